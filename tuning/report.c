/* tuning/report.c: the detection report (tuning_detect) and its printing for
 * `edgelmd --check`. */
#include "tuning/tuning_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tuning_report_init(struct tuning_report *r)
{
	memset(r, 0, sizeof(*r));
}

void tuning_report_fini(struct tuning_report *r)
{
	if (!r)
		return;
	cm_free(r->cpus);
	cm_free(r->cores);
	cm_free(r->policies);
	memset(r, 0, sizeof(*r));
}

static void detect_cpu(const struct tuning_paths *paths, struct tuning_cpu *cpu)
{
	char path[TUNING_PATH_MAX * 2], *text = NULL;
	struct tuning_cpu fromfile;
	bool have_file = tuning_fs_path(path, sizeof(path), paths->procfs_root, "cpuinfo") == 0 &&
	                 tuning_fs_slurp(path, &text, NULL) == 0 &&
	                 tuning_cpu_parse_cpuinfo(text, &fromfile) == 0;
	cm_free(text);
	if (tuning_paths_is_live(paths)) {
		(void)tuning_cpu_detect(cpu, NULL);
		/* the name ops know (lscpu shows it) */
		if (have_file && fromfile.model[0])
			tuning_strlcpy(cpu->model, fromfile.model, sizeof(cpu->model));
		if (have_file && !cpu->vendor[0])
			tuning_strlcpy(cpu->vendor, fromfile.vendor, sizeof(cpu->vendor));
	} else if (have_file) {
		*cpu = fromfile;
	} else {
		memset(cpu, 0, sizeof(*cpu));
		cpu->l1d_kib = cpu->l2_kib = cpu->l3_kib = -1;
		tuning_strlcpy(cpu->source, "none", sizeof(cpu->source));
	}
}

int tuning_detect(const struct tuning_paths *paths, struct tuning_report *r, struct cm_err *err)
{
	tuning_report_fini(r);
	detect_cpu(paths, &r->cpu);
	int ret = tuning_topology_detect(paths, r, err);
	if (ret < 0)
		goto fail;
	if ((ret = tuning_cpufreq_detect(paths, r, err)) < 0)
		goto fail;
	tuning_topology_classify(r);
	tuning_power_owner_detect(paths, &r->power_owner);
	tuning_mem_detect(paths, &r->mem);
	tuning_priority_detect(paths, r);
	tuning_boot_id(paths, r->boot_id, sizeof(r->boot_id));
	return 0;
fail:
	tuning_report_fini(r);
	return ret;
}

/* ---- printing ----------------------------------------------------------- */

static void list(const struct tuning_cpuset *s, char *buf, size_t len)
{
	if (tuning_cpuset_format(s, buf, len) < 0 && len > 4)
		memcpy(buf + len - 4, "...", 4);
	if (!buf[0])
		tuning_strlcpy(buf, "none", len);
}

static void print_cpu(FILE *f, const struct tuning_cpu *cpu)
{
	fprintf(f, "  cpu            %s (%s", cpu->model[0] ? cpu->model : "unknown",
	        cpu->vendor[0] ? cpu->vendor : "unknown vendor");
	if (!strcmp(cpu->arch, "aarch64"))
		fprintf(f, ", implementer 0x%02x part 0x%03x", cpu->family, cpu->model_id);
	else if (cpu->family)
		fprintf(f, ", family %d model %d stepping %d", cpu->family, cpu->model_id,
		        cpu->stepping);
	fprintf(f, ")%s\n", cpu->hypervisor ? ", under a hypervisor" : "");
	char isa[512];
	tuning_isa_format(&cpu->isa, isa, sizeof(isa));
	fprintf(f, "  isa            %s\n", isa);
	if (!strcmp(cpu->arch, "x86_64"))
		fprintf(f, "  os support     %s: AVX state %s, AVX-512 state %s, AMX state %s%s\n",
		        cpu->source, cpu->os_avx ? "saved" : "NOT saved",
		        cpu->os_avx512 ? "saved" : "not saved", cpu->os_amx ? "saved" : "not saved",
		        cpu->isa.amx_tile
		            ? (cpu->amx_permitted ? ", AMX permitted" : ", AMX not yet permitted")
		            : "");
	else
		fprintf(f, "  os support     %s\n", cpu->source);
	if (cpu->notes[0])
		fprintf(f, "  note           %s\n", cpu->notes);
}

