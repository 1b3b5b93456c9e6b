/* daemon/serve.h: the serving core's internals, shared by its files:
 *
 *   ops.c      the op handlers (nng threads);
 *   prepare.c  a generation's prompt, made on the text workers;
 *   store.c    requests: the table of live ids per identity, generated
 *              text, stop strings, held polls, finishing;
 *   sched.c    the scheduler thread: admission, the engine step, draining;
 *   policy.c   the batching policy (pure: tenants, queue, prefill shares);
 *   outbox.c   replies built under the lock, sent after it;
 *   textpool.c the text workers.
 *
 * Locking: d->mu guards the table, the policy (queue and tenants), each
 * request's "under mu" fields and the slots' ownership; engine state is
 * the scheduler thread's alone; s->model_lock is held for reading by text
 * workers while they use the model's tokenizer, and for writing by a model
 * swap. Nothing encodes JSON or calls nng under d->mu. */
#ifndef EDGELM_DAEMON_SERVE_H
#define EDGELM_DAEMON_SERVE_H

#include "daemon/daemon.h"
#include "daemon/outbox.h"
#include "daemon/policy.h"
#include "daemon/textpool.h"

/* One generated token's log-probability (logprobs), its piece and the
 * top alternatives' in the request's lp_pool. text_end: gen_len once the
 * token's text is in gen, LP_PENDING while the detokenizer holds it. */
#define LP_PENDING UINT32_MAX
struct lp_piece {
	uint32_t off;
	uint16_t len;
	float lp;
};
struct lp_entry {
	uint32_t text_end;
	struct lp_piece tok;
	uint8_t n_top;
	struct lp_piece top[IPC_MAX_TOP_LOGPROBS];
};

struct held_poll {
	ipc_call *call;
	uint64_t ack;
	uint64_t deadline_ns;
	struct held_poll *next;
};

enum req_state { RQ_PREPARING, RQ_QUEUED, RQ_RUNNING, RQ_FINISHED };

struct daemon_request {
	struct sched *s;
	char id[IPC_ID_MAX + 1];
	int tenant; /* policy tenant, a reference held while the request lives */
	enum ipc_op op;
	ipc_call *call; /* the generate/chat call: a stream's until it is queued */
	bool stream;
	bool parse_special;
	/* the prompt, made by a text worker before the request is queued; the
	 * text is kept until admission in case a model swap needs it again */
	char *prompt_text;
	size_t prompt_text_len;
	int32_t *prompt;
	int n_prompt;
	int n_keep_auto; /* context_keep -1's count: system prompt + BOS (chat), BOS */
	uint64_t model_gen; /* the model whose tokenizer made `prompt` */
	int max_tokens;
	struct engine_sampler_params sp;
	char **stop;
	size_t *stop_len;
	int n_stop;
	int32_t *bias_ids; /* logit_bias, the request's copy (sp points here) */
	float *bias;
	/* structured output: the GBNF (the request's grammar, or its
	 * json_schema converted), kept until admission in case a model swap
	 * needs it compiled again; the compiled grammar (a reference into
	 * s->grammars), which sp and the sampler borrow, is held until the
	 * sampler is freed */
	char *gbnf;
	size_t gbnf_len;
	struct gcache_entry *grammar;
	struct policy_item qi;
	uint64_t arrival_ns, deadline_ns, admit_ns, first_ns, prefill_end_ns, end_ns;
	bool stall;             /* test hook: stall the scheduler before its steps */
	bool in_table, in_slot; /* under mu; freed when both are false */

	/* scheduler thread only */
	int slot;
	int n_fed;    /* prompt tokens in the KV */
	int n_waited; /* steps in a row its prompt was passed over */
	int n_cached; /* of those, reused from the prefix cache */
	int n_gen;
	int n_shifted; /* positions context shifts dropped: the KV holds fewer */
	int n_keep;    /* positions a context shift keeps (context_keep, resolved) */
	int32_t last_tok;
	engine_sampler *smp;
	struct engine_detok detok;

	/* under mu */
	enum req_state state;
	char *gen; /* generated text; bytes < pub_len never change */
	size_t gen_len, gen_cap, pub_len;
	enum ipc_finish finish;
	/* logprobs (want_lp, n_top_lp set at arrival; the rest under mu) */
	bool want_lp;
	int n_top_lp;
	struct lp_entry *lp;
	size_t n_lp, cap_lp, lp_pending; /* lp_pending: the first entry without a text end */
	char *lp_pool;
	size_t lp_pool_len, lp_pool_cap;
	enum ipc_errcode fail_code; /* a stream refused after its id was sent: polls get it */
	char *fail_msg;
	bool cancel;
	uint64_t last_poll_ns;
	uint64_t max_ack;
	struct held_poll *polls;
	struct daemon_request *next; /* the table */

	/* embed (embed.c): every input's tokens back to back in emb_tok,
	 * input i at emb_off[i] (n_inputs + 1 entries); the one being run is
	 * copied to `prompt`. emb_block holds the reply's ipc_embedding array
	 * and their values (n_inputs x n_embd floats), handed to the reply. */
	int32_t *emb_tok;
	int *emb_off;
	int n_inputs, cur_input, n_embd;
	int pooling; /* enum engine_pooling, resolved */
	double *emb_acc;
	void *emb_block;
	int64_t emb_tokens; /* all inputs' */
};

