/* daemon/prepare.c: a generation's prompt, made on a text worker before the
 * request is queued (serve.h): the chat rendered with the model's template,
 * tokenized, checked against the context, the grammar (a json_schema
 * converted first) compiled for its tokenizer, the sampler made. Called by the
 * handlers (ops.c) and again by the scheduler (sched.c) for a prompt that
 * was tokenized for a model since swapped out. */
#include "daemon/log.h"
#include "daemon/serve.h"
#include "ipc/json_schema.h"

#include <stdio.h>
#include <string.h>

/* Tokenize r's prompt text into r->prompt (model_lock held). */
static int tokenize_text(struct daemon *d, struct daemon_request *r, struct cm_err *err)
{
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	int cap = (int)CM_MIN(r->prompt_text_len + 8, (size_t)1 << 24), n = 0;
	cm_free(r->prompt);
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
	int32_t bos = engine_tokenizer_bos(tok);
	r->n_keep_auto = n > 0 && bos >= 0 && r->prompt[0] == bos ? 1 : 0;
	return 0;
}

/* Render the messages whose keep[] is set into r->prompt_text and tokenize
 * them (model_lock held). */
static int render_tokenize(struct daemon *d, enum engine_chat_format f,
			   const struct engine_chat_msg *all, const bool *keep, size_t n,
			   bool gen_prompt, struct engine_chat_msg *msgs, struct daemon_request *r,
			   struct cm_err *err)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (keep[i])
			msgs[k++] = all[i];
	cm_free(r->prompt_text);
	r->prompt_text = NULL;
	int rc = engine_chat_render(f, msgs, k, gen_prompt, &r->prompt_text, &r->prompt_text_len,
				    err);
	if (rc == -ENOTSUP)
		return cm_err_set(err, -EOPNOTSUPP, "%s", err->msg);
	return rc ? rc : tokenize_text(d, r, err);
}

/* The chat rendered with the model's template and tokenized (model_lock
 * held). A history that leaves no room for min(max_tokens, ctx / 4)
 * generated tokens loses whole messages, oldest first, but never a system
 * message nor the last user message and what follows it (*ret_dropped).
 * r->n_keep_auto becomes the tokens the system messages alone render to
 * (BOS included), as far as they are the prompt's start. */
static int prepare_chat(struct daemon *d, const struct ipc_request *q, struct daemon_request *r,
			int *ret_dropped, struct cm_err *err)
{
	enum engine_chat_format f;
	size_t n = q->n_messages;
	struct engine_chat_msg *all = cm_calloc(2 * (n ? n : 1), sizeof(*all)), *msgs = all + n;
	bool *keep = cm_calloc(n ? n : 1, sizeof(*keep));
	struct daemon_request sys = {.parse_special = true};
	int rc = all && keep ? engine_chat_detect(d->model, d->cfg.chat_template, &f, err)
			     : cm_err_set(err, -ENOMEM, "out of memory");
	size_t last_user = 0, n_drop = 0; /* droppable: before last_user, not system */
	for (size_t i = 0; rc == 0 && i < n; i++) {
		all[i] = (struct engine_chat_msg){(enum engine_chat_role)q->messages[i].role,
						  q->messages[i].content,
						  q->messages[i].content_len};
		if (all[i].role == ENGINE_CHAT_USER)
			last_user = i;
	}
	for (size_t i = 0; i < last_user; i++)
		n_drop += all[i].role != ENGINE_CHAT_SYSTEM;
	uint32_t room = CM_MIN((uint32_t)CM_MAX(r->max_tokens, 0), d->cfg.ctx_size / 4);
	/* the fewest droppable messages whose loss makes it fit, by bisection
	 * (a history of 1024 messages renders 11 times, not 1024) */
	size_t lo = 0, hi = n_drop, k = 0;
	for (bool last = false; rc == 0; ) {
		size_t dropped = 0;
		for (size_t i = 0; i < n; i++) {
			bool drop = i < last_user && all[i].role != ENGINE_CHAT_SYSTEM && dropped < k;
			dropped += drop;
			keep[i] = !drop;
		}
		rc = render_tokenize(d, f, all, keep, n, true, msgs, r, err);
		if (rc || last)
			break;
		if ((uint32_t)r->n_prompt + room <= d->cfg.ctx_size)
			hi = k;
		else
			lo = k + 1;
		if (lo >= hi) { /* the answer (hi: all droppable gone, or it fit) */
			last = hi != k;
			k = hi;
			if (!last)
				break;
		} else {
			k = lo + (hi - lo) / 2;
		}
	}
	*ret_dropped = rc ? 0 : (int)k;
	if (rc == 0) {
		int n_sys = 0;
		for (size_t i = 0; i < n; i++)
			n_sys += (keep[i] = all[i].role == ENGINE_CHAT_SYSTEM);
		if (n_sys && render_tokenize(d, f, all, keep, n, false, msgs, &sys, err) == 0) {
			int same = 0;
			while (same < sys.n_prompt && same < r->n_prompt &&
			       sys.prompt[same] == r->prompt[same])
				same++;
			r->n_keep_auto = CM_MAX(r->n_keep_auto, same);
		}
	}
	cm_free(sys.prompt_text);
	cm_free(sys.prompt);
	cm_free(all);
	cm_free(keep);
	return rc;
}

/* The GBNF of a request's grammar or json_schema (the call is alive). A
 * schema the converter refuses is the request's fault: invalid_field. */
