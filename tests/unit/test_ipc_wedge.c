/* tests/unit/test_ipc_wedge.c: the server's defences against nng 1.5.2.
 *
 * - A local connect() and close() on an ipc:// socket (or a bogus or partial
 *   SP header and close, or nng's own probe of the path from a second server)
 *   can wedge the listener for good (nng bug #1518): the self-check must see
 *   it and re-create the listener, and fresh clients be served again.
 * - Something other than a socket at the path is refused, not deleted.
 * - Under a small RLIMIT_AS, nng's initialisation crashes or hangs when it
 *   cannot create its threads: the server must fail cleanly first.
 *
 * The wedge is racy (the server's header write must meet the closed peer),
 * so the tests poke a bounded number of times (more when the first rounds
 * all miss, as on a loaded box) and also check that a wedge was seen at
 * least once. */
#include "ipc/ipc.h"
#include "ipc/edgelm.h"
#include "tests/test.h"

#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#ifdef TEST_ASAN
/* nng 1.5.2 never frees a closed listener's transport endpoint while it
 * holds connections it negotiated but never handed to the socket, and a
 * wedged listener holds them: every recovery here leaks them (with their
 * fds), inside nng. test_ipc_server runs the self-check, without wedges,
 * under LeakSanitizer with no suppression. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
	return "leak:libnng.so\n";
}
#endif

/* ---- a tiny daemon ---------------------------------------------------------- */

#define MAX_HELD 8

struct tsrv {
	ipc_server *srv;
	char path[256];
	char url[300];
	pthread_mutex_t mu;
	ipc_call *held[MAX_HELD]; /* generate "hold" calls, answered by release() */
	int n_held;
	atomic_int handled;
	/* events */
	int n_events[8];
	char events[4096];
};

static void handler(ipc_call *c, void *userdata)
{
	struct tsrv *t = userdata; /* NULL: only answer */
	const struct ipc_request *q = ipc_call_request(c);
	if (t)
		atomic_fetch_add(&t->handled, 1);
	if (t && q->op == IPC_OP_GENERATE && strcmp(q->prompt, "hold") == 0) {
		pthread_mutex_lock(&t->mu);
		if (t->n_held < MAX_HELD) {
			t->held[t->n_held++] = c;
			c = NULL;
		}
		pthread_mutex_unlock(&t->mu);
		if (!c)
			return;
	}
	struct ipc_reply r = {.op = IPC_OP_HEALTH, .retry_after_ms = -1};
	if (q->op == IPC_OP_HEALTH) {
		r.u.health.status = IPC_HEALTH_READY;
		ipc_call_reply_encode(c, &r);
	} else {
		ipc_call_error(c, IPC_ERR_UNSUPPORTED, -1, NULL);
	}
}

static void on_event(void *userdata, int level, const char *msg)
{
	struct tsrv *t = userdata;
	pthread_mutex_lock(&t->mu);
	if (level >= 0 && level < 8)
		t->n_events[level]++;
	size_t len = strlen(t->events);
	if (len + strlen(msg) + 2 < sizeof(t->events))
		snprintf(t->events + len, sizeof(t->events) - len, "%s\n", msg);
	pthread_mutex_unlock(&t->mu);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  event <%d> %s\n", level, msg);
}

static int events_with(struct tsrv *t, int level)
{
	pthread_mutex_lock(&t->mu);
	int n = t->n_events[level];
	pthread_mutex_unlock(&t->mu);
	return n;
}

static bool events_contain(struct tsrv *t, const char *s)
{
	pthread_mutex_lock(&t->mu);
	bool yes = strstr(t->events, s) != NULL;
	pthread_mutex_unlock(&t->mu);
	return yes;
}

static void release(struct tsrv *t)
{
	pthread_mutex_lock(&t->mu);
	int n = t->n_held;
	ipc_call *held[MAX_HELD];
	memcpy(held, t->held, sizeof(held));
	t->n_held = 0;
	pthread_mutex_unlock(&t->mu);
	for (int i = 0; i < n; i++)
		ipc_call_error(held[i], IPC_ERR_SHUTTING_DOWN, -1, NULL);
}

static void tsrv_path(struct tsrv *t, const char *name)
{
	snprintf(t->path, sizeof(t->path), "%s/wedge-%s-%d.sock", test_tmpdir(), name,
	         (int)getpid());
	snprintf(t->url, sizeof(t->url), "ipc://%s", t->path);
}

/* A server on $TMPDIR/wedge-NAME-PID.sock (and `extra_url` too, if given)
 * with the self-check every `sc_ms` (0: off), each round trip bounded by
 * `sc_timeout_ms` (0: the default). */
