/* tests/unit/test_ipc_client_fleet.c: libedgelm with several daemons
 * (issue 26), against plain nng rep sockets that answer as the daemon does
 * and count what reaches each: requests spread over every endpoint; a
 * daemon that goes away mid-request fails that request at once, an
 * idempotent one is retried on another and a generate never runs twice; a
 * stream's polls and cancel reach only the daemon that started it (a
 * stranger answers not_found, as the daemon would); URL lists parse from
 * the argument and from EDGELM_SOCKET; over tls+tcp:// the client checks
 * the daemon's certificate (CA and host name) and presents its own. */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"
#include "tests/test.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/tls/tls.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define N_FAKES 3
#define MAX_STREAMS 64

/* how many daemons a "hang" may still kill: the retry must find one that
 * answers */
static atomic_int hang_kills;

/* ---- the rep end ------------------------------------------------------------ */

struct fake {
	nng_socket sock;
	pthread_t th;
	char url[512];
	pthread_mutex_t mu;
	char streams[MAX_STREAMS][EDGELM_ID_MAX + 1]; /* ids it started */
	int n_streams;
	atomic_uint n_tokenize, n_generate, n_polls, n_cancels;
	atomic_uint n_foreign; /* polls and cancels for a stream it never started */
	atomic_bool dead;
};

static bool has_stream(struct fake *f, const char *id)
{
	bool found = false;
	pthread_mutex_lock(&f->mu);
	for (int i = 0; i < f->n_streams && !found; i++)
		found = strcmp(f->streams[i], id) == 0;
	pthread_mutex_unlock(&f->mu);
	return found;
}

/* The reply to one request; false: drop the connection instead, as a
 * daemon that dies does ("die" prompts and "hang" texts). */
static bool answer(struct fake *f, const char *body, size_t len, char **ret_json, size_t *ret_len)
{
	struct ipc_request *req = NULL;
	struct cm_err e = {0};
	int rc = ipc_request_parse(body, len, NULL, &req, &e);
	if (rc) {
		ipc_error_encode(ipc_errcode_from_errno(rc), NULL, e.msg, -1, ret_json, ret_len);
		return true;
	}
	struct ipc_reply r = {.op = req->op, .id = req->id, .retry_after_ms = -1};
	bool ok = true, foreign = false;
	switch (req->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT:
		atomic_fetch_add(&f->n_generate, 1);
		if (req->prompt_len == 3 && memcmp(req->prompt, "die", 3) == 0) {
			ok = false;
			break;
		}
		if (req->stream) {
			pthread_mutex_lock(&f->mu);
			if (f->n_streams < MAX_STREAMS)
				snprintf(f->streams[f->n_streams++], EDGELM_ID_MAX + 1, "%s",
				         req->id);
			pthread_mutex_unlock(&f->mu);
		}
		r.u.gen.stream = req->stream;
		r.u.gen.text = "ok";
		r.u.gen.text_len = 2;
		r.u.gen.finish = IPC_FINISH_STOP;
		break;
	case IPC_OP_POLL:
		atomic_fetch_add(&f->n_polls, 1);
		foreign = !has_stream(f, req->id);
		/* two chunks: "x" then the end */
		r.u.poll.offset = req->ack;
		if (req->ack == 0) {
			r.u.poll.text = "x";
			r.u.poll.text_len = 1;
		} else {
			r.u.poll.done = true;
			r.u.poll.finish = IPC_FINISH_STOP;
		}
		break;
	case IPC_OP_CANCEL:
		atomic_fetch_add(&f->n_cancels, 1);
		foreign = !has_stream(f, req->id);
		r.u.cancel.cancelled = true;
		break;
	case IPC_OP_TOKENIZE:
		atomic_fetch_add(&f->n_tokenize, 1);
		if (req->text_len == 4 && memcmp(req->text, "hang", 4) == 0 &&
		    atomic_fetch_sub(&hang_kills, 1) > 0)
			ok = false;
		break;
	default:
		break;
	}
	if (foreign) {
		atomic_fetch_add(&f->n_foreign, 1);
		ipc_error_encode(IPC_ERR_NOT_FOUND, req->id, "no such generation", -1, ret_json,
		                 ret_len);
	} else if (ok) {
		ipc_reply_encode(&r, ret_json, ret_len, NULL);
	}
	ipc_request_free(req);
	return ok;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(f->sock, &m, 0) != 0)
			return NULL; /* closed */
		char *json = NULL;
		size_t jlen = 0;
		bool ok = answer(f, nng_msg_body(m), nng_msg_len(m), &json, &jlen);
		nng_msg_free(m);
		if (!ok) { /* die: the client's pipe goes with the socket */
			atomic_store(&f->dead, true);
			nng_close(f->sock);
			return NULL;
		}
		if (json && nng_msg_alloc(&m, jlen) == 0) {
			memcpy(nng_msg_body(m), json, jlen);
			if (nng_sendmsg(f->sock, m, 0) != 0)
				nng_msg_free(m);
		}
		cm_free(json);
	}
}

