/* tools/lib/mkmodel.c: synthetic models of real shapes.
 *
 * Speed depends on shape, not on values, so benchmarks and load tests run on
 * models with the exact tensor shapes and types of real ones (TinyLlama
 * 1.1B, Llama 3.2 1B, Qwen2.5 0.5B, Qwen3 0.6B, Phi-3-mini) filled with
 * random weights; small test shapes cover phi3 and the gemmas too.
 * The scale keeps activations sane through many layers: matrices draw from
 * N(0, 1/n_in), norms are 1, biases small. The vocabulary (tokenizer.*
 * metadata) is copied from a vocab GGUF, or synthesized (a byte-fallback SPM
 * vocab) for the small test shapes, so no external data is needed for tests.
 *
 * Values are a pure function of (seed, tensor name, row), so a model is
 * reproducible whatever the thread count. */
#include "tools/lib/tools.h"

#include "engine/gguf.h"
#include "engine/quant.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct shape {
	const char *name;
	const char *arch;
	const char *vocab; /* default vocab file under $EDGELM_TESTDATA/vocab, NULL: synthetic */
	uint32_t n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim, n_ctx;
	float eps, rope_base;
	bool tied, qkv_bias, qk_norm, llama3_rope;
	uint32_t n_swa;                    /* attention.sliding_window; 0: not written */
	float attn_softcap, final_softcap; /* gemma2's soft-capping; 0: not written */
};

/* The tensor layout follows the architecture: phi3 fuses attn_qkv and
 * ffn_up (gate and up), gemma2/3 add post-attention and post-FFN norms. */
static const struct shape shapes[] = {
	{.name = "tinyllama-1.1b", .arch = "llama", .vocab = "ggml-vocab-llama-spm.gguf",
	 .n_embd = 2048, .n_layer = 22, .n_head = 32, .n_head_kv = 4, .n_ff = 5632, .head_dim = 64,
	 .n_ctx = 2048, .eps = 1e-5f, .rope_base = 10000.0f},
	{.name = "llama-3.2-1b", .arch = "llama", .vocab = "ggml-vocab-llama-bpe.gguf",
	 .n_embd = 2048, .n_layer = 16, .n_head = 32, .n_head_kv = 8, .n_ff = 8192, .head_dim = 64,
	 .n_ctx = 131072, .eps = 1e-5f, .rope_base = 500000.0f, .tied = true, .llama3_rope = true},
	{.name = "qwen2.5-0.5b", .arch = "qwen2", .vocab = "ggml-vocab-qwen2.gguf", .n_embd = 896,
	 .n_layer = 24, .n_head = 14, .n_head_kv = 2, .n_ff = 4864, .head_dim = 64, .n_ctx = 32768,
	 .eps = 1e-6f, .rope_base = 1000000.0f, .tied = true, .qkv_bias = true},
	{.name = "qwen3-0.6b", .arch = "qwen3", .vocab = "ggml-vocab-qwen2.gguf", .n_embd = 1024,
	 .n_layer = 28, .n_head = 16, .n_head_kv = 8, .n_ff = 3072, .head_dim = 128, .n_ctx = 40960,
	 .eps = 1e-6f, .rope_base = 1000000.0f, .tied = true, .qk_norm = true},
	/* Phi-3-mini-4k: the hyperparameters its vocab file carries, and the
	 * 2047-token window llama.cpp gives files without the key */
	{.name = "phi-3-mini", .arch = "phi3", .vocab = "ggml-vocab-phi-3.gguf", .n_embd = 3072,
	 .n_layer = 32, .n_head = 32, .n_head_kv = 32, .n_ff = 8192, .head_dim = 96, .n_ctx = 4096,
	 .eps = 1e-5f, .rope_base = 10000.0f, .n_swa = 2047},
	/* small shapes for tests: fast, every row a multiple of 256 (small) or
	 * not a multiple of 32 anywhere in the FFN (tiny); windows shorter than
	 * the tests' prompts */
	{.name = "tiny", .arch = "llama", .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2,
	 .n_ff = 172, .head_dim = 16, .n_ctx = 256, .eps = 1e-5f, .rope_base = 10000.0f},
	{.name = "small", .arch = "llama", .n_embd = 256, .n_layer = 4, .n_head = 8, .n_head_kv = 4,
	 .n_ff = 768, .head_dim = 32, .n_ctx = 512, .eps = 1e-5f, .rope_base = 10000.0f,
	 .tied = true},
	{.name = "small-qwen2", .arch = "qwen2", .n_embd = 256, .n_layer = 2, .n_head = 8,
	 .n_head_kv = 2, .n_ff = 768, .head_dim = 32, .n_ctx = 512, .eps = 1e-6f,
	 .rope_base = 1000000.0f, .tied = true, .qkv_bias = true},
	{.name = "small-qwen3", .arch = "qwen3", .n_embd = 256, .n_layer = 2, .n_head = 4,
	 .n_head_kv = 2, .n_ff = 768, .head_dim = 128, .n_ctx = 512, .eps = 1e-6f,
	 .rope_base = 1000000.0f, .tied = true, .qk_norm = true},
	{.name = "small-phi3", .arch = "phi3", .n_embd = 256, .n_layer = 2, .n_head = 8,
	 .n_head_kv = 4, .n_ff = 768, .head_dim = 32, .n_ctx = 512, .eps = 1e-5f,
	 .rope_base = 10000.0f, .n_swa = 5},
	{.name = "small-gemma", .arch = "gemma", .n_embd = 256, .n_layer = 2, .n_head = 4,
	 .n_head_kv = 1, .n_ff = 768, .head_dim = 128, .n_ctx = 512, .eps = 1e-6f,
	 .rope_base = 10000.0f, .tied = true},
	{.name = "small-gemma2", .arch = "gemma2", .n_embd = 256, .n_layer = 2, .n_head = 4,
	 .n_head_kv = 2, .n_ff = 768, .head_dim = 128, .n_ctx = 512, .eps = 1e-6f,
	 .rope_base = 10000.0f, .tied = true, .n_swa = 4, .attn_softcap = 50.0f,
	 .final_softcap = 30.0f},
	/* six layers: five sliding, one global */
	{.name = "small-gemma3", .arch = "gemma3", .n_embd = 256, .n_layer = 6, .n_head = 4,
	 .n_head_kv = 1, .n_ff = 768, .head_dim = 128, .n_ctx = 512, .eps = 1e-6f,
	 .rope_base = 1000000.0f, .tied = true, .qk_norm = true, .n_swa = 4},
};