static struct tsrv *tsrv_start(const char *name, unsigned sc_ms, unsigned sc_timeout_ms,
                               const char *extra_url, const struct ipc_server_params *base)
{
	struct tsrv *t = cm_calloc(1, sizeof(*t));
	if (!t)
		abort();
	pthread_mutex_init(&t->mu, NULL);
	tsrv_path(t, name);
	unlink(t->path);
	const char *urls[] = {t->url, extra_url};
	struct ipc_server_params p = {0};
	if (base)
		p = *base;
	p.urls = urls;
	p.n_urls = extra_url ? 2 : 1;
	p.selfcheck_ms = sc_ms;
	p.selfcheck_timeout_ms = sc_timeout_ms;
	p.on_event = on_event;
	struct cm_err err = {0};
	int rc = ipc_server_new(&p, handler, t, &t->srv, &err);
	CHECK_MSG(rc == 0, "ipc_server_new: %s", err.msg);
	if (rc == 0) {
		rc = ipc_server_start(t->srv, &err);
		CHECK_MSG(rc == 0, "ipc_server_start: %s", err.msg);
	}
	if (rc) {
		ipc_server_free(t->srv);
		pthread_mutex_destroy(&t->mu);
		cm_free(t);
		return NULL;
	}
	return t;
}

static void tsrv_stop(struct tsrv *t)
{
	if (!t)
		return;
	release(t);
	CHECK_EQ_INT(ipc_server_stop(t->srv, 2000), 0);
	ipc_server_free(t->srv);
	pthread_mutex_destroy(&t->mu);
	cm_free(t);
}

static struct ipc_server_stats stats(struct tsrv *t)
{
	struct ipc_server_stats st;
	ipc_server_stats_get(t->srv, &st);
	return st;
}

/* ---- clients ----------------------------------------------------------------- */

/* A fresh req0 client (a new connection) asks for health; any reply within
 * timeout_ms counts. */
static bool served(const char *url, int timeout_ms)
{
	nng_socket s;
	if (nng_req0_open(&s) != 0)
		return false;
	bool ok = false;
	const char *q = "{\"op\":\"health\"}";
	if (nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE) == 0 &&
	    nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 20) == 0 &&
	    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms) == 0 &&
	    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms) == 0 &&
	    nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK) == 0 &&
	    nng_send(s, (void *)q, strlen(q), 0) == 0) {
		char *buf = NULL;
		size_t len = 0;
		if (nng_recv(s, &buf, &len, NNG_FLAG_ALLOC) == 0) {
			ok = len > 0;
			nng_free(buf, len);
		}
	}
	/* After a failure nng may be redialling: a close in the middle of
	 * that handshake wedges the listener again (the bug itself), and the
	 * tests would time two wedges. */
	if (!ok)
		usleep(200000);
	nng_close(s);
	return ok;
}

/* Milliseconds until a fresh client is served (each try a new connection,
 * 500 ms at most), or -1 after limit_ms. */
static long ms_until_served(const char *url, long limit_ms)
{
	uint64_t t0 = cm_now_ns();
	for (;;) {
		if (served(url, 500))
			return (long)((cm_now_ns() - t0) / 1000000);
		if ((long)((cm_now_ns() - t0) / 1000000) >= limit_ms)
			return -1;
		usleep(20000);
	}
}

enum poke_kind {
	POKE_CLOSE,   /* connect() and close() */
	POKE_PARTIAL, /* 3 bytes of an SP header, close() */
	POKE_BOGUS,   /* an HTTP request line, close() */
	POKE_COUNT
};
static const char *const poke_names[] = {"connect+close", "partial header", "bogus header"};

static struct sockaddr_un sun_of(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = CM_MIN(strlen(path), sizeof(sa.sun_path) - 1);
	memcpy(sa.sun_path, path, n);
	return sa;
}

