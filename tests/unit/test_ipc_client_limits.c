/* tests/unit/test_ipc_client_limits.c: libedgelm against a plain nng rep
 * socket over ipc:// that parses each request with the protocol's default
 * limits and its RECVMAXSZ at the default message limit, as the daemon's
 * server does: what libedgelm sends at the documented limits goes through
 * both ends, and what it receives can be several MB.
 *
 * Before: the client refused a 1 MiB prompt itself (EDGELM_E_TOO_LARGE: the
 * JSON around it did not fit its 1 MiB message limit), sent seeds above
 * 2^63-1 as other seeds, and overflowed a signed int computing the reply
 * timeout of a long deadline or poll wait (caught by UBSan). */
#include "ipc/edgelm.h"
#include "ipc/ipc.h"
#include "tests/test.h"

#include <limits.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

/* ---- the rep end ------------------------------------------------------------ */

struct fake {
	nng_socket sock;
	pthread_t th;
	char url[512];
	atomic_size_t max_seen; /* largest request received */
	atomic_uint n_requests;
};

/* The reply to one request: a parse error as the server sends it, else a
 * short answer of the op's shape; tokenize answers one id (2^31-1, the
 * widest) per byte of text. */
static int answer(const char *body, size_t len, char **ret_json, size_t *ret_len)
{
	struct ipc_request *req = NULL;
	struct cm_err e = {0};
	int rc = ipc_request_parse(body, len, NULL, &req, &e);
	if (rc)
		return ipc_error_encode(ipc_errcode_from_errno(rc), NULL, e.msg, -1, ret_json,
		                        ret_len);
	struct ipc_reply r = {.op = req->op, .id = req->id, .retry_after_ms = -1};
	int32_t *ids = NULL;
	switch (req->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT:
		r.u.gen.stream = req->stream;
		r.u.gen.text = "ok";
		r.u.gen.text_len = 2;
		r.u.gen.finish = IPC_FINISH_STOP;
		break;
	case IPC_OP_POLL:
		r.u.poll.offset = req->ack;
		r.u.poll.done = true;
		r.u.poll.finish = IPC_FINISH_STOP;
		break;
	case IPC_OP_TOKENIZE:
		ids = malloc((req->text_len ? req->text_len : 1) * sizeof(*ids));
		if (!ids)
			abort();
		for (size_t i = 0; i < req->text_len; i++)
			ids[i] = INT32_MAX;
		r.u.tokenize.ids = ids;
		r.u.tokenize.n_ids = req->text_len;
		break;
	default:
		break;
	}
	rc = ipc_reply_encode(&r, ret_json, ret_len, NULL);
	free(ids);
	ipc_request_free(req);
	return rc;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	for (;;) {
		nng_msg *m;
		if (nng_recvmsg(f->sock, &m, 0) != 0)
			return NULL; /* closed */
		size_t len = nng_msg_len(m);
		if (len > atomic_load(&f->max_seen))
			atomic_store(&f->max_seen, len);
		atomic_fetch_add(&f->n_requests, 1);
		char *json = NULL;
		size_t jlen = 0;
		int rc = answer(nng_msg_body(m), len, &json, &jlen);
		nng_msg_free(m);
		if (rc == 0 && nng_msg_alloc(&m, jlen) == 0) {
			memcpy(nng_msg_body(m), json, jlen);
			if (nng_sendmsg(f->sock, m, 0) != 0)
				nng_msg_free(m);
		}
		cm_free(json);
	}
}

static struct fake *fake_start(void)
{
	struct fake *f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	snprintf(f->url, sizeof(f->url), "ipc://%s/edgelm-limits-%d.sock", test_tmpdir(),
	         (int)getpid());
	struct ipc_limits lim = {0};
	ipc_limits_fill(&lim);
	int rv = nng_rep0_open(&f->sock);
	if (rv == 0)
		rv = nng_socket_set_size(f->sock, NNG_OPT_RECVMAXSZ, lim.max_msg_bytes);
	if (rv == 0)
		rv = nng_listen(f->sock, f->url, NULL, 0);
	CHECK_MSG(rv == 0, "rep socket on %s: %s", f->url, nng_strerror(rv));
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
	free(f);
}

static edgelm_client *connect_to(struct fake *f)
{
	edgelm_client *c = NULL;
	struct edgelm_error e;
	int rc = edgelm_connect(f->url, &c, &e);
	CHECK_MSG(rc == 0, "connect %s: %s", f->url, e.message);
	if (c)
		edgelm_set_timeout(c, 60000);
	return c;
}

/* ---- tests ------------------------------------------------------------------ */

/* A prompt of exactly the documented 1 MiB goes through with the default
 * limits at both ends; one byte more gets prompt_too_long from the server
 * (the message still fits); a prompt that cannot fit one message is
 * refused locally. */
