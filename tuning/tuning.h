/* tuning/tuning.h: make the box fast for inference, say what was done, undo
 * it on the way out. The one public header of tuning/ (docs/tuning.md).
 *
 * Every knob follows the same four steps: read the current state, apply,
 * report, restore. The daemon drives them in this order (main thread, before
 * any other thread exists):
 *
 *   tuning_paths_from_env(&paths)              roots for sysfs, procfs, ...
 *   tuning_detect(&paths, &report)             read-only detection report
 *   tuning_plan_make(&report, &config, &plan)  what each knob would do
 *   --check:  tuning_report_print(stdout, &report, &plan); exit
 *   tuning_memory_fit_check(&report, model, kv)     refuse before loading
 *   tuning_apply(&plan, &paths, &state)        governor/EPP (state file first),
 *                                              nice, oom_score_adj, service
 *                                              affinity, NUMA policy, AMX
 *   tuning_load_begin(&plan, &state)           lower I/O priority for loading
 *     (engine loads; tuning_hugepage_alloc / tuning_prefault if plan says so)
 *   tuning_load_end(&state)
 *   tuning_memory_lock(&plan, &report, regions, &state)   weights + KV cache
 *   tuning_thread_sched_batch(true) ; engine starts its pinned pool ;
 *   tuning_thread_sched_batch(false)           (workers inherit SCHED_BATCH)
 *   ... serve; `info` embeds tuning_state_json(&state, &plan) ...
 *   tuning_restore(&state, &paths)             on SIGTERM / normal exit
 *   --restore-tuning: tuning_restore_from_file(&paths, &state)
 *
 * Rules: functions return 0 or a negative errno and fill an optional struct
 * cm_err; nothing here logs. tuning_apply never fails because of one knob:
 * each failure is recorded in the state with its reason, for the daemon to
 * log as a warning. Every sysfs/procfs path goes through struct tuning_paths,
 * so the same code runs against the real tree and against test trees. */
#ifndef EDGELM_TUNING_H
#define EDGELM_TUNING_H

#include "common/common.h"
#include "common/cpu.h"

#include <limits.h>
#include <stdio.h>

#define TUNING_MAX_CPUS 1024 /* glibc's CPU_SETSIZE; edge boxes are far below */
#define TUNING_MAX_NODES 64
#define TUNING_MAX_CACHES 8
#define TUNING_PATH_MAX 512
/* "leave this knob alone" for the integer knobs of struct tuning_config. */
#define TUNING_KEEP INT_MIN

/* ---- paths -------------------------------------------------------------- */

/* Where the module looks. Tests point these at fake trees; production uses
 * the defaults. Paths are absolute, without a trailing slash. */
struct tuning_paths {
	char sysfs_root[TUNING_PATH_MAX];  /* EDGELM_SYSFS_ROOT, default /sys */
	char procfs_root[TUNING_PATH_MAX]; /* EDGELM_PROCFS_ROOT, default /proc */
	char run_root[TUNING_PATH_MAX];    /* EDGELM_RUN_ROOT, default /run (systemd unit state) */
	char cgroup_root[TUNING_PATH_MAX]; /* EDGELM_CGROUP_ROOT, default <sysfs_root>/fs/cgroup */
	char
	    state_file[TUNING_PATH_MAX]; /* EDGELM_TUNING_STATE, default /run/edgelm/tuning.state */
};

void tuning_paths_default(struct tuning_paths *p);
/* Defaults, overridden by the environment variables named above. Fails with
 * -ENAMETOOLONG or -EINVAL (relative path) naming the variable. */
int tuning_paths_from_env(struct tuning_paths *p, struct cm_err *err);
/* True when procfs_root is the real /proc: CPU features then come from the
 * CPUID instruction (or hwcaps) of this CPU, else from <procfs>/cpuinfo. */
bool tuning_paths_is_live(const struct tuning_paths *p);

/* ---- CPU sets ----------------------------------------------------------- */

struct tuning_cpuset {
	uint64_t bits[TUNING_MAX_CPUS / 64];
};