static int raw_connect(const char *path)
{
	struct sockaddr_un sa = sun_of(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void poke(const char *path, enum poke_kind kind)
{
	int fd = raw_connect(path);
	if (fd < 0)
		return;
	if (kind == POKE_PARTIAL)
		(void)!send(fd, "\0SP", 3, MSG_NOSIGNAL);
	else if (kind == POKE_BOGUS)
		(void)!send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL);
	close(fd);
}

/* ---- tests ------------------------------------------------------------------- */

/* Each kind of short-lived connection, up to 7 times: right after it a fresh
 * client may go unanswered (the wedge, which must happen at least once over
 * the kinds: a re-created listener), but within 10 s one is served again,
 * through a re-created listener. On nng 1.5.2 without the self-check the
 * listener stays wedged: no reply. */
static void test_wedge_short_connections(void)
{
	struct tsrv *t = tsrv_start("short", 100, 300, NULL, NULL);
	if (!t)
		return;
	CHECK(served(t->url, 2000));
	int wedged = 0;
	for (int k = 0; k < POKE_COUNT; k++) {
		uint64_t rec0 = stats(t).listener_recoveries;
		for (int i = 0; i < 7; i++) {
			poke(t->path, (enum poke_kind)k);
			if (!served(t->url, 250))
				wedged++;
			long ms = ms_until_served(t->url, 10000);
			CHECK_MSG(ms >= 0,
			          "%s, try %d: no reply for 10 s: the listener stays wedged",
			          poke_names[k], i + 1);
			if (ms < 0)
				goto out;
			if (stats(t).listener_recoveries > rec0)
				break; /* this kind wedged it, and it recovered */
		}
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "  %s: %llu recoveries\n", poke_names[k],
			        (unsigned long long)(stats(t).listener_recoveries - rec0));
	}
	/* The race is the box's to win: on a loaded one 21 pokes once all
	 * missed. Go on, cycling the kinds, until one wedges it (a poke that
	 * does not costs a few ms). */
	int pokes = POKE_COUNT * 7;
	for (int i = 0; i < 200 && stats(t).listener_recoveries == 0; i++, pokes++) {
		poke(t->path, (enum poke_kind)(i % POKE_COUNT));
		if (!served(t->url, 250))
			wedged++;
		long ms = ms_until_served(t->url, 10000);
		CHECK_MSG(ms >= 0, "extra poke %d: no reply for 10 s: the listener stays wedged",
		          i + 1);
		if (ms < 0)
			goto out;
	}
	/* The wedge shows as a re-created listener: the self-check re-creates
	 * one only after its own probes went unanswered (the failures check
	 * below). A client's unanswered try is the same wedge seen from
	 * outside, but only when it comes before the self-check's recovery,
	 * which on a quiet box can win the 250 ms: CI's fresh-clone runs saw
	 * recoveries with no client unanswered. */
	struct ipc_server_stats st = stats(t);
	CHECK_MSG(st.listener_recoveries > 0,
	          "no wedge in %d pokes: the reproduction did not hit (%d unanswered)", pokes,
	          wedged);
	CHECK(st.selfcheck_failures >= 2 * st.listener_recoveries);
	CHECK(events_with(t, LOG_WARNING) > 0);
	CHECK(events_contain(t, "re-created the listener on"));
	/* the socket file is back, with its mode */
	struct stat sb;
	CHECK(stat(t->path, &sb) == 0 && S_ISSOCK(sb.st_mode) && (sb.st_mode & 07777) == 0660);
out:
	tsrv_stop(t);
}

/* The daemon's timing (selfcheck_ms = IPC_SELFCHECK_DEFAULT_MS, the default
 * timeout): from a wedge to the first reply to a fresh client, under 10 s. */
static void test_wedge_recovery_time(void)
{
	struct tsrv *t = tsrv_start("time", IPC_SELFCHECK_DEFAULT_MS, 0, NULL, NULL);
	if (!t)
		return;
	CHECK(served(t->url, 2000));
	bool seen = false;
	for (int i = 0; i < 6 && !seen; i++) {
		uint64_t rec0 = stats(t).listener_recoveries;
		poke(t->path, POKE_CLOSE);
		uint64_t t0 = cm_now_ns();
		long ms = ms_until_served(t->url, 15000);
		double s = (double)(cm_now_ns() - t0) / 1e9;
		CHECK_MSG(ms >= 0, "no reply 15 s after the poke");
		if (ms < 0)
			break;
		seen = stats(t).listener_recoveries > rec0;
		if (seen) {
			CHECK_MSG(s < 10, "served again %.1f s after the wedge", s);
			if (getenv("TEST_VERBOSE"))
				fprintf(stderr, "  wedge to reply: %.1f s\n", s);
		}
	}
	CHECK_MSG(seen, "6 pokes and no wedge");
	/* the self-check passes again */
	uint64_t t1 = cm_now_ns();
	for (int i = 0; i < 100 && stats(t).selfcheck_ok_ns < t1; i++)
		usleep(100000);
	CHECK(stats(t).selfcheck_ok_ns >= t1);
	tsrv_stop(t);
}

/* A client connected before the wedge is served during it (only new
 * connections wedge) and, disconnected by the recovery, after it (libedgelm
 * redials). */
