/* tuning/plan.c: from the detection report and the config to a plan: how
 * many workers, on which cpus, where the service threads go, the NUMA policy,
 * and for every knob what it would change or what blocks it.
 *
 * Threads. One worker per physical core this process may use: online cpus
 * & affinity mask & cgroup cpuset, SMT siblings not counted (two threads on
 * one core share its load ports and caches, and decode is bound by memory
 * bandwidth anyway), capped by the cgroup CPU quota (floor(quota/period),
 * at least 1: a worker more than the quota allows gets throttled and stalls
 * every barrier). On big.LITTLE only the big cores get workers: every op
 * ends in a barrier, so the step runs at the speed of the slowest worker, and
 * a LITTLE core (often under half a big one) makes the big ones wait
 * (llama.cpp#7176: default threads 2x slower on an Orange Pi 5, -t 4 on the
 * big cores fix it). The LITTLE cores host the service threads instead. A
 * config override takes big cores, then LITTLE cores, then SMT siblings.
 *
 * NUMA. With more than one node in reach: "node" keeps workers and memory on
 * one node (the one with most usable cores); "interleave" spreads workers
 * over the nodes round-robin and interleaves memory; "auto" picks node when
 * model + KV fit in the node's available memory, else interleave.
 *
 * This file reads no files and changes nothing. It sits below state.c and
 * apply.c (they use the knob names) and calls neither of them. */
#include "tuning/tuning_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const knob_names[TUNING_KNOB_COUNT] = {
    [TUNING_KNOB_THREADS] = "threads",
    [TUNING_KNOB_PINNING] = "pinning",
    [TUNING_KNOB_AFFINITY] = "service-cpus",
    [TUNING_KNOB_NUMA] = "numa",
    [TUNING_KNOB_GOVERNOR] = "governor",
    [TUNING_KNOB_EPP] = "epp",
    [TUNING_KNOB_NICE] = "nice",
    [TUNING_KNOB_SCHED_BATCH] = "sched-batch",
    [TUNING_KNOB_IOPRIO] = "load-ioprio",
    [TUNING_KNOB_OOM_SCORE_ADJ] = "oom-score-adj",
    [TUNING_KNOB_MLOCK] = "mlock",
    [TUNING_KNOB_HUGEPAGES] = "hugepages",
    [TUNING_KNOB_PREFAULT] = "prefault",
    [TUNING_KNOB_AMX] = "amx",
};

const char *tuning_knob_name(enum tuning_knob_kind k)
{
	return (unsigned)k < TUNING_KNOB_COUNT ? knob_names[k] : "?";
}

const char *tuning_knob_status_name(enum tuning_knob_status s)
{
	switch (s) {
	case TUNING_KNOB_APPLY:
		return "apply";
	case TUNING_KNOB_ALREADY:
		return "ok";
	case TUNING_KNOB_OFF:
		return "off";
	case TUNING_KNOB_NA:
		return "n/a";
	case TUNING_KNOB_BLOCKED:
		return "BLOCKED";
	}
	return "?";
}

void tuning_plan_init(struct tuning_plan *p)
{
	memset(p, 0, sizeof(*p));
	p->numa_node = -1;
}

void tuning_plan_fini(struct tuning_plan *p)
{
	if (!p)
		return;
	cm_free(p->knobs);
	memset(p, 0, sizeof(*p));
	p->numa_node = -1;
}

const struct tuning_knob *tuning_plan_knob(const struct tuning_plan *p, enum tuning_knob_kind k)
{
	for (int i = 0; i < p->n_knobs; i++)
		if (p->knobs[i].kind == k)
			return &p->knobs[i];
	return NULL;
}

struct builder {
	struct tuning_plan *p;
	int cap;
	bool oom;
};

static struct tuning_knob *knob(struct builder *b, enum tuning_knob_kind kind,
                                enum tuning_knob_status st, const char *target, const char *current,
                                const char *wanted)
{
	static struct tuning_knob dummy;
	if (b->p->n_knobs == b->cap) {
		int ncap = b->cap ? b->cap * 2 : 32;
		struct tuning_knob *nk = cm_realloc(b->p->knobs, (size_t)ncap * sizeof(*nk));
		if (!nk) {
			b->oom = true;
			memset(&dummy, 0, sizeof(dummy));
			return &dummy;
		}
		b->p->knobs = nk;
		b->cap = ncap;
	}
	struct tuning_knob *k = &b->p->knobs[b->p->n_knobs++];
	memset(k, 0, sizeof(*k));
	k->kind = kind;
	k->status = st;
	tuning_strlcpy(k->target, target ? target : "", sizeof(k->target));
	tuning_strlcpy(k->current, current ? current : "", sizeof(k->current));
	tuning_strlcpy(k->wanted, wanted ? wanted : "", sizeof(k->wanted));
	return k;
}

#define REASON(k, ...) snprintf((k)->reason, sizeof((k)->reason), __VA_ARGS__)

/* ---- workers ------------------------------------------------------------ */

struct core_pick {
	int core; /* index into r->cores */
	int node;
	int rank; /* position among the candidate cores of its node */
	bool big;
	int first; /* lowest candidate cpu */
};

