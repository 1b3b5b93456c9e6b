/* tests/unit/test_monitor_http.c: /metrics over HTTP on 127.0.0.1, scrapes
 * while hundreds of slow clients hold connections, and `promtool check
 * metrics` on scrapes taken while the registry is busy. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

struct http_reply {
	int status;
	char headers[2048];
	char *body; /* malloc'ed */
	size_t body_len;
};

static int http_request(int port, const char *method, const char *path, struct http_reply *r)
{
	memset(r, 0, sizeof(*r));
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	char req[512];
	int n =
	    snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (len + 1 >= cap)
			buf = realloc(buf, cap *= 2);
		ssize_t k = read(fd, buf + len, cap - 1 - len);
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	close(fd);
	buf[len] = '\0';
	char *sep = strstr(buf, "\r\n\r\n");
	if (sscanf(buf, "HTTP/1.%*d %d", &r->status) != 1 || !sep) {
		free(buf);
		return -1;
	}
	snprintf(r->headers, sizeof(r->headers), "%.*s", (int)(sep - buf), buf);
	r->body_len = len - (size_t)(sep + 4 - buf);
	r->body = malloc(r->body_len + 1);
	memcpy(r->body, sep + 4, r->body_len + 1);
	free(buf);
	return 0;
}

static monitor *new_monitor(unsigned interval_ms)
{
	struct monitor_params p;
	monitor_params_default(&p);
	p.interval_ms = interval_ms;
	monitor *m = NULL;
	struct cm_err e = {0};
	int rc = monitor_new(&p, &m, &e);
	CHECK_MSG(rc == 0, "monitor_new: %s", e.msg);
	return m;
}

static void test_http_metrics_and_404(void)
{
	monitor *m = new_monitor(0);
	if (!m)
		return;
	struct cm_err e = {0};
	int rc = monitor_http_start(m, "127.0.0.1:0", &e);
	CHECK_MSG(rc == 0, "http: %s", e.msg);
	int port = monitor_http_port(m);
	CHECK(port > 0);
	CHECK_OK(monitor_sample(m, 0, NULL));
	struct http_reply r;
	CHECK_OK(http_request(port, "GET", "/metrics", &r));
	CHECK_EQ_INT(r.status, 200);
	CHECK_MSG(strstr(r.headers, "Content-Type: text/plain; version=0.0.4; charset=utf-8"),
	          "headers: %s", r.headers);
	CHECK(r.body && strstr(r.body, "# TYPE edgelm_monitor_samples_total counter\n"));
	CHECK(r.body && strstr(r.body, "\nedgelm_monitor_samples_total 1\n"));
	free(r.body);
	CHECK_OK(http_request(port, "GET", "/", &r));
	CHECK_EQ_INT(r.status, 404);
	free(r.body);
	CHECK_OK(http_request(port, "GET", "/metrics/x", &r));
	CHECK_EQ_INT(r.status, 404);
	free(r.body);
	CHECK_OK(http_request(port, "POST", "/metrics", &r));
	CHECK_EQ_INT(r.status, 405);
	CHECK(strstr(r.headers, "Allow: GET, HEAD") != NULL);
	free(r.body);

	/* one server per monitor; the port is taken */
	CHECK_EQ_INT(monitor_http_start(m, "127.0.0.1:0", &e), -EALREADY);
	monitor *m2 = new_monitor(0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	if (m2) {
		CHECK(monitor_http_start(m2, addr, &e) < 0);
		CHECK(strstr(e.msg, "cannot listen") != NULL);
		monitor_free(m2);
	}
	monitor_http_stop(m);
	CHECK_EQ_INT(monitor_http_port(m), 0);
	CHECK(http_request(port, "GET", "/metrics", &r) < 0); /* closed */
	monitor_free(m);
}

static void test_http_listen_strings(void)
{
	monitor *m = new_monitor(0);
	if (!m)
		return;
	struct cm_err e = {0};
	CHECK_OK(monitor_http_start(m, NULL, &e));
	CHECK_OK(monitor_http_start(m, "", &e));
	CHECK_OK(monitor_http_start(m, "off", &e));
	CHECK_EQ_INT(monitor_http_port(m), 0);
	static const char *const bad[] = {
	    "nonsense",      "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999",
	    "127.0.0.1:80x", "[::1]",     "[::1:0",     "example.com:80"};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		CHECK_MSG(monitor_http_start(m, bad[i], &e) == -EINVAL, "%s accepted", bad[i]);
		CHECK(strstr(e.msg, "bad listen address") != NULL);
	}
	CHECK_OK(monitor_http_start(m, "localhost:0", &e));
	CHECK(monitor_http_port(m) > 0);
	monitor_http_stop(m);
	if (monitor_http_start(m, "[::1]:0", &e) == 0) {
		CHECK(monitor_http_port(m) > 0);
		monitor_http_stop(m);
	}                /* else: no IPv6 loopback on this box */
	monitor_free(m); /* also stops a running server */
}

