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

/* Render a chat's messages with the model's template (model_lock held). */
static int render_chat(struct daemon *d, const struct ipc_request *q, struct daemon_request *r,
		       struct cm_err *err)
{
	enum engine_chat_format f;
	struct engine_chat_msg *msgs = cm_calloc(q->n_messages ? q->n_messages : 1, sizeof(*msgs));
	if (!msgs)
		return cm_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < q->n_messages; i++) {
		msgs[i].role = (enum engine_chat_role)q->messages[i].role;
		msgs[i].content = q->messages[i].content;
		msgs[i].len = q->messages[i].content_len;
	}
	int rc = engine_chat_detect(d->model, d->cfg.chat_template, &f, err);
	if (rc == 0)
		rc = engine_chat_render(f, msgs, q->n_messages, true, &r->prompt_text,
					&r->prompt_text_len, err);
	cm_free(msgs);
	if (rc == -ENOTSUP)
		rc = cm_err_set(err, -EOPNOTSUPP, "%s", err->msg);
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

/* Tokenize r's prompt text and check it against the context (model_lock
 * held); the sampler is made here too, so admission only places it. */
static int tokenize_prompt(struct daemon *d, struct daemon_request *r, struct cm_err *err)
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
	if (n == 0)
		return cm_err_set(err, -EINVAL, "the prompt is empty and the model adds no BOS");
	if ((uint32_t)n >= d->cfg.ctx_size)
		return cm_err_set(err, -E2BIG,
				  "prompt of %d tokens does not fit the context of %u tokens", n,
				  d->cfg.ctx_size);
	engine_sampler_free(r->smp);
	r->smp = NULL;
	if ((rc = compile_grammar(d->sched, tok, r, err)))
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
	int rc = 0;

	pthread_rwlock_rdlock(&s->model_lock);
	uint64_t gen = s->model_gen;
	if (!r->prompt_text) {
		/* the call is alive: nobody completes it while the request prepares */
		const struct ipc_request *q = ipc_call_request(r->call);
		rc = take_grammar(q, r, &err);
		if (rc == 0 && q->op == IPC_OP_CHAT) {
			r->parse_special = true;
			rc = render_chat(d, q, r, &err);
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
	if (rc == 0)
		rc = tokenize_prompt(d, r, &err);
	pthread_rwlock_unlock(&s->model_lock);

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

