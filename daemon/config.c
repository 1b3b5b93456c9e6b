/* daemon/config.c: edgelmd's configuration, one table.
 *
 * Every key is one row of `options[]` below (redis's standardConfig; the
 * row type is config_impl.h's, shared with the unit test):
 * name, type, where it lives in struct daemon_config, its default as text,
 * its range and flags, and one line of help. The same rows drive
 *   - the defaults (each default string goes through the parser, so a
 *     default that does not parse is caught by the tests),
 *   - daemon_config_set (type and range checks),
 *   - daemon_config_load (`key value` lines),
 *   - daemon_config_print (the file format, loadable again) and its
 *     --doc variant (the Markdown table of docs/configuration.md),
 *   - daemon_config_apply_reload (what SIGHUP may change in place).
 *
 * File format: one `key value` per line; the value runs to the end of the
 * line and may contain spaces. A value may be put in double quotes (needed
 * for an empty value, leading or trailing spaces, or " #"; inside quotes \"
 * and \\ escape). Lines whose first non-blank character is '#' are
 * comments, and so is everything from a '#' that follows a blank outside
 * quotes. A repeated key replaces the earlier value, except `listen`: its
 * lines add URLs (the first `listen` line of a file replaces the built-in
 * default). */
#include "common/net.h"
#include "daemon/config.h"
#include "daemon/config_impl.h"
#include "daemon/policy.h"
#include "engine/engine.h"

#include "tuning/tuning.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int check_ioprio(const char *v, struct cm_err *err);
static int check_numa(const char *v, struct cm_err *err);
static int check_metrics_listen(const char *v, struct cm_err *err);
static int check_url(const char *v, struct cm_err *err);
static int check_http_listen(const char *v, struct cm_err *err);
static int check_abs_path(const char *v, struct cm_err *err);
static int check_abs_path_or_empty(const char *v, struct cm_err *err);
static int check_tenant_weights(const char *v, struct cm_err *err);
static int check_uid_list(const char *v, struct cm_err *err);
static int check_chat_template(const char *v, struct cm_err *err);
static int check_quantize(const char *v, struct cm_err *err);

#define FIELD(f) offsetof(struct daemon_config, f), sizeof(((struct daemon_config *)0)->f)
#define LISTF(f) offsetof(struct daemon_config, f), sizeof(((struct daemon_config *)0)->f[0])
#define LISTN(n) offsetof(struct daemon_config, n)
#define R CONFIG_RELOADABLE
#define KEEP_NICE 99
#define KEEP_OOM 9999

