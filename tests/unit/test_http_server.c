/* tests/unit/test_http_server.c: the HTTP front's server (http/server.c) on
 * a real socket, in front of a core this test plays itself:
 * - before the core is up (submit says -EAGAIN) every endpoint answers 503
 *   with "loading" / not_ready and Retry-After, the page still loads;
 * - the core's protocol replies come back in OpenAI's shapes, its errors
 *   with their statuses; what the front sends the core is protocol JSON
 *   with the caller's identity;
 * - a key file's bad line stops the start with the line named; a busy
 *   port is an error naming the address.
 * The whole daemon behind the front is tests/integration/daemon_http.sh's. */
#include "http/http.h"

#include "tests/test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

/* The core: -EAGAIN while `loading`, else a canned reply per op. */
static struct {
	bool loading;
	char last[4096];
	char identity[64];
	int calls;
} core;

static int submit(void *c, const char *json, size_t len, const char *identity, http_done_fn done,
		  void *ud)
{
	(void)c;
	core.calls++;
	snprintf(core.last, sizeof(core.last), "%.*s", (int)len, json);
	snprintf(core.identity, sizeof(core.identity), "%s", identity);
	if (core.loading)
		return -EAGAIN;
	const char *reply;
	if (strstr(core.last, "\"op\":\"info\""))
		reply = "{\"v\":1,\"ok\":true,\"op\":\"info\",\"model\":\"/m/x.gguf\",\"architecture\":\"llama\",\"n_ctx\":256}";
	else if (strstr(core.last, "\"op\":\"health\""))
		reply = "{\"v\":1,\"ok\":true,\"op\":\"health\",\"status\":\"ready\",\"ready\":true,\"reasons\":[]}";
	else if (strstr(core.last, "\"prompt\":\"full\""))
		reply = "{\"v\":1,\"ok\":false,\"op\":\"generate\",\"error\":{\"code\":\"queue_full\",\"message\":\"queue full (3 waiting)\",\"retry_after_ms\":2500}}";
	else
		reply = "{\"v\":1,\"ok\":true,\"op\":\"generate\",\"stream\":false,\"text\":\"Hi there\",\"finish_reason\":\"length\",\"usage\":{\"prompt_tokens\":3,\"cached_tokens\":1,\"completion_tokens\":2}}";
	done(ud, reply, strlen(reply));
	return 0;
}

/* One HTTP/1.0 exchange on 127.0.0.1:port; returns the whole response. */
static char *http(unsigned port, const char *req)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	static char buf[65536];
	size_t n = 0;
	buf[0] = '\0';
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		if (fd >= 0)
			close(fd);
		return buf;
	}
	ssize_t r;
	while (n + 1 < sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
		n += (size_t)r;
	buf[n] = '\0';
	close(fd);
	return buf;
}

static char *post(unsigned port, const char *path, const char *body)
{
	static char req[8192];
	snprintf(req, sizeof(req),
		 "POST %s HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
		 path, strlen(body), body);
	return http(port, req);
}

static int status(const char *resp)
{
	return strncmp(resp, "HTTP/1.", 7) == 0 ? atoi(resp + 9) : 0;
}

static json_t *body_json(const char *resp)
{
	const char *b = strstr(resp, "\r\n\r\n");
	return b ? json_loads(b + 4, 0, NULL) : NULL;
}

static http_front *start(const char *keyfile, struct cm_err *err)
{
	static const char *const listen[] = {"127.0.0.1:0"};
	struct http_params p = {.listen = listen,
				.n_listen = 1,
				.api_key_file = keyfile,
				.submit = submit};
	http_front *h = NULL;
	return http_front_start(&p, &h, err) == 0 ? h : NULL;
}