static inline void tuning_cpuset_zero(struct tuning_cpuset *s)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(s->bits); i++)
		s->bits[i] = 0;
}
static inline void tuning_cpuset_add(struct tuning_cpuset *s, int cpu)
{
	if (cpu >= 0 && cpu < TUNING_MAX_CPUS)
		s->bits[cpu / 64] |= 1ull << (cpu % 64);
}
static inline void tuning_cpuset_del(struct tuning_cpuset *s, int cpu)
{
	if (cpu >= 0 && cpu < TUNING_MAX_CPUS)
		s->bits[cpu / 64] &= ~(1ull << (cpu % 64));
}
static inline bool tuning_cpuset_has(const struct tuning_cpuset *s, int cpu)
{
	return cpu >= 0 && cpu < TUNING_MAX_CPUS && (s->bits[cpu / 64] >> (cpu % 64)) & 1;
}
int tuning_cpuset_count(const struct tuning_cpuset *s);
/* Lowest cpu >= from in s, or -1. */
int tuning_cpuset_next(const struct tuning_cpuset *s, int from);
void tuning_cpuset_and(struct tuning_cpuset *d, const struct tuning_cpuset *s);
void tuning_cpuset_or(struct tuning_cpuset *d, const struct tuning_cpuset *s);
bool tuning_cpuset_equal(const struct tuning_cpuset *a, const struct tuning_cpuset *b);
/* Kernel list format "0-3,8,10-11" (whitespace and empty list allowed).
 * -EINVAL on syntax, -ERANGE for cpus >= TUNING_MAX_CPUS. */
int tuning_cpuset_parse(const char *list, struct tuning_cpuset *ret, struct cm_err *err);
/* Writes the list format ("" for an empty set); -ENOSPC if it does not fit
 * (the buffer then holds a truncated list ending in "..."). */
int tuning_cpuset_format(const struct tuning_cpuset *s, char *buf, size_t len);

/* ---- CPU identity and instruction sets ---------------------------------- */

struct tuning_cpu {
	char arch[16];   /* "x86_64", "aarch64" */
	char vendor[32]; /* "GenuineIntel", "AuthenticAMD", "ARM", ... */
	char model[96];  /* "model name" of /proc/cpuinfo, else the CPUID brand string */
	int family, model_id, stepping; /* x86 display family/model; ARM: implementer/part */
	char source[48];           /* where the ISA came from: "cpuid+xgetbv", "hwcap", "cpuinfo" */
	/* the common probe's (common/cpu.h), or a fake tree's cpuinfo */
	struct cm_cpu_isa isa;     /* usable (CPU + OS) */
	struct cm_cpu_isa cpu_has; /* what the CPU reports, before the OS check */
	bool os_avx;               /* XCR0: OS saves YMM */
	bool os_avx512;            /* XCR0: OS saves opmask + ZMM */
	bool os_amx;               /* XCR0: OS saves XTILECFG + XTILEDATA */
	bool amx_permitted;        /* ARCH_GET_XCOMP_PERM includes XTILEDATA */
	bool hypervisor;           /* CPUID.1:ECX[31] or "hypervisor" flag */
	/* Cache sizes from libcpuid (KiB, -1 unknown): used in the report when
	 * sysfs has no cache/index* (VMs). */
	int l1d_kib, l2_kib, l3_kib;
	char notes[160]; /* e.g. what libcpuid missed that CPUID has */
};

/* This CPU: libcpuid for vendor/model/caches, CPUID for every ISA bit
 * (libcpuid 0.6 lacks AVX-VNNI, AVX512-BF16 and AMX, and misses AVX-512 on
 * recent AMD parts), XGETBV for OS support; aarch64 uses getauxval hwcaps.
 * Never fails on an unknown CPU: unknown fields stay empty/false. */
int tuning_cpu_detect(struct tuning_cpu *cpu, struct cm_err *err);
/* Fill cpu from the text of a /proc/cpuinfo (x86 "flags" or arm64
 * "Features"); the kernel hides flags whose state it does not save, so these
 * count as OS-supported. Used for fake trees. */
