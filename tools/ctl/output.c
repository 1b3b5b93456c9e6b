/* tools/ctl/output.c: edgelmctl's failures and generation results, as text
 * or as the JSON objects of --json. */
#include "tools/ctl/ctl.h"
#include "tools/lib/tools.h"

#include <math.h>
#include <string.h>

/* The global options (edgelmctl.c fills them): how results are printed,
 * where and how long to wait. */
struct ctl_globals ctl_g = {.timeout_ms = 30000};

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

/* The JSON error code of a failure the daemon did not name. */
static const char *client_code(int rc)
{
	switch (rc) {
	case EDGELM_E_CONNECT:
		return "cannot_connect";
	case EDGELM_E_TIMEOUT:
		return "timeout";
	case EDGELM_E_CONNECTION:
		return "connection_lost";
	case EDGELM_E_ABORTED:
		return "interrupted";
	default:
		return "client_error";
	}
}

int ctl_fail(int rc, const struct edgelm_error *e)
{
	const char *msg = e->message[0] ? e->message : edgelm_strerror(rc);
	if (ctl_g.json) {
		printf("{\"ok\":false,\"error\":{\"code\":");
		const char *code = e->server_code[0] ? e->server_code : client_code(rc);
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

void ctl_print_stats(const struct edgelm_result *r)
{
	fprintf(stderr, "[%s: %lld prompt tokens (%lld cached), %lld generated; ",
	        edgelm_finish_name(r->finish), (long long)r->prompt_tokens,
	        (long long)r->cached_tokens, (long long)r->completion_tokens);
	fprintf(stderr,
	        "queue %.0f ms, first token %.0f ms, prefill %.1f tok/s, decode %.1f tok/s]\n",
	        r->queue_ms, r->ttft_ms, r->prefill_tps, r->decode_tps);
}

void ctl_print_result_json(const struct edgelm_result *r)
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
