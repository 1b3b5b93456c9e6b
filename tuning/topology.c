/* tuning/topology.c: logical cpus, physical cores and SMT siblings,
 * packages, NUMA nodes, caches, the cpus this process may use (affinity and
 * cgroup cpuset) and the cgroup CPU quota.
 *
 * Sources (all under the configurable roots):
 *   sysfs devices/system/cpu/online, cpuN/topology/{core_id,
 *     physical_package_id,die_id,thread_siblings_list}, cpuN/cpu_capacity,
 *     cpuN/cache/index*, devices/system/node/nodeN/{cpulist,meminfo}
 *   procfs self/status (Cpus_allowed_list, Mems_allowed_list), self/cgroup
 *   cgroup fs: v2 cpuset.cpus.effective, cpu.max, memory.{max,current,stat};
 *     v1 (hybrid hosts, like this project's dev VM) cpuset.effective_cpus,
 *     cpu.cfs_quota_us/cpu.cfs_period_us, memory.limit_in_bytes. */
#include "tuning/tuning_impl.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int read_cpuset(const char *root, const char *rel, struct tuning_cpuset *ret)
{
	char buf[8192];
	int r = tuning_fs_readf(buf, sizeof(buf), root, "%s", rel);
	if (r < 0)
		return r;
	return tuning_cpuset_parse(buf, ret, NULL);
}

static int cpu_read_int(const char *sys, int cpu, const char *rel, int dflt)
{
	long long v;
	if (tuning_fs_read_ll(&v, sys, "devices/system/cpu/cpu%d/%s", cpu, rel) < 0)
		return dflt;
	return (int)v;
}

static uint64_t parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	switch (*end) {
	case 'K':
	case 'k':
		v <<= 10;
		break;
	case 'M':
	case 'm':
		v <<= 20;
		break;
	case 'G':
	case 'g':
		v <<= 30;
		break;
	default:
		break;
	}
	return v;
}

static void detect_caches(const char *sys, struct tuning_report *r, int cpu)
{
	r->n_caches = 0;
	for (int i = 0; i < 16 && r->n_caches < TUNING_MAX_CACHES; i++) {
		char base[64], buf[256];
		snprintf(base, sizeof(base), "devices/system/cpu/cpu%d/cache/index%d", cpu, i);
		if (tuning_fs_readf(buf, sizeof(buf), sys, "%s/level", base) < 0)
			break;
		struct tuning_cache *c = &r->caches[r->n_caches];
		memset(c, 0, sizeof(*c));
		c->level = atoi(buf);
		tuning_fs_readf(c->type, sizeof(c->type), sys, "%s/type", base);
		if (tuning_fs_readf(buf, sizeof(buf), sys, "%s/size", base) >= 0)
			c->size = parse_size(buf);
		struct tuning_cpuset sh;
		if (tuning_fs_readf(buf, sizeof(buf), sys, "%s/shared_cpu_list", base) >= 0 &&
		    tuning_cpuset_parse(buf, &sh, NULL) == 0)
			c->shared_cpus = tuning_cpuset_count(&sh);
		r->n_caches++;
	}
	if (r->n_caches) {
		tuning_strlcpy(r->cache_source, "sysfs", sizeof(r->cache_source));
		return;
	}
	/* VMs often have no cache/ in sysfs: use what libcpuid found. */
	const struct {
		int level;
		const char *type;
		int kib;
	} lc[] = {{1, "Data", r->cpu.l1d_kib},
	          {2, "Unified", r->cpu.l2_kib},
	          {3, "Unified", r->cpu.l3_kib}};
	for (size_t i = 0; i < CM_ARRAY_LEN(lc); i++) {
		if (lc[i].kib <= 0)
			continue;
		struct tuning_cache *c = &r->caches[r->n_caches++];
		memset(c, 0, sizeof(*c));
		c->level = lc[i].level;
		tuning_strlcpy(c->type, lc[i].type, sizeof(c->type));
		c->size = (uint64_t)lc[i].kib << 10;
	}
	if (r->n_caches)
		tuning_strlcpy(r->cache_source, "libcpuid", sizeof(r->cache_source));
}