/* clang-format off */
/* Only list rows give count_off, their last field. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const struct opt options[] = {
	{ "model", OPT_STRING, FIELD(model), "", 0, 0, R, NULL, NULL, 0, "model and engine",
	  "GGUF model to serve (required). A reload with a new path loads it beside the old one, then swaps" },
	{ "threads", OPT_INT, FIELD(threads), "0", 0, TUNING_MAX_CPUS, 0, NULL, NULL, 0, NULL,
	  "worker threads; 0: one per usable physical core (big cores first)" },
	{ "isa", OPT_STRING, FIELD(isa), "auto", 0, 0, 0, NULL, NULL, 0, NULL,
	  "kernel variant: auto (best this CPU has), scalar, avx2, avx512, ... (EDGELM_ISA overrides the file; --isa and --set override both)" },
	{ "repack", OPT_STRING, FIELD(repack), "auto", 0, 0, 0, "auto|on|off", NULL, 0, NULL,
	  "repack Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL/Q8_0/Q4_K/Q6_K weights (on avx512vnni also Q2_K/Q3_K/Q5_K/IQ4_XS) at load into the kernels' interleaved layout (faster decode and prefill; the repacked tensors become private memory): auto (when the kernels read it and it takes at most half the RAM), on, off" },
	{ "repack_cache", OPT_STRING, FIELD(repack_cache), "", 0, 0, 0, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "directory that keeps the repacked weights (the unit's CacheDirectory, /var/cache/edgelm): the first load writes them, later loads map them instead of repacking, which loads at once but leaves the weights in 4 KiB pages (docs/engine.md); \"\": repack at every load" },
	{ "quantize", OPT_STRING, FIELD(quantize), "", 0, 0, 0, NULL, check_quantize, 0, NULL,
	  "quantize an F32/F16/BF16 model at load with edgelm-quantize's recipe and bytes: q8_0, q4_0, q4_k_m, q6_k, ... (edgelm-quantize --help lists them); the weights become private memory of about the quantized size, and the start takes longer (its systemd timeout is extended by 1 s per 4 MiB of the file); a file already quantized loads as stored; \"\": as stored" },
	{ "ctx_size", OPT_UINT, FIELD(ctx_size), "0", 0, 1048576, 0, NULL, NULL, 0, NULL,
	  "tokens per sequence; 0: the model's context, capped by kv_budget_mib" },
	{ "parallel", OPT_UINT, FIELD(parallel), "4", 1, 256, 0, NULL, NULL, 0, NULL,
	  "sequences decoded together (KV cache slots)" },
	{ "batch_size", OPT_UINT, FIELD(batch_size), "512", 1, 65536, 0, NULL, NULL, 0, NULL,
	  "most tokens in one engine step (decodes plus a prefill chunk)" },
	{ "prefill_chunk", OPT_UINT, FIELD(prefill_chunk), "256", 1, 65536, 0, NULL, NULL, 0, NULL,
	  "most prompt tokens per step, so running decodes never stall behind a long prompt" },
	{ "kv_budget_mib", OPT_UINT, FIELD(kv_budget_mib), "0", 0, 16777216, 0, NULL, NULL, 0, NULL,
	  "KV cache memory budget in MiB (all sequences, K and V); 0: no cap" },
	{ "kv_type", OPT_STRING, FIELD(kv_type), "f16", 0, 0, 0, "f32|f16|q8_0", NULL, 0, NULL,
	  "KV cache type: f16 (half the bytes of f32, the same greedy tokens in the reference tests), q8_0 (27% of f32's bytes; logits move more) or f32" },
	{ "prefix_cache", OPT_BOOL, FIELD(prefix_cache), "yes", 0, 0, 0, NULL, NULL, 0, NULL,
	  "keep finished sequences' KV cache to reuse shared prompt prefixes" },
	{ "chat_template", OPT_STRING, FIELD(chat_template), "", 0, 0, 0, NULL,
	  check_chat_template, 0, NULL,
	  "chat format of chat requests: \"\" the model's tokenizer.chat_template (chatml when it has none); or a format name for a template edgelm does not recognise (edgelm-run --chat-template list prints them)" },

	{ "queue_size", OPT_UINT, FIELD(queue_size), "16", 1, 65536, R, NULL, NULL, 0, "requests",
	  "requests waiting for a slot; beyond it a request is refused with queue_full" },
	{ "max_tokens_default", OPT_UINT, FIELD(max_tokens_default), "256", 1, 1048576, R, NULL,
	  NULL, 0, NULL, "max_tokens of a request that gives none" },
	{ "max_tokens_limit", OPT_UINT, FIELD(max_tokens_limit), "8192", 1, 1048576, R, NULL, NULL,
	  0, NULL, "upper bound of a request's max_tokens" },
	{ "context_shift", OPT_BOOL, FIELD(context_shift), "no", 0, 0, R, NULL, NULL, 0, NULL,
	  "when a generation fills its context, keep context_keep tokens, drop half of the rest and go on (until max_tokens) instead of finishing with \"length\"; the model no longer sees the dropped tokens" },
	{ "context_keep", OPT_INT, FIELD(context_keep), "-1", -1, 1048576, R, NULL, NULL, 0, NULL,
	  "tokens a context shift keeps at the start; -1: the system prompt's tokens and the BOS for chat requests, the BOS for others" },
	{ "stream_idle_ms", OPT_UINT, FIELD(stream_idle_ms), "30000", 100, 86400000, R, NULL, NULL,
	  0, NULL, "a stream not polled for this long is cancelled" },
	{ "deadline_ms_default", OPT_UINT, FIELD(deadline_ms_default), "0", 0, 86400000, R, NULL,
	  NULL, 0, NULL, "deadline of a request that gives none; 0: none" },
	{ "drain_timeout_ms", OPT_UINT, FIELD(drain_timeout_ms), "10000", 0, 3600000, R, NULL, NULL,
	  0, NULL, "on SIGTERM, running requests may finish for this long; their streams then have stream_idle_ms to be collected (keep both below the unit's TimeoutStopSec)" },
	{ "tenant_weights", OPT_STRING, FIELD(tenant_weights), "", 0, 0, R, NULL,
	  check_tenant_weights, 0, NULL,
	  "shares of the callers' identities when they compete, NAME=WEIGHT,... (NAME: a user, a uid, uid:N, anonymous; WEIGHT in (0, 1000]); others weigh 1" },
	{ "admin_uids", OPT_STRING, FIELD(admin_uids), "", 0, 0, R, NULL, check_uid_list, 0, NULL,
	  "uids that may poll and cancel any caller's generation, comma-separated; \"\": none (root is not special)" },
	{ "text_threads", OPT_UINT, FIELD(text_threads), "2", 1, 64, 0, NULL, NULL, 0, NULL,
	  "threads that tokenize prompts and serve tokenize/detokenize, beside the engine's workers" },

	{ "listen", OPT_LIST, LISTF(listen), "ipc:///run/edgelm/edgelm.sock", 0, 0, 0, NULL,
	  check_url, 0, "ipc",
	  "nng URL to serve: ipc:///PATH, tcp://ADDR:PORT (not authenticated) or tls+tcp://ADDR:PORT (TLS: set tls_cert_file and tls_key_file, and tls_ca_file to authenticate clients); each listen line adds one, up to 8", LISTN(n_listen) },
	{ "socket_group", OPT_STRING, FIELD(socket_group), "edgelm", 0, 0, 0, NULL, NULL, 0, NULL,
	  "group of the ipc:// socket files; \"\": leave as created" },
	{ "socket_mode", OPT_OCTAL, FIELD(socket_mode), "0660", 0, 0777, 0, NULL, NULL, 0, NULL,
	  "mode of the ipc:// socket files (clients need write permission)" },
	{ "max_msg_kib", OPT_UINT, FIELD(max_msg_kib), "1216", 1, 1048576, 0, NULL, NULL, 0, NULL,
	  "largest request message in KiB; the default fits the protocol's largest prompt (1 MiB) with its envelope" },
	{ "tls_cert_file", OPT_STRING, FIELD(tls_cert_file), "", 0, 0, R, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "certificate (PEM, the chain after it) of the tls+tcp:// listeners; a reload reads the three tls_*_file files again, also unchanged paths: new connections use them, connected clients keep theirs" },
	{ "tls_key_file", OPT_STRING, FIELD(tls_key_file), "", 0, 0, R, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "private key (PEM, unencrypted) of tls_cert_file; keep it readable by the daemon only" },
	{ "tls_ca_file", OPT_STRING, FIELD(tls_ca_file), "", 0, 0, R, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "CA certificates (PEM) of the clients: a tls+tcp:// client must present a certificate they signed, and its subject CN is its identity, tls:CN (tenant_weights tls:CN=W); \"\": clients are not authenticated (identity tls:anonymous)" },

	{ "http_listen", OPT_LIST, LISTF(http_listen), "", 0, 0, 0, NULL, check_http_listen, 0,
	  "http",
	  "address of the OpenAI-compatible HTTP API and web page, ADDR:PORT or [ADDR6]:PORT; each line adds one, up to 8; \"\": off. Anyone who reaches it can generate: keep it on loopback or set http_api_key_file (docs/http.md)",
	  LISTN(n_http_listen) },
	{ "http_api_key_file", OPT_STRING, FIELD(http_api_key_file), "", 0, 0, 0, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "file of API keys, one \"NAME KEY\" per line: HTTP callers must send Authorization: Bearer KEY, and each key's NAME is its identity for the fair share (tenant_weights http:NAME=W); \"\": no keys" },
	{ "http_max_connections", OPT_UINT, FIELD(http_max_connections), "64", 2, 4096, 0, NULL,
	  NULL, 0, NULL, "open HTTP connections at most per address (a thread each); idle and slow ones are shut when it gets crowded" },
	{ "http_rate_limit", OPT_DOUBLE, FIELD(http_rate_limit), "50", 0, 1000000, 0, NULL, NULL,
	  0, NULL, "HTTP requests a second per client address, bursts of twice that; beyond it 429 with Retry-After; 0: no limit" },
	{ "http_cors_origin", OPT_STRING, FIELD(http_cors_origin), "", 0, 0, 0, NULL, NULL, 0,
	  NULL, "Access-Control-Allow-Origin for browsers on other origins (an origin or *); \"\": no CORS headers" },

	{ "metrics_listen", OPT_STRING, FIELD(metrics_listen), "127.0.0.1:9477", 0, 0, 0, NULL,
	  check_metrics_listen, 0, "monitor",
	  "Prometheus endpoint, ADDR:PORT, or off" },
	{ "metrics_bind_required", OPT_BOOL, FIELD(metrics_bind_required), "yes", 0, 0, 0, NULL,
	  NULL, 0, NULL,
	  "refuse to start (exit 3) when metrics_listen cannot be bound (port in use); no: warn and serve without the endpoint" },
	{ "monitor_interval_ms", OPT_UINT, FIELD(monitor_interval_ms), "1000", 100, 60000, 0, NULL,
	  NULL, 0, NULL, "how often the monitor samples the system" },
	{ "metrics_textfile", OPT_STRING, FIELD(metrics_textfile), "", 0, 0, R, NULL,
	  check_abs_path_or_empty, 0, NULL,
	  "node_exporter textfile to write the metrics to (absolute path); \"\": off" },
	{ "peak_bandwidth_gbs", OPT_DOUBLE, FIELD(peak_bandwidth_gbs), "0", 0, 100000, R, NULL, NULL,
	  0, NULL, "measured memory read bandwidth in GB/s (edgelm-bench), for the bottleneck verdict; 0: unknown" },

	{ "tuning", OPT_BOOL, FIELD(tuning), "yes", 0, 0, 0, NULL, NULL, 0, "tuning",
	  "master switch of every tuning knob below" },
	{ "pin", OPT_BOOL, FIELD(pin), "yes", 0, 0, 0, NULL, NULL, 0, NULL,
	  "pin workers to cores, keep service threads off them" },
	{ "governor", OPT_STRING, FIELD(governor), "performance", 0, 0, 0, NULL, NULL, 0, NULL,
	  "cpufreq governor of the cpus used (\"a|b\": the first offered), or keep" },
	{ "epp", OPT_STRING, FIELD(epp), "performance", 0, 0, 0, NULL, NULL, 0, NULL,
	  "energy_performance_preference of the cpus used, or keep" },
	{ "nice", OPT_INT, FIELD(nice), "-5", -20, 19, 0, NULL, NULL, KEEP_NICE, NULL,
	  "nice value of the daemon's threads, or keep" },
	{ "sched_batch", OPT_BOOL, FIELD(sched_batch), "no", 0, 0, 0, NULL, NULL, 0, NULL,
	  "run the workers under SCHED_BATCH" },
	{ "load_ioprio", OPT_STRING, FIELD(load_ioprio), "be:7", 0, 0, 0, NULL, check_ioprio, 0,
	  NULL, "I/O priority while loading the model: keep, idle, be or be:N (N 0..7)" },
	{ "mlock", OPT_STRING, FIELD(mlock), "try", 0, 0, 0, "off|try|on|all", NULL, 0, NULL,
	  "lock weights and KV cache in RAM: off; try (warn once and serve unlocked); on (refuse to start); all (mlockall)" },
	{ "hugepages", OPT_BOOL, FIELD(hugepages), "no", 0, 0, 0, NULL, NULL, 0, NULL,
	  "copy the weights to transparent huge pages (costs the model's size in RSS)" },
	{ "prefault", OPT_BOOL, FIELD(prefault), "yes", 0, 0, 0, NULL, NULL, 0, NULL,
	  "read the whole model at load, so the first requests do not fault" },
	{ "numa", OPT_STRING, FIELD(numa), "auto", 0, 0, 0, NULL, check_numa, 0, NULL,
	  "NUMA placement: auto, node, interleave or off" },
	{ "oom_score_adj", OPT_INT, FIELD(oom_score_adj), "keep", -1000, 1000, 0, NULL, NULL,
	  KEEP_OOM, NULL, "OOM killer adjustment, or keep (lowering it needs CAP_SYS_RESOURCE: prefer OOMScoreAdjust=)" },
	{ "state_file", OPT_STRING, FIELD(state_file), "/run/edgelm/tuning.state", 0, 0, 0, NULL,
	  check_abs_path, 0, NULL, "where tuning records what to restore (edgelmd --restore-tuning)" },

	{ "log_level", OPT_STRING, FIELD(log_level), "info", 0, 0, R,
	  "err|warning|notice|info|debug", NULL, 0, "logging and systemd",
	  "least important messages logged" },
	{ "watchdog_stall_ms", OPT_UINT, FIELD(watchdog_stall_ms), "0", 0, 3600000, CONFIG_HIDDEN,
	  NULL, NULL, 0, NULL,
	  "test only: a prompt containing __edgelm_test_stall__ stalls the scheduler this long" },
};
#pragma GCC diagnostic pop
/* clang-format on */

