/* monitor/monitor.c: the monitor object, the family table, one sample from
 * sources to metrics to flags, and the sampler thread.
 *
 * Every metric the module publishes is declared in the two tables below
 * (docs/monitor.md lists the same names; keep them in step). Kernel counters
 * are mirrored into Prometheus counters by adding their non-negative deltas
 * (the first sample sets the absolute value), so a counter the kernel lets
 * go backwards (iowait) never looks like a reset. Gauges that describe "the
 * last interval" (busy and stall ratios, rates) come from the same deltas
 * over the sample's own time step, so replayed traces with synthetic times
 * give exact answers. */
#include "monitor/monitor_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the family table ---------------------------------------------------- */

enum { C = MONITOR_TYPE_COUNTER, G = MONITOR_TYPE_GAUGE, H = MONITOR_TYPE_HISTOGRAM };

struct fam_def {
	size_t off; /* into struct mon_fams */
	int type;
	const char *name;
	const char *labels[3];
	const char *help;
};

#define F(field) offsetof(struct mon_fams, field)
/* One metric per two lines: clang-format's layout of these tables is far
 * harder to scan. */
/* clang-format off */
static const struct fam_def sys_fams[] = {
	{F(cpu_seconds), C, "edgelm_cpu_seconds_total", {"cpu", "mode"},
	 "CPU time per core and mode (/proc/stat)."},
	{F(cpu_busy), G, "edgelm_cpu_busy_ratio", {"cpu"},
	 "Share of the last interval each core was not idle or in iowait."},
	{F(cpu_steal), G, "edgelm_cpu_steal_ratio", {0},
	 "Share of all CPU time stolen by the hypervisor in the last interval."},
	{F(cpu_iowait), G, "edgelm_cpu_iowait_ratio", {0},
	 "Share of all CPU time idle in iowait in the last interval."},
	{F(load1), G, "edgelm_load1", {0},
	 "1-minute load average."},
	{F(load5), G, "edgelm_load5", {0},
	 "5-minute load average."},
	{F(load15), G, "edgelm_load15", {0},
	 "15-minute load average."},
	{F(procs_running), G, "edgelm_procs_running", {0},
	 "Runnable tasks (procs_running of /proc/stat)."},
	{F(procs_blocked), G, "edgelm_procs_blocked", {0},
	 "Tasks blocked on I/O (procs_blocked of /proc/stat)."},
	{F(mem_total), G, "edgelm_memory_total_bytes", {0},
	 "MemTotal."},
	{F(mem_avail), G, "edgelm_memory_available_bytes", {0},
	 "MemAvailable: memory usable without swapping."},
	{F(mem_used), G, "edgelm_memory_used_ratio", {0},
	 "1 - MemAvailable/MemTotal."},
	{F(swap_total), G, "edgelm_swap_total_bytes", {0},
	 "SwapTotal."},
	{F(swap_used), G, "edgelm_swap_used_bytes", {0},
	 "SwapTotal - SwapFree."},
	{F(swap_in), C, "edgelm_swap_in_bytes_total", {0},
	 "Bytes swapped in (pswpin of /proc/vmstat)."},
	{F(swap_out), C, "edgelm_swap_out_bytes_total", {0},
	 "Bytes swapped out (pswpout of /proc/vmstat)."},
	{F(swap_in_rate), G, "edgelm_swap_in_bytes_per_second", {0},
	 "Swap-in rate over the last interval."},
	{F(swap_out_rate), G, "edgelm_swap_out_bytes_per_second", {0},
	 "Swap-out rate over the last interval."},
	{F(majflt), C, "edgelm_major_page_faults_total", {0},
	 "Major page faults of the whole box (pgmajfault)."},
	{F(majflt_rate), G, "edgelm_major_page_faults_per_second", {0},
	 "Major page faults of the box per second, last interval."},
	{F(oom_kills), C, "edgelm_oom_kills_total", {0},
	 "Processes killed by the OOM killer (oom_kill of /proc/vmstat)."},
	{F(psi_total), C, "edgelm_pressure_stalled_seconds_total", {"resource", "kind"},
	 "Time tasks stalled on a resource (PSI total)."},
	{F(psi_avg10), G, "edgelm_pressure_avg10_ratio", {"resource", "kind"},
	 "PSI avg10: stalled share of the last 10 s, kernel-smoothed."},
	{F(psi_ratio), G, "edgelm_pressure_stall_ratio", {"resource", "kind"},
	 "Stalled share of the last interval (PSI total delta)."},
	{F(cg_mem_current), G, "edgelm_cgroup_memory_current_bytes", {0},
	 "memory.current of the daemon's cgroup."},
	{F(cg_mem_max), G, "edgelm_cgroup_memory_max_bytes", {0},
	 "memory.max of the daemon's cgroup (absent when unlimited)."},
	{F(cg_mem_ratio), G, "edgelm_cgroup_memory_usage_ratio", {0},
	 "memory.current / memory.max."},
	{F(cg_events), C, "edgelm_cgroup_memory_events_total", {"event"},
	 "memory.events of the daemon's cgroup (v1: failcnt as max)."},
	{F(cg_periods), C, "edgelm_cgroup_cpu_periods_total", {0},
	 "CFS enforcement periods of the cgroup (cpu.stat nr_periods)."},
	{F(cg_throttled), C, "edgelm_cgroup_cpu_throttled_periods_total", {0},
	 "Periods in which the cgroup was throttled (nr_throttled)."},
	{F(cg_throttled_seconds), C, "edgelm_cgroup_cpu_throttled_seconds_total", {0},
	 "Time the cgroup was throttled."},
	{F(cg_throttled_ratio), G, "edgelm_cgroup_cpu_throttled_ratio", {0},
	 "Share of the last interval's periods that were throttled."},
	{F(proc_rss), G, "edgelm_process_resident_memory_bytes", {0},
	 "Resident memory of the daemon (VmRSS)."},
	{F(proc_locked), G, "edgelm_process_locked_memory_bytes", {0},
	 "Locked memory of the daemon (VmLck)."},
	{F(proc_swap), G, "edgelm_process_swap_bytes", {0},
	 "Swapped-out memory of the daemon (VmSwap)."},
	{F(proc_cpu), C, "edgelm_process_cpu_seconds_total", {"mode"},
	 "CPU time of the daemon."},
	{F(proc_threads), G, "edgelm_process_threads", {0},
	 "Threads of the daemon."},
	{F(proc_csw), C, "edgelm_process_context_switches_total", {"kind"},
	 "Context switches of the daemon's threads."},
	{F(proc_majflt), C, "edgelm_process_major_page_faults_total", {0},
	 "Major page faults of the daemon."},
	{F(proc_majflt_rate), G, "edgelm_process_major_page_faults_per_second", {0},
	 "Major page faults of the daemon per second, last interval."},
	{F(thread_cpu), C, "edgelm_thread_cpu_seconds_total", {"thread"},
	 "CPU time per thread name of the daemon."},
	{F(worker_busy), G, "edgelm_worker_busy_ratio", {0},
	 "Mean share of the last interval the workers ran on a CPU."},
	{F(worker_wait), G, "edgelm_worker_wait_ratio", {0},
	 "Mean share of the last interval the workers were runnable but waited for a CPU."},
	{F(worker_nivcsw), G, "edgelm_worker_involuntary_switches_per_second", {0},
	 "Involuntary context switches per worker per second, last interval."},
	{F(prefill_rate), G, "edgelm_prefill_tokens_per_second", {0},
	 "Prefill tokens per second of prefill time, last interval."},
	{F(decode_rate), G, "edgelm_decode_tokens_per_second", {0},
	 "Generated tokens per second of decode time, last interval."},
	{F(bw), G, "edgelm_weight_bandwidth_bytes_per_second", {0},
	 "Weight bytes read per second of engine time, last interval."},
	{F(bw_ratio), G, "edgelm_weight_bandwidth_utilization_ratio", {0},
	 "Effective weight bandwidth / measured peak bandwidth."},
	{F(kv_ratio), G, "edgelm_kv_cache_usage_ratio", {0},
	 "KV cache used / capacity."},
	{F(flag), G, "edgelm_bottleneck", {"flag"},
	 "1 while a bottleneck flag is on (docs/monitor.md)."},
	{F(flag_changes), C, "edgelm_bottleneck_changes_total", {"flag"},
	 "Times a bottleneck flag turned on or off."},
	{F(mon_samples), C, "edgelm_monitor_samples_total", {0},
	 "Samples taken by the monitor."},
	{F(mon_errors), C, "edgelm_monitor_sample_errors_total", {"source"},
	 "Samples in which a source could not be read."},
	{F(mon_cpu), C, "edgelm_monitor_cpu_seconds_total", {0},
	 "CPU time the monitor spent sampling, classifying and writing the textfile."},
	{F(mon_duration), G, "edgelm_monitor_last_sample_cpu_seconds", {0},
	 "CPU time of the last sample."},
	{F(mon_info), G, "edgelm_monitor_info", {"reader"},
	 "Always 1; labels say how the system side is read."},
};
#undef F

