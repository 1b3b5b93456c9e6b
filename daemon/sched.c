/* daemon/sched.c: the scheduler thread (serve.h).
 *
 * One thread owns the engine. Each loop iteration is one engine step over a
 * batch of one decode token for every running sequence (so the weights are
 * read once per step for all of them), then prompt tokens of sequences
 * still in prefill, as the policy shares them (policy.c). Finished
 * sequences keep their KV and tokens in their slot; a new prompt that
 * starts with the same tokens takes the slot with the longest common
 * prefix and computes only the rest.
 *
 * Between steps, under d->mu, it admits queued requests (fair share across
 * identities), publishes the text sampled in the step and collects the
 * replies that became due into an outbox list, which the sender thread
 * encodes and sends once the lock is dropped.
 *
 * Results never depend on batching: the engine computes each token's
 * logits identically whatever else is in the batch, and each request has
 * its own sampler, so a greedy request gives the same tokens alone and
 * among others.
 *
 * Drain (sched_stop): queued requests get shutting_down, each logged;
 * running ones finish within the drain timeout, then are cancelled; the
 * thread exits once every stream has been delivered (released by its
 * client's last poll) or left idle for stream_idle_ms. */
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* now - t, or 0 when t is later (set by another thread after `now` was read). */
static uint64_t since(uint64_t now, uint64_t t)
{
	return now > t ? now - t : 0;
}

#define REQ_OF(it) ((struct daemon_request *)((char *)(it)-offsetof(struct daemon_request, qi)))

/* ---- admission --------------------------------------------------------------- */

/* Back to a text worker: tokenized for a model that has been swapped out. */
static void reprepare(struct sched *s, struct daemon_request *r, struct outbox_list *out)
{
	r->state = RQ_PREPARING;
	s->n_preparing++;
	if (textpool_submit(&s->text, ops_prepare, r) != 0) {
		s->n_preparing--;
		r->state = RQ_QUEUED;
		store_fail(s, r, IPC_ERR_SHUTTING_DOWN, "the daemon is shutting down", out);
	}
}

/* Admit queued requests into free slots (under mu). */
static void admit(struct sched *s, struct outbox_list *out)
{
	struct daemon *d = s->d;
	while (s->pol.n_queued > 0 && !s->stopping && !s->swap_model) {
		/* a free slot first: the request's own choice needs its prompt */
		bool any_free = false;
		for (int i = 0; i < s->n_slots; i++) {
			struct slot *sl = &s->slots[i];
			s->pslots[i] = (struct policy_slot){sl->req != NULL, sl->tokens, sl->n_tokens,
							    sl->last_used};
			any_free |= !sl->req;
		}
		if (!any_free)
			return;
		int reuse = 0;
		struct daemon_request *r = REQ_OF(policy_next(&s->pol));
		uint64_t now = cm_now_ns();
		if (r->cancel) {
			store_finish(s, r, IPC_FINISH_CANCELLED, out);
			continue;
		}
		if (r->deadline_ns && now >= r->deadline_ns) {
			store_fail(s, r, IPC_ERR_DEADLINE_EXCEEDED,
				   "the deadline passed while the request was queued", out);
			continue;
		}
		if (r->model_gen != s->model_gen) {
			reprepare(s, r, out);
			continue;
		}
		/* embeddings need every token's state: nothing is reused */
		int best = policy_pick_slot(s->pslots, s->n_slots, r->prompt, r->n_prompt,
					    d->cfg.prefix_cache && r->op != IPC_OP_EMBED, &reuse);
		struct slot *sl = &s->slots[best];
		engine_seq_truncate(d->ctx, best, reuse);
		sl->n_tokens = reuse;
		sl->req = r;
		sl->last_used = now;
		r->in_slot = true;
		r->slot = best;
		r->n_fed = reuse;
		r->n_cached = reuse;
		r->n_shifted = 0;
		r->n_keep = d->cfg.context_keep < 0 ? r->n_keep_auto : d->cfg.context_keep;
		r->state = RQ_RUNNING;
		r->admit_ns = now;
		cm_free(r->prompt_text); /* tokenized for the model in use: not needed again */
		r->prompt_text = NULL;
		cm_free(r->gbnf); /* compiled for it too */
		r->gbnf = NULL;
		engine_detok_init(&r->detok, engine_model_tokenizer(d->model));
		for (int i = 0; r->smp && i < r->n_prompt; i++)
			engine_sampler_accept(r->smp, r->prompt[i]);
		if (d->mi) {
			monitor_counter_add(d->mi->prompt_tokens, r->op == IPC_OP_EMBED
									  ? r->emb_tokens
									  : r->n_prompt);
			monitor_counter_inc(d->mi->prefix_lookups);
			if (reuse > 1) {
				monitor_counter_inc(d->mi->prefix_hits);
				monitor_counter_add(d->mi->prefix_hit_tokens, reuse);
			}
			monitor_histogram_observe(d->mi->queue_wait,
						  (double)(now - r->arrival_ns) / 1e9);
		}
		daemon_log(LOG_DEBUG, r->id, "admitted to slot %d (%s): %d prompt tokens, %d cached",
			   best, policy_tenant_name(&s->pol, r->tenant), r->n_prompt, reuse);
	}
}

