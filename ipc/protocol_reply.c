/* ipc/protocol_reply.c: replies, encoded by the daemon (one typed struct per
 * op) and decoded by libedgelm and the tests. Replies are not bound by the
 * request limits, but decoding still bounds nesting before jansson sees the
 * text, so a client never trusts a socket with its stack. */
#include "ipc/protocol_impl.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- reply encoding ------------------------------------------------------- */

static json_t *enc_usage(const struct ipc_usage *u)
{
	return json_pack("{sIsIsI}", "prompt_tokens", (json_int_t)u->prompt_tokens, "cached_tokens",
	                 (json_int_t)u->cached_tokens, "completion_tokens",
	                 (json_int_t)u->completion_tokens);
}

static json_t *enc_timings(const struct ipc_timings *t)
{
	json_t *o = json_object();
	bool ok = o != NULL;
	if (!ok)
		return NULL;
	ipc_jset(o, "queue_ms", ipc_jreal(t->queue_ms), &ok);
	ipc_jset(o, "ttft_ms", ipc_jreal(t->ttft_ms), &ok);
	ipc_jset(o, "prefill_ms", ipc_jreal(t->prefill_ms), &ok);
	ipc_jset(o, "decode_ms", ipc_jreal(t->decode_ms), &ok);
	ipc_jset(o, "total_ms", ipc_jreal(t->total_ms), &ok);
	ipc_jset(o, "prefill_tps", ipc_jreal(t->prefill_tps), &ok);
	ipc_jset(o, "decode_tps", ipc_jreal(t->decode_tps), &ok);
	if (!ok) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static void enc_final(json_t *o, enum ipc_finish f, const struct ipc_usage *u,
                      const struct ipc_timings *t, bool *ok)
{
	const char *fn = ipc_finish_name(f);
	ipc_jset(o, "finish_reason", fn ? json_string(fn) : json_null(), ok);
	ipc_jset(o, "usage", enc_usage(u), ok);
	ipc_jset(o, "timings", enc_timings(t), ok);
}

static json_t *enc_strings(const char *const *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++) {
		if (json_array_append_new(a, ipc_jcstr(v[i]))) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

/* Whether a text handed in by the daemon is one JSON object. Such a member
 * ("tuning" of info, "metrics") is spliced into the reply as it is, so the
 * daemon's number formatting survives (see splice_raw). */
static bool is_object_text(const char *text)
{
	json_error_t jerr;
	json_t *t = json_loadb(text, strlen(text), JSON_ALLOW_NUL, &jerr);
	bool ok = t && json_is_object(t);
	json_decref(t);
	return ok;
}

/* Append `"key":raw` to the compact object text *json (which ends in '}'). */
static int splice_raw(char **json, size_t *len, const char *key, const char *raw,
                      struct cm_err *err)
{
	size_t klen = strlen(key), rlen = strlen(raw), n = *len;
	bool empty = n == 2; /* "{}" */
	size_t total = n - 1 + (empty ? 0 : 1) + klen + 3 + rlen + 1;
	char *d = cm_malloc(total + 1);
	if (!d)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	size_t j = n - 1;
	memcpy(d, *json, j);
	if (!empty)
		d[j++] = ',';
	d[j++] = '"';
	memcpy(d + j, key, klen);
	j += klen;
	d[j++] = '"';
	d[j++] = ':';
	memcpy(d + j, raw, rlen);
	j += rlen;
	d[j++] = '}';
	d[j] = '\0';
	cm_free(*json);
	*json = d;
	*len = j;
	return 0;
}

static json_t *enc_lp_value(float lp)
{
	return isfinite(lp) ? json_real(lp) : json_null();
}

/* "logprobs": [{"token", "logprob", "top": [{"token", "logprob"}, ...]}] */
static void enc_logprobs(json_t *o, const struct ipc_logprob *lp, size_t n, bool *ok)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++) {
		json_t *top = json_array();
		for (size_t k = 0; top && k < lp[i].n_top; k++)
			if (json_array_append_new(
			        top, json_pack("{s:o,s:o}", "token",
			                       ipc_jstr(lp[i].top[k].token, lp[i].top[k].token_len),
			                       "logprob", enc_lp_value(lp[i].top[k].logprob))))
				*ok = false;
		if (json_array_append_new(a, json_pack("{s:o,s:o,s:o}", "token",
		                                       ipc_jstr(lp[i].token, lp[i].token_len),
		                                       "logprob", enc_lp_value(lp[i].logprob),
		                                       "top", top ? top : json_array())))
			*ok = false;
	}
	ipc_jset(o, "logprobs", a, ok);
}