static const double ttft_buckets[] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double tpot_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
				      0.15,  0.25, 0.5,   1,    2.5};
static const double wait_buckets[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60};
static const double dur_buckets[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

struct inf_def {
	size_t off; /* into struct monitor_inference */
	int type;
	const char *name;
	const double *buckets;
	size_t n_buckets;
	const char *help;
};

#define I(field) offsetof(struct monitor_inference, field)
#define B(a) a, CM_ARRAY_LEN(a)
static const struct inf_def inf_fams[] = {
	{I(running), G, "edgelm_sequences_running", NULL, 0,
	 "Sequences being generated."},
	{I(queued), G, "edgelm_sequences_queued", NULL, 0,
	 "Requests admitted but waiting to start."},
	{I(prompt_tokens), C, "edgelm_prompt_tokens_total", NULL, 0,
	 "Prompt tokens received."},
	{I(prefill_tokens), C, "edgelm_prefill_tokens_total", NULL, 0,
	 "Prompt tokens computed (not served from the prefix cache)."},
	{I(generation_tokens), C, "edgelm_generation_tokens_total", NULL, 0,
	 "Tokens generated."},
	{I(prefill_seconds), C, "edgelm_prefill_seconds_total", NULL, 0,
	 "Engine time spent in prefill."},
	{I(decode_seconds), C, "edgelm_decode_seconds_total", NULL, 0,
	 "Engine time spent in decode."},
	{I(weight_bytes), C, "edgelm_weight_read_bytes_total", NULL, 0,
	 "Weight bytes streamed by engine steps."},
	{I(peak_bandwidth), G, "edgelm_memory_peak_bandwidth_bytes_per_second", NULL, 0,
	 "Measured peak read bandwidth of the box."},
	{I(kv_used), G, "edgelm_kv_cache_used_tokens", NULL, 0,
	 "KV cache cells in use."},
	{I(kv_capacity), G, "edgelm_kv_cache_capacity_tokens", NULL, 0,
	 "KV cache cells in total."},
	{I(prefix_lookups), C, "edgelm_prefix_cache_lookups_total", NULL, 0,
	 "Requests that looked up the prefix cache."},
	{I(prefix_hits), C, "edgelm_prefix_cache_hits_total", NULL, 0,
	 "Requests that reused a cached prefix."},
	{I(prefix_hit_tokens), C, "edgelm_prefix_cache_hit_tokens_total", NULL, 0,
	 "Prompt tokens served from the prefix cache."},
	{I(loading), G, "edgelm_model_loading", NULL, 0,
	 "1 while a model is being loaded."},
	{I(workers), G, "edgelm_engine_workers", NULL, 0,
	 "Engine worker threads."},
	{I(ttft), H, "edgelm_time_to_first_token_seconds", B(ttft_buckets),
	 "Time from admission to the first generated token."},
	{I(tpot), H, "edgelm_time_per_output_token_seconds", B(tpot_buckets),
	 "Time between generated tokens of a sequence."},
	{I(queue_wait), H, "edgelm_queue_wait_seconds", B(wait_buckets),
	 "Time a request waited before it was admitted."},
	{I(duration), H, "edgelm_request_duration_seconds", B(dur_buckets),
	 "Time from receipt to the last reply of a request."},
};
/* clang-format on */
#undef I
#undef B

/* ---- parameters ------------------------------------------------------------- */

void monitor_params_default(struct monitor_params *p)
{
	memset(p, 0, sizeof(*p));
	p->interval_ms = 1000;
	p->worker_prefix = "edgelmd:w";
	p->max_series = 256;
	monitor_thresholds_default(&p->th);
}

static char *dup_or_null(const char *s, bool *oom)
{
	if (!s)
		return NULL;
	char *d = cm_strdup(s);
	if (!d)
		*oom = true;
	return d;
}

static char *root_path(const char *param, const char *env, const char *dflt, bool *oom)
{
	const char *s = param;
	if (!s || !*s)
		s = getenv(env);
	if (!s || !*s)
		s = dflt;
	char *d = dup_or_null(s, oom);
	if (d) { /* "/proc/" -> "/proc", but keep "/" */
		size_t n = strlen(d);
		while (n > 1 && d[n - 1] == '/')
			d[--n] = '\0';
	}
	return d;
}

/* ---- lifecycle ------------------------------------------------------------- */

static long g_hz, g_page;

int monitor_new(const struct monitor_params *p, monitor **ret_m, struct cm_err *err)
{
	struct monitor_params dflt;
	if (!p) {
		monitor_params_default(&dflt);
		p = &dflt;
	}
	*ret_m = NULL;
	if (!g_hz) {
		g_hz = sysconf(_SC_CLK_TCK);
		g_page = sysconf(_SC_PAGESIZE);
		if (g_hz <= 0)
			g_hz = 100;
		if (g_page <= 0)
			g_page = 4096;
	}
	monitor *m = cm_calloc(1, sizeof(*m));
	if (!m)
		return cm_err_set(err, -ENOMEM, "monitor: out of memory");
	m->p = *p;
	if (!m->p.interval_ms)
		m->p.interval_ms = 1000;
	bool oom = false;
	m->procfs = root_path(p->procfs_root, "EDGELM_PROCFS_ROOT", "/proc", &oom);
	m->sysfs = root_path(p->sysfs_root, "EDGELM_SYSFS_ROOT", "/sys", &oom);
	m->worker_prefix = dup_or_null(p->worker_prefix, &oom);
	m->textfile =
	    dup_or_null(p->textfile_path && *p->textfile_path ? p->textfile_path : NULL, &oom);
	m->p.procfs_root = m->procfs;
	m->p.sysfs_root = m->sysfs;
	m->p.worker_prefix = m->worker_prefix;
	m->p.textfile_path = m->textfile;
	m->use_libproc2 = m->procfs && strcmp(m->procfs, "/proc") == 0;
	m->created_ns = cm_now_ns();
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	m->created_unix = (double)ts.tv_sec + ts.tv_nsec / 1e9;

	int rc;
	pthread_condattr_t ca;
	if (oom) {
		rc = cm_err_set(err, -ENOMEM, "monitor: out of memory");
		goto out_free_strings;
	}
	if ((rc = mon_reg_init(&m->reg, p->max_series)) != 0) {
		cm_err_set(err, rc, "monitor: mutex: %s", strerror(-rc));
		goto out_free_strings;
	}
	pthread_mutex_init(&m->sample_mu, NULL);
	pthread_mutex_init(&m->state_mu, NULL);
	pthread_mutex_init(&m->th_mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&m->th_cv, &ca);
	pthread_condattr_destroy(&ca);
	*ret_m = m; /* from here monitor_free() undoes everything */

	for (size_t i = 0; i < CM_ARRAY_LEN(sys_fams); i++) {
		const struct fam_def *d = &sys_fams[i];
		size_t nl = 0;
		while (nl < CM_ARRAY_LEN(d->labels) && d->labels[nl])
			nl++;
		struct monitor_family_desc fd = {
		    .type = (enum monitor_type)d->type,
		    .name = d->name,
		    .help = d->help,
		    .labels = d->labels,
		    .n_labels = nl,
		};
		if ((rc = mon_reg_family_add(
		         &m->reg, &fd, (monitor_family **)((char *)&m->fam + d->off), err)) != 0)
			goto out_free;
	}
	static const char *const req_labels[] = {"op", "outcome"};
	struct monitor_family_desc rd = {
	    .type = MONITOR_TYPE_COUNTER,
	    .name = "edgelm_requests_total",
	    .help = "Requests by IPC op and outcome.",
	    .labels = req_labels,
	    .n_labels = 2,
	};
	if ((rc = mon_reg_family_add(&m->reg, &rd, &m->inf.requests, err)) != 0)
		goto out_free;
	for (size_t i = 0; i < CM_ARRAY_LEN(inf_fams); i++) {
		const struct inf_def *d = &inf_fams[i];
		struct monitor_family_desc fd = {
		    .type = (enum monitor_type)d->type,
		    .name = d->name,
		    .help = d->help,
		    .buckets = d->buckets,
		    .n_buckets = d->n_buckets,
		};
		monitor_family *f;
		if ((rc = mon_reg_family_add(&m->reg, &fd, &f, err)) != 0 ||
		    (rc = monitor_series_get(f, NULL, (monitor_series **)((char *)&m->inf + d->off),
		                             err)) != 0)
			goto out_free;
	}
	monitor_gauge_set(mon_reg_series(m->fam.mon_info, m->use_libproc2 ? "libproc2" : "parsers"),
	                  1);
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		monitor_gauge_set(
		    mon_reg_series(m->fam.flag, monitor_flag_name((enum monitor_flag)f)), 0);
		monitor_counter_add(
		    mon_reg_series(m->fam.flag_changes, monitor_flag_name((enum monitor_flag)f)),
		    0);
	}
	if ((rc = mon_sys_reader_new(m->use_libproc2, &m->sysr, err)) != 0)
		goto out_free;
	return 0;

out_free:
	monitor_free(m);
	*ret_m = NULL;
	return rc;
out_free_strings:
	cm_free(m->procfs);
	cm_free(m->sysfs);
	cm_free(m->worker_prefix);
	cm_free(m->textfile);
	cm_free(m);
	return rc;
}

