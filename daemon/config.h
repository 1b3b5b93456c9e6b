/* daemon/config.h: edgelmd's configuration.
 *
 * One table (config.c) drives parsing of /etc/edgelm/edgelm.conf (plain
 * `key value` lines, # comments), command-line overrides (--set key=value
 * and the dedicated flags), validation, --print-config, the docs
 * (docs/configuration.md's table is `edgelmd --print-config-doc`;
 * `make docs` rewrites it, tests/integration/config_doc.sh fails when it
 * is stale) and SIGHUP reload (only RELOADABLE keys change in place; a model
 * change is handled by the daemon). */
#ifndef EDGELM_DAEMON_CONFIG_H
#define EDGELM_DAEMON_CONFIG_H

#include "common/common.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define DAEMON_CONFIG_PATH "/etc/edgelm/edgelm.conf"
#define DAEMON_MAX_LISTEN 8

struct daemon_config {
	/* model and engine */
	char model[4096];      /* GGUF path (required) */
	int threads;           /* 0: the tuning plan decides */
	char isa[32];          /* "" or "auto": best; "scalar", "avx2", ... */
	char repack[8];        /* "auto", "on", "off" (engine_repack_parse) */
	char repack_cache[4096]; /* directory of repacked copies; "" = none */
	char quantize[16];     /* recipe to quantize on load; "" = as stored */
	uint32_t ctx_size;     /* tokens per sequence; 0: the model's, capped by kv budget */
	uint32_t parallel;     /* sequences decoded together (KV slots) */
	uint32_t batch_size;   /* max tokens per engine step */
	uint32_t prefill_chunk; /* max prompt tokens per step, so decodes never stall */
	uint32_t kv_budget_mib; /* KV cache memory budget; 0: no cap */
	char kv_type[8];        /* KV cache element type: f32, f16, q8_0 (engine names) */
	char chat_template[32]; /* chat format name; "": the model's */
	bool prefix_cache;      /* keep finished sequences' KV for prompt reuse */

	/* requests */
	uint32_t queue_size;        /* requests waiting for a slot; beyond: queue_full */
	uint32_t max_tokens_default; /* when the request gives none */
	uint32_t max_tokens_limit;   /* upper bound of a request's max_tokens */
	bool context_shift;          /* a full context drops tokens instead of finishing */
	int context_keep;            /* tokens a shift keeps; -1: system prompt + BOS */
	uint32_t stream_idle_ms;     /* a stream not polled this long is cancelled */
	uint32_t deadline_ms_default; /* 0: none */
	uint32_t drain_timeout_ms;   /* SIGTERM: let running requests finish this long */
	char tenant_weights[1024];   /* "NAME=W,..." shares of identities (policy.h) */
	char admin_uids[256];        /* uids that may poll and cancel any generation */
	uint32_t text_threads;       /* threads that tokenize off the scheduler */

	/* ipc */
	char listen[DAEMON_MAX_LISTEN][512]; /* nng URLs; ipc://, tcp://, tls+tcp:// */
	int n_listen;
	char socket_group[64]; /* group of the ipc socket file ("" = leave) */
	uint32_t socket_mode;  /* octal, default 0660 */
	uint32_t max_msg_kib;  /* max request size */
	char tls_cert_file[4096]; /* tls+tcp://: the server's certificate (PEM) */
	char tls_key_file[4096];  /* ... and its private key */
	char tls_ca_file[4096];   /* "" = clients not authenticated, else mutual TLS */

	/* http */
	char http_listen[DAEMON_MAX_LISTEN][512]; /* ADDR:PORT of the HTTP front */
	int n_http_listen;
	char http_api_key_file[4096]; /* "" = no keys */
	uint32_t http_max_connections;
	double http_rate_limit;      /* requests/s per client address; 0 = off */
	char http_cors_origin[256];  /* "" = no CORS */

	/* monitor */
	char metrics_listen[128]; /* ADDR:PORT or "off" */
	bool metrics_bind_required; /* a metrics_listen that cannot be bound stops the start */
	uint32_t monitor_interval_ms;
	char metrics_textfile[4096]; /* node_exporter textfile path, "" = off */
	double peak_bandwidth_gbs;   /* measured read bandwidth (edgelm-bench); 0 = unknown */

	/* tuning */
	bool tuning;              /* master switch for every knob below */
	bool pin;                 /* pin workers, keep service threads off their cores */
	char governor[64];        /* "performance", "keep", ... */
	char epp[48];             /* energy_performance_preference or "keep" */
	int nice;                 /* -20..19; 99 = keep */
	bool sched_batch;
	char load_ioprio[16];     /* "keep", "idle", "be", "be:N" */
	char mlock[16];           /* "off", "try", "on" (tuning_mlock names) */
	bool hugepages;
	bool prefault;
	char numa[16];            /* tuning_numa names */
	int oom_score_adj;        /* -1000..1000; 9999 = keep */
	char state_file[4096];    /* tuning state for --restore-tuning */

	/* logging and systemd */
	char log_level[16];        /* "err", "warning", "notice", "info", "debug" */
	uint32_t watchdog_stall_ms; /* test only: stall the scheduler on a prompt
				     * containing "__edgelm_test_stall__" (0 = off) */
};

enum daemon_config_flags {
	CONFIG_RELOADABLE = 1 << 0, /* applied by SIGHUP without a restart */
	CONFIG_HIDDEN = 1 << 1,     /* test-only, not in --print-config docs */
};

/* Defaults for every key. */
void daemon_config_default(struct daemon_config *c);
/* Parse a file into c (keys not in the file keep their values). A missing
 * file is -ENOENT (the caller decides whether that is fine). Errors name the
 * file, line and key. */
int daemon_config_load(struct daemon_config *c, const char *path, struct cm_err *err);
/* Set one key from text ("threads", "4"), validating type and range. */
int daemon_config_set(struct daemon_config *c, const char *key, const char *value,
		      struct cm_err *err);
/* The same, but a list key (listen) gets the value added to its list. */
int daemon_config_append(struct daemon_config *c, const char *key, const char *value,
			 struct cm_err *err);
/* Whole-config checks that single keys cannot do (e.g. model set). */
int daemon_config_validate(const struct daemon_config *c, struct cm_err *err);
/* `key value` lines with comments (default marked), loadable again. With
 * doc = true, a Markdown table of every key (docs/configuration.md). */
void daemon_config_print(FILE *f, const struct daemon_config *c, bool doc);
/* The positions per sequence to allocate, given *n_ctx (ctx_size, or the
 * model's context when ctx_size is 0, already capped by the model's) and
 * the KV bytes per token of kv_type: with kv_budget_mib set, n_ctx x
 * parallel sequences must fit the budget. A ctx_size of 0 is lowered to
 * what fits; an explicit ctx_size that does not fit is -ENOMEM with a
 * message naming both keys. */
int daemon_config_fit_kv_budget(const struct daemon_config *c, uint64_t kv_bytes_per_token,
				uint32_t *n_ctx, struct cm_err *err);
/* After a reload: copy reloadable keys from `nc` into `c`; returns a bitmask
 * of what else differs: 1 = the model (path), 2 = a key that needs a restart
 * (its name in *ret_key). */
int daemon_config_apply_reload(struct daemon_config *c, const struct daemon_config *nc,
			       const char **ret_key);
/* Every key that differs between c and nc and needs a restart (the model
 * excepted: a reload swaps it), as "`a`, `b`"; "" when none. */
void daemon_config_restart_keys(const struct daemon_config *c, const struct daemon_config *nc,
				char *buf, size_t cap);

#endif
