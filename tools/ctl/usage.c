/* tools/ctl/usage.c: edgelmctl's help texts, usage errors and the TEXT|-
 * arguments of generate and tokenize. */
#include "tools/ctl/ctl.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

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
     "      --grammar-file FILE  the text must match this GBNF grammar\n"
     "      --json-schema FILE   the text is JSON valid under this JSON Schema\n"
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
     "  --min-p, --repeat-penalty, --seed, --stop, --grammar-file, --json-schema,\n"
     "  --stats)\n"},
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
    {"embed", "embed [--pooling NAME] [--truncate] TEXT...|-",
     "The embedding of each TEXT (\"-\": each non-empty line of stdin): a unit\n"
     "vector of the model's embedding length, one line of values per text.\n"
     "      --pooling NAME     mean, cls or last (default: the model's, else mean)\n"
     "      --truncate         cut a text longer than the context instead of failing\n"
     "With --json, one object: {\"ok\":true,\"dim\":N,\"embeddings\":[{\"tokens\":..,\n"
     "\"embedding\":[...]},...]}.\n"},
    {"metrics", "metrics", "The daemon's metrics (the figures the monitor exports).\n"},
    {"cancel", "cancel ID", "Cancel the generation named ID.\n"},
    {"top", "top [--interval MS]",
     "A live view of the daemon and the box: per-core CPU, memory, swap,\n"
     "pressure, tokens/s, queue and bottleneck flags, redrawn every second.\n"
     "q or Ctrl-C quits.\n"
     "      --interval MS      redraw period (default 1000)\n"},
};

void ctl_usage_main(FILE *f)
{
	fprintf(f, "usage: edgelmctl [--socket URL]... [TLS options] [--json] [--timeout MS]\n"
	           "                 COMMAND [ARGS]\n\n"
	           "Talk to edgelmd, the local LLM daemon.\n\n"
	           "Commands:\n");
	for (size_t i = 0; i < CM_ARRAY_LEN(helps); i++)
		fprintf(f, "  %s\n", helps[i].usage);
	fprintf(f,
	        "\nOptions:\n"
	        "  -s, --socket URL   the daemon's socket (default: $EDGELM_SOCKET, else\n"
	        "                     %s); repeat it, or give a\n"
	        "                     comma-separated list, for several daemons: each\n"
	        "                     request goes to one that is up\n"
	        "      --tls-ca FILE  for tls+tcp://: the CA that signed the daemons'\n"
	        "                     certificates (default: $EDGELM_TLS_CA)\n"
	        "      --tls-cert FILE, --tls-key FILE\n"
	        "                     this client's certificate and key (default:\n"
	        "                     $EDGELM_TLS_CERT, $EDGELM_TLS_KEY)\n"
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

int ctl_usage_command(const char *name, FILE *f)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(helps); i++) {
		if (strcmp(helps[i].name, name) == 0) {
			fprintf(f, "usage: edgelmctl %s\n\n%s", helps[i].usage, helps[i].text);
			return 0;
		}
	}
	return -1;
}

int ctl_usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fputs("edgelmctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'edgelmctl %s%s--help'.\n", cmd ? cmd : "", cmd ? " " : "");
	return EXIT_USAGE;
}

int ctl_parse_help_only(const char *cmd, int argc, char **argv)
{
	static const struct option lo[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == 'h') {
			ctl_usage_command(cmd, stdout);
			return EXIT_OK;
		}
		return ctl_usage_error(cmd, "bad option");
	}
	return -1;
}

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

char *ctl_text_arg(int argc, char **argv, int from)
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
