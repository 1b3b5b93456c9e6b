/* tests/load/test_load_serve.c: latency checks of the serving core that
 * depend on the box being quiet, so they are not part of `make check`
 * (`make check-load` runs them; docs/performance.md records the figures).
 *
 * - health's worst latency while 8 clients send 1 MiB tokenize requests
 *   stays under 50 ms (tokenizing runs on the text workers, not on nng's
 *   threads, and health takes no lock the tokenizer holds);
 * - a running stream's inter-token gap does not grow while a 1 MiB prompt
 *   is refused (it is tokenized on a text worker, not on the scheduler). */
#include "common/common.h"
#include "ipc/edgelm.h"
#include "tests/test.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

static char url[4200];
static pid_t daemon_pid = -1;
static atomic_bool flood_on;

static double now_ms(void)
{
	return (double)cm_now_ns() / 1e6;
}

static int start_daemon(const char *model)
{
	snprintf(url, sizeof(url), "ipc://%s/load.sock", test_tmpdir());
	char log[4200];
	snprintf(log, sizeof(log), "%s/edgelmd-load.log", test_tmpdir());
	daemon_pid = fork();
	if (daemon_pid == 0) {
		FILE *f = freopen(log, "w", stderr);
		(void)f;
		execl(test_bin("edgelmd"), "edgelmd", "--config", "/dev/null", "--model", model,
		      "--listen", url, "--metrics-listen", "off", "--set", "tuning=false", "--set",
		      "socket_group=", "--set", "parallel=4", "--set", "ctx_size=512", "--set",
		      "watchdog_stall_ms=5", "--threads", "2", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 300; i++) {
		edgelm_client *c = NULL;
		enum edgelm_health h;
		if (edgelm_connect(url, &c, NULL) == 0) {
			int rc = edgelm_health(c, &h, NULL, NULL);
			edgelm_close(c);
			if (rc == 0 && h == EDGELM_HEALTH_READY)
				return 0;
		}
		usleep(50000);
	}
	return -1;
}

static char *mib_text(void)
{
	size_t n = 1 << 20;
	char *t = malloc(n + 1);
	static const char words[] = "Once upon a time there was a little girl named Lily. ";
	for (size_t i = 0; i < n; i++)
		t[i] = words[i % (sizeof(words) - 1)];
	t[n] = '\0';
	return t;
}

static void *flood(void *arg)
{
	const char *text = arg;
	edgelm_client *c = NULL;
	if (edgelm_connect(url, &c, NULL) != 0)
		return NULL;
	edgelm_set_max_msg(c, 0);
	edgelm_set_timeout(c, 120000);
	while (atomic_load(&flood_on)) {
		int32_t *ids = NULL;
		size_t n = 0;
		/* queue_full is fine: the point is a busy tokenizer */
		if (edgelm_tokenize(c, text, false, false, &ids, &n, NULL) != 0)
			usleep(20000);
		edgelm_free(ids);
	}
	edgelm_close(c);
	return NULL;
}

static void test_load_health_under_tokenize(void)
{
	char *text = mib_text();
	pthread_t th[8];
	atomic_store(&flood_on, true);
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, flood, text);
	usleep(500000);
	edgelm_client *c = NULL;
	CHECK_OK(edgelm_connect(url, &c, NULL));
	double worst = 0, sum = 0;
	int n = 0;
	for (double t_end = now_ms() + 5000; now_ms() < t_end; n++) {
		double t0 = now_ms();
		enum edgelm_health h;
		CHECK_OK(edgelm_health(c, &h, NULL, NULL));
		double dt = now_ms() - t0;
		worst = dt > worst ? dt : worst;
		sum += dt;
		usleep(10000);
	}
	edgelm_close(c);
	atomic_store(&flood_on, false);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	free(text);
	printf("health under 8 x 1 MiB tokenize: %d calls, mean %.2f ms, worst %.2f ms\n", n,
	       sum / n, worst);
	CHECK_MSG(worst < 50, "health's worst latency %.1f ms", worst);
}

