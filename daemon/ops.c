/* daemon/ops.c: the op handlers (serve.h).
 *
 * They run on nng's threads and never wait for the engine or for text
 * work: health, info, metrics, poll and cancel are answered here from
 * state copied under d->mu; tokenize, detokenize and the preparation of a
 * generation (chat rendering, tokenizing, the context check) run on the
 * text workers, which hold the model lock for reading meanwhile.
 *
 * Every generation belongs to its caller's identity (policy_identity: the
 * peer uid over ipc://, the API key's name over HTTP). poll and cancel find only the caller's own ids
 * (admin_uids excepted), and another identity's id answers not_found like
 * one that never existed. Ids the daemon makes are 128 random bits.
 *
 * Nothing here counts requests: the server reports every reply, refusals
 * of its own included, to daemon_count_reply (metrics.c). */
#include "common/net.h"
#include "daemon/log.h"
#include "daemon/serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* Text ops (tokenize, detokenize) on the text workers at once, at most. */
#define TEXT_OPS_MAX 32

struct caller {
	char name[POLICY_NAME_MAX];
	bool admin;
};

static void caller_of(struct sched *s, ipc_call *call, struct caller *c)
{
	int64_t uid = -1;
	const char *who = ipc_call_identity(call);
	c->admin = false;
	if (who) {
		/* another transport's caller (http/: "http:KEYNAME") */
		snprintf(c->name, sizeof(c->name), "%s", who);
		return;
	}
	ipc_call_peer(call, NULL, &uid);
	policy_identity(uid, c->name, sizeof(c->name));
	for (int i = 0; i < s->n_admin && uid >= 0; i++)
		c->admin |= s->admin_uids[i] == uid;
}

/* 128 random bits: ids another client cannot guess. */
static void random_id(char *buf, size_t cap)
{
	uint8_t b[16];
	cm_random_bytes(b, sizeof(b));
	char *p = buf;
	p += snprintf(p, cap, "r-");
	for (size_t i = 0; i < sizeof(b) && (size_t)(p - buf) + 3 <= cap; i++)
		p += snprintf(p, 3, "%02x", b[i]);
}

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
		uint64_t seed;
		if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed))
			seed = cm_now_ns() * 2654435761u;
		sp->seed = seed;
	}
	*ret_max_tokens =
	    (in->set & IPC_SET_MAX_TOKENS) ? in->max_tokens : (int)cfg->max_tokens_default;
}

/* ---- generate, chat ------------------------------------------------------------ */

static int copy_stops(struct daemon_request *r, const struct ipc_request *q)
{
	if (q->n_stop == 0)
		return 0;
	r->stop = cm_calloc(q->n_stop, sizeof(*r->stop));
	r->stop_len = cm_calloc(q->n_stop, sizeof(*r->stop_len));
	if (!r->stop || !r->stop_len)
		return -ENOMEM;
	for (size_t i = 0; i < q->n_stop; i++) {
		if (!(r->stop[i] = cm_strndup(q->stop[i], q->stop_len[i])))
			return -ENOMEM;
		r->stop_len[i] = q->stop_len[i];
		r->n_stop++;
	}
	return 0;
}

/* logit_bias: the request's own copy, which the sampler parameters point
 * to (a model swap makes the sampler again after the call is gone). */
static int copy_bias(struct daemon_request *r, const struct ipc_request *q)
{
	if (q->n_bias == 0)
		return 0;
	r->bias_ids = cm_malloc(q->n_bias * sizeof(*r->bias_ids));
	r->bias = cm_malloc(q->n_bias * sizeof(*r->bias));
	if (!r->bias_ids || !r->bias)
		return -ENOMEM;
	memcpy(r->bias_ids, q->bias_ids, q->n_bias * sizeof(*r->bias_ids));
	memcpy(r->bias, q->bias, q->n_bias * sizeof(*r->bias));
	r->sp.bias_ids = r->bias_ids;
	r->sp.bias = r->bias;
	r->sp.n_bias = (int)q->n_bias;
	return 0;
}

