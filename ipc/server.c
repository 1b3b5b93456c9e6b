/* ipc/server.c: the nng rep0 server.
 *
 * One rep0 socket, one listener per URL, and a pool of contexts. Each context
 * is an ipc_call: an nng_ctx with one nng_aio driven as a small state machine
 *
 *   RECV --message--> parse --bad--> SEND (error reply) --> RECV
 *                          \--ok--> HANDLER (owned by the daemon) --reply--> SEND
 *
 * The aio callback only parses and hands off; it never blocks. A call that the
 * handler keeps (a long-poll, a generation) holds its context, so the pool
 * grows, up to max_contexts, whenever fewer than a quarter of n_contexts are
 * left receiving. Beyond max_contexts nng keeps further requests in the
 * connection until a call completes (backpressure, no loss).
 *
 * A reply can come from any thread: it moves the call from HANDLER to SEND
 * with a compare-and-swap (so a second completion is refused) and starts
 * nng_ctx_send on the call's aio, which is idle while the handler owns it.
 *
 * Self-check. nng 1.5.2 (bug #1518, fixed in 1.6.0) hands the error of a
 * connection that fails while the SP headers are exchanged to the listener's
 * accept; when that error is NNG_ECLOSED (our header write met EPIPE because
 * the peer had already closed, as after a bare connect() and close(), or
 * nng's own probe of an existing socket file from a second server), the
 * listener takes it for its own close and never accepts again: the kernel
 * still queues connections, the transport even negotiates them, but no pipe
 * reaches the socket. So a thread dials each listener afresh every
 * selfcheck_ms and makes a round trip (a message with a per-server random
 * token that the server echoes without the handler, so a slow daemon or a
 * busy queue cannot fail it); a listener that fails twice in a row is closed
 * and re-created. nng cannot restart a listener's accept, and closing a
 * listener closes every pipe it accepted (core and transport both), so the
 * clients connected through it are disconnected and redial.
 *
 * The probe speaks SP over a plain socket rather than through an nng req0
 * socket: nng's reaper is shared by the process, and an nng_close stalled
 * there would hold the self-check thread, and ipc_server_stop joining it,
 * for good. */
#include "ipc/server_impl.h"

/* Set once a server has opened its socket: nng has started its threads. */
static atomic_bool nng_started;

static void call_cb(void *arg);

/* One less call in HANDLER or SEND; wake ipc_server_stop when it waits. */
static void busy_done(struct ipc_server *srv, atomic_uint *ctr)
{
	if (atomic_fetch_sub(ctr, 1) == 1 && atomic_load(&srv->draining)) {
		pthread_mutex_lock(&srv->mu);
		pthread_cond_broadcast(&srv->cv);
		pthread_mutex_unlock(&srv->mu);
	}
}

/* ---- the call pool -------------------------------------------------------- */

static void call_recv(struct ipc_call *c)
{
	struct ipc_server *srv = c->srv;
	if (!ipc_io_begin(srv)) {
		atomic_store(&c->state, CALL_IDLE);
		return;
	}
	atomic_store(&c->state, CALL_RECV);
	atomic_fetch_add(&srv->idle, 1);
	nng_ctx_recv(c->ctx, c->aio);
	ipc_io_end(srv);
}

/* Open one more context; the caller starts it receiving after dropping
 * srv->mu (nng may complete a receive synchronously, and the callback can
 * come back here). Called with srv->mu held. */
static int call_add_locked(struct ipc_server *srv, struct ipc_call **ret_call)
{
	if (srv->n_calls >= srv->max_contexts)
		return -ENOSPC;
	struct ipc_call *c = cm_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->srv = srv;
	if (nng_aio_alloc(&c->aio, call_cb, c) != 0) {
		cm_free(c);
		return -ENOMEM;
	}
	if (!ipc_io_begin(srv)) {
		nng_aio_free(c->aio);
		cm_free(c);
		return -ESHUTDOWN;
	}
	int rv = nng_ctx_open(&c->ctx, srv->sock);
	ipc_io_end(srv);
	if (rv != 0) {
		nng_aio_free(c->aio);
		cm_free(c);
		return -ENOMEM;
	}
	srv->calls[srv->n_calls++] = c;
	*ret_call = c;
	return 0;
}