static void print_hybrid(FILE *f, const struct tuning_report *r)
{
	char a[64], b[64];
	struct tuning_cpuset big, little;
	tuning_cpuset_zero(&big);
	tuning_cpuset_zero(&little);
	int bigcap = 0, litcap = 0;
	for (int cc = tuning_cpuset_next(&r->online, 0); cc >= 0 && cc < r->n_cpu_slots;
	     cc = tuning_cpuset_next(&r->online, cc + 1)) {
		int k = r->cpus[cc].core;
		if (k < 0)
			continue;
		if (r->cores[k].big) {
			tuning_cpuset_add(&big, cc);
			bigcap = r->cores[k].capacity;
		} else {
			tuning_cpuset_add(&little, cc);
			litcap =
			    litcap ? CM_MIN(litcap, r->cores[k].capacity) : r->cores[k].capacity;
		}
	}
	list(&big, a, sizeof(a));
	list(&little, b, sizeof(b));
	fprintf(f, "  hybrid         big cpus %s (capacity %d), LITTLE cpus %s (capacity %d)\n", a,
	        bigcap, b, litcap);
}

static void print_topology(FILE *f, const struct tuning_report *r)
{
	char l[1024];
	list(&r->online, l, sizeof(l));
	int threads_max = 1;
	for (int k = 0; k < r->n_cores; k++)
		threads_max = CM_MAX(threads_max, r->cores[k].n_threads);
	fprintf(f,
	        "  topology       %d logical cpus online (%s), %d physical cores, %d package%s, ",
	        tuning_cpuset_count(&r->online), l, r->n_cores, r->n_packages,
	        r->n_packages == 1 ? "" : "s");
	if (r->smt)
		fprintf(f, "SMT %d threads/core\n", threads_max);
	else
		fprintf(f, "no SMT\n");
	if (r->hybrid)
		print_hybrid(f, r);
}

static void print_caches(FILE *f, const struct tuning_report *r)
{
	if (!r->n_caches) {
		fprintf(f, "  caches         unknown\n");
		return;
	}
	char a[64];
	fprintf(f, "  caches        ");
	for (int i = 0; i < r->n_caches; i++) {
		const struct tuning_cache *ca = &r->caches[i];
		tuning_fmt_bytes(a, sizeof(a), ca->size);
		const char *t = !strcmp(ca->type, "Data")          ? "d"
		                : !strcmp(ca->type, "Instruction") ? "i"
		                                                   : "";
		fprintf(f, "%s L%d%s %s", i ? "," : "", ca->level, t, a);
		if (ca->shared_cpus > 1)
			fprintf(f, " (shared by %d)", ca->shared_cpus);
	}
	fprintf(f, " [%s]\n", r->cache_source);
}

static void print_numa(FILE *f, const struct tuning_report *r)
{
	if (r->n_nodes == 0) {
		fprintf(f, "  numa           no node information\n");
		return;
	}
	char a[64], b[64], l[1024];
	fprintf(f, "  numa           %d node%s:", r->n_nodes, r->n_nodes == 1 ? "" : "s");
	for (int i = 0; i < r->n_nodes; i++) {
		list(&r->nodes[i].cpus, l, sizeof(l));
		tuning_fmt_bytes(a, sizeof(a), r->nodes[i].mem_total);
		tuning_fmt_bytes(b, sizeof(b), r->nodes[i].mem_avail);
		fprintf(f, "%s node%d cpus %s, %s (%s available)", i ? ";" : "", r->nodes[i].id, l,
		        a, b);
	}
	fprintf(f, "%s\n", r->mem.numa_balancing == 1 ? "; numa_balancing on" : "");
}

