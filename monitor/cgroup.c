/* monitor/cgroup.c: memory and CPU limits of the watched process' cgroup.
 *
 * cgroup v2 (Documentation/admin-guide/cgroup-v2.rst): the process' group is
 * the "0::<path>" line of /proc/<pid>/cgroup, under <sysfs>/fs/cgroup, or
 * <sysfs>/fs/cgroup/unified on a hybrid host. Files: memory.current,
 * memory.max ("max" or bytes), memory.events (low, high, max, oom, oom_kill),
 * cpu.stat (nr_periods, nr_throttled, throttled_usec with the cpu
 * controller).
 *
 * cgroup v1 fallback, per controller, for hybrid hosts whose v2 group has no
 * memory or cpu controller (like the dev VM): "N:memory:<path>" ->
 * memory/<path>/memory.usage_in_bytes, memory.limit_in_bytes (a huge value
 * means unlimited), memory.failcnt (times the limit was hit; reported as the
 * "max" event), memory.oom_control (oom_kill); "N:cpu,cpuacct:<path>" ->
 * cpu/<path>/cpu.stat (throttled_time in ns).
 *
 * A process in the root group ("/") is "not in a cgroup": the root has no
 * limits, and its v1 usage is the whole machine's. */
#include "monitor/monitor_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* v1 reports "no limit" as LONG_MAX rounded down to a page. */
#define V1_UNLIMITED (1ull << 62)

static bool file_exists(const char *p)
{
	return access(p, F_OK) == 0;
}

/* Find the path for controller `ctl` ("" = the v2 line) in a
 * /proc/<pid>/cgroup text. */
static bool cg_path(const char *text, const char *ctl, char *ret, size_t cap)
{
	size_t k = strlen(ctl);
	for (const char *l = text; l && *l;) {
		const char *c1 = strchr(l, ':');
		const char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		const char *eol = strchr(l, '\n');
		if (!eol)
			eol = l + strlen(l);
		if (c1 && c2 && c2 < eol) {
			bool match;
			if (!*ctl) {
				match = c1 - l == 1 && l[0] == '0' && c2 == c1 + 1;
			} else {
				/* comma-separated list, e.g. "cpu,cpuacct" */
				match = false;
				for (const char *p = c1 + 1; p < c2;) {
					const char *q = memchr(p, ',', (size_t)(c2 - p));
					if (!q)
						q = c2;
					if ((size_t)(q - p) == k && strncmp(p, ctl, k) == 0)
						match = true;
					p = q + 1;
				}
			}
			if (match) {
				size_t n = CM_MIN((size_t)(eol - c2 - 1), cap - 1);
				memcpy(ret, c2 + 1, n);
				ret[n] = '\0';
				return true;
			}
		}
		l = *eol ? eol + 1 : NULL;
	}
	return false;
}

static void read_events_v2(struct mon_buf *b, const char *dir, struct cg_sample *s)
{
	char p[4600];
	snprintf(p, sizeof(p), "%s/memory.events", dir);
	if (mon_read_file(b, p) < 0)
		return;
	(void)mon_kv_u64(b->p, "low", &s->ev_low);
	(void)mon_kv_u64(b->p, "high", &s->ev_high);
	(void)mon_kv_u64(b->p, "max", &s->ev_max);
	(void)mon_kv_u64(b->p, "oom", &s->ev_oom);
	(void)mon_kv_u64(b->p, "oom_kill", &s->ev_oom_kill);
	s->have_events = true;
}

static void read_cpu_stat(struct mon_buf *b, const char *file, bool v1, struct cg_sample *s)
{
	uint64_t t;
	if (mon_read_file(b, file) < 0 || !mon_kv_u64(b->p, "nr_periods", &s->nr_periods) ||
	    !mon_kv_u64(b->p, "nr_throttled", &s->nr_throttled))
		return;
	if (v1 ? mon_kv_u64(b->p, "throttled_time", &t) : mon_kv_u64(b->p, "throttled_usec", &t))
		s->throttled_usec = v1 ? t / 1000 : t;
	s->have_cpu = true;
}