/* url: where to listen ("...:0" for a free TCP port); tls: a server
 * config or NULL. */
static struct fake *fake_start(const char *url, nng_tls_config *tls)
{
	struct fake *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	pthread_mutex_init(&f->mu, NULL);
	nng_listener l;
	int rv = nng_rep0_open(&f->sock);
	if (rv == 0)
		rv = nng_listener_create(&l, f->sock, url);
	if (rv == 0 && tls)
		rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tls);
	if (rv == 0)
		rv = nng_listener_start(l, 0);
	snprintf(f->url, sizeof(f->url), "%s", url);
	int port = 0;
	if (rv == 0 && strstr(url, "tcp://") &&
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0) {
		/* the URL the client dials: same host, the port it got */
		char *colon = strrchr(f->url, ':');
		if (colon)
			snprintf(colon, sizeof(f->url) - (size_t)(colon - f->url), ":%d", port);
	}
	CHECK_MSG(rv == 0, "rep socket on %s: %s", url, nng_strerror(rv));
	if (rv == 0 && pthread_create(&f->th, NULL, fake_main, f) != 0)
		rv = -1;
	if (rv != 0) {
		nng_close(f->sock);
		free(f);
		return NULL;
	}
	return f;
}

static void fake_stop(struct fake *f)
{
	if (!f)
		return;
	nng_close(f->sock);
	pthread_join(f->th, NULL);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

static int start_fakes(struct fake **f, char *list, size_t cap)
{
	list[0] = '\0';
	for (int i = 0; i < N_FAKES; i++) {
		char url[512];
		if (i == 1) /* one over TCP, the rest over ipc:// */
			snprintf(url, sizeof(url), "tcp://127.0.0.1:0");
		else
			snprintf(url, sizeof(url), "ipc://%s/fleet-%d-%d.sock", test_tmpdir(),
			         (int)getpid(), i);
		f[i] = fake_start(url, NULL);
		if (!f[i])
			return -1;
		size_t n = strlen(list);
		snprintf(list + n, cap - n, "%s%s", i ? "," : "", f[i]->url);
	}
	return 0;
}

static void stop_fakes(struct fake **f)
{
	for (int i = 0; i < N_FAKES; i++)
		fake_stop(f[i]);
}

static int tokenize(edgelm_client *c, const char *text, struct edgelm_error *e)
{
	int32_t *ids = NULL;
	size_t n = 0;
	int rc = edgelm_tokenize(c, text, false, false, &ids, &n, e);
	edgelm_free(ids);
	return rc;
}

/* ---- tests ------------------------------------------------------------------ */

/* Requests from one client reach every daemon of the list; the list parses
 * with blanks around its commas, from the argument and from EDGELM_SOCKET. */
static void test_spread(void)
{
	struct fake *f[N_FAKES] = {0};
	char list[2048];
	edgelm_client *c = NULL;
	struct edgelm_error e;
	if (start_fakes(f, list, sizeof(list)))
		goto out;
	int rc = edgelm_connect(list, &c, &e);
	CHECK_MSG(rc == 0, "connect %s: %s", list, e.message);
	for (int i = 0; c && i < 30; i++) {
		rc = tokenize(c, "a", &e);
		CHECK_MSG(rc == 0, "tokenize %d: %s", i, e.message);
	}
	for (int i = 0; i < N_FAKES; i++)
		CHECK_MSG(atomic_load(&f[i]->n_tokenize) > 0, "daemon %d got none of 30", i);
	edgelm_close(c);
	c = NULL;

	/* the environment, with blanks and an empty item */
	char env[2200];
	snprintf(env, sizeof(env), " %s , %s,,%s ", f[0]->url, f[1]->url, f[2]->url);
	setenv("EDGELM_SOCKET", env, 1);
	unsigned before[N_FAKES];
	for (int i = 0; i < N_FAKES; i++)
		before[i] = atomic_load(&f[i]->n_tokenize);
	rc = edgelm_connect(NULL, &c, &e);
	unsetenv("EDGELM_SOCKET");
	CHECK_MSG(rc == 0, "connect $EDGELM_SOCKET=%s: %s", env, e.message);
	for (int i = 0; c && i < 30; i++)
		CHECK_OK(tokenize(c, "a", &e));
	for (int i = 0; i < N_FAKES; i++)
		CHECK_MSG(atomic_load(&f[i]->n_tokenize) > before[i],
		          "env list: daemon %d got none", i);
	edgelm_close(c);
	c = NULL;

	/* edgelm_connect_ex: a list of lists */
	const char *urls[2] = {f[0]->url, NULL};
	char rest[1100];
	snprintf(rest, sizeof(rest), "%s,%s", f[1]->url, f[2]->url);
	urls[1] = rest;
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = urls;
	o.n_urls = 2;
	for (int i = 0; i < N_FAKES; i++)
		before[i] = atomic_load(&f[i]->n_tokenize);
	rc = edgelm_connect_ex(&o, &c, &e);
	CHECK_MSG(rc == 0, "connect_ex: %s", e.message);
	for (int i = 0; c && i < 30; i++)
		CHECK_OK(tokenize(c, "a", &e));
	for (int i = 0; i < N_FAKES; i++)
		CHECK_MSG(atomic_load(&f[i]->n_tokenize) > before[i],
		          "connect_ex: daemon %d got none", i);
out:
	edgelm_close(c);
	stop_fakes(f);
}

/* Connecting needs one daemon up, not all; none up, or a URL that does not
 * parse, fails the connect with a reason. */
static void test_connect_some_down(void)
{
	struct fake *f = NULL;
	edgelm_client *c = NULL;
	struct edgelm_error e;
	char url[512], list[1200];
	snprintf(url, sizeof(url), "ipc://%s/fleet-up-%d.sock", test_tmpdir(), (int)getpid());
	f = fake_start(url, NULL);
	if (!f)
		return;
	snprintf(list, sizeof(list), "ipc://%s/nobody-%d.sock,%s", test_tmpdir(), (int)getpid(),
	         f->url);
	int rc = edgelm_connect(list, &c, &e);
	CHECK_MSG(rc == 0, "one of two up: %d (%s)", rc, e.message);
	for (int i = 0; c && i < 6; i++)
		CHECK_OK(tokenize(c, "a", &e));
	CHECK_EQ_INT(atomic_load(&f->n_tokenize), 6);
	edgelm_close(c);
	c = NULL;

	snprintf(list, sizeof(list), "ipc://%s/nobody-%d.sock,ipc://%s/nobody2-%d.sock",
	         test_tmpdir(), (int)getpid(), test_tmpdir(), (int)getpid());
	rc = edgelm_connect(list, &c, &e);
	CHECK_EQ_INT(rc, EDGELM_E_CONNECT);
	CHECK_MSG(strstr(e.message, "any of 2") != NULL, "message: %s", e.message);
	edgelm_close(c);
	c = NULL;

	snprintf(list, sizeof(list), "%s,bogus://x", f->url);
	rc = edgelm_connect(list, &c, &e);
	CHECK_EQ_INT(rc, EDGELM_E_CONNECT);
	CHECK_MSG(strstr(e.message, "bogus://x") != NULL, "message: %s", e.message);
	edgelm_close(c);
	fake_stop(f);
}

/* A daemon dies holding a request: a tokenize goes on to another daemon and
 * succeeds; a generate fails at once with EDGELM_E_CONNECTION and is not
 * sent again (run once in all); every later request completes on the
 * daemons left. */
static void test_failover(void)
{
	struct fake *f[N_FAKES] = {0};
	char list[2048];
	edgelm_client *c = NULL;
	struct edgelm_error e;
	if (start_fakes(f, list, sizeof(list)))
		goto out;
	int rc = edgelm_connect(list, &c, &e);
	CHECK_MSG(rc == 0, "connect %s: %s", list, e.message);
	if (!c)
		goto out;
	/* "hang" kills whichever daemon takes it, once */
	atomic_store(&hang_kills, 1);
	rc = tokenize(c, "hang", &e);
	int dead = 0;
	for (int i = 0; i < N_FAKES; i++)
		dead += atomic_load(&f[i]->dead);
	CHECK_MSG(dead == 1 && rc == 0, "tokenize through a dying daemon: %d (%s), %d dead", rc,
	          e.message, dead);
	for (int i = 0; i < 20; i++) {
		rc = tokenize(c, "a", &e);
		CHECK_MSG(rc == 0, "tokenize %d after a death: %s", i, e.message);
	}
	int alive_served = 0;
	for (int i = 0; i < N_FAKES; i++)
		alive_served += !atomic_load(&f[i]->dead) && atomic_load(&f[i]->n_tokenize) > 0;
	CHECK_EQ_INT(alive_served, N_FAKES - 1);

	struct edgelm_params p;
	edgelm_params_init(&p);
	struct edgelm_result r;
	unsigned gen0 = 0;
	for (int i = 0; i < N_FAKES; i++)
		gen0 += atomic_load(&f[i]->n_generate);
	rc = edgelm_generate(c, "die", &p, &r, &e);
	CHECK_MSG(rc == EDGELM_E_CONNECTION, "generate on a dying daemon: %d (%s)", rc, e.message);
	edgelm_result_free(&r);
	unsigned gen1 = 0;
	for (int i = 0; i < N_FAKES; i++)
		gen1 += atomic_load(&f[i]->n_generate);
	CHECK_EQ_INT(gen1 - gen0, 1); /* never resent */

	/* one daemon left: everything lands there */
	for (int i = 0; i < 10; i++) {
		rc = edgelm_generate(c, "hi", &p, &r, &e);
		CHECK_MSG(rc == 0, "generate %d on the last daemon: %d (%s)", i, rc, e.message);
		edgelm_result_free(&r);
		rc = tokenize(c, "a", &e);
		CHECK_MSG(rc == 0, "tokenize %d on the last daemon: %s", i, e.message);
	}
out:
	edgelm_close(c);
	stop_fakes(f);
}

/* Streams from one client land on every daemon, and each stream's polls
 * and cancel reach only the daemon that started it. */
static void test_stream_sticks(void)
{
	struct fake *f[N_FAKES] = {0};
	char list[2048];
	edgelm_client *c = NULL;
	struct edgelm_error e;
	if (start_fakes(f, list, sizeof(list)))
		goto out;
	int rc = edgelm_connect(list, &c, &e);
	CHECK_MSG(rc == 0, "connect %s: %s", list, e.message);
	struct edgelm_params p;
	edgelm_params_init(&p);
	for (int i = 0; c && i < 12; i++) {
		struct edgelm_result r;
		rc = edgelm_generate_stream(c, "hi", &p, NULL, NULL, &r, &e);
		CHECK_MSG(rc == 0, "stream %d: %d (%s)", i, rc, e.message);
		CHECK(rc != 0 || strcmp(r.text, "x") == 0);
		/* cancel by id finds the daemon that has it */
		bool cancelled = false;
		if (rc == 0) {
			rc = edgelm_cancel(c, r.id, &cancelled, &e);
			CHECK_MSG(rc == 0 && cancelled, "cancel %s: %d (%s)", r.id, rc, e.message);
		}
		edgelm_result_free(&r);
	}
	for (int i = 0; i < N_FAKES; i++) {
		CHECK_MSG(atomic_load(&f[i]->n_generate) > 0, "daemon %d started no stream", i);
		CHECK_EQ_INT(atomic_load(&f[i]->n_polls), 2 * atomic_load(&f[i]->n_generate));
	}
	/* the foreign ones are the cancels asked of the others first */
	unsigned foreign_polls = 0;
	for (int i = 0; i < N_FAKES; i++)
		foreign_polls += atomic_load(&f[i]->n_foreign);
	unsigned cancels = 0;
	for (int i = 0; i < N_FAKES; i++)
		cancels += atomic_load(&f[i]->n_cancels);
	CHECK_EQ_INT(cancels - foreign_polls, 12);
	struct edgelm_result r;
	bool cancelled = true;
	rc = edgelm_cancel(c, "nobody-has-this", &cancelled, &e);
	CHECK_EQ_INT(rc, EDGELM_E_NOT_FOUND);
	(void)r;
out:
	edgelm_close(c);
	stop_fakes(f);
}

/* ---- TLS -------------------------------------------------------------------- */

/* Makes in dir: ca (the CA the client trusts), other-ca, and signed by ca
 * a server certificate for localhost, one for otherhost and a client's
 * (CN client1); each X as X.crt and X.key, servers also as X.pem (both,
 * as nng's server config wants them). False when openssl is missing. */
static bool make_certs(const char *dir)
{
	char cmd[4096];
	snprintf(
	    cmd, sizeof(cmd),
	    "set -e; cd '%s'; "
	    "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1.key; "
	    "}; "
	    "ca() { key $1; openssl req -x509 -new -key $1.key -out $1.crt -subj /CN=$1 -days 2; "
	    "}; "
	    "leaf() { key $1; openssl req -new -key $1.key -out $1.csr -subj /CN=$2; "
	    "  printf 'subjectAltName=DNS:%%s\\n' $2 >$1.ext; "
	    "  openssl x509 -req -in $1.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out $1.crt "
	    "  -days 2 -extfile $1.ext; cat $1.crt $1.key >$1.pem; }; "
	    "{ ca ca; ca other-ca; leaf srv localhost; leaf wrong otherhost; "
	    "leaf client client1; } >/dev/null 2>&1",
	    dir);
	return system("command -v openssl >/dev/null") == 0 && system(cmd) == 0;
}

/* A server TLS config: its certificate `name`.pem, and (require_client)
 * client certificates must be signed by ca. */
static nng_tls_config *server_tls(const char *dir, const char *name, bool require_client)
{
	char pem[1024], ca[1024];
	snprintf(pem, sizeof(pem), "%s/%s.pem", dir, name);
	snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
	nng_tls_config *cfg;
	int rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER);
	if (rv == 0)
		rv = nng_tls_config_cert_key_file(cfg, pem, NULL);
	if (rv == 0 && require_client) {
		rv = nng_tls_config_ca_file(cfg, ca);
		if (rv == 0)
			rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED);
	}
	CHECK_MSG(rv == 0, "server TLS config %s: %s", name, nng_strerror(rv));
	return rv == 0 ? cfg : NULL;
}

