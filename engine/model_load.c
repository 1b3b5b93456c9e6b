/* engine/model_load.c: reading a GGUF into the model, per architecture.
 *
 * Every hyperparameter and every tensor (presence, shape, type) is checked
 * against what the architecture needs, and a file with tensors it would not
 * use is refused, as llama.cpp does. Weights stay in the read-only mapping;
 * only small vectors stored in a non-f32 type are converted into owned
 * memory. The tensors each architecture needs are two tables below
 * (model_specs, layer_specs); every view loading fills goes into the
 * model's weight table (model_weights.c). */
#include "engine/engine_impl.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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

/* ---- keys and tensors ---------------------------------------------------- */

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
	const struct gguf_tensor *t = gguf_tensor_by_name(L->f, name);
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
				  t->name, quant_dtype_name(t->type));
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
	if (quant_dequantize_row(t->type, t->data, v, n) != 0)
		return cm_err_set(L->err, -ENOTSUP, "model: tensor '%s': type %s not supported",
				  t->name, quant_dtype_name(t->type));
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
	/* Mistral v0.1: one window on every layer (llama.cpp ignores it and
	 * drifts once a sequence outgrows it); 0 or absent: full attention */
	if (hp->arch == ARCH_LLAMA)
		return hp_u32(L, "attention.sliding_window", false, 0, &hp->n_swa);
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
	case ARCH_LLAMA:
	case ARCH_PHI3: return hp->n_swa;                            /* every layer */
	case ARCH_GEMMA2: return il % 2 == 0 ? hp->n_swa : 0;        /* even layers */
	case ARCH_GEMMA3: return (il + 1) % 6 != 0 ? hp->n_swa : 0;  /* 5 of each 6 */
	default: return 0;
	}
}


/* Linear rope scaling (older keys too); other types come with their
 * architectures. */
static int load_rope_scaling(struct loader *L)
{
	struct hparams *hp = &L->m->hp;
	int r;
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
	return 0;
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
	if ((r = load_rope_scaling(L)))
		return r;
	/* llama.cpp's pooling_type: 0 none .. 3 last (4 rank: not ours) */
	uint32_t pool;
	if ((r = hp_u32(L, "pooling_type", false, UINT32_MAX, &pool)))
		return r;
	hp->pooling = pool <= 3 ? (int)pool : -1;
	return load_hparams_arch(L);
}

/* ---- the tensors of each architecture ------------------------------------ */

enum need { NO, OPT, REQ }; /* per architecture: absent, optional, required */
/* sizes, from the hyperparameters (dim_size) */
enum dim { D_E, D_V, D_F, D_QD, D_KD, D_HD, D_ROT2 };
/* a phi3 layer stores Q, K, V fused in attn_qkv or separate; others separate */
enum layer_form { ANY, FUSED, SEPARATE };

/* One tensor of the file and the fields it fills: a vector of `len`
 * floats, or a matrix with rows `len` long cut into row views (a fused
 * tensor becomes several weights). Offsets are into struct layer for
 * layer_specs, into struct engine_model for model_specs. */
struct tensor_spec {
	const char *name; /* layer tensors: after "blk.N." */
	enum engine_wref_kind kind;
	uint8_t len;      /* enum dim */
	uint8_t n_views;  /* matrices */
	struct {
		uint8_t rows; /* enum dim */
		uint16_t off;
	} view[3];
	uint8_t need[ARCH_COUNT];
	uint8_t form; /* enum layer_form */
};

_Static_assert(ARCH_COUNT == 7, "one column per architecture in the tables below");

#define VEC(s, f) .kind = ENGINE_WREF_VECTOR, .view = {{0, offsetof(s, f)}}
#define MAT(s, rows, f) .kind = ENGINE_WREF_MATMUL, .n_views = 1, .view = {{rows, offsetof(s, f)}}
#define ALL {REQ, REQ, REQ, REQ, REQ, REQ, REQ}
/*                       llama qwen2 qwen3 phi3 gemma gemma2 gemma3 */
#define PHI3_ONLY(x)    {NO,   NO,   NO,   x,   NO,   NO,    NO}
#define NOT_PHI3        {REQ,  REQ,  REQ,  NO,  REQ,  REQ,   REQ}
#define QKV_BIAS        {OPT,  REQ,  OPT,  OPT, NO,   NO,    NO}
#define OUT_BIAS        {OPT,  OPT,  OPT,  OPT, NO,   NO,    NO}
#define QK_NORM         {NO,   NO,   REQ,  NO,  NO,   NO,    REQ}
#define POST_NORM       {NO,   NO,   NO,   NO,  NO,   REQ,   REQ}

