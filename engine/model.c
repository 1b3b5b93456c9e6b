/* engine/model.c: model loading (llama-family architectures from GGUF) and
 * the batched forward pass.
 *
 * Loading validates the architecture, every hyperparameter and every tensor
 * (presence, shape, type) against what the architecture needs, and refuses
 * a file with tensors it would not use, as llama.cpp does. Weights stay in
 * the read-only mapping; only small vectors stored in a non-f32 type are
 * converted into owned memory.
 *
 * The forward pass processes a batch of tokens that may belong to different
 * sequences (prefill chunks and decode steps alike). Each matmul reads every
 * weight row once for all tokens of the batch. The result for a token does
 * not depend on the batch it travels in, nor on the number of threads: every
 * output element is computed by one thread with the same sequence of
 * operations (rows are split between threads; reductions never are). */
#include "engine/engine_impl.h"
#include "engine/matmul.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_LAYERS 512
#define MAX_EMBD (1 << 16)
#define MAX_FF (1 << 20)
#define MAX_HEAD_DIM 1024
#define MAX_VOCAB (1 << 22)

static const struct {
	const char *name;
	enum arch_kind kind;
	enum rope_kind rope;
} archs[] = {
	{"llama", ARCH_LLAMA, ROPE_NORM},
	{"qwen2", ARCH_QWEN2, ROPE_NEOX},
	{"qwen3", ARCH_QWEN3, ROPE_NEOX},
	{"phi3", ARCH_PHI3, ROPE_NEOX},
	{"gemma", ARCH_GEMMA, ROPE_NEOX},
	{"gemma2", ARCH_GEMMA2, ROPE_NEOX},
	{"gemma3", ARCH_GEMMA3, ROPE_NEOX},
};

/* ---- loading ------------------------------------------------------------- */

struct loader {
	engine_model *m;
	const struct gguf_file *f;
	bool *used; /* per tensor of the file */
	const char *arch;
	struct cm_err *err;
};

static int hp_u32(struct loader *L, const char *key, bool required, uint32_t def, uint32_t *ret)
{
	char full[128];
	snprintf(full, sizeof(full), "%s.%s", L->arch, key);
	int r = gguf_get_u32(L->f, full, ret, L->err);
	if (r == -ENOENT) {
		if (required)
			return cm_err_set(L->err, -EPROTO, "model: missing key '%s'", full);
		*ret = def;
		return 0;
	}
	return r;
}

static int hp_f32(struct loader *L, const char *key, bool required, float def, float *ret)
{
	char full[128];
	snprintf(full, sizeof(full), "%s.%s", L->arch, key);
	int r = gguf_get_f32(L->f, full, ret, L->err);
	if (r == -ENOENT) {
		if (required)
			return cm_err_set(L->err, -EPROTO, "model: missing key '%s'", full);
		*ret = def;
		return 0;
	}
	if (r == 0 && !isfinite(*ret))
		return cm_err_set(L->err, -EPROTO, "model: key '%s' is not finite", full);
	return r;
}

static const struct gguf_tensor *find_tensor(struct loader *L, const char *name, bool required)
{
	const struct gguf_tensor *t = gguf_find_tensor(L->f, name);
	if (!t) {
		if (required)
			cm_err_set(L->err, -EPROTO, "model: missing tensor '%s'", name);
		return NULL;
	}
	L->used[t - L->f->tensors] = true;
	return t;
}

static int check_shape(struct loader *L, const struct gguf_tensor *t, uint32_t n_dims, int64_t ne0,
		       int64_t ne1)
{
	int64_t want[GGUF_MAX_DIMS] = {ne0, ne1, 1, 1};
	bool ok = t->n_dims >= 1;
	for (int i = 0; i < GGUF_MAX_DIMS && ok; i++)
		ok = t->ne[i] == want[i];
	if (!ok) {
		return cm_err_set(L->err, -EPROTO,
				  "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected "
				  "[%lld, %lld]",
				  t->name, (long long)t->ne[0], (long long)t->ne[1],
				  (long long)t->ne[2], (long long)t->ne[3], (long long)ne0,
				  (long long)ne1);
	}
	(void)n_dims;
	return 0;
}

/* A matrix [n_in, n_out]; optional ones left zeroed when absent. */
static int load_matrix(struct loader *L, const char *name, int64_t n_in, int64_t n_out,
		       bool required, struct weight *w)
{
	memset(w, 0, sizeof(*w));
	const struct gguf_tensor *t = find_tensor(L, name, required);
	if (!t)
		return required ? L->err ? L->err->code : -EPROTO : 0;
	int r = check_shape(L, t, 2, n_in, n_out);
	if (r)
		return r;
	const struct kern_type_ops *ko = &L->m->kern->t[t->type < ENGINE_DTYPE_COUNT ? t->type : 0];
	if (t->type >= ENGINE_DTYPE_COUNT || !ko->vec_dot || !ko->dequant)
		return cm_err_set(L->err, -ENOTSUP,
				  "model: tensor '%s': type %s is not supported by this engine",
				  t->name, dtype_name(t->type));
	w->data = t->data;
	w->type = t->type;
	w->n_in = n_in;
	w->n_out = n_out;
	w->row_bytes = t->row_bytes;
	w->name = t->name;
	return 0;
}

