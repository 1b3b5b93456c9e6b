/* monitor/monitor_impl.h: what the monitor's files share. Not installed;
 * tests may include it to reach the samplers and the classifier directly. */
#ifndef EDGELM_MONITOR_IMPL_H
#define EDGELM_MONITOR_IMPL_H

#include "monitor/monitor.h"

#include <pthread.h>
#include <stdatomic.h>

#define MON_MAX_LABELS 8
#define MON_MAX_BUCKETS 64
#define MON_MAX_CPUS 1024
#define MON_MAX_THREADS 4096
#define MON_MAX_THREAD_NAMES 64 /* distinct names in edgelm_thread_cpu_seconds_total */
#define MON_REASON 192

/* ---- registry.c ------------------------------------------------------- */

struct monitor_series {
	struct monitor_family *fam;
	struct monitor_series *next;
	char **values;             /* fam->n_labels strings */
	_Atomic uint64_t v;        /* double bits: counter/gauge value, histogram sum */
	_Atomic uint64_t count;    /* histogram observations */
	_Atomic uint64_t *buckets; /* histogram: n_buckets + 1 (last: above every bound) */
};

struct mon_reg;

struct monitor_family {
	struct mon_reg *reg;
	struct monitor_family *next;
	enum monitor_type type;
	char *name;
	char *help;
	char *labels[MON_MAX_LABELS];
	size_t n_labels;
	double *buckets;
	size_t n_buckets;
	struct monitor_series *head, *tail;
	size_t n_series;
	bool info; /* series at 0 are not rendered */
};

struct mon_reg {
	pthread_mutex_t mu; /* structure only (families, series lists) */
	struct monitor_family *head, *tail;
	unsigned max_series;
};

int mon_reg_init(struct mon_reg *r, unsigned max_series);
void mon_reg_fini(struct mon_reg *r);
int mon_reg_family_add(struct mon_reg *r, const struct monitor_family_desc *d,
                       monitor_family **ret_f, struct cm_err *err);
monitor_family *mon_reg_family_find(struct mon_reg *r, const char *name);
/* Variadic shorthand for monitor_series_get: up to MON_MAX_LABELS values.
 * Returns NULL on failure (counted by the caller as a sampler error). */
monitor_series *mon_reg_series(monitor_family *f, ...);
double mon_load_double(const _Atomic uint64_t *p);
/* Whether a series is rendered (an info family's series at 0 are not). */
bool mon_series_visible(const struct monitor_series *s);
bool mon_name_valid(const char *s);

/* ---- fsutil.c -------------------------------------------------------- */

/* A growable read buffer; every procfs/sysfs file goes through it. */
struct mon_buf {
	char *p;
	size_t cap;
};
void mon_buf_fini(struct mon_buf *b);
/* Read a whole file into b (NUL-terminated). Returns its length or -errno. */
long mon_read_file(struct mon_buf *b, const char *path);
/* Read the first unsigned integer of a file ("max" gives UINT64_MAX). */
int mon_read_u64(struct mon_buf *b, const char *path, uint64_t *ret);
/* Value of "key <sep> N" within a text; false if absent. */
bool mon_kv_u64(const char *text, const char *key, uint64_t *ret);

/* ---- sample_sys.c ----------------------------------------------------- */

enum {
	CPU_USER,
	CPU_NICE,
	CPU_SYSTEM,
	CPU_IDLE,
	CPU_IOWAIT,
	CPU_IRQ,
	CPU_SOFTIRQ,
	CPU_STEAL,
	CPU_MODES
};
extern const char *const mon_cpu_mode_names[CPU_MODES];

struct sys_cpu {
	int id;
	uint64_t t[CPU_MODES]; /* USER_HZ ticks */
};

struct sys_sample {
	bool have_stat, have_mem, have_vm, have_load;
	int ncpu;
	struct sys_cpu *cpus; /* ncpu entries, owned */
	int cpus_cap;
	uint64_t procs_running, procs_blocked;
	double load[3];
	uint64_t mem_total, mem_avail, swap_total, swap_free; /* bytes */
	uint64_t pswpin, pswpout, pgmajfault, oom_kill;       /* vmstat counters */
	bool have_oom_kill;
};

