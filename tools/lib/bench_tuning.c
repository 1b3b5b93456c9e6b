/* tools/lib/bench_tuning.c: edgelm-bench's tuning switches (--pin,
 * --hugepages, --prefault, --mlock, --tuning on|off), through the tuning
 * module's own code, in the order edgelmd uses it (daemon/main.c:
 * load_model, copy_to_hugepages, lock_memory):
 *
 *   tuning_detect + tuning_plan_make          the workers and their cpus;
 *                                             whether THP and mlock can apply
 *   engine_params.cpus = plan.worker_cpus     the engine pins its workers
 *   tuning_hugepage_alloc + engine_model_relocate   weights in 2 MiB pages
 *   tuning_memory_lock                        weights + KV cache, one warning
 *   tuning_prefault                           weights (read), KV cache (write)
 *
 * Each switch ends "off", "applied" or "failed" with the reason. Where the
 * kernel can tell, "applied" is checked from outside the code that applied
 * it: every worker's affinity from /proc/self/task (the engine pins
 * best-effort and says nothing when it cannot), the lock from VmLck, the
 * copy's RSS and huge pages and the weights' residency from smaps. A switch
 * that was silently ignored is reported as failed, never as applied.
 *
 * Detection and the plan read the roots of tuning_paths_from_env
 * (EDGELM_SYSFS_ROOT, ... as for edgelmd), so tests can fake a box; the
 * checks read the real /proc, the only place with this process's state.
 *
 * Not touched (edgelmd's, process- or system-wide, or persistent): governor
 * and EPP, nice, SCHED_BATCH, I/O priority, OOM score, NUMA policy, the AMX
 * permission, the service threads' affinity.
 *
 * Also here, beside the other /proc/self/status reader: the peak RSS
 * (VmHWM) and its reset, from which the bench takes its load and run peaks. */
#include "tools/lib/tools.h"

#include "tuning/tuning.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum knob_status { KNOB_OFF, KNOB_APPLIED, KNOB_FAILED };
static const char *const status_names[] = {"off", "applied", "failed"};

struct knob {
	bool want;
	enum knob_status status;
	char detail[512]; /* what was done, or why it failed */
	double ms;        /* time it took, < 0 when not timed */
};

enum { K_PIN, K_HUGEPAGES, K_PREFAULT, K_MLOCK, K_COUNT };
static const char *const knob_names[K_COUNT] = {"pin", "hugepages", "prefault", "mlock"};

#define MAX_WORKERS 256

/* ASan and TSan intercept mlock and do nothing ("Sanitizer ignores mlock"):
 * the check below sees it, this says why. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

struct tools_tuning {
	struct tuning_paths paths; /* detection (may be a fake tree) */
	struct tuning_paths live;  /* this process: the real /proc */
	struct tuning_report report;
	struct tuning_plan plan;
	struct tuning_state state;
	bool planned; /* detection and plan succeeded */
	char plan_err[256];
	int threads_asked;
	struct knob k[K_COUNT];
	struct tuning_hugepage_buf hp;
	bool hp_engine; /* hp is the engine's own copy (info.weights_anon) */
	/* memory, bytes */
	uint64_t weights, kv, resident_before, hp_rss, hp_huge;
	uint64_t rss, rss_anon, rss_file, locked;
	/* each worker's allowed cpus as the kernel reports them */
	int n_workers;
	char observed[MAX_WORKERS][32];
};

