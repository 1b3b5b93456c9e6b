/* tools/edgelmctl.c: the command-line client of edgelmd, built on libedgelm.
 *
 *   edgelmctl [--socket URL] [--json] [--timeout MS] COMMAND [ARGS]
 *
 * Exit codes: 0 ok, 1 usage, 2 the daemon returned an error, 3 cannot connect
 * or no reply in time, 4 the daemon is not ready (health), 130 interrupted. */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"
#include "monitor/monitor.h"
#include "tools/lib/tools.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,
	EXIT_SERVER = 2,
	EXIT_CONNECT = 3,
	EXIT_NOT_READY = 4,
	EXIT_INTERRUPTED = 130,
};

#define MAX_STOP 16

struct globals {
	const char *socket;
	bool json;
	int timeout_ms;
};

static struct globals G = {.timeout_ms = 30000};
static volatile sig_atomic_t interrupted;

/* ---- help ----------------------------------------------------------------- */

static const struct command_help {
	const char *name;
	const char *usage;
	const char *text;
} helps[] = {
    {"generate", "generate [OPTIONS] TEXT|-",
     "Generate a continuation of TEXT (\"-\": read it from stdin). Streams to a\n"
     "terminal, replies at once otherwise.\n"
     "  -n, --max-tokens N     tokens to generate at most\n"
     "      --temp T           temperature (0: greedy)\n"
     "      --top-k K          top-k (0: off)\n"
     "      --top-p P          top-p (1: off)\n"
     "      --min-p P          min-p (0: off)\n"
     "      --repeat-penalty R repetition penalty (1: off)\n"
     "      --seed S           sampling seed (default: random)\n"
     "      --stop STR         stop at STR (repeatable, up to 16)\n"
     "      --stream           stream the text as it is produced\n"
     "      --no-stream        wait for the whole text\n"
     "      --id ID            name the generation (for cancel ID)\n"
     "      --deadline MS      give up after MS milliseconds\n"
     "      --priority P       -10..10, higher first\n"
     "      --stats            print token counts and speed to stderr\n"
     "With --json, prints one JSON object with the text and the statistics\n"
     "(streaming: one {\"text\":...} line per piece, then the object).\n"},
    {"chat", "chat [OPTIONS]",
     "An interactive chat: each line read from stdin is a user message; the\n"
     "whole conversation is sent every turn, so the daemon's prefix cache\n"
     "reuses it. Lines \"/reset\" forget the conversation, \"/quit\" ends.\n"
     "Works with a pipe too (one message per line).\n"
     "      --system TEXT      a system message first\n"
     "  and the sampling options of generate (-n, --temp, --top-k, --top-p,\n"
     "  --min-p, --repeat-penalty, --seed, --stop, --stats)\n"},
    {"info", "info",
     "Model, architecture, quant types, context, ISA and kernels, threads,\n"
     "tuning state and version of the daemon.\n"},
    {"health", "health",
     "Whether the daemon is loading, ready or draining, with the reasons.\n"
     "Exit code 0 when ready, 4 otherwise.\n"},
    {"tokenize", "tokenize [--no-special] [--parse-special] TEXT|-",
     "The token ids of TEXT.\n"
     "      --no-special       do not add the model's BOS/EOS tokens\n"
     "      --parse-special    turn special token text (<s>) into its id\n"},
    {"detokenize", "detokenize ID...", "The text of token ids.\n"},
    {"metrics", "metrics", "The daemon's metrics (the figures the monitor exports).\n"},
    {"cancel", "cancel ID", "Cancel the generation named ID.\n"},
    {"top", "top [--interval MS]",
     "A live view of the daemon and the box: per-core CPU, memory, swap,\n"
     "pressure, tokens/s, queue and bottleneck flags, redrawn every second.\n"
     "q or Ctrl-C quits.\n"
     "      --interval MS      redraw period (default 1000)\n"},
};

static void usage_main(FILE *f)
{
	fprintf(f, "usage: edgelmctl [--socket URL] [--json] [--timeout MS] COMMAND [ARGS]\n\n"
	           "Talk to edgelmd, the local LLM daemon.\n\n"
	           "Commands:\n");
	for (size_t i = 0; i < CM_ARRAY_LEN(helps); i++)
		fprintf(f, "  %s\n", helps[i].usage);
	fprintf(f,
	        "\nOptions:\n"
	        "  -s, --socket URL   the daemon's socket (default: $EDGELM_SOCKET, else\n"
	        "                     %s)\n"
	        "  -j, --json         print JSON for machines\n"
	        "  -t, --timeout MS   wait this long for each reply (default 30000; 0: forever;\n"
	        "                     a generation waits as long as it runs; a reconnect\n"
	        "                     at most this long, 30000 with 0)\n"
	        "  -h, --help         this help; COMMAND --help for a command's\n"
	        "      --version      print the version\n\n"
	        "Exit codes: 0 ok, 1 usage, 2 the daemon returned an error, 3 cannot\n"
	        "connect or no reply in time, 4 not ready (health), 130 interrupted.\n",
	        EDGELM_DEFAULT_URL);
}

