/* engine/matmul.c: weight x activations for a batch of tokens.
 *
 * out[t][r] (+)= dot(W row r, x row t) (+ bias[r]) for t < n_tok, r < n_out.
 * The activations are converted once to the weight type's activation layout
 * (kern_ops.t[type].act_type), then the rows of W are split between the
 * workers in chunks taken from an atomic counter; each worker reads a chunk
 * of rows once and applies it to every token. Which worker computes a row
 * never changes its value, so results do not depend on the thread count. */
#include "engine/engine_impl.h"

/* One matmul: out[t][r] (+)= dot(W row r, act row t) (+ bias[r]). */
struct mm_task {
	engine_ctx *c;
	const struct weight *w;
	const void *act;
	size_t act_stride; /* bytes between activation rows */
	float *out;
	size_t out_stride; /* floats between output rows */
	int n_tok;
	const float *bias;
	bool accumulate;
	int chunk_rows;
};

static void mm_worker(void *arg, int ith, int nth)
{
	struct mm_task *t = arg;
	const struct weight *w = t->w;
	kern_vec_dot_fn dot = t->c->m->kern->t[w->type].vec_dot;
	const uint8_t *wd = w->data;
	const uint8_t *act = t->act;
	(void)ith;
	(void)nth;
	for (;;) {
		int64_t r0 = (int64_t)atomic_fetch_add(&t->c->chunk, 1) * t->chunk_rows;
		if (r0 >= w->n_out)
			break;
		int64_t r1 = CM_MIN(r0 + t->chunk_rows, w->n_out);
		for (int64_t r = r0; r < r1; r++) {
			const void *row = wd + (size_t)r * w->row_bytes;
			float b = t->bias ? t->bias[r] : 0.0f;
			for (int k = 0; k < t->n_tok; k++) {
				float s;
				dot(w->n_in, &s, row, act + (size_t)k * t->act_stride);
				float *o = &t->out[(size_t)k * t->out_stride + (size_t)r];
				*o = t->accumulate ? *o + s + b : s + b;
			}
		}
	}
}

struct quant_task {
	kern_quant_fn fn;
	const float *x;
	size_t x_stride;
	uint8_t *y;
	size_t y_stride;
	int64_t n;
	int n_tok;
};

static void quant_worker(void *arg, int ith, int nth)
{
	struct quant_task *q = arg;
	for (int t = ith; t < q->n_tok; t += nth)
		q->fn(q->x + (size_t)t * q->x_stride, q->y + (size_t)t * q->y_stride, q->n);
}

/* out[n_tok][w->n_out] (+)= x[n_tok][w->n_in] . W^T */
void engine_matmul(engine_ctx *c, const struct weight *w, const float *x, size_t x_stride,
		   int n_tok, float *out, size_t out_stride, const float *bias, bool accumulate)
{
	const struct kern_ops *k = c->m->kern;
	uint32_t at = k->t[w->type].act_type;
	size_t arow = kern_act_row_size(at, w->n_in);
	struct quant_task qt = {k->quant_act[at], x, x_stride, c->act, arow, w->n_in, n_tok};
	if (n_tok > 1)
		pool_run(c->m->pool, quant_worker, &qt);
	else
		quant_worker(&qt, 0, 1);
	int nth = pool_size(c->m->pool);
	/* Chunks small enough to balance (4 per thread), large enough to
	 * amortise the atomic. The split never changes any result. */
	int64_t rows = (w->n_out + nth * 4 - 1) / (nth * 4);
	if (rows < 4)
		rows = 4;
	struct mm_task t = {c, w, c->act, arow, out, out_stride, n_tok, bias, accumulate, (int)rows};
	atomic_store(&c->chunk, 0);
	pool_run(c->m->pool, mm_worker, &t);
}

