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
 * instead of resending). Retrying is left to the requests that are safe to
 * repeat: poll, whose ack offset makes it idempotent, and, with several
 * daemons, the ops without effects (xfer's `retry`).
 *
 * Several daemons (edgelm.h, "Several daemons and TLS"): the shared req
 * socket dials them all and nng spreads the requests; a stream's polls and
 * cancel go on the answering endpoint's own socket (struct endpoint). */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
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

/* One daemon the client dials. Its dialers on the shared socket (the first
 * and any redials) tell which endpoint a reply came from; `own` is a req
 * socket of its own, dialled on first need, that carries a stream's polls
 * and cancels so they reach the daemon that holds the stream. */
struct endpoint {
	char *url;
	char *host; /* for TLS: the name the server's certificate must carry */
	int dialer_ids[1 + IPC_MAX_REDIALS];
	int n_dialers;
	nng_socket own;
	bool own_open;
};

struct edgelm_client {
	nng_socket sock;
	nng_dialer dialer;
	atomic_int timeout_ms;
	atomic_size_t max_msg;
	struct endpoint *eps;
	size_t n_eps;
	char *tls_cert, *tls_key, *tls_ca; /* file names, NULL: none */
	pthread_mutex_t dial_mu;           /* dials: redial, endpoint sockets */
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
		               "%s: the connection to the daemon was lost (edgelmd stopped?)",
		               what);
	default:
		return set_err(err, EDGELM_E_CONNECTION, "%s: %s", what, nng_strerror(rv));
	}
}

/* ---- connection ----------------------------------------------------------- */

static void client_free(struct edgelm_client *c)
{
	for (size_t i = 0; i < c->n_eps; i++) {
		cm_free(c->eps[i].url);
		cm_free(c->eps[i].host);
	}
	cm_free(c->eps);
	cm_free(c->tls_cert);
	cm_free(c->tls_key);
	cm_free(c->tls_ca);
	pthread_mutex_destroy(&c->dial_mu);
	cm_free(c);
}

EDGELM_API void edgelm_connect_opts_init(struct edgelm_connect_opts *o)
{
	memset(o, 0, sizeof(*o));
}

/* NULL or "" stays NULL; else a copy (false: out of memory). */
static bool dup_opt(const char *s, const char *env, char **ret)
{
	if (!s || !*s)
		s = env ? getenv(env) : NULL;
	*ret = s && *s ? cm_strdup(s) : NULL;
	return !(s && *s) || *ret;
}

/* Appends the comma-separated URLs in `list` to c->eps (blanks skipped). */
static int add_urls(struct edgelm_client *c, const char *list, struct edgelm_error *err)
{
	const char *p = list;
	while (*p) {
		size_t n = strcspn(p, ",");
		const char *s = p, *e = p + n;
		p = *e ? e + 1 : e;
		while (s < e && (*s == ' ' || *s == '\t'))
			s++;
		while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		if (s == e)
			continue;
		struct endpoint *eps = cm_realloc(c->eps, (c->n_eps + 1) * sizeof(*eps));
		if (!eps)
			return set_err(err, EDGELM_E_NOMEM, "out of memory");
		c->eps = eps;
		struct endpoint *ep = &eps[c->n_eps];
		*ep = (struct endpoint){.url = cm_strndup(s, (size_t)(e - s))};
		if (!ep->url)
			return set_err(err, EDGELM_E_NOMEM, "out of memory");
		c->n_eps++;
	}
	return 0;
}

static char *read_text(const char *path)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return NULL;
	size_t cap = 4096, n = 0;
	char *buf = cm_malloc(cap);
	while (buf) {
		n += fread(buf + n, 1, cap - n - 1, f);
		if (n < cap - 1)
			break;
		char *b = cap < (1u << 20) ? cm_realloc(buf, cap * 2) : NULL;
		if (!b)
			cm_free(buf);
		buf = b;
		cap *= 2;
	}
	bool bad = ferror(f);
	fclose(f);
	if (buf && bad) {
		cm_free(buf);
		return NULL;
	}
	if (buf)
		buf[n] = '\0';
	return buf;
}

/* A client TLS config for `ep`: our certificate (if any), the CA to verify
 * the server against, and the name its certificate must carry. */