struct sys_reader; /* libproc2 handles, or NULL for the parsers */

int mon_sys_reader_new(bool use_libproc2, struct sys_reader **ret, struct cm_err *err);
void mon_sys_reader_free(struct sys_reader *r);
void mon_sys_sample_fini(struct sys_sample *s);
/* Fill s. Each part that fails leaves its have_* false; returns the first
 * error. */
int mon_sys_read(struct sys_reader *r, struct mon_buf *b, const char *procfs, struct sys_sample *s,
                 struct cm_err *err);
/* The parsers, used for fake roots (and by tests against libproc2). */
int mon_sys_parse_stat(const char *text, struct sys_sample *s);
int mon_sys_parse_meminfo(const char *text, struct sys_sample *s);
int mon_sys_parse_vmstat(const char *text, struct sys_sample *s);
int mon_sys_parse_loadavg(const char *text, struct sys_sample *s);

/* ---- psi.c ------------------------------------------------------------ */

enum { PSI_CPU, PSI_MEMORY, PSI_IO, PSI_N };
extern const char *const mon_psi_names[PSI_N];

struct psi_line {
	bool have;
	double avg10, avg60, avg300; /* percent */
	uint64_t total;              /* microseconds stalled */
};

struct psi_res {
	bool present;
	struct psi_line some, full;
};

int mon_psi_parse(const char *text, struct psi_res *r);
/* Reads <procfs>/pressure/{cpu,memory,io}. Missing files: present = false, 0. */
int mon_psi_read(struct mon_buf *b, const char *procfs, struct psi_res r[PSI_N],
                 struct cm_err *err);

/* ---- sample_proc.c ---------------------------------------------------- */

struct proc_thread {
	int tid;
	char name[32];
	bool seen;   /* in the current sample */
	bool worker; /* name starts with worker_prefix */
	bool fresh;  /* first seen in the current sample: deltas are totals */
	uint64_t utime, stime, run_ns, run_delay_ns, nvcsw, nivcsw;             /* cumulative */
	uint64_t d_utime, d_stime, d_run_ns, d_run_delay_ns, d_nvcsw, d_nivcsw; /* since last */
};

struct proc_sample {
	bool have;
	uint64_t utime, stime, majflt, num_threads; /* whole process */
	uint64_t rss, locked, swap;                 /* bytes */
	bool have_sched;                            /* schedstat readable */
	struct proc_thread *th;                     /* per-thread table, owned */
	size_t n_th, cap_th;
};

void mon_proc_sample_fini(struct proc_sample *s);
int mon_proc_parse_stat(const char *text, char *ret_comm, size_t comm_cap, uint64_t *utime,
                        uint64_t *stime, uint64_t *majflt, uint64_t *num_threads);
/* Read <procfs>/<pid>/ and its tasks; pid 0 = "self". Updates the thread
 * table in s (deltas against the previous call). */
int mon_proc_read(struct mon_buf *b, const char *procfs, int pid, const char *worker_prefix,
                  struct proc_sample *s, struct cm_err *err);

/* ---- cgroup.c --------------------------------------------------------- */

struct cg_sample {
	int version; /* 0: not in a (non-root) cgroup, 1 or 2 */
	char path[256];
	bool have_mem;
	uint64_t mem_current, mem_max; /* mem_max UINT64_MAX = unlimited */
	bool have_events;
	uint64_t ev_low, ev_high, ev_max, ev_oom, ev_oom_kill;
	bool have_cpu;
	uint64_t nr_periods, nr_throttled, throttled_usec;
};

int mon_cgroup_read(struct mon_buf *b, const char *procfs, const char *sysfs, int pid,
                    struct cg_sample *s, struct cm_err *err);

/* ---- classify.c ------------------------------------------------------- */

/* The per-sample signals the rules look at (monitor.c derives them). A
 * negative value means "not available" where noted. */
