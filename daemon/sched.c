/* daemon/sched.c: requests -> engine batches (continuous batching), and the
 * IPC handler that feeds it.
 *
 * One scheduler thread owns the engine. Each loop iteration is one engine
 * step over a batch made of: one decode token for every running sequence
 * (so the weights are read once per step for all of them), then prompt
 * tokens of sequences still in prefill, shared so that short prompts finish
 * first ("shortest remaining first", each prefilling sequence gets at most a
 * fair share) and capped while others decode, so running streams never stall
 * behind a long prompt. Finished sequences keep their KV and tokens in their
 * slot; a new prompt that starts with the same tokens (a chat that goes on)
 * takes the slot with the longest common prefix and computes only the rest.
 *
 * The IPC handler runs on nng threads. It answers cheap ops itself (health,
 * info, metrics, tokenize, detokenize, poll of published text, cancel) and
 * queues generations; it never waits for the engine. Everything shared with
 * the scheduler (request table, queue, published text, held polls) is under
 * d->mu; the engine's own state is touched by the scheduler thread only.
 *
 * Results never depend on batching: the engine computes each token's logits
 * identically whatever else is in the batch, and each request has its own
 * sampler, so a greedy request gives the same tokens alone and among others. */
#include "daemon/daemon.h"

#include "daemon/log.h"
#include "daemon/notify.h"
#include "engine/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_STOP 16
#define PREFILL_CHUNK_MIN 4 /* prompt tokens per step at least, so prefill progresses */
/* Prompts this short are fed whole in one step, whatever the chunk */
#define SHORT_PROMPT 32
/* A step carrying prompt tokens may take this many plain decode steps */
#define STEP_FACTOR 1.0
/* A long prompt passed over this many steps in a row (each completed
 * shorter prompts) takes its chunk in the next one anyway */
#define PREFILL_MAX_WAIT 2

struct held_poll {
	ipc_call *call;
	uint64_t ack;
	uint64_t deadline_ns;
	struct held_poll *next;
};

enum req_state { RQ_QUEUED, RQ_RUNNING, RQ_FINISHED };

struct daemon_request {
	char id[IPC_ID_MAX + 1];
	enum ipc_op op;
	ipc_call *call; /* non-stream: answered at the end */
	bool stream;
	char *prompt_text; /* until tokenized at admission */
	size_t prompt_text_len;
	bool parse_special;
	int32_t *prompt;
	int n_prompt;
	int max_tokens;
	struct engine_sampler_params sp;
	char *stop[MAX_STOP];
	size_t stop_len[MAX_STOP];
	int n_stop;
	int priority;
	uint64_t seq_no; /* arrival order */
	uint64_t arrival_ns, deadline_ns, admit_ns, first_ns, prefill_end_ns, end_ns;
	bool stall; /* test: stall the scheduler before each of its steps */
	bool in_table, in_slot; /* under mu; freed when both are false */

	/* scheduler thread only */
	int slot;
	int n_fed;   /* prompt tokens in the KV */
	int n_waited; /* steps in a row its prompt was passed over (add_prefill) */
	int n_cached; /* of those, reused from the prefix cache */
	int n_gen;
	int32_t last_tok;
	engine_sampler *smp;
	struct engine_detok detok;

	/* under mu */
	enum req_state state;
	char *gen; /* generated text; bytes < pub_len never change */
	size_t gen_len, gen_cap, pub_len;
	enum ipc_finish finish;
	bool cancel;
	uint64_t last_poll_ns;
	uint64_t max_ack;
	struct held_poll *polls;
	struct daemon_request *next; /* request table */
};

struct slot {
	struct daemon_request *req;
	int32_t *tokens; /* what the KV of this sequence holds */
	int n_tokens;
	uint64_t last_used;
};

struct sched {
	struct daemon *d;
	pthread_t th;
	bool started;
	pthread_cond_t cv; /* work arrived (with d->mu) */
	pthread_rwlock_t model_lock; /* handler reads the model; a swap writes */
	struct daemon_request *table;
	struct daemon_request **queue;
	int n_queue, cap_queue;
	uint64_t seq_counter;
	uint64_t id_counter;
	struct slot *slots;
	int n_slots;
	bool stopping;
	uint64_t stop_deadline_ns;
	engine_model *swap_model;
	engine_ctx *swap_ctx;
	/* batch scratch */
	int32_t *b_tok, *b_pos, *b_seq;
	bool *b_want;
	struct daemon_request **b_req;
	int b_cap;
	/* stats (scheduler thread; read approximately by sched_counts) */
	_Atomic int n_running;
	_Atomic double tok_s;
	uint64_t last_watchdog_ns;
	/* prompt-chunk control: t1 is the recent duration of a plain decode
	 * step (1-2 tokens, no prompt), chunk_cur the prompt tokens a step
	 * may carry, adjusted after every step that was limited by it */
	double t1;
	double chunk_cur;
};

static uint64_t now_ns(void)
{
	return cm_now_ns();
}

/* now - t, or 0 when t is later (set by another thread after `now` was read). */
static uint64_t since(uint64_t now, uint64_t t)
{
	return now > t ? now - t : 0;
}

/* ---- requests ------------------------------------------------------------ */

static void req_free(struct daemon_request *r)
{
	if (!r)
		return;
	cm_free(r->prompt_text);
	cm_free(r->prompt);
	for (int i = 0; i < r->n_stop; i++)
		cm_free(r->stop[i]);
	engine_sampler_free(r->smp);
	cm_free(r->gen);
	cm_free(r);
}

static struct daemon_request *table_find(struct sched *s, const char *id)
{
	for (struct daemon_request *r = s->table; r; r = r->next)
		if (strcmp(r->id, id) == 0)
			return r;
	return NULL;
}

static void table_remove(struct sched *s, struct daemon_request *r)
{
	for (struct daemon_request **p = &s->table; *p; p = &(*p)->next)
		if (*p == r) {
			*p = r->next;
			return;
		}
}

static void count_request(struct daemon *d, enum ipc_op op, const char *outcome)
{
	if (!d->fam_requests)
		return;
	const char *vals[2] = {ipc_op_name(op), outcome};
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
	t->decode_tps = t->decode_ms > 0 && r->n_gen > 1 ? (r->n_gen - 1) / (t->decode_ms / 1e3)
							 : NAN;
}

