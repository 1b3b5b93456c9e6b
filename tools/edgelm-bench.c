/* tools/edgelm-bench.c: speed of this box and of the engine on it, measured
 * in one run on the same threads.
 *
 *   edgelm-bench -m MODEL [--threads N] [--isa NAME] [--json]
 *
 * (a) read bandwidth: a streaming read over a buffer much larger than the
 *     last-level cache, split across the same number of threads as the
 *     engine (each thread reads its own contiguous part), with the widest
 *     loads the selected kernel variant has (kern_ops.read_stream: 512-bit
 *     on AVX-512), so the ratio in (d) is against what this CPU can read;
 * (b) prefill tokens/s for prompts of 128 and 512 tokens;
 * (c) decode tokens/s at context 0 and 512;
 * (d) effective decode bandwidth: bytes of weights read per token (every
 *     matrix once, the output matrix included, one embedding row) times
 *     decode tokens/s, and its ratio to (a);
 * plus peak RSS. Each figure is the best of --reps runs (default 3): the
 * best run is the one least disturbed by the rest of the box.
 *
 * Token ids are random (fixed seed): speed depends on shapes, not values. */
#include "engine/engine.h"
#include "tools/lib/tools.h"
#include "engine/kernels/kern.h"

#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define EXIT_USAGE 1
#define EXIT_INPUT 2
#define EXIT_RUNTIME 3

static void usage(FILE *o)
{
	fprintf(o,
		"usage: edgelm-bench -m MODEL [options]\n"
		"\n"
		"  -m, --model FILE     GGUF model (e.g. from `edgelm-gguf mkmodel`)\n"
		"  -t, --threads N      worker threads (default: one per usable CPU)\n"
		"      --isa NAME       force a kernel variant (also EDGELM_ISA)\n"
		"      --repack MODE    repack Q4_0/Q8_0 weights at load: auto, on, off\n"
		"                       (also EDGELM_REPACK; default auto)\n"
		"      --prompts LIST   prefill prompt lengths (default 128,512)\n"
		"      --contexts LIST  decode context depths (default 0,512)\n"
		"  -n, --n-gen N        tokens per decode run (default 32)\n"
		"      --reps N         repetitions, best kept (default 3)\n"
		"  -b, --batch N        prefill chunk, tokens per engine call (default 512)\n"
		"      --kv-type TYPE   KV cache type: %s (default %s)\n"
		"      --bw-mib N       bandwidth buffer size in MiB (default 1024)\n"
		"      --json           one JSON object instead of a table\n"
		"  -h, --help\n",
		engine_kv_type_list(), engine_kv_type_name(ENGINE_KV_DEFAULT));
}

/* ---- read bandwidth ------------------------------------------------------ */

struct bw_arg {
	const uint64_t *p;
	size_t n; /* words */
	uint64_t (*read)(const void *p, size_t n);
	uint64_t sink;
	pthread_barrier_t *bar;
	double t0, t1;
};

static void *bw_thread(void *argp)
{
	struct bw_arg *a = argp;
	pthread_barrier_wait(a->bar);
	a->t0 = cm_now();
	a->sink = a->read(a->p, a->n * 8);
	a->t1 = cm_now();
	return NULL;
}

/* Bytes per second over all threads: total bytes / (last end - first start). */
static double measure_bw(int n_threads, size_t bytes, int reps,
			 uint64_t (*read)(const void *p, size_t n))
{
	size_t words = bytes / 8;
	uint64_t *buf = cm_aligned_alloc(words * 8);
	if (!buf)
		return -1;
	for (size_t i = 0; i < words; i++)
		buf[i] = i * 0x9e3779b97f4a7c15ull; /* touch every page */
	double best = 0;
	for (int r = 0; r < reps; r++) {
		pthread_t th[256];
		struct bw_arg args[256];
		pthread_barrier_t bar;
		int n = CM_MIN(n_threads, 256);
		pthread_barrier_init(&bar, NULL, (unsigned)n);
		size_t per = words / (size_t)n / 32 * 32; /* whole 256-byte steps */
		for (int i = 0; i < n; i++) {
			args[i] = (struct bw_arg){
				.p = buf + (size_t)i * per, .n = per, .read = read, .bar = &bar};
			if (i > 0)
				pthread_create(&th[i], NULL, bw_thread, &args[i]);
		}
		bw_thread(&args[0]);
		double t0 = args[0].t0, t1 = args[0].t1;
		for (int i = 1; i < n; i++) {
			pthread_join(th[i], NULL);
			t0 = CM_MIN(t0, args[i].t0);
			t1 = CM_MAX(t1, args[i].t1);
		}
		pthread_barrier_destroy(&bar);
		double v = (double)(per * 8 * (size_t)n) / (t1 - t0);
		best = CM_MAX(best, v);
	}
	cm_free(buf);
	return best;
}

