/* engine/matmul.c: weights x activations for a batch of tokens.
 *
 * out[t][r] (+)= dot(W row r, x row t) (+ bias[r]) for t < n_tok, r < n_out.
 *
 * engine_matmul_multi() runs several matmuls that read the same input (Q, K
 * and V; gate and up) as one job: the input is converted once per distinct
 * activation layout (kern_ops.t[type].act_type), and all the rows of all
 * the weights are split into chunks that the workers claim, in one
 * engine_pool_run, so one barrier covers the group (cpu-kernels.md §1).
 *
 * Claiming: the chunks are cut into one contiguous range per worker; a
 * worker takes its own range's chunks front to back, then steals from the
 * back of the others' (engine_pool_ranges_claim). Each worker thus streams one
 * long run of weights, which the prefetchers follow (chunks dealt from one
 * counter ended a stream every 64 rows and restarted another cold), and a
 * descheduled worker's range is still finished by the others, chunk by
 * chunk.
 *
 * One token (decode) uses the variant's gemv over a chunk of rows, or
 * vec_dot row by row; more tokens use the variant's tile kernel (gemm) when
 * it has one, which reads a weight panel once for a tile of tokens.
 * Weights repacked at load (weight.n_x16, kern.h's x16 layout) use the
 * variant's gemm_x16 for every batch size, one token included, and
 * vec_dot for the few rows past the last full panel.
 *
 * engine_matmul_swiglu() runs a SwiGLU FFN's gate and up projections as
 * one such job whose chunks each cover the same rows of both, and takes
 * silu(gate) * up over a chunk as soon as it is done.
 *
 * Results do not depend on the thread count: every output element is
 * computed by one worker, by a kernel whose operation order depends only on
 * the shapes and the batch size, never on which worker runs which chunk. */
#include "engine/matmul.h"

#define MM_MAX 8          /* matmuls per group */
#define DECODE_ROWS 64    /* rows per chunk, one token (measured: 64-128 best) */
#define TILE_ROWS 64      /* rows per chunk, tile kernel (a multiple of 16) */
#define X16_ROWS ENGINE_X16_GROUP /* rows per chunk, repacked weights, one token (a group) */
/* rows per chunk, repacked weights, a large batch: a part of a group.
 * Whole groups left the workers a chunk apart on the narrow matrices
 * (Qwen2.5 0.5B's 896 rows are 7 groups: 4 on one worker, 3 on the
 * other). A part reads the batch's activations again and, with
 * K-segments, its rows are not one stream: smaller batches keep whole
 * groups (x16_parts). */
#ifndef X16_BATCH_ROWS
#define X16_BATCH_ROWS 32
#endif
#define TILE_TOKENS 128   /* tokens per gemm call */
/* engine_matmul_swiglu tiles a pair's chunk with each matrix's own chunks */
_Static_assert(X16_ROWS % TILE_ROWS == 0 && X16_ROWS % DECODE_ROWS == 0 &&
		       (TILE_ROWS % DECODE_ROWS == 0 || DECODE_ROWS % TILE_ROWS == 0) &&
		       (TILE_ROWS % X16_BATCH_ROWS == 0 || X16_BATCH_ROWS % TILE_ROWS == 0) &&
		       (DECODE_ROWS % X16_BATCH_ROWS == 0 || X16_BATCH_ROWS % DECODE_ROWS == 0) &&
		       X16_ROWS % X16_BATCH_ROWS == 0 && X16_BATCH_ROWS % 16 == 0,
	       "each chunk size must divide the larger ones");
#ifndef STORE_AHEAD
#define STORE_AHEAD 4
#endif

/* One activation layout made from the input. */
struct act {
	uint32_t type;
	const uint8_t *rows; /* n_tok rows, `stride` bytes apart */
	size_t stride;
	const float *aux; /* kern_act_aux(), aux_stride floats apart, or NULL */
	size_t aux_stride;
};

struct mm_job {
	const struct kern_ops *k;
	const struct engine_mm *mm;
	const struct act *act[MM_MAX];
	int64_t first_chunk[MM_MAX + 1]; /* chunk ids of matmul i: [first[i], first[i+1]) */
	int chunk_rows[MM_MAX];
	bool tile[MM_MAX];
	bool x16[MM_MAX];
	int n, n_tok;
	/* engine_matmul_swiglu: a chunk is swiglu_rows rows of both gate
	 * (mm[0]) and up (mm[1]), then gate = swiglu(gate, up) over them */
	void (*swiglu)(int64_t n, float *g, const float *u);
	int swiglu_rows;
	struct pool_ranges ranges;
};