static int pool_add(struct ipc_server *srv)
{
	struct ipc_call *c = NULL;
	pthread_mutex_lock(&srv->mu);
	int rc = atomic_load(&srv->closing) ? -ESHUTDOWN : call_add_locked(srv, &c);
	pthread_mutex_unlock(&srv->mu);
	if (rc == 0)
		call_recv(c);
	return rc;
}

static void pool_maybe_grow(struct ipc_server *srv)
{
	unsigned low = CM_MAX(1u, srv->n_contexts / 4);
	while (atomic_load(&srv->idle) < low && pool_add(srv) == 0)
		;
}

/* ---- sending ------------------------------------------------------------- */

/* Send `json` on a call that is in state SEND and counted in srv->sending; on
 * failure to build the message the request is dropped (the client times out)
 * and the call receives again. */
static int call_send(struct ipc_call *c, const char *json, size_t len)
{
	struct ipc_server *srv = c->srv;
	if (c->local_done) {
		/* a submitted call: the reply goes to its transport, and the
		 * call, which has no context, ends here */
		c->local_done(c->local_ud, json, len);
		atomic_fetch_add(&srv->st_replies, 1);
		cm_free(c);
		busy_done(srv, &srv->sending);
		return 0;
	}
	nng_msg *m = NULL;
	if (nng_msg_alloc(&m, 0) != 0 || nng_msg_append(m, json, len) != 0) {
		if (m)
			nng_msg_free(m);
		atomic_fetch_add(&srv->st_send_failures, 1);
		call_recv(c);
		busy_done(srv, &srv->sending);
		return -ENOMEM;
	}
	if (!ipc_io_begin(srv)) {
		/* closed: the reply has nowhere to go */
		nng_msg_free(m);
		atomic_store(&c->state, CALL_IDLE);
		busy_done(srv, &srv->sending);
		return -ESHUTDOWN;
	}
	nng_aio_set_msg(c->aio, m);
	nng_ctx_send(c->ctx, c->aio);
	ipc_io_end(srv);
	return 0;
}

static void reply_notify(struct ipc_server *srv, enum ipc_op op, enum ipc_errcode code)
{
	if (srv->on_reply)
		srv->on_reply(srv->userdata, op, code);
}

/* An error reply from the server itself (bad request, draining) to a
 * request of `op` (IPC_OP_NONE: unknown). */
static void call_send_error(struct ipc_call *c, enum ipc_op op, enum ipc_errcode code,
                            const char *id, const char *msg, int64_t retry_after_ms)
{
	char *json;
	size_t len;
	struct ipc_server *srv = c->srv;
	reply_notify(srv, op, code < IPC_ERR_COUNT ? code : IPC_ERR_INTERNAL);
	atomic_store(&c->state, CALL_SEND);
	atomic_fetch_add(&srv->sending, 1);
	atomic_fetch_add(&srv->st_errors[code < IPC_ERR_COUNT ? code : IPC_ERR_INTERNAL], 1);
	if (ipc_error_encode(code, id, msg, retry_after_ms, &json, &len) != 0) {
		atomic_fetch_add(&srv->st_send_failures, 1);
		if (c->local_done) {
			/* the transport still gets an answer, a fixed one */
			static const char oom[] = "{\"error\":\"internal\",\"message\":\"out of memory\"}";
			call_send(c, oom, sizeof(oom) - 1);
			return;
		}
		call_recv(c);
		busy_done(srv, &srv->sending);
		return;
	}
	call_send(c, json, len);
	cm_free(json);
}

/* ---- receiving ----------------------------------------------------------- */

static void call_peer_read(struct ipc_call *c, nng_msg *m)
{
	nng_pipe p = nng_msg_get_pipe(m);
	uint64_t v;
	bool verified;
	c->peer_pid = c->peer_uid = -1;
	c->identity[0] = '\0';
	if (nng_pipe_id(p) < 0)
		return;
	if (c->srv->tls && nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified) == 0) {
		/* a TLS pipe; with a CA nng let none in unverified */
		char cn[IPC_IDENTITY_MAX + 1 - 4] = ""; /* room for "tls:" */
		if (verified && atomic_load(&c->srv->tls_verify))
			ipc_tls_peer_cn(p, cn, sizeof(cn));
		snprintf(c->identity, sizeof(c->identity), "tls:%s", cn[0] ? cn : "anonymous");
		return;
	}
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &v) == 0)
		c->peer_pid = (int64_t)v;
	if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &v) == 0)
		c->peer_uid = (int64_t)v;
}

