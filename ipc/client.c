/* ipc/client.c: libedgelm (see ipc/edgelm.h).
 *
 * Requests are built as struct ipc_request and encoded, and replies decoded,
 * by ipc/protocol.c, so the field names exist once. Each call opens its own
 * nng context on the client's req0 socket, which makes a client handle safe
 * to share between threads.
 *
 * Resends: nng's req0 resends a request after NNG_OPT_REQ_RESENDTIME (60 s by
 * default) and after a reconnect. A resent generate would run twice, so the
 * timer is disabled (NNG_DURATION_INFINITE; in nng 1.5.2 any value <= 0 turns
 * it off, and a lost connection then fails the receive with NNG_ECONNRESET
 * instead of resending). Retrying is left to the one request that is safe to
 * repeat: poll, whose ack offset makes it idempotent. */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#ifndef EDGELM_VERSION
#define EDGELM_VERSION "0.1.0"
#endif

#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_POLL_WAIT_MS 2000
#define POLL_RETRIES 5
#define REPLY_MAX_BYTES (256u << 20)

/* The server codes are the protocol's numbers, offset by 100. */
#define SRV(code) (-(100 + (int)(code)))
_Static_assert(EDGELM_E_INVALID_JSON == SRV(IPC_ERR_INVALID_JSON), "code table");
_Static_assert(EDGELM_E_UNSUPPORTED_VERSION == SRV(IPC_ERR_UNSUPPORTED_VERSION), "code table");
_Static_assert(EDGELM_E_UNKNOWN_OP == SRV(IPC_ERR_UNKNOWN_OP), "code table");
_Static_assert(EDGELM_E_INVALID_FIELD == SRV(IPC_ERR_INVALID_FIELD), "code table");
_Static_assert(EDGELM_E_TOO_LARGE == SRV(IPC_ERR_TOO_LARGE), "code table");
_Static_assert(EDGELM_E_PROMPT_TOO_LONG == SRV(IPC_ERR_PROMPT_TOO_LONG), "code table");
_Static_assert(EDGELM_E_QUEUE_FULL == SRV(IPC_ERR_QUEUE_FULL), "code table");
_Static_assert(EDGELM_E_DEADLINE_EXCEEDED == SRV(IPC_ERR_DEADLINE_EXCEEDED), "code table");
_Static_assert(EDGELM_E_SHUTTING_DOWN == SRV(IPC_ERR_SHUTTING_DOWN), "code table");
_Static_assert(EDGELM_E_NOT_FOUND == SRV(IPC_ERR_NOT_FOUND), "code table");
_Static_assert(EDGELM_E_NOT_READY == SRV(IPC_ERR_NOT_READY), "code table");
_Static_assert(EDGELM_E_UNSUPPORTED == SRV(IPC_ERR_UNSUPPORTED), "code table");
_Static_assert(EDGELM_E_INTERNAL == SRV(IPC_ERR_INTERNAL), "code table");
_Static_assert(IPC_ERR_COUNT == 14, "new protocol error: add its EDGELM_E_ code");
_Static_assert((int)EDGELM_FINISH_DEADLINE == (int)IPC_FINISH_DEADLINE, "finish table");
_Static_assert((int)EDGELM_HEALTH_DRAINING == (int)IPC_HEALTH_DRAINING, "health table");
_Static_assert(EDGELM_DEFAULT_MAX_MSG == IPC_DEFAULT_MAX_MSG_BYTES, "client and daemon limits");

struct edgelm_client {
	nng_socket sock;
	nng_dialer dialer;
	atomic_int timeout_ms;
	atomic_size_t max_msg;
	char *url;
	pthread_mutex_t dial_mu; /* fresh dials (redial) */
	int redials;
};

/* ---- errors --------------------------------------------------------------- */

EDGELM_API const char *edgelm_strerror(int code)
{
	switch (code) {
	case EDGELM_OK:
		return "success";
	case EDGELM_E_INVALID_ARG:
		return "invalid argument";
	case EDGELM_E_NOMEM:
		return "out of memory";
	case EDGELM_E_CONNECT:
		return "cannot connect to the daemon";
	case EDGELM_E_TIMEOUT:
		return "no reply from the daemon in time";
	case EDGELM_E_CONNECTION:
		return "connection to the daemon lost";
	case EDGELM_E_PROTOCOL:
		return "malformed reply from the daemon";
	case EDGELM_E_ABORTED:
		return "stopped by the caller";
	default:
		if (edgelm_is_server_error(code) && -code - 100 < IPC_ERR_COUNT)
			return ipc_errcode_describe((enum ipc_errcode)(-code - 100));
		return "unknown error";
	}
}

EDGELM_API const char *edgelm_version(void)
{
	return EDGELM_VERSION;
}

static int set_err(struct edgelm_error *err, int code, const char *fmt, ...) CM_PRINTF(3, 4);
static int set_err(struct edgelm_error *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->message, sizeof(err->message), fmt, ap);
		va_end(ap);
		err->code = code;
		err->server_code[0] = '\0';
		err->retry_after_ms = -1;
	}
	return code;
}

static void clear_err(struct edgelm_error *err)
{
	if (err) {
		err->code = 0;
		err->server_code[0] = '\0';
		err->message[0] = '\0';
		err->retry_after_ms = -1;
	}
}