/* Big cores first; then round-robin over nodes (rank is 0 unless
 * interleaving); then by node and cpu number. */
static int pick_cmp(const void *a, const void *b)
{
	const struct core_pick *x = a, *y = b;
	if (x->big != y->big)
		return x->big ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank - y->rank;
	if (x->node != y->node)
		return x->node - y->node;
	return x->first - y->first;
}

static int int_cmp(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

static int node_index(const struct tuning_report *r, int id)
{
	for (int i = 0; i < r->n_nodes; i++)
		if (r->nodes[i].id == id)
			return i;
	return -1;
}

/* Usable physical cores of a node (big ones count double so that a node
 * of big cores wins over one of LITTLE cores). */
static int node_score(const struct tuning_report *r, int ni)
{
	struct tuning_cpuset s = r->nodes[ni].cpus;
	tuning_cpuset_and(&s, &r->usable);
	int score = 0;
	struct tuning_cpuset seen;
	tuning_cpuset_zero(&seen);
	for (int c = tuning_cpuset_next(&s, 0); c >= 0 && c < r->n_cpu_slots;
	     c = tuning_cpuset_next(&s, c + 1)) {
		int k = r->cpus[c].core;
		if (k < 0 || tuning_cpuset_has(&seen, k))
			continue;
		tuning_cpuset_add(&seen, k);
		score += r->cores[k].big ? 2 : 1;
	}
	return score;
}

static void fmt_list(const struct tuning_cpuset *s, char *buf, size_t len)
{
	if (tuning_cpuset_format(s, buf, len) < 0 && len > 4)
		memcpy(buf + len - 4, "...", 4);
	if (!buf[0])
		tuning_strlcpy(buf, "none", len);
}

static void plan_numa(const struct tuning_report *r, const struct tuning_config *c,
                      struct tuning_plan *p, struct builder *b)
{
	int n_reach = 0;
	for (int i = 0; i < r->n_nodes; i++) {
		struct tuning_cpuset s = r->nodes[i].cpus;
		tuning_cpuset_and(&s, &r->usable);
		if (tuning_cpuset_count(&s) > 0 && r->nodes[i].id < 64 &&
		    ((r->mems_allowed >> r->nodes[i].id) & 1))
			n_reach++;
	}
	p->numa = TUNING_NUMA_OFF;
	p->numa_node = -1;
	p->numa_nodes = 0;
	char cur[64];
	snprintf(cur, sizeof(cur), "%d node%s", r->n_nodes, r->n_nodes == 1 ? "" : "s");
	if (n_reach <= 1) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_NUMA, TUNING_KNOB_NA, "process", cur, "-");
		REASON(k, "%s", r->n_nodes <= 1 ? "one NUMA node" : "only one node within reach");
		return;
	}
	if (c->numa == TUNING_NUMA_OFF) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_NUMA, TUNING_KNOB_OFF, "process", cur, "-");
		REASON(k, "numa off: the kernel places threads and memory");
		return;
	}
	/* the best node: the configured one, else most usable (big) cores */
	int best = -1, best_score = -1;
	for (int i = 0; i < r->n_nodes; i++) {
		int sc = node_score(r, i);
		if (sc > best_score) {
			best = i;
			best_score = sc;
		}
	}
	int want = c->numa_node >= 0 ? node_index(r, c->numa_node) : -1;
	if (want >= 0 && node_score(r, want) > 0)
		best = want;
	uint64_t need = c->model_bytes + c->kv_bytes;
	const struct tuning_node *bn = &r->nodes[best];
	char nb[32], av[32];
	tuning_fmt_bytes(nb, sizeof(nb), need);
	tuning_fmt_bytes(av, sizeof(av), bn->mem_avail);
	enum tuning_numa mode = c->numa;
	char why[200] = "";
	if (mode == TUNING_NUMA_AUTO) {
		if (need && need <= bn->mem_avail) {
			mode = TUNING_NUMA_NODE;
			snprintf(why, sizeof(why), "model + KV (%s) fit in node %d (%s available)",
			         nb, bn->id, av);
		} else {
			mode = TUNING_NUMA_INTERLEAVE;
			if (need)
				snprintf(
				    why, sizeof(why),
				    "model + KV (%s) exceed node %d's %s available: interleaved",
				    nb, bn->id, av);
			else
				snprintf(why, sizeof(why), "model size unknown: interleaved");
		}
	} else if (mode == TUNING_NUMA_NODE) {
		if (need > bn->mem_avail)
			snprintf(why, sizeof(why),
			         "model + KV (%s) exceed node %d's %s available: the rest spills "
			         "to other nodes (MPOL_PREFERRED)",
			         nb, bn->id, av);
		else
			snprintf(why, sizeof(why), "config numa=node");
	} else {
		snprintf(why, sizeof(why), "config numa=interleave");
	}
	p->numa = mode;
	char wanted[96];
	if (mode == TUNING_NUMA_NODE) {
		p->numa_node = bn->id;
		snprintf(wanted, sizeof(wanted), "workers + memory on node %d", bn->id);
	} else {
		for (int i = 0; i < r->n_nodes; i++) {
			struct tuning_cpuset s = r->nodes[i].cpus;
			tuning_cpuset_and(&s, &r->usable);
			if (tuning_cpuset_count(&s) > 0 && r->nodes[i].id < 64 &&
			    ((r->mems_allowed >> r->nodes[i].id) & 1))
				p->numa_nodes |= 1ull << r->nodes[i].id;
		}
		snprintf(wanted, sizeof(wanted), "interleave over %d nodes",
		         __builtin_popcountll(p->numa_nodes));
	}
	struct tuning_knob *k =
	    knob(b, TUNING_KNOB_NUMA, TUNING_KNOB_APPLY, "process", cur, wanted);
	if (r->mem.numa_balancing == 1)
		REASON(k,
		       "%.160s; kernel.numa_balancing=1 may migrate pages (sysctl "
		       "kernel.numa_balancing=0 to stop it)",
		       why);
	else
		REASON(k, "%s", why);
}