static bool is_probe(const struct ipc_server *srv, nng_msg *m)
{
	return srv->probe_len && nng_msg_len(m) == srv->probe_len &&
	       memcmp(nng_msg_body(m), srv->probe, srv->probe_len) == 0;
}

static void call_on_message(struct ipc_call *c, nng_msg *m)
{
	struct ipc_server *srv = c->srv;
	struct cm_err err = {0};

	c->probe = is_probe(srv, m);
	if (c->probe) {
		/* the self-check: echoed here, so that only nng is tested */
		nng_msg_free(m);
		atomic_store(&c->state, CALL_SEND);
		atomic_fetch_add(&srv->sending, 1);
		call_send(c, srv->probe, srv->probe_len);
		return;
	}
	atomic_fetch_add(&srv->st_received, 1);
	c->arrival_ns = cm_now_ns();
	call_peer_read(c, m);

	struct ipc_request *req;
	enum ipc_op op = IPC_OP_NONE;
	if (atomic_load(&srv->draining)) {
		/* parsed only to count the refusal by op */
		if (srv->on_reply && ipc_request_parse_op(nng_msg_body(m), nng_msg_len(m),
		                                          &srv->lim, &req, &op, NULL) == 0)
			ipc_request_free(req);
		nng_msg_free(m);
		call_send_error(c, op, IPC_ERR_SHUTTING_DOWN, NULL, NULL, -1);
		return;
	}
	int rc = ipc_request_parse_op(nng_msg_body(m), nng_msg_len(m), &srv->lim, &req, &op, &err);
	nng_msg_free(m);
	if (rc) {
		enum ipc_errcode code = ipc_errcode_from_errno(rc);
		call_send_error(c, op, code, NULL, err.msg, -1);
		return;
	}
	c->req = req;
	atomic_fetch_add(&srv->in_handler, 1);
	atomic_store(&c->state, CALL_HANDLER);
	pool_maybe_grow(srv);
	/* From here on the handler owns c; it may already be replied to (and
	 * receiving again) on another thread, so c is not touched after this. */
	srv->handler(c, srv->userdata);
}

static void call_cb(void *arg)
{
	struct ipc_call *c = arg;
	struct ipc_server *srv = c->srv;
	int rv = nng_aio_result(c->aio);

	switch (atomic_load(&c->state)) {
	case CALL_RECV:
		atomic_fetch_sub(&srv->idle, 1);
		if (rv != 0) {
			atomic_store(&c->state, CALL_IDLE);
			/* closed or stopped: stay idle; anything else: receive again */
			if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
				call_recv(c);
			return;
		}
		nng_msg *m = nng_aio_get_msg(c->aio);
		nng_aio_set_msg(c->aio, NULL);
		call_on_message(c, m);
		return;
	case CALL_SEND: {
		bool probe = c->probe;
		c->probe = false;
		if (rv != 0) {
			nng_msg_free(nng_aio_get_msg(c->aio));
			nng_aio_set_msg(c->aio, NULL);
			if (!probe)
				atomic_fetch_add(&srv->st_send_failures, 1);
		} else if (!probe) {
			atomic_fetch_add(&srv->st_replies, 1);
		}
		if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
			atomic_store(&c->state, CALL_IDLE);
		else
			call_recv(c);
		busy_done(srv, &srv->sending);
		return;
	}
	default:
		return;
	}
}

/* ---- completing calls ----------------------------------------------------- */

