/* engine/ctx.c: KV cache types and contexts: a context owns one model's KV
 * cache for n_seq sequences, the RoPE tables and the scratch of a batch,
 * all allocated here so that the forward pass (forward.c) never allocates. */
#include "engine/engine_impl.h"

#include <math.h>
#include <string.h>
#include <strings.h>

/* ---- KV cache types -------------------------------------------------------- */

/* The default: f16 halves the cache and its reads and keeps every greedy
 * token of the reference tests (docs/engine.md, "The KV cache"). */
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

/* Not zeroed: only the rows a step writes are ever read, and a large
 * allocation comes from fresh pages that take no memory until written.
 * The logits (n_batch x n_vocab floats, 297 MiB for Qwen2.5's vocabulary
 * and 512-token batches) cost only the rows steps ask for. */
static int ctx_alloc_lazy(float **p, size_t n)
{
	*p = cm_aligned_alloc(n * sizeof(float));
	return *p ? 0 : -ENOMEM;
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
	int nt = engine_pool_size(m->pool);
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
	    ctx_alloc_lazy(&c->logits, B * hp->n_vocab) ||
	    ctx_alloc(&c->rope_cos, (size_t)c->n_ctx * hp->n_rot / 2) ||
	    ctx_alloc(&c->rope_sin, (size_t)c->n_ctx * hp->n_rot / 2) ||
	    (hp->rope_base_local > 0 &&
	     (ctx_alloc(&c->rope_cos_local, (size_t)c->n_ctx * hp->n_rot / 2) ||
	      ctx_alloc(&c->rope_sin_local, (size_t)c->n_ctx * hp->n_rot / 2))) ||
	    !(c->act = cm_aligned_alloc(c->act_cap)) ||
	    !(c->seq_len = cm_calloc(c->n_seq, sizeof(int32_t))) ||
	    !(c->logit_row = cm_calloc(B, sizeof(int32_t))) ||
	    ctx_alloc_lazy(&c->embd, B * E) || !(c->embd_set = cm_calloc(B, sizeof(bool))) ||
	    !(c->embd_want = cm_calloc(B, sizeof(bool))) ||
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
	cm_free(c->embd);
	cm_free(c->embd_set);
	cm_free(c->embd_want);
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
