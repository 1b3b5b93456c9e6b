/* monitor/monitor.h: metrics that explain the box, and a bottleneck
 * classifier. The one public header of monitor/.
 *
 * What the module does
 * - A thread-safe registry of metric families (counter, gauge, histogram)
 *   with labels. Hot updates (monitor_counter_add, monitor_gauge_set,
 *   monitor_histogram_observe) are lock-free atomics; only creating a family
 *   or a new label set takes a mutex. Series live until monitor_free(), so
 *   handles can be cached.
 * - A sampler (monitor_sample(), or a 1 Hz thread from monitor_start()) that
 *   reads the system (libproc2 for /proc/stat, meminfo, vmstat, loadavg;
 *   own parsers when a fake procfs root is set), PSI, the cgroup of the
 *   watched process (v2, or v1 on hybrid hosts) and the process itself, and
 *   publishes them as edgelm_* metrics, plus rates of the standard inference
 *   counters.
 * - A classifier with hysteresis that turns these into flags
 *   (compute_bound, bandwidth_bound, cpu_contention, memory_pressure,
 *   swapping, io_bound), each with a reason, reported through a callback.
 * - Exposition: Prometheus text (HTTP /metrics through libmicrohttpd, or a
 *   node_exporter textfile written atomically) and JSON (the `metrics` IPC
 *   op, and the input of the `edgelmctl top` renderer).
 *
 * Every name and rule is documented in docs/monitor.md.
 *
 * Typical daemon use:
 *   struct monitor_params p;
 *   monitor_params_default(&p);
 *   p.on_flag = log_flag; p.on_flag_ud = d;        (runs on the sampler thread)
 *   monitor_new(&p, &m, &err);
 *   const struct monitor_inference *inf = monitor_inference_get(m);
 *   monitor_gauge_set(inf->workers, n_threads);
 *   monitor_start(m, &err);                         (sampler thread, 1 Hz)
 *   monitor_http_start(m, "127.0.0.1:9477", &err);  (or skip when "off")
 *   ... scheduler: monitor_counter_add(inf->generation_tokens, n); ...
 *   ... IPC `metrics`: monitor_json_render(m, &txt, &len, &err) ...
 *   monitor_http_stop(m); monitor_stop(m); monitor_free(m);
 *
 * Library code: nothing here logs, exits or installs signal handlers
 * (except monitor_top_run(), the interactive loop, which says so). */
#ifndef EDGELM_MONITOR_H
#define EDGELM_MONITOR_H

#include "common/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct monitor monitor;
typedef struct monitor_family monitor_family;
typedef struct monitor_series monitor_series;

/* ------------------------------------------------------------------------
 * Flags */

enum monitor_flag {
	MONITOR_FLAG_COMPUTE_BOUND,
	MONITOR_FLAG_BANDWIDTH_BOUND,
	MONITOR_FLAG_CPU_CONTENTION,
	MONITOR_FLAG_MEMORY_PRESSURE,
	MONITOR_FLAG_SWAPPING,
	MONITOR_FLAG_IO_BOUND,
	MONITOR_FLAG_COUNT
};

/* "compute_bound", ...; NULL for an out-of-range value. */
const char *monitor_flag_name(enum monitor_flag f);

/* One flag change, passed to monitor_params.on_flag. Pointers are valid only
 * during the call. */
struct monitor_flag_event {
	enum monitor_flag flag;
	const char *name;   /* monitor_flag_name(flag) */
	bool on;            /* the new state */
	const char *reason; /* e.g. "run-queue wait 41% >= 15%; psi cpu some 38% >= 25%" */
	double time;        /* monotonic seconds of the sample that changed it */
};

typedef void (*monitor_flag_cb)(void *ud, const struct monitor_flag_event *ev);

/* Current state of one flag (monitor_flags_get). */
struct monitor_flag_state {
	bool on;
	char reason[192]; /* why it is on, or why it went off */
	double since;     /* monotonic seconds of the last change, 0 if never */
};