int ipc_server_submit(ipc_server *srv, const char *json, size_t len, const char *identity,
                      ipc_submit_done_fn done, void *ud)
{
	if (!srv || !done)
		return -ESHUTDOWN;
	/* counted in the handler's calls before draining is looked at, so that
	 * ipc_server_stop, which drains and then waits for that count, either
	 * waits for this call or is seen draining here: no handler runs once
	 * the server has stopped */
	atomic_fetch_add(&srv->in_handler, 1);
	if (atomic_load(&srv->closing)) {
		busy_done(srv, &srv->in_handler);
		return -ESHUTDOWN;
	}
	struct ipc_call *c = cm_calloc(1, sizeof(*c));
	if (!c) {
		busy_done(srv, &srv->in_handler);
		return -ENOMEM;
	}
	c->srv = srv;
	c->local_done = done;
	c->local_ud = ud;
	snprintf(c->identity, sizeof(c->identity), "%s", identity ? identity : "");
	c->peer_pid = c->peer_uid = -1;
	c->arrival_ns = cm_now_ns();
	atomic_fetch_add(&srv->st_received, 1);

	struct ipc_request *req;
	enum ipc_op op = IPC_OP_NONE;
	struct cm_err err = {0};
	if (atomic_load(&srv->draining)) {
		if (srv->on_reply && ipc_request_parse_op(json, len, &srv->lim, &req, &op, NULL) == 0)
			ipc_request_free(req);
		call_send_error(c, op, IPC_ERR_SHUTTING_DOWN, NULL, NULL, -1);
		busy_done(srv, &srv->in_handler);
		return 0;
	}
	int rc = ipc_request_parse_op(json, len, &srv->lim, &req, &op, &err);
	if (rc) {
		call_send_error(c, op, ipc_errcode_from_errno(rc), NULL, err.msg, -1);
		busy_done(srv, &srv->in_handler);
		return 0;
	}
	c->req = req;
	atomic_store(&c->state, CALL_HANDLER); /* the count taken above is the handler's */
	srv->handler(c, srv->userdata);
	return 0;
}

const char *ipc_call_identity(const ipc_call *call)
{
	return call->identity[0] ? call->identity : NULL;
}

const struct ipc_request *ipc_call_request(const ipc_call *call)
{
	return call->req;
}

uint64_t ipc_call_arrival_ns(const ipc_call *call)
{
	return call->arrival_ns;
}

void ipc_call_peer(const ipc_call *call, int64_t *ret_pid, int64_t *ret_uid)
{
	if (ret_pid)
		*ret_pid = call->peer_pid;
	if (ret_uid)
		*ret_uid = call->peer_uid;
}

/* HANDLER -> SEND, once. The call moves from the in_handler count to the
 * sending count (in that order, so that ipc_server_stop, which waits for
 * both to reach zero, cannot close the socket between the two) and its
 * request is freed. */
static int call_take(struct ipc_call *c)
{
	int expect = CALL_HANDLER;
	if (!atomic_compare_exchange_strong(&c->state, &expect, CALL_SEND))
		return -EALREADY;
	struct ipc_server *srv = c->srv;
	ipc_request_free(c->req);
	c->req = NULL;
	atomic_fetch_add(&srv->sending, 1);
	busy_done(srv, &srv->in_handler);
	return 0;
}

/* Complete the call with `json`, which answers `code`; counted only when
 * the call was the handler's to complete. */
static int call_reply_code(ipc_call *call, enum ipc_errcode code, const char *json, size_t len)
{
	enum ipc_op op = call->req ? call->req->op : IPC_OP_NONE; /* freed by call_take */
	if (call_take(call))
		return -EALREADY;
	reply_notify(call->srv, op, code);
	return call_send(call, json, len); /* -ESHUTDOWN after ipc_server_stop */
}

int ipc_call_reply(ipc_call *call, const char *json, size_t len)
{
	return call_reply_code(call, IPC_ERR_NONE, json, len);
}

int ipc_call_reply_encode(ipc_call *call, const struct ipc_reply *r)
{
	struct ipc_reply copy = *r;
	char *json;
	size_t len;
	struct cm_err err;
	if (!copy.id && call->req)
		copy.id = call->req->id;
	if (copy.error != IPC_ERR_NONE && (unsigned)copy.error < IPC_ERR_COUNT)
		atomic_fetch_add(&call->srv->st_errors[copy.error], 1);
	int rc = ipc_reply_encode(&copy, &json, &len, &err);
	if (rc) {
		/* Still complete the call, with an internal error. */
		return ipc_call_error(call, IPC_ERR_INTERNAL, -1, "cannot encode the reply: %s",
		                      err.msg);
	}
	rc = call_reply_code(call, copy.error < IPC_ERR_COUNT ? copy.error : IPC_ERR_INTERNAL, json,
	                     len);
	cm_free(json);
	return rc;
}