void tools_mkmodel_usage(FILE *o)
{
	fprintf(o, "usage: edgelm-gguf mkmodel --shape NAME -o OUT.gguf [--type T] [--vocab FILE]\n"
		   "                          [--seed N] [--layers N] [--ctx N] [--threads N]\n"
		   "  --shape   one of:");
	for (size_t i = 0; i < CM_ARRAY_LEN(shapes); i++)
		fprintf(o, " %s", shapes[i].name);
	fprintf(o, "\n  --type    type or llama-quantize mix of the 2-D weights (default Q4_0):");
	const struct quant_recipe *r;
	for (size_t i = 0; (r = quant_recipe_at(i)); i++)
		fprintf(o, "%s%s", i % 9 == 8 ? "\n              " : " ", r->name);
	fprintf(o, "\n            (edgelm-quantize's per-tensor rules and row-size fallbacks)\n"
		   "  --vocab   vocab GGUF to copy tokenizer.* from ('synthetic' for a byte-level\n"
		   "            SPM vocab; default: the shape's real vocab from\n"
		   "            $EDGELM_TESTDATA/vocab, synthetic for the test shapes)\n"
		   "  --layers  override the layer count (smaller files for tests)\n");
}

/* splitmix64: the per-row stream seed; xoshiro-like quality is not needed. */
static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

