/* http/server.c: the HTTP front's server (http.h).
 *
 * One libmicrohttpd daemon per listen address, a thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), at most max_connections of them. A
 * request's thread parses the body, submits protocol requests to the core
 * and waits for each reply on an eventfd while it polls its own socket for
 * a hang-up (POLLRDHUP): a client that goes away, streaming or not, has its
 * generation cancelled at once (docs/http.md, "Disconnects").
 *
 * Streams are the protocol's: generate/chat with stream true, then polls
 * (long-polls held by the core until there is new text), each poll reply
 * written as one SSE event from MHD's content reader on the same thread.
 *
 * Slow clients. A connection that has not sent a whole request is
 * "waiting"; when a new connection takes the waiting ones of its address
 * past a quarter of max_connections, or all waiting ones past half of it,
 * the one that has waited longest is shut down, so slowloris clients push
 * out only each other and a new client always gets in. MHD's timeout
 * closes connections silent for timeout_s. */
#include "http/http_impl.h"

#include "common/net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RATE_SLOTS 256       /* client addresses tracked by the rate limit */
#define POLL_WAIT_MS 15000   /* a stream's long-poll */
#define SSE_BLOCK 16384      /* MHD's buffer for the content reader */
#define INFO_TTL_NS 2000000000ull /* the model name's cache */

struct conn {
	bool used, waiting, evicted;
	int fd;
	uint64_t since_ns;
	uint8_t ip_len;
	unsigned char ip[16];
};

struct rate_slot {
	uint8_t ip_len;
	unsigned char ip[16];
	double tokens;
	uint64_t last_ns;
};

struct listener {
	struct http_front *h;
	struct MHD_Daemon *d;
	unsigned port;
	struct conn *conns; /* max_connections + slack, under h->mu */
	unsigned n_conns;
};

struct http_front {
	struct http_params p;
	char *cors;
	char **key_names, **keys;
	int n_keys;
	struct listener ls[HTTP_MAX_LISTEN];
	size_t n_ls;
	pthread_mutex_t mu; /* conns, rates, the model name */
	struct rate_slot rates[RATE_SLOTS];
	char model[256];
	uint64_t model_ns;
	atomic_bool draining, stopping;
};

/* ---- one request -------------------------------------------------------------- */

enum route { R_NONE, R_PAGE, R_HEALTH, R_MODELS, R_COMPLETIONS, R_CHAT, R_STATUS, R_OPTIONS,
	     R_EMBED };

struct hreq {
	struct http_front *h;
	struct MHD_Connection *c;
	int fd; /* the client's socket */
	int efd; /* a reply arrived */
	pthread_mutex_t mu;
	int refs; /* the connection's, the response's, an outstanding call's */
	char *reply; /* under mu: the last reply's JSON */
	size_t reply_len;
	bool replied;
	bool gone; /* the client hung up */

	enum route route;
	char *body;
	size_t body_len, body_cap;
	bool too_large, started;
	char identity[64];

	/* a generation */
	enum oai_kind kind;
	char id[40];
	char cid[48];
	char model[256];
	int64_t created;
	bool stream, include_usage, active, finished;
	bool cancel_sent; /* for this generation */
	int submit_rc;    /* the last refused submission: -EAGAIN loading, else stopping */
	uint64_t ack;
	size_t text_offset; /* completions' logprobs.text_offset so far */
	char *out; /* SSE bytes not yet handed to MHD */
	size_t out_len, out_off, out_cap;
	bool first_chunk;
};

static void hreq_unref(struct hreq *q)
{
	pthread_mutex_lock(&q->mu);
	int left = --q->refs;
	pthread_mutex_unlock(&q->mu);
	if (left)
		return;
	close(q->efd);
	pthread_mutex_destroy(&q->mu);
	cm_free(q->reply);
	cm_free(q->body);
	cm_free(q->out);
	cm_free(q);
}

static void on_core_reply(void *ud, const char *json, size_t len)
{
	struct hreq *q = ud;
	char *copy = cm_malloc(len + 1);
	if (copy) {
		memcpy(copy, json, len);
		copy[len] = '\0';
	}
	pthread_mutex_lock(&q->mu);
	cm_free(q->reply);
	q->reply = copy;
	q->reply_len = copy ? len : 0;
	q->replied = true;
	pthread_mutex_unlock(&q->mu);
	uint64_t one = 1;
	(void)!write(q->efd, &one, sizeof(one));
	hreq_unref(q);
}

static void on_ignored_reply(void *ud, const char *json, size_t len)
{
	(void)ud;
	(void)json;
	(void)len;
}

/* Cancel the generation of q (its id), once, without waiting for the
 * answer. */
static void cancel_generation(struct hreq *q)
{
	if (q->cancel_sent)
		return;
	q->cancel_sent = true;
	char json[128];
	int n = snprintf(json, sizeof(json), "{\"v\":1,\"op\":\"cancel\",\"id\":\"%s\"}", q->id);
	(void)q->h->p.submit(q->h->p.core, json, (size_t)n, q->identity, on_ignored_reply, NULL);
}

/* Submit `json` and wait for its reply, watching the client: a hang-up
 * cancels the generation in progress (if any) and the wait goes on for the
 * reply, which the cancel brings at once. Returns the parsed reply, or NULL
 * (the core refused the submission, an unparseable reply, or the front is
 * stopping and the core has not answered for STOP_GRACE_MS: the call is
 * left to complete into q, which its reference keeps). */
