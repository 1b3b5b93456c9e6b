/* tests/unit/test_ipc_server.c: the nng server and libedgelm over real
 * ipc:// sockets in $TEST_TMPDIR.
 *
 * The handler below plays the daemon: it answers most ops at once, keeps
 * streams whose text grows on a worker thread, holds long-polls and answers
 * them later from that thread, emulates a bounded queue of 16, and can
 * delay chosen poll replies past the client's timeout (a lost reply) to show
 * that streaming neither loses nor repeats text. */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"
#include "tests/test.h"

#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the emulated daemon -------------------------------------------------- */

#define QUEUE_CAP 16
#define MAX_STREAMS 64
#define MAX_PENDING 512
#define MAX_HELD 8

struct tstream {
	bool used;
	char id[IPC_ID_MAX + 1];
	char text[4096];
	size_t total;    /* bytes the stream will have */
	size_t produced; /* bytes produced so far */
	bool cancelled;
	bool lossy;
	unsigned polls;
	unsigned ticks;
	unsigned gen; /* slot reuse count */
};

struct pending {
	ipc_call *call;
	int stream;
	unsigned gen;
	uint64_t ack;
	uint64_t deadline_ns; /* reply by then at the latest */
	uint64_t not_before_ns;
};

struct queued {
	ipc_call *call;
	uint64_t done_ns;
};

struct tdaemon {
	ipc_server *srv;
	char url[600];
	char path[512];
	pthread_mutex_t mu;
	pthread_t worker;
	atomic_bool quit;
	struct tstream streams[MAX_STREAMS];
	struct pending pend[MAX_PENDING];
	size_t n_pend;
	struct queued queue[QUEUE_CAP];
	size_t n_queue;
	ipc_call *held[MAX_HELD];
	size_t n_held;
	atomic_int late_polls; /* poll replies delayed past the client's timeout */
	atomic_int double_reply_rc;
};

static const char *const words[] = {
    "Once ", "upon ",  "a ",  "time ", "th\xc3\xa9re ", "was ", "a ", "tiny ", "\xf0\x9f\x90\xb1 ",
    "who ",  "liked ", "to ", "nap. "};

/* The text a stream of `n` words produces. */
static size_t stream_text(char *buf, size_t cap, int n)
{
	size_t len = 0;
	for (int i = 0; i < n; i++) {
		const char *w = words[i % CM_ARRAY_LEN(words)];
		size_t l = strlen(w);
		if (len + l >= cap)
			break;
		memcpy(buf + len, w, l);
		len += l;
	}
	buf[len] = '\0';
	return len;
}

/* Encoded replies are built under the lock and sent after it is dropped. */
struct outbox {
	ipc_call *call[MAX_PENDING + QUEUE_CAP + 4];
	char *json[MAX_PENDING + QUEUE_CAP + 4];
	size_t n;
};

static void outbox_add(struct outbox *o, ipc_call *c, const struct ipc_reply *r)
{
	char *json = NULL;
	size_t len;
	struct ipc_reply copy = *r;
	if (!copy.id)
		copy.id = ipc_call_request(c)->id;
	if (ipc_reply_encode(&copy, &json, &len, NULL) != 0)
		abort();
	o->call[o->n] = c;
	o->json[o->n] = json;
	o->n++;
}

static void outbox_flush(struct outbox *o)
{
	for (size_t i = 0; i < o->n; i++) {
		ipc_call_reply(o->call[i], o->json[i], strlen(o->json[i]));
		cm_free(o->json[i]);
	}
	o->n = 0;
}

static void outbox_add_error(struct outbox *o, ipc_call *c, enum ipc_errcode code)
{
	char *json = NULL;
	if (ipc_error_encode(code, ipc_call_request(c)->id, NULL, -1, &json, NULL) != 0)
		abort();
	o->call[o->n] = c;
	o->json[o->n] = json;
	o->n++;
}

static void poll_reply(struct tdaemon *d, struct outbox *o, ipc_call *c, int si, uint64_t ack)
{
	struct tstream *s = &d->streams[si];
	struct ipc_reply r = {.op = IPC_OP_POLL, .retry_after_ms = -1};
	r.id = s->id;
	r.u.poll.offset = ack;
	r.u.poll.text = s->text + ack;
	r.u.poll.text_len = s->produced - ack;
	bool finished = s->produced == s->total;
	if (finished) {
		r.u.poll.done = true;
		r.u.poll.finish = s->cancelled ? IPC_FINISH_CANCELLED : IPC_FINISH_STOP;
		r.u.poll.usage = (struct ipc_usage){3, 0, (int64_t)s->total};
		r.u.poll.timings = (struct ipc_timings){0.1, 2, 1, 5, 7, 3000, 200};
	}
	outbox_add(o, c, &r);
	/* The client acknowledged the whole finished stream: free it. */
	if (finished && ack == s->total)
		s->used = false;
}

static int stream_find(struct tdaemon *d, const char *id)
{
	for (int i = 0; i < MAX_STREAMS; i++)
		if (d->streams[i].used && strcmp(d->streams[i].id, id) == 0)
			return i;
	return -1;
}

static void *worker_main(void *arg)
{
	struct tdaemon *d = arg;
	static struct outbox o; /* one worker thread */
	while (!atomic_load(&d->quit)) {
		usleep(3000);
		uint64_t now = cm_now_ns();
		pthread_mutex_lock(&d->mu);
		/* grow streams by one word */
		for (int i = 0; i < MAX_STREAMS; i++) {
			struct tstream *s = &d->streams[i];
			if (!s->used || s->produced == s->total)
				continue;
			if (s->lossy && (s->polls == 0 || ++s->ticks % 8 != 0))
				continue; /* slower, so that many polls are made */
			const char *sp = memchr(s->text + s->produced, ' ', s->total - s->produced);
			s->produced = sp ? (size_t)(sp - s->text) + 1 : s->total;
		}
		/* answer long-polls that have text, an end, or ran out of time */
		for (size_t i = 0; i < d->n_pend;) {
			struct pending *p = &d->pend[i];
			struct tstream *s = &d->streams[p->stream];
			bool ready = s->produced > p->ack || s->produced == s->total ||
			             now >= p->deadline_ns;
			if (ready && now >= p->not_before_ns) {
				if (!s->used || s->gen != p->gen) /* freed meanwhile */
					outbox_add_error(&o, p->call, IPC_ERR_NOT_FOUND);
				else
					poll_reply(d, &o, p->call, p->stream, p->ack);
				d->pend[i] = d->pend[--d->n_pend];
			} else {
				i++;
			}
		}
		/* the bounded queue: each entry finishes after ~20 ms */
		for (size_t i = 0; i < d->n_queue;) {
			if (now >= d->queue[i].done_ns) {
				struct ipc_reply r = {.op = IPC_OP_GENERATE, .retry_after_ms = -1};
				r.u.gen.text = "queued work done";
				r.u.gen.text_len = strlen(r.u.gen.text);
				r.u.gen.finish = IPC_FINISH_LENGTH;
				outbox_add(&o, d->queue[i].call, &r);
				d->queue[i] = d->queue[--d->n_queue];
			} else {
				i++;
			}
		}
		pthread_mutex_unlock(&d->mu);
		outbox_flush(&o);
	}
	return NULL;
}