static void knob_fail(struct knob *k, const char *fmt, ...) CM_PRINTF(2, 3);
static void knob_fail(struct knob *k, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(k->detail, sizeof(k->detail), fmt, ap);
	va_end(ap);
	k->status = KNOB_FAILED;
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

int tools_tuning_new(const struct tools_tuning_want *w, const char *model, int threads,
                     struct tools_tuning **ret, struct cm_err *err)
{
	struct tools_tuning *t = cm_calloc(1, sizeof(*t));
	if (!t)
		return cm_err_set(err, -ENOMEM, "tuning: out of memory");
	t->k[K_PIN].want = w->pin;
	t->k[K_HUGEPAGES].want = w->hugepages;
	t->k[K_PREFAULT].want = w->prefault;
	t->k[K_MLOCK].want = w->mlock;
	for (int i = 0; i < K_COUNT; i++)
		t->k[i].ms = -1;
	t->threads_asked = threads;
	tuning_paths_default(&t->live);
	tuning_report_init(&t->report);
	tuning_plan_init(&t->plan);
	tuning_state_init(&t->state);

	/* Only the knobs the bench has switches for; everything else "keep". */
	struct tuning_config tc;
	tuning_config_default(&tc);
	tc.threads = threads;
	tc.pin = w->pin;
	snprintf(tc.governor, sizeof(tc.governor), "keep");
	snprintf(tc.epp, sizeof(tc.epp), "keep");
	tc.nice = TUNING_KEEP;
	tc.sched_batch = false;
	tc.load_ioprio = TUNING_IOPRIO_KEEP;
	tc.mlock = w->mlock ? TUNING_MLOCK_ON : TUNING_MLOCK_OFF;
	tc.hugepages = w->hugepages;
	tc.prefault = w->prefault;
	tc.numa = TUNING_NUMA_OFF;
	tc.oom_score_adj = TUNING_KEEP;
	tc.amx = false;
	tc.model_bytes = file_size(model);
	struct cm_err e = {0};
	if (tuning_paths_from_env(&t->paths, &e) == 0 &&
	    tuning_detect(&t->paths, &t->report, &e) == 0 &&
	    tuning_plan_make(&t->report, &tc, &t->plan, &e) == 0) {
		t->planned = true;
	} else {
		snprintf(t->plan_err, sizeof(t->plan_err), "%s", e.msg);
		for (int i = 0; i < K_COUNT; i++)
			if (t->k[i].want)
				knob_fail(&t->k[i], "no tuning plan: %s", e.msg);
	}
	*ret = t;
	return 0;
}

void tools_tuning_free(struct tools_tuning *t)
{
	if (!t)
		return;
	tuning_hugepage_free(&t->hp);
	tuning_state_fini(&t->state);
	tuning_plan_fini(&t->plan);
	tuning_report_fini(&t->report);
	cm_free(t);
}

bool tools_tuning_pinned(const struct tools_tuning *t)
{
	return t->k[K_PIN].want && t->planned && t->plan.pin && t->plan.n_workers > 0;
}

void tools_tuning_engine_params(const struct tools_tuning *t, struct engine_params *ep)
{
	ep->n_threads = t->threads_asked;
	if (!tools_tuning_pinned(t))
		return;
	/* as edgelmd's load_model: the plan's workers, worker i on cpus[i] */
	ep->n_threads = t->plan.n_workers;
	ep->cpus = t->plan.worker_cpus;
	ep->n_cpus = t->plan.n_workers;
}

int tools_tuning_worker_cpu(const struct tools_tuning *t, int i)
{
	if (!tools_tuning_pinned(t) || i < 0)
		return -1;
	return t->plan.worker_cpus[i % t->plan.n_workers];
}

/* Bytes resident of the mapping(s) holding [addr, addr+len), from smaps. */
static uint64_t resident(const struct tools_tuning *t, const void *addr, size_t len)
{
	uint64_t rss = 0;
	if (tuning_memory_rss(&t->live, addr, len, &rss, NULL, NULL) != 0)
		return 0;
	return rss;
}

static void copy_to_hugepages(struct tools_tuning *t, engine_model *m)
{
	struct knob *k = &t->k[K_HUGEPAGES];
	const struct tuning_knob *pk = tuning_plan_knob(&t->plan, TUNING_KNOB_HUGEPAGES);
	if (pk && pk->status == TUNING_KNOB_BLOCKED) {
		knob_fail(k, "%s", pk->reason);
		return;
	}
	struct engine_region wr;
	struct cm_err err = {0};
	engine_model_region(m, &wr);
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	if (info.weights_anon) {
		/* repacking already copied them there (engine.h): the same
		 * memory the copy below would make; report it as that */
		t->hp_engine = true;
		t->hp.addr = wr.addr; /* not owned: map_addr stays NULL */
		t->hp.len = wr.len;
		k->status = KNOB_APPLIED;
		return;
	}
	double t0 = cm_now();
	if (tuning_hugepage_alloc(&t->paths, wr.len, &t->hp, &err) != 0 ||
	    engine_model_relocate(m, t->hp.addr, t->hp.len, &err) != 0) {
		knob_fail(k, "%s; the weights stay on the file mapping", err.msg);
		tuning_hugepage_free(&t->hp);
		return;
	}
	k->ms = (cm_now() - t0) * 1e3;
	k->status = KNOB_APPLIED;
	/* the rest of the detail is written by tools_tuning_check */
}

void tools_tuning_apply(struct tools_tuning *t, engine_model *m, engine_ctx *c)
{
	struct engine_region er[3];
	engine_model_region(m, &er[0]);
	int n = 1 + engine_ctx_regions(c, &er[1], 2);
	t->weights = er[0].len;
	t->kv = 0;
	for (int i = 1; i < n; i++)
		t->kv += er[i].len;
	if (t->planned && t->k[K_HUGEPAGES].want) {
		copy_to_hugepages(t, m);
		engine_model_region(m, &er[0]); /* the copy, if made */
	}
	struct tuning_region regs[3];
	for (int i = 0; i < n; i++)
		regs[i] = (struct tuning_region){er[i].addr, er[i].len, er[i].what};
	struct knob *k = &t->k[K_MLOCK];
	if (t->planned && k->want) {
		struct cm_err err = {0};
		double t0 = cm_now();
		int r = tuning_memory_lock(&t->plan, &t->report, regs, n, &t->state, &err);
		k->ms = (cm_now() - t0) * 1e3;
		if (r != 0) {
			/* the one warning, as edgelmd's mlock "try": run unlocked */
			fprintf(stderr, "edgelm-bench: warning: %s\n", err.msg);
			knob_fail(k, "%s", err.msg);
		} else {
			k->status = KNOB_APPLIED;
		}
	}
	k = &t->k[K_PREFAULT];
	if (t->planned && k->want) {
		struct cm_err err = {0};
		double t0 = cm_now();
		int r = 0;
		for (int i = 0; i < n && r == 0; i++)
			r = tuning_prefault(regs[i].addr, regs[i].len, i > 0, &err);
		k->ms = (cm_now() - t0) * 1e3;
		if (r != 0)
			knob_fail(k, "%s", err.msg);
		else
			k->status = KNOB_APPLIED;
	}
	/* what the first step will find in memory */
	t->resident_before = resident(t, regs[0].addr, regs[0].len);
	if (k->status == KNOB_APPLIED) {
		long pg = sysconf(_SC_PAGESIZE);
		uint64_t want =
		    regs[0].len / (uint64_t)(pg > 0 ? pg : 4096) * (uint64_t)(pg > 0 ? pg : 4096);
		if (t->resident_before < want)
			knob_fail(k,
			          "prefault returned, but only %.1f of %.1f MiB of weights are "
			          "resident",
			          t->resident_before / 1048576.0, regs[0].len / 1048576.0);
		else
			snprintf(k->detail, sizeof(k->detail),
			         "weights %.1f MiB (read) and KV cache %.1f MiB (write) populated",
			         regs[0].len / 1048576.0, t->kv / 1048576.0);
	}
}

/* "VmRSS:    1234 kB" -> bytes */
static void read_status(struct tools_tuning *t)
{
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return;
	char line[256];
	unsigned long long v;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %llu", &v) == 1)
			t->rss = v << 10;
		else if (sscanf(line, "RssAnon: %llu", &v) == 1)
			t->rss_anon = v << 10;
		else if (sscanf(line, "RssFile: %llu", &v) == 1)
			t->rss_file = v << 10;
		else if (sscanf(line, "VmLck: %llu", &v) == 1)
			t->locked = v << 10;
	}
	fclose(f);
}