static int own(engine_model *m, void *p)
{
	if (m->n_owned == m->cap_owned) {
		int cap = m->cap_owned ? m->cap_owned * 2 : 64;
		void **n = cm_realloc(m->owned, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		m->owned = n;
		m->cap_owned = cap;
	}
	m->owned[m->n_owned++] = p;
	return 0;
}

/* A vector of n floats. */
static int load_vector(struct loader *L, const char *name, int64_t n, bool required,
		       const float **ret)
{
	*ret = NULL;
	const struct gguf_tensor *t = find_tensor(L, name, required);
	if (!t)
		return required ? L->err ? L->err->code : -EPROTO : 0;
	int r = check_shape(L, t, 1, n, 1);
	if (r)
		return r;
	if (t->type == ENGINE_DTYPE_F32 && ((uintptr_t)t->data % sizeof(float)) == 0) {
		*ret = t->data;
		return 0;
	}
	float *v = cm_aligned_alloc((size_t)n * sizeof(float));
	if (!v || own(L->m, v) != 0) {
		cm_free(v);
		return cm_err_set(L->err, -ENOMEM, "model: out of memory");
	}
	if (dequantize_row(t->type, t->data, v, n) != 0)
		return cm_err_set(L->err, -ENOTSUP, "model: tensor '%s': type %s not supported",
				  t->name, dtype_name(t->type));
	*ret = v;
	return 0;
}

/* phi3: one sliding window on every layer; 0 means none (Phi-4). Files from
 * before the key existed get llama.cpp's values for the Phi-3 shapes. */
static int phi3_window(struct loader *L)
{
	struct hparams *hp = &L->m->hp;
	char key[128];
	snprintf(key, sizeof(key), "%s.attention.sliding_window", L->arch);
	if (gguf_find_kv(L->f, key))
		return hp_u32(L, "attention.sliding_window", true, 0, &hp->n_swa);
	if (hp->n_ctx_train == 4096 && (hp->n_layer == 32 || hp->n_layer == 40))
		hp->n_swa = 2047; /* mini, medium 4k */
	else if (hp->n_ctx_train == 131072 && hp->n_layer == 32)
		hp->n_swa = 262144; /* mini 128k */
	else if (hp->n_ctx_train == 131072 && hp->n_layer == 40)
		hp->n_swa = 131072; /* medium 128k */
	else
		return cm_err_set(L->err, -EPROTO,
				  "model: missing key '%s' (no default for %u layers, context %u)",
				  key, hp->n_layer, hp->n_ctx_train);
	return 0;
}

/* What phi3 and the gemmas add to the llama hyperparameters
 * (gguf-formats §4.4). The defaults are llama's. */
static int load_hparams_arch(struct loader *L)
{
	struct hparams *hp = &L->m->hp;
	int r;
	hp->act = FFN_SILU;
	hp->embd_scale = 1.0f;
	hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
	hp->attn_softcap = hp->final_softcap = 0;
	hp->n_swa = 0;
	hp->rope_base_local = 0;
	if (hp->arch == ARCH_PHI3)
		return phi3_window(L);
	if (hp->arch != ARCH_GEMMA && hp->arch != ARCH_GEMMA2 && hp->arch != ARCH_GEMMA3)
		return 0;
	/* The files store the norms' 1 + w already: plain RMSNorm multiplies. */
	hp->act = FFN_GELU;
	hp->embd_scale = sqrtf((float)hp->n_embd);
	/* The 27B models scale queries by n_embd / n_head rather than the head
	 * dimension; llama.cpp tells them by their layer count (46 for gemma2
	 * as the formats doc says; 62 for gemma3, which it does not list). */
	if ((hp->arch == ARCH_GEMMA2 && hp->n_layer == 46) ||
	    (hp->arch == ARCH_GEMMA3 && hp->n_layer == 62))
		hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
	if (hp->arch == ARCH_GEMMA2) {
		if ((r = hp_f32(L, "attn_logit_softcapping", false, 50.0f, &hp->attn_softcap)) ||
		    (r = hp_f32(L, "final_logit_softcapping", false, 30.0f, &hp->final_softcap)) ||
		    (r = hp_u32(L, "attention.sliding_window", false, 4096, &hp->n_swa)))
			return r;
		if (!(hp->attn_softcap > 0) || !(hp->final_softcap > 0))
			return cm_err_set(L->err, -EPROTO,
					  "model: gemma2 logit soft-capping values must be positive");
	} else if (hp->arch == ARCH_GEMMA3) {
		if ((r = hp_u32(L, "attention.sliding_window", true, 0, &hp->n_swa)))
			return r;
		hp->rope_base_local = 10000.0f; /* sliding layers: fixed base, no scaling */
	}
	if (hp->arch != ARCH_GEMMA && hp->n_swa == 0)
		return cm_err_set(L->err, -EPROTO, "model: key '%s.attention.sliding_window' is 0",
				  L->arch);
	return 0;
}

/* The sliding window of layer il (gguf-formats §4.4), 0: full attention. */
static uint32_t layer_window(const struct hparams *hp, uint32_t il)
{
	switch (hp->arch) {
	case ARCH_PHI3: return hp->n_swa;                            /* every layer */
	case ARCH_GEMMA2: return il % 2 == 0 ? hp->n_swa : 0;        /* even layers */
	case ARCH_GEMMA3: return (il + 1) % 6 != 0 ? hp->n_swa : 0;  /* 5 of each 6 */
	default: return 0;
	}
}

static int load_hparams(struct loader *L)
{
	struct hparams *hp = &L->m->hp;
	int r;
	uint32_t key_len, val_len, n_rot;
	if ((r = hp_u32(L, "context_length", true, 0, &hp->n_ctx_train)) ||
	    (r = hp_u32(L, "embedding_length", true, 0, &hp->n_embd)) ||
	    (r = hp_u32(L, "block_count", true, 0, &hp->n_layer)) ||
	    (r = hp_u32(L, "feed_forward_length", true, 0, &hp->n_ff)) ||
	    (r = hp_u32(L, "attention.head_count", true, 0, &hp->n_head)))
		return r;
	if (hp->n_embd == 0 || hp->n_embd > MAX_EMBD)
		return cm_err_set(L->err, -EPROTO, "model: embedding_length %u out of range",
				  hp->n_embd);
	if (hp->n_layer == 0 || hp->n_layer > MAX_LAYERS)
		return cm_err_set(L->err, -EPROTO, "model: block_count %u out of range", hp->n_layer);
	if (hp->n_ff == 0 || hp->n_ff > MAX_FF)
		return cm_err_set(L->err, -EPROTO, "model: feed_forward_length %u out of range",
				  hp->n_ff);
	if (hp->n_head == 0 || hp->n_head > hp->n_embd)
		return cm_err_set(L->err, -EPROTO, "model: head_count %u out of range", hp->n_head);
	if (hp->n_ctx_train == 0)
		return cm_err_set(L->err, -EPROTO, "model: context_length is 0");
	if ((r = hp_u32(L, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv)))
		return r;
	if (hp->n_head_kv == 0 || hp->n_head % hp->n_head_kv != 0)
		return cm_err_set(L->err, -EPROTO,
				  "model: head_count_kv %u does not divide head_count %u",
				  hp->n_head_kv, hp->n_head);
	uint32_t def_hd = hp->n_embd / hp->n_head;
	if ((r = hp_u32(L, "attention.key_length", false, def_hd, &key_len)) ||
	    (r = hp_u32(L, "attention.value_length", false, def_hd, &val_len)))
		return r;
	if (key_len != val_len)
		return cm_err_set(L->err, -ENOTSUP,
				  "model: key_length %u != value_length %u is not supported", key_len,
				  val_len);
	if (key_len == 0 || key_len > MAX_HEAD_DIM || key_len % 2)
		return cm_err_set(L->err, -EPROTO, "model: head dimension %u out of range", key_len);
	hp->head_dim = key_len;
	if ((r = hp_u32(L, "rope.dimension_count", false, key_len, &n_rot)))
		return r;
	if (n_rot == 0 || n_rot > key_len || n_rot % 2)
		return cm_err_set(L->err, -EPROTO, "model: rope.dimension_count %u out of range",
				  n_rot);
	if (hp->arch == ARCH_LLAMA && n_rot != key_len)
		return cm_err_set(L->err, -EPROTO,
				  "model: rope.dimension_count %u must equal the head dimension %u",
				  n_rot, key_len);
	hp->n_rot = n_rot;
	if ((r = hp_f32(L, "attention.layer_norm_rms_epsilon", true, 0, &hp->eps)) ||
	    (r = hp_f32(L, "rope.freq_base", false, 10000.0f, &hp->rope_base)))
		return r;
	if (!(hp->eps > 0) || !(hp->rope_base > 0))
		return cm_err_set(L->err, -EPROTO, "model: epsilon or rope.freq_base not positive");
	/* Linear rope scaling (older keys too); other types come with their
	 * architectures. */
	float factor = 0;
	char key[128];
	struct gguf_str stype = {0};
	snprintf(key, sizeof(key), "%s.rope.scaling.type", L->arch);
	r = gguf_get_str(L->f, key, &stype, L->err);
	if (r && r != -ENOENT)
		return r;
	bool scaled = r == 0 && !gguf_str_eq(stype, "none");
	/* phi3's longrope: its factor tensors and attn_factor, in rope_tables() */
	bool longrope = scaled && hp->arch == ARCH_PHI3 && gguf_str_eq(stype, "longrope");
	if (scaled && !longrope && !gguf_str_eq(stype, "linear"))
		return cm_err_set(L->err, -ENOTSUP, "model: rope scaling type '%.*s' not supported",
				  (int)CM_MIN(stype.len, 32), stype.ptr);
	if ((r = hp_f32(L, "rope.scaling.factor", false, 0, &factor)))
		return r;
	if (factor == 0 && (r = hp_f32(L, "rope.scale_linear", false, 0, &factor)))
		return r;
	hp->rope_freq_scale = (factor > 0 && (scaled || r == 0)) ? 1.0f / factor : 1.0f;
	if (r == 0 && stype.ptr && gguf_str_eq(stype, "none"))
		hp->rope_freq_scale = 1.0f;
	if ((r = hp_f32(L, "rope.scaling.attn_factor", false, 1.0f, &hp->rope_attn_factor)) ||
	    (r = hp_u32(L, "rope.scaling.original_context_length", false, hp->n_ctx_train,
			&hp->n_ctx_orig)))
		return r;
	if (!(hp->rope_attn_factor > 0))
		return cm_err_set(L->err, -EPROTO, "model: rope.scaling.attn_factor not positive");
	return load_hparams_arch(L);
}

/* Rows [first, first + n) of w as a matrix of their own: phi3's fused
 * attn_qkv and ffn_up become the usual Q, K, V and gate, up weights. */
static struct weight weight_rows(const struct weight *w, int64_t first, int64_t n)
{
	struct weight v = *w;
	v.data = (const uint8_t *)w->data + (size_t)first * w->row_bytes;
	v.n_out = n;
	return v;
}

/* phi3 longrope: divisors of the rope frequencies, both or neither. */
static int load_rope_factors(struct loader *L)
{
	engine_model *m = L->m;
	int64_t n = m->hp.n_rot / 2;
	int r;
	if ((r = load_vector(L, "rope_factors_long.weight", n, false, &m->rope_long)) ||
	    (r = load_vector(L, "rope_factors_short.weight", n, false, &m->rope_short)))
		return r;
	if (!m->rope_long != !m->rope_short)
		return cm_err_set(L->err, -EPROTO, "model: missing tensor '%s'",
				  m->rope_long ? "rope_factors_short.weight"
					       : "rope_factors_long.weight");
	for (int64_t i = 0; m->rope_long && i < n; i++)
		if (!(m->rope_long[i] > 0) || !(m->rope_short[i] > 0) ||
		    !isfinite(m->rope_long[i]) || !isfinite(m->rope_short[i]))
			return cm_err_set(L->err, -EPROTO,
					  "model: rope factor %lld is not a positive number",
					  (long long)i);
	return 0;
}

static int load_tensors(struct loader *L)
{
	engine_model *m = L->m;
	const struct hparams *hp = &m->hp;
	int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
	int64_t QD = (int64_t)hp->head_dim * hp->n_head, KD = (int64_t)hp->head_dim * hp->n_head_kv;
	bool phi3 = hp->arch == ARCH_PHI3;
	bool gemma = hp->arch == ARCH_GEMMA || hp->arch == ARCH_GEMMA2 || hp->arch == ARCH_GEMMA3;
	bool bias_req = hp->arch == ARCH_QWEN2;
	char name[GGUF_MAX_NAME + 16];
	int r;

	if ((r = load_matrix(L, "token_embd.weight", E, V, true, &m->tok_embd)) ||
	    (r = load_vector(L, "output_norm.weight", E, true, &m->output_norm)) ||
	    (r = load_matrix(L, "output.weight", E, V, phi3, &m->output)))
		return r;
	if (!m->output.data)
		m->output = m->tok_embd; /* tied embeddings */
	if (phi3 && (r = load_rope_factors(L)))
		return r;
	if (!phi3 && !gemma &&
	    (r = load_vector(L, "rope_freqs.weight", hp->n_rot / 2, false, &m->rope_freqs)))
		return r;

	m->layers = cm_calloc(hp->n_layer, sizeof(*m->layers));
	if (!m->layers)
		return cm_err_set(L->err, -ENOMEM, "model: out of memory");
	for (uint32_t i = 0; i < hp->n_layer; i++) {
		struct layer *l = &m->layers[i];
#define NAME(s) (snprintf(name, sizeof(name), "blk.%u." s, i), name)
		/* phi3 fuses Q, K, V (rows in that order); llama.cpp also takes
		 * them separate, with optional biases as llama */
		bool fused = phi3 && !gguf_find_tensor(L->f, NAME("attn_q.weight"));
		if ((r = load_vector(L, NAME("attn_norm.weight"), E, true, &l->attn_norm)))
			return r;
		if (fused) {
			struct weight qkv;
			if ((r = load_matrix(L, NAME("attn_qkv.weight"), E, QD + 2 * KD, true, &qkv)))
				return r;
			l->wq = weight_rows(&qkv, 0, QD);
			l->wk = weight_rows(&qkv, QD, KD);
			l->wv = weight_rows(&qkv, QD + KD, KD);
		} else if ((r = load_matrix(L, NAME("attn_q.weight"), E, QD, true, &l->wq)) ||
			   (r = load_matrix(L, NAME("attn_k.weight"), E, KD, true, &l->wk)) ||
			   (r = load_matrix(L, NAME("attn_v.weight"), E, KD, true, &l->wv))) {
			return r;
		}
		if ((r = load_matrix(L, NAME("attn_output.weight"), QD, E, true, &l->wo)))
			return r;
		if (!gemma && !fused &&
		    ((r = load_vector(L, NAME("attn_q.bias"), QD, bias_req, &l->bq)) ||
		     (r = load_vector(L, NAME("attn_k.bias"), KD, bias_req, &l->bk)) ||
		     (r = load_vector(L, NAME("attn_v.bias"), KD, bias_req, &l->bv)) ||
		     (r = load_vector(L, NAME("attn_output.bias"), E, false, &l->bo))))
			return r;
		if ((r = load_vector(L, NAME("ffn_norm.weight"), E, true, &l->ffn_norm)))
			return r;
		if (phi3) {
			/* fused: the first n_ff rows are the gate, the next n_ff up */
			struct weight up;
			if ((r = load_matrix(L, NAME("ffn_up.weight"), E, 2 * F, true, &up)))
				return r;
			l->w_gate = weight_rows(&up, 0, F);
			l->w_up = weight_rows(&up, F, F);
		} else if ((r = load_matrix(L, NAME("ffn_gate.weight"), E, F, true, &l->w_gate)) ||
			   (r = load_matrix(L, NAME("ffn_up.weight"), E, F, true, &l->w_up))) {
			return r;
		}
		if ((r = load_matrix(L, NAME("ffn_down.weight"), F, E, true, &l->w_down)))
			return r;
		if (hp->arch == ARCH_QWEN3 || hp->arch == ARCH_GEMMA3) {
			if ((r = load_vector(L, NAME("attn_q_norm.weight"), hp->head_dim, true,
					     &l->q_norm)) ||
			    (r = load_vector(L, NAME("attn_k_norm.weight"), hp->head_dim, true,
					     &l->k_norm)))
				return r;
		}
		if (hp->arch == ARCH_GEMMA2 || hp->arch == ARCH_GEMMA3) {
			if ((r = load_vector(L, NAME("post_attention_norm.weight"), E, true,
					     &l->post_attn_norm)) ||
			    (r = load_vector(L, NAME("post_ffw_norm.weight"), E, true,
					     &l->post_ffn_norm)))
				return r;
		}
		l->n_swa = layer_window(hp, i);
		l->rope_local = hp->rope_base_local > 0 && l->n_swa > 0;
#undef NAME
	}
	for (uint64_t i = 0; i < L->f->n_tensors; i++)
		if (!L->used[i])
			return cm_err_set(L->err, -EPROTO,
					  "model: unexpected tensor '%s' for architecture %s",
					  L->f->tensors[i].name, L->arch);
	return 0;
}

static uint64_t weight_bytes(const struct weight *w)
{
	return w->data ? (uint64_t)w->row_bytes * (uint64_t)w->n_out : 0;
}

int engine_model_matrices(engine_model *m, struct weight ***ret)
{
	int cap = (int)m->hp.n_layer * 7 + 1, n = 0;
	struct weight **v = cm_calloc((size_t)cap, sizeof(*v));
	*ret = v;
	if (!v)
		return 0;
	for (uint32_t i = 0; i < m->hp.n_layer; i++) {
		struct layer *l = &m->layers[i];
		struct weight *lw[] = {&l->wq, &l->wk, &l->wv, &l->wo,
				       &l->w_gate, &l->w_up, &l->w_down};
		for (size_t k = 0; k < CM_ARRAY_LEN(lw); k++)
			if (lw[k]->data)
				v[n++] = lw[k];
	}
	v[n++] = &m->output;
	return n;
}

static void fill_info(engine_model *m)
{
	struct engine_model_info *in = &m->info;
	const struct hparams *hp = &m->hp;
	snprintf(in->arch, sizeof(in->arch), "%s", archs[hp->arch].name);
	in->n_vocab = hp->n_vocab;
	in->n_embd = hp->n_embd;
	in->n_layer = hp->n_layer;
	in->n_head = hp->n_head;
	in->n_head_kv = hp->n_head_kv;
	in->n_ff = hp->n_ff;
	in->head_dim = hp->head_dim;
	in->n_ctx_train = hp->n_ctx_train;
	in->n_ctx = m->n_ctx;
	in->rope_base = hp->rope_base;
	in->norm_eps = hp->eps;
	in->isa = m->kern ? m->kern->name : "none";
	in->n_threads = m->pool ? pool_size(m->pool) : 0;
	uint64_t per_tok = 0;
	struct weight **mats = NULL;
	int n_mats = engine_model_matrices(m, &mats);
	for (int i = 0; i < n_mats; i++)
		per_tok += weight_bytes(mats[i]);
	cm_free(mats);
	in->weight_bytes_token = per_tok;
	const struct gguf_file *f = m->file;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		in->weight_bytes += t->nbytes;
		uint64_t ne = 1;
		for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
			ne *= (uint64_t)t->ne[d];
		in->n_params += ne;
		if (t->type < CM_ARRAY_LEN(in->type_counts))
			in->type_counts[t->type]++;
	}
}

