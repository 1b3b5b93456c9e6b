/* engine/forward.c: the batched forward pass.
 *
 * A batch holds tokens of any sequences (prefill chunks and decode steps
 * alike), and each matmul reads every weight row once for all of them. A
 * token's result depends neither on its batch nor on the thread count:
 * every output element is computed by one thread with the same sequence of
 * operations (rows are split between threads; reductions never are).
 *
 * The functions of the hot loop stay static in this one file so that the
 * compiler inlines them as one unit. */
#include "engine/engine_impl.h"
#include "engine/matmul.h"

#include <math.h>
#include <string.h>

static void rmsnorm(float *o, const float *x, const float *w, int64_t n, float eps)
{
	prefetch_bytes(x, (size_t)n * sizeof(float)); /* engine_impl.h */
	/* Four partial sums break the chain of dependent adds; squares are
	 * exact in double, so the order moves ss only far below scale's
	 * float. Two v2d halves: a v4d, wider than the baseline's registers,
	 * would live on the stack. */
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
 * With a prefill batch the per-token norms, RoPE and GeGLU would otherwise
 * run on one thread between the parallel matmuls. Chunks go in one range
 * per worker (pool_ranges), as matmul.c's quant_worker claims tokens, so a
 * worker converts the rows it normed from its own cache. Each element is
 * computed the same way whoever computes it. Decode-sized batches stay on
 * the calling thread: waking the pool would cost more than the work. */
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
		int64_t k = engine_pool_ranges_claim(&j->ranges, ith);
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
	if (n * weight < PAR_MIN || engine_pool_size(c->m->pool) < 2) {
		fn(c, 0, n, arg);
		return;
	}
	struct par_job j = {.c = c, .fn = fn, .arg = arg, .n = n, .chunk = chunk};
	engine_pool_ranges_init(&j.ranges, (n + chunk - 1) / chunk, engine_pool_size(c->m->pool));
	engine_pool_run(c->m->pool, par_worker, &j);
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

/* Rotate the first n_rot dimensions of n_heads head vectors at v by the
 * angles whose cosines and sines are cs[], sn[] (n_rot / 2 each). */
static void rope_rotate(const struct hparams *hp, float *v, int n_heads, const float *cs,
			const float *sn)
{
	int half = (int)hp->n_rot / 2;
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

/* local: gemma3's sliding layers, with their own tables */
static void rope_apply(const engine_ctx *c, float *v, int n_heads, int pos, bool local)
{
	size_t half = c->m->hp.n_rot / 2;
	rope_rotate(&c->m->hp, v, n_heads,
		    (local ? c->rope_cos_local : c->rope_cos) + (size_t)pos * half,
		    (local ? c->rope_sin_local : c->rope_sin) + (size_t)pos * half);
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

/* kv_store's inverse: one cached K or V row (all heads) into x as floats. */
static void kv_load(engine_ctx *c, const uint8_t *src, float *x)
{
	const struct hparams *hp = &c->m->hp;
	size_t hd = hp->head_dim, kvd = hd * hp->n_head_kv;
	switch (c->kv_type) {
	case ENGINE_KV_F16:
		quant_dequantize_row(ENGINE_DTYPE_F16, src, x, (int64_t)kvd);
		break;
	case ENGINE_KV_Q8_0: {
		int64_t padded = (int64_t)(c->kv_head_bytes / sizeof(struct block_q8_0)) * QK8_0;
		for (uint32_t h = 0; h < hp->n_head_kv; h++) {
			quant_dequantize_row(ENGINE_DTYPE_Q8_0, src + h * c->kv_head_bytes,
					     c->kv_pad, padded);
			memcpy(x + h * hd, c->kv_pad, hd * sizeof(float));
		}
		memset(c->kv_pad, 0, (size_t)padded * sizeof(float)); /* kv_store's zero tail */
		break;
	}
	default:
		memcpy(x, src, kvd * sizeof(float));
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
 * pool rather than leaving the other workers waiting. */
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

/* The largest of x[0..n) (-inf for none), four lanes at a time: prefill's
 * rows are long. max is exact, so the order does not matter. */
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

/* The query heads [h0, h1) of one KV head for token t: scores, softmax,
 * weighted sum of V. With c->attn_mq > 1 they share the several-head
 * kernels, which convert each F16 K and V row once for all of them and
 * give the single-head kernels' bits (kern.h). */
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
	int tasks = T * (int)hp->n_head_kv, want = 2 * engine_pool_size(c->m->pool);
	return CM_MAX(1, CM_MIN(group, (want + tasks - 1) / tasks));
}

/* A task is (token, KV head, a run of its query heads): heads sharing a KV
 * head run on one thread, so its K and V rows come from memory once;
 * at->split runs keep the pool busy with one token. The split changes no
 * head's arithmetic. */
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
	engine_pool_bind_caller(m->pool);
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
		quant_dequantize_row(te->type, row, c->x + (size_t)t * E, (int64_t)E);
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
		engine_pool_run(m->pool, attn_worker, &at);
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

	/* Hidden states for the tokens that want them: the normed row is the
	 * embedding, and it stays in place (batch index = row). */
	for (int t = 0; t < T; t++) {
		c->embd_set[t] = b->want_embd && b->want_embd[t];
		if (c->embd_set[t])
			rmsnorm(c->embd + t * E, c->x + t * E, m->output_norm, (int64_t)E, hp->eps);
	}
	/* Logits for the requested tokens only: gather their normed rows. */
	int n_out = 0;
	for (int t = 0; t < T; t++) {
		bool want = b->want_logits ? b->want_logits[t] : !b->want_embd && t == T - 1;
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

const float *engine_get_embd(const engine_ctx *c, int i)
{
	if (i < 0 || i >= c->n_tok || !c->embd_set[i])
		return NULL;
	return c->embd + (size_t)i * c->m->hp.n_embd;
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

/* RoPE makes a score depend on the two positions only through their
 * difference, and rotations compose: a key rotated for position p and then
 * by -d is the key for p - d. Every variant the engine has (adjacent pairs
 * or halves, base and linear scale, per-dimension divisors, gemma3's local
 * tables) is a per-pair angle theta_i times the position, so row d of the
 * tables, conjugated and with the attn_factor (mscale) taken out, undoes d
 * positions of each. Only K moves through floats: V is position-free. */
int engine_seq_shift(engine_ctx *c, int seq, int n_keep, int n_discard, struct cm_err *err)
{
	const struct hparams *hp = &c->m->hp;
	if (seq < 0 || (uint32_t)seq >= c->n_seq)
		return cm_err_set(err, -EINVAL, "shift: sequence %d out of range", seq);
	int len = c->seq_len[seq];
	if (n_keep < 0 || n_discard < 0 || n_discard > len - n_keep)
		return cm_err_set(err, -EINVAL, "shift: keep %d, discard %d of %d positions",
				  n_keep, n_discard, len);
	if (!(hp->rope_attn_factor > 0))
		return cm_err_set(err, -ENOTSUP, "shift: rope attn_factor %g cannot be undone",
				  (double)hp->rope_attn_factor);
	if (n_discard == 0)
		return 0;
	int from = n_keep + n_discard, n_move = len - from;
	if (n_move == 0) { /* nothing moves (and row n_discard may be past the tables) */
		c->seq_len[seq] = n_keep;
		return 0;
	}
	/* cos, -sin of n_discard positions, global and local tables, in
	 * the batch's query scratch (n_batch x n_head x head_dim floats) */
	size_t half = hp->n_rot / 2;
	float *rot = c->q, *krow = c->k;
	if ((size_t)c->n_batch * hp->n_head * hp->head_dim < 4 * half)
		return cm_err_set(err, -ENOTSUP, "shift: no scratch for the rope tables");
	float inv = 1.0f / hp->rope_attn_factor;
	for (size_t i = 0; i < half; i++) {
		rot[i] = c->rope_cos[(size_t)n_discard * half + i] * inv;
		rot[half + i] = -c->rope_sin[(size_t)n_discard * half + i] * inv;
		if (c->rope_cos_local) { /* built with mscale 1 (ctx.c) */
			rot[2 * half + i] = c->rope_cos_local[(size_t)n_discard * half + i];
			rot[3 * half + i] = -c->rope_sin_local[(size_t)n_discard * half + i];
		}
	}
	for (uint32_t l = 0; l < hp->n_layer; l++) {
		const float *cs = rot + (c->m->layers[l].rope_local ? 2 * half : 0);
		size_t base = (size_t)seq * c->kv_seq_stride + l * c->kv_layer_stride;
		uint8_t *kc = c->k_cache + base, *vc = c->v_cache + base;
		memmove(kc + (size_t)n_keep * c->kv_row_bytes, kc + (size_t)from * c->kv_row_bytes,
			(size_t)n_move * c->kv_row_bytes);
		memmove(vc + (size_t)n_keep * c->kv_row_bytes, vc + (size_t)from * c->kv_row_bytes,
			(size_t)n_move * c->kv_row_bytes);
		for (int p = n_keep; p < n_keep + n_move; p++) {
			uint8_t *row = kc + (size_t)p * c->kv_row_bytes;
			kv_load(c, row, krow);
			rope_rotate(hp, krow, (int)hp->n_head_kv, cs, cs + half);
			kv_store(c, row, krow);
		}
	}
	c->seq_len[seq] = len - n_discard;
	return 0;
}