#undef R

static const struct opt *opt_find(const char *name)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(options); i++)
		if (strcmp(options[i].name, name) == 0)
			return &options[i];
	return NULL;
}

static void *opt_ptr(struct daemon_config *c, const struct opt *o)
{
	return (char *)c + o->off;
}

static const void *opt_cptr(const struct daemon_config *c, const struct opt *o)
{
	return (const char *)c + o->off;
}

/* ---- value checks ------------------------------------------------------- */

static int check_ioprio(const char *v, struct cm_err *err)
{
	enum tuning_ioprio cls;
	int level;

	if (tuning_ioprio_parse(v, &cls, &level) < 0)
		return cm_err_set(err, -EINVAL, "'%s' is not keep, idle, be or be:N (N 0..7)", v);
	return 0;
}

static int check_numa(const char *v, struct cm_err *err)
{
	enum tuning_numa n;

	if (tuning_numa_parse(v, &n) < 0)
		return cm_err_set(err, -EINVAL, "'%s' is not auto, node, interleave or off", v);
	return 0;
}

/* "off", or ADDR:PORT with a port 1..65535 ("[::1]:9477" for IPv6). */
static int check_chat_template(const char *v, struct cm_err *err)
{
	enum engine_chat_format f;
	if (!*v || engine_chat_format_from_name(v, &f) == 0)
		return 0;
	return cm_err_set(err, -EINVAL, "'%.32s' is not a chat format (known: %s)", v,
	                  engine_chat_format_list());
}

