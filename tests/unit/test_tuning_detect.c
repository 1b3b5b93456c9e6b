/* tests/unit/test_tuning_detect.c: the detection report, on the fake trees
 * of docs/tuning.md and on this box's real /sys and /proc. */
#include "tests/unit/test_tuning_fake.h"

#include <sched.h>

static void test_cpuset(void)
{
	struct tuning_cpuset s;
	char buf[64];
	CHECK_OK(tuning_cpuset_parse("0-3,8,10-11\n", &s, NULL));
	CHECK_EQ_INT(tuning_cpuset_count(&s), 7);
	CHECK(tuning_cpuset_has(&s, 8) && !tuning_cpuset_has(&s, 9));
	CHECK_OK(tuning_cpuset_format(&s, buf, sizeof(buf)));
	CHECK_STREQ(buf, "0-3,8,10-11");
	CHECK_OK(tuning_cpuset_parse("", &s, NULL));
	CHECK_EQ_INT(tuning_cpuset_count(&s), 0);
	CHECK_OK(tuning_cpuset_format(&s, buf, sizeof(buf)));
	CHECK_STREQ(buf, "");
	CHECK_OK(tuning_cpuset_parse("1023", &s, NULL));
	CHECK_EQ_INT(tuning_cpuset_next(&s, 0), 1023);
	struct cm_err err = {0};
	CHECK_EQ_INT(tuning_cpuset_parse("1024", &s, &err), -ERANGE);
	CHECK_EQ_INT(tuning_cpuset_parse("3-1", &s, NULL), -EINVAL);
	CHECK_EQ_INT(tuning_cpuset_parse("a", &s, NULL), -EINVAL);
	CHECK_EQ_INT(tuning_cpuset_parse("1,,2", &s, NULL), -EINVAL);
	/* too long for the buffer: -ENOSPC, still terminated */
	CHECK_OK(tuning_cpuset_parse("0,2,4,6,8,10,12,14,16,18,20", &s, NULL));
	CHECK_EQ_INT(tuning_cpuset_format(&s, buf, 12), -ENOSPC);
	CHECK(strlen(buf) < 12);
}

static void test_paths_env(void)
{
	struct tuning_paths p;
	struct cm_err err = {0};
	tuning_paths_default(&p);
	CHECK_STREQ(p.sysfs_root, "/sys");
	CHECK(tuning_paths_is_live(&p));
	setenv("EDGELM_SYSFS_ROOT", "/tmp/fake/sys/", 1);
	setenv("EDGELM_PROCFS_ROOT", "/tmp/fake/proc", 1);
	CHECK_OK(tuning_paths_from_env(&p, &err));
	CHECK_STREQ(p.sysfs_root, "/tmp/fake/sys");
	CHECK_STREQ(p.cgroup_root, "/tmp/fake/sys/fs/cgroup"); /* follows sysfs */
	CHECK_STREQ(p.procfs_root, "/tmp/fake/proc");
	CHECK_STREQ(p.state_file, "/run/edgelm/tuning.state");
	CHECK(!tuning_paths_is_live(&p));
	setenv("EDGELM_PROCFS_ROOT", "relative/proc", 1);
	CHECK_EQ_INT(tuning_paths_from_env(&p, &err), -EINVAL);
	CHECK(strstr(err.msg, "EDGELM_PROCFS_ROOT") != NULL);
	unsetenv("EDGELM_SYSFS_ROOT");
	unsetenv("EDGELM_PROCFS_ROOT");
}

static void test_cpuinfo_parse(void)
{
	struct tuning_cpu cpu;
	CHECK_OK(
	    tuning_cpu_parse_cpuinfo("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
	                             "model\t\t: 143\nmodel name\t: Xeon\n"
	                             "flags\t\t: fpu avx avx2 fma avx512f avx512_vnni amx_tile\n",
	                             &cpu));
	CHECK_STREQ(cpu.vendor, "GenuineIntel");
	CHECK_STREQ(cpu.model, "Xeon");
	CHECK_EQ_INT(cpu.model_id, 143);
	CHECK(cpu.isa.avx2 && cpu.isa.fma && cpu.isa.avx512f && cpu.isa.avx512vnni);
	CHECK(!cpu.isa.avx512bw && !cpu.isa.f16c);
	CHECK(cpu.isa.amx_tile && !cpu.isa.amx_int8);
	CHECK_OK(tuning_cpu_parse_cpuinfo("processor\t: 0\nFeatures\t: fp asimd asimddp i8mm\n"
	                                  "CPU implementer\t: 0x41\nCPU part\t: 0xd0b\n",
	                                  &cpu));
	CHECK_STREQ(cpu.arch, "aarch64");
	CHECK(cpu.isa.neon && cpu.isa.dotprod && cpu.isa.i8mm && !cpu.isa.avx2);
	CHECK_STREQ(cpu.model, "Cortex-A76");
	CHECK_EQ_INT(tuning_cpu_parse_cpuinfo("nothing useful\n", &cpu), -EINVAL);
}

