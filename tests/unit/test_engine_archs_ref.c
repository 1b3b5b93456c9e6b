/* tests/unit/test_engine_archs_ref.c: the phi3 and gemma-family math of the engine,
 * and llama's sliding window (Mistral v0.1),
 * against a plain reference written here from gguf-formats §4.3-4.4.
 *
 * Each case takes a small shape from `edgelm-gguf mkmodel` (F32, synthetic
 * vocabulary) for its keys and tensor list, rewrites every tensor with
 * random values (norm weights around 1, so a (1 + w) applied on top of the
 * stored weights shows), sets soft-caps, windows and rope scaling small
 * enough to bite on a 10-token prompt, and compares the engine's logits at
 * every position with a double-precision forward pass over the same
 * numbers: within 1e-4 relative, on the scalar kernels and this CPU's best.
 *
 * So that the comparison proves something, the reference is also run with
 * each architecture feature deliberately wrong (no soft-cap, (1 + w) norms,
 * no window, the window off by one, gate and up swapped, ...): every such
 * variant must differ from the right one by far more than the bound.
 *
 * The last test checks that bad files of the new architectures are refused
 * with messages that say what is wrong. */
#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/test.h"

#include <unistd.h>

enum ref_arch { R_PHI3, R_GEMMA, R_GEMMA2, R_GEMMA3, R_LLAMA };

/* Deliberate mistakes, for the reference only. */
enum {
	M_NORM_PLUS_ONE = 1 << 0,   /* norms multiply by 1 + w instead of the stored w */
	M_NO_EMBD_SCALE = 1 << 1,   /* gemma embeddings not scaled by sqrt(n_embd) */
	M_SILU = 1 << 2,            /* SiLU gate instead of GELU */
	M_NO_ATTN_SOFTCAP = 1 << 3, /* gemma2 */
	M_NO_FINAL_SOFTCAP = 1 << 4,
	M_NO_POST_NORM = 1 << 5,    /* gemma2/3 post-attention and post-FFN norms */
	M_NO_WINDOW = 1 << 6,
	M_WINDOW_PLUS_ONE = 1 << 7, /* one key too many in the window */
	M_WINDOW_ODD = 1 << 8,      /* gemma2: odd layers windowed instead of even */
	M_GLOBAL_ROPE = 1 << 9,     /* gemma3: sliding layers with the global rope */
	M_NO_QK_NORM = 1 << 10,     /* gemma3 */
	M_GATE_UP_SWAP = 1 << 11,   /* phi3: up first, then gate */
	M_KV_SWAP = 1 << 12,        /* phi3: Q, V, K instead of Q, K, V */
	M_OTHER_FACTORS = 1 << 13,  /* phi3: short rope factors instead of long, or back */
	M_NO_ATTN_FACTOR = 1 << 14, /* phi3: cos and sin not times attn_factor */
	M_SCALE_EMBD_HEADS = 1 << 15, /* 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim) */
	M_NO_ROPE_SCALE = 1 << 16,  /* gemma3: global layers without their linear scaling */
	M_COUNT = 17
};

static const char *const mut_names[M_COUNT] = {
	"(1+w) norms", "no embedding scale", "SiLU gate", "no attention soft-cap",
	"no final soft-cap", "no post norms", "no window", "window + 1", "odd layers windowed",
	"global rope on sliding layers", "no Q/K norm", "gate/up swapped", "K/V swapped",
	"other rope factors", "no attn_factor", "1/sqrt(n_embd/n_head)", "no global rope scaling",
};

struct ref_tensor {
	char name[GGUF_MAX_NAME];
	int64_t ne0, ne1;
	float *data;
};

struct ref_model {
	enum ref_arch arch;
	int E, n_layer, H, HKV, HD, F, V;
	double eps, base, freq_scale, attn_softcap, final_softcap, attn_factor;
	int n_swa;
	int n_ctx_orig; /* phi3 longrope */
	struct ref_tensor t[160];
	int nt;
};

/* What a case changes in the shape's file. */
struct ref_case {
	const char *shape, *arch;
	enum ref_arch kind;
	int n_layer;
	int n_swa;
	float attn_softcap, final_softcap; /* gemma2 */
	bool longrope;                     /* phi3: factors, attn_factor, n_ctx_orig 16 */
	float linear_factor;               /* gemma3: global layers' rope scaling */
	unsigned mutations;                /* the mistakes this case must catch */
};

