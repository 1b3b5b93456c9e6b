/* engine/matmul.h: grouped matmuls on one input (matmul.c). Internal to the
 * engine, like engine_impl.h, which it needs. */
#ifndef EDGELM_ENGINE_MATMUL_H
#define EDGELM_ENGINE_MATMUL_H

#include "engine/engine_impl.h"

/* One matmul of a group: out[t][r] (+)= dot(W row r, x row t) (+ bias[r]),
 * out rows out_stride floats apart. */
struct engine_mm {
	const struct weight *w;
	float *out;
	size_t out_stride;
	const float *bias;  /* NULL: none */
	bool accumulate;    /* add to out instead of overwriting it */
};

/* Run n matmuls that share the input x[n_tok][n_in] (x_stride floats
 * between rows; every w->n_in must be equal) in one engine_pool_run: the input is
 * converted once per activation layout the weights need, and the workers
 * claim row chunks of all n weights from one counter. The outputs must not
 * overlap the input or each other. Equivalent, value for value, to n calls
 * of engine_matmul(). */
void engine_matmul_multi(engine_ctx *c, const float *x, size_t x_stride, int n_tok,
			 const struct engine_mm *mm, int n);

/* A SwiGLU FFN's gate (gu[0]) and up (gu[1]) projections of x, then
 * gate = silu(gate) * up (kern_ops.silu_mul_f32); the outputs take no bias
 * and are overwritten. With a batch, a chunk of the job is the same rows
 * of both matrices, and its worker takes their product right away, while
 * both tiles are in its cache: a separate pass over the two T x n_ff
 * outputs would read them back from memory.
 * The results are the same either way (element-wise). */
void engine_matmul_swiglu(engine_ctx *c, const float *x, size_t x_stride, int n_tok,
			  const struct engine_mm gu[2]);

#endif