static int server_err(struct edgelm_error *err, const struct ipc_reply *r)
{
	int code = SRV(r->error);
	if (err) {
		err->code = code;
		snprintf(err->server_code, sizeof(err->server_code), "%s",
		         ipc_errcode_name(r->error));
		snprintf(err->message, sizeof(err->message), "%s",
		         r->message ? r->message : ipc_errcode_describe(r->error));
		err->retry_after_ms = r->retry_after_ms;
	}
	return code;
}

static int nng_err(struct edgelm_error *err, int rv, int timeout_ms, const char *what)
{
	switch (rv) {
	case NNG_ETIMEDOUT:
		return set_err(err, EDGELM_E_TIMEOUT, "%s: no reply within %d ms", what,
		               timeout_ms);
	case NNG_ENOMEM:
		return set_err(err, EDGELM_E_NOMEM, "%s: out of memory", what);
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
		return set_err(err, EDGELM_E_CONNECTION,
		               "%s: the connection to the daemon was lost (edgelmd stopped?)", what);
	default:
		return set_err(err, EDGELM_E_CONNECTION, "%s: %s", what, nng_strerror(rv));
	}
}

/* ---- connection ----------------------------------------------------------- */

static void client_free(struct edgelm_client *c)
{
	pthread_mutex_destroy(&c->dial_mu);
	cm_free(c->url);
	cm_free(c);
}

EDGELM_API int edgelm_connect(const char *url, edgelm_client **ret_client, struct edgelm_error *err)
{
	clear_err(err);
	if (!ret_client)
		return set_err(err, EDGELM_E_INVALID_ARG, "edgelm_connect: ret_client is NULL");
	*ret_client = NULL;
	if (!url || !*url) {
		url = getenv("EDGELM_SOCKET");
		if (!url || !*url)
			url = EDGELM_DEFAULT_URL;
	}
	struct edgelm_client *c = cm_calloc(1, sizeof(*c));
	if (!c || !(c->url = cm_strdup(url)) || pthread_mutex_init(&c->dial_mu, NULL) != 0) {
		if (c)
			cm_free(c->url);
		cm_free(c);
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	}
	atomic_init(&c->timeout_ms, DEFAULT_TIMEOUT_MS);
	atomic_init(&c->max_msg, (size_t)IPC_DEFAULT_MAX_MSG_BYTES);
	int rv = nng_req0_open(&c->sock);
	if (rv != 0) {
		client_free(c);
		return set_err(err, EDGELM_E_NOMEM, "cannot open an nng req0 socket: %s",
		               nng_strerror(rv));
	}
	/* Contexts copy the socket's resend time when they open; each call sets
	 * it on its context again (below) so neither can resend. */
	rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	if (rv == 0)
		rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20);
	if (rv == 0)
		rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
	if (rv == 0)
		rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, REPLY_MAX_BYTES);
	if (rv != 0) {
		nng_close(c->sock);
		client_free(c);
		return set_err(err, EDGELM_E_CONNECT, "cannot configure the socket: %s",
		               nng_strerror(rv));
	}
	/* A blocking dial: fail now, with the reason, when nothing listens. */
	rv = nng_dial(c->sock, url, &c->dialer, 0);
	if (rv != 0) {
		nng_close(c->sock);
		client_free(c);
		const char *hint = rv == NNG_ENOENT || rv == NNG_ECONNREFUSED
		                       ? " (is edgelmd running?)"
		                   : rv == NNG_EPERM ? " (are you in the socket's group?)"
		                                     : "";
		return set_err(err, EDGELM_E_CONNECT, "cannot connect to %s: %s%s", url,
		               nng_strerror(rv), hint);
	}
	*ret_client = c;
	return 0;
}

/* ---- closing ---------------------------------------------------------------
 * nng 1.5.2's nng_close can wait for good after the peer dropped the
 * connection (its shared reaper misses a wakeup; nanomsg/nng#1543, fixed in
 * nng 1.8): seen in ~1 of 30 runs of a client whose oversized request the
 * daemon cut off, then reconnected. A client must not hang in close for
 * that, so the close runs in a detached thread and edgelm_close waits for
 * it IPC_CLOSE_WAIT_MS at most; past that the thread keeps the socket (and
 * frees its record if the close ever returns). */
void (*ipc_client_close_fn)(uint32_t sock_id) = NULL;

struct closer {
	nng_socket sock;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int refs; /* the thread's and edgelm_close's */
};

static void closer_unref(struct closer *k)
{
	pthread_mutex_lock(&k->mu);
	bool last = --k->refs == 0;
	pthread_mutex_unlock(&k->mu);
	if (last) {
		pthread_cond_destroy(&k->cv);
		pthread_mutex_destroy(&k->mu);
		cm_free(k);
	}
}

static void sock_close(nng_socket s)
{
	if (ipc_client_close_fn)
		ipc_client_close_fn(nng_socket_id(s));
	else
		nng_close(s);
}

static void *close_thread(void *arg)
{
	struct closer *k = arg;
	sock_close(k->sock);
	pthread_mutex_lock(&k->mu);
	k->done = true;
	pthread_cond_signal(&k->cv);
	pthread_mutex_unlock(&k->mu);
	closer_unref(k);
	return NULL;
}