static int usage_command(const char *name, FILE *f)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(helps); i++) {
		if (strcmp(helps[i].name, name) == 0) {
			fprintf(f, "usage: edgelmctl %s\n\n%s", helps[i].usage, helps[i].text);
			return 0;
		}
	}
	return -1;
}

static int usage_error(const char *cmd, const char *fmt, ...) CM_PRINTF(2, 3);
static int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fputs("edgelmctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'edgelmctl %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
	return EXIT_USAGE;
}

/* ---- output --------------------------------------------------------------- */

static void json_num(FILE *f, double x)
{
	if (isfinite(x))
		fprintf(f, "%.6g", x);
	else
		fputs("null", f);
}

static int exit_code(int rc)
{
	switch (rc) {
	case 0:
		return EXIT_OK;
	case EDGELM_E_INVALID_ARG:
		return EXIT_USAGE;
	case EDGELM_E_CONNECT:
	case EDGELM_E_TIMEOUT:
	case EDGELM_E_CONNECTION:
		return EXIT_CONNECT;
	case EDGELM_E_ABORTED:
		return EXIT_INTERRUPTED;
	default:
		return EXIT_SERVER;
	}
}

/* Report a failure (stderr, or a JSON object on stdout) and return the exit
 * code it maps to. */
static int fail(int rc, const struct edgelm_error *e)
{
	const char *msg = e->message[0] ? e->message : edgelm_strerror(rc);
	if (G.json) {
		printf("{\"ok\":false,\"error\":{\"code\":");
		const char *code = e->server_code[0] ? e->server_code : NULL;
		if (!code) {
			switch (rc) {
			case EDGELM_E_CONNECT:
				code = "cannot_connect";
				break;
			case EDGELM_E_TIMEOUT:
				code = "timeout";
				break;
			case EDGELM_E_CONNECTION:
				code = "connection_lost";
				break;
			case EDGELM_E_ABORTED:
				code = "interrupted";
				break;
			default:
				code = "client_error";
			}
		}
		tools_json_strn(stdout, code, strlen(code));
		printf(",\"message\":");
		tools_json_strn(stdout, msg, strlen(msg));
		if (e->retry_after_ms >= 0)
			printf(",\"retry_after_ms\":%lld", (long long)e->retry_after_ms);
		printf("}}\n");
	} else {
		fprintf(stderr, "edgelmctl: %s", msg);
		if (e->server_code[0])
			fprintf(stderr, " (%s)", e->server_code);
		if (e->retry_after_ms >= 0)
			fprintf(stderr, "; retry in %lld ms", (long long)e->retry_after_ms);
		fputc('\n', stderr);
	}
	return exit_code(rc);
}

static void print_stats(const struct edgelm_result *r)
{
	fprintf(stderr, "[%s: %lld prompt tokens (%lld cached), %lld generated; ",
	        edgelm_finish_name(r->finish), (long long)r->prompt_tokens,
	        (long long)r->cached_tokens, (long long)r->completion_tokens);
	fprintf(stderr,
	        "queue %.0f ms, first token %.0f ms, prefill %.1f tok/s, decode %.1f tok/s]\n",
	        r->queue_ms, r->ttft_ms, r->prefill_tps, r->decode_tps);
}

static void print_result_json(const struct edgelm_result *r)
{
	printf("{\"ok\":true,\"id\":");
	tools_json_strn(stdout, r->id, strlen(r->id));
	printf(",\"text\":");
	tools_json_strn(stdout, r->text ? r->text : "", r->text_len);
	printf(",\"finish_reason\":\"%s\",\"usage\":{\"prompt_tokens\":%lld,\"cached_tokens\":%lld,"
	       "\"completion_tokens\":%lld},\"timings\":{",
	       edgelm_finish_name(r->finish), (long long)r->prompt_tokens,
	       (long long)r->cached_tokens, (long long)r->completion_tokens);
	const struct {
		const char *k;
		double v;
	} t[] = {{"queue_ms", r->queue_ms},     {"ttft_ms", r->ttft_ms},
	         {"prefill_ms", r->prefill_ms}, {"decode_ms", r->decode_ms},
	         {"total_ms", r->total_ms},     {"prefill_tps", r->prefill_tps},
	         {"decode_tps", r->decode_tps}};
	for (size_t i = 0; i < CM_ARRAY_LEN(t); i++) {
		printf("%s\"%s\":", i ? "," : "", t[i].k);
		json_num(stdout, t[i].v);
	}
	printf("}}\n");
}