static int tls_connect(const struct fake *f, const char *dir, const char *ca, bool cert,
                       edgelm_client **c, struct edgelm_error *e)
{
	/* the fake listens on 127.0.0.1; the client dials it by name */
	char url[600], caf[1024], crt[1024], key[1024];
	snprintf(url, sizeof(url), "tls+tcp://localhost:%s", strrchr(f->url, ':') + 1);
	snprintf(caf, sizeof(caf), "%s/%s.crt", dir, ca);
	snprintf(crt, sizeof(crt), "%s/client.crt", dir);
	snprintf(key, sizeof(key), "%s/client.key", dir);
	const char *urls[1] = {url};
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = urls;
	o.n_urls = 1;
	o.tls_ca_file = caf;
	o.tls_cert_file = cert ? crt : NULL;
	o.tls_key_file = cert ? key : NULL;
	*c = NULL;
	int rc = edgelm_connect_ex(&o, c, e);
	if (rc == 0) {
		edgelm_set_timeout(*c, 5000);
		rc = tokenize(*c, "a", e);
	}
	edgelm_close(*c);
	*c = NULL;
	return rc;
}

/* Over tls+tcp:// the client verifies the daemon's certificate against its
 * CA and the URL's host name, and presents its own: a daemon whose
 * certificate names another host, or that an untrusted CA signed, is
 * refused at connect; a daemon that wants a client certificate gets one. */