int ipc_call_error(ipc_call *call, enum ipc_errcode code, int64_t retry_after_ms, const char *fmt,
                   ...)
{
	char msg[512];
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
	}
	if ((unsigned)code >= IPC_ERR_COUNT || code == IPC_ERR_NONE)
		code = IPC_ERR_INTERNAL;
	char id[IPC_ID_MAX + 1] = "";
	if (call->req && call->req->id)
		snprintf(id, sizeof(id), "%s", call->req->id);
	char *json;
	size_t len;
	int rc = ipc_error_encode(code, id[0] ? id : NULL, fmt ? msg : NULL, retry_after_ms, &json,
	                          &len);
	if (rc) {
		/* Out of memory: complete the call without a reply. */
		enum ipc_op op = call->req ? call->req->op : IPC_OP_NONE;
		if (call_take(call) == 0) {
			struct ipc_server *srv = call->srv;
			reply_notify(srv, op, code);
			atomic_fetch_add(&srv->st_send_failures, 1);
			call_recv(call); /* stays idle when closing */
			busy_done(srv, &srv->sending);
		}
		return rc;
	}
	atomic_fetch_add(&call->srv->st_errors[code], 1);
	rc = call_reply_code(call, code, json, len);
	cm_free(json);
	return rc;
}

/* ---- setup ---------------------------------------------------------------- */

/* The threads nng 1.5.2's nni_init starts, all at once on the first socket:
 * a poller, 4 resolvers, a task queue of 2 a CPU (at most 16), the reaper,
 * the timer, and an aio expiry thread a CPU (at most 256). */
static unsigned nng_thread_count(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	return 1 + 4 + (unsigned)CM_MIN(2 * n, 16) + 1 + 1 + (unsigned)CM_MIN(n, 256);
}

/* Address space left once nng's threads exist: its initialisation goes on
 * allocating, and a failure there is as fatal as a thread's. */
#define PREFLIGHT_SPARE_BYTES ((size_t)16 << 20)

struct preflight {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool go;
};

static void *preflight_thread(void *arg)
{
	struct preflight *pf = arg;
	pthread_mutex_lock(&pf->mu);
	while (!pf->go)
		pthread_cond_wait(&pf->cv, &pf->mu);
	pthread_mutex_unlock(&pf->mu);
	return NULL;
}

