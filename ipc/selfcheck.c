/* ipc/selfcheck.c: the server's self-check of its listeners (the reason is
 * in server.c's header: nng 1.5.2's #1518). */
#include "ipc/server_impl.h"

#include <stdarg.h>

/* ---- self-check ------------------------------------------------------------ */

static void event(struct ipc_server *srv, int level, const char *fmt, ...) CM_PRINTF(3, 4);
static void event(struct ipc_server *srv, int level, const char *fmt, ...)
{
	if (!srv->on_event)
		return;
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	srv->on_event(srv->userdata, level, msg);
}

/* Wait until `fd` is ready by end_ns, in short slices so that a stop is
 * noticed. */
enum { IO_OK, IO_TIMEOUT, IO_CLOSED, IO_QUIT };
static int sc_wait(struct ipc_server *srv, int fd, short events, uint64_t end_ns)
{
	for (;;) {
		if (atomic_load(&srv->sc_quit))
			return IO_QUIT;
		uint64_t now = cm_now_ns();
		if (now >= end_ns)
			return IO_TIMEOUT;
		struct pollfd pfd = {.fd = fd, .events = events};
		int r = poll(&pfd, 1, (int)CM_MIN((end_ns - now) / 1000000 + 1, 50));
		if (r > 0)
			return IO_OK;
		if (r < 0 && errno != EINTR)
			return IO_CLOSED;
	}
}

/* Read until *got == n, keeping the progress across calls. */
static int sc_read(struct ipc_server *srv, int fd, void *buf, size_t n, size_t *got,
                   uint64_t end_ns)
{
	while (*got < n) {
		int w = sc_wait(srv, fd, POLLIN, end_ns);
		if (w != IO_OK)
			return w;
		ssize_t r = recv(fd, (char *)buf + *got, n - *got, 0);
		if (r > 0)
			*got += (size_t)r;
		else if (r == 0 || (errno != EINTR && errno != EAGAIN))
			return IO_CLOSED;
	}
	return IO_OK;
}

static int sc_write(struct ipc_server *srv, int fd, const void *buf, size_t n, uint64_t end_ns)
{
	for (size_t put = 0; put < n;) {
		int w = sc_wait(srv, fd, POLLOUT, end_ns);
		if (w != IO_OK)
			return w;
		ssize_t r = send(fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
		if (r > 0)
			put += (size_t)r;
		else if (r < 0 && errno != EINTR && errno != EAGAIN)
			return IO_CLOSED;
	}
	return IO_OK;
}

static void put_be(unsigned char *p, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)v;
}

/* PROBE_WEDGED: failed as a wedged listener does, negotiating and then
 * never handing the connection on (see the top). */
enum { PROBE_OK, PROBE_FAILED, PROBE_WEDGED, PROBE_SKIPPED, PROBE_QUIT };

static void probe_drop(struct listener *L)
{
	if (L->sc_fd >= 0)
		close(L->sc_fd);
	L->sc_fd = -1;
}

/* Connect to a listener as a req0 peer and send the SP header and one
 * request, framed as the transport frames it (ipc:// adds a type byte). */
static int probe_open(struct ipc_server *srv, struct listener *L, uint64_t end, char *why, size_t n)
{
	static const unsigned char req0_hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
	size_t frame = L->path ? 9 : 8, len = 4 + srv->probe_len;
	unsigned char out[8 + 9 + 4 + PROBE_MAX];
	memcpy(out, req0_hdr, 8);
	out[8] = 1; /* ipc:// message type; overwritten for tcp:// */
	put_be(out + frame, len, 8);
	put_be(out + 8 + frame, 0x80000000u, 4); /* request id; the high bit ends it */
	memcpy(out + 8 + frame + 4, srv->probe, srv->probe_len);

	int fd = socket(L->probe_sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(why, n, "cannot open a socket: %s", strerror(errno));
		return PROBE_SKIPPED;
	}
	int io = IO_OK, e = 0;
	if (connect(fd, (const struct sockaddr *)&L->probe_sa, L->probe_salen) != 0) {
		e = errno;
		if (e == EINPROGRESS) { /* tcp:// */
			socklen_t sl = sizeof(e);
			io = sc_wait(srv, fd, POLLOUT, end);
			if (io == IO_OK && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &sl) != 0)
				e = errno;
		}
	}
	if (io == IO_OK && !e)
		io = sc_write(srv, fd, out, 8 + frame + len, end);
	if (io == IO_OK && !e) {
		L->sc_fd = fd;
		L->sc_header = false;
		L->sc_got = 0;
		return PROBE_OK;
	}
	close(fd);
	struct stat st;
	if (io == IO_QUIT)
		return PROBE_QUIT;
	if (L->path && lstat(L->path, &st) != 0 && errno == ENOENT)
		snprintf(why, n, "its socket file is gone");
	else if (e)
		snprintf(why, n, "cannot connect: %s", strerror(e));
	else
		snprintf(why, n, "no connection within %u ms", srv->sc_timeout_ms);
	return PROBE_FAILED;
}