/* ---- argument helpers ----------------------------------------------------- */

/* Read all of stdin ("-" arguments). */
static char *read_stdin(void)
{
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t r = fread(buf + n, 1, cap - n - 1, stdin);
		n += r;
		if (r == 0)
			break;
		if (cap - n - 1 == 0) {
			char *nb = realloc(buf, cap *= 2);
			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	if (buf)
		buf[n] = '\0';
	return buf;
}

/* Join argv[from..argc) with spaces; "-" alone reads stdin. */
static char *text_arg(int argc, char **argv, int from)
{
	if (argc - from == 1 && strcmp(argv[from], "-") == 0)
		return read_stdin();
	size_t len = 1;
	for (int i = from; i < argc; i++)
		len += strlen(argv[i]) + 1;
	char *s = malloc(len);
	if (!s)
		return NULL;
	s[0] = '\0';
	for (int i = from; i < argc; i++) {
		if (i > from)
			strcat(s, " ");
		strcat(s, argv[i]);
	}
	return s;
}

static int connect_or_fail(edgelm_client **c)
{
	struct edgelm_error e;
	int rc = edgelm_connect(G.socket, c, &e);
	if (rc)
		return fail(rc, &e);
	edgelm_set_timeout(*c, G.timeout_ms);
	return 0;
}

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* SIGINT stops a streaming generation (the library cancels it). */
static void sigint_catch(bool on)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on ? on_sigint : SIG_DFL;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
}

/* ---- generation options (generate and chat) ------------------------------- */

struct gen_opts {
	struct edgelm_params p;
	const char *stop[MAX_STOP];
	int stream; /* -1: decide by isatty */
	bool stats;
	const char *system;
};

enum {
	OPT_TEMP = 256,
	OPT_TOPK,
	OPT_TOPP,
	OPT_MINP,
	OPT_REPEAT,
	OPT_SEED,
	OPT_STOP,
	OPT_STREAM,
	OPT_NOSTREAM,
	OPT_ID,
	OPT_DEADLINE,
	OPT_PRIORITY,
	OPT_STATS,
	OPT_SYSTEM,
	OPT_NOSPECIAL,
	OPT_PARSESPECIAL,
	OPT_VERSION,
};