static void test_tls(void)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/fleet-tls-%d", test_tmpdir(), (int)getpid());
	if (mkdir(dir, 0700) != 0 || !make_certs(dir)) {
		TEST_SKIP("no openssl to make test certificates");
		return;
	}
	struct edgelm_error e;
	edgelm_client *c = NULL;
	nng_tls_config *good = server_tls(dir, "srv", true);
	nng_tls_config *wrong = server_tls(dir, "wrong", false);
	struct fake *f = good ? fake_start("tls+tcp://127.0.0.1:0", good) : NULL;
	struct fake *w = wrong ? fake_start("tls+tcp://127.0.0.1:0", wrong) : NULL;
	if (!f || !w)
		goto out;

	int rc = tls_connect(f, dir, "ca", true, &c, &e);
	CHECK_MSG(rc == 0, "TLS with the right CA, name and client cert: %d (%s)", rc, e.message);
	CHECK_EQ_INT(atomic_load(&f->n_tokenize), 1);

	rc = tls_connect(w, dir, "ca", true, &c, &e);
	CHECK_MSG(rc == EDGELM_E_CONNECT, "server cert for otherhost: %d (%s)", rc, e.message);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "wrong name: %s\n", e.message);
	CHECK_MSG(strstr(e.message, "certificate") != NULL, "message: %s", e.message);
	rc = tls_connect(f, dir, "other-ca", true, &c, &e);
	CHECK_MSG(rc == EDGELM_E_CONNECT, "untrusted CA: %d (%s)", rc, e.message);
	CHECK_MSG(strstr(e.message, "certificate") != NULL, "message: %s", e.message);
	rc = tls_connect(f, dir, "ca", false, &c, &e);
	CHECK_MSG(rc != 0, "no client certificate for a server that requires one: accepted");
	CHECK_EQ_INT(atomic_load(&f->n_tokenize), 1);
	CHECK_EQ_INT(atomic_load(&w->n_tokenize), 0);

	/* no CA: refused before dialling */
	const char *urls[1] = {"tls+tcp://localhost:1"};
	struct edgelm_connect_opts o;
	edgelm_connect_opts_init(&o);
	o.urls = urls;
	o.n_urls = 1;
	unsetenv("EDGELM_TLS_CA");
	rc = edgelm_connect_ex(&o, &c, &e);
	CHECK_EQ_INT(rc, EDGELM_E_INVALID_ARG);
	CHECK_MSG(strstr(e.message, "CA") != NULL, "message: %s", e.message);
out:
	fake_stop(f);
	fake_stop(w);
	if (good)
		nng_tls_config_free(good);
	if (wrong)
		nng_tls_config_free(wrong);
}

int main(void)
{
	TEST_RUN(test_spread);
	TEST_RUN(test_connect_some_down);
	TEST_RUN(test_failover);
	TEST_RUN(test_stream_sticks);
	TEST_RUN(test_tls);
	return test_finish();
}