int tools_mem_read(struct tools_mem *ret)
{
	*ret = (struct tools_mem){0};
	FILE *f = fopen("/proc/self/status", "r");
	if (!f)
		return -errno;
	char line[256];
	unsigned long long v;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmRSS: %llu", &v) == 1)
			ret->rss = v << 10;
		else if (sscanf(line, "VmHWM: %llu", &v) == 1)
			ret->hwm = v << 10;
	}
	fclose(f);
	if (!ret->rss || !ret->hwm) {
		*ret = (struct tools_mem){0};
		return -ENODATA;
	}
	return 0;
}

/* How far VmHWM may sit above VmRSS just after a reset that worked: what
 * the process allocates between the write and the read back. */
#define HWM_SLACK (1u << 20)

int tools_mem_hwm_reset(struct cm_err *err)
{
	struct tools_mem before, after;
	int r = tools_mem_read(&before);
	if (r < 0)
		return cm_err_set(err, r, "/proc/self/status: %s", strerror(-r));
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return cm_err_set(err, r, "/proc/self/clear_refs: %s", strerror(-r));
	}
	ssize_t n = write(fd, "5", 1);
	r = n == 1 ? 0 : n < 0 ? -errno : -EIO;
	close(fd);
	if (r < 0)
		return cm_err_set(err, r, "/proc/self/clear_refs: writing 5: %s", strerror(-r));
	r = tools_mem_read(&after);
	if (r < 0)
		return cm_err_set(err, r, "/proc/self/status: %s", strerror(-r));
	/* a kernel that takes the write and ignores it: the peak stays up */
	if (before.hwm > before.rss + HWM_SLACK && after.hwm > after.rss + HWM_SLACK &&
	    after.hwm >= before.hwm)
		return cm_err_set(err, -ENOTSUP,
		                  "/proc/self/clear_refs took 5, but VmHWM stayed at %.1f MiB "
		                  "(VmRSS %.1f MiB)",
		                  after.hwm / 1048576.0, after.rss / 1048576.0);
	return 0;
}

