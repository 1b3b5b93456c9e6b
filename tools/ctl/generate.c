/* tools/ctl/generate.c: edgelmctl generate and chat: their options, the
 * streamed output, and chat's conversation loop. */
#include "tools/ctl/ctl.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_STOP 16
/* the protocol's bound of a grammar and of a schema (IPC_MAX_GRAMMAR_BYTES) */
#define MAX_GRAMMAR_FILE ((size_t)64 << 10)

static volatile sig_atomic_t interrupted;

struct gen_opts {
	struct edgelm_params p;
	const char *stop[MAX_STOP];
	int stream; /* -1: decide by isatty */
	bool stats;
	const char *system;
	const char *grammar_file, *schema_file;
	char *grammar, *schema; /* their text, once read (gen_opts_load) */
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
	OPT_GRAMMAR_FILE,
	OPT_JSON_SCHEMA,
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
    {"grammar-file", required_argument, NULL, OPT_GRAMMAR_FILE},
    {"json-schema", required_argument, NULL, OPT_JSON_SCHEMA},
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
				return ctl_usage_error(cmd, "-n: '%s' is not a positive count",
				                       optarg);
			o->p.max_tokens = (int32_t)v;
			break;
		case OPT_TEMP:
		case OPT_TOPP:
		case OPT_MINP:
		case OPT_REPEAT:
			if (tools_parse_double(optarg, -HUGE_VAL, HUGE_VAL, &d) != 0)
				return ctl_usage_error(cmd, "'%s' is not a number", optarg);
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
				return ctl_usage_error(cmd, "--top-k: '%s' is not a count", optarg);
			o->p.top_k = (int32_t)v;
			break;
		case OPT_SEED:
			if (tools_parse_long(optarg, 0, LONG_MAX, &v) != 0)
				return ctl_usage_error(cmd, "--seed: '%s' is not a seed", optarg);
			o->p.has_seed = true;
			o->p.seed = (uint64_t)v;
			break;
		case OPT_STOP:
			if (o->p.n_stop == MAX_STOP)
				return ctl_usage_error(cmd, "at most %d --stop strings", MAX_STOP);
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
				return ctl_usage_error(cmd, "--deadline: '%s' is not a time in ms",
				                       optarg);
			o->p.deadline_ms = v;
			break;
		case OPT_PRIORITY:
			if (tools_parse_long(optarg, -10, 10, &v) != 0)
				return ctl_usage_error(cmd, "--priority: '%s' is not in -10..10",
				                       optarg);
			o->p.priority = (int32_t)v;
			break;
		case OPT_STATS:
			o->stats = true;
			break;
		case OPT_SYSTEM:
			o->system = optarg;
			break;
		case OPT_GRAMMAR_FILE:
			o->grammar_file = optarg;
			break;
		case OPT_JSON_SCHEMA:
			o->schema_file = optarg;
			break;
		case 'h':
			ctl_usage_command(cmd, stdout);
			return EXIT_OK;
		default:
			return ctl_usage_error(cmd, "bad option");
		}
	}
	if (o->grammar_file && o->schema_file)
		return ctl_usage_error(cmd, "--grammar-file and --json-schema exclude each other");
	return -1;
}

/* Read the files the options name: -1 to go on, else the exit code after
 * saying why. The daemon checks what they hold. */
static int gen_opts_load(const char *cmd, struct gen_opts *o)
{
	struct cm_err err = {0};
	if ((o->grammar_file && tools_read_file(o->grammar_file, MAX_GRAMMAR_FILE, &o->grammar,
	                                        NULL, &err) != 0) ||
	    (o->schema_file &&
	     tools_read_file(o->schema_file, MAX_GRAMMAR_FILE, &o->schema, NULL, &err) != 0)) {
		fprintf(stderr, "edgelmctl %s: %s\n", cmd, err.msg);
		return EXIT_USAGE;
	}
	o->p.grammar = o->grammar;
	o->p.json_schema = o->schema;
	return -1;
}

static void gen_opts_free(struct gen_opts *o)
{
	cm_free(o->grammar);
	cm_free(o->schema);
}

/* ---- streaming ------------------------------------------------------------ */

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

/* ---- generate ------------------------------------------------------------- */