static void test_wedge_established_client(void)
{
	struct tsrv *t = tsrv_start("est", 100, 300, NULL, NULL);
	if (!t)
		return;
	edgelm_client *c = NULL;
	struct edgelm_error e;
	CHECK_OK(edgelm_connect(t->url, &c, &e));
	if (!c) {
		tsrv_stop(t);
		return;
	}
	enum edgelm_health h;
	CHECK_OK(edgelm_health(c, &h, NULL, &e));
	uint64_t rec0 = stats(t).listener_recoveries;
	for (int i = 0; i < 7 && stats(t).listener_recoveries == rec0; i++) {
		poke(t->path, POKE_CLOSE);
		/* during the wedge (or not) the old connection works */
		CHECK_OK(edgelm_health(c, &h, NULL, &e));
		for (int j = 0; j < 50 && stats(t).listener_recoveries == rec0; j++)
			usleep(20000);
	}
	CHECK(stats(t).listener_recoveries > rec0);
	/* after it: one call may meet the dropped connection */
	edgelm_set_timeout(c, 3000);
	int rc = edgelm_health(c, &h, NULL, &e);
	if (rc != 0)
		rc = edgelm_health(c, &h, NULL, &e);
	CHECK_MSG(rc == 0, "after the recovery: %d (%s)", rc, e.message);
	edgelm_close(c);
	tsrv_stop(t);
}

/* A connection held open without a byte does not wedge the listener, nor
 * hold up others. */
static void test_connection_held(void)
{
	struct tsrv *t = tsrv_start("held", 100, 300, NULL, NULL);
	if (!t)
		return;
	int fd = raw_connect(t->path);
	CHECK(fd >= 0);
	CHECK(served(t->url, 2000));
	usleep(500000);
	CHECK(served(t->url, 2000));
	if (fd >= 0)
		close(fd);
	CHECK(ms_until_served(t->url, 10000) >= 0);
	CHECK_EQ_INT(stats(t).selfcheck_failures, 0);
	tsrv_stop(t);
}

/* `test_ipc_wedge --second-server URL`: a second server on URL, in its own
 * process as a second edgelmd would be. Exit 0 when refused as in use. */
static int second_server(const char *url)
{
	const char *u[] = {url};
	struct ipc_server_params p = {.urls = u, .n_urls = 1};
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	int rc = ipc_server_new(&p, handler, NULL, &srv, &err);
	if (rc == 0)
		rc = ipc_server_start(srv, &err);
	ipc_server_free(srv);
	if (rc != -EADDRINUSE || !strstr(err.msg, "another edgelmd")) {
		printf("second server: %d (%s), want -EADDRINUSE\n", rc, err.msg);
		return 1;
	}
	return 0;
}

/* A second server on a live path is refused, leaves the socket file, and
 * does not wedge the first: its check of the path completes an SP handshake
 * where nng's own probe would connect and close. The first has no
 * self-check here, so nothing would repair a wedge. */
static void test_second_server(void)
{
	struct tsrv *t = tsrv_start("twice", 0, 0, NULL, NULL);
	if (!t)
		return;
	CHECK(served(t->url, 2000));
	const char *u[] = {t->url};
	struct ipc_server_params p2 = {.urls = u, .n_urls = 1};
	for (int i = 0; i < 7; i++) {
		ipc_server *srv2 = NULL;
		struct cm_err err = {0};
		CHECK_OK(ipc_server_new(&p2, handler, NULL, &srv2, &err));
		if (srv2) {
			CHECK_EQ_INT(ipc_server_start(srv2, &err), -EADDRINUSE);
			CHECK_MSG(strstr(err.msg, "another edgelmd") != NULL, "%s", err.msg);
		}
		ipc_server_free(srv2);
		struct stat st;
		CHECK(stat(t->path, &st) == 0 && S_ISSOCK(st.st_mode));
		CHECK_MSG(served(t->url, 3000), "try %d: the first server no longer answers",
		          i + 1);
	}
	/* from another process */
	char self[4096], cmd[8192], *out = NULL;
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sl > 0);
	self[sl > 0 ? sl : 0] = '\0';
	snprintf(cmd, sizeof(cmd), "'%s' --second-server '%s' 2>&1", self, t->url);
	for (int i = 0; i < 3; i++) {
		int rc = test_run_capture(cmd, &out);
		CHECK_MSG(rc == 0, "%s", out);
		free(out);
		CHECK_MSG(served(t->url, 3000), "process %d: the first server no longer answers",
		          i + 1);
	}
	CHECK_EQ_INT(stats(t).listener_recoveries, 0);
	tsrv_stop(t);
}

/* The same with an older second server, whose nng probe (a connect() and
 * close()) wedges the first: the first's self-check repairs it. */