/* The engine's own check, so the two accept the same names. */
static int check_quantize(const char *v, struct cm_err *err)
{
	return engine_quantize_check(v, err);
}

/* ADDR:PORT or [ADDR6]:PORT with a numeric address (http/ binds it as
 * given: no name lookups in a daemon's start) or localhost: what the HTTP
 * front's parser takes, with IPv6 only in brackets (where the port cannot
 * be read as part of the address) and a port of digits. */
static int check_http_listen(const char *v, struct cm_err *err)
{
	const char *colon = strrchr(v, ':');
	if (!colon || colon == v || !isdigit((unsigned char)colon[1]))
		return cm_err_set(err, -EINVAL, "'%s' is not ADDR:PORT", v);
	struct sockaddr_storage ss;
	bool v6;
	if (cm_parse_addr_port(v, &ss, &v6) != 0 || (v6 && v[0] != '['))
		return cm_err_set(err, -EINVAL,
				  "'%s': the address must be numeric (127.0.0.1, [::1]) or localhost, "
				  "the port 0-65535",
				  v);
	return 0;
}

static int check_metrics_listen(const char *v, struct cm_err *err)
{
	const char *colon = strrchr(v, ':');
	char *end;
	unsigned long port;

	if (strcmp(v, "off") == 0)
		return 0;
	if (!colon || colon == v)
		return cm_err_set(err, -EINVAL, "'%s' is not ADDR:PORT or off", v);
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (!isdigit((unsigned char)colon[1]) || *end || errno || port < 1 || port > 65535)
		return cm_err_set(err, -EINVAL, "'%s': the port is not 1..65535", v);
	return 0;
}