int tuning_cpu_parse_cpuinfo(const char *text, struct tuning_cpu *cpu);
/* Ask the kernel for AMX (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
 * Process-wide and permanent. -EOPNOTSUPP when the CPU/OS lacks AMX. */
int tuning_cpu_amx_request(struct tuning_cpu *cpu, struct cm_err *err);
/* The instruction sets to hand to the engine (engine_params.cpu): cpu->isa,
 * with AMX cleared unless the kernel has granted permission (checked now, on
 * x86). True when the report is the live CPU's (common/cpu.h's probe); a
 * fake tree's is for reports only, never for choosing kernels. */
bool tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct cm_cpu_isa *ret);
/* "avx2 fma f16c avx512f ..." of the set flags (kern_caps fields first). */
void tuning_isa_format(const struct cm_cpu_isa *isa, char *buf, size_t len);

/* ---- detection report --------------------------------------------------- */

struct tuning_cpu_info {
	bool present, online;
	int core; /* index into report.cores, -1 if unknown/offline */
	int core_id, package_id, die_id;
	int node;     /* NUMA node, -1 unknown */
	int capacity; /* cpu_capacity (ARM, hybrid): 1024 = fastest; 0 unknown */
	int max_khz;  /* cpuinfo_max_freq of its cpufreq policy; 0 unknown */
	int policy;   /* index into report.policies, -1 none */
};

/* One physical core: its SMT siblings share report.cpus[c].core. */
struct tuning_core {
	int first_cpu; /* lowest online logical cpu of the core */
	int n_threads; /* online logical cpus (SMT siblings) */
	int package, node;
	int capacity; /* max over its cpus (cpu_capacity, else max_khz), 0 unknown */
	bool big;     /* in the fastest class (see docs/tuning.md, big.LITTLE) */
};

struct tuning_cache {
	int level;
	char type[16];   /* "Data", "Instruction", "Unified" */
	uint64_t size;   /* bytes */
	int shared_cpus; /* logical cpus sharing one instance, 0 unknown */
};

struct tuning_node {
	int id;
	struct tuning_cpuset cpus;
	uint64_t mem_total, mem_avail; /* bytes; avail = free + file pages + reclaimable slab */
};

/* One cpufreq policy (devices/system/cpu/cpufreq/policyN). */
struct tuning_policy {
	char name[32];             /* "policy0" */
	struct tuning_cpuset cpus; /* affected_cpus (related_cpus if absent) */
	char driver[32];           /* scaling_driver */
	char governor[32];         /* scaling_governor */
	char governors[256];       /* scaling_available_governors */
	bool has_epp;
	char epp[48];   /* energy_performance_preference */
	char epps[256]; /* energy_performance_available_preferences */
	int max_khz;    /* cpuinfo_max_freq */
	int gov_access; /* access(scaling_governor, W_OK): 0 or -errno */
	int epp_access; /* same for energy_performance_preference */
};

struct tuning_cgroup {
	int version;    /* 0 none found, 1 (v1 controllers), 2 (unified) */
	char path[256]; /* from /proc/self/cgroup */
	bool has_cpuset;
	struct tuning_cpuset cpuset; /* cpuset.cpus.effective (v1: cpuset.effective_cpus) */
	bool has_quota;              /* the most restrictive cpu.max on the way to the root */
	int64_t quota_us, period_us;
	int quota_cpus; /* floor(quota/period), at least 1; 0 without quota */
	bool has_mem_limit;
	uint64_t mem_limit, mem_usage, mem_file; /* memory.max, .current, stat "file" */
};

/* Who else manages the CPU frequency, if anyone. */
struct tuning_power_owner {
	bool found;
	char name[32]; /* "tuned", "power-profiles-daemon", "tlp", "cpupower", "auto-cpufreq" */
	char how[128]; /* "process tuned (pid 812)", "unit tlp.service is active" */
};