static void handle_gen(struct tdaemon *d, ipc_call *c, const struct ipc_request *q,
                       struct outbox *o)
{
	const char *prompt =
	    q->op == IPC_OP_CHAT ? q->messages[q->n_messages - 1].content : q->prompt;
	struct ipc_reply r = {.op = q->op, .retry_after_ms = -1};
	if (strcmp(prompt, "hold") == 0) {
		if (d->n_held < MAX_HELD) {
			d->held[d->n_held++] = c;
			return;
		}
	}
	if (strncmp(prompt, "queue", 5) == 0) {
		if (d->n_queue == QUEUE_CAP) {
			pthread_mutex_unlock(&d->mu);
			ipc_call_error(c, IPC_ERR_QUEUE_FULL, 100, "queue full (%d waiting)",
			               QUEUE_CAP);
			pthread_mutex_lock(&d->mu);
			return;
		}
		d->queue[d->n_queue].call = c;
		d->queue[d->n_queue].done_ns = cm_now_ns() + 20000000u;
		d->n_queue++;
		return;
	}
	if (q->stream) {
		int si = -1;
		for (int i = 0; i < MAX_STREAMS && si < 0; i++)
			if (!d->streams[i].used)
				si = i;
		if (si < 0) {
			pthread_mutex_unlock(&d->mu);
			ipc_call_error(c, IPC_ERR_QUEUE_FULL, 50, NULL);
			pthread_mutex_lock(&d->mu);
			return;
		}
		struct tstream *s = &d->streams[si];
		unsigned gen = s->gen + 1;
		memset(s, 0, sizeof(*s));
		s->gen = gen;
		s->used = true;
		snprintf(s->id, sizeof(s->id), "%s", q->id ? q->id : "anon");
		s->lossy = strncmp(prompt, "lossy", 5) == 0;
		s->total = stream_text(s->text, sizeof(s->text), q->sampling.max_tokens);
		r.id = s->id;
		r.u.gen.stream = true;
		outbox_add(o, c, &r);
		return;
	}
	char text[256];
	/* structured output: the echo shows what arrived */
	snprintf(text, sizeof(text), "echo: %s%s%s", prompt,
	         q->json_schema ? " schema=" : q->grammar ? " grammar=" : "",
	         q->json_schema ? q->json_schema : q->grammar ? q->grammar : "");
	r.u.gen.text = text;
	r.u.gen.text_len = strlen(text);
	r.u.gen.finish = IPC_FINISH_STOP;
	r.u.gen.usage = (struct ipc_usage){(int64_t)strlen(prompt), 0, 2};
	r.u.gen.timings = (struct ipc_timings){0.5, 1.5, 1, 2, 3.5, 1000, 500};
	outbox_add(o, c, &r);
}

static void handler(ipc_call *c, void *userdata)
{
	struct tdaemon *d = userdata;
	const struct ipc_request *q = ipc_call_request(c);
	struct outbox *o = cm_calloc(1, sizeof(*o));
	struct ipc_reply r = {.op = q->op, .retry_after_ms = -1};
	if (!o)
		abort();
	pthread_mutex_lock(&d->mu);
	switch (q->op) {
	case IPC_OP_HEALTH:
		r.u.health.status = IPC_HEALTH_READY;
		outbox_add(o, c, &r);
		break;
	case IPC_OP_INFO: {
		static const char *const qt[] = {"F32"};
		r.u.info = (struct ipc_info_reply){.version = "test",
		                                   .model = "test.gguf",
		                                   .architecture = "llama",
		                                   .quant_types = qt,
		                                   .n_quant_types = 1,
		                                   .n_ctx = 256,
		                                   .n_vocab = 512,
		                                   .isa = "generic",
		                                   .threads = 1};
		outbox_add(o, c, &r);
		break;
	}
	case IPC_OP_METRICS: {
		const struct ipc_metric m[] = {{"edgelm_requests_total", "counter", NULL, 0, 1}};
		r.u.metrics.items = m;
		r.u.metrics.n_items = 1;
		outbox_add(o, c, &r);
		break;
	}
	case IPC_OP_TOKENIZE: {
		int32_t ids[256];
		size_t n = CM_MIN(q->text_len, CM_ARRAY_LEN(ids));
		for (size_t i = 0; i < n; i++)
			ids[i] = (unsigned char)q->text[i];
		r.u.tokenize.ids = ids;
		r.u.tokenize.n_ids = n;
		outbox_add(o, c, &r);
		break;
	}
	case IPC_OP_DETOKENIZE: {
		char t[256];
		size_t n = CM_MIN(q->n_ids, sizeof(t));
		for (size_t i = 0; i < n; i++)
			t[i] = (char)q->ids[i];
		r.u.detokenize.text = t;
		r.u.detokenize.text_len = n;
		outbox_add(o, c, &r);
		break;
	}
	case IPC_OP_CANCEL: {
		int si = stream_find(d, q->id);
		if (si < 0) {
			pthread_mutex_unlock(&d->mu);
			ipc_call_error(c, IPC_ERR_NOT_FOUND, -1, "no generation '%s'", q->id);
			pthread_mutex_lock(&d->mu);
			break;
		}
		struct tstream *s = &d->streams[si];
		r.u.cancel.cancelled = s->produced < s->total;
		s->total = s->produced;
		s->cancelled = r.u.cancel.cancelled;
		outbox_add(o, c, &r);
		break;
	}
	case IPC_OP_POLL: {
		int si = stream_find(d, q->id);
		if (si < 0) {
			pthread_mutex_unlock(&d->mu);
			ipc_call_error(c, IPC_ERR_NOT_FOUND, -1, "no stream '%s'", q->id);
			pthread_mutex_lock(&d->mu);
			break;
		}
		struct tstream *s = &d->streams[si];
		if (q->ack > s->produced) {
			pthread_mutex_unlock(&d->mu);
			ipc_call_error(c, IPC_ERR_INVALID_FIELD, -1, "ack beyond the stream");
			pthread_mutex_lock(&d->mu);
			break;
		}
		uint64_t now = cm_now_ns();
		bool late = s->lossy && (s->polls++ % 3) == 1;
		if (!late && (s->produced > q->ack || s->produced == s->total)) {
			poll_reply(d, o, c, si, q->ack);
			break;
		}
		if (d->n_pend == MAX_PENDING)
			abort();
		d->pend[d->n_pend++] = (struct pending){
		    .call = c,
		    .stream = si,
		    .gen = s->gen,
		    .ack = q->ack,
		    .deadline_ns = now + (uint64_t)q->wait_ms * 1000000u,
		    .not_before_ns = late ? now + 700000000u : 0,
		};
		if (late)
			atomic_fetch_add(&d->late_polls, 1);
		break;
	}
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT:
		handle_gen(d, c, q, o);
		break;
	default:
		pthread_mutex_unlock(&d->mu);
		ipc_call_error(c, IPC_ERR_UNSUPPORTED, -1, NULL);
		pthread_mutex_lock(&d->mu);
		break;
	}
	pthread_mutex_unlock(&d->mu);
	outbox_flush(o);
	cm_free(o);
}

