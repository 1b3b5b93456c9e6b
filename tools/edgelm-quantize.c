/* tools/edgelm-quantize.c: convert the matrices of a GGUF model to another
 * tensor type, or to one of llama-quantize's mixes.
 *
 *   edgelm-quantize [-t N] IN.gguf OUT.gguf TYPE
 *
 * TYPE is a recipe (engine/quantize_recipe.c, gguf-formats §3): Q4_K_M, Q4_K_S,
 * Q5_K_M, Q5_K_S, Q6_K, Q3_K_M, Q2_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
 * IQ4_XS, F16, BF16 or F32 (Q3_K, Q4_K, Q5_K mean their _M mix).
 * Follows llama-quantize's choices:
 * - only weight matrices are converted: names ending in "weight", at least
 *   two dimensions (ggml_n_dims >= 2, trailing 1s not counted), not norms
 *   ("_norm.weight"), not the MoE router or position/token-type embeddings.
 *   Everything else (1-D tensors, norms, biases) is copied unchanged;
 * - the output matrix (output.weight, or token_embd.weight when the
 *   embedding is tied) is Q6_K in every quantized recipe but Q8_0, and the
 *   K mixes give attn_v / ffn_down more bits in some layers;
 * - a matrix whose rows (ne[0]) do not divide the chosen type's block falls
 *   back (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K/IQ4_XS ->
 *   IQ4_NL, then F16), with one line per tensor:
 *   "edgelm-quantize: NAME: row N not a multiple of B, T1 -> T2".
 * Sources may be of any type the engine computes with; a tensor that is
 * converted is dequantized to f32 row by row first. A tensor already of the
 * target type is copied as is. All metadata is copied; general.file_type and
 * general.quantization_version are set.
 *
 * Rows are split over worker threads (-t, default one per usable CPU). The
 * converted tensors are held in memory until the file is written.
 * Exit codes: 0 ok, 1 usage, 2 bad input, 3 write (or memory) error. */
#include "common/common.h"
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXIT_USAGE 1
#define EXIT_INPUT 2
#define EXIT_WRITE 3

#define MAX_THREADS 256
/* Below this many elements a tensor is converted on the main thread. */
#define MIN_PARALLEL_ELEMS 8192

static void usage(FILE *o)
{
	fprintf(o, "usage: edgelm-quantize [-t N] IN.gguf OUT.gguf TYPE\n"
		   "\n"
		   "Convert the weight matrices of IN to TYPE and write OUT, with\n"
		   "llama-quantize's rules: 1-D tensors and norms are copied unchanged; the\n"
		   "output matrix becomes Q6_K (except for Q8_0 and float types); the K mixes\n"
		   "give some attn_v/ffn_down layers more bits; matrices whose rows do not\n"
		   "divide the block fall back to another type (one line each).\n"
		   "\n"
		   "TYPE:");
	const struct quant_recipe *r;
	for (size_t i = 0; (r = quant_recipe_at(i)); i++)
		fprintf(o, " %s", r->name);
	fprintf(o, "\n"
		   "\n"
		   "  -t, --threads N   worker threads (default: one per usable CPU)\n"
		   "  -h, --help\n"
		   "\n"
		   "Exit codes: 0 ok, 1 usage, 2 bad input, 3 write error.\n");
}

/* Source types we can read rows of (every computable type dequantizes). */
static bool can_read(uint32_t type)
{
	const struct dtype_info *ti = quant_dtype_get(type);
	return ti && ti->computable;
}

/* ---- row conversion ------------------------------------------------------------ */

struct work {
	const struct gguf_tensor *t;
	uint32_t out_type;
	uint8_t *out;
	int64_t r0, r1;
	int rc;
};

static void *convert_rows(void *arg)
{
	struct work *w = arg;
	float *tmp = cm_malloc((size_t)w->t->ne[0] * sizeof(float));
	if (!tmp) {
		w->rc = -ENOMEM;
		return NULL;
	}
	/* the engine's conversion, the one quantizing on load uses */
	w->rc = quant_convert_rows(w->t, w->out_type, w->out, w->r0, w->r1, tmp);
	cm_free(tmp);
	return NULL;
}

/* Convert tensor t into out (rows of out_type) with up to nthreads. */
static int convert_tensor(const struct gguf_tensor *t, uint32_t out_type, uint8_t *out,
			  int nthreads)
{
	int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
	int64_t elems = rows * t->ne[0];
	int nth = elems < MIN_PARALLEL_ELEMS ? 1 : nthreads;
	if (nth > rows)
		nth = (int)rows;
	if (nth < 1)
		nth = 1;

	struct work wk[MAX_THREADS];
	pthread_t th[MAX_THREADS];
	bool started[MAX_THREADS] = { false };
	for (int i = 0; i < nth; i++) {
		wk[i] = (struct work){ .t = t, .out_type = out_type, .out = out,
				       .r0 = rows * i / nth, .r1 = rows * (i + 1) / nth };
	}
	/* Workers 1..nth-1 on threads, worker 0 here; a thread that cannot be
	 * created has its share done here too. */
	for (int i = 1; i < nth; i++)
		started[i] = pthread_create(&th[i], NULL, convert_rows, &wk[i]) == 0;
	convert_rows(&wk[0]);
	for (int i = 1; i < nth; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		else
			convert_rows(&wk[i]);
	}
	for (int i = 0; i < nth; i++)
		if (wk[i].rc)
			return wk[i].rc;
	return 0;
}

