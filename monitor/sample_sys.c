/* monitor/sample_sys.c: the system side: CPU time per core, procs running
 * and blocked, load, memory, swap, vmstat counters.
 *
 * On the real /proc these come from libproc2 (procps 4): procps_stat_reap()
 * for per-CPU ticks, procps_meminfo_select(), procps_vmstat_select() and
 * procps_loadavg(); each of those re-reads its file on every call (the _get
 * variants would cache for a second). libproc2 has no way to read another
 * root, so when a fake procfs root is configured (tests replaying recorded
 * traces, containers with /proc elsewhere) the same figures come from the
 * small parsers below, which follow proc(5). test_monitor_sys checks that the
 * two paths agree on this box. */
#include "monitor/monitor_impl.h"

#include <inttypes.h>
#include <libproc2/meminfo.h>
#include <libproc2/misc.h>
#include <libproc2/stat.h>
#include <libproc2/vmstat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const mon_cpu_mode_names[CPU_MODES] = {
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
};

struct sys_reader {
	struct stat_info *st;
	struct meminfo_info *mi;
	struct vmstat_info *vi;
};

int mon_sys_reader_new(bool use_libproc2, struct sys_reader **ret, struct cm_err *err)
{
	*ret = NULL;
	if (!use_libproc2)
		return 0;
	struct sys_reader *r = cm_calloc(1, sizeof(*r));
	if (!r)
		return cm_err_set(err, -ENOMEM, "monitor: out of memory");
	int rc;
	if ((rc = procps_stat_new(&r->st)) < 0 || (rc = procps_meminfo_new(&r->mi)) < 0 ||
	    (rc = procps_vmstat_new(&r->vi)) < 0) {
		mon_sys_reader_free(r);
		return cm_err_set(err, rc, "monitor: libproc2: %s", strerror(-rc));
	}
	*ret = r;
	return 0;
}

void mon_sys_reader_free(struct sys_reader *r)
{
	if (!r)
		return;
	if (r->st)
		procps_stat_unref(&r->st);
	if (r->mi)
		procps_meminfo_unref(&r->mi);
	if (r->vi)
		procps_vmstat_unref(&r->vi);
	cm_free(r);
}

void mon_sys_sample_fini(struct sys_sample *s)
{
	cm_free(s->cpus);
	s->cpus = NULL;
	s->cpus_cap = 0;
	s->ncpu = 0;
}

static int cpus_reserve(struct sys_sample *s, int n)
{
	if (n <= s->cpus_cap)
		return 0;
	if (n > MON_MAX_CPUS)
		return -E2BIG;
	struct sys_cpu *p = cm_realloc(s->cpus, (size_t)n * sizeof(*p));
	if (!p)
		return -ENOMEM;
	s->cpus = p;
	s->cpus_cap = n;
	return 0;
}

/* ---- parsers (fake roots) ------------------------------------------------ */

int mon_sys_parse_stat(const char *text, struct sys_sample *s)
{
	s->ncpu = 0;
	s->have_stat = false;
	for (const char *l = text; l && *l;) {
		if (strncmp(l, "cpu", 3) == 0 && l[3] >= '0' && l[3] <= '9') {
			char *end;
			long id = strtol(l + 3, &end, 10);
			if (s->ncpu == s->cpus_cap) {
				int want = CM_MIN(s->cpus_cap ? s->cpus_cap * 2 : 8, MON_MAX_CPUS);
				int rc = s->ncpu < want ? cpus_reserve(s, want) : -E2BIG;
				if (rc)
					return rc;
			}
			struct sys_cpu *c = &s->cpus[s->ncpu++];
			c->id = (int)id;
			const char *p = end;
			for (int m = 0; m < CPU_MODES; m++) {
				/* Older kernels have fewer columns: the rest stay 0. */
				c->t[m] = strtoull(p, &end, 10);
				p = end;
			}
		} else if (strncmp(l, "procs_running ", 14) == 0) {
			s->procs_running = strtoull(l + 14, NULL, 10);
		} else if (strncmp(l, "procs_blocked ", 14) == 0) {
			s->procs_blocked = strtoull(l + 14, NULL, 10);
		}
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	if (s->ncpu == 0)
		return -EPROTO;
	s->have_stat = true;
	return 0;
}

int mon_sys_parse_meminfo(const char *text, struct sys_sample *s)
{
	uint64_t total, avail, st = 0, sf = 0;
	s->have_mem = false;
	if (!mon_kv_u64(text, "MemTotal", &total) || !mon_kv_u64(text, "MemAvailable", &avail))
		return -EPROTO;
	(void)mon_kv_u64(text, "SwapTotal", &st);
	(void)mon_kv_u64(text, "SwapFree", &sf);
	s->mem_total = total * 1024;
	s->mem_avail = avail * 1024;
	s->swap_total = st * 1024;
	s->swap_free = sf * 1024;
	s->have_mem = true;
	return 0;
}

int mon_sys_parse_vmstat(const char *text, struct sys_sample *s)
{
	s->have_vm = false;
	s->pswpin = s->pswpout = s->pgmajfault = s->oom_kill = 0;
	if (!mon_kv_u64(text, "pgmajfault", &s->pgmajfault))
		return -EPROTO;
	(void)mon_kv_u64(text, "pswpin", &s->pswpin);
	(void)mon_kv_u64(text, "pswpout", &s->pswpout);
	s->have_oom_kill = mon_kv_u64(text, "oom_kill", &s->oom_kill);
	s->have_vm = true;
	return 0;
}

int mon_sys_parse_loadavg(const char *text, struct sys_sample *s)
{
	s->have_load = sscanf(text, "%lf %lf %lf", &s->load[0], &s->load[1], &s->load[2]) == 3;
	return s->have_load ? 0 : -EPROTO;
}

/* ---- libproc2 (real /proc) ---------------------------------------------- */

static int lp2_stat(struct sys_reader *r, struct sys_sample *s)
{
	static enum stat_item items[] = {
	    STAT_TIC_ID,     STAT_TIC_USER, STAT_TIC_NICE,    STAT_TIC_SYSTEM, STAT_TIC_IDLE,
	    STAT_TIC_IOWAIT, STAT_TIC_IRQ,  STAT_TIC_SOFTIRQ, STAT_TIC_STOLEN,
	};
	s->have_stat = false;
	struct stat_reaped *rp =
	    procps_stat_reap(r->st, STAT_REAP_CPUS_ONLY, items, (int)CM_ARRAY_LEN(items));
	if (!rp || !rp->cpus || rp->cpus->total <= 0)
		return errno ? -errno : -EIO;
	int n = rp->cpus->total, rc = cpus_reserve(s, n);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++) {
		struct stat_result *h = rp->cpus->stacks[i]->head;
		s->cpus[i].id = h[0].result.s_int;
		for (int m = 0; m < CPU_MODES; m++)
			s->cpus[i].t[m] = h[1 + m].result.ull_int;
	}
	s->ncpu = n;
	/* The reap just read /proc/stat; these come from the same read. */
	struct stat_result *sr = procps_stat_get(r->st, STAT_SYS_PROC_RUNNING);
	s->procs_running = sr ? sr->result.ul_int : 0;
	sr = procps_stat_get(r->st, STAT_SYS_PROC_BLOCKED);
	s->procs_blocked = sr ? sr->result.ul_int : 0;
	s->have_stat = true;
	return 0;
}