static void store(const struct engine_mm *m, int t, int64_t r, float s)
{
	float b = m->bias ? m->bias[r] : 0.0f;
	float *o = &m->out[(size_t)t * m->out_stride + (size_t)r];
	*o = m->accumulate ? *o + s + b : s + b;
}

/* out[0..nr) (+)= s[0..nr) (+ bias[r0..]): store() for a row of results,
 * four at a time (engine_impl.h's v4f: the plain loop stayed scalar). */
static void store_row(const struct engine_mm *m, float *out, const float *s, int64_t r0, int nr)
{
	const float *b = m->bias ? m->bias + r0 : NULL;
	const v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
	int r = 0;
	if (!m->accumulate && !b) {
		memcpy(out, s, (size_t)nr * sizeof(float));
		return;
	}
	for (; r + 4 <= nr; r += 4) {
		v4f v = v4f_load(s + r), bv = b ? v4f_load(b + r) : zero;
		v4f_store(out + r, m->accumulate ? v4f_load(out + r) + v + bv : v + bv);
	}
	for (; r < nr; r++) /* store()'s expression */
		out[r] = (m->accumulate ? out[r] + s[r] : s[r]) + (b ? b[r] : 0.0f);
}

static void run_vec_dot(const struct mm_job *j, int i, int64_t r0, int64_t r1)
{
	const struct engine_mm *m = &j->mm[i];
	const struct weight *w = m->w;
	const struct kern_type_ops *ko = &j->k->t[w->type];
	const struct act *a = j->act[i];
	const uint8_t *wd = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
	for (int64_t r = r0; r < r1; r++, wd += w->row_bytes)
		for (int t = 0; t < j->n_tok; t++) {
			float s;
			ko->vec_dot(w->n_in, &s, wd, a->rows + (size_t)t * a->stride);
			store(m, t, r, s);
		}
}

/* Rows [r0, r1) of a repacked weight: panels through gemm_x16, the native
 * tail (rows >= n_x16) through vec_dot. The rows lie in one group of the
 * layout (a chunk is a group or a part of one, starting at a panel): its
 * K-segments run one after the other into one output, each after the
 * first continuing the sums of the ones before (repack.c; kern.h's
 * from_s). */
static void run_x16(const struct mm_job *j, int i, int64_t r0, int64_t r1)
{
	const struct engine_mm *m = &j->mm[i];
	const struct weight *w = m->w;
	const struct kern_type_ops *ko = &j->k->t[w->type];
	const struct act *a = j->act[i];
	int64_t p1 = CM_MIN(r1, w->n_x16);
	if (r0 < p1) {
		float tmp[TILE_TOKENS * X16_ROWS];
		int nr = (int)(p1 - r0);
		bool direct = !m->bias && !m->accumulate;
		const struct dtype_info *tw = quant_dtype_get(w->type), *ta = quant_dtype_get(a->type);
		int64_t nb = w->n_in / tw->blck, sb = w->x16_seg;
		/* the group's first row and its rows (fewer in the last one) */
		int64_t g0 = r0 / ENGINE_X16_GROUP * ENGINE_X16_GROUP;
		int ng = (int)CM_MIN((int64_t)ENGINE_X16_GROUP, w->n_x16 - g0);
		for (int t0 = 0; t0 < j->n_tok; t0 += TILE_TOKENS) {
			int nt = CM_MIN(TILE_TOKENS, j->n_tok - t0);
			float *o = m->out + (size_t)t0 * m->out_stride + (size_t)r0;
			/* a plain product goes straight to the output */
			float *d = direct ? o : tmp;
			size_t ds = direct ? m->out_stride : X16_ROWS;
			for (int64_t b0 = 0; b0 < nb; b0 += sb) {
				int64_t n = CM_MIN(sb, nb - b0) * tw->blck;
				/* the segment's activation blocks and their aux */
				int64_t ab = b0 * tw->blck / ta->blck;
				const uint8_t *ar =
					a->rows + (size_t)t0 * a->stride + (size_t)ab * ta->size;
				const float *xr = NULL;
				if (a->aux)
					xr = a->aux + (size_t)t0 * a->aux_stride +
					     kern_act_aux_len(a->type, ab * ta->blck);
				size_t srs = quant_dtype_row_size(w->type, n);
				ko->gemm_x16(n, nr, nt,
					     engine_x16_segment(w, g0, ng, b0) + (size_t)(r0 - g0) * srs,
					     srs, ar, a->stride, xr, a->aux_stride, d, ds, b0 > 0);
			}
			if (!direct)
				for (int t = 0; t < nt; t++) {
					/* a later token's residual rows: asked for
					 * before the gemm, they were gone after it */
					size_t ahead = (size_t)(t + STORE_AHEAD) * m->out_stride;
					if (m->accumulate && t + STORE_AHEAD < nt)
						for (int r = 0; r < nr; r += 16)
							__builtin_prefetch(o + ahead + r, 1, 3);
					store_row(m, o + (size_t)t * m->out_stride,
						  tmp + t * X16_ROWS, r0, nr);
				}
		}
	}
	if (p1 < r1)
		run_vec_dot(j, i, CM_MAX(r0, p1), r1);
}

