/* tuning/governor.c: cpufreq policies (governor, EPP) and who else manages
 * them.
 *
 * cpufreq sysfs (Documentation/admin-guide/pm/cpufreq.rst): one directory
 * per policy, devices/system/cpu/cpufreq/policyN, with scaling_governor,
 * scaling_available_governors, scaling_driver, affected_cpus,
 * cpuinfo_max_freq and, with intel_pstate/amd-pstate in active mode,
 * energy_performance_preference(+_available_preferences). VMs and many
 * containers have no policy at all: that is reported, not an error.
 *
 * The knobs themselves are applied and restored by apply.c like any other
 * sysfs knob; this file only reads. */
#include "tuning/tuning_impl.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int policy_cmp(const void *a, const void *b)
{
	const struct tuning_policy *pa = a, *pb = b;
	return atoi(pa->name + 6) - atoi(pb->name + 6);
}

int tuning_cpufreq_detect(const struct tuning_paths *paths, struct tuning_report *r,
                          struct cm_err *err)
{
	const char *sys = paths->sysfs_root;
	char dirpath[TUNING_PATH_MAX * 2];
	r->n_policies = 0;
	r->cpufreq = false;
	if (tuning_fs_path(dirpath, sizeof(dirpath), sys, "devices/system/cpu/cpufreq") < 0)
		return 0;
	DIR *d = opendir(dirpath);
	if (!d)
		return 0;
	int cap = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end;
		if (strncmp(de->d_name, "policy", 6) != 0)
			continue;
		long id = strtol(de->d_name + 6, &end, 10);
		if (end == de->d_name + 6 || *end || id < 0)
			continue;
		if (r->n_policies == cap) {
			int ncap = cap ? cap * 2 : 16;
			struct tuning_policy *np =
			    cm_realloc(r->policies, (size_t)ncap * sizeof(*np));
			if (!np) {
				closedir(d);
				return cm_err_set(err, -ENOMEM, "tuning: out of memory");
			}
			r->policies = np;
			cap = ncap;
		}
		struct tuning_policy *p = &r->policies[r->n_policies];
		memset(p, 0, sizeof(*p));
		snprintf(p->name, sizeof(p->name), "policy%ld", id);
		const char *base = "devices/system/cpu/cpufreq";
		char buf[4096];
		if (tuning_fs_readf(buf, sizeof(buf), sys, "%s/%s/affected_cpus", base, p->name) <
		        0 &&
		    tuning_fs_readf(buf, sizeof(buf), sys, "%s/%s/related_cpus", base, p->name) < 0)
			buf[0] = '\0';
		/* affected_cpus is space separated ("0 1 2"); related_cpus too */
		for (char *q = buf; *q; q++)
			if (*q == ' ')
				*q = ',';
		if (tuning_cpuset_parse(buf, &p->cpus, NULL) < 0)
			tuning_cpuset_zero(&p->cpus);
		tuning_fs_readf(p->driver, sizeof(p->driver), sys, "%s/%s/scaling_driver", base,
		                p->name);
		tuning_fs_readf(p->governor, sizeof(p->governor), sys, "%s/%s/scaling_governor",
		                base, p->name);
		tuning_fs_readf(p->governors, sizeof(p->governors), sys,
		                "%s/%s/scaling_available_governors", base, p->name);
		p->has_epp =
		    tuning_fs_readf(p->epp, sizeof(p->epp), sys,
		                    "%s/%s/energy_performance_preference", base, p->name) >= 0;
		if (p->has_epp)
			tuning_fs_readf(p->epps, sizeof(p->epps), sys,
			                "%s/%s/energy_performance_available_preferences", base,
			                p->name);
		char ap[TUNING_PATH_MAX * 2];
		p->gov_access = p->epp_access = -ENOENT;
		if (tuning_fs_path(ap, sizeof(ap), sys, "%s/%s/scaling_governor", base, p->name) ==
		    0)
			p->gov_access = access(ap, W_OK) == 0 ? 0 : -errno;
		if (p->has_epp &&
		    tuning_fs_path(ap, sizeof(ap), sys, "%s/%s/energy_performance_preference", base,
		                   p->name) == 0)
			p->epp_access = access(ap, W_OK) == 0 ? 0 : -errno;
		long long khz;
		if (tuning_fs_read_ll(&khz, sys, "%s/%s/cpuinfo_max_freq", base, p->name) == 0)
			p->max_khz = (int)khz;
		r->n_policies++;
	}
	closedir(d);
	if (r->n_policies > 1)
		qsort(r->policies, (size_t)r->n_policies, sizeof(*r->policies), policy_cmp);
	for (int i = 0; i < r->n_policies; i++) {
		const struct tuning_policy *p = &r->policies[i];
		for (int c = tuning_cpuset_next(&p->cpus, 0); c >= 0 && c < r->n_cpu_slots;
		     c = tuning_cpuset_next(&p->cpus, c + 1)) {
			r->cpus[c].policy = i;
			r->cpus[c].max_khz = p->max_khz;
		}
	}
	r->cpufreq = r->n_policies > 0;
	return 0;
}