/* Approximately normal: sum of 4 uniforms, scaled to unit variance. */
static void fill_normal(float *x, int64_t n, uint64_t seed, float std)
{
	uint64_t s = seed;
	const float k = std * 1.7320508f / 4294967296.0f; /* sqrt(3) / 2^32 */
	for (int64_t i = 0; i < n; i++) {
		s = mix64(s);
		uint32_t a = (uint32_t)s, b = (uint32_t)(s >> 32);
		s = mix64(s);
		uint32_t c = (uint32_t)s, d = (uint32_t)(s >> 32);
		float u = (float)a + (float)b + (float)c + (float)d - 2.0f * 4294967296.0f;
		x[i] = u * k;
	}
}

struct gen_tensor {
	char name[GGUF_MAX_NAME];
	uint32_t type;
	uint32_t n_dims;
	int64_t ne[2];
	float std;   /* 0: constant `value` */
	float value;
	const float *values; /* explicit f32 values (rope_freqs) */
	uint8_t *data;
	size_t row_bytes;
};

struct gen_job {
	struct gen_tensor *t;
	int n;
	uint64_t seed;
	int next;
	pthread_mutex_t mu;
	int failed;
};

static void gen_one(struct gen_tensor *t, uint64_t seed, float *row)
{
	uint64_t ts = seed ^ hash_str(t->name);
	for (int64_t r = 0; r < t->ne[1]; r++) {
		if (t->values)
			memcpy(row, t->values, (size_t)t->ne[0] * sizeof(float));
		else if (t->std > 0)
			fill_normal(row, t->ne[0], mix64(ts + (uint64_t)r), t->std);
		else
			for (int64_t i = 0; i < t->ne[0]; i++)
				row[i] = t->value;
		quant_quantize_row(t->type, row, t->data + (size_t)r * t->row_bytes, t->ne[0]);
	}
}

static void *gen_worker(void *arg)
{
	struct gen_job *j = arg;
	float *row = NULL;
	size_t cap = 0;
	for (;;) {
		pthread_mutex_lock(&j->mu);
		int i = j->next++;
		pthread_mutex_unlock(&j->mu);
		if (i >= j->n)
			break;
		struct gen_tensor *t = &j->t[i];
		if ((size_t)t->ne[0] > cap) {
			free(row);
			cap = (size_t)t->ne[0];
			row = malloc(cap * sizeof(float));
			if (!row) {
				j->failed = 1;
				break;
			}
		}
		gen_one(t, j->seed, row);
	}
	free(row);
	return NULL;
}

static bool skip_non_tokenizer(const char *key, void *ctx)
{
	(void)ctx;
	return strncmp(key, "tokenizer.", 10) != 0;
}

/* A byte-fallback SPM vocab: <unk> <s> </s>, 256 byte tokens, then common
 * English pieces so that text tokenizes into a plausible number of tokens. */
#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */
static int synth_vocab(struct gguf_writer *w, uint32_t *ret_n)
{
	static const char *pieces[] = {
		SP "", "e", "t", "a", "o", "n", "i", "s", "h", "r", "d", "l", "u", SP "t",
		SP "a", "he", "in", SP "the", SP "s", "er", "on", "an", SP "w",
		"ed", SP "b", "nd", SP "and", "ing", SP "to", SP "was",
		SP "Once", SP "upon", SP "time", ".", ",", SP "He",
	};
	uint32_t n = 3 + 256 + CM_ARRAY_LEN(pieces);
	const char **toks = calloc(n, sizeof(*toks));
	char(*bytes)[8] = calloc(256, 8);
	float *scores = calloc(n, sizeof(float));
	int32_t *types = calloc(n, sizeof(int32_t));
	int r = -ENOMEM;
	if (!toks || !bytes || !scores || !types)
		goto out;
	toks[0] = "<unk>", types[0] = 2;
	toks[1] = "<s>", types[1] = 3;
	toks[2] = "</s>", types[2] = 3;
	for (int b = 0; b < 256; b++) {
		snprintf(bytes[b], 8, "<0x%02X>", b);
		toks[3 + b] = bytes[b];
		types[3 + b] = 6;
	}
	for (size_t i = 0; i < CM_ARRAY_LEN(pieces); i++) {
		toks[259 + i] = pieces[i];
		types[259 + i] = 1;
		scores[259 + i] = -(float)i;
	}
	if ((r = gguf_writer_set_str(w, "tokenizer.ggml.model", "llama")) ||
	    (r = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, n)) ||
	    (r = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, n)) ||
	    (r = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, n)) ||
	    (r = gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1)) ||
	    (r = gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2)) ||
	    (r = gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0)))
		goto out;
	*ret_n = n;