#define STOP_GRACE_MS 2000
static json_t *core_call(struct hreq *q, const char *json, size_t len)
{
	pthread_mutex_lock(&q->mu);
	q->replied = false;
	q->refs++;
	pthread_mutex_unlock(&q->mu);
	int rc = q->h->p.submit(q->h->p.core, json, len, q->identity, on_core_reply, q);
	if (rc != 0) {
		q->submit_rc = rc;
		hreq_unref(q);
		return NULL;
	}
	uint64_t stop_seen = 0;
	for (;;) {
		if (q->gone && q->active)
			cancel_generation(q); /* also when it went before this call */
		if (atomic_load(&q->h->stopping)) {
			uint64_t now = cm_now_ns();
			if (!stop_seen)
				stop_seen = now;
			else if (now - stop_seen > (uint64_t)STOP_GRACE_MS * 1000000u)
				return NULL;
		}
		struct pollfd pf[2] = {{.fd = q->efd, .events = POLLIN},
				       {.fd = q->gone ? -1 : q->fd, .events = POLLRDHUP}};
		int n = poll(pf, 2, 250);
		if (n < 0 && errno == EINTR)
			continue;
		if (pf[0].revents & POLLIN) {
			uint64_t v;
			(void)!read(q->efd, &v, sizeof(v));
			pthread_mutex_lock(&q->mu);
			bool done = q->replied;
			char *r = q->reply;
			size_t rl = q->reply_len;
			q->reply = NULL;
			pthread_mutex_unlock(&q->mu);
			if (!done)
				continue;
			json_t *j = r ? json_loadb(r, rl, JSON_ALLOW_NUL, NULL) : NULL;
			cm_free(r);
			return j;
		}
		if (pf[1].revents & (POLLRDHUP | POLLHUP | POLLERR))
			q->gone = true;
	}
}

/* ---- responses ------------------------------------------------------------------ */

static void add_common_headers(struct hreq *q, struct MHD_Response *r)
{
	if (q->h->cors) {
		MHD_add_response_header(r, "Access-Control-Allow-Origin", q->h->cors);
		MHD_add_response_header(r, "Vary", "Origin");
	}
}