/* ---- random numbers ------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rng_uniform(void)
{
	return (double)(rng_next() >> 11) / 9007199254740992.0;
}

static double rng_normal(void)
{
	double u = rng_uniform() + 1e-300, v = rng_uniform();
	return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

/* ---- building the model file --------------------------------------------- */

static int mkmodel(const char *shape, int n_layer, const char *out)
{
	char args[256];
	snprintf(args, sizeof(args), "--shape %s --vocab synthetic --type F32 --layers %d --ctx 64",
	         shape, n_layer);
	return test_mkmodel(out, args);
}

static struct ref_tensor *ref_add(struct ref_model *M, const char *name, int64_t ne0,
                                  int64_t ne1)
{
	if (M->nt == (int)CM_ARRAY_LEN(M->t))
		return NULL;
	struct ref_tensor *t = &M->t[M->nt];
	t->data = malloc((size_t)(ne0 * ne1) * sizeof(float));
	if (!t->data)
		return NULL;
	M->nt++;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->ne0 = ne0;
	t->ne1 = ne1;
	return t;
}

static void ref_free(struct ref_model *M)
{
	for (int i = 0; i < M->nt; i++)
		free(M->t[i].data);
	M->nt = 0;
}

static const float *W(const struct ref_model *M, const char *fmt, int layer)
{
	char name[GGUF_MAX_NAME];
	snprintf(name, sizeof(name), fmt, layer);
	for (int i = 0; i < M->nt; i++)
		if (strcmp(M->t[i].name, name) == 0)
			return M->t[i].data;
	return NULL;
}

static uint32_t kv_u32(const struct gguf_file *f, const char *arch, const char *key)
{
	char full[128];
	uint32_t v = 0;
	snprintf(full, sizeof(full), "%s.%s", arch, key);
	CHECK_OK(gguf_get_u32(f, full, &v, NULL));
	return v;
}

/* Modifications for the refusal tests. */
struct damage {
	const char *drop_key, *drop_tensor, *extra_tensor;
	const char *set_key; /* set to set_f32 (f32) */
	float set_f32;
};

/* The case's model file at `out`, its numbers in M. */
static int build(const struct ref_case *rc, const struct damage *dm, const char *out,
                 struct ref_model *M)
{
	char tmpl[4200], key[128];
	snprintf(tmpl, sizeof(tmpl), "%s.tmpl", out);
	memset(M, 0, sizeof(*M));
	if (mkmodel(rc->shape, rc->n_layer, tmpl) != 0)
		return -1;
	struct gguf_file *f = NULL;
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	int r = -1;
	if (gguf_open(tmpl, &f, &err) || gguf_writer_new(&w, &err))
		goto out;
	M->arch = rc->kind;
	M->E = (int)kv_u32(f, rc->arch, "embedding_length");
	M->n_layer = (int)kv_u32(f, rc->arch, "block_count");
	M->H = (int)kv_u32(f, rc->arch, "attention.head_count");
	M->HKV = (int)kv_u32(f, rc->arch, "attention.head_count_kv");
	M->HD = (int)kv_u32(f, rc->arch, "rope.dimension_count"); /* = head_dim in mkmodel */
	M->F = (int)kv_u32(f, rc->arch, "feed_forward_length");
	float eps = 0, base = 0;
#define K(s) (snprintf(key, sizeof(key), "%s." s, rc->arch), key)
	CHECK_OK(gguf_get_f32(f, K("attention.layer_norm_rms_epsilon"), &eps, NULL));
	CHECK_OK(gguf_get_f32(f, K("rope.freq_base"), &base, NULL));
	M->eps = eps;
	M->base = base;
	M->freq_scale = 1;
	M->attn_factor = 1;
	M->n_ctx_orig = 64;
	if (gguf_writer_copy_kv(w, f, NULL, NULL))
		goto out;
	if (rc->n_swa) {
		gguf_writer_set_u32(w, K("attention.sliding_window"), (uint32_t)rc->n_swa);
		M->n_swa = rc->n_swa;
	}
	if (rc->attn_softcap > 0) {
		gguf_writer_set_f32(w, K("attn_logit_softcapping"), rc->attn_softcap);
		gguf_writer_set_f32(w, K("final_logit_softcapping"), rc->final_softcap);
		M->attn_softcap = rc->attn_softcap;
		M->final_softcap = rc->final_softcap;
	} else if (rc->kind == R_GEMMA2) { /* the defaults */
		M->attn_softcap = 50;
		M->final_softcap = 30;
	}
	if (rc->longrope) {
		gguf_writer_set_str(w, K("rope.scaling.type"), "longrope");
		gguf_writer_set_f32(w, K("rope.scaling.attn_factor"), 1.25f);
		gguf_writer_set_u32(w, K("rope.scaling.original_context_length"), 16);
		M->attn_factor = (double)1.25f;
		M->n_ctx_orig = 16;
	}
	if (rc->linear_factor > 0) {
		gguf_writer_set_str(w, K("rope.scaling.type"), "linear");
		gguf_writer_set_f32(w, K("rope.scaling.factor"), rc->linear_factor);
		M->freq_scale = 1.0 / (double)rc->linear_factor;
	}
#undef K
	if (dm && dm->set_key)
		gguf_writer_set_f32(w, dm->set_key, dm->set_f32);
	if (dm && dm->drop_key)
		gguf_writer_remove(w, dm->drop_key);