static const struct option gen_longopts[] = {
    {"max-tokens", required_argument, NULL, 'n'},
    {"temp", required_argument, NULL, OPT_TEMP},
    {"top-k", required_argument, NULL, OPT_TOPK},
    {"top-p", required_argument, NULL, OPT_TOPP},
    {"min-p", required_argument, NULL, OPT_MINP},
    {"repeat-penalty", required_argument, NULL, OPT_REPEAT},
    {"seed", required_argument, NULL, OPT_SEED},
    {"stop", required_argument, NULL, OPT_STOP},
    {"stream", no_argument, NULL, OPT_STREAM},
    {"no-stream", no_argument, NULL, OPT_NOSTREAM},
    {"id", required_argument, NULL, OPT_ID},
    {"deadline", required_argument, NULL, OPT_DEADLINE},
    {"priority", required_argument, NULL, OPT_PRIORITY},
    {"stats", no_argument, NULL, OPT_STATS},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Parse generate/chat options; returns -1 to go on, else an exit code. */
static int gen_opts_parse(const char *cmd, int argc, char **argv, struct gen_opts *o)
{
	memset(o, 0, sizeof(*o));
	edgelm_params_init(&o->p);
	o->stream = -1;
	long v;
	double d;
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+n:h", gen_longopts, NULL)) != -1) {
		switch (ch) {
		case 'n':
			if (tools_parse_long(optarg, 1, INT32_MAX, &v) != 0)
				return usage_error(cmd, "-n: '%s' is not a positive count", optarg);
			o->p.max_tokens = (int32_t)v;
			break;
		case OPT_TEMP:
		case OPT_TOPP:
		case OPT_MINP:
		case OPT_REPEAT:
			if (tools_parse_double(optarg, -HUGE_VAL, HUGE_VAL, &d) != 0)
				return usage_error(cmd, "'%s' is not a number", optarg);
			if (ch == OPT_TEMP)
				o->p.temperature = (float)d;
			else if (ch == OPT_TOPP)
				o->p.top_p = (float)d;
			else if (ch == OPT_MINP)
				o->p.min_p = (float)d;
			else
				o->p.repeat_penalty = (float)d;
			break;
		case OPT_TOPK:
			if (tools_parse_long(optarg, 0, INT32_MAX, &v) != 0)
				return usage_error(cmd, "--top-k: '%s' is not a count", optarg);
			o->p.top_k = (int32_t)v;
			break;
		case OPT_SEED:
			if (tools_parse_long(optarg, 0, LONG_MAX, &v) != 0)
				return usage_error(cmd, "--seed: '%s' is not a seed", optarg);
			o->p.has_seed = true;
			o->p.seed = (uint64_t)v;
			break;
		case OPT_STOP:
			if (o->p.n_stop == MAX_STOP)
				return usage_error(cmd, "at most %d --stop strings", MAX_STOP);
			o->stop[o->p.n_stop++] = optarg;
			o->p.stop = o->stop;
			break;
		case OPT_STREAM:
			o->stream = 1;
			break;
		case OPT_NOSTREAM:
			o->stream = 0;
			break;
		case OPT_ID:
			o->p.id = optarg;
			break;
		case OPT_DEADLINE:
			if (tools_parse_long(optarg, 1, 86400000, &v) != 0)
				return usage_error(cmd, "--deadline: '%s' is not a time in ms",
				                   optarg);
			o->p.deadline_ms = v;
			break;
		case OPT_PRIORITY:
			if (tools_parse_long(optarg, -10, 10, &v) != 0)
				return usage_error(cmd, "--priority: '%s' is not in -10..10",
				                   optarg);
			o->p.priority = (int32_t)v;
			break;
		case OPT_STATS:
			o->stats = true;
			break;
		case OPT_SYSTEM:
			o->system = optarg;
			break;
		case 'h':
			usage_command(cmd, stdout);
			return EXIT_OK;
		default:
			return usage_error(cmd, "bad option");
		}
	}
	return -1;
}

struct stream_out {
	bool json;
	bool any;
	char last;
};

static int stream_cb(const char *text, size_t len, void *user)
{
	struct stream_out *so = user;
	if (so->json) {
		printf("{\"text\":");
		tools_json_strn(stdout, text, len);
		printf("}\n");
	} else {
		fwrite(text, 1, len, stdout);
	}
	fflush(stdout);
	if (len) {
		so->any = true;
		so->last = text[len - 1];
	}
	return interrupted ? 1 : 0;
}

/* ---- commands ------------------------------------------------------------- */

static int cmd_generate(int argc, char **argv)
{
	struct gen_opts o;
	int r = gen_opts_parse("generate", argc, argv, &o);
	if (r >= 0)
		return r;
	if (optind >= argc)
		return usage_error("generate", "generate needs a TEXT");
	if (o.system)
		return usage_error("generate", "--system is for chat");
	char *prompt = text_arg(argc, argv, optind);
	if (!prompt) {
		fprintf(stderr, "edgelmctl: cannot read the prompt\n");
		return EXIT_USAGE;
	}
	bool stream = o.stream >= 0 ? o.stream : isatty(STDOUT_FILENO) && !G.json;
	edgelm_client *c = NULL;
	int rc = connect_or_fail(&c);
	if (rc) {
		free(prompt);
		return rc;
	}
	struct edgelm_result res;
	struct edgelm_error e;
	struct stream_out so = {.json = G.json};
	if (stream) {
		sigint_catch(true);
		rc = edgelm_generate_stream(c, prompt, &o.p, stream_cb, &so, &res, &e);
		sigint_catch(false);
	} else {
		rc = edgelm_generate(c, prompt, &o.p, &res, &e);
	}
	int code;
	if (rc == 0) {
		if (G.json)
			print_result_json(&res);
		else if (!stream)
			fwrite(res.text, 1, res.text_len, stdout);
		if (!G.json && (stream ? so.any && so.last != '\n'
		                       : res.text_len && res.text[res.text_len - 1] != '\n'))
			putchar('\n');
		if (o.stats)
			print_stats(&res);
		code = EXIT_OK;
	} else {
		if (stream && so.any && !G.json)
			putchar('\n');
		code = fail(rc, &e);
	}
	edgelm_result_free(&res);
	edgelm_close(c);
	free(prompt);
	return code;
}

