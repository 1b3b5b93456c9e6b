/* tests/unit/test_monitor_sys.c: the samplers: parsers of /proc files, PSI,
 * the process and its threads, cgroup v2/v1/hybrid trees, libproc2 against
 * the parsers on this box, the sampler thread, and the monitor's own cost. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(p);
}

static void put(const char *root, const char *rel, const char *text)
{
	char path[4400];
	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (char *p = path + strlen(root) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0755);
			*p = '/';
		}
	}
	FILE *f = fopen(path, "w");
	CHECK_MSG(f != NULL, "cannot write %s", path);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static char *fake_root(char *buf, size_t cap)
{
	snprintf(buf, cap, "%s/edgelm-monsys-XXXXXX", test_tmpdir());
	return mkdtemp(buf);
}

/* ---- parsers ------------------------------------------------------------------- */

static void test_parse_stat(void)
{
	struct sys_sample s = {0};
	const char *t = "cpu  10 20 30 40 50 60 70 80 90 100\n"
	                "cpu0 1 2 3 4 5 6 7 8 0 0\n"
	                "cpu3 11 12 13 14\n" /* an old kernel's short line, a gap in ids */
	                "intr 1 2 3\nctxt 99\nprocs_running 3\nprocs_blocked 1\n";
	CHECK_OK(mon_sys_parse_stat(t, &s));
	CHECK(s.have_stat);
	CHECK_EQ_INT(s.ncpu, 2);
	CHECK_EQ_INT(s.cpus[0].id, 0);
	CHECK_EQ_INT(s.cpus[0].t[CPU_STEAL], 8);
	CHECK_EQ_INT(s.cpus[1].id, 3);
	CHECK_EQ_INT(s.cpus[1].t[CPU_IDLE], 14);
	CHECK_EQ_INT(s.cpus[1].t[CPU_STEAL], 0);
	CHECK_EQ_INT(s.procs_running, 3);
	CHECK_EQ_INT(s.procs_blocked, 1);
	CHECK_EQ_INT(mon_sys_parse_stat("cpu  1 2 3\n", &s), -EPROTO);
	/* many cores: the table grows */
	char big[64 * 1024];
	size_t n = 0;
	for (int i = 0; i < 300; i++)
		n += (size_t)snprintf(big + n, sizeof(big) - n, "cpu%d %d 0 0 0 0 0 0 0 0 0\n", i,
		                      i);
	CHECK_OK(mon_sys_parse_stat(big, &s));
	CHECK_EQ_INT(s.ncpu, 300);
	CHECK_EQ_INT(s.cpus[299].t[CPU_USER], 299);
	mon_sys_sample_fini(&s);
}

static void test_parse_meminfo_vmstat_loadavg(void)
{
	struct sys_sample s = {0};
	CHECK_OK(mon_sys_parse_meminfo(
	    "MemTotal:       1000 kB\nMemFree:  10 kB\nMemAvailable:  "
	    "   400 kB\nSwapCached: 1 kB\nSwapTotal: 200 kB\nSwapFree: 50 kB\n",
	    &s));
	CHECK_EQ_INT(s.mem_total, 1024000);
	CHECK_EQ_INT(s.mem_avail, 409600);
	CHECK_EQ_INT(s.swap_total, 204800);
	CHECK_EQ_INT(s.swap_free, 51200);
	CHECK_EQ_INT(mon_sys_parse_meminfo("MemTotal: 5 kB\n", &s), -EPROTO); /* no MemAvailable */
	CHECK(!s.have_mem);
	CHECK_OK(mon_sys_parse_vmstat(
	    "pgpgin 5\npswpin 7\npswpout 8\npgmajfault_x 1\npgmajfault 9\n", &s));
	CHECK_EQ_INT(s.pswpin, 7);
	CHECK_EQ_INT(s.pswpout, 8);
	CHECK_EQ_INT(s.pgmajfault, 9);
	CHECK(!s.have_oom_kill);
	CHECK_OK(mon_sys_parse_loadavg("0.50 1.25 2.00 3/400 1234\n", &s));
	CHECK_NEAR(s.load[1], 1.25, 1e-12);
	CHECK_EQ_INT(mon_sys_parse_loadavg("x\n", &s), -EPROTO);
}

