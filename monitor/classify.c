/* monitor/classify.c: bottleneck flags with hysteresis.
 *
 * Every flag has an "on" rule and an "off" rule over the per-sample signals
 * of struct classify_in (monitor.c derives them from counter deltas, so they
 * describe the last interval only). The two rules use different thresholds
 * (value hysteresis: between them nothing changes), and a flag changes only
 * after on_samples (off_samples) consecutive samples that satisfy its rule
 * (time hysteresis). A missing source (-1) never turns a flag on and never
 * holds one on.
 *
 * compute_bound is decided last: it needs the other flags off, because
 * saturated workers that wait for memory, swap or a stolen core are not
 * limited by arithmetic. The rules, thresholds and advice are in
 * docs/monitor.md; keep them in step. */
#include "monitor/monitor_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const flag_names[MONITOR_FLAG_COUNT] = {
    [MONITOR_FLAG_COMPUTE_BOUND] = "compute_bound",
    [MONITOR_FLAG_BANDWIDTH_BOUND] = "bandwidth_bound",
    [MONITOR_FLAG_CPU_CONTENTION] = "cpu_contention",
    [MONITOR_FLAG_MEMORY_PRESSURE] = "memory_pressure",
    [MONITOR_FLAG_SWAPPING] = "swapping",
    [MONITOR_FLAG_IO_BOUND] = "io_bound",
};

const char *monitor_flag_name(enum monitor_flag f)
{
	return (unsigned)f < MONITOR_FLAG_COUNT ? flag_names[f] : NULL;
}

void monitor_thresholds_default(struct monitor_thresholds *t)
{
	*t = (struct monitor_thresholds){
	    .on_samples = 2,
	    .off_samples = 3,
	    .active_min = 0.20,
	    .compute_on = 0.90,
	    .compute_off = 0.75,
	    .bandwidth_on = 0.80,
	    .bandwidth_off = 0.70,
	    .steal_on = 0.05,
	    .steal_off = 0.02,
	    .throttle_on = 0.10,
	    .throttle_off = 0.03,
	    .wait_on = 0.15,
	    .wait_off = 0.05,
	    .nivcsw_on = 50,
	    .psi_cpu_on = 0.25,
	    .psi_cpu_off = 0.10,
	    .mem_avail_on = 0.10,
	    .mem_avail_off = 0.15,
	    .psi_mem_on = 0.10,
	    .psi_mem_off = 0.02,
	    .cg_mem_on = 0.90,
	    .cg_mem_off = 0.85,
	    .swapin_on = 256 * 1024,
	    .swapin_off = 4096,
	    .majflt_on = 20,
	    .majflt_off = 2,
	    .psi_io_on = 0.20,
	    .psi_io_off = 0.05,
	};
}

/* A reason being built: parts joined by "; ". */
struct why {
	char s[MON_REASON];
	size_t n;
};

CM_PRINTF(2, 3) static void why_add(struct why *w, const char *fmt, ...)
{
	if (w->n + 3 >= sizeof(w->s))
		return;
	if (w->n)
		w->n += (size_t)snprintf(w->s + w->n, sizeof(w->s) - w->n, "; ");
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(w->s + w->n, sizeof(w->s) - w->n, fmt, ap);
	va_end(ap);
	if (k > 0)
		w->n = CM_MIN(w->n + (size_t)k, sizeof(w->s) - 1);
}

static double pct(double r)
{
	return r * 100.0;
}

/* Is x known and >= on? Known and < off (or unknown)? */
static bool ge(double x, double on)
{
	return x >= 0 && x >= on;
}

static bool below(double x, double off)
{
	return x < 0 || x < off;
}

/* Step one flag's state machine. */
static bool step(struct flag_machine *fm, bool on_rule, bool off_rule, const struct why *on_why,
                 const struct why *off_why, const struct monitor_thresholds *th, double t)
{
	if (!fm->on) {
		fm->count = on_rule ? fm->count + 1 : 0;
		if (fm->count < CM_MAX(th->on_samples, 1))
			return false;
		fm->on = true;
	} else {
		if (on_rule) /* still on: keep the newest reason */
			snprintf(fm->reason, sizeof(fm->reason), "%s", on_why->s);
		fm->count = off_rule ? fm->count + 1 : 0;
		if (fm->count < CM_MAX(th->off_samples, 1))
			return false;
		fm->on = false;
	}
	fm->count = 0;
	fm->since = t;
	snprintf(fm->reason, sizeof(fm->reason), "%s", fm->on ? on_why->s : off_why->s);
	return true;
}

