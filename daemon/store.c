/* daemon/store.c: the request store (serve.h): ids per identity, generated
 * text and its publication, stop strings, held polls, finishing. Every
 * function here runs under d->mu and builds replies into an outbox list;
 * none of them encodes or sends. */
#include "daemon/log.h"
#include "daemon/serve.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void req_free(struct daemon_request *r)
{
	if (!r)
		return;
	cm_free(r->prompt_text);
	cm_free(r->prompt);
	for (int i = 0; i < r->n_stop; i++)
		cm_free(r->stop[i]);
	cm_free(r->stop);
	cm_free(r->stop_len);
	cm_free(r->bias_ids);
	cm_free(r->bias);
	cm_free(r->lp);
	cm_free(r->lp_pool);
	engine_sampler_free(r->smp);
	if (r->grammar) /* after the sampler that borrows it */
		gcache_put(&r->s->grammars, r->grammar);
	cm_free(r->gbnf);
	cm_free(r->gen);
	cm_free(r->fail_msg);
	cm_free(r->emb_tok);
	cm_free(r->emb_off);
	cm_free(r->emb_acc);
	cm_free(r->emb_block);
	cm_free(r);
}

/* Another identity's id is as absent as one that never existed: the same
 * `not_found`, so ids cannot be probed across identities. */
struct daemon_request *store_find(struct sched *s, int tenant, bool admin, const char *id)
{
	if (!id)
		return NULL;
	for (struct daemon_request *r = s->table; r; r = r->next)
		if ((admin || r->tenant == tenant) && strcmp(r->id, id) == 0)
			return r;
	return NULL;
}

void store_add(struct sched *s, struct daemon_request *r)
{
	r->next = s->table;
	s->table = r;
	r->in_table = true;
}

void store_maybe_free(struct sched *s, struct daemon_request *r)
{
	if (r->in_table || r->in_slot || r->state == RQ_PREPARING)
		return;
	policy_tenant_put(&s->pol, r->tenant);
	req_free(r);
}

void store_unlist(struct sched *s, struct daemon_request *r)
{
	if (r->in_table) {
		for (struct daemon_request **p = &s->table; *p; p = &(*p)->next)
			if (*p == r) {
				*p = r->next;
				break;
			}
		r->in_table = false;
	}
	store_maybe_free(s, r);
}

int store_n_streams(struct sched *s)
{
	int n = 0;
	for (struct daemon_request *r = s->table; r; r = r->next)
		n += r->stream;
	return n;
}

void store_count(struct daemon *d, enum ipc_op op, const char *outcome)
{
	if (!d->fam_requests)
		return;
	const char *name = ipc_op_name(op);
	const char *vals[2] = {name ? name : "unknown", outcome};
	monitor_series *ser = NULL;
	if (monitor_series_get(d->fam_requests, vals, &ser, NULL) == 0 && ser)
		monitor_counter_inc(ser);
}

static double ms_between(uint64_t a, uint64_t b)
{
	return a && b && b >= a ? (double)(b - a) / 1e6 : NAN;
}

static void fill_stats(const struct daemon_request *r, struct ipc_usage *u, struct ipc_timings *t)
{
	u->prompt_tokens = r->n_prompt;
	u->cached_tokens = r->n_cached;
	u->completion_tokens = r->n_gen;
	t->queue_ms = ms_between(r->arrival_ns, r->admit_ns);
	t->ttft_ms = ms_between(r->arrival_ns, r->first_ns);
	t->prefill_ms = ms_between(r->admit_ns, r->prefill_end_ns);
	t->decode_ms = ms_between(r->prefill_end_ns, r->end_ns);
	t->total_ms = ms_between(r->arrival_ns, r->end_ns);
	int computed = r->n_prompt - r->n_cached;
	t->prefill_tps = t->prefill_ms > 0 ? computed / (t->prefill_ms / 1e3) : NAN;
	t->decode_tps =
	    t->decode_ms > 0 && r->n_gen > 1 ? (r->n_gen - 1) / (t->decode_ms / 1e3) : NAN;
}

/* ---- generated text -------------------------------------------------------- */

