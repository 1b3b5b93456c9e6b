/* tests/unit/test_engine_ctxshift.c: engine_seq_shift (context shift).
 *
 * With one layer, a key depends only on its token and position, so a
 * shifted cache must give the logits a fresh prefill of the kept tokens at
 * their new positions gives, for this and the next decodes: up to the
 * rounding the re-rotation adds, which the KV type bounds (f32: float
 * rotation, 1e-5 of the largest logit; f16: a second f16 rounding of each
 * key, 1e-3; q8_0: a second 8-bit rounding, 1e-2). The one-layer shapes
 * cover adjacent-pair and half rope, a sliding window, gemma3's local
 * tables, and linear scaling with attn_factor and per-pair divisors
 * (rope_freqs) at once. Deeper models (stories260K, stories3M) see the dropped tokens in
 * their upper layers' keys, so there the test checks the cache itself:
 * layer 0 against a fresh prefill, every layer's keys against a
 * double-precision re-rotation of the keys before the shift, values moved
 * unchanged, and the lengths. */
#include "engine/engine_impl.h"
#include "engine/gguf.h"
#include "tests/test.h"

#include <math.h>
#include <unistd.h>

static const enum engine_kv_type kv_types[] = {ENGINE_KV_F32, ENGINE_KV_F16, ENGINE_KV_Q8_0};
static const double kv_tol[] = {1e-5, 1e-3, 1e-2};

enum { T_PROMPT = 24, N_CTX = 64, N_NEXT = 3 };

static void tokens(int32_t *tok, int n, uint32_t n_vocab)
{
	for (int i = 0; i < n; i++)
		tok[i] = (int32_t)((uint32_t)(i * 7 + 3) % n_vocab);
}

/* max |a - b| / max |b| over n logits */
static double rel_diff(const float *a, const float *b, int n)
{
	double d = 0, s = 1e-30;
	for (int i = 0; i < n; i++) {
		double x = fabs((double)a[i] - (double)b[i]);
		if (!(x <= d))
			d = x;
		if (fabs((double)b[i]) > s)
			s = fabs((double)b[i]);
	}
	return d / s;
}

static int decode_one(engine_ctx *c, int seq, int32_t tok, int pos, struct cm_err *err)
{
	int32_t s = seq;
	struct engine_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &s};
	return engine_decode(c, &b, err);
}

/* prefill tok[0..n) into seq from position 0 */
static int prefill(engine_ctx *c, int seq, const int32_t *tok, int n, struct cm_err *err)
{
	int32_t pos[N_CTX], s[N_CTX];
	for (int i = 0; i < n; i++) {
		pos[i] = i;
		s[i] = seq;
	}
	struct engine_batch b = {.n = n, .tokens = tok, .pos = pos, .seq = s};
	return engine_decode(c, &b, err);
}

/* Shift sequence 0 after a prompt, then compare its next decodes with a
 * fresh prefill of the kept tokens in sequence 1, within the KV type's
 * bound times tol_mul. */
