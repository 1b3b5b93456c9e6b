/* tuning/memory.c: memory facts (meminfo, THP, memlock limit and
 * capabilities), the fit check, locking, huge-page buffers and prefault.
 *
 * Facts come from files, not from syscalls, so fake trees can model them:
 * <procfs>/meminfo, <procfs>/self/limits (RLIMIT_MEMLOCK, RLIMIT_NICE),
 * <procfs>/self/status (CapEff), <sysfs>/kernel/mm/transparent_hugepage/. */
#include "tuning/tuning_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define CAP_IPC_LOCK_ 14
#define CAP_SYS_NICE_ 23
#define CAP_SYS_RESOURCE_ 24
#define HUGE_2M (2u << 20)

/* First value of a /proc/<pid>/limits line: soft limit. */
static int limits_soft(const char *text, const char *key, bool *ret_unlimited, uint64_t *ret)
{
	char v[128];
	if (tuning_text_field(text, key, v, sizeof(v)) < 0)
		return -ENOENT;
	if (strncmp(v, "unlimited", 9) == 0) {
		*ret_unlimited = true;
		*ret = UINT64_MAX;
		return 0;
	}
	char *end;
	unsigned long long x = strtoull(v, &end, 10);
	if (end == v)
		return -EINVAL;
	*ret_unlimited = false;
	*ret = x;
	return 0;
}

void tuning_mem_detect(const struct tuning_paths *paths, struct tuning_mem *m)
{
	char path[TUNING_PATH_MAX * 2], *text = NULL, buf[128];
	memset(m, 0, sizeof(*m));
	m->numa_balancing = -1;
	m->nice_floor = 20;
	if (tuning_fs_path(path, sizeof(path), paths->procfs_root, "meminfo") == 0 &&
	    tuning_fs_slurp(path, &text, NULL) == 0) {
		(void)tuning_text_kib(text, "MemTotal", &m->total);
		if (tuning_text_kib(text, "MemAvailable", &m->available) < 0)
			(void)tuning_text_kib(text, "MemFree", &m->available);
		(void)tuning_text_kib(text, "SwapTotal", &m->swap_total);
		(void)tuning_text_kib(text, "SwapFree", &m->swap_free);
		(void)tuning_text_kib(text, "Hugepagesize", &m->hugepage_size);
		char v[32];
		if (tuning_text_field(text, "HugePages_Total", v, sizeof(v)) == 0)
			m->hugepages_total = strtoull(v, NULL, 10);
		if (tuning_text_field(text, "HugePages_Free", v, sizeof(v)) == 0)
			m->hugepages_free = strtoull(v, NULL, 10);
		cm_free(text);
		text = NULL;
	}
	if (tuning_fs_readf(buf, sizeof(buf), paths->sysfs_root,
	                    "kernel/mm/transparent_hugepage/enabled") >= 0)
		tuning_text_bracketed(buf, m->thp_enabled, sizeof(m->thp_enabled));
	if (tuning_fs_readf(buf, sizeof(buf), paths->sysfs_root,
	                    "kernel/mm/transparent_hugepage/defrag") >= 0)
		tuning_text_bracketed(buf, m->thp_defrag, sizeof(m->thp_defrag));
	long long nb;
	if (tuning_fs_read_ll(&nb, paths->procfs_root, "sys/kernel/numa_balancing") == 0)
		m->numa_balancing = (int)nb;

	bool have_limits = false;
	if (tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/limits") == 0 &&
	    tuning_fs_slurp(path, &text, NULL) == 0) {
		have_limits = limits_soft(text, "Max locked memory", &m->memlock_unlimited,
		                          &m->memlock_limit) == 0;
		bool unl;
		uint64_t nl;
		if (limits_soft(text, "Max nice priority", &unl, &nl) == 0)
			m->nice_floor = unl || nl >= 40 ? -20 : 20 - (int)nl;
		cm_free(text);
		text = NULL;
	}
	if (!have_limits && tuning_paths_is_live(paths)) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
			m->memlock_unlimited = rl.rlim_cur == RLIM_INFINITY;
			m->memlock_limit = m->memlock_unlimited ? UINT64_MAX : rl.rlim_cur;
		}
	}
	if (tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/status") == 0 &&
	    tuning_fs_slurp(path, &text, NULL) == 0) {
		char v[64];
		if (tuning_text_field(text, "CapEff", v, sizeof(v)) == 0) {
			uint64_t caps = strtoull(v, NULL, 16);
			m->cap_ipc_lock = (caps >> CAP_IPC_LOCK_) & 1;
			m->cap_sys_nice = (caps >> CAP_SYS_NICE_) & 1;
			m->cap_sys_resource = (caps >> CAP_SYS_RESOURCE_) & 1;
		}
		cm_free(text);
	}
}