struct tuning_mem {
	uint64_t total, available, swap_total, swap_free;        /* bytes, /proc/meminfo */
	uint64_t hugepage_size, hugepages_total, hugepages_free; /* hugetlbfs pool */
	char thp_enabled[16]; /* "always", "madvise", "never", "" absent */
	char thp_defrag[24];
	bool memlock_unlimited;
	uint64_t memlock_limit; /* RLIMIT_MEMLOCK soft, bytes (self/limits) */
	bool cap_ipc_lock, cap_sys_nice, cap_sys_resource; /* CapEff of self/status */
	int nice_floor;     /* lowest nice allowed by RLIMIT_NICE: 20 - rlim */
	int numa_balancing; /* kernel.numa_balancing, -1 unknown */
};

struct tuning_report {
	struct tuning_cpu cpu;
	int n_cpu_slots; /* cpus[] is indexed by cpu id, 0..n_cpu_slots-1 */
	struct tuning_cpu_info *cpus;
	int n_cores;
	struct tuning_core *cores;
	int n_packages;
	bool smt;    /* some core has more than one online thread */
	bool hybrid; /* cores of different capacity (big.LITTLE) */
	struct tuning_cpuset online;
	struct tuning_cpuset affinity; /* Cpus_allowed_list of <procfs>/self/status */
	struct tuning_cpuset usable;   /* online & affinity & cgroup cpuset */
	int usable_cores;              /* physical cores with a usable cpu */
	int n_caches;
	struct tuning_cache caches[TUNING_MAX_CACHES]; /* as seen by the first usable cpu */
	char cache_source[16];                         /* "sysfs", "libcpuid", "" */
	int n_nodes;
	struct tuning_node nodes[TUNING_MAX_NODES];
	uint64_t mems_allowed; /* Mems_allowed_list as a node mask (first 64) */
	struct tuning_cgroup cgroup;
	bool cpufreq; /* at least one cpufreq policy */
	int n_policies;
	struct tuning_policy *policies;
	struct tuning_power_owner power_owner;
	struct tuning_mem mem;
	/* process state now (calling thread where per-thread) */
	int nice;
	int oom_score_adj; /* TUNING_KEEP when unreadable */
	int ioprio_class, ioprio_level;
	char boot_id[40];
};

void tuning_report_init(struct tuning_report *r);
void tuning_report_fini(struct tuning_report *r);
/* Read everything the report holds into r (initialised with
 * tuning_report_init; a used one is reset). Missing optional files
 * (cpufreq, cache, NUMA, cgroup) are recorded as absent, not errors; only an
 * unreadable CPU list (-ENOENT...) or no memory (-ENOMEM) fails. */
int tuning_detect(const struct tuning_paths *paths, struct tuning_report *r, struct cm_err *err);

/* ---- configuration ------------------------------------------------------ */

enum tuning_mlock {
	TUNING_MLOCK_OFF,
	TUNING_MLOCK_ON,  /* mlock() the regions the daemon passes (weights, KV) */
	TUNING_MLOCK_ALL, /* mlockall(MCL_CURRENT | MCL_FUTURE) */
};

enum tuning_numa {
	TUNING_NUMA_AUTO,       /* one node if the model fits there, else interleave */
	TUNING_NUMA_NODE,       /* workers and memory on one node */
	TUNING_NUMA_INTERLEAVE, /* workers on all nodes, memory interleaved */
	TUNING_NUMA_OFF,        /* leave placement to the kernel */
};

enum tuning_ioprio {
	TUNING_IOPRIO_KEEP,
	TUNING_IOPRIO_BE,   /* best effort, level 0 (high) .. 7 (low) */
	TUNING_IOPRIO_IDLE, /* only when the disk is otherwise idle */
};