void monitor_free(monitor *m)
{
	if (!m)
		return;
	monitor_http_stop(m);
	monitor_stop(m);
	mon_sys_reader_free(m->sysr);
	for (int i = 0; i < 2; i++)
		mon_sys_sample_fini(&m->sys[i]);
	mon_proc_sample_fini(&m->proc);
	mon_buf_fini(&m->buf);
	mon_reg_fini(&m->reg);
	pthread_mutex_destroy(&m->sample_mu);
	pthread_mutex_destroy(&m->state_mu);
	pthread_mutex_destroy(&m->th_mu);
	pthread_cond_destroy(&m->th_cv);
	cm_free(m->procfs);
	cm_free(m->sysfs);
	cm_free(m->worker_prefix);
	cm_free(m->textfile);
	cm_free(m);
}

int monitor_family_add(monitor *m, const struct monitor_family_desc *d, monitor_family **ret_f,
                       struct cm_err *err)
{
	return mon_reg_family_add(&m->reg, d, ret_f, err);
}

monitor_family *monitor_family_find(monitor *m, const char *name)
{
	return name ? mon_reg_family_find(&m->reg, name) : NULL;
}

const struct monitor_inference *monitor_inference_get(monitor *m)
{
	return &m->inf;
}

void monitor_flags_get(monitor *m, struct monitor_flag_state ret_flags[MONITOR_FLAG_COUNT])
{
	pthread_mutex_lock(&m->state_mu);
	memcpy(ret_flags, m->flags, sizeof(m->flags));
	pthread_mutex_unlock(&m->state_mu);
}

