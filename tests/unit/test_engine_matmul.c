/* tests/unit/test_engine_matmul.c: engine_matmul_swiglu (engine/matmul.c).
 *
 * A SwiGLU FFN's gate and up projections with their product taken in the
 * same job (a chunk of rows of both matrices, then silu(gate) * up over
 * them) give bit for bit what engine_matmul_multi and then silu_mul_f32 over
 * the whole batch give: for one token (the unfused way), a few, and more than
 * a tile of tokens; for a pair whose matrices chunk alike (both repacked, or
 * both in the file's layout) and for pairs that do not (one matrix repacked
 * in groups of 128 rows, the other in the file's layout in chunks of 64),
 * which the pair's chunks must tile with each matrix's own. The up output
 * is left as engine_matmul_multi leaves it. */
#include "engine/engine_impl.h"
#include "engine/matmul.h"
#include "tests/test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *mkmodel(const char *type)
{
	static char out[2][4096];
	static int k;
	char args[256];
	char *o = out[k++ % 2];
	snprintf(o, sizeof(out[0]), "%s/edgelm-matmul-%d-%s.gguf", test_tmpdir(), (int)getpid(),
		 type);
	snprintf(args, sizeof(args), "--shape small --vocab synthetic --type %s", type);
	return test_mkmodel(o, args) == 0 ? o : NULL;
}

static engine_model *load(const char *path, int repack)
{
	struct engine_params p = {0};
	struct cm_err err = {0};
	engine_model *m = NULL;
	p.n_threads = 2;
	p.repack = repack;
	int r = engine_model_load(path, &p, &m, &err);
	CHECK_MSG(r == 0, "load %s: %s", path, err.msg);
	return r == 0 ? m : NULL;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float unif(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* gate from model a, up from model b, on a's context */
static void check_pair(engine_ctx *c, const struct weight *gate, const struct weight *up,
		       const char *what)
{
	const int64_t E = gate->n_in, F = gate->n_out;
	static const int toks[] = {1, 3, 130};
	for (size_t k = 0; k < CM_ARRAY_LEN(toks); k++) {
		int T = toks[k];
		size_t out = (size_t)T * F * sizeof(float);
		float *x = malloc((size_t)T * E * sizeof(float));
		float *g = malloc(out), *u = malloc(out), *g0 = malloc(out), *u0 = malloc(out);
		for (int64_t i = 0; i < T * E; i++)
			x[i] = unif();
		/* poisoned outputs: every element must be written */
		memset(g, 0xff, out);
		memset(u, 0xff, out);
		struct engine_mm ref[2] = {{gate, g0, (size_t)F, NULL, false},
					   {up, u0, (size_t)F, NULL, false}};
		engine_matmul_multi(c, x, (size_t)E, T, ref, 2);
		for (int t = 0; t < T; t++)
			c->m->kern->silu_mul_f32(F, g0 + (size_t)t * F, u0 + (size_t)t * F);
		struct engine_mm gu[2] = {{gate, g, (size_t)F, NULL, false},
					  {up, u, (size_t)F, NULL, false}};
		engine_matmul_swiglu(c, x, (size_t)E, T, gu);
		CHECK_MSG(memcmp(g, g0, out) == 0, "%s, %d tokens: the product differs", what, T);
		CHECK_MSG(memcmp(u, u0, out) == 0, "%s, %d tokens: up differs", what, T);
		/* and it is the product, not two copies of one input */
		bool moved = false;
		for (int64_t i = 0; i < T * F; i++)
			moved |= g[i] != u[i];
		CHECK_MSG(moved, "%s, %d tokens: gate equals up", what, T);
		free(x);
		free(g);
		free(u);
		free(g0);
		free(u0);
	}
}

static void test_swiglu(void)
{
	const char *pq = mkmodel("Q4_0"), *pf = mkmodel("F16");
	CHECK_MSG(pq && pf, "mkmodel failed");
	if (!pq || !pf)
		return;
	engine_model *q = load(pq, 0), *qo = load(pq, -1), *f = load(pf, 0);
	engine_ctx *c = NULL;
	struct engine_ctx_params cp = {.n_ctx = 64, .n_seq = 1, .n_batch = 256};
	struct cm_err err = {0};
	if (q && qo && f && engine_ctx_new(q, &cp, &c, &err) == 0) {
		const struct layer *lq = &q->layers[0], *lo = &qo->layers[0], *lf = &f->layers[0];
		bool x16 = lq->w_gate.n_x16 > 0;
		printf("# Q4_0 gate/up %s on %s\n", x16 ? "repacked" : "in the file's layout",
		       q->kern->name);
		check_pair(c, &lq->w_gate, &lq->w_up, "Q4_0 pair");
		check_pair(c, &lo->w_gate, &lo->w_up, "Q4_0 pair, not repacked");
		check_pair(c, &lf->w_gate, &lf->w_up, "F16 pair");
		check_pair(c, &lq->w_gate, &lf->w_up, "Q4_0 gate, F16 up");
		check_pair(c, &lf->w_gate, &lq->w_up, "F16 gate, Q4_0 up");
		check_pair(c, &lo->w_gate, &lq->w_up, "file-layout gate, repacked up");
	} else {
		CHECK_MSG(false, "setup failed: %s", err.msg);
	}
	engine_ctx_free(c);
	engine_model_free(q);
	engine_model_free(qo);
	engine_model_free(f);
	unlink(pq);
	unlink(pf);
}

int main(void)
{
	TEST_RUN(test_swiglu);
	return test_finish();
}