/* The cpus workers may take: the usable ones, on the chosen node when
 * numa=node. */
static void worker_candidates(const struct tuning_report *r, const struct tuning_plan *p,
                              struct tuning_cpuset *ret_cand)
{
	*ret_cand = r->usable;
	if (p->numa == TUNING_NUMA_NODE) {
		int ni = node_index(r, p->numa_node);
		if (ni >= 0)
			tuning_cpuset_and(ret_cand, &r->nodes[ni].cpus);
	}
}

/* Candidate cpus grouped by core: list[off[k] .. off[k]+cnt[k]); picks are
 * the cores with any candidate, in preference order. */
struct core_table {
	struct core_pick *picks;
	int *cnt, *off, *list, *node_rank;
	int n_picks, n_big, max_threads;
};

static void core_table_free(struct core_table *t)
{
	cm_free(t->picks);
	cm_free(t->cnt);
	cm_free(t->off);
	cm_free(t->list);
	cm_free(t->node_rank);
}

static int core_table_build(const struct tuning_report *r, const struct tuning_cpuset *cand,
                            int n_cand, struct core_table *t)
{
	int nc = r->n_cores;
	memset(t, 0, sizeof(*t));
	t->picks = cm_calloc((size_t)nc + 1, sizeof(*t->picks));
	t->cnt = cm_calloc((size_t)nc + 1, sizeof(int));
	t->off = cm_calloc((size_t)nc + 1, sizeof(int));
	t->list = cm_calloc((size_t)n_cand + 1, sizeof(int));
	t->node_rank = cm_calloc(TUNING_MAX_NODES + 1, sizeof(int));
	if (!t->picks || !t->cnt || !t->off || !t->list || !t->node_rank) {
		core_table_free(t);
		return -ENOMEM;
	}
	for (int cpu = tuning_cpuset_next(cand, 0); cpu >= 0 && cpu < r->n_cpu_slots;
	     cpu = tuning_cpuset_next(cand, cpu + 1))
		if (r->cpus[cpu].core >= 0)
			t->cnt[r->cpus[cpu].core]++;
	for (int k = 0; k < nc; k++)
		t->off[k + 1] = t->off[k] + t->cnt[k];
	for (int k = 0; k < nc; k++)
		t->cnt[k] = 0;
	for (int cpu = tuning_cpuset_next(cand, 0); cpu >= 0 && cpu < r->n_cpu_slots;
	     cpu = tuning_cpuset_next(cand, cpu + 1)) {
		int k = r->cpus[cpu].core;
		if (k < 0)
			continue;
		t->list[t->off[k] + t->cnt[k]++] = cpu;
		t->max_threads = CM_MAX(t->max_threads, t->cnt[k]);
	}
	return 0;
}

static void order_cores(const struct tuning_report *r, bool interleave, struct core_table *t)
{
	for (int k = 0; k < r->n_cores; k++) {
		if (!t->cnt[k])
			continue;
		struct core_pick *pk = &t->picks[t->n_picks++];
		pk->core = k;
		pk->node = r->cores[k].node;
		int nslot =
		    pk->node >= 0 && pk->node < TUNING_MAX_NODES ? pk->node : TUNING_MAX_NODES;
		pk->rank = t->node_rank[nslot]++;
		if (!interleave)
			pk->rank = 0;
		pk->big = r->cores[k].big;
		pk->first = t->list[t->off[k]];
		t->n_big += pk->big;
	}
	qsort(t->picks, (size_t)t->n_picks, sizeof(*t->picks), pick_cmp);
}