/* ---- one sample ----------------------------------------------------------- */

/* Mirror a cumulative kernel counter: absolute on first sight, then the
 * non-negative deltas. */
static void mirror(monitor_series *s, double cur, double prev, bool have_prev)
{
	if (!have_prev)
		monitor_counter_set(s, cur);
	else if (cur > prev)
		monitor_counter_add(s, cur - prev);
}

static double clamp01(double x)
{
	return x < 0 ? 0 : x > 1 ? 1 : x;
}

static const struct sys_cpu *cpu_by_id(const struct sys_sample *s, int id, int hint)
{
	if (hint < s->ncpu && s->cpus[hint].id == id)
		return &s->cpus[hint];
	for (int i = 0; i < s->ncpu; i++)
		if (s->cpus[i].id == id)
			return &s->cpus[i];
	return NULL;
}

static void publish_sys(monitor *m, const struct sys_sample *S, const struct sys_sample *P,
                        bool prev, double dt, struct classify_in *in)
{
	const struct mon_fams *f = &m->fam;
	double hz = (double)g_hz, page = (double)g_page;
	if (S->have_stat) {
		uint64_t sum_all = 0, sum_steal = 0, sum_iowait = 0;
		for (int i = 0; i < S->ncpu; i++) {
			const struct sys_cpu *c = &S->cpus[i];
			const struct sys_cpu *pc =
			    prev && P->have_stat ? cpu_by_id(P, c->id, i) : NULL;
			char id[16];
			snprintf(id, sizeof(id), "%d", c->id);
			uint64_t d[CPU_MODES], tot = 0;
			for (int k = 0; k < CPU_MODES; k++) {
				mirror(mon_reg_series(f->cpu_seconds, id, mon_cpu_mode_names[k]),
				       (double)c->t[k] / hz, pc ? (double)pc->t[k] / hz : 0, pc);
				d[k] = pc && c->t[k] > pc->t[k] ? c->t[k] - pc->t[k] : 0;
				tot += d[k];
			}
			if (pc && tot) {
				double idle = (double)(d[CPU_IDLE] + d[CPU_IOWAIT]) / (double)tot;
				monitor_gauge_set(mon_reg_series(f->cpu_busy, id),
				                  clamp01(1 - idle));
				sum_all += tot;
				sum_steal += d[CPU_STEAL];
				sum_iowait += d[CPU_IOWAIT];
			}
		}
		if (sum_all) {
			in->steal = (double)sum_steal / (double)sum_all;
			monitor_gauge_set(mon_reg_series(f->cpu_steal), in->steal);
			monitor_gauge_set(mon_reg_series(f->cpu_iowait),
			                  (double)sum_iowait / (double)sum_all);
		}
		monitor_gauge_set(mon_reg_series(f->procs_running), (double)S->procs_running);
		monitor_gauge_set(mon_reg_series(f->procs_blocked), (double)S->procs_blocked);
	}
	if (S->have_load) {
		monitor_gauge_set(mon_reg_series(f->load1), S->load[0]);
		monitor_gauge_set(mon_reg_series(f->load5), S->load[1]);
		monitor_gauge_set(mon_reg_series(f->load15), S->load[2]);
	}
	if (S->have_mem) {
		monitor_gauge_set(mon_reg_series(f->mem_total), (double)S->mem_total);
		monitor_gauge_set(mon_reg_series(f->mem_avail), (double)S->mem_avail);
		in->mem_avail = S->mem_total ? (double)S->mem_avail / (double)S->mem_total : -1;
		if (in->mem_avail >= 0)
			monitor_gauge_set(mon_reg_series(f->mem_used), clamp01(1 - in->mem_avail));
		monitor_gauge_set(mon_reg_series(f->swap_total), (double)S->swap_total);
		monitor_gauge_set(
		    mon_reg_series(f->swap_used),
		    S->swap_total > S->swap_free ? (double)(S->swap_total - S->swap_free) : 0);
	}
	if (S->have_vm) {
		bool pv = prev && P->have_vm;
		mirror(mon_reg_series(f->swap_in), (double)S->pswpin * page,
		       (double)P->pswpin * page, pv);
		mirror(mon_reg_series(f->swap_out), (double)S->pswpout * page,
		       (double)P->pswpout * page, pv);
		mirror(mon_reg_series(f->majflt), (double)S->pgmajfault, (double)P->pgmajfault, pv);
		if (S->have_oom_kill)
			mirror(mon_reg_series(f->oom_kills), (double)S->oom_kill,
			       (double)P->oom_kill, pv && P->have_oom_kill);
		if (pv && dt > 0) {
			double in_r =
			    S->pswpin > P->pswpin ? (double)(S->pswpin - P->pswpin) * page / dt : 0;
			double out_r = S->pswpout > P->pswpout
			                   ? (double)(S->pswpout - P->pswpout) * page / dt
			                   : 0;
			double mf = S->pgmajfault > P->pgmajfault
			                ? (double)(S->pgmajfault - P->pgmajfault) / dt
			                : 0;
			monitor_gauge_set(mon_reg_series(f->swap_in_rate), in_r);
			monitor_gauge_set(mon_reg_series(f->swap_out_rate), out_r);
			monitor_gauge_set(mon_reg_series(f->majflt_rate), mf);
			in->swapin_rate = in_r;
		}
	}
}