struct tuning_config {
	int threads;       /* workers; 0 = one per usable physical core */
	bool pin;          /* pin workers; keep service threads off their cores */
	char governor[64]; /* "performance", "a|b" (first available), "keep" */
	char epp[48];      /* energy_performance_preference, or "keep" */
	int nice;          /* -20..19 or TUNING_KEEP */
	bool sched_batch;  /* SCHED_BATCH for the workers */
	enum tuning_ioprio load_ioprio;
	int load_ioprio_level; /* 0..7 for TUNING_IOPRIO_BE */
	enum tuning_mlock mlock;
	bool hugepages; /* copy weights to 2 MiB-aligned anonymous memory */
	bool prefault;  /* touch the weights at load */
	enum tuning_numa numa;
	int numa_node;     /* for TUNING_NUMA_NODE: -1 = choose */
	int oom_score_adj; /* -1000..1000 or TUNING_KEEP */
	bool amx;          /* request AMX permission when the CPU has it */
	/* What the daemon will load, when known (0 = unknown): NUMA, huge page
	 * and mlock decisions use them. */
	uint64_t model_bytes, kv_bytes;
};

/* Defaults: threads auto, pin on, governor/EPP "performance", nice -5, no
 * SCHED_BATCH, load I/O best-effort 7, mlock on, huge pages off, prefault
 * on, NUMA auto, oom_score_adj kept, AMX on. */
void tuning_config_default(struct tuning_config *c);
/* Name <-> value for config files and reports. *_parse return -EINVAL. */
const char *tuning_mlock_name(enum tuning_mlock m);
int tuning_mlock_parse(const char *s, enum tuning_mlock *ret);
const char *tuning_numa_name(enum tuning_numa n);
int tuning_numa_parse(const char *s, enum tuning_numa *ret);
/* "keep", "idle", "be", "be:N" */
int tuning_ioprio_parse(const char *s, enum tuning_ioprio *ret_class, int *ret_level);

/* ---- plan --------------------------------------------------------------- */

enum tuning_knob_kind {
	TUNING_KNOB_THREADS,
	TUNING_KNOB_PINNING,
	TUNING_KNOB_AFFINITY, /* main thread (and so scheduler/IPC threads) -> service cpus */
	TUNING_KNOB_NUMA,
	TUNING_KNOB_GOVERNOR, /* one per cpufreq policy; persistent */
	TUNING_KNOB_EPP,      /* one per cpufreq policy; persistent */
	TUNING_KNOB_NICE,
	TUNING_KNOB_SCHED_BATCH,
	TUNING_KNOB_IOPRIO, /* for model loading */
	TUNING_KNOB_OOM_SCORE_ADJ,
	TUNING_KNOB_MLOCK,
	TUNING_KNOB_HUGEPAGES,
	TUNING_KNOB_PREFAULT,
	TUNING_KNOB_AMX,
	TUNING_KNOB_COUNT
};

enum tuning_knob_status {
	TUNING_KNOB_APPLY,   /* will change current -> wanted */
	TUNING_KNOB_ALREADY, /* already as wanted */
	TUNING_KNOB_OFF,     /* disabled by config */
	TUNING_KNOB_NA,      /* does not apply to this box (no cpufreq, one node...) */
	TUNING_KNOB_BLOCKED, /* wanted, but something blocks it: reason says what and the fix */
};

struct tuning_knob {
	enum tuning_knob_kind kind;
	enum tuning_knob_status status;
	char target[96]; /* sysfs path relative to the root, "process", "workers", ... */
	char current[64];
	char wanted[96];
	char reason[256]; /* for BLOCKED/NA/OFF, or a note */
};

struct tuning_plan {
	struct tuning_config cfg; /* the config it was made from */
	int n_workers;
	int worker_cpus[TUNING_MAX_CPUS]; /* worker i runs on worker_cpus[i] (when pin) */
	bool pin;
	struct tuning_cpuset workers; /* set of worker_cpus */
	struct tuning_cpuset service; /* scheduler + IPC threads */
	bool service_shared;          /* too few cores: service threads share the workers' */
	enum tuning_numa numa;        /* resolved: NODE, INTERLEAVE or OFF */
	int numa_node;                /* NODE: the node, else -1 */
	uint64_t numa_nodes;          /* INTERLEAVE: node mask */
	char threads_note[192];       /* how n_workers was derived */
	int n_knobs;
	struct tuning_knob *knobs;
};