/* How many workers, with the why in p->threads_note. */
static int worker_count(const struct tuning_report *r, const struct tuning_config *c, int n_cand,
                        const struct core_table *t, struct tuning_plan *p)
{
	int n;
	char note[192];
	if (c->threads > 0) {
		n = c->threads;
		if (n > n_cand) {
			snprintf(note, sizeof(note),
			         "config threads=%d, clamped to the %d usable cpus", c->threads,
			         n_cand);
			n = n_cand;
		} else {
			snprintf(note, sizeof(note), "config threads=%d", n);
		}
		if (r->cgroup.quota_cpus && n > r->cgroup.quota_cpus) {
			size_t l = strlen(note);
			snprintf(note + l, sizeof(note) - l,
			         " (over the cgroup quota of %d cpus: "
			         "workers will be throttled)",
			         r->cgroup.quota_cpus);
		}
	} else {
		n = r->hybrid ? t->n_big : t->n_picks;
		if (r->hybrid)
			snprintf(note, sizeof(note),
			         "one per big core: %d big of %d usable cores "
			         "(LITTLE cores would slow every barrier)",
			         t->n_big, t->n_picks);
		else
			snprintf(note, sizeof(note), "one per physical core: %d usable core%s%s", n,
			         n == 1 ? "" : "s", r->smt ? " (SMT siblings not counted)" : "");
		if (r->cgroup.quota_cpus && n > r->cgroup.quota_cpus) {
			size_t l = strlen(note);
			snprintf(note + l, sizeof(note) - l,
			         ", limited by the cgroup quota "
			         "%lld/%lld us -> %d",
			         (long long)r->cgroup.quota_us, (long long)r->cgroup.period_us,
			         r->cgroup.quota_cpus);
			n = r->cgroup.quota_cpus;
		}
		if (n < 1)
			n = 1;
	}
	tuning_strlcpy(p->threads_note, note, sizeof(p->threads_note));
	return n;
}

/* One cpu per core in preference order, then further siblings.
 * *ret_cores gets the cores used, by core index. */
static void pick_workers(const struct core_table *t, int n, struct tuning_plan *p,
                         struct tuning_cpuset *ret_cores)
{
	tuning_cpuset_zero(&p->workers);
	tuning_cpuset_zero(ret_cores);
	int got = 0;
	for (int pass = 0; got < n && pass < t->max_threads; pass++) {
		for (int i = 0; i < t->n_picks && got < n; i++) {
			int k = t->picks[i].core;
			if (pass >= t->cnt[k])
				continue;
			int cpu = t->list[t->off[k] + pass];
			p->worker_cpus[got++] = cpu;
			tuning_cpuset_add(&p->workers, cpu);
			tuning_cpuset_add(ret_cores, k);
		}
	}
	p->n_workers = got;
	qsort(p->worker_cpus, (size_t)got, sizeof(int), int_cmp);
}

/* Service threads: usable cpus off the workers' cores, on the workers'
 * node first; if none, they share the workers' cpus. */
static void plan_service(const struct tuning_report *r, const struct tuning_config *c,
                         const struct tuning_cpuset *worker_cores, struct tuning_plan *p)
{
	struct tuning_cpuset spare = r->usable;
	for (int cpu = tuning_cpuset_next(&r->usable, 0); cpu >= 0 && cpu < r->n_cpu_slots;
	     cpu = tuning_cpuset_next(&r->usable, cpu + 1)) {
		int k = r->cpus[cpu].core;
		if (k >= 0 && tuning_cpuset_has(worker_cores, k))
			tuning_cpuset_del(&spare, cpu);
	}
	struct tuning_cpuset svc = spare;
	if (p->numa == TUNING_NUMA_NODE) {
		int ni = node_index(r, p->numa_node);
		if (ni >= 0) {
			tuning_cpuset_and(&svc, &r->nodes[ni].cpus);
			if (tuning_cpuset_count(&svc) == 0)
				svc = spare;
		}
	}
	p->service_shared = tuning_cpuset_count(&svc) == 0;
	if (!c->pin || p->service_shared)
		svc = r->usable;
	p->service = svc;
}

static int plan_workers(const struct tuning_report *r, const struct tuning_config *c,
                        struct tuning_plan *p, struct cm_err *err)
{
	struct tuning_cpuset cand;
	worker_candidates(r, p, &cand);
	int n_cand = tuning_cpuset_count(&cand);
	if (n_cand == 0)
		return cm_err_set(err, -ENODEV,
		                  "tuning: no usable cpu (online & affinity & cpuset "
		                  "is empty)");
	struct core_table t;
	if (core_table_build(r, &cand, n_cand, &t) < 0)
		return cm_err_set(err, -ENOMEM, "tuning: out of memory");
	order_cores(r, p->numa == TUNING_NUMA_INTERLEAVE, &t);
	int n = worker_count(r, c, n_cand, &t, p);
	struct tuning_cpuset worker_cores; /* by core index */
	pick_workers(&t, n, p, &worker_cores);
	core_table_free(&t);
	plan_service(r, c, &worker_cores, p);
	return 0;
}

/* ---- cpufreq knobs ------------------------------------------------------ */

static const char *owner_fix(const char *name)
{
	if (strcmp(name, "tuned") == 0)
		return "choose its profile instead (tuned-adm profile throughput-performance)";
	if (strcmp(name, "power-profiles-daemon") == 0)
		return "choose its profile instead (powerprofilesctl set performance)";
	if (strcmp(name, "tlp") == 0)
		return "set CPU_SCALING_GOVERNOR_ON_AC=performance in /etc/tlp.conf";
	if (strcmp(name, "cpupower") == 0)
		return "set governor= in cpupower's config (/etc/default/cpupower)";
	if (strcmp(name, "auto-cpufreq") == 0)
		return "use auto-cpufreq --force=performance";
	return "configure it instead";
}

