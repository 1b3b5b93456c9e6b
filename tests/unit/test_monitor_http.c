/* tests/unit/test_monitor_http.c: /metrics over HTTP on 127.0.0.1, and
 * `promtool check metrics` on scrapes taken while the registry is busy. */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
	TEST_RUN(test_promtool_on_scrapes_under_load);
	return test_finish();
}