static int tls_config(struct edgelm_client *c, struct endpoint *ep, nng_tls_config **ret,
                      struct edgelm_error *err)
{
	*ret = NULL;
	if (!c->tls_ca)
		return set_err(err, EDGELM_E_INVALID_ARG,
		               "%s: TLS needs a CA file to verify the daemon (--tls-ca, "
		               "EDGELM_TLS_CA)",
		               ep->url);
	int rv;
	if (!ep->host) { /* redials and the endpoint's own socket reuse it */
		nng_url *u;
		if ((rv = nng_url_parse(&u, ep->url)) != 0)
			return set_err(err, EDGELM_E_CONNECT, "%s: %s", ep->url, nng_strerror(rv));
		ep->host = cm_strdup(u->u_hostname ? u->u_hostname : "");
		nng_url_free(u);
		if (!ep->host)
			return set_err(err, EDGELM_E_NOMEM, "out of memory");
	}
	nng_tls_config *cfg;
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0)
		return set_err(err, EDGELM_E_CONNECT, "cannot set up TLS: %s", nng_strerror(rv));
	const char *what = c->tls_ca;
	rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
	if (rv == 0)
		rv = nng_tls_config_ca_file(cfg, c->tls_ca);
	if (rv == 0 && ep->host[0]) {
		what = "the server name";
		rv = nng_tls_config_server_name(cfg, ep->host);
	}
	if (rv == 0 && c->tls_cert) {
		/* without a key file the key is in the certificate's file */
		const char *kf = c->tls_key ? c->tls_key : c->tls_cert;
		char *cert = read_text(c->tls_cert), *key = read_text(kf);
		what = !cert ? c->tls_cert : kf;
		rv = !cert || !key ? NNG_ENOENT : nng_tls_config_own_cert(cfg, cert, key, NULL);
		if (key)
			explicit_bzero(key, strlen(key));
		cm_free(cert);
		cm_free(key);
	}
	if (rv != 0) {
		nng_tls_config_free(cfg);
		return set_err(err, EDGELM_E_CONNECT, "TLS: cannot load %s: %s", what,
		               nng_strerror(rv));
	}
	*ret = cfg;
	return 0;
}

static bool is_tls(const char *url)
{
	return strncmp(url, "tls+", 4) == 0;
}

static int sock_setup(nng_socket *s)
{
	int rv = nng_req0_open(s);
	if (rv != 0)
		return rv;
	/* Contexts copy the socket's resend time when they open; each call sets
	 * it on its context again (below) so neither can resend. */
	rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	if (rv == 0)
		rv = nng_socket_set_ms(*s, NNG_OPT_RECONNMINT, 20);
	if (rv == 0)
		rv = nng_socket_set_ms(*s, NNG_OPT_RECONNMAXT, 1000);
	if (rv == 0)
		rv = nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, REPLY_MAX_BYTES);
	if (rv != 0)
		nng_close(*s);
	return rv;
}

/* Dials ep on s: blocking (fails when nothing listens) or in the background
 * (nng keeps trying). Returns an nng error, or -1 with err set. */
static int dial_ep(struct edgelm_client *c, struct endpoint *ep, nng_socket s, bool block,
                   nng_dialer *ret_d, struct edgelm_error *err)
{
	nng_dialer d;
	int rv = nng_dialer_create(&d, s, ep->url);
	if (rv != 0)
		return rv;
	if (is_tls(ep->url)) {
		nng_tls_config *cfg;
		if (tls_config(c, ep, &cfg, err) != 0) {
			nng_dialer_close(d);
			return -1;
		}
		/* the dialer holds its own reference */
		rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
		nng_tls_config_free(cfg);
	}
	if (rv == 0)
		rv = nng_dialer_start(d, block ? 0 : NNG_FLAG_NONBLOCK);
	if (rv != 0) {
		nng_dialer_close(d);
		return rv;
	}
	if (ret_d)
		*ret_d = d;
	return 0;
}

static int dial_fail(struct edgelm_error *err, const char *url, int rv)
{
	const char *hint = rv == NNG_ENOENT || rv == NNG_ECONNREFUSED ? " (is edgelmd running?)"
	                   : rv == NNG_EPERM ? " (are you in the socket's group?)"
	                   : rv == NNG_EPEERAUTH || rv == NNG_ECRYPTO
	                       ? " (the daemon's certificate is not signed by the CA or not "
	                         "for this host name, or it refused ours)"
	                       : "";
	return set_err(err, EDGELM_E_CONNECT, "cannot connect to %s: %s%s", url, nng_strerror(rv),
	               hint);
}

