/* tests/unit/test_tuning_plan.c: thread count and pinning for each modelled
 * box (SMT siblings excluded, cpuset and quota honoured, big cores on
 * big.LITTLE), NUMA choice, the config override, and on this box under a
 * restricted affinity (taskset -c 0). */
#include "tests/unit/test_tuning_fake.h"

#include <sched.h>
#include <sys/wait.h>

static int make_plan(const char *box, const struct tuning_config *c, struct tuning_report *r,
                     struct tuning_plan *p)
{
	struct tuning_paths paths;
	struct cm_err err = {0};
	tuning_plan_init(p);
	tuning_report_init(r);
	if (fake_shared(box, &paths) < 0)
		return -1;
	int ret = tuning_detect(&paths, r, &err);
	if (ret == 0)
		ret = tuning_plan_make(r, c, p, &err);
	if (ret < 0)
		fprintf(stderr, "tuning_plan_make(%s): %s\n", box, err.msg);
	return ret;
}

static const char *fmt(const struct tuning_cpuset *s)
{
	static char buf[4][256];
	static int k;
	char *b = buf[k++ % 4];
	(void)tuning_cpuset_format(s, b, 256);
	return b;
}

/* No two workers on one core, every worker on a usable cpu. */
static void check_distinct_cores(const struct tuning_report *r, const struct tuning_plan *p)
{
	for (int i = 0; i < p->n_workers; i++) {
		int c = p->worker_cpus[i];
		CHECK(tuning_cpuset_has(&r->usable, c));
		for (int j = 0; j < i; j++)
			CHECK_MSG(r->cpus[c].core != r->cpus[p->worker_cpus[j]].core,
			          "cpus %d and %d share a core", c, p->worker_cpus[j]);
	}
}