/* Starts close_thread on k (refs 2); false when it cannot (k destroyed) */
static bool closer_start(struct closer *k)
{
	pthread_condattr_t ca;
	pthread_attr_t ta;
	pthread_t th;
	bool ok = false;
	if (pthread_condattr_init(&ca) != 0)
		return false;
	bool cv = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
		  pthread_cond_init(&k->cv, &ca) == 0;
	pthread_condattr_destroy(&ca);
	bool mu = cv && pthread_mutex_init(&k->mu, NULL) == 0;
	if (mu && pthread_attr_init(&ta) == 0) {
		ok = pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED) == 0 &&
		     pthread_create(&th, &ta, close_thread, k) == 0;
		pthread_attr_destroy(&ta);
	}
	if (!ok && mu)
		pthread_mutex_destroy(&k->mu);
	if (!ok && cv)
		pthread_cond_destroy(&k->cv);
	return ok;
}

EDGELM_API void edgelm_close(edgelm_client *c)
{
	if (!c)
		return;
	struct closer *k = cm_malloc(sizeof(*k));
	if (k) {
		*k = (struct closer){.sock = c->sock, .refs = 2};
		if (!closer_start(k)) {
			cm_free(k);
			k = NULL;
		}
	}
	if (!k) { /* no thread to be had: close here */
		sock_close(c->sock);
		client_free(c);
		return;
	}
	struct timespec dl = cm_deadline(CLOCK_MONOTONIC, IPC_CLOSE_WAIT_MS);
	pthread_mutex_lock(&k->mu);
	while (!k->done)
		if (pthread_cond_timedwait(&k->cv, &k->mu, &dl) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&k->mu);
	closer_unref(k);
	client_free(c);
}

EDGELM_API void edgelm_set_timeout(edgelm_client *c, int timeout_ms)
{
	atomic_store(&c->timeout_ms, timeout_ms > 0 ? timeout_ms : 0);
}

EDGELM_API void edgelm_set_max_msg(edgelm_client *c, size_t bytes)
{
	atomic_store(&c->max_msg, bytes);
}

EDGELM_API void edgelm_free(void *p)
{
	cm_free(p);
}

/* ---- one request, one reply ----------------------------------------------- */

/* A connection lost (the daemon restarted, or dropped an oversized
 * request) comes back through the dialer's reconnect, which nng 1.5.2
 * schedules from its shared reaper; when that stalls (nanomsg/nng#1543,
 * seen after a drop), the dialer never dials again. A request that found no
 * connection for IPC_REDIAL_AFTER_MS therefore dials once more itself: the
 * new dialer's pipe serves it, and the old dialer's, should it come back,
 * is just a second pipe. At most IPC_MAX_REDIALS extra dialers a client. */
static void redial(struct edgelm_client *c)
{
	pthread_mutex_lock(&c->dial_mu);
	nng_dialer d;
	if (c->redials < IPC_MAX_REDIALS && nng_dial(c->sock, c->url, &d, 0) == 0)
		c->redials++;
	pthread_mutex_unlock(&c->dial_mu);
}

int ipc_client_stall_dialer(struct edgelm_client *c)
{
	return nng_dialer_close(c->dialer) == 0 ? 0 : -1;
}