static void test_prompt_of_one_mib(void)
{
	struct fake *f = fake_start();
	edgelm_client *c = f ? connect_to(f) : NULL;
	const size_t P = IPC_DEFAULT_MAX_PROMPT_BYTES;
	char *prompt = malloc(2 * P + 1);
	if (!c || !prompt)
		goto out;
	struct edgelm_params p;
	edgelm_params_init(&p);
	p.max_tokens = 8;
	p.temperature = 0;
	struct edgelm_result r;
	struct edgelm_error e;

	memset(prompt, 'a', P);
	prompt[P] = '\0';
	int rc = edgelm_generate(c, prompt, &p, &r, &e);
	CHECK_MSG(rc == 0, "1 MiB prompt: %d (%s)", rc, e.message);
	CHECK(rc != 0 || strcmp(r.text, "ok") == 0);
	edgelm_result_free(&r);
	CHECK(atomic_load(&f->max_seen) > P);
	CHECK(atomic_load(&f->max_seen) <= EDGELM_DEFAULT_MAX_MSG);

	/* streamed, the same */
	rc = edgelm_generate_stream(c, prompt, &p, NULL, NULL, &r, &e);
	CHECK_MSG(rc == 0, "1 MiB prompt, streamed: %d (%s)", rc, e.message);
	edgelm_result_free(&r);

	prompt[P] = 'a';
	prompt[P + 1] = '\0';
	rc = edgelm_generate(c, prompt, &p, &r, &e);
	CHECK_MSG(rc == EDGELM_E_PROMPT_TOO_LONG, "1 MiB + 1: %d (%s)", rc, e.message);
	CHECK_STREQ(e.server_code, "prompt_too_long");
	edgelm_result_free(&r);

	unsigned n = atomic_load(&f->n_requests);
	memset(prompt, 'a', 2 * P);
	prompt[2 * P] = '\0';
	rc = edgelm_generate(c, prompt, &p, &r, &e);
	CHECK_MSG(rc == EDGELM_E_TOO_LARGE, "2 MiB: %d (%s)", rc, e.message);
	CHECK_STREQ(e.server_code, "");
	CHECK_EQ_INT(atomic_load(&f->n_requests), n); /* never sent */
	edgelm_result_free(&r);

	/* the largest tokenize is answered with ~11 MB of ids */
	memset(prompt, 't', P);
	prompt[P] = '\0';
	int32_t *ids = NULL;
	size_t n_ids = 0;
	rc = edgelm_tokenize(c, prompt, true, false, &ids, &n_ids, &e);
	CHECK_MSG(rc == 0, "tokenize 1 MiB: %d (%s)", rc, e.message);
	CHECK_EQ_INT(n_ids, P);
	CHECK(ids && n_ids == P && ids[0] == INT32_MAX && ids[P - 1] == INT32_MAX);
	edgelm_free(ids);
out:
	free(prompt);
	edgelm_close(c);
	fake_stop(f);
}

/* Numbers libedgelm used to change on the way: a seed above 2^63-1 is
 * refused instead of being sent as another seed; a deadline or poll wait
 * far in the future still gets a reply timeout (no signed overflow). */
static void test_params_not_changed(void)
{
	struct fake *f = fake_start();
	edgelm_client *c = f ? connect_to(f) : NULL;
	if (!c)
		goto out;
	struct edgelm_params p;
	edgelm_params_init(&p);
	struct edgelm_result r;
	struct edgelm_error e;

	p.has_seed = true;
	p.seed = (uint64_t)INT64_MAX + 6;
	unsigned n = atomic_load(&f->n_requests);
	int rc = edgelm_generate(c, "hi", &p, &r, &e);
	CHECK_MSG(rc == EDGELM_E_INVALID_ARG, "seed 2^63+5: %d (%s)", rc, e.message);
	CHECK(strstr(e.message, "seed") != NULL);
	CHECK_EQ_INT(atomic_load(&f->n_requests), n);
	edgelm_result_free(&r);
	p.seed = (uint64_t)INT64_MAX;
	rc = edgelm_generate(c, "hi", &p, &r, &e);
	CHECK_MSG(rc == 0, "seed 2^63-1: %d (%s)", rc, e.message);
	edgelm_result_free(&r);
	p.has_seed = false;

	/* the server refuses both; the client must get that far */
	edgelm_set_timeout(c, INT_MAX);
	p.deadline_ms = INT64_MAX;
	rc = edgelm_generate(c, "hi", &p, &r, &e);
	CHECK_MSG(rc == EDGELM_E_INVALID_FIELD, "deadline 2^63-1: %d (%s)", rc, e.message);
	edgelm_result_free(&r);
	p.deadline_ms = 0;
	p.poll_wait_ms = INT32_MAX;
	rc = edgelm_generate_stream(c, "hi", &p, NULL, NULL, &r, &e);
	CHECK_MSG(rc == EDGELM_E_INVALID_FIELD, "poll wait 2^31-1: %d (%s)", rc, e.message);
	CHECK(strstr(e.message, "wait_ms") != NULL);
	edgelm_result_free(&r);
out:
	edgelm_close(c);
	fake_stop(f);
}

int main(void)
{
	TEST_RUN(test_prompt_of_one_mib);
	TEST_RUN(test_params_not_changed);
	return test_finish();
}