static const char *access_fix(int e)
{
	switch (e) {
	case -EROFS:
		return "sysfs is read-only (ProtectKernelTunables=yes?): run this step as "
		       "root, e.g. ExecStartPre=+";
	case -EACCES:
	case -EPERM:
		return "needs root: run this step as root, e.g. ExecStartPre=+";
	case -ENOENT:
		return "the file is missing";
	default:
		return "not writable";
	}
}

/* First governor of "a|b|c" that the policy offers. */
static bool pick_governor(const char *want, const char *avail, char *out, size_t len)
{
	char tmp[64];
	tuning_strlcpy(tmp, want, sizeof(tmp));
	for (char *save = NULL, *g = strtok_r(tmp, "|", &save); g; g = strtok_r(NULL, "|", &save)) {
		if (!avail[0] || tuning_word_in(avail, g)) {
			tuning_strlcpy(out, g, len);
			return true;
		}
	}
	return false;
}

static void plan_cpufreq(const struct tuning_report *r, const struct tuning_config *c,
                         const struct tuning_plan *p, struct builder *b)
{
	struct tuning_cpuset used = p->workers;
	tuning_cpuset_or(&used, &p->service);
	bool gov_keep = strcmp(c->governor, "keep") == 0 || !c->governor[0];
	bool epp_keep = strcmp(c->epp, "keep") == 0 || !c->epp[0];
	if (!r->cpufreq) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_GOVERNOR, gov_keep ? TUNING_KNOB_OFF : TUNING_KNOB_NA,
		         "cpufreq", "absent", gov_keep ? "keep" : c->governor);
		REASON(k, "no cpufreq on this box (VM, container or cpufreq disabled): the "
		          "hypervisor or firmware sets the clock; nothing to do");
		k = knob(b, TUNING_KNOB_EPP, epp_keep ? TUNING_KNOB_OFF : TUNING_KNOB_NA, "cpufreq",
		         "absent", epp_keep ? "keep" : c->epp);
		REASON(k, "no cpufreq");
		return;
	}
	if (gov_keep) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_GOVERNOR, TUNING_KNOB_OFF, "cpufreq", "-", "keep");
		REASON(k, "config governor=keep");
	}
	if (epp_keep) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_EPP, TUNING_KNOB_OFF, "cpufreq", "-", "keep");
		REASON(k, "config epp=keep");
	}
	bool any_epp = false;
	const struct tuning_power_owner *o = &r->power_owner;
	/* EPP first: apply.c writes knobs in plan order and restores in
	 * reverse, and intel_pstate refuses EPP changes (EBUSY) while the
	 * governor is "performance" — so EPP must go before the governor on
	 * the way in and after it on the way out. */
	for (int pass = 0; pass < 2; pass++) {
		bool is_gov = pass == 1;
		if (is_gov ? gov_keep : epp_keep)
			continue;
		for (int i = 0; i < r->n_policies; i++) {
			const struct tuning_policy *pol = &r->policies[i];
			struct tuning_cpuset s = pol->cpus;
			tuning_cpuset_and(&s, &used);
			if (tuning_cpuset_count(&s) == 0)
				continue; /* not a cpu we use */
			if (!is_gov && !pol->has_epp)
				continue;
			any_epp |= !is_gov;
			char target[96];
			snprintf(target, sizeof(target), "devices/system/cpu/cpufreq/%s/%s",
			         pol->name,
			         is_gov ? "scaling_governor" : "energy_performance_preference");
			const char *cur = is_gov ? pol->governor : pol->epp;
			const char *want_cfg = is_gov ? c->governor : c->epp;
			char want[64];
			bool avail =
			    is_gov ? pick_governor(want_cfg, pol->governors, want, sizeof(want))
			           : (tuning_strlcpy(want, want_cfg, sizeof(want)),
			              !pol->epps[0] || tuning_word_in(pol->epps, want));
			enum tuning_knob_kind kind =
			    is_gov ? TUNING_KNOB_GOVERNOR : TUNING_KNOB_EPP;
			int acc = is_gov ? pol->gov_access : pol->epp_access;
			struct tuning_knob *k;
			if (o->found) {
				k = knob(b, kind, TUNING_KNOB_BLOCKED, target, cur,
				         avail ? want : want_cfg);
				REASON(k, "owned by %s (%s): left alone; %s", o->name, o->how,
				       owner_fix(o->name));
			} else if (!avail) {
				k = knob(b, kind, TUNING_KNOB_BLOCKED, target, cur, want_cfg);
				REASON(k, "'%.60s' not offered by %.30s (available: %.120s)",
				       want_cfg, pol->driver[0] ? pol->driver : "the driver",
				       is_gov ? pol->governors : pol->epps);
			} else if (strcmp(cur, want) == 0) {
				k = knob(b, kind, TUNING_KNOB_ALREADY, target, cur, want);
			} else if (acc < 0) {
				k = knob(b, kind, TUNING_KNOB_BLOCKED, target, cur, want);
				REASON(k, "%s", access_fix(acc));
			} else {
				k = knob(b, kind, TUNING_KNOB_APPLY, target, cur, want);
			}
		}
	}
	if (!epp_keep && !any_epp) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_EPP, TUNING_KNOB_NA, "cpufreq", "-", c->epp);
		REASON(k, "no energy_performance_preference (driver %s)",
		       r->policies[0].driver[0] ? r->policies[0].driver : "unknown");
	}
}