/* Classifier thresholds. Each rule has an "on" threshold and an "off" one
 * (value hysteresis), and a flag changes only after on_samples (off_samples)
 * consecutive samples that satisfy the on (off) rule (time hysteresis).
 * Ratios are 0..1, rates per second. docs/monitor.md gives each rule. */
struct monitor_thresholds {
	int on_samples;                     /* 2 */
	int off_samples;                    /* 3 */
	double active_min;                  /* 0.20: workers busy+waiting below this = idle */
	double compute_on, compute_off;     /* 0.90 / 0.75: workers' busy ratio */
	double bandwidth_on, bandwidth_off; /* 0.80 / 0.70: weight bandwidth / peak */
	double steal_on, steal_off;         /* 0.05 / 0.02: steal share of all CPU time */
	double throttle_on, throttle_off;   /* 0.10 / 0.03: cgroup throttled periods */
	double wait_on, wait_off;           /* 0.15 / 0.05: workers' run-queue wait ratio */
	double nivcsw_on; /* 50: involuntary switches per worker-second, with wait >= wait_off */
	double psi_cpu_on, psi_cpu_off;     /* 0.25 / 0.10: PSI cpu some stall ratio */
	double mem_avail_on, mem_avail_off; /* 0.10 / 0.15: MemAvailable/MemTotal (low = bad) */
	double psi_mem_on, psi_mem_off;     /* 0.10 / 0.02: PSI memory some stall ratio */
	double cg_mem_on, cg_mem_off;       /* 0.90 / 0.85: cgroup memory.current/memory.max */
	double swapin_on, swapin_off;       /* 262144 / 4096: swap-in bytes per second */
	double majflt_on, majflt_off;       /* 20 / 2: the process' major faults per second */
	double psi_io_on, psi_io_off;       /* 0.20 / 0.05: PSI io some stall ratio */
};

void monitor_thresholds_default(struct monitor_thresholds *t);

/* ------------------------------------------------------------------------
 * Lifecycle and sampling */

struct monitor_params {
	/* Roots of procfs and sysfs. NULL: $EDGELM_PROCFS_ROOT or "/proc", and
	 * $EDGELM_SYSFS_ROOT or "/sys" (read once, in monitor_new). cgroup fs is
	 * <sysfs root>/fs/cgroup. With the real /proc, /proc/stat, meminfo,
	 * vmstat and loadavg are read through libproc2; with any other root
	 * through the module's own parsers (libproc2 always reads /proc). */
	const char *procfs_root;
	const char *sysfs_root;
	int pid;                   /* process to watch; 0 = this process */
	unsigned interval_ms;      /* monitor_start() period; 1000 */
	const char *worker_prefix; /* thread-name prefix of engine workers; "edgelmd:w" */
	const char *textfile_path; /* if set, written (atomically) after every sample */
	unsigned max_series;       /* label sets per family (cardinality cap); 256 */
	struct monitor_thresholds th;
	monitor_flag_cb on_flag; /* flag changes; called on the sampling thread */
	void *on_flag_ud;
	/* Called at the start of every sample, on the sampling thread, so the
	 * daemon can copy its stats structs into the standard counters first. */
	void (*pre_sample)(void *ud, monitor *m);
	void *pre_sample_ud;
};

void monitor_params_default(struct monitor_params *p);

/* Create a monitor and its standard families (docs/monitor.md). `p` may be
 * NULL for the defaults; its strings are copied. */
int monitor_new(const struct monitor_params *p, monitor **ret_m, struct cm_err *err);
/* Stops the HTTP server and the sampler thread if running. NULL is fine. */
void monitor_free(monitor *m);