/* in load order: the first missing or malformed one names the error */
static const struct tensor_spec model_specs[] = {
	{"token_embd.weight", .len = D_E, .kind = ENGINE_WREF_LOOKUP, .n_views = 1,
	 .view = {{D_V, offsetof(struct engine_model, tok_embd)}}, .need = ALL},
	{"output_norm.weight", .len = D_E, VEC(struct engine_model, output_norm), .need = ALL},
	/* absent: tied to the token embedding (load_model_tensors) */
	{"output.weight", .len = D_E, MAT(struct engine_model, D_V, output),
	 .need = {OPT, OPT, OPT, REQ, OPT, OPT, OPT}},
	/* phi3 longrope: divisors of the rope frequencies, both or neither */
	{"rope_factors_long.weight", .len = D_ROT2, VEC(struct engine_model, rope_long),
	 .need = PHI3_ONLY(OPT)},
	{"rope_factors_short.weight", .len = D_ROT2, VEC(struct engine_model, rope_short),
	 .need = PHI3_ONLY(OPT)},
	{"rope_freqs.weight", .len = D_ROT2, VEC(struct engine_model, rope_freqs),
	 .need = {OPT, OPT, OPT, NO, NO, NO, NO}},
};

static const struct tensor_spec layer_specs[] = {
	{"attn_norm.weight", .len = D_E, VEC(struct layer, attn_norm), .need = ALL},
	/* Q, K, V rows in that order */
	{"attn_qkv.weight", .len = D_E, .kind = ENGINE_WREF_MATMUL, .n_views = 3,
	 .view = {{D_QD, offsetof(struct layer, wq)},
		  {D_KD, offsetof(struct layer, wk)},
		  {D_KD, offsetof(struct layer, wv)}},
	 .need = PHI3_ONLY(REQ), .form = FUSED},
	{"attn_q.weight", .len = D_E, MAT(struct layer, D_QD, wq), .need = ALL, .form = SEPARATE},
	{"attn_k.weight", .len = D_E, MAT(struct layer, D_KD, wk), .need = ALL, .form = SEPARATE},
	{"attn_v.weight", .len = D_E, MAT(struct layer, D_KD, wv), .need = ALL, .form = SEPARATE},
	{"attn_output.weight", .len = D_QD, MAT(struct layer, D_E, wo), .need = ALL},
	{"attn_q.bias", .len = D_QD, VEC(struct layer, bq), .need = QKV_BIAS, .form = SEPARATE},
	{"attn_k.bias", .len = D_KD, VEC(struct layer, bk), .need = QKV_BIAS, .form = SEPARATE},
	{"attn_v.bias", .len = D_KD, VEC(struct layer, bv), .need = QKV_BIAS, .form = SEPARATE},
	{"attn_output.bias", .len = D_E, VEC(struct layer, bo), .need = OUT_BIAS, .form = SEPARATE},
	{"ffn_norm.weight", .len = D_E, VEC(struct layer, ffn_norm), .need = ALL},
	/* phi3 fuses gate and up: the first n_ff rows are the gate */
	{"ffn_up.weight", .len = D_E, .kind = ENGINE_WREF_MATMUL, .n_views = 2,
	 .view = {{D_F, offsetof(struct layer, w_gate)}, {D_F, offsetof(struct layer, w_up)}},
	 .need = PHI3_ONLY(REQ)},
	{"ffn_gate.weight", .len = D_E, MAT(struct layer, D_F, w_gate), .need = NOT_PHI3},
	{"ffn_up.weight", .len = D_E, MAT(struct layer, D_F, w_up), .need = NOT_PHI3},
	{"ffn_down.weight", .len = D_F, MAT(struct layer, D_E, w_down), .need = ALL},
	{"attn_q_norm.weight", .len = D_HD, VEC(struct layer, q_norm), .need = QK_NORM},
	{"attn_k_norm.weight", .len = D_HD, VEC(struct layer, k_norm), .need = QK_NORM},
	/* gemma2/3: each half's output is normed before its residual add */
	{"post_attention_norm.weight", .len = D_E, VEC(struct layer, post_attn_norm),
	 .need = POST_NORM},
	{"post_ffw_norm.weight", .len = D_E, VEC(struct layer, post_ffn_norm), .need = POST_NORM},
};