/* A request is freed once it has left both the table (nobody can name it)
 * and its slot (the scheduler no longer uses it). Under mu. */
static void maybe_free(struct daemon_request *r)
{
	if (!r->in_table && !r->in_slot)
		req_free(r);
}

static void unlist(struct sched *s, struct daemon_request *r)
{
	if (r->in_table) {
		table_remove(s, r);
		r->in_table = false;
	}
	maybe_free(r);
}

/* Answer a poll from the published text (under mu). A finished stream whose
 * text the client acknowledged entirely is released (rule 6 of the
 * protocol) when `may_release` and no other poll is held. Returns true if r
 * was released (and may be gone). */
static bool answer_poll(struct sched *s, struct daemon_request *r, ipc_call *call, uint64_t ack,
			bool may_release)
{
	struct ipc_reply rep = {.op = IPC_OP_POLL, .id = r->id, .retry_after_ms = -1};
	struct ipc_poll_reply *p = &rep.u.poll;
	p->offset = ack;
	p->text = r->gen ? r->gen + ack : "";
	p->text_len = r->pub_len - ack;
	p->done = r->state == RQ_FINISHED;
	if (p->done) {
		p->finish = r->finish;
		fill_stats(r, &p->usage, &p->timings);
	}
	bool release = may_release && p->done && ack == r->pub_len && !r->polls;
	ipc_call_reply_encode(call, &rep);
	if (release)
		unlist(s, r);
	return release;
}

/* Answer the held polls that are due (all of them with `all`). */
static void answer_held_polls(struct sched *s, struct daemon_request *r, bool all)
{
	uint64_t now = all ? 0 : now_ns();
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
		if (answer_poll(s, r, call, ack, !due)) 
			return; /* released: nothing is left to answer */
	}
}

/* Finish a request (under mu): publish everything, answer who waits. The
 * request leaves the table when it is not a stream. */
static void finish_locked(struct sched *s, struct daemon_request *r, enum ipc_finish f)
{
	struct daemon *d = s->d;
	if (r->state == RQ_FINISHED)
		return;
	r->state = RQ_FINISHED;
	r->finish = f;
	r->end_ns = now_ns();
	r->pub_len = r->gen_len;
	r->last_poll_ns = r->end_ns; /* the idle clock restarts for the final polls */
	const char *outcome = f == IPC_FINISH_CANCELLED ? "cancelled"
			      : f == IPC_FINISH_DEADLINE ? "deadline"
							  : "ok";
	count_request(d, r->op, outcome);
	if (d->mi) {
		if (r->admit_ns)
			monitor_histogram_observe(d->mi->duration, (double)(r->end_ns - r->arrival_ns) / 1e9);
		if (r->n_gen > 1 && r->first_ns)
			monitor_histogram_observe(d->mi->tpot, (double)(r->end_ns - r->first_ns) / 1e9 /
								  (r->n_gen - 1));
	}
	daemon_log(LOG_INFO, r->id, "finished: %s, %d prompt tokens (%d cached), %d generated",
		   ipc_finish_name(f), r->n_prompt, r->n_cached, r->n_gen);
	if (!r->stream) {
		if (r->call) {
			struct ipc_reply rep = {.op = r->op, .id = r->id, .retry_after_ms = -1};
			rep.u.gen.text = r->gen ? r->gen : "";
			rep.u.gen.text_len = r->gen_len;
			rep.u.gen.finish = f;
			fill_stats(r, &rep.u.gen.usage, &rep.u.gen.timings);
			ipc_call_reply_encode(r->call, &rep);
			r->call = NULL;
		}
		unlist(s, r); /* freed once its slot lets go (release_slot) */
		return;
	}
	answer_held_polls(s, r, true);
}

/* ---- generated text ------------------------------------------------------ */

static int gen_append(struct daemon_request *r, const char *p, size_t n)
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

/* After text was appended (under mu): a stop string cuts the text and ends
 * the request (returns true); otherwise publish all but a tail that could
 * still become a stop string, so a stop string's text is never sent. */