static struct tdaemon *daemon_start(const char *name, const struct ipc_server_params *extra)
{
	struct tdaemon *d = cm_calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	pthread_mutex_init(&d->mu, NULL);
	snprintf(d->path, sizeof(d->path), "%s/%s-%d.sock", test_tmpdir(), name, (int)getpid());
	snprintf(d->url, sizeof(d->url), "ipc://%s", d->path);
	struct ipc_server_params p = {0};
	if (extra)
		p = *extra;
	const char *urls[] = {d->url};
	p.urls = urls;
	p.n_urls = 1;
	/* The self-check runs beside everything here (and under LeakSanitizer);
	 * nothing wedges the listener, so it never re-creates it. */
	if (!p.selfcheck_ms)
		p.selfcheck_ms = 100;
	struct cm_err err = {0};
	int rc = ipc_server_new(&p, handler, d, &d->srv, &err);
	CHECK_MSG(rc == 0, "ipc_server_new: %s", err.msg);
	if (rc == 0) {
		rc = ipc_server_start(d->srv, &err);
		CHECK_MSG(rc == 0, "ipc_server_start: %s", err.msg);
	}
	if (rc) {
		ipc_server_free(d->srv);
		cm_free(d);
		return NULL;
	}
	pthread_create(&d->worker, NULL, worker_main, d);
	return d;
}

static void daemon_stop(struct tdaemon *d)
{
	if (!d)
		return;
	/* Answer what is still held so every call completes before free. */
	pthread_mutex_lock(&d->mu);
	size_t nh = d->n_held;
	ipc_call *held[MAX_HELD];
	memcpy(held, d->held, sizeof(held));
	d->n_held = 0;
	pthread_mutex_unlock(&d->mu);
	for (size_t i = 0; i < nh; i++)
		ipc_call_error(held[i], IPC_ERR_SHUTTING_DOWN, -1, NULL);
	/* Let long-polls finish (the worker answers them by their deadline). */
	for (int i = 0; i < 400; i++) {
		pthread_mutex_lock(&d->mu);
		size_t n = d->n_pend + d->n_queue;
		pthread_mutex_unlock(&d->mu);
		if (n == 0)
			break;
		usleep(10000);
	}
	struct ipc_server_stats st;
	ipc_server_stats_get(d->srv, &st);
	CHECK_EQ_INT(st.listener_recoveries, 0);
	int left = ipc_server_stop(d->srv, 2000);
	CHECK_EQ_INT(left, 0);
	atomic_store(&d->quit, true);
	pthread_join(d->worker, NULL);
	ipc_server_free(d->srv);
	pthread_mutex_destroy(&d->mu);
	cm_free(d);
}

static edgelm_client *connect_to(struct tdaemon *d)
{
	edgelm_client *c = NULL;
	struct edgelm_error e;
	int rc = edgelm_connect(d->url, &c, &e);
	CHECK_MSG(rc == 0, "edgelm_connect: %s", e.message);
	return c;
}