static void logits_case(const char *path, const char *what, int n_keep, int n_discard,
			double tol_mul)
{
	for (size_t k = 0; k < CM_ARRAY_LEN(kv_types); k++) {
		struct engine_params p = {.n_threads = 2};
		engine_model *m = NULL;
		engine_ctx *c = NULL;
		struct cm_err err = {0};
		int r = engine_model_load(path, &p, &m, &err);
		CHECK_MSG(r == 0, "%s: %s", what, err.msg);
		if (r)
			return;
		struct engine_ctx_params cp = {
		    .n_ctx = N_CTX, .n_seq = 2, .n_batch = N_CTX, .kv_type = kv_types[k]};
		CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
		int V = (int)m->hp.n_vocab;
		int32_t tok[T_PROMPT + N_NEXT], kept[T_PROMPT];
		tokens(tok, T_PROMPT + N_NEXT, m->hp.n_vocab);
		int nk = 0;
		for (int i = 0; i < T_PROMPT; i++)
			if (i < n_keep || i >= n_keep + n_discard)
				kept[nk++] = tok[i];
		float *a = malloc((size_t)V * sizeof(float));
		CHECK_OK(prefill(c, 0, tok, T_PROMPT, &err));
		CHECK_OK(engine_seq_shift(c, 0, n_keep, n_discard, &err));
		CHECK_EQ_INT(engine_seq_len(c, 0), T_PROMPT - n_discard);
		CHECK_OK(prefill(c, 1, kept, nk, &err));
		double worst = 0;
		for (int j = 0; j < N_NEXT; j++) {
			int pos = nk + j;
			CHECK_OK(decode_one(c, 0, tok[T_PROMPT + j], pos, &err));
			memcpy(a, engine_get_logits_last(c), (size_t)V * sizeof(float));
			CHECK_OK(decode_one(c, 1, tok[T_PROMPT + j], pos, &err));
			double d = rel_diff(a, engine_get_logits_last(c), V);
			worst = d > worst ? d : worst;
		}
		CHECK_EQ_INT(engine_seq_len(c, 0), nk + N_NEXT);
		fprintf(stderr, "%s, %s KV, keep %d, discard %d: shifted vs fresh %.3g\n", what,
			engine_kv_type_name(kv_types[k]), n_keep, n_discard, worst);
		CHECK_MSG(worst <= kv_tol[k] * tol_mul, "%s, %s KV: %g > %g", what,
			  engine_kv_type_name(kv_types[k]), worst, kv_tol[k] * tol_mul);
		free(a);
		engine_ctx_free(c);
		engine_model_free(m);
	}
}

static void one_layer(const char *shape)
{
	char path[4096], args[256];
	snprintf(path, sizeof(path), "%s/ctxshift-%d-%s.gguf", test_tmpdir(), (int)getpid(), shape);
	snprintf(args, sizeof(args),
		 "--shape %s --vocab synthetic --type F32 --layers 1 --ctx %d --seed 5", shape,
		 N_CTX);
	if (test_mkmodel(path, args) != 0) {
		CHECK_MSG(0, "%s: mkmodel failed", shape);
		return;
	}
	logits_case(path, shape, 1, 11, 1);
	logits_case(path, shape, 0, 5, 1);
	logits_case(path, shape, 4, T_PROMPT - 4, 1); /* nothing moves */
	unlink(path);
}

static void test_one_layer_llama(void)
{
	one_layer("tiny"); /* adjacent pairs, head dim 16: q8_0 rows padded */
}

static void test_one_layer_qwen2(void)
{
	one_layer("small-qwen2"); /* halves, biases */
}

static void test_one_layer_phi3(void)
{
	one_layer("small-phi3"); /* window of 5 across the gap */
}

static void test_one_layer_gemma3(void)
{
	one_layer("small-gemma3"); /* layer 0 slides: the local rope tables */
}

/* "tiny" with every llama rope knob: linear scaling 2, attn_factor 1.3
 * (cos and sin times it: the shift must take it out) and a rope_freqs
 * tensor of divisors 1..4.5 (Llama 3.1's per-pair factors). */