static int check_url(const char *v, struct cm_err *err)
{
	const char *sep = strstr(v, "://");

	if (!sep || sep == v || !sep[3])
		return cm_err_set(err, -EINVAL,
		                  "'%s' is not an nng URL (ipc:///path, tcp://ADDR:PORT, "
		                  "tls+tcp://ADDR:PORT)", v);
	return 0;
}

static int check_abs_path(const char *v, struct cm_err *err)
{
	if (v[0] != '/')
		return cm_err_set(err, -EINVAL, "'%s' is not an absolute path", v);
	return 0;
}

static int check_abs_path_or_empty(const char *v, struct cm_err *err)
{
	return v[0] ? check_abs_path(v, err) : 0;
}

static int check_tenant_weights(const char *v, struct cm_err *err)
{
	return policy_weights_parse(v, NULL, NULL, err);
}

static int check_uid_list(const char *v, struct cm_err *err)
{
	for (const char *p = v; *p; p++)
		if (!isdigit((unsigned char)*p) && *p != ',' && *p != ' ')
			return cm_err_set(err, -EINVAL, "'%s' is not a list of numeric uids", v);
	return 0;
}

static bool in_choices(const char *choices, const char *v)
{
	size_t n = strlen(v);

	for (const char *p = choices; p && *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (len == n && strncmp(p, v, n) == 0)
			return true;
		p = bar ? bar + 1 : NULL;
	}
	return false;
}

/* ---- parsing one value -------------------------------------------------- */