/* ---- engine runs --------------------------------------------------------- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static int32_t rand_token(int n_vocab)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (int32_t)(rng_state % (uint64_t)n_vocab);
}

/* Prefill n tokens into a fresh sequence; returns seconds, < 0 on error. */
static double run_prefill(engine_ctx *c, int n, int n_vocab, struct cm_err *err)
{
	int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
	if (!t)
		return -1;
	for (int i = 0; i < n; i++)
		t[i] = rand_token(n_vocab);
	engine_seq_truncate(c, 0, 0);
	double t0 = cm_now();
	int r = engine_eval(c, t, n, 0, err);
	double dt = cm_now() - t0;
	free(t);
	return r ? -1 : dt;
}

/* Decode n_gen tokens after a context of depth tokens; returns seconds. */
static double run_decode(engine_ctx *c, int depth, int n_gen, int n_vocab, struct cm_err *err)
{
	if (depth > 0 && run_prefill(c, depth, n_vocab, err) < 0)
		return -1;
	if (depth == 0)
		engine_seq_truncate(c, 0, 0);
	double t0 = cm_now();
	for (int i = 0; i < n_gen; i++) {
		int32_t tok = rand_token(n_vocab);
		if (engine_eval(c, &tok, 1, depth + i, err) != 0)
			return -1;
	}
	return cm_now() - t0;
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 0 || v > (1 << 20))
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

