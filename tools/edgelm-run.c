/* tools/edgelm-run.c: one-shot generation without a daemon.
 *
 *   edgelm-run -m MODEL -p PROMPT [-n N] [sampling options] [--json]
 *
 * Text streams to stdout as it is generated (never half a UTF-8 character).
 * --json prints one JSON object per generated token instead:
 *   {"id":383,"text":" there","top":[[383,18.6112],[322,15.7008],...]}
 * --tokenize prints the prompt's ids as a JSON array and exits (works on
 * vocab-only GGUFs). Timings go to stderr unless --quiet.
 *
 *   edgelm-run -m MODEL --chat FILE|- [--chat-template NAME] [--stop STR]...
 *
 * --chat reads a JSON array of {"role": "system"|"user"|"assistant",
 * "content": "..."} messages, renders them with the model's chat format
 * (or the one --chat-template names) plus the generation prompt, and
 * tokenizes the result with special tokens. Generation ends at the model's
 * end-of-turn tokens and at any --stop string; a stop string may span
 * several tokens and its text is never printed (text mode: output that
 * could still be the start of a stop string is held back until it is
 * not). In --json mode, the lines show every token as generated. 
 * --embed prints the prompt's embedding instead (the pooled, L2-normalised
 * final hidden state, --pooling mean|cls|last; default the model's, else
 * mean): the values on one line, or with --json one object
 * {"n_tokens":…, "pooling":…, "embedding":[…]}.
 * Exit codes: 0 ok, 1 usage, 2 bad model or input, 3 runtime failure. */
#include "engine/engine.h"
#include "ipc/json_schema.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXIT_USAGE 1
#define EXIT_INPUT 2
#define EXIT_RUNTIME 3
/* Prompt chunk (engine n_batch): docs/engine.md, "Prefill in chunks". */
#define DEFAULT_BATCH 256

static void usage(FILE *o)
{
	fprintf(o,
		"usage: edgelm-run -m MODEL (-p PROMPT | -f FILE) [options]\n"
		"\n"
		"  -m, --model FILE       GGUF model\n"
		"  -p, --prompt TEXT      prompt text (BOS added as the model says)\n"
		"  -f, --file FILE        read the prompt from FILE\n"
		"  -n, --n-predict N      tokens to generate (default 128; stops early at EOS)\n"
		"      --temp T           temperature (default 0.8; 0 = greedy)\n"
		"      --top-k K          (default 40; 0 = off)\n"
		"      --top-p P          (default 0.95; 1 = off)\n"
		"      --min-p P          (default 0.05; 0 = off)\n"
		"      --repeat-penalty R (default 1 = off)\n"
		"      --frequency-penalty F, --presence-penalty P (default 0)\n"
		"      --penalty-last-n N window for penalties (default 64, -1 = all)\n"
		"      --seed S           sampling seed (default: from the clock, printed)\n"
		"  -t, --threads N        worker threads (default: one per usable CPU)\n"
		"  -c, --ctx N            cap the context length (default: the model's)\n"
		"  -b, --batch N          prefill the prompt in chunks of N tokens (default %d;\n"
		"                         the scratch memory grows with N, the speed barely)\n"
		"      --kv-type TYPE     KV cache type: %s (default %s)\n"
		"      --isa NAME         force a kernel variant (scalar, ...; also EDGELM_ISA)\n"
		"      --repack MODE      repack Q4_0/Q8_0 weights at load: auto, on, off\n"
		"                         (also EDGELM_REPACK; default auto)\n"
		"      --repack-cache DIR keep the repacked weights in DIR and map them on\n"
		"                         later loads instead of repacking (also\n"
		"                         EDGELM_REPACK_CACHE)\n"
		"      --quantize TYPE    quantize F32/F16/BF16 weights on load as\n"
		"                         edgelm-quantize TYPE would (q8_0, q4_k_m, ...)\n"
		"      --json             one JSON object per generated token\n"
		"      --top-logits K     top logits per token in --json mode (default 8)\n"
		"      --tokenize         print the prompt's token ids as JSON and exit\n"
		"      --special          render control tokens in the output text\n"
		"      --chat FILE|-      JSON array of {role, content} messages (instead of -p)\n"
		"      --chat-template NAME  override the model's chat format (--chat-template\n"
		"                         list prints the names)\n"
		"      --stop STR         stop when the output contains STR (repeatable; STR is\n"
		"                         not printed)\n"
		"      --logit-bias ID=BIAS  add BIAS (-100..100) to token ID's logit before\n"
		"                         sampling; -100 bans it (repeatable)\n"
		"      --ignore-eos       go on past end-of-text tokens until -n or the context\n"
		"      --context-shift    when the context is full, drop half of the tokens\n"
		"                         after the kept ones and go on (until -n)\n"
		"      --keep N           tokens a context shift keeps at the start (default:\n"
		"                         the BOS only; -1: the whole prompt)\n"
		"      --embed            print the prompt's embedding and exit\n"
		"      --pooling NAME     --embed's pooling: mean, cls, last (default: the\n"
		"                         model's, else mean)\n"
		"      --grammar-file FILE  constrain the output to a GBNF grammar (docs/grammar.md);\n"
		"                         generation stops when it is complete\n"
		"      --json-schema FILE the output is a JSON value valid under the JSON Schema\n"
		"                         in FILE (the subset of docs/grammar.md)\n"
		"  -q, --quiet            no timings on stderr\n"
		"  -h, --help\n",
		DEFAULT_BATCH, engine_kv_type_list(), engine_kv_type_name(ENGINE_KV_DEFAULT));
}