static void detect_nodes(const struct tuning_paths *paths, struct tuning_report *r)
{
	char dirpath[TUNING_PATH_MAX * 2];
	r->n_nodes = 0;
	if (tuning_fs_path(dirpath, sizeof(dirpath), paths->sysfs_root, "devices/system/node") < 0)
		return;
	DIR *d = opendir(dirpath);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d)) && r->n_nodes < TUNING_MAX_NODES) {
		char *end;
		if (strncmp(de->d_name, "node", 4) != 0 || !de->d_name[4])
			continue;
		long id = strtol(de->d_name + 4, &end, 10);
		if (*end || id < 0 || id >= TUNING_MAX_NODES)
			continue;
		struct tuning_node *n = &r->nodes[r->n_nodes];
		memset(n, 0, sizeof(*n));
		n->id = (int)id;
		char rel[64];
		snprintf(rel, sizeof(rel), "devices/system/node/node%ld/cpulist", id);
		if (read_cpuset(paths->sysfs_root, rel, &n->cpus) < 0)
			tuning_cpuset_zero(&n->cpus);
		char path[TUNING_PATH_MAX * 2], *text = NULL, key[64];
		if (tuning_fs_path(path, sizeof(path), paths->sysfs_root,
		                   "devices/system/node/node%ld/meminfo", id) == 0 &&
		    tuning_fs_slurp(path, &text, NULL) == 0) {
			uint64_t v = 0, free_ = 0, af = 0, inf = 0, sr = 0;
			snprintf(key, sizeof(key), "Node %ld MemTotal", id);
			if (tuning_text_kib(text, key, &v) == 0)
				n->mem_total = v;
			snprintf(key, sizeof(key), "Node %ld MemFree", id);
			(void)tuning_text_kib(text, key, &free_);
			snprintf(key, sizeof(key), "Node %ld Active(file)", id);
			(void)tuning_text_kib(text, key, &af);
			snprintf(key, sizeof(key), "Node %ld Inactive(file)", id);
			(void)tuning_text_kib(text, key, &inf);
			snprintf(key, sizeof(key), "Node %ld SReclaimable", id);
			(void)tuning_text_kib(text, key, &sr);
			/* Like MemAvailable, per node: free + page cache +
			 * reclaimable slab. An estimate, used only to decide
			 * whether a model fits on one node. */
			n->mem_avail = free_ + af + inf + sr;
			if (n->mem_total && n->mem_avail > n->mem_total)
				n->mem_avail = n->mem_total;
			cm_free(text);
		}
		r->n_nodes++;
	}
	closedir(d);
	/* readdir order is arbitrary: sort by id */
	for (int i = 1; i < r->n_nodes; i++)
		for (int j = i; j > 0 && r->nodes[j - 1].id > r->nodes[j].id; j--) {
			struct tuning_node t = r->nodes[j];
			r->nodes[j] = r->nodes[j - 1];
			r->nodes[j - 1] = t;
		}
}

/* ---- cgroup ------------------------------------------------------------- */

/* Apply fn to dir = base + path, then to each ancestor up to base itself. */
static void walk_up(const char *base, const char *path, void (*fn)(const char *dir, void *ctx),
                    void *ctx)
{
	char p[TUNING_PATH_MAX];
	tuning_strlcpy(p, path, sizeof(p));
	for (;;) {
		char dir[TUNING_PATH_MAX * 2];
		size_t n = strlen(p);
		while (n > 0 && p[n - 1] == '/')
			p[--n] = '\0';
		snprintf(dir, sizeof(dir), "%s%s%s", base, p[0] == '/' || !p[0] ? "" : "/", p);
		fn(dir, ctx);
		char *slash = strrchr(p, '/');
		if (!p[0])
			break;
		if (!slash)
			p[0] = '\0';
		else
			*slash = '\0';
	}
}

struct quota_ctx {
	struct tuning_cgroup *cg;
	int version;
};

