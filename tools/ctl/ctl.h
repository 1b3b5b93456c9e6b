/* tools/ctl/ctl.h: the parts of edgelmctl (tools/edgelmctl.c), one concept
 * a file:
 *
 *   tools/edgelmctl.c     main: parsing the global options, the command table
 *   tools/ctl/usage.c     help texts, usage errors, TEXT|- arguments
 *   tools/ctl/output.c    the global options, failures and results (text, --json)
 *   tools/ctl/connect.c   connecting with the global options
 *   tools/ctl/generate.c  generate and chat: options, streaming, the chat loop
 *   tools/ctl/simple.c    info, health, metrics, tokenize, detokenize, cancel
 *   tools/ctl/embed.c     embed
 *   tools/ctl/top.c       the live view */
#ifndef EDGELM_CTL_H
#define EDGELM_CTL_H

#include "common/common.h"
#include "ipc/edgelm.h"

#include <stdbool.h>
#include <stdio.h>

enum {
	EXIT_OK = 0,
	EXIT_USAGE = 1,
	EXIT_SERVER = 2,
	EXIT_CONNECT = 3,
	EXIT_NOT_READY = 4,
	EXIT_INTERRUPTED = 130,
};

/* The options before COMMAND (set by main, read by the commands). */
#define CTL_MAX_SOCKETS 32
struct ctl_globals {
	const char *sockets[CTL_MAX_SOCKETS]; /* --socket, repeated; none: the library's default */
	size_t n_sockets;
	const char *tls_cert, *tls_key, *tls_ca; /* NULL: $EDGELM_TLS_* */
	bool json;
	int timeout_ms;
};
extern struct ctl_globals ctl_g; /* output.c */

/* ---- connect.c ------------------------------------------------------------ */

/* Connect with the global options; 0, else the exit code after reporting. */
int ctl_connect(edgelm_client **c);

/* ---- usage.c -------------------------------------------------------------- */

void ctl_usage_main(FILE *f);
/* COMMAND's help on f: 0, or -1 when there is no such command. */
int ctl_usage_command(const char *name, FILE *f);
/* "edgelmctl: MESSAGE" and where to find help (cmd may be NULL) on stderr;
 * returns EXIT_USAGE. */
int ctl_usage_error(const char *cmd, const char *fmt, ...) CM_PRINTF(2, 3);
/* The options of a command that has only --help: -1 to go on, else the exit
 * code (optind is left at the first argument). */
int ctl_parse_help_only(const char *cmd, int argc, char **argv);
/* argv[from..argc) joined with spaces; "-" alone reads stdin. NULL: no
 * memory. The caller frees. */
char *ctl_text_arg(int argc, char **argv, int from);

/* ---- output.c ------------------------------------------------------------- */

/* Report a failure (stderr, or a JSON object on stdout) and return the exit
 * code it maps to. */
int ctl_fail(int rc, const struct edgelm_error *e);
/* A generation's counts and speed on stderr (--stats). */
void ctl_print_stats(const struct edgelm_result *r);
/* A generation as the one JSON object of --json. */
void ctl_print_result_json(const struct edgelm_result *r);

/* ---- the commands: argv[0] is the command's name; each returns the exit code */

int ctl_cmd_generate(int argc, char **argv);
int ctl_cmd_chat(int argc, char **argv);
/* info, health and metrics */
int ctl_cmd_status(int argc, char **argv);
int ctl_cmd_tokenize(int argc, char **argv);
int ctl_cmd_detokenize(int argc, char **argv);
int ctl_cmd_embed(int argc, char **argv); /* embed.c */
int ctl_cmd_cancel(int argc, char **argv);
int ctl_cmd_top(int argc, char **argv);

#endif