static enum MHD_Result send_json_flags(struct hreq *q, unsigned status, json_t *j,
				       int64_t retry_s, size_t flags)
{
	char *text = j ? json_dumps(j, JSON_COMPACT | flags) : NULL;
	json_decref(j);
	if (!text)
		return MHD_NO;
	size_t len = strlen(text);
	struct MHD_Response *r = MHD_create_response_from_buffer_with_free_callback(len, text, free);
	if (!r) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", "application/json");
	add_common_headers(q, r);
	if (retry_s > 0) {
		char ra[24];
		snprintf(ra, sizeof(ra), "%lld", (long long)retry_s);
		MHD_add_response_header(r, "Retry-After", ra);
	}
	if (status == 401)
		MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
	enum MHD_Result ret = MHD_queue_response(q->c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_json(struct hreq *q, unsigned status, json_t *j, int64_t retry_s)
{
	return send_json_flags(q, status, j, retry_s, 0);
}

static enum MHD_Result send_err(struct hreq *q, const struct oai_err *e)
{
	return send_json(q, e->status, oai_err_json(e), e->retry_after_s);
}

static enum MHD_Result send_error(struct hreq *q, unsigned status, const char *type,
				  const char *code, const char *msg)
{
	struct oai_err e;
	oai_err_set(&e, status, type, NULL, code, "%s", msg);
	if (status == 429 || status == 503)
		e.retry_after_s = 1;
	return send_err(q, &e);
}

/* The core took no request: still loading the model (submit's -EAGAIN),
 * or stopping. */
static void unavailable(const struct hreq *q, struct oai_err *e)
{
	if (q->submit_rc == -EAGAIN)
		oai_err_set(e, 503, "server_error", NULL, "not_ready", "the model is loading");
	else
		oai_err_set(e, 503, "server_error", NULL, "shutting_down", "the server is stopping");
	e->retry_after_s = 1;
}

/* ---- the model's name (info), cached briefly ------------------------------------ */

static json_t *core_simple(struct hreq *q, const char *op)
{
	char json[64];
	int n = snprintf(json, sizeof(json), "{\"v\":1,\"op\":\"%s\"}", op);
	return core_call(q, json, (size_t)n);
}

/* The model's id as /v1/models lists it and responses name it: the file's
 * name without its directory, from an info reply. */
static const char *model_id(const json_t *info)
{
	const char *m = json_string_value(json_object_get(info, "model"));
	const char *slash = m ? strrchr(m, '/') : NULL;
	return slash ? slash + 1 : m ? m : "edgelm";
}

static void model_name(struct hreq *q)
{
	struct http_front *h = q->h;
	uint64_t now = cm_now_ns();
	pthread_mutex_lock(&h->mu);
	bool fresh = h->model[0] && now - h->model_ns < INFO_TTL_NS;
	if (fresh)
		snprintf(q->model, sizeof(q->model), "%s", h->model);
	pthread_mutex_unlock(&h->mu);
	if (fresh)
		return;
	json_t *j = core_simple(q, "info");
	snprintf(q->model, sizeof(q->model), "%s", model_id(j));
	pthread_mutex_lock(&h->mu);
	snprintf(h->model, sizeof(h->model), "%s", q->model);
	h->model_ns = now;
	pthread_mutex_unlock(&h->mu);
	json_decref(j);
}

/* ---- routes --------------------------------------------------------------------- */

static enum MHD_Result do_health(struct hreq *q)
{
	json_t *j = core_simple(q, "health");
	const char *st = json_string_value(json_object_get(j, "status"));
	if (!j)
		st = q->submit_rc == -EAGAIN ? "loading" : "draining";
	bool ready = json_is_true(json_object_get(j, "ready")) && !atomic_load(&q->h->draining);
	json_t *out = json_pack("{s:s}", "status", ready ? "ok" : st ? st : "unavailable");
	json_t *reasons = json_object_get(j, "reasons");
	if (out && reasons)
		json_object_set(out, "reasons", reasons);
	json_decref(j);
	return send_json(q, ready ? 200 : 503, out, ready ? 0 : 1);
}

static enum MHD_Result do_models(struct hreq *q)
{
	json_t *j = core_simple(q, "info");
	if (!j || !json_is_true(json_object_get(j, "ok"))) {
		struct oai_err e;
		if (j)
			oai_err_from_reply(j, &e);
		else
			unavailable(q, &e);
		json_decref(j);
		return send_err(q, &e);
	}
	json_t *model = json_pack(
	    "{s:s,s:s,s:I,s:s,s:O*,s:O*,s:O*}", "id", model_id(j),
	    "object", "model", "created", (json_int_t)0, "owned_by", "edgelm", "architecture",
	    json_object_get(j, "architecture"), "context_length", json_object_get(j, "n_ctx"),
	    "quantization", json_object_get(j, "quant_types"));
	json_decref(j);
	return send_json(q, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model), 0);
}

/* The first sample's value of a family in the monitor's JSON. */
static json_t *metric_value(const json_t *mon, const char *name)
{
	const json_t *fam = json_object_get(json_object_get(mon, "metrics"), name);
	const json_t *v = json_object_get(json_array_get(json_object_get(fam, "series"), 0), "value");
	return v ? json_incref((json_t *)v) : json_null();
}

/* info, health and the monitor's headline figures in one small object, for
 * the page's status strip */
static enum MHD_Result do_status(struct hreq *q)
{
	json_t *info = core_simple(q, "info");
	json_t *health = core_simple(q, "health");
	json_t *metrics = core_simple(q, "metrics");
	json_t *out = json_object();
	const char *keys[] = {"model", "architecture", "isa", "threads", "n_ctx", "version"};
	for (size_t i = 0; i < CM_ARRAY_LEN(keys); i++) {
		json_t *v = json_object_get(info, keys[i]);
		if (v)
			json_object_set(out, keys[i], v);
	}
	json_t *st = json_object_get(health, "status");
	json_object_set_new(out, "status", st ? json_incref(st) : json_string("unavailable"));
	const json_t *mon = json_object_get(metrics, "metrics");
	json_object_set_new(out, "decode_tokens_per_second",
			    metric_value(mon, "edgelm_decode_tokens_per_second"));
	json_object_set_new(out, "running", metric_value(mon, "edgelm_sequences_running"));
	json_object_set_new(out, "queued", metric_value(mon, "edgelm_sequences_queued"));
	json_t *flags = json_array();
	const char *fname;
	const json_t *f;
	json_object_foreach ((json_t *)json_object_get(mon, "flags"), fname, f)
		if (json_is_true(json_object_get(f, "on")))
			json_array_append_new(flags, json_string(fname));
	json_object_set_new(out, "flags", flags);
	json_decref(info);
	json_decref(health);
	json_decref(metrics);
	return send_json(q, 200, out, 0);
}

static void random_hex(char *buf, size_t nbytes)
{
	uint8_t b[16];
	if (nbytes > sizeof(b))
		nbytes = sizeof(b);
	cm_random_bytes(b, nbytes);
	for (size_t i = 0; i < nbytes; i++)
		sprintf(buf + 2 * i, "%02x", b[i]);
}

static int out_reserve(struct hreq *q, size_t more)
{
	if (q->out_len + more <= q->out_cap)
		return 0;
	size_t cap = CM_MAX(q->out_cap * 2, q->out_len + more + 256);
	char *p = cm_realloc(q->out, cap);
	if (!p)
		return -ENOMEM;
	q->out = p;
	q->out_cap = cap;
	return 0;
}

/* Append one SSE event: "data: JSON\n\n" (j is consumed) or data: [DONE]. */
static int sse_event(struct hreq *q, json_t *j, bool done)
{
	char *text = done ? NULL : j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!done && !text)
		return -ENOMEM;
	const char *body = done ? "[DONE]" : text;
	size_t n = strlen(body);
	int rc = out_reserve(q, n + 8);
	if (rc == 0) {
		memcpy(q->out + q->out_len, "data: ", 6);
		memcpy(q->out + q->out_len + 6, body, n);
		memcpy(q->out + q->out_len + 6 + n, "\n\n", 2);
		q->out_len += n + 8;
	}
	free(text);
	return rc;
}