static int enc_ok_body(json_t *o, const struct ipc_reply *r, struct cm_err *err)
{
	bool ok = true;
	switch (r->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: {
		const struct ipc_gen_reply *g = &r->u.gen;
		ipc_jset(o, "stream", json_boolean(g->stream), &ok);
		if (!g->stream) {
			ipc_jset(o, "text", ipc_jstr(g->text, g->text_len), &ok);
			if (g->has_logprobs)
				enc_logprobs(o, g->logprobs, g->n_logprobs, &ok);
			enc_final(o, g->finish, &g->usage, &g->timings, &ok);
		}
		break;
	}
	case IPC_OP_POLL: {
		const struct ipc_poll_reply *p = &r->u.poll;
		if (p->offset > (uint64_t)LLONG_MAX - p->text_len)
			return cm_err_set(err, -EINVAL, "ipc: poll offset out of range");
		ipc_jset(o, "offset", json_integer((json_int_t)p->offset), &ok);
		ipc_jset(o, "next", json_integer((json_int_t)(p->offset + p->text_len)), &ok);
		ipc_jset(o, "text", ipc_jstr(p->text, p->text_len), &ok);
		if (p->has_logprobs)
			enc_logprobs(o, p->logprobs, p->n_logprobs, &ok);
		ipc_jset(o, "done", json_boolean(p->done), &ok);
		if (p->done)
			enc_final(o, p->finish, &p->usage, &p->timings, &ok);
		break;
	}
	case IPC_OP_CANCEL:
		ipc_jset(o, "cancelled", json_boolean(r->u.cancel.cancelled), &ok);
		break;
	case IPC_OP_TOKENIZE: {
		json_t *a = json_array();
		for (size_t i = 0; a && i < r->u.tokenize.n_ids; i++)
			if (json_array_append_new(a, json_integer(r->u.tokenize.ids[i])))
				ok = false;
		ipc_jset(o, "ids", a, &ok);
		ipc_jset(o, "count", json_integer((json_int_t)r->u.tokenize.n_ids), &ok);
		break;
	}
	case IPC_OP_DETOKENIZE:
		ipc_jset(o, "text", ipc_jstr(r->u.detokenize.text, r->u.detokenize.text_len), &ok);
		break;
	case IPC_OP_EMBED: {
		const struct ipc_embed_reply *e = &r->u.embed;
		json_t *a = json_array();
		for (size_t i = 0; a && ok && i < e->n; i++) {
			const struct ipc_embedding *d = &e->data[i];
			json_t *v = json_array(), *it = json_object();
			for (size_t k = 0; v && k < d->n_values; k++)
				if (json_array_append_new(v, ipc_jfloat(d->values[k])))
					ok = false;
			if (!it) {
				json_decref(v);
				ok = false;
				break;
			}
			ipc_jset(it, "index", json_integer((json_int_t)i), &ok);
			ipc_jset(it, "tokens", json_integer((json_int_t)d->tokens), &ok);
			ipc_jset(it, "embedding", v, &ok);
			if (json_array_append_new(a, it))
				ok = false;
		}
		ipc_jset(o, "embeddings", a, &ok);
		if (e->pooling)
			ipc_jset(o, "pooling", ipc_jcstr(e->pooling), &ok);
		ipc_jset(o, "usage", json_pack("{sI}", "prompt_tokens", (json_int_t)e->prompt_tokens),
		         &ok);
		break;
	}
	case IPC_OP_INFO: {
		const struct ipc_info_reply *in = &r->u.info;
#define SETS(key, v)                                                                               \
	if (v)                                                                                     \
		ipc_jset(o, key, ipc_jcstr(v), &ok);
		SETS("version", in->version)
		SETS("model", in->model)
		SETS("architecture", in->architecture)
		ipc_jset(o, "quant_types", enc_strings(in->quant_types, in->n_quant_types), &ok);
		ipc_jset(o, "n_ctx", json_integer(in->n_ctx), &ok);
		ipc_jset(o, "n_vocab", json_integer(in->n_vocab), &ok);
		SETS("isa", in->isa)
		SETS("kernels", in->kernels)
#undef SETS
		ipc_jset(o, "threads", json_integer(in->threads), &ok);
		if (in->tuning_json && !is_object_text(in->tuning_json))
			return cm_err_set(err, -EINVAL,
			                  "ipc: info tuning_json is not a JSON object");
		break;
	}
	case IPC_OP_HEALTH: {
		const char *st = ipc_health_name(r->u.health.status);
		if (!st)
			return cm_err_set(err, -EINVAL, "ipc: bad health status %d",
			                  r->u.health.status);
		ipc_jset(o, "status", json_string(st), &ok);
		ipc_jset(o, "ready", json_boolean(r->u.health.status == IPC_HEALTH_READY), &ok);
		ipc_jset(o, "reasons", enc_strings(r->u.health.reasons, r->u.health.n_reasons),
		         &ok);
		break;
	}
	case IPC_OP_METRICS: {
		if (r->u.metrics.json) {
			if (!is_object_text(r->u.metrics.json))
				return cm_err_set(err, -EINVAL,
				                  "ipc: metrics json is not a JSON object");
			break; /* spliced in by ipc_reply_encode */
		}
		json_t *a = json_array();
		for (size_t i = 0; a && i < r->u.metrics.n_items; i++) {
			const struct ipc_metric *m = &r->u.metrics.items[i];
			json_t *e = json_object(), *l = json_object();
			if (!e || !l) {
				json_decref(e);
				json_decref(l);
				ok = false;
				break;
			}
			for (size_t k = 0; k < m->n_labels; k++)
				if (m->labels[k].name)
					ipc_jset(l, m->labels[k].name,
					         ipc_jcstr(m->labels[k].value), &ok);
			ipc_jset(e, "name", ipc_jcstr(m->name), &ok);
			ipc_jset(e, "type", ipc_jcstr(m->type ? m->type : "untyped"), &ok);
			ipc_jset(e, "labels", l, &ok);
			ipc_jset(e, "value", ipc_jreal(m->value), &ok);
			if (json_array_append_new(a, e))
				ok = false;
		}
		ipc_jset(o, "metrics", a, &ok);
		break;
	}
	default:
		return cm_err_set(err, -EINVAL, "ipc: cannot encode a reply with op %d", r->op);
	}
	return ok ? 0 : cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
}