/* ---- fit check ---------------------------------------------------------- */

int tuning_memory_fit_check(const struct tuning_report *r, uint64_t model_bytes, uint64_t kv_bytes,
                            struct cm_err *err)
{
	uint64_t need;
	if (cm_add_overflow_u64(model_bytes, kv_bytes, &need))
		return cm_err_set(err, -EOVERFLOW, "memory: model + KV size overflows");
	uint64_t avail = r->mem.available;
	bool by_cgroup = false;
	const struct tuning_cgroup *cg = &r->cgroup;
	if (cg->has_mem_limit) {
		uint64_t room = cg->mem_limit > cg->mem_usage ? cg->mem_limit - cg->mem_usage : 0;
		room += cg->mem_file; /* its page cache can be reclaimed */
		if (room > cg->mem_limit)
			room = cg->mem_limit;
		if (room < avail) {
			avail = room;
			by_cgroup = true;
		}
	}
	if (need <= avail)
		return 0;
	char n[32], m[32], k[32], a[32], l[32];
	tuning_fmt_bytes(n, sizeof(n), need);
	tuning_fmt_bytes(m, sizeof(m), model_bytes);
	tuning_fmt_bytes(k, sizeof(k), kv_bytes);
	tuning_fmt_bytes(a, sizeof(a), avail);
	if (by_cgroup) {
		tuning_fmt_bytes(l, sizeof(l), cg->mem_limit);
		return cm_err_set(
		    err, -ENOMEM,
		    "model does not fit in memory: needs %s (weights %s + KV cache %s), "
		    "cgroup memory limit %s leaves %s; raise MemoryMax= or use a "
		    "smaller model, quantization or context",
		    n, m, k, l, a);
	}
	return cm_err_set(err, -ENOMEM,
	                  "model does not fit in memory: needs %s (weights %s + KV cache %s), "
	                  "MemAvailable is %s; use a smaller model, quantization or context, "
	                  "or free memory",
	                  n, m, k, a);
}

/* ---- locking ------------------------------------------------------------ */

/* Whether the limit lets `bytes` be locked (CAP_IPC_LOCK overrides it). */
static bool memlock_allowed(const struct tuning_mem *m, uint64_t bytes)
{
	return m->cap_ipc_lock || m->memlock_unlimited || m->memlock_limit >= bytes;
}

/* The one warning, with the fix for its cause: LimitMEMLOCK only when the
 * limit is what refused (the unit already sets it, so under the unit a
 * failure is something else, usually too little free RAM). The caller says
 * what it does next (serve unlocked, or refuse). Kept under 256 bytes
 * (struct cm_err). */
static int memlock_warning(struct cm_err *err, int code, const struct tuning_mem *m,
                           uint64_t bytes, const char *why)
{
	char b[32];
	tuning_fmt_bytes(b, sizeof(b), bytes);
	const char *fix = !memlock_allowed(m, bytes)
	                      ? "fix: LimitMEMLOCK=infinity in edgelmd.service (systemctl edit "
	                        "edgelmd)"
	                  : code == -ENOMEM || code == -EAGAIN
	                      ? "not the limit: too little free RAM to pin it; free memory, or a "
	                        "smaller model or ctx_size"
	                  : code == -EPERM ? "not the limit: mlock was refused, as in a "
	                                     "container without CAP_IPC_LOCK"
	                                   : "see mlock(2)";
	return cm_err_set(err, code, "mlock: cannot lock %s of weights and KV cache in RAM (%s); %s",
	                  b, why, fix);
}

