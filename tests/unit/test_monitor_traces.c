/* tests/unit/test_monitor_traces.c: the bottleneck classifier, driven by
 * recorded procfs traces through a fake procfs/sysfs root, and directly.
 *
 * Each trace in tests/data/monitor/ (made by mktraces.py) is a sequence of
 * one-second ticks of files; the test writes them into a temporary root,
 * takes a sample with a synthetic timestamp, and checks the flags the trace
 * expects after that tick, reasons included. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_EXPECT 16

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static void rm_rf(const char *dir)
{
	nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void mkdirs_for(const char *path)
{
	char tmp[4700];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(tmp, 0755);
			*p = '/';
		}
	}
}

static const char *trace_dir(void)
{
	/* Tests run from the tree's top; fall back to this file's location. */
	static char buf[4096];
	if (test_file_exists("tests/data/monitor/saturated.trace"))
		return "tests/data/monitor";
	snprintf(buf, sizeof(buf), "%s", __FILE__);
	char *s = strstr(buf, "tests/unit/");
	if (s)
		snprintf(s, sizeof(buf) - (size_t)(s - buf), "tests/data/monitor");
	return buf;
}

struct expect {
	int flag; /* enum monitor_flag */
	int on;   /* -1: only a reason check */
	char reason[512];
};

struct replay {
	const char *name;
	monitor *m;
	int tick;
	char note[128];
	struct expect ex[MAX_EXPECT];
	int n_ex;
	int events[MONITOR_FLAG_COUNT]; /* on_flag calls per flag */
	int seen_on[MONITOR_FLAG_COUNT];
	int seen_off_after_on[MONITOR_FLAG_COUNT];
	int checks;
};

static int g_seen_on[MONITOR_FLAG_COUNT], g_seen_off[MONITOR_FLAG_COUNT];

static void on_flag(void *ud, const struct monitor_flag_event *ev)
{
	struct replay *r = ud;
	r->events[ev->flag]++;
	CHECK(ev->reason && ev->reason[0]);
	CHECK_STREQ(ev->name, monitor_flag_name(ev->flag));
}

static int flag_by_name(const char *s)
{
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++)
		if (strcmp(s, monitor_flag_name((enum monitor_flag)f)) == 0)
			return f;
	return -1;
}

static void finish_tick(struct replay *r)
{
	if (r->tick < 0)
		return;
	struct cm_err e = {0};
	uint64_t t = (uint64_t)(r->tick + 1) * 1000000000ull;
	int rc = monitor_sample(r->m, t, &e);
	CHECK_MSG(rc == 0, "%s tick %d: sample: %s", r->name, r->tick, e.msg);
	struct monitor_flag_state fl[MONITOR_FLAG_COUNT];
	monitor_flags_get(r->m, fl);
	for (int i = 0; i < r->n_ex; i++) {
		const struct expect *x = &r->ex[i];
		r->checks++;
		if (x->on >= 0)
			CHECK_MSG(fl[x->flag].on == (x->on != 0),
			          "%s tick %d (%s): %s is %s, expected %s (reason: %s)", r->name,
			          r->tick, r->note, monitor_flag_name((enum monitor_flag)x->flag),
			          fl[x->flag].on ? "on" : "off", x->on ? "on" : "off",
			          fl[x->flag].reason);
		else
			CHECK_MSG(strstr(fl[x->flag].reason, x->reason) != NULL,
			          "%s tick %d: %s reason '%s' lacks '%s'", r->name, r->tick,
			          monitor_flag_name((enum monitor_flag)x->flag), fl[x->flag].reason,
			          x->reason);
	}
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		if (fl[f].on)
			r->seen_on[f] = 1;
		else if (r->seen_on[f])
			r->seen_off_after_on[f] = 1;
	}
	r->n_ex = 0;
}

static void set_metric(struct replay *r, const char *name, double v)
{
	monitor_family *f = monitor_family_find(r->m, name);
	monitor_series *s = NULL;
	CHECK_MSG(f && monitor_series_get(f, NULL, &s, NULL) == 0, "%s: no metric %s", r->name,
	          name);
	if (!s)
		return;
	if (f->type == MONITOR_TYPE_COUNTER)
		monitor_counter_set(s, v);
	else
		monitor_gauge_set(s, v);
}