/* ---- between steps ------------------------------------------------------------- */

static void release_slot(struct sched *s, struct daemon_request *r)
{
	struct slot *sl = &s->slots[r->slot];
	sl->req = NULL;
	sl->last_used = cm_now_ns();
	/* after a shift only the kept start is what a prefill of those tokens
	 * gives: the rest saw tokens since dropped */
	if (r->n_shifted > 0)
		sl->n_tokens = CM_MIN(sl->n_tokens, r->n_keep);
	engine_seq_truncate(s->d->ctx, r->slot, sl->n_tokens);
	if (!s->d->cfg.prefix_cache) {
		engine_seq_truncate(s->d->ctx, r->slot, 0);
		sl->n_tokens = 0;
	}
	engine_sampler_free(r->smp);
	r->smp = NULL;
	gcache_put(&s->grammars, r->grammar);
	r->grammar = NULL;
	r->in_slot = false;
	store_maybe_free(s, r);
}

struct queue_sweep {
	struct sched *s;
	uint64_t now;
	struct outbox_list *out;
};

static void sweep_queued(struct policy_item *it, void *user)
{
	struct queue_sweep *w = user;
	struct sched *s = w->s;
	struct daemon_request *r = REQ_OF(it);
	if (s->stopping) {
		policy_dequeue(&s->pol, it);
		daemon_log(LOG_NOTICE, r->id, "queued %s refused: the daemon is shutting down",
			   ipc_op_name(r->op));
		store_fail(s, r, IPC_ERR_SHUTTING_DOWN, "the daemon is shutting down", w->out);
	} else if (r->deadline_ns && w->now >= r->deadline_ns) {
		policy_dequeue(&s->pol, it);
		store_fail(s, r, IPC_ERR_DEADLINE_EXCEEDED,
			   "the deadline passed while the request was queued", w->out);
	} else if (r->cancel) {
		policy_dequeue(&s->pol, it);
		store_finish(s, r, IPC_FINISH_CANCELLED, w->out);
	}
}

/* Cancellations, deadlines, abandoned streams, held polls whose wait ran
 * out, the drain's deadlines (under mu). */