	/* fresh values for every tensor of the shape */
	bool gemma = rc->kind != R_PHI3 && rc->kind != R_LLAMA;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *gt = &f->tensors[i];
		struct ref_tensor *t = ref_add(M, gt->name, gt->ne[0], gt->ne[1]);
		if (!t)
			goto out;
		bool norm = strstr(t->name, "norm.weight") != NULL;
		bool embd = strcmp(t->name, "token_embd.weight") == 0;
		double sd = norm ? 0.25 : embd && !gemma ? 1.0 : 1.0 / sqrt((double)t->ne0);
		for (int64_t j = 0; j < t->ne0 * t->ne1; j++)
			t->data[j] = (float)((norm ? 1.0 : 0.0) + sd * rng_normal());
		if (embd)
			M->V = (int)t->ne1;
	}
	if (rc->longrope) {
		struct ref_tensor *lf = ref_add(M, "rope_factors_long.weight", M->HD / 2, 1);
		struct ref_tensor *sf = ref_add(M, "rope_factors_short.weight", M->HD / 2, 1);
		if (!lf || !sf)
			goto out;
		for (int j = 0; j < M->HD / 2; j++) {
			lf->data[j] = (float)(1.0 + 7.0 * rng_uniform());
			sf->data[j] = (float)(1.0 + 0.5 * rng_uniform());
		}
	}
	if (dm && dm->extra_tensor) {
		struct ref_tensor *x = ref_add(M, dm->extra_tensor, M->E, 1);
		if (!x)
			goto out;
		memset(x->data, 0, (size_t)M->E * sizeof(float));
	}
	for (int i = 0; i < M->nt; i++) {
		const struct ref_tensor *t = &M->t[i];
		if (dm && dm->drop_tensor && strcmp(t->name, dm->drop_tensor) == 0)
			continue;
		int64_t ne[2] = {t->ne0, t->ne1};
		if (gguf_writer_add_tensor(w, t->name, ENGINE_DTYPE_F32, t->ne1 > 1 ? 2 : 1, ne,
		                           t->data, &err))
			goto out;
	}
	r = gguf_writer_write(w, out, &err);
out:
	if (r)
		fprintf(stderr, "build %s: %s\n", rc->shape, err.msg);
	gguf_writer_free(w);
	gguf_close(f);
	unlink(tmpl);
	return r;
}

/* ---- the reference forward pass ------------------------------------------ */

static void ref_rmsnorm(double *y, const double *x, const float *w, int n, double eps,
                        unsigned mut)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += x[i] * x[i];
	double s = 1.0 / sqrt(ss / n + eps);
	for (int i = 0; i < n; i++)
		y[i] = x[i] * s * ((mut & M_NORM_PLUS_ONE) ? 1.0 + w[i] : (double)w[i]);
}

/* y[r] = sum_i W[row0 + r][i] x[i] for r < n_out; rows of n_in floats. */
static void ref_matvec(double *y, const float *w, int row0, int n_out, const double *x, int n_in)
{
	for (int r = 0; r < n_out; r++) {
		const float *row = w + (size_t)(row0 + r) * n_in;
		double s = 0;
		for (int i = 0; i < n_in; i++)
			s += (double)row[i] * x[i];
		y[r] = s;
	}
}

/* Window of layer l (0: none), as the reference understands it. */
static int ref_window(const struct ref_model *M, int l, unsigned mut)
{
	bool sliding;
	switch (M->arch) {
	case R_PHI3:
	case R_LLAMA: sliding = true; break;
	case R_GEMMA2: sliding = (mut & M_WINDOW_ODD) ? l % 2 == 1 : l % 2 == 0; break;
	case R_GEMMA3: sliding = (l + 1) % 6 != 0; break;
	default: sliding = false;
	}
	if (!sliding || !M->n_swa || (mut & M_NO_WINDOW))
		return 0;
	return M->n_swa + ((mut & M_WINDOW_PLUS_ONE) ? 1 : 0);
}