static void print_cgroup(FILE *f, const struct tuning_cgroup *cg)
{
	if (cg->version == 0) {
		fprintf(f, "  cgroup         none found\n");
		return;
	}
	char a[64], b[64], l[1024];
	fprintf(f, "  cgroup         v%d %s", cg->version, cg->path[0] ? cg->path : "/");
	if (cg->has_cpuset) {
		list(&cg->cpuset, l, sizeof(l));
		fprintf(f, ", cpuset %s", l);
	}
	if (cg->has_quota)
		fprintf(f, ", cpu quota %lld/%lld us = %.2f cpus -> %d", (long long)cg->quota_us,
		        (long long)cg->period_us, (double)cg->quota_us / (double)cg->period_us,
		        cg->quota_cpus);
	else
		fprintf(f, ", no cpu quota");
	if (cg->has_mem_limit) {
		tuning_fmt_bytes(a, sizeof(a), cg->mem_limit);
		tuning_fmt_bytes(b, sizeof(b), cg->mem_usage);
		fprintf(f, ", memory limit %s (%s used)", a, b);
	}
	fputc('\n', f);
}

/* Memory, huge pages and the memlock limit. */
static void print_memory(FILE *f, const struct tuning_mem *m)
{
	char a[64], b[64], c[64];
	tuning_fmt_bytes(a, sizeof(a), m->total);
	tuning_fmt_bytes(b, sizeof(b), m->available);
	if (m->swap_total) {
		tuning_fmt_bytes(c, sizeof(c), m->swap_total);
		fprintf(f, "  memory         %s total, %s available, swap %s\n", a, b, c);
	} else {
		fprintf(f, "  memory         %s total, %s available, no swap\n", a, b);
	}
	tuning_fmt_bytes(a, sizeof(a), m->hugepage_size);
	fprintf(f, "  huge pages     THP %s (defrag %s), hugetlb pool %llu x %s\n",
	        m->thp_enabled[0] ? m->thp_enabled : "absent",
	        m->thp_defrag[0] ? m->thp_defrag : "-", (unsigned long long)m->hugepages_total, a);
	if (m->memlock_unlimited)
		snprintf(a, sizeof(a), "unlimited");
	else
		tuning_fmt_bytes(a, sizeof(a), m->memlock_limit);
	fprintf(f, "  memlock        RLIMIT_MEMLOCK %s, CAP_IPC_LOCK %s\n", a,
	        m->cap_ipc_lock ? "yes" : "no");
}

/* cpufreq and whoever else manages it. */
static void print_cpufreq(FILE *f, const struct tuning_report *r)
{
	if (!r->cpufreq) {
		fprintf(f, "  cpufreq        absent\n");
	} else {
		const struct tuning_policy *p0 = &r->policies[0];
		fprintf(f,
		        "  cpufreq        %d polic%s, driver %s, governor %s (available: %s)%s%s\n",
		        r->n_policies, r->n_policies == 1 ? "y" : "ies", p0->driver, p0->governor,
		        p0->governors, p0->has_epp ? ", epp " : "", p0->has_epp ? p0->epp : "");
	}
	if (r->power_owner.found)
		fprintf(f, "  power manager  %s (%s)\n", r->power_owner.name, r->power_owner.how);
	else
		fprintf(f,
		        "  power manager  none found (tuned, power-profiles-daemon, tlp, cpupower, "
		        "auto-cpufreq)\n");
}

static void print_report(FILE *f, const struct tuning_report *r)
{
	char a[64], l[1024];
	fprintf(f, "Detection\n");
	print_cpu(f, &r->cpu);
	print_topology(f, r);
	print_caches(f, r);
	print_numa(f, r);
	list(&r->affinity, l, sizeof(l));
	fprintf(f, "  affinity       %s\n", l);
	print_cgroup(f, &r->cgroup);
	list(&r->usable, l, sizeof(l));
	fprintf(f, "  usable         cpus %s: %d physical core%s\n", l, r->usable_cores,
	        r->usable_cores == 1 ? "" : "s");
	print_memory(f, &r->mem);
	print_cpufreq(f, r);
	if (r->oom_score_adj == TUNING_KEEP)
		snprintf(a, sizeof(a), "?");
	else
		snprintf(a, sizeof(a), "%d", r->oom_score_adj);
	fprintf(f, "  process        nice %d, oom_score_adj %s\n", r->nice, a);
}

/* "devices/system/cpu/cpufreq/policy3/scaling_governor" -> "policy3" */
static const char *short_target(const char *t, char *buf, size_t len)
{
	const char *p = strstr(t, "cpufreq/");
	if (!p)
		return t;
	p += 8;
	const char *e = strchr(p, '/');
	size_t n = e ? (size_t)(e - p) : strlen(p);
	if (n >= len)
		n = len - 1;
	memcpy(buf, p, n);
	buf[n] = '\0';
	return buf;
}

