/* daemon/policy.c: tenants, the admission queue, prefill shares, the
 * prefix cache's slot choice and the prompt chunk (policy.h). */
#include "daemon/policy.h"

#include <ctype.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int policy_init(struct policy *p, struct cm_err *err)
{
	memset(p, 0, sizeof(*p));
	p->cap_tenants = 16;
	p->tenants = cm_calloc((size_t)p->cap_tenants, sizeof(*p->tenants));
	if (!p->tenants)
		return cm_err_set(err, -ENOMEM, "out of memory");
	return 0;
}

void policy_fini(struct policy *p)
{
	cm_free(p->tenants);
	memset(p, 0, sizeof(*p));
}

void policy_identity(int64_t uid, char *buf, size_t cap)
{
	if (uid >= 0)
		snprintf(buf, cap, "uid:%lld", (long long)uid);
	else
		snprintf(buf, cap, "anonymous");
}

/* NAME as written in tenant_weights -> an identity. */
static int weight_name(const char *s, size_t len, char *out, struct cm_err *err)
{
	char name[POLICY_NAME_MAX - 4]; /* room for "uid:" */
	if (len == 0 || len >= sizeof(name))
		return cm_err_set(err, -EINVAL, "tenant_weights: bad name '%.*s'", (int)len, s);
	memcpy(name, s, len);
	name[len] = '\0';
	bool digits = true;
	for (size_t i = 0; i < len; i++)
		digits &= isdigit((unsigned char)name[i]) != 0;
	if (digits) {
		snprintf(out, POLICY_NAME_MAX, "uid:%s", name);
		return 0;
	}
	if (strchr(name, ':') || strcmp(name, "anonymous") == 0) {
		snprintf(out, POLICY_NAME_MAX, "%s", name);
		return 0;
	}
	struct passwd pw, *res = NULL;
	char buf[4096];
	if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) != 0 || !res)
		return cm_err_set(err, -ENOENT,
				  "tenant_weights: '%s' is not a user, a uid or an identity "
				  "(uid:N, anonymous)",
				  name);
	policy_identity(res->pw_uid, out, POLICY_NAME_MAX);
	return 0;
}

int policy_weights_parse(const char *spec, struct policy_weight *ret, int *ret_n,
			 struct cm_err *err)
{
	int n = 0;
	const char *s = spec;
	while (*s) {
		while (*s == ',' || *s == ' ')
			s++;
		if (!*s)
			break;
		const char *eq = strchr(s, '='), *end = s + strcspn(s, ", ");
		if (!eq || eq > end)
			return cm_err_set(err, -EINVAL, "tenant_weights: '%.*s' is not NAME=WEIGHT",
					  (int)(end - s), s);
		if (n >= POLICY_MAX_WEIGHTS)
			return cm_err_set(err, -EINVAL, "tenant_weights: more than %d entries",
					  POLICY_MAX_WEIGHTS);
		struct policy_weight w;
		int r = weight_name(s, (size_t)(eq - s), w.name, err);
		if (r)
			return r;
		char num[32];
		size_t nl = (size_t)(end - eq - 1);
		if (nl == 0 || nl >= sizeof(num))
			return cm_err_set(err, -EINVAL, "tenant_weights: bad weight for %s", w.name);
		memcpy(num, eq + 1, nl);
		num[nl] = '\0';
		char *e;
		w.weight = strtod(num, &e);
		if (*e || !(w.weight > 0 && w.weight <= 1000))
			return cm_err_set(err, -EINVAL,
					  "tenant_weights: weight '%s' of %s is not in (0, 1000]", num,
					  w.name);
		if (ret)
			ret[n] = w;
		n++;
		s = end;
	}
	if (ret_n)
		*ret_n = n;
	return 0;
}

static double weight_of(const struct policy *p, const char *name)
{
	for (int i = 0; i < p->n_weights; i++)
		if (strcmp(p->weights[i].name, name) == 0)
			return p->weights[i].weight;
	return 1.0;
}

void policy_set_weights(struct policy *p, const struct policy_weight *w, int n)
{
	n = CM_MIN(n, POLICY_MAX_WEIGHTS);
	memcpy(p->weights, w, (size_t)n * sizeof(*w));
	p->n_weights = n;
	for (int i = 0; i < p->n_tenants; i++)
		p->tenants[i].weight = weight_of(p, p->tenants[i].name);
}