/* NEOX rope (NORM: adjacent pairs, llama) on n_heads vectors of HD at
 * position p. */
static void ref_rope(double *v, int n_heads, int HD, int p, double base, const float *div,
                     double freq_scale, double mscale, bool norm)
{
	int half = HD / 2;
	for (int h = 0; h < n_heads; h++) {
		double *x = v + (size_t)h * HD;
		for (int i = 0; i < half; i++) {
			double th = p * pow(base, -2.0 * i / HD) * freq_scale;
			if (div)
				th /= div[i];
			double c = cos(th) * mscale, s = sin(th) * mscale;
			int ia = norm ? 2 * i : i, ib = norm ? 2 * i + 1 : i + half;
			double a = x[ia], b = x[ib];
			x[ia] = a * c - b * s;
			x[ib] = a * s + b * c;
		}
	}
}

static double ref_gelu(double x)
{
	return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static double ref_silu(double x)
{
	return x / (1.0 + exp(-x));
}

/* Logits [T][V] of tokens at positions 0..T-1 of one sequence, whose
 * context holds n_ctx positions (phi3 longrope picks its factors by it). */
static void ref_forward(const struct ref_model *M, unsigned mut, const int32_t *tok, int T,
                        int n_ctx, double *logits)
{
	const int E = M->E, H = M->H, HKV = M->HKV, HD = M->HD, F = M->F, V = M->V;
	const int QD = H * HD, KD = HKV * HD;
	const bool phi3 = M->arch == R_PHI3, llama = M->arch == R_LLAMA, gemma = !phi3 && !llama;
	double *x = calloc((size_t)T * E, sizeof(double));
	double *h = calloc((size_t)E, sizeof(double));
	double *q = calloc((size_t)T * QD, sizeof(double));
	double *k = calloc((size_t)T * KD, sizeof(double));
	double *v = calloc((size_t)T * KD, sizeof(double));
	double *att = calloc((size_t)QD, sizeof(double));
	double *o = calloc((size_t)E, sizeof(double));
	double *g = calloc((size_t)F, sizeof(double));
	double *u = calloc((size_t)F, sizeof(double));
	double *sc = calloc((size_t)T, sizeof(double));
	if (!x || !h || !q || !k || !v || !att || !o || !g || !u || !sc) {
		CHECK(!"out of memory");
		goto out;
	}
	const float *embd = W(M, "token_embd.weight", 0);
	double es = gemma && !(mut & M_NO_EMBD_SCALE) ? sqrt((double)E) : 1.0;
	for (int t = 0; t < T; t++)
		for (int i = 0; i < E; i++)
			x[(size_t)t * E + i] = embd[(size_t)tok[t] * E + i] * es;
	double scale = 1.0 / sqrt((double)((mut & M_SCALE_EMBD_HEADS) ? E / H : HD));
	const float *div = NULL;
	if (phi3 && W(M, "rope_factors_long.weight", 0)) {
		bool lng = n_ctx > M->n_ctx_orig;
		if (mut & M_OTHER_FACTORS)
			lng = !lng;
		div = W(M, lng ? "rope_factors_long.weight" : "rope_factors_short.weight", 0);
	}
	double mscale = (mut & M_NO_ATTN_FACTOR) ? 1.0 : M->attn_factor;

	for (int l = 0; l < M->n_layer; l++) {
		int win = ref_window(M, l, mut);
		/* gemma3's sliding layers (by the true pattern) rope with base
		 * 10000, unscaled; the global ones with the file's base and scale */
		bool local = M->arch == R_GEMMA3 && (l + 1) % 6 != 0 && !(mut & M_GLOBAL_ROPE);
		double base = local ? 10000.0 : M->base;
		double fs = local || (mut & M_NO_ROPE_SCALE) ? 1.0 : M->freq_scale;
		for (int t = 0; t < T; t++) {
			double *qt = q + (size_t)t * QD, *kt = k + (size_t)t * KD, *vt = v + (size_t)t * KD;
			ref_rmsnorm(h, x + (size_t)t * E, W(M, "blk.%d.attn_norm.weight", l), E, M->eps,
			            mut);
			if (phi3) {
				const float *qkv = W(M, "blk.%d.attn_qkv.weight", l);
				bool swap = mut & M_KV_SWAP;
				ref_matvec(qt, qkv, 0, QD, h, E);
				ref_matvec(kt, qkv, swap ? QD + KD : QD, KD, h, E);
				ref_matvec(vt, qkv, swap ? QD : QD + KD, KD, h, E);
			} else {
				ref_matvec(qt, W(M, "blk.%d.attn_q.weight", l), 0, QD, h, E);
				ref_matvec(kt, W(M, "blk.%d.attn_k.weight", l), 0, KD, h, E);
				ref_matvec(vt, W(M, "blk.%d.attn_v.weight", l), 0, KD, h, E);
			}
			if (M->arch == R_GEMMA3 && !(mut & M_NO_QK_NORM)) {
				for (int hh = 0; hh < H; hh++)
					ref_rmsnorm(qt + hh * HD, qt + hh * HD,
					            W(M, "blk.%d.attn_q_norm.weight", l), HD, M->eps, mut);
				for (int hh = 0; hh < HKV; hh++)
					ref_rmsnorm(kt + hh * HD, kt + hh * HD,
					            W(M, "blk.%d.attn_k_norm.weight", l), HD, M->eps, mut);
			}
			ref_rope(qt, H, HD, t, base, div, fs, mscale, llama);
			ref_rope(kt, HKV, HD, t, base, div, fs, mscale, llama);
		}
		for (int t = 0; t < T; t++) {
			for (int hh = 0; hh < H; hh++) {
				int kvh = hh / (H / HKV);
				int p0 = win > 0 && t - win + 1 > 0 ? t - win + 1 : 0;
				const double *qh = q + (size_t)t * QD + hh * HD;
				double mx = -INFINITY, sum = 0;
				for (int p = p0; p <= t; p++) {
					const double *kp = k + (size_t)p * KD + kvh * HD;
					double s = 0;
					for (int i = 0; i < HD; i++)
						s += qh[i] * kp[i];
					s *= scale;
					if (M->attn_softcap > 0 && !(mut & M_NO_ATTN_SOFTCAP))
						s = M->attn_softcap * tanh(s / M->attn_softcap);
					sc[p] = s;
					mx = s > mx ? s : mx;
				}
				for (int p = p0; p <= t; p++)
					sum += (sc[p] = exp(sc[p] - mx));
				double *ah = att + hh * HD;
				for (int i = 0; i < HD; i++) {
					double a = 0;
					for (int p = p0; p <= t; p++)
						a += sc[p] / sum * v[(size_t)p * KD + kvh * HD + i];
					ah[i] = a;
				}
			}
			ref_matvec(o, W(M, "blk.%d.attn_output.weight", l), 0, E, att, QD);
			const float *pn = W(M, "blk.%d.post_attention_norm.weight", l);
			if (pn && !(mut & M_NO_POST_NORM))
				ref_rmsnorm(o, o, pn, E, M->eps, mut);
			for (int i = 0; i < E; i++)
				x[(size_t)t * E + i] += o[i];
		}
		for (int t = 0; t < T; t++) {
			double *xt = x + (size_t)t * E;
			ref_rmsnorm(h, xt, W(M, "blk.%d.ffn_norm.weight", l), E, M->eps, mut);
			if (phi3) {
				const float *up = W(M, "blk.%d.ffn_up.weight", l);
				bool swap = mut & M_GATE_UP_SWAP;
				ref_matvec(g, up, swap ? F : 0, F, h, E);
				ref_matvec(u, up, swap ? 0 : F, F, h, E);
			} else {
				ref_matvec(g, W(M, "blk.%d.ffn_gate.weight", l), 0, F, h, E);
				ref_matvec(u, W(M, "blk.%d.ffn_up.weight", l), 0, F, h, E);
			}
			bool use_gelu = gemma && !(mut & M_SILU);
			for (int i = 0; i < F; i++)
				g[i] = (use_gelu ? ref_gelu(g[i]) : ref_silu(g[i])) * u[i];
			ref_matvec(o, W(M, "blk.%d.ffn_down.weight", l), 0, E, g, F);
			const float *pn = W(M, "blk.%d.post_ffw_norm.weight", l);
			if (pn && !(mut & M_NO_POST_NORM))
				ref_rmsnorm(o, o, pn, E, M->eps, mut);
			for (int i = 0; i < E; i++)
				xt[i] += o[i];
		}
	}
	const float *out_w = W(M, "output.weight", 0);
	if (!out_w)
		out_w = embd; /* tied */
	for (int t = 0; t < T; t++) {
		ref_rmsnorm(h, x + (size_t)t * E, W(M, "output_norm.weight", 0), E, M->eps, mut);
		double *lt = logits + (size_t)t * V;
		ref_matvec(lt, out_w, 0, V, h, E);
		if (M->final_softcap > 0 && !(mut & M_NO_FINAL_SOFTCAP))
			for (int i = 0; i < V; i++)
				lt[i] = M->final_softcap * tanh(lt[i] / M->final_softcap);
	}
out:
	free(x);
	free(h);
	free(q);
	free(k);
	free(v);
	free(att);
	free(o);
	free(g);
	free(u);
	free(sc);
}

/* Worst over positions of max |a - b| / max |b|. */
static double worst_rel(const double *a, const double *b, int T, int V)
{
	double worst = 0;
	for (int t = 0; t < T; t++) {
		double d = 0, s = 1e-30;
		for (int i = 0; i < V; i++) {
			double x = fabs(a[(size_t)t * V + i] - b[(size_t)t * V + i]);
			if (!(x <= d))
				d = x; /* NaN propagates */
			s = fabs(b[(size_t)t * V + i]) > s ? fabs(b[(size_t)t * V + i]) : s;
		}
		if (!(d / s <= worst))
			worst = d / s;
	}
	return worst;
}

/* ---- the comparison ------------------------------------------------------ */

enum { T_TOK = 10 };
#define TOL 1e-4
/* The reference keeps K and V in double: TOL holds with an f32 KV cache;
 * the default f16 cache is checked too, within TOL_KV_F16 (measured
 * 3.3e-4 to 6.1e-4 on these shapes). */
#define TOL_KV_F16 2e-3

/* The engine's logits at every position, one batch, into out[T][V]. */
static void engine_logits(const char *path, const char *isa, enum engine_kv_type kv, int n_ctx,
                          const int32_t *tok, double *out, int V)
{
	struct engine_params p = {.n_threads = 2, .isa = isa};
	engine_model *m = NULL;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r == 0, "%s: %s", path, err.msg);
	if (r)
		return;
	struct engine_ctx_params cp = {
		.n_ctx = (uint32_t)n_ctx, .n_seq = 1, .n_batch = T_TOK, .kv_type = kv};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	int32_t pos[T_TOK];
	bool want[T_TOK];
	for (int i = 0; i < T_TOK; i++) {
		pos[i] = i;
		want[i] = true;
	}
	struct engine_batch b = {.n = T_TOK, .tokens = tok, .pos = pos, .want_logits = want};
	if (c && engine_decode(c, &b, &err) == 0) {
		for (int t = 0; t < T_TOK; t++) {
			const float *l = engine_get_logits(c, t);
			CHECK(l != NULL);
			for (int i = 0; l && i < V; i++)
				out[(size_t)t * V + i] = l[i];
		}
	} else {
		CHECK_MSG(0, "decode: %s", err.msg);
	}
	engine_ctx_free(c);
	engine_model_free(m);
}