static void quota_visit(const char *dir, void *vctx)
{
	struct quota_ctx *q = vctx;
	long long quota = -1, period = 0;
	if (q->version == 2) {
		char buf[64], qs[32];
		if (tuning_fs_readf(buf, sizeof(buf), dir, "cpu.max") < 0)
			return;
		if (sscanf(buf, "%31s %lld", qs, &period) != 2 || strcmp(qs, "max") == 0)
			return;
		quota = atoll(qs);
	} else {
		if (tuning_fs_read_ll(&quota, dir, "cpu.cfs_quota_us") < 0 || quota <= 0)
			return;
		if (tuning_fs_read_ll(&period, dir, "cpu.cfs_period_us") < 0)
			return;
	}
	if (quota <= 0 || period <= 0)
		return;
	struct tuning_cgroup *cg = q->cg;
	/* keep the most restrictive ratio on the way up */
	if (!cg->has_quota ||
	    (double)quota / (double)period < (double)cg->quota_us / (double)cg->period_us) {
		cg->has_quota = true;
		cg->quota_us = quota;
		cg->period_us = period;
	}
}

static void mem_visit(const char *dir, void *vctx)
{
	struct quota_ctx *q = vctx;
	struct tuning_cgroup *cg = q->cg;
	long long lim = -1, cur = 0;
	uint64_t file = 0;
	char buf[64], path[TUNING_PATH_MAX * 2], *text = NULL;
	if (q->version == 2) {
		if (tuning_fs_readf(buf, sizeof(buf), dir, "memory.max") < 0 ||
		    strcmp(buf, "max") == 0)
			return;
		lim = atoll(buf);
		(void)tuning_fs_read_ll(&cur, dir, "memory.current");
		if (tuning_fs_path(path, sizeof(path), dir, "memory.stat") == 0 &&
		    tuning_fs_slurp(path, &text, NULL) == 0) {
			char v[32];
			if (tuning_text_field(text, "file", v, sizeof(v)) == 0)
				file = strtoull(v, NULL, 10);
			cm_free(text);
		}
	} else {
		if (tuning_fs_read_ll(&lim, dir, "memory.limit_in_bytes") < 0)
			return;
		(void)tuning_fs_read_ll(&cur, dir, "memory.usage_in_bytes");
		if (tuning_fs_path(path, sizeof(path), dir, "memory.stat") == 0 &&
		    tuning_fs_slurp(path, &text, NULL) == 0) {
			char v[32];
			if (tuning_text_field(text, "total_cache", v, sizeof(v)) == 0)
				file = strtoull(v, NULL, 10);
			cm_free(text);
		}
	}
	/* v1 says "unlimited" with a huge page-aligned number */
	if (lim <= 0 || (uint64_t)lim >= (1ull << 60))
		return;
	if (cur < 0)
		cur = 0;
	uint64_t room = (uint64_t)lim > (uint64_t)cur ? (uint64_t)lim - (uint64_t)cur : 0;
	room += file;
	uint64_t best = cg->mem_limit > cg->mem_usage ? cg->mem_limit - cg->mem_usage : 0;
	best += cg->mem_file;
	if (!cg->has_mem_limit || room < best) {
		cg->has_mem_limit = true;
		cg->mem_limit = (uint64_t)lim;
		cg->mem_usage = (uint64_t)cur;
		cg->mem_file = file;
	}
}

struct cpuset_ctx {
	struct tuning_cgroup *cg;
	const char *file;
};

static void cpuset_visit(const char *dir, void *vctx)
{
	struct cpuset_ctx *c = vctx;
	if (c->cg->has_cpuset)
		return; /* the nearest one wins: it already reflects its ancestors */
	char buf[8192];
	if (tuning_fs_readf(buf, sizeof(buf), dir, "%s", c->file) < 0 || !buf[0])
		return;
	if (tuning_cpuset_parse(buf, &c->cg->cpuset, NULL) == 0)
		c->cg->has_cpuset = true;
}

/* A v1 controller's mount: "<root>/cpu,cpuacct" as listed, else "<root>/cpu". */
static bool v1_dir(const char *root, const char *list, const char *ctrl, char *buf, size_t len)
{
	snprintf(buf, len, "%s/%s", root, list);
	if (tuning_fs_exists(buf))
		return true;
	snprintf(buf, len, "%s/%s", root, ctrl);
	return tuning_fs_exists(buf);
}