int ipc_preflight(struct cm_err *err)
{
	if (atomic_load(&nng_started))
		return 0;
	unsigned need = nng_thread_count(), made = 0;
	pthread_t *th = cm_calloc(need, sizeof(*th));
	if (!th)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory");
	struct preflight pf = {.go = false};
	pthread_mutex_init(&pf.mu, NULL);
	pthread_cond_init(&pf.cv, NULL);
	/* Default attributes, as nng's own threads, all alive at once: their
	 * stacks take the address space (and the tasks) nng's will. */
	int e = 0;
	while (made < need && (e = pthread_create(&th[made], NULL, preflight_thread, &pf)) == 0)
		made++;
	bool spare = true;
	if (made == need) {
		void *p = mmap(NULL, PREFLIGHT_SPARE_BYTES, PROT_NONE,
		               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			spare = false;
		else
			munmap(p, PREFLIGHT_SPARE_BYTES);
	}
	pthread_mutex_lock(&pf.mu);
	pf.go = true;
	pthread_cond_broadcast(&pf.cv);
	pthread_mutex_unlock(&pf.mu);
	for (unsigned i = 0; i < made; i++)
		pthread_join(th[i], NULL);
	cm_free(th);
	pthread_cond_destroy(&pf.cv);
	pthread_mutex_destroy(&pf.mu);
	if (made == need && spare)
		return 0;

	size_t stack = 0;
	pthread_attr_t a;
	if (pthread_getattr_default_np(&a) == 0) {
		(void)pthread_attr_getstacksize(&a, &stack);
		pthread_attr_destroy(&a);
	}
	struct rlimit rl;
	char what[128];
	if (made < need)
		snprintf(what, sizeof(what),
		         "only %u of the %u threads it starts could be created (%s)", made, need,
		         strerror(e));
	else
		snprintf(what, sizeof(what),
		         "its %u threads leave less than %zu MiB of address space", need,
		         PREFLIGHT_SPARE_BYTES >> 20);
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		return cm_err_set(err, -ENOMEM,
		                  "ipc: nng cannot start: %s; the address space limit (LimitAS=, "
		                  "ulimit -v) is %llu MiB and nng's threads take %zu MiB (%zu KiB "
		                  "stacks)",
		                  what, (unsigned long long)(rl.rlim_cur >> 20),
		                  (size_t)need * stack >> 20, stack >> 10);
	return cm_err_set(
	    err, -EAGAIN,
	    "ipc: nng cannot start: %s; raise the task limit (TasksMax=, LimitNPROC=)", what);
}

static int listener_add(struct ipc_server *srv, const char *url, struct cm_err *err)
{
	struct listener *L = &srv->listeners[srv->n_listeners];
	bool is_ipc = strncmp(url, "ipc://", 6) == 0;
	bool is_tls = strncmp(url, "tls+tcp://", 10) == 0;
	if (!is_ipc && !is_tls && strncmp(url, "tcp://", 6) != 0 &&
	    strncmp(url, "inproc://", 9) != 0)
		return cm_err_set(
		    err, -EINVAL,
		    "ipc: listen URL '%s': only ipc://, tcp://, tls+tcp:// and inproc:// are served",
		    url);
	if (is_tls && !srv->tls)
		return cm_err_set(err, -EINVAL,
		                  "ipc: listen URL '%s': tls+tcp:// needs tls_cert_file and "
		                  "tls_key_file (the server's certificate and key)",
		                  url);
	L->tls = is_tls;
	L->url = cm_strdup(url);
	if (!L->url)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory");
	L->sc_fd = -1;
	srv->n_listeners++; /* from here on ipc_server_free releases L */
	if (is_ipc) {
		const char *path = url + 6;
		if (!*path)
			return cm_err_set(err, -EINVAL, "ipc: listen URL '%s' has no path", url);
		L->path = cm_strdup(path);
		if (!L->path)
			return cm_err_set(err, -ENOMEM, "ipc: out of memory");
		/* nng reports a missing directory as a bare "Entry not found";
		 * name the directory instead. */
		char *dir = cm_strdup(path);
		if (!dir)
			return cm_err_set(err, -ENOMEM, "ipc: out of memory");
		char *slash = strrchr(dir, '/');
		const char *d = ".";
		if (slash == dir)
			d = "/";
		else if (slash) {
			*slash = '\0';
			d = dir;
		}
		struct stat st;
		int rc = 0;
		if (stat(d, &st) != 0)
			rc = cm_err_set(err, -errno,
			                "ipc: socket directory '%s' of %s: %s (create it, e.g. "
			                "RuntimeDirectory=edgelm)",
			                d, url, strerror(errno));
		else if (!S_ISDIR(st.st_mode))
			rc = cm_err_set(err, -ENOTDIR, "ipc: '%s' (of %s) is not a directory", d,
			                url);
		cm_free(dir);
		if (rc)
			return rc;
	}
	return ipc_listener_create(srv, L, url, err);
}

/* The self-check's request: a random token, so that only this server's echo
 * passes (not another process that took over the path). */
static void probe_init(struct ipc_server *srv)
{
	unsigned char tok[16];
	if (getrandom(tok, sizeof(tok), GRND_NONBLOCK) != (ssize_t)sizeof(tok)) {
		uint64_t a = cm_now_ns() ^ ((uint64_t)getpid() << 32), b = (uintptr_t)srv;
		memcpy(tok, &a, 8);
		memcpy(tok + 8, &b, 8);
	}
	int n = snprintf(srv->probe, sizeof(srv->probe), "{\"op\":\"health\",\"selfcheck\":\"");
	for (size_t i = 0; i < sizeof(tok); i++)
		n += snprintf(srv->probe + n, sizeof(srv->probe) - (size_t)n, "%02x", tok[i]);
	n += snprintf(srv->probe + n, sizeof(srv->probe) - (size_t)n, "\"}");
	srv->probe_len = (size_t)n;
}

int ipc_server_new(const struct ipc_server_params *p, ipc_handler_fn handler, void *userdata,
                   ipc_server **ret_srv, struct cm_err *err)
{
	static const char *const default_urls[] = {IPC_DEFAULT_URL};
	*ret_srv = NULL;
	if (!p || !handler)
		return cm_err_set(err, -EINVAL, "ipc: server needs params and a handler");
	if (p->n_urls && !p->urls)
		return cm_err_set(err, -EINVAL, "ipc: %zu listen URLs but no array", p->n_urls);
	const char *const *urls = p->n_urls ? p->urls : default_urls;
	size_t n_urls = p->n_urls ? p->n_urls : 1;
	if (n_urls > 64)
		return cm_err_set(err, -EINVAL, "ipc: %zu listen URLs, at most 64", n_urls);
	if (p->socket_mode < -1 || p->socket_mode > 07777)
		return cm_err_set(err, -EINVAL, "ipc: socket mode %o out of range", p->socket_mode);
	if (p->selfcheck_timeout_ms > 600000)
		return cm_err_set(err, -EINVAL, "ipc: self-check timeout %u ms, at most 600000",
		                  p->selfcheck_timeout_ms);

	struct ipc_server *srv = cm_calloc(1, sizeof(*srv));
	if (!srv)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory");
	pthread_mutex_init(&srv->mu, NULL);
	pthread_cond_init(&srv->cv, NULL);
	pthread_rwlock_init(&srv->io, NULL);
	pthread_mutex_init(&srv->sc_mu, NULL);
	pthread_mutex_init(&srv->tls_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&srv->sc_cv, &ca);
	pthread_condattr_destroy(&ca);
	srv->handler = handler;
	srv->userdata = userdata;
	srv->lim = p->limits;
	ipc_limits_fill(&srv->lim);
	srv->n_contexts = p->n_contexts ? p->n_contexts : 16;
	srv->max_contexts = p->max_contexts ? p->max_contexts : 1024;
	if (srv->max_contexts < srv->n_contexts)
		srv->max_contexts = srv->n_contexts;
	srv->socket_mode = p->socket_mode == 0 ? 0660 : p->socket_mode;
	srv->sc_period_ms = p->selfcheck_ms;
	srv->sc_timeout_ms =
	    p->selfcheck_timeout_ms ? p->selfcheck_timeout_ms : IPC_SELFCHECK_TIMEOUT_MS;
	srv->on_event = p->on_event;
	srv->on_reply = p->on_reply;
	probe_init(srv);
	int rc;
	/* nng drops a connection whose message is over the limit: every
	 * round trip would fail, and every round re-create the listeners. */
	if (srv->sc_period_ms && srv->lim.max_msg_bytes < 256) {
		rc = cm_err_set(err, -EINVAL,
		                "ipc: the self-check needs max_msg_bytes of 256 at least");
		goto fail;
	}
	if (p->socket_group && *p->socket_group &&
	    !(srv->socket_group = cm_strdup(p->socket_group))) {
		rc = cm_err_set(err, -ENOMEM, "ipc: out of memory");
		goto fail;
	}
	srv->calls = cm_calloc(srv->max_contexts, sizeof(*srv->calls));
	srv->listeners = cm_calloc(n_urls, sizeof(*srv->listeners));
	if (!srv->calls || !srv->listeners) {
		rc = cm_err_set(err, -ENOMEM, "ipc: out of memory");
		goto fail;
	}
	if ((rc = ipc_preflight(err)))
		goto fail;
	int rv = nng_rep0_open(&srv->sock);
	if (rv != 0) {
		rc = cm_err_set(err, ipc_nng_to_errno(rv), "ipc: cannot open a rep0 socket: %s",
		                nng_strerror(rv));
		goto fail;
	}
	srv->sock_open = true;
	atomic_store(&nng_started, true);
	/* Set before any listener exists, and again per listener: messages over
	 * the limit are refused by the transport before they are buffered. */
	rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, srv->lim.max_msg_bytes);
	if (rv != 0) {
		rc = cm_err_set(err, ipc_nng_to_errno(rv), "ipc: cannot set the message limit: %s",
		                nng_strerror(rv));
		goto fail;
	}
	for (size_t i = 0; i < n_urls; i++) {
		if (!urls[i]) {
			rc = cm_err_set(err, -EINVAL, "ipc: listen URL %zu is NULL", i);
			goto fail;
		}
		/* the files are read only when a listener needs them */
		if (!srv->tls && strncmp(urls[i], "tls+tcp://", 10) == 0 && p->tls_cert_file &&
		    *p->tls_cert_file && p->tls_key_file && *p->tls_key_file) {
			if ((rc = ipc_tls_config_new(p->tls_cert_file, p->tls_key_file,
			                             p->tls_ca_file, &srv->tls, &srv->tls_ecfg,
			                             err)))
				goto fail;
			atomic_store(&srv->tls_verify, p->tls_ca_file && *p->tls_ca_file);
		}
		if ((rc = listener_add(srv, urls[i], err)))
			goto fail;
	}
	*ret_srv = srv;
	return 0;
fail:
	ipc_server_free(srv);
	return rc;
}