#undef VEC
#undef MAT
#undef ALL
#undef PHI3_ONLY
#undef NOT_PHI3
#undef QKV_BIAS
#undef OUT_BIAS
#undef QK_NORM
#undef POST_NORM

static int64_t dim_size(const struct hparams *hp, int d)
{
	switch (d) {
	case D_E: return hp->n_embd;
	case D_V: return hp->n_vocab;
	case D_F: return hp->n_ff;
	case D_QD: return (int64_t)hp->head_dim * hp->n_head;
	case D_KD: return (int64_t)hp->head_dim * hp->n_head_kv;
	case D_HD: return hp->head_dim;
	default: return hp->n_rot / 2; /* D_ROT2 */
	}
}

/* Rows [first, first + n) of w as a matrix of their own. */
static struct weight weight_rows(const struct weight *w, int64_t first, int64_t n)
{
	struct weight v = *w;
	v.data = (const uint8_t *)w->data + (size_t)first * w->row_bytes;
	v.n_out = n;
	return v;
}

static int add_ref(struct loader *L, const struct tensor_spec *s, void *field)
{
	struct engine_weights *ws = &L->m->weights;
	int r = s->kind == ENGINE_WREF_VECTOR ? engine_weights_add_vector(ws, field)
					      : engine_weights_add_matrix(ws, field, s->kind);
	return r ? cm_err_set(L->err, r, "model: out of memory") : 0;
}

/* The tensor `name` of spec s into its fields in the struct at base; an
 * optional one absent leaves them zero and out of the weight table. */
static int load_spec(struct loader *L, const struct tensor_spec *s, const char *name,
		     void *base, bool required)
{
	const struct hparams *hp = &L->m->hp;
	int r;
	if (s->kind == ENGINE_WREF_VECTOR) {
		const float **v = (const float **)((char *)base + s->view[0].off);
		if ((r = load_vector(L, name, dim_size(hp, s->len), required, v)) || !*v)
			return r;
		return add_ref(L, s, v);
	}
	int64_t rows = 0;
	for (int i = 0; i < s->n_views; i++)
		rows += dim_size(hp, s->view[i].rows);
	struct weight whole;
	if ((r = load_matrix(L, name, dim_size(hp, s->len), rows, required, &whole)))
		return r;
	int64_t first = 0;
	for (int i = 0; i < s->n_views; i++) {
		struct weight *w = (struct weight *)((char *)base + s->view[i].off);
		int64_t n = dim_size(hp, s->view[i].rows);
		*w = whole.data ? weight_rows(&whole, first, n) : whole;
		first += n;
		if (w->data && (r = add_ref(L, s, w)))
			return r;
	}
	return 0;
}

