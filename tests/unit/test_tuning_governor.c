/* tests/unit/test_tuning_governor.c: the governor and EPP knobs on fake
 * trees: set and restored after a normal exit, after SIGTERM, and after
 * kill -9 followed by --restore-tuning (tuning_restore_from_file); another
 * power manager leaves them untouched; the state file's safety rules. */
#include "tests/unit/test_tuning_fake.h"

#include <signal.h>
#include <sys/wait.h>

#define GOV(n) "devices/system/cpu/cpufreq/policy" #n "/scaling_governor"
#define EPP(n) "devices/system/cpu/cpufreq/policy" #n "/energy_performance_preference"

struct fixture {
	struct tuning_paths paths;
	struct tuning_report r;
	struct tuning_plan p;
	struct tuning_config c;
};

static int setup(struct fixture *f, const char *box)
{
	struct cm_err err = {0};
	tuning_plan_init(&f->p);
	config_cpufreq_only(&f->c);
	if (fake_detect(box, &f->paths, &f->r) < 0)
		return -1;
	int ret = tuning_plan_make(&f->r, &f->c, &f->p, &err);
	if (ret < 0)
		fprintf(stderr, "plan: %s\n", err.msg);
	return ret;
}

static void teardown(struct fixture *f)
{
	tuning_plan_fini(&f->p);
	tuning_report_fini(&f->r);
}

static int count_lines(const char *path, const char *prefix)
{
	FILE *fp = fopen(path, "r");
	if (!fp)
		return -1;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof(line), fp))
		n += strncmp(line, prefix, strlen(prefix)) == 0;
	fclose(fp);
	return n;
}

