/* tests/unit/test_daemon_metrics.c: what the daemon counts and publishes.
 *
 * - Every IPC reply is reported once to the server's on_reply with its op
 *   and error code, the requests the server refuses itself (bad JSON, a
 *   field out of range, an unknown op, draining) included, the self-check's
 *   round trips excluded; the daemon counts them in
 *   edgelm_requests_total{op,outcome} with bounded labels.
 * - edgelm_build_info and edgelm_model_info show one label set, the one in
 *   force after a model swap (info families hide series at 0).
 * - metrics_bind_required defaults to yes.
 * tests/integration/daemon_metrics.sh checks the same against a live
 * daemon, and that a busy metrics port stops the start. */
#include "daemon/config.h"
#include "daemon/serve.h"
#include "tests/test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <unistd.h>

/* ---- the server's on_reply ----------------------------------------------------- */

struct seen {
	pthread_mutex_t mu;
	int n;
	enum ipc_op op[32];
	enum ipc_errcode code[32];
};

static void record_reply(void *ud, enum ipc_op op, enum ipc_errcode code)
{
	struct seen *s = ud;
	pthread_mutex_lock(&s->mu);
	if (s->n < 32) {
		s->op[s->n] = op;
		s->code[s->n] = code;
	}
	s->n++;
	pthread_mutex_unlock(&s->mu);
}

/* Answers cancel with not_found, detokenize with an encoded invalid_field,
 * anything else with a health reply. */
static void handler(ipc_call *call, void *ud)
{
	(void)ud;
	const struct ipc_request *q = ipc_call_request(call);
	struct ipc_reply rep = {.op = IPC_OP_HEALTH, .retry_after_ms = -1};
	if (q->op == IPC_OP_CANCEL) {
		ipc_call_error(call, IPC_ERR_NOT_FOUND, -1, "no generation '%s'", q->id);
		return;
	}
	if (q->op == IPC_OP_DETOKENIZE) {
		rep.op = IPC_OP_NONE;
		rep.error = IPC_ERR_INVALID_FIELD;
	}
	rep.u.health.status = IPC_HEALTH_READY;
	ipc_call_reply_encode(call, &rep);
}

static int round_trip(nng_socket s, const char *json)
{
	char *buf = NULL;
	size_t len = 0;
	int rv = nng_send(s, (void *)json, strlen(json), 0);
	if (rv == 0)
		rv = nng_recv(s, &buf, &len, NNG_FLAG_ALLOC);
	if (buf)
		nng_free(buf, len);
	return rv;
}