static bool health_ok(struct tdaemon *d)
{
	edgelm_client *c = connect_to(d);
	if (!c)
		return false;
	enum edgelm_health h = EDGELM_HEALTH_LOADING;
	struct edgelm_error e;
	int rc = edgelm_health(c, &h, NULL, &e);
	edgelm_close(c);
	return rc == 0 && h == EDGELM_HEALTH_READY;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_ops_and_socket_file(void)
{
	struct group *g = getgrgid(getegid());
	struct ipc_server_params p = {.socket_group = g ? g->gr_name : NULL};
	struct tdaemon *d = daemon_start("ops", &p);
	if (!d)
		return;
	struct stat st;
	CHECK(stat(d->path, &st) == 0);
	CHECK(S_ISSOCK(st.st_mode));
	CHECK_EQ_INT(st.st_mode & 07777, 0660);
	CHECK_EQ_INT(st.st_gid, getegid());

	edgelm_client *c = connect_to(d);
	if (!c) {
		daemon_stop(d);
		return;
	}
	struct edgelm_error e;
	enum edgelm_health h;
	char *json = NULL;
	CHECK_OK(edgelm_health(c, &h, &json, &e));
	CHECK_EQ_INT(h, EDGELM_HEALTH_READY);
	CHECK(json && strstr(json, "\"status\":\"ready\""));
	edgelm_free(json);
	CHECK_OK(edgelm_info(c, &json, &e));
	CHECK(json && strstr(json, "\"architecture\":\"llama\""));
	edgelm_free(json);
	CHECK_OK(edgelm_metrics(c, &json, &e));
	CHECK(json && strstr(json, "edgelm_requests_total"));
	edgelm_free(json);

	int32_t *ids = NULL;
	size_t n = 0;
	CHECK_OK(edgelm_tokenize(c, "abc", true, false, &ids, &n, &e));
	CHECK(n == 3 && ids && ids[0] == 'a' && ids[2] == 'c');
	char *text = NULL;
	CHECK_OK(edgelm_detokenize(c, ids, n, &text, &e));
	CHECK_STREQ(text, "abc");
	edgelm_free(ids);
	edgelm_free(text);

	struct edgelm_params prm;
	edgelm_params_init(&prm);
	prm.temperature = 0;
	prm.max_tokens = 5;
	struct edgelm_result res;
	CHECK_OK(edgelm_generate(c, "hello", &prm, &res, &e));
	CHECK_STREQ(res.text, "echo: hello");
	CHECK_EQ_INT(res.finish, EDGELM_FINISH_STOP);
	CHECK_EQ_INT(res.prompt_tokens, 5);
	CHECK(res.ttft_ms == 1.5);
	CHECK(strncmp(res.id, "c-", 2) == 0);
	edgelm_result_free(&res);

	const struct edgelm_message msgs[] = {{"system", "Be brief."}, {"user", "hi there"}};
	CHECK_OK(edgelm_chat(c, msgs, 2, NULL, NULL, NULL, &res, &e));
	CHECK_STREQ(res.text, "echo: hi there");
	edgelm_result_free(&res);
	const struct edgelm_message badrole[] = {{"robot", "x"}};
	CHECK_EQ_INT(edgelm_chat(c, badrole, 1, NULL, NULL, NULL, &res, &e), EDGELM_E_INVALID_ARG);

	/* grammar and json_schema reach the daemon, the schema as compact JSON;
	 * bad schema text and both at once are refused here */
	struct edgelm_params sp;
	edgelm_params_init(&sp);
	sp.json_schema = "{ \"type\": \"object\",\n  \"required\": [] }";
	CHECK_OK(edgelm_generate(c, "hello", &sp, &res, &e));
	CHECK_STREQ(res.text, "echo: hello schema={\"type\":\"object\",\"required\":[]}");
	edgelm_result_free(&res);
	sp.json_schema = NULL;
	sp.grammar = "root ::= \"a\"";
	CHECK_OK(edgelm_chat(c, msgs, 2, &sp, NULL, NULL, &res, &e));
	CHECK_STREQ(res.text, "echo: hi there grammar=root ::= \"a\"");
	edgelm_result_free(&res);
	sp.json_schema = "{}";
	CHECK_EQ_INT(edgelm_generate(c, "x", &sp, &res, &e), EDGELM_E_INVALID_ARG);
	CHECK(strstr(e.message, "exclude") != NULL);
	sp.grammar = NULL;
	sp.json_schema = "{\"type\":";
	CHECK_EQ_INT(edgelm_generate(c, "x", &sp, &res, &e), EDGELM_E_INVALID_ARG);
	CHECK(strstr(e.message, "json_schema: invalid JSON") != NULL);
	sp.json_schema = "[{}]";
	CHECK_EQ_INT(edgelm_generate(c, "x", &sp, &res, &e), EDGELM_E_INVALID_ARG);
	CHECK(strstr(e.message, "object") != NULL);

	bool cancelled = true;
	CHECK_EQ_INT(edgelm_cancel(c, "no-such-id", &cancelled, &e), EDGELM_E_NOT_FOUND);
	CHECK_STREQ(e.server_code, "not_found");
	CHECK(strstr(e.message, "no-such-id") != NULL);

	/* a daemon-side range check, through the library */
	prm.top_p = 2;
	CHECK_EQ_INT(edgelm_generate(c, "x", &prm, &res, &e), EDGELM_E_INVALID_FIELD);
	CHECK(res.text == NULL);
	CHECK(strstr(e.message, "top_p") != NULL);

	struct ipc_server_stats ss;
	ipc_server_stats_get(d->srv, &ss);
	CHECK(ss.received >= 9);
	CHECK(ss.errors[IPC_ERR_NOT_FOUND] == 1 && ss.errors[IPC_ERR_INVALID_FIELD] == 1);
	CHECK_EQ_INT(ss.in_handler, 0);
	edgelm_close(c);
	char path[sizeof(d->path)];
	memcpy(path, d->path, sizeof(path));
	daemon_stop(d);
	/* closing the socket removed its file */
	CHECK(stat(path, &st) != 0);
}

struct collect {
	char buf[4096];
	size_t len;
	int chunks;
	int stop_after; /* > 0: return 1 after that many chunks */
};

static int collect_cb(const char *text, size_t len, void *user)
{
	struct collect *cl = user;
	if (cl->len + len < sizeof(cl->buf)) {
		memcpy(cl->buf + cl->len, text, len);
		cl->len += len;
		cl->buf[cl->len] = '\0';
	}
	cl->chunks++;
	return cl->stop_after > 0 && cl->chunks >= cl->stop_after;
}

static void test_streaming(void)
{
	struct tdaemon *d = daemon_start("stream", NULL);
	edgelm_client *c = d ? connect_to(d) : NULL;
	if (!c) {
		daemon_stop(d);
		return;
	}
	char want[4096];
	size_t want_len = stream_text(want, sizeof(want), 40);
	struct edgelm_params prm;
	edgelm_params_init(&prm);
	prm.max_tokens = 40;
	prm.poll_wait_ms = 200;
	struct edgelm_result res;
	struct edgelm_error e;
	struct collect cl = {.len = 0};

	CHECK_OK(edgelm_generate_stream(c, "tell a story", &prm, collect_cb, &cl, &res, &e));
	CHECK_EQ_INT(cl.len, want_len);
	CHECK_STREQ(cl.buf, want);
	CHECK_STREQ(res.text, want);
	CHECK(cl.chunks > 1);
	CHECK_EQ_INT(res.finish, EDGELM_FINISH_STOP);
	CHECK_EQ_INT(res.completion_tokens, (int64_t)want_len);
	edgelm_result_free(&res);

	/* lost replies: every third poll is answered after the client gave up
	 * on it, so the client asks again from the same offset */
	edgelm_set_timeout(c, 250);
	prm.poll_wait_ms = 50;
	prm.id = "lossy-1";
	memset(&cl, 0, sizeof(cl));
	CHECK_OK(edgelm_generate_stream(c, "lossy story", &prm, collect_cb, &cl, &res, &e));
	CHECK_STREQ(cl.buf, want);
	CHECK_STREQ(res.text, want);
	CHECK_STREQ(res.id, "lossy-1");
	CHECK(atomic_load(&d->late_polls) >= 2);
	edgelm_result_free(&res);
	edgelm_set_timeout(c, 30000);

	/* the callback stops the stream: the library cancels it */
	prm.id = "stopped-1";
	prm.poll_wait_ms = 200;
	memset(&cl, 0, sizeof(cl));
	cl.stop_after = 2;
	CHECK_EQ_INT(edgelm_generate_stream(c, "story", &prm, collect_cb, &cl, &res, &e),
	             EDGELM_E_ABORTED);
	CHECK_EQ_INT(res.finish, EDGELM_FINISH_CANCELLED);
	CHECK(res.text_len > 0 && res.text_len < want_len);
	edgelm_result_free(&res);
	/* the daemon saw the cancel */
	pthread_mutex_lock(&d->mu);
	int si = stream_find(d, "stopped-1");
	CHECK(si >= 0 && d->streams[si].cancelled);
	pthread_mutex_unlock(&d->mu);

	/* streamed chat */
	const struct edgelm_message msgs[] = {{"user", "go"}};
	prm.id = NULL;
	memset(&cl, 0, sizeof(cl));
	CHECK_OK(edgelm_chat(c, msgs, 1, &prm, collect_cb, &cl, &res, &e));
	CHECK_STREQ(res.text, want);
	edgelm_result_free(&res);

	/* the finished streams were acknowledged and freed by the final poll */
	pthread_mutex_lock(&d->mu);
	CHECK(stream_find(d, "lossy-1") < 0);
	pthread_mutex_unlock(&d->mu);
	edgelm_close(c);
	daemon_stop(d);
}

struct client_job {
	struct tdaemon *d;
	int ok, fail;
};

static void *client_thread(void *arg)
{
	struct client_job *j = arg;
	edgelm_client *c = NULL;
	struct edgelm_error e;
	if (edgelm_connect(j->d->url, &c, &e) != 0) {
		j->fail++;
		return NULL;
	}
	char want[4096];
	size_t want_len = stream_text(want, sizeof(want), 6);
	for (int i = 0; i < 12; i++) {
		struct edgelm_result res;
		struct edgelm_params prm;
		edgelm_params_init(&prm);
		enum edgelm_health h;
		int rc;
		switch (i % 3) {
		case 0:
			rc = edgelm_health(c, &h, NULL, &e);
			break;
		case 1:
			rc = edgelm_generate(c, "ping", NULL, &res, &e);
			if (rc == 0 && strcmp(res.text, "echo: ping") != 0)
				rc = -1;
			edgelm_result_free(&res);
			break;
		default:
			prm.max_tokens = 6;
			prm.poll_wait_ms = 100;
			rc = edgelm_generate_stream(c, "s", &prm, NULL, NULL, &res, &e);
			if (rc == 0 && (res.text_len != want_len || strcmp(res.text, want) != 0))
				rc = -1;
			edgelm_result_free(&res);
			break;
		}
		if (rc == 0)
			j->ok++;
		else
			j->fail++;
	}
	edgelm_close(c);
	return NULL;
}

static void test_concurrent_clients(void)
{
	struct tdaemon *d = daemon_start("many", NULL);
	if (!d)
		return;
	enum { N = 12 };
	pthread_t th[N];
	struct client_job jobs[N];
	for (int i = 0; i < N; i++) {
		jobs[i] = (struct client_job){.d = d};
		pthread_create(&th[i], NULL, client_thread, &jobs[i]);
	}
	int ok = 0, fail = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		ok += jobs[i].ok;
		fail += jobs[i].fail;
	}
	CHECK_EQ_INT(fail, 0);
	CHECK_EQ_INT(ok, N * 12);
	daemon_stop(d);
}