static void run_rows(const struct mm_job *j, int i, int64_t r0, int64_t r1)
{
	const struct engine_mm *m = &j->mm[i];
	const struct weight *w = m->w;
	const struct kern_type_ops *ko = &j->k->t[w->type];
	const struct act *a = j->act[i];
	const uint8_t *wd = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;

	if (j->x16[i]) {
		run_x16(j, i, r0, r1);
		return;
	}

	/* gemv is bit-identical to gemm for one token (kern.h), so this keeps
	 * the batch invariance below at decode speed */
	if (j->n_tok == 1 && ko->gemv) {
		float tmp[DECODE_ROWS];
		ko->gemv(w->n_in, (int)(r1 - r0), 1, wd, w->row_bytes, a->rows, a->stride, a->aux,
			 a->aux_stride, tmp, 1);
		for (int64_t r = r0; r < r1; r++)
			store(m, 0, r, tmp[r - r0]);
		return;
	}
	if (!j->tile[i]) {
		run_vec_dot(j, i, r0, r1);
		return;
	}
	float tmp[TILE_TOKENS * TILE_ROWS];
	int nr = (int)(r1 - r0);
	for (int t0 = 0; t0 < j->n_tok; t0 += TILE_TOKENS) {
		int nt = CM_MIN(TILE_TOKENS, j->n_tok - t0);
		ko->gemm(w->n_in, nr, nt, wd, w->row_bytes, a->rows + (size_t)t0 * a->stride,
			 a->stride, a->aux ? a->aux + (size_t)t0 * a->aux_stride : NULL,
			 a->aux_stride, tmp, TILE_ROWS);
		for (int t = 0; t < nt; t++)
			for (int r = 0; r < nr; r++)
				store(m, t0 + t, r0 + r, tmp[t * TILE_ROWS + r]);
	}
}

/* engine_matmul_swiglu's chunk c: rows [c * swiglu_rows, ...) of gate,
 * then of up, each in its own chunk size, then their product while both
 * are in this worker's cache */
static void run_swiglu(const struct mm_job *j, int64_t c)
{
	const struct engine_mm *g = &j->mm[0], *u = &j->mm[1];
	int64_t r0 = c * j->swiglu_rows, r1 = CM_MIN(r0 + j->swiglu_rows, g->w->n_out);
	for (int i = 0; i < 2; i++)
		for (int64_t r = r0; r < r1; r += j->chunk_rows[i])
			run_rows(j, i, r, CM_MIN(r + j->chunk_rows[i], r1));
	for (int t = 0; t < j->n_tok; t++)
		j->swiglu(r1 - r0, g->out + (size_t)t * g->out_stride + r0,
			  u->out + (size_t)t * u->out_stride + r0);
}

static void mm_worker(void *arg, int ith, int nth)
{
	struct mm_job *j = arg;
	(void)nth;
	for (;;) {
		int64_t c = engine_pool_ranges_claim(&j->ranges, ith);
		if (c < 0)
			break;
		if (j->swiglu) {
			run_swiglu(j, c);
			continue;
		}
		int i = 0;
		while (c >= j->first_chunk[i + 1])
			i++;
		int64_t r0 = (c - j->first_chunk[i]) * j->chunk_rows[i];
		int64_t r1 = CM_MIN(r0 + j->chunk_rows[i], j->mm[i].w->n_out);
		run_rows(j, i, r0, r1);
	}
}

