/* daemon/policy.h: the batching policy, as a pure unit (no threads, no
 * engine, no locks: the scheduler calls it under its own lock).
 *
 * - Tenants: every request belongs to an identity ("uid:1000" over ipc://,
 *   "anonymous" where the transport tells none). Identities share the
 *   daemon by weighted round robin (stride scheduling): each has a pass
 *   that grows by 1/weight per admission and by tokens/weight per prefill
 *   share, and the lowest pass goes first. A tenant that was idle starts at
 *   the current virtual time, so idleness earns no credit.
 * - The admission queue: one queue per tenant, each ordered by priority,
 *   then arrival; policy_next picks the tenant, then its first request.
 * - Prefill shares: which prompt tokens a step carries (policy_prefill).
 * - The prefix cache's slot choice (policy_pick_slot).
 * - The prompt chunk, steered by measured step times (policy_chunk_*). */
#ifndef EDGELM_DAEMON_POLICY_H
#define EDGELM_DAEMON_POLICY_H

#include "common/common.h"

#include <stdbool.h>
#include <stdint.h>

#define POLICY_NAME_MAX 64     /* bytes of an identity, NUL included */
#define POLICY_MAX_TENANTS 1024 /* identities with live requests at once */
#define POLICY_MAX_WEIGHTS 64   /* entries of tenant_weights */

/* Prompt rules (see policy_prefill). */
#define POLICY_PREFILL_CHUNK_MIN 4 /* prompt tokens per step at least */
#define POLICY_SHORT_PROMPT 32     /* prompts this short go in whole */
#define POLICY_STEP_FACTOR 1.0     /* a step with prompt tokens may take this many decode steps */
#define POLICY_PREFILL_MAX_WAIT 2  /* steps in a row a long prompt may be passed over */

/* A queued request, embedded in the daemon's request. */
struct policy_item {
	int tenant;
	int priority;    /* -10..10, higher first */
	uint64_t seq_no; /* arrival order, set by policy_enqueue */
	struct policy_item *next;
	bool queued;
};

struct policy_tenant {
	char name[POLICY_NAME_MAX];
	double weight;
	double pass_admit, pass_prefill;
	int n_live; /* references (requests), policy_tenant_get/put */
	int n_queued;
	uint64_t last_prefill_plan; /* plan number it last took part in */
	struct policy_item *head;
};

struct policy_weight {
	char name[POLICY_NAME_MAX];
	double weight;
};

struct policy {
	struct policy_tenant *tenants;
	int n_tenants, cap_tenants;
	struct policy_weight weights[POLICY_MAX_WEIGHTS];
	int n_weights;
	double vtime_admit, vtime_prefill;
	uint64_t seq_counter, plan_counter;
	int n_queued;
};

int policy_init(struct policy *p, struct cm_err *err);
void policy_fini(struct policy *p);

/* Parse "NAME=W[,NAME=W]..." (W > 0, up to 1000; "" for none) into `ret`
 * (may be NULL to only check). NAME is an identity as policy_identity
 * makes it ("uid:N", "anonymous") or a plain uid or user name, which
 * becomes "uid:N". */
int policy_weights_parse(const char *spec, struct policy_weight *ret, int *ret_n,
			 struct cm_err *err);
/* Replace the weights; tenants already known take theirs at once. */
void policy_set_weights(struct policy *p, const struct policy_weight *w, int n);

/* The identity of a peer: "uid:N" for uid >= 0, else "anonymous". */
void policy_identity(int64_t uid, char *buf, size_t cap);

/* The tenant of `name` (created with its weight if new), one reference
 * taken. -ENOSPC when POLICY_MAX_TENANTS identities are live. */
int policy_tenant_get(struct policy *p, const char *name);
void policy_tenant_put(struct policy *p, int tenant);
/* The live tenant of `name`, no reference taken; -1 if none. */
int policy_tenant_find(const struct policy *p, const char *name);
const char *policy_tenant_name(const struct policy *p, int tenant);

/* Queue an item (its tenant and priority set); remove one from anywhere. */
void policy_enqueue(struct policy *p, struct policy_item *it);
void policy_dequeue(struct policy *p, struct policy_item *it);
/* The next item to admit, removed from its queue: the tenant with the
 * lowest pass, then its best item; NULL when nothing is queued. */
struct policy_item *policy_next(struct policy *p);
/* Visit every queued item (cb may policy_dequeue the item it is given). */
void policy_foreach(struct policy *p, void (*cb)(struct policy_item *it, void *user), void *user);

/* One sequence in prefill, as policy_prefill sees it. */
struct policy_prefill_seq {
	int tenant;
	int left;     /* prompt tokens not yet fed */
	int *n_waited; /* in/out: steps in a row it was passed over */
	int take;     /* out: tokens this step carries */
	void *user;   /* the caller's */
};

/* Hand out up to `budget` prompt tokens (the chunk) within `room` (the
 * batch): tenants by their prefill pass, and within a tenant shortest
 * remaining first; a short prompt (<= POLICY_SHORT_PROMPT) goes in whole
 * past the chunk; a step that completes prompts carries no partial chunk
 * of a longer one, unless that one was passed over POLICY_PREFILL_MAX_WAIT
 * steps in a row. Sets each seq's take; returns the total; *ret_chunked
 * tells whether a prompt was cut. `seqs` is reordered. */
int policy_prefill(struct policy *p, struct policy_prefill_seq *seqs, int n, int budget, int room,
		   bool *ret_chunked);

/* A KV slot as the prefix cache sees it. */
struct policy_slot {
	bool busy;
	const int32_t *tokens;
	int n_tokens;
	uint64_t last_used;
};
/* The free slot whose KV shares the longest prefix with the prompt (the
 * least recently used among equals, and among all when prefix is false);
 * -1 if none is free. *ret_reuse: the prompt tokens it holds, at most
 * n_prompt - 1 (the last prompt token must be computed for its logits). */
int policy_pick_slot(const struct policy_slot *slots, int n, const int32_t *prompt, int n_prompt,
		     bool prefix, int *ret_reuse);

/* The prompt chunk: steered so that a step carrying prompt tokens lasts
 * about POLICY_STEP_FACTOR plain decode steps. */
struct policy_chunk {
	double t1;        /* recent duration of a plain decode step (s), 0: unknown */
	double chunk_cur; /* prompt tokens a step may carry */
};
int policy_chunk_size(const struct policy_chunk *c, int cfg_chunk, int n_decode);
void policy_chunk_update(struct policy_chunk *c, int cfg_chunk, double dt, int n_prefill, int n,
			 bool chunked);

#endif