int ipc_reply_encode(const struct ipc_reply *r, char **ret_json, size_t *ret_len,
                     struct cm_err *err)
{
	json_t *o = json_object();
	if (!o)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	bool ok = true;
	int rc = 0;
	bool is_err = r->error != IPC_ERR_NONE;
	ipc_jset(o, "v", json_integer(IPC_PROTOCOL_VERSION), &ok);
	ipc_jset(o, "ok", json_boolean(!is_err), &ok);
	if (ipc_op_name(r->op))
		ipc_jset(o, "op", json_string(ipc_op_name(r->op)), &ok);
	if (r->id)
		ipc_jset(o, "id", ipc_jcstr(r->id), &ok);
	if (is_err) {
		json_t *e = json_object();
		if (e) {
			ipc_jset(e, "code", json_string(ipc_errcode_name(r->error)), &ok);
			ipc_jset(
			    e, "message",
			    ipc_jcstr(r->message ? r->message : ipc_errcode_describe(r->error)),
			    &ok);
			if (r->retry_after_ms >= 0)
				ipc_jset(e, "retry_after_ms", json_integer(r->retry_after_ms), &ok);
		}
		ipc_jset(o, "error", e, &ok);
	} else if (ok) {
		rc = enc_ok_body(o, r, err);
	}
	char *json = NULL;
	size_t len = 0;
	if (!rc)
		rc = ok ? ipc_jdump(o, &json, &len, err)
		        : cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	json_decref(o);
	if (!rc && !is_err && r->op == IPC_OP_INFO && r->u.info.tuning_json)
		rc = splice_raw(&json, &len, "tuning", r->u.info.tuning_json, err);
	if (!rc && !is_err && r->op == IPC_OP_METRICS && r->u.metrics.json)
		rc = splice_raw(&json, &len, "metrics", r->u.metrics.json, err);
	if (rc) {
		cm_free(json);
		return rc;
	}
	*ret_json = json;
	if (ret_len)
		*ret_len = len;
	return 0;
}