/* The container uses cpus 0-3 (cpuset): policies 0-3 change, 4-15 not. */
static void test_normal_exit(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	CHECK_EQ_INT(st.n_failed, 0);
	CHECK_STREQ(fake_read(sys, GOV(0)), "performance");
	CHECK_STREQ(fake_read(sys, GOV(3)), "performance");
	CHECK_STREQ(fake_read(sys, GOV(4)), "schedutil");
	CHECK_STREQ(fake_read(sys, GOV(15)), "schedutil");
	CHECK_EQ_INT(count_lines(f.paths.state_file, "change governor"), 4);
	CHECK_EQ_INT(
	    count_lines(f.paths.state_file, "boot_id 0b0e1d1a-0000-4000-8000-000000000003"), 1);

	CHECK_OK(tuning_restore(&st, &f.paths, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	CHECK_STREQ(fake_read(sys, GOV(3)), "schedutil");
	CHECK(!test_file_exists(f.paths.state_file));
	/* idempotent */
	CHECK_OK(tuning_restore(&st, &f.paths, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	tuning_state_fini(&st);
	teardown(&f);
}

/* intel_pstate: EPP is written before the governor and restored after it. */
static void test_epp_order(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "xeon2s") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	CHECK_EQ_INT(st.n_failed, 0);
	CHECK_STREQ(fake_read(sys, GOV(127)), "performance");
	CHECK_STREQ(fake_read(sys, EPP(127)), "performance");
	/* the file lists all EPP changes before the governors */
	FILE *fp = fopen(f.paths.state_file, "r");
	CHECK(fp != NULL);
	char line[512];
	int epp = 0, gov = 0, order_ok = 1;
	while (fp && fgets(line, sizeof(line), fp)) {
		if (!strncmp(line, "change epp ", 11)) {
			epp++;
			order_ok &= gov == 0;
		} else if (!strncmp(line, "change governor ", 16)) {
			gov++;
		}
	}
	if (fp)
		fclose(fp);
	CHECK_EQ_INT(epp, 128);
	CHECK_EQ_INT(gov, 128);
	CHECK(order_ok);
	int first_gov = -1, last_epp = -1;
	for (int i = 0; i < st.n_changes; i++) {
		if (st.changes[i].kind == TUNING_KNOB_GOVERNOR && first_gov < 0)
			first_gov = i;
		if (st.changes[i].kind == TUNING_KNOB_EPP)
			last_epp = i;
	}
	CHECK(last_epp < first_gov);
	CHECK_OK(tuning_restore(&st, &f.paths, &err));
	CHECK_STREQ(fake_read(sys, GOV(64)), "powersave");
	CHECK_STREQ(fake_read(sys, EPP(64)), "balance_performance");
	tuning_state_fini(&st);
	teardown(&f);
}

enum child_end { END_SIGTERM, END_KILL9 };

/* Fork a "daemon" that applies the plan on the fake tree, tells us, and
 * then waits: on SIGTERM it restores and exits 0 (what edgelmd does); kill
 * -9 gives it no chance. */
static pid_t spawn_daemon(struct fixture *f)
{
	int fds[2];
	if (pipe(fds) != 0)
		return -1;
	sigset_t set, old;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, &old); /* blocked before fork: no race */
	pid_t pid = fork();
	if (pid == 0) {
		close(fds[0]);
		struct tuning_state st;
		tuning_state_init(&st);
		if (tuning_apply(&f->p, &f->paths, &st, NULL) != 0 || st.n_failed)
			_exit(3);
		if (write(fds[1], "r", 1) != 1)
			_exit(4);
		int sig = 0;
		sigwait(&set, &sig);
		_exit(tuning_restore(&st, &f->paths, NULL) == 0 ? 0 : 5);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	close(fds[1]);
	char c = 0;
	if (pid < 0 || read(fds[0], &c, 1) != 1 || c != 'r') {
		close(fds[0]);
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
		return -1;
	}
	close(fds[0]);
	return pid;
}

static void test_sigterm(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	pid_t pid = spawn_daemon(&f);
	CHECK(pid > 0);
	if (pid > 0) {
		CHECK_STREQ(fake_read(sys, GOV(2)), "performance");
		CHECK(test_file_exists(f.paths.state_file));
		kill(pid, SIGTERM);
		int status = 0;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
	}
	CHECK_STREQ(fake_read(sys, GOV(2)), "schedutil");
	CHECK(!test_file_exists(f.paths.state_file));
	/* ExecStopPost's --restore-tuning then finds nothing to do */
	struct tuning_state st;
	CHECK_OK(tuning_restore_from_file(&f.paths, &st, &err));
	CHECK_EQ_INT(st.n_changes, 0);
	tuning_state_fini(&st);
	teardown(&f);
}

static void test_kill9_restore(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	pid_t pid = spawn_daemon(&f);
	CHECK(pid > 0);
	if (pid > 0) {
		kill(pid, SIGKILL);
		int status = 0;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	}
	/* the daemon is gone, its governor stays */
	CHECK_STREQ(fake_read(sys, GOV(1)), "performance");
	CHECK(test_file_exists(f.paths.state_file));
	/* edgelmd --restore-tuning */
	struct tuning_state st;
	CHECK_OK(tuning_restore_from_file(&f.paths, &st, &err));
	CHECK_EQ_INT(st.n_changes, 4);
	for (int i = 0; i < 4; i++)
		CHECK(st.changes[i].restored && st.changes[i].restore_result == 0);
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	CHECK_STREQ(fake_read(sys, GOV(1)), "schedutil");
	CHECK_STREQ(fake_read(sys, GOV(3)), "schedutil");
	CHECK(!test_file_exists(f.paths.state_file));
	char *buf = NULL;
	size_t len = 0;
	FILE *mf = open_memstream(&buf, &len);
	tuning_state_print(mf, &st);
	fclose(mf);
	CHECK(buf && strstr(buf, "restored schedutil") != NULL);
	free(buf);
	tuning_state_fini(&st);
	teardown(&f);
}

/* A daemon restarted after kill -9 without --restore-tuning must not take
 * the previous run's "performance" for the original value. */
static void test_kill9_then_restart(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	pid_t pid = spawn_daemon(&f);
	CHECK(pid > 0);
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	struct tuning_state st;
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	CHECK_EQ_INT(st.n_failed, 0);
	CHECK_STREQ(fake_read(sys, GOV(0)), "performance");
	CHECK_OK(tuning_restore(&st, &f.paths, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	tuning_state_fini(&st);
	teardown(&f);
}

static void check_untouched_by_owner(const char *owner_word, struct fixture *f)
{
	struct cm_err err = {0};
	struct tuning_state st;
	const char *sys = f->paths.sysfs_root;
	CHECK(f->r.power_owner.found);
	int n_blocked = 0;
	for (int i = 0; i < f->p.n_knobs; i++)
		if (f->p.knobs[i].kind == TUNING_KNOB_GOVERNOR) {
			CHECK_EQ_INT(f->p.knobs[i].status, TUNING_KNOB_BLOCKED);
			CHECK(strstr(f->p.knobs[i].reason, owner_word) != NULL);
			n_blocked++;
		}
	CHECK_EQ_INT(n_blocked, 4);
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f->p, &f->paths, &st, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	CHECK(!test_file_exists(f->paths.state_file));
	/* one recorded failure names the owner, not one per policy */
	CHECK_EQ_INT(st.n_failed, 1);
	CHECK(st.n_changes == 1 && strstr(st.changes[0].reason, owner_word) != NULL);
	CHECK(st.n_changes == 1 && strstr(st.changes[0].target, "4 cpufreq policies") != NULL);
	CHECK_OK(tuning_restore(&st, &f->paths, &err));
	tuning_state_fini(&st);
}

static void test_power_manager_process(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (fake_tree("container", &f.paths) < 0) {
		CHECK(0);
		return;
	}
	CHECK_OK(fake_write(f.paths.procfs_root, "812/comm", "tuned"));
	tuning_report_init(&f.r);
	tuning_plan_init(&f.p);
	config_cpufreq_only(&f.c);
	CHECK_OK(tuning_detect(&f.paths, &f.r, &err));
	CHECK_STREQ(f.r.power_owner.name, "tuned");
	CHECK(strstr(f.r.power_owner.how, "812") != NULL);
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	check_untouched_by_owner("tuned", &f);
	CHECK(strstr(f.p.knobs[0].reason, "") != NULL);
	const struct tuning_knob *k = tuning_plan_knob(&f.p, TUNING_KNOB_GOVERNOR);
	CHECK(k && strstr(k->reason, "tuned-adm profile") != NULL);
	teardown(&f);
}

static void test_power_manager_unit(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (fake_tree("container", &f.paths) < 0) {
		CHECK(0);
		return;
	}
	/* tlp is a oneshot unit: no process, but its unit stays active */
	char path[700];
	snprintf(path, sizeof(path), "%s/systemd/units/invocation:tlp.service", f.paths.run_root);
	CHECK_OK(fake_write(f.paths.run_root, "systemd/units/placeholder", "x"));
	CHECK_OK(symlink("0123456789abcdef0123456789abcdef", path));
	tuning_report_init(&f.r);
	CHECK_OK(tuning_detect(&f.paths, &f.r, &err));
	CHECK(!f.r.power_owner.found); /* systemd is not PID 1 in this tree */
	tuning_report_fini(&f.r);
	CHECK_OK(fake_write(f.paths.run_root, "systemd/system/placeholder", "x"));
	tuning_report_init(&f.r);
	tuning_plan_init(&f.p);
	config_cpufreq_only(&f.c);
	CHECK_OK(tuning_detect(&f.paths, &f.r, &err));
	CHECK_STREQ(f.r.power_owner.name, "tlp");
	CHECK(strstr(f.r.power_owner.how, "tlp.service") != NULL);
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	check_untouched_by_owner("tlp", &f);
	teardown(&f);
}

/* Someone else changes a governor while we run: theirs wins on restore. */
static void test_changed_meanwhile(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	CHECK_OK(fake_write(sys, GOV(1), "ondemand"));
	CHECK_OK(tuning_restore(&st, &f.paths, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "schedutil");
	CHECK_STREQ(fake_read(sys, GOV(1)), "ondemand");
	int left = 0;
	for (int i = 0; i < st.n_changes; i++)
		if (st.changes[i].restore_result == 1) {
			left++;
			CHECK(strstr(st.changes[i].restore_note, "someone else") != NULL);
		}
	CHECK_EQ_INT(left, 1);
	tuning_state_fini(&st);
	teardown(&f);
}

static void test_governor_choice(void)
{
	struct fixture f;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	/* first available of a list, like tuned's governor=a|b */
	snprintf(f.c.governor, sizeof(f.c.governor), "turbo|ondemand");
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	const struct tuning_knob *k = tuning_plan_knob(&f.p, TUNING_KNOB_GOVERNOR);
	CHECK(k && k->status == TUNING_KNOB_APPLY && !strcmp(k->wanted, "ondemand"));
	snprintf(f.c.governor, sizeof(f.c.governor), "turbo");
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	k = tuning_plan_knob(&f.p, TUNING_KNOB_GOVERNOR);
	CHECK(k && k->status == TUNING_KNOB_BLOCKED && strstr(k->reason, "not offered") != NULL);
	snprintf(f.c.governor, sizeof(f.c.governor), "schedutil");
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	k = tuning_plan_knob(&f.p, TUNING_KNOB_GOVERNOR);
	CHECK(k && k->status == TUNING_KNOB_ALREADY);
	snprintf(f.c.governor, sizeof(f.c.governor), "keep");
	CHECK_OK(tuning_plan_make(&f.r, &f.c, &f.p, &err));
	k = tuning_plan_knob(&f.p, TUNING_KNOB_GOVERNOR);
	CHECK(k && k->status == TUNING_KNOB_OFF);
	teardown(&f);
}

/* No state file, no sysfs write. */
static void test_state_unwritable(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	snprintf(f.paths.state_file, sizeof(f.paths.state_file), "%.400s/meminfo/x/state",
	         f.paths.procfs_root);
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	CHECK_EQ_INT(st.n_failed, 4);
	CHECK(strstr(st.changes[0].reason, "state file") != NULL);
	CHECK_STREQ(fake_read(f.paths.sysfs_root, GOV(0)), "schedutil");
	tuning_state_fini(&st);
	teardown(&f);
}

/* A failed restore keeps the state file for a later --restore-tuning. */
static void test_restore_failure_keeps_file(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	tuning_state_init(&st);
	CHECK_OK(tuning_apply(&f.p, &f.paths, &st, &err));
	char path[700];
	snprintf(path, sizeof(path), "%s/%s", f.paths.sysfs_root, GOV(2));
	CHECK_OK(unlink(path)); /* policy2 vanished (cpu offlined) */
	CHECK_EQ_INT(tuning_restore(&st, &f.paths, &err), -EIO);
	CHECK(strstr(err.msg, "policy2") != NULL);
	CHECK(test_file_exists(f.paths.state_file));
	CHECK_EQ_INT(count_lines(f.paths.state_file, "change governor"), 1);
	CHECK_STREQ(fake_read(f.paths.sysfs_root, GOV(3)), "schedutil");
	tuning_state_fini(&st);
	teardown(&f);
}

static void test_state_file_rules(void)
{
	struct fixture f;
	struct tuning_state st;
	struct cm_err err = {0};
	if (setup(&f, "container") < 0) {
		CHECK(0);
		return;
	}
	const char *sys = f.paths.sysfs_root;
	char body[1024];
	/* a file that names something other than a cpufreq attribute */
	snprintf(body, sizeof(body),
	         "edgelm-tuning-state 1\nboot_id -\npid 1\n"
	         "change governor devices/system/cpu/cpufreq/policy0/../../../../kernel/x a b\n");
	CHECK_OK(fake_write(f.paths.run_root, "edgelm/tuning.state", body));
	CHECK_EQ_INT(tuning_restore_from_file(&f.paths, &st, &err), -EBADMSG);
	CHECK(strstr(err.msg, "refusing") != NULL);
	tuning_state_fini(&st);
	/* a value that is not a plain word */
	snprintf(body, sizeof(body),
	         "edgelm-tuning-state 1\nboot_id -\npid 1\n"
	         "change governor " GOV(0) " $(reboot) performance\n");
	CHECK_OK(fake_write(f.paths.run_root, "edgelm/tuning.state", body));
	CHECK_EQ_INT(tuning_restore_from_file(&f.paths, &st, &err), -EBADMSG);
	tuning_state_fini(&st);
	/* a file from an earlier boot: removed, nothing written */
	CHECK_OK(fake_write(sys, GOV(0), "performance"));
	snprintf(body, sizeof(body),
	         "edgelm-tuning-state 1\nboot_id 99999999-0000-4000-8000-000000000000\npid 1\n"
	         "change governor " GOV(0) " powersave performance\n");
	CHECK_OK(fake_write(f.paths.run_root, "edgelm/tuning.state", body));
	CHECK_OK(tuning_restore_from_file(&f.paths, &st, &err));
	CHECK_STREQ(fake_read(sys, GOV(0)), "performance");
	CHECK(!test_file_exists(f.paths.state_file));
	tuning_state_fini(&st);
	/* the writer still runs (our parent, alive): refuse */
	snprintf(body, sizeof(body),
	         "edgelm-tuning-state 1\nboot_id -\npid %ld\n"
	         "change governor " GOV(0) " powersave performance\n",
	         (long)getppid());
	CHECK_OK(fake_write(f.paths.run_root, "edgelm/tuning.state", body));
	CHECK_EQ_INT(tuning_restore_from_file(&f.paths, &st, &err), -EBUSY);
	CHECK_STREQ(fake_read(sys, GOV(0)), "performance");
	tuning_state_fini(&st);
	/* missing version line */
	CHECK_OK(fake_write(f.paths.run_root, "edgelm/tuning.state", "boot_id -\n"));
	CHECK_EQ_INT(tuning_restore_from_file(&f.paths, &st, &err), -EBADMSG);
	tuning_state_fini(&st);
	teardown(&f);
}

int main(void)
{
	TEST_RUN(test_normal_exit);
	TEST_RUN(test_epp_order);
	TEST_RUN(test_sigterm);
	TEST_RUN(test_kill9_restore);
	TEST_RUN(test_kill9_then_restart);
	TEST_RUN(test_power_manager_process);
	TEST_RUN(test_power_manager_unit);
	TEST_RUN(test_changed_meanwhile);
	TEST_RUN(test_governor_choice);
	TEST_RUN(test_state_unwritable);
	TEST_RUN(test_restore_failure_keeps_file);
	TEST_RUN(test_state_file_rules);
	fake_cleanup();
	return test_finish();
}