static void test_second_server_old_probe(void)
{
	struct tsrv *t = tsrv_start("twice-old", 100, 300, NULL, NULL);
	if (!t)
		return;
	for (int i = 0; i < 5; i++) {
		poke(t->path, POKE_CLOSE); /* nng 1.5.2's ipc_remove_stale */
		CHECK_MSG(ms_until_served(t->url, 10000) >= 0, "try %d: still wedged after 10 s",
		          i + 1);
	}
	tsrv_stop(t);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static bool file_has(const char *path, const char *text)
{
	char buf[256] = "";
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strcmp(buf, text) == 0;
}

/* Start a server on `path`; returns its start's result and message. */
static int start_on(const char *path, struct cm_err *err, ipc_server **ret_srv)
{
	char url[300];
	snprintf(url, sizeof(url), "ipc://%s", path);
	const char *u[] = {url};
	struct ipc_server_params p = {.urls = u, .n_urls = 1};
	ipc_server *srv = NULL;
	int rc = ipc_server_new(&p, handler, NULL, &srv, err);
	if (rc == 0)
		rc = ipc_server_start(srv, err);
	if (ret_srv && rc == 0)
		*ret_srv = srv;
	else
		ipc_server_free(srv);
	return rc;
}

/* What is not a socket at the path is refused and left as it was (nng 1.5.2
 * deletes it: its stale-socket probe gets ECONNREFUSED and unlinks the
 * path); a stale socket file is replaced. */
static void test_path_not_socket(void)
{
	char path[256], target[300];
	snprintf(path, sizeof(path), "%s/wedge-file-%d.sock", test_tmpdir(), (int)getpid());
	snprintf(target, sizeof(target), "%s.target", path);
	struct cm_err err = {0};
	struct stat st;

	unlink(path);
	write_file(path, "precious");
	CHECK_EQ_INT(start_on(path, &err, NULL), -EEXIST);
	CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "is a regular file, not a socket: "
	                                                   "refusing to replace it"),
	          "%s", err.msg);
	CHECK_MSG(file_has(path, "precious"), "the regular file was removed or changed");
	unlink(path);

	/* a symbolic link, to a regular file and dangling */
	write_file(target, "precious too");
	CHECK(symlink(target, path) == 0);
	CHECK_EQ_INT(start_on(path, &err, NULL), -EEXIST);
	CHECK_MSG(strstr(err.msg, "is a symbolic link, not a socket"), "%s", err.msg);
	CHECK(lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
	CHECK(file_has(target, "precious too"));
	unlink(target);
	CHECK_EQ_INT(start_on(path, &err, NULL), -EEXIST);
	CHECK(lstat(path, &st) == 0 && S_ISLNK(st.st_mode));
	unlink(path);

	/* a FIFO and a directory */
	CHECK(mkfifo(path, 0600) == 0);
	CHECK_EQ_INT(start_on(path, &err, NULL), -EEXIST);
	CHECK_MSG(strstr(err.msg, "is a FIFO"), "%s", err.msg);
	CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode));
	unlink(path);
	CHECK(mkdir(path, 0700) == 0);
	CHECK_EQ_INT(start_on(path, &err, NULL), -EEXIST);
	CHECK(lstat(path, &st) == 0 && S_ISDIR(st.st_mode));
	rmdir(path);

	/* a stale socket: bound, then its owner gone */
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = sun_of(path);
	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	close(fd);
	CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
	ipc_server *srv = NULL;
	CHECK_MSG(start_on(path, &err, &srv) == 0, "stale socket: %s", err.msg);
	char url[300];
	snprintf(url, sizeof(url), "ipc://%s", path);
	if (srv)
		CHECK(served(url, 2000));
	ipc_server_free(srv);
	CHECK(lstat(path, &st) != 0); /* removed on close, as before */
}

/* Probes are answered by the server (never the handler), are not counted as
 * requests, keep selfcheck_ok_ns fresh, and reach tcp:// listeners on a
 * wildcard address and a port chosen by the kernel. */
static void test_selfcheck_counts(void)
{
	struct tsrv *t = tsrv_start("counts", 50, 1000, "tcp://0.0.0.0:0", NULL);
	if (!t)
		return;
	uint64_t t0 = cm_now_ns();
	CHECK(stats(t).selfcheck_ok_ns > 0 && stats(t).selfcheck_ok_ns <= t0);
	for (int i = 0; i < 100 && stats(t).selfchecks < 8; i++)
		usleep(20000);
	struct ipc_server_stats st = stats(t);
	CHECK(st.selfchecks >= 8);
	CHECK_EQ_INT(st.selfcheck_failures, 0);
	CHECK_EQ_INT(st.listener_recoveries, 0);
	CHECK(st.selfcheck_ok_ns > t0);
	CHECK_EQ_INT(st.received, 0);
	CHECK_EQ_INT(st.replies, 0);
	CHECK_EQ_INT(atomic_load(&t->handled), 0);
	CHECK(served(t->url, 2000));
	st = stats(t);
	CHECK_EQ_INT(st.received, 1);
	CHECK_EQ_INT(atomic_load(&t->handled), 1);
	CHECK_EQ_INT(events_with(t, LOG_WARNING) + events_with(t, LOG_ERR), 0);
	tsrv_stop(t);

	/* a message limit the probe does not fit in is refused */
	const char *u[] = {"ipc:///tmp/never-bound.sock"};
	struct ipc_server_params tiny = {.urls = u, .n_urls = 1, .selfcheck_ms = 100};
	tiny.limits.max_msg_bytes = 64;
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	CHECK_EQ_INT(ipc_server_new(&tiny, handler, NULL, &srv, &err), -EINVAL);
	CHECK_MSG(strstr(err.msg, "max_msg_bytes") != NULL, "%s", err.msg);

	/* off: no thread, no time */
	t = tsrv_start("counts-off", 0, 0, NULL, NULL);
	if (!t)
		return;
	usleep(100000);
	st = stats(t);
	CHECK_EQ_INT(st.selfcheck_ok_ns, 0);
	CHECK_EQ_INT(st.selfchecks, 0);
	tsrv_stop(t);
}