out:
	free(toks);
	free(bytes);
	free(scores);
	free(types);
	return r;
}

/* Llama 3.x rope frequency divisors (gguf-formats §4.3), factor 32 as 3.2. */
static void llama3_freqs(float *f, uint32_t n_rot, float base)
{
	const double factor = 32, low = 1, high = 4, old = 8192;
	for (uint32_t i = 0; i < n_rot / 2; i++) {
		double freq = pow(base, -2.0 * i / n_rot);
		double wavelen = 2 * M_PI / freq;
		if (wavelen < old / high)
			f[i] = 1;
		else if (wavelen > old / low)
			f[i] = (float)factor;
		else {
			double smooth = (old / wavelen - low) / (high - low);
			f[i] = (float)(1.0 / ((1 - smooth) / factor + smooth));
		}
	}
}

/* ---- options ----------------------------------------------------------------- */

struct mkmodel_opts {
	const struct shape *sh;
	const struct quant_recipe *recipe;
	const char *out;
	const char *vocab; /* NULL: synthetic; may point to vocab_path */
	long seed, threads;
	uint32_t n_layer, n_ctx;
	char vocab_path[4096];
};

/* The command line into o: -1 to go on, else the exit code. */
static int mkmodel_opts_parse(int argc, char **argv, struct mkmodel_opts *o)
{
	static const struct option opts[] = {
		{"shape", required_argument, NULL, 's'}, {"type", required_argument, NULL, 'T'},
		{"vocab", required_argument, NULL, 'v'}, {"seed", required_argument, NULL, 'S'},
		{"layers", required_argument, NULL, 'l'}, {"ctx", required_argument, NULL, 'c'},
		{"threads", required_argument, NULL, 't'}, {"output", required_argument, NULL, 'o'},
		{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
	};
	const char *shape_name = NULL, *type_name = "Q4_0";
	static const char G[] = "edgelm-gguf";
	long layers = 0, ctx = 0;
	bool bad = false;
	int c;
	*o = (struct mkmodel_opts){.seed = 1};
	optind = 1;
	while ((c = getopt_long(argc, argv, "s:T:v:S:l:c:t:o:h", opts, NULL)) != -1) {
		switch (c) {
		case 's': shape_name = optarg; break;
		case 'T': type_name = optarg; break;
		case 'v': o->vocab = optarg; break;
		case 'S':
			bad |= tools_opt_long(G, "--seed", optarg, 0, LONG_MAX, &o->seed) != 0;
			break;
		case 'l': bad |= tools_opt_long(G, "--layers", optarg, 0, 512, &layers) != 0; break;
		case 'c': bad |= tools_opt_long(G, "--ctx", optarg, 0, INT32_MAX, &ctx) != 0; break;
		case 't':
			bad |= tools_opt_long(G, "--threads", optarg, 0, 4096, &o->threads) != 0;
			break;
		case 'o': o->out = optarg; break;
		case 'h': tools_mkmodel_usage(stdout); return 0;
		default: tools_mkmodel_usage(stderr); return 1;
		}
	}
	for (size_t i = 0; shape_name && i < CM_ARRAY_LEN(shapes); i++)
		if (strcasecmp(shapes[i].name, shape_name) == 0)
			o->sh = &shapes[i];
	o->recipe = quant_recipe_find(type_name);
	if (!o->sh || !o->out || !o->recipe || bad || optind < argc) {
		if (shape_name && !o->sh)
			fprintf(stderr, "edgelm-gguf: unknown shape '%s'\n", shape_name);
		if (!o->recipe)
			fprintf(stderr, "edgelm-gguf: unsupported type '%s'\n", type_name);
		tools_mkmodel_usage(stderr);
		return 1;
	}
	o->n_layer = layers ? (uint32_t)layers : o->sh->n_layer;
	o->n_ctx = ctx ? (uint32_t)ctx : o->sh->n_ctx;
	if (!o->vocab && o->sh->vocab) {
		const char *root = getenv("EDGELM_TESTDATA");
		snprintf(o->vocab_path, sizeof(o->vocab_path), "%s/vocab/%s",
			 root && *root ? root : "../shared", o->sh->vocab);
		o->vocab = o->vocab_path;
	}
	if (o->vocab && strcmp(o->vocab, "synthetic") == 0)
		o->vocab = NULL;
	return -1;
}

/* ---- the model --------------------------------------------------------------- */

struct mkmodel {
	struct gguf_writer *w;
	struct gguf_file *vf; /* the vocab file, open until the model is written */
	struct gen_tensor *ts;
	int nt;
	float *rope_f;
	uint32_t n_vocab;
	uint64_t total; /* bytes of tensor data */
};

static void mkmodel_free(struct mkmodel *m)
{
	for (int i = 0; m->ts && i < m->nt; i++)
		free(m->ts[i].data);
	free(m->ts);
	free(m->rope_f);
	gguf_close(m->vf);
	gguf_writer_free(m->w);
}

/* general.* and the architecture's hyperparameters. */
static void write_header(struct gguf_writer *w, const struct mkmodel_opts *o)
{
	const struct shape *sh = o->sh;
	char key[128], gname[128];
	snprintf(gname, sizeof(gname), "synthetic %s", sh->name);
#define K(s) (snprintf(key, sizeof(key), "%s." s, sh->arch), key)
	gguf_writer_set_str(w, "general.architecture", sh->arch);
	gguf_writer_set_str(w, "general.name", gname);
	gguf_writer_set_u32(w, "general.file_type", o->recipe->file_type);
	gguf_writer_set_u32(w, K("context_length"), o->n_ctx);
	gguf_writer_set_u32(w, K("embedding_length"), sh->n_embd);
	gguf_writer_set_u32(w, K("block_count"), o->n_layer);
	gguf_writer_set_u32(w, K("feed_forward_length"), sh->n_ff);
	gguf_writer_set_u32(w, K("attention.head_count"), sh->n_head);
	gguf_writer_set_u32(w, K("attention.head_count_kv"), sh->n_head_kv);
	gguf_writer_set_f32(w, K("attention.layer_norm_rms_epsilon"), sh->eps);
	gguf_writer_set_f32(w, K("rope.freq_base"), sh->rope_base);
	if (sh->head_dim != sh->n_embd / sh->n_head) {
		gguf_writer_set_u32(w, K("attention.key_length"), sh->head_dim);
		gguf_writer_set_u32(w, K("attention.value_length"), sh->head_dim);
	}
	gguf_writer_set_u32(w, K("rope.dimension_count"), sh->head_dim);
	if (sh->n_swa)
		gguf_writer_set_u32(w, K("attention.sliding_window"), sh->n_swa);
	if (sh->attn_softcap > 0) {
		gguf_writer_set_f32(w, K("attn_logit_softcapping"), sh->attn_softcap);
		gguf_writer_set_f32(w, K("final_logit_softcapping"), sh->final_softcap);
	}
#undef K
}

/* tokenizer.*: copied from the vocab file, else synthesized. */
static int write_vocab(const struct mkmodel_opts *o, struct mkmodel *m, struct cm_err *err)
{
	if (!o->vocab) {
		if (synth_vocab(m->w, &m->n_vocab) != 0)
			return cm_err_set(err, -ENOMEM, "cannot build the synthetic vocabulary");
		return 0;
	}
	if (gguf_open(o->vocab, &m->vf, err) != 0)
		return -1;
	if (gguf_writer_copy_kv(m->w, m->vf, skip_non_tokenizer, NULL) != 0)
		return cm_err_set(err, -ENOMEM, "cannot copy the vocabulary");
	const struct gguf_kv *kv = gguf_find_kv(m->vf, "tokenizer.ggml.tokens");
	if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING ||
	    kv->arr_n == 0 || kv->arr_n > (1u << 22))
		return cm_err_set(err, -EPROTO, "%s: no usable tokenizer.ggml.tokens", o->vocab);
	m->n_vocab = (uint32_t)kv->arr_n;
	return 0;
}