/* ---- slow clients ---------------------------------------------------------- */

/* A TCP connection to 127.0.0.1:port from `src` (NULL: 127.0.0.1); -1 on
 * failure. Connecting waits 5 s at most. */
static int tcp_connect(int port, const char *src)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct timeval tv = {.tv_sec = 5};
	(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (src) {
		struct sockaddr_in la = {.sin_family = AF_INET};
		if (inet_pton(AF_INET, src, &la.sin_addr) != 1 ||
		    bind(fd, (struct sockaddr *)&la, sizeof(la)) < 0) {
			close(fd);
			return -1;
		}
	}
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int64_t now_ms(void)
{
	return (int64_t)(cm_now_ns() / 1000000);
}

/* Read until the server closes `fd` or timeout_ms pass: true when it closed
 * (EOF or reset). Looks at least once, also with timeout_ms 0. */
static bool wait_closed(int fd, int timeout_ms)
{
	int64_t end = now_ms() + timeout_ms;
	for (;;) {
		int64_t left = end - now_ms();
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, left > 0 ? (int)left : 0) > 0) {
			char buf[4096];
			ssize_t k = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
				return true;
		}
		if (left <= 0)
			return false;
	}
}

/* GET /metrics on a new connection from 127.0.0.1; the status, or -1 when
 * no whole reply came within timeout_ms. */
static int scrape_within(int port, int timeout_ms)
{
	int fd = tcp_connect(port, NULL);
	if (fd < 0)
		return -1;
	static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	int status = -1;
	if (write(fd, req, sizeof(req) - 1) == (ssize_t)(sizeof(req) - 1)) {
		char head[64] = "";
		size_t n = 0;
		int64_t end = now_ms() + timeout_ms;
		for (;;) {
			int64_t left = end - now_ms();
			struct pollfd p = {.fd = fd, .events = POLLIN};
			if (left <= 0 || poll(&p, 1, (int)left) < 0)
				break;
			if (p.revents == 0)
				continue;
			char buf[65536];
			ssize_t k = recv(fd, buf, sizeof(buf), 0);
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0) { /* whole reply read (HTTP/1.0: closed at the end) */
				if (k == 0 && sscanf(head, "HTTP/1.%*d %d", &status) != 1)
					status = -1;
				break;
			}
			if (n + 1 < sizeof(head)) {
				size_t c = CM_MIN((size_t)k, sizeof(head) - 1 - n);
				memcpy(head + n, buf, c);
				n += c;
				head[n] = '\0';
			}
		}
	}
	close(fd);
	return status;
}

/* Whether `fd` is still open from the server's side right now. */
static bool still_open(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 0) == 0;
}

#define N_IDLE 32
#define N_SLOW 300
#define N_BYSTANDER 2

/* Clients that connect and send nothing, or half a request, must not lock
 * Prometheus out (before: 32 of them held every connection until the 10 s
 * timeout). All come from 127.0.0.2 when this box lets a socket bind it (any
 * 127/8 address is loopback on Linux), so that two idle connections of
 * another peer, 127.0.0.3, show that one peer pushes out only its own; else
 * from 127.0.0.1 like the scrapes. The idle connections left are closed by
 * the server's timeout. */