static int count_cpus(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		int n = CPU_COUNT(&set);
		if (n > 0)
			return n;
	}
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

int engine_model_load(const char *path, const struct engine_params *p, engine_model **ret_model,
		      struct cm_err *err)
{
	struct engine_params defaults = {0};
	if (!p)
		p = &defaults;
	quant_init();
	engine_model *m = cm_calloc(1, sizeof(*m));
	if (!m)
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	struct loader L = {.m = m, .err = err};
	int r = gguf_open(path, &m->file, err);
	if (r)
		goto fail;
	L.f = m->file;

	struct gguf_str arch;
	r = gguf_get_str(L.f, "general.architecture", &arch, err);
	if (r == -ENOENT)
		r = cm_err_set(err, -EPROTO, "model: missing key 'general.architecture'");
	if (r)
		goto fail;
	size_t ai;
	for (ai = 0; ai < CM_ARRAY_LEN(archs); ai++)
		if (gguf_str_eq(arch, archs[ai].name))
			break;
	if (ai == CM_ARRAY_LEN(archs)) {
		r = cm_err_set(err, -ENOTSUP,
			       "model: architecture '%.*s' is not supported (supported: llama, "
			       "qwen2, qwen3, phi3, gemma, gemma2, gemma3)",
			       (int)CM_MIN(arch.len, 64), arch.ptr);
		goto fail;
	}
	L.arch = archs[ai].name;
	m->hp.arch = archs[ai].kind;
	m->hp.rope = archs[ai].rope;
	struct gguf_str gname;
	if (gguf_get_str(L.f, "general.name", &gname, NULL) == 0)
		snprintf(m->info.name, sizeof(m->info.name), "%.*s", (int)CM_MIN(gname.len, 127),
			 gname.ptr);