/* One poll of the stream: new text and maybe its end, as SSE events. */
static int stream_step(struct hreq *q)
{
	char json[256];
	int n = snprintf(json, sizeof(json),
			 "{\"v\":1,\"op\":\"poll\",\"id\":\"%s\",\"ack\":%llu,\"wait_ms\":%d}",
			 q->id, (unsigned long long)q->ack, POLL_WAIT_MS);
	json_t *r = core_call(q, json, (size_t)n);
	if (q->gone) {
		json_decref(r);
		return -EPIPE;
	}
	if (!r || !json_is_true(json_object_get(r, "ok"))) {
		struct oai_err e;
		if (r)
			oai_err_from_reply(r, &e);
		else
			unavailable(q, &e);
		json_decref(r);
		q->finished = true;
		q->active = false;
		sse_event(q, oai_err_json(&e), false);
		return sse_event(q, NULL, true);
	}
	const json_t *text = json_object_get(r, "text");
	size_t len = json_string_length(text);
	json_int_t next = json_integer_value(json_object_get(r, "next"));
	bool done = json_is_true(json_object_get(r, "done"));
	int rc = 0;
	const json_t *plp = json_object_get(r, "logprobs");
	if (len || json_array_size(plp) > 0) {
		json_t *ch = oai_chunk(q->kind, q->cid, q->model, q->created,
				       json_string_value(text), len, false, NULL, NULL);
		if (ch && plp)
			json_object_set_new(json_array_get(json_object_get(ch, "choices"), 0),
					    "logprobs", oai_logprobs(q->kind, plp, &q->text_offset));
		rc = sse_event(q, ch, false);
	}
	if (next > 0)
		q->ack = (uint64_t)next;
	if (rc == 0 && done) {
		q->finished = true;
		q->active = false;
		const char *fin = oai_finish(json_string_value(json_object_get(r, "finish_reason")));
		rc = sse_event(q, oai_chunk(q->kind, q->cid, q->model, q->created, NULL, 0, false,
					     fin ? fin : "stop", NULL),
			       false);
		if (rc == 0 && q->include_usage)
			rc = sse_event(q, oai_chunk(q->kind, q->cid, q->model, q->created, NULL, 0,
						     false, NULL,
						     oai_usage(json_object_get(r, "usage"))),
				       false);
		if (rc == 0)
			rc = sse_event(q, NULL, true);
	}
	json_decref(r);
	return rc;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct hreq *q = cls;
	(void)pos;
	for (;;) {
		if (q->out_off < q->out_len) {
			size_t n = CM_MIN(max, q->out_len - q->out_off);
			memcpy(buf, q->out + q->out_off, n);
			q->out_off += n;
			if (q->out_off == q->out_len)
				q->out_off = q->out_len = 0;
			return (ssize_t)n;
		}
		if (q->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (q->first_chunk) {
			q->first_chunk = false;
			if (q->kind == OAI_CHAT &&
			    sse_event(q, oai_chunk(q->kind, q->cid, q->model, q->created, "", 0, true,
						     NULL, NULL),
				      false) != 0)
				return MHD_CONTENT_READER_END_WITH_ERROR;
			continue;
		}
		if (stream_step(q) != 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
	}
}

/* The stream's response is gone (finished, or the client went away). */
static void sse_free(void *cls)
{
	struct hreq *q = cls;
	if (q->active && !q->finished)
		cancel_generation(q);
	q->active = false;
	hreq_unref(q);
}

static enum MHD_Result do_generate(struct hreq *q)
{
	if (atomic_load(&q->h->draining))
		return send_error(q, 503, "server_error", "shutting_down",
				  "the server is shutting down");
	json_error_t je;
	json_t *body = json_loadb(q->body ? q->body : "", q->body_len,
				  JSON_REJECT_DUPLICATES, &je);
	if (!body) {
		struct oai_err e;
		oai_err_set(&e, 400, "invalid_request_error", NULL, NULL,
			    "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
			    je.column);
		return send_err(q, &e);
	}
	q->id[0] = 'h';
	q->id[1] = '-';
	random_hex(q->id + 2, 12);
	snprintf(q->cid, sizeof(q->cid), "%s%s", q->kind == OAI_CHAT ? "chatcmpl-" : "cmpl-",
		 q->id + 2);
	q->created = (int64_t)time(NULL);
	struct oai_opts o;
	struct oai_err e;
	char *proto = NULL;
	int rc = oai_request(body, q->kind, q->id, &proto, &o, &e);
	json_decref(body);
	if (rc)
		return send_err(q, &e);
	model_name(q);
	q->stream = o.stream;
	q->include_usage = o.include_usage;
	q->active = true;
	json_t *r = core_call(q, proto, strlen(proto));
	free(proto);
	if (q->gone) {
		json_decref(r);
		q->active = false;
		return MHD_NO; /* nobody to answer */
	}
	if (!r || !json_is_true(json_object_get(r, "ok"))) {
		q->active = false;
		if (r)
			oai_err_from_reply(r, &e);
		else
			unavailable(q, &e);
		json_decref(r);
		return send_err(q, &e);
	}
	if (!q->stream) {
		q->active = false;
		json_t *out = oai_response(q->kind, q->cid, q->model, q->created, r);
		json_decref(r);
		return send_json(q, 200, out, 0);
	}
	json_decref(r);
	q->first_chunk = true;
	pthread_mutex_lock(&q->mu);
	q->refs++; /* the response's */
	pthread_mutex_unlock(&q->mu);
	struct MHD_Response *resp =
	    MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, SSE_BLOCK, sse_reader, q, sse_free);
	if (!resp) {
		sse_free(q);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "text/event-stream");
	MHD_add_response_header(resp, "Cache-Control", "no-cache");
	MHD_add_response_header(resp, "X-Accel-Buffering", "no");
	add_common_headers(q, resp);
	enum MHD_Result ret = MHD_queue_response(q->c, 200, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* POST /v1/embeddings: one embed call, no streaming; a client that hangs
 * up just loses the answer (the request is short and not cancellable). */
static enum MHD_Result do_embed(struct hreq *q)
{
	if (atomic_load(&q->h->draining))
		return send_error(q, 503, "server_error", "shutting_down",
				  "the server is shutting down");
	json_error_t je;
	json_t *body = json_loadb(q->body ? q->body : "", q->body_len,
				  JSON_REJECT_DUPLICATES, &je);
	struct oai_err e;
	if (!body) {
		oai_err_set(&e, 400, "invalid_request_error", NULL, NULL,
			    "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line,
			    je.column);
		return send_err(q, &e);
	}
	char *proto = NULL;
	bool base64;
	int rc = oai_embed_request(body, &proto, &base64, &e);
	json_decref(body);
	if (rc)
		return send_err(q, &e);
	model_name(q);
	json_t *r = core_call(q, proto, strlen(proto));
	free(proto);
	if (q->gone) {
		json_decref(r);
		return MHD_NO;
	}
	if (!r || !json_is_true(json_object_get(r, "ok"))) {
		if (r)
			oai_err_from_reply(r, &e);
		else
			unavailable(q, &e);
		json_decref(r);
		return send_err(q, &e);
	}
	json_t *out = oai_embed_response(q->model, r, base64);
	json_decref(r);
	/* 9 significant digits give back every float exactly */
	return send_json_flags(q, 200, out, 0, JSON_REAL_PRECISION(9));
}

static enum MHD_Result do_page(struct hreq *q)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    http_page_html_len, (void *)http_page_html, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
	/* the page talks only to this server, and runs only its own script */
	MHD_add_response_header(r, "Content-Security-Policy",
				"default-src 'self'; script-src 'unsafe-inline'; style-src "
				"'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'");
	MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
	enum MHD_Result ret = MHD_queue_response(q->c, 200, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result do_options(struct hreq *q)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	add_common_headers(q, r);
	if (q->h->cors) {
		MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
		MHD_add_response_header(r, "Access-Control-Allow-Headers",
					"Authorization, Content-Type");
		MHD_add_response_header(r, "Access-Control-Max-Age", "600");
	}
	MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
	enum MHD_Result ret = MHD_queue_response(q->c, q->h->cors ? 204 : 405, r);
	MHD_destroy_response(r);
	return ret;
}

/* ---- auth, rate ------------------------------------------------------------------- */

/* Compare without an early exit, so the time taken does not tell how much
 * of a key matched. */
static bool key_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = (unsigned char)(la != lb);
	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)(a[i] ^ b[i < lb ? i : 0]);
	return d == 0;
}

/* The caller's identity from its Bearer key; false: refused. */
static bool authenticate(struct hreq *q)
{
	struct http_front *h = q->h;
	if (h->n_keys == 0) {
		snprintf(q->identity, sizeof(q->identity), "http");
		return true;
	}
	const char *auth = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, "Authorization");
	if (!auth || strncasecmp(auth, "Bearer ", 7) != 0)
		return false;
	auth += 7;
	while (*auth == ' ')
		auth++;
	int found = -1;
	for (int i = 0; i < h->n_keys; i++)
		if (key_equal(auth, h->keys[i]) && found < 0)
			found = i;
	if (found < 0)
		return false;
	snprintf(q->identity, sizeof(q->identity), "http:%s", h->key_names[found]);
	return true;
}