/* phi3 longrope's divisors: both or neither, and positive. */
static int check_rope_factors(struct loader *L)
{
	engine_model *m = L->m;
	int64_t n = m->hp.n_rot / 2;
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

static int load_model_tensors(struct loader *L)
{
	engine_model *m = L->m;
	int r;
	for (size_t k = 0; k < CM_ARRAY_LEN(model_specs); k++) {
		const struct tensor_spec *s = &model_specs[k];
		uint8_t need = s->need[m->hp.arch];
		if (need != NO && (r = load_spec(L, s, s->name, m, need == REQ)))
			return r;
	}
	if (!m->output.data) {
		m->output = m->tok_embd; /* tied embeddings */
		if ((r = engine_weights_add_matrix(&m->weights, &m->output, ENGINE_WREF_MATMUL)))
			return cm_err_set(L->err, r, "model: out of memory");
	}
	return check_rope_factors(L);
}

static int load_layer(struct loader *L, uint32_t il)
{
	const struct hparams *hp = &L->m->hp;
	struct layer *l = &L->m->layers[il];
	char name[GGUF_MAX_NAME + 16];
	snprintf(name, sizeof(name), "blk.%u.attn_q.weight", il);
	int form = hp->arch == ARCH_PHI3 && !gguf_tensor_by_name(L->f, name) ? FUSED : SEPARATE;
	for (size_t k = 0; k < CM_ARRAY_LEN(layer_specs); k++) {
		const struct tensor_spec *s = &layer_specs[k];
		uint8_t need = s->need[hp->arch];
		if (need == NO || (s->form != ANY && s->form != form))
			continue;
		snprintf(name, sizeof(name), "blk.%u.%s", il, s->name);
		int r = load_spec(L, s, name, l, need == REQ);
		if (r)
			return r;
	}
	l->n_swa = layer_window(hp, il);
	l->rope_local = hp->rope_base_local > 0 && l->n_swa > 0;
	return 0;
}

static int load_tensors(struct loader *L)
{
	engine_model *m = L->m;
	int r;
	if ((r = load_model_tensors(L)))
		return r;
	m->layers = cm_calloc(m->hp.n_layer, sizeof(*m->layers));
	if (!m->layers)
		return cm_err_set(L->err, -ENOMEM, "model: out of memory");
	for (uint32_t i = 0; i < m->hp.n_layer; i++)
		if ((r = load_layer(L, i)))
			return r;
	for (uint64_t i = 0; i < L->f->n_tensors; i++)
		if (!L->used[i])
			return cm_err_set(L->err, -EPROTO,
					  "model: unexpected tensor '%s' for architecture %s",
					  L->f->tensors[i].name, L->arch);
	return 0;
}

/* ---- entry points (model.c) ---------------------------------------------- */

const char *engine_arch_name(enum arch_kind a)
{
	return archs[a].name;
}

int engine_model_read_arch(engine_model *m, struct cm_err *err)
{
	struct gguf_str arch;
	int r = gguf_get_str(m->file, "general.architecture", &arch, err);
	if (r == -ENOENT)
		r = cm_err_set(err, -EPROTO, "model: missing key 'general.architecture'");
	if (r)
		return r;
	size_t ai;
	for (ai = 0; ai < CM_ARRAY_LEN(archs); ai++)
		if (gguf_str_eq(arch, archs[ai].name))
			break;
	if (ai == CM_ARRAY_LEN(archs))
		return cm_err_set(err, -ENOTSUP,
				  "model: architecture '%.*s' is not supported (supported: llama, "
				  "qwen2, qwen3, phi3, gemma, gemma2, gemma3)",
				  (int)CM_MIN(arch.len, 64), arch.ptr);
	m->hp.arch = archs[ai].kind;
	m->hp.rope = archs[ai].rope;
	struct gguf_str gname;
	if (gguf_get_str(m->file, "general.name", &gname, NULL) == 0)
		snprintf(m->info.name, sizeof(m->info.name), "%.*s", (int)CM_MIN(gname.len, 127),
			 gname.ptr);
	return 0;
}

int engine_model_read_weights(engine_model *m, struct cm_err *err)
{
	struct loader L = {.m = m, .f = m->file, .arch = archs[m->hp.arch].name, .err = err};
	int r;
	if ((r = load_hparams(&L)))
		return r;
	if (m->hp.n_vocab > MAX_VOCAB)
		return cm_err_set(err, -EPROTO, "model: vocabulary of %u tokens too large",
				  m->hp.n_vocab);
	L.used = cm_calloc(L.f->n_tensors ? L.f->n_tensors : 1, sizeof(bool));
	if (!L.used)
		return cm_err_set(err, -ENOMEM, "model: out of memory");
	r = load_tensors(&L);
	cm_free(L.used);
	return r;
}