static void publish_psi(monitor *m, const struct psi_res *S, const struct psi_res *P, bool prev,
                        double dt, struct classify_in *in)
{
	const struct mon_fams *f = &m->fam;
	double *slot[PSI_N] = {&in->psi_cpu, &in->psi_mem, &in->psi_io};
	for (int r = 0; r < PSI_N; r++) {
		if (!S[r].present)
			continue;
		for (int k = 0; k < 2; k++) {
			const struct psi_line *l = k ? &S[r].full : &S[r].some;
			const struct psi_line *pl = k ? &P[r].full : &P[r].some;
			const char *kind = k ? "full" : "some";
			if (!l->have)
				continue;
			bool pv = prev && P[r].present && pl->have;
			mirror(mon_reg_series(f->psi_total, mon_psi_names[r], kind),
			       (double)l->total / 1e6, (double)pl->total / 1e6, pv);
			monitor_gauge_set(mon_reg_series(f->psi_avg10, mon_psi_names[r], kind),
			                  l->avg10 / 100.0);
			if (pv && dt > 0) {
				double d =
				    l->total > pl->total ? (double)(l->total - pl->total) : 0;
				double ratio = clamp01(d / 1e6 / dt);
				monitor_gauge_set(
				    mon_reg_series(f->psi_ratio, mon_psi_names[r], kind), ratio);
				if (k == 0)
					*slot[r] = ratio;
			}
		}
	}
}