	r = engine_tokenizer_new(L.f, &m->tok, err);
	if (r) {
		cm_err_prefix(err, "model");
		goto fail;
	}
	m->hp.n_vocab = (uint32_t)engine_tokenizer_n_vocab(m->tok);
	if (p->vocab_only) {
		m->vocab_only = true;
		*ret_model = m;
		return 0;
	}

	struct kern_caps caps;
	kern_detect_caps(&caps);
	/* forcing the AMX variant asks for its permission (kern.h); the best
	 * variant uses AMX only when the process already holds it */
	if (p->isa && strcasecmp(p->isa, "amx") == 0 && caps.amx_int8)
		(void)kern_amx_request();
	m->kern = kern_select(&caps, p->isa);
	if (!m->kern) {
		r = cm_err_set(err, -ENOTSUP,
			       "model: kernel variant '%s' is not available on this CPU/build",
			       p->isa ? p->isa : "");
		goto fail;
	}
	if ((r = load_hparams(&L)))
		goto fail;
	if (m->hp.n_vocab > MAX_VOCAB) {
		r = cm_err_set(err, -EPROTO, "model: vocabulary of %u tokens too large",
			       m->hp.n_vocab);
		goto fail;
	}
	L.used = cm_calloc(L.f->n_tensors ? L.f->n_tensors : 1, sizeof(bool));
	if (!L.used) {
		r = cm_err_set(err, -ENOMEM, "model: out of memory");
		goto fail;
	}
	r = load_tensors(&L);
	cm_free(L.used);
	if (r)
		goto fail;
	m->n_ctx = m->hp.n_ctx_train;
	if (p->ctx_max > 0 && p->ctx_max < m->n_ctx)
		m->n_ctx = p->ctx_max;
	int nt = p->n_threads > 0 ? p->n_threads : count_cpus();
	if ((r = pool_new(nt, p->cpus, p->n_cpus, &m->pool, err)))
		goto fail;
	fill_info(m);
	if ((r = engine_model_repack(m, p->repack, p->repack_segment, err)))
		goto fail;
	*ret_model = m;
	return 0;
fail:
	engine_model_free(m);
	return r;
}

void engine_model_free(engine_model *m)
{
	if (!m)
		return;
	pool_free(m->pool);
	engine_tokenizer_free(m->tok);
	for (int i = 0; i < m->n_owned; i++)
		cm_free(m->owned[i]);
	cm_free(m->owned);
	cm_free(m->layers);
	if (m->own_copy)
		munmap(m->own_copy, m->own_copy_len);
	gguf_close(m->file);
	cm_free(m);
}

void engine_model_get_info(const engine_model *m, struct engine_model_info *ret_info)
{
	*ret_info = m->info;
	if (m->vocab_only) {
		ret_info->n_vocab = m->hp.n_vocab;
		ret_info->isa = "none";
	}
}

const engine_tokenizer *engine_model_tokenizer(const engine_model *m)
{
	return m->tok;
}

void engine_model_region(const engine_model *m, struct engine_region *ret)
{
	ret->addr = m->relocated ? m->relocated : (void *)m->file->base;
	/* the engine's own copy in whole 2 MiB pages: an mlock of a range
	 * that ends inside a huge page would split it */
	ret->len = m->own_copy ? m->own_copy_len : m->file->size;
	ret->what = "weights";
}

static void rebase(const void **p, const uint8_t *old, size_t size, uint8_t *buf)
{
	const uint8_t *q = *p;
	if (q && q >= old && q < old + size)
		*p = buf + (q - old);
}

void model_rebase(engine_model *m, void *buf)
{
	const uint8_t *old = m->file->base;
	size_t size = m->file->size;
	uint8_t *nb = buf;
#define RB(x) rebase((const void **)&(x), old, size, nb)
	RB(m->tok_embd.data);
	RB(m->output.data);
	RB(m->output_norm);
	RB(m->rope_freqs);
	RB(m->rope_long);
	RB(m->rope_short);
	for (uint32_t i = 0; i < m->hp.n_layer; i++) {
		struct layer *l = &m->layers[i];
		RB(l->attn_norm);
		RB(l->ffn_norm);
		RB(l->bq);
		RB(l->bk);
		RB(l->bv);
		RB(l->bo);
		RB(l->q_norm);
		RB(l->k_norm);
		RB(l->post_attn_norm);
		RB(l->post_ffn_norm);
		RB(l->wq.data);
		RB(l->wk.data);
		RB(l->wv.data);
		RB(l->wo.data);
		RB(l->w_gate.data);
		RB(l->w_up.data);
		RB(l->w_down.data);
	}
#undef RB
	m->relocated = buf;
	/* The file mapping stays (metadata is still read from it), but its
	 * pages need not stay resident: compute reads only the copy now. */
	if (m->file->mapped)
		(void)madvise((void *)old, size, MADV_DONTNEED);
}

int engine_model_relocate(engine_model *m, void *buf, size_t len, struct cm_err *err)
{
	if (m->vocab_only || m->relocated)
		return cm_err_set(err, -EINVAL, "model: nothing to relocate");
	if (len < m->file->size)
		return cm_err_set(err, -EINVAL, "model: relocation buffer of %zu bytes < %zu", len,
				  m->file->size);
	memcpy(buf, m->file->base, m->file->size);
	model_rebase(m, buf);
	return 0;
}

/* ---- KV cache types -------------------------------------------------------- */

/* The default: f16 halves the cache and its reads, and keeps every greedy
 * token of the reference tests (logits within 0.014; top-1 agreement with
 * an f32 cache 99.9% teacher-forced: docs/engine.md, "The KV cache"). */
#define KV_TYPE_DEFAULT ENGINE_KV_F16

static const char *const kv_type_names[] = {
	[ENGINE_KV_F32] = "f32",
	[ENGINE_KV_F16] = "f16",
	[ENGINE_KV_Q8_0] = "q8_0",
};

static enum engine_kv_type kv_type_resolve(enum engine_kv_type t)
{
	return t == ENGINE_KV_DEFAULT ? KV_TYPE_DEFAULT : t;
}

static bool kv_type_valid(enum engine_kv_type t)
{
	return t == ENGINE_KV_F32 || t == ENGINE_KV_F16 || t == ENGINE_KV_Q8_0;
}

const char *engine_kv_type_name(enum engine_kv_type t)
{
	t = kv_type_resolve(t);
	return kv_type_valid(t) ? kv_type_names[t] : "?";
}

int engine_kv_type_from_name(const char *name, enum engine_kv_type *ret)
{
	for (size_t i = 0; name && i < CM_ARRAY_LEN(kv_type_names); i++)
		if (kv_type_names[i] && strcasecmp(name, kv_type_names[i]) == 0) {
			*ret = (enum engine_kv_type)i;
			return 0;
		}
	return -ENOENT;
}

const char *engine_kv_type_list(void)
{
	return "f32|f16|q8_0";
}

/* Bytes of one cached head row (head_dim elements) in type t: Q8_0 rows are
 * zero-padded to whole blocks, so a block never spans two heads. */
static size_t kv_head_bytes(enum engine_kv_type t, uint32_t head_dim)
{
	switch (kv_type_resolve(t)) {
	case ENGINE_KV_F32:
		return (size_t)head_dim * sizeof(float);
	case ENGINE_KV_F16:
		return (size_t)head_dim * sizeof(uint16_t);
	case ENGINE_KV_Q8_0:
		return (size_t)(head_dim + QK8_0 - 1) / QK8_0 * sizeof(struct block_q8_0);
	default:
		return 0;
	}
}

uint64_t engine_model_kv_bytes_per_token(const engine_model *m, enum engine_kv_type t)
{
	return 2ull * m->hp.n_layer * m->hp.n_head_kv * kv_head_bytes(t, m->hp.head_dim);
}

int engine_ctx_regions(const engine_ctx *c, struct engine_region *ret, int max)
{
	size_t bytes = c->kv_seq_stride * c->n_seq;
	int n = 0;
	if (n < max)
		ret[n++] = (struct engine_region){c->k_cache, bytes, "KV cache (K)"};
	if (n < max)
		ret[n++] = (struct engine_region){c->v_cache, bytes, "KV cache (V)"};
	return n;
}

/* ---- contexts ------------------------------------------------------------ */

static int ctx_alloc(float **p, size_t n)
{
	*p = cm_aligned_alloc(n * sizeof(float));
	if (!*p)
		return -ENOMEM;
	memset(*p, 0, n * sizeof(float));
	return 0;
}

static int ctx_alloc_bytes(uint8_t **p, size_t n)
{
	*p = cm_aligned_alloc(n);
	if (!*p)
		return -ENOMEM;
	memset(*p, 0, n);
	return 0;
}

/* cos and sin of p theta_i for every position p, theta_i = base^(-2i/n_rot)
 * / div[i] (if given) * freq_scale, both times mscale (gguf-formats §4.3). */