static int parse_bool(const char *v, bool *ret)
{
	static const char *const yes[] = {"yes", "true", "on", "1"};
	static const char *const no[] = {"no", "false", "off", "0"};

	for (size_t i = 0; i < CM_ARRAY_LEN(yes); i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

static int range_err(const struct opt *o, const char *v, struct cm_err *err)
{
	if (o->keep)
		return cm_err_set(err, -ERANGE, "%s: %s is out of range %.0f..%.0f (or keep)",
		                  o->name, v, o->min, o->max);
	if (o->type == OPT_OCTAL)
		return cm_err_set(err, -ERANGE, "%s: %s is out of range %04o..%04o", o->name, v,
		                  (unsigned)o->min, (unsigned)o->max);
	return cm_err_set(err, -ERANGE, "%s: %s is out of range %.15g..%.15g", o->name, v, o->min,
	                  o->max);
}

static int set_integer(struct daemon_config *c, const struct opt *o, const char *v,
                       struct cm_err *err)
{
	char *end;
	long long x;
	int base = o->type == OPT_OCTAL ? 8 : 10;

	if (o->keep && strcmp(v, "keep") == 0) {
		*(int *)opt_ptr(c, o) = (int)o->keep;
		return 0;
	}
	errno = 0;
	x = strtoll(v, &end, base);
	if (end == v || *end || !(isdigit((unsigned char)v[0]) || v[0] == '-' || v[0] == '+'))
		return cm_err_set(err, -EINVAL, "%s: '%s' is not %s", o->name, v,
		                  o->type == OPT_OCTAL ? "an octal number (e.g. 0660)"
		                  : o->keep            ? "an integer or keep"
		                                       : "an integer");
	if (errno == ERANGE || x < (long long)o->min || x > (long long)o->max) {
		if (o->keep && x == o->keep) {
			*(int *)opt_ptr(c, o) = (int)o->keep;
			return 0;
		}
		return range_err(o, v, err);
	}
	if (o->type == OPT_INT)
		*(int *)opt_ptr(c, o) = (int)x;
	else
		*(uint32_t *)opt_ptr(c, o) = (uint32_t)x;
	return 0;
}

static int set_string(char *dst, size_t size, const struct opt *o, const char *v,
                      struct cm_err *err)
{
	struct cm_err sub;
	int r;

	if (strlen(v) >= size)
		return cm_err_set(err, -ENAMETOOLONG, "%s: value longer than %zu bytes", o->name,
		                  size - 1);
	for (const char *p = v; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return cm_err_set(err, -EINVAL, "%s: control character in the value",
			                  o->name);
	if (o->choices && !in_choices(o->choices, v)) {
		char list[128];
		size_t j = 0;
		for (const char *p = o->choices; *p && j + 3 < sizeof(list); p++) {
			if (*p == '|') {
				list[j++] = ',';
				list[j++] = ' ';
			} else {
				list[j++] = *p;
			}
		}
		list[j] = '\0';
		return cm_err_set(err, -EINVAL, "%s: '%s' is not one of %s", o->name, v, list);
	}
	if (o->check) {
		r = o->check(v, &sub);
		if (r < 0)
			return cm_err_set(err, r, "%s: %s", o->name, sub.msg);
	}
	memcpy(dst, v, strlen(v) + 1);
	return 0;
}

/* A list value replaces the list: URLs separated by blanks. */
static int set_list(struct daemon_config *c, const struct opt *o, const char *v, bool append,
                    struct cm_err *err)
{
	int *count = (int *)((char *)c + o->count_off);
	char(*list)[512] = opt_ptr(c, o);
	char tmp[DAEMON_MAX_LISTEN][512];
	int n = append ? *count : 0;
	const char *p = v;
	int r;

	/* Parse into a copy: a bad entry leaves the list as it was. */
	if (append)
		memcpy(tmp, list, sizeof(tmp));
	else
		memset(tmp, 0, sizeof(tmp));
	while (*p) {
		size_t len;
		char one[512];

		while (*p && isspace((unsigned char)*p))
			p++;
		if (!*p)
			break;
		len = strcspn(p, " \t");
		if (n >= DAEMON_MAX_LISTEN)
			return cm_err_set(err, -E2BIG, "%s: more than %d URLs", o->name,
			                  DAEMON_MAX_LISTEN);
		if (len >= sizeof(one))
			return cm_err_set(err, -ENAMETOOLONG, "%s: URL longer than %zu bytes",
			                  o->name, sizeof(one) - 1);
		memcpy(one, p, len);
		one[len] = '\0';
		r = set_string(tmp[n], sizeof(tmp[n]), o, one, err);
		if (r < 0)
			return r;
		n++;
		p += len;
	}
	memcpy(list, tmp, sizeof(tmp));
	*count = n;
	return 0;
}

char (*daemon_config_list(const struct daemon_config *c, const struct opt *o, int *ret_n))[512]
{
	*ret_n = *(const int *)((const char *)c + o->count_off);
	return (char(*)[512])((char *)c + o->off);
}

static int opt_set(struct daemon_config *c, const struct opt *o, const char *v, bool append,
                   struct cm_err *err)
{
	double d;
	char *end;
	bool b;

	switch (o->type) {
	case OPT_STRING:
		return set_string(opt_ptr(c, o), o->size, o, v, err);
	case OPT_INT:
	case OPT_UINT:
	case OPT_OCTAL:
		return set_integer(c, o, v, err);
	case OPT_BOOL:
		if (parse_bool(v, &b) < 0)
			return cm_err_set(err, -EINVAL, "%s: '%s' is not yes or no", o->name, v);
		*(bool *)opt_ptr(c, o) = b;
		return 0;
	case OPT_DOUBLE:
		errno = 0;
		d = strtod(v, &end);
		if (end == v || *end || isspace((unsigned char)v[0]))
			return cm_err_set(err, -EINVAL, "%s: '%s' is not a number", o->name, v);
		if (errno == ERANGE || !isfinite(d) || d < o->min || d > o->max)
			return range_err(o, v, err);
		*(double *)opt_ptr(c, o) = d;
		return 0;
	case OPT_LIST:
		return set_list(c, o, v, append, err);
	}
	return cm_err_set(err, -EINVAL, "%s: bad option type", o->name);
}

/* ---- closest key, for "did you mean" ------------------------------------ */

static size_t edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	size_t row[64];

	if (lb >= CM_ARRAY_LEN(row))
		return SIZE_MAX;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t cost = tolower((unsigned char)a[i - 1]) != b[j - 1];
			size_t best = diag + cost;
			if (row[j] + 1 < best)
				best = row[j] + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

/* The known key nearest to `key`, or NULL when none is plausibly meant. */
static const char *closest_key(const char *key)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;
	size_t len = strlen(key);

	for (size_t i = 0; i < CM_ARRAY_LEN(options); i++) {
		const struct opt *o = &options[i];
		size_t d;

		if (o->flags & CONFIG_HIDDEN)
			continue;
		d = edit_distance(key, o->name);
		/* "threads_count" -> "threads": a known key that the typo contains
		 * or that contains the typo is a good guess too. */
		if (len >= 3 && (strstr(o->name, key) || strstr(key, o->name)))
			d = CM_MIN(d, (size_t)2);
		if (d < best_d) {
			best_d = d;
			best = o->name;
		}
	}
	if (best && best_d <= CM_MAX((size_t)2, len / 3))
		return best;
	return NULL;
}

static int unknown_key(const char *key, struct cm_err *err)
{
	const char *near = closest_key(key);

	if (near)
		return cm_err_set(err, -ENOENT, "unknown key '%s' (did you mean '%s'?)", key, near);
	return cm_err_set(err, -ENOENT, "unknown key '%s'", key);
}

/* ---- public ------------------------------------------------------------- */

void daemon_config_default(struct daemon_config *c)
{
	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < CM_ARRAY_LEN(options); i++) {
		int r = opt_set(c, &options[i], options[i].def, false, NULL);
		(void)r;
		/* The tests check that every default parses. */
	}
}

int daemon_config_set(struct daemon_config *c, const char *key, const char *value,
                      struct cm_err *err)
{
	const struct opt *o = opt_find(key);

	if (!o)
		return unknown_key(key, err);
	return opt_set(c, o, value, false, err);
}

int daemon_config_append(struct daemon_config *c, const char *key, const char *value,
                         struct cm_err *err)
{
	const struct opt *o = opt_find(key);

	if (!o)
		return unknown_key(key, err);
	return opt_set(c, o, value, o->type == OPT_LIST, err);
}

/* Split one line into key and value (both point into `line`, which is
 * modified). Returns 1 for a key line, 0 for a blank or comment line, or a
 * negative errno with a message. */
static int split_line(char *line, char **ret_key, char **ret_value, struct cm_err *err)
{
	char *p = line, *key, *v, *w;

	while (isspace((unsigned char)*p))
		p++;
	if (*p == '\0' || *p == '#')
		return 0;
	key = p;
	while (*p && !isspace((unsigned char)*p))
		p++;
	if (*p)
		*p++ = '\0';
	while (isspace((unsigned char)*p))
		p++;
	v = p;
	if (*v == '"') {
		/* Quoted: unescape in place up to the closing quote. */
		for (p = w = v + 1; *p && *p != '"'; p++) {
			if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
				p++;
			*w++ = *p;
		}
		if (*p != '"')
			return cm_err_set(err, -EINVAL, "%s: missing closing quote", key);
		*w = '\0';
		for (p++; isspace((unsigned char)*p); p++)
			;
		if (*p && *p != '#')
			return cm_err_set(err, -EINVAL, "%s: text after the closing quote", key);
		*ret_key = key;
		*ret_value = v + 1;
		return 1;
	}
	/* Unquoted: a '#' after a blank starts a comment. */
	for (p = v; *p; p++) {
		if (*p == '#' && p > v && isspace((unsigned char)p[-1])) {
			*p = '\0';
			break;
		}
	}
	w = v + strlen(v);
	while (w > v && isspace((unsigned char)w[-1]))
		*--w = '\0';
	if (*v == '\0')
		return cm_err_set(err, -EINVAL, "%s: missing value (use \"\" for an empty one)",
		                  key);
	*ret_key = key;
	*ret_value = v;
	return 1;
}

int daemon_config_load(struct daemon_config *c, const char *path, struct cm_err *err)
{
	struct daemon_config tmp;
	char *line = NULL;
	size_t cap = 0;
	ssize_t len;
	unsigned lineno = 0;
	bool list_seen[CM_ARRAY_LEN(options)] = {false};
	struct cm_err sub;
	FILE *f;
	int r = 0;

	f = fopen(path, "re");
	if (!f)
		return cm_err_set(err, -errno, "%s: %s", path, strerror(errno));
	/* Work on a copy, so a file with an error changes nothing. */
	tmp = *c;
	while ((len = getline(&line, &cap, f)) >= 0) {
		char *key = NULL, *value = NULL;
		const struct opt *o;

		lineno++;
		if (memchr(line, '\0', (size_t)len)) {
			r = cm_err_set(err, -EINVAL, "%s:%u: NUL byte in the line", path, lineno);
			goto out;
		}
		cm_err_clear(&sub);
		r = split_line(line, &key, &value, &sub);
		if (r == 0)
			continue;
		if (r < 0) {
			r = cm_err_set(err, r, "%s:%u: %s", path, lineno, sub.msg);
			goto out;
		}
		o = opt_find(key);
		if (!o) {
			r = unknown_key(key, &sub);
			r = cm_err_set(err, r, "%s:%u: %s", path, lineno, sub.msg);
			goto out;
		}
		/* a file's first line of a list replaces the default, the
		 * next ones add to it */
		r = opt_set(&tmp, o, value, o->type == OPT_LIST && list_seen[o - options], &sub);
		if (r < 0) {
			r = cm_err_set(err, r, "%s:%u: %s", path, lineno, sub.msg);
			goto out;
		}
		if (o->type == OPT_LIST)
			list_seen[o - options] = true;
	}
	if (ferror(f)) {
		r = cm_err_set(err, -EIO, "%s: read error", path);
		goto out;
	}
	*c = tmp;
	r = 0;
out:
	free(line);
	fclose(f);
	return r;
}

int daemon_config_validate(const struct daemon_config *c, struct cm_err *err)
{
	if (!c->model[0])
		return cm_err_set(err, -EINVAL, "no model: set `model` in %s or pass --model",
		                  DAEMON_CONFIG_PATH);
	if (c->n_listen < 1)
		return cm_err_set(err, -EINVAL, "no listen URL: set `listen` or pass --listen");
	for (int i = 0; i < c->n_listen; i++)
		if (strncmp(c->listen[i], "tls+tcp://", 10) == 0 &&
		    (!c->tls_cert_file[0] || !c->tls_key_file[0]))
			return cm_err_set(err, -EINVAL,
			                  "listen %s: a tls+tcp:// listener needs tls_cert_file and "
			                  "tls_key_file (the server's certificate and key)",
			                  c->listen[i]);
	if (c->prefill_chunk > c->batch_size)
		return cm_err_set(err, -EINVAL, "prefill_chunk (%u) is larger than batch_size (%u)",
		                  c->prefill_chunk, c->batch_size);
	if (c->parallel > c->batch_size)
		return cm_err_set(err, -EINVAL,
		                  "parallel (%u) is larger than batch_size (%u): every step "
		                  "decodes one token of each sequence",
		                  c->parallel, c->batch_size);
	if (c->max_tokens_default > c->max_tokens_limit)
		return cm_err_set(err, -EINVAL,
		                  "max_tokens_default (%u) is larger than max_tokens_limit (%u)",
		                  c->max_tokens_default, c->max_tokens_limit);
	return 0;
}

int daemon_config_fit_kv_budget(const struct daemon_config *c, uint64_t kv_bytes_per_token,
				uint32_t *n_ctx, struct cm_err *err)
{
	if (c->kv_budget_mib == 0 || kv_bytes_per_token == 0)
		return 0;
	uint64_t budget = (uint64_t)c->kv_budget_mib << 20;
	uint64_t per_pos = kv_bytes_per_token * (c->parallel ? c->parallel : 1);
	uint64_t fit = budget / per_pos;
	if (fit >= *n_ctx)
		return 0;
	if (c->ctx_size != 0)
		return cm_err_set(err, -ENOMEM,
		                  "ctx_size %u x parallel %u needs %.1f MiB of %s KV cache, over "
		                  "kv_budget_mib %u (it fits %llu tokens per sequence)",
		                  *n_ctx, c->parallel, (double)(per_pos * *n_ctx) / (1 << 20),
		                  c->kv_type, c->kv_budget_mib, (unsigned long long)fit);
	if (fit == 0)
		return cm_err_set(err, -ENOMEM,
		                  "kv_budget_mib %u does not hold one token of %u sequences (%s KV, "
		                  "%llu bytes per token and sequence)",
		                  c->kv_budget_mib, c->parallel, c->kv_type,
		                  (unsigned long long)kv_bytes_per_token);
	*n_ctx = (uint32_t)fit;
	return 0;
}

static bool opt_equal(const struct daemon_config *a, const struct daemon_config *b,
                      const struct opt *o)
{
	const void *pa = opt_cptr(a, o), *pb = opt_cptr(b, o);

	switch (o->type) {
	case OPT_STRING:
		return strcmp(pa, pb) == 0;
	case OPT_INT:
		return *(const int *)pa == *(const int *)pb;
	case OPT_UINT:
	case OPT_OCTAL:
		return *(const uint32_t *)pa == *(const uint32_t *)pb;
	case OPT_BOOL:
		return *(const bool *)pa == *(const bool *)pb;
	case OPT_DOUBLE:
		return *(const double *)pa == *(const double *)pb;
	case OPT_LIST: {
		int na, nb;
		char(*la)[512] = daemon_config_list(a, o, &na);
		char(*lb)[512] = daemon_config_list(b, o, &nb);
		if (na != nb)
			return false;
		for (int i = 0; i < na; i++)
			if (strcmp(la[i], lb[i]) != 0)
				return false;
		return true;
	}
	}
	return false;
}

/* ---- reload ------------------------------------------------------------- */

int daemon_config_apply_reload(struct daemon_config *c, const struct daemon_config *nc,
                               const char **ret_key)
{
	int what = 0;

	if (ret_key)
		*ret_key = NULL;
	for (size_t i = 0; i < CM_ARRAY_LEN(options); i++) {
		const struct opt *o = &options[i];

		if (opt_equal(c, nc, o))
			continue;
		if (strcmp(o->name, "model") == 0) {
			/* Not copied: the daemon loads the new model beside the old
			 * one and sets c->model itself once the swap succeeded. */
			what |= 1;
		} else if (o->flags & CONFIG_RELOADABLE) {
			/* Only scalar types are reloadable; size is the field's. */
			memcpy(opt_ptr(c, o), opt_cptr(nc, o), o->size);
		} else if (!(what & 2)) {
			what |= 2;
			if (ret_key)
				*ret_key = o->name;
		}
	}
	return what;
}

void daemon_config_restart_keys(const struct daemon_config *c, const struct daemon_config *nc,
                                char *buf, size_t cap)
{
	size_t n = 0;

	if (cap)
		buf[0] = '\0';
	for (size_t i = 0; i < CM_ARRAY_LEN(options); i++) {
		const struct opt *o = &options[i];

		if ((o->flags & CONFIG_RELOADABLE) || opt_equal(c, nc, o))
			continue;
		int k = snprintf(buf + n, cap - n, "%s`%s`", n ? ", " : "", o->name);
		if (k < 0 || (size_t)k >= cap - n)
			break;
		n += (size_t)k;
	}
}

/* ---- the table, for the unit test (config_impl.h) ------------------------ */

const struct opt *daemon_config_options(size_t *ret_n)
{
	*ret_n = CM_ARRAY_LEN(options);
	return options;
}

const struct opt *daemon_config_opt_find(const char *name)
{
	return opt_find(name);
}

int daemon_config_opt_set(struct daemon_config *c, const struct opt *o, const char *v,
                          bool append, struct cm_err *err)
{
	return opt_set(c, o, v, append, err);
}

bool daemon_config_opt_equal(const struct daemon_config *a, const struct daemon_config *b,
                             const struct opt *o)
{
	return opt_equal(a, b, o);
}