static void test_xeon2s_interleave(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	tuning_config_default(&c); /* model size unknown: NUMA auto -> interleave */
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.n_workers, 64); /* 64 cores, 128 logical: siblings excluded */
	CHECK_EQ_INT(p.numa, TUNING_NUMA_INTERLEAVE);
	CHECK_EQ_INT(p.numa_nodes, 3);
	CHECK_STREQ(fmt(&p.workers), "0-63");
	check_distinct_cores(&r, &p);
	/* every core has a worker: the service threads must share */
	CHECK(p.service_shared);
	const struct tuning_knob *k = tuning_plan_knob(&p, TUNING_KNOB_NUMA);
	CHECK(k && strstr(k->reason, "numa_balancing") != NULL);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_xeon2s_node(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	tuning_config_default(&c);
	c.model_bytes = 40ull << 30; /* fits in node 0's 240 GiB */
	c.kv_bytes = 8ull << 30;
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.numa, TUNING_NUMA_NODE);
	CHECK_EQ_INT(p.numa_node, 0);
	CHECK_EQ_INT(p.n_workers, 32);
	CHECK_STREQ(fmt(&p.workers), "0-31");
	check_distinct_cores(&r, &p);
	/* node 0 has no spare core: service threads go to node 1's cpus */
	CHECK(!p.service_shared);
	CHECK_STREQ(fmt(&p.service), "32-63,96-127");
	tuning_plan_fini(&p);
	tuning_report_fini(&r);

	/* too big for a node: interleaved, workers round-robin over nodes */
	c.model_bytes = 300ull << 30;
	c.threads = 4;
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.numa, TUNING_NUMA_INTERLEAVE);
	CHECK_EQ_INT(p.n_workers, 4);
	CHECK_STREQ(fmt(&p.workers), "0-1,32-33");
	CHECK(!p.service_shared);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);

	/* explicit node 1 */
	c.numa = TUNING_NUMA_NODE;
	c.numa_node = 1;
	c.threads = 0;
	c.model_bytes = 1ull << 30;
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.numa_node, 1);
	CHECK_STREQ(fmt(&p.workers), "32-63");
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_xeon2s_override(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	tuning_config_default(&c);
	c.numa = TUNING_NUMA_OFF;
	c.threads = 70; /* more than the cores: 6 siblings join */
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.n_workers, 70);
	CHECK_STREQ(fmt(&p.workers), "0-69");
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
	c.threads = 500; /* clamped to the usable cpus */
	if (make_plan("xeon2s", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.n_workers, 128);
	CHECK(strstr(p.threads_note, "clamped") != NULL);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_biglittle(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	tuning_config_default(&c);
	if (make_plan("biglittle", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	/* the big cores (4-7) work, the LITTLE ones (0-3) serve */
	CHECK_EQ_INT(p.n_workers, 4);
	CHECK_STREQ(fmt(&p.workers), "4-7");
	CHECK_STREQ(fmt(&p.service), "0-3");
	CHECK(strstr(p.threads_note, "big") != NULL);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
	/* an override beyond the big cores takes LITTLE cores next */
	c.threads = 6;
	if (make_plan("biglittle", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_STREQ(fmt(&p.workers), "0-1,4-7");
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_container(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	tuning_config_default(&c);
	if (make_plan("container", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	/* cpuset 0-3 (4 cores), cpu.max 150000/100000 -> 1 worker */
	CHECK_EQ_INT(p.n_workers, 1);
	CHECK_EQ_INT(p.worker_cpus[0], 0);
	CHECK_STREQ(fmt(&p.service), "1-3");
	CHECK(strstr(p.threads_note, "quota") != NULL);
	/* the governor only on the policies of the cpus we use */
	int n_gov = 0;
	for (int i = 0; i < p.n_knobs; i++)
		if (p.knobs[i].kind == TUNING_KNOB_GOVERNOR) {
			n_gov++;
			CHECK_EQ_INT(p.knobs[i].status, TUNING_KNOB_APPLY);
			CHECK(strstr(p.knobs[i].target, "/policy") != NULL);
		}
	CHECK_EQ_INT(n_gov, 4);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
	/* an override above the quota is honoured, with a note */
	c.threads = 3;
	if (make_plan("container", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.n_workers, 3);
	CHECK(strstr(p.threads_note, "throttled") != NULL);
	check_distinct_cores(&r, &p);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_vm(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_paths paths;
	struct cm_err err = {0};
	tuning_config_default(&c);
	if (make_plan("vm", &c, &r, &p) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(p.n_workers, 2);
	CHECK_STREQ(fmt(&p.workers), "0-1");
	CHECK(p.service_shared);
	const struct tuning_knob *k = tuning_plan_knob(&p, TUNING_KNOB_GOVERNOR);
	CHECK(k && k->status == TUNING_KNOB_NA);
	CHECK(k && strstr(k->reason, "no cpufreq") != NULL);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
	/* taskset -c 0 */
	if (fake_tree("vm", &paths) < 0) {
		CHECK(0);
		return;
	}
	CHECK_OK(fake_write(paths.procfs_root, "self/status",
	                    "Name:\tedgelmd\nCpus_allowed_list:\t0\nMems_allowed_list:\t0"));
	tuning_report_init(&r);
	tuning_plan_init(&p);
	CHECK_OK(tuning_detect(&paths, &r, &err));
	CHECK_OK(tuning_plan_make(&r, &c, &p, &err));
	CHECK_EQ_INT(p.n_workers, 1);
	CHECK_EQ_INT(p.worker_cpus[0], 0);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_bad_config(void)
{
	struct tuning_config c;
	struct tuning_report r;
	struct tuning_plan p;
	struct cm_err err = {0};
	struct tuning_paths paths;
	tuning_report_init(&r);
	if (fake_shared("vm", &paths) < 0 || tuning_detect(&paths, &r, &err) < 0) {
		CHECK(0);
		return;
	}
	tuning_plan_init(&p);
	tuning_config_default(&c);
	c.nice = 25;
	CHECK_EQ_INT(tuning_plan_make(&r, &c, &p, &err), -EINVAL);
	CHECK(strstr(err.msg, "nice") != NULL);
	tuning_config_default(&c);
	c.threads = -1;
	CHECK_EQ_INT(tuning_plan_make(&r, &c, &p, &err), -EINVAL);
	tuning_config_default(&c);
	c.oom_score_adj = 2000;
	CHECK_EQ_INT(tuning_plan_make(&r, &c, &p, &err), -EINVAL);
	tuning_config_default(&c);
	snprintf(c.epp, sizeof(c.epp), "x/../y");
	CHECK_EQ_INT(tuning_plan_make(&r, &c, &p, &err), -EINVAL);
	/* config names */
	enum tuning_mlock m;
	enum tuning_numa nm;
	enum tuning_ioprio io;
	int lvl;
	CHECK_OK(tuning_mlock_parse("all", &m));
	CHECK_EQ_INT(m, TUNING_MLOCK_ALL);
	CHECK_EQ_INT(tuning_mlock_parse("maybe", &m), -EINVAL);
	CHECK_OK(tuning_numa_parse("interleave", &nm));
	CHECK_STREQ(tuning_numa_name(nm), "interleave");
	CHECK_OK(tuning_ioprio_parse("be:3", &io, &lvl));
	CHECK(io == TUNING_IOPRIO_BE && lvl == 3);
	CHECK_EQ_INT(tuning_ioprio_parse("be:9", &io, &lvl), -EINVAL);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

/* On this box under taskset -c 0: one worker (a child process, so the
 * test's own affinity stays). */
static void test_live_taskset(void)
{
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) != 0 || !CPU_ISSET(0, &cs)) {
		TEST_SKIP("cpu 0 not in our affinity mask");
		return;
	}
	pid_t pid = fork();
	if (pid == 0) {
		CPU_ZERO(&cs);
		CPU_SET(0, &cs);
		if (sched_setaffinity(0, sizeof(cs), &cs) != 0)
			_exit(10);
		struct tuning_paths paths;
		struct tuning_report r;
		struct tuning_plan p;
		struct tuning_config c;
		tuning_paths_default(&paths);
		tuning_report_init(&r);
		tuning_plan_init(&p);
		tuning_config_default(&c);
		if (tuning_detect(&paths, &r, NULL) < 0 || tuning_plan_make(&r, &c, &p, NULL) < 0)
			_exit(11);
		int rc = p.n_workers == 1 && p.worker_cpus[0] == 0 ? 0 : 12;
		tuning_plan_fini(&p);
		tuning_report_fini(&r);
		_exit(rc);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
}

/* Every allocation failing in turn: an error or a result, never a crash
 * or a leak (ASan checks the latter). */
static void test_alloc_failures(void)
{
	struct tuning_paths paths;
	struct tuning_config c;
	tuning_config_default(&c);
	if (fake_shared("container", &paths) < 0) {
		CHECK(0);
		return;
	}
	int ok_at = -1;
	for (long n = 0; n < 200 && ok_at < 0; n++) {
		struct tuning_report r;
		struct tuning_plan p;
		struct tuning_state st;
		char *json = NULL;
		tuning_report_init(&r);
		tuning_plan_init(&p);
		tuning_state_init(&st);
		cm_alloc_fail_reset(n);
		int ret = tuning_detect(&paths, &r, NULL);
		if (ret == 0)
			ret = tuning_plan_make(&r, &c, &p, NULL);
		if (ret == 0)
			ret = tuning_state_json(&st, &p, &json, NULL);
		cm_alloc_fail_reset(-1);
		CHECK(ret == 0 || ret == -ENOMEM);
		if (ret == 0 && r.n_cores == 8 && r.cgroup.has_quota && p.n_workers == 1)
			ok_at = (int)n;
		cm_free(json);
		tuning_state_fini(&st);
		tuning_plan_fini(&p);
		tuning_report_fini(&r);
	}
	CHECK(ok_at > 0);
}

int main(void)
{
	TEST_RUN(test_xeon2s_interleave);
	TEST_RUN(test_xeon2s_node);
	TEST_RUN(test_xeon2s_override);
	TEST_RUN(test_biglittle);
	TEST_RUN(test_container);
	TEST_RUN(test_vm);
	TEST_RUN(test_bad_config);
	TEST_RUN(test_live_taskset);
	TEST_RUN(test_alloc_failures);
	fake_cleanup();
	return test_finish();
}