/* 1000 requests in flight at once from one raw nng req0 socket (one context
 * each) against a handler whose queue holds 16. */
static void test_queue_full_1000(void)
{
	struct tdaemon *d = daemon_start("flood", NULL);
	if (!d)
		return;
	enum { N = 1000 };
	nng_socket s;
	CHECK_OK(nng_req0_open(&s));
	CHECK_OK(nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE));
	CHECK_OK(nng_dial(s, d->url, NULL, 0));
	nng_ctx *ctx = calloc(N, sizeof(*ctx));
	nng_aio **aio = calloc(N, sizeof(*aio));
	const char *req = "{\"v\":1,\"op\":\"generate\",\"prompt\":\"queue me\",\"max_tokens\":4}";
	for (int i = 0; i < N; i++) {
		nng_msg *m;
		CHECK_OK(nng_ctx_open(&ctx[i], s));
		CHECK_OK(nng_aio_alloc(&aio[i], NULL, NULL));
		nng_aio_set_timeout(aio[i], 15000);
		CHECK_OK(nng_msg_alloc(&m, 0));
		CHECK_OK(nng_msg_append(m, req, strlen(req)));
		nng_aio_set_msg(aio[i], m);
		nng_ctx_send(ctx[i], aio[i]);
	}
	for (int i = 0; i < N; i++) {
		nng_aio_wait(aio[i]);
		CHECK_OK(nng_aio_result(aio[i]));
		nng_ctx_recv(ctx[i], aio[i]);
	}
	int ok = 0, full = 0, other = 0, with_hint = 0;
	for (int i = 0; i < N; i++) {
		nng_aio_wait(aio[i]);
		if (nng_aio_result(aio[i]) != 0) {
			other++;
			continue;
		}
		nng_msg *m = nng_aio_get_msg(aio[i]);
		struct ipc_reply *r = NULL;
		if (ipc_reply_decode(nng_msg_body(m), nng_msg_len(m), IPC_OP_GENERATE, &r, NULL) ==
		    0) {
			if (r->error == IPC_ERR_NONE)
				ok++;
			else if (r->error == IPC_ERR_QUEUE_FULL) {
				full++;
				with_hint += r->retry_after_ms == 100;
			} else
				other++;
			ipc_reply_free(r);
		} else {
			other++;
		}
		nng_msg_free(m);
	}
	for (int i = 0; i < N; i++) {
		nng_aio_free(aio[i]);
		nng_ctx_close(ctx[i]);
	}
	free(aio);
	free(ctx);
	nng_close(s);
	CHECK_EQ_INT(other, 0);
	CHECK_EQ_INT(ok + full, N);
	CHECK(ok >= QUEUE_CAP);
	CHECK(full > 0);
	CHECK_EQ_INT(with_hint, full);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "1000 requests: %d done, %d queue_full\n", ok, full);
	CHECK(health_ok(d));
	daemon_stop(d);
}

/* A 2 MB generate request (a prompt of spaces). */
static char *oversized_request(size_t *ret_len)
{
	size_t big = 2u << 20;
	char *huge = malloc(big);
	if (!huge)
		abort();
	memset(huge, ' ', big);
	memcpy(huge, "{\"op\":\"generate\",\"prompt\":\"", 27);
	memcpy(huge + big - 2, "\"}", 2);
	*ret_len = big;
	return huge;
}

/* `test_ipc_server --oversized-client URL`, run by test_hostile_over_wire:
 * sends the 2 MB request with no local limit (the daemon's transport must
 * drop the connection: the call fails with EDGELM_E_CONNECTION), then asks
 * the same client for health (it reconnects). Exit 0 when both hold. */
static int oversized_client(const char *url)
{
	edgelm_client *c;
	struct edgelm_error e;
	if (edgelm_connect(url, &c, &e) != 0) {
		printf("connect %s: %s\n", url, e.message);
		return 1;
	}
	edgelm_set_max_msg(c, 0);
	edgelm_set_timeout(c, 10000);
	size_t big;
	char *huge = oversized_request(&big), *reply = NULL;
	int rc = edgelm_call_json(c, huge, big, &reply, NULL, &e), ret = 0;
	free(huge);
	edgelm_free(reply);
	if (rc != EDGELM_E_CONNECTION) {
		printf("2 MB: %d (%s), want the connection dropped\n", rc, e.message);
		ret = 2;
	}
	enum edgelm_health h;
	rc = edgelm_health(c, &h, NULL, &e);
	if (rc != 0) {
		printf("health after the drop: %d (%s)\n", rc, e.message);
		ret = 3;
	}
	edgelm_close(c);
	return ret;
}

/* Hostile requests over the wire: each gets its code, and the daemon still
 * answers health. The 2 MB message is over NNG_OPT_RECVMAXSZ: nng drops the
 * connection without reading it, so the sender sees the connection lost;
 * libedgelm refuses it locally before sending. */