void tuning_plan_init(struct tuning_plan *p);
void tuning_plan_fini(struct tuning_plan *p);
/* Decide workers, pinning and every knob from the report and config into
 * ret_plan (initialised with tuning_plan_init; a used one is reset). Pure:
 * reads no files and changes nothing. -EINVAL on a bad config value. */
int tuning_plan_make(const struct tuning_report *r, const struct tuning_config *c,
                     struct tuning_plan *ret_plan, struct cm_err *err);
/* First knob of a kind, or NULL. */
const struct tuning_knob *tuning_plan_knob(const struct tuning_plan *p, enum tuning_knob_kind k);
const char *tuning_knob_name(enum tuning_knob_kind k);
const char *tuning_knob_status_name(enum tuning_knob_status s);

/* ---- applied state, state file, restore --------------------------------- */

/* One change that was attempted. Persistent ones (sysfs) outlive the process
 * and are written to the state file; the others die with it but are still
 * restored on a normal exit. */
struct tuning_change {
	enum tuning_knob_kind kind;
	char target[96];
	char before[64];
	char after[64];
	bool persistent;
	int result;       /* 0 applied, 1 pending (in the file, not yet written), -errno failed */
	char reason[256]; /* failure reason with the fix */
	bool restored;
	int restore_result; /* 0 restored, 1 left alone (see restore_note), -errno */
	char restore_note[160];
};

struct tuning_state {
	int n_changes, cap_changes;
	struct tuning_change *changes;
	int n_failed; /* changes with result < 0 */
	long pid;     /* who applied it */
	char boot_id[40];
	bool mlocked;     /* memory was locked (munlockall on restore) */
	bool load_active; /* between tuning_load_begin and _end */
	int load_saved_ioprio;
};

void tuning_state_init(struct tuning_state *s);
void tuning_state_fini(struct tuning_state *s);

/* Apply the plan, knob by knob: governor and EPP (sysfs), nice,
 * oom_score_adj, the main thread's affinity (service cpus), the NUMA memory
 * policy and the AMX permission. Before the first sysfs write the state
 * file lists every sysfs change with its original value (written
 * atomically), so `edgelmd --restore-tuning` can undo it after kill -9; if
 * the file cannot be written, no sysfs file is touched. A state file left by
 * an earlier crash in the same boot is restored first. Never fails because
 * of a knob: each failure or BLOCKED knob is a change with result < 0 and a
 * reason (state->n_failed counts them) for the daemon to log as a warning.
 * Returns 0. */
int tuning_apply(const struct tuning_plan *plan, const struct tuning_paths *paths,
                 struct tuning_state *state, struct cm_err *err);
/* Undo every applied change in reverse order. A sysfs value that someone
 * else changed after us is left alone (noted in restore_note). On success
 * the state file is removed. Idempotent. -EIO if some restore failed (the
 * state file is kept for a later --restore-tuning). */
int tuning_restore(struct tuning_state *state, const struct tuning_paths *paths,
                   struct cm_err *err);

/* Write / read the state file (a small text file, see docs/tuning.md).
 * Save writes <path>.tmp, fsyncs and renames. Load fails with -ENOENT when
 * there is none, -ESTALE when it was written in an earlier boot, -EBADMSG
 * when a line is malformed or names a path outside the cpufreq files. */
int tuning_state_save(const struct tuning_state *s, const char *path, struct cm_err *err);
int tuning_state_load(const char *path, const struct tuning_paths *paths, struct tuning_state *ret,
                      struct cm_err *err);
/* `edgelmd --restore-tuning`: load the state file and restore it. 0 when
 * there was nothing to restore (no file; a file from an earlier boot, which
 * is removed) or all was restored. ret_state (may be NULL) receives what was
 * done, for printing. */
int tuning_restore_from_file(const struct tuning_paths *paths, struct tuning_state *ret_state,
                             struct cm_err *err);

/* ---- helpers the daemon calls at the right moment ----------------------- */

/* Lower the calling thread's I/O priority for loading the model
 * (plan->cfg.load_ioprio), and put it back. Recorded in the state. */
int tuning_load_begin(const struct tuning_plan *plan, struct tuning_state *st, struct cm_err *err);
int tuning_load_end(struct tuning_state *st, struct cm_err *err);