static void run_case(const struct ref_case *rc, uint64_t seed)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/edgelm-archs-ref-%d-%s.gguf", test_tmpdir(), (int)getpid(),
	         rc->shape);
	struct ref_model *M = calloc(1, sizeof(*M));
	if (!M) {
		CHECK(!"out of memory");
		return;
	}
	rng_state = seed;
	int r = build(rc, NULL, path, M);
	CHECK_MSG(r == 0, "%s: cannot build the model", rc->shape);
	if (r) {
		ref_free(M);
		free(M);
		return;
	}
	int32_t tok[T_TOK];
	for (int i = 0; i < T_TOK; i++)
		tok[i] = (int32_t)(rng_next() % (uint64_t)M->V);
	size_t n = (size_t)T_TOK * M->V;
	double *ref = malloc(n * sizeof(double)), *alt = malloc(n * sizeof(double));
	double *eng = malloc(n * sizeof(double));
	if (!ref || !alt || !eng)
		goto out;
	/* longrope: a context beyond the original length takes the long
	 * factors, one within it the short ones */
	const int ctxs[2] = {64, 16};
	for (int ci = 0; ci < (rc->longrope ? 2 : 1); ci++) {
		int n_ctx = ctxs[ci];
		ref_forward(M, 0, tok, T_TOK, n_ctx, ref);
		static const char *const isas[] = {"scalar", NULL};
		for (int k = 0; k < 4; k++) {
			const char *isa = isas[k % 2] ? isas[k % 2] : getenv("EDGELM_ISA");
			enum engine_kv_type kv = k < 2 ? ENGINE_KV_F32 : ENGINE_KV_F16;
			double tol = k < 2 ? TOL : TOL_KV_F16;
			for (size_t i = 0; i < n; i++)
				eng[i] = NAN;
			engine_logits(path, isa, kv, n_ctx, tok, eng, M->V);
			double d = worst_rel(eng, ref, T_TOK, M->V);
			fprintf(stderr, "%s (ctx %d, %s kernels, %s KV): engine vs reference: %.3g\n",
			        rc->shape, n_ctx, isa ? isa : "best", engine_kv_type_name(kv), d);
			CHECK_MSG(d <= tol, "%s (ctx %d, %s kernels, %s KV): %g > %g", rc->shape, n_ctx,
			          isa ? isa : "best", engine_kv_type_name(kv), d, tol);
		}
		/* each mistake must move the logits by far more than the bound */
		for (int b = 0; b < M_COUNT; b++) {
			if (!(rc->mutations & (1u << b)))
				continue;
			ref_forward(M, 1u << b, tok, T_TOK, n_ctx, alt);
			double d = worst_rel(alt, ref, T_TOK, M->V);
			fprintf(stderr, "  %s: reference with %s differs by %.3g\n", rc->shape,
			        mut_names[b], d);
			CHECK_MSG(d > 100 * TOL, "%s: %s is not caught (%g)", rc->shape, mut_names[b],
			          d);
		}
	}