static void test_hostile_over_wire(void)
{
	struct tdaemon *d = daemon_start("hostile", NULL);
	edgelm_client *c = d ? connect_to(d) : NULL;
	if (!c) {
		daemon_stop(d);
		return;
	}
	edgelm_set_max_msg(c, 0);
	static const struct {
		const char *json;
		int want;
	} cases[] = {
	    {"{\"op\":\"health\"", EDGELM_E_INVALID_JSON},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"temperature\":NaN}", EDGELM_E_INVALID_JSON},
	    {"{\"op\":\"launch\"}", EDGELM_E_UNKNOWN_OP},
	    {"{\"op\":\"generate\",\"prompt\":7}", EDGELM_E_INVALID_FIELD},
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"max_tokens\":-1}", EDGELM_E_INVALID_FIELD},
	    {"{\"v\":9,\"op\":\"health\"}", EDGELM_E_UNSUPPORTED_VERSION},
	    {"{\"op\":\"poll\",\"id\":\"nope\"}", EDGELM_E_NOT_FOUND},
	    {"\xff\xfe", EDGELM_E_INVALID_JSON},
	    {"{\"op\":\"health\"}", 0},
	};
	struct edgelm_error e;
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		char *reply = NULL;
		int rc =
		    edgelm_call_json(c, cases[i].json, strlen(cases[i].json), &reply, NULL, &e);
		CHECK_MSG(rc == cases[i].want, "%s: got %d (%s)", cases[i].json, rc, e.message);
		CHECK(reply != NULL);
		edgelm_free(reply);
	}
	/* deep nesting */
	struct sbuf {
		char *p;
		size_t n;
	} b;
	b.n = 10000;
	b.p = malloc(b.n);
	memset(b.p, '[', b.n);
	char *reply = NULL;
	CHECK_EQ_INT(edgelm_call_json(c, b.p, b.n, &reply, NULL, &e), EDGELM_E_INVALID_JSON);
	edgelm_free(reply);
	free(b.p);

	/* 300000 values in 600 KB: too_large from the parser */
	b.n = 600030;
	b.p = malloc(b.n + 1);
	size_t k = (size_t)snprintf(b.p, b.n, "{\"op\":\"detokenize\",\"ids\":[0");
	while (k + 4 < b.n) {
		b.p[k++] = ',';
		b.p[k++] = '0';
	}
	b.p[k++] = ']';
	b.p[k++] = '}';
	CHECK_EQ_INT(edgelm_call_json(c, b.p, k, &reply, NULL, &e), EDGELM_E_TOO_LARGE);
	CHECK_STREQ(e.server_code, "too_large");
	edgelm_free(reply);
	free(b.p);

	/* 2 MB, over the 1 MiB limit: the client's own limit refuses it
	 * without sending ... */
	size_t big;
	char *huge = oversized_request(&big);
	edgelm_set_max_msg(c, 1u << 20);
	CHECK_EQ_INT(edgelm_call_json(c, huge, big, &reply, NULL, &e), EDGELM_E_TOO_LARGE);
	CHECK(reply == NULL);
	free(huge);
	/* ... and sent anyway by a client in its own process (as in use), the
	 * daemon's transport drops the connection, the same client reconnects
	 * and gets health (oversized_client). With both ends in this process,
	 * nng 1.5.2's shared reaper stalled after the drop in ~1 of 30 runs
	 * under load, nng_close then waiting for good; across processes 450
	 * drops by 3 concurrent clients against edgelmd left it healthy. When
	 * the client's own reconnect stalls the same way (CI, once, under ASan),
	 * its next call dials afresh (test_redial_after_stall). The
	 * client's own close can still stall after its drop (seen once in the
	 * seventh session, the child waiting in nng_close): edgelm_close now
	 * gives up waiting after IPC_CLOSE_WAIT_MS (test_close_bounded). */
	char self[4096], cmd[8192], *out = NULL;
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sl > 0);
	self[sl > 0 ? sl : 0] = '\0';
	snprintf(cmd, sizeof(cmd), "'%s' --oversized-client '%s' 2>&1", self, d->url);
	int rc = test_run_capture(cmd, &out);
	CHECK_MSG(rc == 0, "oversized client: exit %d: %s", rc, out);
	free(out);
	CHECK(health_ok(d)); /* and to a new client here */
	struct ipc_server_stats st;
	ipc_server_stats_get(d->srv, &st);
	CHECK(st.errors[IPC_ERR_INVALID_JSON] >= 4);
	edgelm_close(c);
	daemon_stop(d);
}

/* A blocking generate the test daemon holds unanswered ("hold"); `forever`
 * sets the client's timeout to 0. `done` is set when the call returned. */
struct held_gen {
	struct tdaemon *d;
	bool forever;
	int rc;
	char text[64];
	char msg[256];
	atomic_bool done;
};

static void *held_gen_thread(void *arg)
{
	struct held_gen *hg = arg;
	edgelm_client *c = NULL;
	struct edgelm_error e;
	hg->rc = edgelm_connect(hg->d->url, &c, &e);
	if (hg->rc == 0) {
		if (hg->forever)
			edgelm_set_timeout(c, 0);
		struct edgelm_result res;
		hg->rc = edgelm_generate(c, "hold", NULL, &res, &e);
		if (hg->rc == 0)
			snprintf(hg->text, sizeof(hg->text), "%s", res.text);
		else
			snprintf(hg->msg, sizeof(hg->msg), "%s", e.message);
		edgelm_result_free(&res);
		edgelm_close(c);
	}
	atomic_store(&hg->done, true);
	return NULL;
}

/* Wait (up to 2.5 s) until the test daemon holds a call. */
static void wait_held(struct tdaemon *d)
{
	for (int i = 0; i < 500; i++) {
		pthread_mutex_lock(&d->mu);
		size_t n = d->n_held;
		pthread_mutex_unlock(&d->mu);
		if (n)
			break;
		usleep(5000);
	}
}

struct stopper {
	ipc_server *srv;
	int left;
	atomic_bool done;
};

static void *stop_thread(void *arg)
{
	struct stopper *s = arg;
	s->left = ipc_server_stop(s->srv, 5000);
	atomic_store(&s->done, true);
	return NULL;
}

