/* tools/ctl/embed.c: edgelmctl embed, the daemon's embeddings of texts.
 *
 * Each TEXT argument is one input; "-" alone reads stdin, one input a
 * non-empty line (a file of passages to index). The vectors come back in
 * order: one line of values each, or with --json one object. */
#include "tools/ctl/ctl.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

/* stdin's non-empty lines into *ret (their buffer in *ret_buf). */
static int read_lines(char ***ret, size_t *ret_n, char **ret_buf)
{
	size_t cap = 0, len = 0, n = 0;
	char *buf = NULL;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *nb = realloc(buf, cap = 2 * cap + 4096 + 1);
			if (!nb) {
				free(buf);
				return -1;
			}
			buf = nb;
		}
		size_t got = fread(buf + len, 1, cap - len - 1, stdin);
		if (got == 0)
			break;
		len += got;
	}
	if (!buf && !(buf = malloc(1)))
		return -1;
	buf[len] = '\0';
	char **v = malloc((len / 2 + 2) * sizeof(*v));
	if (!v) {
		free(buf);
		return -1;
	}
	for (char *p = buf, *nl; p < buf + len; p = nl + 1) {
		nl = strchr(p, '\n');
		if (!nl)
			nl = buf + len;
		*nl = '\0';
		if (nl > p && nl[-1] == '\r')
			nl[-1] = '\0';
		if (*p)
			v[n++] = p;
	}
	*ret = v;
	*ret_n = n;
	*ret_buf = buf;
	return 0;
}

int ctl_cmd_embed(int argc, char **argv)
{
	enum { OPT_POOLING = 256, OPT_TRUNCATE };
	static const struct option lo[] = {{"pooling", required_argument, NULL, OPT_POOLING},
	                                   {"truncate", no_argument, NULL, OPT_TRUNCATE},
	                                   {"help", no_argument, NULL, 'h'},
	                                   {NULL, 0, NULL, 0}};
	const char *pooling = NULL;
	bool truncate = false;
	int ch;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "+h", lo, NULL)) != -1) {
		if (ch == OPT_POOLING) {
			pooling = optarg;
			if (strcmp(pooling, "mean") && strcmp(pooling, "cls") &&
			    strcmp(pooling, "last"))
				return ctl_usage_error("embed", "--pooling is mean, cls or last");
		} else if (ch == OPT_TRUNCATE) {
			truncate = true;
		} else if (ch == 'h') {
			ctl_usage_command("embed", stdout);
			return EXIT_OK;
		} else {
			return ctl_usage_error("embed", "bad option");
		}
	}
	if (optind >= argc)
		return ctl_usage_error("embed", "embed needs a TEXT");
	char **texts = argv + optind, *buf = NULL, **lines = NULL;
	size_t n = (size_t)(argc - optind);
	if (n == 1 && strcmp(texts[0], "-") == 0) {
		if (read_lines(&lines, &n, &buf) != 0) {
			fprintf(stderr, "edgelmctl: out of memory\n");
			return EXIT_USAGE;
		}
		texts = lines;
		if (n == 0) {
			free(lines);
			free(buf);
			return ctl_usage_error("embed", "no text on stdin");
		}
	}
	edgelm_client *c = NULL;
	int code = ctl_connect(&c);
	float *v = NULL;
	size_t dim = 0;
	int64_t *tokens = NULL;
	struct edgelm_error e;
	int rc = code ? 0
	              : edgelm_embed(c, (const char *const *)texts, n, pooling, truncate, &v, &dim,
	                             &tokens, &e);
	edgelm_close(c);
	free(lines);
	free(buf);
	if (code)
		return code;
	if (rc)
		return ctl_fail(rc, &e);
	if (ctl_g.json)
		printf("{\"ok\":true,\"dim\":%zu,\"embeddings\":[", dim);
	for (size_t i = 0; i < n; i++) {
		if (ctl_g.json)
			printf("%s{\"tokens\":%lld,\"embedding\":[", i ? "," : "",
			       (long long)tokens[i]);
		for (size_t k = 0; k < dim; k++)
			printf("%s%.9g", k ? (ctl_g.json ? "," : " ") : "", (double)v[i * dim + k]);
		printf(ctl_g.json ? "]}" : "\n");
	}
	if (ctl_g.json)
		printf("]}\n");
	edgelm_free(v);
	edgelm_free(tokens);
	return EXIT_OK;
}