static bool check_stops(struct daemon_request *r)
{
	size_t hold = 0;
	for (int i = 0; i < r->n_stop; i++) {
		size_t L = r->stop_len[i];
		/* a full match can only start in the part not yet published */
		size_t from = r->pub_len;
		if (r->gen_len >= L) {
			const char *hit = NULL;
			if (from + L <= r->gen_len)
				hit = memmem(r->gen + from, r->gen_len - from, r->stop[i], L);
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

/* ---- admission ----------------------------------------------------------- */

static int queue_cmp(const struct daemon_request *a, const struct daemon_request *b)
{
	if (a->priority != b->priority)
		return a->priority > b->priority ? -1 : 1;
	return a->seq_no < b->seq_no ? -1 : 1;
}

static struct daemon_request *queue_pop(struct sched *s)
{
	if (s->n_queue == 0)
		return NULL;
	int best = 0;
	for (int i = 1; i < s->n_queue; i++)
		if (queue_cmp(s->queue[i], s->queue[best]) < 0)
			best = i;
	struct daemon_request *r = s->queue[best];
	memmove(&s->queue[best], &s->queue[best + 1],
		(size_t)(s->n_queue - best - 1) * sizeof(*s->queue));
	s->n_queue--;
	return r;
}

static void queue_remove(struct sched *s, struct daemon_request *r)
{
	for (int i = 0; i < s->n_queue; i++)
		if (s->queue[i] == r) {
			memmove(&s->queue[i], &s->queue[i + 1],
				(size_t)(s->n_queue - i - 1) * sizeof(*s->queue));
			s->n_queue--;
			return;
		}
}

/* An error for a request that never ran (under mu): it leaves the table. */
static void fail_locked(struct sched *s, struct daemon_request *r, enum ipc_errcode code,
			const char *msg)
{
	count_request(s->d, r->op, ipc_errcode_name(code));
	if (r->call) {
		ipc_call_error(r->call, code, -1, "%s", msg);
		r->call = NULL;
	}
	/* a stream was answered with its id already: its polls see the end */
	r->state = RQ_FINISHED;
	r->finish = IPC_FINISH_CANCELLED;
	r->end_ns = now_ns();
	if (r->stream) {
		answer_held_polls(s, r, true);
		return; /* stays pollable until released or idle */
	}
	unlist(s, r);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
	int n = CM_MIN(na, nb), i = 0;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

/* Tokenize a request's prompt (scheduler thread, without mu). */
static int tokenize_request(struct sched *s, struct daemon_request *r, struct cm_err *err)
{
	const engine_tokenizer *tok = engine_model_tokenizer(s->d->model);
	int cap = (int)CM_MIN(r->prompt_text_len + 8, (size_t)1 << 24), n = 0;
	r->prompt = cm_malloc((size_t)cap * sizeof(int32_t));
	if (!r->prompt)
		return cm_err_set(err, -ENOMEM, "out of memory");
	int rc = engine_tokenize(tok, r->prompt_text, r->prompt_text_len, true, r->parse_special,
				 r->prompt, cap, &n, err);
	if (rc == -ENOBUFS)
		return cm_err_set(err, -E2BIG, "prompt too long");
	if (rc)
		return rc;
	r->n_prompt = n;
	return 0;
}

/* Admit queued requests into free slots (called with mu held). */
static void admit(struct sched *s)
{
	struct daemon *d = s->d;
	uint32_t n_ctx = d->cfg.ctx_size;
	while (s->n_queue > 0 && !s->stopping && !s->swap_model) {
		int free_slot = -1;
		for (int i = 0; i < s->n_slots; i++)
			if (!s->slots[i].req) {
				free_slot = i;
				break;
			}
		if (free_slot < 0)
			return;
		struct daemon_request *r = queue_pop(s);
		uint64_t now = now_ns();
		if (r->cancel) {
			finish_locked(s, r, IPC_FINISH_CANCELLED);
			continue;
		}
		if (r->deadline_ns && now >= r->deadline_ns) {
			fail_locked(s, r, IPC_ERR_DEADLINE_EXCEEDED,
				    "the deadline passed while the request was queued");
			continue;
		}
		/* Tokenizing a long prompt takes a while: do it without the lock,
		 * so polls and new requests are not held up. r is out of the queue
		 * and only this thread admits, so nothing else touches its prompt;
		 * a cancel meanwhile only sets r->cancel. */
		pthread_mutex_unlock(&d->mu);
		struct cm_err err = {0};
		int rc = tokenize_request(s, r, &err);
		if (rc == 0 && (r->n_prompt == 0))
			rc = cm_err_set(&err, -EINVAL, "the prompt is empty and the model adds no BOS");
		if (rc == 0 && (uint32_t)r->n_prompt >= n_ctx)
			rc = cm_err_set(&err, -E2BIG,
					"prompt of %d tokens does not fit the context of %u tokens",
					r->n_prompt, n_ctx);
		if (rc == 0) {
			struct engine_model_info mi;
			engine_model_get_info(d->model, &mi);
			rc = engine_sampler_new(&r->sp, (int)mi.n_vocab, &r->smp, &err);
		}
		pthread_mutex_lock(&d->mu);
		if (rc) {
			fail_locked(s, r, ipc_errcode_from_errno(rc), err.msg);
			continue;
		}
		/* The prefix cache: the free slot whose KV shares the longest
		 * prefix; otherwise the least recently used one. */
		int best = -1, best_len = -1;
		for (int i = 0; i < s->n_slots; i++) {
			struct slot *sl = &s->slots[i];
			if (sl->req)
				continue;
			int c = d->cfg.prefix_cache ? common_prefix(sl->tokens, sl->n_tokens,
								    r->prompt, r->n_prompt)
						    : 0;
			if (c > best_len ||
			    (c == best_len && sl->last_used < s->slots[best].last_used)) {
				best = i;
				best_len = c;
			}
		}
		struct slot *sl = &s->slots[best];
		int reuse = CM_MIN(best_len, r->n_prompt - 1); /* the last token makes the logits */
		if (reuse < 0)
			reuse = 0;
		engine_seq_truncate(d->ctx, best, reuse);
		sl->n_tokens = reuse;
		sl->req = r;
		sl->last_used = now;
		r->in_slot = true;
		r->slot = best;
		r->n_fed = reuse;
		r->n_cached = reuse;
		r->state = RQ_RUNNING;
		r->admit_ns = now;
		engine_detok_init(&r->detok, engine_model_tokenizer(d->model));
		for (int i = 0; i < r->n_prompt; i++)
			engine_sampler_accept(r->smp, r->prompt[i]);
		if (d->mi) {
			monitor_counter_add(d->mi->prompt_tokens, r->n_prompt);
			monitor_counter_inc(d->mi->prefix_lookups);
			if (reuse > 1) {
				monitor_counter_inc(d->mi->prefix_hits);
				monitor_counter_add(d->mi->prefix_hit_tokens, reuse);
			}
			monitor_histogram_observe(d->mi->queue_wait,
						  (double)(now - r->arrival_ns) / 1e9);
		}
		daemon_log(LOG_DEBUG, r->id, "admitted to slot %d: %d prompt tokens, %d cached",
			   best, r->n_prompt, reuse);
	}
}

/* ---- the step ------------------------------------------------------------ */

static void release_slot(struct sched *s, struct daemon_request *r)
{
	struct slot *sl = &s->slots[r->slot];
	sl->req = NULL;
	sl->last_used = now_ns();
	engine_seq_truncate(s->d->ctx, r->slot, sl->n_tokens);
	if (!s->d->cfg.prefix_cache) {
		engine_seq_truncate(s->d->ctx, r->slot, 0);
		sl->n_tokens = 0;
	}
	engine_sampler_free(r->smp);
	r->smp = NULL;
	r->in_slot = false;
	maybe_free(r);
}

/* Checks between steps (under mu): cancellations, deadlines, abandoned
 * streams, held polls whose wait ran out. */
static void housekeeping(struct sched *s)
{
	struct daemon *d = s->d;
	uint64_t now = now_ns();
	uint64_t idle_ns = (uint64_t)d->cfg.stream_idle_ms * 1000000ull;
	for (int i = 0; i < s->n_slots; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (!r || r->state != RQ_RUNNING)
			continue;
		if (r->cancel)
			finish_locked(s, r, IPC_FINISH_CANCELLED);
		else if (r->deadline_ns && now >= r->deadline_ns)
			finish_locked(s, r, IPC_FINISH_DEADLINE);
		else if (r->stream && idle_ns && since(now, r->last_poll_ns) > idle_ns) {
			daemon_log(LOG_NOTICE, r->id, "stream not polled for %u ms: cancelled",
				   d->cfg.stream_idle_ms);
			finish_locked(s, r, IPC_FINISH_CANCELLED);
		} else if (s->stopping && s->stop_deadline_ns && now >= s->stop_deadline_ns)
			finish_locked(s, r, IPC_FINISH_CANCELLED);
		if (r->state == RQ_FINISHED)
			release_slot(s, r);
	}
	/* queued requests past their deadline, or waiting when we stop */
	for (int i = 0; i < s->n_queue;) {
		struct daemon_request *r = s->queue[i];
		if (s->stopping) {
			queue_remove(s, r);
			fail_locked(s, r, IPC_ERR_SHUTTING_DOWN, "the daemon is shutting down");
		} else if (r->deadline_ns && now >= r->deadline_ns) {
			queue_remove(s, r);
			fail_locked(s, r, IPC_ERR_DEADLINE_EXCEEDED,
				    "the deadline passed while the request was queued");
		} else if (r->cancel) {
			queue_remove(s, r);
			finish_locked(s, r, IPC_FINISH_CANCELLED);
		} else {
			i++;
		}
	}
	/* streams: held polls due, finished streams nobody collects */
	for (struct daemon_request *r = s->table, *next; r; r = next) {
		next = r->next;
		if (r->polls)
			answer_held_polls(s, r, false);
		if (r->state == RQ_FINISHED && r->stream && idle_ns && !r->polls &&
		    since(now, r->last_poll_ns) > idle_ns)
			unlist(s, r);
	}
}

/* Hand out up to `budget` prompt tokens (the chunk) to the prefilling
 * sequences, short prompts whole within `room` (the batch). Returns the
 * tokens added; *ret_chunked tells whether a prompt was cut by the chunk. */
static int add_prefill(struct sched *s, int n, int budget, int room, bool *ret_chunked)
{
	const int chunk = budget;
	struct daemon_request *pre[256];
	int np = 0;
	for (int i = 0; i < s->n_slots && np < 256; i++) {
		struct daemon_request *r = s->slots[i].req;
		if (r && r->state == RQ_RUNNING && r->n_fed < r->n_prompt)
			pre[np++] = r;
	}
	/* insertion sort by remaining prompt tokens */
	for (int i = 1; i < np; i++)
		for (int j = i; j > 0 && pre[j]->n_prompt - pre[j]->n_fed <
					   pre[j - 1]->n_prompt - pre[j - 1]->n_fed;
		     j--) {
			struct daemon_request *t = pre[j];
			pre[j] = pre[j - 1];
			pre[j - 1] = t;
		}
	/* Shortest remaining first, each taking what it needs: a short prompt
	 * that arrives during a long prefill is done in one step. A step that
	 * completes prompts carries no partial chunk of a longer one: the
	 * short request's first token then costs about what it costs on an
	 * idle daemon, and the long prompt pauses for that one step; after
	 * PREFILL_MAX_WAIT such steps in a row it takes its chunk anyway, so a
	 * steady stream of short prompts cannot starve it. */
	int added = 0, completed = 0;
	for (int i = 0; i < np && room > 0; i++) {
		struct daemon_request *r = pre[i];
		int left = r->n_prompt - r->n_fed;
		/* a short prompt goes in whole, past the chunk (it costs
		 * about what a decode token does, and its step is its first
		 * token); a long one takes the chunk's budget */
		int take;
		if (left <= SHORT_PROMPT && left <= room) {
			take = left;
		} else if ((completed > 0 || budget <= 0) && r->n_waited < PREFILL_MAX_WAIT) {
			/* (the short prompts took the chunk's budget) */
			r->n_waited++;
			break;
		} else {
			take = CM_MIN(left, CM_MIN(CM_MAX(budget, chunk), room));
		}
		r->n_waited = 0;
		completed += take == left;
		*ret_chunked |= take < left;
		struct slot *sl = &s->slots[r->slot];
		for (int k = 0; k < take; k++) {
			int p = r->n_fed + k;
			s->b_tok[n] = r->prompt[p];
			s->b_pos[n] = p;
			s->b_seq[n] = r->slot;
			s->b_want[n] = p == r->n_prompt - 1;
			s->b_req[n] = r;
			sl->tokens[p] = r->prompt[p];
			n++;
		}
		r->n_fed += take;
		sl->n_tokens = r->n_fed;
		budget -= take;
		room -= take;
		added += take;
	}
	return added;
}

/* Sample the next token of r from logits; publish its text (takes mu). */
static void on_logits(struct sched *s, struct daemon_request *r, const float *logits)
{
	struct daemon *d = s->d;
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	uint64_t now = now_ns();
	int32_t id = engine_sampler_sample(r->smp, logits);
	engine_sampler_accept(r->smp, id);
	char piece[512];
	int n = 0;
	bool eog = engine_tokenizer_is_eog(tok, id);
	if (!eog)
		n = engine_detok_push(&r->detok, tok, id, piece, sizeof(piece));
	pthread_mutex_lock(&d->mu);
	if (r->n_gen == 0) {
		r->first_ns = now;
		r->prefill_end_ns = now;
		if (d->mi)
			monitor_histogram_observe(d->mi->ttft, (double)(now - r->arrival_ns) / 1e9);
	}
	r->n_gen++;
	r->last_tok = id;
	bool stopped = false;
	if (n > 0 && gen_append(r, piece, (size_t)n) == 0)
		stopped = check_stops(r);
	if (eog || stopped) {
		finish_locked(s, r, IPC_FINISH_STOP);
	} else if (r->n_gen >= r->max_tokens ||
		   (uint32_t)(r->n_prompt + r->n_gen) >= d->cfg.ctx_size) {
		int m = engine_detok_flush(&r->detok, piece, sizeof(piece));
		if (m > 0 && gen_append(r, piece, (size_t)m) == 0 && check_stops(r))
			finish_locked(s, r, IPC_FINISH_STOP);
		else
			finish_locked(s, r, IPC_FINISH_LENGTH);
	} else if (r->polls) {
		answer_held_polls(s, r, false);
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
	uint64_t now = now_ns();
	if (now - s->last_watchdog_ns >= wd * 1000 / 4) {
		daemon_notify_watchdog();
		s->last_watchdog_ns = now;
	}
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
	d->model = s->swap_model;
	d->ctx = s->swap_ctx;
	engine_model_get_info(d->model, &d->minfo);
	s->swap_model = NULL;
	s->swap_ctx = NULL;
	for (int i = 0; i < s->n_slots; i++)
		s->slots[i].n_tokens = 0;
	pthread_rwlock_unlock(&s->model_lock);
	atomic_store(&d->phase, PHASE_READY);
	daemon_log(LOG_NOTICE, NULL, "model swapped in: %s", d->cfg.model);
	daemon_log_set_model(d->model_name);
	daemon_notify_ready();
}

static void *sched_main(void *arg)
{
	struct sched *s = arg;
	struct daemon *d = s->d;
	pthread_setname_np(pthread_self(), "edgelmd:sched");
	s->last_watchdog_ns = now_ns();
	daemon_notify_watchdog();
	for (;;) {
		pthread_mutex_lock(&d->mu);
		housekeeping(s);
		if (s->swap_model && !has_work(s)) {
			pthread_mutex_unlock(&d->mu);
			do_swap(s);
			pthread_mutex_lock(&d->mu);
		}
		admit(s);
		bool work = has_work(s);
		if (!work && s->stopping && s->n_queue == 0) {
			pthread_mutex_unlock(&d->mu);
			break;
		}
		if (!work) {
			/* idle: wake for new work, held polls and the watchdog */
			struct timespec ts = cm_deadline(CLOCK_MONOTONIC, 50);
			pthread_cond_timedwait(&s->cv, &d->mu, &ts);
			pthread_mutex_unlock(&d->mu);
			update_status(s, 0, 0, 0);
			watchdog_tick(s);
			continue;
		}
		pthread_mutex_unlock(&d->mu);

		/* Build the batch: decode tokens first, then prompt tokens. */
		int n = 0, n_decode = 0;
		for (int i = 0; i < s->n_slots; i++) {
			struct daemon_request *r = s->slots[i].req;
			if (!r || r->state != RQ_RUNNING)
				continue;
			if (r->stall && d->cfg.watchdog_stall_ms) {
				daemon_log(LOG_WARNING, r->id, "test stall for %u ms",
					   d->cfg.watchdog_stall_ms);
				struct timespec st = {d->cfg.watchdog_stall_ms / 1000,
						      (long)(d->cfg.watchdog_stall_ms % 1000) * 1000000L};
				nanosleep(&st, NULL);
			}
			if (r->n_fed < r->n_prompt || r->n_gen == 0)
				continue;
			int p = r->n_prompt + r->n_gen - 1;
			s->b_tok[n] = r->last_tok;
			s->b_pos[n] = p;
			s->b_seq[n] = r->slot;
			s->b_want[n] = true;
			s->b_req[n] = r;
			s->slots[i].tokens[p] = r->last_tok;
			s->slots[i].n_tokens = p + 1;
			n++;
		}
		n_decode = n;
		int budget = (int)d->cfg.batch_size - n;
		/* Prompt tokens per step: as many as keep a step within
		 * STEP_FACTOR times a plain decode step, so that a request arriving
		 * during a long prefill waits about half a decode step for the
		 * running step to end (its prompt then gets a step of its own,
		 * add_prefill), and running streams slow down by at most that
		 * factor. A step's cost is far from linear in its tokens (a few
		 * tokens cost what one does: the weights are read once), so the
		 * chunk is steered by the measured step times rather than by a
		 * cost model. Until a decode step has been seen, prefill_chunk
		 * applies (4 x PREFILL_CHUNK_MIN beside running decodes). */
		int chunk = (int)d->cfg.prefill_chunk;
		if (s->t1 > 0)
			chunk = (int)CM_MIN((double)chunk,
					    CM_MAX(s->chunk_cur, (double)PREFILL_CHUNK_MIN));
		else if (n > 0)
			chunk = CM_MIN(chunk, 4 * PREFILL_CHUNK_MIN);
		bool chunked = false;
		int n_prefill = add_prefill(s, n, CM_MIN(budget, chunk), budget, &chunked);
		n += n_prefill;
		if (n == 0)
			continue;
		struct engine_batch b = {.n = n, .tokens = s->b_tok, .pos = s->b_pos,
					 .seq = s->b_seq, .want_logits = s->b_want};
		struct cm_err err = {0};
		double t0 = cm_now();
		int rc = engine_decode(d->ctx, &b, &err);
		double dt = cm_now() - t0;
		if (rc) {
			/* An engine error fails the requests of this batch, not the daemon. */
			daemon_log(LOG_ERR, NULL, "engine step failed: %s", err.msg);
			pthread_mutex_lock(&d->mu);
			for (int i = 0; i < n; i++)
				if (s->b_req[i]->state == RQ_RUNNING)
					finish_locked(s, s->b_req[i], IPC_FINISH_CANCELLED);
			pthread_mutex_unlock(&d->mu);
		} else {
			for (int i = 0; i < n; i++)
				if (s->b_want[i] && s->b_req[i]->state == RQ_RUNNING)
					on_logits(s, s->b_req[i], engine_get_logits(d->ctx, i));
		}
		pthread_mutex_lock(&d->mu);
		for (int i = 0; i < s->n_slots; i++) {
			struct daemon_request *r = s->slots[i].req;
			if (r && r->state == RQ_FINISHED)
				release_slot(s, r);
		}
		pthread_mutex_unlock(&d->mu);
		if (rc == 0) {
			if (n_prefill == 0 && n <= 2) { /* a plain decode step */
				if (s->t1 <= 0) /* first seen: start small, grow */
					s->chunk_cur = 4 * PREFILL_CHUNK_MIN;
				s->t1 = s->t1 > 0 ? 0.8 * s->t1 + 0.2 * dt : dt;
			}
			if (s->t1 > 0 && chunked) {
				/* a step the chunk limited: steer it to the target */
				double f = STEP_FACTOR * s->t1 / dt;
				s->chunk_cur *= CM_MAX(0.5, CM_MIN(1.25, f));
				s->chunk_cur = CM_MAX((double)PREFILL_CHUNK_MIN,
						      CM_MIN(s->chunk_cur, (double)d->cfg.prefill_chunk));
			}
		}
		update_status(s, dt, n_decode, n_prefill);
		watchdog_tick(s);
	}
	/* Leaving: answer every held poll with what is there. */
	pthread_mutex_lock(&d->mu);
	for (struct daemon_request *r = s->table, *next; r; r = next) {
		next = r->next;
		if (r->polls)
			answer_held_polls(s, r, true);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- lifecycle ----------------------------------------------------------- */

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
	pthread_rwlock_init(&s->model_lock, NULL);
	s->n_slots = (int)d->cfg.parallel;
	s->cap_queue = (int)d->cfg.queue_size;
	s->b_cap = (int)d->cfg.batch_size + s->n_slots;
	s->slots = cm_calloc((size_t)s->n_slots, sizeof(*s->slots));
	s->queue = cm_calloc((size_t)s->cap_queue + 1, sizeof(*s->queue));
	s->b_tok = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_pos = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_seq = cm_calloc((size_t)s->b_cap, sizeof(int32_t));
	s->b_want = cm_calloc((size_t)s->b_cap, sizeof(bool));
	s->b_req = cm_calloc((size_t)s->b_cap, sizeof(*s->b_req));
	bool ok = s->slots && s->queue && s->b_tok && s->b_pos && s->b_seq && s->b_want && s->b_req;
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
	s->stop_deadline_ns = now_ns() + (uint64_t)timeout_ms * 1000000ull;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&d->mu);
	if (s->started) {
		pthread_join(s->th, NULL);
		s->started = false;
	}
}

void sched_free(struct sched *s)
{
	if (!s)
		return;
	if (s->started)
		sched_stop(s, 0);
	struct daemon_request *r = s->table;
	while (r) {
		struct daemon_request *next = r->next;
		struct held_poll *h = r->polls;
		while (h) {
			struct held_poll *hn = h->next;
			ipc_call_error(h->call, IPC_ERR_SHUTTING_DOWN, -1, NULL);
			cm_free(h);
			h = hn;
		}
		r->polls = NULL;
		if (r->call)
			ipc_call_error(r->call, IPC_ERR_SHUTTING_DOWN, -1, NULL);
		r->call = NULL;
		r->in_table = false;
		maybe_free(r);
		r = next;
	}
	s->table = NULL;
	for (int i = 0; s->slots && i < s->n_slots; i++) {
		struct daemon_request *sr = s->slots[i].req;
		if (sr) {
			if (sr->call)
				ipc_call_error(sr->call, IPC_ERR_SHUTTING_DOWN, -1, NULL);
			sr->call = NULL;
			sr->in_slot = false;
			maybe_free(sr);
		}
		cm_free(s->slots[i].tokens);
	}
	cm_free(s->slots);
	cm_free(s->queue);
	cm_free(s->b_tok);
	cm_free(s->b_pos);
	cm_free(s->b_seq);
	cm_free(s->b_want);
	cm_free(s->b_req);
	engine_ctx_free(s->swap_ctx);
	engine_model_free(s->swap_model);
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
	*ret_queued = s->n_queue;
	pthread_mutex_unlock(&s->d->mu);
	*ret_running = atomic_load(&s->n_running);
	*ret_tok_s = atomic_load(&s->tok_s);
}

/* ---- the IPC handler ----------------------------------------------------- */

static void sampling_from_request(const struct daemon_config *cfg, const struct ipc_sampling *in,
				  struct engine_sampler_params *sp, int *ret_max_tokens)
{
	engine_sampler_params_default(sp);
	sp->temp = in->temperature;
	sp->top_k = in->top_k;
	sp->top_p = in->top_p;
	sp->min_p = in->min_p;
	sp->repeat_penalty = in->repeat_penalty;
	sp->freq_penalty = in->frequency_penalty;
	sp->presence_penalty = in->presence_penalty;
	sp->penalty_last_n = in->penalty_last_n;
	if (in->set & IPC_SET_SEED) {
		sp->seed = in->seed;
	} else {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		sp->seed = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)ts.tv_sec;
	}
	int mt = (in->set & IPC_SET_MAX_TOKENS) ? in->max_tokens : (int)cfg->max_tokens_default;
	*ret_max_tokens = (int)CM_MIN((uint32_t)mt, cfg->max_tokens_limit);
}

static void handle_generate(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	struct daemon_request *r = cm_calloc(1, sizeof(*r));
	if (!r) {
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	r->op = q->op;
	r->stream = q->stream;
	r->slot = -1;
	r->priority = q->priority;
	r->arrival_ns = ipc_call_arrival_ns(call);
	r->last_poll_ns = now_ns();
	uint64_t dl = q->deadline_ms ? (uint64_t)q->deadline_ms : d->cfg.deadline_ms_default;
	r->deadline_ns = dl ? r->arrival_ns + dl * 1000000ull : 0;
	sampling_from_request(&d->cfg, &q->sampling, &r->sp, &r->max_tokens);
	struct cm_err err = {0};
	int rc = 0;
	if (q->op == IPC_OP_CHAT) {
		enum engine_chat_format f;
		struct engine_chat_msg msgs[1024];
		size_t nm = CM_MIN(q->n_messages, CM_ARRAY_LEN(msgs));
		for (size_t i = 0; i < nm; i++) {
			msgs[i].role = (enum engine_chat_role)q->messages[i].role;
			msgs[i].content = q->messages[i].content;
			msgs[i].len = q->messages[i].content_len;
		}
		pthread_rwlock_rdlock(&s->model_lock);
		rc = engine_chat_detect(d->model, NULL, &f, &err);
		pthread_rwlock_unlock(&s->model_lock);
		if (rc == 0)
			rc = engine_chat_render(f, msgs, nm, true, &r->prompt_text, &r->prompt_text_len,
						&err);
		r->parse_special = true;
		if (rc) {
			req_free(r);
			ipc_call_error(call, rc == -ENOTSUP ? IPC_ERR_UNSUPPORTED : IPC_ERR_INTERNAL, -1,
				       "%s", err.msg);
			return;
		}
	} else {
		r->prompt_text = cm_strndup(q->prompt ? q->prompt : "", q->prompt_len);
		r->prompt_text_len = q->prompt_len;
	}
	for (size_t i = 0; i < q->n_stop && i < MAX_STOP; i++) {
		r->stop[i] = cm_strndup(q->stop[i], q->stop_len[i]);
		r->stop_len[i] = q->stop_len[i];
		r->n_stop++;
	}
	if (!r->prompt_text) {
		req_free(r);
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	if (d->cfg.watchdog_stall_ms && strstr(r->prompt_text, "__edgelm_test_stall__"))
		r->stall = true;

	pthread_mutex_lock(&d->mu);
	if (s->stopping || atomic_load(&d->phase) == PHASE_DRAINING) {
		pthread_mutex_unlock(&d->mu);
		req_free(r);
		ipc_call_error(call, IPC_ERR_SHUTTING_DOWN, -1, NULL);
		return;
	}
	if (s->n_queue >= s->cap_queue) {
		int nq = s->n_queue;
		pthread_mutex_unlock(&d->mu);
		req_free(r);
		count_request(d, q->op, "queue_full");
		/* a rough hint: a slot frees every few hundred ms under load */
		ipc_call_error(call, IPC_ERR_QUEUE_FULL, 250 + 50 * (int64_t)nq,
			       "queue full (%d waiting)", nq);
		return;
	}
	if (q->id) {
		if (table_find(s, q->id)) {
			pthread_mutex_unlock(&d->mu);
			req_free(r);
			ipc_call_error(call, IPC_ERR_INVALID_FIELD, -1, "id '%s' is in use", q->id);
			return;
		}
		snprintf(r->id, sizeof(r->id), "%s", q->id);
	} else {
		snprintf(r->id, sizeof(r->id), "r-%llu", (unsigned long long)++s->id_counter);
	}
	r->seq_no = ++s->seq_counter;
	r->state = RQ_QUEUED;
	r->next = s->table;
	s->table = r;
	r->in_table = true;
	s->queue[s->n_queue++] = r;
	if (!r->stream)
		r->call = call;
	pthread_cond_signal(&s->cv);
	/* From here a non-stream request may be answered (and q freed) by the
	 * scheduler at any time: use only the copy in r... which the scheduler
	 * may free too once answered; so log from copies. */
	char id[IPC_ID_MAX + 1];
	snprintf(id, sizeof(id), "%s", r->id);
	enum ipc_op op = r->op;
	bool stream = r->stream;
	size_t plen = r->prompt_text_len;
	pthread_mutex_unlock(&d->mu);
	daemon_log(LOG_INFO, id, "%s queued (%zu bytes of prompt%s)", ipc_op_name(op), plen,
		   stream ? ", streaming" : "");
	if (stream) {
		struct ipc_reply rep = {.op = op, .id = id, .retry_after_ms = -1};
		rep.u.gen.stream = true;
		ipc_call_reply_encode(call, &rep);
	}
}

static void handle_poll(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	pthread_mutex_lock(&d->mu);
	struct daemon_request *r = q->id ? table_find(s, q->id) : NULL;
	if (!r || !r->stream) {
		pthread_mutex_unlock(&d->mu);
		ipc_call_error(call, IPC_ERR_NOT_FOUND, -1, "no stream '%s'", q->id ? q->id : "");
		return;
	}
	if (q->ack > r->pub_len || q->ack < r->max_ack) {
		uint64_t have = r->pub_len, min = r->max_ack;
		pthread_mutex_unlock(&d->mu);
		ipc_call_error(call, IPC_ERR_INVALID_FIELD, -1,
			       "ack %llu out of range [%llu, %llu]", (unsigned long long)q->ack,
			       (unsigned long long)min, (unsigned long long)have);
		return;
	}
	r->max_ack = q->ack;
	r->last_poll_ns = now_ns();
	bool now_answer = q->wait_ms == 0 || r->pub_len > q->ack || r->state == RQ_FINISHED ||
			  !s->started;
	if (!now_answer) {
		struct held_poll *h = cm_calloc(1, sizeof(*h));
		if (h) {
			h->call = call;
			h->ack = q->ack;
			h->deadline_ns = r->last_poll_ns + (uint64_t)q->wait_ms * 1000000ull;
			h->next = r->polls;
			r->polls = h;
			pthread_cond_signal(&s->cv);
			pthread_mutex_unlock(&d->mu);
			return;
		}
	}
	answer_poll(s, r, call, q->ack, true);
	pthread_mutex_unlock(&d->mu);
}

static void handle_cancel(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	pthread_mutex_lock(&d->mu);
	struct daemon_request *r = q->id ? table_find(s, q->id) : NULL;
	if (!r) {
		pthread_mutex_unlock(&d->mu);
		ipc_call_error(call, IPC_ERR_NOT_FOUND, -1, "no generation '%s'", q->id ? q->id : "");
		return;
	}
	daemon_log(LOG_INFO, r->id, "cancel requested");
	struct ipc_reply rep = {.op = IPC_OP_CANCEL, .id = r->id, .retry_after_ms = -1};
	if (r->state == RQ_FINISHED) {
		rep.u.cancel.cancelled = false;
		ipc_call_reply_encode(call, &rep);
		if (r->stream && !r->polls)
			unlist(s, r);
	} else {
		r->cancel = true;
		rep.u.cancel.cancelled = true;
		ipc_call_reply_encode(call, &rep);
		pthread_cond_signal(&s->cv);
	}
	pthread_mutex_unlock(&d->mu);
}

static void handle_tokenize(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	struct cm_err err = {0};
	int32_t *ids = cm_malloc((q->text_len + 8) * sizeof(int32_t));
	int n = 0;
	if (!ids) {
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	pthread_rwlock_rdlock(&s->model_lock);
	int rc = engine_tokenize(engine_model_tokenizer(d->model), q->text ? q->text : "",
				 q->text_len, q->add_special, q->parse_special, ids,
				 (int)(q->text_len + 8), &n, &err);
	pthread_rwlock_unlock(&s->model_lock);
	if (rc) {
		cm_free(ids);
		ipc_call_error(call, ipc_errcode_from_errno(rc), -1, "%s", err.msg);
		return;
	}
	struct ipc_reply rep = {.op = IPC_OP_TOKENIZE, .retry_after_ms = -1};
	rep.u.tokenize.ids = ids;
	rep.u.tokenize.n_ids = (size_t)n;
	ipc_call_reply_encode(call, &rep);
	cm_free(ids);
}

static void handle_detokenize(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	struct cm_err err = {0};
	char *text = NULL;
	pthread_rwlock_rdlock(&s->model_lock);
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	int nv = engine_tokenizer_n_vocab(tok);
	int rc = 0;
	for (size_t i = 0; i < q->n_ids && rc == 0; i++)
		if (q->ids[i] < 0 || q->ids[i] >= nv)
			rc = cm_err_set(&err, -EINVAL, "ids[%zu]: %d is not in the vocabulary of %d",
					i, q->ids[i], nv);
	if (rc == 0)
		rc = engine_detokenize(tok, q->ids, (int)q->n_ids, false, &text, &err);
	pthread_rwlock_unlock(&s->model_lock);
	if (rc) {
		ipc_call_error(call, ipc_errcode_from_errno(rc), -1, "%s", err.msg);
		return;
	}
	struct ipc_reply rep = {.op = IPC_OP_DETOKENIZE, .retry_after_ms = -1};
	rep.u.detokenize.text = text;
	rep.u.detokenize.text_len = strlen(text);
	ipc_call_reply_encode(call, &rep);
	cm_free(text);
}

static void handle_info(struct daemon *d, ipc_call *call)
{
	struct sched *s = d->sched;
	const char *qt[40];
	size_t nq = 0;
	pthread_rwlock_rdlock(&s->model_lock);
	struct engine_model_info mi;
	engine_model_get_info(d->model, &mi);
	for (uint32_t t = 0; t < CM_ARRAY_LEN(mi.type_counts) && nq < CM_ARRAY_LEN(qt); t++)
		if (mi.type_counts[t])
			qt[nq++] = dtype_name(t);
	struct ipc_reply rep = {.op = IPC_OP_INFO, .retry_after_ms = -1};
	struct ipc_info_reply *in = &rep.u.info;
	char kernels[128];
	const char *kv = engine_kv_type_name(engine_ctx_kv_type(d->ctx));
	if (mi.n_x16_tensors)
		snprintf(kernels, sizeof(kernels), "%s, %u tensors repacked x16 (%.1f MiB), KV cache %s",
			 mi.isa, mi.n_x16_tensors, (double)mi.x16_bytes / (1 << 20), kv);
	else
		snprintf(kernels, sizeof(kernels), "%s, KV cache %s", mi.isa, kv);
	in->version = EDGELM_VERSION;
	in->model = d->model_name;
	in->architecture = mi.arch;
	in->quant_types = qt;
	in->n_quant_types = nq;
	in->n_ctx = d->cfg.ctx_size;
	in->n_vocab = mi.n_vocab;
	in->isa = mi.isa;
	in->kernels = kernels;
	in->threads = mi.n_threads;
	pthread_mutex_lock(&d->mu);
	in->tuning_json = d->tuning_json;
	ipc_call_reply_encode(call, &rep);
	pthread_mutex_unlock(&d->mu);
	pthread_rwlock_unlock(&s->model_lock);
}

static void handle_health(struct daemon *d, ipc_call *call)
{
	struct ipc_reply rep = {.op = IPC_OP_HEALTH, .retry_after_ms = -1};
	int phase = atomic_load(&d->phase);
	const char *reasons[4];
	size_t nr = 0;
	rep.u.health.status = phase == PHASE_READY     ? IPC_HEALTH_READY
			      : phase == PHASE_LOADING ? IPC_HEALTH_LOADING
						       : IPC_HEALTH_DRAINING;
	char buf[MONITOR_FLAG_COUNT][64]; /* the reasons' text, until encoded below */
	if (phase == PHASE_LOADING)
		reasons[nr++] = "loading a new model";
	if (phase == PHASE_DRAINING)
		reasons[nr++] = "shutting down";
	if (d->mon) {
		struct monitor_flag_state fl[MONITOR_FLAG_COUNT];
		monitor_flags_get(d->mon, fl);
		for (int i = 0; i < MONITOR_FLAG_COUNT && nr < CM_ARRAY_LEN(reasons); i++)
			if (fl[i].on && (i == MONITOR_FLAG_SWAPPING || i == MONITOR_FLAG_MEMORY_PRESSURE)) {
				snprintf(buf[i], sizeof(buf[i]), "degraded: %s",
					 monitor_flag_name((enum monitor_flag)i));
				reasons[nr++] = buf[i];
			}
	}
	rep.u.health.reasons = reasons;
	rep.u.health.n_reasons = nr;
	ipc_call_reply_encode(call, &rep);
}

static void handle_metrics(struct daemon *d, ipc_call *call)
{
	struct cm_err err = {0};
	char *json = NULL;
	size_t len = 0;
	if (!d->mon || monitor_json_render(d->mon, &json, &len, &err) != 0) {
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "metrics: %s",
			       d->mon ? err.msg : "monitor off");
		return;
	}
	struct ipc_reply rep = {.op = IPC_OP_METRICS, .retry_after_ms = -1};
	rep.u.metrics.json = json;
	ipc_call_reply_encode(call, &rep);
	cm_free(json);
}

void daemon_handle_call(ipc_call *call, void *userdata)
{
	struct daemon *d = userdata;
	const struct ipc_request *q = ipc_call_request(call);
	enum ipc_op op = q->op; /* q dies with the call once it is answered */
	if (!d->sched || !d->model) {
		ipc_call_error(call, IPC_ERR_NOT_READY, 500, NULL);
		return;
	}
	switch (q->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: handle_generate(d, call, q); return;
	case IPC_OP_POLL: handle_poll(d, call, q); return;
	case IPC_OP_CANCEL: handle_cancel(d, call, q); return;
	case IPC_OP_TOKENIZE: handle_tokenize(d, call, q); break;
	case IPC_OP_DETOKENIZE: handle_detokenize(d, call, q); break;
	case IPC_OP_INFO: handle_info(d, call); break;
	case IPC_OP_HEALTH: handle_health(d, call); break;
	case IPC_OP_METRICS: handle_metrics(d, call); break;
	default: ipc_call_error(call, IPC_ERR_UNKNOWN_OP, -1, NULL); return;
	}
	count_request(d, op, "ok");
}