static int take_grammar(const struct ipc_request *q, struct daemon_request *r, struct cm_err *err)
{
	if (q->grammar) {
		r->gbnf = cm_strndup(q->grammar, q->grammar_len);
		r->gbnf_len = q->grammar_len;
		return r->gbnf ? 0 : cm_err_set(err, -ENOMEM, "out of memory");
	}
	if (!q->json_schema)
		return 0;
	int rc = ipc_json_schema_to_gbnf(q->json_schema, q->json_schema_len, &r->gbnf, err);
	if (rc == 0)
		r->gbnf_len = strlen(r->gbnf);
	else if (rc != -ENOMEM)
		rc = err->code = -EINVAL;
	return rc;
}

/* Compile r's grammar for the model's tokenizer, or take the one compiled
 * for an earlier request (model_lock held), again after a swap: a syntax
 * error is invalid_field, with its line and column. */
static int compile_grammar(struct sched *s, const engine_tokenizer *tok, struct daemon_request *r,
			   struct cm_err *err)
{
	gcache_put(&s->grammars, r->grammar); /* its sampler is gone already */
	r->grammar = NULL;
	r->sp.grammar = NULL;
	if (!r->gbnf)
		return 0;
	int rc = gcache_get(&s->grammars, tok, s->model_gen, r->gbnf, r->gbnf_len, &r->grammar,
			    err);
	if (rc && rc != -EINVAL && rc != -ENOMEM)
		rc = err->code = -EIO; /* the model's side (its vocabulary), not the request's */
	r->sp.grammar = gcache_grammar(r->grammar);
	return rc;
}

/* Check r's tokens against the context (model_lock held); the sampler is
 * made here too, so admission only places it. */
static int tokenize_prompt(struct daemon *d, struct daemon_request *r, struct cm_err *err)
{
	int n = r->n_prompt;
	if (n == 0)
		return cm_err_set(err, -EINVAL, "the prompt is empty and the model adds no BOS");
	if ((uint32_t)n >= d->cfg.ctx_size)
		return cm_err_set(err, -E2BIG,
				  "prompt of %d tokens does not fit the context of %u tokens", n,
				  d->cfg.ctx_size);
	engine_sampler_free(r->smp);
	r->smp = NULL;
	int rc = compile_grammar(d->sched, engine_model_tokenizer(d->model), r, err);
	if (rc)
		return rc;
	struct engine_model_info mi;
	engine_model_get_info(d->model, &mi);
	return engine_sampler_new(&r->sp, (int)mi.n_vocab, &r->smp, err);
}

void ops_prepare(void *arg)
{
	struct daemon_request *r = arg;
	struct sched *s = r->s;
	struct daemon *d = s->d;
	struct cm_err err = {0};
	int rc = 0, n_dropped = 0;
	size_t n_msgs = 0;
	bool tokenized = false;

	pthread_rwlock_rdlock(&s->model_lock);
	uint64_t gen = s->model_gen;
	if (r->op == IPC_OP_EMBED) {
		/* the call lives until the reply: embed never streams */
		rc = embed_prepare(d, r, ipc_call_request(r->call), &err);
	} else if (!r->prompt_text) {
		/* the call is alive: nobody completes it while the request prepares */
		const struct ipc_request *q = ipc_call_request(r->call);
		rc = take_grammar(q, r, &err);
		if (rc == 0 && q->op == IPC_OP_CHAT) {
			r->parse_special = true;
			n_msgs = q->n_messages;
			rc = prepare_chat(d, q, r, &n_dropped, &err);
			tokenized = true;
		} else if (rc == 0) {
			r->prompt_text = cm_strndup(q->prompt ? q->prompt : "", q->prompt_len);
			r->prompt_text_len = q->prompt_len;
			if (!r->prompt_text)
				rc = cm_err_set(&err, -ENOMEM, "out of memory");
		}
		if (rc == 0 && d->cfg.watchdog_stall_ms &&
		    strstr(r->prompt_text, "__edgelm_test_stall__"))
			r->stall = true;
	}
	if (rc == 0 && !tokenized && r->op != IPC_OP_EMBED)
		rc = tokenize_text(d, r, &err);
	if (rc == 0 && r->op != IPC_OP_EMBED)
		rc = tokenize_prompt(d, r, &err);
	pthread_rwlock_unlock(&s->model_lock);
	if (n_dropped)
		daemon_log(LOG_INFO, r->id, "chat trimmed to the context: %d of %zu messages dropped",
			   n_dropped, n_msgs);

	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	char id[IPC_ID_MAX + 1];
	snprintf(id, sizeof(id), "%s", r->id);
	enum ipc_op op = r->op;
	bool stream = r->stream, queued = false;
	int n_prompt = r->n_prompt;
	pthread_mutex_lock(&d->mu);
	s->n_preparing--;
	r->state = RQ_QUEUED; /* the scheduler's from here (a cancel is seen at admission) */
	r->model_gen = gen;
	if (rc) {
		store_fail(s, r, ipc_errcode_from_errno(rc), err.msg, &out);
	} else if (s->stopping) {
		store_fail(s, r, IPC_ERR_SHUTTING_DOWN, "the daemon is shutting down", &out);
	} else {
		policy_enqueue(&s->pol, &r->qi);
		if (stream && r->call) {
			struct outbox_msg *m = outbox_add(&out, r->call, op, id);
			if (m)
				m->rep.u.gen.stream = true;
			r->call = NULL;
		}
		queued = true;
		pthread_cond_signal(&s->cv);
	}
	pthread_mutex_unlock(&d->mu);
	if (queued)
		daemon_log(LOG_INFO, id, "%s queued (%d prompt tokens%s)", ipc_op_name(op), n_prompt,
			   stream ? ", streaming" : "");
	else
		daemon_log(LOG_INFO, id, "%s refused: %s", ipc_op_name(op),
			   rc ? err.msg : "the daemon is shutting down");
	outbox_send(&out);
}