static void test_one_layer_rope_knobs(void)
{
	char tmpl[4096], path[4096];
	snprintf(tmpl, sizeof(tmpl), "%s/ctxshift-%d-knobs.tmpl", test_tmpdir(), (int)getpid());
	snprintf(path, sizeof(path), "%s/ctxshift-%d-knobs.gguf", test_tmpdir(), (int)getpid());
	char args[256];
	snprintf(args, sizeof(args),
		 "--shape tiny --vocab synthetic --type F32 --layers 1 --ctx %d --seed 9", N_CTX);
	if (test_mkmodel(tmpl, args) != 0) {
		CHECK_MSG(0, "mkmodel failed");
		return;
	}
	struct gguf_file *f = NULL;
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	CHECK_OK(gguf_open(tmpl, &f, &err));
	CHECK_OK(gguf_writer_new(&w, &err));
	if (!f || !w)
		goto out;
	CHECK_OK(gguf_writer_copy_kv(w, f, NULL, NULL));
	gguf_writer_set_str(w, "llama.rope.scaling.type", "linear");
	gguf_writer_set_f32(w, "llama.rope.scaling.factor", 2.0f);
	gguf_writer_set_f32(w, "llama.rope.scaling.attn_factor", 1.3f);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		CHECK_OK(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, &err));
	}
	float div[8]; /* head dim 16: 8 pairs */
	for (int i = 0; i < 8; i++)
		div[i] = 1.0f + 0.5f * (float)i;
	int64_t ne[1] = {8};
	CHECK_OK(gguf_writer_add_tensor(w, "rope_freqs.weight", ENGINE_DTYPE_F32, 1, ne, div, &err));
	CHECK_OK(gguf_writer_write(w, path, &err));
	/* the knobs took: a shift that ignored attn_factor would scale the keys */
	struct engine_params p = {.n_threads = 1};
	engine_model *m = NULL;
	CHECK_OK(engine_model_load(path, &p, &m, &err));
	CHECK(m && m->rope_freqs && m->hp.rope_attn_factor == 1.3f && m->hp.rope_freq_scale == 0.5f);
	engine_model_free(m);
	/* attn_factor multiplies q and k: a key's rounding moves the scores
	 * 1.3^2 = 1.69 times as much (measured 1.7e-2 for q8_0, 1.6e-7 f32) */
	logits_case(path, "tiny with rope knobs", 1, 11, 2);
	logits_case(path, "tiny with rope knobs", 0, 5, 2);
out:
	gguf_writer_free(w);
	gguf_close(f);
	unlink(tmpl);
	unlink(path);
}

/* ---- real models: the cache itself --------------------------------------- */

static void row_f(engine_ctx *c, const uint8_t *src, float *x)
{
	const struct hparams *hp = &c->m->hp;
	size_t hd = hp->head_dim;
	for (uint32_t h = 0; h < hp->n_head_kv; h++) {
		const uint8_t *s = src + h * c->kv_head_bytes;
		uint32_t t = c->kv_type == ENGINE_KV_F32   ? ENGINE_DTYPE_F32
			     : c->kv_type == ENGINE_KV_F16 ? ENGINE_DTYPE_F16
							   : ENGINE_DTYPE_Q8_0;
		float tmp[1024];
		int64_t n = c->kv_type == ENGINE_KV_Q8_0 ? (int64_t)(hd + 31) / 32 * 32 : (int64_t)hd;
		CHECK(n <= 1024);
		quant_dequantize_row(t, s, tmp, n);
		memcpy(x + h * hd, tmp, hd * sizeof(float));
	}
}

/* max |a - b| / max |b| over n */
static double rel_diff_d(const float *a, const double *b, int n)
{
	double d = 0, s = 1e-30;
	for (int i = 0; i < n; i++) {
		d = fabs(a[i] - b[i]) > d ? fabs(a[i] - b[i]) : d;
		s = fabs(b[i]) > s ? fabs(b[i]) : s;
	}
	return d / s;
}