int store_gen_append(struct daemon_request *r, const char *p, size_t n)
{
	if (r->gen_len + n + 1 > r->gen_cap) {
		size_t cap = r->gen_cap ? r->gen_cap * 2 : 256;
		while (cap < r->gen_len + n + 1)
			cap *= 2;
		char *g = cm_realloc(r->gen, cap);
		if (!g)
			return -ENOMEM;
		r->gen = g;
		r->gen_cap = cap;
	}
	memcpy(r->gen + r->gen_len, p, n);
	r->gen_len += n;
	r->gen[r->gen_len] = '\0';
	return 0;
}

static int lp_pool_put(struct daemon_request *r, const char *p, size_t n, struct lp_piece *out)
{
	if (n > UINT16_MAX)
		n = UINT16_MAX;
	if (r->lp_pool_len + n > r->lp_pool_cap) {
		size_t cap = CM_MAX(r->lp_pool_cap * 2, r->lp_pool_len + n + 1024);
		if (cap > UINT32_MAX)
			return -E2BIG;
		char *q = cm_realloc(r->lp_pool, cap);
		if (!q)
			return -ENOMEM;
		r->lp_pool = q;
		r->lp_pool_cap = cap;
	}
	memcpy(r->lp_pool + r->lp_pool_len, p, n);
	out->off = (uint32_t)r->lp_pool_len;
	out->len = (uint16_t)n;
	r->lp_pool_len += n;
	return 0;
}

int store_lp_add(struct daemon_request *r, const struct lp_entry *e, const char *const *pieces)
{
	if (r->n_lp == r->cap_lp) {
		size_t cap = r->cap_lp ? r->cap_lp * 2 : 64;
		struct lp_entry *l = cm_realloc(r->lp, cap * sizeof(*l));
		if (!l)
			return -ENOMEM;
		r->lp = l;
		r->cap_lp = cap;
	}
	struct lp_entry *d = &r->lp[r->n_lp];
	*d = *e;
	d->text_end = LP_PENDING;
	/* pieces[0]: the token's, then the alternatives' (lengths in e) */
	if (lp_pool_put(r, pieces[0], e->tok.len, &d->tok) != 0)
		return -ENOMEM;
	for (int k = 0; k < e->n_top; k++)
		if (lp_pool_put(r, pieces[1 + k], e->top[k].len, &d->top[k]) != 0)
			return -ENOMEM;
	r->n_lp++;
	return 0;
}

void store_lp_settle(struct daemon_request *r)
{
	for (; r->lp_pending < r->n_lp; r->lp_pending++)
		r->lp[r->lp_pending].text_end = (uint32_t)CM_MIN(r->gen_len, (size_t)UINT32_MAX - 1);
}

/* The first entry whose text ends after `at` (entries' ends never
 * decrease: settled ones take gen_len as it grows, the pending ones after
 * them are LP_PENDING). */