/* One round trip to a listener over a new connection (only new connections
 * wedge), bounded by the self-check timeout: its 4-byte request id and body
 * must come back. A connection that gets no answer in time is kept and
 * waited on by the next rounds, not replaced: a wedged listener keeps every
 * new connection (and nng never frees them), and a slow one answers late. */
static int probe(struct ipc_server *srv, struct listener *L, char *why, size_t n)
{
	static const unsigned char rep0_hdr[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0};
	size_t frame = L->path ? 9 : 8, len = 4 + srv->probe_len;
	uint64_t end = cm_now_ns() + (uint64_t)srv->sc_timeout_ms * 1000000u;
	if (L->sc_fd < 0) {
		int r = probe_open(srv, L, end, why, n);
		if (r != PROBE_OK)
			return r;
	}
	int io = IO_OK;
	if (!L->sc_header) {
		io = sc_read(srv, L->sc_fd, L->sc_in, 8, &L->sc_got, end);
		if (io == IO_OK && memcmp(L->sc_in, rep0_hdr, 8) != 0) {
			probe_drop(L);
			snprintf(why, n, "not an nng rep0 socket");
			return PROBE_FAILED;
		}
		if (io == IO_OK) {
			L->sc_header = true;
			L->sc_got = 0;
		}
	}
	if (io == IO_OK)
		io = sc_read(srv, L->sc_fd, L->sc_in, frame + len, &L->sc_got, end);
	if (io == IO_OK) {
		const unsigned char *in = L->sc_in;
		uint64_t got = 0;
		for (size_t i = frame - 8; i < frame; i++)
			got = got << 8 | in[i];
		bool ok = (frame == 8 || in[0] == 1) && got == len && in[frame] == 0x80 &&
		          in[frame + 1] == 0 && in[frame + 2] == 0 && in[frame + 3] == 0 &&
		          memcmp(in + frame + 4, srv->probe, srv->probe_len) == 0;
		probe_drop(L);
		if (!ok)
			snprintf(why, n, "a reply not from this server");
		return ok ? PROBE_OK : PROBE_FAILED;
	}
	const char *stage = L->sc_header ? "reply" : "SP header";
	if (io == IO_QUIT)
		return PROBE_QUIT;
	if (io == IO_CLOSED) {
		probe_drop(L);
		snprintf(why, n, "the connection was closed before the %s", stage);
		return PROBE_FAILED;
	}
	if (L->sc_header && atomic_load(&srv->idle) == 0) {
		/* every context is held by the handler: nng keeps the request
		 * waiting, which says nothing of the listener */
		snprintf(why, n, "no context free to answer");
		return PROBE_SKIPPED;
	}
	snprintf(why, n, "no %s within %u ms", stage, srv->sc_timeout_ms);
	return L->sc_header ? PROBE_WEDGED : PROBE_FAILED;
}

/* Close a failing listener and open it again. Under `io` like every other
 * nng call on the socket, though ipc_server_stop joins this thread before it
 * closes the socket. */
static int listener_recover(struct ipc_server *srv, struct listener *L, struct cm_err *warn,
                            struct cm_err *err)
{
	if (!ipc_io_begin(srv))
		return cm_err_set(err, -ESHUTDOWN, "ipc: closing");
	int rc = 0;
	struct stat st;
	/* nng's close unlinks the path, whatever is there by then. */
	if (L->path && L->started && lstat(L->path, &st) == 0 &&
	    (st.st_dev != L->dev || st.st_ino != L->ino)) {
		rc = cm_err_set(err, -EEXIST,
		                "ipc: %s is no longer this server's socket file: not "
		                "re-creating its listener, which would remove it",
		                L->path);
		goto out;
	}
	if (L->created) {
		nng_listener_close(L->l); /* and every pipe it accepted */
		L->created = L->started = false;
	}
	rc = ipc_listener_create(srv, L, L->listen_url ? L->listen_url : L->url, err);
	if (rc == 0)
		rc = ipc_listener_start(srv, L, warn, err);
out:
	ipc_io_end(srv);
	return rc;
}

/* Returns false when re-creating the listener failed. */
static bool recover(struct ipc_server *srv, struct listener *L)
{
	struct cm_err err = {0}, warn = {0};
	probe_drop(L);
	int rc = listener_recover(srv, L, &warn, &err);
	if (rc == 0) {
		atomic_fetch_add(&srv->st_recoveries, 1);
		L->fails = 0;
		L->verified = false;
		L->last_event[0] = '\0';
		event(srv, LOG_WARNING,
		      "ipc: re-created the listener on %s; clients connected through it were "
		      "disconnected",
		      L->url);
		if (warn.code)
			event(srv, LOG_WARNING, "%s; ignoring", warn.msg);
		return true;
	}
	if (rc != -ESHUTDOWN && strcmp(L->last_event, err.msg) != 0) {
		/* once per distinct failure; it is retried every round */
		snprintf(L->last_event, sizeof(L->last_event), "%s", err.msg);
		event(srv, LOG_ERR, "%s; retrying", err.msg);
	}
	return false;
}