/* timeout_ms <= 0: wait forever. */
static int xfer(struct edgelm_client *c, const char *req, size_t len, int timeout_ms,
                char **ret_reply, size_t *ret_len, struct edgelm_error *err)
{
	*ret_reply = NULL;
	size_t maxm = atomic_load(&c->max_msg);
	if (maxm && len > maxm)
		return set_err(err, EDGELM_E_TOO_LARGE,
		               "request of %zu bytes is larger than the %zu-byte message limit",
		               len, maxm);
	nng_duration to = timeout_ms > 0 ? timeout_ms : NNG_DURATION_INFINITE;
	/* Sending waits only for a connection (after a reconnect): at most the
	 * call's own timeout or the client's, the smaller, and never forever,
	 * so that a call after the daemon went away (the cancel that follows a
	 * dropped generate, say) fails instead of waiting for a daemon that
	 * may never come back. */
	int gen_to = atomic_load(&c->timeout_ms);
	int send_to = timeout_ms > 0 && (gen_to <= 0 || timeout_ms < gen_to) ? timeout_ms : gen_to;
	if (send_to <= 0)
		send_to = DEFAULT_TIMEOUT_MS;
	nng_ctx ctx;
	nng_aio *aio = NULL;
	nng_msg *m = NULL;
	int rc = 0;
	int rv = nng_ctx_open(&ctx, c->sock);
	if (rv != 0)
		return nng_err(err, rv, 0, "cannot open an nng context");
	if ((rv = nng_ctx_set_ms(ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0 || (rv = nng_msg_alloc(&m, len)) != 0) {
		rc = nng_err(err, rv, 0, "cannot prepare the request");
		goto out;
	}
	memcpy(nng_msg_body(m), req, len);
	nng_aio_set_msg(aio, m);
	int first = send_to > IPC_REDIAL_AFTER_MS ? IPC_REDIAL_AFTER_MS : send_to;
	nng_aio_set_timeout(aio, first);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	if (nng_aio_result(aio) == NNG_ETIMEDOUT && send_to > first) {
		/* Not sent yet, so safe to send again on a fresh connection. */
		redial(c);
		nng_aio_set_timeout(aio, send_to - first);
		nng_ctx_send(ctx, aio);
		nng_aio_wait(aio);
	}
	if ((rv = nng_aio_result(aio)) != 0) {
		nng_msg_free(nng_aio_get_msg(aio));
		if (rv == NNG_ETIMEDOUT)
			rc = set_err(err, EDGELM_E_CONNECTION,
			             "no connection to the daemon within %d ms (is edgelmd running?)",
			             send_to);
		else
			rc = nng_err(err, rv, send_to, "sending the request");
		goto out;
	}
	nng_aio_set_timeout(aio, to);
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		rc = nng_err(err, rv, timeout_ms, "waiting for the reply");
		goto out;
	}
	m = nng_aio_get_msg(aio);
	size_t n = nng_msg_len(m);
	char *buf = cm_malloc(n + 1);
	if (!buf) {
		nng_msg_free(m);
		rc = set_err(err, EDGELM_E_NOMEM, "out of memory");
		goto out;
	}
	memcpy(buf, nng_msg_body(m), n);
	buf[n] = '\0';
	nng_msg_free(m);
	*ret_reply = buf;
	if (ret_len)
		*ret_len = n;
out:
	nng_aio_free(aio);
	nng_ctx_close(ctx);
	return rc;
}

/* Encode, send, decode. A daemon error becomes its EDGELM_E_ code, with the
 * decoded reply still returned in *ret_rep when ret_rep is not NULL. */
static int call_op(struct edgelm_client *c, const struct ipc_request *req, int timeout_ms,
                   struct ipc_reply **ret_rep, char **ret_raw, struct edgelm_error *err)
{
	char *json, *raw = NULL;
	size_t len, rlen = 0;
	struct cm_err ce;
	struct ipc_reply *rep = NULL;
	if (ret_rep)
		*ret_rep = NULL;
	if (ret_raw)
		*ret_raw = NULL;
	int rc = ipc_request_encode(req, &json, &len, &ce);
	if (rc)
		return set_err(err, rc == -ENOMEM ? EDGELM_E_NOMEM : EDGELM_E_INVALID_ARG, "%s",
		               ce.msg);
	rc = xfer(c, json, len, timeout_ms, &raw, &rlen, err);
	cm_free(json);
	if (rc)
		return rc;
	rc = ipc_reply_decode(raw, rlen, req->op, &rep, &ce);
	if (rc) {
		cm_free(raw);
		return set_err(err, rc == -ENOMEM ? EDGELM_E_NOMEM : EDGELM_E_PROTOCOL, "%s",
		               ce.msg);
	}
	rc = rep->error != IPC_ERR_NONE ? server_err(err, rep) : 0;
	if (ret_rep)
		*ret_rep = rep;
	else
		ipc_reply_free(rep);
	if (ret_raw)
		*ret_raw = raw;
	else
		cm_free(raw);
	return rc;
}

EDGELM_API int edgelm_call_json(edgelm_client *c, const char *request, size_t len, char **ret_reply,
                                size_t *ret_len, struct edgelm_error *err)
{
	clear_err(err);
	if (!c || !request || !ret_reply)
		return set_err(err, EDGELM_E_INVALID_ARG, "edgelm_call_json: NULL argument");
	char *raw;
	size_t rlen;
	int rc = xfer(c, request, len, atomic_load(&c->timeout_ms), &raw, &rlen, err);
	if (rc) {
		*ret_reply = NULL;
		return rc;
	}
	struct ipc_reply *rep;
	struct cm_err ce;
	if (ipc_reply_decode(raw, rlen, IPC_OP_NONE, &rep, &ce) == 0) {
		if (rep->error != IPC_ERR_NONE)
			rc = server_err(err, rep);
		ipc_reply_free(rep);
	} else {
		/* An ok reply to an op we cannot name still counts as ok; anything
		 * else malformed is reported. */
		if (!strstr(raw, "\"ok\":true"))
			rc = set_err(err, EDGELM_E_PROTOCOL, "%s", ce.msg);
	}
	*ret_reply = raw;
	if (ret_len)
		*ret_len = rlen;
	return rc;
}

/* ---- generation ----------------------------------------------------------- */

EDGELM_API void edgelm_params_init(struct edgelm_params *p)
{
	memset(p, 0, sizeof(*p));
	p->temperature = NAN;
	p->top_k = -1;
	p->top_p = NAN;
	p->min_p = NAN;
	p->repeat_penalty = NAN;
	p->frequency_penalty = NAN;
	p->presence_penalty = NAN;
	p->penalty_last_n = INT32_MIN;
}

EDGELM_API const char *edgelm_finish_name(enum edgelm_finish f)
{
	const char *n = ipc_finish_name((enum ipc_finish)f);
	return n ? n : "none";
}

EDGELM_API void edgelm_result_free(struct edgelm_result *r)
{
	if (!r)
		return;
	cm_free(r->text);
	memset(r, 0, sizeof(*r));
}

static void result_clear(struct edgelm_result *r)
{
	memset(r, 0, sizeof(*r));
	r->queue_ms = r->ttft_ms = r->prefill_ms = r->decode_ms = r->total_ms = NAN;
	r->prefill_tps = r->decode_tps = NAN;
}

static void result_stats(struct edgelm_result *r, enum ipc_finish f, const struct ipc_usage *u,
                         const struct ipc_timings *t)
{
	r->finish = (enum edgelm_finish)f;
	r->prompt_tokens = u->prompt_tokens;
	r->cached_tokens = u->cached_tokens;
	r->completion_tokens = u->completion_tokens;
	r->queue_ms = t->queue_ms;
	r->ttft_ms = t->ttft_ms;
	r->prefill_ms = t->prefill_ms;
	r->decode_ms = t->decode_ms;
	r->total_ms = t->total_ms;
	r->prefill_tps = t->prefill_tps;
	r->decode_tps = t->decode_tps;
}

static int result_append(struct edgelm_result *r, size_t *cap, const char *s, size_t n)
{
	if (r->text_len + n + 1 > *cap) {
		size_t nc = CM_MAX(*cap * 2, r->text_len + n + 1);
		nc = CM_MAX(nc, (size_t)256);
		char *p = cm_realloc(r->text, nc);
		if (!p)
			return -1;
		r->text = p;
		*cap = nc;
	}
	memcpy(r->text + r->text_len, s, n);
	r->text_len += n;
	r->text[r->text_len] = '\0';
	return 0;
}

/* A unique id for generations the caller did not name. */
static void make_id(char *buf, size_t cap)
{
	static atomic_uint counter;
	uint64_t x = 0;
	if (getrandom(&x, sizeof(x), GRND_NONBLOCK) != (ssize_t)sizeof(x))
		x = cm_now_ns() ^ ((uint64_t)getpid() << 32);
	x ^= atomic_fetch_add(&counter, 1);
	snprintf(buf, cap, "c-%016llx", (unsigned long long)x);
}

static bool isset(float f)
{
	return !isnan(f);
}

static int build_gen(struct ipc_request *req, enum ipc_op op, const struct edgelm_params *p,
                     char *idbuf, size_t idcap, struct edgelm_error *err)
{
	ipc_request_init(req, op);
	if (p && p->id) {
		if (strlen(p->id) > EDGELM_ID_MAX)
			return set_err(err, EDGELM_E_INVALID_ARG, "id longer than %d bytes",
			               EDGELM_ID_MAX);
		snprintf(idbuf, idcap, "%s", p->id);
	} else {
		make_id(idbuf, idcap);
	}
	req->id = idbuf;
	if (!p)
		return 0;
	struct ipc_sampling *s = &req->sampling;
	if (p->max_tokens > 0) {
		s->max_tokens = p->max_tokens;
		s->set |= IPC_SET_MAX_TOKENS;
	}
#define F(field, src, bit)                                                                         \
	if (isset(p->src)) {                                                                       \
		s->field = p->src;                                                                 \
		s->set |= bit;                                                                     \
	}
	F(temperature, temperature, IPC_SET_TEMPERATURE)
	F(top_p, top_p, IPC_SET_TOP_P)
	F(min_p, min_p, IPC_SET_MIN_P)
	F(repeat_penalty, repeat_penalty, IPC_SET_REPEAT_PENALTY)
	F(frequency_penalty, frequency_penalty, IPC_SET_FREQUENCY_PENALTY)
	F(presence_penalty, presence_penalty, IPC_SET_PRESENCE_PENALTY)
#undef F
	if (p->top_k >= 0) {
		s->top_k = p->top_k;
		s->set |= IPC_SET_TOP_K;
	}
	if (p->penalty_last_n != INT32_MIN) {
		s->penalty_last_n = p->penalty_last_n;
		s->set |= IPC_SET_PENALTY_LAST_N;
	}
	if (p->has_seed) {
		s->seed = p->seed;
		s->set |= IPC_SET_SEED;
	}
	req->stop = p->stop;
	req->n_stop = p->stop ? p->n_stop : 0;
	if (p->grammar && p->json_schema)
		return set_err(err, EDGELM_E_INVALID_ARG, "grammar and json_schema exclude each other");
	if (p->grammar) {
		req->grammar = p->grammar;
		req->grammar_len = strlen(p->grammar);
	}
	if (p->json_schema) {
		/* the codec writes it as a JSON value: refuse bad text here, with
		 * jansson's word on where */
		json_error_t je;
		json_t *v = json_loads(p->json_schema, JSON_REJECT_DUPLICATES, &je);
		bool obj = json_is_object(v);
		json_decref(v);
		if (!v)
			return set_err(err, EDGELM_E_INVALID_ARG,
			               "json_schema: invalid JSON at line %d column %d: %s", je.line,
			               je.column, je.text);
		if (!obj)
			return set_err(err, EDGELM_E_INVALID_ARG,
			               "json_schema must be a JSON object");
		req->json_schema = p->json_schema;
		req->json_schema_len = strlen(p->json_schema);
	}
	req->deadline_ms = p->deadline_ms;
	req->priority = p->priority;
	return 0;
}

/* Best effort: tell the daemon to stop a generation we gave up on. */
static void cancel_quietly(struct edgelm_client *c, const char *id)
{
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_CANCEL);
	req.id = id;
	(void)call_op(c, &req, 2000, NULL, NULL, NULL);
}