static void test_http_slow_clients(void)
{
	monitor *m = new_monitor(0);
	if (!m)
		return;
	struct cm_err e = {0};
	CHECK_OK(monitor_http_start(m, "127.0.0.1:0", &e));
	int port = monitor_http_port(m);
	int probe = tcp_connect(port, "127.0.0.2");
	bool alt = probe >= 0;
	if (probe >= 0)
		close(probe);
	const char *atk = alt ? "127.0.0.2" : NULL;

	int by[N_BYSTANDER];
	for (int i = 0; i < N_BYSTANDER; i++) {
		by[i] = tcp_connect(port, alt ? "127.0.0.3" : NULL);
		CHECK(by[i] >= 0);
	}
	int64_t t0 = now_ms();

	int fds[N_IDLE + N_SLOW];
	for (int i = 0; i < N_IDLE; i++) {
		fds[i] = tcp_connect(port, atk);
		CHECK(fds[i] >= 0);
	}
	usleep(200000); /* let the server take them in */
	CHECK_EQ_INT(scrape_within(port, 3000), 200);

	static const char part[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
	for (int i = N_IDLE; i < N_IDLE + N_SLOW; i++) {
		fds[i] = tcp_connect(port, atk);
		CHECK(fds[i] >= 0);
		if (fds[i] >= 0)
			CHECK(write(fds[i], part, sizeof(part) - 1) == (ssize_t)(sizeof(part) - 1));
	}
	CHECK_EQ_INT(scrape_within(port, 3000), 200);

	/* the longest-waiting were pushed out: all but a few dozen closed */
	int closed = 0;
	for (int64_t end = now_ms() + 5000; closed < N_IDLE + N_SLOW - 64 && now_ms() < end;) {
		for (int i = 0; i < N_IDLE + N_SLOW; i++) {
			if (fds[i] >= 0 && wait_closed(fds[i], 0)) {
				close(fds[i]);
				fds[i] = -1;
				closed++;
			}
		}
		usleep(50000);
	}
	CHECK_MSG(closed >= N_IDLE + N_SLOW - 64, "%d of %d slow connections closed", closed,
	          N_IDLE + N_SLOW);
	/* a header byte from each of the rest keeps none of them safe */
	for (int i = 0; i < N_IDLE + N_SLOW; i++)
		if (fds[i] >= 0)
			(void)send(fds[i], "x", 1, MSG_NOSIGNAL);
	for (int i = 0; i < 40; i++) {
		int fd = tcp_connect(port, atk);
		if (fd >= 0)
			close(fd);
	}
	CHECK_EQ_INT(scrape_within(port, 3000), 200);
	if (alt)
		for (int i = 0; i < N_BYSTANDER; i++)
			CHECK_MSG(by[i] >= 0 && still_open(by[i]),
			          "another peer's connection %d was pushed out", i);
	for (int i = 0; i < N_IDLE + N_SLOW; i++)
		if (fds[i] >= 0)
			close(fds[i]);

	/* the bystanders (opened at t0, silent since) go at the 10 s timeout */
	for (int i = 0; i < N_BYSTANDER; i++) {
		if (by[i] < 0)
			continue;
		int64_t left = t0 + 20000 - now_ms();
		bool gone = wait_closed(by[i], left > 0 ? (int)left : 0);
		CHECK_MSG(gone, "idle connection %d still open after %lld ms", i,
		          (long long)(now_ms() - t0));
		if (alt)
			CHECK_MSG(now_ms() - t0 >= 8000, "idle connection %d closed after %lld ms",
			          i, (long long)(now_ms() - t0));
		close(by[i]);
	}
	CHECK_EQ_INT(scrape_within(port, 3000), 200);
	monitor_free(m);
}

/* ---- promtool on scrapes under load ----------------------------------------- */

struct load {
	monitor *m;
	atomic_int stop;
};

static void *load_main(void *arg)
{
	struct load *l = arg;
	const struct monitor_inference *inf = monitor_inference_get(l->m);
	static const char *const ops[] = {"generate", "chat", "tokenize", "info"};
	static const char *const outcomes[] = {"ok", "error", "cancelled", "busy"};
	unsigned i = 0;
	while (!atomic_load(&l->stop)) {
		monitor_series *s;
		const char *v[] = {ops[i % 4], outcomes[(i / 4) % 4]};
		if (monitor_series_get(inf->requests, v, &s, NULL) == 0)
			monitor_counter_inc(s);
		monitor_counter_add(inf->generation_tokens, 3);
		monitor_counter_add(inf->decode_seconds, 0.01);
		monitor_counter_add(inf->weight_bytes, 1e8);
		monitor_gauge_set(inf->running, i % 3);
		monitor_histogram_observe(inf->ttft, (i % 50) * 0.05);
		monitor_histogram_observe(inf->tpot, (i % 20) * 0.01);
		monitor_histogram_observe(inf->queue_wait, (i % 9) * 0.003);
		monitor_histogram_observe(inf->duration, (i % 40) * 0.5);
		i++;
	}
	return NULL;
}

static const char *find_promtool(void)
{
	static char buf[4096];
	const char *env = getenv("PROMTOOL");
	if (env && *env)
		return access(env, X_OK) == 0 ? env : NULL;
	const char *path = getenv("PATH");
	if (!path)
		return NULL;
	char copy[4096];
	snprintf(copy, sizeof(copy), "%s", path);
	char *save = NULL;
	for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		snprintf(buf, sizeof(buf), "%s/promtool", d);
		if (access(buf, X_OK) == 0)
			return buf;
	}
	return NULL;
}

