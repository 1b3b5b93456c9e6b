/* tests/unit/test_monitor_top.c: the `edgelmctl top` frame renderer and its
 * interactive loop (driven through a pipe and a file, not a terminal). */
#include "monitor/monitor_impl.h"
#include "tests/test.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *live_json(void)
{
	monitor *m = NULL;
	CHECK_OK(monitor_new(NULL, &m, NULL));
	if (!m)
		return NULL;
	const struct monitor_inference *inf = monitor_inference_get(m);
	CHECK_OK(monitor_sample(m, 0, NULL));
	monitor_gauge_set(inf->running, 2);
	monitor_gauge_set(inf->queued, 1);
	monitor_gauge_set(inf->kv_capacity, 1000);
	monitor_gauge_set(inf->kv_used, 450);
	monitor_gauge_set(inf->peak_bandwidth, 1e10);
	monitor_counter_add(inf->generation_tokens, 40);
	monitor_counter_add(inf->decode_seconds, 2);
	monitor_counter_add(inf->weight_bytes, 1.6e10);
	const char *v[] = {"generate", "ok"};
	monitor_series *r;
	CHECK_OK(monitor_series_get(inf->requests, v, &r, NULL));
	monitor_counter_add(r, 5);
	usleep(50000);
	CHECK_OK(monitor_sample(m, 0, NULL));
	char *j = NULL;
	CHECK_OK(monitor_json_render(m, &j, NULL, NULL));
	monitor_free(m);
	return j;
}

static int max_line(const char *s)
{
	int best = 0, cur = 0;
	for (; *s; s++) {
		if (*s == '\n') {
			best = CM_MAX(best, cur);
			cur = 0;
		} else {
			cur++;
		}
	}
	return CM_MAX(best, cur);
}

static void test_render_live_frame(void)
{
	char *j = live_json();
	if (!j)
		return;
	static char buf[16384];
	struct cm_err e = {0};
	CHECK_OK(monitor_top_render(j, 80, buf, sizeof(buf), &e));
	CHECK(strstr(buf, "edgelm top") == buf);
	CHECK(strstr(buf, "\ncpu0  [") != NULL);
	CHECK(strstr(buf, "\nmem   [") != NULL);
	CHECK(strstr(buf, "\nswap  [") != NULL);
	CHECK(strstr(buf, "\npsi   ") != NULL);
	CHECK(strstr(buf, "decode 20.0") != NULL);
	CHECK(strstr(buf, "(80% of peak)") != NULL);
	CHECK(strstr(buf, "queue running 2  queued 1  kv 45%  requests 5") != NULL);
	CHECK(strstr(buf, "\nflags none\n") != NULL);
	CHECK_MSG(max_line(buf) <= 80, "line of %d columns", max_line(buf));
	CHECK_OK(monitor_top_render(j, 150, buf, sizeof(buf), &e));
	CHECK(max_line(buf) <= 150 && max_line(buf) > 100); /* bars use the width */
	/* a small buffer: cut, still terminated */
	char small[64];
	CHECK_OK(monitor_top_render(j, 80, small, sizeof(small), &e));
	CHECK(strlen(small) < sizeof(small));
	cm_free(j);
	if (getenv("TEST_VERBOSE")) {
		j = live_json();
		monitor_top_render(j, 100, buf, sizeof(buf), &e);
		fputs(buf, stderr);
		cm_free(j);
	}
}

static void test_render_flags_and_errors(void)
{
	const char *j =
	    "{\"version\":1,\"time_unix\":0,\"uptime_seconds\":3725,\"interval_seconds\":1,"
	    "\"last_error\":\"monitor: /proc/pressure/io: unexpected format\","
	    "\"flags\":{\"compute_bound\":{\"on\":false,\"reason\":\"\"},"
	    "\"cpu_contention\":{\"on\":true,\"reason\":\"steal 15% >= 5%\"},"
	    "\"swapping\":{\"on\":true,\"reason\":\"swap-in 4000 KiB/s during inference\"}},"
	    "\"metrics\":{\"edgelm_cpu_busy_ratio\":{\"type\":\"gauge\",\"series\":["
	    "{\"labels\":{\"cpu\":\"0\"},\"value\":0.5},{\"labels\":{\"cpu\":\"1\"},\"value\":1}]}}"
	    "}";
	static char buf[8192];
	struct cm_err e = {0};
	CHECK_OK(monitor_top_render(j, 60, buf, sizeof(buf), &e));
	CHECK(strstr(buf, "up 1h02m") != NULL);
	CHECK(strstr(buf, "\nflags cpu_contention: steal 15% >= 5%\n") != NULL);
	CHECK(strstr(buf, "\n      swapping: swap-in 4000 KiB/s") != NULL);
	CHECK(strstr(buf, "  50%\n") != NULL);
	CHECK(strstr(buf, " 100%\n") != NULL);
	CHECK(strstr(buf, "psi   not available") != NULL);
	CHECK(strstr(buf, "note  monitor: /proc/pressure/io") != NULL);
	CHECK(max_line(buf) <= 60);
	CHECK_EQ_INT(monitor_top_render("{nope", 80, buf, sizeof(buf), &e), -EPROTO);
	CHECK(strstr(e.msg, "bad metrics JSON") != NULL);
	CHECK_EQ_INT(monitor_top_render("{\"flags\":{}}", 80, buf, sizeof(buf), &e), -EPROTO);
	CHECK_EQ_INT(monitor_top_render(NULL, 80, buf, sizeof(buf), &e), -EPROTO);
	CHECK_EQ_INT(monitor_top_render(j, 80, buf, 0, &e), -EINVAL);
}

