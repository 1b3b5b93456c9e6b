/* tuning/apply.c: apply a plan and restore what was applied.
 *
 * Each knob: re-read the current value (it may have changed since the plan),
 * record it, apply, record the result. A failure is recorded with its reason
 * and the next knob is tried (chrony's SYS_ functions do the same). The sysfs
 * knobs outlive the process, so they are written to the state file before
 * the first one is touched: after kill -9, `edgelmd --restore-tuning` finds
 * the original values there. */
#include "tuning/tuning_impl.h"

#include <numaif.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

static bool is_persistent(enum tuning_knob_kind k)
{
	return k == TUNING_KNOB_GOVERNOR || k == TUNING_KNOB_EPP;
}

/* Knobs that tuning_apply itself handles; the others (mlock, huge pages,
 * prefault, I/O priority, SCHED_BATCH, pinning of workers) are applied by
 * the daemon or the engine through the helpers, at the right moment. */
static bool applied_here(enum tuning_knob_kind k)
{
	switch (k) {
	case TUNING_KNOB_GOVERNOR:
	case TUNING_KNOB_EPP:
	case TUNING_KNOB_NICE:
	case TUNING_KNOB_OOM_SCORE_ADJ:
	case TUNING_KNOB_AFFINITY:
	case TUNING_KNOB_NUMA:
	case TUNING_KNOB_AMX:
		return true;
	default:
		return false;
	}
}