int ipc_error_encode(enum ipc_errcode code, const char *id, const char *msg, int64_t retry_after_ms,
                     char **ret_json, size_t *ret_len)
{
	struct ipc_reply r = {.op = IPC_OP_NONE,
	                      .id = id,
	                      .error = code == IPC_ERR_NONE ? IPC_ERR_INTERNAL : code,
	                      .message = msg,
	                      .retry_after_ms = retry_after_ms};
	return ipc_reply_encode(&r, ret_json, ret_len, NULL);
}

/* ---- reply decoding ------------------------------------------------------- */

struct dctx {
	struct ipc_arena *arena;
	struct cm_err *err;
};

static int bad_reply(struct dctx *c, const char *what)
{
	return cm_err_set(c->err, -EPROTO, "ipc: malformed reply: %s", what);
}

/* Optional string: absent or null leaves *ret NULL. */
static int dec_str(struct dctx *c, json_t *o, const char *key, const char **ret, size_t *ret_len)
{
	json_t *v = json_object_get(o, key);
	*ret = NULL;
	if (ret_len)
		*ret_len = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return bad_reply(c, key);
	char *d = ipc_arena_strndup(c->arena, json_string_value(v), json_string_length(v));
	if (!d)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	*ret = d;
	if (ret_len)
		*ret_len = json_string_length(v);
	return 0;
}

static int dec_int(struct dctx *c, json_t *o, const char *key, int64_t *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return bad_reply(c, key);
	*ret = json_integer_value(v);
	return 0;
}

static int dec_real(struct dctx *c, json_t *o, const char *key, double *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = NAN;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return bad_reply(c, key);
	*ret = json_number_value(v);
	return 0;
}

static int dec_bool(struct dctx *c, json_t *o, const char *key, bool *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = false;
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return bad_reply(c, key);
	*ret = json_is_true(v);
	return 0;
}