static void test_parse_psi(void)
{
	struct psi_res r;
	CHECK_OK(mon_psi_parse("some avg10=1.50 avg60=0.20 avg300=0.00 total=12345\n"
	                       "full avg10=0.50 avg60=0.10 avg300=0.00 total=678\n",
	                       &r));
	CHECK(r.present && r.some.have && r.full.have);
	CHECK_NEAR(r.some.avg10, 1.5, 1e-12);
	CHECK_EQ_INT(r.some.total, 12345);
	CHECK_EQ_INT(r.full.total, 678);
	CHECK_OK(
	    mon_psi_parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n", &r)); /* old cpu */
	CHECK(!r.full.have);
	CHECK_EQ_INT(mon_psi_parse("garbage\n", &r), -EPROTO);
	/* no /proc/pressure: not an error, nothing present */
	char root[4096];
	if (!fake_root(root, sizeof(root)))
		return;
	struct mon_buf b = {0};
	struct psi_res rr[PSI_N];
	CHECK_OK(mon_psi_read(&b, root, rr, NULL));
	CHECK(!rr[0].present && !rr[1].present && !rr[2].present);
	put(root, "pressure/io", "bad\n");
	struct cm_err e = {0};
	CHECK_EQ_INT(mon_psi_read(&b, root, rr, &e), -EPROTO);
	CHECK(strstr(e.msg, "pressure/io") != NULL);
	mon_buf_fini(&b);
	nftw(root, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void test_parse_proc_stat(void)
{
	char comm[32];
	uint64_t ut, st, mf, nt;
	CHECK_OK(
	    mon_proc_parse_stat("42 (we (ird) name) S 1 42 42 0 -1 0 7 0 5 0 300 40 0 0 20 0 6 0 "
	                        "99 123 456\n",
	                        comm, sizeof(comm), &ut, &st, &mf, &nt));
	CHECK_STREQ(comm, "we (ird) name");
	CHECK_EQ_INT(ut, 300);
	CHECK_EQ_INT(st, 40);
	CHECK_EQ_INT(mf, 5);
	CHECK_EQ_INT(nt, 6);
	CHECK_EQ_INT(mon_proc_parse_stat("42 no parens\n", comm, sizeof(comm), &ut, &st, &mf, &nt),
	             -EPROTO);
	CHECK_EQ_INT(mon_proc_parse_stat("42 (x) S 1 2\n", comm, sizeof(comm), &ut, &st, &mf, &nt),
	             -EPROTO);
}

/* Threads: deltas per tid, new threads flagged fresh, gone threads dropped. */
static void test_proc_threads(void)
{
	char root[4096];
	if (!fake_root(root, sizeof(root)))
		return;
	put(root, "7/stat", "7 (edgelmd) S 1 7 7 0 -1 0 0 0 3 0 100 10 0 0 20 0 2\n");
	put(root, "7/status", "VmRSS:\t 2048 kB\nVmLck:\t 1024 kB\n");
	put(root, "7/task/7/stat", "7 (edgelmd) S 1 7 7 0 -1 0 0 0 0 0 1 0 0 0 20 0 2\n");
	put(root, "7/task/8/stat", "8 (edgelmd:w0) R 1 7 7 0 -1 0 0 0 0 0 99 10 0 0 20 0 2\n");
	put(root, "7/task/8/schedstat", "1000 500 3\n");
	put(root, "7/task/8/status",
	    "voluntary_ctxt_switches:\t4\nnonvoluntary_ctxt_switches:\t9\n");
	struct mon_buf b = {0};
	struct proc_sample s = {0};
	CHECK_OK(mon_proc_read(&b, root, 7, "edgelmd:w", &s, NULL));
	CHECK(s.have && s.have_sched);
	CHECK_EQ_INT(s.rss, 2048 * 1024);
	CHECK_EQ_INT(s.locked, 1024 * 1024);
	CHECK_EQ_INT(s.majflt, 3);
	CHECK_EQ_INT(s.n_th, 2);
	struct proc_thread *w = s.th[0].tid == 8 ? &s.th[0] : &s.th[1];
	CHECK(w->worker && w->fresh);
	CHECK_EQ_INT(w->d_nivcsw, 9);
	put(root, "7/task/8/schedstat", "3000 2500 5\n");
	put(root, "7/task/8/status",
	    "voluntary_ctxt_switches:\t4\nnonvoluntary_ctxt_switches:\t19\n");
	char gone[4200]; /* thread 7 exits */
	snprintf(gone, sizeof(gone), "%s/7/task/7", root);
	nftw(gone, rm_one, 8, FTW_DEPTH | FTW_PHYS);
	CHECK_OK(mon_proc_read(&b, root, 7, "edgelmd:w", &s, NULL));
	CHECK_EQ_INT(s.n_th, 1);
	CHECK(!s.th[0].fresh);
	CHECK_EQ_INT(s.th[0].d_run_ns, 2000);
	CHECK_EQ_INT(s.th[0].d_run_delay_ns, 2000);
	CHECK_EQ_INT(s.th[0].d_nivcsw, 10);
	struct cm_err e = {0};
	CHECK(mon_proc_read(&b, root, 8, NULL, &s, &e) == -ENOENT); /* no such process */
	mon_proc_sample_fini(&s);
	mon_buf_fini(&b);
	nftw(root, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- cgroups ---------------------------------------------------------------------- */

static void test_cgroup_v2(void)
{
	char root[4096], proc[4200], sys[4200];
	if (!fake_root(root, sizeof(root)))
		return;
	snprintf(proc, sizeof(proc), "%s/proc", root);
	snprintf(sys, sizeof(sys), "%s/sys", root);
	put(root, "proc/self/cgroup", "0::/system.slice/edgelmd.service\n");
	put(root, "sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
	put(root, "sys/fs/cgroup/system.slice/edgelmd.service/memory.current", "1000\n");
	put(root, "sys/fs/cgroup/system.slice/edgelmd.service/memory.max", "max\n");
	put(root, "sys/fs/cgroup/system.slice/edgelmd.service/memory.events",
	    "low 1\nhigh 2\nmax 3\noom 4\noom_kill 5\noom_group_kill 6\n");
	put(root, "sys/fs/cgroup/system.slice/edgelmd.service/cpu.stat",
	    "usage_usec 9\nnr_periods 100\nnr_throttled 7\nthrottled_usec 3000\n");
	struct mon_buf b = {0};
	struct cg_sample s;
	CHECK_OK(mon_cgroup_read(&b, proc, sys, 0, &s, NULL));
	CHECK_EQ_INT(s.version, 2);
	CHECK_STREQ(s.path, "/system.slice/edgelmd.service");
	CHECK(s.have_mem && s.have_events && s.have_cpu);
	CHECK_EQ_INT(s.mem_current, 1000);
	CHECK(s.mem_max == UINT64_MAX);
	CHECK_EQ_INT(s.ev_high, 2);
	CHECK_EQ_INT(s.ev_oom, 4);
	CHECK_EQ_INT(s.ev_oom_kill, 5);
	CHECK_EQ_INT(s.nr_throttled, 7);
	CHECK_EQ_INT(s.throttled_usec, 3000);
	/* the root group is no cgroup */
	put(root, "proc/self/cgroup", "0::/\n");
	CHECK_OK(mon_cgroup_read(&b, proc, sys, 0, &s, NULL));
	CHECK_EQ_INT(s.version, 0);
	mon_buf_fini(&b);
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Hybrid host (like this dev VM): v2 under fs/cgroup/unified without
 * controllers, v1 memory and cpu controllers beside it. */
static void test_cgroup_hybrid_v1(void)
{
	char root[4096], proc[4200], sys[4200];
	if (!fake_root(root, sizeof(root)))
		return;
	snprintf(proc, sizeof(proc), "%s/proc", root);
	snprintf(sys, sizeof(sys), "%s/sys", root);
	put(root, "proc/self/cgroup",
	    "9:name=systemd:/x\n4:memory:/lim\n1:cpu,cpuacct:/lim\n0::/x\n");
	put(root, "sys/fs/cgroup/unified/x/cgroup.procs", "1\n");
	put(root, "sys/fs/cgroup/unified/x/cpu.stat", "usage_usec 5\n"); /* no cpu controller */
	put(root, "sys/fs/cgroup/memory/lim/memory.usage_in_bytes", "900\n");
	put(root, "sys/fs/cgroup/memory/lim/memory.limit_in_bytes", "1000\n");
	put(root, "sys/fs/cgroup/memory/lim/memory.failcnt", "12\n");
	put(root, "sys/fs/cgroup/memory/lim/memory.oom_control",
	    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n");
	put(root, "sys/fs/cgroup/cpu,cpuacct/lim/cpu.stat",
	    "nr_periods 50\nnr_throttled 5\nthrottled_time 7000000\n");
	struct mon_buf b = {0};
	struct cg_sample s;
	CHECK_OK(mon_cgroup_read(&b, proc, sys, 0, &s, NULL));
	CHECK_EQ_INT(s.version, 1);
	CHECK(s.have_mem && s.have_cpu && s.have_events);
	CHECK_EQ_INT(s.mem_current, 900);
	CHECK_EQ_INT(s.mem_max, 1000);
	CHECK_EQ_INT(s.ev_max, 12);
	CHECK_EQ_INT(s.ev_oom_kill, 2);
	CHECK_EQ_INT(s.nr_periods, 50);
	CHECK_EQ_INT(s.throttled_usec, 7000);
	put(root, "sys/fs/cgroup/memory/lim/memory.limit_in_bytes", "9223372036854771712\n");
	CHECK_OK(mon_cgroup_read(&b, proc, sys, 0, &s, NULL));
	CHECK(s.mem_max == UINT64_MAX); /* v1's "unlimited" */
	/* v2 controllers in the unified tree win */
	put(root, "sys/fs/cgroup/unified/x/memory.current", "77\n");
	put(root, "sys/fs/cgroup/unified/x/memory.max", "100\n");
	CHECK_OK(mon_cgroup_read(&b, proc, sys, 0, &s, NULL));
	CHECK_EQ_INT(s.version, 2);
	CHECK_EQ_INT(s.mem_current, 77);
	CHECK_EQ_INT(s.nr_periods, 50); /* cpu still from v1 */
	mon_buf_fini(&b);
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- the real box ------------------------------------------------------------------ */

/* libproc2 and the parsers read the same figures. */
static void test_libproc2_matches_parsers(void)
{
	struct sys_reader *r = NULL;
	CHECK_OK(mon_sys_reader_new(true, &r, NULL));
	if (!r)
		return;
	struct mon_buf b = {0};
	struct sys_sample a = {0}, p = {0};
	struct cm_err e = {0};
	int rc = mon_sys_read(r, &b, "/proc", &a, &e);
	CHECK_MSG(rc == 0, "libproc2: %s", e.msg);
	rc = mon_sys_read(NULL, &b, "/proc", &p, &e);
	CHECK_MSG(rc == 0, "parsers: %s", e.msg);
	CHECK(a.have_stat && a.have_mem && a.have_vm && a.have_load);
	CHECK_EQ_INT(a.ncpu, p.ncpu);
	CHECK_EQ_INT(a.ncpu, sysconf(_SC_NPROCESSORS_ONLN));
	for (int i = 0; i < a.ncpu && i < p.ncpu; i++) {
		CHECK_EQ_INT(a.cpus[i].id, p.cpus[i].id);
		for (int k = 0; k < CPU_MODES; k++) { /* read a moment apart */
			CHECK(p.cpus[i].t[k] >= a.cpus[i].t[k]);
			CHECK(p.cpus[i].t[k] - a.cpus[i].t[k] < 100);
		}
	}
	CHECK_EQ_INT(a.mem_total, p.mem_total);
	CHECK_EQ_INT(a.swap_total, p.swap_total);
	CHECK_NEAR((double)a.mem_avail, (double)p.mem_avail, 0.02 * (double)a.mem_total);
	CHECK(p.pgmajfault >= a.pgmajfault && p.pgmajfault - a.pgmajfault < 1000);
	CHECK_EQ_INT(a.pswpin, p.pswpin);
	CHECK_NEAR(a.load[0], p.load[0], 0.5);
	mon_sys_sample_fini(&a);
	mon_sys_sample_fini(&p);
	mon_buf_fini(&b);
	mon_sys_reader_free(r);
}

static atomic_int g_stop_idle;

static void *idle_worker(void *arg)
{
	char name[16];
	snprintf(name, sizeof(name), "edgelmd:w%d", (int)(intptr_t)arg);
	pthread_setname_np(pthread_self(), name);
	while (!atomic_load(&g_stop_idle))
		usleep(5000);
	return NULL;
}

/* Issue 7 asks for < 1% of one core at 1 Hz: < 10 ms of CPU per sample.
 * Measured with the daemon's shape: 8 named workers beside the main thread. */
static void test_cost_below_one_percent(void)
{
	pthread_t th[8];
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, idle_worker, (void *)(intptr_t)i);
	char dir[4096], path[4200];
	snprintf(dir, sizeof(dir), "%s/edgelm-cost-XXXXXX", test_tmpdir());
	CHECK(mkdtemp(dir) != NULL);
	snprintf(path, sizeof(path), "%s/edgelm.prom", dir);
	struct monitor_params p;
	monitor_params_default(&p);
	p.textfile_path = path; /* the whole per-second job, textfile included */
	monitor *m = NULL;
	CHECK_OK(monitor_new(&p, &m, NULL));
	if (m) {
		const int n = 30;
		CHECK_OK(monitor_sample(m, 0, NULL)); /* warm-up: buffers, series */
		double c0 = monitor_series_value(mon_reg_series(m->fam.mon_cpu));
		struct timespec a, b;
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
		for (int i = 0; i < n; i++)
			CHECK_OK(monitor_sample(m, 0, NULL));
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
		double per = (monitor_series_value(mon_reg_series(m->fam.mon_cpu)) - c0) / n;
		double proc = ((double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9) / n;
		fprintf(stderr,
		        "monitor cost: %.3f ms CPU per sample (self-measured), %.3f ms (process "
		        "clock) = %.3f%% of one core at 1 Hz\n",
		        per * 1e3, proc * 1e3, proc * 100);
		CHECK_MSG(per < 0.010, "%.3f ms per sample", per * 1e3);
		CHECK(per > 0);
		monitor_free(m);
	}
	atomic_store(&g_stop_idle, 1);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	unlink(path);
	rmdir(dir);
}

static int g_presamples;

static void pre_sample(void *ud, monitor *m)
{
	(void)ud;
	g_presamples++;
	monitor_counter_add(monitor_inference_get(m)->prompt_tokens, 1);
}

static void test_sampler_thread(void)
{
	struct monitor_params p;
	monitor_params_default(&p);
	p.interval_ms = 50;
	p.pre_sample = pre_sample;
	monitor *m = NULL;
	CHECK_OK(monitor_new(&p, &m, NULL));
	if (!m)
		return;
	CHECK_OK(monitor_start(m, NULL));
	CHECK_OK(monitor_start(m, NULL)); /* idempotent */
	usleep(330000);
	monitor_stop(m);
	double n = monitor_series_value(mon_reg_series(m->fam.mon_samples));
	CHECK_MSG(n >= 4 && n <= 9, "%g samples in 330 ms at 50 ms", n);
	CHECK_EQ_INT(g_presamples, (int)n);
	CHECK_NEAR(monitor_series_value(monitor_inference_get(m)->prompt_tokens), n, 0);
	monitor_stop(m); /* idempotent */
	/* a long interval does not delay stop */
	monitor_free(m);
	p.interval_ms = 10000;
	p.pre_sample = NULL;
	CHECK_OK(monitor_new(&p, &m, NULL));
	if (!m)
		return;
	CHECK_OK(monitor_start(m, NULL));
	usleep(20000);
	uint64_t t0 = cm_now_ns();
	monitor_free(m);
	CHECK((cm_now_ns() - t0) < 500000000ull);
}

/* A fake root: the parsers are used and say so. */
static void test_fake_root_env(void)
{
	char root[4096];
	if (!fake_root(root, sizeof(root)))
		return;
	setenv("EDGELM_PROCFS_ROOT", root, 1);
	monitor *m = NULL;
	CHECK_OK(monitor_new(NULL, &m, NULL));
	unsetenv("EDGELM_PROCFS_ROOT");
	if (!m)
		return;
	CHECK(!m->use_libproc2);
	CHECK_STREQ(m->procfs, root);
	struct cm_err e = {0};
	CHECK(monitor_sample(m, 0, &e) < 0); /* an empty root: errors, counted */
	CHECK(strstr(e.msg, root) != NULL);
	monitor_family *f = monitor_family_find(m, "edgelm_monitor_sample_errors_total");
	const char *v[] = {"system"};
	monitor_series *s = NULL;
	CHECK_OK(monitor_series_get(f, v, &s, NULL));
	CHECK_NEAR(monitor_series_value(s), 1, 0);
	monitor_free(m);
	struct monitor_params p;
	monitor_params_default(&p);
	p.procfs_root = "/proc/";
	CHECK_OK(monitor_new(&p, &m, NULL));
	if (m) {
		CHECK(m->use_libproc2);
		monitor_free(m);
	}
	nftw(root, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
	TEST_RUN(test_parse_stat);
	TEST_RUN(test_parse_meminfo_vmstat_loadavg);
	TEST_RUN(test_parse_psi);
	TEST_RUN(test_parse_proc_stat);
	TEST_RUN(test_proc_threads);
	TEST_RUN(test_cgroup_v2);
	TEST_RUN(test_cgroup_hybrid_v1);
	TEST_RUN(test_libproc2_matches_parsers);
	TEST_RUN(test_cost_below_one_percent);
	TEST_RUN(test_sampler_thread);
	TEST_RUN(test_fake_root_env);
	return test_finish();
}