static void real_case(const char *name, int n_keep, int n_discard)
{
	char rel[256];
	snprintf(rel, sizeof(rel), "models/%s", name);
	const char *path = test_data_path(rel);
	if (access(path, R_OK) != 0) {
		TEST_SKIP_DATA("%s not found under $EDGELM_TESTDATA", name);
		return;
	}
	for (size_t k = 0; k < CM_ARRAY_LEN(kv_types); k++) {
		struct engine_params p = {.n_threads = 2};
		engine_model *m = NULL;
		engine_ctx *c = NULL;
		struct cm_err err = {0};
		CHECK_OK(engine_model_load(path, &p, &m, &err));
		struct engine_ctx_params cp = {
		    .n_ctx = N_CTX, .n_seq = 2, .n_batch = N_CTX, .kv_type = kv_types[k]};
		CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
		const struct hparams *hp = &m->hp;
		CHECK(hp->rope == ROPE_NORM && !m->rope_freqs); /* the reference below */
		size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, rb = c->kv_row_bytes;
		int32_t tok[T_PROMPT], kept[T_PROMPT];
		tokens(tok, T_PROMPT, hp->n_vocab);
		int nk = 0;
		for (int i = 0; i < T_PROMPT; i++)
			if (i < n_keep || i >= n_keep + n_discard)
				kept[nk++] = tok[i];
		CHECK_OK(prefill(c, 0, tok, T_PROMPT, &err));
		size_t seq_bytes = c->kv_seq_stride;
		uint8_t *k0 = malloc(seq_bytes), *v0 = malloc(seq_bytes);
		float *x = malloc(kvd * sizeof(float)), *y = malloc(kvd * sizeof(float));
		double *ref = malloc(kvd * sizeof(double));
		memcpy(k0, c->k_cache, seq_bytes);
		memcpy(v0, c->v_cache, seq_bytes);
		CHECK_OK(engine_seq_shift(c, 0, n_keep, n_discard, &err));
		CHECK_EQ_INT(engine_seq_len(c, 0), nk);
		CHECK_OK(prefill(c, 1, kept, nk, &err));
		double worst_rot = 0, worst_l0 = 0;
		bool v_same = true, keep_same = true;
		for (uint32_t l = 0; l < hp->n_layer; l++) {
			size_t lo = l * c->kv_layer_stride;
			for (int pnew = 0; pnew < nk; pnew++) {
				int pold = pnew < n_keep ? pnew : pnew + n_discard;
				const uint8_t *kn = c->k_cache + lo + (size_t)pnew * rb;
				const uint8_t *ko = k0 + lo + (size_t)pold * rb;
				v_same &= memcmp(c->v_cache + lo + (size_t)pnew * rb,
						 v0 + lo + (size_t)pold * rb, rb) == 0;
				if (pnew < n_keep) {
					keep_same &= memcmp(kn, ko, rb) == 0;
					continue;
				}
				/* the old key rotated back by n_discard positions, in double */
				row_f(c, ko, x);
				for (uint32_t h = 0; h < hp->n_head_kv; h++)
					for (uint32_t i = 0; i < hp->n_rot / 2; i++) {
						double th = -(double)n_discard *
							    pow(hp->rope_base, -2.0 * i / hp->n_rot) *
							    hp->rope_freq_scale;
						size_t ia = h * hp->head_dim + 2 * i, ib = ia + 1;
						ref[ia] = x[ia] * cos(th) - x[ib] * sin(th);
						ref[ib] = x[ia] * sin(th) + x[ib] * cos(th);
					}
				row_f(c, kn, y);
				double d = rel_diff_d(y, ref, (int)kvd);
				worst_rot = d > worst_rot ? d : worst_rot;
				if (l == 0) { /* layer 0 against the fresh prefill */
					row_f(c, c->k_cache + c->kv_seq_stride + (size_t)pnew * rb, x);
					for (size_t i = 0; i < kvd; i++)
						ref[i] = x[i];
					d = rel_diff_d(y, ref, (int)kvd);
					worst_l0 = d > worst_l0 ? d : worst_l0;
				}
			}
		}
		fprintf(stderr, "%s, %s KV: keys vs re-rotation %.3g, layer 0 vs fresh %.3g\n", name,
			engine_kv_type_name(kv_types[k]), worst_rot, worst_l0);
		CHECK(v_same);
		CHECK(keep_same);
		/* a key element against the row's largest, through up to three
		 * roundings of the type (the old key, the shifted one, and the
		 * fresh one or the reference's input): f16's half ulp is 2^-11
		 * of the element, so 3 x 4.9e-4 with the rotation's mixing of
		 * a pair; q8_0's half step is 1/254 of the block's largest
		 * (measured: f16 8.8e-4, q8_0 9.3e-3) */
		static const double cache_tol[] = {1e-5, 2e-3, 2e-2};
		double tol = cache_tol[k];
		CHECK_MSG(worst_rot <= tol, "%s %s: %g", name, engine_kv_type_name(kv_types[k]),
			  worst_rot);
		CHECK_MSG(worst_l0 <= tol, "%s %s: %g", name, engine_kv_type_name(kv_types[k]),
			  worst_l0);
		/* decoding goes on at the shifted length, up to the context */
		int pos = nk;
		for (; pos < N_CTX; pos++)
			if (decode_one(c, 0, tok[pos % T_PROMPT], pos, &err) != 0)
				break;
		CHECK_EQ_INT(pos, N_CTX);
		CHECK_EQ_INT(engine_seq_len(c, 0), N_CTX);
		free(k0);
		free(v0);
		free(x);
		free(y);
		free(ref);
		engine_ctx_free(c);
		engine_model_free(m);
	}
}