int policy_tenant_get(struct policy *p, const char *name)
{
	int free_i = -1;
	for (int i = 0; i < p->n_tenants; i++) {
		struct policy_tenant *t = &p->tenants[i];
		if (t->n_live > 0 && strcmp(t->name, name) == 0) {
			t->n_live++;
			return i;
		}
		if (t->n_live == 0 && free_i < 0)
			free_i = i;
	}
	if (free_i < 0) {
		if (p->n_tenants >= POLICY_MAX_TENANTS)
			return -ENOSPC;
		if (p->n_tenants == p->cap_tenants) {
			int cap = p->cap_tenants * 2;
			struct policy_tenant *nt =
			    cm_realloc(p->tenants, (size_t)cap * sizeof(*nt));
			if (!nt)
				return -ENOMEM;
			p->tenants = nt;
			p->cap_tenants = cap;
		}
		free_i = p->n_tenants++;
	}
	struct policy_tenant *t = &p->tenants[free_i];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->weight = weight_of(p, name);
	/* a new identity starts now: no credit for the time it was away */
	t->pass_admit = p->vtime_admit;
	t->pass_prefill = p->vtime_prefill;
	t->n_live = 1;
	return free_i;
}

void policy_tenant_put(struct policy *p, int tenant)
{
	if (tenant >= 0 && tenant < p->n_tenants && p->tenants[tenant].n_live > 0)
		p->tenants[tenant].n_live--;
}

int policy_tenant_find(const struct policy *p, const char *name)
{
	for (int i = 0; i < p->n_tenants; i++)
		if (p->tenants[i].n_live > 0 && strcmp(p->tenants[i].name, name) == 0)
			return i;
	return -1;
}

const char *policy_tenant_name(const struct policy *p, int tenant)
{
	return tenant >= 0 && tenant < p->n_tenants ? p->tenants[tenant].name : "?";
}

/* a before b in a tenant's queue */
static bool item_before(const struct policy_item *a, const struct policy_item *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority;
	return a->seq_no < b->seq_no;
}

void policy_enqueue(struct policy *p, struct policy_item *it)
{
	struct policy_tenant *t = &p->tenants[it->tenant];
	it->seq_no = ++p->seq_counter;
	if (t->n_queued == 0 && t->pass_admit < p->vtime_admit)
		t->pass_admit = p->vtime_admit;
	struct policy_item **pp = &t->head;
	while (*pp && !item_before(it, *pp))
		pp = &(*pp)->next;
	it->next = *pp;
	*pp = it;
	it->queued = true;
	t->n_queued++;
	p->n_queued++;
}

void policy_dequeue(struct policy *p, struct policy_item *it)
{
	if (!it->queued)
		return;
	struct policy_tenant *t = &p->tenants[it->tenant];
	for (struct policy_item **pp = &t->head; *pp; pp = &(*pp)->next)
		if (*pp == it) {
			*pp = it->next;
			break;
		}
	it->next = NULL;
	it->queued = false;
	t->n_queued--;
	p->n_queued--;
}

struct policy_item *policy_next(struct policy *p)
{
	struct policy_tenant *best = NULL;
	for (int i = 0; i < p->n_tenants; i++) {
		struct policy_tenant *t = &p->tenants[i];
		if (!t->head)
			continue;
		/* equal passes: the earlier arrival, so one tenant is plain FIFO */
		if (!best || t->pass_admit < best->pass_admit ||
		    (t->pass_admit == best->pass_admit && item_before(t->head, best->head)))
			best = t;
	}
	if (!best)
		return NULL;
	struct policy_item *it = best->head;
	policy_dequeue(p, it);
	p->vtime_admit = best->pass_admit;
	best->pass_admit += 1.0 / best->weight;
	return it;
}

void policy_foreach(struct policy *p, void (*cb)(struct policy_item *it, void *user), void *user)
{
	for (int i = 0; i < p->n_tenants; i++)
		for (struct policy_item *it = p->tenants[i].head, *next; it; it = next) {
			next = it->next;
			cb(it, user);
		}
}

/* ---- prefill shares -------------------------------------------------------- */

static bool seq_before(const struct policy *p, const struct policy_prefill_seq *a,
		       const struct policy_prefill_seq *b)
{
	double pa = p->tenants[a->tenant].pass_prefill, pb = p->tenants[b->tenant].pass_prefill;
	if (pa != pb)
		return pa < pb;
	return a->left < b->left;
}

