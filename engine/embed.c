/* engine/embed.c: embeddings, a prompt's final hidden states pooled into
 * one unit vector (docs/engine.md, "Embeddings").
 *
 * The states come from engine_decode's want_embd; this file only chooses
 * which tokens want them and pools. Mean pooling sums in double, so the
 * result does not depend on how the input was cut into n_batch chunks
 * beyond the last float bits. */
#include "engine/engine_impl.h"

#include <math.h>
#include <string.h>
#include <strings.h>

static const char *const pool_names[] = {"none", "mean", "cls", "last"};

const char *engine_pooling_name(enum engine_pooling p)
{
	if (p == ENGINE_POOL_UNSPECIFIED)
		return "unspecified";
	if (p < 0 || (size_t)p >= CM_ARRAY_LEN(pool_names))
		return "?";
	return pool_names[p];
}

int engine_pooling_parse(const char *name, enum engine_pooling *ret)
{
	if (!name)
		return -ENOENT;
	for (size_t i = 0; i < CM_ARRAY_LEN(pool_names); i++)
		if (strcasecmp(name, pool_names[i]) == 0) {
			*ret = (enum engine_pooling)i;
			return 0;
		}
	return -ENOENT;
}

enum engine_pooling engine_pooling_resolve(const engine_model *m, enum engine_pooling p)
{
	if (p != ENGINE_POOL_UNSPECIFIED)
		return p;
	int f = m->hp.pooling;
	return f >= ENGINE_POOL_MEAN && f <= ENGINE_POOL_LAST ? (enum engine_pooling)f
							       : ENGINE_POOL_MEAN;
}

void engine_embd_normalize(float *v, int n)
{
	double ss = 0;
	for (int i = 0; i < n; i++)
		ss += (double)v[i] * v[i];
	if (ss <= 0)
		return;
	double inv = 1.0 / sqrt(ss);
	for (int i = 0; i < n; i++)
		v[i] = (float)(v[i] * inv);
}

int engine_embed(engine_ctx *c, int seq, const int32_t *tokens, int n, enum engine_pooling pooling,
		 float *out, struct cm_err *err)
{
	const struct hparams *hp = &c->m->hp;
	int E = (int)hp->n_embd;
	pooling = engine_pooling_resolve(c->m, pooling);
	if (pooling < ENGINE_POOL_MEAN || pooling > ENGINE_POOL_LAST)
		return cm_err_set(err, -EINVAL, "embed: pooling '%s' gives no single vector",
				  engine_pooling_name(pooling));
	if (n < 1)
		return cm_err_set(err, -EINVAL, "embed: no tokens");
	if (seq < 0 || (uint32_t)seq >= c->n_seq)
		return cm_err_set(err, -EINVAL, "embed: sequence %d out of range", seq);
	if ((uint32_t)n > c->n_ctx)
		return cm_err_set(err, -ENOSPC, "embed: %d tokens exceed the context of %u", n,
				  c->n_ctx);
	/* a VLA of n_embd doubles would do, but n_embd reaches 16k */
	double *acc = cm_calloc((size_t)E, sizeof(double));
	int32_t *seqs = cm_malloc((size_t)c->n_batch * sizeof(int32_t));
	int r = 0;
	if (!acc || !seqs) {
		r = cm_err_set(err, -ENOMEM, "embed: out of memory");
		goto out;
	}
	engine_seq_truncate(c, seq, 0);
	for (int done = 0; done < n;) {
		int chunk = CM_MIN(n - done, (int)c->n_batch);
		for (int i = 0; i < chunk; i++) {
			int at = done + i;
			c->eval_pos[i] = at;
			seqs[i] = seq;
			c->embd_want[i] = pooling == ENGINE_POOL_MEAN ||
					  (pooling == ENGINE_POOL_CLS && at == 0) ||
					  (pooling == ENGINE_POOL_LAST && at == n - 1);
		}
		struct engine_batch b = {.n = chunk,
					 .tokens = tokens + done,
					 .pos = c->eval_pos,
					 .seq = seqs,
					 .want_embd = c->embd_want};
		if ((r = engine_decode(c, &b, err)))
			goto out;
		for (int i = 0; i < chunk; i++) {
			const float *h = engine_get_embd(c, i);
			if (h)
				for (int k = 0; k < E; k++)
					acc[k] += h[k];
		}
		done += chunk;
	}
	double div = pooling == ENGINE_POOL_MEAN ? (double)n : 1.0;
	for (int k = 0; k < E; k++)
		out[k] = (float)(acc[k] / div);
	engine_embd_normalize(out, E);
out:
	engine_seq_truncate(c, seq, 0);
	cm_free(acc);
	cm_free(seqs);
	return r;
}