static void publish_cgroup(monitor *m, const struct cg_sample *S, const struct cg_sample *P,
                           bool prev, double dt, struct classify_in *in)
{
	const struct mon_fams *f = &m->fam;
	bool same = prev && P->version && strcmp(S->path, P->path) == 0;
	if (S->have_mem) {
		monitor_gauge_set(mon_reg_series(f->cg_mem_current), (double)S->mem_current);
		if (S->mem_max != UINT64_MAX && S->mem_max > 0) {
			in->cg_mem = (double)S->mem_current / (double)S->mem_max;
			monitor_gauge_set(mon_reg_series(f->cg_mem_max), (double)S->mem_max);
			monitor_gauge_set(mon_reg_series(f->cg_mem_ratio), in->cg_mem);
		}
	}
	if (S->have_events) {
		static const char *const ev[] = {"low", "high", "max", "oom", "oom_kill"};
		const uint64_t cur[] = {S->ev_low, S->ev_high, S->ev_max, S->ev_oom,
		                        S->ev_oom_kill};
		const uint64_t old[] = {P->ev_low, P->ev_high, P->ev_max, P->ev_oom,
		                        P->ev_oom_kill};
		bool pv = same && P->have_events;
		for (size_t i = 0; i < CM_ARRAY_LEN(ev); i++) {
			if (S->version == 1 && i != 2 && i != 4)
				continue; /* v1 has only failcnt and oom_kill */
			mirror(mon_reg_series(f->cg_events, ev[i]), (double)cur[i], (double)old[i],
			       pv);
			if (pv && (i == 1 || i == 2 || i == 3) && cur[i] > old[i])
				in->cg_events += (double)(cur[i] - old[i]);
		}
	}
	if (S->have_cpu) {
		bool pv = same && P->have_cpu;
		mirror(mon_reg_series(f->cg_periods), (double)S->nr_periods, (double)P->nr_periods,
		       pv);
		mirror(mon_reg_series(f->cg_throttled), (double)S->nr_throttled,
		       (double)P->nr_throttled, pv);
		mirror(mon_reg_series(f->cg_throttled_seconds), (double)S->throttled_usec / 1e6,
		       (double)P->throttled_usec / 1e6, pv);
		if (pv && dt > 0) {
			uint64_t dp =
			    S->nr_periods > P->nr_periods ? S->nr_periods - P->nr_periods : 0;
			uint64_t dth = S->nr_throttled > P->nr_throttled
			                   ? S->nr_throttled - P->nr_throttled
			                   : 0;
			in->throttled = dp ? clamp01((double)dth / (double)dp) : 0;
			monitor_gauge_set(mon_reg_series(f->cg_throttled_ratio), in->throttled);
		}
	}
}

static void publish_proc(monitor *m, bool prev, double dt, struct classify_in *in)
{
	const struct mon_fams *f = &m->fam;
	const struct proc_sample *S = &m->proc;
	double hz = (double)g_hz;
	if (!S->have)
		return;
	bool pv = prev && m->pp.have;
	monitor_gauge_set(mon_reg_series(f->proc_rss), (double)S->rss);
	monitor_gauge_set(mon_reg_series(f->proc_locked), (double)S->locked);
	monitor_gauge_set(mon_reg_series(f->proc_swap), (double)S->swap);
	monitor_gauge_set(mon_reg_series(f->proc_threads), (double)S->num_threads);
	mirror(mon_reg_series(f->proc_cpu, "user"), (double)S->utime / hz, (double)m->pp.utime / hz,
	       pv);
	mirror(mon_reg_series(f->proc_cpu, "system"), (double)S->stime / hz,
	       (double)m->pp.stime / hz, pv);
	mirror(mon_reg_series(f->proc_majflt), (double)S->majflt, (double)m->pp.majflt, pv);
	if (pv && dt > 0) {
		double r = S->majflt > m->pp.majflt ? (double)(S->majflt - m->pp.majflt) / dt : 0;
		monitor_gauge_set(mon_reg_series(f->proc_majflt_rate), r);
		in->majflt_rate = r;
	}
	m->pp.have = true;
	m->pp.utime = S->utime;
	m->pp.stime = S->stime;
	m->pp.majflt = S->majflt;

	/* Threads: counters take every delta (new threads their totals); the
	 * interval ratios only use threads seen in both samples. */
	uint64_t nv = 0, niv = 0;
	bool any_worker = false;
	for (size_t i = 0; i < S->n_th; i++)
		any_worker |= S->th[i].worker;
	double run = 0, wait = 0, csw = 0;
	int n = 0;
	for (size_t i = 0; i < S->n_th; i++) {
		const struct proc_thread *t = &S->th[i];
		nv += t->d_nvcsw;
		niv += t->d_nivcsw;
		double cpu = (double)(t->d_utime + t->d_stime) / hz;
		monitor_series *ts = mon_reg_series(f->thread_cpu, t->name);
		if (!ts)
			ts = mon_reg_series(f->thread_cpu, "other");
		monitor_counter_add(ts, cpu);
		if (t->fresh || (any_worker && !t->worker))
			continue;
		double busy = S->have_sched ? (double)t->d_run_ns / 1e9 : cpu;
		if (!any_worker && busy <= 0 && t->d_run_delay_ns == 0)
			continue; /* no worker names: count the threads that wanted a CPU */
		run += busy;
		wait += (double)t->d_run_delay_ns / 1e9;
		csw += (double)t->d_nivcsw;
		n++;
	}
	monitor_counter_add(mon_reg_series(f->proc_csw, "voluntary"), (double)nv);
	monitor_counter_add(mon_reg_series(f->proc_csw, "involuntary"), (double)niv);
	if (!pv || dt <= 0)
		return;
	if (!any_worker) {
		double w = monitor_series_value(m->inf.workers);
		if (w >= 1)
			n = (int)w;
	}
	if (n > 0) {
		in->worker_busy = clamp01(run / (n * dt));
		in->worker_wait = clamp01(wait / (n * dt));
		in->nivcsw_rate = csw / (n * dt);
	}
	in->active = in->worker_busy + in->worker_wait >= m->p.th.active_min;
	monitor_gauge_set(mon_reg_series(f->worker_busy), in->worker_busy);
	monitor_gauge_set(mon_reg_series(f->worker_wait), in->worker_wait);
	monitor_gauge_set(mon_reg_series(f->worker_nivcsw), in->nivcsw_rate);
}