static void test_promtool_on_scrapes_under_load(void)
{
	const char *promtool = find_promtool();
	monitor *m = new_monitor(100);
	if (!m)
		return;
	struct cm_err e = {0};
	CHECK_OK(monitor_http_start(m, "127.0.0.1:0", &e));
	CHECK_OK(monitor_start(m, &e));
	monitor_gauge_set(monitor_inference_get(m)->peak_bandwidth, 2e10);
	struct load l = {.m = m};
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, load_main, &l);
	char file[4096];
	snprintf(file, sizeof(file), "%s/edgelm-scrape-%d.prom", test_tmpdir(), (int)getpid());
	for (int k = 0; k < 3; k++) {
		usleep(150000);
		struct http_reply r;
		CHECK_OK(http_request(monitor_http_port(m), "GET", "/metrics", &r));
		CHECK_EQ_INT(r.status, 200);
		if (!r.body)
			continue;
		CHECK(strstr(r.body, "edgelm_requests_total{op=") != NULL);
		CHECK(strstr(r.body, "edgelm_decode_tokens_per_second ") != NULL);
		FILE *f = fopen(file, "w");
		CHECK(f != NULL);
		if (f) {
			fwrite(r.body, 1, r.body_len, f);
			fclose(f);
		}
		free(r.body);
		if (!promtool)
			continue;
		char cmd[12600], out[4200];
		snprintf(out, sizeof(out), "%s.out", file);
		snprintf(cmd, sizeof(cmd), "'%s' check metrics < '%s' > '%s' 2>&1", promtool, file,
		         out);
		int st = system(cmd);
		FILE *o = fopen(out, "r");
		char msg[2048] = "";
		size_t n = o ? fread(msg, 1, sizeof(msg) - 1, o) : 0;
		msg[n] = '\0';
		if (o)
			fclose(o);
		CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0 && n == 0,
		          "promtool check metrics: exit %d: %s", WEXITSTATUS(st), msg);
		unlink(out);
	}
	atomic_store(&l.stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	monitor_stop(m);
	monitor_free(m);
	unlink(file);
	if (!promtool)
		TEST_SKIP("promtool not found: install Debian's prometheus package (or extract "
		          "usr/bin/promtool from it) and put it in PATH or $PROMTOOL");
}

int main(void)
{
	TEST_RUN(test_http_metrics_and_404);
	TEST_RUN(test_http_listen_strings);
	TEST_RUN(test_http_slow_clients);
	TEST_RUN(test_promtool_on_scrapes_under_load);
	return test_finish();
}