static int default_threads(void)
{
	cpu_set_t set;
	int n = 0;
	if (sched_getaffinity(0, sizeof(set), &set) == 0)
		n = CPU_COUNT(&set);
	if (n < 1) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		n = c > 0 ? (int)CM_MIN(c, MAX_THREADS) : 1;
	}
	return CM_MIN(n, MAX_THREADS);
}

static double mib(uint64_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* ---- main ----------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	static const struct option long_opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int nthreads = 0, c;

	while ((c = getopt_long(argc, argv, "t:h", long_opts, NULL)) != -1) {
		switch (c) {
		case 't':
			if (tools_opt_int("edgelm-quantize", "--threads", optarg, 1, MAX_THREADS,
					  &nthreads) != 0)
				return EXIT_USAGE;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (argc - optind != 3) {
		usage(stderr);
		return EXIT_USAGE;
	}
	const char *in_path = argv[optind], *out_path = argv[optind + 1];
	const char *type_name = argv[optind + 2];
	const struct quant_recipe *recipe = quant_recipe_find(type_name);
	if (!recipe) {
		if (quant_recipe_needs_imatrix(type_name))
			fprintf(stderr, "edgelm-quantize: %s needs an importance matrix, which "
					"edgelm does not compute\n", type_name);
		else
			fprintf(stderr, "edgelm-quantize: unsupported type '%s' (see --help)\n",
				type_name);
		return EXIT_USAGE;
	}
	if (!nthreads)
		nthreads = default_threads();

	struct cm_err err = { 0 };
	struct gguf_file *f = NULL;
	struct gguf_writer *w = NULL;
	void **owned = NULL;
	int ret = EXIT_WRITE, rc;
	unsigned n_by_type[ENGINE_DTYPE_COUNT] = { 0 };
	uint64_t in_bytes = 0, out_bytes = 0;

	if ((rc = gguf_open(in_path, &f, &err))) {
		fprintf(stderr, "edgelm-quantize: %s\n", err.msg);
		return rc == -ENOMEM ? EXIT_WRITE : EXIT_INPUT;
	}
	owned = cm_calloc(f->n_tensors ? f->n_tensors : 1, sizeof(*owned));
	if (!owned || gguf_writer_new(&w, &err)) {
		fprintf(stderr, "edgelm-quantize: out of memory\n");
		goto out;
	}
	if ((rc = gguf_writer_copy_kv(w, f, NULL, NULL)) ||
	    (rc = gguf_writer_set_u32(w, "general.file_type", recipe->file_type)) ||
	    (rc = gguf_writer_set_u32(w, "general.quantization_version", 2))) {
		fprintf(stderr, "edgelm-quantize: copying metadata: %s\n", strerror(-rc));
		goto out;
	}

	struct quant_shape shape;
	quant_recipe_shape(f, &shape);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		const void *data = t->data;
		char note[128];
		uint32_t out_type = quant_recipe_tensor(recipe, &shape, t, note, sizeof(note));
		if (note[0])
			fprintf(stderr, "edgelm-quantize: %s: %s\n", t->name, note);
		if (out_type != t->type) {
			if (!can_read(t->type)) {
				fprintf(stderr, "edgelm-quantize: %s: cannot convert from %s\n",
					t->name, quant_dtype_name(t->type));
				ret = EXIT_INPUT;
				goto out;
			}
			size_t out_row = quant_dtype_row_size(out_type, t->ne[0]);
			uint64_t rows = (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]), nbytes;
			if (!out_row || cm_mul_overflow_u64(rows, out_row, &nbytes) ||
			    nbytes > SIZE_MAX) {
				fprintf(stderr, "edgelm-quantize: %s: size overflows\n", t->name);
				ret = EXIT_INPUT;
				goto out;
			}
			uint8_t *buf = cm_malloc((size_t)nbytes);
			if (!buf) {
				fprintf(stderr, "edgelm-quantize: %s: out of memory (%.1f MiB)\n",
					t->name, mib(nbytes));
				goto out;
			}
			owned[i] = buf;
			if ((rc = convert_tensor(t, out_type, buf, nthreads))) {
				fprintf(stderr, "edgelm-quantize: %s: conversion failed: %s\n",
					t->name, strerror(-rc));
				goto out;
			}
			data = buf;
		}
		if (gguf_writer_add_tensor(w, t->name, out_type, t->n_dims, t->ne, data, &err)) {
			fprintf(stderr, "edgelm-quantize: %s\n", err.msg);
			goto out;
		}
		n_by_type[out_type]++;
		in_bytes += t->nbytes;
		out_bytes += quant_dtype_row_size(out_type, t->ne[0]) *
			     (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
	}

	if (gguf_writer_write(w, out_path, &err)) {
		fprintf(stderr, "edgelm-quantize: %s\n", err.msg);
		goto out;
	}

	printf("edgelm-quantize: %s -> %s (%s): %" PRIu64 " tensors:", in_path, out_path,
	       recipe->name, f->n_tensors);
	const char *sep = " ";
	for (uint32_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		if (n_by_type[t]) {
			printf("%s%s %u", sep, quant_dtype_name(t), n_by_type[t]);
			sep = ", ";
		}
	}
	printf("\nedgelm-quantize: tensor data %.2f MiB -> %.2f MiB, file %.2f MiB -> %.2f MiB\n",
	       mib(in_bytes), mib(out_bytes), mib(file_size(in_path)), mib(file_size(out_path)));
	ret = 0;
out:
	if (owned)
		for (uint64_t i = 0; i < f->n_tensors; i++)
			cm_free(owned[i]);
	cm_free(owned);
	gguf_writer_free(w);
	gguf_close(f);
	return ret;
}
