/* tests/unit/test_tuning_report.c: `edgelmd --check` output (detection
 * report, each knob current -> wanted or BLOCKED: reason), the applied
 * state for `info` (JSON) and --restore-tuning's printout. */
#include "tests/unit/test_tuning_fake.h"

static char *render(const struct tuning_report *r, const struct tuning_plan *p)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	tuning_report_print(f, r, p);
	fclose(f);
	return buf;
}

static int check_box(const char *box, const struct tuning_config *c, struct tuning_paths *paths,
                     struct tuning_report *r, struct tuning_plan *p, char **out)
{
	struct cm_err err = {0};
	tuning_plan_init(p);
	if (fake_detect(box, paths, r) < 0 || tuning_plan_make(r, c, p, &err) < 0)
		return -1;
	*out = render(r, p);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "---- %s\n%s", box, *out);
	return *out ? 0 : -1;
}

#define HAS(text, s) CHECK_MSG(strstr(text, s) != NULL, "missing \"%s\"", s)

static void test_check_vm(void)
{
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
	char *out = NULL;
	tuning_config_default(&c);
	if (check_box("vm", &c, &paths, &r, &p, &out) < 0) {
		CHECK(0);
		return;
	}
	HAS(out, "  cpu            AMD EPYC (AuthenticAMD, family 26 model 2 stepping 1), under a "
	         "hypervisor\n");
	HAS(out, "avx512f");
	HAS(out, "avx512vnni avx512bf16 avxvnni");
	HAS(out, "2 logical cpus online (0-1), 2 physical cores, 1 package, no SMT");
	HAS(out, "cgroup         v1 /, cpuset 0-1, no cpu quota");
	HAS(out, "cpufreq        absent");
	HAS(out, "memlock        RLIMIT_MEMLOCK 8 MiB, CAP_IPC_LOCK yes");
	HAS(out, "huge pages     THP madvise");
	HAS(out, "workers        2 on cpus 0-1 (pinned)");
	HAS(out, "governor       cpufreq                n/a: no cpufreq on this box");
	HAS(out, "nice           process                0 -> -5");
	HAS(out, "they share them");
	HAS(out, "Summary: ");
	CHECK(strstr(out, "BLOCKED") == NULL);
	free(out);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_check_blocked(void)
{
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
	struct cm_err err = {0};
	char *out = NULL;
	if (fake_tree("container", &paths) < 0) {
		CHECK(0);
		return;
	}
	CHECK_OK(fake_write(paths.procfs_root, "4711/comm", "power-profiles-"));
	tuning_config_default(&c);
	tuning_report_init(&r);
	tuning_plan_init(&p);
	CHECK_OK(tuning_detect(&paths, &r, &err));
	CHECK_OK(tuning_plan_make(&r, &c, &p, &err));
	out = render(&r, &p);
	CHECK(out != NULL);
	if (!out)
		return;
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "%s", out);
	HAS(out, "power manager  power-profiles-daemon (process power-profiles- (pid 4711) is "
	         "running)");
	/* four policies merged into one line */
	HAS(out, "governor       policy0-3 (4)          BLOCKED: schedutil -> performance\n");
	HAS(out, "owned by power-profiles-daemon");
	HAS(out, "powerprofilesctl set performance");
	/* container without CAP_SYS_NICE, 8 MiB memlock */
	HAS(out, "nice           process                BLOCKED: 0 -> -5\n");
	HAS(out, "fix: Nice=-5 in edgelmd.service");
	HAS(out, "LimitMEMLOCK=infinity");
	HAS(out, "cpu quota 150000/100000 us = 1.50 cpus -> 1");
	HAS(out, "workers        1 on cpus 0 (pinned)");
	HAS(out, "service        scheduler + IPC threads on cpus 1-3");
	HAS(out, "Summary: ");
	HAS(out, " blocked\n");
	free(out);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_check_xeon(void)
{
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
	char *out = NULL;
	tuning_config_default(&c);
	c.model_bytes = 8ull << 30;
	if (check_box("xeon2s", &c, &paths, &r, &p, &out) < 0) {
		CHECK(0);
		return;
	}
	HAS(out, "Intel(R) Xeon(R) Gold 6430");
	HAS(out, "amx-tile amx-int8 amx-bf16");
	HAS(out,
	    "128 logical cpus online (0-127), 64 physical cores, 2 packages, SMT 2 threads/core");
	HAS(out, "L3 60 MiB (shared by 64)");
	HAS(out, "numa           2 nodes");
	HAS(out, "epp            policy0-63,96-127 (96) balance_performance -> performance\n");
	HAS(out, "governor       policy0-63,96-127 (96) powersave -> performance\n");
	HAS(out, "workers + memory on node 0");
	HAS(out, "amx            process                not permitted -> permitted");
	free(out);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_check_biglittle(void)
{
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
	char *out = NULL;
	tuning_config_default(&c);
	if (check_box("biglittle", &c, &paths, &r, &p, &out) < 0) {
		CHECK(0);
		return;
	}
	HAS(out, "Cortex-A55 + Cortex-A76");
	HAS(out, "big cpus 4-7 (capacity 1024), LITTLE cpus 0-3 (capacity 446)");
	HAS(out, "workers        4 on cpus 4-7 (pinned)");
	HAS(out, "policy0,4 (2)          schedutil -> performance");
	HAS(out, "epp            cpufreq                n/a: no energy_performance_preference "
	         "(driver cpufreq-dt)");
	free(out);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

static void test_json_and_print(void)
{
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
	struct tuning_state st;
	struct cm_err err = {0};
	config_cpufreq_only(&c);
	tuning_plan_init(&p);
	if (fake_detect("container", &paths, &r) < 0 || tuning_plan_make(&r, &c, &p, &err) < 0) {
		CHECK(0);
		return;
	}
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&p, &paths, &st, &err));
	char *json = NULL;
	CHECK_OK(tuning_state_json(&st, &p, &json, &err));
	CHECK(json != NULL);
	if (json) {
		HAS(json,
		    "\"workers\":1,\"pinned\":false,\"worker_cpus\":[0],\"service_cpus\":\"0-3\"");
		HAS(json, "{\"knob\":\"governor\",\"target\":\"policy0\",\"before\":\"schedutil\","
		          "\"after\":\"performance\",\"status\":\"applied\"}");
		HAS(json, "\"failed\":0");
		CHECK(json[strlen(json) - 1] == '}');
		cm_free(json);
	}
	CHECK_OK(tuning_restore(&st, &paths, &err));
	CHECK_OK(tuning_state_json(&st, NULL, &json, &err));
	if (json) {
		HAS(json, "\"status\":\"restored\"");
		CHECK(strstr(json, "workers") == NULL);
		cm_free(json);
	}
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	tuning_state_print(f, &st);
	fclose(f);
	HAS(buf, "governor");
	HAS(buf, "policy3");
	HAS(buf, "schedutil -> performance; restored schedutil");
	free(buf);
	/* escaping */
	struct tuning_state s2;
	tuning_state_init(&s2);
	CHECK_OK(tuning_apply(&p, &paths, &s2, &err));
	snprintf(s2.changes[0].after, sizeof(s2.changes[0].after), "a\"b\\c\n");
	CHECK_OK(tuning_state_json(&s2, NULL, &json, &err));
	if (json) {
		HAS(json, "\"after\":\"a\\\"b\\\\c\\u000a\"");
		cm_free(json);
	}
	snprintf(s2.changes[0].after, sizeof(s2.changes[0].after), "performance");
	CHECK_OK(tuning_restore(&s2, &paths, &err));
	tuning_state_fini(&s2);
	tuning_state_fini(&st);
	tuning_plan_fini(&p);
	tuning_report_fini(&r);
}

int main(void)
{
	TEST_RUN(test_check_vm);
	TEST_RUN(test_check_blocked);
	TEST_RUN(test_check_xeon);
	TEST_RUN(test_check_biglittle);
	TEST_RUN(test_json_and_print);
	fake_cleanup();
	return test_finish();
}