struct history {
	struct edgelm_message *m;
	char **owned;
	size_t n, cap;
};

static int history_add(struct history *h, const char *role, const char *content)
{
	if (h->n == h->cap) {
		size_t nc = h->cap ? h->cap * 2 : 16;
		struct edgelm_message *m = realloc(h->m, nc * sizeof(*m));
		if (!m)
			return -1;
		h->m = m;
		char **o = realloc(h->owned, nc * sizeof(*o));
		if (!o)
			return -1;
		h->owned = o;
		h->cap = nc;
	}
	char *dup = strdup(content);
	if (!dup)
		return -1;
	h->owned[h->n] = dup;
	h->m[h->n].role = role;
	h->m[h->n].content = dup;
	h->n++;
	return 0;
}

static void history_truncate(struct history *h, size_t n)
{
	while (h->n > n)
		free(h->owned[--h->n]);
}

static int cmd_chat(int argc, char **argv)
{
	struct gen_opts o;
	int r = gen_opts_parse("chat", argc, argv, &o);
	if (r >= 0)
		return r;
	if (optind < argc)
		return usage_error("chat", "chat reads its messages from stdin");
	bool tty = isatty(STDIN_FILENO);
	bool stream = o.stream >= 0 ? o.stream : true;
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code)
		return code;
	struct history h = {0};
	size_t base = 0;
	if (o.system) {
		if (history_add(&h, "system", o.system))
			return fail(EDGELM_E_NOMEM, &(struct edgelm_error){.retry_after_ms = -1});
		base = 1;
	}
	if (tty)
		fprintf(stderr, "chat with edgelmd: /reset forgets, /quit or Ctrl-D ends\n");
	char *line = NULL;
	size_t cap = 0;
	for (;;) {
		if (tty) {
			fputs("> ", stderr);
			fflush(stderr);
		}
		ssize_t n = getline(&line, &cap, stdin);
		if (n < 0)
			break;
		while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
			line[--n] = '\0';
		if (n == 0)
			continue;
		if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0)
			break;
		if (strcmp(line, "/reset") == 0) {
			history_truncate(&h, base);
			if (tty)
				fprintf(stderr, "(conversation forgotten)\n");
			continue;
		}
		size_t before = h.n;
		if (history_add(&h, "user", line)) {
			code = fail(EDGELM_E_NOMEM, &(struct edgelm_error){.retry_after_ms = -1});
			break;
		}
		struct edgelm_result res;
		struct edgelm_error e;
		struct stream_out so = {.json = G.json};
		interrupted = 0;
		sigint_catch(stream);
		int rc = edgelm_chat(c, h.m, h.n, &o.p, stream ? stream_cb : NULL, &so, &res, &e);
		sigint_catch(false);
		if (rc == 0 || rc == EDGELM_E_ABORTED) {
			if (G.json && rc == 0)
				print_result_json(&res);
			else if (!stream)
				fwrite(res.text, 1, res.text_len, stdout);
			if (!G.json)
				putchar('\n');
			fflush(stdout);
			if (o.stats && rc == 0)
				print_stats(&res);
			/* keep what the user saw, also when interrupted */
			if (history_add(&h, "assistant", res.text ? res.text : ""))
				rc = EDGELM_E_NOMEM;
		}
		edgelm_result_free(&res);
		if (rc != 0 && rc != EDGELM_E_ABORTED) {
			if (stream && so.any && !G.json)
				putchar('\n');
			code = fail(rc, &e);
			history_truncate(&h, before); /* the turn failed: try again */
			if (!tty)
				break;
			code = EXIT_OK;
		}
	}
	free(line);
	history_truncate(&h, 0);
	free(h.m);
	free(h.owned);
	edgelm_close(c);
	return code;
}

static void print_labels(const struct ipc_metric *m)
{
	if (!m->n_labels)
		return;
	putchar('{');
	for (size_t k = 0; k < m->n_labels; k++)
		printf("%s%s=\"%s\"", k ? "," : "", m->labels[k].name, m->labels[k].value);
	putchar('}');
}

static void print_label_obj(json_t *labels)
{
	const char *k;
	json_t *v;
	bool first = true;
	if (!json_is_object(labels) || json_object_size(labels) == 0)
		return;
	putchar('{');
	json_object_foreach(labels, k, v)
	{
		printf("%s%s=\"%s\"", first ? "" : ",", k,
		       json_is_string(v) ? json_string_value(v) : "");
		first = false;
	}
	putchar('}');
}