static void replay_trace(const char *name)
{
	char path[4200], root[4096], proc[4200], sys[4200];
	snprintf(path, sizeof(path), "%s/%s.trace", trace_dir(), name);
	FILE *in = fopen(path, "r");
	if (!in) {
		TEST_SKIP("no trace %s", path);
		return;
	}
	snprintf(root, sizeof(root), "%s/edgelm-mon-%s-XXXXXX", test_tmpdir(), name);
	CHECK(mkdtemp(root) != NULL);
	snprintf(proc, sizeof(proc), "%s/proc", root);
	snprintf(sys, sizeof(sys), "%s/sys", root);

	struct replay r = {.name = name, .tick = -1};
	struct monitor_params p;
	monitor_params_default(&p);
	p.procfs_root = proc;
	p.sysfs_root = sys;
	p.on_flag = on_flag;
	p.on_flag_ud = &r;
	struct cm_err e = {0};
	int rc = monitor_new(&p, &r.m, &e);
	CHECK_MSG(rc == 0, "monitor_new: %s", e.msg);
	if (rc) {
		fclose(in);
		rm_rf(root);
		return;
	}

	char line[4096];
	FILE *out = NULL;
	while (fgets(line, sizeof(line), in)) {
		if (out) {
			if (strcmp(line, "end\n") == 0) {
				fclose(out);
				out = NULL;
			} else {
				fputs(line, out);
			}
			continue;
		}
		line[strcspn(line, "\n")] = '\0';
		char a[256], b[512];
		double v;
		if (line[0] == '#' || !line[0])
			continue;
		if (strncmp(line, "tick", 4) == 0) {
			finish_tick(&r);
			r.tick++;
			const char *c = strchr(line, '#');
			snprintf(r.note, sizeof(r.note), "%s", c ? c + 2 : "");
		} else if (sscanf(line, "file %255s", a) == 1) {
			char fp[4600];
			snprintf(fp, sizeof(fp), "%s/%s", root, a);
			mkdirs_for(fp);
			out = fopen(fp, "w");
			CHECK_MSG(out != NULL, "cannot write %s", fp);
			if (!out)
				break;
		} else if (sscanf(line, "set %255s %lf", a, &v) == 2) {
			set_metric(&r, a, v);
		} else if (sscanf(line, "expect %255s %lf", a, &v) == 2 ||
		           sscanf(line, "reason %255s %511[^\n]", a, b) == 2) {
			int f = flag_by_name(a);
			CHECK_MSG(f >= 0 && r.n_ex < MAX_EXPECT, "%s: bad line '%s'", name, line);
			if (f < 0 || r.n_ex >= MAX_EXPECT)
				continue;
			struct expect *x = &r.ex[r.n_ex++];
			x->flag = f;
			if (line[0] == 'e') {
				x->on = (int)v;
			} else {
				x->on = -1;
				snprintf(x->reason, sizeof(x->reason), "%s", b);
			}
		} else {
			CHECK_MSG(0, "%s: unknown line '%s'", name, line);
		}
	}
	if (out)
		fclose(out);
	finish_tick(&r);
	fclose(in);

	/* Every change reached the callback and the changes counter. */
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		monitor_family *cf = monitor_family_find(r.m, "edgelm_bottleneck_changes_total");
		const char *v[] = {monitor_flag_name((enum monitor_flag)f)};
		monitor_series *s = NULL;
		CHECK(cf && monitor_series_get(cf, v, &s, NULL) == 0);
		CHECK_EQ_INT((long long)monitor_series_value(s), r.events[f]);
		g_seen_on[f] |= r.seen_on[f];
		g_seen_off[f] |= r.seen_off_after_on[f];
	}
	CHECK(r.checks > 20);
	monitor_free(r.m);
	rm_rf(root);
}

static void test_trace_saturated(void)
{
	replay_trace("saturated");
}

static void test_trace_contended(void)
{
	replay_trace("contended");
}

static void test_trace_mempressure(void)
{
	replay_trace("mempressure");
}

static void test_trace_swapping(void)
{
	replay_trace("swapping");
}

static void test_trace_ioload(void)
{
	replay_trace("ioload");
}

/* The traces together turn every flag on and off again. */
static void test_traces_cover_every_flag(void)
{
	for (int f = 0; f < MONITOR_FLAG_COUNT; f++) {
		CHECK_MSG(g_seen_on[f], "no trace turns %s on",
		          monitor_flag_name((enum monitor_flag)f));
		CHECK_MSG(g_seen_off[f], "no trace turns %s off again",
		          monitor_flag_name((enum monitor_flag)f));
	}
}

/* ---- the classifier alone -------------------------------------------------- */

static struct classify_in quiet(void)
{
	return (struct classify_in){
	    .steal = 0,
	    .throttled = -1,
	    .psi_cpu = 0,
	    .psi_mem = 0,
	    .psi_io = 0,
	    .mem_avail = 0.8,
	    .cg_mem = -1,
	    .bw_ratio = -1,
	};
}

static void test_classify_unknown_sources_never_flag(void)
{
	struct monitor_thresholds th;
	monitor_thresholds_default(&th);
	struct classify_state st = {0};
	struct monitor_flag_event ev[MONITOR_FLAG_COUNT];
	struct classify_in in = {
	    .active = true,
	    .generating = true,
	    .loading = true,
	    .steal = -1,
	    .throttled = -1,
	    .psi_cpu = -1,
	    .psi_mem = -1,
	    .psi_io = -1,
	    .mem_avail = -1,
	    .cg_mem = -1,
	    .bw_ratio = -1,
	};
	for (int i = 0; i < 10; i++)
		CHECK_EQ_INT(mon_classify_step(&st, &th, &in, i, ev), 0);
}