static int dec_strings(struct dctx *c, json_t *o, const char *key, const char *const **ret,
                       size_t *ret_n)
{
	json_t *a = json_object_get(o, key);
	*ret = NULL;
	*ret_n = 0;
	if (!a || json_is_null(a))
		return 0;
	if (!json_is_array(a))
		return bad_reply(c, key);
	size_t n = json_array_size(a);
	const char **v = ipc_arena_zalloc(c->arena, n ? n : 1, sizeof(*v));
	if (!v)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(a, i);
		if (!json_is_string(e))
			return bad_reply(c, key);
		v[i] = ipc_arena_strndup(c->arena, json_string_value(e), json_string_length(e));
		if (!v[i])
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static int dec_final(struct dctx *c, json_t *o, enum ipc_finish *f, struct ipc_usage *u,
                     struct ipc_timings *t)
{
	json_t *fr = json_object_get(o, "finish_reason");
	*f = IPC_FINISH_NONE;
	if (fr && json_is_string(fr)) {
		int i = ipc_finish_index(json_string_value(fr), json_string_length(fr));
		if (i < 0)
			return bad_reply(c, "finish_reason");
		*f = (enum ipc_finish)i;
	} else if (fr && !json_is_null(fr)) {
		return bad_reply(c, "finish_reason");
	}
	json_t *uo = json_object_get(o, "usage");
	if (uo && !json_is_object(uo))
		return bad_reply(c, "usage");
	if (uo && (dec_int(c, uo, "prompt_tokens", &u->prompt_tokens) ||
	           dec_int(c, uo, "cached_tokens", &u->cached_tokens) ||
	           dec_int(c, uo, "completion_tokens", &u->completion_tokens)))
		return -EPROTO;
	json_t *to = json_object_get(o, "timings");
	if (to && !json_is_object(to))
		return bad_reply(c, "timings");
	if (to &&
	    (dec_real(c, to, "queue_ms", &t->queue_ms) || dec_real(c, to, "ttft_ms", &t->ttft_ms) ||
	     dec_real(c, to, "prefill_ms", &t->prefill_ms) ||
	     dec_real(c, to, "decode_ms", &t->decode_ms) ||
	     dec_real(c, to, "total_ms", &t->total_ms) ||
	     dec_real(c, to, "prefill_tps", &t->prefill_tps) ||
	     dec_real(c, to, "decode_tps", &t->decode_tps)))
		return -EPROTO;
	return 0;
}

/* An embedded object back to compact text in the arena. */
static int dec_object(struct dctx *c, json_t *t, const char **ret)
{
	size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(17);
	size_t n = json_dumpb(t, NULL, 0, flags);
	char *s = n ? ipc_arena_alloc(c->arena, n + 1) : NULL;
	if (!s || json_dumpb(t, s, n, flags) != n)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	s[n] = '\0';
	*ret = s;
	return 0;
}

/* metrics: the monitor's object as text, or a list of samples. */
static int dec_metrics(struct dctx *c, json_t *o, struct ipc_reply *r)
{
	json_t *a = json_object_get(o, "metrics");
	if (a && json_is_object(a))
		return dec_object(c, a, &r->u.metrics.json);
	if (!a || !json_is_array(a))
		return bad_reply(c, "metrics");
	size_t n = json_array_size(a);
	struct ipc_metric *m = ipc_arena_zalloc(c->arena, n ? n : 1, sizeof(*m));
	if (!m)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(a, i);
		if (!json_is_object(e))
			return bad_reply(c, "metrics");
		if (dec_str(c, e, "name", &m[i].name, NULL) ||
		    dec_str(c, e, "type", &m[i].type, NULL) || dec_real(c, e, "value", &m[i].value))
			return -EPROTO;
		json_t *l = json_object_get(e, "labels");
		if (l && !json_is_object(l))
			return bad_reply(c, "labels");
		size_t nl = l ? json_object_size(l) : 0, k = 0;
		struct ipc_metric_label *lb = ipc_arena_zalloc(c->arena, nl ? nl : 1, sizeof(*lb));
		if (!lb)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory");
		const char *key;
		json_t *val;
		if (l) {
			json_object_foreach(l, key, val)
			{
				if (!json_is_string(val) || k >= nl)
					return bad_reply(c, "labels");
				lb[k].name = ipc_arena_strndup(c->arena, key, strlen(key));
				lb[k].value = ipc_arena_strndup(c->arena, json_string_value(val),
				                                json_string_length(val));
				if (!lb[k].name || !lb[k].value)
					return cm_err_set(c->err, -ENOMEM, "ipc: out of memory");
				k++;
			}
		}
		m[i].labels = lb;
		m[i].n_labels = k;
	}
	r->u.metrics.items = m;
	r->u.metrics.n_items = n;
	return 0;
}

