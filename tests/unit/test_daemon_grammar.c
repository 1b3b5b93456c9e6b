/* tests/unit/test_daemon_grammar.c: structured output through the real
 * edgelmd (stories260K, a temporary ipc:// socket):
 *
 * - generate with a json_schema: the text is JSON valid under the schema
 *   (tests/unit/schema_check.h) and the generation ends with "stop" as the
 *   value closes, for several seeds at temperature 1, streamed too;
 * - chat with a grammar: the text is one of the grammar's words;
 * - a grammar that does not compile, a schema outside the subset and
 *   both fields at once are invalid_field, naming the line and column or
 *   the JSON pointer, and the daemon carries on;
 * - grammar and plain requests side by side in the slots. */
#include "common/common.h"
#include "ipc/edgelm.h"
#include "tests/test.h"
#include "tests/unit/schema_check.h"

#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static char url[4200], log_path[4200];
static const char *model;
static pid_t daemon_pid = -1;

static const char *schema =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":10},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\"]},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":5},\"maxItems\":2},"
    "\"owner\":{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"ok\"]}},"
    "\"required\":[\"name\",\"kind\",\"owner\"],\"additionalProperties\":false}";

static int start(void)
{
	const char *argv[] = {"edgelmd",   "--foreground",     "--model", model, "--listen", url,
	                      "--metrics-listen", "off", "--threads", "2", "--set", "tuning=false",
	                      "--set", "socket_group=", "--set", "parallel=4", "--set",
	                      "log_level=debug", "--set", "ctx_size=512", NULL};
	snprintf(log_path, sizeof(log_path), "%s/edgelmd-grammar.log", test_tmpdir());
	daemon_pid = fork();
	if (daemon_pid == 0) {
		int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fd >= 0)
			dup2(fd, 2);
		execv(test_bin("edgelmd"), (char *const *)argv);
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
		if (waitpid(daemon_pid, NULL, WNOHANG) == daemon_pid) {
			fprintf(stderr, "edgelmd exited early; log in %s\n", log_path);
			daemon_pid = -1;
			return -1;
		}
		usleep(50000);
	}
	return -1;
}

static int stop(void)
{
	if (daemon_pid <= 0)
		return -1;
	kill(daemon_pid, SIGTERM);
	int st = -1;
	for (int i = 0; i < 600; i++) {
		if (waitpid(daemon_pid, &st, WNOHANG) == daemon_pid)
			break;
		usleep(50000);
	}
	if (!WIFEXITED(st)) {
		kill(daemon_pid, SIGKILL);
		waitpid(daemon_pid, NULL, 0);
	}
	daemon_pid = -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static json_t *call(const char *req)
{
	edgelm_client *c = NULL;
	if (edgelm_connect(url, &c, NULL) != 0)
		return NULL;
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

static const char *err_msg(json_t *j)
{
	return json_string_value(json_object_get(json_object_get(j, "error"), "message"));
}

static bool text_valid(const char *text, const char *what)
{
	char why[128] = "";
	bool ok = text && sc_check_text(schema, text, why, sizeof(why));
	CHECK_MSG(ok, "%s: %s: %s", what, why, text ? text : "(no text)");
	return ok;
}

static char *gen_request(uint64_t seed, bool stream)
{
	size_t cap = strlen(schema) + 512;
	char *req = malloc(cap);
	if (req)
		snprintf(req, cap,
		         "{\"op\":\"generate\",\"prompt\":\"Once upon a time\",\"max_tokens\":300,"
		         "\"temperature\":1,\"top_k\":0,\"top_p\":1,\"min_p\":0,\"seed\":%llu,"
		         "\"stream\":%s,\"json_schema\":%s}",
		         (unsigned long long)seed, stream ? "true" : "false", schema);
	return req;
}

static void test_generate_json_schema(void)
{
	for (uint64_t seed = 1; seed <= 6; seed++) {
		char *req = gen_request(seed, false);
		json_t *j = req ? call(req) : NULL;
		CHECK_MSG(json_is_true(json_object_get(j, "ok")), "seed %llu: %s",
		          (unsigned long long)seed, err_msg(j) ? err_msg(j) : "no reply");
		const char *text = json_string_value(json_object_get(j, "text"));
		char what[32];
		snprintf(what, sizeof(what), "seed %llu", (unsigned long long)seed);
		text_valid(text, what);
		CHECK_STREQ(json_string_value(json_object_get(j, "finish_reason")), "stop");
		json_decref(j);
		free(req);
	}
}

static void test_stream_json_schema(void)
{
	char *req = gen_request(7, true);
	json_t *j = req ? call(req) : NULL;
	free(req);
	const char *id = json_string_value(json_object_get(j, "id"));
	CHECK(id != NULL);
	char sid[80];
	snprintf(sid, sizeof(sid), "%s", id ? id : "");
	json_decref(j);
	char text[8192] = "";
	size_t n = 0;
	bool done = false;
	for (int i = 0; i < 200 && !done && sid[0]; i++) {
		char poll[256];
		snprintf(poll, sizeof(poll), "{\"op\":\"poll\",\"id\":\"%s\",\"ack\":%zu,\"wait_ms\":1000}",
		         sid, n);
		json_t *p = call(poll);
		const char *t = json_string_value(json_object_get(p, "text"));
		size_t tl = json_string_length(json_object_get(p, "text"));
		size_t len = strlen(text);
		if (t && len + tl < sizeof(text)) {
			memcpy(text + len, t, tl);
			text[len + tl] = '\0';
		}
		/* rule 3: the next ack is the daemon's `next` */
		n = (size_t)json_integer_value(json_object_get(p, "next"));
		done = json_is_true(json_object_get(p, "done"));
		if (done)
			CHECK_STREQ(json_string_value(json_object_get(p, "finish_reason")), "stop");
		if (!p || json_object_get(p, "error"))
			break;
		json_decref(p);
	}
	CHECK(done);
	text_valid(text, "stream");
	/* release the finished stream (rule 6), or the daemon's shutdown
	 * waits its drain out for a client that never comes back */
	if (done) {
		char poll[256];
		snprintf(poll, sizeof(poll), "{\"op\":\"poll\",\"id\":\"%s\",\"ack\":%zu,\"wait_ms\":0}",
		         sid, n);
		json_decref(call(poll));
	}
}

static void test_chat_grammar(void)
{
	json_t *j = call("{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"Yes or no?\"}],"
	                 "\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\" | \\\"maybe so\\\"\","
	                 "\"max_tokens\":50,\"temperature\":1,\"seed\":3}");
	CHECK(json_is_true(json_object_get(j, "ok")));
	const char *t = json_string_value(json_object_get(j, "text"));
	CHECK_MSG(t && (strcmp(t, "yes") == 0 || strcmp(t, "no") == 0 || strcmp(t, "maybe so") == 0),
	          "text: %s", t ? t : "(none)");
	CHECK_STREQ(json_string_value(json_object_get(j, "finish_reason")), "stop");
	json_decref(j);
}

static void test_refusals(void)
{
	static const struct {
		const char *req, *code, *msg;
	} cases[] = {
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"grammar\":\"root ::= \\\"a\\\"\\nb ::= (\"}",
	     "invalid_field", "grammar: line 2, column"},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"grammar\":\"rot ::= \\\"a\\\"\"}",
	     "invalid_field", "no rule 'root'"},
	    {"{\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
	     "\"json_schema\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\","
	     "\"pattern\":\"a+\"}}}}",
	     "invalid_field", "json_schema: #/properties/n/pattern: keyword 'pattern' is not supported"},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"json_schema\":{\"$ref\":\"#/nowhere\"}}",
	     "invalid_field", "points at nothing"},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"json_schema\":{},\"grammar\":\"root ::= \\\"a\\\"\"}",
	     "invalid_field", "exclude each other"},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"json_schema\":[]}", "invalid_field",
	     "must be an object"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		json_t *j = call(cases[i].req);
		CHECK_MSG(err_code(j) && strcmp(err_code(j), cases[i].code) == 0, "%s: %s",
		          cases[i].req, err_code(j) ? err_code(j) : "(ok)");
		CHECK_MSG(err_msg(j) && strstr(err_msg(j), cases[i].msg), "%s: %s", cases[i].req,
		          err_msg(j) ? err_msg(j) : "(none)");
		json_decref(j);
	}
	/* and the daemon carries on */
	json_t *j = call("{\"op\":\"generate\",\"prompt\":\"Once\",\"max_tokens\":4,\"temperature\":0}");
	CHECK(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
}