out:
	free(ref);
	free(alt);
	free(eng);
	ref_free(M);
	free(M);
	unlink(path);
}

static void test_ref_phi3(void)
{
	static const struct ref_case rc = {
	    .shape = "small-phi3", .arch = "phi3", .kind = R_PHI3, .n_layer = 2, .n_swa = 3,
	    .longrope = true,
	    .mutations = M_NORM_PLUS_ONE | M_NO_WINDOW | M_WINDOW_PLUS_ONE | M_GATE_UP_SWAP |
	                 M_KV_SWAP | M_OTHER_FACTORS | M_NO_ATTN_FACTOR};
	run_case(&rc, 3);
}

static void test_ref_gemma(void)
{
	static const struct ref_case rc = {
	    .shape = "small-gemma", .arch = "gemma", .kind = R_GEMMA, .n_layer = 2,
	    .mutations = M_NORM_PLUS_ONE | M_NO_EMBD_SCALE | M_SILU | M_SCALE_EMBD_HEADS};
	run_case(&rc, 5);
}

static void test_ref_gemma2(void)
{
	static const struct ref_case rc = {
	    .shape = "small-gemma2", .arch = "gemma2", .kind = R_GEMMA2, .n_layer = 2, .n_swa = 3,
	    .attn_softcap = 0.8f, .final_softcap = 1.5f,
	    .mutations = M_NORM_PLUS_ONE | M_NO_EMBD_SCALE | M_SILU | M_NO_ATTN_SOFTCAP |
	                 M_NO_FINAL_SOFTCAP | M_NO_POST_NORM | M_NO_WINDOW | M_WINDOW_PLUS_ONE |
	                 M_WINDOW_ODD | M_SCALE_EMBD_HEADS};
	run_case(&rc, 7);
}