static void publish_inference(monitor *m, bool prev, double dt, struct classify_in *in)
{
	const struct monitor_inference *inf = &m->inf;
	const struct mon_fams *f = &m->fam;
	struct infer_prev cur = {
	    .prefill_tokens = monitor_series_value(inf->prefill_tokens),
	    .generation_tokens = monitor_series_value(inf->generation_tokens),
	    .prefill_seconds = monitor_series_value(inf->prefill_seconds),
	    .decode_seconds = monitor_series_value(inf->decode_seconds),
	    .weight_bytes = monitor_series_value(inf->weight_bytes),
	};
	struct infer_prev d = {0};
	if (prev) {
		d.prefill_tokens = CM_MAX(cur.prefill_tokens - m->ip.prefill_tokens, 0);
		d.generation_tokens = CM_MAX(cur.generation_tokens - m->ip.generation_tokens, 0);
		d.prefill_seconds = CM_MAX(cur.prefill_seconds - m->ip.prefill_seconds, 0);
		d.decode_seconds = CM_MAX(cur.decode_seconds - m->ip.decode_seconds, 0);
		d.weight_bytes = CM_MAX(cur.weight_bytes - m->ip.weight_bytes, 0);
	}
	m->ip = cur;
	in->loading = monitor_series_value(inf->loading) != 0;
	in->generating = monitor_series_value(inf->running) > 0 || d.generation_tokens > 0 ||
	                 d.prefill_tokens > 0;
	double kv_cap = monitor_series_value(inf->kv_capacity);
	if (kv_cap > 0)
		monitor_gauge_set(mon_reg_series(f->kv_ratio),
		                  clamp01(monitor_series_value(inf->kv_used) / kv_cap));
	if (!prev || dt <= 0)
		return;
	monitor_gauge_set(mon_reg_series(f->prefill_rate),
	                  d.prefill_seconds > 0 ? d.prefill_tokens / d.prefill_seconds : 0);
	monitor_gauge_set(mon_reg_series(f->decode_rate),
	                  d.decode_seconds > 0 ? d.generation_tokens / d.decode_seconds : 0);
	double engine_s = d.prefill_seconds + d.decode_seconds;
	double bw = engine_s > 0 ? d.weight_bytes / engine_s : 0;
	double peak = monitor_series_value(inf->peak_bandwidth);
	monitor_gauge_set(mon_reg_series(f->bw), bw);
	if (peak > 0) {
		monitor_gauge_set(mon_reg_series(f->bw_ratio), bw / peak);
		if (engine_s > 0)
			in->bw_ratio = bw / peak;
	}
}

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void note_error(monitor *m, const char *source, int rc, const struct cm_err *e, int *first,
                       struct cm_err *err)
{
	if (!rc)
		return;
	monitor_counter_inc(mon_reg_series(m->fam.mon_errors, source));
	pthread_mutex_lock(&m->state_mu);
	snprintf(m->last_error, sizeof(m->last_error), "%s", e->msg);
	pthread_mutex_unlock(&m->state_mu);
	if (!*first) {
		*first = rc;
		cm_err_set(err, rc, "%s", e->msg);
	}
}