struct classify_in {
	bool active;     /* workers busy + waiting >= active_min */
	bool generating; /* sequences running, or tokens produced this interval */
	bool loading;    /* edgelm_model_loading != 0 */
	double worker_busy, worker_wait, nivcsw_rate;
	double steal;                    /* -1: n/a */
	double throttled;                /* -1: n/a */
	double psi_cpu, psi_mem, psi_io; /* -1: n/a */
	double mem_avail;                /* -1: n/a */
	double cg_mem;                   /* -1: n/a (no limit) */
	double cg_events;                /* memory.events high+max+oom delta */
	double swapin_rate;              /* bytes/s */
	double majflt_rate;              /* the process', per second */
	double bw_ratio;                 /* -1: n/a */
};

struct flag_machine {
	bool on;
	int count;
	double since;
	char reason[MON_REASON];
};

struct classify_state {
	struct flag_machine f[MONITOR_FLAG_COUNT];
};

/* Advance every flag by one sample. Writes changes to ret_ev (with reasons
 * pointing into st) and returns how many. */
int mon_classify_step(struct classify_state *st, const struct monitor_thresholds *th,
                      const struct classify_in *in, double t,
                      struct monitor_flag_event ret_ev[MONITOR_FLAG_COUNT]);

/* ---- monitor.c -------------------------------------------------------- */

struct mon_fams {
	monitor_family *cpu_seconds, *cpu_busy, *cpu_steal, *cpu_iowait, *load1, *load5, *load15,
	    *procs_running, *procs_blocked, *mem_total, *mem_avail, *mem_used, *swap_total,
	    *swap_used, *swap_in, *swap_out, *swap_in_rate, *swap_out_rate, *majflt, *majflt_rate,
	    *oom_kills, *psi_total, *psi_avg10, *psi_ratio, *cg_mem_current, *cg_mem_max,
	    *cg_mem_ratio, *cg_events, *cg_periods, *cg_throttled, *cg_throttled_seconds,
	    *cg_throttled_ratio, *proc_rss, *proc_locked, *proc_swap, *proc_cpu, *proc_threads,
	    *proc_csw, *proc_majflt, *proc_majflt_rate, *thread_cpu, *worker_busy, *worker_wait,
	    *worker_nivcsw, *prefill_rate, *decode_rate, *bw, *bw_ratio, *kv_ratio, *flag,
	    *flag_changes, *mon_samples, *mon_errors, *mon_cpu, *mon_duration, *mon_info;
};

/* Previous values of the inference counters, for rates. */
struct infer_prev {
	double prefill_tokens, generation_tokens, prefill_seconds, decode_seconds, weight_bytes;
};

struct monitor {
	char *procfs, *sysfs, *worker_prefix, *textfile;
	bool use_libproc2;
	struct monitor_params p; /* string fields point at the copies above */
	struct mon_reg reg;
	struct mon_fams fam;
	struct monitor_inference inf;

	/* sampling: everything below until state_mu is owned by sample_mu */
	pthread_mutex_t sample_mu;
	struct sys_reader *sysr;
	struct mon_buf buf;
	struct sys_sample sys[2]; /* [cur], [!cur] */
	struct psi_res psi[2][PSI_N];
	struct proc_sample proc; /* carries its own thread table */
	struct {
		bool have;
		uint64_t utime, stime, majflt;
	} pp; /* previous whole-process totals */
	struct cg_sample cg[2];
	struct infer_prev ip;
	int cur;
	bool have_prev;
	uint64_t prev_ns;
	struct classify_state cls;

	/* what readers see */
	pthread_mutex_t state_mu;
	struct monitor_flag_state flags[MONITOR_FLAG_COUNT];
	double interval; /* seconds between the last two samples */
	uint64_t n_samples;
	char last_error[256];
	uint64_t created_ns;
	double created_unix;

	/* sampler thread */
	pthread_mutex_t th_mu;
	pthread_cond_t th_cv;
	pthread_t th;
	bool th_running, th_stop;

	/* http.c */
	void *http; /* struct http_server (http.c) */
	int http_port;
};

#endif