/* ---- start and stop -------------------------------------------------------- */

int ipc_server_start(ipc_server *srv, struct cm_err *err)
{
	cm_err_clear(err);
	if (srv->started)
		return cm_err_set(err, -EALREADY, "ipc: server already started");
	srv->started = true;
	int rc = 0;
	for (unsigned i = 0; i < srv->n_contexts && rc == 0; i++)
		rc = pool_add(srv);
	if (rc)
		return cm_err_set(err, rc, "ipc: cannot open %u nng contexts", srv->n_contexts);
	struct cm_err w = {0};
	for (size_t i = 0; i < srv->n_listeners; i++) {
		struct listener *L = &srv->listeners[i];
		if (!L->created)
			continue;
		if ((rc = ipc_listener_start(srv, L, w.code ? NULL : &w, err)))
			return rc;
	}
	if ((rc = ipc_selfcheck_start(srv)))
		return cm_err_set(err, rc, "ipc: cannot start the self-check thread: %s",
		                  strerror(-rc));
	if (w.code && err)
		*err = w;
	return 0;
}

void ipc_server_drain(ipc_server *srv)
{
	atomic_store(&srv->draining, true);
}

int ipc_server_stop(ipc_server *srv, int timeout_ms)
{
	if (!srv)
		return 0;
	ipc_selfcheck_stop(srv); /* first: no listener is re-created from here on */
	ipc_server_drain(srv);
	pthread_mutex_lock(&srv->mu);
	if (srv->stopped) {
		pthread_mutex_unlock(&srv->mu);
		return (int)atomic_load(&srv->in_handler);
	}
	if (timeout_ms > 0) {
		struct timespec ts = cm_deadline(CLOCK_REALTIME, timeout_ms);
		while (atomic_load(&srv->in_handler) + atomic_load(&srv->sending) > 0)
			if (pthread_cond_timedwait(&srv->cv, &srv->mu, &ts) != 0)
				break;
	}
	srv->stopped = true;
	pthread_mutex_unlock(&srv->mu);
	pthread_rwlock_wrlock(&srv->io);
	atomic_store(&srv->closing, true);
	if (srv->sock_open) {
		/* Closes listeners (removing ipc socket files) and every context;
		 * pending aios finish with NNG_ECLOSED. */
		nng_close(srv->sock);
		srv->sock_open = false;
	}
	pthread_rwlock_unlock(&srv->io);
	return (int)atomic_load(&srv->in_handler);
}