int monitor_sample(monitor *m, uint64_t now_ns, struct cm_err *err)
{
	struct monitor_flag_event ev[MONITOR_FLAG_COUNT];
	char reasons[MONITOR_FLAG_COUNT][MON_REASON];
	int nev = 0, first = 0, rc;
	struct cm_err e = {0};

	if (m->p.pre_sample)
		m->p.pre_sample(m->p.pre_sample_ud, m);

	pthread_mutex_lock(&m->sample_mu);
	double cpu0 = thread_cpu_seconds();
	uint64_t now = now_ns ? now_ns : cm_now_ns();
	int cur = m->cur;
	bool prev = m->have_prev && now > m->prev_ns;
	double dt = prev ? (double)(now - m->prev_ns) / 1e9 : 0;
	struct classify_in in = {
	    .steal = -1,
	    .throttled = -1,
	    .psi_cpu = -1,
	    .psi_mem = -1,
	    .psi_io = -1,
	    .mem_avail = -1,
	    .cg_mem = -1,
	    .bw_ratio = -1,
	};

	rc = mon_sys_read(m->sysr, &m->buf, m->procfs, &m->sys[cur], &e);
	note_error(m, "system", rc, &e, &first, err);
	rc = mon_psi_read(&m->buf, m->procfs, m->psi[cur], &e);
	note_error(m, "pressure", rc, &e, &first, err);
	rc = mon_proc_read(&m->buf, m->procfs, m->p.pid, m->worker_prefix, &m->proc, &e);
	note_error(m, "process", rc, &e, &first, err);
	rc = mon_cgroup_read(&m->buf, m->procfs, m->sysfs, m->p.pid, &m->cg[cur], &e);
	note_error(m, "cgroup", rc, &e, &first, err);

	publish_sys(m, &m->sys[cur], &m->sys[!cur], prev, dt, &in);
	publish_psi(m, m->psi[cur], m->psi[!cur], prev, dt, &in);
	publish_cgroup(m, &m->cg[cur], &m->cg[!cur], prev, dt, &in);
	publish_proc(m, prev, dt, &in);
	publish_inference(m, prev, dt, &in);

	if (prev && dt > 0)
		nev = mon_classify_step(&m->cls, &m->p.th, &in, (double)now / 1e9, ev);
	for (int i = 0; i < nev; i++) {
		const char *name = ev[i].name;
		monitor_gauge_set(mon_reg_series(m->fam.flag, name), ev[i].on ? 1 : 0);
		monitor_counter_inc(mon_reg_series(m->fam.flag_changes, name));
		snprintf(reasons[i], sizeof(reasons[i]), "%s", ev[i].reason);
		ev[i].reason = reasons[i];
	}
	pthread_mutex_lock(&m->state_mu);
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		const struct flag_machine *fm = &m->cls.f[f];
		m->flags[f].on = fm->on;
		m->flags[f].since = fm->since;
		_Static_assert(sizeof(m->flags[f].reason) == sizeof(fm->reason), "reason sizes");
		memcpy(m->flags[f].reason, fm->reason, sizeof(fm->reason));
	}
	if (prev)
		m->interval = dt;
	m->n_samples++;
	pthread_mutex_unlock(&m->state_mu);

	m->cur = !cur;
	m->have_prev = true;
	m->prev_ns = now;
	monitor_counter_inc(mon_reg_series(m->fam.mon_samples));

	if (m->textfile) {
		rc = monitor_textfile_write(m, m->textfile, &e);
		note_error(m, "textfile", rc, &e, &first, err);
	}
	double cost = thread_cpu_seconds() - cpu0;
	monitor_counter_add(mon_reg_series(m->fam.mon_cpu), cost);
	monitor_gauge_set(mon_reg_series(m->fam.mon_duration), cost);
	pthread_mutex_unlock(&m->sample_mu);

	if (m->p.on_flag)
		for (int i = 0; i < nev; i++)
			m->p.on_flag(m->p.on_flag_ud, &ev[i]);
	return first;
}

/* ---- sampler thread ------------------------------------------------------- */

static void *sampler_main(void *arg)
{
	monitor *m = arg;
	struct timespec next;
	uint64_t period = (uint64_t)m->p.interval_ms * 1000000ull;
	pthread_setname_np(pthread_self(), "edgelmd:monitor");
	clock_gettime(CLOCK_MONOTONIC, &next);
	pthread_mutex_lock(&m->th_mu);
	while (!m->th_stop) {
		pthread_mutex_unlock(&m->th_mu);
		(void)monitor_sample(m, 0, NULL); /* failures are counted and kept in last_error */
		pthread_mutex_lock(&m->th_mu);
		uint64_t t =
		    (uint64_t)next.tv_sec * 1000000000ull + (uint64_t)next.tv_nsec + period;
		uint64_t now = cm_now_ns();
		if (t < now) /* fell behind (suspend, overload): restart the grid */
			t = now + period;
		next.tv_sec = (time_t)(t / 1000000000ull);
		next.tv_nsec = (long)(t % 1000000000ull);
		while (!m->th_stop && pthread_cond_timedwait(&m->th_cv, &m->th_mu, &next) == 0)
			;
	}
	pthread_mutex_unlock(&m->th_mu);
	return NULL;
}

int monitor_start(monitor *m, struct cm_err *err)
{
	pthread_mutex_lock(&m->th_mu);
	if (m->th_running) {
		pthread_mutex_unlock(&m->th_mu);
		return 0;
	}
	m->th_stop = false;
	int rc = pthread_create(&m->th, NULL, sampler_main, m);
	if (rc == 0)
		m->th_running = true;
	pthread_mutex_unlock(&m->th_mu);
	if (rc)
		return cm_err_set(err, -rc, "monitor: sampler thread: %s", strerror(rc));
	return 0;
}

void monitor_stop(monitor *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->th_mu);
	if (!m->th_running) {
		pthread_mutex_unlock(&m->th_mu);
		return;
	}
	m->th_stop = true;
	pthread_cond_broadcast(&m->th_cv);
	pthread_mutex_unlock(&m->th_mu);
	pthread_join(m->th, NULL);
	pthread_mutex_lock(&m->th_mu);
	m->th_running = false;
	m->th_stop = false;
	pthread_mutex_unlock(&m->th_mu);
}