EDGELM_API int edgelm_connect_ex(const struct edgelm_connect_opts *o, edgelm_client **ret_client,
                                 struct edgelm_error *err)
{
	clear_err(err);
	if (!ret_client)
		return set_err(err, EDGELM_E_INVALID_ARG, "edgelm_connect: ret_client is NULL");
	*ret_client = NULL;
	struct edgelm_connect_opts none;
	if (!o) {
		edgelm_connect_opts_init(&none);
		o = &none;
	}
	struct edgelm_client *c = cm_calloc(1, sizeof(*c));
	if (!c)
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	if (pthread_mutex_init(&c->dial_mu, NULL) != 0) {
		cm_free(c);
		return set_err(err, EDGELM_E_NOMEM, "out of memory");
	}
	atomic_init(&c->timeout_ms, DEFAULT_TIMEOUT_MS);
	atomic_init(&c->max_msg, (size_t)IPC_DEFAULT_MAX_MSG_BYTES);
	int rc = 0;
	if (!dup_opt(o->tls_cert_file, "EDGELM_TLS_CERT", &c->tls_cert) ||
	    !dup_opt(o->tls_key_file, "EDGELM_TLS_KEY", &c->tls_key) ||
	    !dup_opt(o->tls_ca_file, "EDGELM_TLS_CA", &c->tls_ca))
		rc = set_err(err, EDGELM_E_NOMEM, "out of memory");
	for (size_t i = 0; rc == 0 && o->urls && i < o->n_urls; i++)
		if (o->urls[i])
			rc = add_urls(c, o->urls[i], err);
	if (rc == 0 && c->n_eps == 0) {
		const char *env = getenv("EDGELM_SOCKET");
		rc = add_urls(c, env && *env ? env : EDGELM_DEFAULT_URL, err);
		if (rc == 0 && c->n_eps == 0)
			rc = add_urls(c, EDGELM_DEFAULT_URL, err);
	}
	if (rc) {
		client_free(c);
		return rc;
	}
	int rv = sock_setup(&c->sock);
	if (rv != 0) {
		client_free(c);
		return set_err(err, EDGELM_E_CONNECT, "cannot open an nng req0 socket: %s",
		               nng_strerror(rv));
	}
	/* Blocking dials: fail now, with the reason, when no daemon listens.
	 * With several endpoints one is enough; the others are dialled in the
	 * background and join as they come up. A bad URL or TLS file fails
	 * the whole connect: that is a mistake, not a box that is down. */
	size_t n_up = 0;
	int first_rv = 0;
	const char *first_url = NULL;
	/* nng gives a request to the first ready pipe, so a client that sends
	 * one request and exits (edgelmctl) would always reach the first
	 * daemon listed: start the dials at a random one */
	uint32_t start = 0;
	if (getrandom(&start, sizeof(start), GRND_NONBLOCK) != (ssize_t)sizeof(start))
		start = (uint32_t)cm_now_ns();
	for (size_t k = 0; k < c->n_eps; k++) {
		size_t i = (start + k) % c->n_eps;
		struct endpoint *ep = &c->eps[i];
		nng_dialer d;
		rv = dial_ep(c, ep, c->sock, true, &d, err);
		if (rv == 0) {
			n_up++;
		} else if (rv != -1 && rv != NNG_EINVAL && rv != NNG_EADDRINVAL &&
		           rv != NNG_ENOTSUP && rv != NNG_ENOMEM) {
			if (!first_url) {
				first_url = ep->url;
				first_rv = rv;
			}
			if (c->n_eps == 1)
				continue;
			rv = dial_ep(c, ep, c->sock, false, &d, err);
		}
		if (rv != 0) {
			rc = rv != -1 ? dial_fail(err, ep->url, rv)
			     : err    ? err->code
			              : EDGELM_E_CONNECT;
			break;
		}
		ep->dialer_ids[ep->n_dialers++] = nng_dialer_id(d);
		if (k == 0)
			c->dialer = d;
	}
	if (rc == 0 && n_up == 0) {
		if (c->n_eps > 1)
			rc = set_err(err, EDGELM_E_CONNECT,
			             "cannot connect to any of %zu daemons; %s: %s%s", c->n_eps,
			             first_url, nng_strerror(first_rv),
			             first_rv == NNG_ENOENT || first_rv == NNG_ECONNREFUSED
			                 ? " (is edgelmd running?)"
			                 : "");
		else
			rc = dial_fail(err, first_url, first_rv);
	}
	if (rc) {
		nng_close(c->sock);
		client_free(c);
		return rc;
	}
	*ret_client = c;
	return 0;
}