static int dec_lp_value(struct dctx *c, json_t *v, float *ret)
{
	if (json_is_null(v)) {
		*ret = -INFINITY;
		return 0;
	}
	if (!json_is_number(v))
		return bad_reply(c, "logprobs");
	*ret = (float)json_number_value(v);
	return 0;
}

/* Optional "logprobs" (see enc_logprobs). */
static int dec_logprobs(struct dctx *c, json_t *o, bool *has, const struct ipc_logprob **ret,
                        size_t *ret_n)
{
	json_t *a = json_object_get(o, "logprobs");
	*has = false;
	*ret = NULL;
	*ret_n = 0;
	if (!a)
		return 0;
	if (!json_is_array(a))
		return bad_reply(c, "logprobs");
	size_t n = json_array_size(a);
	struct ipc_logprob *lp = n ? ipc_arena_zalloc(c->arena, n, sizeof(*lp)) : NULL;
	if (n && !lp)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(a, i), *top = json_object_get(e, "top");
		if (!json_is_object(e) || dec_str(c, e, "token", &lp[i].token, &lp[i].token_len) ||
		    !lp[i].token || dec_lp_value(c, json_object_get(e, "logprob"), &lp[i].logprob))
			return bad_reply(c, "logprobs");
		if (top && !json_is_array(top))
			return bad_reply(c, "logprobs");
		size_t nt = top ? json_array_size(top) : 0;
		struct ipc_logprob_top *t = nt ? ipc_arena_zalloc(c->arena, nt, sizeof(*t)) : NULL;
		if (nt && !t)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
		for (size_t k = 0; k < nt; k++) {
			json_t *te = json_array_get(top, k);
			if (!json_is_object(te) || dec_str(c, te, "token", &t[k].token, &t[k].token_len) ||
			    !t[k].token ||
			    dec_lp_value(c, json_object_get(te, "logprob"), &t[k].logprob))
				return bad_reply(c, "logprobs");
		}
		lp[i].top = t;
		lp[i].n_top = nt;
	}
	*has = true;
	*ret = lp;
	*ret_n = n;
	return 0;
}

static int dec_embed(struct dctx *c, json_t *o, struct ipc_embed_reply *e)
{
	json_t *a = json_object_get(o, "embeddings");
	if (!a || !json_is_array(a))
		return bad_reply(c, "embeddings");
	size_t n = json_array_size(a);
	struct ipc_embedding *d = ipc_arena_zalloc(c->arena, n ? n : 1, sizeof(*d));
	if (!d)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	for (size_t i = 0; i < n; i++) {
		json_t *it = json_array_get(a, i), *v = json_object_get(it, "embedding");
		if (!json_is_object(it) || !v || !json_is_array(v) ||
		    dec_int(c, it, "tokens", &d[i].tokens))
			return bad_reply(c, "embeddings");
		size_t k = json_array_size(v);
		float *f = ipc_arena_zalloc(c->arena, k ? k : 1, sizeof(*f));
		if (!f)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
		for (size_t j = 0; j < k; j++) {
			json_t *x = json_array_get(v, j);
			if (!json_is_number(x))
				return bad_reply(c, "embedding");
			f[j] = (float)json_number_value(x);
		}
		d[i].values = f;
		d[i].n_values = k;
	}
	e->data = d;
	e->n = n;
	json_t *u = json_object_get(o, "usage");
	if (u && dec_int(c, u, "prompt_tokens", &e->prompt_tokens))
		return -EPROTO;
	return dec_str(c, o, "pooling", &e->pooling, NULL);
}