/* ---- the rest ----------------------------------------------------------- */

static void ioprio_str(char *buf, size_t len, int cls, int level)
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
		snprintf(buf, len, "none");
		break;
	}
}

static int check_config(const struct tuning_config *c, struct cm_err *err)
{
	if (c->threads < 0 || c->threads > TUNING_MAX_CPUS)
		return cm_err_set(err, -EINVAL, "tuning: threads %d out of range 0..%d", c->threads,
		                  TUNING_MAX_CPUS);
	if (c->nice != TUNING_KEEP && (c->nice < -20 || c->nice > 19))
		return cm_err_set(err, -EINVAL, "tuning: nice %d out of range -20..19", c->nice);
	if (c->oom_score_adj != TUNING_KEEP &&
	    (c->oom_score_adj < -1000 || c->oom_score_adj > 1000))
		return cm_err_set(err, -EINVAL, "tuning: oom_score_adj %d out of range -1000..1000",
		                  c->oom_score_adj);
	if (c->load_ioprio == TUNING_IOPRIO_BE &&
	    (c->load_ioprio_level < 0 || c->load_ioprio_level > 7))
		return cm_err_set(err, -EINVAL, "tuning: I/O priority level %d out of range 0..7",
		                  c->load_ioprio_level);
	if (c->numa_node < -1 || c->numa_node >= TUNING_MAX_NODES)
		return cm_err_set(err, -EINVAL, "tuning: numa_node %d out of range", c->numa_node);
	if ((unsigned)c->mlock > TUNING_MLOCK_ALL || (unsigned)c->numa > TUNING_NUMA_OFF ||
	    (unsigned)c->load_ioprio > TUNING_IOPRIO_IDLE)
		return cm_err_set(err, -EINVAL, "tuning: bad enum value in config");
	if (strchr(c->governor, ' '))
		return cm_err_set(err, -EINVAL, "tuning: governor '%s': no spaces", c->governor);
	/* the EPP value may end up in the state file, which holds plain words only */
	if (c->epp[0] && strcmp(c->epp, "keep") != 0 && !tuning_word_is_plain(c->epp))
		return cm_err_set(err, -EINVAL, "tuning: epp '%s': not a plain word", c->epp);
	return 0;
}

/* ---- one step per knob, in plan order ----------------------------------- */

/* The threads knob goes first in the list, ahead of the numa knob that
 * plan_numa added before the workers were known. */
static void plan_threads(const struct tuning_report *r, struct builder *b)
{
	struct tuning_plan *p = b->p;
	char cur[96], want[96];
	int n_usable = tuning_cpuset_count(&r->usable);
	snprintf(cur, sizeof(cur), "%d usable cpu%s", n_usable, n_usable == 1 ? "" : "s");
	snprintf(want, sizeof(want), "%d worker%s", p->n_workers, p->n_workers == 1 ? "" : "s");
	struct tuning_knob *k =
	    knob(b, TUNING_KNOB_THREADS, TUNING_KNOB_APPLY, "workers", cur, want);
	REASON(k, "%s", p->threads_note);
	if (!b->oom && p->n_knobs >= 2) {
		struct tuning_knob t = p->knobs[p->n_knobs - 1];
		memmove(&p->knobs[1], &p->knobs[0], (size_t)(p->n_knobs - 1) * sizeof(t));
		p->knobs[0] = t;
	}
}

/* Worker pinning and the main thread's cpus (service-cpus). */
static void plan_pinning(const struct tuning_report *r, const struct tuning_config *c,
                         struct builder *b)
{
	const struct tuning_plan *p = b->p;
	char want[96], wl[512], sl[512], al[512];
	struct tuning_knob *k;
	fmt_list(&p->workers, wl, sizeof(wl));
	fmt_list(&p->service, sl, sizeof(sl));
	fmt_list(&r->affinity, al, sizeof(al));
	if (!c->pin) {
		k = knob(b, TUNING_KNOB_PINNING, TUNING_KNOB_OFF, "workers", "unpinned",
		         "unpinned");
		REASON(k, "config pin=off");
		k = knob(b, TUNING_KNOB_AFFINITY, TUNING_KNOB_OFF, "main thread", al, al);
		REASON(k, "config pin=off");
		return;
	}
	snprintf(want, sizeof(want), "worker i -> cpus %.70s", wl);
	k = knob(b, TUNING_KNOB_PINNING, TUNING_KNOB_APPLY, "workers", "unpinned", want);
	REASON(k, "one worker per cpu, each on its own core");
	struct tuning_cpuset cur_aff = r->affinity;
	tuning_cpuset_and(&cur_aff, &r->online);
	bool same = tuning_cpuset_equal(&p->service, &cur_aff);
	k = knob(b, TUNING_KNOB_AFFINITY, same ? TUNING_KNOB_ALREADY : TUNING_KNOB_APPLY,
	         "main thread", al, sl);
	if (p->service_shared)
		REASON(k, "not enough cores to keep the scheduler and IPC threads off the "
		          "workers' cores: they share them");
	else
		REASON(k, "scheduler and IPC threads stay off the workers' cores");
}