static void handle_generate(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	if ((q->sampling.set & IPC_SET_MAX_TOKENS) &&
	    (uint32_t)q->sampling.max_tokens > d->cfg.max_tokens_limit) {
		ipc_call_error(call, IPC_ERR_INVALID_FIELD, -1,
			       "max_tokens: %d is over this daemon's limit of %u (max_tokens_limit)",
			       q->sampling.max_tokens, d->cfg.max_tokens_limit);
		return;
	}
	struct daemon_request *r = cm_calloc(1, sizeof(*r));
	if (!r || copy_stops(r, q) != 0) {
		req_free(r);
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	r->s = s;
	r->op = q->op;
	r->stream = q->stream;
	r->slot = -1;
	r->qi.priority = q->priority;
	r->arrival_ns = ipc_call_arrival_ns(call);
	r->last_poll_ns = cm_now_ns();
	uint64_t dl = q->deadline_ms ? (uint64_t)q->deadline_ms : d->cfg.deadline_ms_default;
	r->deadline_ns = dl ? r->arrival_ns + dl * 1000000ull : 0;
	sampling_from_request(&d->cfg, &q->sampling, &r->sp, &r->max_tokens);
	r->want_lp = q->logprobs || q->top_logprobs > 0;
	r->n_top_lp = q->top_logprobs;
	if (copy_bias(r, q) != 0) {
		req_free(r);
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	struct caller who;
	caller_of(s, call, &who);

	pthread_mutex_lock(&d->mu);
	enum ipc_errcode code = IPC_ERR_NONE;
	char msg[160] = "";
	int64_t retry = -1;
	/* requests on the text workers or in the queue that no free slot
	 * will take at once: a burst into an idle daemon is not refused */
	int free_slots = 0;
	for (int i = 0; i < s->n_slots; i++)
		free_slots += !s->slots[i].req;
	int waiting = s->pol.n_queued + s->n_preparing - free_slots;
	if (s->stopping || atomic_load(&d->phase) == PHASE_DRAINING) {
		code = IPC_ERR_SHUTTING_DOWN;
	} else if (waiting >= (int)d->cfg.queue_size) {
		code = IPC_ERR_QUEUE_FULL;
		snprintf(msg, sizeof(msg), "queue full (%d waiting)", waiting);
		/* a rough hint: a slot frees every few hundred ms under load */
		retry = 250 + 50 * (int64_t)waiting;
	} else if ((r->tenant = policy_tenant_get(&s->pol, who.name)) < 0) {
		code = IPC_ERR_QUEUE_FULL;
		snprintf(msg, sizeof(msg), "too many identities with live requests");
		retry = 1000;
	} else if (q->id && store_find(s, r->tenant, false, q->id)) {
		policy_tenant_put(&s->pol, r->tenant);
		code = IPC_ERR_INVALID_FIELD;
		snprintf(msg, sizeof(msg), "id '%s' is in use", q->id);
	}
	if (code != IPC_ERR_NONE) {
		pthread_mutex_unlock(&d->mu);
		req_free(r);
		ipc_call_error(call, code, retry, msg[0] ? "%s" : NULL, msg);
		return;
	}
	if (q->id)
		snprintf(r->id, sizeof(r->id), "%s", q->id);
	else
		random_id(r->id, sizeof(r->id));
	r->qi.tenant = r->tenant;
	r->state = RQ_PREPARING;
	r->call = call;
	store_add(s, r);
	s->n_preparing++;
	pthread_mutex_unlock(&d->mu);

	int rc = textpool_submit(&s->text, ops_prepare, r);
	if (rc) {
		struct outbox_list out;
		OUTBOX_LIST_INIT(&out);
		pthread_mutex_lock(&d->mu);
		s->n_preparing--;
		r->state = RQ_QUEUED; /* no longer the text workers' */
		store_fail(s, r, rc == -ESHUTDOWN ? IPC_ERR_SHUTTING_DOWN : IPC_ERR_QUEUE_FULL,
			   rc == -ESHUTDOWN ? "the daemon is shutting down" : "text workers busy",
			   &out);
		pthread_mutex_unlock(&d->mu);
		outbox_send(&out);
	}
}

/* ---- poll, cancel ------------------------------------------------------------ */

static struct daemon_request *find_own(struct sched *s, ipc_call *call, const char *id)
{
	struct caller who;
	caller_of(s, call, &who);
	int t = policy_tenant_find(&s->pol, who.name);
	if (t < 0 && !who.admin)
		return NULL;
	return store_find(s, t, who.admin, id);
}

static void handle_poll(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	char msg[160] = "";
	pthread_mutex_lock(&d->mu);
	struct daemon_request *r = find_own(s, call, q->id);
	if (!r || !r->stream) {
		snprintf(msg, sizeof(msg), "no stream '%s'", q->id ? q->id : "");
		outbox_error(&out, call, q->id, IPC_ERR_NOT_FOUND, -1, msg);
	} else if (q->ack > r->pub_len || q->ack < r->max_ack) {
		snprintf(msg, sizeof(msg), "ack %llu out of range [%llu, %llu]",
			 (unsigned long long)q->ack, (unsigned long long)r->max_ack,
			 (unsigned long long)r->pub_len);
		outbox_error(&out, call, q->id, IPC_ERR_INVALID_FIELD, -1, msg);
	} else {
		r->max_ack = q->ack;
		r->last_poll_ns = cm_now_ns();
		bool now = q->wait_ms == 0 || r->pub_len > q->ack || r->state == RQ_FINISHED ||
			   !s->started;
		struct held_poll *h = now ? NULL : cm_calloc(1, sizeof(*h));
		if (h) {
			h->call = call;
			h->ack = q->ack;
			h->deadline_ns = r->last_poll_ns + (uint64_t)q->wait_ms * 1000000ull;
			h->next = r->polls;
			r->polls = h;
			pthread_cond_signal(&s->cv);
		} else {
			store_answer_poll(s, r, call, q->ack, true, &out);
		}
	}
	pthread_mutex_unlock(&d->mu);
	outbox_send(&out);
}

static void handle_cancel(struct daemon *d, ipc_call *call, const struct ipc_request *q)
{
	struct sched *s = d->sched;
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	char id[IPC_ID_MAX + 1] = "";
	pthread_mutex_lock(&d->mu);
	struct daemon_request *r = find_own(s, call, q->id);
	if (!r) {
		char msg[160];
		snprintf(msg, sizeof(msg), "no generation '%s'", q->id ? q->id : "");
		outbox_error(&out, call, q->id, IPC_ERR_NOT_FOUND, -1, msg);
	} else {
		snprintf(id, sizeof(id), "%s", r->id);
		struct outbox_msg *m = outbox_add(&out, call, IPC_OP_CANCEL, r->id);
		if (r->state == RQ_FINISHED) {
			if (m)
				m->rep.u.cancel.cancelled = false;
			if (r->stream && !r->polls)
				store_unlist(s, r);
		} else {
			r->cancel = true;
			if (m)
				m->rep.u.cancel.cancelled = true;
			pthread_cond_signal(&s->cv);
		}
	}
	pthread_mutex_unlock(&d->mu);
	if (id[0])
		daemon_log(LOG_INFO, id, "cancel requested");
	outbox_send(&out);
}

/* ---- tokenize, detokenize (on the text workers) ----------------------------- */

struct text_job {
	struct sched *s;
	ipc_call *call;
};

static void text_job_done(struct text_job *j)
{
	atomic_fetch_sub(&j->s->n_text_ops, 1);
	cm_free(j);
}

static void do_tokenize(void *arg)
{
	struct text_job *j = arg;
	struct daemon *d = j->s->d;
	const struct ipc_request *q = ipc_call_request(j->call);
	struct cm_err err = {0};
	int32_t *ids = cm_malloc((q->text_len + 8) * sizeof(int32_t));
	int n = 0, rc = ids ? 0 : cm_err_set(&err, -ENOMEM, "out of memory");
	if (rc == 0) {
		pthread_rwlock_rdlock(&j->s->model_lock);
		rc = engine_tokenize(engine_model_tokenizer(d->model), q->text ? q->text : "",
				     q->text_len, q->add_special, q->parse_special, ids,
				     (int)(q->text_len + 8), &n, &err);
		pthread_rwlock_unlock(&j->s->model_lock);
	}
	if (rc) {
		ipc_call_error(j->call, ipc_errcode_from_errno(rc), -1, "%s", err.msg);
	} else {
		struct ipc_reply rep = {.op = IPC_OP_TOKENIZE, .retry_after_ms = -1};
		rep.u.tokenize.ids = ids;
		rep.u.tokenize.n_ids = (size_t)n;
		ipc_call_reply_encode(j->call, &rep);
	}
	cm_free(ids);
	text_job_done(j);
}

static void do_detokenize(void *arg)
{
	struct text_job *j = arg;
	struct daemon *d = j->s->d;
	const struct ipc_request *q = ipc_call_request(j->call);
	struct cm_err err = {0};
	char *text = NULL;
	pthread_rwlock_rdlock(&j->s->model_lock);
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	int nv = engine_tokenizer_n_vocab(tok);
	int rc = 0;
	for (size_t i = 0; i < q->n_ids && rc == 0; i++)
		if (q->ids[i] < 0 || q->ids[i] >= nv)
			rc = cm_err_set(&err, -EINVAL, "ids[%zu]: %d is not in the vocabulary of %d",
					i, q->ids[i], nv);
	if (rc == 0)
		rc = engine_detokenize(tok, q->ids, (int)q->n_ids, q->special, &text, &err);
	pthread_rwlock_unlock(&j->s->model_lock);
	if (rc) {
		ipc_call_error(j->call, ipc_errcode_from_errno(rc), -1, "%s", err.msg);
	} else {
		struct ipc_reply rep = {.op = IPC_OP_DETOKENIZE, .retry_after_ms = -1};
		rep.u.detokenize.text = text;
		rep.u.detokenize.text_len = strlen(text);
		ipc_call_reply_encode(j->call, &rep);
	}
	cm_free(text);
	text_job_done(j);
}

static void submit_text_op(struct daemon *d, ipc_call *call, textpool_fn fn)
{
	struct sched *s = d->sched;
	struct text_job *j = cm_calloc(1, sizeof(*j));
	if (!j) {
		ipc_call_error(call, IPC_ERR_INTERNAL, -1, "out of memory");
		return;
	}
	j->s = s;
	j->call = call;
	int rc = -EAGAIN;
	if (atomic_fetch_add(&s->n_text_ops, 1) < TEXT_OPS_MAX)
		rc = textpool_submit(&s->text, fn, j);
	if (rc == 0)
		return;
	atomic_fetch_sub(&s->n_text_ops, 1);
	cm_free(j);
	enum ipc_errcode code = rc == -ESHUTDOWN ? IPC_ERR_SHUTTING_DOWN : IPC_ERR_QUEUE_FULL;
	ipc_call_error(call, code, code == IPC_ERR_QUEUE_FULL ? 200 : -1,
		       code == IPC_ERR_QUEUE_FULL ? "%d text requests in progress" : NULL,
		       TEXT_OPS_MAX);
}

/* ---- info, health, metrics --------------------------------------------------- */

static void handle_info(struct daemon *d, ipc_call *call)
{
	/* copied under the lock, encoded after it */
	char arch[32], isa[32], kernels[160], model[256];
	const char *qt[ENGINE_TYPE_SLOTS];
	size_t nq = 0;
	char *tuning = NULL;
	struct ipc_reply rep = {.op = IPC_OP_INFO, .retry_after_ms = -1};
	struct ipc_info_reply *in = &rep.u.info;
	pthread_mutex_lock(&d->mu);
	const struct engine_model_info *mi = &d->minfo;
	for (uint32_t t = 0; t < CM_ARRAY_LEN(mi->type_counts) && nq < CM_ARRAY_LEN(qt); t++)
		if (mi->type_counts[t])
			qt[nq++] = engine_dtype_name(t); /* static strings */
	snprintf(arch, sizeof(arch), "%s", mi->arch);
	snprintf(isa, sizeof(isa), "%s", mi->isa);
	snprintf(model, sizeof(model), "%s", d->model_name);
	if (mi->n_x16_tensors)
		snprintf(kernels, sizeof(kernels),
			 "%s, %u tensors repacked x16 (%.1f MiB), KV cache %s", mi->isa,
			 mi->n_x16_tensors, (double)mi->x16_bytes / (1 << 20), d->kv_type_name);
	else
		snprintf(kernels, sizeof(kernels), "%s, KV cache %s", mi->isa, d->kv_type_name);
	in->n_vocab = mi->n_vocab;
	in->threads = mi->n_threads;
	in->n_ctx = d->cfg.ctx_size;
	if (d->tuning_json)
		tuning = cm_strdup(d->tuning_json);
	pthread_mutex_unlock(&d->mu);
	in->version = EDGELM_VERSION;
	in->model = model;
	in->architecture = arch;
	in->quant_types = qt;
	in->n_quant_types = nq;
	in->isa = isa;
	in->kernels = kernels;
	in->tuning_json = tuning;
	ipc_call_reply_encode(call, &rep);
	cm_free(tuning);
}

static void handle_health(struct daemon *d, ipc_call *call)
{
	struct ipc_reply rep = {.op = IPC_OP_HEALTH, .retry_after_ms = -1};
	int phase = atomic_load(&d->phase);
	const char *reasons[6];
	size_t nr = 0;
	rep.u.health.status = phase == PHASE_READY     ? IPC_HEALTH_READY
			      : phase == PHASE_LOADING ? IPC_HEALTH_LOADING
						       : IPC_HEALTH_DRAINING;
	char buf[MONITOR_FLAG_COUNT][64]; /* the reasons' text, until encoded below */
	if (phase == PHASE_LOADING)
		reasons[nr++] = "loading the model";
	if (atomic_load(&d->reloading))
		reasons[nr++] = "loading a new model; the current one serves";
	if (phase == PHASE_DRAINING)
		reasons[nr++] = "shutting down";
	if (d->mon) {
		struct monitor_flag_state fl[MONITOR_FLAG_COUNT];
		monitor_flags_get(d->mon, fl);
		for (int i = 0; i < MONITOR_FLAG_COUNT && nr < CM_ARRAY_LEN(reasons); i++)
			if (fl[i].on &&
			    (i == MONITOR_FLAG_SWAPPING || i == MONITOR_FLAG_MEMORY_PRESSURE)) {
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
	bool draining = atomic_load(&d->phase) == PHASE_DRAINING;
	switch (op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT:
	case IPC_OP_TOKENIZE:
	case IPC_OP_DETOKENIZE:
		if (draining) {
			/* new work is refused; polls, cancels, health go on */
			ipc_call_error(call, IPC_ERR_SHUTTING_DOWN, -1, NULL);
			return;
		}
		break;
	default: break;
	}
	switch (op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: handle_generate(d, call, q); return;
	case IPC_OP_POLL: handle_poll(d, call, q); return;
	case IPC_OP_CANCEL: handle_cancel(d, call, q); return;
	case IPC_OP_TOKENIZE: submit_text_op(d, call, do_tokenize); return;
	case IPC_OP_DETOKENIZE: submit_text_op(d, call, do_detokenize); return;
	case IPC_OP_INFO: handle_info(d, call); break;
	case IPC_OP_HEALTH: handle_health(d, call); break;
	case IPC_OP_METRICS: handle_metrics(d, call); break;
	default: ipc_call_error(call, IPC_ERR_UNKNOWN_OP, -1, NULL); return;
	}
}