int main(int argc, char **argv)
{
	/* --daemon URL: load a running edgelmd instead (tools/lib/bench_daemon.c) */
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--daemon") == 0 || strncmp(argv[i], "--daemon=", 9) == 0)
			return tools_bench_daemon_main(argc, argv);

	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'}, {"threads", required_argument, NULL, 't'},
		{"isa", required_argument, NULL, 'I'},   {"prompts", required_argument, NULL, 'P'},
		{"contexts", required_argument, NULL, 'C'}, {"n-gen", required_argument, NULL, 'n'},
		{"reps", required_argument, NULL, 'r'},  {"bw-mib", required_argument, NULL, 'W'},
		{"json", no_argument, NULL, 'j'},        {"help", no_argument, NULL, 'h'},
		{"batch", required_argument, NULL, 'B'}, {"kv-type", required_argument, NULL, 'K'},
		{"repack", required_argument, NULL, 'R'},
		{NULL, 0, NULL, 0},
	};
	const char *model = NULL, *isa = getenv("EDGELM_ISA"), *repack = getenv("EDGELM_REPACK");
	int threads = 0, n_gen = 32, reps = 3, bw_mib = 1024, n_batch = 512;
	enum engine_kv_type kv_type = ENGINE_KV_DEFAULT;
	int prompts[8] = {128, 512}, n_prompts = 2, ctxs[8] = {0, 512}, n_ctxs = 2;
	bool json = false;
	int c;
	while ((c = getopt_long(argc, argv, "m:t:n:r:b:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 't': threads = atoi(optarg); break;
		case 'I': isa = optarg; break;
		case 'R': repack = optarg; break;
		case 'P': n_prompts = parse_list(optarg, prompts, 8); break;
		case 'C': n_ctxs = parse_list(optarg, ctxs, 8); break;
		case 'n': n_gen = atoi(optarg); break;
		case 'r': reps = atoi(optarg); break;
		case 'W': bw_mib = atoi(optarg); break;
		case 'b':
		case 'B': n_batch = atoi(optarg); break;
		case 'K':
			if (engine_kv_type_from_name(optarg, &kv_type) != 0) {
				fprintf(stderr, "edgelm-bench: --kv-type: '%s' is not one of %s\n",
					optarg, engine_kv_type_list());
				return EXIT_USAGE;
			}
			break;
		case 'j': json = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	if (!model || optind < argc || n_prompts < 0 || n_ctxs < 0 || threads < 0 || n_gen < 1 ||
	    reps < 1 || bw_mib < 16 || n_batch < 1 || n_batch > 65536) {
		usage(stderr);
		return EXIT_USAGE;
	}
	struct cm_err err = {0};
	engine_model *m = NULL;
	engine_ctx *cx = NULL;
	struct engine_params ep = {.n_threads = threads, .isa = isa};
	if (engine_repack_parse(repack, &ep.repack) != 0) {
		fprintf(stderr, "edgelm-bench: --repack: expected auto, on or off, not '%s'\n", repack);
		return EXIT_USAGE;
	}
	if (engine_model_load(model, &ep, &m, &err) != 0) {
		fprintf(stderr, "edgelm-bench: %s: %s\n", model, err.msg);
		return EXIT_INPUT;
	}
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	int max_ctx = 1;
	for (int i = 0; i < n_prompts; i++)
		max_ctx = CM_MAX(max_ctx, prompts[i]);
	for (int i = 0; i < n_ctxs; i++)
		max_ctx = CM_MAX(max_ctx, ctxs[i] + n_gen);
	if ((uint32_t)max_ctx > info.n_ctx) {
		fprintf(stderr, "edgelm-bench: the runs need a context of %d, the model has %u\n",
			max_ctx, info.n_ctx);
		engine_model_free(m);
		return EXIT_USAGE;
	}
	struct engine_ctx_params cp = {
		.n_ctx = (uint32_t)max_ctx,
		.n_seq = 1,
		.n_batch = (uint32_t)n_batch,
		.kv_type = kv_type,
	};
	if (engine_ctx_new(m, &cp, &cx, &err) != 0) {
		fprintf(stderr, "edgelm-bench: %s\n", err.msg);
		engine_model_free(m);
		return EXIT_RUNTIME;
	}

	/* the same variant the engine chose */
	const struct kern_ops *ko = kern_select(NULL, isa);
	uint64_t (*rd)(const void *, size_t) =
		ko && ko->read_stream ? ko->read_stream : kern_read_stream_generic;
	double bw = measure_bw(info.n_threads, (size_t)bw_mib << 20, CM_MAX(reps, 3), rd);
	double pre[8] = {0}, dec[8] = {0};
	int rc = 0;
	/* warm-up: fault in the weights, settle the pool */
	if (run_decode(cx, 0, 2, (int)info.n_vocab, &err) < 0)
		rc = EXIT_RUNTIME;
	for (int i = 0; i < n_prompts && !rc; i++)
		for (int r = 0; r < reps && !rc; r++) {
			double t = run_prefill(cx, prompts[i], (int)info.n_vocab, &err);
			if (t < 0)
				rc = EXIT_RUNTIME;
			else
				pre[i] = CM_MAX(pre[i], prompts[i] / t);
		}
	for (int i = 0; i < n_ctxs && !rc; i++)
		for (int r = 0; r < reps && !rc; r++) {
			double t = run_decode(cx, ctxs[i], n_gen, (int)info.n_vocab, &err);
			if (t < 0)
				rc = EXIT_RUNTIME;
			else
				dec[i] = CM_MAX(dec[i], n_gen / t);
		}
	if (rc) {
		fprintf(stderr, "edgelm-bench: %s\n", err.msg);
		goto out;
	}
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	double rss_mib = (double)ru.ru_maxrss / 1024.0;
	double wb = (double)info.weight_bytes_token;

	if (json) {
		printf("{\"model\":\"%s\",\"arch\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
		       "\"kv_type\":\"%s\",\"batch\":%d,"
		       "\"repacked_tensors\":%u,\"repacked_bytes\":%llu,"
		       "\"weight_bytes_per_token\":%.0f,\"read_bandwidth_gbs\":%.3f,\"prefill\":[",
		       info.name, info.arch, info.isa, info.n_threads,
		       engine_kv_type_name(engine_ctx_kv_type(cx)), n_batch, info.n_x16_tensors,
		       (unsigned long long)info.x16_bytes, wb, bw / 1e9);
		for (int i = 0; i < n_prompts; i++)
			printf("%s{\"tokens\":%d,\"tok_s\":%.2f}", i ? "," : "", prompts[i], pre[i]);
		printf("],\"decode\":[");
		for (int i = 0; i < n_ctxs; i++)
			printf("%s{\"context\":%d,\"tok_s\":%.2f,\"bandwidth_gbs\":%.3f,"
			       "\"bandwidth_ratio\":%.4f}",
			       i ? "," : "", ctxs[i], dec[i], dec[i] * wb / 1e9, dec[i] * wb / bw);
		printf("],\"peak_rss_mib\":%.1f}\n", rss_mib);
	} else {
		printf("model        %s (%s), %.1f MiB of weights read per token\n",
		       info.name[0] ? info.name : model, info.arch, wb / (1 << 20));
		printf("kernels      %s, %d threads", info.isa, info.n_threads);
		if (info.n_x16_tensors)
			printf(", %u tensors repacked x16 (%.1f MiB)", info.n_x16_tensors,
			       (double)info.x16_bytes / (1 << 20));
		printf("\n");
		printf("kv cache     %s, %.1f KiB per token; prefill in chunks of %d\n",
		       engine_kv_type_name(engine_ctx_kv_type(cx)),
		       (double)engine_model_kv_bytes_per_token(m, engine_ctx_kv_type(cx)) / 1024,
		       n_batch);
		printf("read bw      %.2f GB/s (streaming read, %d threads)\n", bw / 1e9,
		       info.n_threads);
		for (int i = 0; i < n_prompts; i++)
			printf("prefill %-4d %.1f tok/s\n", prompts[i], pre[i]);
		for (int i = 0; i < n_ctxs; i++)
			printf("decode @%-4d %.2f tok/s  = %.2f GB/s of weights, %.0f%% of read bw\n",
			       ctxs[i], dec[i], dec[i] * wb / 1e9, 100 * dec[i] * wb / bw);
		printf("peak RSS     %.1f MiB\n", rss_mib);
	}
out:
	engine_ctx_free(cx);
	engine_model_free(m);
	return rc;
}