/* Take one sample now: read every source, update the metrics, classify, call
 * on_flag for each change, write the textfile. `now_ns` is the monotonic
 * time of the sample (0 = now); tests pass synthetic times to replay traces.
 * Sources that do not exist (no PSI, no cgroup) are skipped silently; a
 * source that fails is counted in edgelm_monitor_sample_errors_total and the
 * first failure is returned after the rest of the sample is done. */
int monitor_sample(monitor *m, uint64_t now_ns, struct cm_err *err);

/* Run monitor_sample() every interval_ms on a thread of the monitor's own
 * ("edgelmd:monitor"). monitor_stop() joins it; both are idempotent. */
int monitor_start(monitor *m, struct cm_err *err);
void monitor_stop(monitor *m);

/* Copy the current state of all flags. */
void monitor_flags_get(monitor *m, struct monitor_flag_state ret_flags[MONITOR_FLAG_COUNT]);

/* ------------------------------------------------------------------------
 * Registry */

enum monitor_type {
	MONITOR_TYPE_COUNTER,
	MONITOR_TYPE_GAUGE,
	MONITOR_TYPE_HISTOGRAM,
};

struct monitor_family_desc {
	enum monitor_type type;
	const char *name; /* [a-zA-Z_][a-zA-Z0-9_]*; counters end in _total, others don't */
	const char *help; /* one line */
	const char *const *labels; /* label names; n_labels of them (max 8) */
	size_t n_labels;
	const double *buckets; /* histogram upper bounds, strictly increasing, finite */
	size_t n_buckets;      /* +Inf is implicit; max 64 */
	/* An info gauge (name ending in _info): series at 0 are left out of both
	 * renderings, so setting the label set replaced to 0 and the new one to
	 * 1 shows only the one in force (series cannot be removed). */
	bool info;
};

/* Register a family. Names are checked (charset, no ':', _total rule, no
 * clash with another family or its _bucket/_sum/_count), label names too
 * (no "le" in histograms, no "__" prefix). */
int monitor_family_add(monitor *m, const struct monitor_family_desc *d, monitor_family **ret_f,
                       struct cm_err *err);
/* The family called `name`, or NULL. */
monitor_family *monitor_family_find(monitor *m, const char *name);

/* The series with these label values (n_labels of them, in the family's
 * order), created on first use. Fails with -ENOSPC past max_series. The
 * handle stays valid until monitor_free(); look it up once, update it often. */
int monitor_series_get(monitor_family *f, const char *const *values, monitor_series **ret_s,
                       struct cm_err *err);

/* Lock-free updates, safe from any thread. Counters: v >= 0 (others ignored).
 * monitor_counter_set mirrors a cumulative source (engine stats): it must not
 * go down except on a real reset. */
void monitor_counter_add(monitor_series *s, double v);
void monitor_counter_inc(monitor_series *s);
void monitor_counter_set(monitor_series *s, double v);
void monitor_gauge_set(monitor_series *s, double v);
void monitor_gauge_add(monitor_series *s, double v);
void monitor_histogram_observe(monitor_series *s, double v);
/* Counter or gauge value; histogram: its sum. */
double monitor_series_value(const monitor_series *s);

/* The standard inference figures, created by monitor_new(). The daemon
 * updates them (directly from the scheduler, or by copying engine stats in
 * pre_sample); the sampler derives rates, ratios and flags from them. */