static void rope_fill(const engine_ctx *c, float base, const float *div, float freq_scale,
		      float mscale, float *cosv, float *sinv)
{
	const struct hparams *hp = &c->m->hp;
	uint32_t half = hp->n_rot / 2;
	for (uint32_t i = 0; i < half; i++) {
		double inv = pow((double)base, -2.0 * (double)i / (double)hp->n_rot);
		if (div)
			inv /= (double)div[i];
		inv *= (double)freq_scale;
		for (uint32_t p = 0; p < c->n_ctx; p++) {
			double th = (double)p * inv;
			cosv[(size_t)p * half + i] = (float)(cos(th) * mscale);
			sinv[(size_t)p * half + i] = (float)(sin(th) * mscale);
		}
	}
}

static void rope_tables(engine_ctx *c)
{
	const engine_model *m = c->m;
	const struct hparams *hp = &m->hp;
	/* divisors: Llama 3's rope_freqs, or phi3 longrope's long factors when
	 * a sequence may outgrow the original context, else its short ones */
	const float *div = m->rope_freqs;
	if (m->rope_long)
		div = c->n_ctx > hp->n_ctx_orig ? m->rope_long : m->rope_short;
	rope_fill(c, hp->rope_base, div, hp->rope_freq_scale, hp->rope_attn_factor, c->rope_cos,
		  c->rope_sin);
	if (c->rope_cos_local)
		rope_fill(c, hp->rope_base_local, NULL, 1.0f, 1.0f, c->rope_cos_local,
			  c->rope_sin_local);
}

int engine_ctx_new(engine_model *m, const struct engine_ctx_params *p, engine_ctx **ret_ctx,
		   struct cm_err *err)
{
	if (m->vocab_only)
		return cm_err_set(err, -EINVAL, "ctx: model was loaded without weights");
	const struct hparams *hp = &m->hp;
	engine_ctx *c = cm_aligned_alloc(sizeof(*c)); /* 64-aligned: see engine_ctx.chunk */
	if (c)
		memset(c, 0, sizeof(*c));
	if (!c)
		return cm_err_set(err, -ENOMEM, "ctx: out of memory");
	c->m = m;
	c->n_ctx = p && p->n_ctx ? CM_MIN(p->n_ctx, m->n_ctx) : m->n_ctx;
	c->n_seq = p && p->n_seq ? p->n_seq : 1;
	c->n_batch = p && p->n_batch ? p->n_batch : 512;
	if (c->n_seq > 4096 || c->n_batch > 65536) {
		engine_ctx_free(c);
		return cm_err_set(err, -EINVAL, "ctx: n_seq or n_batch out of range");
	}
	c->kv_type = kv_type_resolve(p ? p->kv_type : ENGINE_KV_DEFAULT);
	if (!kv_type_valid(c->kv_type)) {
		int t = (int)c->kv_type;
		engine_ctx_free(c);
		return cm_err_set(err, -EINVAL, "ctx: KV cache type %d unknown (%s)", t,
				  engine_kv_type_list());
	}
	size_t kvd = (size_t)hp->n_head_kv * hp->head_dim;
	size_t nbh = (hp->head_dim + QK8_0 - 1) / QK8_0; /* Q8_0 blocks per head row */
	c->kv_head_bytes = kv_head_bytes(c->kv_type, hp->head_dim);
	c->kv_row_bytes = c->kv_head_bytes * hp->n_head_kv;
	uint64_t kv_bytes, layer_bytes;
	if (cm_mul_overflow_u64(c->kv_row_bytes, c->n_ctx, &layer_bytes) ||
	    cm_mul_overflow_u64(layer_bytes, hp->n_layer, &kv_bytes) ||
	    cm_mul_overflow_u64(kv_bytes, c->n_seq, &kv_bytes) || kv_bytes > (SIZE_MAX / 4)) {
		engine_ctx_free(c);
		return cm_err_set(err, -ENOMEM, "ctx: KV cache size overflows");
	}
	c->kv_layer_stride = (size_t)layer_bytes;
	c->kv_seq_stride = c->kv_layer_stride * hp->n_layer;
	size_t B = c->n_batch, E = hp->n_embd, QD = (size_t)hp->n_head * hp->head_dim;
	size_t FF = hp->n_ff, maxd = CM_MAX(CM_MAX(E, QD), FF);
	int nt = pool_size(m->pool);
	c->act_cap = B * kern_act_row_size(ENGINE_DTYPE_F32, (int64_t)maxd);
	/* the query heads of a KV head together over the F16 cache, where
	 * the variant has kernels for that (attn_heads) */
	const struct kern_ops *kn = m->kern;
	uint32_t group = hp->n_head / hp->n_head_kv;
	c->attn_mq = 1;
	if (c->kv_type == ENGINE_KV_F16 && kn->attn_score_f16_mq && kn->attn_vsum_f16_mq && group > 1)
		c->attn_mq = (int)group;
	int r = 0;
	if (ctx_alloc_bytes(&c->k_cache, kv_bytes) || ctx_alloc_bytes(&c->v_cache, kv_bytes) ||
	    ctx_alloc(&c->kv_pad, nbh * QK8_0) || ctx_alloc(&c->attn_qpad, (size_t)nt * nbh * QK8_0) ||
	    !(c->attn_q8 = cm_aligned_alloc((size_t)nt * nbh * sizeof(struct block_q8_0))) ||
	    !(c->eval_pos = cm_calloc(B, sizeof(int32_t))) ||
	    ctx_alloc(&c->x, B * E) || ctx_alloc(&c->xb, B * maxd) || ctx_alloc(&c->q, B * QD) ||
	    ctx_alloc(&c->k, B * kvd) || ctx_alloc(&c->v, B * kvd) || ctx_alloc(&c->att, B * QD) ||
	    ctx_alloc(&c->hb, B * FF) || ctx_alloc(&c->hb2, B * FF) ||
	    ctx_alloc(&c->scores, (size_t)nt * (size_t)c->attn_mq * c->n_ctx) ||
	    ctx_alloc(&c->logits, B * hp->n_vocab) ||
	    ctx_alloc(&c->rope_cos, (size_t)c->n_ctx * hp->n_rot / 2) ||
	    ctx_alloc(&c->rope_sin, (size_t)c->n_ctx * hp->n_rot / 2) ||
	    (hp->rope_base_local > 0 &&
	     (ctx_alloc(&c->rope_cos_local, (size_t)c->n_ctx * hp->n_rot / 2) ||
	      ctx_alloc(&c->rope_sin_local, (size_t)c->n_ctx * hp->n_rot / 2))) ||
	    !(c->act = cm_aligned_alloc(c->act_cap)) ||
	    !(c->seq_len = cm_calloc(c->n_seq, sizeof(int32_t))) ||
	    !(c->logit_row = cm_calloc(B, sizeof(int32_t))) ||
	    !(c->zero_seq = cm_calloc(B, sizeof(int32_t))) ||
	    !(c->embd_row = cm_malloc(m->tok_embd.row_bytes))) {
		enum engine_kv_type t = c->kv_type;
		engine_ctx_free(c);
		return cm_err_set(err, -ENOMEM,
				  "ctx: cannot allocate KV cache and buffers (%llu MiB of %s KV)",
				  (unsigned long long)(kv_bytes * 2 >> 20), engine_kv_type_name(t));
	}
	rope_tables(c);
	*ret_ctx = c;
	return r;
}

void engine_ctx_free(engine_ctx *c)
{
	if (!c)
		return;
	cm_free(c->k_cache);
	cm_free(c->v_cache);
	cm_free(c->kv_pad);
	cm_free(c->attn_q8);
	cm_free(c->attn_qpad);
	cm_free(c->eval_pos);
	cm_free(c->x);
	cm_free(c->xb);
	cm_free(c->q);
	cm_free(c->k);
	cm_free(c->v);
	cm_free(c->att);
	cm_free(c->hb);
	cm_free(c->hb2);
	cm_free(c->scores);
	cm_free(c->logits);
	cm_free(c->rope_cos);
	cm_free(c->rope_sin);
	cm_free(c->rope_cos_local);
	cm_free(c->rope_sin_local);
	cm_free(c->act);
	cm_free(c->seq_len);
	cm_free(c->logit_row);
	cm_free(c->zero_seq);
	cm_free(c->embd_row);
	cm_free(c);
}

enum engine_kv_type engine_ctx_kv_type(const engine_ctx *c)
{
	return c->kv_type;
}

uint32_t engine_ctx_n_ctx(const engine_ctx *c)
{
	return c->n_ctx;
}

void engine_seq_truncate(engine_ctx *c, int seq, int pos)
{
	if (seq < 0 || (uint32_t)seq >= c->n_seq || pos < 0)
		return;
	if (pos < c->seq_len[seq])
		c->seq_len[seq] = pos;
}

int engine_seq_len(const engine_ctx *c, int seq)
{
	if (seq < 0 || (uint32_t)seq >= c->n_seq)
		return -1;
	return c->seq_len[seq];
}