static void housekeeping(struct sched *s, struct outbox_list *out)
{
	struct daemon *d = s->d;
	uint64_t now = cm_now_ns();
	uint64_t idle_ns = (uint64_t)d->cfg.stream_idle_ms * 1000000ull;
	for (int i = 0; i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (!r || r->state != RQ_RUNNING)
			continue;
		if (r->cancel) {
			store_finish(s, r, IPC_FINISH_CANCELLED, out);
		} else if (r->deadline_ns && now >= r->deadline_ns) {
			store_finish(s, r, IPC_FINISH_DEADLINE, out);
		} else if (r->stream && idle_ns && since(now, r->last_poll_ns) > idle_ns) {
			daemon_log(LOG_NOTICE, r->id, "stream not polled for %u ms: cancelled",
				   d->cfg.stream_idle_ms);
			store_finish(s, r, IPC_FINISH_CANCELLED, out);
		} else if (s->stopping && now >= s->stop_deadline_ns) {
			daemon_log(LOG_NOTICE, r->id, "drain timeout: cancelled");
			store_finish(s, r, IPC_FINISH_CANCELLED, out);
		}
		if (r->state == RQ_FINISHED)
			release_slot(s, r);
	}
	struct queue_sweep w = {s, now, out};
	policy_foreach(&s->pol, sweep_queued, &w);
	/* streams: held polls due; finished streams nobody collects */
	bool hard = s->stopping && now >= s->stop_hard_ns;
	for (struct daemon_request *r = s->table, *next; r; r = next) {
		next = r->next;
		if (r->polls)
			store_answer_held_polls(s, r, hard, out);
		if (r->state == RQ_FINISHED && r->stream && !r->polls &&
		    ((idle_ns && since(now, r->last_poll_ns) > idle_ns) || hard)) {
			if (s->stopping)
				daemon_log(LOG_NOTICE, r->id,
					   "stream not collected at shutdown (%zu bytes): dropped",
					   r->pub_len);
			store_unlist(s, r);
		}
	}
}

/* ---- the step ---------------------------------------------------------------- */

/* Sample the next token of r; publish its text (under mu, taken here). */
static void on_logits(struct sched *s, struct daemon_request *r, const float *logits,
		      struct outbox_list *out)
{
	struct daemon *d = s->d;
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	uint64_t now = cm_now_ns();
	int32_t id = engine_sampler_sample(r->smp, logits);
	engine_sampler_accept(r->smp, id);
	char piece[512];
	int n = 0;
	bool eog = engine_tokenizer_is_eog(tok, id);
	/* a grammar ends the text once it allows nothing more ("stop"); the
	 * sampler offers only tokens it takes, so a refusal is a bug to log */
	bool gdone = false;
	if (r->grammar && !eog) {
		if (engine_sampler_advance(r->smp, id) != 0)
			daemon_log(LOG_WARNING, r->id, "grammar refused sampled token %d", (int)id);
		gdone = engine_sampler_grammar_done(r->smp);
	}
	if (!eog)
		n = engine_detok_push(&r->detok, tok, id, piece, sizeof(piece));
	/* logprobs: the softmax and the pieces before the lock */
	struct lp_entry lpe;
	char lp_text[1 + IPC_MAX_TOP_LOGPROBS][128];
	const char *lp_pieces[1 + IPC_MAX_TOP_LOGPROBS];
	if (r->want_lp) {
		int32_t top_ids[IPC_MAX_TOP_LOGPROBS];
		float top_lps[IPC_MAX_TOP_LOGPROBS];
		int nt = CM_MIN(r->n_top_lp, IPC_MAX_TOP_LOGPROBS);
		lpe.tok.lp = engine_logprobs(logits, engine_tokenizer_n_vocab(tok), id, nt, top_ids,
					     top_lps);
		lpe.n_top = 0;
		for (int k = 0; k <= nt; k++) {
			int32_t t = k == 0 ? id : top_ids[k - 1];
			if (k > 0 && t < 0)
				break;
			/* a longer piece is cut: these are for display */
			int len = engine_token_to_piece(tok, t, false, lp_text[k], sizeof(lp_text[k]));
			lp_pieces[k] = lp_text[k];
			struct lp_piece *pc = k == 0 ? &lpe.tok : &lpe.top[k - 1];
			pc->len = (uint16_t)(len > 0 ? len : 0);
			if (k > 0) {
				pc->lp = top_lps[k - 1];
				lpe.n_top++;
			}
		}
	}
	pthread_mutex_lock(&d->mu);
	if (r->want_lp && store_lp_add(r, &lpe, lp_pieces) != 0)
		r->want_lp = false; /* out of memory: the rest goes without them */
	if (r->n_gen == 0) {
		r->first_ns = now;
		r->prefill_end_ns = now;
		if (d->mi)
			monitor_histogram_observe(d->mi->ttft, (double)(now - r->arrival_ns) / 1e9);
	}
	r->n_gen++;
	r->last_tok = id;
	bool stopped = false;
	if (n > 0 && store_gen_append(r, piece, (size_t)n) == 0) {
		store_lp_settle(r);
		stopped = store_check_stops(r);
	}
	if (eog || stopped) {
		store_finish(s, r, IPC_FINISH_STOP, out);
	} else if (gdone || r->n_gen >= r->max_tokens ||
		   ((uint32_t)(r->n_prompt + r->n_gen - r->n_shifted) >= d->cfg.ctx_size &&
		    !(d->cfg.context_shift && r->n_keep < (int)d->cfg.ctx_size - 2))) {
		int m = engine_detok_flush(&r->detok, piece, sizeof(piece));
		if (m > 0 && store_gen_append(r, piece, (size_t)m) == 0)
			store_lp_settle(r);
		if (gdone || (m > 0 && r->gen_len > 0 && store_check_stops(r)))
			store_finish(s, r, IPC_FINISH_STOP, out);
		else
			store_finish(s, r, IPC_FINISH_LENGTH, out);
	} else if (r->polls) {
		store_answer_held_polls(s, r, false, out);
	}
	pthread_mutex_unlock(&d->mu);
}

