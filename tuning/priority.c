/* tuning/priority.c: nice, SCHED_BATCH, I/O priority, oom_score_adj and
 * thread affinity helpers.
 *
 * On Linux nice, scheduling policy, I/O priority and affinity are per
 * thread, and a new thread inherits them from the thread that creates it.
 * The daemon therefore sets them on its main thread before any other thread
 * exists (tuning_apply), and brackets the engine's pool creation with
 * tuning_thread_sched_batch(true/false) so only the workers run SCHED_BATCH. */
#include "tuning/tuning_impl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define IOPRIO_WHO_PROCESS_ 1
#define IOPRIO_SHIFT_ 13

int tuning_ioprio_get(int *ret_class, int *ret_level)
{
	long v = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS_, 0);
	if (v < 0)
		return -errno;
	*ret_class = (int)(v >> IOPRIO_SHIFT_);
	*ret_level = (int)(v & ((1 << IOPRIO_SHIFT_) - 1));
	return 0;
}

int tuning_ioprio_set(int cls, int level)
{
	if (syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS_, 0, (cls << IOPRIO_SHIFT_) | level) < 0)
		return -errno;
	return 0;
}

/* Field 19 of <procfs>/self/stat is the nice value; the comm field (2) may
 * hold spaces and parentheses, so count from the last ')'. */
static int stat_nice(const struct tuning_paths *paths, int *ret)
{
	char buf[1024];
	if (tuning_fs_readf(buf, sizeof(buf), paths->procfs_root, "self/stat") < 0)
		return -ENOENT;
	char *p = strrchr(buf, ')');
	if (!p)
		return -EINVAL;
	p++;
	/* fields 3.. follow; nice is the 17th after ')' */
	for (int field = 3; field < 19; field++) {
		p = strchr(p + 1, ' ');
		if (!p)
			return -EINVAL;
	}
	*ret = atoi(p + 1);
	return 0;
}

void tuning_priority_detect(const struct tuning_paths *paths, struct tuning_report *r)
{
	if (stat_nice(paths, &r->nice) < 0) {
		errno = 0;
		int n = getpriority(PRIO_PROCESS, 0);
		r->nice = tuning_paths_is_live(paths) && !errno ? n : 0;
	}
	long long v;
	if (tuning_fs_read_ll(&v, paths->procfs_root, "self/oom_score_adj") == 0)
		r->oom_score_adj = (int)v;
	else
		r->oom_score_adj = TUNING_KEEP;
	r->ioprio_class = TUNING_IOPRIO_CLASS_NONE;
	r->ioprio_level = 0;
	if (tuning_paths_is_live(paths))
		(void)tuning_ioprio_get(&r->ioprio_class, &r->ioprio_level);
}

int tuning_thread_sched_batch(bool on, struct cm_err *err)
{
	struct sched_param sp = {.sched_priority = 0};
	if (sched_setscheduler(0, on ? SCHED_BATCH : SCHED_OTHER, &sp) != 0) {
		int e = errno;
		return cm_err_set(err, -e, "sched: SCHED_%s: %s", on ? "BATCH" : "OTHER",
		                  strerror(e));
	}
	return 0;
}

int tuning_thread_affinity(const struct tuning_cpuset *set, struct cm_err *err)
{
	cpu_set_t cs;
	CPU_ZERO(&cs);
	int n = 0;
	for (int c = tuning_cpuset_next(set, 0); c >= 0 && c < CPU_SETSIZE;
	     c = tuning_cpuset_next(set, c + 1)) {
		CPU_SET(c, &cs);
		n++;
	}
	if (!n)
		return cm_err_set(err, -EINVAL, "affinity: empty cpu set");
	if (sched_setaffinity(0, sizeof(cs), &cs) != 0) {
		int e = errno;
		char list[128];
		(void)tuning_cpuset_format(set, list, sizeof(list));
		return cm_err_set(err, -e, "affinity: cpus %s: %s", list, strerror(e));
	}
	return 0;
}

int tuning_thread_pin(int cpu, struct cm_err *err)
{
	struct tuning_cpuset s;
	tuning_cpuset_zero(&s);
	if (cpu < 0 || cpu >= TUNING_MAX_CPUS)
		return cm_err_set(err, -EINVAL, "affinity: cpu %d out of range", cpu);
	tuning_cpuset_add(&s, cpu);
	return tuning_thread_affinity(&s, err);
}

static void ioprio_name(char *buf, size_t len, int cls, int level)
{
	switch (cls) {
	case TUNING_IOPRIO_CLASS_RT:
		snprintf(buf, len, "rt/%d", level);
		break;
	case TUNING_IOPRIO_CLASS_BE:
		snprintf(buf, len, "be/%d", level);
		break;
	case TUNING_IOPRIO_CLASS_IDLE:
		snprintf(buf, len, "idle");
		break;
	default:
		snprintf(buf, len, "none (from nice)");
		break;
	}
}

int tuning_load_begin(const struct tuning_plan *plan, struct tuning_state *st, struct cm_err *err)
{
	const struct tuning_config *c = &plan->cfg;
	if (c->load_ioprio == TUNING_IOPRIO_KEEP || st->load_active)
		return 0;
	int cls = 0, level = 0, ret;
	if ((ret = tuning_ioprio_get(&cls, &level)) < 0)
		return cm_err_set(err, ret, "ioprio: ioprio_get: %s", strerror(-ret));
	int ncls = c->load_ioprio == TUNING_IOPRIO_IDLE ? TUNING_IOPRIO_CLASS_IDLE
	                                                : TUNING_IOPRIO_CLASS_BE;
	int nlevel = ncls == TUNING_IOPRIO_CLASS_BE ? c->load_ioprio_level : 0;
	char before[32], after[32];
	ioprio_name(before, sizeof(before), cls, level);
	ioprio_name(after, sizeof(after), ncls, nlevel);
	struct tuning_change *ch =
	    tuning_state_add(st, TUNING_KNOB_IOPRIO, "model loading", before, after, false);
	if (!ch)
		return cm_err_set(err, -ENOMEM, "ioprio: out of memory");
	if ((ret = tuning_ioprio_set(ncls, nlevel)) < 0) {
		tuning_change_fail(st, ch, ret, "ioprio_set %s: %s", after, strerror(-ret));
		return cm_err_set(err, ret, "ioprio: %s", ch->reason);
	}
	ch->result = 0;
	st->load_active = true;
	st->load_saved_ioprio = (cls << IOPRIO_SHIFT_) | level;
	return 0;
}

int tuning_load_end(struct tuning_state *st, struct cm_err *err)
{
	if (!st->load_active)
		return 0;
	st->load_active = false;
	int v = st->load_saved_ioprio;
	int ret = tuning_ioprio_set(v >> IOPRIO_SHIFT_, v & ((1 << IOPRIO_SHIFT_) - 1));
	for (int i = st->n_changes - 1; i >= 0; i--) {
		struct tuning_change *c = &st->changes[i];
		if (c->kind == TUNING_KNOB_IOPRIO && c->result == 0 && !c->restored) {
			c->restored = true;
			c->restore_result = ret;
			break;
		}
	}
	if (ret < 0)
		return cm_err_set(err, ret, "ioprio: restoring after load: %s", strerror(-ret));
	return 0;
}