int mon_cgroup_read(struct mon_buf *b, const char *procfs, const char *sysfs, int pid,
                    struct cg_sample *s, struct cm_err *err)
{
	char p[4600], text[2048], dir[4400], rel[256];
	memset(s, 0, sizeof(*s));
	if (pid > 0)
		snprintf(p, sizeof(p), "%s/%d/cgroup", procfs, pid);
	else
		snprintf(p, sizeof(p), "%s/self/cgroup", procfs);
	long n = mon_read_file(b, p);
	if (n == -ENOENT)
		return 0; /* kernel without cgroups */
	if (n < 0)
		return cm_err_set(err, (int)n, "monitor: %s: %s", p, strerror((int)-n));
	snprintf(text, sizeof(text), "%s", b->p);

	/* v2 */
	if (cg_path(text, "", rel, sizeof(rel)) && strcmp(rel, "/") != 0) {
		snprintf(p, sizeof(p), "%s/fs/cgroup/cgroup.controllers", sysfs);
		const char *root = file_exists(p) ? "" : "/unified";
		snprintf(dir, sizeof(dir), "%s/fs/cgroup%s%s", sysfs, root, rel);
		snprintf(p, sizeof(p), "%s/memory.current", dir);
		if (mon_read_u64(b, p, &s->mem_current) == 0) {
			s->have_mem = true;
			snprintf(p, sizeof(p), "%s/memory.max", dir);
			if (mon_read_u64(b, p, &s->mem_max))
				s->mem_max = UINT64_MAX;
			read_events_v2(b, dir, s);
		}
		snprintf(p, sizeof(p), "%s/cpu.stat", dir);
		read_cpu_stat(b, p, false, s);
		if (s->have_mem || s->have_cpu) {
			s->version = 2;
			snprintf(s->path, sizeof(s->path), "%s", rel);
		}
	}

	/* v1, per controller the v2 group did not give us */
	if (!s->have_mem && cg_path(text, "memory", rel, sizeof(rel)) && strcmp(rel, "/") != 0) {
		snprintf(dir, sizeof(dir), "%s/fs/cgroup/memory%s", sysfs, rel);
		snprintf(p, sizeof(p), "%s/memory.usage_in_bytes", dir);
		if (mon_read_u64(b, p, &s->mem_current) == 0) {
			s->have_mem = true;
			snprintf(p, sizeof(p), "%s/memory.limit_in_bytes", dir);
			if (mon_read_u64(b, p, &s->mem_max) || s->mem_max >= V1_UNLIMITED)
				s->mem_max = UINT64_MAX;
			snprintf(p, sizeof(p), "%s/memory.failcnt", dir);
			if (mon_read_u64(b, p, &s->ev_max) == 0)
				s->have_events = true;
			snprintf(p, sizeof(p), "%s/memory.oom_control", dir);
			if (mon_read_file(b, p) >= 0)
				(void)mon_kv_u64(b->p, "oom_kill", &s->ev_oom_kill);
			if (!s->version)
				s->version = 1;
			if (!s->path[0])
				snprintf(s->path, sizeof(s->path), "%s", rel);
		}
	}
	if (!s->have_cpu && cg_path(text, "cpu", rel, sizeof(rel)) && strcmp(rel, "/") != 0) {
		static const char *const mounts[] = {"cpu", "cpu,cpuacct", "cpuacct,cpu"};
		for (size_t i = 0; i < CM_ARRAY_LEN(mounts) && !s->have_cpu; i++) {
			snprintf(p, sizeof(p), "%s/fs/cgroup/%s%s/cpu.stat", sysfs, mounts[i], rel);
			read_cpu_stat(b, p, true, s);
		}
		if (s->have_cpu && !s->version)
			s->version = 1;
		if (s->have_cpu && !s->path[0])
			snprintf(s->path, sizeof(s->path), "%s", rel);
	}
	return 0;
}