static void test_ref_gemma3(void)
{
	static const struct ref_case rc = {
	    .shape = "small-gemma3", .arch = "gemma3", .kind = R_GEMMA3, .n_layer = 6, .n_swa = 3,
	    .linear_factor = 4.0f,
	    .mutations = M_NORM_PLUS_ONE | M_NO_EMBD_SCALE | M_SILU | M_NO_POST_NORM |
	                 M_NO_WINDOW | M_WINDOW_PLUS_ONE | M_GLOBAL_ROPE | M_NO_QK_NORM |
	                 M_SCALE_EMBD_HEADS | M_NO_ROPE_SCALE};
	run_case(&rc, 11);
}

/* Mistral v0.1: llama with a window on every layer, 8 keys over the
 * 10-token prompt (without the key the logits differ: M_NO_WINDOW). */
static void test_ref_llama_window(void)
{
	static const struct ref_case rc = {
	    .shape = "small", .arch = "llama", .kind = R_LLAMA, .n_layer = 2, .n_swa = 8,
	    .mutations = M_NO_WINDOW | M_WINDOW_PLUS_ONE};
	run_case(&rc, 13);
}

/* ---- refusals ------------------------------------------------------------ */

static void expect_refused(const struct ref_case *rc, const struct damage *dm, const char *want)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/edgelm-archs-bad-%d-%s.gguf", test_tmpdir(), (int)getpid(),
	         rc->shape);
	struct ref_model *M = calloc(1, sizeof(*M));
	if (!M || build(rc, dm, path, M) != 0) {
		CHECK_MSG(0, "%s: cannot build the model", rc->shape);
		goto out;
	}
	struct engine_params p = {.n_threads = 1};
	engine_model *m = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r < 0 && strstr(err.msg, want), "%s: got %d '%s', want '%s'", rc->shape, r,
	          err.msg, want);
	engine_model_free(m);