static void test_xeon2s(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	if (fake_detect("xeon2s", &p, &r) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(tuning_cpuset_count(&r.online), 128);
	CHECK_EQ_INT(r.n_cores, 64);
	CHECK_EQ_INT(r.n_packages, 2);
	CHECK(r.smt);
	CHECK(!r.hybrid);
	/* siblings share a core */
	CHECK_EQ_INT(r.cpus[3].core, r.cpus[67].core);
	CHECK(r.cpus[3].core != r.cpus[4].core);
	CHECK_EQ_INT(r.cpus[40].package_id, 1);
	CHECK_EQ_INT(r.n_nodes, 2);
	CHECK_EQ_INT(r.cpus[40].node, 1);
	CHECK_EQ_INT(r.cpus[64].node, 0);
	CHECK_EQ_INT(r.usable_cores, 64);
	CHECK_EQ_INT(r.cgroup.version, 2);
	CHECK_STREQ(r.cgroup.path, "/system.slice/edgelmd.service");
	CHECK(!r.cgroup.has_quota);
	CHECK(r.cpufreq);
	CHECK_EQ_INT(r.n_policies, 128);
	CHECK_STREQ(r.policies[5].name, "policy5");
	CHECK_STREQ(r.policies[5].governor, "powersave");
	CHECK(r.policies[5].has_epp);
	CHECK_STREQ(r.policies[5].epp, "balance_performance");
	CHECK_EQ_INT(r.cpus[5].policy, 5);
	CHECK_EQ_INT(r.n_caches, 4);
	CHECK_EQ_INT(r.caches[3].level, 3);
	CHECK_EQ_INT(r.caches[3].size, 60ull << 20);
	CHECK_EQ_INT(r.caches[3].shared_cpus, 64);
	CHECK_STREQ(r.cpu.source, "cpuinfo");
	CHECK(r.cpu.isa.amx_tile && r.cpu.isa.amx_int8 && r.cpu.isa.avx512bf16);
	CHECK(!r.power_owner.found);
	CHECK(r.mem.memlock_unlimited);
	CHECK_EQ_INT(r.mem.numa_balancing, 1);
	CHECK_STREQ(r.mem.thp_enabled, "madvise");
	tuning_report_fini(&r);
}

static void test_biglittle(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	if (fake_detect("biglittle", &p, &r) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(r.n_cores, 8);
	CHECK(!r.smt);
	CHECK(r.hybrid);
	CHECK(!r.cores[r.cpus[0].core].big);
	CHECK(r.cores[r.cpus[5].core].big);
	CHECK_EQ_INT(r.n_policies, 2);
	CHECK_EQ_INT(r.cpus[6].max_khz, 2400000);
	CHECK_STREQ(r.cpu.arch, "aarch64");
	CHECK_STREQ(r.cpu.model, "Cortex-A55 + Cortex-A76");
	CHECK(r.cpu.isa.neon && r.cpu.isa.dotprod && !r.cpu.isa.i8mm);
	CHECK(!r.mem.cap_ipc_lock);
	CHECK_EQ_INT(r.mem.memlock_limit, 8u << 20);
	tuning_report_fini(&r);
}

static void test_container(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	if (fake_detect("container", &p, &r) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(tuning_cpuset_count(&r.online), 16);
	CHECK_EQ_INT(r.cgroup.version, 2);
	CHECK(r.cgroup.has_cpuset);
	char buf[64];
	CHECK_OK(tuning_cpuset_format(&r.cgroup.cpuset, buf, sizeof(buf)));
	CHECK_STREQ(buf, "0-3");
	CHECK(r.cgroup.has_quota);
	CHECK_EQ_INT(r.cgroup.quota_us, 150000);
	CHECK_EQ_INT(r.cgroup.period_us, 100000);
	CHECK_EQ_INT(r.cgroup.quota_cpus, 1);
	CHECK_EQ_INT(tuning_cpuset_count(&r.usable), 4);
	CHECK_EQ_INT(r.usable_cores, 4);
	CHECK(r.cgroup.has_mem_limit);
	CHECK_EQ_INT(r.cgroup.mem_limit, 4ull << 30);
	CHECK_EQ_INT(r.cgroup.mem_file, 512ull << 20);
	CHECK(!r.mem.cap_sys_nice);
	tuning_report_fini(&r);
}

/* the affinity mask restricts what is usable (taskset -c 0) */
static void test_vm_taskset(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct cm_err err = {0};
	if (fake_detect("vm", &p, &r) < 0) {
		CHECK(0);
		return;
	}
	CHECK_EQ_INT(tuning_cpuset_count(&r.online), 2);
	CHECK(!r.cpufreq);
	CHECK_EQ_INT(r.cgroup.version, 1);
	CHECK(r.cgroup.has_cpuset);
	CHECK(!r.cgroup.has_quota);
	CHECK(!r.cgroup.has_mem_limit); /* v1 "unlimited" */
	CHECK_EQ_INT(r.usable_cores, 2);
	CHECK_EQ_INT(r.n_caches, 0);
	tuning_report_fini(&r);
	/* taskset -c 0 */
	char status[1024];
	snprintf(status, sizeof(status),
	         "Name:\tedgelmd\nCapEff:\t000001fffeffffff\nCpus_allowed_list:\t0\n"
	         "Mems_allowed_list:\t0");
	CHECK_OK(fake_write(p.procfs_root, "self/status", status));
	tuning_report_init(&r);
	CHECK_OK(tuning_detect(&p, &r, &err));
	CHECK_EQ_INT(tuning_cpuset_count(&r.usable), 1);
	CHECK_EQ_INT(r.usable_cores, 1);
	tuning_report_fini(&r);
}

/* v2 cpu.max in a parent limits too; the most restrictive one wins */
static void test_quota_in_parent(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct cm_err err = {0};
	if (fake_tree("container", &p) < 0) {
		CHECK(0);
		return;
	}
	char cg[600];
	snprintf(cg, sizeof(cg), "%s", p.cgroup_root);
	CHECK_OK(fake_write(cg, "docker/cpu.max", "50000 100000"));
	tuning_report_init(&r);
	CHECK_OK(tuning_detect(&p, &r, &err));
	CHECK_EQ_INT(r.cgroup.quota_us, 50000);
	CHECK_EQ_INT(r.cgroup.quota_cpus, 1); /* at least one */
	tuning_report_fini(&r);
	/* no online file: a clear error */
	char path[700];
	snprintf(path, sizeof(path), "%s/devices/system/cpu/online", p.sysfs_root);
	CHECK_OK(unlink(path));
	tuning_report_init(&r);
	CHECK_EQ_INT(tuning_detect(&p, &r, &err), -ENOENT);
	CHECK(strstr(err.msg, "online") != NULL);
	tuning_report_fini(&r);
}

/* The real tree of this box: 2 logical cpus, no cpufreq, AVX-512. */
static void test_live(void)
{
	struct tuning_paths p;
	struct tuning_report r;
	struct cm_err err = {0};
	tuning_paths_default(&p);
	tuning_report_init(&r);
	CHECK_OK(tuning_detect(&p, &r, &err));
	int n = tuning_cpuset_count(&r.online);
	long conf = sysconf(_SC_NPROCESSORS_ONLN);
	CHECK_EQ_INT(n, conf);
	cpu_set_t cs;
	if (sched_getaffinity(0, sizeof(cs), &cs) == 0)
		CHECK_EQ_INT(tuning_cpuset_count(&r.affinity), CPU_COUNT(&cs));
	if (conf != 2 || r.cpufreq) {
		TEST_SKIP("not the 2-cpu dev VM without cpufreq (%ld cpus, cpufreq %s)", conf,
		          r.cpufreq ? "present" : "absent");
	} else {
		CHECK_EQ_INT(n, 2);
		CHECK(!r.cpufreq);
		CHECK_EQ_INT(r.n_policies, 0);
	}
#if defined(__x86_64__)
	CHECK_STREQ(r.cpu.source, "cpuid+xgetbv");
	__builtin_cpu_init();
	CHECK_EQ_INT(r.cpu.isa.avx2, __builtin_cpu_supports("avx2") != 0);
	CHECK_EQ_INT(r.cpu.isa.avx512f, __builtin_cpu_supports("avx512f") != 0);
	CHECK_EQ_INT(r.cpu.isa.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
	CHECK_EQ_INT(r.cpu.isa.avx512vnni, __builtin_cpu_supports("avx512vnni") != 0);
	if (!__builtin_cpu_supports("avx512f"))
		TEST_SKIP("this CPU has no AVX-512: ISA assertions skipped");
	else
		CHECK(r.cpu.isa.avx512f && r.cpu.os_avx512);
	struct cm_cpu_isa eng;
	tuning_cpu_engine_isa(&r.cpu, &eng);
	CHECK_EQ_INT(eng.avx512f, r.cpu.isa.avx512f);
	if (!r.cpu.isa.amx_tile)
		CHECK(!eng.amx_tile);
#endif
	CHECK(r.mem.total > 0 && r.mem.available > 0);
	CHECK(r.boot_id[0] != '\0');
	tuning_report_fini(&r);
}

int main(void)
{
	TEST_RUN(test_cpuset);
	TEST_RUN(test_paths_env);
	TEST_RUN(test_cpuinfo_parse);
	TEST_RUN(test_xeon2s);
	TEST_RUN(test_biglittle);
	TEST_RUN(test_container);
	TEST_RUN(test_vm_taskset);
	TEST_RUN(test_quota_in_parent);
	TEST_RUN(test_live);
	fake_cleanup();
	return test_finish();
}