static int dec_ok_body(struct dctx *c, json_t *o, struct ipc_reply *r)
{
	int64_t x;
	switch (r->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: {
		struct ipc_gen_reply *g = &r->u.gen;
		if (dec_bool(c, o, "stream", &g->stream))
			return -EPROTO;
		if (g->stream)
			return 0;
		if (dec_str(c, o, "text", &g->text, &g->text_len) ||
		    dec_logprobs(c, o, &g->has_logprobs, &g->logprobs, &g->n_logprobs))
			return -EPROTO;
		return dec_final(c, o, &g->finish, &g->usage, &g->timings);
	}
	case IPC_OP_POLL: {
		struct ipc_poll_reply *p = &r->u.poll;
		int64_t next;
		if (dec_int(c, o, "offset", &x) || dec_int(c, o, "next", &next) ||
		    dec_str(c, o, "text", &p->text, &p->text_len) ||
		    dec_logprobs(c, o, &p->has_logprobs, &p->logprobs, &p->n_logprobs) ||
		    dec_bool(c, o, "done", &p->done))
			return -EPROTO;
		if (x < 0)
			return bad_reply(c, "offset");
		p->offset = (uint64_t)x;
		/* `next` counts the daemon's bytes, which differ from text_len where
		 * the encoder replaced invalid UTF-8. */
		if (!json_object_get(o, "next")) {
			if (p->text_len > (uint64_t)(INT64_MAX - x))
				return bad_reply(c, "offset");
			next = x + (int64_t)p->text_len;
		}
		if (next < x)
			return bad_reply(c, "next");
		p->next = (uint64_t)next;
		if (p->done)
			return dec_final(c, o, &p->finish, &p->usage, &p->timings);
		return 0;
	}
	case IPC_OP_CANCEL:
		return dec_bool(c, o, "cancelled", &r->u.cancel.cancelled);
	case IPC_OP_TOKENIZE: {
		json_t *a = json_object_get(o, "ids");
		if (!a || !json_is_array(a))
			return bad_reply(c, "ids");
		size_t n = json_array_size(a);
		int32_t *ids = ipc_arena_zalloc(c->arena, n ? n : 1, sizeof(*ids));
		if (!ids)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
		for (size_t i = 0; i < n; i++) {
			json_t *e = json_array_get(a, i);
			if (!json_is_integer(e) || json_integer_value(e) < INT32_MIN ||
			    json_integer_value(e) > INT32_MAX)
				return bad_reply(c, "ids");
			ids[i] = (int32_t)json_integer_value(e);
		}
		r->u.tokenize.ids = ids;
		r->u.tokenize.n_ids = n;
		return 0;
	}
	case IPC_OP_DETOKENIZE:
		return dec_str(c, o, "text", &r->u.detokenize.text, &r->u.detokenize.text_len);
	case IPC_OP_EMBED:
		return dec_embed(c, o, &r->u.embed);
	case IPC_OP_INFO: {
		struct ipc_info_reply *in = &r->u.info;
		if (dec_str(c, o, "version", &in->version, NULL) ||
		    dec_str(c, o, "model", &in->model, NULL) ||
		    dec_str(c, o, "architecture", &in->architecture, NULL) ||
		    dec_strings(c, o, "quant_types", &in->quant_types, &in->n_quant_types) ||
		    dec_int(c, o, "n_ctx", &in->n_ctx) || dec_int(c, o, "n_vocab", &in->n_vocab) ||
		    dec_str(c, o, "isa", &in->isa, NULL) ||
		    dec_str(c, o, "kernels", &in->kernels, NULL) || dec_int(c, o, "threads", &x))
			return -EPROTO;
		if (x < INT32_MIN || x > INT32_MAX)
			return bad_reply(c, "threads");
		in->threads = (int32_t)x;
		json_t *t = json_object_get(o, "tuning");
		if (t && json_is_object(t))
			return dec_object(c, t, &in->tuning_json);
		return 0;
	}
	case IPC_OP_HEALTH: {
		json_t *st = json_object_get(o, "status");
		if (!st || !json_is_string(st))
			return bad_reply(c, "status");
		int i = ipc_health_index(json_string_value(st), json_string_length(st));
		if (i < 0)
			return bad_reply(c, "status");
		r->u.health.status = (enum ipc_health_status)i;
		return dec_strings(c, o, "reasons", &r->u.health.reasons, &r->u.health.n_reasons);
	}
	case IPC_OP_METRICS:
		return dec_metrics(c, o, r);
	default:
		return cm_err_set(c->err, -EINVAL, "ipc: cannot decode replies to op %d", r->op);
	}
}