static void addr_of(struct MHD_Connection *c, uint8_t *len, unsigned char *ip)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;
	*len = 0;
	if (sa && sa->sa_family == AF_INET) {
		memcpy(ip, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		*len = 4;
	} else if (sa && sa->sa_family == AF_INET6) {
		memcpy(ip, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
		*len = 16;
	}
}

/* A token bucket per client address (burst: two seconds' worth, at least
 * 4); false: over the limit, *retry_s until a token is back. */
static bool rate_ok(struct hreq *q, int64_t *retry_s)
{
	struct http_front *h = q->h;
	double rate = h->p.rate_limit;
	if (rate <= 0)
		return true;
	double burst = CM_MAX(4.0, 2 * rate);
	uint8_t len;
	unsigned char ip[16];
	addr_of(q->c, &len, ip);
	uint64_t now = cm_now_ns();
	uint32_t hash = 2166136261u;
	for (uint8_t i = 0; i < len; i++)
		hash = (hash ^ ip[i]) * 16777619u;
	pthread_mutex_lock(&h->mu);
	struct rate_slot *s = &h->rates[hash % RATE_SLOTS];
	if (s->ip_len != len || memcmp(s->ip, ip, len) != 0) {
		/* a new address, or another that hashed here: it starts full */
		s->ip_len = len;
		memcpy(s->ip, ip, len);
		s->tokens = burst;
		s->last_ns = now;
	}
	s->tokens = CM_MIN(burst, s->tokens + (double)(now - s->last_ns) * 1e-9 * rate);
	s->last_ns = now;
	bool ok = s->tokens >= 1.0;
	if (ok)
		s->tokens -= 1.0;
	else
		*retry_s = (int64_t)ceil((1.0 - s->tokens) / rate);
	pthread_mutex_unlock(&h->mu);
	return ok;
}

/* ---- connections (slow clients) ---------------------------------------------------- */

static bool same_ip(const struct conn *a, const struct conn *b)
{
	return a->ip_len == b->ip_len && memcmp(a->ip, b->ip, a->ip_len) == 0;
}

/* Called with h->mu held, after nc arrived. */
static void make_room(struct listener *L, const struct conn *nc)
{
	unsigned max = L->h->p.max_connections;
	unsigned soft_all = CM_MAX(2u, max / 2), soft_ip = CM_MAX(2u, max / 4);
	struct conn *oldest = NULL, *oldest_ip = NULL;
	unsigned n = 0, n_ip = 0;
	for (unsigned i = 0; i < L->n_conns; i++) {
		struct conn *c = &L->conns[i];
		if (!c->used || c->evicted || !c->waiting)
			continue;
		n++;
		bool mine = same_ip(c, nc);
		n_ip += mine;
		if (c == nc)
			continue;
		if (!oldest || c->since_ns < oldest->since_ns)
			oldest = c;
		if (mine && (!oldest_ip || c->since_ns < oldest_ip->since_ns))
			oldest_ip = c;
	}
	struct conn *victim = n_ip > soft_ip ? oldest_ip : n > soft_all ? oldest : NULL;
	if (victim) {
		(void)shutdown(victim->fd, SHUT_RDWR);
		victim->evicted = true;
	}
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
			  enum MHD_ConnectionNotificationCode code)
{
	struct listener *L = cls;
	pthread_mutex_lock(&L->h->mu);
	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		struct conn *hc = *socket_ctx;
		if (hc)
			hc->used = false;
		*socket_ctx = NULL;
		pthread_mutex_unlock(&L->h->mu);
		return;
	}
	const union MHD_ConnectionInfo *fd =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	for (unsigned i = 0; fd && i < L->n_conns; i++) {
		struct conn *hc = &L->conns[i];
		if (hc->used)
			continue;
		*hc = (struct conn){.used = true, .waiting = true, .fd = fd->connect_fd,
				    .since_ns = cm_now_ns()};
		addr_of(c, &hc->ip_len, hc->ip);
		*socket_ctx = hc;
		make_room(L, hc);
		break;
	}
	pthread_mutex_unlock(&L->h->mu);
}