/* A matrix of nout rows of nin, of the type the recipe gives it. */
static struct gen_tensor *add_mat(const struct mkmodel_opts *o, struct mkmodel *m,
				  const char *name, uint32_t nin, uint32_t nout)
{
	const struct shape *sh = o->sh;
	struct gen_tensor *t = &m->ts[m->nt++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->n_dims = 2, t->ne[0] = nin, t->ne[1] = nout;
	struct quant_tensor tt = {t->name, nin, (int)o->n_layer, (int)(sh->n_head / sh->n_head_kv),
				  !strcmp(t->name, "output.weight") ||
					  (sh->tied && !strcmp(t->name, "token_embd.weight"))};
	t->type = quant_recipe_type(o->recipe, &tt, NULL, 0);
	t->std = 1.0f / sqrtf((float)nin);
	return t;
}

/* An f32 vector: N(0, sd), or `val` everywhere when sd is 0. */
static struct gen_tensor *add_vec(struct mkmodel *m, const char *name, uint32_t n, float sd,
				  float val)
{
	struct gen_tensor *t = &m->ts[m->nt++];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->n_dims = 1, t->ne[0] = n, t->ne[1] = 1;
	t->type = ENGINE_DTYPE_F32, t->std = sd, t->value = val;
	return t;
}

/* The tensors of layer l. */
static void list_layer(const struct mkmodel_opts *o, struct mkmodel *m, uint32_t l)
{
	const struct shape *sh = o->sh;
	uint32_t E = sh->n_embd, QD = sh->head_dim * sh->n_head, KD = sh->head_dim * sh->n_head_kv;
	bool phi3 = strcmp(sh->arch, "phi3") == 0, gemma = strncmp(sh->arch, "gemma", 5) == 0;
	bool post_norms = gemma && strcmp(sh->arch, "gemma") != 0;
	char nm[GGUF_MAX_NAME];
#define N(s) (snprintf(nm, sizeof(nm), "blk.%u." s, l), nm)
	add_vec(m, N("attn_norm.weight"), E, 0, 1.0f);
	if (phi3) {
		add_mat(o, m, N("attn_qkv.weight"), E, QD + 2 * KD);
	} else {
		add_mat(o, m, N("attn_q.weight"), E, QD);
		add_mat(o, m, N("attn_k.weight"), E, KD);
		add_mat(o, m, N("attn_v.weight"), E, KD);
	}
	if (sh->qkv_bias) {
		add_vec(m, N("attn_q.bias"), QD, 0.02f, 0);
		add_vec(m, N("attn_k.bias"), KD, 0.02f, 0);
		add_vec(m, N("attn_v.bias"), KD, 0.02f, 0);
	}
	if (sh->qk_norm) {
		add_vec(m, N("attn_q_norm.weight"), sh->head_dim, 0, 1.0f);
		add_vec(m, N("attn_k_norm.weight"), sh->head_dim, 0, 1.0f);
	}
	add_mat(o, m, N("attn_output.weight"), QD, E);
	if (post_norms)
		add_vec(m, N("post_attention_norm.weight"), E, 0, 1.0f);
	add_vec(m, N("ffn_norm.weight"), E, 0, 1.0f);
	if (phi3) {
		add_mat(o, m, N("ffn_up.weight"), E, 2 * sh->n_ff); /* gate rows, then up */
	} else {
		add_mat(o, m, N("ffn_gate.weight"), E, sh->n_ff);
		add_mat(o, m, N("ffn_up.weight"), E, sh->n_ff);
	}
	add_mat(o, m, N("ffn_down.weight"), sh->n_ff, E);
	if (post_norms)
		add_vec(m, N("post_ffw_norm.weight"), E, 0, 1.0f);
#undef N
}

/* The tensor list, in llama.cpp's order. -ENOMEM */
static int list_tensors(const struct mkmodel_opts *o, struct mkmodel *m)
{
	const struct shape *sh = o->sh;
	size_t max_t = 4 + (size_t)o->n_layer * 16;
	m->ts = calloc(max_t, sizeof(*m->ts));
	if (!m->ts)
		return -ENOMEM;
	struct gen_tensor *emb = add_mat(o, m, "token_embd.weight", sh->n_embd, m->n_vocab);
	/* embeddings: unit scale, RMSNorm follows; gemma scales them by
	 * sqrt(n_embd) itself */
	if (strncmp(sh->arch, "gemma", 5) != 0)
		emb->std = 1.0f;
	add_vec(m, "output_norm.weight", sh->n_embd, 0, 1.0f);
	if (!sh->tied)
		add_mat(o, m, "output.weight", sh->n_embd, m->n_vocab);
	if (sh->llama3_rope) {
		m->rope_f = malloc(sizeof(float) * sh->head_dim / 2);
		if (!m->rope_f)
			return -ENOMEM;
		llama3_freqs(m->rope_f, sh->head_dim, sh->rope_base);
		add_vec(m, "rope_freqs.weight", sh->head_dim / 2, 0, 0)->values = m->rope_f;
	}
	for (uint32_t l = 0; l < o->n_layer; l++)
		list_layer(o, m, l);
	return 0;
}

/* Every tensor's values, on up to 16 threads. -ENOMEM */
static int fill_tensors(const struct mkmodel_opts *o, struct mkmodel *m)
{
	for (int i = 0; i < m->nt; i++) {
		struct gen_tensor *t = &m->ts[i];
		t->row_bytes = quant_dtype_row_size(t->type, t->ne[0]);
		t->data = malloc(t->row_bytes * (size_t)t->ne[1]);
		if (!t->data)
			return -ENOMEM;
	}
	struct gen_job job = {.t = m->ts, .n = m->nt, .seed = mix64((uint64_t)o->seed)};
	pthread_mutex_init(&job.mu, NULL);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int nth = o->threads > 0 ? (int)o->threads : (int)(ncpu > 0 ? CM_MIN(ncpu, 16) : 1);
	pthread_t th[16];
	int started = 0;
	for (int i = 1; i < nth && i < 16; i++)
		if (pthread_create(&th[started], NULL, gen_worker, &job) == 0)
			started++;
	gen_worker(&job);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&job.mu);
	return job.failed ? -ENOMEM : 0;
}