static int lp2_meminfo(struct sys_reader *r, struct sys_sample *s)
{
	static enum meminfo_item items[] = {
	    MEMINFO_MEM_TOTAL,
	    MEMINFO_MEM_AVAILABLE,
	    MEMINFO_SWAP_TOTAL,
	    MEMINFO_SWAP_FREE,
	};
	s->have_mem = false;
	struct meminfo_stack *st = procps_meminfo_select(r->mi, items, (int)CM_ARRAY_LEN(items));
	if (!st)
		return errno ? -errno : -EIO;
	/* libproc2 reports KiB, as the file does. */
	s->mem_total = (uint64_t)st->head[0].result.ul_int * 1024;
	s->mem_avail = (uint64_t)st->head[1].result.ul_int * 1024;
	s->swap_total = (uint64_t)st->head[2].result.ul_int * 1024;
	s->swap_free = (uint64_t)st->head[3].result.ul_int * 1024;
	s->have_mem = s->mem_total > 0;
	return s->have_mem ? 0 : -EPROTO;
}

static int lp2_vmstat(struct sys_reader *r, struct sys_sample *s)
{
	static enum vmstat_item items[] = {
	    VMSTAT_PSWPIN,
	    VMSTAT_PSWPOUT,
	    VMSTAT_PGMAJFAULT,
	    VMSTAT_OOM_KILL,
	};
	s->have_vm = false;
	struct vmstat_stack *st = procps_vmstat_select(r->vi, items, (int)CM_ARRAY_LEN(items));
	if (!st)
		return errno ? -errno : -EIO;
	s->pswpin = st->head[0].result.ul_int;
	s->pswpout = st->head[1].result.ul_int;
	s->pgmajfault = st->head[2].result.ul_int;
	s->oom_kill = st->head[3].result.ul_int;
	s->have_oom_kill = true;
	s->have_vm = true;
	return 0;
}

static int lp2_loadavg(struct sys_sample *s)
{
	int rc = procps_loadavg(&s->load[0], &s->load[1], &s->load[2]);
	s->have_load = rc >= 0;
	return rc < 0 ? rc : 0;
}

/* ---- both ---------------------------------------------------------------- */

static int parse_file(struct mon_buf *b, const char *procfs, const char *name,
                      int (*parse)(const char *, struct sys_sample *), struct sys_sample *s)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", procfs, name);
	long n = mon_read_file(b, path);
	if (n < 0)
		return (int)n;
	return parse(b->p, s);
}

int mon_sys_read(struct sys_reader *r, struct mon_buf *b, const char *procfs, struct sys_sample *s,
                 struct cm_err *err)
{
	static const char *const what[] = {"stat", "meminfo", "vmstat", "loadavg"};
	static int (*const parsers[])(const char *, struct sys_sample *) = {
	    mon_sys_parse_stat,
	    mon_sys_parse_meminfo,
	    mon_sys_parse_vmstat,
	    mon_sys_parse_loadavg,
	};
	int first = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(what); i++) {
		int rc;
		errno = 0;
		if (r)
			rc = i == 0   ? lp2_stat(r, s)
			     : i == 1 ? lp2_meminfo(r, s)
			     : i == 2 ? lp2_vmstat(r, s)
			              : lp2_loadavg(s);
		else
			rc = parse_file(b, procfs, what[i], parsers[i], s);
		if (rc && !first)
			first = cm_err_set(err, rc, "monitor: %s/%s: %s%s", procfs, what[i],
			                   r ? "libproc2: " : "",
			                   rc == -EPROTO ? "unexpected format" : strerror(-rc));
	}
	return first;
}