static int run_blocking(struct edgelm_client *c, struct ipc_request *req, struct edgelm_result *res,
                        struct edgelm_error *err)
{
	int t = atomic_load(&c->timeout_ms);
	/* Without a deadline, wait as long as the generation runs: the request is
	 * never resent, and a vanished daemon drops the connection. */
	int timeout = 0;
	if (req->deadline_ms > 0 && t > 0)
		timeout = (int)CM_MIN((int64_t)INT32_MAX - t, req->deadline_ms) + t;
	struct ipc_reply *rep;
	int rc = call_op(c, req, timeout, &rep, NULL, err);
	if (rc) {
		ipc_reply_free(rep);
		if (rc == EDGELM_E_TIMEOUT || rc == EDGELM_E_CONNECTION)
			cancel_quietly(c, req->id);
		return rc;
	}
	const struct ipc_gen_reply *g = &rep->u.gen;
	size_t cap = 0;
	if (g->stream) {
		ipc_reply_free(rep);
		return set_err(err, EDGELM_E_PROTOCOL, "a stream started for a blocking request");
	}
	if (result_append(res, &cap, g->text ? g->text : "", g->text_len)) {
		ipc_reply_free(rep);
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	}
	snprintf(res->id, sizeof(res->id), "%s", rep->id ? rep->id : req->id);
	result_stats(res, g->finish, &g->usage, &g->timings);
	ipc_reply_free(rep);
	return 0;
}

