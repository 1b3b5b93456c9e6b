/* tools/ctl/simple.c: edgelmctl's one-request commands: info, health,
 * metrics (--json prints the daemon's reply as it is), tokenize, detokenize
 * and cancel. */
#include "tools/ctl/ctl.h"
#include "ipc/ipc.h"
#include "tools/lib/tools.h"

#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- metrics as text -------------------------------------------------------- */

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
	/* whole numbers as such: the shortest %g of a count of 10 is 1e+01 */
	if (x == floor(x) && fabs(x) < 1e15) {
		printf(" %.0f\n", x);
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

static void print_metrics(const struct ipc_reply *r)
{
	if (r->u.metrics.json) {
		print_metrics_doc(r->u.metrics.json);
		return;
	}
	for (size_t i = 0; i < r->u.metrics.n_items; i++) {
		const struct ipc_metric *m = &r->u.metrics.items[i];
		printf("%s", m->name ? m->name : "?");
		print_labels(m);
		print_number(m->value);
	}
}

/* ---- info, health, metrics ---------------------------------------------------- */

static void print_info(const struct ipc_info_reply *in)
{
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
}

static void print_health(const struct ipc_reply *r)
{
	printf("%s", ipc_health_name(r->u.health.status));
	for (size_t i = 0; i < r->u.health.n_reasons; i++)
		printf("%s%s", i ? "; " : ": ", r->u.health.reasons[i]);
	putchar('\n');
}

/* The daemon's reply to op as text; the exit code `code` unless the reply
 * does not decode. */
static int print_status(enum ipc_op op, const char *json, int code)
{
	struct ipc_reply *r = NULL;
	struct cm_err err;
	if (ipc_reply_decode(json, strlen(json), op, &r, &err) != 0) {
		fprintf(stderr, "edgelmctl: %s\n", err.msg);
		return EXIT_SERVER;
	}
	if (op == IPC_OP_INFO)
		print_info(&r->u.info);
	else if (op == IPC_OP_HEALTH)
		print_health(r);
	else
		print_metrics(r);
	ipc_reply_free(r);
	return code;
}

int ctl_cmd_status(int argc, char **argv)
{
	const char *cmd = argv[0];
	int code = ctl_parse_help_only(cmd, argc, argv);
	if (code >= 0)
		return code;
	if (optind < argc)
		return ctl_usage_error(cmd, "%s takes no arguments", cmd);
	edgelm_client *c = NULL;
	code = ctl_connect(&c);
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
		code = ctl_fail(rc, &e);
		/* a daemon that is going away is not ready */
		if (op == IPC_OP_HEALTH &&
		    (rc == EDGELM_E_SHUTTING_DOWN || rc == EDGELM_E_NOT_READY))
			code = EXIT_NOT_READY;
		return code;
	}
	if (op == IPC_OP_HEALTH && h != EDGELM_HEALTH_READY)
		code = EXIT_NOT_READY;
	if (ctl_g.json)
		printf("%s\n", json);
	else
		code = print_status(op, json, code);
	edgelm_free(json);
	return code;
}

/* ---- tokenize, detokenize, cancel ------------------------------------------- */

int ctl_cmd_tokenize(int argc, char **argv)
{
	enum { OPT_NOSPECIAL = 256, OPT_PARSESPECIAL };
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
			ctl_usage_command("tokenize", stdout);
			return EXIT_OK;
		} else
			return ctl_usage_error("tokenize", "bad option");
	}
	if (optind >= argc)
		return ctl_usage_error("tokenize", "tokenize needs a TEXT");
	char *text = ctl_text_arg(argc, argv, optind);
	if (!text)
		return EXIT_USAGE;
	edgelm_client *c = NULL;
	int code = ctl_connect(&c);
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
		return ctl_fail(rc, &e);
	if (ctl_g.json)
		printf("{\"ok\":true,\"count\":%zu,\"ids\":[", n);
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i ? (ctl_g.json ? "," : " ") : "", ids[i]);
	printf(ctl_g.json ? "]}\n" : "\n");
	edgelm_free(ids);
	return EXIT_OK;
}

int ctl_cmd_detokenize(int argc, char **argv)
{
	int code = ctl_parse_help_only("detokenize", argc, argv);
	if (code >= 0)
		return code;
	if (optind >= argc)
		return ctl_usage_error("detokenize", "detokenize needs token ids");
	size_t n = (size_t)(argc - optind);
	int32_t *ids = calloc(n, sizeof(*ids));
	if (!ids)
		return EXIT_USAGE;
	for (size_t i = 0; i < n; i++) {
		long v;
		if (tools_parse_long(argv[optind + (int)i], 0, INT32_MAX, &v) != 0) {
			free(ids);
			return ctl_usage_error("detokenize", "'%s' is not a token id",
			                       argv[optind + (int)i]);
		}
		ids[i] = (int32_t)v;
	}
	edgelm_client *c = NULL;
	code = ctl_connect(&c);
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
		return ctl_fail(rc, &e);
	if (ctl_g.json) {
		printf("{\"ok\":true,\"text\":");
		tools_json_strn(stdout, text, strlen(text));
		printf("}\n");
	} else {
		printf("%s\n", text);
	}
	edgelm_free(text);
	return EXIT_OK;
}

int ctl_cmd_cancel(int argc, char **argv)
{
	int code = ctl_parse_help_only("cancel", argc, argv);
	if (code >= 0)
		return code;
	if (argc - optind != 1)
		return ctl_usage_error("cancel", "cancel needs one ID");
	const char *id = argv[optind];
	edgelm_client *c = NULL;
	code = ctl_connect(&c);
	if (code)
		return code;
	bool cancelled = false;
	struct edgelm_error e;
	int rc = edgelm_cancel(c, id, &cancelled, &e);
	edgelm_close(c);
	if (rc)
		return ctl_fail(rc, &e);
	if (ctl_g.json)
		printf("{\"ok\":true,\"cancelled\":%s}\n", cancelled ? "true" : "false");
	else
		printf(cancelled ? "%s: cancelled\n" : "%s: had already finished\n", id);
	return EXIT_OK;
}