static void update_status(struct sched *s, double step_s, int n_decode, int n_prefill)
{
	struct daemon *d = s->d;
	int running = 0, kv = 0;
	for (int i = 0; i < s->n_slots; i++) {
		if (s->slots[i].req)
			running++;
		kv += engine_seq_len(d->ctx, i) > 0 ? engine_seq_len(d->ctx, i) : 0;
	}
	atomic_store(&s->n_running, running);
	if (n_decode > 0 && step_s > 0)
		atomic_store(&s->tok_s, n_decode / step_s);
	if (!d->mi)
		return;
	monitor_gauge_set(d->mi->running, running);
	monitor_gauge_set(d->mi->kv_used, kv);
	if (n_prefill + n_decode > 0) {
		double share = (double)n_prefill / (n_prefill + n_decode);
		monitor_counter_add(d->mi->prefill_seconds, step_s * share);
		monitor_counter_add(d->mi->decode_seconds, step_s * (1 - share));
		monitor_counter_add(d->mi->prefill_tokens, n_prefill);
		monitor_counter_add(d->mi->generation_tokens, n_decode);
		monitor_counter_add(d->mi->weight_bytes, (double)d->minfo.weight_bytes_token);
	}
}

static void watchdog_tick(struct sched *s)
{
	uint64_t wd = daemon_watchdog_usec();
	if (!wd)
		return;
	uint64_t now = cm_now_ns();
	if (now - s->last_watchdog_ns < wd * 1000 / 4)
		return;
	/* The last resort for a socket that no longer serves and that the
	 * server's self-check could not repair: no more WATCHDOG=1, so systemd
	 * restarts the daemon. */
	ipc_server *srv = __atomic_load_n(&s->d->srv, __ATOMIC_ACQUIRE);
	/* at least a few self-check rounds and a recovery, however short the
	 * watchdog period */
	uint64_t grace = CM_MAX(wd * 1000 / 2, (uint64_t)4 *
						    (IPC_SELFCHECK_DEFAULT_MS + IPC_SELFCHECK_TIMEOUT_MS) *
						    1000000ull);
	if (srv) {
		struct ipc_server_stats st;
		ipc_server_stats_get(srv, &st);
		/* rounds skipped while every context is held by the handler
		 * prove nothing: a merely saturated daemon keeps its watchdog */
		bool saturated = st.contexts && st.in_handler >= st.contexts;
		if (st.selfcheck_ok_ns && !saturated && since(now, st.selfcheck_ok_ns) > grace) {
			if (!s->watchdog_withheld)
				daemon_log(LOG_ERR, NULL,
					   "the socket's self-check has failed for %llu ms: "
					   "withholding the watchdog",
					   (unsigned long long)(since(now, st.selfcheck_ok_ns) / 1000000));
			s->watchdog_withheld = true;
			return;
		}
	}
	s->watchdog_withheld = false;
	daemon_notify_watchdog();
	s->last_watchdog_ns = now;
}