int mon_classify_step(struct classify_state *st, const struct monitor_thresholds *th,
                      const struct classify_in *in, double t,
                      struct monitor_flag_event ret_ev[MONITOR_FLAG_COUNT])
{
	int n = 0;
	bool changed[MONITOR_FLAG_COUNT] = {0};
	struct why on, off;
	bool on_rule, off_rule;

	/* cpu_contention: someone else runs on the cores our workers want. */
	on = (struct why){0};
	off = (struct why){0};
	if (ge(in->steal, th->steal_on))
		why_add(&on, "steal %.0f%% >= %.0f%%", pct(in->steal), pct(th->steal_on));
	if (ge(in->throttled, th->throttle_on))
		why_add(&on, "cgroup throttled %.0f%% of periods >= %.0f%%", pct(in->throttled),
		        pct(th->throttle_on));
	if (in->active && ge(in->worker_wait, th->wait_on))
		why_add(&on, "workers wait for a cpu %.0f%% of the time >= %.0f%%",
		        pct(in->worker_wait), pct(th->wait_on));
	/* Preemptions count only when they cost time: a wakeup of one of our
	 * own threads preempts a worker cheaply. */
	if (in->active && ge(in->nivcsw_rate, th->nivcsw_on) && ge(in->worker_wait, th->wait_off))
		why_add(&on, "%.0f involuntary switches/s per worker >= %.0f", in->nivcsw_rate,
		        th->nivcsw_on);
	if (in->active && ge(in->psi_cpu, th->psi_cpu_on))
		why_add(&on, "psi cpu some %.0f%% >= %.0f%%", pct(in->psi_cpu),
		        pct(th->psi_cpu_on));
	on_rule = on.n > 0;
	off_rule = below(in->steal, th->steal_off) && below(in->throttled, th->throttle_off) &&
	           (!in->active ||
	            (below(in->worker_wait, th->wait_off) && below(in->psi_cpu, th->psi_cpu_off)));
	why_add(
	    &off,
	    "cleared: steal %.0f%%, workers wait %.0f%%, %.0f invol. switches/s, psi cpu %.0f%%",
	    pct(CM_MAX(in->steal, 0)), pct(in->worker_wait), in->nivcsw_rate,
	    pct(CM_MAX(in->psi_cpu, 0)));
	changed[MONITOR_FLAG_CPU_CONTENTION] =
	    step(&st->f[MONITOR_FLAG_CPU_CONTENTION], on_rule, off_rule, &on, &off, th, t);

	/* memory_pressure: little memory left, or reclaim stalls. */
	on = (struct why){0};
	off = (struct why){0};
	if (in->mem_avail >= 0 && in->mem_avail <= th->mem_avail_on)
		why_add(&on, "MemAvailable %.1f%% of RAM <= %.0f%%", pct(in->mem_avail),
		        pct(th->mem_avail_on));
	if (ge(in->psi_mem, th->psi_mem_on))
		why_add(&on, "psi memory some %.0f%% >= %.0f%%", pct(in->psi_mem),
		        pct(th->psi_mem_on));
	if (ge(in->cg_mem, th->cg_mem_on))
		why_add(&on, "cgroup memory %.0f%% of memory.max >= %.0f%%", pct(in->cg_mem),
		        pct(th->cg_mem_on));
	if (in->cg_events > 0)
		why_add(&on, "cgroup hit its memory limit %.0f times", in->cg_events);
	on_rule = on.n > 0;
	off_rule = (in->mem_avail < 0 || in->mem_avail >= th->mem_avail_off) &&
	           below(in->psi_mem, th->psi_mem_off) && below(in->cg_mem, th->cg_mem_off) &&
	           in->cg_events <= 0;
	why_add(&off, "cleared: MemAvailable %.1f%%, psi memory %.0f%%, cgroup memory %.0f%%",
	        pct(CM_MAX(in->mem_avail, 0)), pct(CM_MAX(in->psi_mem, 0)),
	        pct(CM_MAX(in->cg_mem, 0)));
	changed[MONITOR_FLAG_MEMORY_PRESSURE] =
	    step(&st->f[MONITOR_FLAG_MEMORY_PRESSURE], on_rule, off_rule, &on, &off, th, t);