/* Check every listener once; returns the wait before the next round (0: stop). */
static unsigned selfcheck_round(struct ipc_server *srv)
{
	bool all_ok = true, stuck = false;
	for (size_t i = 0; i < srv->n_listeners; i++) {
		struct listener *L = &srv->listeners[i];
		if (!L->checked)
			continue; /* inproc://, or never started */
		if (!L->started) {
			all_ok = false;
			stuck |= !recover(srv, L);
			continue;
		}
		char why[200];
		int r = probe(srv, L, why, sizeof(why));
		if (r == PROBE_QUIT)
			return 0;
		if (r == PROBE_OK) {
			atomic_fetch_add(&srv->st_selfchecks, 1);
			if (L->fails)
				event(srv, LOG_NOTICE, "ipc: self-check of %s passes again",
				      L->url);
			L->fails = 0;
			L->fails_needed = SELFCHECK_FAILS;
			L->verified = true;
			continue;
		}
		all_ok = false;
		if (r == PROBE_SKIPPED)
			continue;
		atomic_fetch_add(&srv->st_selfcheck_failures, 1);
		if (!L->fails_needed)
			L->fails_needed = SELFCHECK_FAILS;
		bool redo = ++L->fails >= L->fails_needed;
		/* quiet while a failure to re-create it stands reported */
		if ((L->fails == 1 || redo) && !L->last_event[0])
			event(srv, LOG_WARNING, "ipc: self-check of %s failed: %s%s", L->url, why,
			      redo ? "; re-creating its listener" : "");
		if (!redo)
			continue;
		/* A wedge is undone by re-creating the listener, however often it
		 * comes back (a client closing while nng redials it wedges the new
		 * one). Other failures that outlive a re-creation (a dial that cannot
		 * work here, a cleaner removing the socket file) are not, and each
		 * one drops the listener's clients: less often. */
		if (r == PROBE_WEDGED)
			L->fails_needed = SELFCHECK_FAILS;
		else if (!L->verified)
			L->fails_needed = CM_MIN(2 * L->fails_needed, SELFCHECK_FAILS_MAX);
		stuck |= !recover(srv, L);
	}
	if (all_ok)
		atomic_store(&srv->st_selfcheck_ok_ns, cm_now_ns());
	/* look again soon after a failure, at the normal pace while a
	 * listener cannot be re-created */
	return all_ok || stuck ? srv->sc_period_ms : CM_MIN(srv->sc_period_ms, SELFCHECK_RETRY_MS);
}

static void *selfcheck_main(void *arg)
{
	struct ipc_server *srv = arg;
	unsigned wait = srv->sc_period_ms;
	pthread_mutex_lock(&srv->sc_mu);
	while (!atomic_load(&srv->sc_quit) && wait) {
		struct timespec ts = cm_deadline(CLOCK_MONOTONIC, wait);
		while (!atomic_load(&srv->sc_quit) &&
		       pthread_cond_timedwait(&srv->sc_cv, &srv->sc_mu, &ts) == 0)
			;
		if (atomic_load(&srv->sc_quit))
			break;
		pthread_mutex_unlock(&srv->sc_mu);
		wait = selfcheck_round(srv);
		pthread_mutex_lock(&srv->sc_mu);
	}
	pthread_mutex_unlock(&srv->sc_mu);
	for (size_t i = 0; i < srv->n_listeners; i++)
		probe_drop(&srv->listeners[i]);
	return NULL;
}

int ipc_selfcheck_start(struct ipc_server *srv)
{
	bool any = false;
	for (size_t i = 0; i < srv->n_listeners; i++)
		any |= srv->listeners[i].checked;
	if (!srv->sc_period_ms || !any)
		return 0;
	atomic_store(&srv->st_selfcheck_ok_ns, cm_now_ns());
	pthread_mutex_lock(&srv->sc_mu);
	int e = pthread_create(&srv->sc_thread, NULL, selfcheck_main, srv);
	if (e == 0) {
		pthread_setname_np(srv->sc_thread, "ipc:selfcheck");
		srv->sc_joinable = true;
	}
	pthread_mutex_unlock(&srv->sc_mu);
	return -e;
}

/* Idempotent; only the first caller joins. */
void ipc_selfcheck_stop(struct ipc_server *srv)
{
	pthread_mutex_lock(&srv->sc_mu);
	atomic_store(&srv->sc_quit, true);
	bool join = srv->sc_joinable;
	srv->sc_joinable = false;
	pthread_cond_broadcast(&srv->sc_cv);
	pthread_mutex_unlock(&srv->sc_mu);
	if (join)
		pthread_join(srv->sc_thread, NULL);
}