static struct conn *conn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *i =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return i ? i->socket_context : NULL;
}

static void conn_waiting(struct listener *L, struct MHD_Connection *c, bool waiting)
{
	pthread_mutex_lock(&L->h->mu);
	struct conn *hc = conn_of(c);
	if (hc) {
		hc->waiting = waiting;
		hc->since_ns = cm_now_ns();
	}
	pthread_mutex_unlock(&L->h->mu);
}

/* ---- the handler ------------------------------------------------------------------- */

static enum route route_of(const char *method, const char *url, bool *method_ok)
{
	static const struct {
		const char *url, *method;
		enum route r;
	} routes[] = {
		{"/", "GET", R_PAGE},
		{"/index.html", "GET", R_PAGE},
		{"/health", "GET", R_HEALTH},
		{"/v1/health", "GET", R_HEALTH},
		{"/v1/models", "GET", R_MODELS},
		{"/v1/completions", "POST", R_COMPLETIONS},
		{"/v1/chat/completions", "POST", R_CHAT},
		{"/v1/embeddings", "POST", R_EMBED},
		{"/v1/edgelm/status", "GET", R_STATUS},
	};
	*method_ok = true;
	for (size_t i = 0; i < CM_ARRAY_LEN(routes); i++) {
		if (strcmp(url, routes[i].url) != 0)
			continue;
		if (strcmp(method, "OPTIONS") == 0)
			return R_OPTIONS;
		bool head = strcmp(method, "HEAD") == 0 && strcmp(routes[i].method, "GET") == 0;
		*method_ok = head || strcmp(method, routes[i].method) == 0;
		return routes[i].r;
	}
	return R_NONE;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct listener *L = cls;
	struct hreq *q = *con_cls;
	(void)toe;
	conn_waiting(L, c, true);
	if (q)
		hreq_unref(q);
	*con_cls = NULL;
}