int tuning_memlock_check(const struct tuning_report *r, uint64_t bytes, struct cm_err *err)
{
	const struct tuning_mem *m = &r->mem;
	if (memlock_allowed(m, bytes))
		return 0;
	char lim[32], why[96];
	tuning_fmt_bytes(lim, sizeof(lim), m->memlock_limit);
	snprintf(why, sizeof(why), "RLIMIT_MEMLOCK is %s and CAP_IPC_LOCK is missing", lim);
	return memlock_warning(err, -EPERM, m, bytes, why);
}

int tuning_memory_lock(const struct tuning_plan *plan, const struct tuning_report *r,
                       const struct tuning_region *regions, int n_regions, struct tuning_state *st,
                       struct cm_err *err)
{
	enum tuning_mlock mode = plan->cfg.mlock;
	if (mode == TUNING_MLOCK_OFF || st->mlocked)
		return 0;
	/* once per state: a second call after a failure stays quiet, so the
	 * warning is logged once */
	for (int i = 0; i < st->n_changes; i++)
		if (st->changes[i].kind == TUNING_KNOB_MLOCK && !st->changes[i].restored)
			return 0;
	uint64_t total = 0;
	for (int i = 0; i < n_regions; i++)
		total += regions[i].len;
	char tb[32], after[64];
	tuning_fmt_bytes(tb, sizeof(tb), total);
	snprintf(after, sizeof(after), "%s %s", mode == TUNING_MLOCK_ALL ? "mlockall" : "locked",
	         tb);
	struct tuning_change *c = tuning_state_add(
	    st, TUNING_KNOB_MLOCK, mode == TUNING_MLOCK_ALL ? "process" : "weights+kv", "unlocked",
	    after, false);
	if (!c)
		return cm_err_set(err, -ENOMEM, "mlock: out of memory");
	int ret = tuning_memlock_check(r, total, err);
	if (ret < 0) {
		tuning_change_fail(st, c, ret, "%s", err ? err->msg : "mlock not allowed");
		return ret;
	}
	if (mode == TUNING_MLOCK_ALL) {
		if (mlockall(MCL_CURRENT | MCL_FUTURE) != 0) {
			int e = errno;
			ret = memlock_warning(err, -e, &r->mem, total, strerror(e));
			tuning_change_fail(st, c, ret, "%s", err ? err->msg : strerror(e));
			return ret;
		}
	} else {
		for (int i = 0; i < n_regions; i++) {
			if (!regions[i].len)
				continue;
			if (mlock(regions[i].addr, regions[i].len) == 0)
				continue;
			int e = errno;
			char why[96];
			snprintf(why, sizeof(why), "%s: %s",
			         regions[i].what ? regions[i].what : "region", strerror(e));
			for (int j = 0; j < i; j++)
				(void)munlock(regions[j].addr, regions[j].len);
			ret = memlock_warning(err, -e, &r->mem, total, why);
			tuning_change_fail(st, c, ret, "%s", err ? err->msg : why);
			return ret;
		}
	}
	c->result = 0;
	st->mlocked = true;
	return 0;
}

/* ---- huge pages --------------------------------------------------------- */