enum {
	OPT_TEMP = 256,
	OPT_TOPK,
	OPT_TOPP,
	OPT_MINP,
	OPT_REP,
	OPT_FREQ,
	OPT_PRES,
	OPT_LASTN,
	OPT_SEED,
	OPT_ISA,
	OPT_REPACK,
	OPT_JSON,
	OPT_TOPL,
	OPT_TOKENIZE,
	OPT_SPECIAL,
	OPT_CHAT,
	OPT_CHAT_TEMPLATE,
	OPT_STOP,
	OPT_KV_TYPE,
	OPT_BIAS,
	OPT_REPACK_CACHE,
	OPT_IGNORE_EOS,
	OPT_CONTEXT_SHIFT,
	OPT_KEEP,
	OPT_QUANTIZE,
	OPT_EMBED,
	OPT_POOLING,
	OPT_GRAMMAR_FILE,
	OPT_JSON_SCHEMA,
};

static const struct option long_opts[] = {
	{"model", required_argument, NULL, 'm'},
	{"prompt", required_argument, NULL, 'p'},
	{"file", required_argument, NULL, 'f'},
	{"n-predict", required_argument, NULL, 'n'},
	{"threads", required_argument, NULL, 't'},
	{"ctx", required_argument, NULL, 'c'},
	{"batch", required_argument, NULL, 'b'},
	{"kv-type", required_argument, NULL, OPT_KV_TYPE},
	{"temp", required_argument, NULL, OPT_TEMP},
	{"top-k", required_argument, NULL, OPT_TOPK},
	{"top-p", required_argument, NULL, OPT_TOPP},
	{"min-p", required_argument, NULL, OPT_MINP},
	{"repeat-penalty", required_argument, NULL, OPT_REP},
	{"frequency-penalty", required_argument, NULL, OPT_FREQ},
	{"presence-penalty", required_argument, NULL, OPT_PRES},
	{"penalty-last-n", required_argument, NULL, OPT_LASTN},
	{"seed", required_argument, NULL, OPT_SEED},
	{"isa", required_argument, NULL, OPT_ISA},
	{"repack", required_argument, NULL, OPT_REPACK},
	{"repack-cache", required_argument, NULL, OPT_REPACK_CACHE},
	{"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
	{"context-shift", no_argument, NULL, OPT_CONTEXT_SHIFT},
	{"keep", required_argument, NULL, OPT_KEEP},
	{"quantize", required_argument, NULL, OPT_QUANTIZE},
	{"grammar-file", required_argument, NULL, OPT_GRAMMAR_FILE},
	{"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
	{"json", no_argument, NULL, OPT_JSON},
	{"top-logits", required_argument, NULL, OPT_TOPL},
	{"tokenize", no_argument, NULL, OPT_TOKENIZE},
	{"special", no_argument, NULL, OPT_SPECIAL},
	{"chat", required_argument, NULL, OPT_CHAT},
	{"chat-template", required_argument, NULL, OPT_CHAT_TEMPLATE},
	{"stop", required_argument, NULL, OPT_STOP},
	{"logit-bias", required_argument, NULL, OPT_BIAS},
	{"embed", no_argument, NULL, OPT_EMBED},
	{"pooling", required_argument, NULL, OPT_POOLING},
	{"quiet", no_argument, NULL, 'q'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* "--name" of option c, for messages (argv[optind - 1] is the value when
 * it came as its own argument, and "--name=value" otherwise) */
static const char *opt_name(int c)
{
	static char b[64];
	for (const struct option *o = long_opts; o->name; o++)
		if (o->val == c) {
			snprintf(b, sizeof(b), "--%s", o->name);
			return b;
		}
	return "?";
}

static char *read_file(const char *path, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, n = 0, r;
	char *buf = malloc(cap + 1);
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap) {
			char *nb = realloc(buf, (cap *= 2) + 1);
			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	fclose(f);
	if (buf) {
		buf[n] = '\0';
		*ret_len = n;
	}
	return buf;
}

/* The k highest logits, highest first (ties: lower id first). */
static int top_logits(const float *l, int n, int k, int32_t *ids)
{
	int m = 0;
	if (k <= 0) /* --top-logits 0: the walk below would index ids[-1] */
		return 0;
	for (int i = 0; i < n; i++) {
		float v = l[i];
		if (isnan(v))
			continue;
		if (m == k && !(v > l[ids[m - 1]]))
			continue;
		int j = m < k ? m++ : k - 1;
		while (j > 0 && v > l[ids[j - 1]]) {
			ids[j] = ids[j - 1];
			j--;
		}
		ids[j] = i;
	}
	return m;
}

/* --chat: the messages of a JSON array, rendered in format f. Returns
 * the prompt (malloc'ed by the engine) or NULL after printing why. */
static char *chat_prompt(const char *path, const engine_model *m, const char *tmpl_name,
			 size_t *ret_len)
{
	json_error_t je;
	json_t *root = strcmp(path, "-") == 0 ? json_loadf(stdin, 0, &je)
					      : json_load_file(path, 0, &je);
	if (!root) {
		fprintf(stderr, "edgelm-run: --chat %s: line %d: %s\n", path, je.line, je.text);
		return NULL;
	}
	char *text = NULL;
	size_t n = json_is_array(root) ? json_array_size(root) : 0;
	struct engine_chat_msg *msgs = calloc(n ? n : 1, sizeof(*msgs));
	if (!json_is_array(root) || !msgs) {
		fprintf(stderr, "edgelm-run: --chat %s: expected a JSON array of messages\n", path);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(root, i);
		const char *role = json_string_value(json_object_get(o, "role"));
		json_t *c = json_object_get(o, "content");
		if (!role || !json_is_string(c)) {
			fprintf(stderr,
				"edgelm-run: --chat %s: message %zu needs string role and "
				"content\n",
				path, i);
			goto out;
		}
		if (strcmp(role, "system") == 0)
			msgs[i].role = ENGINE_CHAT_SYSTEM;
		else if (strcmp(role, "user") == 0)
			msgs[i].role = ENGINE_CHAT_USER;
		else if (strcmp(role, "assistant") == 0)
			msgs[i].role = ENGINE_CHAT_ASSISTANT;
		else {
			fprintf(stderr, "edgelm-run: --chat %s: message %zu: unknown role '%s' "
					"(system, user, assistant)\n",
				path, i, role);
			goto out;
		}
		msgs[i].content = json_string_value(c);
		msgs[i].len = json_string_length(c);
	}
	struct cm_err err = {0};
	enum engine_chat_format f;
	if (engine_chat_detect(m, tmpl_name, &f, &err) != 0 ||
	    engine_chat_render(f, msgs, n, true, &text, ret_len, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s\n", err.msg);
		text = NULL;
	}
out:
	free(msgs);
	json_decref(root);
	return text;
}

#define MAX_STOP 32
#define MAX_BIAS 1024 /* --logit-bias entries, as the protocol allows */

/* Text output with stop strings: `hold` keeps generated text that could
 * still begin a stop string. */
struct out_text {
	char *hold;
	size_t n, cap;
	const char *stop[MAX_STOP];
	size_t stop_len[MAX_STOP];
	int n_stop;
	bool silent;  /* --json: only watch for stop strings */
	bool stopped; /* a stop string was seen: print nothing more */
};

static void out_write(const struct out_text *o, const char *s, size_t n)
{
	if (!o->silent && n)
		fwrite(s, 1, n, stdout);
}

/* Append text; print what can no longer be part of a stop string. Returns
 * true when a stop string was completed (the text before it is printed,
 * the rest dropped). */
static bool out_push(struct out_text *o, const char *s, size_t n)
{
	if (o->stopped)
		return true;
	if (o->n_stop == 0) {
		out_write(o, s, n);
		return false;
	}
	if (o->n + n > o->cap) {
		size_t cap = o->cap ? o->cap : 256;
		while (cap < o->n + n)
			cap *= 2;
		char *h = realloc(o->hold, cap);
		if (!h) {
			out_write(o, o->hold, o->n);
			out_write(o, s, n);
			o->n = 0;
			return false;
		}
		o->hold = h;
		o->cap = cap;
	}
	memcpy(o->hold + o->n, s, n);
	o->n += n;
	size_t first = o->n; /* earliest stop match */
	for (int k = 0; k < o->n_stop; k++) {
		const char *p = memmem(o->hold, o->n, o->stop[k], o->stop_len[k]);
		if (p && (size_t)(p - o->hold) < first)
			first = (size_t)(p - o->hold);
	}
	if (first < o->n) {
		out_write(o, o->hold, first);
		o->n = 0;
		o->stopped = true;
		return true;
	}
	/* keep the longest suffix that is a proper prefix of a stop string */
	size_t keep = 0;
	for (int k = 0; k < o->n_stop; k++) {
		size_t L = o->stop_len[k] - 1 < o->n ? o->stop_len[k] - 1 : o->n;
		for (size_t l = L; l > keep; l--) {
			if (memcmp(o->hold + o->n - l, o->stop[k], l) == 0) {
				keep = l;
				break;
			}
		}
	}
	out_write(o, o->hold, o->n - keep);
	memmove(o->hold, o->hold + o->n - keep, keep);
	o->n = keep;
	return false;
}

/* ---- options ------------------------------------------------------------- */

struct run_opts {
	const char *model_path, *prompt, *prompt_file, *chat_file, *chat_tmpl;
	const char *isa, *repack, *repack_cache, *quantize, *grammar_file, *schema_file;
	const char *stop[MAX_STOP];
	int n_stop;
	int32_t bias_ids[MAX_BIAS];
	float bias[MAX_BIAS];
	int n_bias;
	long n_predict, n_threads, ctx, top_n, n_batch;
	long keep; /* --keep; -2: the BOS only */
	enum engine_kv_type kv_type;
	bool json, tokenize_only, special, quiet, seed_set, ignore_eos, context_shift, embed;
	enum engine_pooling pooling;
	struct engine_sampler_params sp;
};

/* Text output for o: --stop's strings; only watching for them with --json. */
static void out_init(struct out_text *ot, const struct run_opts *o)
{
	*ot = (struct out_text){.silent = o->json, .n_stop = o->n_stop};
	for (int k = 0; k < o->n_stop; k++) {
		ot->stop[k] = o->stop[k];
		ot->stop_len[k] = strlen(o->stop[k]);
	}
}

/* The command line into o: -1 to go on, else the exit code. */
static int run_opts_parse(int argc, char **argv, struct run_opts *o)
{
	*o = (struct run_opts){
		.isa = getenv("EDGELM_ISA"),
		.repack = getenv("EDGELM_REPACK"),
		.repack_cache = getenv("EDGELM_REPACK_CACHE"),
		.n_predict = 128,
		.top_n = 8,
		.n_batch = DEFAULT_BATCH,
		.kv_type = ENGINE_KV_DEFAULT,
		.keep = -2,
		.pooling = ENGINE_POOL_UNSPECIFIED,
	};
	long lastn = 64;
	engine_sampler_params_default(&o->sp);
	int c;
	while ((c = getopt_long(argc, argv, "m:p:f:n:t:c:b:qh", long_opts, NULL)) != -1) {
		long lv;
		int bad = 0;
		switch (c) {
		case 'm': o->model_path = optarg; break;
		case 'p': o->prompt = optarg; break;
		case 'f': o->prompt_file = optarg; break;
		case 'n': bad = tools_parse_long(optarg, 0, 1 << 24, &o->n_predict); break;
		case 't': bad = tools_parse_long(optarg, 1, 4096, &o->n_threads); break;
		case 'c': bad = tools_parse_long(optarg, 1, 1 << 24, &o->ctx); break;
		case 'b': bad = tools_parse_long(optarg, 1, 65536, &o->n_batch); break;
		case OPT_KV_TYPE:
			if (engine_kv_type_from_name(optarg, &o->kv_type) != 0) {
				fprintf(stderr, "edgelm-run: --kv-type: '%s' is not one of %s\n",
					optarg, engine_kv_type_list());
				return EXIT_USAGE;
			}
			break;
		case OPT_TEMP: bad = tools_parse_float(optarg, 0, 100, &o->sp.temp); break;
		case OPT_TOPK:
			bad = tools_parse_long(optarg, 0, 1 << 30, &lv);
			o->sp.top_k = (int32_t)lv;
			break;
		case OPT_TOPP: bad = tools_parse_float(optarg, 0, 1, &o->sp.top_p); break;
		case OPT_MINP: bad = tools_parse_float(optarg, 0, 1, &o->sp.min_p); break;
		case OPT_REP: bad = tools_parse_float(optarg, 0, 100, &o->sp.repeat_penalty); break;
		case OPT_FREQ:
			bad = tools_parse_float(optarg, -100, 100, &o->sp.freq_penalty);
			break;
		case OPT_PRES:
			bad = tools_parse_float(optarg, -100, 100, &o->sp.presence_penalty);
			break;
		case OPT_LASTN:
			bad = tools_parse_long(optarg, -1, 1 << 24, &lastn);
			break;
		case OPT_SEED: {
			char *end;
			errno = 0;
			o->sp.seed = strtoull(optarg, &end, 0);
			bad = errno || end == optarg || *end;
			o->seed_set = true;
			break;
		}
		case OPT_ISA: o->isa = optarg; break;
		case OPT_REPACK: o->repack = optarg; break;
		case OPT_REPACK_CACHE: o->repack_cache = optarg; break;
		case OPT_IGNORE_EOS: o->ignore_eos = true; break;
		case OPT_CONTEXT_SHIFT: o->context_shift = true; break;
		case OPT_KEEP: bad = tools_parse_long(optarg, -1, 1 << 24, &o->keep); break;
		case OPT_QUANTIZE: {
			struct cm_err qe = {0};
			if (engine_quantize_check(optarg, &qe) != 0) {
				fprintf(stderr, "edgelm-run: %s\n", qe.msg);
				return EXIT_USAGE;
			}
			o->quantize = optarg;
			break;
		}
		case OPT_GRAMMAR_FILE: o->grammar_file = optarg; break;
		case OPT_JSON_SCHEMA: o->schema_file = optarg; break;
		case OPT_JSON: o->json = true; break;
		case OPT_EMBED: o->embed = true; break;
		case OPT_POOLING:
			if (engine_pooling_parse(optarg, &o->pooling) != 0 ||
			    o->pooling == ENGINE_POOL_NONE) {
				fprintf(stderr, "edgelm-run: --pooling: '%s' is not one of mean, "
						"cls, last\n", optarg);
				return EXIT_USAGE;
			}
			break;
		case OPT_TOPL: bad = tools_parse_long(optarg, 0, 1 << 20, &o->top_n); break;
		case OPT_TOKENIZE: o->tokenize_only = true; break;
		case OPT_SPECIAL: o->special = true; break;
		case OPT_CHAT: o->chat_file = optarg; break;
		case OPT_CHAT_TEMPLATE:
			if (strcmp(optarg, "list") == 0) {
				printf("%s\n", engine_chat_format_list());
				return 0;
			}
			o->chat_tmpl = optarg;
			break;
		case OPT_STOP:
			if (o->n_stop == MAX_STOP || !*optarg) {
				fprintf(stderr,
					"edgelm-run: --stop: at most %d non-empty strings\n",
					MAX_STOP);
				return EXIT_USAGE;
			}
			o->stop[o->n_stop++] = optarg;
			break;
		case OPT_BIAS: {
			/* ID=BIAS; the ids are checked against the vocabulary at load */
			char *eq = strchr(optarg, '='), *end;
			long id = eq ? strtol(optarg, &end, 10) : -1;
			if (!eq || end != eq || id < 0 || id > INT32_MAX || o->n_bias == MAX_BIAS) {
				fprintf(stderr,
					"edgelm-run: --logit-bias wants ID=BIAS (a token id, a bias in "
					"-100..100), at most %d of them\n",
					MAX_BIAS);
				return EXIT_USAGE;
			}
			o->bias_ids[o->n_bias] = (int32_t)id;
			bad = tools_parse_float(eq + 1, -100, 100, &o->bias[o->n_bias]);
			o->n_bias++;
			break;
		}
		case 'q': o->quiet = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return EXIT_USAGE;
		}
		if (bad) {
			fprintf(stderr, "edgelm-run: invalid value '%s' for %s\n", optarg,
				opt_name(c));
			return EXIT_USAGE;
		}
	}
	o->sp.penalty_last_n = (int32_t)lastn;
	o->sp.bias_ids = o->bias_ids;
	o->sp.bias = o->bias;
	o->sp.n_bias = o->n_bias;
	if (optind < argc || !o->model_path || (o->prompt && o->prompt_file) ||
	    (o->chat_file && (o->prompt || o->prompt_file)) || (o->grammar_file && o->schema_file)) {
		usage(stderr);
		return EXIT_USAGE;
	}
	return -1;
}

/* ---- the run ----------------------------------------------------------------- */

struct run {
	engine_model *m;
	engine_ctx *cx;
	engine_sampler *smp;
	engine_grammar *grammar; /* --grammar-file */
	const engine_tokenizer *tok;
	struct engine_model_info info;
	char *pbuf; /* the prompt when read from a file or rendered from --chat */
	const char *prompt;
	size_t plen;
	int32_t *ids;
	int n_ids;
	struct out_text ot;
	double t_load, t_prompt, t_gen;
	int n_gen;
};

static void run_free(struct run *r)
{
	free(r->ot.hold);
	free(r->ids);
	free(r->pbuf);
	engine_sampler_free(r->smp);
	engine_grammar_free(r->grammar);
	engine_ctx_free(r->cx);
	engine_model_free(r->m);
}

/* -p or -f; and the seed from the clock when --seed is not given. */
static int run_read_prompt(struct run_opts *o, struct run *r)
{
	r->prompt = o->prompt;
	if (o->prompt_file) {
		r->pbuf = read_file(o->prompt_file, &r->plen);
		if (!r->pbuf) {
			fprintf(stderr, "edgelm-run: cannot read %s: %s\n", o->prompt_file,
				strerror(errno));
			return EXIT_INPUT;
		}
		r->prompt = r->pbuf;
	} else {
		if (!r->prompt)
			r->prompt = "";
		r->plen = strlen(r->prompt);
	}
	if (!o->seed_set)
		o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	return 0;
}

/* The model (only its vocabulary for --tokenize), and --chat's prompt. */
static int run_load(const struct run_opts *o, struct run *r)
{
	struct cm_err err = {0};
	struct engine_params ep = {
		.n_threads = (int)o->n_threads,
		.ctx_max = (uint32_t)o->ctx,
		.isa = o->isa,
		.vocab_only = o->tokenize_only,
		.repack_cache = o->repack_cache,
		.quantize = o->quantize,
	};
	if (engine_repack_parse(o->repack, &ep.repack) != 0) {
		fprintf(stderr, "edgelm-run: --repack: expected auto, on or off, not '%s'\n",
			o->repack);
		return EXIT_USAGE;
	}
	double t0 = cm_now();
	if (engine_model_load(o->model_path, &ep, &r->m, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s: %s\n", o->model_path, err.msg);
		return EXIT_INPUT;
	}
	r->t_load = cm_now() - t0;
	r->tok = engine_model_tokenizer(r->m);
	if (o->chat_file) {
		free(r->pbuf);
		r->pbuf = chat_prompt(o->chat_file, r->m, o->chat_tmpl, &r->plen);
		if (!r->pbuf)
			return EXIT_INPUT;
		r->prompt = r->pbuf;
	}
	const char *gfile = o->grammar_file ? o->grammar_file : o->schema_file;
	if (gfile && !o->tokenize_only) {
		size_t len;
		char *text = read_file(gfile, &len);
		if (!text) {
			fprintf(stderr, "edgelm-run: cannot read %s: %s\n", gfile, strerror(errno));
			return EXIT_INPUT;
		}
		t0 = cm_now();
		char *gbnf = NULL; /* --json-schema: the schema's grammar (ipc/json_schema.c) */
		int rc = o->schema_file ? ipc_json_schema_to_gbnf(text, len, &gbnf, &err) : 0;
		if (rc == 0)
			rc = engine_grammar_new(r->tok, gbnf ? gbnf : text, gbnf ? strlen(gbnf) : len,
						&r->grammar, &err);
		free(text);
		cm_free(gbnf);
		if (rc) {
			fprintf(stderr, "edgelm-run: %s: %s\n", gfile, err.msg);
			return EXIT_INPUT;
		}
		if (!o->quiet)
			fprintf(stderr, "edgelm-run: grammar %s compiled in %.1f ms\n", gfile,
				(cm_now() - t0) * 1e3);
	}
	return 0;
}

/* The prompt's ids (--chat's with special tokens parsed). */
static int run_tokenize(const struct run_opts *o, struct run *r)
{
	struct cm_err err = {0};
	bool parse_special = o->chat_file != NULL;
	int cap = (int)CM_MIN(r->plen + 16, (size_t)1 << 26);
	r->ids = malloc((size_t)cap * sizeof(*r->ids));
	if (!r->ids)
		return EXIT_RUNTIME;
	int rc = engine_tokenize(r->tok, r->prompt, r->plen, true, parse_special, r->ids, cap,
				 &r->n_ids, &err);
	if (rc == -ENOBUFS) {
		free(r->ids);
		cap = r->n_ids;
		r->ids = malloc((size_t)cap * sizeof(*r->ids));
		rc = r->ids ? engine_tokenize(r->tok, r->prompt, r->plen, true, parse_special,
					      r->ids, cap, &r->n_ids, &err)
			    : -ENOMEM;
	}
	if (rc) {
		fprintf(stderr, "edgelm-run: tokenize: %s\n", err.msg);
		return EXIT_INPUT;
	}
	return 0;
}

static void print_ids(const struct run *r)
{
	putchar('[');
	for (int i = 0; i < r->n_ids; i++)
		printf(i ? ", %d" : "%d", r->ids[i]);
	puts("]");
}

/* Context and sampler for the prompt, the banner, then the prompt's
 * prefill. */
static int run_prefill(const struct run_opts *o, struct run *r)
{
	struct cm_err err = {0};
	engine_model_get_info(r->m, &r->info);
	const struct engine_model_info *info = &r->info;
	if (r->n_ids == 0) {
		fprintf(stderr, "edgelm-run: the prompt is empty and the model adds no BOS\n");
		return EXIT_INPUT;
	}
	if ((uint32_t)r->n_ids >= info->n_ctx) {
		fprintf(stderr, "edgelm-run: prompt of %d tokens does not fit the context of %u\n",
			r->n_ids, info->n_ctx);
		return EXIT_INPUT;
	}
	struct engine_ctx_params cp = {
		.n_ctx = info->n_ctx,
		.n_seq = 1,
		.n_batch = (uint32_t)o->n_batch,
		.kv_type = o->kv_type,
	};
	if (engine_ctx_new(r->m, &cp, &r->cx, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s\n", err.msg);
		return EXIT_RUNTIME;
	}
	struct engine_sampler_params sp = o->sp;
	sp.grammar = r->grammar;
	int rc = engine_sampler_new(&sp, (int)info->n_vocab, &r->smp, &err);
	if (rc) {
		/* a --logit-bias id this model does not have: the command line's */
		fprintf(stderr, "edgelm-run: %s\n", err.msg);
		return rc == -EINVAL ? EXIT_USAGE : EXIT_RUNTIME;
	}
	if (!o->quiet)
		fprintf(stderr,
			"edgelm-run: %s (%s, %u layers, %u ctx, %s KV), %d threads, kernels %s, "
			"seed %llu\n",
			info->name[0] ? info->name : o->model_path, info->arch, info->n_layer,
			info->n_ctx, engine_kv_type_name(engine_ctx_kv_type(r->cx)),
			info->n_threads, info->isa, (unsigned long long)o->sp.seed);
	if (!o->quiet)
		tools_quant_report(stderr, "edgelm-run", info);
	if (!o->quiet && info->n_x16_tensors)
		fprintf(stderr, "edgelm-run: repacked %u tensors (%.1f MiB) into the x16 layout%s%s\n",
			info->n_x16_tensors, (double)info->x16_bytes / (1 << 20),
			info->repack_cache_note[0] ? "; repack cache: " : "",
			info->repack_cache_note);
	for (int i = 0; i < r->n_ids; i++)
		engine_sampler_accept(r->smp, r->ids[i]);

	double t1 = cm_now();
	if (engine_eval(r->cx, r->ids, r->n_ids, 0, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s\n", err.msg);
		return EXIT_RUNTIME;
	}
	r->t_prompt = cm_now() - t1;
	return 0;
}

/* The text of token id into piece: none for end-of-generation tokens, the
 * control tokens' own text with --special. */
static int token_text(const struct run_opts *o, const struct run *r, struct engine_detok *dt,
		      int32_t id, bool eog, char *piece, size_t piece_cap)
{
	int n = 0;
	if (!eog || o->special) {
		if (o->special && (engine_tokenizer_attr(r->tok, id) & ENGINE_TOKEN_CONTROL)) {
			n = engine_token_to_piece(r->tok, id, true, piece, piece_cap);
			if (n < 0)
				n = 0;
		} else {
			n = engine_detok_push(dt, r->tok, id, piece, piece_cap);
		}
	}
	return n;
}

/* --json: one object per generated token, with its top logits. */
static void print_token_json(const struct run_opts *o, const struct run *r, int32_t id,
			     const char *piece, int n, const float *logits, int32_t *top)
{
	printf("{\"id\":%d,\"text\":", id);
	tools_json_strn(stdout, piece, n > 0 ? (size_t)n : 0);
	fputs(",\"top\":[", stdout);
	int k = top_logits(logits, (int)r->info.n_vocab, (int)o->top_n, top);
	for (int i = 0; i < k; i++)
		printf(i ? ",[%d,%.6g]" : "[%d,%.6g]", top[i], logits[top[i]]);
	fputs("]}\n", stdout);
}

/* --context-shift with a full context: keep the first tokens (--keep), drop
 * half of the rest and move *pos down; false when nothing can go. */
static bool run_shift(const struct run_opts *o, struct run *r, int *pos)
{
	struct cm_err err = {0};
	int n_keep = o->keep == -1 ? r->n_ids : (int)o->keep;
	if (o->keep == -2) /* the BOS, if the prompt starts with one */
		n_keep = r->ids[0] == engine_tokenizer_bos(r->tok) ? 1 : 0;
	int n_discard = (*pos - n_keep) / 2;
	if (n_discard < 1) {
		fprintf(stderr, "edgelm-run: context full; --keep %d leaves nothing to drop\n",
			n_keep);
		return false;
	}
	if (engine_seq_shift(r->cx, 0, n_keep, n_discard, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s\n", err.msg);
		return false;
	}
	if (!o->quiet)
		fprintf(stderr, "edgelm-run: context shift: kept %d, dropped %d tokens\n", n_keep,
			n_discard);
	*pos -= n_discard;
	return true;
}

/* Sample, print, evaluate, until -n, the context's end (unless
 * --context-shift), an end-of-generation token or a stop string. */
static int run_generate(const struct run_opts *o, struct run *r)
{
	struct cm_err err = {0};
	int rc = 0;
	struct engine_detok dt;
	engine_detok_init(&dt, r->tok);
	size_t piece_cap = 4096;
	char *piece = malloc(piece_cap);
	int32_t *top = malloc(sizeof(*top) * (size_t)(o->top_n > 0 ? o->top_n : 1));
	if (!piece || !top) {
		rc = EXIT_RUNTIME;
		goto out;
	}
	int pos = r->n_ids;
	double t2 = cm_now();
	while (r->n_gen < o->n_predict && ((uint32_t)pos < r->info.n_ctx || o->context_shift)) {
		const float *logits = engine_get_logits_last(r->cx);
		int32_t id = engine_sampler_sample(r->smp, logits);
		engine_sampler_accept(r->smp, id);
		r->n_gen++;
		bool eog = engine_tokenizer_is_eog(r->tok, id);
		/* a refusal only when the grammar allows nothing (EOS is given) */
		bool gram_end = engine_sampler_advance(r->smp, id) != 0 ||
				engine_sampler_grammar_done(r->smp);
		int n = token_text(o, r, &dt, id, eog, piece, piece_cap);
		if (o->json)
			print_token_json(o, r, id, piece, n, logits, top);
		bool stop = n > 0 && out_push(&r->ot, piece, (size_t)n);
		fflush(stdout);
		if ((eog && (!o->ignore_eos || r->grammar)) || stop || gram_end)
			break;
		if (r->n_gen >= o->n_predict)
			break;
		if ((uint32_t)pos >= r->info.n_ctx && o->context_shift && !run_shift(o, r, &pos))
			break;
		if (engine_eval(r->cx, &id, 1, pos, &err) != 0) {
			fprintf(stderr, "edgelm-run: %s\n", err.msg);
			rc = EXIT_RUNTIME;
			goto out;
		}
		pos++;
	}
	int n = engine_detok_flush(&dt, piece, piece_cap);
	if (!o->json && n > 0)
		(void)out_push(&r->ot, piece, (size_t)n);
	if (!r->ot.stopped)
		out_write(&r->ot, r->ot.hold, r->ot.n); /* no stop string after all */
	if (!o->json)
		putchar('\n');
	r->t_gen = cm_now() - t2;
out:
	free(piece);
	free(top);
	return rc;
}

/* --embed: the prompt's pooled embedding on stdout. */
static int run_embed(const struct run_opts *o, struct run *r)
{
	struct cm_err err = {0};
	engine_model_get_info(r->m, &r->info);
	const struct engine_model_info *info = &r->info;
	if (r->n_ids == 0) {
		fprintf(stderr, "edgelm-run: the prompt is empty and the model adds no BOS\n");
		return EXIT_INPUT;
	}
	if ((uint32_t)r->n_ids > info->n_ctx) {
		fprintf(stderr, "edgelm-run: prompt of %d tokens does not fit the context of %u\n",
			r->n_ids, info->n_ctx);
		return EXIT_INPUT;
	}
	struct engine_ctx_params cp = {.n_ctx = (uint32_t)r->n_ids, .n_seq = 1,
				       .n_batch = (uint32_t)o->n_batch, .kv_type = o->kv_type};
	float *v = malloc(sizeof(float) * info->n_embd);
	enum engine_pooling pool = engine_pooling_resolve(r->m, o->pooling);
	double t1 = cm_now();
	if (!v || engine_ctx_new(r->m, &cp, &r->cx, &err) != 0 ||
	    engine_embed(r->cx, 0, r->ids, r->n_ids, pool, v, &err) != 0) {
		fprintf(stderr, "edgelm-run: %s\n", v ? err.msg : "out of memory");
		free(v);
		return EXIT_RUNTIME;
	}
	r->t_prompt = cm_now() - t1;
	if (o->json)
		printf("{\"n_tokens\":%d,\"pooling\":\"%s\",\"embedding\":[", r->n_ids,
		       engine_pooling_name(pool));
	for (uint32_t i = 0; i < info->n_embd; i++)
		printf(i ? (o->json ? ",%.9g" : " %.9g") : "%.9g", (double)v[i]);
	puts(o->json ? "]}" : "");
	free(v);
	return 0;
}

/* Timings on stderr unless --quiet. */
static void run_report(const struct run_opts *o, const struct run *r)
{
	if (o->quiet)
		return;
	fprintf(stderr,
		"edgelm-run: load %.0f ms; prompt %d tokens in %.0f ms (%.1f tok/s); "
		"generated %d tokens in %.0f ms (%.1f tok/s)\n",
		r->t_load * 1e3, r->n_ids, r->t_prompt * 1e3,
		r->n_ids / (r->t_prompt > 0 ? r->t_prompt : 1e-9), r->n_gen, r->t_gen * 1e3,
		r->n_gen / (r->t_gen > 0 ? r->t_gen : 1e-9));
}

int main(int argc, char **argv)
{
	struct run_opts o;
	int rc = run_opts_parse(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct run r = {0};
	out_init(&r.ot, &o);
	rc = run_read_prompt(&o, &r);
	if (!rc)
		rc = run_load(&o, &r);
	if (!rc)
		rc = run_tokenize(&o, &r);
	if (!rc && o.tokenize_only) {
		print_ids(&r);
	} else if (!rc && o.embed) {
		rc = run_embed(&o, &r);
		if (!rc && !o.quiet)
			fprintf(stderr, "edgelm-run: embedded %d tokens in %.0f ms\n", r.n_ids,
				r.t_prompt * 1e3);
	} else if (!rc) {
		rc = run_prefill(&o, &r);
		if (!rc)
			rc = run_generate(&o, &r);
		if (!rc)
			run_report(&o, &r);
	}
	run_free(&r);
	return rc;
}