static void test_on_reply_counts_every_reply(void)
{
	struct seen seen = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char path[600], url[620];
	snprintf(path, sizeof(path), "%s/metrics-%d.sock", test_tmpdir(), (int)getpid());
	snprintf(url, sizeof(url), "ipc://%s", path);
	const char *urls[] = {url};
	struct ipc_server_params p = {
	    .urls = urls,
	    .n_urls = 1,
	    .socket_mode = -1,
	    .selfcheck_ms = 20, /* its round trips must not be counted */
	    .on_reply = record_reply,
	};
	ipc_server *srv = NULL;
	struct cm_err err = {0};
	CHECK_OK(ipc_server_new(&p, handler, &seen, &srv, &err));
	if (!srv)
		return;
	CHECK_OK(ipc_server_start(srv, &err));
	nng_socket s;
	CHECK_OK(nng_req0_open(&s));
	nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
	CHECK_OK(nng_dial(s, url, NULL, 0));

	static const struct {
		const char *json;
		enum ipc_op op;
		enum ipc_errcode code;
	} cases[] = {
	    {"{\"op\":\"health\"}", IPC_OP_HEALTH, IPC_ERR_NONE},
	    /* refused by the parser: the op is still known */
	    {"{\"op\":\"generate\",\"prompt\":\"x\",\"top_p\":5}", IPC_OP_GENERATE,
	     IPC_ERR_INVALID_FIELD},
	    {"{\"op\":\"chat\",\"messages\":[],\"bogus\":1}", IPC_OP_CHAT, IPC_ERR_INVALID_FIELD},
	    {"{\"op\":\"frobnicate\"}", IPC_OP_NONE, IPC_ERR_UNKNOWN_OP},
	    {"not json", IPC_OP_NONE, IPC_ERR_INVALID_JSON},
	    {"{\"v\":7,\"op\":\"health\"}", IPC_OP_NONE, IPC_ERR_UNSUPPORTED_VERSION},
	    /* answered by the handler */
	    {"{\"op\":\"cancel\",\"id\":\"nope\"}", IPC_OP_CANCEL, IPC_ERR_NOT_FOUND},
	    {"{\"op\":\"detokenize\",\"ids\":[99999]}", IPC_OP_DETOKENIZE, IPC_ERR_INVALID_FIELD},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++)
		CHECK_OK(round_trip(s, cases[i].json));
	usleep(200 * 1000); /* several self-check rounds */
	ipc_server_drain(srv);
	CHECK_OK(round_trip(s, "{\"op\":\"tokenize\",\"text\":\"a\"}"));

	pthread_mutex_lock(&seen.mu);
	CHECK_EQ_INT(seen.n, CM_ARRAY_LEN(cases) + 1);
	for (size_t i = 0; i < CM_ARRAY_LEN(cases) && i < (size_t)seen.n; i++) {
		CHECK_MSG(seen.op[i] == cases[i].op, "case %zu: op %d, expected %d", i, seen.op[i],
		          cases[i].op);
		CHECK_MSG(seen.code[i] == cases[i].code, "case %zu: code %d, expected %d", i,
		          seen.code[i], cases[i].code);
	}
	size_t last = CM_ARRAY_LEN(cases);
	if ((size_t)seen.n > last) {
		CHECK_EQ_INT(seen.op[last], IPC_OP_TOKENIZE);
		CHECK_EQ_INT(seen.code[last], IPC_ERR_SHUTTING_DOWN);
	}
	pthread_mutex_unlock(&seen.mu);
	struct ipc_server_stats st;
	ipc_server_stats_get(srv, &st);
	CHECK(st.selfchecks > 0);
	nng_close(s);
	ipc_server_free(srv);
}

static void test_parse_op_reports_the_op(void)
{
	struct ipc_request *r = NULL;
	enum ipc_op op = IPC_OP_COUNT;
	const char *j = "{\"op\":\"poll\",\"id\":\"a\",\"wait_ms\":-1}";
	CHECK(ipc_request_parse_op(j, strlen(j), NULL, &r, &op, NULL) < 0);
	CHECK(r == NULL);
	CHECK_EQ_INT(op, IPC_OP_POLL);
	j = "{\"op\":\"health\"}";
	CHECK_OK(ipc_request_parse_op(j, strlen(j), NULL, &r, &op, NULL));
	CHECK_EQ_INT(op, IPC_OP_HEALTH);
	ipc_request_free(r);
	j = "[1]";
	CHECK(ipc_request_parse_op(j, strlen(j), NULL, &r, &op, NULL) < 0);
	CHECK_EQ_INT(op, IPC_OP_NONE);
}

/* ---- the daemon's counting and info gauges -------------------------------------- */

static char *scrape(monitor *m)
{
	char *t = NULL;
	size_t n;
	struct cm_err err = {0};
	CHECK_OK(monitor_prometheus_render(m, &t, &n, &err));
	return t;
}

static int count_lines(const char *text, const char *prefix)
{
	int n = 0;
	size_t l = strlen(prefix);
	for (const char *p = text; p && *p;) {
		if (strncmp(p, prefix, l) == 0)
			n++;
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return n;
}

static void daemon_with_monitor(struct daemon *d)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->mu, NULL);
	struct cm_err err = {0};
	CHECK_OK(monitor_new(NULL, &d->mon, &err));
	if (d->mon) {
		d->mi = monitor_inference_get(d->mon);
		d->fam_requests = d->mi->requests;
	}
}

static void daemon_without_monitor(struct daemon *d)
{
	monitor_free(d->mon);
	pthread_mutex_destroy(&d->mu);
}