int tuning_cgroup_detect(const struct tuning_paths *paths, struct tuning_cgroup *cg)
{
	char path[TUNING_PATH_MAX * 2], *text = NULL;
	memset(cg, 0, sizeof(*cg));
	if (tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/cgroup") < 0 ||
	    tuning_fs_slurp(path, &text, NULL) < 0)
		return 0;

	char ctl[TUNING_PATH_MAX * 2], v2path[256] = "";
	bool have_v2 = false;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (strncmp(line, "0::", 3) == 0) {
			tuning_strlcpy(v2path, line + 3, sizeof(v2path));
			have_v2 = true;
		}
	}
	/* Unified hierarchy mounted at the cgroup root with controllers. */
	char controllers[256] = "";
	if (have_v2 && tuning_fs_readf(controllers, sizeof(controllers), paths->cgroup_root,
	                               "cgroup.controllers") >= 0) {
		cg->version = 2;
		tuning_strlcpy(cg->path, v2path, sizeof(cg->path));
		struct cpuset_ctx cc = {cg, "cpuset.cpus.effective"};
		struct quota_ctx qc = {cg, 2};
		walk_up(paths->cgroup_root, v2path, cpuset_visit, &cc);
		walk_up(paths->cgroup_root, v2path, quota_visit, &qc);
		walk_up(paths->cgroup_root, v2path, mem_visit, &qc);
		goto out;
	}

	/* v1 (or hybrid): per-controller hierarchies. */
	cm_free(text);
	text = NULL;
	if (tuning_fs_slurp(path, &text, NULL) < 0)
		return 0;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c1 || !c2)
			continue;
		*c2 = '\0';
		const char *list = c1 + 1, *cpath = c2 + 1;
		if (!*list)
			continue;
		struct quota_ctx qc = {cg, 1};
		if (tuning_word_in(list, "cpuset") || strstr(list, "cpuset")) {
			if (v1_dir(paths->cgroup_root, list, "cpuset", ctl, sizeof(ctl))) {
				struct cpuset_ctx cc = {cg, "cpuset.effective_cpus"};
				walk_up(ctl, cpath, cpuset_visit, &cc);
				if (!cg->has_cpuset) {
					cc.file = "cpuset.cpus";
					walk_up(ctl, cpath, cpuset_visit, &cc);
				}
				cg->version = 1;
			}
		}
		/* "cpu" but not "cpuacct"/"cpuset" alone */
		bool has_cpu = false;
		char tmp[128];
		tuning_strlcpy(tmp, list, sizeof(tmp));
		for (char *tok = strtok(tmp, ","); tok; tok = strtok(NULL, ","))
			has_cpu |= strcmp(tok, "cpu") == 0;
		if (has_cpu && v1_dir(paths->cgroup_root, list, "cpu", ctl, sizeof(ctl))) {
			walk_up(ctl, cpath, quota_visit, &qc);
			cg->version = 1;
			if (!cg->path[0])
				tuning_strlcpy(cg->path, cpath, sizeof(cg->path));
		}
		if (strstr(list, "memory") &&
		    v1_dir(paths->cgroup_root, list, "memory", ctl, sizeof(ctl))) {
			walk_up(ctl, cpath, mem_visit, &qc);
			cg->version = 1;
		}
	}
out:
	if (cg->has_quota) {
		int64_t q = cg->quota_us / cg->period_us;
		cg->quota_cpus = q < 1 ? 1 : (int)CM_MIN(q, (int64_t)TUNING_MAX_CPUS);
	}
	cm_free(text);
	return 0;
}

/* ---- cpus and cores ----------------------------------------------------- */