static bool has_work(struct sched *s)
{
	for (int i = 0; i < s->n_slots; i++)
		if (s->slots[i].req && s->slots[i].req->state == RQ_RUNNING)
			return true;
	return false;
}

static void do_swap(struct sched *s)
{
	struct daemon *d = s->d;
	pthread_rwlock_wrlock(&s->model_lock);
	engine_ctx_free(d->ctx);
	engine_model_free(d->model);
	pthread_mutex_lock(&d->mu);
	d->model = s->swap_model;
	d->ctx = s->swap_ctx;
	engine_model_get_info(d->model, &d->minfo);
	snprintf(d->kv_type_name, sizeof(d->kv_type_name), "%s",
		 engine_kv_type_name(engine_ctx_kv_type(d->ctx)));
	/* never larger: the new model loaded with ctx_max = the old context */
	d->cfg.ctx_size = engine_ctx_n_ctx(d->ctx);
	s->swap_model = NULL;
	s->swap_ctx = NULL;
	s->model_gen++;
	for (int i = 0; i < s->n_slots; i++)
		s->slots[i].n_tokens = 0;
	pthread_mutex_unlock(&d->mu);
	pthread_rwlock_unlock(&s->model_lock);
	atomic_store(&d->reloading, false);
	daemon_log(LOG_NOTICE, NULL, "model swapped in: %s", d->cfg.model);
	daemon_log_set_model(d->model_name);
	daemon_metrics_model(d);
	daemon_notify_ready();
}

/* The test hook: a prompt naming __edgelm_test_stall__ slows every step. */
static void test_stall(struct sched *s, struct daemon_request *r)
{
	unsigned ms = s->d->cfg.watchdog_stall_ms;
	if (!r->stall || !ms)
		return;
	daemon_log(LOG_WARNING, r->id, "test stall for %u ms", ms);
	struct timespec st = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&st, NULL);
}

static void batch_put(struct sched *s, int n, struct daemon_request *r, int32_t tok, int pos,
		      bool want)
{
	s->b_tok[n] = tok;
	s->b_pos[n] = pos;
	s->b_seq[n] = r->slot;
	s->b_want[n] = want;
	s->b_embd[n] = false;
	s->b_req[n] = r;
	s->slots[r->slot].tokens[pos] = tok;
}

/* Prompt tokens as the policy shares them; returns how many were added. */
static int add_prefill(struct sched *s, int n, int budget, int room, bool *chunked)
{
	int np = 0;
	for (int i = 0; i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (r && r->state == RQ_RUNNING && r->n_fed < r->n_prompt)
			s->pre[np++] = (struct policy_prefill_seq){r->tenant, r->n_prompt - r->n_fed,
								    &r->n_waited, 0, r};
	}
	if (np == 0)
		return 0;
	pthread_mutex_lock(&s->d->mu); /* the tenants' passes */
	int added = policy_prefill(&s->pol, s->pre, np, budget, room, chunked);
	pthread_mutex_unlock(&s->d->mu);
	for (int i = 0; i < np; i++) {
		if (!s->pre[i].take)
			continue;
		struct daemon_request *r = s->pre[i].user;
		bool emb = r->op == IPC_OP_EMBED;
		for (int k = 0; k < s->pre[i].take; k++, n++) {
			int p = r->n_fed + k;
			batch_put(s, n, r, r->prompt[p], p, !emb && p == r->n_prompt - 1);
			s->b_embd[n] = emb && embed_wants(r, p);
		}
		r->n_fed += s->pre[i].take;
		s->slots[r->slot].n_tokens = r->n_fed;
	}
	return added;
}

/* Context shift (context_shift): the next token's position p is past the
 * context. Keep the first n_keep, drop half of the rest from the KV and the
 * slot's record alike, and return the new position. */