static struct hreq *hreq_new(struct listener *L, struct MHD_Connection *c)
{
	struct hreq *q = cm_calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->efd = eventfd(0, EFD_CLOEXEC);
	if (q->efd < 0) {
		cm_free(q);
		return NULL;
	}
	pthread_mutex_init(&q->mu, NULL);
	q->refs = 1;
	q->h = L->h;
	q->c = c;
	const union MHD_ConnectionInfo *fd =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	q->fd = fd ? fd->connect_fd : -1;
	return q;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **con_cls)
{
	struct listener *L = cls;
	struct http_front *h = L->h;
	struct hreq *q = *con_cls;
	(void)version;
	if (!q) {
		/* the headers are in: route, check the size announced */
		if (!(q = hreq_new(L, c)))
			return MHD_NO;
		*con_cls = q;
		bool method_ok;
		q->route = route_of(method, url, &method_ok);
		if (q->route == R_NONE) {
			q->started = true;
			return send_error(q, 404, "invalid_request_error", "not_found",
					  "no such endpoint (see docs/http.md)");
		}
		if (!method_ok) {
			q->started = true;
			return send_error(q, 405, "invalid_request_error", "method_not_allowed",
					  "method not allowed on this endpoint");
		}
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
		if (cl && strtoull(cl, NULL, 10) > h->p.max_body_bytes) {
			q->started = true;
			char msg[96];
			snprintf(msg, sizeof(msg), "the body is larger than %zu bytes",
				 h->p.max_body_bytes);
			return send_error(q, 413, "invalid_request_error", "too_large", msg);
		}
		return MHD_YES;
	}
	if (q->started) {
		/* answered early (404, 413, ...): the rest is dropped */
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;
		*upload_size = 0;
		if (q->too_large || q->body_len + n > h->p.max_body_bytes) {
			q->too_large = true;
			return MHD_YES;
		}
		if (q->body_len + n + 1 > q->body_cap) {
			size_t cap = CM_MAX(q->body_cap * 2, q->body_len + n + 1);
			cap = CM_MIN(cap, h->p.max_body_bytes + 1);
			char *b = cm_realloc(q->body, cap);
			if (!b)
				return MHD_NO;
			q->body = b;
			q->body_cap = cap;
		}
		memcpy(q->body + q->body_len, upload, n);
		q->body_len += n;
		return MHD_YES;
	}
	/* the whole request is in */
	q->started = true;
	conn_waiting(L, c, false);
	if (q->too_large) {
		char msg[96];
		snprintf(msg, sizeof(msg), "the body is larger than %zu bytes", h->p.max_body_bytes);
		return send_error(q, 413, "invalid_request_error", "too_large", msg);
	}
	if (q->route == R_OPTIONS)
		return do_options(q);
	if (q->route == R_PAGE)
		return do_page(q);
	int64_t retry = 0;
	if (!rate_ok(q, &retry)) {
		struct oai_err e;
		oai_err_set(&e, 429, "rate_limit_error", NULL, "rate_limit_exceeded",
			    "too many requests from this address (http_rate_limit %g/s)",
			    h->p.rate_limit);
		e.retry_after_s = retry > 0 ? retry : 1;
		return send_err(q, &e);
	}
	if (q->route == R_HEALTH) {
		snprintf(q->identity, sizeof(q->identity), "http");
		return do_health(q);
	}
	if (!authenticate(q))
		return send_error(q, 401, "invalid_request_error", "invalid_api_key",
				  "a valid API key is required (Authorization: Bearer KEY)");
	switch (q->route) {
	case R_MODELS:
		return do_models(q);
	case R_STATUS:
		return do_status(q);
	case R_COMPLETIONS:
		q->kind = OAI_COMPLETIONS;
		return do_generate(q);
	case R_CHAT:
		q->kind = OAI_CHAT;
		return do_generate(q);
	case R_EMBED:
		return do_embed(q);
	default:
		return MHD_NO;
	}
}

/* ---- keys -------------------------------------------------------------------------- */

void http_keys_free(char **names, char **keys, int n)
{
	for (int i = 0; i < n; i++) {
		cm_free(names ? names[i] : NULL);
		if (keys && keys[i]) {
			explicit_bzero(keys[i], strlen(keys[i]));
			cm_free(keys[i]);
		}
	}
	cm_free(names);
	cm_free(keys);
}

int http_keys_parse(const char *text, char ***ret_names, char ***ret_keys, struct cm_err *err)
{
	char **names = NULL, **keys = NULL;
	int n = 0, cap = 0, line = 0;
	const char *p = text;
	while (*p) {
		line++;
		size_t len = strcspn(p, "\n");
		const char *e = p + len;
		const char *w[3];
		size_t wl[3];
		int nw = 0;
		for (const char *s = p; s < e;) {
			while (s < e && (*s == ' ' || *s == '\t' || *s == '\r'))
				s++;
			if (s == e || *s == '#')
				break;
			const char *t = s;
			while (t < e && *t != ' ' && *t != '\t' && *t != '\r')
				t++;
			if (nw == 2) {
				nw = 3;
				break;
			}
			w[nw] = s;
			wl[nw++] = (size_t)(t - s);
			s = t;
		}
		p = *e ? e + 1 : e;
		if (nw == 0)
			continue;
		if (nw > 2) {
			http_keys_free(names, keys, n);
			return cm_err_set(err, -EINVAL, "line %d: want NAME KEY or KEY", line);
		}
		const char *k = w[nw - 1];
		size_t kl = wl[nw - 1];
		bool printable = true;
		for (size_t i = 0; i < kl; i++)
			printable &= isgraph((unsigned char)k[i]) != 0;
		if (kl < 8 || kl > 256 || !printable) {
			http_keys_free(names, keys, n);
			return cm_err_set(err, -EINVAL,
					  "line %d: a key is 8-256 printable characters", line);
		}
		if (nw == 2 && (wl[0] == 0 || wl[0] > 48)) {
			http_keys_free(names, keys, n);
			return cm_err_set(err, -EINVAL, "line %d: a name is 1-48 characters", line);
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 4;
			char **nn = cm_realloc(names, (size_t)cap * sizeof(*nn));
			if (nn)
				names = nn;
			char **nk = nn ? cm_realloc(keys, (size_t)cap * sizeof(*nk)) : NULL;
			if (nk)
				keys = nk;
			if (!nn || !nk) {
				http_keys_free(names, keys, n);
				return cm_err_set(err, -ENOMEM, "out of memory");
			}
		}
		char name[64];
		if (nw == 2)
			snprintf(name, sizeof(name), "%.*s", (int)wl[0], w[0]);
		else
			snprintf(name, sizeof(name), "key%d", n + 1);
		names[n] = cm_strdup(name);
		keys[n] = cm_strndup(k, kl);
		n++;
		if (!names[n - 1] || !keys[n - 1]) {
			http_keys_free(names, keys, n);
			return cm_err_set(err, -ENOMEM, "out of memory");
		}
	}
	if (n == 0)
		return cm_err_set(err, -EINVAL, "no key in the file");
	*ret_names = names;
	*ret_keys = keys;
	return n;
}