/* Metadata, vocabulary and tensors in memory. Returns the exit code. */
static int mkmodel_build(const struct mkmodel_opts *o, struct mkmodel *m, struct cm_err *err)
{
	quant_init();
	if (gguf_writer_new(&m->w, err) != 0)
		return 2;
	write_header(m->w, o);
	if (write_vocab(o, m, err) != 0)
		return 2;
	if (list_tensors(o, m) != 0 || fill_tensors(o, m) != 0) {
		cm_err_set(err, -ENOMEM, "out of memory");
		return 2;
	}
	return 0;
}

/* The tensors into the writer, then the file. Returns the exit code. */
static int mkmodel_write(const struct mkmodel_opts *o, struct mkmodel *m, struct cm_err *err)
{
	for (int i = 0; i < m->nt; i++) {
		const struct gen_tensor *t = &m->ts[i];
		if (gguf_writer_add_tensor(m->w, t->name, t->type, t->n_dims, t->ne, t->data,
					   err) != 0)
			return 2;
		m->total += t->row_bytes * (uint64_t)t->ne[1];
	}
	if (gguf_writer_write(m->w, o->out, err) != 0)
		return 3;
	return 0;
}

int tools_mkmodel_main(int argc, char **argv)
{
	struct mkmodel_opts o;
	int rc = mkmodel_opts_parse(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct mkmodel m = {0};
	struct cm_err err = {0};
	rc = mkmodel_build(&o, &m, &err);
	if (!rc)
		rc = mkmodel_write(&o, &m, &err);
	if (rc)
		fprintf(stderr, "edgelm-gguf: mkmodel: %s\n", err.msg);
	else
		fprintf(stderr,
			"edgelm-gguf: wrote %s: %s, %u layers, vocab %u, %s weights, %.1f MiB\n",
			o.out, o.sh->name, o.n_layer, m.n_vocab, o.recipe->name,
			(double)m.total / (1 << 20));
	mkmodel_free(&m);
	return rc;
}