/* The socket file removed (a tmp cleaner): the listener is re-created and
 * the file with it. Another file put in its place is left alone: nng's
 * close would unlink whatever is at the path. */
static void test_socket_file_replaced(void)
{
	struct tsrv *t = tsrv_start("gone", 50, 300, NULL, NULL);
	if (!t)
		return;
	CHECK(unlink(t->path) == 0);
	CHECK_MSG(ms_until_served(t->url, 10000) >= 0, "not served 10 s after the unlink");
	struct stat st;
	CHECK(stat(t->path, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0660);
	CHECK(stats(t).listener_recoveries >= 1);
	CHECK(events_contain(t, "its socket file is gone"));

	CHECK(unlink(t->path) == 0);
	write_file(t->path, "someone else's");
	uint64_t f0 = stats(t).selfcheck_failures;
	for (int i = 0; i < 200 && !events_contain(t, "no longer this server's"); i++)
		usleep(20000);
	CHECK(events_contain(t, "no longer this server's socket file"));
	CHECK(events_with(t, LOG_ERR) == 1); /* once, though retried */
	int warned = events_with(t, LOG_WARNING);
	usleep(300000);
	CHECK(events_with(t, LOG_ERR) == 1);
	CHECK_EQ_INT(events_with(t, LOG_WARNING), warned);
	CHECK(stats(t).selfcheck_failures > f0);
	CHECK(file_has(t->path, "someone else's"));
	unlink(t->path);
	tsrv_stop(t);
}

struct holder {
	const char *url;
	int rc;
};

static void *hold_thread(void *arg)
{
	struct holder *h = arg;
	edgelm_client *c = NULL;
	struct edgelm_error e;
	h->rc = edgelm_connect(h->url, &c, &e);
	if (h->rc == 0) {
		struct edgelm_result res;
		h->rc = edgelm_generate(c, "hold", NULL, &res, &e);
		edgelm_result_free(&res);
	}
	edgelm_close(c);
	return NULL;
}

/* With every context held by the handler, nng keeps a probe waiting: that is
 * no failure (no recovery, which would drop the clients), but no pass either. */
static void test_selfcheck_saturated(void)
{
	struct ipc_server_params base = {.n_contexts = 2, .max_contexts = 2};
	struct tsrv *t = tsrv_start("busy", 50, 200, NULL, &base);
	if (!t)
		return;
	struct holder h[2] = {{.url = t->url}, {.url = t->url}};
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, hold_thread, &h[i]);
	for (int i = 0; i < 200; i++) {
		pthread_mutex_lock(&t->mu);
		int n = t->n_held;
		pthread_mutex_unlock(&t->mu);
		if (n == 2)
			break;
		usleep(10000);
	}
	usleep(300000);
	uint64_t ok0 = stats(t).selfcheck_ok_ns;
	usleep(1000000);
	struct ipc_server_stats st = stats(t);
	CHECK_EQ_INT(st.selfcheck_failures, 0);
	CHECK_EQ_INT(st.listener_recoveries, 0);
	CHECK_EQ_INT(st.selfcheck_ok_ns, ok0);
	release(t);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ_INT(h[i].rc, EDGELM_E_SHUTTING_DOWN);
	}
	for (int i = 0; i < 100 && stats(t).selfcheck_ok_ns == ok0; i++)
		usleep(20000);
	CHECK(stats(t).selfcheck_ok_ns > ok0);
	tsrv_stop(t);
}

/* The socket path is a copy: test_stop_during_selfcheck frees the server,
 * path included, while the poker still runs (ASan caught the read of the
 * freed path once in CI-like load). */
struct poker {
	char path[256];
	atomic_bool quit;
};

static void *poke_thread(void *arg)
{
	struct poker *p = arg;
	while (!atomic_load(&p->quit)) {
		poke(p->path, POKE_CLOSE);
		usleep(3000);
	}
	return NULL;
}

/* Stopping is prompt and clean whatever the self-check is doing: waiting for
 * a reply from a wedged listener (the wait is cancelled), or re-creating a
 * listener while connections come and go. */