/* SCHED_BATCH (on) or SCHED_OTHER (off) for the calling thread; threads it
 * creates inherit it. Needs no privilege. */
int tuning_thread_sched_batch(bool on, struct cm_err *err);
/* Pin the calling thread to one cpu / a set. */
int tuning_thread_pin(int cpu, struct cm_err *err);
int tuning_thread_affinity(const struct tuning_cpuset *set, struct cm_err *err);

/* The model + KV cache must fit in MemAvailable (and in the cgroup's
 * memory.max). -ENOMEM with a message that says how much is needed and
 * available and what to do. */
int tuning_memory_fit_check(const struct tuning_report *r, uint64_t model_bytes, uint64_t kv_bytes,
                            struct cm_err *err);

/* Whether `bytes` can be locked: 0 if CAP_IPC_LOCK or RLIMIT_MEMLOCK allow
 * it, else -EPERM with the one warning to log (it names LimitMEMLOCK=infinity). */
int tuning_memlock_check(const struct tuning_report *r, uint64_t bytes, struct cm_err *err);

struct tuning_region {
	void *addr;
	size_t len;
	const char *what; /* "weights", "KV cache" */
};
/* Lock the regions (plan->cfg.mlock ON) or everything (ALL). Pass all the
 * regions in one call: on failure it returns -EPERM/-ENOMEM with one
 * warning for all of them (naming LimitMEMLOCK=infinity), which the daemon
 * logs before serving unlocked. Later calls with the same state do nothing
 * and return 0, so the warning comes once. 0 with nothing done when mlock is
 * off. tuning_restore unlocks (munlockall). */
int tuning_memory_lock(const struct tuning_plan *plan, const struct tuning_report *r,
                       const struct tuning_region *regions, int n_regions, struct tuning_state *st,
                       struct cm_err *err);

/* 2 MiB-aligned anonymous memory with MADV_HUGEPAGE, for the engine's copy
 * of the weights. The kernel only gives huge pages to anonymous memory, not
 * to a read-only file mapping. */
struct tuning_hugepage_buf {
	void *addr;     /* 2 MiB aligned, len bytes usable */
	size_t len;     /* rounded up to 2 MiB */
	void *map_addr; /* what to munmap */
	size_t map_len;
	bool madvised;        /* MADV_HUGEPAGE accepted */
	char thp_enabled[16]; /* "always", "madvise", "never", "" unknown */
	bool thp_effective;   /* enabled is always or madvise */
};
int tuning_hugepage_alloc(const struct tuning_paths *paths, size_t size,
                          struct tuning_hugepage_buf *ret, struct cm_err *err);
void tuning_hugepage_free(struct tuning_hugepage_buf *b);
/* Resident and huge-page-backed bytes of [addr, addr+len) from
 * <procfs>/self/smaps: the RSS cost to report. */
int tuning_memory_rss(const struct tuning_paths *paths, const void *addr, size_t len,
                      uint64_t *ret_rss, uint64_t *ret_anon_huge, struct cm_err *err);
/* Fault the range in now (MADV_POPULATE_READ/WRITE, else touch each page),
 * so the first request does not pay for it. write = true only for writable
 * memory (the huge-page copy, the KV cache); the read-only model mapping
 * takes write = false. */
int tuning_prefault(void *addr, size_t len, bool write, struct cm_err *err);

/* ---- output ------------------------------------------------------------- */

/* `edgelmd --check`: the detection report, then each knob as
 * "current -> wanted", "ok", or "BLOCKED: reason" (like tuned-adm verify). */
void tuning_report_print(FILE *f, const struct tuning_report *r, const struct tuning_plan *p);
/* What was applied and restored, one line per change (--restore-tuning). */
void tuning_state_print(FILE *f, const struct tuning_state *s);
/* The applied state as one JSON object, for `info` over IPC. The caller
 * frees *ret_json with cm_free. */
int tuning_state_json(const struct tuning_state *s, const struct tuning_plan *p, char **ret_json,
                      struct cm_err *err);

#endif