static void test_stop_while_busy(void)
{
	struct tdaemon *d = daemon_start("stop", NULL);
	if (!d)
		return;
	struct held_gen hg = {.d = d};
	pthread_t th, st;
	pthread_create(&th, NULL, held_gen_thread, &hg);
	wait_held(d);
	edgelm_client *c = connect_to(d);
	struct stopper sp = {.srv = d->srv};
	pthread_create(&st, NULL, stop_thread, &sp);
	usleep(50000);
	/* draining: new requests get shutting_down, the held one goes on */
	struct edgelm_error e;
	enum edgelm_health h;
	if (c) {
		CHECK_EQ_INT(edgelm_health(c, &h, NULL, &e), EDGELM_E_SHUTTING_DOWN);
		CHECK_STREQ(e.server_code, "shutting_down");
	}
	CHECK(!atomic_load(&sp.done));
	pthread_mutex_lock(&d->mu);
	ipc_call *held = d->n_held ? d->held[0] : NULL;
	d->n_held = 0;
	pthread_mutex_unlock(&d->mu);
	CHECK(held != NULL);
	if (held) {
		struct ipc_reply r = {.op = IPC_OP_GENERATE, .retry_after_ms = -1};
		r.u.gen.text = "finished while draining";
		r.u.gen.text_len = strlen(r.u.gen.text);
		r.u.gen.finish = IPC_FINISH_STOP;
		CHECK_OK(ipc_call_reply_encode(held, &r));
	}
	pthread_join(th, NULL);
	pthread_join(st, NULL);
	CHECK_OK(hg.rc);
	CHECK_STREQ(hg.text, "finished while draining");
	CHECK_EQ_INT(sp.left, 0);
	/* closed: the socket file is gone and clients cannot connect */
	struct stat sb;
	CHECK(stat(d->path, &sb) != 0);
	edgelm_client *c2 = NULL;
	CHECK_EQ_INT(edgelm_connect(d->url, &c2, &e), EDGELM_E_CONNECT);
	edgelm_close(c);
	daemon_stop(d);
}

/* The daemon goes away while a blocking generate with no timeout waits:
 * the call fails with EDGELM_E_CONNECTION (regression: the cancel the
 * library sends after the dropped reply waited forever for a reconnect,
 * so `edgelmctl --timeout 0 generate --no-stream` hung when edgelmd died). */
static void test_daemon_vanishes(void)
{
	struct tdaemon *d = daemon_start("vanish", NULL);
	if (!d)
		return;
	edgelm_client *c = connect_to(d);
	struct held_gen dg = {.d = d, .forever = true};
	pthread_t th;
	pthread_create(&th, NULL, held_gen_thread, &dg);
	wait_held(d);
	/* the daemon stops without answering the held call */
	CHECK_EQ_INT(ipc_server_stop(d->srv, 50), 1);
	for (int i = 0; i < 1000 && !atomic_load(&dg.done); i++)
		usleep(10000);
	CHECK_MSG(atomic_load(&dg.done), "generate still waiting 10 s after the daemon went away");
	if (atomic_load(&dg.done)) {
		pthread_join(th, NULL);
		CHECK_MSG(dg.rc == EDGELM_E_CONNECTION, "generate: %d (%s)", dg.rc, dg.msg);
	} else {
		pthread_detach(th); /* hung: leave it, the check above failed */
	}
	/* a later call on a client connected before waits for a reconnect at
	 * most its timeout, and says why it failed */
	if (c) {
		struct edgelm_error e;
		enum edgelm_health h;
		edgelm_set_timeout(c, 300);
		uint64_t t0 = cm_now_ns();
		CHECK_EQ_INT(edgelm_health(c, &h, NULL, &e), EDGELM_E_CONNECTION);
		CHECK(cm_now_ns() - t0 < 5000000000u);
		CHECK_MSG(strstr(e.message, "no connection") != NULL, "message: %s", e.message);
	}
	edgelm_close(c);
	daemon_stop(d);
}

/* edgelm_close with nng's close stalled (nng 1.5.2 after a dropped
 * connection: ipc/client.c): it returns after IPC_CLOSE_WAIT_MS, not never;
 * the close, once it can go on, finishes in the helper thread. The stall
 * is stood in for by a close that waits to be released: nng's own comes
 * ~1 time in 30 and cannot be had on demand (test_hostile_over_wire's
 * oversized client met it). A plain close returns at once. */
static atomic_int close_gate, close_calls;

static void gated_close(uint32_t id)
{
	/* 6 s at most, so that a close waited for in full fails the timing
	 * check below instead of hanging the test */
	for (int i = 0; i < 6000 && !atomic_load(&close_gate); i++)
		usleep(1000);
	nng_socket s = {.id = id};
	nng_close(s);
	atomic_fetch_add(&close_calls, 1);
}

static void test_close_bounded(void)
{
	struct tdaemon *d = daemon_start("close", NULL);
	if (!d)
		return;
	edgelm_client *c = connect_to(d);
	if (c) {
		uint64_t t0 = cm_now_ns();
		edgelm_close(c);
		CHECK_MSG(cm_now_ns() - t0 < 1000000000u, "a plain close took %.2f s",
			  (double)(cm_now_ns() - t0) / 1e9);
	}
	c = connect_to(d);
	if (c) {
		atomic_store(&close_gate, 0);
		atomic_store(&close_calls, 0);
		ipc_client_close_fn = gated_close;
		uint64_t t0 = cm_now_ns();
		edgelm_close(c);
		double dt = (double)(cm_now_ns() - t0) / 1e9;
		CHECK_MSG(dt >= IPC_CLOSE_WAIT_MS / 1e3 * 0.9 && dt < IPC_CLOSE_WAIT_MS / 1e3 + 2,
			  "edgelm_close with the close stalled returned after %.2f s", dt);
		CHECK_EQ_INT(atomic_load(&close_calls), 0);
		atomic_store(&close_gate, 1); /* the stall ends: the thread closes */
		for (int i = 0; i < 500 && atomic_load(&close_calls) == 0; i++)
			usleep(10000);
		CHECK_EQ_INT(atomic_load(&close_calls), 1);
		ipc_client_close_fn = NULL;
	}
	CHECK(health_ok(d)); /* the daemon saw the clients go */
	daemon_stop(d);
}

/* A client whose dialer never reconnects (nng 1.5.2's reaper stalled after
 * a drop; CI saw the oversized client's health wait 10 s for it) still gets
 * its next call through: after IPC_REDIAL_AFTER_MS it dials again itself. */
static void test_redial_after_stall(void)
{
	struct tdaemon *d = daemon_start("redial", NULL);
	edgelm_client *c = d ? connect_to(d) : NULL;
	if (!c) {
		daemon_stop(d);
		return;
	}
	edgelm_set_timeout(c, 3 * IPC_REDIAL_AFTER_MS + 10000);
	enum edgelm_health h;
	struct edgelm_error e;
	CHECK_EQ_INT(edgelm_health(c, &h, NULL, &e), 0);
	CHECK_EQ_INT(ipc_client_stall_dialer(c), 0);
	int rc = edgelm_health(c, &h, NULL, &e);
	CHECK_MSG(rc == 0, "health after the dialer stalled: %d (%s)", rc, e.message);
	for (int i = 0; i < 3; i++) /* the fresh dialer's connection stays */
		CHECK_EQ_INT(edgelm_health(c, &h, NULL, &e), 0);
	edgelm_close(c);
	daemon_stop(d);
}

/* In this process from now on, the chown family fails with EPERM, as
 * under the unit's SystemCallFilter=~@privileged. */