void ipc_server_free(ipc_server *srv)
{
	if (!srv)
		return;
	ipc_server_stop(srv, 0);
	for (unsigned i = 0; i < srv->n_calls; i++) {
		struct ipc_call *c = srv->calls[i];
		nng_aio_free(c->aio); /* waits for a running callback */
		if (atomic_load(&c->state) == CALL_HANDLER)
			ipc_request_free(c->req); /* a call the handler never completed */
		cm_free(c);
	}
	for (size_t i = 0; i < srv->n_listeners; i++) {
		cm_free(srv->listeners[i].url);
		cm_free(srv->listeners[i].path);
		cm_free(srv->listeners[i].listen_url);
	}
	cm_free(srv->listeners);
	cm_free(srv->calls);
	cm_free(srv->socket_group);
	if (srv->tls)
		nng_tls_config_free(srv->tls);
	pthread_cond_destroy(&srv->sc_cv);
	pthread_mutex_destroy(&srv->sc_mu);
	pthread_mutex_destroy(&srv->tls_mu);
	pthread_rwlock_destroy(&srv->io);
	pthread_cond_destroy(&srv->cv);
	pthread_mutex_destroy(&srv->mu);
	cm_free(srv);
}

void ipc_server_stats_get(const ipc_server *srv, struct ipc_server_stats *st)
{
	struct ipc_server *s = (struct ipc_server *)srv; /* atomics are read only */
	memset(st, 0, sizeof(*st));
	st->received = atomic_load(&s->st_received);
	st->replies = atomic_load(&s->st_replies);
	st->send_failures = atomic_load(&s->st_send_failures);
	for (int i = 0; i < IPC_ERR_COUNT; i++)
		st->errors[i] = atomic_load(&s->st_errors[i]);
	pthread_mutex_lock(&s->mu);
	st->contexts = s->n_calls;
	pthread_mutex_unlock(&s->mu);
	st->in_handler = atomic_load(&s->in_handler);
	st->selfchecks = atomic_load(&s->st_selfchecks);
	st->selfcheck_failures = atomic_load(&s->st_selfcheck_failures);
	st->listener_recoveries = atomic_load(&s->st_recoveries);
	st->selfcheck_ok_ns = atomic_load(&s->st_selfcheck_ok_ns);
}
