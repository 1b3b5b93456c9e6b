/* tests/fuzz/fuzz_ipc_request.c: libFuzzer entry for the request parser.
 *
 * Every input is parsed. A request that parses must encode, and its encoding
 * must parse again and encode to the same bytes (the codec is stable); a
 * failure must carry a message and a code from the table. The same bytes are
 * also decoded as a reply to a chosen op, which is what libedgelm does with
 * whatever comes back from a socket.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -I. \
 *         tests/fuzz/fuzz_ipc_request.c ipc/protocol*.c common/common.c -ljansson
 *   ./a.out -max_len=4096 tests/fuzz/corpus/ipc_request
 *
 * `make check` replays the corpus with tests/fuzz/replay.c. */
#include "ipc/ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_request(const struct ipc_request *r)
{
	char *a = NULL, *b = NULL;
	size_t alen, blen;
	struct ipc_request *r2 = NULL;
	struct cm_err err = {0};
	if (ipc_request_encode(r, &a, &alen, NULL) != 0)
		return; /* only out of memory */
	if (ipc_request_parse(a, alen, NULL, &r2, &err) != 0) {
		fprintf(stderr, "re-parse failed: %s\n%s\n", err.msg, a);
		abort();
	}
	if (ipc_request_encode(r2, &b, &blen, NULL) == 0) {
		if (alen != blen || memcmp(a, b, alen) != 0) {
			fprintf(stderr, "unstable encoding:\n%s\n%s\n", a, b);
			abort();
		}
		cm_free(b);
	}
	ipc_request_free(r2);
	cm_free(a);

	/* Echo the request's text through a reply, as a daemon would. */
	struct ipc_reply rep = {.op = IPC_OP_POLL, .id = r->id, .retry_after_ms = -1};
	rep.u.poll.text = r->prompt ? r->prompt : r->text;
	rep.u.poll.text_len = r->prompt ? r->prompt_len : r->text_len;
	rep.u.poll.offset = r->ack > (1ull << 40) ? 0 : r->ack;
	char *json = NULL;
	size_t len;
	if (ipc_reply_encode(&rep, &json, &len, NULL) == 0) {
		struct ipc_reply *d = NULL;
		if (ipc_reply_decode(json, len, IPC_OP_POLL, &d, NULL) != 0 ||
		    d->u.poll.next != rep.u.poll.offset + rep.u.poll.text_len) {
			fprintf(stderr, "reply round trip failed: %s\n", json);
			abort();
		}
		ipc_reply_free(d);
		cm_free(json);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ipc_request *r = NULL;
	struct cm_err err = {0};
	int rc = ipc_request_parse((const char *)data, size, NULL, &r, &err);
	if (rc == 0) {
		check_request(r);
		ipc_request_free(r);
	} else {
		enum ipc_errcode code = ipc_errcode_from_errno(rc);
		if (r != NULL || err.code != rc || !err.msg[0] || code == IPC_ERR_NONE) {
			fprintf(stderr, "bad failure contract: rc %d, msg '%s'\n", rc, err.msg);
			abort();
		}
		char *json = NULL;
		if (ipc_error_encode(code, NULL, err.msg, -1, &json, NULL) == 0)
			cm_free(json);
	}

	/* The same bytes as a reply (libedgelm's side): to the op it names, and
	 * to an op picked by the last byte. */
	struct ipc_reply *d = NULL;
	if (ipc_reply_decode((const char *)data, size, IPC_OP_NONE, &d, NULL) == 0)
		ipc_reply_free(d);
	enum ipc_op op = (enum ipc_op)(size ? data[size - 1] % IPC_OP_COUNT : 0);
	if (ipc_reply_decode((const char *)data, size, op, &d, NULL) == 0)
		ipc_reply_free(d);
	return 0;
}