/* Cpus_allowed_list of a /proc status file, "" if unreadable. */
static void read_allowed(const char *path, char *buf, size_t len)
{
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
			char *s = line + 18;
			s += strspn(s, " \t");
			s[strcspn(s, "\n")] = '\0';
			snprintf(buf, len, "%s", s);
			break;
		}
	fclose(f);
}

/* Each worker's allowed cpus: worker 0 is the calling thread (the engine's
 * pool runs a share of every step on it), workers 1.. are the threads the
 * engine named "edgelm:wN". Returns how many were found. */
static int observe_workers(struct tools_tuning *t, int n)
{
	int found = 0;
	for (int i = 0; i < n; i++)
		t->observed[i][0] = '\0';
	read_allowed("/proc/thread-self/status", t->observed[0], sizeof(t->observed[0]));
	found += t->observed[0][0] != '\0';
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return found;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		char path[300], comm[32] = "";
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", de->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = '\0';
		fclose(f);
		int ith;
		char tail;
		if (sscanf(comm, "edgelm:w%d%c", &ith, &tail) < 1 || ith < 1 || ith >= n)
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/status", de->d_name);
		read_allowed(path, t->observed[ith], sizeof(t->observed[ith]));
		found += t->observed[ith][0] != '\0';
	}
	closedir(d);
	return found;
}