static int keys_load(struct http_front *h, const char *path, struct cm_err *err)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return cm_err_set(err, -errno, "http: api key file %s: %s", path, strerror(errno));
	char *text = NULL;
	size_t len = 0, cap = 0;
	char buf[4096];
	size_t got;
	while ((got = fread(buf, 1, sizeof(buf), f)) > 0) {
		if (len + got + 1 > cap || len + got > (1u << 20)) {
			if (len + got > (1u << 20)) {
				fclose(f);
				cm_free(text);
				return cm_err_set(err, -EFBIG, "http: api key file %s: over 1 MiB",
						  path);
			}
			cap = CM_MAX(2 * cap, len + got + 1);
			char *t = cm_realloc(text, cap);
			if (!t) {
				fclose(f);
				cm_free(text);
				return cm_err_set(err, -ENOMEM, "out of memory");
			}
			text = t;
		}
		memcpy(text + len, buf, got);
		len += got;
	}
	fclose(f);
	if (!text)
		text = cm_strdup("");
	else
		text[len] = '\0';
	struct cm_err sub = {0};
	int n = text ? http_keys_parse(text, &h->key_names, &h->keys, &sub) : -ENOMEM;
	if (text) {
		explicit_bzero(text, len);
		cm_free(text);
	}
	if (n < 0)
		return cm_err_set(err, n, "http: api key file %s: %s", path, sub.msg);
	h->n_keys = n;
	return 0;
}

/* ---- start, stop ------------------------------------------------------------------- */


int http_front_start(const struct http_params *p, http_front **ret, struct cm_err *err)
{
	if (!p->submit || p->n_listen == 0 || p->n_listen > HTTP_MAX_LISTEN)
		return cm_err_set(err, -EINVAL, "http: 1-%d listen addresses and a core are needed",
				  HTTP_MAX_LISTEN);
	struct http_front *h = cm_calloc(1, sizeof(*h));
	if (!h)
		return cm_err_set(err, -ENOMEM, "http: out of memory");
	h->p = *p;
	if (!h->p.max_connections)
		h->p.max_connections = HTTP_DEFAULT_MAX_CONNECTIONS;
	if (!h->p.timeout_s)
		h->p.timeout_s = HTTP_DEFAULT_TIMEOUT_S;
	if (!h->p.max_body_bytes)
		h->p.max_body_bytes = HTTP_DEFAULT_MAX_BODY;
	h->p.listen = NULL;
	pthread_mutex_init(&h->mu, NULL);
	if (p->cors_origin && *p->cors_origin)
		h->cors = cm_strdup(p->cors_origin);
	int rc = 0;
	if (p->api_key_file && *p->api_key_file && (rc = keys_load(h, p->api_key_file, err)) != 0) {
		http_front_stop(h);
		return rc;
	}
	for (size_t i = 0; i < p->n_listen; i++) {
		struct sockaddr_storage ss;
		bool v6;
		if (cm_parse_addr_port(p->listen[i], &ss, &v6)) {
			http_front_stop(h);
			return cm_err_set(err, -EINVAL,
					  "http: bad listen address '%s' (want ADDR:PORT or "
					  "[ADDR6]:PORT)",
					  p->listen[i]);
		}
		struct listener *L = &h->ls[i];
		L->h = h;
		/* slack above MHD's limit: connections it accepts before the
		 * limit bites are still tracked */
		L->n_conns = h->p.max_connections + 16;
		L->conns = cm_calloc(L->n_conns, sizeof(*L->conns));
		if (!L->conns) {
			http_front_stop(h);
			return cm_err_set(err, -ENOMEM, "http: out of memory");
		}
		uint16_t port = v6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
				   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
		errno = 0;
		L->d = MHD_start_daemon(
		    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
			(v6 ? MHD_USE_IPv6 : 0),
		    port, NULL, NULL, handle, L, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
		    MHD_OPTION_CONNECTION_LIMIT, h->p.max_connections,
		    MHD_OPTION_CONNECTION_TIMEOUT, h->p.timeout_s, MHD_OPTION_NOTIFY_CONNECTION,
		    on_connection, L, MHD_OPTION_NOTIFY_COMPLETED, on_completed, L,
		    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
		    MHD_OPTION_THREAD_STACK_SIZE, (size_t)256 * 1024, MHD_OPTION_END);
		if (!L->d) {
			int e = errno ? -errno : -EADDRNOTAVAIL;
			http_front_stop(h);
			return cm_err_set(err, e, "http: cannot listen on %s: %s", p->listen[i],
					  strerror(-e));
		}
		h->n_ls = i + 1;
		const union MHD_DaemonInfo *info = MHD_get_daemon_info(L->d, MHD_DAEMON_INFO_BIND_PORT);
		L->port = info ? info->port : port;
	}
	*ret = h;
	return 0;
}

unsigned http_front_port(const http_front *h, size_t i)
{
	return h && i < h->n_ls ? h->ls[i].port : 0;
}

void http_front_drain(http_front *h)
{
	if (h)
		atomic_store(&h->draining, true);
}

void http_front_stop(http_front *h)
{
	if (!h)
		return;
	atomic_store(&h->draining, true);
	atomic_store(&h->stopping, true);
	for (size_t i = 0; i < CM_ARRAY_LEN(h->ls); i++) {
		/* shuts every connection down: their waits see the hang-up,
		 * cancel, and take the core's answer before the join */
		if (h->ls[i].d)
			MHD_stop_daemon(h->ls[i].d);
		cm_free(h->ls[i].conns);
	}
	http_keys_free(h->key_names, h->keys, h->n_keys);
	cm_free(h->cors);
	pthread_mutex_destroy(&h->mu);
	cm_free(h);
}
