/* tools/edgelm-bench.c: speed of this box and of the engine on it, measured
 * in one run on the same threads.
 *
 *   edgelm-bench -m MODEL [--threads N] [--isa NAME] [--json]
 *                [--tuning on|off] [--pin] [--hugepages] [--prefault] [--mlock]
 *   edgelm-bench --tokenize -m MODEL [FILE]     (tools/lib/bench_tokenize.c)
 *   edgelm-bench --daemon URL ...               (tools/lib/bench_daemon.c)
 *
 * (a) read bandwidth: a streaming read over a buffer much larger than the
 *     last-level cache, split across the same number of threads as the
 *     engine (each thread reads its own contiguous part), with the widest
 *     loads the selected kernel variant has (kern_ops.read_stream: 512-bit
 *     on AVX-512), and where the variant has it also as one chain of single
 *     loads (kern_ops.read_stream_chain, which read 20-30 % more on a Zen 5
 *     VM), the better of the two kept, so the ratio in (d) is against what
 *     this CPU can read;
 * (b) prefill tokens/s and time to first token for prompts of 128 and 512
 *     tokens: from a cleared KV cache, the prompt's prefill and the first
 *     token sampled from its logits (llama.cpp's default sampler chain);
 * (c) decode tokens/s at context 0 and 512;
 * (d) effective decode bandwidth: bytes of weights read per token (every
 *     matrix once, the output matrix included, one embedding row) times
 *     decode tokens/s, and its ratio to (a); and the paired ratio: per
 *     decode rep, its bandwidth over the higher of the read samples taken
 *     just before and just after it, the median over reps (on a VM whose
 *     bandwidth drifts by 2x within a minute, the run's best read sample
 *     can come from a moment no decode saw);
 * (e) with --grammar-file (or --json-schema, converted as the daemon does):
 *     decode with each token sampled and fed back,
 *     once with the sampler alone and once with the grammar in it, side by
 *     side in each rep (the grammar starts over whenever a value is
 *     complete), and the sampling time per token of each;
 * plus the load's wall time and the peak RSS during it (VmHWM reset just
 * before it where the kernel allows), the first one-token step's time after
 * the load and its page faults (cold: every weight page faults in unless
 * prefaulted or locked), the second step's time, and memory: the peak RSS
 * of the model, KV cache and scratch over the load and the runs (the
 * bandwidth buffer, resident from before the warm-up to the end, taken
 * out: see bench_run), RSS at the end, locked, huge pages. Each speed
 * figure is the best of --reps runs (default 3): the best run is the one
 * least disturbed by the rest of the box.
 *
 * Tuning switches (tools/lib/bench_tuning.c): --pin, --hugepages,
 * --prefault, --mlock apply what edgelmd applies, through the same tuning
 * module calls; --tuning on is what edgelmd does by default
 * (tuning_config_default: pin, prefault, mlock; huge pages stay off), and
 * --tuning off (the default) none. The report says of each whether it was
 * applied or failed, and why.
 *
 * Token ids are random (fixed seed): speed depends on shapes, not values. */
#include "engine/engine.h"
#include "ipc/json_schema.h"
#include "tools/lib/tools.h"
#include "engine/kernels/kern.h"
#include "tuning/tuning.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
		"      --repack MODE    repack weights (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0,\n"
		"                       Q4_K, Q6_K; avx512vnni: also Q2_K, Q3_K, Q5_K,\n"
		"                       IQ4_XS) at load: auto, on, off (also\n"
		"                       EDGELM_REPACK; default auto)\n"
		"      --repack-segment BYTES  K-segment of a repacked panel: 0 the type's\n"
		"                       default, -1 whole rows (for comparisons)\n"
		"      --repack-cache DIR  map the repacked weights from DIR, writing them\n"
		"                       there first when missing (also EDGELM_REPACK_CACHE)\n"
		"      --quantize TYPE  quantize F32/F16/BF16 weights on load as edgelm-quantize\n"
		"                       TYPE would (q8_0, q4_k_m, ...); the load's time and\n"
		"                       peak RSS include it\n"
		"      --prompts LIST   prompt lengths for prefill tok/s and time to first token\n"
		"                       (default 128,512)\n"
		"      --contexts LIST  decode context depths (default 0,512)\n"
		"  -n, --n-gen N        tokens per decode run (default 32)\n"
		"      --reps N         repetitions, best kept (default 3)\n"
		"  -b, --batch N        prefill chunk, tokens per engine call (default 512)\n"
		"      --kv-type TYPE   KV cache type: %s (default %s)\n"
		"      --bw-mib N       bandwidth buffer size in MiB (default 1024; reported apart,\n"
		"                       not in the peak RSS)\n"
		"      --json           one JSON object instead of a table\n"
		"      --grammar-file FILE  also decode with sampling, with and without this GBNF\n"
		"                       grammar in the sampler (-n tokens per run, from context 0)\n"
		"      --json-schema FILE   the same with the grammar of this JSON Schema (as a\n"
		"                       request's json_schema; docs/grammar.md)\n"
		"\n"
		"tuning (as edgelmd applies it; the report says what applied and what failed):\n"
		"      --tuning on|off  on: what edgelmd does by default (pin, prefault, mlock);\n"
		"                       off (default): nothing; the switches below add to it\n"
		"      --pin            pin the workers, one per physical core (the tuning plan)\n"
		"      --hugepages      copy the weights to 2 MiB-aligned memory (THP)\n"
		"      --prefault       populate weights and KV cache before timing\n"
		"      --mlock          lock weights and KV cache (a warning if not allowed)\n"
		"\n"
		"  --tokenize [FILE]    tokenizer speed instead: encode and decode MB/s and\n"
		"                       tokens/s of FILE, else $EDGELM_TESTDATA's held-out\n"
		"                       stories, else synthetic English (-m may be a vocab GGUF)\n"
		"      --text-mb N      repeat the text up to N MB (default 4; 0: once)\n"
		"\n"
		"  --daemon URL...      load running edgelmd instead, one or several, over TLS too\n"
		"                       (--help --daemon: its options)\n"
		"  -h, --help\n",
		engine_kv_type_list(), engine_kv_type_name(ENGINE_KV_DEFAULT));
}