/* ---- activation conversion ------------------------------------------------ */

struct quant_job {
	kern_quant_fn fn;
	kern_quant_aux_fn fn_aux; /* NULL: fn, then kern_act_aux */
	const float *x;
	size_t x_stride;
	struct act *a;
	int64_t n;
	int n_tok;
	/* tokens in one range per worker: the same ones model.c's par_for
	 * gives it (the norm before), so a row it wrote is in its cache */
	struct pool_ranges ranges;
};

static void quant_one(const struct quant_job *q, int t)
{
	uint8_t *row = (uint8_t *)q->a->rows + (size_t)t * q->a->stride;
	const float *x = q->x + (size_t)t * q->x_stride;
	float *aux = q->a->aux ? (float *)q->a->aux + (size_t)t * q->a->aux_stride : NULL;
	if (aux && q->fn_aux) {
		q->fn_aux(x, row, q->n, aux);
		return;
	}
	q->fn(x, row, q->n);
	if (aux)
		kern_act_aux(q->a->type, row, q->n, aux);
}

static void quant_worker(void *arg, int ith, int nth)
{
	struct quant_job *q = arg;
	(void)nth;
	for (;;) {
		int64_t t = engine_pool_ranges_claim(&q->ranges, ith);
		if (t < 0)
			break;
		quant_one(q, (int)t);
	}
}

static size_t align64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

/* Make layout `type` of the input in c->act at *used (bytes). */
static void make_act(engine_ctx *c, uint32_t type, bool want_aux, const float *x,
		     size_t x_stride, int64_t n, int n_tok, struct act *a, size_t *used)
{
	const struct kern_ops *k = c->m->kern;
	a->type = type;
	a->aux = NULL;
	a->aux_stride = 0;
	if (type == ENGINE_DTYPE_F32) {
		/* the f32 layout is the input itself */
		a->rows = (const uint8_t *)x;
		a->stride = x_stride * sizeof(float);
		return;
	}
	uint8_t *base = (uint8_t *)c->act + *used;
	a->stride = kern_act_row_size(type, n);
	a->rows = base;
	size_t bytes = align64(a->stride * (size_t)n_tok);
	size_t aux_len = want_aux ? kern_act_aux_len(type, n) : 0;
	if (aux_len) {
		a->aux = (const float *)(base + bytes);
		a->aux_stride = aux_len;
		bytes += align64(aux_len * sizeof(float) * (size_t)n_tok);
	}
	*used += bytes;
	struct quant_job q = {.fn = k->quant_act[type], .fn_aux = k->quant_act_aux[type], .x = x,
			      .x_stride = x_stride, .a = a, .n = n, .n_tok = n_tok};
	if (n_tok > 1) {
		engine_pool_ranges_init(&q.ranges, n_tok, engine_pool_size(c->m->pool));
		engine_pool_run(c->m->pool, quant_worker, &q);
	} else {
		prefetch_bytes(x, (size_t)n * sizeof(float)); /* engine_impl.h */
		quant_one(&q, 0);
	}
}