int engine_seq_copy(engine_ctx *c, int dst, int src, int n)
{
	if (dst < 0 || src < 0 || (uint32_t)dst >= c->n_seq || (uint32_t)src >= c->n_seq ||
	    n < 0 || n > c->seq_len[src])
		return -EINVAL;
	if (dst == src) {
		c->seq_len[dst] = n;
		return 0;
	}
	for (uint32_t l = 0; l < c->m->hp.n_layer; l++) {
		size_t so = (size_t)src * c->kv_seq_stride + l * c->kv_layer_stride;
		size_t d0 = (size_t)dst * c->kv_seq_stride + l * c->kv_layer_stride;
		memcpy(c->k_cache + d0, c->k_cache + so, (size_t)n * c->kv_row_bytes);
		memcpy(c->v_cache + d0, c->v_cache + so, (size_t)n * c->kv_row_bytes);
	}
	c->seq_len[dst] = n;
	return 0;
}

/* ---- forward pass -------------------------------------------------------- */

static void rmsnorm(float *o, const float *x, const float *w, int64_t n, float eps)
{
	prefetch_bytes(x, (size_t)n * sizeof(float)); /* engine_impl.h */
	/* four partial sums: one chain of dependent double adds made this
	 * ~3 % of a prefill; each square is exact in double, so the order
	 * changes ss only far below the float that scale is rounded to. The
	 * vector extension keeps the four sums in lanes (the same sums the
	 * scalar loop made; -O2 left that loop and the product scalar), in
	 * two halves: one accumulator of four doubles, wider than the
	 * baseline's registers, lived on the stack and each add waited on its
	 * store and reload (rmsnorm 2.9 -> 1.2 % of a Qwen2.5 prefill). */
	v2d lo = {0, 0}, hi = {0, 0};
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		v4d d = __builtin_convertvector(v4f_load(x + i), v4d);
		v2d d0 = {d[0], d[1]}, d1 = {d[2], d[3]};
		lo += d0 * d0;
		hi += d1 * d1;
	}
	for (; i < n; i++)
		lo[0] += (double)x[i] * (double)x[i];
	double ss = (lo[0] + lo[1]) + (hi[0] + hi[1]);
	float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
	for (i = 0; i + 4 <= n; i += 4)
		v4f_store(o + i, v4f_load(x + i) * scale * v4f_load(w + i));
	for (; i < n; i++)
		o[i] = x[i] * scale * w[i];
}

/* ---- element-wise work of a batch, on the pool ----------------------------
 * The matmuls are parallel; with a prefill batch, the per-token norms,
 * RoPE and the GeGLU activation (T x n_ff tanhf) would otherwise run on one
 * thread between them. Chunks are claimed in one range per worker, as the matmul
 * rows are (pool_ranges): a worker then takes the same tokens here as in
 * the activation conversion that follows (matmul.c's quant_worker claims
 * tokens the same way), and converts the rows it normed from its own cache
 * (Qwen2.5 0.5B prefill +3.5 % over one shared counter). Each element is
 * computed the same way whoever computes it, so results do not change.
 * Small batches (decode) stay on the calling thread, where
 * waking the pool would cost more than the work. */
enum { PAR_MIN = 1 << 15 }; /* elements below which a job stays serial */

struct par_job {
	engine_ctx *c;
	void (*fn)(engine_ctx *c, int64_t i0, int64_t i1, const void *arg);
	const void *arg;
	int64_t n, chunk;
	struct pool_ranges ranges; /* chunks */
};

static void par_worker(void *varg, int ith, int nth)
{
	struct par_job *j = varg;
	(void)nth;
	for (;;) {
		int64_t k = pool_ranges_claim(&j->ranges, ith);
		if (k < 0)
			break;
		int64_t i0 = k * j->chunk;
		j->fn(j->c, i0, CM_MIN(i0 + j->chunk, j->n), j->arg);
	}
}

/* fn over [0, n) in chunks of `chunk` items of `weight` elements each */
static void par_for(engine_ctx *c, int64_t n, int64_t chunk, int64_t weight,
		    void (*fn)(engine_ctx *c, int64_t i0, int64_t i1, const void *arg),
		    const void *arg)
{
	if (n * weight < PAR_MIN || pool_size(c->m->pool) < 2) {
		fn(c, 0, n, arg);
		return;
	}
	struct par_job j = {.c = c, .fn = fn, .arg = arg, .n = n, .chunk = chunk};
	pool_ranges_init(&j.ranges, (n + chunk - 1) / chunk, pool_size(c->m->pool));
	pool_run(c->m->pool, par_worker, &j);
}

struct norm_arg {
	float *o;
	const float *x, *w;
	int64_t n;
	float eps;
};

static void norm_rows(engine_ctx *c, int64_t t0, int64_t t1, const void *varg)
{
	const struct norm_arg *a = varg;
	(void)c;
	for (int64_t t = t0; t < t1; t++)
		rmsnorm(a->o + t * a->n, a->x + t * a->n, a->w, a->n, a->eps);
}

/* o[t] = rmsnorm(x[t]) * w for T rows of n */
static void rmsnorm_rows(engine_ctx *c, float *o, const float *x, const float *w, int T,
			 int64_t n, float eps)
{
	struct norm_arg a = {o, x, w, n, eps};
	par_for(c, T, 4, n, norm_rows, &a);
}

static float gelu(float x);

/* GeGLU (SwiGLU is engine_matmul_swiglu's) */
static void act_range(engine_ctx *c, int64_t i0, int64_t i1, const void *varg)
{
	(void)varg;
	for (int64_t i = i0; i < i1; i++)
		c->hb[i] = gelu(c->hb[i]) * c->hb2[i];
}

/* local: gemma3's sliding layers, with their own tables */
static void rope_apply(const engine_ctx *c, float *v, int n_heads, int pos, bool local)
{
	const struct hparams *hp = &c->m->hp;
	int half = (int)hp->n_rot / 2;
	const float *cs = (local ? c->rope_cos_local : c->rope_cos) + (size_t)pos * half;
	const float *sn = (local ? c->rope_sin_local : c->rope_sin) + (size_t)pos * half;
	for (int h = 0; h < n_heads; h++) {
		float *x = v + (size_t)h * hp->head_dim;
		int i = 0;
		if (hp->rope == ROPE_NEOX) /* pairs (i, i + half): four at a time */
			for (; i + 4 <= half; i += 4) {
				v4f a = v4f_load(x + i), b = v4f_load(x + i + half);
				v4f c4 = v4f_load(cs + i), s4 = v4f_load(sn + i);
				v4f_store(x + i, a * c4 - b * s4);
				v4f_store(x + i + half, a * s4 + b * c4);
			}
		for (; i < half; i++) {
			int ia = hp->rope == ROPE_NORM ? 2 * i : i;
			int ib = hp->rope == ROPE_NORM ? 2 * i + 1 : i + half;
			float a = x[ia], b = x[ib];
			x[ia] = a * cs[i] - b * sn[i];
			x[ib] = a * sn[i] + b * cs[i];
		}
	}
}

/* kv_store() pads each head through c->kv_pad (Q8_0 cache, head_dim not a
 * multiple of 32): then only one thread may store at a time. */
static bool kv_store_shared(const engine_ctx *c)
{
	return c->kv_type == ENGINE_KV_Q8_0 && c->m->hp.head_dim % QK8_0 != 0;
}

/* One token's K and V rows into the cache, in the cache's type. */
static void kv_store(engine_ctx *c, uint8_t *dst, const float *x)
{
	const struct hparams *hp = &c->m->hp;
	size_t hd = hp->head_dim, kvd = hd * hp->n_head_kv;
	switch (c->kv_type) {
	case ENGINE_KV_F16:
		c->m->kern->quant_act[ENGINE_DTYPE_F16](x, dst, (int64_t)kvd);
		break;
	case ENGINE_KV_Q8_0: {
		kern_quant_fn quant = c->m->kern->quant_act[ENGINE_DTYPE_Q8_0];
		if (hd % QK8_0 == 0) {
			quant(x, dst, (int64_t)kvd);
			break;
		}
		int64_t padded = (int64_t)(c->kv_head_bytes / sizeof(struct block_q8_0)) * QK8_0;
		for (uint32_t h = 0; h < hp->n_head_kv; h++) {
			memcpy(c->kv_pad, x + h * hd, hd * sizeof(float)); /* the tail stays 0 */
			quant(c->kv_pad, dst + h * c->kv_head_bytes, padded);
		}
		break;
	}
	default:
		memcpy(dst, x, kvd * sizeof(float));
		break;
	}
}