static int deny_chown(void)
{
#define DENY(nr)                                                            \
	BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1),                     \
	    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA))
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef __NR_chown
		DENY(__NR_chown),
		DENY(__NR_lchown),
#endif
		DENY(__NR_fchown),
		DENY(__NR_fchownat),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
#undef DENY
	struct sock_fprog prog = {.len = (unsigned short)CM_ARRAY_LEN(f), .filter = f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
		return -1;
	return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* `test_ipc_server --socket-group-child URL GROUP`: under deny_chown(),
 * start a server on URL with socket_group GROUP; exit 0 when it started
 * without a warning. A process of its own: nng's threads do not survive a
 * fork. */
static int socket_group_child(const char *url, const char *group)
{
	if (deny_chown() != 0)
		return 10;
	if (chown(test_tmpdir(), (uid_t)-1, getegid()) == 0 || errno != EPERM)
		return 11; /* the filter must bite, or this proves nothing */
	const char *u[] = {url};
	struct ipc_server_params p = {.socket_group = group, .urls = u, .n_urls = 1};
	struct tdaemon dd = {0};
	pthread_mutex_init(&dd.mu, NULL);
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	if (ipc_server_new(&p, handler, &dd, &srv, &err) != 0) {
		printf("ipc_server_new: %s\n", err.msg);
		return 12;
	}
	int rc = ipc_server_start(srv, &err);
	if (rc != 0 || err.code != 0)
		printf("start: %d: %s\n", rc, err.msg);
	int ret = rc != 0 ? 13 : err.code != 0 ? 1 : 0;
	ipc_server_free(srv);
	return ret;
}

/* The unit makes the socket in its own group (Group=edgelm) and forbids
 * chown: a socket_group that is already the socket's group must start
 * without the chgrp warning (it was logged at every start). */
static void test_socket_group_already_set(void)
{
	struct group *g = getgrgid(getegid());
	if (!g) {
		TEST_SKIP("no name for group %d", (int)getegid());
		return;
	}
	char path[512], self[4096], cmd[8192], *out = NULL;
	snprintf(path, sizeof(path), "%s/grp-same-%d.sock", test_tmpdir(), (int)getpid());
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	CHECK(sl > 0);
	self[sl > 0 ? sl : 0] = '\0';
	snprintf(cmd, sizeof(cmd), "'%s' --socket-group-child 'ipc://%s' '%s' 2>&1", self, path,
		 g->gr_name);
	int rc = test_run_capture(cmd, &out);
	CHECK_MSG(rc == 0, "socket group child: exit %d: %s", rc, out);
	free(out);
	unlink(path);
}

static void test_setup_errors(void)
{
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	const char *urls[] = {"ipc:///nonexistent-edgelm-dir/x/edgelm.sock"};
	struct ipc_server_params p = {.urls = urls, .n_urls = 1};
	CHECK_EQ_INT(ipc_server_new(&p, handler, NULL, &srv, &err), -ENOENT);
	CHECK(srv == NULL);
	CHECK(strstr(err.msg, "socket directory") && strstr(err.msg, "/nonexistent-edgelm-dir/x"));

	const char *bad_scheme[] = {"ws://127.0.0.1:1/x"};
	p.urls = bad_scheme;
	CHECK_EQ_INT(ipc_server_new(&p, handler, NULL, &srv, &err), -EINVAL);

	/* an unknown group: served anyway, the failure reported */
	struct ipc_server_params pg = {.socket_group = "no-such-group-edgelm"};
	char path[512], url[600];
	snprintf(path, sizeof(path), "%s/grp-%d.sock", test_tmpdir(), (int)getpid());
	snprintf(url, sizeof(url), "ipc://%s", path);
	const char *u[] = {url};
	pg.urls = u;
	pg.n_urls = 1;
	pg.socket_mode = 0600;
	struct tdaemon dd = {0};
	pthread_mutex_init(&dd.mu, NULL);
	CHECK_OK(ipc_server_new(&pg, handler, &dd, &srv, &err));
	if (srv) {
		CHECK_OK(ipc_server_start(srv, &err));
		CHECK(err.code != 0 && strstr(err.msg, "no-such-group-edgelm"));
		struct stat st;
		CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600);
		edgelm_client *c = NULL;
		struct edgelm_error e;
		CHECK_OK(edgelm_connect(url, &c, &e));
		enum edgelm_health h;
		CHECK_OK(edgelm_health(c, &h, NULL, &e));
		edgelm_close(c);
	}
	ipc_server_free(srv);
	pthread_mutex_destroy(&dd.mu);

	/* nothing listening: the client says so at once */
	edgelm_client *c = NULL;
	struct edgelm_error e;
	CHECK_EQ_INT(edgelm_connect(url, &c, &e), EDGELM_E_CONNECT);
	CHECK(strstr(e.message, "cannot connect") != NULL);
	CHECK(c == NULL);
}

/* A second server on a live socket is refused, with a hint, and the first
 * still answers new clients: nng 1.5.2's own check of an existing path (a
 * connect() and close()) wedged the first server's listener (nng bug #1518,
 * test_ipc_wedge.c), so ipc_server_start checks the path itself first. */
static void test_second_server_refused(void)
{
	struct tdaemon *d = daemon_start("twice", NULL);
	if (!d)
		return;
	CHECK(health_ok(d));
	const char *u[] = {d->url};
	struct ipc_server_params p2 = {.urls = u, .n_urls = 1};
	ipc_server *srv2 = NULL;
	struct cm_err err = {0};
	CHECK_OK(ipc_server_new(&p2, handler, d, &srv2, &err));
	if (srv2) {
		CHECK_EQ_INT(ipc_server_start(srv2, &err), -EADDRINUSE);
		CHECK(strstr(err.msg, "another edgelmd") != NULL);
	}
	ipc_server_free(srv2);
	/* the first server's socket file is still there, and it serves */
	struct stat st;
	CHECK(stat(d->path, &st) == 0);
	CHECK(health_ok(d));
	daemon_stop(d);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--oversized-client") == 0)
		return oversized_client(argv[2]);
	if (argc == 4 && strcmp(argv[1], "--socket-group-child") == 0)
		return socket_group_child(argv[2], argv[3]);
	TEST_RUN(test_ops_and_socket_file);
	TEST_RUN(test_streaming);
	TEST_RUN(test_concurrent_clients);
	TEST_RUN(test_queue_full_1000);
	TEST_RUN(test_hostile_over_wire);
	TEST_RUN(test_stop_while_busy);
	TEST_RUN(test_daemon_vanishes);
	TEST_RUN(test_close_bounded);
	TEST_RUN(test_redial_after_stall);
	TEST_RUN(test_setup_errors);
	TEST_RUN(test_socket_group_already_set);
	TEST_RUN(test_second_server_refused);
	return test_finish();
}