/* ---- read bandwidth ------------------------------------------------------ */

struct bw_arg {
	const uint64_t *p;
	int cpu; /* pin to this cpu first, -1: leave it */
	size_t n; /* words */
	uint64_t (*read)(const void *p, size_t n);
	uint64_t sink;
	pthread_barrier_t *bar;
	double window; /* seconds: whole passes until it has passed */
	double t0, t1;
	size_t bytes;
};

static void *bw_thread(void *argp)
{
	struct bw_arg *a = argp;
	if (a->cpu >= 0)
		(void)tuning_thread_pin(a->cpu, NULL);
	pthread_barrier_wait(a->bar);
	a->t0 = cm_now();
	a->bytes = 0;
	do {
		a->sink ^= a->read(a->p, a->n * 8);
		a->bytes += a->n * 8;
		a->t1 = cm_now();
	} while (a->t1 - a->t0 < a->window);
	return NULL;
}

/* The read-bandwidth meter: one buffer, sampled several times across the
 * run (before the warm-up, after prefill, before each decode repetition,
 * at the end). A sample reads the buffer over and over for BW_WINDOW
 * seconds, the order of a decode run, so that both figures are sustained
 * rates: on a shared VM a single 20 ms pass swings by 2x and more, and the
 * bandwidth drifts by tens of percent within minutes. The bar is decode
 * against the best sample of the same run, so a dip while decode ran
 * cannot flatter the ratio. */
#define BW_WINDOW 0.25
struct bw_meter {
	uint64_t *buf;
	size_t words;
	int n_threads;
	uint64_t (*read)(const void *p, size_t n);
	uint64_t (*read2)(const void *p, size_t n); /* NULL: none */
	const struct tools_tuning *tt;
	double best, lowest; /* over the samples (each the best of its reps) */
	int samples;
};