static void test_loading(void)
{
	struct cm_err err = {0};
	http_front *h = start(NULL, &err);
	CHECK_MSG(h, "%s", err.msg);
	if (!h)
		return;
	unsigned port = http_front_port(h, 0);
	core.loading = true;
	char *r = http(port, "GET /health HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 503);
	CHECK(strstr(r, "\"status\":\"loading\"") && strstr(r, "Retry-After: 1"));
	r = http(port, "GET /v1/models HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 503);
	CHECK(strstr(r, "\"code\":\"not_ready\"") && strstr(r, "loading"));
	r = post(port, "/v1/completions", "{\"prompt\":\"a\"}");
	CHECK_EQ_INT(status(r), 503);
	CHECK(strstr(r, "\"not_ready\"") != NULL);
	r = post(port, "/v1/chat/completions",
		 "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":true}");
	CHECK_EQ_INT(status(r), 503);
	r = http(port, "GET / HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 200);
	CHECK(strstr(r, "<title>edgelm</title>") != NULL);
	core.loading = false;
	http_front_stop(h);
}

static void test_replies(void)
{
	struct cm_err err = {0};
	http_front *h = start(NULL, &err);
	CHECK_MSG(h, "%s", err.msg);
	if (!h)
		return;
	unsigned port = http_front_port(h, 0);
	char *r = http(port, "GET /health HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 200);
	r = http(port, "GET /v1/models HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 200);
	json_t *j = body_json(r);
	CHECK(strcmp(json_string_value(json_object_get(
			     json_array_get(json_object_get(j, "data"), 0), "id")),
		     "x.gguf") == 0);
	json_decref(j);

	r = post(port, "/v1/completions", "{\"prompt\":\"Once\",\"max_tokens\":2,\"seed\":5}");
	CHECK_EQ_INT(status(r), 200);
	j = body_json(r);
	json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
	CHECK(strcmp(json_string_value(json_object_get(c0, "text")), "Hi there") == 0);
	CHECK(strcmp(json_string_value(json_object_get(c0, "finish_reason")), "length") == 0);
	CHECK(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")) == 5);
	CHECK(strcmp(json_string_value(json_object_get(j, "model")), "x.gguf") == 0);
	json_decref(j);
	/* what the core was given: protocol JSON, the caller's identity */
	json_t *sent = json_loads(core.last, 0, NULL);
	CHECK(strcmp(json_string_value(json_object_get(sent, "op")), "generate") == 0);
	CHECK(json_integer_value(json_object_get(sent, "seed")) == 5);
	CHECK(strncmp(json_string_value(json_object_get(sent, "id")), "h-", 2) == 0);
	json_decref(sent);
	CHECK(strcmp(core.identity, "http") == 0);

	/* the core's refusal: 429 with Retry-After in whole seconds (2.5 s -> 3) */
	r = post(port, "/v1/completions", "{\"prompt\":\"full\"}");
	CHECK_EQ_INT(status(r), 429);
	CHECK(strstr(r, "Retry-After: 3") && strstr(r, "\"code\":\"queue_full\""));
	/* the front's own refusals never reach the core */
	int calls = core.calls;
	r = post(port, "/v1/completions", "{\"prompt\":\"a\",\"n\":3}");
	CHECK_EQ_INT(status(r), 400);
	CHECK(strstr(r, "\"param\":\"n\"") != NULL);
	r = post(port, "/v1/completions", "{\"prompt\":");
	CHECK_EQ_INT(status(r), 400);
	r = http(port, "GET /v1/completions HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 405);
	r = http(port, "GET /nowhere HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 404);
	CHECK_EQ_INT(core.calls, calls);

	/* a busy port: the address named */
	char addr[32];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
	const char *const busy[] = {addr};
	struct http_params p = {.listen = busy, .n_listen = 1, .submit = submit};
	http_front *h2 = NULL;
	CHECK(http_front_start(&p, &h2, &err) != 0 && !h2);
	CHECK_MSG(strstr(err.msg, addr) != NULL, "%s", err.msg);
	http_front_stop(h);
}

/* CORS only when configured: the origin on every answer, preflights 204 */
static void test_cors(void)
{
	static const char *const listen[] = {"127.0.0.1:0"};
	struct http_params p = {.listen = listen,
				.n_listen = 1,
				.cors_origin = "https://app.example",
				.submit = submit};
	struct cm_err err = {0};
	http_front *h = NULL;
	CHECK_OK(http_front_start(&p, &h, &err));
	if (!h)
		return;
	unsigned port = http_front_port(h, 0);
	char *r = http(port, "OPTIONS /v1/chat/completions HTTP/1.0\r\n"
			     "Origin: https://app.example\r\n"
			     "Access-Control-Request-Method: POST\r\n\r\n");
	CHECK_EQ_INT(status(r), 204);
	CHECK(strstr(r, "Access-Control-Allow-Origin: https://app.example") &&
	      strstr(r, "Access-Control-Allow-Headers: Authorization, Content-Type"));
	r = http(port, "GET /v1/models HTTP/1.0\r\n\r\n");
	CHECK_EQ_INT(status(r), 200);
	CHECK(strstr(r, "Access-Control-Allow-Origin: https://app.example") != NULL);
	r = post(port, "/v1/completions", "{\"prompt\":\"a\",\"n\":2}");
	CHECK(status(r) == 400 && strstr(r, "Access-Control-Allow-Origin") != NULL);
	http_front_stop(h);
	/* and none without it */
	p.cors_origin = NULL;
	CHECK_OK(http_front_start(&p, &h, &err));
	if (!h)
		return;
	port = http_front_port(h, 0);
	r = http(port, "GET /v1/models HTTP/1.0\r\n\r\n");
	CHECK(status(r) == 200 && !strstr(r, "Access-Control"));
	CHECK_EQ_INT(status(http(port, "OPTIONS /v1/models HTTP/1.0\r\n\r\n")), 405);
	http_front_stop(h);
}

static void test_keys_file(void)
{
	char path[] = "/tmp/test_http_keys.XXXXXX";
	int fd = mkstemp(path);
	CHECK(fd >= 0);
	if (fd < 0)
		return;
	const char *text = "alice sk-aaaaaaaaaa\nbad line with three\n";
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	struct cm_err err = {0};
	CHECK(start(path, &err) == NULL);
	CHECK_MSG(strstr(err.msg, path) && strstr(err.msg, "line 2"), "%s", err.msg);
	fd = open(path, O_WRONLY | O_TRUNC);
	text = "alice sk-aaaaaaaaaa\n";
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	http_front *h = start(path, &err);
	CHECK_MSG(h, "%s", err.msg);
	if (h) {
		unsigned port = http_front_port(h, 0);
		CHECK_EQ_INT(status(http(port, "GET /v1/models HTTP/1.0\r\n\r\n")), 401);
		char *r = http(port, "GET /v1/models HTTP/1.0\r\nAuthorization: Bearer sk-aaaaaaaaaa\r\n\r\n");
		CHECK_EQ_INT(status(r), 200);
		CHECK(strcmp(core.identity, "http:alice") == 0);
		/* /health needs no key */
		CHECK_EQ_INT(status(http(port, "GET /health HTTP/1.0\r\n\r\n")), 200);
		http_front_stop(h);
	}
	unlink(path);
	CHECK(start("/nonexistent/keys", &err) == NULL && strstr(err.msg, "/nonexistent/keys"));
}

int main(void)
{
	TEST_RUN(test_loading);
	TEST_RUN(test_replies);
	TEST_RUN(test_cors);
	TEST_RUN(test_keys_file);
	return test_finish();
}