int ipc_reply_decode(const char *json, size_t len, enum ipc_op expect, struct ipc_reply **ret_reply,
                     struct cm_err *err)
{
	*ret_reply = NULL;
	if (!json || len == 0)
		return cm_err_set(err, -EPROTO, "ipc: empty reply");
	/* Replies come from our daemon, but a client must not trust them with
	 * its stack either. */
	struct ipc_limits lim = {.max_msg_bytes = SIZE_MAX, .max_values = SIZE_MAX};
	ipc_limits_fill(&lim);
	lim.max_depth = 8;
	if (ipc_json_prescan(json, len, &lim, NULL))
		return cm_err_set(err, -EPROTO, "ipc: malformed reply: nested too deep");
	json_error_t jerr;
	json_t *o = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
	if (!o)
		return cm_err_set(err, -EPROTO, "ipc: reply is not JSON: %s", jerr.text);
	int rc;
	struct ipc_arena *arena = ipc_arena_new();
	struct ipc_reply *r = arena ? ipc_arena_zalloc(arena, 1, sizeof(*r)) : NULL;
	if (!r) {
		rc = cm_err_set(err, -ENOMEM, "ipc: out of memory decoding a reply");
		goto out;
	}
	r->arena_ = arena;
	r->retry_after_ms = -1;
	struct dctx c = {.arena = arena, .err = err};
	if (!json_is_object(o)) {
		rc = bad_reply(&c, "not an object");
		goto out;
	}
	json_t *v = json_object_get(o, "v");
	if (v && (!json_is_integer(v) || json_integer_value(v) != IPC_PROTOCOL_VERSION)) {
		rc = cm_err_set(err, -EPROTO, "ipc: reply of an unsupported protocol version");
		goto out;
	}
	json_t *okv = json_object_get(o, "ok");
	if (!okv || !json_is_boolean(okv)) {
		rc = bad_reply(&c, "ok");
		goto out;
	}
	json_t *opv = json_object_get(o, "op");
	r->op = expect;
	if (opv && json_is_string(opv)) {
		int i = ipc_op_index(json_string_value(opv), json_string_length(opv));
		if (i <= 0 || (expect != IPC_OP_NONE && i != (int)expect)) {
			rc = bad_reply(&c, "op does not match the request");
			goto out;
		}
		r->op = (enum ipc_op)i;
	}
	if ((rc = dec_str(&c, o, "id", &r->id, NULL)))
		goto out;
	if (json_is_false(okv)) {
		json_t *e = json_object_get(o, "error");
		json_t *code = e ? json_object_get(e, "code") : NULL;
		if (!e || !json_is_object(e) || !code || !json_is_string(code)) {
			rc = bad_reply(&c, "error");
			goto out;
		}
		r->error = ipc_errcode_from_name(json_string_value(code));
		if (r->error == IPC_ERR_NONE)
			r->error = IPC_ERR_INTERNAL; /* a code newer than this client */
		int64_t ra;
		if ((rc = dec_str(&c, e, "message", &r->message, NULL)) ||
		    (rc = dec_int(&c, e, "retry_after_ms", &ra)))
			goto out;
		r->retry_after_ms = json_object_get(e, "retry_after_ms") ? ra : -1;
	} else if (r->op == IPC_OP_NONE) {
		rc = bad_reply(&c, "op");
		goto out;
	} else if ((rc = dec_ok_body(&c, o, r))) {
		goto out;
	}
	*ret_reply = r;
	arena = NULL;
	rc = 0;
out:
	json_decref(o);
	ipc_arena_free(arena);
	return rc;
}

void ipc_reply_free(struct ipc_reply *r)
{
	if (r)
		ipc_arena_free(r->arena_);
}