static int shift_seq(struct sched *s, struct daemon_request *r, int p)
{
	struct daemon *d = s->d;
	struct slot *sl = &s->slots[r->slot];
	struct cm_err err = {0};
	int n_discard = (p - r->n_keep) / 2;
	if (engine_seq_shift(d->ctx, r->slot, r->n_keep, n_discard, &err) != 0) {
		daemon_log(LOG_ERR, r->id, "context shift failed: %s", err.msg);
		return -1;
	}
	memmove(sl->tokens + r->n_keep, sl->tokens + r->n_keep + n_discard,
		(size_t)(p - r->n_keep - n_discard) * sizeof(int32_t));
	r->n_shifted += n_discard;
	daemon_log(LOG_DEBUG, r->id, "context shift: kept %d, dropped %d tokens", r->n_keep,
		   n_discard);
	return p - n_discard;
}

/* One engine step over every running sequence. */
static void step(struct sched *s)
{
	struct daemon *d = s->d;
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	int n = 0;
	for (int i = 0; i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (!r || r->state != RQ_RUNNING)
			continue;
		test_stall(s, r);
		if (r->n_fed < r->n_prompt || r->n_gen == 0)
			continue;
		int p = r->n_prompt + r->n_gen - 1 - r->n_shifted;
		if ((uint32_t)p >= d->cfg.ctx_size && (p = shift_seq(s, r, p)) < 0) {
			pthread_mutex_lock(&d->mu);
			store_finish(s, r, IPC_FINISH_LENGTH, &out);
			release_slot(s, r);
			pthread_mutex_unlock(&d->mu);
			continue;
		}
		batch_put(s, n++, r, r->last_tok, p, true);
		s->slots[i].n_tokens = p + 1;
	}
	int n_decode = n;
	int budget = (int)d->cfg.batch_size - n;
	int chunk = policy_chunk_size(&s->chunk, (int)d->cfg.prefill_chunk, n);
	bool chunked = false;
	int n_prefill = add_prefill(s, n, CM_MIN(budget, chunk), budget, &chunked);
	n += n_prefill;
	if (n == 0) {
		outbox_post(&s->out, &out);
		return;
	}
	struct engine_batch b = {.n = n, .tokens = s->b_tok, .pos = s->b_pos, .seq = s->b_seq,
				 .want_logits = s->b_want, .want_embd = s->b_embd};
	struct cm_err err = {0};
	double t0 = cm_now();
	int rc = engine_decode(d->ctx, &b, &err);
	double dt = cm_now() - t0;
	if (rc) {
		/* an engine error fails the requests of this batch, not the daemon */
		daemon_log(LOG_ERR, NULL, "engine step failed: %s", err.msg);
		pthread_mutex_lock(&d->mu);
		for (int i = 0; i < n; i++)
			if (s->b_req[i]->state == RQ_RUNNING)
				store_finish(s, s->b_req[i], IPC_FINISH_CANCELLED, &out);
		pthread_mutex_unlock(&d->mu);
	} else {
		for (int i = 0; i < n; i++)
			if (s->b_want[i] && s->b_req[i]->state == RQ_RUNNING)
				on_logits(s, s->b_req[i], engine_get_logits(d->ctx, i), &out);
			else if (s->b_req[i]->op == IPC_OP_EMBED &&
				 s->b_req[i]->state == RQ_RUNNING)
				embed_take(s, s->b_req[i], i, &out);
	}
	pthread_mutex_lock(&d->mu);
	for (int i = 0; i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (r && r->state == RQ_FINISHED)
			release_slot(s, r);
	}
	pthread_mutex_unlock(&d->mu);
	outbox_post(&s->out, &out);
	if (rc == 0)
		policy_chunk_update(&s->chunk, (int)d->cfg.prefill_chunk, dt, n_prefill, n,
				    chunked);
	update_status(s, dt, n_decode, n_prefill);
}