	/* swapping: pages come back from swap, or weights fault in, while we
	 * generate. */
	on = (struct why){0};
	off = (struct why){0};
	if (in->generating && in->swapin_rate >= th->swapin_on)
		why_add(&on, "swap-in %.0f KiB/s during inference >= %.0f", in->swapin_rate / 1024,
		        th->swapin_on / 1024);
	if (in->generating && in->majflt_rate >= th->majflt_on)
		why_add(&on, "%.0f major faults/s in the daemon during inference >= %.0f",
		        in->majflt_rate, th->majflt_on);
	on_rule = on.n > 0;
	off_rule = !in->generating ||
	           (in->swapin_rate < th->swapin_off && in->majflt_rate < th->majflt_off);
	why_add(&off, "cleared: swap-in %.0f KiB/s, %.0f major faults/s%s", in->swapin_rate / 1024,
	        in->majflt_rate, in->generating ? "" : ", not generating");
	changed[MONITOR_FLAG_SWAPPING] =
	    step(&st->f[MONITOR_FLAG_SWAPPING], on_rule, off_rule, &on, &off, th, t);

	/* io_bound: loading the model waits for the disk. */
	on = (struct why){0};
	off = (struct why){0};
	if (in->loading && ge(in->psi_io, th->psi_io_on))
		why_add(&on, "psi io some %.0f%% >= %.0f%% while loading", pct(in->psi_io),
		        pct(th->psi_io_on));
	on_rule = on.n > 0;
	off_rule = !in->loading || below(in->psi_io, th->psi_io_off);
	why_add(&off, "cleared: psi io %.0f%%%s", pct(CM_MAX(in->psi_io, 0)),
	        in->loading ? "" : ", not loading");
	changed[MONITOR_FLAG_IO_BOUND] =
	    step(&st->f[MONITOR_FLAG_IO_BOUND], on_rule, off_rule, &on, &off, th, t);

	/* bandwidth_bound: decode streams the weights near the box's peak. */
	on = (struct why){0};
	off = (struct why){0};
	if (in->generating && ge(in->bw_ratio, th->bandwidth_on))
		why_add(&on, "weight bandwidth %.0f%% of measured peak >= %.0f%%",
		        pct(in->bw_ratio), pct(th->bandwidth_on));
	on_rule = on.n > 0;
	off_rule = !in->generating || below(in->bw_ratio, th->bandwidth_off);
	why_add(&off, "cleared: weight bandwidth %.0f%% of peak%s", pct(CM_MAX(in->bw_ratio, 0)),
	        in->generating ? "" : ", not generating");
	changed[MONITOR_FLAG_BANDWIDTH_BOUND] =
	    step(&st->f[MONITOR_FLAG_BANDWIDTH_BOUND], on_rule, off_rule, &on, &off, th, t);

	/* compute_bound: workers saturate their cores and nothing else holds
	 * them back. */
	on = (struct why){0};
	off = (struct why){0};
	bool blocked = false;
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++)
		if (f != MONITOR_FLAG_COMPUTE_BOUND && st->f[f].on)
			blocked = true;
	bool calm = below(in->psi_mem, th->psi_mem_off) && below(in->psi_io, th->psi_io_off);
	bool stormy = ge(in->psi_mem, th->psi_mem_on) || ge(in->psi_io, th->psi_io_on);
	if (in->worker_busy >= th->compute_on && !blocked && calm)
		why_add(&on, "workers %.0f%% busy >= %.0f%%, no contention or memory/io pressure",
		        pct(in->worker_busy), pct(th->compute_on));
	on_rule = on.n > 0;
	off_rule = in->worker_busy < th->compute_off || blocked || stormy;
	why_add(&off, "cleared: workers %.0f%% busy%s%s", pct(in->worker_busy),
	        blocked ? ", another flag is on" : "", stormy ? ", memory/io pressure" : "");
	changed[MONITOR_FLAG_COMPUTE_BOUND] =
	    step(&st->f[MONITOR_FLAG_COMPUTE_BOUND], on_rule, off_rule, &on, &off, th, t);

	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		if (!changed[f])
			continue;
		ret_ev[n++] = (struct monitor_flag_event){
		    .flag = (enum monitor_flag)f,
		    .name = flag_names[f],
		    .on = st->f[f].on,
		    .reason = st->f[f].reason,
		    .time = t,
		};
	}
	return n;
}