/* " value\n" in the shortest form that reads back exactly. */
static void print_number(double x)
{
	char buf[40];
	if (!isfinite(x)) {
		printf(" %s\n", isnan(x) ? "NaN" : x > 0 ? "+Inf" : "-Inf");
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, x);
		if (strtod(buf, NULL) == x)
			break;
	}
	printf(" %s\n", buf);
}

static void print_value(json_t *v)
{
	print_number(json_is_number(v) ? json_number_value(v) : NAN);
}

/* The monitor's document (docs/monitor.md): one line per series, histograms
 * as _count and _sum, then the flags that are on. */
static void print_metrics_doc(const char *doc)
{
	json_error_t jerr;
	json_t *root = json_loads(doc, 0, &jerr);
	json_t *fams = root ? json_object_get(root, "metrics") : NULL;
	const char *name;
	json_t *fam;
	if (!json_is_object(fams)) {
		printf("%s\n", doc);
		json_decref(root);
		return;
	}
	json_object_foreach(fams, name, fam)
	{
		json_t *series = json_object_get(fam, "series");
		size_t i;
		json_t *sr;
		json_array_foreach(series, i, sr)
		{
			json_t *labels = json_object_get(sr, "labels");
			if (json_object_get(sr, "buckets")) {
				printf("%s_count", name);
				print_label_obj(labels);
				print_value(json_object_get(sr, "count"));
				printf("%s_sum", name);
				print_label_obj(labels);
				print_value(json_object_get(sr, "sum"));
			} else {
				printf("%s", name);
				print_label_obj(labels);
				print_value(json_object_get(sr, "value"));
			}
		}
	}
	json_t *flags = json_object_get(root, "flags");
	json_t *f;
	json_object_foreach(flags, name, f)
	{
		if (json_is_true(json_object_get(f, "on"))) {
			json_t *reason = json_object_get(f, "reason");
			printf("# flag %s: %s\n", name,
			       json_is_string(reason) ? json_string_value(reason) : "on");
		}
	}
	json_decref(root);
}

/* info, health and metrics: --json prints the daemon's reply as it is. */
static int cmd_status(const char *cmd, int argc, char **argv)
{
	static const struct option lo[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == 'h') {
			usage_command(cmd, stdout);
			return EXIT_OK;
		}
		return usage_error(cmd, "bad option");
	}
	if (optind < argc)
		return usage_error(cmd, "%s takes no arguments", cmd);
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code)
		return code;
	char *json = NULL;
	struct edgelm_error e;
	enum edgelm_health h = EDGELM_HEALTH_LOADING;
	enum ipc_op op;
	int rc;
	if (strcmp(cmd, "info") == 0) {
		op = IPC_OP_INFO;
		rc = edgelm_info(c, &json, &e);
	} else if (strcmp(cmd, "health") == 0) {
		op = IPC_OP_HEALTH;
		rc = edgelm_health(c, &h, &json, &e);
	} else {
		op = IPC_OP_METRICS;
		rc = edgelm_metrics(c, &json, &e);
	}
	edgelm_close(c);
	if (rc) {
		code = fail(rc, &e);
		/* a daemon that is going away is not ready */
		if (op == IPC_OP_HEALTH &&
		    (rc == EDGELM_E_SHUTTING_DOWN || rc == EDGELM_E_NOT_READY))
			code = EXIT_NOT_READY;
		return code;
	}
	if (op == IPC_OP_HEALTH && h != EDGELM_HEALTH_READY)
		code = EXIT_NOT_READY;
	if (G.json) {
		printf("%s\n", json);
		edgelm_free(json);
		return code;
	}
	struct ipc_reply *r = NULL;
	struct cm_err err;
	if (ipc_reply_decode(json, strlen(json), op, &r, &err) != 0) {
		fprintf(stderr, "edgelmctl: %s\n", err.msg);
		edgelm_free(json);
		return EXIT_SERVER;
	}
	if (op == IPC_OP_INFO) {
		const struct ipc_info_reply *in = &r->u.info;
#define S(x) ((x) ? (x) : "-")
		printf("model:        %s\n", S(in->model));
		printf("architecture: %s\n", S(in->architecture));
		printf("quant types: ");
		for (size_t i = 0; i < in->n_quant_types; i++)
			printf(" %s", in->quant_types[i]);
		printf("\ncontext:      %lld tokens\n", (long long)in->n_ctx);
		printf("vocabulary:   %lld tokens\n", (long long)in->n_vocab);
		printf("isa:          %s\n", S(in->isa));
		printf("kernels:      %s\n", S(in->kernels));
		printf("threads:      %d\n", in->threads);
		printf("tuning:       %s\n", S(in->tuning_json));
		printf("version:      %s\n", S(in->version));
#undef S
	} else if (op == IPC_OP_HEALTH) {
		printf("%s", ipc_health_name(r->u.health.status));
		for (size_t i = 0; i < r->u.health.n_reasons; i++)
			printf("%s%s", i ? "; " : ": ", r->u.health.reasons[i]);
		putchar('\n');
	} else if (r->u.metrics.json) {
		print_metrics_doc(r->u.metrics.json);
	} else {
		for (size_t i = 0; i < r->u.metrics.n_items; i++) {
			const struct ipc_metric *m = &r->u.metrics.items[i];
			printf("%s", m->name ? m->name : "?");
			print_labels(m);
			print_number(m->value);
		}
	}
	ipc_reply_free(r);
	edgelm_free(json);
	return code;
}