struct monitor_inference {
	monitor_family *requests;          /* edgelm_requests_total{op,outcome} */
	monitor_series *running;           /* edgelm_sequences_running */
	monitor_series *queued;            /* edgelm_sequences_queued */
	monitor_series *prompt_tokens;     /* edgelm_prompt_tokens_total */
	monitor_series *prefill_tokens;    /* edgelm_prefill_tokens_total (computed, not cached) */
	monitor_series *generation_tokens; /* edgelm_generation_tokens_total */
	monitor_series *prefill_seconds;   /* edgelm_prefill_seconds_total (engine time) */
	monitor_series *decode_seconds;    /* edgelm_decode_seconds_total (engine time) */
	monitor_series *weight_bytes;      /* edgelm_weight_read_bytes_total */
	monitor_series *peak_bandwidth;    /* edgelm_memory_peak_bandwidth_bytes_per_second */
	monitor_series *kv_used;           /* edgelm_kv_cache_used_tokens */
	monitor_series *kv_capacity;       /* edgelm_kv_cache_capacity_tokens */
	monitor_series *prefix_lookups;    /* edgelm_prefix_cache_lookups_total */
	monitor_series *prefix_hits;       /* edgelm_prefix_cache_hits_total */
	monitor_series *prefix_hit_tokens; /* edgelm_prefix_cache_hit_tokens_total */
	monitor_series *loading;           /* edgelm_model_loading (0/1) */
	monitor_series *workers;           /* edgelm_engine_workers */
	monitor_series *ttft;              /* histogram edgelm_time_to_first_token_seconds */
	monitor_series *tpot;              /* histogram edgelm_time_per_output_token_seconds */
	monitor_series *queue_wait;        /* histogram edgelm_queue_wait_seconds */
	monitor_series *duration;          /* histogram edgelm_request_duration_seconds */
};

const struct monitor_inference *monitor_inference_get(monitor *m);

/* ------------------------------------------------------------------------
 * Exposition. Texts are allocated with cm_malloc; the caller cm_free()s. */

/* Prometheus text format 0.0.4. */
int monitor_prometheus_render(monitor *m, char **ret_text, size_t *ret_len, struct cm_err *err);
/* The same figures as JSON, plus the flags with reasons (schema in
 * docs/monitor.md): the `metrics` IPC op's answer and top's input. */
int monitor_json_render(monitor *m, char **ret_text, size_t *ret_len, struct cm_err *err);
/* Write the Prometheus text to `path` through a temporary file in the same
 * directory and rename(2), so node_exporter never reads half a file. */
int monitor_textfile_write(monitor *m, const char *path, struct cm_err *err);

#define MONITOR_HTTP_LISTEN_DEFAULT "127.0.0.1:9477"

/* Serve GET /metrics on `listen` ("ADDR:PORT", "[ADDR6]:PORT"; port 0 picks
 * one). NULL, "" or "off" does nothing and returns 0. Other paths get 404,
 * other methods 405. */
int monitor_http_start(monitor *m, const char *listen, struct cm_err *err);
/* The bound port, or 0 when not serving. */
int monitor_http_port(monitor *m);
void monitor_http_stop(monitor *m);

/* ------------------------------------------------------------------------
 * `edgelmctl top` */

/* Render one frame of the top view from a metrics JSON text (as made by
 * monitor_json_render) into buf (always NUL-terminated; cut at cap), at most
 * `width` columns (clamped to 40..200). Plain text, no escape sequences. */
int monitor_top_render(const char *json, int width, char *buf, size_t cap, struct cm_err *err);

/* Fetch a metrics JSON text; store a cm_malloc'ed, NUL-terminated text in
 * *ret_json. Return 0 or -errno (the frame then shows err->msg). */
typedef int (*monitor_fetch_cb)(void *ud, char **ret_json, struct cm_err *err);

/* The interactive loop of `edgelmctl top`: fetch, render, redraw every
 * interval_ms (1000 if 0) until 'q', 'Q' or Ctrl-C on in_fd, EOF on in_fd,
 * or SIGINT/SIGTERM. When in_fd is a terminal it is put in raw mode (Ctrl-C
 * arrives as a byte), when out_fd is one the alternate screen is used; both
 * are restored on return. SIGINT/SIGTERM handlers are installed for the
 * duration of the call and restored. Returns 0 on a clean quit. */
int monitor_top_run(monitor_fetch_cb fetch, void *ud, unsigned interval_ms, int in_fd, int out_fd,
                    struct cm_err *err);

#endif