struct gaps {
	double last, worst, sum;
	int n;
	double window_from, window_to, worst_in_window;
};

static int on_piece(const char *text, size_t len, void *user)
{
	struct gaps *g = user;
	double t = now_ms();
	if (g->last > 0) {
		double gap = t - g->last;
		g->worst = gap > g->worst ? gap : g->worst;
		g->sum += gap;
		g->n++;
		if (t >= g->window_from && t <= g->window_to + 50)
			g->worst_in_window = gap > g->worst_in_window ? gap : g->worst_in_window;
	}
	g->last = t;
	return 0;
}

struct stream_arg {
	struct gaps g;
	int rc;
};

static void *stream(void *arg)
{
	struct stream_arg *a = arg;
	edgelm_client *c = NULL;
	if (edgelm_connect(url, &c, NULL) != 0)
		return NULL;
	struct edgelm_params p;
	edgelm_params_init(&p);
	p.temperature = 1;
	p.seed = 1;
	p.has_seed = true;
	p.max_tokens = 440;
	p.poll_wait_ms = 1000;
	struct edgelm_result r = {0};
	/* the test hook makes each step of this stream last 5 ms or more, so
	 * it runs for a few seconds, through the refused prompt */
	a->rc = edgelm_generate_stream(c, "__edgelm_test_stall__ Once upon a time", &p, on_piece,
				       &a->g, &r, NULL);
	edgelm_result_free(&r);
	edgelm_close(c);
	return NULL;
}

static void test_load_stream_gap_refused_prompt(void)
{
	char *text = mib_text();
	/* baseline: the worst gap of a stream alone */
	struct stream_arg base = {0};
	stream(&base);
	/* again, with a 1 MiB prompt refused in the middle */
	struct stream_arg run = {0};
	pthread_t th;
	pthread_create(&th, NULL, stream, &run);
	usleep(300000);
	edgelm_client *c = NULL;
	CHECK_OK(edgelm_connect(url, &c, NULL));
	edgelm_set_max_msg(c, 0);
	struct edgelm_params p;
	edgelm_params_init(&p);
	struct edgelm_result r = {0};
	struct edgelm_error e = {0};
	run.g.window_from = now_ms();
	int rc = edgelm_generate(c, text, &p, &r, &e);
	run.g.window_to = now_ms();
	edgelm_result_free(&r);
	edgelm_close(c);
	pthread_join(th, NULL);
	free(text);
	CHECK_MSG(rc == EDGELM_E_PROMPT_TOO_LONG, "1 MiB prompt: %d (%s)", rc, e.message);
	printf("stream alone: %d gaps, worst %.2f ms; with a 1 MiB prompt refused "
	       "(%.0f ms to refuse): worst %.2f ms, in that window %.2f ms\n",
	       base.g.n, base.g.worst, run.g.window_to - run.g.window_from, run.g.worst,
	       run.g.worst_in_window);
	CHECK(run.g.n > 0 && base.g.n > 0);
	CHECK_MSG(run.g.worst_in_window > 0, "the stream did not run through the refusal");
	/* polls bunch tokens: compare worst gaps with some slack for the poll */
	CHECK_MSG(run.g.worst_in_window <= 2 * base.g.worst + 20,
		  "a gap of %.1f ms while the prompt was refused (alone: %.1f ms)",
		  run.g.worst_in_window, base.g.worst);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const char *model = test_data_path("models/stories260K-f32.gguf");
	if (!test_file_exists(model)) {
		test_cur_name = "test_load_serve";
		TEST_SKIP_DATA("stories260K not found under $EDGELM_TESTDATA");
		test_n_skip++;
		return test_finish();
	}
	if (start_daemon(model) != 0) {
		test_cur_name = "start";
		CHECK(!"edgelmd did not start");
		test_n_fail++;
		return test_finish();
	}
	TEST_RUN(test_load_health_under_tokenize);
	TEST_RUN(test_load_stream_gap_refused_prompt);
	kill(daemon_pid, SIGTERM);
	waitpid(daemon_pid, NULL, 0);
	return test_finish();
}