out:
	if (M)
		ref_free(M);
	free(M);
	unlink(path);
}

static void test_refusals(void)
{
	static const struct ref_case phi3 = {.shape = "small-phi3", .arch = "phi3",
	                                     .kind = R_PHI3, .n_layer = 1, .n_swa = 3};
	static const struct ref_case phi3_lr = {.shape = "small-phi3", .arch = "phi3",
	                                        .kind = R_PHI3, .n_layer = 1, .n_swa = 3,
	                                        .longrope = true};
	static const struct ref_case gemma = {.shape = "small-gemma", .arch = "gemma",
	                                      .kind = R_GEMMA, .n_layer = 1};
	static const struct ref_case gemma2 = {.shape = "small-gemma2", .arch = "gemma2",
	                                       .kind = R_GEMMA2, .n_layer = 2};
	static const struct ref_case gemma3 = {.shape = "small-gemma3", .arch = "gemma3",
	                                       .kind = R_GEMMA3, .n_layer = 1, .n_swa = 3};
	struct damage d;

	d = (struct damage){.drop_tensor = "blk.0.attn_qkv.weight"};
	expect_refused(&phi3, &d, "missing tensor 'blk.0.attn_qkv.weight'");
	d = (struct damage){.drop_tensor = "output.weight"};
	expect_refused(&phi3, &d, "missing tensor 'output.weight'");
	d = (struct damage){.drop_tensor = "rope_factors_short.weight"};
	expect_refused(&phi3_lr, &d, "missing tensor 'rope_factors_short.weight'");
	/* not a known Phi-3 shape: no fallback window */
	d = (struct damage){.drop_key = "phi3.attention.sliding_window"};
	expect_refused(&phi3, &d, "missing key 'phi3.attention.sliding_window'");
	d = (struct damage){.extra_tensor = "blk.0.ffn_gate.weight"};
	expect_refused(&phi3, &d, "unexpected tensor 'blk.0.ffn_gate.weight' for architecture phi3");

	d = (struct damage){.extra_tensor = "blk.0.attn_q.bias"};
	expect_refused(&gemma, &d, "unexpected tensor 'blk.0.attn_q.bias' for architecture gemma");
	d = (struct damage){.extra_tensor = "blk.0.post_ffw_norm.weight"};
	expect_refused(&gemma, &d, "unexpected tensor 'blk.0.post_ffw_norm.weight'");

	d = (struct damage){.drop_tensor = "blk.1.post_ffw_norm.weight"};
	expect_refused(&gemma2, &d, "missing tensor 'blk.1.post_ffw_norm.weight'");
	d = (struct damage){.set_key = "gemma2.attn_logit_softcapping", .set_f32 = 0};
	expect_refused(&gemma2, &d, "soft-capping values must be positive");
	d = (struct damage){.set_key = "gemma2.final_logit_softcapping", .set_f32 = -1};
	expect_refused(&gemma2, &d, "soft-capping values must be positive");

	d = (struct damage){.drop_key = "gemma3.attention.sliding_window"};
	expect_refused(&gemma3, &d, "missing key 'gemma3.attention.sliding_window'");
	d = (struct damage){.drop_tensor = "blk.0.attn_k_norm.weight"};
	expect_refused(&gemma3, &d, "missing tensor 'blk.0.attn_k_norm.weight'");
	d = (struct damage){.set_key = "gemma3.rope.scaling.attn_factor", .set_f32 = 0};
	expect_refused(&gemma3, &d, "attn_factor not positive");
}

int main(void)
{
	TEST_RUN(test_ref_phi3);
	TEST_RUN(test_ref_gemma);
	TEST_RUN(test_ref_gemma2);
	TEST_RUN(test_ref_gemma3);
	TEST_RUN(test_ref_llama_window);
	TEST_RUN(test_refusals);
	return test_finish();
}
