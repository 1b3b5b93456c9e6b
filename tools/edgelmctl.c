/* tools/edgelmctl.c: the command-line client of edgelmd, built on libedgelm.
 *
 *   edgelmctl [--socket URL]... [--tls-ca FILE] [--json] [--timeout MS] COMMAND [ARGS]
 *
 * Exit codes: 0 ok, 1 usage, 2 the daemon returned an error, 3 cannot connect
 * or no reply in time, 4 the daemon is not ready (health), 130 interrupted.
 *
 * This file holds main: the global options and the command table. The
 * commands live in tools/ctl/ (ctl.h lists which file holds what). */
#include "tools/ctl/ctl.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <signal.h>
#include <string.h>

static const struct {
	const char *name;
	int (*fn)(int argc, char **argv);
} commands[] = {
    {"generate", ctl_cmd_generate},     {"chat", ctl_cmd_chat},      {"info", ctl_cmd_status},
    {"health", ctl_cmd_status},         {"metrics", ctl_cmd_status}, {"tokenize", ctl_cmd_tokenize},
    {"detokenize", ctl_cmd_detokenize}, {"cancel", ctl_cmd_cancel},  {"top", ctl_cmd_top},
    {"embed", ctl_cmd_embed},
};

/* The options before COMMAND into ctl_g; -1 to go on (optind at COMMAND),
 * else the exit code. */
static int parse_globals(int argc, char **argv)
{
	enum { OPT_VERSION = 256, OPT_TLS_CERT, OPT_TLS_KEY, OPT_TLS_CA };
	static const struct option lo[] = {
	    {"socket", required_argument, NULL, 's'},
	    {"json", no_argument, NULL, 'j'},
	    {"timeout", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, OPT_VERSION},
	    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
	    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
	    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
	    {NULL, 0, NULL, 0},
	};
	int ch;
	long v;
	/* "+": options end at the command; its own options follow it */
	while ((ch = getopt_long(argc, argv, "+s:jt:h", lo, NULL)) != -1) {
		switch (ch) {
		case 's':
			/* repeated: several daemons, one client (edgelm_connect_ex) */
			if (ctl_g.n_sockets == CTL_MAX_SOCKETS)
				return ctl_usage_error(NULL, "--socket: at most %d",
				                       CTL_MAX_SOCKETS);
			ctl_g.sockets[ctl_g.n_sockets++] = optarg;
			break;
		case OPT_TLS_CERT:
			ctl_g.tls_cert = optarg;
			break;
		case OPT_TLS_KEY:
			ctl_g.tls_key = optarg;
			break;
		case OPT_TLS_CA:
			ctl_g.tls_ca = optarg;
			break;
		case 'j':
			ctl_g.json = true;
			break;
		case 't':
			if (tools_parse_long(optarg, 0, INT32_MAX, &v) != 0)
				return ctl_usage_error(NULL, "--timeout: '%s' is not a time in ms",
				                       optarg);
			ctl_g.timeout_ms = (int)v;
			break;
		case 'h':
			ctl_usage_main(stdout);
			return EXIT_OK;
		case OPT_VERSION:
			printf("edgelmctl %s\n", edgelm_version());
			return EXIT_OK;
		default:
			return ctl_usage_error(NULL, "bad option");
		}
	}
	if (optind >= argc) {
		ctl_usage_main(stderr);
		return EXIT_USAGE;
	}
	return -1;
}

/* `edgelmctl help [COMMAND]` */
static int help(int argc, char **argv)
{
	if (argc < 2) {
		ctl_usage_main(stdout);
		return EXIT_OK;
	}
	if (ctl_usage_command(argv[1], stdout) != 0)
		return ctl_usage_error(NULL, "no command '%s'", argv[1]);
	return EXIT_OK;
}

int main(int argc, char **argv)
{
	int code = parse_globals(argc, argv);
	if (code >= 0)
		return code;
	const char *cmd = argv[optind];
	int sub_argc = argc - optind;
	char **sub_argv = argv + optind;
	if (strcmp(cmd, "help") == 0)
		return help(sub_argc, sub_argv);
	/* a broken pipe (edgelmctl ... | head) ends the program quietly */
	signal(SIGPIPE, SIG_DFL);
	for (size_t i = 0; i < CM_ARRAY_LEN(commands); i++)
		if (strcmp(cmd, commands[i].name) == 0)
			return commands[i].fn(sub_argc, sub_argv);
	return ctl_usage_error(NULL, "no command '%s'", cmd);
}