static void test_stop_during_selfcheck(void)
{
	/* a probe in flight on a wedged listener, with a 5 s timeout */
	struct tsrv *t = tsrv_start("stop-wait", 50, 5000, NULL, NULL);
	if (t) {
		for (int i = 0; i < 7 && served(t->url, 300); i++)
			poke(t->path, POKE_CLOSE);
		usleep(200000);
		uint64_t t0 = cm_now_ns();
		tsrv_stop(t);
		double s = (double)(cm_now_ns() - t0) / 1e9;
		CHECK_MSG(s < 2, "stop took %.2f s", s);
	}
	/* stops at random points of a storm of pokes and recoveries */
	for (int i = 0; i < 20; i++) {
		char name[32];
		snprintf(name, sizeof(name), "stop-%d", i);
		t = tsrv_start(name, 10, 100, NULL, NULL);
		if (!t)
			return;
		struct poker pk = {.quit = false};
		snprintf(pk.path, sizeof(pk.path), "%s", t->path);
		pthread_t th;
		pthread_create(&th, NULL, poke_thread, &pk);
		usleep((useconds_t)(50000 + (i * 37 % 10) * 30000));
		uint64_t t0 = cm_now_ns();
		tsrv_stop(t);
		double s = (double)(cm_now_ns() - t0) / 1e9;
		CHECK_MSG(s < 2, "stop %d took %.2f s", i, s);
		atomic_store(&pk.quit, true);
		pthread_join(th, NULL);
	}
}

/* Pokes faster than the self-check wedge each new listener at once: every
 * wedge is undone by re-creating the listener, after two failed round
 * trips, however often it comes back (no back-off for a wedge); once the
 * pokes stop, it serves. */
static int open_fds(void)
{
	int n = 0;
	for (int fd = 0; fd < 4096; fd++)
		n += fcntl(fd, F_GETFD) != -1;
	return n;
}

static void test_wedge_storm(void)
{
	struct tsrv *t = tsrv_start("storm", 20, 100, NULL, NULL);
	if (!t)
		return;
	int fds0 = open_fds();
	struct poker pk = {.quit = false};
	snprintf(pk.path, sizeof(pk.path), "%s", t->path);
	pthread_t th;
	pthread_create(&th, NULL, poke_thread, &pk);
	usleep(3000000);
	atomic_store(&pk.quit, true);
	pthread_join(th, NULL);
	struct ipc_server_stats st = stats(t);
	int fds = open_fds();
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  storm: %llu failures, %llu recoveries, %d more fds\n",
		        (unsigned long long)st.selfcheck_failures,
		        (unsigned long long)st.listener_recoveries, fds - fds0);
	CHECK(st.listener_recoveries >= 4);
	CHECK(st.listener_recoveries * 2 <= st.selfcheck_failures);
	/* nng keeps a closed wedged listener's socket and the connections it
	 * parked (about two a wedge here): no more than that */
	CHECK_MSG(fds - fds0 <= 3 * (int)st.listener_recoveries + 6,
	          "%d more fds after %llu recoveries", fds - fds0,
	          (unsigned long long)st.listener_recoveries);
	CHECK_MSG(ms_until_served(t->url, 10000) >= 0, "still wedged 10 s after the storm");
	tsrv_stop(t);
}

struct unlinker {
	const char *path;
	atomic_bool quit;
};

static void *unlink_thread(void *arg)
{
	struct unlinker *u = arg;
	while (!atomic_load(&u->quit)) {
		unlink(u->path);
		usleep(2000);
	}
	return NULL;
}

/* A failure that re-creating the listener does not cure (a cleaner that
 * keeps removing the socket file): each re-creation drops the listener's
 * clients, so they come further apart; once it stops, the file is back.
 * Without the back-off there would be one for every two failures. */
static void test_unlink_storm_backoff(void)
{
	struct tsrv *t = tsrv_start("unlinked", 20, 100, NULL, NULL);
	if (!t)
		return;
	struct unlinker u = {.path = t->path};
	pthread_t th;
	pthread_create(&th, NULL, unlink_thread, &u);
	usleep(3000000);
	atomic_store(&u.quit, true);
	pthread_join(th, NULL);
	struct ipc_server_stats st = stats(t);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  unlinks: %llu failures, %llu recoveries\n",
		        (unsigned long long)st.selfcheck_failures,
		        (unsigned long long)st.listener_recoveries);
	CHECK(st.listener_recoveries >= 2);
	CHECK_MSG(st.listener_recoveries * 4 <= st.selfcheck_failures,
	          "%llu recoveries for %llu failures", (unsigned long long)st.listener_recoveries,
	          (unsigned long long)st.selfcheck_failures);
	CHECK_MSG(ms_until_served(t->url, 10000) >= 0, "not served 10 s after the unlinks");
	struct stat sb;
	CHECK(stat(t->path, &sb) == 0 && S_ISSOCK(sb.st_mode));
	tsrv_stop(t);
}