/* grammars.c: compiled grammars shared by the requests that send the same
 * text, for the model generation they were compiled for. */
struct gcache_entry;
struct gcache {
	pthread_mutex_t mu;
	struct gcache_entry *head;
	int n;
	uint64_t model_gen; /* the newest seen: older entries go once unheld */
	uint64_t compiles, hits;
};
struct gcache_stats {
	int entries;
	uint64_t compiles, hits;
};
void gcache_init(struct gcache *c);
void gcache_fini(struct gcache *c); /* nothing may be held */
/* A reference to the grammar of `text` compiled for tok (the model of
 * model_gen): a kept one, or compiled now (engine_grammar_new's errors). */
int gcache_get(struct gcache *c, const engine_tokenizer *tok, uint64_t model_gen, const char *text,
	       size_t len, struct gcache_entry **ret, struct cm_err *err);
const engine_grammar *gcache_grammar(const struct gcache_entry *e); /* NULL: NULL */
void gcache_put(struct gcache *c, struct gcache_entry *e);          /* NULL-safe */
void gcache_stats(struct gcache *c, struct gcache_stats *ret);

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
	pthread_cond_t cv;           /* work for the scheduler (with d->mu) */
	pthread_rwlock_t model_lock; /* text workers read the tokenizer; a swap writes */
	uint64_t model_gen;          /* bumped by each swap (under model_lock and mu) */
	struct policy pol;           /* under mu */
	struct daemon_request *table;
	int n_preparing; /* requests on the text workers, counted against queue_size */
	_Atomic int n_text_ops; /* tokenize/detokenize calls on the text workers */
	int admin_uids[16];
	int n_admin;
	struct slot *slots;
	int n_slots;
	bool stopping;
	uint64_t stop_deadline_ns; /* running requests are cancelled after it */
	uint64_t stop_hard_ns;     /* and undelivered streams dropped after this */
	engine_model *swap_model;
	engine_ctx *swap_ctx;
	struct textpool text;
	struct outbox out;
	struct gcache grammars;
	/* batch scratch (scheduler thread) */
	int32_t *b_tok, *b_pos, *b_seq;
	bool *b_want;
	bool *b_embd; /* want_embd: prompt tokens of embed requests */
	struct daemon_request **b_req;
	int b_cap;
	struct policy_prefill_seq *pre;
	struct policy_slot *pslots;
	struct policy_chunk chunk;
	/* stats (scheduler thread; read approximately by sched_counts) */
	_Atomic int n_running;
	_Atomic double tok_s;
	uint64_t last_watchdog_ns;
	bool watchdog_withheld;
};

/* store.c (all under d->mu unless said otherwise) */
void req_free(struct daemon_request *r); /* no lock needed: r is nobody else's */
struct daemon_request *store_find(struct sched *s, int tenant, bool admin, const char *id);
void store_add(struct sched *s, struct daemon_request *r);
void store_unlist(struct sched *s, struct daemon_request *r);
/* r may be freed now that it left its slot or the table */
void store_maybe_free(struct sched *s, struct daemon_request *r);
int store_gen_append(struct daemon_request *r, const char *p, size_t n);
/* Record a generated token's log-probability (under mu); then
 * store_lp_settle once its text is appended, so that entries waiting for
 * text get its end. */
int store_lp_add(struct daemon_request *r, const struct lp_entry *e, const char *const *pieces);
void store_lp_settle(struct daemon_request *r);
bool store_check_stops(struct daemon_request *r);
bool store_answer_poll(struct sched *s, struct daemon_request *r, ipc_call *call, uint64_t ack,
		       bool may_release, struct outbox_list *out);
void store_answer_held_polls(struct sched *s, struct daemon_request *r, bool all,
			     struct outbox_list *out);
void store_finish(struct sched *s, struct daemon_request *r, enum ipc_finish f,
		  struct outbox_list *out);
/* An error for a request that never ran: it leaves the table (a stream's
 * id stays pollable, and ends cancelled). */
void store_fail(struct sched *s, struct daemon_request *r, enum ipc_errcode code, const char *msg,
		struct outbox_list *out);
void store_count(struct daemon *d, enum ipc_op op, const char *outcome);
/* Live streams in the table (finished or not): a drain waits for them. */
int store_n_streams(struct sched *s);

/* embed.c: an embed request's inputs, tokenized and checked on a text
 * worker (model_lock held); whether prompt position pos of the current
 * input needs its hidden state; batch token i's state taken after a step
 * (the scheduler thread; finishes the request after its last input,
 * taking mu); and its reply, built in store_finish (under mu). */
int embed_prepare(struct daemon *d, struct daemon_request *r, const struct ipc_request *q,
		  struct cm_err *err);
bool embed_wants(const struct daemon_request *r, int pos);
void embed_take(struct sched *s, struct daemon_request *r, int i, struct outbox_list *out);
void embed_reply(struct daemon_request *r, enum ipc_finish f, struct outbox_msg *m);

/* prepare.c: prepare a generation on a text worker (render, tokenize,
 * check, sampler), then queue it. */
void ops_prepare(void *arg);


#endif