static int run_stream(struct edgelm_client *c, struct ipc_request *req, int32_t wait_ms,
                      edgelm_text_cb cb, void *user, struct edgelm_result *res,
                      struct edgelm_error *err)
{
	int t = atomic_load(&c->timeout_ms);
	struct ipc_reply *rep;
	size_t cap = 0;
	req->stream = true;
	int rc = call_op(c, req, t, &rep, NULL, err);
	if (rc) {
		ipc_reply_free(rep);
		if (rc == EDGELM_E_TIMEOUT || rc == EDGELM_E_CONNECTION)
			cancel_quietly(c, req->id);
		return rc;
	}
	if (!rep->u.gen.stream) {
		ipc_reply_free(rep);
		return set_err(err, EDGELM_E_PROTOCOL, "the daemon did not start a stream");
	}
	snprintf(res->id, sizeof(res->id), "%s", rep->id ? rep->id : req->id);
	ipc_reply_free(rep);

	if (wait_ms <= 0)
		wait_ms = DEFAULT_POLL_WAIT_MS;
	uint64_t ack = 0;
	int failures = 0;
	for (;;) {
		struct ipc_request poll;
		ipc_request_init(&poll, IPC_OP_POLL);
		poll.id = res->id;
		poll.ack = ack;
		poll.wait_ms = (uint32_t)wait_ms;
		int poll_to = t > 0 ? (int)CM_MIN((int64_t)INT32_MAX, (int64_t)wait_ms + t) : 0;
		rc = call_op(c, &poll, poll_to, &rep, NULL, err);
		if (rc == EDGELM_E_TIMEOUT || rc == EDGELM_E_CONNECTION) {
			/* The reply was lost or is late: ask again from the same
			 * offset; the daemon still holds everything after it. */
			ipc_reply_free(rep);
			if (++failures > POLL_RETRIES) {
				cancel_quietly(c, res->id);
				return rc;
			}
			if (rc == EDGELM_E_CONNECTION)
				usleep(100000u * (unsigned)failures);
			continue;
		}
		if (rc) {
			ipc_reply_free(rep);
			return rc;
		}
		failures = 0;
		const struct ipc_poll_reply *pr = &rep->u.poll;
		if (pr->offset != ack || pr->next < ack) {
			ipc_reply_free(rep);
			cancel_quietly(c, res->id);
			return set_err(err, EDGELM_E_PROTOCOL,
			               "poll reply at offset %llu, asked for %llu",
			               (unsigned long long)pr->offset, (unsigned long long)ack);
		}
		if (pr->text_len) {
			if (result_append(res, &cap, pr->text, pr->text_len)) {
				ipc_reply_free(rep);
				cancel_quietly(c, res->id);
				return set_err(err, EDGELM_E_NOMEM, "out of memory");
			}
			if (cb && cb(pr->text, pr->text_len, user) != 0) {
				ipc_reply_free(rep);
				cancel_quietly(c, res->id);
				res->finish = EDGELM_FINISH_CANCELLED;
				return set_err(err, EDGELM_E_ABORTED, "stopped by the callback");
			}
		}
		uint64_t next = pr->next;
		bool done = pr->done;
		if (done)
			result_stats(res, pr->finish, &pr->usage, &pr->timings);
		ipc_reply_free(rep);
		if (done) {
			/* Acknowledge the end so the daemon frees the stream now
			 * rather than after its idle timeout. */
			if (next != ack) {
				poll.ack = next;
				poll.wait_ms = 0;
				(void)call_op(c, &poll, 2000, NULL, NULL, NULL);
			}
			break;
		}
		ack = next;
	}
	if (!res->text && result_append(res, &cap, "", 0))
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	return 0;
}

static int generate(edgelm_client *c, struct ipc_request *req, const struct edgelm_params *p,
                    bool stream, edgelm_text_cb cb, void *user, struct edgelm_result *res,
                    struct edgelm_error *err)
{
	int rc = stream ? run_stream(c, req, p ? p->poll_wait_ms : 0, cb, user, res, err)
	                : run_blocking(c, req, res, err);
	if (rc && rc != EDGELM_E_ABORTED && !stream)
		edgelm_result_free(res);
	return rc;
}