static void test_daemon_counts_outcomes(void)
{
	struct daemon d;
	daemon_with_monitor(&d);
	if (!d.mon)
		return;
	daemon_count_reply(&d, IPC_OP_GENERATE, IPC_ERR_NONE); /* counted when it finishes */
	daemon_count_reply(&d, IPC_OP_CHAT, IPC_ERR_NONE);
	daemon_count_reply(&d, IPC_OP_GENERATE, IPC_ERR_INVALID_FIELD);
	daemon_count_reply(&d, IPC_OP_DETOKENIZE, IPC_ERR_INVALID_FIELD);
	daemon_count_reply(&d, IPC_OP_CANCEL, IPC_ERR_NOT_FOUND);
	daemon_count_reply(&d, IPC_OP_GENERATE, IPC_ERR_TOO_LARGE);
	daemon_count_reply(&d, IPC_OP_NONE, IPC_ERR_UNKNOWN_OP);
	daemon_count_reply(&d, (enum ipc_op)99, IPC_ERR_INVALID_JSON);
	daemon_count_reply(&d, IPC_OP_HEALTH, IPC_ERR_NONE);
	daemon_count_reply(&d, IPC_OP_HEALTH, IPC_ERR_NONE);

	/* a stream whose id went out: its end counts the generation */
	struct sched s = {.d = &d};
	struct outbox_list out;
	OUTBOX_LIST_INIT(&out);
	struct daemon_request *r = cm_calloc(1, sizeof(*r));
	r->s = &s;
	r->op = IPC_OP_CHAT;
	r->stream = true;
	store_finish(&s, r, IPC_FINISH_CANCELLED, &out);
	store_finish(&s, r, IPC_FINISH_STOP, &out); /* finished already: no second count */
	req_free(r);
	r = cm_calloc(1, sizeof(*r));
	r->s = &s;
	r->op = IPC_OP_GENERATE;
	r->stream = true;
	store_fail(&s, r, IPC_ERR_SHUTTING_DOWN, "the daemon is shutting down", &out);
	CHECK(out.head == NULL);
	req_free(r);

	char *t = scrape(d.mon);
	CHECK(t && !strstr(t, "op=\"generate\",outcome=\"ok\""));
	CHECK(t && !strstr(t, "op=\"chat\",outcome=\"ok\""));
	CHECK(t &&
	      strstr(t, "\nedgelm_requests_total{op=\"generate\",outcome=\"invalid_field\"} 1\n"));
	CHECK(
	    t &&
	    strstr(t, "\nedgelm_requests_total{op=\"detokenize\",outcome=\"invalid_field\"} 1\n"));
	CHECK(t && strstr(t, "\nedgelm_requests_total{op=\"cancel\",outcome=\"not_found\"} 1\n"));
	CHECK(t && strstr(t, "\nedgelm_requests_total{op=\"generate\",outcome=\"too_large\"} 1\n"));
	CHECK(t && strstr(t, "\nedgelm_requests_total{op=\"unknown\",outcome=\"unknown_op\"} 1\n"));
	CHECK(t &&
	      strstr(t, "\nedgelm_requests_total{op=\"unknown\",outcome=\"invalid_json\"} 1\n"));
	CHECK(t && strstr(t, "\nedgelm_requests_total{op=\"health\",outcome=\"ok\"} 2\n"));
	CHECK(t && strstr(t, "\nedgelm_requests_total{op=\"chat\",outcome=\"cancelled\"} 1\n"));
	CHECK(t &&
	      strstr(t, "\nedgelm_requests_total{op=\"generate\",outcome=\"shutting_down\"} 1\n"));
	/* the label values are the protocol's names: ops, "unknown", error codes, finishes */
	CHECK_EQ_INT(count_lines(t, "edgelm_requests_total{"), 9);
	cm_free(t);
	CHECK_STREQ(daemon_outcome_name(IPC_ERR_NONE), "ok");
	CHECK_STREQ(daemon_outcome_name(IPC_ERR_QUEUE_FULL), "queue_full");
	daemon_without_monitor(&d);
}

static void set_model(struct daemon *d, const char *name, const char *file, uint32_t dtype)
{
	memset(&d->minfo, 0, sizeof(d->minfo));
	snprintf(d->minfo.name, sizeof(d->minfo.name), "%s", name);
	snprintf(d->minfo.arch, sizeof(d->minfo.arch), "llama");
	d->minfo.isa = "avx2";
	d->minfo.type_counts[0] = 5; /* F32 norms: not the weights' type */
	d->minfo.type_counts[dtype] = 14;
	snprintf(d->model_name, sizeof(d->model_name), "%s", file);
	snprintf(d->kv_type_name, sizeof(d->kv_type_name), "f16");
}

