/* daemon/embed.c: the embed op in the serving core (serve.h).
 *
 * An embed request is a request like a generation's with nothing to
 * generate: it is tokenized on a text worker, queued and admitted by the
 * same fair share, and its inputs are prefilled one after another in its
 * slot, in the policy's chunks beside other requests' decodes and
 * prefills. The prompt tokens of an embed request ask the engine for their
 * hidden states instead of logits, so a step of embeddings alone skips the
 * output matmul. After an input's last token its states are pooled into a
 * unit vector and the slot is cleared for the next input; after the last
 * input the request finishes with its reply.
 *
 * A token's state depends neither on its batch nor on the chunking
 * (forward.c), and pooling sums in double, so an input's vector is the
 * same alone, in a list or beside generations (within float rounding of
 * the mean). */
#include "daemon/log.h"
#include "daemon/serve.h"

#include <string.h>

static enum engine_pooling pooling_of(enum ipc_pooling p)
{
	switch (p) {
	case IPC_POOL_MEAN: return ENGINE_POOL_MEAN;
	case IPC_POOL_CLS: return ENGINE_POOL_CLS;
	case IPC_POOL_LAST: return ENGINE_POOL_LAST;
	default: return ENGINE_POOL_UNSPECIFIED;
	}
}

/* Point `prompt` at input k (the scheduler's view of the current input). */
static void select_input(struct daemon_request *r, int k)
{
	r->cur_input = k;
	r->n_prompt = r->emb_off[k + 1] - r->emb_off[k];
	memcpy(r->prompt, r->emb_tok + r->emb_off[k], (size_t)r->n_prompt * sizeof(int32_t));
	r->n_fed = 0;
}

int embed_prepare(struct daemon *d, struct daemon_request *r, const struct ipc_request *q,
		  struct cm_err *err)
{
	const engine_tokenizer *tok = engine_model_tokenizer(d->model);
	struct engine_model_info mi;
	engine_model_get_info(d->model, &mi);
	int ctx = (int)CM_MIN(d->cfg.ctx_size, (uint32_t)INT32_MAX);
	size_t n_in = q->n_inputs, total = 0;
	for (size_t i = 0; i < n_in; i++)
		total += q->input_lens[i] + 8; /* a token per byte at most, and BOS/EOS */
	/* a model swap prepares again: start afresh */
	cm_free(r->emb_tok);
	cm_free(r->emb_off);
	cm_free(r->emb_acc);
	cm_free(r->emb_block);
	cm_free(r->prompt);
	r->emb_block = NULL;
	r->n_embd = (int)mi.n_embd;
	r->n_inputs = (int)n_in;
	r->pooling = engine_pooling_resolve(d->model, pooling_of((enum ipc_pooling)q->pooling));
	size_t block = n_in * sizeof(struct ipc_embedding) + n_in * mi.n_embd * sizeof(float);
	r->emb_tok = cm_malloc(total * sizeof(int32_t));
	r->emb_off = cm_calloc(n_in + 1, sizeof(int));
	r->emb_acc = cm_calloc(mi.n_embd, sizeof(double));
	r->emb_block = cm_calloc(1, block);
	r->prompt = cm_malloc((size_t)CM_MAX(ctx, 1) * sizeof(int32_t));
	if (!r->emb_tok || !r->emb_off || !r->emb_acc || !r->emb_block || !r->prompt)
		return cm_err_set(err, -ENOMEM, "out of memory");
	struct ipc_embedding *e = r->emb_block;
	float *values = (float *)(e + n_in);
	size_t at = 0;
	r->emb_tokens = 0;
	for (size_t i = 0; i < n_in; i++) {
		int n = 0;
		int rc = engine_tokenize(tok, q->inputs[i], q->input_lens[i], true, false,
					 r->emb_tok + at, (int)CM_MIN(total - at, (size_t)INT32_MAX),
					 &n, err);
		if (rc)
			return rc == -ENOBUFS ? cm_err_set(err, -E2BIG, "input[%zu]: too long", i) : rc;
		if (n == 0)
			return cm_err_set(err, -EINVAL, "input[%zu]: no tokens", i);
		if (n > ctx) {
			if (!q->truncate)
				return cm_err_set(err, -E2BIG,
						  "input[%zu]: %d tokens do not fit the context of %d "
						  "tokens (set truncate to cut it)",
						  i, n, ctx);
			n = ctx;
		}
		e[i] = (struct ipc_embedding){values + i * mi.n_embd, mi.n_embd, n};
		at += (size_t)n;
		r->emb_off[i + 1] = (int)at;
		r->emb_tokens += n;
	}
	select_input(r, 0);
	return 0;
}

bool embed_wants(const struct daemon_request *r, int pos)
{
	switch (r->pooling) {
	case ENGINE_POOL_CLS: return pos == 0;
	case ENGINE_POOL_LAST: return pos == r->n_prompt - 1;
	default: return true;
	}
}

void embed_take(struct sched *s, struct daemon_request *r, int i, struct outbox_list *out)
{
	struct daemon *d = s->d;
	const float *h = engine_get_embd(d->ctx, i);
	int E = r->n_embd;
	if (h)
		for (int k = 0; k < E; k++)
			r->emb_acc[k] += h[k];
	if (s->b_pos[i] != r->n_prompt - 1)
		return;
	/* the input's last token: pool, then the next input or the end */
	struct ipc_embedding *e = (struct ipc_embedding *)r->emb_block + r->cur_input;
	float *v = (float *)e->values;
	double div = r->pooling == ENGINE_POOL_MEAN ? (double)r->n_prompt : 1.0;
	for (int k = 0; k < E; k++) {
		v[k] = (float)(r->emb_acc[k] / div);
		r->emb_acc[k] = 0;
	}
	engine_embd_normalize(v, E);
	if (r->cur_input + 1 < r->n_inputs) {
		select_input(r, r->cur_input + 1);
		engine_seq_truncate(d->ctx, r->slot, 0);
		s->slots[r->slot].n_tokens = 0;
		return;
	}
	pthread_mutex_lock(&d->mu);
	store_finish(s, r, IPC_FINISH_STOP, out);
	pthread_mutex_unlock(&d->mu);
}

void embed_reply(struct daemon_request *r, enum ipc_finish f, struct outbox_msg *m)
{
	if (f != IPC_FINISH_STOP || !r->emb_block) {
		/* cancelled by the drain, a deadline or an engine failure */
		m->rep.error = f == IPC_FINISH_DEADLINE ? IPC_ERR_DEADLINE_EXCEEDED
			       : r->s->stopping         ? IPC_ERR_SHUTTING_DOWN
							: IPC_ERR_INTERNAL;
		m->rep.retry_after_ms = -1;
		return;
	}
	m->embd = r->emb_block; /* the reply's now: its pointers point into it */
	r->emb_block = NULL;
	m->rep.u.embed = (struct ipc_embed_reply){
		.data = m->embd,
		.n = (size_t)r->n_inputs,
		.pooling = engine_pooling_name(r->pooling),
		.prompt_tokens = r->emb_tokens,
	};
}
