/* tests/unit/test_daemon_serve.c: the real edgelmd on a temporary socket,
 * with stories260K, driven through libedgelm and raw protocol messages.
 *
 * - 8 concurrent clients, streaming and not: each greedy output equals the
 *   reference text for its prompt (batching never changes results);
 * - cancel frees the sequence (edgelm_sequences_running back to 0);
 * - a stream nobody polls is cancelled and freed after stream_idle_ms;
 * - a poll repeated after a "lost" reply returns the same text: nothing is
 *   lost or duplicated;
 * - hostile requests get their error codes and health stays ready;
 * - a client-chosen id in use, queue limits, tokenize/detokenize, info;
 * - embed: a list gives one unit vector per input, equal to edgelm-run's
 *   (within 1e-5) and to the same input alone; pooling changes it; empty
 *   and oversized inputs get clear errors (truncate cuts instead);
 *   concurrent embeds beside generations change neither;
 * - SIGTERM: exit 0. */
#include "common/common.h"
#include "ipc/edgelm.h"
#include "tests/test.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static pid_t daemon_pid = -1;
static char url[4200];
static json_t *ref;

static edgelm_client *client(void)
{
	edgelm_client *c = NULL;
	struct edgelm_error e;
	if (edgelm_connect(url, &c, &e) != 0)
		return NULL;
	return c;
}

static int start_daemon(void)
{
	const char *model = test_data_path("models/stories260K-f32.gguf");
	char model_copy[4096];
	snprintf(model_copy, sizeof(model_copy), "%s", model);
	snprintf(url, sizeof(url), "ipc://%s/edgelm-test.sock", test_tmpdir());
	char log[4200];
	snprintf(log, sizeof(log), "%s/edgelmd.log", test_tmpdir());
	daemon_pid = fork();
	if (daemon_pid == 0) {
		FILE *f = freopen(log, "w", stderr);
		(void)f;
		execl(test_bin("edgelmd"), "edgelmd", "--config", "/dev/null", "--model", model_copy,
		      "--listen", url, "--metrics-listen", "off", "--set", "parallel=8", "--set",
		      "tuning=false", "--set", "stream_idle_ms=1500", "--set", "queue_size=16",
		      "--set", "socket_group=", "--set", "watchdog_stall_ms=40", "--threads", "2",
		      (char *)NULL);
		_exit(127);
	}
	/* wait for ready */
	for (int i = 0; i < 200; i++) {
		edgelm_client *c = client();
		enum edgelm_health h;
		if (c && edgelm_health(c, &h, NULL, NULL) == 0 && h == EDGELM_HEALTH_READY) {
			edgelm_close(c);
			return 0;
		}
		if (c)
			edgelm_close(c);
		int st;
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid) {
			fprintf(stderr, "edgelmd exited early (status %d); log in %s\n", st, log);
			daemon_pid = -1;
			return -1;
		}
		usleep(50000);
	}
	return -1;
}

/* A metric's value from the metrics JSON (first series), NaN if absent. */
static double metric(const char *name)
{
	edgelm_client *c = client();
	char *js = NULL;
	double v = NAN;
	if (c && edgelm_metrics(c, &js, NULL) == 0) {
		json_t *j = json_loads(js, 0, NULL);
		json_t *m = json_object_get(json_object_get(j, "metrics"), "metrics");
		json_t *fam = json_object_get(m, name);
		json_t *s0 = json_array_get(json_object_get(fam, "series"), 0);
		if (s0)
			v = json_number_value(json_object_get(s0, "value"));
		json_decref(j);
	}
	edgelm_free(js);
	edgelm_close(c);
	return v;
}

static bool wait_metric(const char *name, double want, int ms)
{
	for (int t = 0; t < ms; t += 100) {
		if (metric(name) == want)
			return true;
		usleep(100000);
	}
	return false;
}

struct job {
	int prompt;
	bool stream;
	int rc;
	char *text;
	size_t len;
};

