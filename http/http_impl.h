/* http/http_impl.h: shared by http/server.c (connections, the core calls,
 * SSE) and http/openai.c (OpenAI's JSON to the protocol's and back);
 * nothing else includes it. */
#ifndef EDGELM_HTTP_IMPL_H
#define EDGELM_HTTP_IMPL_H

#include "http/http.h"

#include <jansson.h>
#include <stdint.h>

enum oai_kind { OAI_COMPLETIONS, OAI_CHAT };

/* A refused request, in OpenAI's error shape with its HTTP status. */
struct oai_err {
	unsigned status;
	const char *type;  /* "invalid_request_error", ... */
	char param[64];    /* "" when no one field is at fault */
	const char *code;  /* NULL or "context_length_exceeded", ... */
	int64_t retry_after_s; /* > 0: a Retry-After header */
	char message[512];
};

/* What the translation of a generation request found besides the
 * protocol request. */
struct oai_opts {
	bool stream;
	bool include_usage; /* stream_options.include_usage */
};

/* OpenAI's request body -> the protocol's generate or chat request with
 * id `id` (stream as asked). 0, or -EINVAL with e filled (400). */
int oai_request(const json_t *body, enum oai_kind kind, const char *id, char **ret_json,
		struct oai_opts *o, struct oai_err *e);

/* A protocol error reply (`error` object) -> e, with its status. */
void oai_err_from_reply(const json_t *reply, struct oai_err *e);
void oai_err_set(struct oai_err *e, unsigned status, const char *type, const char *param,
		 const char *code, const char *fmt, ...) CM_PRINTF(6, 7);
/* {"error":{"message","type","param","code"}} */
json_t *oai_err_json(const struct oai_err *e);

/* finish_reason as OpenAI names it, from the protocol's */
const char *oai_finish(const char *proto);
/* {"prompt_tokens","completion_tokens","total_tokens",
 *  "prompt_tokens_details":{"cached_tokens"}} from the protocol's usage */
json_t *oai_usage(const json_t *usage);
/* choice.logprobs from the protocol's "logprobs" array: chat's
 * {"content": [{token, logprob, bytes, top_logprobs}]}, completions'
 * {tokens, token_logprobs, top_logprobs, text_offset} (text_offset counts
 * on from *text_offset, bytes of the tokens' text). */
json_t *oai_logprobs(enum oai_kind kind, const json_t *proto, size_t *text_offset);
/* The whole (non-streaming) response from the protocol's generate/chat
 * reply. */
json_t *oai_response(enum oai_kind kind, const char *cid, const char *model, int64_t created,
		     const json_t *reply);
/* One streamed chunk: text (may be empty), role (chat's first chunk),
 * finish (NULL while running); usage: the closing usage-only chunk. */
json_t *oai_chunk(enum oai_kind kind, const char *cid, const char *model, int64_t created,
		  const char *text, size_t len, bool role, const char *finish, json_t *usage);

/* POST /v1/embeddings' body -> the protocol's embed request (input a
 * string or strings; token ids are refused); *ret_base64: encoding_format
 * "base64". 0, or -EINVAL with e filled (400). */
int oai_embed_request(const json_t *body, char **ret_json, bool *ret_base64, struct oai_err *e);
/* {"object":"list","data":[{"object":"embedding","index","embedding"}],
 *  "model","usage":{"prompt_tokens","total_tokens"}} from an embed reply;
 * base64: each vector as its float32 bytes (little-endian) in base64. */
json_t *oai_embed_response(const char *model, const json_t *reply, bool base64);

/* The web page (http/page.html, embedded by the build). */
extern const unsigned char http_page_html[];
extern const size_t http_page_html_len;

#endif
