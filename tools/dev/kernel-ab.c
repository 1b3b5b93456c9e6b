/* tools/dev/kernel-ab.c: two builds of one kernel file, compared in one
 * process (built and run by tools/dev/kernel-ab.sh; not installed).
 *
 *   kernel-ab MODEL [-n TOKENS] [-r REPS] [-t THREADS] [-i ISA] [-b BATCH | -p]
 *
 * On a VM whose speed drifts by 25 % within minutes, two binaries timed one
 * after the other measure the drift. Here the model is loaded once; build A
 * is the library's kernel table, build B the same kernel file compiled with
 * other flags (its table renamed to ab_b_ops by the script); -i forces
 * the variant A runs (EDGELM_ISA's names), which must be the one B's table
 * is built from. Each rep runs
 * the same steps with A, then with B, and the result is the median of the
 * per-rep ratios B/A. A step is one decode token (default), a batch of
 * BATCH tokens per call (-b), or one prefill of TOKENS tokens (-p).
 * B replaces A's matmul functions (kern_ops.t[], where B has them); the
 * converters and attention stay A's. Both builds must compute the same
 * results (the kernel tests); this only times them. */
#include "common/common.h"
#include "engine/engine_impl.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REPS 64

extern const struct kern_ops *const ab_b_ops; /* the script's stub */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* The steps of one rep: tok/s. */
static double run_rep(engine_ctx *c, int n, int batch, bool prefill, int32_t *tok)
{
	struct cm_err err = {0};
	engine_seq_truncate(c, 0, 0);
	double t0 = cm_now();
	int step = prefill ? n : batch;
	for (int i = 0; i < n; i += step) {
		int k = CM_MIN(step, n - i);
		for (int j = 0; j < k; j++)
			tok[j] = 100 + i + j; /* speed depends on shapes, not ids */
		if (engine_eval(c, tok, k, i, &err)) {
			fprintf(stderr, "kernel-ab: %s\n", err.msg);
			exit(1);
		}
	}
	return n / (cm_now() - t0);
}

int main(int argc, char **argv)
{
	int n = 24, reps = 10, threads = 2, batch = 1, opt;
	bool prefill = false;
	const char *isa = NULL;
	while ((opt = getopt(argc, argv, "n:r:t:i:b:p")) != -1) {
		switch (opt) {
		case 'n': n = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 't': threads = atoi(optarg); break;
		case 'i': isa = optarg; break;
		case 'b': batch = atoi(optarg); break;
		case 'p': prefill = true; break;
		default: goto usage;
		}
	}
	if (optind != argc - 1 || n < 1 || reps < 1 || reps > MAX_REPS || batch < 1)
		goto usage;

	struct engine_params p = {.n_threads = threads, .isa = isa};
	struct cm_err err = {0};
	engine_model *m;
	engine_ctx *c;
	if (engine_model_load(argv[optind], &p, &m, &err)) {
		fprintf(stderr, "kernel-ab: %s\n", err.msg);
		return 1;
	}
	struct engine_ctx_params cp = {.n_ctx = (uint32_t)n + 8, .n_seq = 1,
				       .n_batch = (uint32_t)(prefill ? n : batch)};
	if (engine_ctx_new(m, &cp, &c, &err)) {
		fprintf(stderr, "kernel-ab: %s\n", err.msg);
		return 1;
	}
	const struct kern_ops *a = m->kern;
	static struct kern_ops b;
	b = *a;
	for (int t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		const struct kern_type_ops *o = &ab_b_ops->t[t];
		if (o->vec_dot)
			b.t[t].vec_dot = o->vec_dot;
		if (o->gemv)
			b.t[t].gemv = o->gemv;
		if (o->gemm)
			b.t[t].gemm = o->gemm;
		if (o->gemm_x16)
			b.t[t].gemm_x16 = o->gemm_x16;
	}
	int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
	if (!tok)
		return 1;
	double ra[MAX_REPS], rb[MAX_REPS], q[MAX_REPS];
	run_rep(c, n, batch, prefill, tok); /* warm-up: first touches, page faults */
	for (int r = 0; r < reps; r++) {
		m->kern = a;
		ra[r] = run_rep(c, n, batch, prefill, tok);
		m->kern = &b;
		rb[r] = run_rep(c, n, batch, prefill, tok);
		m->kern = a;
		q[r] = rb[r] / ra[r];
		printf("rep %2d  A %8.2f tok/s  B %8.2f tok/s  B/A %.3f\n", r, ra[r], rb[r], q[r]);
	}
	qsort(q, (size_t)reps, sizeof(double), cmp_double);
	printf("%s (%s, %d threads): median B/A %.3f (min %.3f, max %.3f, %d reps)\n", a->name,
	       prefill ? "prefill" : batch > 1 ? "batched decode" : "decode", threads, q[reps / 2],
	       q[0], q[reps - 1], reps);
	free(tok);
	engine_ctx_free(c);
	engine_model_free(m);
	return 0;

usage:
	fprintf(stderr, "usage: kernel-ab MODEL [-n TOKENS] [-r REPS (max %d)] [-t THREADS] "
			"[-i ISA] [-b BATCH | -p]\n", MAX_REPS);
	return 1;
}
