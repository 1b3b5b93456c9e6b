/* tests/fuzz/fuzz_http_request.c: libFuzzer entry for the HTTP front's
 * translation (http/openai.c), the part that sees a network client's bytes
 * first (after jansson).
 *
 * The first byte picks completions or chat; the rest is the request body.
 * A body that translates must give protocol JSON that the socket's parser
 * takes or refuses with a message (never a crash); every refusal must be a
 * 4xx/5xx with a message. The body is also translated as /v1/embeddings'.
 * The same bytes are also read as a protocol reply and turned into
 * OpenAI's response, chunk, embeddings list and error, as the server does
 * with what the core answers.
 *
 *   make fuzz && build-fuzz/fuzz_http_request -max_len=4096 tests/fuzz/corpus/http_request
 *
 * `make check` replays the corpus with tests/fuzz/replay.c. */
#include "http/http_impl.h"
#include "ipc/ipc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_err(const struct oai_err *e)
{
	if (e->status < 400 || e->status > 599 || !e->message[0] || !e->type) {
		fprintf(stderr, "bad error: %u %s\n", e->status, e->message);
		abort();
	}
	json_t *j = oai_err_json(e);
	if (!j)
		abort();
	json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	enum oai_kind kind = data[0] & 1 ? OAI_CHAT : OAI_COMPLETIONS;
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
	if (j) {
		char *proto = NULL;
		struct oai_opts o;
		struct oai_err e = {0};
		if (oai_request(j, kind, "h-fuzz", &proto, &o, &e) == 0) {
			struct ipc_request *r = NULL;
			struct cm_err err = {0};
			int rc = ipc_request_parse(proto, strlen(proto), NULL, &r, &err);
			if (rc == 0) {
				if (r->op != (kind == OAI_CHAT ? IPC_OP_CHAT : IPC_OP_GENERATE) ||
				    r->stream != o.stream)
					abort();
				ipc_request_free(r);
			} else if (!err.msg[0]) {
				abort();
			}
			free(proto);
		} else {
			check_err(&e);
		}
		bool b64;
		if (oai_embed_request(j, &proto, &b64, &e) == 0) {
			struct ipc_request *r = NULL;
			struct cm_err err = {0};
			int rc = ipc_request_parse(proto, strlen(proto), NULL, &r, &err);
			if (rc == 0 && r->op != IPC_OP_EMBED)
				abort();
			if (rc != 0 && !err.msg[0])
				abort();
			ipc_request_free(r);
			free(proto);
		} else {
			check_err(&e);
		}
		json_decref(j);
	}
	/* the same bytes as the core's reply */
	json_t *reply = json_loadb(body, len, JSON_ALLOW_NUL, NULL);
	if (reply) {
		struct oai_err e;
		oai_err_from_reply(reply, &e);
		check_err(&e);
		json_t *resp = oai_response(kind, "id", "m", 0, reply);
		json_decref(resp);
		json_decref(oai_embed_response("m", reply, data[0] & 8));
		const json_t *t = json_object_get(reply, "text");
		json_t *ch = oai_chunk(kind, "id", "m", 0, json_string_value(t), json_string_length(t),
				       data[0] & 2, oai_finish(json_string_value(
						      json_object_get(reply, "finish_reason"))),
				       data[0] & 4 ? oai_usage(json_object_get(reply, "usage")) : NULL);
		json_decref(ch);
		json_decref(reply);
	}
	return 0;
}