static int gen_prompt(edgelm_client *c, const char *prompt, const struct edgelm_params *p,
                      bool stream, edgelm_text_cb cb, void *user, struct edgelm_result *res,
                      struct edgelm_error *err)
{
	clear_err(err);
	if (!res)
		return set_err(err, EDGELM_E_INVALID_ARG, "result is NULL");
	result_clear(res);
	if (!c || !prompt)
		return set_err(err, EDGELM_E_INVALID_ARG, "client or prompt is NULL");
	struct ipc_request req;
	char id[EDGELM_ID_MAX + 1];
	int rc = build_gen(&req, IPC_OP_GENERATE, p, id, sizeof(id), err);
	if (rc)
		return rc;
	req.prompt = prompt;
	req.prompt_len = strlen(prompt);
	return generate(c, &req, p, stream, cb, user, res, err);
}

EDGELM_API int edgelm_generate(edgelm_client *c, const char *prompt,
                               const struct edgelm_params *params, struct edgelm_result *ret_result,
                               struct edgelm_error *err)
{
	return gen_prompt(c, prompt, params, false, NULL, NULL, ret_result, err);
}

EDGELM_API int edgelm_generate_stream(edgelm_client *c, const char *prompt,
                                      const struct edgelm_params *params, edgelm_text_cb cb,
                                      void *user, struct edgelm_result *ret_result,
                                      struct edgelm_error *err)
{
	return gen_prompt(c, prompt, params, true, cb, user, ret_result, err);
}

EDGELM_API int edgelm_chat(edgelm_client *c, const struct edgelm_message *messages,
                           size_t n_messages, const struct edgelm_params *params, edgelm_text_cb cb,
                           void *user, struct edgelm_result *ret_result, struct edgelm_error *err)
{
	clear_err(err);
	if (!ret_result)
		return set_err(err, EDGELM_E_INVALID_ARG, "result is NULL");
	result_clear(ret_result);
	if (!c || !messages || n_messages == 0)
		return set_err(err, EDGELM_E_INVALID_ARG, "client or messages missing");
	struct ipc_message *m = cm_calloc(n_messages, sizeof(*m));
	if (!m)
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	int rc = 0;
	for (size_t i = 0; i < n_messages && rc == 0; i++) {
		const char *role = messages[i].role ? messages[i].role : "";
		int r = -1;
		for (int k = 0; k < IPC_ROLE_COUNT; k++)
			if (strcmp(role, ipc_role_name((enum ipc_role)k)) == 0)
				r = k;
		if (r < 0 || !messages[i].content)
			rc = set_err(err, EDGELM_E_INVALID_ARG,
			             "message %zu: role must be system, user or assistant, and "
			             "content not NULL",
			             i);
		else {
			m[i].role = (enum ipc_role)r;
			m[i].content = messages[i].content;
			m[i].content_len = strlen(messages[i].content);
		}
	}
	struct ipc_request req;
	char id[EDGELM_ID_MAX + 1];
	if (rc == 0)
		rc = build_gen(&req, IPC_OP_CHAT, params, id, sizeof(id), err);
	if (rc == 0) {
		req.messages = m;
		req.n_messages = n_messages;
		rc = generate(c, &req, params, cb != NULL, cb, user, ret_result, err);
	}
	cm_free(m);
	return rc;
}

EDGELM_API int edgelm_cancel(edgelm_client *c, const char *id, bool *ret_cancelled,
                             struct edgelm_error *err)
{
	clear_err(err);
	if (!c || !id)
		return set_err(err, EDGELM_E_INVALID_ARG, "client or id is NULL");
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_CANCEL);
	req.id = id;
	struct ipc_reply *rep;
	int rc = call_op(c, &req, atomic_load(&c->timeout_ms), &rep, NULL, err);
	if (rc == 0 && ret_cancelled)
		*ret_cancelled = rep->u.cancel.cancelled;
	ipc_reply_free(rep);
	return rc;
}

/* ---- tokens and status ---------------------------------------------------- */

EDGELM_API int edgelm_tokenize(edgelm_client *c, const char *text, bool add_special,
                               bool parse_special, int32_t **ret_ids, size_t *ret_n,
                               struct edgelm_error *err)
{
	clear_err(err);
	if (!c || !text || !ret_ids || !ret_n)
		return set_err(err, EDGELM_E_INVALID_ARG, "NULL argument");
	*ret_ids = NULL;
	*ret_n = 0;
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_TOKENIZE);
	req.text = text;
	req.text_len = strlen(text);
	req.add_special = add_special;
	req.parse_special = parse_special;
	struct ipc_reply *rep;
	int rc = call_op(c, &req, atomic_load(&c->timeout_ms), &rep, NULL, err);
	if (rc == 0) {
		size_t n = rep->u.tokenize.n_ids;
		int32_t *ids = cm_malloc((n ? n : 1) * sizeof(*ids));
		if (!ids) {
			rc = set_err(err, EDGELM_E_NOMEM, "out of memory");
		} else {
			if (n)
				memcpy(ids, rep->u.tokenize.ids, n * sizeof(*ids));
			*ret_ids = ids;
			*ret_n = n;
		}
	}
	ipc_reply_free(rep);
	return rc;
}