static int cmd_tokenize(int argc, char **argv)
{
	static const struct option lo[] = {{"no-special", no_argument, NULL, OPT_NOSPECIAL},
	                                   {"parse-special", no_argument, NULL, OPT_PARSESPECIAL},
	                                   {"help", no_argument, NULL, 'h'},
	                                   {NULL, 0, NULL, 0}};
	bool add_special = true, parse_special = false;
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == OPT_NOSPECIAL)
			add_special = false;
		else if (ch == OPT_PARSESPECIAL)
			parse_special = true;
		else if (ch == 'h') {
			usage_command("tokenize", stdout);
			return EXIT_OK;
		} else
			return usage_error("tokenize", "bad option");
	}
	if (optind >= argc)
		return usage_error("tokenize", "tokenize needs a TEXT");
	char *text = text_arg(argc, argv, optind);
	if (!text)
		return EXIT_USAGE;
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code) {
		free(text);
		return code;
	}
	int32_t *ids = NULL;
	size_t n = 0;
	struct edgelm_error e;
	int rc = edgelm_tokenize(c, text, add_special, parse_special, &ids, &n, &e);
	edgelm_close(c);
	free(text);
	if (rc)
		return fail(rc, &e);
	if (G.json)
		printf("{\"ok\":true,\"count\":%zu,\"ids\":[", n);
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? (G.json ? "," : " ") : "", ids[i]);
	printf(G.json ? "]}\n" : "\n");
	edgelm_free(ids);
	return EXIT_OK;
}

static int cmd_detokenize(int argc, char **argv)
{
	static const struct option lo[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == 'h') {
			usage_command("detokenize", stdout);
			return EXIT_OK;
		}
		return usage_error("detokenize", "bad option");
	}
	if (optind >= argc)
		return usage_error("detokenize", "detokenize needs token ids");
	size_t n = (size_t)(argc - optind);
	int32_t *ids = calloc(n, sizeof(*ids));
	if (!ids)
		return EXIT_USAGE;
	for (size_t i = 0; i < n; i++) {
		long v;
		if (tools_parse_long(argv[optind + (int)i], 0, INT32_MAX, &v) != 0) {
			free(ids);
			return usage_error("detokenize", "'%s' is not a token id",
			                   argv[optind + (int)i]);
		}
		ids[i] = (int32_t)v;
	}
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code) {
		free(ids);
		return code;
	}
	char *text = NULL;
	struct edgelm_error e;
	int rc = edgelm_detokenize(c, ids, n, &text, &e);
	edgelm_close(c);
	free(ids);
	if (rc)
		return fail(rc, &e);
	if (G.json) {
		printf("{\"ok\":true,\"text\":");
		tools_json_strn(stdout, text, strlen(text));
		printf("}\n");
	} else {
		printf("%s\n", text);
	}
	edgelm_free(text);
	return EXIT_OK;
}

static int cmd_cancel(int argc, char **argv)
{
	static const struct option lo[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == 'h') {
			usage_command("cancel", stdout);
			return EXIT_OK;
		}
		return usage_error("cancel", "bad option");
	}
	if (argc - optind != 1)
		return usage_error("cancel", "cancel needs one ID");
	const char *id = argv[optind];
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code)
		return code;
	bool cancelled = false;
	struct edgelm_error e;
	int rc = edgelm_cancel(c, id, &cancelled, &e);
	edgelm_close(c);
	if (rc)
		return fail(rc, &e);
	if (G.json)
		printf("{\"ok\":true,\"cancelled\":%s}\n", cancelled ? "true" : "false");
	else
		printf(cancelled ? "%s: cancelled\n" : "%s: had already finished\n", id);
	return EXIT_OK;
}