static int collect(const char *text, size_t len, void *user)
{
	struct job *j = user;
	j->text = realloc(j->text, j->len + len + 1);
	memcpy(j->text + j->len, text, len);
	j->len += len;
	j->text[j->len] = '\0';
	return 0;
}

static void *run_job(void *arg)
{
	struct job *j = arg;
	json_t *item = json_array_get(ref, (size_t)j->prompt);
	edgelm_client *c = client();
	struct edgelm_params p;
	edgelm_params_init(&p);
	p.temperature = 0;
	p.max_tokens = (int32_t)json_array_size(json_object_get(item, "steps"));
	struct edgelm_result r = {0};
	const char *prompt = json_string_value(json_object_get(item, "prompt"));
	if (j->stream) {
		j->rc = edgelm_generate_stream(c, prompt, &p, collect, j, &r, NULL);
	} else {
		j->rc = edgelm_generate(c, prompt, &p, &r, NULL);
		if (j->rc == 0) {
			j->text = strdup(r.text);
			j->len = r.text_len;
		}
	}
	edgelm_result_free(&r);
	edgelm_close(c);
	return NULL;
}

static void test_concurrent_reference(void)
{
	pthread_t th[8];
	struct job jobs[8];
	for (int i = 0; i < 8; i++) {
		jobs[i] = (struct job){.prompt = i % (int)json_array_size(ref), .stream = i % 2 == 0};
		pthread_create(&th[i], NULL, run_job, &jobs[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		const char *want =
			json_string_value(json_object_get(json_array_get(ref, (size_t)jobs[i].prompt), "text"));
		CHECK_EQ_INT(jobs[i].rc, 0);
		CHECK_MSG(jobs[i].text && strcmp(jobs[i].text, want) == 0,
			  "client %d (%s):\n got: %s\nwant: %s", i, jobs[i].stream ? "stream" : "blocking",
			  jobs[i].text ? jobs[i].text : "(null)", want);
		free(jobs[i].text);
	}
	CHECK(wait_metric("edgelm_sequences_running", 0, 3000));
}

/* Raw protocol call; returns the parsed reply. */
static json_t *call(const char *req)
{
	edgelm_client *c = client();
	char *rep = NULL;
	size_t len = 0;
	edgelm_call_json(c, req, strlen(req), &rep, &len, NULL);
	json_t *j = rep ? json_loads(rep, 0, NULL) : NULL;
	edgelm_free(rep);
	edgelm_close(c);
	return j;
}

static const char *err_code(json_t *j)
{
	return json_string_value(json_object_get(json_object_get(j, "error"), "code"));
}

static void test_poll_retry(void)
{
	json_t *item = json_array_get(ref, 0);
	char req[1024];
	snprintf(req, sizeof(req),
		 "{\"op\":\"generate\",\"id\":\"retry-1\",\"prompt\":\"%s\",\"max_tokens\":%zu,"
		 "\"temperature\":0,\"stream\":true}",
		 json_string_value(json_object_get(item, "prompt")),
		 json_array_size(json_object_get(item, "steps")));
	json_t *j = call(req);
	CHECK(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	char got[8192] = "";
	size_t have = 0;
	bool done = false;
	for (int guard = 0; !done && guard < 2000; guard++) {
		snprintf(req, sizeof(req),
			 "{\"op\":\"poll\",\"id\":\"retry-1\",\"ack\":%zu,\"wait_ms\":500}", have);
		json_t *a = call(req);
		/* every other reply is "lost": ask again with the same ack */
		json_t *b = call(req);
		CHECK(a && b);
		if (!a || !b)
			break;
		const char *ta = json_string_value(json_object_get(a, "text"));
		const char *tb = json_string_value(json_object_get(b, "text"));
		/* the retry starts at the same offset; it may carry more text */
		CHECK(ta && tb && strncmp(ta, tb, strlen(ta)) == 0);
		CHECK_EQ_INT(json_integer_value(json_object_get(b, "offset")), (long long)have);
		size_t next = (size_t)json_integer_value(json_object_get(b, "next"));
		if (tb && have + strlen(tb) < sizeof(got))
			memcpy(got + have, tb, strlen(tb) + 1);
		have = next;
		done = json_is_true(json_object_get(b, "done"));
		json_decref(a);
		json_decref(b);
	}
	CHECK(done);
	CHECK_STREQ(got, json_string_value(json_object_get(item, "text")));
	/* release, then the id is gone */
	snprintf(req, sizeof(req), "{\"op\":\"poll\",\"id\":\"retry-1\",\"ack\":%zu}", have);
	json_decref(call(req));
	json_t *gone = call(req);
	CHECK_STREQ(err_code(gone), "not_found");
	json_decref(gone);
}

static void test_cancel_frees(void)
{
	/* The test hook (watchdog_stall_ms) makes this request slow: 40 ms a
	 * step, so it is surely running when the cancel arrives. */
	json_t *j = call("{\"op\":\"generate\",\"id\":\"c-1\",\"prompt\":\"__edgelm_test_stall__ Once\","
			 "\"max_tokens\":400,\"temperature\":1,\"stream\":true}");
	CHECK(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	usleep(100000);
	j = call("{\"op\":\"cancel\",\"id\":\"c-1\"}");
	CHECK(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	CHECK(wait_metric("edgelm_sequences_running", 0, 3000));
	j = call("{\"op\":\"poll\",\"id\":\"c-1\",\"ack\":0,\"wait_ms\":1000}");
	const char *fr = json_string_value(json_object_get(j, "finish_reason"));
	CHECK_MSG(fr && strcmp(fr, "cancelled") == 0, "poll after cancel: %s",
		  j ? json_dumps(j, JSON_COMPACT) : "(no reply)");
	json_decref(j);
}

static void test_abandoned_stream(void)
{
	json_t *j = call("{\"op\":\"generate\",\"id\":\"gone-1\",\"prompt\":\"__edgelm_test_stall__ Once\","
			 "\"max_tokens\":450,\"temperature\":1,\"stream\":true}");
	CHECK(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	usleep(500000);
	CHECK_EQ_INT(metric("edgelm_sequences_running"), 1); /* still generating (40 ms a step) */
	/* nobody polls: after stream_idle_ms (1500) it is cancelled and freed */
	CHECK(wait_metric("edgelm_sequences_running", 0, 6000));
	usleep(1800000);
	j = call("{\"op\":\"poll\",\"id\":\"gone-1\",\"ack\":0}");
	CHECK_STREQ(err_code(j), "not_found");
	json_decref(j);
}

static void test_errors_and_health(void)
{
	static const struct {
		const char *req, *code;
	} cases[] = {
		{"{", "invalid_json"},
		{"{\"op\":\"fly\"}", "unknown_op"},
		{"{\"op\":\"generate\"}", "invalid_field"},
		{"{\"op\":\"generate\",\"prompt\":5}", "invalid_field"},
		{"{\"op\":\"generate\",\"prompt\":\"x\",\"temperature\":-1}", "invalid_field"},
		{"{\"op\":\"poll\",\"id\":\"nope\"}", "not_found"},
		{"{\"op\":\"cancel\",\"id\":\"nope\"}", "not_found"},
		{"{\"op\":\"detokenize\",\"ids\":[99999]}", "invalid_field"},
		{"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
		 "invalid_json"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		json_t *j = call(cases[i].req);
		CHECK_MSG(j && err_code(j) && strcmp(err_code(j), cases[i].code) == 0,
			  "%s: got %s", cases[i].req, j && err_code(j) ? err_code(j) : "(none)");
		json_decref(j);
	}
	/* a prompt longer than the context (512) */
	size_t n = 6000;
	char *big = malloc(n + 100);
	strcpy(big, "{\"op\":\"generate\",\"prompt\":\"");
	size_t k = strlen(big);
	for (size_t i = 0; i < n / 2; i++, k += 2)
		memcpy(big + k, "a ", 2);
	strcpy(big + k, "\"}");
	json_t *j = call(big);
	CHECK_STREQ(err_code(j), "prompt_too_long");
	json_decref(j);
	free(big);
	/* an id in use */
	j = call("{\"op\":\"generate\",\"id\":\"dup\",\"prompt\":\"Once\",\"max_tokens\":300,"
		 "\"stream\":true}");
	json_decref(j);
	j = call("{\"op\":\"generate\",\"id\":\"dup\",\"prompt\":\"Once\",\"stream\":true}");
	CHECK_STREQ(err_code(j), "invalid_field");
	json_decref(j);
	json_decref(call("{\"op\":\"cancel\",\"id\":\"dup\"}"));
	/* health is still ready */
	edgelm_client *c = client();
	enum edgelm_health h = EDGELM_HEALTH_LOADING;
	CHECK_OK(edgelm_health(c, &h, NULL, NULL));
	CHECK_EQ_INT(h, EDGELM_HEALTH_READY);
	edgelm_close(c);
}

static void test_tokenize_info(void)
{
	edgelm_client *c = client();
	int32_t *ids = NULL;
	size_t n = 0;
	CHECK_OK(edgelm_tokenize(c, "Once upon a time", true, false, &ids, &n, NULL));
	json_t *pt = json_object_get(json_array_get(ref, 0), "prompt_tokens");
	CHECK_EQ_INT(n, json_array_size(pt));
	for (size_t i = 0; i < n && i < json_array_size(pt); i++)
		CHECK_EQ_INT(ids[i], json_integer_value(json_array_get(pt, i)));
	char *text = NULL;
	CHECK_OK(edgelm_detokenize(c, ids + 1, n - 1, &text, NULL));
	CHECK_STREQ(text, "Once upon a time");
	edgelm_free(text);
	edgelm_free(ids);
	/* control tokens: left out, or their text with "special" (issue 25) */
	json_t *d = call("{\"op\":\"detokenize\",\"ids\":[1,403,2]}");
	json_t *ds = call("{\"op\":\"detokenize\",\"ids\":[1,403,2],\"special\":true}");
	const char *plain = json_string_value(json_object_get(d, "text"));
	const char *sp = json_string_value(json_object_get(ds, "text"));
	CHECK_MSG(plain && sp && strstr(sp, "<s>") && strstr(sp, "</s>") && !strstr(plain, "<s>") &&
		      strlen(sp) > strlen(plain),
		  "plain '%s', special '%s'", plain ? plain : "", sp ? sp : "");
	json_decref(d);
	json_decref(ds);
	char *info = NULL;
	CHECK_OK(edgelm_info(c, &info, NULL));
	json_t *j = info ? json_loads(info, 0, NULL) : NULL;
	CHECK_STREQ(json_string_value(json_object_get(j, "architecture")), "llama");
	CHECK_EQ_INT(json_integer_value(json_object_get(j, "n_vocab")), 512);
	/* the kernels line names the KV cache type in force (default f16) */
	const char *kern = json_string_value(json_object_get(j, "kernels"));
	CHECK_MSG(kern && strstr(kern, "KV cache f16"), "kernels: %s", kern ? kern : "(none)");
	json_decref(j);
	edgelm_free(info);
	edgelm_close(c);
}

/* A chat that goes on: each turn resends the whole conversation, and the
 * prefix cache computes only the new part. */
static void test_chat_prefix_cache(void)
{
	edgelm_client *c = client();
	struct edgelm_message msgs[16];
	char *replies[8] = {0};
	const char *users[5] = {"Once upon a time", "Tell me about Lily", "What did she see?",
				"Where was the ball?", "The end"};
	size_t n = 0;
	double hits0 = metric("edgelm_prefix_cache_hits_total");
	int64_t last_prompt = 0;
	for (int t = 0; t < 5; t++) {
		msgs[n++] = (struct edgelm_message){"user", users[t]};
		struct edgelm_params p;
		edgelm_params_init(&p);
		p.temperature = 0;
		p.max_tokens = 12;
		struct edgelm_result r = {0};
		CHECK_OK(edgelm_chat(c, msgs, n, &p, NULL, NULL, &r, NULL));
		if (t > 0)
			CHECK_MSG(r.cached_tokens >= last_prompt - 1,
				  "turn %d: %lld of %lld prompt tokens cached, previous prompt %lld", t,
				  (long long)r.cached_tokens, (long long)r.prompt_tokens,
				  (long long)last_prompt);
		last_prompt = r.prompt_tokens;
		replies[t] = strdup(r.text ? r.text : "");
		msgs[n++] = (struct edgelm_message){"assistant", replies[t]};
		edgelm_result_free(&r);
	}
	CHECK(metric("edgelm_prefix_cache_hits_total") - hits0 >= 4);
	for (int t = 0; t < 5; t++)
		free(replies[t]);
	edgelm_close(c);
}

/* The same through `edgelmctl chat`, fed from a pipe. */
static void test_edgelmctl_chat(void)
{
	double hits0 = metric("edgelm_prefix_cache_hits_total");
	char cmd[9000];
	snprintf(cmd, sizeof(cmd),
		 "printf 'Once upon a time\\nTell me more\\nAnd then?\\nWho was there?\\nThe end\\n' | "
		 "%s --socket '%s' chat -n 8 --temp 0 >/dev/null 2>&1",
		 test_bin("edgelmctl"), url);
	int st = system(cmd);
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "edgelmctl chat: status %d", st);
	CHECK(metric("edgelm_prefix_cache_hits_total") - hits0 >= 4);
}

/* ---- embed ---- */

static const char *const emb_texts[] = {"Once upon a time", "The cat sat on the mat.",
					"Tom had a red ball"};

/* edgelm-run's vector for text (the teacher: engine_embed in one process) */
static json_t *run_embed(const char *text, const char *pooling)
{
	char cmd[8192], *out = NULL;
	snprintf(cmd, sizeof(cmd), "%s -m '%s' -p '%s' --embed --json -q --threads 2 --pooling %s",
		 test_bin("edgelm-run"), test_data_path("models/stories260K-f32.gguf"), text,
		 pooling);
	json_t *j = NULL;
	if (test_run_capture(cmd, &out) == 0 && out) {
		json_t *all = json_loads(out, 0, NULL);
		j = json_incref(json_object_get(all, "embedding"));
		json_decref(all);
	}
	free(out);
	return j;
}

static double vec_diff(json_t *a, json_t *b)
{
	if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b))
		return INFINITY;
	double d = 0;
	for (size_t i = 0; i < json_array_size(a); i++)
		d = fmax(d, fabs(json_number_value(json_array_get(a, i)) -
				 json_number_value(json_array_get(b, i))));
	return d;
}

static json_t *emb_of(json_t *rep, size_t i)
{
	return json_object_get(json_array_get(json_object_get(rep, "embeddings"), i), "embedding");
}

static void test_embed(void)
{
	json_t *want[3];
	for (int i = 0; i < 3; i++)
		want[i] = run_embed(emb_texts[i], "mean");
	CHECK(want[0] && want[1] && want[2]);
	char req[1024];
	snprintf(req, sizeof(req), "{\"op\":\"embed\",\"input\":[\"%s\",\"%s\",\"%s\",\"%s\"]}",
		 emb_texts[0], emb_texts[1], emb_texts[2], emb_texts[0]);
	json_t *j = call(req);
	CHECK_MSG(json_is_true(json_object_get(j, "ok")), "%s", err_code(j));
	CHECK_EQ_INT(json_array_size(json_object_get(j, "embeddings")), 4);
	CHECK_STREQ(json_string_value(json_object_get(j, "pooling")), "mean");
	int64_t total = 0;
	for (size_t i = 0; i < 4; i++) {
		json_t *e = emb_of(j, i);
		CHECK_EQ_INT(json_array_size(e), 64);
		double ss = 0;
		for (size_t k = 0; k < json_array_size(e); k++)
			ss += pow(json_number_value(json_array_get(e, k)), 2);
		CHECK_MSG(fabs(ss - 1) < 1e-5, "input %zu: norm^2 %g", i, ss);
		CHECK_MSG(vec_diff(e, want[i % 3]) < 1e-5, "input %zu: %g from edgelm-run", i,
			  vec_diff(e, want[i % 3]));
		total += json_integer_value(
			json_object_get(json_array_get(json_object_get(j, "embeddings"), i), "tokens"));
	}
	CHECK(vec_diff(emb_of(j, 0), emb_of(j, 3)) == 0);
	CHECK(total > 4 && total == json_integer_value(json_object_get(
					    json_object_get(j, "usage"), "prompt_tokens")));
	json_decref(j);

	/* a string alone, other poolings */
	snprintf(req, sizeof(req), "{\"op\":\"embed\",\"input\":\"%s\",\"pooling\":\"last\"}",
		 emb_texts[1]);
	j = call(req);
	json_t *last = run_embed(emb_texts[1], "last");
	CHECK_STREQ(json_string_value(json_object_get(j, "pooling")), "last");
	CHECK_MSG(vec_diff(emb_of(j, 0), last) < 1e-5, "last: %g", vec_diff(emb_of(j, 0), last));
	CHECK(vec_diff(emb_of(j, 0), want[1]) > 1e-3);
	json_decref(last);
	json_decref(j);
	snprintf(req, sizeof(req), "{\"op\":\"embed\",\"input\":[\"%s\"],\"pooling\":\"cls\"}",
		 emb_texts[1]);
	j = call(req);
	json_t *cls = run_embed(emb_texts[1], "cls");
	CHECK_MSG(vec_diff(emb_of(j, 0), cls) < 1e-5, "cls: %g", vec_diff(emb_of(j, 0), cls));
	json_decref(cls);
	json_decref(j);
	for (int i = 0; i < 3; i++)
		json_decref(want[i]);
}

/* edgelm_requests_total{op="embed",outcome} (0 when absent) */
static double embed_count(const char *outcome)
{
	edgelm_client *c = client();
	char *js = NULL;
	double v = 0;
	if (c && edgelm_metrics(c, &js, NULL) == 0) {
		json_t *j = json_loads(js, 0, NULL);
		json_t *fam = json_object_get(json_object_get(json_object_get(j, "metrics"), "metrics"),
					      "edgelm_requests_total");
		size_t i;
		json_t *ser;
		json_array_foreach(json_object_get(fam, "series"), i, ser) {
			json_t *l = json_object_get(ser, "labels");
			const char *op = json_string_value(json_object_get(l, "op"));
			const char *oc = json_string_value(json_object_get(l, "outcome"));
			if (op && oc && strcmp(op, "embed") == 0 && strcmp(oc, outcome) == 0)
				v = json_number_value(json_object_get(ser, "value"));
		}
		json_decref(j);
	}
	edgelm_free(js);
	edgelm_close(c);
	return v;
}

static void test_embed_errors(void)
{
	static const char *const bad[] = {
		"{\"op\":\"embed\",\"input\":\"\"}",
		"{\"op\":\"embed\",\"input\":[]}",
		"{\"op\":\"embed\",\"input\":[\"a\",\"\"]}",
		"{\"op\":\"embed\"}",
		"{\"op\":\"embed\",\"input\":\"a\",\"pooling\":\"rank\"}",
	};
	/* each request counts once, by its outcome */
	double ok0 = embed_count("ok"), bad0 = embed_count("invalid_field");
	json_t *one = call("{\"op\":\"embed\",\"input\":\"a\"}");
	json_decref(one);
	CHECK(embed_count("ok") == ok0 + 1);
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		json_t *j = call(bad[i]);
		CHECK_MSG(err_code(j) && strcmp(err_code(j), "invalid_field") == 0, "%s: %s", bad[i],
			  err_code(j) ? err_code(j) : "(ok)");
		json_decref(j);
	}
	CHECK(embed_count("invalid_field") == bad0 + CM_ARRAY_LEN(bad));
	/* longer than the context of 512: refused, or cut with truncate */
	size_t cap = 8192;
	char *req = malloc(cap), *p = req;
	p += sprintf(p, "{\"op\":\"embed\",\"input\":\"");
	for (int i = 0; i < 700; i++)
		p += sprintf(p, "a ");
	strcpy(p, "\"}");
	json_t *j = call(req);
	const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
	CHECK_STREQ(err_code(j), "prompt_too_long");
	CHECK_MSG(msg && strstr(msg, "context"), "%s", msg ? msg : "");
	json_decref(j);
	strcpy(p, "\",\"truncate\":true}");
	j = call(req);
	CHECK(json_is_true(json_object_get(j, "ok")));
	CHECK_EQ_INT(json_integer_value(json_object_get(
			     json_array_get(json_object_get(j, "embeddings"), 0), "tokens")),
		     512);
	json_decref(j);
	free(req);
}

/* libedgelm's edgelm_embed and edgelmctl embed give the op's vectors */
static void test_embed_clients(void)
{
	json_t *raw = call("{\"op\":\"embed\",\"input\":[\"Once upon a time\",\"The cat sat "
			   "on the mat.\"]}");
	edgelm_client *c = client();
	float *v = NULL;
	size_t dim = 0;
	int64_t *tok = NULL;
	struct edgelm_error e;
	CHECK_OK(edgelm_embed(c, emb_texts, 2, NULL, false, &v, &dim, &tok, &e));
	CHECK_EQ_INT(dim, 64);
	for (size_t i = 0; v && i < 2; i++) {
		json_t *want = emb_of(raw, i);
		for (size_t k = 0; k < dim; k++)
			CHECK((double)v[i * dim + k] ==
			      (double)(float)json_number_value(json_array_get(want, k)));
		CHECK(tok[i] == json_integer_value(json_object_get(
					json_array_get(json_object_get(raw, "embeddings"), i), "tokens")));
	}
	edgelm_free(v);
	edgelm_free(tok);
	CHECK_EQ_INT(edgelm_embed(c, emb_texts, 1, "rank", false, &v, &dim, NULL, &e),
		     EDGELM_E_INVALID_ARG);
	const char *empty[] = {""};
	CHECK_EQ_INT(edgelm_embed(c, empty, 1, NULL, false, &v, &dim, NULL, &e),
		     EDGELM_E_INVALID_FIELD);
	edgelm_close(c);

	char cmd[9000], *out = NULL;
	snprintf(cmd, sizeof(cmd),
		 "printf 'Once upon a time\\n\\nThe cat sat on the mat.\\n' | %s --socket '%s' --json "
		 "embed -",
		 test_bin("edgelmctl"), url);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	json_t *j = out ? json_loads(out, 0, NULL) : NULL;
	CHECK(json_integer_value(json_object_get(j, "dim")) == 64);
	CHECK_EQ_INT(json_array_size(json_object_get(j, "embeddings")), 2);
	for (size_t i = 0; i < 2; i++)
		CHECK(vec_diff(emb_of(j, i), emb_of(raw, i)) < 1e-7);
	json_decref(j);
	free(out);
	snprintf(cmd, sizeof(cmd), "%s --socket '%s' embed --pooling last 'Once upon a time' 'x'",
		 test_bin("edgelmctl"), url);
	CHECK_EQ_INT(test_run_capture(cmd, &out), 0);
	int lines = 0;
	for (char *p = out; p && *p; p++)
		lines += *p == '\n';
	CHECK_EQ_INT(lines, 2);
	free(out);
	json_decref(raw);
}

struct emb_job {
	int k;
	json_t *rep;
};

static void *run_embed_job(void *arg)
{
	struct emb_job *e = arg;
	char req[1024];
	snprintf(req, sizeof(req), "{\"op\":\"embed\",\"input\":[\"%s\",\"%s\"]}",
		 emb_texts[e->k % 3], emb_texts[(e->k + 1) % 3]);
	e->rep = call(req);
	return NULL;
}

/* Embeds beside generations: the generations' text is the reference's and
 * the vectors are those of an embed alone. */
static void test_embed_concurrent(void)
{
	json_t *alone = call("{\"op\":\"embed\",\"input\":[\"Once upon a time\",\"The cat sat "
			     "on the mat.\",\"Tom had a red ball\"]}");
	pthread_t gth[3], eth[6];
	struct job jobs[3];
	struct emb_job ej[6];
	for (int i = 0; i < 3; i++) {
		jobs[i] = (struct job){.prompt = i % (int)json_array_size(ref), .stream = i == 1};
		pthread_create(&gth[i], NULL, run_job, &jobs[i]);
	}
	for (int i = 0; i < 6; i++) {
		ej[i] = (struct emb_job){.k = i};
		pthread_create(&eth[i], NULL, run_embed_job, &ej[i]);
	}
	for (int i = 0; i < 6; i++) {
		pthread_join(eth[i], NULL);
		CHECK_MSG(json_is_true(json_object_get(ej[i].rep, "ok")), "embed %d: %s", i,
			  err_code(ej[i].rep) ? err_code(ej[i].rep) : "(no reply)");
		for (int k = 0; k < 2; k++) {
			double d = vec_diff(emb_of(ej[i].rep, (size_t)k),
					    emb_of(alone, (size_t)((i + k) % 3)));
			CHECK_MSG(d < 1e-5, "embed %d input %d: %g from alone", i, k, d);
		}
		json_decref(ej[i].rep);
	}
	for (int i = 0; i < 3; i++) {
		pthread_join(gth[i], NULL);
		const char *want = json_string_value(
			json_object_get(json_array_get(ref, (size_t)jobs[i].prompt), "text"));
		CHECK_EQ_INT(jobs[i].rc, 0);
		CHECK_MSG(jobs[i].text && strcmp(jobs[i].text, want) == 0, "generation %d: %s", i,
			  jobs[i].text ? jobs[i].text : "(null)");
		free(jobs[i].text);
	}
	json_decref(alone);
	CHECK(wait_metric("edgelm_sequences_running", 0, 3000));
}

static void test_sigterm(void)
{
	CHECK(kill(daemon_pid, SIGTERM) == 0);
	int st = -1;
	for (int i = 0; i < 100; i++) {
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			break;
		usleep(100000);
	}
	CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %d", st);
	daemon_pid = -1;
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	if (!test_file_exists(test_data_path("models/stories260K-f32.gguf")) ||
	    !test_file_exists(test_data_path("reference/stories260K-f32.json"))) {
		test_cur_name = "test_daemon_serve";
		TEST_SKIP_DATA("stories260K model or reference not found under $EDGELM_TESTDATA");
		test_n_skip++;
		if (getenv("EDGELM_REQUIRE_DATA"))
			test_n_fail++;
		return test_finish();
	}
	ref = json_load_file(test_data_path("reference/stories260K-f32.json"), 0, NULL);
	if (start_daemon() != 0) {
		test_cur_name = "start_daemon";
		CHECK(!"edgelmd did not become ready");
		test_n_fail++;
		return test_finish();
	}
	TEST_RUN(test_concurrent_reference);
	TEST_RUN(test_poll_retry);
	TEST_RUN(test_cancel_frees);
	TEST_RUN(test_abandoned_stream);
	TEST_RUN(test_errors_and_health);
	TEST_RUN(test_tokenize_info);
	TEST_RUN(test_chat_prefix_cache);
	TEST_RUN(test_edgelmctl_chat);
	TEST_RUN(test_embed);
	TEST_RUN(test_embed_errors);
	TEST_RUN(test_embed_concurrent);
	TEST_RUN(test_embed_clients);
	TEST_RUN(test_sigterm);
	if (daemon_pid > 0) {
		kill(daemon_pid, SIGKILL);
		waitpid(daemon_pid, NULL, 0);
	}
	json_decref(ref);
	return test_finish();
}