/* ---- the loop ----------------------------------------------------------------------- */

struct fetcher {
	int calls;
	int fail_first;
	const char *json;
};

static int fetch(void *ud, char **ret, struct cm_err *err)
{
	struct fetcher *f = ud;
	f->calls++;
	if (f->calls <= f->fail_first)
		return cm_err_set(err, -ECONNREFUSED, "ipc: connection refused");
	*ret = cm_strdup(f->json);
	return *ret ? 0 : -ENOMEM;
}

struct keys {
	int fd;
	int delay_ms;
	char key; /* 0: close the pipe (EOF) */
};

static void *press(void *arg)
{
	struct keys *k = arg;
	usleep((useconds_t)k->delay_ms * 1000);
	if (k->key) {
		ssize_t n = write(k->fd, "x", 1); /* ignored key */
		n += write(k->fd, &k->key, 1);
		(void)n;
	} else {
		close(k->fd);
	}
	return NULL;
}

static void run_loop(char key, int fail_first, int *ret_calls, char *out, size_t cap)
{
	char *j = live_json();
	int p[2];
	char path[4096];
	snprintf(path, sizeof(path), "%s/edgelm-top-%d.txt", test_tmpdir(), (int)getpid());
	FILE *of = fopen(path, "w+");
	CHECK(j && of && pipe(p) == 0);
	if (!j || !of) {
		cm_free(j);
		if (of)
			fclose(of);
		return;
	}
	struct fetcher f = {.fail_first = fail_first, .json = j};
	struct keys k = {.fd = p[1], .delay_ms = 160, .key = key};
	pthread_t th;
	pthread_create(&th, NULL, press, &k);
	uint64_t t0 = cm_now_ns();
	struct cm_err e = {0};
	CHECK_OK(monitor_top_run(fetch, &f, 50, p[0], fileno(of), &e));
	double dt = (double)(cm_now_ns() - t0) / 1e9;
	pthread_join(th, NULL);
	CHECK_MSG(dt < 1.0, "took %.2f s to quit", dt);
	*ret_calls = f.calls;
	fflush(of);
	rewind(of);
	size_t n = fread(out, 1, cap - 1, of);
	out[n] = '\0';
	fclose(of);
	unlink(path);
	close(p[0]);
	if (key)
		close(p[1]);
	cm_free(j);
}

static void test_loop_quits_on_q_ctrl_c_and_eof(void)
{
	static char out[1 << 20];
	int calls = 0;
	run_loop('q', 0, &calls, out, sizeof(out));
	CHECK_MSG(calls >= 2 && calls <= 6, "%d frames in 160 ms at 50 ms", calls);
	CHECK(strstr(out, "edgelm top") != NULL);
	CHECK(strstr(out, "\033[") == NULL);      /* not a terminal: no escape sequences */
	run_loop(3, 0, &calls, out, sizeof(out)); /* Ctrl-C in raw mode */
	CHECK(calls >= 2);
	run_loop(0, 0, &calls, out, sizeof(out)); /* EOF */
	CHECK(calls >= 2);
	run_loop('Q', 2, &calls, out, sizeof(out)); /* the daemon is down, then back */
	CHECK(strstr(out, "edgelm top: ipc: connection refused") != NULL);
	CHECK(strstr(out, "\ncpu0  [") != NULL);
}

static void *send_sigint(void *arg)
{
	(void)arg;
	usleep(150000);
	kill(getpid(), SIGINT);
	return NULL;
}

static void test_loop_quits_on_sigint_and_restores_handler(void)
{
	struct sigaction before, after;
	sigaction(SIGINT, NULL, &before);
	int p[2];
	CHECK(pipe(p) == 0);
	FILE *of = fopen("/dev/null", "w");
	struct fetcher f = {.json = "{\"flags\":{},\"metrics\":{}}"};
	pthread_t th;
	pthread_create(&th, NULL, send_sigint, NULL);
	CHECK_OK(monitor_top_run(fetch, &f, 1000, p[0], fileno(of), NULL));
	pthread_join(th, NULL);
	sigaction(SIGINT, NULL, &after);
	CHECK(before.sa_handler == after.sa_handler);
	fclose(of);
	close(p[0]);
	close(p[1]);
	CHECK_EQ_INT(monitor_top_run(NULL, NULL, 0, 0, 1, NULL), -EINVAL);
}

int main(void)
{
	TEST_RUN(test_render_live_frame);
	TEST_RUN(test_render_flags_and_errors);
	TEST_RUN(test_loop_quits_on_q_ctrl_c_and_eof);
	TEST_RUN(test_loop_quits_on_sigint_and_restores_handler);
	return test_finish();
}