/* `top`: the monitor's frame renderer fed by the metrics op. */
static int top_fetch(void *ud, char **ret_json, struct cm_err *err)
{
	edgelm_client *c = ud;
	struct edgelm_error e;
	char *reply = NULL;
	int rc = edgelm_metrics(c, &reply, &e);
	if (rc != 0)
		return cm_err_set(err, -EIO, "%s", e.message);
	json_t *root = json_loads(reply, 0, NULL);
	edgelm_free(reply);
	json_t *doc = root ? json_object_get(root, "metrics") : NULL;
	char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(root);
	if (!text)
		return cm_err_set(err, -EPROTO, "the daemon's metrics are not a monitor document");
	*ret_json = cm_strdup(text);
	free(text);
	return *ret_json ? 0 : cm_err_set(err, -ENOMEM, "out of memory");
}

static int cmd_top(int argc, char **argv)
{
	long interval = 1000;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage_command("top", stdout);
			return EXIT_OK;
		}
		if (strcmp(argv[i], "--interval") == 0 && i + 1 < argc) {
			char *end;
			interval = strtol(argv[++i], &end, 10);
			if (*end || interval < 100 || interval > 60000)
				return usage_error("top", "--interval wants 100..60000 ms");
			continue;
		}
		return usage_error("top", "unknown argument '%s'", argv[i]);
	}
	edgelm_client *c = NULL;
	int code = connect_or_fail(&c);
	if (code)
		return code;
	struct cm_err err = {0};
	int rc = monitor_top_run(top_fetch, c, (unsigned)interval, STDIN_FILENO, STDOUT_FILENO,
				 &err);
	edgelm_close(c);
	if (rc) {
		fprintf(stderr, "edgelmctl: top: %s\n", err.msg);
		return EXIT_SERVER;
	}
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
	    {"socket", required_argument, NULL, 's'},    {"json", no_argument, NULL, 'j'},
	    {"timeout", required_argument, NULL, 't'},   {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, OPT_VERSION}, {NULL, 0, NULL, 0},
	};
	int ch;
	long v;
	/* "+": options end at the command; its own options follow it */
	while ((ch = getopt_long(argc, argv, "+s:jt:h", lo, NULL)) != -1) {
		switch (ch) {
		case 's':
			G.socket = optarg;
			break;
		case 'j':
			G.json = true;
			break;
		case 't':
			if (tools_parse_long(optarg, 0, INT32_MAX, &v) != 0)
				return usage_error(NULL, "--timeout: '%s' is not a time in ms",
				                   optarg);
			G.timeout_ms = (int)v;
			break;
		case 'h':
			usage_main(stdout);
			return EXIT_OK;
		case OPT_VERSION:
			printf("edgelmctl %s\n", edgelm_version());
			return EXIT_OK;
		default:
			return usage_error(NULL, "bad option");
		}
	}
	if (optind >= argc) {
		usage_main(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[optind];
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	if (strcmp(cmd, "help") == 0) {
		if (sub_argc < 2) {
			usage_main(stdout);
			return EXIT_OK;
		}
		if (usage_command(sub_argv[1], stdout) != 0)
			return usage_error(NULL, "no command '%s'", sub_argv[1]);
		return EXIT_OK;
	}
	/* a broken pipe (edgelmctl ... | head) ends the program quietly */
	signal(SIGPIPE, SIG_DFL);
	if (strcmp(cmd, "generate") == 0)
		return cmd_generate(sub_argc, sub_argv);
	if (strcmp(cmd, "chat") == 0)
		return cmd_chat(sub_argc, sub_argv);
	if (strcmp(cmd, "info") == 0 || strcmp(cmd, "health") == 0 || strcmp(cmd, "metrics") == 0)
		return cmd_status(cmd, sub_argc, sub_argv);
	if (strcmp(cmd, "tokenize") == 0)
		return cmd_tokenize(sub_argc, sub_argv);
	if (strcmp(cmd, "detokenize") == 0)
		return cmd_detokenize(sub_argc, sub_argv);
	if (strcmp(cmd, "cancel") == 0)
		return cmd_cancel(sub_argc, sub_argv);
	if (strcmp(cmd, "top") == 0)
		return cmd_top(sub_argc, sub_argv);
	return usage_error(NULL, "no command '%s'", cmd);
}