static int bw_open(struct bw_meter *b, int n_threads, size_t bytes,
		   uint64_t (*read)(const void *p, size_t n),
		   uint64_t (*read2)(const void *p, size_t n), const struct tools_tuning *tt)
{
	*b = (struct bw_meter){.words = bytes / 8, .n_threads = CM_MIN(n_threads, 256),
			       .read = read, .read2 = read2, .tt = tt};
	/* its own mapping, not malloc's: its pages are its alone (mincore
	 * counts them exactly) and go back on bw_close, where a sanitizer's
	 * allocator would keep a freed block resident in quarantine */
	void *p = mmap(NULL, b->words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	if (p == MAP_FAILED)
		return -1;
	b->buf = p;
	for (size_t i = 0; i < b->words; i++)
		b->buf[i] = i * 0x9e3779b97f4a7c15ull; /* touch every page */
	return 0;
}

static void bw_close(struct bw_meter *b)
{
	if (b->buf)
		munmap(b->buf, b->words * 8);
	b->buf = NULL;
}

/* Bytes of the buffer in RAM (mincore), to take it out of the process's
 * peak RSS. A static vector in steps: an allocated one would itself show
 * in the RSS being measured. */
static uint64_t bw_resident(const struct bw_meter *b)
{
	static unsigned char vec[4096];
	long pgl = sysconf(_SC_PAGESIZE);
	uintptr_t pg = pgl > 0 ? (uintptr_t)pgl : 4096;
	uintptr_t a = (uintptr_t)b->buf, end = a + b->words * 8; /* page-aligned: mmap */
	uint64_t n = 0;
	if (!b->buf)
		return 0;
	while (a < end) {
		size_t len = CM_MIN(end - a, sizeof(vec) * pg);
		if (mincore((void *)a, len, vec) != 0)
			return 0;
		for (size_t i = 0; i < (len + pg - 1) / pg; i++)
			n += vec[i] & 1;
		a += len;
	}
	return n * pg;
}

/* Bytes per second over all threads: total bytes / (last end - first start),
 * best of `reps` and of the read loops (read, then read2 when there is
 * one). Thread i runs where engine worker i runs (pinned with --pin). */
static double bw_sample(struct bw_meter *b, int reps)
{
	double best = 0;
	int n = b->n_threads;
	if (!b->buf)
		return -1;
	int loops = b->read2 ? 2 : 1;
	for (int r = 0; r < reps * loops; r++) {
		pthread_t th[256];
		struct bw_arg args[256];
		pthread_barrier_t bar;
		pthread_barrier_init(&bar, NULL, (unsigned)n);
		size_t per = b->words / (size_t)n / 32 * 32; /* whole 256-byte steps */
		for (int i = 0; i < n; i++) {
			args[i] = (struct bw_arg){.p = b->buf + (size_t)i * per,
						  .cpu = tools_tuning_worker_cpu(b->tt, i),
						  .n = per,
						  .read = loops == 2 && r % 2 ? b->read2 : b->read,
						  .bar = &bar,
						  .window = BW_WINDOW};
			if (i > 0)
				pthread_create(&th[i], NULL, bw_thread, &args[i]);
		}
		bw_thread(&args[0]);
		double t0 = args[0].t0, t1 = args[0].t1;
		size_t bytes = args[0].bytes;
		for (int i = 1; i < n; i++) {
			pthread_join(th[i], NULL);
			t0 = CM_MIN(t0, args[i].t0);
			t1 = CM_MAX(t1, args[i].t1);
			bytes += args[i].bytes;
		}
		pthread_barrier_destroy(&bar);
		double v = (double)bytes / (t1 - t0);
		best = CM_MAX(best, v);
	}
	b->best = CM_MAX(b->best, best);
	b->lowest = b->samples ? CM_MIN(b->lowest, best) : best;
	b->samples++;
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v); the mean of the middle two for even n. */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
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

/* ---- options ------------------------------------------------------------- */

static int parse_on_off(const char *s, bool *ret)
{
	if (strcmp(s, "on") == 0)
		*ret = true;
	else if (strcmp(s, "off") == 0)
		*ret = false;
	else
		return -1;
	return 0;
}

struct bench_opts {
	const char *model, *isa, *repack, *repack_cache, *quantize, *grammar_file, *schema_file;
	int threads, n_gen, reps, bw_mib, n_batch, segment;
	enum engine_kv_type kv_type;
	int prompts[8], n_prompts, ctxs[8], n_ctxs;
	bool json, tokenize, bad, tuning;
	double text_mb;
	struct tools_tuning_want add; /* the switches, added to --tuning's base */
};

/* The options into o: -1 to go on (optind at the first argument), else
 * the exit code. The numeric options' ranges are checked here; o->bad says
 * one was wrong. */
static int bench_opts_parse(int argc, char **argv, struct bench_opts *o)
{
	enum { OPT_TUNING = 256, OPT_PIN, OPT_HUGEPAGES, OPT_PREFAULT, OPT_MLOCK, OPT_TOKENIZE,
	       OPT_TEXT_MB, OPT_SEGMENT, OPT_REPACK_CACHE,
	       OPT_QUANTIZE, OPT_GRAMMAR_FILE, OPT_JSON_SCHEMA };
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'}, {"threads", required_argument, NULL, 't'},
		{"isa", required_argument, NULL, 'I'},   {"prompts", required_argument, NULL, 'P'},
		{"contexts", required_argument, NULL, 'C'}, {"n-gen", required_argument, NULL, 'n'},
		{"reps", required_argument, NULL, 'r'},  {"bw-mib", required_argument, NULL, 'W'},
		{"json", no_argument, NULL, 'j'},        {"help", no_argument, NULL, 'h'},
		{"batch", required_argument, NULL, 'B'}, {"kv-type", required_argument, NULL, 'K'},
		{"repack", required_argument, NULL, 'R'},
		{"repack-segment", required_argument, NULL, OPT_SEGMENT},
		{"repack-cache", required_argument, NULL, OPT_REPACK_CACHE},
		{"quantize", required_argument, NULL, OPT_QUANTIZE},
		{"tuning", required_argument, NULL, OPT_TUNING},
		{"pin", no_argument, NULL, OPT_PIN},
		{"hugepages", no_argument, NULL, OPT_HUGEPAGES},
		{"prefault", no_argument, NULL, OPT_PREFAULT},
		{"mlock", no_argument, NULL, OPT_MLOCK},
		{"tokenize", no_argument, NULL, OPT_TOKENIZE},
		{"text-mb", required_argument, NULL, OPT_TEXT_MB},
		{"grammar-file", required_argument, NULL, OPT_GRAMMAR_FILE},
		{"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
		{NULL, 0, NULL, 0},
	};
	static const char P[] = "edgelm-bench";
	*o = (struct bench_opts){
		.isa = getenv("EDGELM_ISA"), .repack = getenv("EDGELM_REPACK"),
		.repack_cache = getenv("EDGELM_REPACK_CACHE"),
		.n_gen = 32, .reps = 3, .bw_mib = 1024, .n_batch = 512,
		.kv_type = ENGINE_KV_DEFAULT,
		.prompts = {128, 512}, .n_prompts = 2, .ctxs = {0, 512}, .n_ctxs = 2,
		.text_mb = 4,
	};
	bool bad = false;
	int c;
	while ((c = getopt_long(argc, argv, "m:t:n:r:b:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o->model = optarg; break;
		case 't':
			bad |= tools_opt_int(P, "--threads", optarg, 0, 4096, &o->threads) != 0;
			break;
		case 'I': o->isa = optarg; break;
		case 'R': o->repack = optarg; break;
		case OPT_REPACK_CACHE: o->repack_cache = optarg; break;
		case OPT_QUANTIZE: {
			struct cm_err qe = {0};
			if (engine_quantize_check(optarg, &qe) != 0) {
				fprintf(stderr, "%s: %s\n", P, qe.msg);
				bad = true;
			}
			o->quantize = optarg;
			break;
		}
		case OPT_SEGMENT:
			bad |= tools_opt_int(P, "--repack-segment", optarg, -1, 1 << 30,
					     &o->segment) != 0;
			break;
		case 'P':
			o->n_prompts = tools_opt_list(P, "--prompts", optarg, 1, 1 << 20,
						      o->prompts, true, 8);
			break;
		case 'C':
			o->n_ctxs = tools_opt_list(P, "--contexts", optarg, 0, 1 << 20,
						   o->ctxs, true, 8);
			break;
		case 'n':
			bad |= tools_opt_int(P, "--n-gen", optarg, 1, 1 << 20, &o->n_gen) != 0;
			break;
		case 'r': bad |= tools_opt_int(P, "--reps", optarg, 1, 1000, &o->reps) != 0; break;
		case 'W':
			bad |= tools_opt_int(P, "--bw-mib", optarg, 16, 1 << 20, &o->bw_mib) != 0;
			break;
		case 'b':
		case 'B':
			bad |= tools_opt_int(P, "--batch", optarg, 1, 65536, &o->n_batch) != 0;
			break;
		case 'K':
			if (engine_kv_type_from_name(optarg, &o->kv_type) != 0) {
				fprintf(stderr, "edgelm-bench: --kv-type: '%s' is not one of %s\n",
					optarg, engine_kv_type_list());
				return EXIT_USAGE;
			}
			break;
		case 'j': o->json = true; break;
		case OPT_TUNING: bad |= parse_on_off(optarg, &o->tuning) != 0; break;
		case OPT_PIN: o->add.pin = true; break;
		case OPT_HUGEPAGES: o->add.hugepages = true; break;
		case OPT_PREFAULT: o->add.prefault = true; break;
		case OPT_MLOCK: o->add.mlock = true; break;
		case OPT_TOKENIZE: o->tokenize = true; break;
		case OPT_GRAMMAR_FILE: o->grammar_file = optarg; break;
		case OPT_JSON_SCHEMA: o->schema_file = optarg; break;
		case OPT_TEXT_MB: {
			char *end;
			o->text_mb = strtod(optarg, &end);
			bad |= end == optarg || *end || !(o->text_mb >= 0 && o->text_mb <= 4096);
			break;
		}
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
	}
	o->bad = bad || (o->grammar_file && o->schema_file); /* one grammar at a time */
	return -1;
}

/* --tuning's base (what edgelmd does by default, from the tuning module's
 * defaults) plus the switches. */
static struct tools_tuning_want bench_want(const struct bench_opts *o)
{
	struct tools_tuning_want want = {0};
	if (o->tuning) {
		struct tuning_config dc;
		tuning_config_default(&dc);
		want = (struct tools_tuning_want){.pin = dc.pin,
						  .hugepages = dc.hugepages,
						  .prefault = dc.prefault,
						  .mlock = dc.mlock != TUNING_MLOCK_OFF};
	}
	want.pin |= o->add.pin;
	want.hugepages |= o->add.hugepages;
	want.prefault |= o->add.prefault;
	want.mlock |= o->add.mlock;
	return want;
}

/* --tokenize [FILE]: the one place a positional argument is taken. */
static int bench_tokenize(const struct bench_opts *o, int argc, char **argv)
{
	if (!o->model || o->bad || optind + 1 < argc) {
		usage(stderr);
		return EXIT_USAGE;
	}
	struct tools_tokbench_params tp = {.model = o->model,
					   .text = optind < argc ? argv[optind] : NULL,
					   .text_mb = o->text_mb,
					   .reps = o->reps,
					   .json = o->json};
	return tools_bench_tokenize(&tp);
}

/* ---- the engine runs ------------------------------------------------------- */

struct bench {
	struct tools_tuning *tt;
	engine_model *m;
	engine_ctx *cx;
	engine_sampler *smp;
	struct engine_model_info info;
	struct bw_meter bwm;
	struct cm_err err;
	/* the figures */
	double t_load, first_ms, second_ms;
	long first_faults;
	double pre[8], ttft_ms[8], dec[8], paired[8];
	/* --grammar-file: [0] the sampler alone, [1] with the grammar */
	engine_grammar *gram;
	engine_sampler *gsmp[2];
	double g_compile_ms, g_tok_s[2], g_sample_ms[2];
	int g_completed;
	/* memory, bytes (0: /proc/self/status unreadable) */
	bool hwm_reset;          /* VmHWM reset before the load */
	struct cm_err hwm_err;   /* why not */
	uint64_t load_peak, load_rss;
	uint64_t peak_before_bw; /* VmHWM as the bandwidth buffer was allocated */
	uint64_t bw_bytes;       /* the buffer's resident bytes */
	uint64_t process_peak;   /* VmHWM at the end, the buffer included */
	uint64_t peak;           /* without the buffer */
};

static void bench_free(struct bench *b)
{
	bw_close(&b->bwm);
	engine_sampler_free(b->smp);
	engine_sampler_free(b->gsmp[0]);
	engine_sampler_free(b->gsmp[1]);
	engine_grammar_free(b->gram);
	engine_ctx_free(b->cx);
	engine_model_free(b->m);
	tools_tuning_free(b->tt); /* after the model: it may hold the weights */
}

/* --grammar-file or --json-schema: the file named */
static const char *grammar_src(const struct bench_opts *o)
{
	return o->grammar_file ? o->grammar_file : o->schema_file;
}

/* --grammar-file: the grammar compiled (timed) for the model's vocabulary,
 * and two samplers of the default chain, without and with it. A
 * --json-schema is converted first (ipc/json_schema.c, as the daemon does
 * for a request's json_schema); the conversion is not in the compile time. */
static int grammar_setup(const struct bench_opts *o, struct bench *b,
			 const struct engine_sampler_params *sp)
{
	FILE *f = fopen(grammar_src(o), "rb");
	char *text = NULL;
	size_t len = 0;
	if (f) {
		text = malloc(1 << 20);
		len = text ? fread(text, 1, 1 << 20, f) : 0;
		fclose(f);
	}
	if (!text || len == 0) {
		fprintf(stderr, "edgelm-bench: cannot read %s (or it is empty)\n", grammar_src(o));
		free(text);
		return EXIT_INPUT;
	}
	if (o->schema_file) {
		char *gbnf = NULL;
		if (ipc_json_schema_to_gbnf(text, len, &gbnf, &b->err) != 0) {
			fprintf(stderr, "edgelm-bench: %s: %s\n", o->schema_file, b->err.msg);
			free(text);
			return EXIT_INPUT;
		}
		free(text);
		text = gbnf;
		len = strlen(gbnf);
	}
	double t0 = cm_now();
	int rc = engine_grammar_new(engine_model_tokenizer(b->m), text, len, &b->gram, &b->err);
	b->g_compile_ms = (cm_now() - t0) * 1e3;
	free(text);
	if (rc) {
		fprintf(stderr, "edgelm-bench: %s: %s\n", grammar_src(o), b->err.msg);
		return EXIT_INPUT;
	}
	for (int k = 0; k < 2; k++) {
		struct engine_sampler_params p = *sp;
		p.grammar = k ? b->gram : NULL;
		if (engine_sampler_new(&p, (int)b->info.n_vocab, &b->gsmp[k], &b->err) != 0) {
			fprintf(stderr, "edgelm-bench: %s\n", b->err.msg);
			return EXIT_RUNTIME;
		}
	}
	return 0;
}

/* Tuning plan, model, context and bandwidth buffer; the tuning applied
 * before anything is timed. */
static int bench_setup(const struct bench_opts *o, int repack, struct bench *b)
{
	struct tools_tuning_want want = bench_want(o);
	struct engine_params ep = {.isa = o->isa,
				   .repack = repack,
				   .repack_segment = o->segment,
				   .repack_cache = o->repack_cache,
				   .quantize = o->quantize};
	if (tools_tuning_new(&want, o->model, o->threads, &b->tt, &b->err) != 0) {
		fprintf(stderr, "edgelm-bench: %s\n", b->err.msg);
		return EXIT_RUNTIME;
	}
	tools_tuning_engine_params(b->tt, &ep);
	/* The load's own peak: where the reset fails, VmHWM is the peak since
	 * the process started, which before this is option parsing and the
	 * tuning detection (a few MiB; the report says which). */
	b->hwm_reset = tools_mem_hwm_reset(&b->hwm_err) == 0;
	double t0 = cm_now();
	if (engine_model_load(o->model, &ep, &b->m, &b->err) != 0) {
		fprintf(stderr, "edgelm-bench: %s: %s\n", o->model, b->err.msg);
		return EXIT_INPUT;
	}
	b->t_load = cm_now() - t0;
	struct tools_mem mm;
	(void)tools_mem_read(&mm);
	b->load_peak = mm.hwm;
	b->load_rss = mm.rss;
	engine_model_get_info(b->m, &b->info);
	int max_ctx = 1;
	for (int i = 0; i < o->n_prompts; i++)
		max_ctx = CM_MAX(max_ctx, o->prompts[i]);
	for (int i = 0; i < o->n_ctxs; i++)
		max_ctx = CM_MAX(max_ctx, o->ctxs[i] + o->n_gen);
	if ((uint32_t)max_ctx > b->info.n_ctx) {
		fprintf(stderr, "edgelm-bench: the runs need a context of %d, the model has %u\n",
			max_ctx, b->info.n_ctx);
		return EXIT_USAGE;
	}
	struct engine_ctx_params cp = {
		.n_ctx = (uint32_t)max_ctx,
		.n_seq = 1,
		.n_batch = (uint32_t)o->n_batch,
		.kv_type = o->kv_type,
	};
	if (engine_ctx_new(b->m, &cp, &b->cx, &b->err) != 0) {
		fprintf(stderr, "edgelm-bench: %s\n", b->err.msg);
		return EXIT_RUNTIME;
	}
	/* huge-page copy, lock, prefault: before anything is timed */
	tools_tuning_apply(b->tt, b->m, b->cx);
	/* llama.cpp's default chain, as edgelmd's when a request sets none */
	struct engine_sampler_params sp;
	engine_sampler_params_default(&sp);
	sp.seed = 1;
	if (engine_sampler_new(&sp, (int)b->info.n_vocab, &b->smp, &b->err) != 0) {
		fprintf(stderr, "edgelm-bench: %s\n", b->err.msg);
		return EXIT_RUNTIME;
	}
	if (grammar_src(o)) {
		int rc = grammar_setup(o, b, &sp);
		if (rc)
			return rc;
	}
	(void)tools_mem_read(&mm);
	b->peak_before_bw = mm.hwm;

	/* the same variant the engine chose */
	const struct kern_ops *ko = kern_select(NULL, o->isa);
	uint64_t (*rd)(const void *, size_t) =
		ko && ko->read_stream ? ko->read_stream : kern_read_stream_generic;
	if (bw_open(&b->bwm, b->info.n_threads, (size_t)o->bw_mib << 20, rd,
		    ko ? ko->read_stream_chain : NULL, b->tt) != 0) {
		fprintf(stderr, "edgelm-bench: no memory for the %d MiB bandwidth buffer\n",
			o->bw_mib);
		return EXIT_RUNTIME;
	}
	b->bw_bytes = bw_resident(&b->bwm);
	return 0;
}

/* Warm-up, timed: the first step after load pays the page faults of every
 * weight unless they were prefaulted or locked. */
static int warm_up(struct bench *b)
{
	int rc = 0, n_vocab = (int)b->info.n_vocab;
	/* RUSAGE_SELF: the workers' faults count too */
	struct rusage r0, r1;
	int32_t tok = rand_token(n_vocab);
	getrusage(RUSAGE_SELF, &r0);
	double t0 = cm_now();
	if (engine_eval(b->cx, &tok, 1, 0, &b->err) != 0)
		rc = EXIT_RUNTIME;
	b->first_ms = (cm_now() - t0) * 1e3;
	getrusage(RUSAGE_SELF, &r1);
	b->first_faults = (r1.ru_minflt - r0.ru_minflt) + (r1.ru_majflt - r0.ru_majflt);
	tok = rand_token(n_vocab);
	t0 = cm_now();
	if (!rc && engine_eval(b->cx, &tok, 1, 1, &b->err) != 0)
		rc = EXIT_RUNTIME;
	b->second_ms = (cm_now() - t0) * 1e3;
	if (!rc && run_decode(b->cx, 0, 2, n_vocab, &b->err) < 0)
		rc = EXIT_RUNTIME;
	return rc;
}

/* One prompt as edgelmd serves a request once it is tokenized and
 * admitted: the KV cache cleared, the prompt into the sampler's history,
 * the prefill, the first token sampled from its logits. *ret_prefill is
 * the prefill alone (llama-bench's pp times just that); returns the time
 * to first token in seconds, < 0 on error. */
static double run_first_token(struct bench *b, int32_t *t, int n, double *ret_prefill)
{
	int n_vocab = (int)b->info.n_vocab;
	for (int i = 0; i < n; i++)
		t[i] = rand_token(n_vocab);
	engine_seq_truncate(b->cx, 0, 0);
	engine_sampler_reset(b->smp);
	double t0 = cm_now();
	for (int i = 0; i < n; i++)
		engine_sampler_accept(b->smp, t[i]);
	double t1 = cm_now();
	if (engine_eval(b->cx, t, n, 0, &b->err) != 0)
		return -1;
	double t2 = cm_now();
	const float *logits = engine_get_logits_last(b->cx);
	int32_t id = logits ? engine_sampler_sample(b->smp, logits) : -1;
	double t3 = cm_now();
	if (id < 0 || id >= n_vocab) {
		cm_err_set(&b->err, -EPROTO, "no first token after a prompt of %d", n);
		return -1;
	}
	*ret_prefill = t2 - t1;
	return t3 - t0;
}

static int prefill_runs(const struct bench_opts *o, struct bench *b)
{
	int n_max = 1;
	for (int i = 0; i < o->n_prompts; i++)
		n_max = CM_MAX(n_max, o->prompts[i]);
	int32_t *t = malloc(sizeof(int32_t) * (size_t)n_max);
	if (!t) {
		cm_err_set(&b->err, -ENOMEM, "no memory for a prompt of %d", n_max);
		return EXIT_RUNTIME;
	}
	for (int i = 0; i < o->n_prompts; i++)
		for (int r = 0; r < o->reps; r++) {
			double pre, ttft = run_first_token(b, t, o->prompts[i], &pre);
			if (ttft < 0) {
				free(t);
				return EXIT_RUNTIME;
			}
			b->pre[i] = CM_MAX(b->pre[i], o->prompts[i] / pre);
			b->ttft_ms[i] = r ? CM_MIN(b->ttft_ms[i], ttft * 1e3) : ttft * 1e3;
		}
	free(t);
	return 0;
}

/* paired[i]: the median over reps of (this rep's decode bandwidth) / (the
 * higher of the read samples taken just before and just after it): on a
 * box whose bandwidth drifts (a VM sharing its memory), the run's best
 * sample can come from a moment the decode never saw. The sample after
 * prefill is the first decode's `before`; each rep's `after` is the next
 * one's. */
static int decode_runs(const struct bench_opts *o, struct bench *b)
{
	int rc = 0;
	double before = bw_sample(&b->bwm, 1);
	double *ratios = calloc((size_t)o->reps, sizeof(double));
	if (!ratios) {
		cm_err_set(&b->err, -ENOMEM, "no memory for %d decode ratios", o->reps);
		return EXIT_RUNTIME;
	}
	for (int i = 0; i < o->n_ctxs && !rc; i++) {
		for (int r = 0; r < o->reps && !rc; r++) {
			double t = run_decode(b->cx, o->ctxs[i], o->n_gen, (int)b->info.n_vocab,
					      &b->err);
			double after = bw_sample(&b->bwm, 1);
			if (t < 0) {
				rc = EXIT_RUNTIME;
				break;
			}
			b->dec[i] = CM_MAX(b->dec[i], o->n_gen / t);
			ratios[r] = o->n_gen / t * (double)b->info.weight_bytes_token /
				    CM_MAX(before, after);
			before = after;
		}
		if (!rc)
			b->paired[i] = median(ratios, o->reps);
	}
	free(ratios);
	return rc;
}

/* n_gen steps from context 0, each token sampled by s and fed back: the
 * decode as a server runs it. A value the grammar completes (or an end
 * token) starts the grammar over, so every step is a constrained one.
 * Returns seconds, < 0 on error; *ret_sample: the seconds in the sampler. */
static double run_decode_sampled(struct bench *b, engine_sampler *s, int n_gen,
				 double *ret_sample, int *ret_completed)
{
	const engine_tokenizer *tok = engine_model_tokenizer(b->m);
	int32_t id = engine_tokenizer_bos(tok);
	if (id < 0)
		id = rand_token((int)b->info.n_vocab);
	engine_seq_truncate(b->cx, 0, 0);
	engine_sampler_reset(s);
	double ts = 0, t0 = cm_now();
	int completed = 0;
	for (int i = 0; i < n_gen; i++) {
		if (engine_eval(b->cx, &id, 1, i, &b->err) != 0)
			return -1;
		double t1 = cm_now();
		id = engine_sampler_sample(s, engine_get_logits_last(b->cx));
		engine_sampler_accept(s, id);
		if (engine_sampler_advance(s, id) != 0 || engine_sampler_grammar_done(s) ||
		    engine_tokenizer_is_eog(tok, id)) {
			engine_sampler_reset(s);
			completed++;
		}
		ts += cm_now() - t1;
	}
	*ret_sample = ts;
	*ret_completed = completed;
	return cm_now() - t0;
}

/* (e): the two samplers alternate within each rep, so drift hits both,
 * in ABBA order: whichever runs second in a pair ran faster here. */
static int grammar_runs(const struct bench_opts *o, struct bench *b)
{
	for (int r = 0; r < o->reps; r++)
		for (int j = 0; j < 2; j++) {
			int k = j ^ (r & 1);
			double ts;
			int done;
			double t = run_decode_sampled(b, b->gsmp[k], o->n_gen, &ts, &done);
			if (t < 0)
				return EXIT_RUNTIME;
			double ms = ts * 1e3 / o->n_gen;
			b->g_tok_s[k] = CM_MAX(b->g_tok_s[k], o->n_gen / t);
			b->g_sample_ms[k] = r ? CM_MIN(b->g_sample_ms[k], ms) : ms;
			if (k)
				b->g_completed = done;
		}
	return 0;
}

/* The timed runs, then what the kernel did with the tuning and the memory
 * figures (the bandwidth buffer freed first).
 *
 * The peak without the buffer: it stays resident, whole, from bw_open to
 * here (every sample reads all of it), so while it lives VmHWM is the rest's
 * peak plus its size; before it, VmHWM was read as it was allocated. The
 * samples between decode reps need it alive, hence the subtraction rather
 * than freeing it first. */
static int bench_run(const struct bench_opts *o, struct bench *b)
{
	(void)bw_sample(&b->bwm, CM_MAX(o->reps, 3));
	int rc = warm_up(b);
	if (!rc)
		rc = prefill_runs(o, b);
	if (!rc)
		rc = decode_runs(o, b);
	if (!rc && b->gram)
		rc = grammar_runs(o, b);
	struct tools_mem mm;
	(void)tools_mem_read(&mm);
	uint64_t bw_end = bw_resident(&b->bwm);
	bw_close(&b->bwm);
	if (rc) {
		fprintf(stderr, "edgelm-bench: %s\n", b->err.msg);
		return rc;
	}
	/* pages reclaimed from it would make the figure low by up to those */
	if (bw_end + (b->bw_bytes >> 6) < b->bw_bytes)
		fprintf(stderr,
			"edgelm-bench: warning: the bandwidth buffer lost %.1f of its %.1f MiB "
			"while resident: the peak RSS may be low by up to that\n",
			(double)(b->bw_bytes - bw_end) / (1 << 20), (double)b->bw_bytes / (1 << 20));
	b->process_peak = mm.hwm;
	if (mm.hwm && b->peak_before_bw)
		b->peak = CM_MAX(b->peak_before_bw, mm.hwm - CM_MIN(mm.hwm, b->bw_bytes));
	tools_tuning_check(b->tt, b->m);
	return 0;
}

/* ---- the report -------------------------------------------------------------- */

static double mib(uint64_t bytes)
{
	return (double)bytes / (1 << 20);
}

/* bytes as MiB, or null when /proc/self/status was unreadable */
static void json_mib(const char *key, uint64_t bytes)
{
	if (bytes)
		printf(",\"%s\":%.1f", key, mib(bytes));
	else
		printf(",\"%s\":null", key);
}

static void report_json(const struct bench_opts *o, const struct bench *b)
{
	const struct engine_model_info *info = &b->info;
	double bw = b->bwm.best, wb = (double)info->weight_bytes_token;
	printf("{\"model\":");
	tools_json_str(stdout, info->name);
	printf(",\"arch\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
	       "\"kv_type\":\"%s\",\"batch\":%d,"
	       "\"repacked_tensors\":%u,\"repacked_segmented\":%u,"
	       "\"repacked_bytes\":%llu,\"weights_anon\":%s,\"weights_cached\":%s,"
	       "\"weight_bytes_per_token\":%.0f,\"read_bandwidth_gbs\":%.3f,"
	       "\"read_bandwidth_lowest_gbs\":%.3f,\"read_bandwidth_samples\":%d,\"prefill\":[",
	       info->arch, info->isa, info->n_threads,
	       engine_kv_type_name(engine_ctx_kv_type(b->cx)), o->n_batch, info->n_x16_tensors,
	       info->n_x16_segmented, (unsigned long long)info->x16_bytes,
	       info->weights_anon ? "true" : "false", info->weights_cached ? "true" : "false", wb,
	       bw / 1e9, b->bwm.lowest / 1e9, b->bwm.samples);
	for (int i = 0; i < o->n_prompts; i++)
		printf("%s{\"tokens\":%d,\"tok_s\":%.2f,\"ttft_ms\":%.2f}", i ? "," : "",
		       o->prompts[i], b->pre[i], b->ttft_ms[i]);
	printf("],\"decode\":[");
	for (int i = 0; i < o->n_ctxs; i++)
		printf("%s{\"context\":%d,\"tok_s\":%.2f,\"bandwidth_gbs\":%.3f,"
		       "\"bandwidth_ratio\":%.4f,\"bandwidth_ratio_paired\":%.4f}",
		       i ? "," : "", o->ctxs[i], b->dec[i], b->dec[i] * wb / 1e9,
		       b->dec[i] * wb / bw, b->paired[i]);
	printf("],\"load_ms\":%.1f", b->t_load * 1e3);
	json_mib("load_peak_rss_mib", b->load_peak);
	json_mib("load_rss_mib", b->load_rss);
	printf(",");
	tools_quant_json(stdout, info);
	printf(",\"hwm_reset\":%s", b->hwm_reset ? "true" : "false");
	if (!b->hwm_reset) {
		printf(",\"hwm_reset_error\":");
		tools_json_str(stdout, b->hwm_err.msg);
	}
	printf(",\"first_step_ms\":%.2f,\"first_step_faults\":%ld,\"second_step_ms\":%.2f",
	       b->first_ms, b->first_faults, b->second_ms);
	json_mib("peak_rss_mib", b->peak);
	printf(",\"bw_buffer_mib\":%.1f", mib(b->bw_bytes));
	json_mib("process_peak_rss_mib", b->process_peak);
	if (b->gram) {
		printf(",\"grammar\":{\"file\":");
		tools_json_str(stdout, grammar_src(o));
		printf(",\"json_schema\":%s", o->schema_file ? "true" : "false");
		printf(",\"compile_ms\":%.2f,\"tokens\":%d,\"completed\":%d,"
		       "\"plain_tok_s\":%.2f,\"plain_sample_ms\":%.3f,"
		       "\"tok_s\":%.2f,\"sample_ms\":%.3f,\"overhead\":%.4f}",
		       b->g_compile_ms, o->n_gen, b->g_completed, b->g_tok_s[0], b->g_sample_ms[0],
		       b->g_tok_s[1], b->g_sample_ms[1], b->g_tok_s[0] / b->g_tok_s[1] - 1);
	}
	printf(",");
	tools_tuning_json(b->tt, stdout);
	printf("}\n");
}

static void report_text(const struct bench_opts *o, const struct bench *b)
{
	const struct engine_model_info *info = &b->info;
	double bw = b->bwm.best, wb = (double)info->weight_bytes_token;
	enum engine_kv_type kv = engine_ctx_kv_type(b->cx);
	printf("model        %s (%s), %.1f MiB of weights read per token\n",
	       info->name[0] ? info->name : o->model, info->arch, wb / (1 << 20));
	printf("kernels      %s, %d threads", info->isa, info->n_threads);
	if (info->n_x16_tensors)
		printf(", %u tensors repacked x16 (%.1f MiB, %u in K-segments)",
		       info->n_x16_tensors, (double)info->x16_bytes / (1 << 20),
		       info->n_x16_segmented);
	if (info->weights_anon)
		printf(", weights in anonymous memory (%.1f MiB in huge pages)",
		       (double)tools_tuning_huge_bytes(b->tt) / (1 << 20));
	printf("\n");
	if (info->repack_cache_note[0])
		printf("repack cache %s\n", info->repack_cache_note);
	printf("kv cache     %s, %.1f KiB per token; prefill in chunks of %d\n",
	       engine_kv_type_name(kv),
	       (double)engine_model_kv_bytes_per_token(b->m, kv) / 1024, o->n_batch);
	tools_tuning_print(b->tt, stdout);
	printf("read bw      %.2f GB/s (streaming read, %d threads%s; the best of %d samples "
	       "across the run, the lowest %.2f)\n",
	       bw / 1e9, info->n_threads, b->bwm.read2 ? ", the better of 2 loops" : "",
	       b->bwm.samples, b->bwm.lowest / 1e9);
	printf("load         %.0f ms, peak RSS %.1f MiB during it, %.1f after", b->t_load * 1e3,
	       mib(b->load_peak), mib(b->load_rss));
	if (b->hwm_reset)
		printf("\n");
	else
		printf(" (VmHWM not reset: %s; the peak since the process started)\n",
		       b->hwm_err.msg);
	if (info->quant_requested[0])
		printf("quantize     %s on load: %u tensors in %.2f s, %.1f MiB -> %.1f MiB%s%s\n",
		       info->quant_requested, info->n_quantized, info->quant_seconds,
		       mib(info->quant_bytes_in), mib(info->quant_bytes_out),
		       info->quant_note[0] ? "; " : "", info->quant_note);
	printf("first step   %.1f ms, %ld page faults (one token, the first step after the load; "
	       "the second: %.1f ms)\n",
	       b->first_ms, b->first_faults, b->second_ms);
	for (int i = 0; i < o->n_prompts; i++)
		printf("prefill %-4d %.1f tok/s, time to first token %.1f ms\n", o->prompts[i],
		       b->pre[i], b->ttft_ms[i]);
	for (int i = 0; i < o->n_ctxs; i++)
		printf("decode @%-4d %.2f tok/s  = %.2f GB/s of weights, %.0f%% of read bw "
		       "(paired: %.0f%%)\n",
		       o->ctxs[i], b->dec[i], b->dec[i] * wb / 1e9, 100 * b->dec[i] * wb / bw,
		       100 * b->paired[i]);
	if (b->gram) {
		printf("grammar      %s%s compiled in %.1f ms\n", grammar_src(o),
		       o->schema_file ? " (JSON Schema)" : "", b->g_compile_ms);
		printf("decode+samp  %.2f tok/s, sampling %.3f ms/token (the sampler alone)\n",
		       b->g_tok_s[0], b->g_sample_ms[0]);
		printf("decode+gram  %.2f tok/s, sampling %.3f ms/token (with the grammar; %d values "
		       "completed in %d tokens): %+.1f%% time per token\n",
		       b->g_tok_s[1], b->g_sample_ms[1], b->g_completed, o->n_gen,
		       100 * (b->g_tok_s[0] / b->g_tok_s[1] - 1));
	}
	if (b->peak)
		printf("peak RSS     %.1f MiB: model, KV cache and scratch over the load and the runs "
		       "(not the %.1f MiB bandwidth buffer; with it the process peaked at %.1f)\n",
		       mib(b->peak), mib(b->bw_bytes), mib(b->process_peak));
	else
		printf("peak RSS     unknown (/proc/self/status unreadable)\n");
}

int main(int argc, char **argv)
{
	/* --daemon URL: load a running edgelmd instead (tools/lib/bench_daemon.c) */
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--daemon") == 0 || strncmp(argv[i], "--daemon=", 9) == 0)
			return tools_bench_daemon_main(argc, argv);

	struct bench_opts o;
	int rc = bench_opts_parse(argc, argv, &o);
	if (rc >= 0)
		return rc;
	if (o.tokenize)
		return bench_tokenize(&o, argc, argv);
	if (!o.model || o.bad || optind < argc || o.n_prompts < 0 || o.n_ctxs < 0) {
		usage(stderr);
		return EXIT_USAGE;
	}
	int repack;
	if (engine_repack_parse(o.repack, &repack) != 0) {
		fprintf(stderr, "edgelm-bench: --repack: expected auto, on or off, not '%s'\n",
			o.repack);
		return EXIT_USAGE;
	}

	struct bench b = {0};
	rc = bench_setup(&o, repack, &b);
	if (!rc)
		rc = bench_run(&o, &b);
	if (!rc) {
		if (o.json)
			report_json(&o, &b);
		else
			report_text(&o, &b);
	}
	bench_free(&b);
	return rc;
}