static void test_classify_time_hysteresis(void)
{
	struct monitor_thresholds th;
	monitor_thresholds_default(&th);
	th.on_samples = 3;
	th.off_samples = 2;
	struct classify_state st = {0};
	struct monitor_flag_event ev[MONITOR_FLAG_COUNT];
	struct classify_in hot = quiet(), cold = quiet();
	hot.steal = 0.5;
	/* on needs 3 in a row; an interruption restarts the count */
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 1, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 2, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &cold, 3, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 4, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 5, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 6, ev), 1);
	CHECK_EQ_INT(ev[0].flag, MONITOR_FLAG_CPU_CONTENTION);
	CHECK(ev[0].on);
	CHECK(strstr(ev[0].reason, "steal 50%") != NULL);
	CHECK_NEAR(ev[0].time, 6, 1e-9);
	/* off needs 2 */
	CHECK_EQ_INT(mon_classify_step(&st, &th, &cold, 7, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &hot, 8, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &cold, 9, ev), 0);
	CHECK_EQ_INT(mon_classify_step(&st, &th, &cold, 10, ev), 1);
	CHECK(!ev[0].on);
	CHECK(strstr(ev[0].reason, "cleared") != NULL);
}

static void test_classify_value_hysteresis(void)
{
	struct monitor_thresholds th;
	monitor_thresholds_default(&th);
	th.on_samples = th.off_samples = 1;
	struct classify_state st = {0};
	struct monitor_flag_event ev[MONITOR_FLAG_COUNT];
	struct classify_in in = quiet();
	in.psi_mem = 0.10; /* exactly the on threshold */
	CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 1, ev), 1);
	CHECK(st.f[MONITOR_FLAG_MEMORY_PRESSURE].on);
	for (double v = 0.09; v >= 0.02; v -= 0.01) { /* the band holds it */
		in.psi_mem = v + 1e-9;
		CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 2, ev), 0);
		CHECK(st.f[MONITOR_FLAG_MEMORY_PRESSURE].on);
	}
	in.psi_mem = 0.0199;
	CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 3, ev), 1);
	CHECK(!st.f[MONITOR_FLAG_MEMORY_PRESSURE].on);
	in.psi_mem = 0.05; /* band again: stays off */
	CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 4, ev), 0);
}

static void test_classify_contention_needs_our_workers(void)
{
	struct monitor_thresholds th;
	monitor_thresholds_default(&th);
	th.on_samples = th.off_samples = 1;
	struct classify_state st = {0};
	struct monitor_flag_event ev[MONITOR_FLAG_COUNT];
	struct classify_in in = quiet();
	/* Others stall on the CPU, but our workers are idle: not our problem. */
	in.psi_cpu = 0.9;
	in.worker_wait = 0.5;
	in.nivcsw_rate = 500;
	in.active = false;
	CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 1, ev), 0);
	in.active = true;
	CHECK_EQ_INT(mon_classify_step(&st, &th, &in, 2, ev), 1);
	CHECK(strstr(st.f[MONITOR_FLAG_CPU_CONTENTION].reason, "involuntary") != NULL);
	/* Many preemptions that cost no waiting are not contention. */
	struct classify_state st3 = {0};
	in = quiet();
	in.active = true;
	in.worker_busy = 0.99;
	in.nivcsw_rate = 400;
	in.worker_wait = 0.01;
	CHECK_EQ_INT(mon_classify_step(&st3, &th, &in, 1, ev), 1);
	CHECK_EQ_INT(ev[0].flag, MONITOR_FLAG_COMPUTE_BOUND);
	/* Throttling by the cgroup counts even when idle. */
	struct classify_state st2 = {0};
	in = quiet();
	in.throttled = 0.4;
	CHECK_EQ_INT(mon_classify_step(&st2, &th, &in, 1, ev), 1);
	CHECK(strstr(ev[0].reason, "throttled 40%") != NULL);
}

static void test_flag_names(void)
{
	CHECK_STREQ(monitor_flag_name(MONITOR_FLAG_COMPUTE_BOUND), "compute_bound");
	CHECK_STREQ(monitor_flag_name(MONITOR_FLAG_IO_BOUND), "io_bound");
	CHECK(monitor_flag_name(MONITOR_FLAG_COUNT) == NULL);
	CHECK(monitor_flag_name((enum monitor_flag) - 1) == NULL);
}

int main(void)
{
	TEST_RUN(test_trace_saturated);
	TEST_RUN(test_trace_contended);
	TEST_RUN(test_trace_mempressure);
	TEST_RUN(test_trace_swapping);
	TEST_RUN(test_trace_ioload);
	TEST_RUN(test_traces_cover_every_flag);
	TEST_RUN(test_classify_unknown_sources_never_flag);
	TEST_RUN(test_classify_time_hysteresis);
	TEST_RUN(test_classify_value_hysteresis);
	TEST_RUN(test_classify_contention_needs_our_workers);
	TEST_RUN(test_flag_names);
	return test_finish();
}