/* sc[p] = q . k_p * scale for the n cached rows of one KV head at kc. */
static void attn_scores(engine_ctx *c, int ith, const float *q, const uint8_t *kc, int n,
			float scale, float *sc)
{
	const struct kern_ops *k = c->m->kern;
	int hd = (int)c->m->hp.head_dim;
	size_t stride = c->kv_row_bytes;
	switch (c->kv_type) {
	case ENGINE_KV_F16:
		k->attn_score_f16(hd, n, q, kc, stride, scale, sc);
		break;
	case ENGINE_KV_Q8_0: {
		/* the query meets K in its own format: exact int8 block sums */
		int nbh = (int)(c->kv_head_bytes / sizeof(struct block_q8_0));
		void *q8 = (uint8_t *)c->attn_q8 + (size_t)ith * c->kv_head_bytes;
		const float *qs = q;
		if (hd % QK8_0) {
			float *pad = c->attn_qpad + (size_t)ith * nbh * QK8_0;
			memcpy(pad, q, (size_t)hd * sizeof(float)); /* the tail stays 0 */
			qs = pad;
		}
		k->quant_act[ENGINE_DTYPE_Q8_0](qs, q8, (int64_t)nbh * QK8_0);
		k->attn_score_q8_0(hd, n, q8, kc, stride, scale, sc);
		break;
	}
	default:
		for (int p = 0; p < n; p++)
			sc[p] = k->dot_f32(hd, q, (const float *)(kc + (size_t)p * stride)) * scale;
		break;
	}
}

/* o = sum_p w[p] v_p over the n cached rows of one KV head at vc. */
static void attn_values(engine_ctx *c, const float *w, const uint8_t *vc, int n, float *o)
{
	const struct kern_ops *k = c->m->kern;
	int hd = (int)c->m->hp.head_dim;
	size_t stride = c->kv_row_bytes;
	switch (c->kv_type) {
	case ENGINE_KV_F16:
		k->attn_vsum_f16(hd, n, w, vc, stride, o);
		break;
	case ENGINE_KV_Q8_0:
		k->attn_vsum_q8_0(hd, n, w, vc, stride, o);
		break;
	default:
		memset(o, 0, (size_t)hd * sizeof(float));
		for (int p = 0; p < n; p++)
			k->axpy_f32(hd, w[p], (const float *)(vc + (size_t)p * stride), o);
		break;
	}
}

/* Q/K norms (qwen3, gemma3), RoPE, and the K/V rows into the cache for
 * tokens [t0, t1): each token's rows are its own, so the batch goes to the
 * pool (on one thread this was ~3 % of a Qwen2.5 0.5B prefill, the other
 * worker waiting). */
struct qk_arg {
	const struct layer *L;
	uint32_t layer;
};

static void qk_rows(engine_ctx *c, int64_t t0, int64_t t1, const void *varg)
{
	const struct qk_arg *a = varg;
	const struct layer *L = a->L;
	const struct hparams *hp = &c->m->hp;
	size_t hd = hp->head_dim, QD = hd * hp->n_head, KD = hd * hp->n_head_kv;
	for (int64_t t = t0; t < t1; t++) {
		float *q = c->q + t * QD, *k = c->k + t * KD;
		prefetch_bytes(q, QD * sizeof(float));
		prefetch_bytes(k, KD * sizeof(float));
		prefetch_bytes(c->v + t * KD, KD * sizeof(float));
		if (L->q_norm) {
			for (uint32_t h = 0; h < hp->n_head; h++)
				rmsnorm(q + h * hd, q + h * hd, L->q_norm, (int64_t)hd, hp->eps);
			for (uint32_t h = 0; h < hp->n_head_kv; h++)
				rmsnorm(k + h * hd, k + h * hd, L->k_norm, (int64_t)hd, hp->eps);
		}
		rope_apply(c, q, (int)hp->n_head, c->pos[t], L->rope_local);
		rope_apply(c, k, (int)hp->n_head_kv, c->pos[t], L->rope_local);
		size_t off = (size_t)c->seq[t] * c->kv_seq_stride + a->layer * c->kv_layer_stride +
			     (size_t)c->pos[t] * c->kv_row_bytes;
		kv_store(c, c->k_cache + off, k);
		kv_store(c, c->v_cache + off, c->v + t * KD);
	}
}

struct attn_task {
	engine_ctx *c;
	int layer;
	int n_swa; /* sliding window of the layer, 0: full causal */
	int split; /* runs of query heads per KV head (attn_worker) */
};

/* The largest of x[0..n) (-inf for none), four lanes at a time: with the
 * row 512 tokens long, the scalar loop and the one below were ~4 % of a
 * TinyLlama prefill. max is exact, so the order does not matter. */
static float max_f32(const float *x, int n)
{
	typedef int32_t v4i __attribute__((vector_size(16)));
	v4f m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		v4f v = v4f_load(x + i);
		v4i gt = v > m;
		m = (v4f)(((v4i)v & gt) | ((v4i)m & ~gt));
	}
	float r = -INFINITY;
	for (int k = 0; k < 4; k++)
		r = m[k] > r ? m[k] : r;
	for (; i < n; i++)
		r = x[i] > r ? x[i] : r;
	return r;
}

/* x[0..n) *= f */
static void scale_f32(float *x, int n, float f)
{
	int i = 0;
	for (; i + 4 <= n; i += 4)
		v4f_store(x + i, v4f_load(x + i) * f);
	for (; i < n; i++)
		x[i] *= f;
}

/* gemma2's soft-capping of attention scores and logits */
static float softcap(float s, float cap)
{
	return cap * tanhf(s / cap);
}

/* The softmax of one head's n scores in place (soft-capped first where
 * the architecture says). */
static void softmax_row(const engine_ctx *c, float *s, int n)
{
	float cap = c->m->hp.attn_softcap;
	if (cap > 0)
		for (int p = 0; p < n; p++)
			s[p] = softcap(s[p], cap);
	float mx = max_f32(s, n);
	float sum = c->m->kern->exp_sum_f32(n, s, mx);
	scale_f32(s, n, 1.0f / sum);
}

/* The query heads [h0, h1) of one KV head for token t: scores against the
 * cached rows, softmax, weighted sum of V. With c->attn_mq > 1 (an F16
 * cache and a variant with several-head kernels) they go through those
 * kernels together, their scores side by side in the thread's rows and
 * the K and V rows converted from F16 once for all of them; otherwise
 * head by head. Either way each head's values are the same (kern.h: the
 * several-head kernels give the single-head kernels' bits). */
static void attn_heads(struct attn_task *at, int ith, int t, int h0, int h1)
{
	engine_ctx *c = at->c;
	const struct hparams *hp = &c->m->hp;
	const struct kern_ops *k = c->m->kern;
	int hd = (int)hp->head_dim, nh = (int)hp->n_head, nq = h1 - h0;
	int kvh = h0 / (int)(hp->n_head / hp->n_head_kv);
	size_t ns = (size_t)c->n_ctx;
	float *sc = c->scores + (size_t)ith * (size_t)c->attn_mq * ns;
	int pos = c->pos[t], seq = c->seq[t];
	size_t base = (size_t)seq * c->kv_seq_stride + (size_t)at->layer * c->kv_layer_stride +
		      (size_t)kvh * c->kv_head_bytes;
	/* sliding window: only the last n_swa keys (the cache keeps all) */
	int p0 = at->n_swa > 0 && pos >= at->n_swa ? pos - at->n_swa + 1 : 0, n = pos - p0 + 1;
	const uint8_t *kc = c->k_cache + base + (size_t)p0 * c->kv_row_bytes;
	const uint8_t *vc = c->v_cache + base + (size_t)p0 * c->kv_row_bytes;
	const float *q = c->q + (size_t)t * nh * hd + (size_t)h0 * hd;
	float *o = c->att + (size_t)t * nh * hd + (size_t)h0 * hd;
	if (c->attn_mq > 1) {
		k->attn_score_f16_mq(hd, n, nq, q, (size_t)hd, kc, c->kv_row_bytes, hp->attn_scale,
				     sc + p0, ns);
		for (int i = 0; i < nq; i++)
			softmax_row(c, sc + (size_t)i * ns + p0, n);
		k->attn_vsum_f16_mq(hd, n, nq, sc + p0, ns, vc, c->kv_row_bytes, o, (size_t)hd);
		return;
	}
	for (int i = 0; i < nq; i++) {
		attn_scores(c, ith, q + (size_t)i * hd, kc, n, hp->attn_scale, sc + p0);
		softmax_row(c, sc + p0, n);
		attn_values(c, sc + p0, vc, n, o + (size_t)i * hd);
	}
}

/* Runs per KV head: 1 when tokens x KV heads give every thread two
 * tasks, else as many as that takes (at most one per query head) */
static int attn_split(const engine_ctx *c, int T)
{
	const struct hparams *hp = &c->m->hp;
	int group = (int)(hp->n_head / hp->n_head_kv);
	int tasks = T * (int)hp->n_head_kv, want = 2 * pool_size(c->m->pool);
	return CM_MAX(1, CM_MIN(group, (want + tasks - 1) / tasks));
}

/* A task is (token, KV head, a run of its query heads): the query heads
 * that share a KV head run one after another on one thread, so its K and V
 * rows come from memory once and from that core's cache for the others
 * (dealt one head per task, both cores pulled every KV head, each head
 * again). at->split runs per KV head keep enough tasks for the pool when
 * the batch is one token. Every head's arithmetic is the same whatever
 * the split. */