EDGELM_API int edgelm_connect(const char *url, edgelm_client **ret_client, struct edgelm_error *err)
{
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = &url;
	o.n_urls = url && *url ? 1 : 0;
	return edgelm_connect_ex(&o, ret_client, err);
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
	nng_socket *socks; /* the shared one and the endpoints' own */
	size_t n_socks;
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
		cm_free(k->socks);
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
	for (size_t i = 0; i < k->n_socks; i++)
		sock_close(k->socks[i]);
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
	/* no call runs any more, so the endpoints' sockets are settled */
	nng_socket *socks = cm_malloc((c->n_eps + 1) * sizeof(*socks));
	size_t n = 0;
	if (socks) {
		socks[n++] = c->sock;
		for (size_t i = 0; i < c->n_eps; i++)
			if (c->eps[i].own_open)
				socks[n++] = c->eps[i].own;
	}
	struct closer *k = socks ? cm_malloc(sizeof(*k)) : NULL;
	if (k) {
		*k = (struct closer){.socks = socks, .n_socks = n, .refs = 2};
		if (!closer_start(k)) {
			cm_free(k);
			k = NULL;
		}
	}
	if (!k) { /* no thread to be had: close here */
		sock_close(c->sock);
		for (size_t i = 0; i < c->n_eps; i++)
			if (c->eps[i].own_open)
				sock_close(c->eps[i].own);
		cm_free(socks);
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
	if (c->redials < IPC_MAX_REDIALS) {
		c->redials++;
		/* one endpoint: wait for the dial, so the resend finds the pipe;
		 * several: the others may serve it, and a blocking TCP dial to a
		 * box that is gone can take minutes */
		for (size_t i = 0; i < c->n_eps; i++) {
			struct endpoint *ep = &c->eps[i];
			nng_dialer d;
			if (dial_ep(c, ep, c->sock, c->n_eps == 1, &d, NULL) == 0)
				ep->dialer_ids[ep->n_dialers++] = nng_dialer_id(d);
		}
	}
	pthread_mutex_unlock(&c->dial_mu);
}

/* The endpoint whose dialer made pipe p, or -1. */
static int pipe_ep(struct edgelm_client *c, nng_pipe p)
{
	int id = nng_dialer_id(nng_pipe_dialer(p));
	int found = -1;
	if (id <= 0)
		return -1;
	pthread_mutex_lock(&c->dial_mu);
	for (size_t i = 0; i < c->n_eps && found < 0; i++)
		for (int k = 0; k < c->eps[i].n_dialers; k++)
			if (c->eps[i].dialer_ids[k] == id)
				found = (int)i;
	pthread_mutex_unlock(&c->dial_mu);
	return found;
}

/* Endpoint i's own socket, dialled on first use. */
static int ep_sock(struct edgelm_client *c, int i, nng_socket *ret_s, struct edgelm_error *err)
{
	struct endpoint *ep = &c->eps[i];
	int rc = 0;
	pthread_mutex_lock(&c->dial_mu);
	if (!ep->own_open) {
		int rv = sock_setup(&ep->own);
		if (rv != 0) {
			rc = nng_err(err, rv, 0, "cannot open an nng req0 socket");
		} else if ((rv = dial_ep(c, ep, ep->own, true, NULL, err)) != 0) {
			nng_close(ep->own);
			rc = rv == -1 ? (err ? err->code : EDGELM_E_CONNECT)
			              : set_err(err, EDGELM_E_CONNECTION,
			                        "cannot reach %s, which holds the stream: %s",
			                        ep->url, nng_strerror(rv));
		} else {
			ep->own_open = true;
		}
	}
	*ret_s = ep->own;
	pthread_mutex_unlock(&c->dial_mu);
	return rc;
}

int ipc_client_stall_dialer(struct edgelm_client *c)
{
	return nng_dialer_close(c->dialer) == 0 ? 0 : -1;
}

/* timeout_ms <= 0: wait forever. ep: -1 for the shared socket, which nng
 * spreads over the endpoints, else endpoint ep's own socket; *ret_ep (may
 * be NULL) gets the endpoint that answered, -1 if unknown. `retry`: the
 * request is safe to run twice, so when the daemon that had it drops the
 * connection, it goes again to another (with several endpoints, at most
 * once per other endpoint). */
static int xfer(struct edgelm_client *c, int ep, bool retry, const char *req, size_t len,
                int timeout_ms, char **ret_reply, size_t *ret_len, int *ret_ep,
                struct edgelm_error *err)
{
	int retries = retry && ep < 0 && c->n_eps > 1 ? (int)c->n_eps - 1 : 0;
	*ret_reply = NULL;
	if (ret_ep)
		*ret_ep = ep;
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
	nng_socket sock = c->sock;
	if (ep >= 0) {
		int rc = ep_sock(c, ep, &sock, err);
		if (rc)
			return rc;
	}
	nng_ctx ctx;
	nng_aio *aio = NULL;
	nng_msg *m = NULL;
	int rc = 0;
	int rv = nng_ctx_open(&ctx, sock);
	if (rv != 0)
		return nng_err(err, rv, 0, "cannot open an nng context");
	if ((rv = nng_ctx_set_ms(ctx, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
	    (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		rc = nng_err(err, rv, 0, "cannot prepare the request");
		goto out;
	}
again:
	if ((rv = nng_msg_alloc(&m, len)) != 0) {
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
		if (ep < 0)
			redial(c);
		nng_aio_set_timeout(aio, send_to - first);
		nng_ctx_send(ctx, aio);
		nng_aio_wait(aio);
	}
	if ((rv = nng_aio_result(aio)) != 0) {
		nng_msg_free(nng_aio_get_msg(aio));
		if (rv == NNG_ETIMEDOUT)
			rc = set_err(
			    err, EDGELM_E_CONNECTION,
			    "no connection to the daemon within %d ms (is edgelmd running?)",
			    send_to);
		else
			rc = nng_err(err, rv, send_to, "sending the request");
		goto out;
	}
	nng_aio_set_timeout(aio, to);
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	rv = nng_aio_result(aio);
	if ((rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT) && retries-- > 0)
		goto again; /* the pipe is gone; nng sends on one still there */
	if (rv != 0) {
		rc = nng_err(err, rv, timeout_ms, "waiting for the reply");
		goto out;
	}
	m = nng_aio_get_msg(aio);
	if (ret_ep && ep < 0 && c->n_eps > 1)
		*ret_ep = pipe_ep(c, nng_msg_get_pipe(m));
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

/* The ops a daemon may run twice without a difference to anyone: xfer may
 * send them again when the daemon that had one went away. */
static bool idempotent(enum ipc_op op)
{
	return op == IPC_OP_INFO || op == IPC_OP_HEALTH || op == IPC_OP_METRICS ||
	       op == IPC_OP_TOKENIZE || op == IPC_OP_DETOKENIZE || op == IPC_OP_EMBED;
}

/* Encode, send, decode. A daemon error becomes its EDGELM_E_ code, with the
 * decoded reply still returned in *ret_rep when ret_rep is not NULL. ep and
 * ret_ep as for xfer. */
static int call_ep(struct edgelm_client *c, int ep, const struct ipc_request *req, int timeout_ms,
                   struct ipc_reply **ret_rep, char **ret_raw, int *ret_ep,
                   struct edgelm_error *err)
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
	rc = xfer(c, ep, idempotent(req->op), json, len, timeout_ms, &raw, &rlen, ret_ep, err);
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

static int call_op(struct edgelm_client *c, const struct ipc_request *req, int timeout_ms,
                   struct ipc_reply **ret_rep, char **ret_raw, struct edgelm_error *err)
{
	return call_ep(c, -1, req, timeout_ms, ret_rep, ret_raw, NULL, err);
}

EDGELM_API int edgelm_call_json(edgelm_client *c, const char *request, size_t len, char **ret_reply,
                                size_t *ret_len, struct edgelm_error *err)
{
	clear_err(err);
	if (!c || !request || !ret_reply)
		return set_err(err, EDGELM_E_INVALID_ARG, "edgelm_call_json: NULL argument");
	char *raw;
	size_t rlen;
	int rc =
	    xfer(c, -1, false, request, len, atomic_load(&c->timeout_ms), &raw, &rlen, NULL, err);
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
		return set_err(err, EDGELM_E_INVALID_ARG,
		               "grammar and json_schema exclude each other");
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
			               "json_schema: invalid JSON at line %d column %d: %s",
			               je.line, je.column, je.text);
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

/* Cancel id on endpoint ep, or (ep -1) wherever it runs: with several
 * endpoints the generation may be on any daemon, so each is asked through
 * its own socket until one knows the id. All answered not_found: that;
 * else the last other error. */
static int cancel_on(struct edgelm_client *c, int ep, const char *id, int timeout_ms,
                     bool *ret_cancelled, struct edgelm_error *err)
{
	struct ipc_request req;
	ipc_request_init(&req, IPC_OP_CANCEL);
	req.id = id;
	struct ipc_reply *rep;
	if (ep >= 0 || c->n_eps == 1) {
		int rc = call_ep(c, ep, &req, timeout_ms, &rep, NULL, NULL, err);
		if (rc == 0 && ret_cancelled)
			*ret_cancelled = rep->u.cancel.cancelled;
		ipc_reply_free(rep);
		return rc;
	}
	int rc = EDGELM_E_NOT_FOUND;
	struct edgelm_error e1, last;
	clear_err(&last);
	for (size_t i = 0; i < c->n_eps; i++) {
		int r = call_ep(c, (int)i, &req, timeout_ms, &rep, NULL, NULL, &e1);
		if (r == 0) {
			if (ret_cancelled)
				*ret_cancelled = rep->u.cancel.cancelled;
			ipc_reply_free(rep);
			clear_err(err);
			return 0;
		}
		ipc_reply_free(rep);
		if (r != EDGELM_E_NOT_FOUND || rc == EDGELM_E_NOT_FOUND) {
			if (r != EDGELM_E_NOT_FOUND)
				rc = r;
			last = e1;
		}
	}
	if (err)
		*err = last;
	return rc;
}

/* Best effort: tell the daemon to stop a generation we gave up on. */
static void cancel_quietly(struct edgelm_client *c, int ep, const char *id)
{
	(void)cancel_on(c, ep, id, 2000, NULL, NULL);
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
			cancel_quietly(c, -1, req->id);
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
	/* The stream lives on the daemon that started it: with several
	 * endpoints its polls and cancels go there, on that endpoint's own
	 * socket, not over the shared one that nng spreads. */
	int ep = -1;
	int rc = call_ep(c, -1, req, t, &rep, NULL, &ep, err);
	if (rc) {
		ipc_reply_free(rep);
		if (rc == EDGELM_E_TIMEOUT || rc == EDGELM_E_CONNECTION)
			cancel_quietly(c, -1, req->id);
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
		rc = call_ep(c, ep, &poll, poll_to, &rep, NULL, NULL, err);
		if (rc == EDGELM_E_TIMEOUT || rc == EDGELM_E_CONNECTION) {
			/* The reply was lost or is late: ask again from the same
			 * offset; the daemon still holds everything after it. */
			ipc_reply_free(rep);
			if (++failures > POLL_RETRIES) {
				cancel_quietly(c, ep, res->id);
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
			cancel_quietly(c, ep, res->id);
			return set_err(err, EDGELM_E_PROTOCOL,
			               "poll reply at offset %llu, asked for %llu",
			               (unsigned long long)pr->offset, (unsigned long long)ack);
		}
		if (pr->text_len) {
			if (result_append(res, &cap, pr->text, pr->text_len)) {
				ipc_reply_free(rep);
				cancel_quietly(c, ep, res->id);
				return set_err(err, EDGELM_E_NOMEM, "out of memory");
			}
			if (cb && cb(pr->text, pr->text_len, user) != 0) {
				ipc_reply_free(rep);
				cancel_quietly(c, ep, res->id);
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
				(void)call_ep(c, ep, &poll, 2000, NULL, NULL, NULL, NULL);
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
	return cancel_on(c, -1, id, atomic_load(&c->timeout_ms), ret_cancelled, err);
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
                            const char *pooling, bool truncate, float **ret_values, size_t *ret_dim,
                            int64_t **ret_tokens, struct edgelm_error *err)
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
			rc = set_err(err, EDGELM_E_PROTOCOL,
			             "embed reply does not match the request");
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