static void plan_nice(const struct tuning_report *r, const struct tuning_config *c,
                      struct builder *b)
{
	char cur[96], want[96];
	snprintf(cur, sizeof(cur), "%d", r->nice);
	if (c->nice == TUNING_KEEP) {
		(void)knob(b, TUNING_KNOB_NICE, TUNING_KNOB_OFF, "process", cur, "keep");
		return;
	}
	snprintf(want, sizeof(want), "%d", c->nice);
	if (c->nice == r->nice) {
		(void)knob(b, TUNING_KNOB_NICE, TUNING_KNOB_ALREADY, "process", cur, want);
	} else if (c->nice < r->nice && !r->mem.cap_sys_nice && c->nice < r->mem.nice_floor) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_NICE, TUNING_KNOB_BLOCKED, "process", cur, want);
		REASON(k,
		       "lowering nice needs CAP_SYS_NICE or RLIMIT_NICE >= %d; fix: Nice=%d "
		       "in edgelmd.service",
		       20 - c->nice, c->nice);
	} else {
		(void)knob(b, TUNING_KNOB_NICE, TUNING_KNOB_APPLY, "process", cur, want);
	}
}

static void plan_sched_batch(const struct tuning_config *c, struct builder *b)
{
	struct tuning_knob *k =
	    knob(b, TUNING_KNOB_SCHED_BATCH, c->sched_batch ? TUNING_KNOB_APPLY : TUNING_KNOB_OFF,
	         "workers", "SCHED_OTHER", c->sched_batch ? "SCHED_BATCH" : "SCHED_OTHER");
	if (c->sched_batch)
		REASON(k, "set by the daemon around the pool's creation");
}

/* I/O priority while the model loads. */
static void plan_ioprio(const struct tuning_report *r, const struct tuning_config *c,
                        struct builder *b)
{
	char cur[96], want[96];
	ioprio_str(cur, sizeof(cur), r->ioprio_class, r->ioprio_level);
	if (c->load_ioprio == TUNING_IOPRIO_KEEP) {
		(void)knob(b, TUNING_KNOB_IOPRIO, TUNING_KNOB_OFF, "model loading", cur, "keep");
		return;
	}
	ioprio_str(want, sizeof(want),
	           c->load_ioprio == TUNING_IOPRIO_IDLE ? TUNING_IOPRIO_CLASS_IDLE
	                                                : TUNING_IOPRIO_CLASS_BE,
	           c->load_ioprio_level);
	struct tuning_knob *k =
	    knob(b, TUNING_KNOB_IOPRIO, TUNING_KNOB_APPLY, "model loading", cur, want);
	REASON(k, "only while the model loads, then restored");
}

static void plan_oom_score_adj(const struct tuning_report *r, const struct tuning_config *c,
                               struct builder *b)
{
	char cur[96], want[96];
	if (r->oom_score_adj == TUNING_KEEP)
		snprintf(cur, sizeof(cur), "unknown");
	else
		snprintf(cur, sizeof(cur), "%d", r->oom_score_adj);
	if (c->oom_score_adj == TUNING_KEEP) {
		(void)knob(b, TUNING_KNOB_OOM_SCORE_ADJ, TUNING_KNOB_OFF, "process", cur, "keep");
		return;
	}
	snprintf(want, sizeof(want), "%d", c->oom_score_adj);
	if (c->oom_score_adj == r->oom_score_adj) {
		(void)knob(b, TUNING_KNOB_OOM_SCORE_ADJ, TUNING_KNOB_ALREADY, "process", cur, want);
	} else if (r->oom_score_adj != TUNING_KEEP && c->oom_score_adj < r->oom_score_adj &&
	           !r->mem.cap_sys_resource) {
		struct tuning_knob *k =
		    knob(b, TUNING_KNOB_OOM_SCORE_ADJ, TUNING_KNOB_BLOCKED, "process", cur, want);
		REASON(k,
		       "lowering it needs CAP_SYS_RESOURCE; fix: OOMScoreAdjust=%d in "
		       "edgelmd.service",
		       c->oom_score_adj);
	} else {
		(void)knob(b, TUNING_KNOB_OOM_SCORE_ADJ, TUNING_KNOB_APPLY, "process", cur, want);
	}
}

static void plan_mlock(const struct tuning_report *r, const struct tuning_config *c,
                       struct builder *b)
{
	uint64_t need = c->model_bytes + c->kv_bytes;
	char cur[96], want[96], lim[32], nb[32];
	if (r->mem.memlock_unlimited)
		snprintf(lim, sizeof(lim), "unlimited");
	else
		tuning_fmt_bytes(lim, sizeof(lim), r->mem.memlock_limit);
	tuning_fmt_bytes(nb, sizeof(nb), need);
	snprintf(cur, sizeof(cur), "RLIMIT_MEMLOCK %s%s", lim,
	         r->mem.cap_ipc_lock ? ", CAP_IPC_LOCK" : "");
	if (c->mlock == TUNING_MLOCK_OFF) {
		(void)knob(b, TUNING_KNOB_MLOCK, TUNING_KNOB_OFF, "weights+kv", cur, "off");
		return;
	}
	const char *what = c->mlock == TUNING_MLOCK_ALL ? "mlockall" : "lock weights+KV";
	if (need)
		snprintf(want, sizeof(want), "%s (%s)", what, nb);
	else
		snprintf(want, sizeof(want), "%s", what);
	bool ok = r->mem.cap_ipc_lock || r->mem.memlock_unlimited ||
	          (need && r->mem.memlock_limit >= need);
	struct tuning_knob *k =
	    knob(b, TUNING_KNOB_MLOCK, ok ? TUNING_KNOB_APPLY : TUNING_KNOB_BLOCKED, "weights+kv",
	         cur, want);
	if (!ok)
		REASON(k,
		       "RLIMIT_MEMLOCK is %s and CAP_IPC_LOCK is missing%s; fix: "
		       "LimitMEMLOCK=infinity in edgelmd.service",
		       lim, need ? "" : " (model size unknown)");
}