static void test_info_gauges_follow_a_swap(void)
{
	struct daemon d;
	daemon_with_monitor(&d);
	if (!d.mon)
		return;
	daemon_metrics_init(&d);
	set_model(&d, "one", "one.gguf", 2 /* Q4_0 */);
	daemon_metrics_model(&d);
	char *t = scrape(d.mon);
	CHECK(t && strstr(t, "\nedgelm_model_info{name=\"one\",file=\"one.gguf\",arch=\"llama\","
	                     "type=\"Q4_0\",kv_type=\"f16\"} 1\n"));
	CHECK(t && strstr(t, "\nedgelm_build_info{version=\"" EDGELM_VERSION "\",isa=\"avx2\","));
	CHECK(t && strstr(t, "\nedgelm_start_time_seconds 1"));
	cm_free(t);

	set_model(&d, "two", "two.gguf", 8 /* Q8_0 */);
	daemon_metrics_model(&d);
	daemon_metrics_model(&d); /* the same again changes nothing */
	t = scrape(d.mon);
	CHECK(t && strstr(t, "\nedgelm_model_info{name=\"two\",file=\"two.gguf\",arch=\"llama\","
	                     "type=\"Q8_0\",kv_type=\"f16\"} 1\n"));
	CHECK(t && !strstr(t, "one.gguf"));
	CHECK_EQ_INT(count_lines(t, "edgelm_model_info{"), 1);
	CHECK_EQ_INT(count_lines(t, "edgelm_build_info{"), 1);
	cm_free(t);
	char *j = NULL;
	size_t n;
	CHECK_OK(monitor_json_render(d.mon, &j, &n, NULL));
	CHECK(j && strstr(j, "two.gguf") && !strstr(j, "one.gguf"));
	cm_free(j);
	daemon_without_monitor(&d);
}

static void test_info_family_rules(void)
{
	monitor *m = NULL;
	CHECK_OK(monitor_new(NULL, &m, NULL));
	if (!m)
		return;
	static const char *const l[] = {"a"};
	struct monitor_family_desc fd = {.type = MONITOR_TYPE_COUNTER,
	                                 .name = "x_info_total",
	                                 .help = "h",
	                                 .labels = l,
	                                 .n_labels = 1,
	                                 .info = true};
	monitor_family *f = NULL;
	CHECK_EQ_INT(monitor_family_add(m, &fd, &f, NULL), -EINVAL);
	fd.type = MONITOR_TYPE_GAUGE;
	fd.name = "x_information";
	CHECK_EQ_INT(monitor_family_add(m, &fd, &f, NULL), -EINVAL);
	fd.name = "x_info";
	CHECK_OK(monitor_family_add(m, &fd, &f, NULL));
	monitor_series *s = NULL;
	const char *v[] = {"b"};
	CHECK_OK(monitor_series_get(f, v, &s, NULL));
	char *t = scrape(m); /* at 0: neither the series nor the family */
	CHECK(t && !strstr(t, "x_info"));
	cm_free(t);
	monitor_gauge_set(s, 1);
	t = scrape(m);
	CHECK(t && strstr(t, "\nx_info{a=\"b\"} 1\n"));
	cm_free(t);
	monitor_free(m);
}

static void test_metrics_bind_required_key(void)
{
	struct daemon_config c;
	struct cm_err err = {0};
	daemon_config_default(&c);
	CHECK(c.metrics_bind_required);
	CHECK_OK(daemon_config_set(&c, "metrics_bind_required", "no", &err));
	CHECK(!c.metrics_bind_required);
	CHECK_EQ_INT(daemon_config_set(&c, "metrics_bind_required", "maybe", &err), -EINVAL);
}

int main(void)
{
	TEST_RUN(test_on_reply_counts_every_reply);
	TEST_RUN(test_parse_op_reports_the_op);
	TEST_RUN(test_daemon_counts_outcomes);
	TEST_RUN(test_info_gauges_follow_a_swap);
	TEST_RUN(test_info_family_rules);
	TEST_RUN(test_metrics_bind_required_key);
	return test_finish();
}