static size_t lp_after(const struct daemon_request *r, uint64_t at)
{
	size_t lo = 0, hi = r->n_lp;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (r->lp[mid].text_end > at)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* The logprobs a reply carries: entries whose text ends in (ack, upto],
 * or, once finished, every entry whose text ends after ack (text cut by a
 * stop string, held by the detokenizer); a first poll (ack 0) takes the
 * entries from the start. One range, found by bisection: a poll answered
 * under the lock at every token must not walk the whole stream. Copied
 * into m (m->lp). */
static int reply_logprobs(struct outbox_msg *m, const struct daemon_request *r, uint64_t ack,
			  uint64_t upto, bool done, const struct ipc_logprob **ret, size_t *ret_n)
{
	size_t from = ack == 0 ? 0 : lp_after(r, ack);
	size_t to = done ? r->n_lp : lp_after(r, upto);
	size_t n = to > from ? to - from : 0, n_top = 0, bytes = 0;
	for (size_t i = from; i < from + n; i++) {
		const struct lp_entry *e = &r->lp[i];
		n_top += e->n_top;
		bytes += e->tok.len;
		for (int k = 0; k < e->n_top; k++)
			bytes += e->top[k].len;
	}
	*ret = NULL;
	*ret_n = 0;
	if (n == 0)
		return 0;
	size_t sz = n * sizeof(struct ipc_logprob) + n_top * sizeof(struct ipc_logprob_top) + bytes;
	char *mem = cm_malloc(sz);
	if (!mem)
		return -ENOMEM;
	struct ipc_logprob *lp = (struct ipc_logprob *)mem;
	struct ipc_logprob_top *tp = (struct ipc_logprob_top *)(lp + n);
	char *txt = (char *)(tp + n_top);
	for (size_t i = from, j = 0; j < n; i++, j++) {
		const struct lp_entry *e = &r->lp[i];
		memcpy(txt, r->lp_pool + e->tok.off, e->tok.len);
		lp[j] = (struct ipc_logprob){txt, e->tok.len, e->tok.lp, tp, e->n_top};
		txt += e->tok.len;
		for (int k = 0; k < e->n_top; k++) {
			memcpy(txt, r->lp_pool + e->top[k].off, e->top[k].len);
			*tp++ = (struct ipc_logprob_top){txt, e->top[k].len, e->top[k].lp};
			txt += e->top[k].len;
		}
	}
	cm_free(m->lp);
	m->lp = mem;
	*ret = lp;
	*ret_n = n;
	return 0;
}

/* After text was appended: a stop string cuts the text and ends the
 * request (true); otherwise publish all but a tail that could still become
 * a stop string, so a stop string's text is never sent. */
bool store_check_stops(struct daemon_request *r)
{
	size_t hold = 0;
	for (int i = 0; i < r->n_stop; i++) {
		size_t L = r->stop_len[i];
		/* a full match can only start in the part not yet published */
		size_t from = r->pub_len;
		if (r->gen_len >= L && from + L <= r->gen_len) {
			const char *hit = memmem(r->gen + from, r->gen_len - from, r->stop[i], L);
			if (hit) {
				r->gen_len = (size_t)(hit - r->gen);
				r->gen[r->gen_len] = '\0';
				return true;
			}
		}
		/* longest suffix of gen that is a proper prefix of the stop string */
		size_t maxk = CM_MIN(L - 1, r->gen_len - r->pub_len);
		for (size_t k = maxk; k > hold; k--)
			if (memcmp(r->gen + r->gen_len - k, r->stop[i], k) == 0) {
				hold = k;
				break;
			}
	}
	r->pub_len = r->gen_len - hold;
	return false;
}

/* ---- polls ----------------------------------------------------------------- */

/* Answer a poll from the published text. A finished stream whose text the
 * client acknowledged entirely is released (rule 6 of the protocol) when
 * `may_release` and no other poll is held. Returns true if r was released
 * (and may be gone). */
bool store_answer_poll(struct sched *s, struct daemon_request *r, ipc_call *call, uint64_t ack,
		       bool may_release, struct outbox_list *out)
{
	if (r->fail_code != IPC_ERR_NONE) {
		/* refused before it ran (e.g. queued at shutdown): the error is
		 * what the stream delivers, once */
		outbox_error(out, call, r->id, r->fail_code, -1, r->fail_msg);
		bool release = may_release && !r->polls;
		if (release)
			store_unlist(s, r); /* r is gone */
		return release;
	}
	struct outbox_msg *m = outbox_add(out, call, IPC_OP_POLL, r->id);
	if (m) {
		struct ipc_poll_reply *p = &m->rep.u.poll;
		p->offset = ack;
		if (outbox_set_text(m, r->gen ? r->gen + ack : "", r->pub_len - ack) != 0) {
			/* out of memory: answer with no text, the client polls again */
			p->text = "";
			p->text_len = 0;
			p->done = false;
			return false;
		}
		p->text = m->text;
		p->text_len = r->pub_len - ack;
		p->done = r->state == RQ_FINISHED;
		if (r->want_lp) {
			/* out of memory: the entries come with a later poll */
			p->has_logprobs = reply_logprobs(m, r, ack, r->pub_len, p->done,
							 &p->logprobs, &p->n_logprobs) == 0;
		}
		if (p->done) {
			p->finish = r->finish;
			fill_stats(r, &p->usage, &p->timings);
		}
	}
	bool release = may_release && r->state == RQ_FINISHED && ack == r->pub_len && !r->polls;
	if (release)
		store_unlist(s, r);
	return release;
}

void store_answer_held_polls(struct sched *s, struct daemon_request *r, bool all,
			     struct outbox_list *out)
{
	uint64_t now = all ? 0 : cm_now_ns();
	struct held_poll *due = NULL, **tail = &due;
	for (struct held_poll **pp = &r->polls; *pp;) {
		struct held_poll *h = *pp;
		if (all || r->state == RQ_FINISHED || r->pub_len > h->ack || now >= h->deadline_ns) {
			*pp = h->next;
			h->next = NULL;
			*tail = h;
			tail = &h->next;
		} else {
			pp = &h->next;
		}
	}
	while (due) {
		struct held_poll *h = due;
		due = h->next;
		ipc_call *call = h->call;
		uint64_t ack = h->ack;
		cm_free(h);
		if (store_answer_poll(s, r, call, ack, !due, out))
			return; /* released: nothing is left to answer */
	}
}

/* ---- finishing ------------------------------------------------------------- */

void store_finish(struct sched *s, struct daemon_request *r, enum ipc_finish f,
		  struct outbox_list *out)
{
	struct daemon *d = s->d;
	if (r->state == RQ_FINISHED)
		return;
	r->state = RQ_FINISHED;
	r->finish = f;
	r->end_ns = cm_now_ns();
	r->pub_len = r->gen_len;
	r->last_poll_ns = r->end_ns; /* the idle clock restarts for the final polls */
	const char *outcome = f == IPC_FINISH_CANCELLED ? "cancelled"
			      : f == IPC_FINISH_DEADLINE ? "deadline"
							  : "ok";
	bool counted = false; /* by the reply, when it turns into an error */
	if (d->mi) {
		if (r->admit_ns)
			monitor_histogram_observe(d->mi->duration,
						  (double)(r->end_ns - r->arrival_ns) / 1e9);
		if (r->n_gen > 1 && r->first_ns)
			monitor_histogram_observe(d->mi->tpot, (double)(r->end_ns - r->first_ns) /
								   1e9 / (r->n_gen - 1));
	}
	daemon_log(LOG_INFO, r->id, "finished: %s, %d prompt tokens (%d cached), %d generated",
		   ipc_finish_name(f), r->n_prompt, r->n_cached, r->n_gen);
	if (!r->stream) {
		if (r->call && r->op == IPC_OP_EMBED) {
			struct outbox_msg *m = outbox_add(out, r->call, r->op, r->id);
			r->call = NULL;
			if (m)
				embed_reply(r, f, m);
			counted = true; /* its reply is (daemon_count_reply) */
		} else if (r->call) {
			struct outbox_msg *m = outbox_add(out, r->call, r->op, r->id);
			r->call = NULL;
			if (m && outbox_set_text(m, r->gen ? r->gen : "", r->gen_len) == 0) {
				struct ipc_gen_reply *g = &m->rep.u.gen;
				g->text = m->text;
				g->text_len = r->gen_len;
				g->finish = f;
				if (r->want_lp)
					g->has_logprobs = reply_logprobs(m, r, 0, r->gen_len, true,
									 &g->logprobs,
									 &g->n_logprobs) == 0;
				fill_stats(r, &g->usage, &g->timings);
			} else {
				if (m)
					m->rep.error = IPC_ERR_INTERNAL;
				counted = true;
			}
		}
		if (!counted)
			store_count(d, r->op, outcome);
		store_unlist(s, r); /* freed once its slot lets go */
		return;
	}
	store_count(d, r->op, outcome);
	store_answer_held_polls(s, r, true, out);
}

void store_fail(struct sched *s, struct daemon_request *r, enum ipc_errcode code, const char *msg,
		struct outbox_list *out)
{
	bool id_sent = r->stream && !r->call; /* a stream's id goes out once it is queued */
	/* an error reply is counted when sent (daemon_count_reply); a stream
	 * whose id went out counts its generate/chat here */
	if (!r->call)
		store_count(s->d, r->op, daemon_outcome_name(code));
	if (r->call) {
		outbox_error(out, r->call, r->id, code, -1, msg);
		r->call = NULL;
	}
	r->state = RQ_FINISHED;
	r->finish = IPC_FINISH_CANCELLED;
	r->end_ns = cm_now_ns();
	r->last_poll_ns = r->end_ns;
	if (id_sent) {
		r->fail_code = code;
		r->fail_msg = msg ? cm_strdup(msg) : NULL;
		store_answer_held_polls(s, r, true, out);
		return; /* until a poll collects the error, or idle */
	}
	store_unlist(s, r);
}