int tuning_hugepage_alloc(const struct tuning_paths *paths, size_t size,
                          struct tuning_hugepage_buf *ret, struct cm_err *err)
{
	memset(ret, 0, sizeof(*ret));
	if (size == 0)
		return cm_err_set(err, -EINVAL, "hugepages: size 0");
	if (size > SIZE_MAX - 2 * (size_t)HUGE_2M)
		return cm_err_set(err, -EOVERFLOW, "hugepages: size too large");
	size_t len = (size_t)cm_align_up(size, HUGE_2M);
	size_t map_len = len + HUGE_2M;
	char *p = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		int e = errno;
		char b[32];
		tuning_fmt_bytes(b, sizeof(b), len);
		return cm_err_set(err, -e, "hugepages: mmap of %s: %s", b, strerror(e));
	}
	/* Trim to a 2 MiB-aligned window so every 2 MiB of it can be a PMD. */
	uintptr_t a = (uintptr_t)cm_align_up((uintptr_t)p, HUGE_2M);
	size_t head = a - (uintptr_t)p, tail = map_len - head - len;
	if (head)
		(void)munmap(p, head);
	if (tail)
		(void)munmap((char *)a + len, tail);
	ret->addr = (void *)a;
	ret->len = len;
	ret->map_addr = (void *)a;
	ret->map_len = len;
	ret->madvised = madvise(ret->addr, len, MADV_HUGEPAGE) == 0;
	char buf[128];
	if (paths && tuning_fs_readf(buf, sizeof(buf), paths->sysfs_root,
	                             "kernel/mm/transparent_hugepage/enabled") >= 0)
		tuning_text_bracketed(buf, ret->thp_enabled, sizeof(ret->thp_enabled));
	ret->thp_effective = ret->madvised && (strcmp(ret->thp_enabled, "always") == 0 ||
	                                       strcmp(ret->thp_enabled, "madvise") == 0);
	return 0;
}

void tuning_hugepage_free(struct tuning_hugepage_buf *b)
{
	if (!b || !b->map_addr)
		return;
	(void)munmap(b->map_addr, b->map_len);
	memset(b, 0, sizeof(*b));
}

int tuning_memory_rss(const struct tuning_paths *paths, const void *addr, size_t len,
                      uint64_t *ret_rss, uint64_t *ret_anon_huge, struct cm_err *err)
{
	char path[TUNING_PATH_MAX * 2], *text = NULL;
	int r = tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/smaps");
	if (r == 0)
		r = tuning_fs_slurp(path, &text, NULL);
	if (r < 0)
		return cm_err_set(err, r, "memory: %s: %s", path, strerror(-r));
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	uint64_t rss = 0, huge = 0;
	bool in = false;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		unsigned long long s, e;
		char dash;
		/* a VMA header: "7f00-7f80 rw-p ..."; field lines ("Rss:",
		 * "AnonHugePages:") never have '-' after a leading hex run */
		if (sscanf(line, "%llx%c%llx", &s, &dash, &e) == 3 && dash == '-') {
			in = s < hi && e > lo;
			continue;
		}
		if (!in)
			continue;
		uint64_t v;
		if (strncmp(line, "Rss:", 4) == 0 && tuning_text_kib(line, "Rss", &v) == 0)
			rss += v;
		else if (strncmp(line, "AnonHugePages:", 14) == 0 &&
		         tuning_text_kib(line, "AnonHugePages", &v) == 0)
			huge += v;
	}
	cm_free(text);
	if (ret_rss)
		*ret_rss = rss;
	if (ret_anon_huge)
		*ret_anon_huge = huge;
	return 0;
}

int tuning_prefault(void *addr, size_t len, bool write, struct cm_err *err)
{
	if (!addr || !len)
		return 0;
	long pg = sysconf(_SC_PAGESIZE);
	size_t page = pg > 0 ? (size_t)pg : 4096;
	uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(page - 1);
	size_t l = len + ((uintptr_t)addr - a);
	int tries = 0;
	for (;;) {
		if (madvise((void *)a, l, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
			return 0;
		if (errno == EINTR && ++tries < 8)
			continue;
		if (errno != EINVAL) {
			int e = errno;
			return cm_err_set(err, -e, "prefault: madvise(MADV_POPULATE_%s): %s",
			                  write ? "WRITE" : "READ", strerror(e));
		}
		break; /* kernel before 5.14: touch the pages */
	}
	volatile char *p = (volatile char *)addr;
	char sink = 0;
	for (size_t off = 0; off < len; off += page) {
		if (write)
			p[off] = p[off];
		else
			sink ^= p[off];
	}
	if (write)
		p[len - 1] = p[len - 1];
	else
		sink ^= p[len - 1];
	(void)sink;
	return 0;
}