struct job {
	int k;
	bool ok;
	char text[4096];
};

static void *run_job(void *arg)
{
	struct job *jb = arg;
	char *req = NULL;
	if (jb->k % 2 == 0) {
		req = gen_request(100 + (uint64_t)jb->k, false);
	} else {
		req = malloc(256);
		if (req)
			snprintf(req, 256,
			         "{\"op\":\"generate\",\"prompt\":\"Once upon\",\"max_tokens\":40,"
			         "\"temperature\":1,\"seed\":%d}",
			         jb->k);
	}
	json_t *j = req ? call(req) : NULL;
	free(req);
	jb->ok = json_is_true(json_object_get(j, "ok"));
	snprintf(jb->text, sizeof(jb->text), "%s",
	         json_string_value(json_object_get(j, "text")) ? json_string_value(json_object_get(j, "text"))
	                                                        : "");
	json_decref(j);
	return NULL;
}

/* Grammar and plain requests share the batch: each gets its own kind of text. */
static void test_concurrent(void)
{
	struct job jobs[6];
	pthread_t th[6];
	for (int k = 0; k < 6; k++) {
		jobs[k] = (struct job){.k = k};
		CHECK_OK(pthread_create(&th[k], NULL, run_job, &jobs[k]));
	}
	int plain_not_json = 0;
	for (int k = 0; k < 6; k++) {
		pthread_join(th[k], NULL);
		CHECK_MSG(jobs[k].ok, "job %d failed", k);
		if (k % 2 == 0) {
			text_valid(jobs[k].text, "concurrent");
		} else {
			char why[64];
			plain_not_json += !sc_check_text(schema, jobs[k].text, why, sizeof(why));
		}
	}
	CHECK_EQ_INT(plain_not_json, 3); /* plain stories, not held to the schema */
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	model = strdup(test_data_path("models/stories260K-f32.gguf"));
	if (!test_file_exists(model)) {
		test_cur_name = "test_daemon_grammar";
		TEST_SKIP_DATA("stories260K model not found under $EDGELM_TESTDATA");
		test_n_skip++;
		if (getenv("EDGELM_REQUIRE_DATA"))
			test_n_fail++;
		return test_finish();
	}
	snprintf(url, sizeof(url), "ipc://%s/grammar.sock", test_tmpdir());
	if (start() != 0) {
		test_cur_name = "start";
		CHECK(!"edgelmd did not become ready");
		test_n_fail++;
		return test_finish();
	}
	TEST_RUN(test_generate_json_schema);
	TEST_RUN(test_stream_json_schema);
	TEST_RUN(test_chat_grammar);
	TEST_RUN(test_refusals);
	TEST_RUN(test_concurrent);
	test_cur_name = "stop";
	CHECK_EQ_INT(stop(), 0);
	return test_finish();
}