EDGELM_API int edgelm_embed(edgelm_client *c, const char *const *texts, size_t n,
                            const char *pooling, bool truncate, float **ret_values,
                            size_t *ret_dim, int64_t **ret_tokens, struct edgelm_error *err)
{
	clear_err(err);
	if (!c || !texts || !ret_values || !ret_dim)
		return set_err(err, EDGELM_E_INVALID_ARG, "NULL argument");
	*ret_values = NULL;
	*ret_dim = 0;
	if (ret_tokens)
		*ret_tokens = NULL;
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_EMBED);
	size_t *lens = cm_calloc(n ? n : 1, sizeof(*lens));
	if (!lens)
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if (!texts[i]) {
			cm_free(lens);
			return set_err(err, EDGELM_E_INVALID_ARG, "NULL text");
		}
		lens[i] = strlen(texts[i]);
	}
	req.inputs = texts;
	req.input_lens = lens;
	req.n_inputs = n;
	req.truncate = truncate;
	if (pooling) {
		int p = IPC_POOL_COUNT;
		for (int k = IPC_POOL_MEAN; k < IPC_POOL_COUNT; k++)
			if (strcmp(pooling, ipc_pooling_name((enum ipc_pooling)k)) == 0)
				p = k;
		if (p == IPC_POOL_COUNT) {
			cm_free(lens);
			return set_err(err, EDGELM_E_INVALID_ARG,
			               "pooling must be mean, cls or last");
		}
		req.pooling = p;
	}
	struct ipc_reply *rep;
	int rc = call_op(c, &req, atomic_load(&c->timeout_ms), &rep, NULL, err);
	cm_free(lens);
	if (rc == 0) {
		const struct ipc_embed_reply *e = &rep->u.embed;
		size_t dim = e->n ? e->data[0].n_values : 0;
		bool same = e->n == n;
		for (size_t i = 0; same && i < e->n; i++)
			same = e->data[i].n_values == dim;
		float *v = same ? cm_malloc(CM_MAX(n * dim, (size_t)1) * sizeof(*v)) : NULL;
		int64_t *t = same && ret_tokens ? cm_malloc((n ? n : 1) * sizeof(*t)) : NULL;
		if (!same) {
			rc = set_err(err, EDGELM_E_PROTOCOL, "embed reply does not match the request");
		} else if (!v || (ret_tokens && !t)) {
			cm_free(v);
			cm_free(t);
			rc = set_err(err, EDGELM_E_NOMEM, "out of memory");
		} else {
			for (size_t i = 0; i < n; i++) {
				memcpy(v + i * dim, e->data[i].values, dim * sizeof(*v));
				if (t)
					t[i] = e->data[i].tokens;
			}
			*ret_values = v;
			*ret_dim = dim;
			if (ret_tokens)
				*ret_tokens = t;
		}
	}
	ipc_reply_free(rep);
	return rc;
}

EDGELM_API int edgelm_detokenize(edgelm_client *c, const int32_t *ids, size_t n, char **ret_text,
                                 struct edgelm_error *err)
{
	clear_err(err);
	if (!c || (!ids && n) || !ret_text)
		return set_err(err, EDGELM_E_INVALID_ARG, "NULL argument");
	*ret_text = NULL;
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_DETOKENIZE);
	req.ids = ids;
	req.n_ids = n;
	struct ipc_reply *rep;
	int rc = call_op(c, &req, atomic_load(&c->timeout_ms), &rep, NULL, err);
	if (rc == 0) {
		const char *t = rep->u.detokenize.text ? rep->u.detokenize.text : "";
		*ret_text = cm_strndup(t, rep->u.detokenize.text_len);
		if (!*ret_text)
			rc = set_err(err, EDGELM_E_NOMEM, "out of memory");
	}
	ipc_reply_free(rep);
	return rc;
}

static int simple_op(edgelm_client *c, enum ipc_op op, struct ipc_reply **ret_rep, char **ret_json,
                     struct edgelm_error *err)
{
	clear_err(err);
	if (ret_json)
		*ret_json = NULL;
	if (!c)
		return set_err(err, EDGELM_E_INVALID_ARG, "client is NULL");
	struct ipc_request req;
	ipc_request_init(&req, op);
	char *raw;
	int rc = call_op(c, &req, atomic_load(&c->timeout_ms), ret_rep, &raw, err);
	if (ret_json && rc == 0)
		*ret_json = raw;
	else
		cm_free(raw);
	return rc;
}

EDGELM_API int edgelm_info(edgelm_client *c, char **ret_json, struct edgelm_error *err)
{
	if (!ret_json)
		return set_err(err, EDGELM_E_INVALID_ARG, "ret_json is NULL");
	return simple_op(c, IPC_OP_INFO, NULL, ret_json, err);
}

EDGELM_API int edgelm_metrics(edgelm_client *c, char **ret_json, struct edgelm_error *err)
{
	if (!ret_json)
		return set_err(err, EDGELM_E_INVALID_ARG, "ret_json is NULL");
	return simple_op(c, IPC_OP_METRICS, NULL, ret_json, err);
}

EDGELM_API int edgelm_health(edgelm_client *c, enum edgelm_health *ret_status, char **ret_json,
                             struct edgelm_error *err)
{
	struct ipc_reply *rep = NULL;
	int rc = simple_op(c, IPC_OP_HEALTH, &rep, ret_json, err);
	if (rc == 0 && ret_status)
		*ret_status = (enum edgelm_health)rep->u.health.status;
	ipc_reply_free(rep);
	return rc;
}