static void check_pinning(struct tools_tuning *t, int n_threads)
{
	t->n_workers = CM_MIN(n_threads, MAX_WORKERS);
	/* A worker names and pins itself when it starts; give a late one time. */
	for (int tries = 0; observe_workers(t, t->n_workers) < t->n_workers && tries < 100; tries++)
		usleep(10000);
	struct knob *k = &t->k[K_PIN];
	if (!k->want || !tools_tuning_pinned(t))
		return;
	char planned[256] = "";
	size_t l = 0;
	for (int i = 0; i < t->n_workers; i++) {
		int cpu = tools_tuning_worker_cpu(t, i);
		l += (size_t)snprintf(planned + l, sizeof(planned) - l, "%s%d", i ? "," : "", cpu);
		if (l >= sizeof(planned))
			l = sizeof(planned) - 1;
		struct tuning_cpuset s;
		if (!t->observed[i][0]) {
			knob_fail(k, "worker %d not found in /proc/self/task", i);
			return;
		}
		if (tuning_cpuset_parse(t->observed[i], &s, NULL) != 0 ||
		    tuning_cpuset_count(&s) != 1 || !tuning_cpuset_has(&s, cpu)) {
			knob_fail(
			    k,
			    "worker %d should run on cpu %d but may run on cpus %s: the engine "
			    "could not pin it (a cpuset or taskset without that cpu?)",
			    i, cpu, t->observed[i]);
			return;
		}
	}
	k->status = KNOB_APPLIED;
	snprintf(k->detail, sizeof(k->detail), "worker i on cpu %s (%s)", planned,
	         t->plan.threads_note);
	if (t->threads_asked > 0 && t->threads_asked != t->plan.n_workers) {
		l = strlen(k->detail);
		snprintf(k->detail + l, sizeof(k->detail) - l, "; %d threads asked, %d planned",
		         t->threads_asked, t->plan.n_workers);
	}
}

uint64_t tools_tuning_huge_bytes(const struct tools_tuning *t)
{
	return t->hp_huge;
}

void tools_tuning_check(struct tools_tuning *t, engine_model *m)
{
	struct engine_model_info info;
	engine_model_get_info(m, &info);
	check_pinning(t, info.n_threads);
	struct knob *k = &t->k[K_HUGEPAGES];
	if (info.weights_anon && k->status != KNOB_APPLIED) {
		/* repacking put the weights in huge-page memory unasked */
		struct engine_region wr;
		engine_model_region(m, &wr);
		(void)tuning_memory_rss(&t->live, wr.addr, wr.len, &t->hp_rss, &t->hp_huge, NULL);
	}
	if (k->status == KNOB_APPLIED) {
		(void)tuning_memory_rss(&t->live, t->hp.addr, t->hp.len, &t->hp_rss, &t->hp_huge,
		                        NULL);
		if (t->hp_engine)
			snprintf(k->detail, sizeof(k->detail),
			         "the repacked weights already live in 2 MiB-aligned anonymous "
			         "memory (MADV_HUGEPAGE, no copy made): %.1f MiB resident, %.1f MiB of "
			         "it in huge pages",
			         t->hp_rss / 1048576.0, t->hp_huge / 1048576.0);
		else
			snprintf(k->detail, sizeof(k->detail),
			         "weights copied to 2 MiB-aligned anonymous memory in %.0f ms (THP "
			         "%s): %.1f MiB resident, %.1f MiB of it in huge pages",
			         k->ms, t->hp.thp_enabled[0] ? t->hp.thp_enabled : "unknown",
			         t->hp_rss / 1048576.0, t->hp_huge / 1048576.0);
		if (t->hp_huge == 0) {
			size_t l = strlen(k->detail);
			snprintf(k->detail + l, sizeof(k->detail) - l, "; none in huge pages: %s",
			         !t->hp_engine && !t->hp.thp_effective ? "MADV_HUGEPAGE refused or THP off"
			         : t->k[K_MLOCK].status == KNOB_APPLIED
			             ? "mlock of a range that ends inside a 2 MiB page splits it"
			             : "no free 2 MiB page (see transparent_hugepage/defrag)");
		}
	}
	read_status(t);
	k = &t->k[K_MLOCK];
	if (k->status == KNOB_APPLIED) {
		if (t->locked < t->weights + t->kv)
			knob_fail(k,
			          "mlock returned, but VmLck is %.1f MiB for %.1f MiB of weights "
			          "and KV cache%s",
			          t->locked / 1048576.0, (t->weights + t->kv) / 1048576.0,
			          SANITIZED ? " (sanitizer builds make mlock a no-op)" : "");
		else
			snprintf(k->detail, sizeof(k->detail),
			         "weights + KV cache locked (%.1f MiB) in %.0f ms",
			         (t->weights + t->kv) / 1048576.0, k->ms);
	}
}