int policy_prefill(struct policy *p, struct policy_prefill_seq *seqs, int n, int budget, int room,
		   bool *ret_chunked)
{
	const int chunk = budget;
	uint64_t plan = ++p->plan_counter;
	/* tenants back after a pause start at the current virtual time */
	for (int i = 0; i < n; i++) {
		struct policy_tenant *t = &p->tenants[seqs[i].tenant];
		if (t->last_prefill_plan + 1 < plan && t->pass_prefill < p->vtime_prefill)
			t->pass_prefill = p->vtime_prefill;
		t->last_prefill_plan = plan;
		seqs[i].take = 0;
	}
	/* insertion sort: the tenant with the lowest pass first, then the
	 * shortest remaining prompt */
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && seq_before(p, &seqs[j], &seqs[j - 1]); j--) {
			struct policy_prefill_seq t = seqs[j];
			seqs[j] = seqs[j - 1];
			seqs[j - 1] = t;
		}
	/* A short prompt goes in whole, past the chunk: it costs about what a
	 * decode token does, and its step is its first token. A step that
	 * completes prompts carries no partial chunk of a longer one, so the
	 * short request's first token costs what it costs on an idle daemon;
	 * after POLICY_PREFILL_MAX_WAIT such steps in a row the long prompt
	 * takes its chunk anyway, so short prompts cannot starve it. */
	int added = 0, completed = 0;
	for (int i = 0; i < n && room > 0; i++) {
		struct policy_prefill_seq *q = &seqs[i];
		int take;
		if (q->left <= POLICY_SHORT_PROMPT && q->left <= room) {
			take = q->left;
		} else if ((completed > 0 || budget <= 0) &&
			   *q->n_waited < POLICY_PREFILL_MAX_WAIT) {
			(*q->n_waited)++;
			break;
		} else {
			take = CM_MIN(q->left, CM_MIN(CM_MAX(budget, chunk), room));
		}
		*q->n_waited = 0;
		completed += take == q->left;
		*ret_chunked |= take < q->left;
		q->take = take;
		p->tenants[q->tenant].pass_prefill += take / p->tenants[q->tenant].weight;
		budget -= take;
		room -= take;
		added += take;
	}
	double vmin = -1;
	for (int i = 0; i < n; i++) {
		double v = p->tenants[seqs[i].tenant].pass_prefill;
		if (vmin < 0 || v < vmin)
			vmin = v;
	}
	if (vmin > p->vtime_prefill)
		p->vtime_prefill = vmin;
	return added;
}

/* ---- the prefix cache ------------------------------------------------------ */

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
	int n = CM_MIN(na, nb), i = 0;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

int policy_pick_slot(const struct policy_slot *slots, int n, const int32_t *prompt, int n_prompt,
		     bool prefix, int *ret_reuse)
{
	int best = -1, best_len = -1;
	for (int i = 0; i < n; i++) {
		const struct policy_slot *sl = &slots[i];
		if (sl->busy)
			continue;
		int c = prefix ? common_prefix(sl->tokens, sl->n_tokens, prompt, n_prompt) : 0;
		if (c > best_len || (c == best_len && sl->last_used < slots[best].last_used)) {
			best = i;
			best_len = c;
		}
	}
	if (best >= 0)
		*ret_reuse = CM_MAX(0, CM_MIN(best_len, n_prompt - 1));
	return best;
}

/* ---- the prompt chunk -------------------------------------------------------- */

int policy_chunk_size(const struct policy_chunk *c, int cfg_chunk, int n_decode)
{
	/* A step's cost is far from linear in its tokens (a few tokens cost
	 * what one does: the weights are read once), so the chunk follows the
	 * measured step times rather than a cost model. Until a plain decode
	 * step has been seen, a small chunk beside running decodes. */
	if (c->t1 > 0)
		return (int)CM_MIN((double)cfg_chunk,
				   CM_MAX(c->chunk_cur, (double)POLICY_PREFILL_CHUNK_MIN));
	if (n_decode > 0)
		return CM_MIN(cfg_chunk, 4 * POLICY_PREFILL_CHUNK_MIN);
	return cfg_chunk;
}

void policy_chunk_update(struct policy_chunk *c, int cfg_chunk, double dt, int n_prefill, int n,
			 bool chunked)
{
	if (n_prefill == 0 && n <= 2) { /* a plain decode step */
		if (c->t1 <= 0)
			c->chunk_cur = 4 * POLICY_PREFILL_CHUNK_MIN; /* start small, grow */
		c->t1 = c->t1 > 0 ? 0.8 * c->t1 + 0.2 * dt : dt;
	}
	if (c->t1 > 0 && chunked && dt > 0) {
		double f = POLICY_STEP_FACTOR * c->t1 / dt;
		c->chunk_cur *= CM_MAX(0.5, CM_MIN(1.25, f));
		c->chunk_cur = CM_MAX((double)POLICY_PREFILL_CHUNK_MIN,
				      CM_MIN(c->chunk_cur, (double)cfg_chunk));
	}
}