static void *sched_main(void *arg)
{
	struct sched *s = arg;
	struct daemon *d = s->d;
	pthread_setname_np(pthread_self(), "edgelmd:sched");
	s->last_watchdog_ns = cm_now_ns();
	daemon_notify_watchdog();
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	for (;;) {
		pthread_mutex_lock(&d->mu);
		housekeeping(s, &out);
		if (s->swap_model && !has_work(s)) {
			pthread_mutex_unlock(&d->mu);
			outbox_post(&s->out, &out);
			do_swap(s);
			pthread_mutex_lock(&d->mu);
		}
		admit(s, &out);
		bool work = has_work(s);
		if (!work && s->stopping && s->pol.n_queued == 0 && s->n_preparing == 0 &&
		    store_n_streams(s) == 0) {
			pthread_mutex_unlock(&d->mu);
			outbox_post(&s->out, &out);
			break;
		}
		if (!work) {
			/* idle: wake for new work, held polls and the watchdog */
			struct timespec ts = cm_deadline(CLOCK_MONOTONIC, 50);
			pthread_cond_timedwait(&s->cv, &d->mu, &ts);
			pthread_mutex_unlock(&d->mu);
			outbox_post(&s->out, &out);
			update_status(s, 0, 0, 0);
			watchdog_tick(s);
			continue;
		}
		pthread_mutex_unlock(&d->mu);
		outbox_post(&s->out, &out);
		step(s);
		watchdog_tick(s);
	}
	return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------ */

static int parse_admins(struct sched *s, const char *spec, struct cm_err *err)
{
	s->n_admin = 0;
	const char *p = spec;
	while (*p) {
		while (*p == ',' || *p == ' ')
			p++;
		if (!*p)
			break;
		char *e;
		long v = strtol(p, &e, 10);
		if (e == p || v < 0 || (*e && *e != ',' && *e != ' '))
			return cm_err_set(err, -EINVAL, "admin_uids: '%s' is not a list of uids", spec);
		if (s->n_admin >= (int)CM_ARRAY_LEN(s->admin_uids))
			return cm_err_set(err, -EINVAL, "admin_uids: more than %zu uids",
					  CM_ARRAY_LEN(s->admin_uids));
		s->admin_uids[s->n_admin++] = (int)v;
		p = e;
	}
	return 0;
}

int sched_apply_config(struct sched *s, struct cm_err *err)
{
	struct policy_weight w[POLICY_MAX_WEIGHTS];
	int nw = 0;
	int rc = policy_weights_parse(s->d->cfg.tenant_weights, w, &nw, err);
	if (rc == 0)
		rc = parse_admins(s, s->d->cfg.admin_uids, err);
	if (rc == 0)
		policy_set_weights(&s->pol, w, nw);
	return rc;
}

int sched_new(struct daemon *d, struct sched **ret, struct cm_err *err)
{
	struct sched *s = cm_calloc(1, sizeof(*s));
	if (!s)
		return cm_err_set(err, -ENOMEM, "out of memory");
	s->d = d;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	/* a swap waiting for the lock holds off new text work, so it cannot starve */
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&s->model_lock, &ra);
	pthread_rwlockattr_destroy(&ra);
	gcache_init(&s->grammars);
	if (policy_init(&s->pol, err) != 0) {
		sched_free(s);
		return err->code;
	}
	if (sched_apply_config(s, err) != 0) {
		sched_free(s);
		return err->code;
	}
	s->n_slots = (int)d->cfg.parallel;
	s->b_cap = (int)d->cfg.batch_size + s->n_slots;
	s->slots = cm_calloc((size_t)s->n_slots, sizeof(*s->slots));
	s->pslots = cm_calloc((size_t)s->n_slots, sizeof(*s->pslots));
	s->pre = cm_calloc((size_t)s->n_slots, sizeof(*s->pre));
	s->b_tok = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_pos = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_seq = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_want = cm_calloc((size_t)s->b_cap, sizeof(bool));
	s->b_embd = cm_calloc((size_t)s->b_cap, sizeof(bool));
	s->b_req = cm_calloc((size_t)s->b_cap, sizeof(*s->b_req));
	bool ok = s->slots && s->pslots && s->pre && s->b_tok && s->b_pos && s->b_seq &&
		  s->b_want && s->b_embd && s->b_req;
	for (int i = 0; ok && i < s->n_slots; i++)
		ok = (s->slots[i].tokens = cm_calloc(d->cfg.ctx_size, sizeof(int32_t))) != NULL;
	if (!ok) {
		sched_free(s);
		return cm_err_set(err, -ENOMEM, "scheduler: out of memory");
	}
	*ret = s;
	return 0;
}

