/* tests/unit/test_tuning_memory.c: the memory-fit refusal, the mlock
 * warning (fake limits, and this box under a 64 KiB RLIMIT_MEMLOCK), huge
 * page buffers, prefault and the RSS report. */
#include "tests/unit/test_tuning_fake.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

static void test_fit(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct cm_err err = {0};
	if (fake_detect("vm", &p, &r) < 0) { /* MemAvailable 23.1 GiB */
		CHECK(0);
		return;
	}
	CHECK_OK(tuning_memory_fit_check(&r, 4ull << 30, 1ull << 30, &err));
	CHECK_EQ_INT(tuning_memory_fit_check(&r, 30ull << 30, 2ull << 30, &err), -ENOMEM);
	CHECK_STREQ(err.msg,
	            "model does not fit in memory: needs 32 GiB (weights 30 GiB + KV cache "
	            "2 GiB), MemAvailable is 23.1 GiB; use a smaller model, quantization or "
	            "context, or free memory");
	CHECK_EQ_INT(tuning_memory_fit_check(&r, UINT64_MAX, 1, &err), -EOVERFLOW);
	tuning_report_fini(&r);
}

static void test_fit_cgroup(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct cm_err err = {0};
	/* memory.max 4 GiB, 1 GiB used of which 512 MiB page cache */
	if (fake_detect("container", &p, &r) < 0) {
		CHECK(0);
		return;
	}
	CHECK_OK(tuning_memory_fit_check(&r, 3ull << 30, 256ull << 20, &err));
	CHECK_EQ_INT(tuning_memory_fit_check(&r, 3ull << 30, 1ull << 30, &err), -ENOMEM);
	CHECK_STREQ(err.msg,
	            "model does not fit in memory: needs 4 GiB (weights 3 GiB + KV cache "
	            "1 GiB), cgroup memory limit 4 GiB leaves 3.5 GiB; raise MemoryMax= or "
	            "use a smaller model, quantization or context");
	tuning_report_fini(&r);
}

static const char *const warning_64k =
    "mlock: cannot lock 100 MiB of weights and KV cache in RAM (RLIMIT_MEMLOCK is 64 KiB and "
    "CAP_IPC_LOCK is missing); fix: LimitMEMLOCK=infinity in edgelmd.service (systemctl edit "
    "edgelmd)";

/* A fake box whose RLIMIT_MEMLOCK is `limit` ("65536", "unlimited") and
 * whose process has no CAP_IPC_LOCK, detected into r; false if the tree
 * could not be made. */
static bool memlock_box(const char *limit, struct tuning_report *r, struct tuning_plan *plan)
{
	struct tuning_paths p;
	struct cm_err err = {0};
	char limits[256];
	if (fake_tree("vm", &p) < 0)
		return false;
	snprintf(limits, sizeof(limits),
	         "Limit                     Soft Limit           Hard Limit           Units\n"
	         "Max locked memory         %-20s %-20s bytes",
	         limit, limit);
	CHECK_OK(fake_write(p.procfs_root, "self/limits", limits));
	CHECK_OK(fake_write(p.procfs_root, "self/status",
	                    "Name:\tedgelmd\nCapEff:\t0000000000000000\nCpus_allowed_list:\t0-1"));
	tuning_report_init(r);
	tuning_plan_init(plan);
	CHECK_OK(tuning_detect(&p, r, &err));
	return true;
}

/* prlimit --memlock=65536 without CAP_IPC_LOCK, on a fake tree */
static void test_memlock_warning(void)
{
	struct tuning_report r;
	struct tuning_plan plan;
	struct tuning_config c;
	struct cm_err err = {0};
	if (!memlock_box("65536", &r, &plan)) {
		CHECK(0);
		return;
	}
	CHECK(!r.mem.cap_ipc_lock);
	CHECK_EQ_INT(r.mem.memlock_limit, 65536);
	CHECK_OK(tuning_memlock_check(&r, 32768, &err));
	CHECK_EQ_INT(tuning_memlock_check(&r, 100ull << 20, &err), -EPERM);
	CHECK_STREQ(err.msg, warning_64k);
	CHECK(strlen(warning_64k) < sizeof(err.msg));

	tuning_config_default(&c);
	c.model_bytes = 90ull << 20;
	c.kv_bytes = 10ull << 20;
	CHECK_OK(tuning_plan_make(&r, &c, &plan, &err));
	const struct tuning_knob *k = tuning_plan_knob(&plan, TUNING_KNOB_MLOCK);
	CHECK(k && k->status == TUNING_KNOB_BLOCKED && strstr(k->reason, "LimitMEMLOCK=infinity"));

	/* the lock itself: one warning, then quiet */
	static char region[4096];
	struct tuning_region reg[2] = {{region, 90u << 20, "weights"},
	                               {region, 10u << 20, "KV cache"}};
	struct tuning_state st;
	tuning_state_init(&st);
	CHECK_EQ_INT(tuning_memory_lock(&plan, &r, reg, 2, &st, &err), -EPERM);
	CHECK_STREQ(err.msg, warning_64k);
	CHECK_EQ_INT(st.n_failed, 1);
	cm_err_clear(&err);
	CHECK_OK(tuning_memory_lock(&plan, &r, reg, 2, &st, &err));
	CHECK_STREQ(err.msg, "");
	CHECK_EQ_INT(st.n_failed, 1);
	CHECK(!st.mlocked);
	tuning_state_fini(&st);
	tuning_plan_fini(&plan);
	tuning_report_fini(&r);
}