static bool pid_alive(long pid)
{
	if (pid <= 0 || pid == (long)getpid())
		return false;
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* Blocked knobs go into the state once per kind and reason, so the daemon
 * logs "governor: owned by tuned" once, not once per policy. */
static void record_blocked(struct tuning_state *st, const struct tuning_plan *plan, int i)
{
	const struct tuning_knob *k = &plan->knobs[i];
	for (int j = 0; j < i; j++) {
		const struct tuning_knob *o = &plan->knobs[j];
		if (o->kind == k->kind && o->status == TUNING_KNOB_BLOCKED &&
		    strcmp(o->reason, k->reason) == 0)
			return;
	}
	int n = 0;
	for (int j = i; j < plan->n_knobs; j++)
		n += plan->knobs[j].kind == k->kind &&
		     plan->knobs[j].status == TUNING_KNOB_BLOCKED &&
		     strcmp(plan->knobs[j].reason, k->reason) == 0;
	char target[96];
	if (n > 1)
		snprintf(target, sizeof(target), "%d cpufreq policies", n);
	else
		tuning_strlcpy(target, k->target, sizeof(target));
	struct tuning_change *c =
	    tuning_state_add(st, k->kind, target, k->current, k->wanted, false);
	if (c)
		tuning_change_fail(st, c, -EPERM, "BLOCKED: %s", k->reason);
}

static void apply_sysfs(const struct tuning_plan *plan, const struct tuning_paths *paths,
                        struct tuning_state *st)
{
	int first = st->n_changes;
	/* 1. record every change with the value found now */
	for (int i = 0; i < plan->n_knobs; i++) {
		const struct tuning_knob *k = &plan->knobs[i];
		if (!is_persistent(k->kind) || k->status != TUNING_KNOB_APPLY)
			continue;
		char cur[64];
		int r = tuning_fs_readf(cur, sizeof(cur), paths->sysfs_root, "%s", k->target);
		struct tuning_change *c = tuning_state_add(
		    st, k->kind, k->target, r >= 0 ? cur : k->current, k->wanted, true);
		if (!c)
			return;
		if (r < 0)
			tuning_change_fail(st, c, r, "reading %s: %s", k->target, strerror(-r));
		else if (!tuning_word_is_plain(cur))
			tuning_change_fail(st, c, -EINVAL, "unexpected value '%s' in %s", cur,
			                   k->target);
		else if (strcmp(cur, k->wanted) == 0) {
			/* already so: nothing to write, nothing to restore */
			c->result = 0;
			c->restored = true;
		}
	}
	if (st->n_changes == first)
		return;
	/* 2. the state file first: without it a crash could not be undone */
	struct cm_err e = {0};
	if (tuning_state_save(st, paths->state_file, &e) < 0) {
		for (int i = first; i < st->n_changes; i++)
			if (st->changes[i].result > 0)
				tuning_change_fail(
				    st, &st->changes[i], e.code,
				    "not changed: %s (without the state file a crash "
				    "could not be undone)",
				    e.msg);
		return;
	}
	/* 3. write, in plan order (EPP before governor, see plan.c) */
	for (int i = first; i < st->n_changes; i++) {
		struct tuning_change *c = &st->changes[i];
		if (c->result <= 0)
			continue;
		char path[TUNING_PATH_MAX * 2];
		int r = tuning_fs_path(path, sizeof(path), paths->sysfs_root, "%s", c->target);
		if (r == 0)
			r = tuning_fs_write(path, c->after);
		if (r < 0)
			tuning_change_fail(st, c, r, "writing '%s' to %s: %s", c->after, c->target,
			                   strerror(-r));
		else
			c->result = 0;
	}
	/* 4. drop what failed from the file */
	(void)tuning_state_save(st, paths->state_file, NULL);
}

/* A state file left by a crash in this boot: put its values back before
 * recording new "original" values (else we would save our own settings as
 * the originals). */
static bool handle_old_state(const struct tuning_paths *paths, struct tuning_state *st)
{
	struct tuning_state old;
	struct cm_err e = {0};
	int r = tuning_state_load(paths->state_file, paths, &old, &e);
	if (r == -ENOENT)
		return true;
	if (r == -ESTALE) {
		(void)unlink(paths->state_file);
		return true;
	}
	struct tuning_change *c;
	if (r == -EBADMSG) {
		c = tuning_state_add(st, TUNING_KNOB_GOVERNOR, "cpufreq", "-", "-", false);
		if (c)
			tuning_change_fail(st, c, r,
			                   "cpufreq left alone: %.150s; remove it after checking",
			                   e.msg);
		return false;
	}
	if (r < 0)
		return true; /* unreadable: saving the new one will fail and say why */
	bool ok = true;
	if (pid_alive(old.pid)) {
		c = tuning_state_add(st, TUNING_KNOB_GOVERNOR, "cpufreq", "-", "-", false);
		if (c)
			tuning_change_fail(
			    st, c, -EBUSY,
			    "cpufreq left alone: process %ld (another edgelmd?) holds %s", old.pid,
			    paths->state_file);
		ok = false;
	} else if (tuning_restore(&old, paths, &e) < 0) {
		c = tuning_state_add(st, TUNING_KNOB_GOVERNOR, "cpufreq", "-", "-", false);
		if (c)
			tuning_change_fail(st, c, e.code,
			                   "cpufreq left alone: restoring the previous run's state "
			                   "failed: %s",
			                   e.msg);
		ok = false;
	}
	tuning_state_fini(&old);
	return ok;
}

static void fmt_set(const cpu_set_t *cs, char *buf, size_t len)
{
	struct tuning_cpuset s;
	tuning_cpuset_zero(&s);
	for (int c = 0; c < CPU_SETSIZE && c < TUNING_MAX_CPUS; c++)
		if (CPU_ISSET(c, cs))
			tuning_cpuset_add(&s, c);
	if (tuning_cpuset_format(&s, buf, len) < 0)
		buf[0] = '\0'; /* too long to restore from text: restore skips it */
}

static void apply_process(const struct tuning_plan *plan, const struct tuning_paths *paths,
                          const struct tuning_knob *k, struct tuning_state *st)
{
	char before[64] = "", after[64];
	tuning_strlcpy(after, k->wanted, sizeof(after));
	struct tuning_change *c;
	int r = 0;
	switch (k->kind) {
	case TUNING_KNOB_NICE: {
		errno = 0;
		int cur = getpriority(PRIO_PROCESS, 0);
		snprintf(before, sizeof(before), "%d", errno ? 0 : cur);
		if (!(c = tuning_state_add(st, k->kind, "process", before, after, false)))
			return;
		if (setpriority(PRIO_PROCESS, 0, plan->cfg.nice) != 0) {
			r = -errno;
			tuning_change_fail(st, c, r,
			                   "setpriority(%d): %s; fix: Nice=%d in edgelmd.service",
			                   plan->cfg.nice, strerror(-r), plan->cfg.nice);
			return;
		}
		break;
	}
	case TUNING_KNOB_OOM_SCORE_ADJ: {
		char path[TUNING_PATH_MAX * 2];
		if (tuning_fs_readf(before, sizeof(before), paths->procfs_root,
		                    "self/oom_score_adj") < 0)
			tuning_strlcpy(before, k->current, sizeof(before));
		if (!(c = tuning_state_add(st, k->kind, "process", before, after, false)))
			return;
		r = tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/oom_score_adj");
		if (r == 0)
			r = tuning_fs_write(path, after);
		if (r < 0) {
			tuning_change_fail(st, c, r,
			                   "oom_score_adj %s: %s; fix: OOMScoreAdjust=%s in "
			                   "edgelmd.service",
			                   after, strerror(-r), after);
			return;
		}
		break;
	}
	case TUNING_KNOB_AFFINITY: {
		cpu_set_t cs;
		if (sched_getaffinity(0, sizeof(cs), &cs) == 0)
			fmt_set(&cs, before, sizeof(before));
		char list[64];
		if (tuning_cpuset_format(&plan->service, list, sizeof(list)) < 0)
			tuning_strlcpy(list, "(long list)", sizeof(list));
		if (!(c = tuning_state_add(st, k->kind, "main thread", before, list, false)))
			return;
		struct cm_err e = {0};
		if ((r = tuning_thread_affinity(&plan->service, &e)) < 0) {
			tuning_change_fail(st, c, r, "%s", e.msg);
			return;
		}
		break;
	}
	case TUNING_KNOB_NUMA: {
		unsigned long mask[TUNING_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
		int mode;
		if (plan->numa == TUNING_NUMA_NODE && plan->numa_node >= 0) {
			mask[plan->numa_node / (8 * sizeof(unsigned long))] |=
			    1ul << (plan->numa_node % (8 * sizeof(unsigned long)));
			/* preferred, not bind: if the node fills up later (KV
			 * growth), pages spill over instead of an OOM kill */
			mode = MPOL_PREFERRED;
		} else if (plan->numa == TUNING_NUMA_INTERLEAVE && plan->numa_nodes) {
			for (int n = 0; n < 64 && n < TUNING_MAX_NODES; n++)
				if ((plan->numa_nodes >> n) & 1)
					mask[n / (8 * sizeof(unsigned long))] |=
					    1ul << (n % (8 * sizeof(unsigned long)));
			mode = MPOL_INTERLEAVE;
		} else {
			return;
		}
		if (!(c = tuning_state_add(st, k->kind, "process", "default", after, false)))
			return;
		if (set_mempolicy(mode, mask, TUNING_MAX_NODES + 1) != 0) {
			r = -errno;
			tuning_change_fail(st, c, r, "set_mempolicy: %s", strerror(-r));
			return;
		}
		break;
	}
	case TUNING_KNOB_AMX: {
		if (!(c = tuning_state_add(st, k->kind, "process", "not permitted", "permitted",
		                           false)))
			return;
		struct tuning_cpu cpu;
		struct cm_err e = {0};
		(void)tuning_cpu_detect(&cpu, NULL);
		if ((r = tuning_cpu_amx_request(&cpu, &e)) < 0) {
			tuning_change_fail(st, c, r, "%s", e.msg);
			return;
		}
		break;
	}
	default:
		return;
	}
	c->result = 0;
}

int tuning_apply(const struct tuning_plan *plan, const struct tuning_paths *paths,
                 struct tuning_state *state, struct cm_err *err)
{
	state->pid = (long)getpid();
	tuning_boot_id(paths, state->boot_id, sizeof(state->boot_id));

	bool any_sysfs = false;
	for (int i = 0; i < plan->n_knobs; i++)
		any_sysfs |= is_persistent(plan->knobs[i].kind) &&
		             plan->knobs[i].status == TUNING_KNOB_APPLY;
	if (any_sysfs && handle_old_state(paths, state))
		apply_sysfs(plan, paths, state);

	for (int i = 0; i < plan->n_knobs; i++) {
		const struct tuning_knob *k = &plan->knobs[i];
		if (!applied_here(k->kind))
			continue;
		if (k->status == TUNING_KNOB_BLOCKED)
			record_blocked(state, plan, i);
		else if (k->status == TUNING_KNOB_APPLY && !is_persistent(k->kind))
			apply_process(plan, paths, k, state);
	}
	cm_err_clear(err);
	return 0;
}

/* ---- restore ------------------------------------------------------------ */

static void restore_one(struct tuning_change *c, const struct tuning_paths *paths)
{
	int r = 0;
	c->restore_note[0] = '\0';
	switch (c->kind) {
	case TUNING_KNOB_GOVERNOR:
	case TUNING_KNOB_EPP: {
		char path[TUNING_PATH_MAX * 2], cur[64];
		if (!tuning_state_target_ok(c->target) || !tuning_word_is_plain(c->before)) {
			r = -EINVAL;
			snprintf(c->restore_note, sizeof(c->restore_note), "refusing target %.60s",
			         c->target);
			break;
		}
		r = tuning_fs_path(path, sizeof(path), paths->sysfs_root, "%s", c->target);
		if (r == 0)
			r = tuning_fs_read(path, cur, sizeof(cur));
		if (r < 0) {
			snprintf(c->restore_note, sizeof(c->restore_note), "reading: %s",
			         strerror(-r));
			break;
		}
		r = 0;
		if (strcmp(cur, c->before) == 0)
			break; /* already the original */
		if (strcmp(cur, c->after) != 0) {
			/* someone changed it after us: theirs wins */
			r = 1;
			snprintf(c->restore_note, sizeof(c->restore_note),
			         "now '%.40s', changed by someone else since", cur);
			break;
		}
		r = tuning_fs_write(path, c->before);
		if (r < 0)
			snprintf(c->restore_note, sizeof(c->restore_note), "writing '%.40s': %s",
			         c->before, strerror(-r));
		break;
	}
	case TUNING_KNOB_NICE:
		if (setpriority(PRIO_PROCESS, 0, atoi(c->before)) != 0) {
			r = -errno;
			snprintf(c->restore_note, sizeof(c->restore_note), "setpriority: %s",
			         strerror(-r));
		}
		break;
	case TUNING_KNOB_OOM_SCORE_ADJ: {
		char path[TUNING_PATH_MAX * 2];
		r = tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/oom_score_adj");
		if (r == 0)
			r = tuning_fs_write(path, c->before);
		if (r < 0)
			snprintf(c->restore_note, sizeof(c->restore_note), "%s", strerror(-r));
		break;
	}
	case TUNING_KNOB_AFFINITY: {
		struct tuning_cpuset s;
		struct cm_err e = {0};
		if (!c->before[0] || tuning_cpuset_parse(c->before, &s, NULL) < 0) {
			r = 1;
			snprintf(c->restore_note, sizeof(c->restore_note), "previous mask unknown");
			break;
		}
		if ((r = tuning_thread_affinity(&s, &e)) < 0)
			snprintf(c->restore_note, sizeof(c->restore_note), "%.150s", e.msg);
		break;
	}
	case TUNING_KNOB_NUMA:
		if (set_mempolicy(MPOL_DEFAULT, NULL, 0) != 0) {
			r = -errno;
			snprintf(c->restore_note, sizeof(c->restore_note), "set_mempolicy: %s",
			         strerror(-r));
		}
		break;
	case TUNING_KNOB_MLOCK:
		if (munlockall() != 0) {
			r = -errno;
			snprintf(c->restore_note, sizeof(c->restore_note), "munlockall: %s",
			         strerror(-r));
		}
		break;
	case TUNING_KNOB_IOPRIO:
		/* restored by tuning_load_end; here only if loading never ended */
		break;
	case TUNING_KNOB_AMX:
		r = 1;
		snprintf(c->restore_note, sizeof(c->restore_note),
		         "the kernel keeps the permission until exit");
		break;
	default:
		break;
	}
	c->restored = true;
	c->restore_result = r;
}

int tuning_restore(struct tuning_state *state, const struct tuning_paths *paths, struct cm_err *err)
{
	int failed = 0, first_fail = -1;
	bool persistent = false;
	if (state->load_active)
		(void)tuning_load_end(state, NULL);
	for (int i = state->n_changes - 1; i >= 0; i--) {
		struct tuning_change *c = &state->changes[i];
		if (c->result < 0 || (c->restored && c->restore_result >= 0))
			continue; /* failed to apply, or already restored (a failed restore is
			             retried) */
		restore_one(c, paths);
		if (c->restore_result < 0) {
			failed++;
			if (first_fail < 0)
				first_fail = i;
		}
		if (c->kind == TUNING_KNOB_MLOCK)
			state->mlocked = false;
	}
	for (int i = 0; i < state->n_changes; i++)
		persistent |= state->changes[i].persistent;
	if (failed) {
		const struct tuning_change *c = &state->changes[first_fail];
		/* keep (rewrite) the state file so --restore-tuning can retry */
		if (persistent)
			(void)tuning_state_save(state, paths->state_file, NULL);
		return cm_err_set(err, -EIO, "tuning: %d change%s not restored; first: %s %s: %s",
		                  failed, failed == 1 ? "" : "s", tuning_knob_name(c->kind),
		                  c->target, c->restore_note);
	}
	/* the file is ours only if this state wrote (or was read from) it */
	if (persistent && unlink(paths->state_file) < 0 && errno != ENOENT) {
		int e = errno;
		return cm_err_set(err, -e, "tuning: removing %s: %s", paths->state_file,
		                  strerror(e));
	}
	cm_err_clear(err);
	return 0;
}

int tuning_restore_from_file(const struct tuning_paths *paths, struct tuning_state *ret_state,
                             struct cm_err *err)
{
	struct tuning_state s;
	int r = tuning_state_load(paths->state_file, paths, &s, err);
	if (ret_state)
		tuning_state_init(ret_state);
	if (r == -ENOENT) {
		cm_err_clear(err);
		return 0;
	}
	if (r == -ESTALE) {
		(void)unlink(paths->state_file);
		cm_err_clear(err);
		return 0;
	}
	if (r < 0)
		return r;
	if (pid_alive(s.pid)) {
		long pid = s.pid;
		tuning_state_fini(&s);
		return cm_err_set(err, -EBUSY,
		                  "tuning: process %ld that wrote %s is still running; it restores "
		                  "on exit (stop it first)",
		                  pid, paths->state_file);
	}
	r = tuning_restore(&s, paths, err);
	if (ret_state)
		*ret_state = s;
	else
		tuning_state_fini(&s);
	return r;
}