/* ---- other power managers ----------------------------------------------- *
 *
 * Who else may own the governor, and how we notice each one:
 *   - a running process, by <procfs>/<pid>/comm (15 characters at most):
 *     tuned (a Python script; comm is the script's name), power-profiles-daemon
 *     (comm "power-profiles-"), auto-cpufreq, and tlp / cpupower while they run;
 *   - an active systemd unit: tlp.service and cpupower.service are oneshot
 *     units with RemainAfterExit=yes, so no process stays behind although
 *     their settings are in force. While a unit is loaded after starting,
 *     PID 1 keeps the symlink <run>/systemd/units/invocation:<unit> (it is
 *     how journald finds invocation ids); it goes when the unit is stopped
 *     and unloaded. A failed unit that stays loaded keeps it too: we then
 *     leave the governor alone, which is the safe mistake. Only checked when
 *     <run>/systemd/system exists, i.e. systemd is PID 1 (sd_booted()).
 * These are the units tuned.service lists in Conflicts=, plus tuned itself.
 * D-Bus (org.freedesktop.systemd1) would be exact but cannot be pointed at a
 * test tree, and `--check` must work without a bus. */

static const struct {
	const char *comm;
	const char *name;
} power_procs[] = {
    {"tuned", "tuned"},
    {"power-profiles-", "power-profiles-daemon"},
    {"auto-cpufreq", "auto-cpufreq"},
    {"tlp", "tlp"},
    {"cpupower", "cpupower"},
};

static const struct {
	const char *unit;
	const char *name;
} power_units[] = {
    {"tuned.service", "tuned"},
    {"power-profiles-daemon.service", "power-profiles-daemon"},
    {"tlp.service", "tlp"},
    {"cpupower.service", "cpupower"},
    {"auto-cpufreq.service", "auto-cpufreq"},
};

void tuning_power_owner_detect(const struct tuning_paths *paths, struct tuning_power_owner *o)
{
	memset(o, 0, sizeof(*o));
	DIR *d = opendir(paths->procfs_root);
	if (d) {
		struct dirent *de;
		long self = (long)getpid();
		while (!o->found && (de = readdir(d))) {
			char *end;
			long pid = strtol(de->d_name, &end, 10);
			if (end == de->d_name || *end || pid <= 0 ||
			    (pid == self && tuning_paths_is_live(paths)))
				continue;
			char comm[32];
			if (tuning_fs_readf(comm, sizeof(comm), paths->procfs_root, "%ld/comm",
			                    pid) < 0)
				continue;
			for (size_t i = 0; i < CM_ARRAY_LEN(power_procs); i++) {
				if (strcmp(comm, power_procs[i].comm) != 0)
					continue;
				o->found = true;
				tuning_strlcpy(o->name, power_procs[i].name, sizeof(o->name));
				snprintf(o->how, sizeof(o->how), "process %s (pid %ld) is running",
				         comm, pid);
				break;
			}
		}
		closedir(d);
	}
	if (o->found)
		return;
	char path[TUNING_PATH_MAX * 2];
	struct stat st;
	if (tuning_fs_path(path, sizeof(path), paths->run_root, "systemd/system") < 0 ||
	    stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
		return;
	for (size_t i = 0; i < CM_ARRAY_LEN(power_units); i++) {
		if (tuning_fs_path(path, sizeof(path), paths->run_root,
		                   "systemd/units/invocation:%s", power_units[i].unit) < 0)
			continue;
		if (lstat(path, &st) == 0) {
			o->found = true;
			tuning_strlcpy(o->name, power_units[i].name, sizeof(o->name));
			snprintf(o->how, sizeof(o->how), "unit %s is active", power_units[i].unit);
			return;
		}
	}
}