int tuning_topology_detect(const struct tuning_paths *paths, struct tuning_report *r,
                           struct cm_err *err)
{
	const char *sys = paths->sysfs_root;
	char buf[8192];
	int ret = tuning_fs_readf(buf, sizeof(buf), sys, "devices/system/cpu/online");
	if (ret < 0)
		return cm_err_set(err, ret, "tuning: %s/devices/system/cpu/online: %s", sys,
		                  strerror(-ret));
	if ((ret = tuning_cpuset_parse(buf, &r->online, err)) < 0)
		return cm_err_prefix(err, "tuning: devices/system/cpu/online");
	int max_cpu = -1;
	for (int c = tuning_cpuset_next(&r->online, 0); c >= 0;
	     c = tuning_cpuset_next(&r->online, c + 1))
		max_cpu = c;
	struct tuning_cpuset present;
	if (read_cpuset(sys, "devices/system/cpu/present", &present) == 0) {
		for (int c = tuning_cpuset_next(&present, 0); c >= 0;
		     c = tuning_cpuset_next(&present, c + 1))
			max_cpu = CM_MAX(max_cpu, c);
	} else {
		present = r->online;
	}
	if (max_cpu < 0)
		return cm_err_set(err, -ENOENT, "tuning: no online cpu in %s", sys);

	r->n_cpu_slots = max_cpu + 1;
	r->cpus = cm_calloc((size_t)r->n_cpu_slots, sizeof(*r->cpus));
	r->cores = cm_calloc((size_t)r->n_cpu_slots, sizeof(*r->cores));
	if (!r->cpus || !r->cores)
		return cm_err_set(err, -ENOMEM, "tuning: out of memory");
	for (int c = 0; c < r->n_cpu_slots; c++) {
		struct tuning_cpu_info *ci = &r->cpus[c];
		ci->present = tuning_cpuset_has(&present, c);
		ci->online = tuning_cpuset_has(&r->online, c);
		ci->core = -1;
		ci->node = -1;
		ci->policy = -1;
		ci->core_id = ci->package_id = ci->die_id = -1;
		if (!ci->online)
			continue;
		ci->core_id = cpu_read_int(sys, c, "topology/core_id", -1);
		ci->package_id = cpu_read_int(sys, c, "topology/physical_package_id", 0);
		ci->die_id = cpu_read_int(sys, c, "topology/die_id", 0);
		ci->capacity = cpu_read_int(sys, c, "cpu_capacity", 0);
	}

	/* Cores: cpus listed in each other's thread_siblings_list. */
	r->n_cores = 0;
	struct tuning_cpuset pkgs;
	tuning_cpuset_zero(&pkgs);
	for (int c = tuning_cpuset_next(&r->online, 0); c >= 0;
	     c = tuning_cpuset_next(&r->online, c + 1)) {
		struct tuning_cpu_info *ci = &r->cpus[c];
		tuning_cpuset_add(&pkgs, ci->package_id < 0 ? 0 : ci->package_id);
		if (ci->core >= 0)
			continue;
		struct tuning_cpuset sib;
		char rel[96], rel2[96];
		snprintf(rel, sizeof(rel), "devices/system/cpu/cpu%d/topology/thread_siblings_list",
		         c);
		snprintf(rel2, sizeof(rel2), "devices/system/cpu/cpu%d/topology/core_cpus_list", c);
		if (read_cpuset(sys, rel, &sib) < 0 && read_cpuset(sys, rel2, &sib) < 0)
			tuning_cpuset_zero(&sib);
		tuning_cpuset_add(&sib, c);
		tuning_cpuset_and(&sib, &r->online);
		struct tuning_core *core = &r->cores[r->n_cores];
		core->first_cpu = c;
		core->package = ci->package_id < 0 ? 0 : ci->package_id;
		core->node = -1;
		for (int s = tuning_cpuset_next(&sib, 0); s >= 0;
		     s = tuning_cpuset_next(&sib, s + 1)) {
			if (r->cpus[s].core >= 0)
				continue;
			r->cpus[s].core = r->n_cores;
			core->n_threads++;
		}
		if (core->n_threads > 1)
			r->smt = true;
		r->n_cores++;
	}
	r->n_packages = tuning_cpuset_count(&pkgs);