static int64_t div_up(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The chunks of j's matmuls from their chunk_rows (first_chunk), and the
 * number the pool deals: with swiglu, a pair's chunk is the larger of the
 * two sizes, a multiple of the smaller (the assertion at the top), so
 * each matrix's own chunks tile the pair's. */
static int64_t deal_chunks(struct mm_job *j)
{
	for (int i = 0; i < j->n; i++)
		j->first_chunk[i + 1] = j->first_chunk[i] + div_up(j->mm[i].w->n_out, j->chunk_rows[i]);
	if (!j->swiglu)
		return j->first_chunk[j->n];
	j->swiglu_rows = CM_MAX(j->chunk_rows[0], j->chunk_rows[1]);
	return div_up(j->mm[0].w->n_out, j->swiglu_rows);
}

/* Whether a batch's repacked matmuls go in X16_BATCH_ROWS parts of groups
 * (n_chunks: the chunks the pool deals, repacked weights in whole groups):
 * from 128 tokens, or from 64 where whole groups split unevenly between the
 * workers; smaller batches still read weights and keep whole groups
 * (docs/performance.md §4). */
static bool x16_parts(int n_tok, int64_t n_chunks, int nth)
{
	if (n_tok >= 128)
		return true;
	return n_tok >= 64 && n_chunks % nth != 0;
}

/* engine_matmul_multi(); with swiglu (a gate and up pair of one n_out),
 * their product too */
static void matmul_multi(engine_ctx *c, const float *x, size_t x_stride, int n_tok,
			 const struct engine_mm *mm, int n, bool swiglu)
{
	const struct kern_ops *k = c->m->kern;
	struct act acts[MM_MAX];
	int n_acts = 0;
	size_t used = 0;
	struct mm_job j = {.k = k, .mm = mm, .n = n, .n_tok = n_tok};

	if (n_tok <= 0 || n <= 0)
		return;
	if (n > MM_MAX) { /* not used by the model; keeps the API total */
		engine_matmul_multi(c, x, x_stride, n_tok, mm, MM_MAX);
		engine_matmul_multi(c, x, x_stride, n_tok, mm + MM_MAX, n - MM_MAX);
		return;
	}
	for (int i = 0; i < n; i++) {
		const struct weight *w = mm[i].w;
		const struct kern_type_ops *ko = &k->t[w->type];
		uint32_t at = ko->act_type;
		/* A type with a tile kernel uses it for every batch size, one
		 * token included: a token's logits must not depend on how many
		 * others share its step (continuous batching), and the tile
		 * kernel's float operations per (row, token) are the same whatever
		 * the tile, while a separate decode kernel's are not. */
		j.tile[i] = ko->gemm != NULL;
		/* model.c repacks a weight only for a variant with gemm_x16 */
		j.x16[i] = w->n_x16 > 0 && ko->gemm_x16 != NULL;
		int a;
		for (a = 0; a < n_acts; a++)
			if (acts[a].type == at)
				break;
		if (a == n_acts) {
			/* aux only matters to tile kernels; all weights of a group
			 * with one layout see the same batch, so ask for it once */
			bool aux = false;
			for (int i2 = i; i2 < n; i2++) {
				const struct kern_type_ops *o = &k->t[mm[i2].w->type];
				aux |= o->act_type == at &&
				       (o->gemm != NULL || mm[i2].w->n_x16 > 0 ||
					(n_tok == 1 && o->gemv != NULL));
			}
			make_act(c, at, aux, x, x_stride, w->n_in, n_tok, &acts[a], &used);
			n_acts++;
		}
		j.act[i] = &acts[a];
		j.chunk_rows[i] = j.x16[i] ? X16_ROWS : j.tile[i] ? TILE_ROWS : DECODE_ROWS;
	}
	if (swiglu)
		j.swiglu = k->silu_mul_f32;
	int64_t n_chunks = deal_chunks(&j);
	if (x16_parts(n_tok, n_chunks, engine_pool_size(c->m->pool))) {
		for (int i = 0; i < n; i++)
			if (j.x16[i])
				j.chunk_rows[i] = X16_BATCH_ROWS;
		n_chunks = deal_chunks(&j);
	}
	engine_pool_ranges_init(&j.ranges, n_chunks, engine_pool_size(c->m->pool));
	engine_pool_run(c->m->pool, mm_worker, &j);
}

void engine_matmul_multi(engine_ctx *c, const float *x, size_t x_stride, int n_tok,
			 const struct engine_mm *mm, int n)
{
	matmul_multi(c, x, x_stride, n_tok, mm, n, false);
}

void engine_matmul_swiglu(engine_ctx *c, const float *x, size_t x_stride, int n_tok,
			  const struct engine_mm gu[2])
{
	if (n_tok > 1) {
		matmul_multi(c, x, x_stride, n_tok, gu, 2, true);
		return;
	}
	/* one token: each worker streams its own run of both matrices (the
	 * pair's chunks would alternate between them), then one short row */
	matmul_multi(c, x, x_stride, n_tok, gu, 2, false);
	if (n_tok == 1)
		c->m->kern->silu_mul_f32(gu[0].w->n_out, gu[0].out, gu[1].out);
}

/* out[n_tok][w->n_out] (+)= x[n_tok][w->n_in] . W^T */
void engine_matmul(engine_ctx *c, const struct weight *w, const float *x, size_t x_stride,
		   int n_tok, float *out, size_t out_stride, const float *bias, bool accumulate)
{
	struct engine_mm m = {w, out, out_stride, bias, accumulate};
	engine_matmul_multi(c, x, x_stride, n_tok, &m, 1);
}