/* `test_ipc_wedge --as-child MiB`: a fresh process (nng not started) that
 * allows itself MiB more address space than it has, then opens and starts a
 * server. Exit 0: it served, or failed cleanly saying why. A crash or a hang
 * (ended by alarm) is what nng 1.5.2 does by itself. */
static int as_child(const char *arg)
{
	alarm(20);
	long extra = atol(arg);
	long vm_kib = 0;
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof(line), f))
		if (strncmp(line, "VmSize:", 7) == 0)
			vm_kib = atol(line + 7);
	if (f)
		fclose(f);
	struct rlimit rl;
	rl.rlim_cur = rl.rlim_max = ((rlim_t)vm_kib << 10) + ((rlim_t)extra << 20);
	if (setrlimit(RLIMIT_AS, &rl) != 0) {
		printf("setrlimit: %s\n", strerror(errno));
		return 2;
	}
	char path[256], url[300];
	snprintf(path, sizeof(path), "%s/wedge-as-%d.sock", test_tmpdir(), (int)getpid());
	snprintf(url, sizeof(url), "ipc://%s", path);
	const char *u[] = {url};
	struct ipc_server_params p = {.urls = u, .n_urls = 1};
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	int rc = ipc_server_new(&p, handler, NULL, &srv, &err);
	if (rc == 0)
		rc = ipc_server_start(srv, &err);
	ipc_server_free(srv);
	if (rc == 0) {
		printf("+%ld MiB: served\n", extra);
		return 0;
	}
	printf("+%ld MiB: %d: %s\n", extra, rc, err.msg);
	if ((rc == -ENOMEM || rc == -EAGAIN) && strstr(err.msg, "nng cannot start") &&
	    strstr(err.msg, "LimitAS="))
		return 0;
	return 3;
}

/* Address space from nothing to more than nng's threads need, in 20 steps,
 * each in a new process: a clean error or a server, never a crash or a
 * hang. */
static void test_rlimit_as(void)
{
#ifdef TEST_ASAN
	TEST_SKIP("ASan reserves terabytes of shadow memory: no RLIMIT_AS test");
	return;
#else
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	if (ncpu < 1)
		ncpu = 1;
	long threads = 7 + CM_MIN(2 * ncpu, 16) + CM_MIN(ncpu, 256);
	size_t stack = 8u << 20;
	pthread_attr_t a;
	if (pthread_getattr_default_np(&a) == 0) {
		pthread_attr_getstacksize(&a, &stack);
		pthread_attr_destroy(&a);
	}
	long top = (long)((size_t)threads * (stack + 4096) >> 20) + 64;
	char self[4096], cmd[8192];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sl > 0);
	self[sl > 0 ? sl : 0] = '\0';
	int clean = 0, ok = 0;
	for (int i = 0; i <= 20; i++) {
		long extra = top * i / 20;
		char *out = NULL;
		snprintf(cmd, sizeof(cmd), "'%s' --as-child %ld 2>&1", self, extra);
		int rc = test_run_capture(cmd, &out);
		CHECK_MSG(rc == 0, "+%ld MiB of address space: exit %d (%s): %s", extra, rc,
		          rc < 0 ? "killed: crashed, or hung until alarm()" : "wrong error",
		          out ? out : "");
		if (rc == 0 && strstr(out, "served"))
			ok++;
		else if (rc == 0)
			clean++;
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "  %s", out ? out : "\n");
		free(out);
	}
	CHECK(clean > 0); /* the range covered the failure ... */
	CHECK(ok > 0);    /* ... and enough to serve */
#endif
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--second-server") == 0)
		return second_server(argv[2]);
	if (argc == 3 && strcmp(argv[1], "--as-child") == 0)
		return as_child(argv[2]);
	TEST_RUN(test_rlimit_as); /* first: its children exec afresh anyway */
	TEST_RUN(test_path_not_socket);
	TEST_RUN(test_selfcheck_counts);
	TEST_RUN(test_connection_held);
	TEST_RUN(test_wedge_short_connections);
	TEST_RUN(test_wedge_established_client);
	TEST_RUN(test_second_server);
	TEST_RUN(test_second_server_old_probe);
	TEST_RUN(test_socket_file_replaced);
	TEST_RUN(test_selfcheck_saturated);
	TEST_RUN(test_stop_during_selfcheck);
	TEST_RUN(test_wedge_storm);
	TEST_RUN(test_unlink_storm_backoff);
	TEST_RUN(test_wedge_recovery_time);
	return test_finish();
}