	detect_nodes(paths, r);
	for (int i = 0; i < r->n_nodes; i++)
		for (int c = tuning_cpuset_next(&r->nodes[i].cpus, 0); c >= 0 && c < r->n_cpu_slots;
		     c = tuning_cpuset_next(&r->nodes[i].cpus, c + 1))
			r->cpus[c].node = r->nodes[i].id;
	for (int k = 0; k < r->n_cores; k++)
		r->cores[k].node = r->cpus[r->cores[k].first_cpu].node;

	/* What this process may use. */
	char path[TUNING_PATH_MAX * 2], *text = NULL;
	r->affinity = r->online;
	r->mems_allowed = ~0ull;
	if (tuning_fs_path(path, sizeof(path), paths->procfs_root, "self/status") == 0 &&
	    tuning_fs_slurp(path, &text, NULL) == 0) {
		char v[8192];
		struct tuning_cpuset s;
		if (tuning_text_field(text, "Cpus_allowed_list", v, sizeof(v)) == 0 &&
		    tuning_cpuset_parse(v, &s, NULL) == 0)
			r->affinity = s;
		if (tuning_text_field(text, "Mems_allowed_list", v, sizeof(v)) == 0 &&
		    tuning_cpuset_parse(v, &s, NULL) == 0)
			r->mems_allowed = s.bits[0];
		cm_free(text);
	}
	tuning_cgroup_detect(paths, &r->cgroup);
	r->usable = r->online;
	tuning_cpuset_and(&r->usable, &r->affinity);
	if (r->cgroup.has_cpuset)
		tuning_cpuset_and(&r->usable, &r->cgroup.cpuset);
	r->usable_cores = 0;
	struct tuning_cpuset seen; /* by core index */
	tuning_cpuset_zero(&seen);
	for (int c = tuning_cpuset_next(&r->usable, 0); c >= 0;
	     c = tuning_cpuset_next(&r->usable, c + 1)) {
		int k = c < r->n_cpu_slots ? r->cpus[c].core : -1;
		if (k >= 0 && !tuning_cpuset_has(&seen, k)) {
			tuning_cpuset_add(&seen, k);
			r->usable_cores++;
		}
	}
	int first = tuning_cpuset_next(&r->usable, 0);
	detect_caches(sys, r, first >= 0 ? first : tuning_cpuset_next(&r->online, 0));
	return 0;
}

/* After cpufreq detection: each core's capacity (cpu_capacity, else the
 * policy's cpuinfo_max_freq) and whether it is in the fast class. On
 * big.LITTLE a core is "big" when its capacity is at least 80 % of the
 * fastest core's; see docs/tuning.md for why workers go there. */
void tuning_topology_classify(struct tuning_report *r)
{
	int maxcap = 0, mincap = 0;
	bool use_capacity = true;
	for (int c = tuning_cpuset_next(&r->online, 0); c >= 0;
	     c = tuning_cpuset_next(&r->online, c + 1))
		if (c < r->n_cpu_slots && r->cpus[c].capacity <= 0)
			use_capacity = false;
	for (int k = 0; k < r->n_cores; k++)
		r->cores[k].capacity = 0;
	for (int c = tuning_cpuset_next(&r->online, 0); c >= 0;
	     c = tuning_cpuset_next(&r->online, c + 1)) {
		int k = c < r->n_cpu_slots ? r->cpus[c].core : -1;
		if (k < 0)
			continue;
		int v = use_capacity ? r->cpus[c].capacity : r->cpus[c].max_khz;
		r->cores[k].capacity = CM_MAX(r->cores[k].capacity, v);
	}
	for (int k = 0; k < r->n_cores; k++) {
		maxcap = CM_MAX(maxcap, r->cores[k].capacity);
		mincap = k == 0 ? r->cores[k].capacity : CM_MIN(mincap, r->cores[k].capacity);
	}
	/* 5 % of noise between otherwise equal cores is not big.LITTLE */
	r->hybrid = maxcap > 0 && mincap > 0 && (int64_t)mincap * 100 < (int64_t)maxcap * 95;
	for (int k = 0; k < r->n_cores; k++)
		r->cores[k].big =
		    !r->hybrid || (int64_t)r->cores[k].capacity * 100 >= (int64_t)maxcap * 80;
}