int ctl_cmd_generate(int argc, char **argv)
{
	struct gen_opts o;
	int r = gen_opts_parse("generate", argc, argv, &o);
	if (r >= 0)
		return r;
	if (optind >= argc)
		return ctl_usage_error("generate", "generate needs a TEXT");
	if (o.system)
		return ctl_usage_error("generate", "--system is for chat");
	if ((r = gen_opts_load("generate", &o)) >= 0)
		return r;
	char *prompt = ctl_text_arg(argc, argv, optind);
	if (!prompt) {
		fprintf(stderr, "edgelmctl: cannot read the prompt\n");
		gen_opts_free(&o);
		return EXIT_USAGE;
	}
	bool stream = o.stream >= 0 ? o.stream : isatty(STDOUT_FILENO) && !ctl_g.json;
	edgelm_client *c = NULL;
	int rc = ctl_connect(&c);
	if (rc) {
		free(prompt);
		gen_opts_free(&o);
		return rc;
	}
	struct edgelm_result res;
	struct edgelm_error e;
	struct stream_out so = {.json = ctl_g.json};
	if (stream) {
		sigint_catch(true);
		rc = edgelm_generate_stream(c, prompt, &o.p, stream_cb, &so, &res, &e);
		sigint_catch(false);
	} else {
		rc = edgelm_generate(c, prompt, &o.p, &res, &e);
	}
	int code;
	if (rc == 0) {
		if (ctl_g.json)
			ctl_print_result_json(&res);
		else if (!stream)
			fwrite(res.text, 1, res.text_len, stdout);
		if (!ctl_g.json && (stream ? so.any && so.last != '\n'
		                           : res.text_len && res.text[res.text_len - 1] != '\n'))
			putchar('\n');
		if (o.stats)
			ctl_print_stats(&res);
		code = EXIT_OK;
	} else {
		if (stream && so.any && !ctl_g.json)
			putchar('\n');
		code = ctl_fail(rc, &e);
	}
	edgelm_result_free(&res);
	edgelm_close(c);
	free(prompt);
	gen_opts_free(&o);
	return code;
}

/* ---- chat ----------------------------------------------------------------- */

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

static int fail_nomem(void)
{
	return ctl_fail(EDGELM_E_NOMEM, &(struct edgelm_error){.retry_after_ms = -1});
}

/* One user message: the whole conversation goes to the daemon, the reply is
 * printed and kept. Returns -1 to read the next line, else the exit code. */
static int chat_turn(edgelm_client *c, const struct gen_opts *o, bool stream, bool tty,
                     struct history *h, const char *line)
{
	size_t before = h->n;
	if (history_add(h, "user", line))
		return fail_nomem();
	struct edgelm_result res;
	struct edgelm_error e;
	struct stream_out so = {.json = ctl_g.json};
	interrupted = 0;
	sigint_catch(stream);
	int rc = edgelm_chat(c, h->m, h->n, &o->p, stream ? stream_cb : NULL, &so, &res, &e);
	sigint_catch(false);
	if (rc == 0 || rc == EDGELM_E_ABORTED) {
		if (ctl_g.json && rc == 0)
			ctl_print_result_json(&res);
		else if (!stream)
			fwrite(res.text, 1, res.text_len, stdout);
		if (!ctl_g.json)
			putchar('\n');
		fflush(stdout);
		if (o->stats && rc == 0)
			ctl_print_stats(&res);
		/* keep what the user saw, also when interrupted */
		if (history_add(h, "assistant", res.text ? res.text : ""))
			rc = EDGELM_E_NOMEM;
	}
	edgelm_result_free(&res);
	if (rc != 0 && rc != EDGELM_E_ABORTED) {
		if (stream && so.any && !ctl_g.json)
			putchar('\n');
		int code = ctl_fail(rc, &e);
		history_truncate(h, before); /* the turn failed: try again */
		if (!tty)
			return code;
	}
	return -1;
}

int ctl_cmd_chat(int argc, char **argv)
{
	struct gen_opts o;
	int r = gen_opts_parse("chat", argc, argv, &o);
	if (r >= 0)
		return r;
	if (optind < argc)
		return ctl_usage_error("chat", "chat reads its messages from stdin");
	if ((r = gen_opts_load("chat", &o)) >= 0)
		return r;
	bool tty = isatty(STDIN_FILENO);
	bool stream = o.stream >= 0 ? o.stream : true;
	edgelm_client *c = NULL;
	int code = ctl_connect(&c);
	if (code) {
		gen_opts_free(&o);
		return code;
	}
	struct history h = {0};
	size_t base = 0;
	if (o.system) {
		if (history_add(&h, "system", o.system))
			return fail_nomem();
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
		int turn = chat_turn(c, &o, stream, tty, &h, line);
		if (turn >= 0) {
			code = turn;
			break;
		}
	}
	free(line);
	history_truncate(&h, 0);
	free(h.m);
	free(h.owned);
	edgelm_close(c);
	gen_opts_free(&o);
	return code;
}