/* With the limit out of the way (unlimited, as the unit sets it) a failing
 * mlock is not the limit's fault: the warning must not send the operator to
 * LimitMEMLOCK again (issue 23: it did). An unmapped range fails with
 * ENOMEM, as too little free RAM does. */
static void test_memlock_not_the_limit(void)
{
#if defined(__SANITIZE_ADDRESS__)
	TEST_SKIP("ASan turns mlock into a no-op that succeeds: no failure to word");
	return;
#endif
	struct tuning_report r;
	struct tuning_plan plan;
	struct tuning_config c;
	struct cm_err err = {0};
	if (!memlock_box("unlimited", &r, &plan)) {
		CHECK(0);
		return;
	}
	CHECK(r.mem.memlock_unlimited);
	tuning_config_default(&c);
	c.model_bytes = 1 << 20;
	CHECK_OK(tuning_plan_make(&r, &c, &plan, &err));
	void *hole = mmap(NULL, 1 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(hole != MAP_FAILED);
	munmap(hole, 1 << 20);
	struct tuning_region reg[1] = {{hole, 1 << 20, "weights"}};
	struct tuning_state st;
	tuning_state_init(&st);
	CHECK_EQ_INT(tuning_memory_lock(&plan, &r, reg, 1, &st, &err), -ENOMEM);
	CHECK_MSG(strstr(err.msg, "too little free RAM") && !strstr(err.msg, "LimitMEMLOCK"),
		  "%s", err.msg);
	tuning_state_fini(&st);
	tuning_plan_fini(&plan);
	tuning_report_fini(&r);
}

static long vmlck_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %ld", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

/* This box, in a child: RLIMIT_MEMLOCK 64 KiB and (if root) no
 * CAP_IPC_LOCK, as under `prlimit --memlock=65536` for a non-root daemon. */
static void test_live_memlock(void)
{
	pid_t pid = fork();
	if (pid == 0) {
		struct rlimit rl = {65536, 65536};
		if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
			_exit(10);
		if (getuid() == 0 && setuid(65534) != 0) /* drops every capability */
			_exit(11);
		struct tuning_paths p;
		struct tuning_report r;
		struct tuning_plan plan;
		struct tuning_config c;
		struct tuning_state st;
		struct cm_err err = {0};
		tuning_paths_default(&p);
		tuning_report_init(&r);
		tuning_plan_init(&plan);
		tuning_state_init(&st);
		tuning_config_default(&c);
		if (tuning_detect(&p, &r, &err) < 0 || tuning_plan_make(&r, &c, &plan, &err) < 0)
			_exit(12);
		if (r.mem.cap_ipc_lock || r.mem.memlock_limit != 65536)
			_exit(13);
		size_t len = 4u << 20;
		void *m =
		    mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct tuning_region reg = {m, len, "weights"};
		int ret = tuning_memory_lock(&plan, &r, &reg, 1, &st, &err);
		if (ret != -EPERM || !strstr(err.msg, "RLIMIT_MEMLOCK is 64 KiB") ||
		    !strstr(err.msg, "LimitMEMLOCK=infinity"))
			_exit(14);
		_exit(vmlck_kib() == 0 ? 0 : 15);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exit %d",
	          WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* With the capability or a big enough limit, the lock works and restore
 * undoes it. */
static void test_live_lock(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct tuning_plan plan;
	struct tuning_config c;
	struct tuning_state st;
	struct cm_err err = {0};
	tuning_paths_default(&p);
	/* never the real /run/edgelm/tuning.state */
	snprintf(p.state_file, sizeof(p.state_file), "%.400s/tuning-live-%ld.state", test_tmpdir(),
	         (long)getpid());
	tuning_report_init(&r);
	tuning_plan_init(&plan);
	tuning_state_init(&st);
	tuning_config_default(&c);
	config_cpufreq_only(&c);
	c.mlock = TUNING_MLOCK_ON;
	CHECK_OK(tuning_detect(&p, &r, &err));
	CHECK_OK(tuning_plan_make(&r, &c, &plan, &err));
	size_t len = 1u << 20;
	if (tuning_memlock_check(&r, len, NULL) < 0) {
		TEST_SKIP("cannot lock 1 MiB here: %s", err.msg);
		goto out;
	}
	void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	struct tuning_region reg = {m, len, "weights"};
	long before = vmlck_kib();
	CHECK_OK(tuning_memory_lock(&plan, &r, &reg, 1, &st, &err));
	CHECK(st.mlocked);
#if defined(__SANITIZE_ADDRESS__)
	(void)before; /* ASan turns mlock/munlockall into no-ops */
	CHECK_OK(tuning_restore(&st, &p, &err));
	CHECK(!st.mlocked);
#else
	CHECK(vmlck_kib() >= before + 1024);
	CHECK_OK(tuning_restore(&st, &p, &err));
	CHECK(!st.mlocked);
	CHECK_EQ_INT(vmlck_kib(), 0);
#endif
	munmap(m, len);
out:
	tuning_state_fini(&st);
	tuning_plan_fini(&plan);
	tuning_report_fini(&r);
}

static void test_hugepage_buf(void)
{
	struct tuning_paths p;
	struct tuning_hugepage_buf b;
	struct cm_err err = {0};
	tuning_paths_default(&p);
	CHECK_OK(tuning_hugepage_alloc(&p, 5u << 20, &b, &err));
	CHECK(b.addr != NULL);
	CHECK_EQ_INT((uintptr_t)b.addr % (2u << 20), 0);
	CHECK_EQ_INT(b.len, 6u << 20);
	CHECK(b.madvised);
	char thp[64] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (f) {
		if (fgets(thp, sizeof(thp), f))
			CHECK(b.thp_enabled[0] && strstr(thp, b.thp_enabled) != NULL);
		fclose(f);
	}
	/* the engine copies the weights in; prefault touches them first */
	CHECK_OK(tuning_prefault(b.addr, b.len, true, &err));
	memset(b.addr, 0x5a, b.len);
	uint64_t rss = 0, huge = 0;
	CHECK_OK(tuning_memory_rss(&p, b.addr, b.len, &rss, &huge, &err));
	CHECK(rss >= b.len);
	if (b.thp_effective && huge == 0)
		fprintf(stderr, "note: THP %s but no huge page given (fragmented memory?)\n",
		        b.thp_enabled);
	CHECK(huge <= rss);
	tuning_hugepage_free(&b);
	CHECK(b.addr == NULL);
	tuning_hugepage_free(&b); /* NULL-safe */
	CHECK_EQ_INT(tuning_hugepage_alloc(&p, 0, &b, &err), -EINVAL);
}

static void test_prefault_file(void)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/tuning-prefault-%ld", test_tmpdir(), (long)getpid());
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	size_t len = 3u << 20;
	CHECK_OK(ftruncate(fd, (off_t)len));
	void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
	CHECK(m != MAP_FAILED);
	struct tuning_paths p;
	struct cm_err err = {0};
	tuning_paths_default(&p);
	uint64_t before = 0, after = 0;
	CHECK_OK(tuning_memory_rss(&p, m, len, &before, NULL, &err));
	CHECK_OK(tuning_prefault(m, len, false, &err));
	CHECK_OK(tuning_memory_rss(&p, m, len, &after, NULL, &err));
	CHECK_MSG(after >= len, "rss %llu after prefault of %zu", (unsigned long long)after, len);
	CHECK_OK(tuning_prefault(NULL, 0, false, &err));
	munmap(m, len);
	close(fd);
	unlink(path);
}

static void test_hugepages_knob(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct tuning_plan plan;
	struct tuning_config c;
	struct cm_err err = {0};
	if (fake_tree("vm", &p) < 0) {
		CHECK(0);
		return;
	}
	tuning_report_init(&r);
	tuning_plan_init(&plan);
	tuning_config_default(&c);
	c.hugepages = true;
	c.model_bytes = 1ull << 30;
	CHECK_OK(tuning_detect(&p, &r, &err));
	CHECK_OK(tuning_plan_make(&r, &c, &plan, &err));
	const struct tuning_knob *k = tuning_plan_knob(&plan, TUNING_KNOB_HUGEPAGES);
	CHECK(k && k->status == TUNING_KNOB_APPLY && strstr(k->wanted, "+1 GiB RSS"));
	tuning_report_fini(&r);
	CHECK_OK(fake_write(p.sysfs_root, "kernel/mm/transparent_hugepage/enabled",
	                    "always madvise [never]"));
	tuning_report_init(&r);
	CHECK_OK(tuning_detect(&p, &r, &err));
	CHECK_OK(tuning_plan_make(&r, &c, &plan, &err));
	k = tuning_plan_knob(&plan, TUNING_KNOB_HUGEPAGES);
	CHECK(k && k->status == TUNING_KNOB_BLOCKED);
	CHECK(k && strstr(k->reason, "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"));
	tuning_plan_fini(&plan);
	tuning_report_fini(&r);
}

int main(void)
{
	TEST_RUN(test_fit);
	TEST_RUN(test_fit_cgroup);
	TEST_RUN(test_memlock_warning);
	TEST_RUN(test_memlock_not_the_limit);
	TEST_RUN(test_live_memlock);
	TEST_RUN(test_live_lock);
	TEST_RUN(test_hugepage_buf);
	TEST_RUN(test_prefault_file);
	TEST_RUN(test_hugepages_knob);
	fake_cleanup();
	return test_finish();
}