int sched_start(struct sched *s, struct cm_err *err)
{
	struct daemon *d = s->d;
	if (outbox_start(&s->out, err) != 0)
		return err->code;
	/* generations are bounded by queue_size before they get here */
	if (textpool_start(&s->text, (int)d->cfg.text_threads, 65536 + 2 * 32, err) != 0)
		return err->code;
	int r = pthread_create(&s->th, NULL, sched_main, s);
	if (r)
		return cm_err_set(err, -r, "cannot start the scheduler thread: %s", strerror(r));
	s->started = true;
	return 0;
}

void sched_stop(struct sched *s, unsigned timeout_ms)
{
	struct daemon *d = s->d;
	pthread_mutex_lock(&d->mu);
	s->stopping = true;
	uint64_t now = cm_now_ns();
	s->stop_deadline_ns = now + (uint64_t)timeout_ms * 1000000ull;
	/* streams finished by then get stream_idle_ms more to be collected */
	s->stop_hard_ns = s->stop_deadline_ns + (uint64_t)d->cfg.stream_idle_ms * 1000000ull;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&d->mu);
	if (s->started) {
		pthread_join(s->th, NULL);
		s->started = false;
	}
	/* text work still queued sees `stopping` and answers shutting_down */
	textpool_stop(&s->text);
	outbox_stop(&s->out);
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	if (s->started || s->text.th || s->out.started)
		sched_stop(s, 0);
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	pthread_mutex_lock(&s->d->mu);
	for (int i = 0; s->slots && i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (!r)
			continue;
		store_finish(s, r, IPC_FINISH_CANCELLED, &out);
		s->slots[i].req = NULL;
		r->in_slot = false;
		store_maybe_free(s, r);
	}
	while (s->table) {
		struct daemon_request *r = s->table;
		for (struct held_poll *h = r->polls, *hn; h; h = hn) {
			hn = h->next;
			outbox_error(&out, h->call, r->id, IPC_ERR_SHUTTING_DOWN, -1, NULL);
			cm_free(h);
		}
		r->polls = NULL;
		if (r->call)
			outbox_error(&out, r->call, r->id, IPC_ERR_SHUTTING_DOWN, -1, NULL);
		r->call = NULL;
		if (r->qi.queued)
			policy_dequeue(&s->pol, &r->qi);
		r->state = RQ_FINISHED;
		store_unlist(s, r);
	}
	pthread_mutex_unlock(&s->d->mu);
	outbox_send(&out);
	for (int i = 0; s->slots && i < s->n_slots; i++)
		cm_free(s->slots[i].tokens);
	cm_free(s->slots);
	cm_free(s->pslots);
	cm_free(s->pre);
	cm_free(s->b_tok);
	cm_free(s->b_pos);
	cm_free(s->b_seq);
	cm_free(s->b_want);
	cm_free(s->b_embd);
	cm_free(s->b_req);
	engine_ctx_free(s->swap_ctx);
	engine_model_free(s->swap_model);
	policy_fini(&s->pol);
	gcache_fini(&s->grammars);
	pthread_cond_destroy(&s->cv);
	pthread_rwlock_destroy(&s->model_lock);
	cm_free(s);
}

void sched_swap_model(struct sched *s, engine_model *m, engine_ctx *c)
{
	pthread_mutex_lock(&s->d->mu);
	if (s->swap_model) {
		engine_ctx_free(s->swap_ctx);
		engine_model_free(s->swap_model);
	}
	s->swap_model = m;
	s->swap_ctx = c;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->d->mu);
}

void sched_counts(struct sched *s, int *ret_running, int *ret_queued, double *ret_tok_s)
{
	pthread_mutex_lock(&s->d->mu);
	*ret_queued = s->pol.n_queued + s->n_preparing;
	pthread_mutex_unlock(&s->d->mu);
	*ret_running = atomic_load(&s->n_running);
	*ret_tok_s = atomic_load(&s->tok_s);
}