static void json_knob(FILE *o, const struct tools_tuning *t, int i)
{
	const struct knob *k = &t->k[i];
	fprintf(o, "\"%s\":{\"status\":\"%s\"", knob_names[i], status_names[k->status]);
	if (k->detail[0]) {
		fprintf(o, ",\"%s\":", k->status == KNOB_FAILED ? "reason" : "detail");
		tools_json_str(o, k->detail);
	}
	if (k->ms >= 0)
		fprintf(o, ",\"ms\":%.1f", k->ms);
	if (i == K_PIN) {
		fprintf(o, ",\"cpus\":[");
		for (int w = 0; tools_tuning_pinned(t) && w < t->plan.n_workers; w++)
			fprintf(o, "%s%d", w ? "," : "", t->plan.worker_cpus[w]);
		fprintf(o, "],\"observed\":[");
		for (int w = 0; w < t->n_workers; w++) {
			fprintf(o, "%s", w ? "," : "");
			tools_json_str(o, t->observed[w]);
		}
		fprintf(o, "]");
	}
	fprintf(o, "}");
}

void tools_tuning_json(const struct tools_tuning *t, FILE *o)
{
	fprintf(o, "\"tuning\":{");
	for (int i = 0; i < K_COUNT; i++) {
		json_knob(o, t, i);
		fprintf(o, ",");
	}
	fprintf(o, "\"not_touched\":\"governor, epp, nice, sched-batch, load-ioprio, "
	           "oom-score-adj, numa, amx, service-cpus\"");
	if (!t->planned) {
		fprintf(o, ",\"plan_error\":");
		tools_json_str(o, t->plan_err);
	}
	fprintf(o,
	        "},\"memory\":{\"weights_bytes\":%llu,\"kv_bytes\":%llu,"
	        "\"weights_resident_before_bytes\":%llu,\"hugepage_rss_bytes\":%llu,"
	        "\"hugepage_huge_bytes\":%llu,\"rss_bytes\":%llu,\"rss_anon_bytes\":%llu,"
	        "\"rss_file_bytes\":%llu,\"locked_bytes\":%llu}",
	        (unsigned long long)t->weights, (unsigned long long)t->kv,
	        (unsigned long long)t->resident_before, (unsigned long long)t->hp_rss,
	        (unsigned long long)t->hp_huge, (unsigned long long)t->rss,
	        (unsigned long long)t->rss_anon, (unsigned long long)t->rss_file,
	        (unsigned long long)t->locked);
}

void tools_tuning_print(const struct tools_tuning *t, FILE *o)
{
	for (int i = 0; i < K_COUNT; i++) {
		const struct knob *k = &t->k[i];
		fprintf(o, "%-12s %-10s %s%s%s\n", i == 0 ? "tuning" : "", knob_names[i],
		        status_names[k->status], k->detail[0] ? ": " : "", k->detail);
	}
	fprintf(o, "%-12s %-10s governor, epp, nice, I/O priority, NUMA (edgelmd applies them)\n",
	        "", "untouched");
	if (t->n_workers > 0) {
		fprintf(o, "%-12s", "affinity");
		for (int w = 0; w < t->n_workers; w++)
			fprintf(o, " w%d:%s", w, t->observed[w][0] ? t->observed[w] : "?");
		fprintf(o, "\n");
	}
	fprintf(o,
	        "memory       RSS %.1f MiB (anon %.1f, file %.1f) after the runs, locked %.1f; "
	        "weights %.1f MiB, %.1f resident before the first step\n",
	        t->rss / 1048576.0, t->rss_anon / 1048576.0, t->rss_file / 1048576.0,
	        t->locked / 1048576.0, t->weights / 1048576.0, t->resident_before / 1048576.0);
}