static bool same_line(const struct tuning_knob *a, const struct tuning_knob *b)
{
	return a->kind == b->kind && a->status == b->status && !strcmp(a->current, b->current) &&
	       !strcmp(a->wanted, b->wanted) && !strcmp(a->reason, b->reason);
}

/* Knobs i..j-1 on cpufreq policies: "policy0-63,96-127 (96)". */
static void merged_target(const struct tuning_plan *p, int i, int j, char *buf, size_t len)
{
	struct tuning_cpuset ids;
	tuning_cpuset_zero(&ids);
	for (int x = i; x < j; x++) {
		const char *s = strstr(p->knobs[x].target, "cpufreq/policy");
		if (!s) {
			snprintf(buf, len, "%d targets", j - i);
			return;
		}
		tuning_cpuset_add(&ids, atoi(s + 14));
	}
	char l[80];
	if (tuning_cpuset_format(&ids, l, sizeof(l)) < 0)
		snprintf(l, sizeof(l), "...");
	snprintf(buf, len, "policy%s (%d)", l, j - i);
}

static void print_knobs(FILE *f, const struct tuning_plan *p)
{
	fprintf(f, "Knobs (current -> wanted)\n");
	int n_apply = 0, n_blocked = 0;
	for (int i = 0; i < p->n_knobs;) {
		const struct tuning_knob *k = &p->knobs[i];
		int j = i + 1;
		while (j < p->n_knobs && same_line(k, &p->knobs[j]))
			j++;
		char t1[48], target[112];
		if (j - i > 1)
			merged_target(p, i, j, target, sizeof(target));
		else
			snprintf(target, sizeof(target), "%s",
			         short_target(k->target, t1, sizeof(t1)));
		fprintf(f, "  %-14s %-22s ", tuning_knob_name(k->kind), target);
		switch (k->status) {
		case TUNING_KNOB_APPLY:
			fprintf(f, "%s -> %s", k->current, k->wanted);
			n_apply += j - i;
			break;
		case TUNING_KNOB_ALREADY:
			fprintf(f, "ok: %s", k->wanted);
			break;
		case TUNING_KNOB_OFF:
			fprintf(f, "off: %s", k->current);
			break;
		case TUNING_KNOB_NA:
			fprintf(f, "n/a: %s", k->reason);
			break;
		case TUNING_KNOB_BLOCKED:
			fprintf(f, "BLOCKED: %s -> %s", k->current, k->wanted);
			n_blocked += j - i;
			break;
		}
		fputc('\n', f);
		if (k->reason[0] && k->status != TUNING_KNOB_NA)
			fprintf(f, "  %-14s %-22s   %s\n", "", "", k->reason);
		i = j;
	}
	fprintf(f, "Summary: %d change%s to apply, %d blocked\n", n_apply, n_apply == 1 ? "" : "s",
	        n_blocked);
}

void tuning_report_print(FILE *f, const struct tuning_report *r, const struct tuning_plan *p)
{
	print_report(f, r);
	if (!p)
		return;
	char wl[1024], sl[1024];
	fprintf(f, "Plan\n");
	if (tuning_cpuset_format(&p->workers, wl, sizeof(wl)) < 0)
		tuning_strlcpy(wl + sizeof(wl) - 4, "...", 4);
	if (tuning_cpuset_format(&p->service, sl, sizeof(sl)) < 0)
		tuning_strlcpy(sl + sizeof(sl) - 4, "...", 4);
	fprintf(f, "  workers        %d on cpus %s%s\n", p->n_workers, wl,
	        p->pin ? " (pinned)" : " (not pinned)");
	fprintf(f, "  why            %s\n", p->threads_note);
	fprintf(f, "  service        scheduler + IPC threads on cpus %s\n", sl);
	if (p->numa == TUNING_NUMA_NODE)
		fprintf(f, "  numa           node %d\n", p->numa_node);
	else if (p->numa == TUNING_NUMA_INTERLEAVE)
		fprintf(f, "  numa           interleave (node mask 0x%llx)\n",
		        (unsigned long long)p->numa_nodes);
	print_knobs(f, p);
}