static void attn_worker(void *arg, int ith, int nth)
{
	struct attn_task *at = arg;
	engine_ctx *c = at->c;
	const struct hparams *hp = &c->m->hp;
	int nkv = (int)hp->n_head_kv, group = (int)(hp->n_head / hp->n_head_kv);
	int per = (group + at->split - 1) / at->split;
	(void)nth;
	for (;;) {
		int i = atomic_fetch_add(&c->chunk, 1);
		if (i >= c->n_tok * nkv * at->split)
			break;
		int t = i / (nkv * at->split), r = i % (nkv * at->split);
		int kvh = r / at->split, part = r % at->split;
		int h0 = kvh * group + part * per, h1 = CM_MIN(h0 + per, (kvh + 1) * group);
		if (h0 < h1) /* a run may start past the group's end (5 heads in runs of 2) */
			attn_heads(at, ith, t, h0, h1);
	}
}

/* tanh GELU; beyond |x| >= 10 it is x or 0 to float precision (ggml
 * takes the same shortcut) */
static float gelu(float x)
{
	if (x >= 10.0f)
		return x;
	if (x <= -10.0f)
		return 0.0f;
	return 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
}

/* gemma2/3: x += RMSNorm(W a) post, the sublayer's output normed before the
 * residual add (through xb, free by then). */
static void add_post_normed(engine_ctx *c, const struct weight *w, const float *a,
			    size_t a_stride, int T, const float *post)
{
	const struct hparams *hp = &c->m->hp;
	size_t E = hp->n_embd;
	engine_matmul(c, w, a, a_stride, T, c->xb, E, NULL, false);
	for (int t = 0; t < T; t++) {
		float *y = c->xb + t * E, *x = c->x + t * E;
		rmsnorm(y, y, post, (int64_t)E, hp->eps);
		for (size_t i = 0; i < E; i++)
			x[i] += y[i];
	}
}

static int check_batch(engine_ctx *c, const struct engine_batch *b, struct cm_err *err)
{
	if (b->n <= 0 || (uint32_t)b->n > c->n_batch)
		return cm_err_set(err, -EINVAL, "decode: batch of %d tokens (max %u)", b->n,
				  c->n_batch);
	/* expected next position per sequence, for the consecutiveness check */
	for (int i = 0; i < b->n; i++) {
		int32_t tok = b->tokens[i], s = b->seq ? b->seq[i] : 0, p = b->pos[i];
		if (tok < 0 || (uint32_t)tok >= c->m->hp.n_vocab)
			return cm_err_set(err, -EINVAL, "decode: token %d out of range", tok);
		if (s < 0 || (uint32_t)s >= c->n_seq)
			return cm_err_set(err, -EINVAL, "decode: sequence %d out of range", s);
		if (p < 0 || (uint32_t)p >= c->n_ctx)
			return cm_err_set(err, -ENOSPC,
					  "decode: position %d exceeds the context of %u", p,
					  c->n_ctx);
		/* first token of this sequence in the batch? */
		int prev = -1;
		for (int j = i - 1; j >= 0; j--)
			if ((b->seq ? b->seq[j] : 0) == s) {
				prev = j;
				break;
			}
		if (prev < 0 ? p > c->seq_len[s] : p != b->pos[prev] + 1)
			return cm_err_set(err, -EINVAL,
					  "decode: sequence %d: position %d is not contiguous", s, p);
	}
	return 0;
}

int engine_decode(engine_ctx *c, const struct engine_batch *b, struct cm_err *err)
{
	engine_model *m = c->m;
	const struct hparams *hp = &m->hp;
	int r = check_batch(c, b, err);
	if (r)
		return r;
	int T = b->n;
	c->seq = b->seq ? b->seq : c->zero_seq; /* NULL: all in sequence 0 */
	c->pos = b->pos;
	c->n_tok = T;
	for (int i = 0; i < T; i++) {
		int s = c->seq[i];
		if (b->pos[i] < c->seq_len[s])
			c->seq_len[s] = b->pos[i];
	}

	size_t E = hp->n_embd, hd = hp->head_dim, QD = hd * hp->n_head;
	size_t KD = hd * hp->n_head_kv, FF = hp->n_ff;

	for (int t = 0; t < T; t++) {
		const struct weight *te = &m->tok_embd;
		int64_t tok = b->tokens[t];
		const uint8_t *row = (const uint8_t *)te->data + (size_t)tok * te->row_bytes;
		if (tok < te->n_x16) { /* a repacked tied output: out of its panels */
			engine_x16_row(te, tok, c->embd_row);
			row = c->embd_row;
		}
		dequantize_row(te->type, row, c->x + (size_t)t * E, (int64_t)E);
		if (hp->embd_scale != 1.0f) /* gemma */
			for (size_t i = 0; i < E; i++)
				c->x[(size_t)t * E + i] *= hp->embd_scale;
	}

	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const struct layer *L = &m->layers[l];
		rmsnorm_rows(c, c->xb, c->x, L->attn_norm, T, (int64_t)E, hp->eps);
		struct engine_mm qkv[3] = {{&L->wq, c->q, QD, L->bq, false},
					   {&L->wk, c->k, KD, L->bk, false},
					   {&L->wv, c->v, KD, L->bv, false}};
		engine_matmul_multi(c, c->xb, E, T, qkv, 3);
		struct qk_arg qa = {L, l};
		if (kv_store_shared(c)) /* one padding buffer: one thread */
			qk_rows(c, 0, T, &qa);
		else
			par_for(c, T, 4, (int64_t)(QD + 2 * KD), qk_rows, &qa);
		struct attn_task at = {c, (int)l, (int)CM_MIN(L->n_swa, (uint32_t)INT32_MAX),
				       attn_split(c, T)};
		atomic_store(&c->chunk, 0);
		pool_run(m->pool, attn_worker, &at);
		if (L->post_attn_norm)
			add_post_normed(c, &L->wo, c->att, QD, T, L->post_attn_norm);
		else
			engine_matmul(c, &L->wo, c->att, QD, T, c->x, E, L->bo, true);

		rmsnorm_rows(c, c->xb, c->x, L->ffn_norm, T, (int64_t)E, hp->eps);
		struct engine_mm gate_up[2] = {{&L->w_gate, c->hb, FF, NULL, false},
					       {&L->w_up, c->hb2, FF, NULL, false}};
		if (hp->act == FFN_SILU) {
			engine_matmul_swiglu(c, c->xb, E, T, gate_up);
		} else {
			engine_matmul_multi(c, c->xb, E, T, gate_up, 2);
			par_for(c, (int64_t)T * (int64_t)FF, 4096, 1, act_range, NULL);
		}
		if (L->post_ffn_norm)
			add_post_normed(c, &L->w_down, c->hb, FF, T, L->post_ffn_norm);
		else
			engine_matmul(c, &L->w_down, c->hb, FF, T, c->x, E, NULL, true);
	}

	/* Logits for the requested tokens only: gather their normed rows. */
	int n_out = 0;
	for (int t = 0; t < T; t++) {
		bool want = b->want_logits ? b->want_logits[t] : t == T - 1;
		c->logit_row[t] = want ? n_out : -1;
		if (want) {
			rmsnorm(c->xb + (size_t)n_out * E, c->x + t * E, m->output_norm, (int64_t)E,
				hp->eps);
			n_out++;
		}
	}
	c->n_logits = n_out;
	if (n_out > 0)
		engine_matmul(c, &m->output, c->xb, E, n_out, c->logits, hp->n_vocab, NULL, false);
	if (hp->final_softcap > 0) /* gemma2 */
		for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++)
			c->logits[i] = softcap(c->logits[i], hp->final_softcap);
	for (int i = 0; i < T; i++) {
		int s = c->seq[i];
		if (b->pos[i] + 1 > c->seq_len[s])
			c->seq_len[s] = b->pos[i] + 1;
	}
	c->last_logits = n_out > 0 ? c->logits + (size_t)(n_out - 1) * hp->n_vocab : NULL;
	c->seq = NULL;
	c->pos = NULL;
	return 0;
}

const float *engine_get_logits(const engine_ctx *c, int i)
{
	if (i < 0 || (uint32_t)i >= c->n_batch || c->logit_row[i] < 0)
		return NULL;
	return c->logits + (size_t)c->logit_row[i] * c->m->hp.n_vocab;
}

int engine_eval(engine_ctx *c, const int32_t *tokens, int n, int pos, struct cm_err *err)
{
	int done = 0;
	while (done < n) {
		int chunk = CM_MIN(n - done, (int)c->n_batch);
		for (int i = 0; i < chunk; i++)
			c->eval_pos[i] = pos + done + i;
		struct engine_batch b = {.n = chunk, .tokens = tokens + done, .pos = c->eval_pos};
		int r = engine_decode(c, &b, err);
		if (r)
			return r;
		done += chunk;
	}
	return 0;
}

const float *engine_get_logits_last(const engine_ctx *c)
{
	return c->last_logits;
}