static void plan_hugepages(const struct tuning_report *r, const struct tuning_config *c,
                           struct builder *b)
{
	char cur[96], want[96], nb[32];
	struct tuning_knob *k;
	snprintf(cur, sizeof(cur), "THP %s", r->mem.thp_enabled[0] ? r->mem.thp_enabled : "absent");
	if (!c->hugepages) {
		k = knob(b, TUNING_KNOB_HUGEPAGES, TUNING_KNOB_OFF, "weights", cur, "off");
		REASON(k, "the copy costs RSS; measure with edgelm-bench before turning it on");
	} else if (strcmp(r->mem.thp_enabled, "always") != 0 &&
	           strcmp(r->mem.thp_enabled, "madvise") != 0) {
		k = knob(b, TUNING_KNOB_HUGEPAGES, TUNING_KNOB_BLOCKED, "weights", cur,
		         "2 MiB pages");
		REASON(k,
		       "transparent huge pages are %s; fix: echo madvise > "
		       "/sys/kernel/mm/transparent_hugepage/enabled",
		       r->mem.thp_enabled[0] ? r->mem.thp_enabled : "not built in");
	} else {
		if (c->model_bytes) {
			tuning_fmt_bytes(nb, sizeof(nb), c->model_bytes);
			snprintf(want, sizeof(want), "copy to 2 MiB pages (+%s RSS)", nb);
		} else {
			snprintf(want, sizeof(want), "copy to 2 MiB pages (+model size RSS)");
		}
		k = knob(b, TUNING_KNOB_HUGEPAGES, TUNING_KNOB_APPLY, "weights", cur, want);
		REASON(k, "a read-only file mapping gets no huge pages: the weights are copied "
		          "to anonymous memory with MADV_HUGEPAGE");
	}
}

static void plan_prefault(const struct tuning_config *c, struct builder *b)
{
	(void)knob(b, TUNING_KNOB_PREFAULT, c->prefault ? TUNING_KNOB_APPLY : TUNING_KNOB_OFF,
	           "weights", "on demand", c->prefault ? "populate at load" : "on demand");
}

static void plan_amx(const struct tuning_report *r, const struct tuning_config *c,
                     struct builder *b)
{
	struct tuning_knob *k;
	if (!r->cpu.isa.amx_tile) {
		k = knob(b, TUNING_KNOB_AMX, TUNING_KNOB_NA, "process", "-", "-");
		REASON(k, "%s",
		       r->cpu.cpu_has.amx_tile ? "the OS does not enable AMX state (XCR0)"
		                               : "this CPU has no AMX");
	} else if (!c->amx) {
		(void)knob(b, TUNING_KNOB_AMX, TUNING_KNOB_OFF, "process", "-", "-");
	} else if (r->cpu.amx_permitted) {
		(void)knob(b, TUNING_KNOB_AMX, TUNING_KNOB_ALREADY, "process", "permitted",
		           "permitted");
	} else {
		k = knob(b, TUNING_KNOB_AMX, TUNING_KNOB_APPLY, "process", "not permitted",
		         "permitted");
		REASON(k, "arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)");
	}
}

int tuning_plan_make(const struct tuning_report *r, const struct tuning_config *c,
                     struct tuning_plan *ret_plan, struct cm_err *err)
{
	int ret = check_config(c, err);
	if (ret < 0)
		return ret;
	struct tuning_plan *p = ret_plan;
	tuning_plan_fini(p);
	p->cfg = *c;
	p->pin = c->pin;
	struct builder b = {p, 0, false};

	plan_numa(r, c, p, &b);
	if ((ret = plan_workers(r, c, p, err)) < 0) {
		tuning_plan_fini(p);
		return ret;
	}
	plan_threads(r, &b);
	plan_pinning(r, c, &b);
	plan_cpufreq(r, c, p, &b);
	plan_nice(r, c, &b);
	plan_sched_batch(c, &b);
	plan_ioprio(r, c, &b);
	plan_oom_score_adj(r, c, &b);
	plan_mlock(r, c, &b);
	plan_hugepages(r, c, &b);
	plan_prefault(c, &b);
	plan_amx(r, c, &b);
	if (b.oom) {
		tuning_plan_fini(p);
		return cm_err_set(err, -ENOMEM, "tuning: out of memory");
	}
	return 0;
}