static void test_real_stories260k(void)
{
	real_case("stories260K-f32.gguf", 1, 11);
	real_case("stories260K-f16.gguf", 0, 7);
}

static void test_real_stories3m(void)
{
	real_case("stories3M-q8_0.gguf", 1, 11);
}

static void test_refusals(void)
{
	const char *path = test_data_path("models/stories260K-f32.gguf");
	if (access(path, R_OK) != 0) {
		TEST_SKIP_DATA("stories260K-f32.gguf not found under $EDGELM_TESTDATA");
		return;
	}
	struct engine_params p = {.n_threads = 1};
	engine_model *m = NULL;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	CHECK_OK(engine_model_load(path, &p, &m, &err));
	struct engine_ctx_params cp = {.n_ctx = N_CTX, .n_seq = 1, .n_batch = N_CTX};
	CHECK_OK(engine_ctx_new(m, &cp, &c, &err));
	int32_t tok[8];
	tokens(tok, 8, m->hp.n_vocab);
	CHECK_OK(prefill(c, 0, tok, 8, &err));
	CHECK_EQ_INT(engine_seq_shift(c, 1, 0, 1, &err), -EINVAL);
	CHECK_EQ_INT(engine_seq_shift(c, 0, 4, 5, &err), -EINVAL);
	CHECK(strstr(err.msg, "keep 4, discard 5 of 8") != NULL);
	CHECK_EQ_INT(engine_seq_shift(c, 0, -1, 1, &err), -EINVAL);
	CHECK_OK(engine_seq_shift(c, 0, 2, 0, &err));
	CHECK_EQ_INT(engine_seq_len(c, 0), 8);
	CHECK_OK(engine_seq_shift(c, 0, 2, 6, &err)); /* the whole tail */
	CHECK_EQ_INT(engine_seq_len(c, 0), 2);
	/* a full context dropped whole: no rope row n_ctx is read */
	int32_t full[N_CTX];
	tokens(full, N_CTX, m->hp.n_vocab);
	CHECK_OK(prefill(c, 0, full, N_CTX, &err));
	CHECK_OK(engine_seq_shift(c, 0, 0, N_CTX, &err));
	CHECK_EQ_INT(engine_seq_len(c, 0), 0);
	engine_ctx_free(c);
	engine_model_free(m);
}

int main(void)
{
	TEST_RUN(test_one_layer_llama);
	TEST_RUN(test_one_layer_qwen2);
	TEST_RUN(test_one_layer_phi3);
	TEST_RUN(test_one_layer_gemma3);
	TEST_RUN(test_one_layer_rope_knobs);
	TEST_RUN(test_real_stories260k);
	TEST_RUN(test_real_stories3m);
	TEST_RUN(test_refusals);
	return test_finish();
}
