/* tests/unit/test_http_openai.c: the HTTP front's translation (http/openai.c)
 * and its key file (http_keys_parse), without a server:
 * - OpenAI request bodies become protocol requests that the socket's own
 *   parser accepts, with the fields mapped (max_completion_tokens, stop as
 *   a string, text parts, developer -> system, stream);
 * - what is not served is refused by name (n, logprobs, logit_bias,
 *   response_format's other types, tools, token prompts, roles);
 * - response_format json_object and json_schema, and llama.cpp's grammar
 *   and json_schema, become the protocol's grammar or json_schema;
 * - protocol errors become OpenAI's shape with the right status, param and
 *   Retry-After; finish reasons and usage map;
 * - embeddings: input a string or strings becomes an embed request the
 *   socket's parser accepts (pooling, truncate pass through); token ids,
 *   bad encoding_format and dimensions are refused by name; the reply
 *   becomes OpenAI's list, floats or base64 of float32 bytes;
 * - keys: NAME KEY and KEY lines, comments, bad lines named. */
#include "http/http_impl.h"
#include "ipc/ipc.h"

#include "tests/test.h"

static json_t *load(const char *s)
{
	json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL);
	CHECK_MSG(j, "bad test JSON: %s", s);
	return j;
}

/* Translate `body`; on success parse the result with the socket's parser. */
static int translate(const char *body, enum oai_kind kind, struct ipc_request **ret,
		     struct oai_opts *o, struct oai_err *e)
{
	json_t *j = load(body);
	char *proto = NULL;
	int rc = oai_request(j, kind, "h-test", &proto, o, e);
	json_decref(j);
	*ret = NULL;
	if (rc)
		return rc;
	struct cm_err err = {0};
	rc = ipc_request_parse(proto, strlen(proto), NULL, ret, &err);
	CHECK_MSG(rc == 0 || *ret == NULL, "%s", err.msg);
	if (rc) {
		/* the protocol's refusal, as the daemon would answer it */
		char *js;
		size_t len;
		CHECK_OK(ipc_error_encode(ipc_errcode_from_errno(rc), NULL, err.msg, -1, &js, &len));
		json_t *reply = json_loadb(js, len, 0, NULL);
		oai_err_from_reply(reply, e);
		json_decref(reply);
		cm_free(js);
	}
	free(proto);
	return rc;
}

static void test_completion_fields(void)
{
	struct ipc_request *r;
	struct oai_opts o;
	struct oai_err e;
	CHECK_OK(translate("{\"model\":\"x\",\"prompt\":\"Once\",\"max_tokens\":7,\"temperature\":0,"
			   "\"top_p\":0.5,\"seed\":3,\"stop\":\"\\n\",\"frequency_penalty\":0.5,"
			   "\"presence_penalty\":-1,\"user\":\"u\",\"n\":1,\"top_k\":5,\"min_p\":0.1,"
			   "\"repeat_penalty\":1.1,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
			   "\"logit_bias\":{\"7\":-100,\"9\":2.5},\"logprobs\":null,\"unknown_extra\":[1]}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r) {
		CHECK(r->op == IPC_OP_GENERATE);
		CHECK(strcmp(r->prompt, "Once") == 0);
		CHECK(strcmp(r->id, "h-test") == 0);
		CHECK_EQ_INT(r->sampling.max_tokens, 7);
		CHECK(r->sampling.temperature == 0.0f && r->sampling.top_p == 0.5f);
		CHECK(r->sampling.top_k == 5 && r->sampling.min_p == 0.1f);
		CHECK(r->sampling.seed == 3 && (r->sampling.set & IPC_SET_SEED));
		CHECK(r->sampling.frequency_penalty == 0.5f && r->sampling.presence_penalty == -1.0f);
		CHECK_EQ_INT((int)r->n_stop, 1);
		CHECK(r->n_stop == 1 && strcmp(r->stop[0], "\n") == 0);
		CHECK(r->stream);
		CHECK(r->n_bias == 2);
		for (size_t i = 0; i < r->n_bias; i++)
			CHECK(r->bias_ids[i] == 7 ? r->bias[i] == -100.0f
						  : r->bias_ids[i] == 9 && r->bias[i] == 2.5f);
	}
	CHECK(o.stream && o.include_usage);
	ipc_request_free(r);

	/* max_completion_tokens wins; a prompt array of one string */
	CHECK_OK(translate("{\"prompt\":[\"Hi\"],\"max_tokens\":3,\"max_completion_tokens\":9}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r) {
		CHECK_EQ_INT(r->sampling.max_tokens, 9);
		CHECK(strcmp(r->prompt, "Hi") == 0 && !r->stream);
	}
	CHECK(!o.stream && !o.include_usage);
	ipc_request_free(r);
	/* logprobs: completions' integer is the alternatives' count */
	CHECK_OK(translate("{\"prompt\":\"a\",\"logprobs\":3}", OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->logprobs && r->top_logprobs == 3);
	ipc_request_free(r);
	CHECK_OK(translate("{\"prompt\":\"a\",\"logprobs\":0}", OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->logprobs && r->top_logprobs == 0);
	ipc_request_free(r);
	CHECK_OK(translate("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
			   "\"top_logprobs\":20}",
			   OAI_CHAT, &r, &o, &e));
	if (r)
		CHECK(r->logprobs && r->top_logprobs == 20);
	ipc_request_free(r);
	CHECK_OK(translate("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false}",
			   OAI_CHAT, &r, &o, &e));
	if (r)
		CHECK(!r->logprobs && r->top_logprobs == 0);
	ipc_request_free(r);
	/* no sampling fields: the protocol's defaults, flagged unset */
	CHECK_OK(translate("{\"prompt\":\"\"}", OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(!(r->sampling.set & (IPC_SET_MAX_TOKENS | IPC_SET_TEMPERATURE | IPC_SET_SEED)));
	ipc_request_free(r);
}

static void test_structured_output(void)
{
	struct ipc_request *r;
	struct oai_opts o;
	struct oai_err e;
	/* json_object: any object */
	CHECK_OK(translate("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			   "\"response_format\":{\"type\":\"json_object\"}}",
			   OAI_CHAT, &r, &o, &e));
	if (r)
		CHECK(r->json_schema && strcmp(r->json_schema, "{\"type\":\"object\"}") == 0 &&
		      !r->grammar);
	ipc_request_free(r);
	/* json_schema: its schema; name and strict need nothing */
	CHECK_OK(translate("{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\","
			   "\"json_schema\":{\"name\":\"pet\",\"strict\":true,\"schema\":"
			   "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\"}}}}}}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->json_schema &&
		      strcmp(r->json_schema,
			     "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"string\"}}}") == 0);
	ipc_request_free(r);
	/* no schema: any JSON value */
	CHECK_OK(translate("{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\","
			   "\"json_schema\":{\"name\":\"x\"}}}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->json_schema && strcmp(r->json_schema, "{}") == 0);
	ipc_request_free(r);
	/* llama-server's schema beside json_object, and its own fields */
	CHECK_OK(translate("{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\","
			   "\"schema\":{\"type\":\"array\"}}}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->json_schema && strcmp(r->json_schema, "{\"type\":\"array\"}") == 0);
	ipc_request_free(r);
	CHECK_OK(translate("{\"prompt\":\"a\",\"json_schema\":{\"type\":\"integer\"}}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(r->json_schema && strcmp(r->json_schema, "{\"type\":\"integer\"}") == 0);
	ipc_request_free(r);
	CHECK_OK(translate("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
			   "\"grammar\":\"root ::= \\\"a\\\"\",\"response_format\":{\"type\":\"text\"}}",
			   OAI_CHAT, &r, &o, &e));
	if (r)
		CHECK(r->grammar && strcmp(r->grammar, "root ::= \"a\"") == 0 && !r->json_schema);
	ipc_request_free(r);
	/* null is absent */
	CHECK_OK(translate("{\"prompt\":\"a\",\"response_format\":null,\"grammar\":null,"
			   "\"json_schema\":null}",
			   OAI_COMPLETIONS, &r, &o, &e));
	if (r)
		CHECK(!r->grammar && !r->json_schema);
	ipc_request_free(r);
}

static void test_chat_messages(void)
{
	struct ipc_request *r;
	struct oai_opts o;
	struct oai_err e;
	CHECK_OK(translate("{\"messages\":[{\"role\":\"developer\",\"content\":\"Be brief.\"},"
			   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
			   "{\"type\":\"text\",\"text\":\"lo\"}],\"name\":\"bob\"},"
			   "{\"role\":\"assistant\",\"content\":null},"
			   "{\"role\":\"user\",\"content\":\"again\"}]}",
			   OAI_CHAT, &r, &o, &e));
	if (r) {
		CHECK(r->op == IPC_OP_CHAT);
		CHECK_EQ_INT((int)r->n_messages, 4);
		CHECK(r->n_messages == 4 && r->messages[0].role == IPC_ROLE_SYSTEM &&
		      strcmp(r->messages[1].content, "Hello") == 0 &&
		      r->messages[2].role == IPC_ROLE_ASSISTANT && r->messages[2].content_len == 0);
	}
	ipc_request_free(r);
}

/* Each refused body names the field in param with a 400. */
static void test_refusals(void)
{
	static const struct {
		const char *body;
		enum oai_kind kind;
		const char *param;
	} cases[] = {
		{"{\"prompt\":\"a\",\"n\":2}", OAI_COMPLETIONS, "n"},
		{"{\"prompt\":[1,2,3]}", OAI_COMPLETIONS, "prompt"},
		{"{\"prompt\":[\"a\",\"b\"]}", OAI_COMPLETIONS, "prompt"},
		{"{\"prompt\":5}", OAI_COMPLETIONS, "prompt"},
		{"{}", OAI_COMPLETIONS, "prompt"},
		{"{\"prompt\":\"a\",\"echo\":true}", OAI_COMPLETIONS, "echo"},
		{"{\"prompt\":\"a\",\"best_of\":3}", OAI_COMPLETIONS, "best_of"},
		{"{\"prompt\":\"a\",\"suffix\":\"z\"}", OAI_COMPLETIONS, "suffix"},
		{"{\"prompt\":\"a\",\"logit_bias\":[5]}", OAI_COMPLETIONS, "logit_bias"},
		{"{\"prompt\":\"a\",\"logit_bias\":{\"x\":1}}", OAI_COMPLETIONS, "logit_bias"},
		{"{\"prompt\":\"a\",\"logit_bias\":{\"5\":101}}", OAI_COMPLETIONS, "logit_bias"},
		{"{\"prompt\":\"a\",\"stop\":4}", OAI_COMPLETIONS, "stop"},
		{"{\"prompt\":\"a\",\"stream\":\"yes\"}", OAI_COMPLETIONS, "stream"},
		{"{\"prompt\":\"a\",\"max_tokens\":1.5}", OAI_COMPLETIONS, "max_tokens"},
		{"{\"messages\":[]}", OAI_CHAT, "messages"},
		{"{\"messages\":\"hi\"}", OAI_CHAT, "messages"},
		{"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", OAI_CHAT, "messages[0].role"},
		{"{\"messages\":[{\"content\":\"x\"}]}", OAI_CHAT, "messages[0].role"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", OAI_CHAT,
		 "messages[0].content"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":7}]}", OAI_CHAT, "messages[0].content"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":\"yes\"}", OAI_CHAT,
		 "logprobs"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", OAI_CHAT,
		 "top_logprobs"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
		 "\"top_logprobs\":21}",
		 OAI_CHAT, "top_logprobs"},
		{"{\"prompt\":\"a\",\"logprobs\":-1}", OAI_COMPLETIONS, "top_logprobs"},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
		 "\"xml\"}}",
		 OAI_CHAT, "response_format"},
		{"{\"prompt\":\"a\",\"response_format\":\"json\"}", OAI_COMPLETIONS, "response_format"},
		{"{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\"}}", OAI_COMPLETIONS,
		 "response_format"},
		{"{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
		 "{\"schema\":[]}}}",
		 OAI_COMPLETIONS, "response_format"},
		{"{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"x\"}",
		 OAI_COMPLETIONS, "response_format"},
		{"{\"prompt\":\"a\",\"json_schema\":5}", OAI_COMPLETIONS, "json_schema"},
		/* the protocol's own checks */
		{"{\"prompt\":\"a\",\"grammar\":5}", OAI_COMPLETIONS, "grammar"},
		{"{\"prompt\":\"a\",\"grammar\":\"root ::= x\",\"json_schema\":{}}", OAI_COMPLETIONS,
		 ""},
		{"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", OAI_CHAT,
		 "tools"},
		/* the socket's parser, through the protocol's error */
		{"{\"prompt\":\"a\",\"top_p\":5}", OAI_COMPLETIONS, "top_p"},
		{"{\"prompt\":\"a\",\"temperature\":\"hot\"}", OAI_COMPLETIONS, "temperature"},
		{"{\"prompt\":\"a\",\"seed\":-1}", OAI_COMPLETIONS, "seed"},
		{"{\"prompt\":\"a\",\"max_tokens\":0}", OAI_COMPLETIONS, "max_tokens"},
		{"{\"prompt\":\"a\",\"stop\":[\"\"]}", OAI_COMPLETIONS, "stop"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		struct ipc_request *r = NULL;
		struct oai_opts o;
		struct oai_err e = {0};
		int rc = translate(cases[i].body, cases[i].kind, &r, &o, &e);
		CHECK_MSG(rc != 0, "accepted: %s", cases[i].body);
		CHECK_MSG(e.status == 400, "%s: status %u", cases[i].body, e.status);
		CHECK_MSG(strcmp(e.param, cases[i].param) == 0, "%s: param '%s', want '%s' (%s)",
			  cases[i].body, e.param, cases[i].param, e.message);
		CHECK_MSG(e.message[0] != '\0', "%s: no message", cases[i].body);
		json_t *ej = oai_err_json(&e);
		CHECK(json_is_string(json_object_get(json_object_get(ej, "error"), "message")));
		CHECK(json_is_string(json_object_get(json_object_get(ej, "error"), "type")));
		json_decref(ej);
		ipc_request_free(r);
	}
	/* not an object */
	json_t *arr = load("[1]");
	struct oai_opts o;
	struct oai_err e;
	char *proto = NULL;
	CHECK(oai_request(arr, OAI_CHAT, "h-1", &proto, &o, &e) == -EINVAL && e.status == 400);
	json_decref(arr);
}

static void test_errors_from_replies(void)
{
	static const struct {
		const char *reply;
		unsigned status;
		const char *code;
		int64_t retry;
	} cases[] = {
		{"{\"ok\":false,\"error\":{\"code\":\"queue_full\",\"message\":\"queue full\",\"retry_after_ms\":1250}}",
		 429, "queue_full", 2},
		{"{\"ok\":false,\"error\":{\"code\":\"shutting_down\",\"message\":\"x\"}}", 503,
		 "shutting_down", 1},
		{"{\"ok\":false,\"error\":{\"code\":\"prompt_too_long\",\"message\":\"x\"}}", 400,
		 "context_length_exceeded", 0},
		{"{\"ok\":false,\"error\":{\"code\":\"too_large\",\"message\":\"x\"}}", 413, NULL, 0},
		{"{\"ok\":false,\"error\":{\"code\":\"not_ready\",\"message\":\"x\"}}", 503,
		 "not_ready", 1},
		{"{\"ok\":false,\"error\":{\"code\":\"internal\",\"message\":\"x\"}}", 500, NULL, 0},
		{"{\"ok\":false,\"error\":{\"code\":\"never-heard-of\"}}", 500, NULL, 0},
		{"{\"ok\":false}", 500, NULL, 0},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(cases); i++) {
		json_t *j = load(cases[i].reply);
		struct oai_err e;
		oai_err_from_reply(j, &e);
		CHECK_MSG(e.status == cases[i].status, "%s: %u", cases[i].reply, e.status);
		CHECK_MSG(cases[i].code ? e.code && strcmp(e.code, cases[i].code) == 0 : !e.code,
			  "%s: code %s", cases[i].reply, e.code ? e.code : "(null)");
		CHECK_MSG(e.retry_after_s == cases[i].retry, "%s: retry %lld", cases[i].reply,
			  (long long)e.retry_after_s);
		json_decref(j);
	}
}

static void test_responses(void)
{
	CHECK(strcmp(oai_finish("stop"), "stop") == 0);
	CHECK(strcmp(oai_finish("length"), "length") == 0);
	CHECK(strcmp(oai_finish("deadline"), "length") == 0);
	CHECK(strcmp(oai_finish("cancelled"), "cancelled") == 0);
	CHECK(oai_finish(NULL) == NULL);

	json_t *reply = load("{\"ok\":true,\"text\":\"a\\u0000b\",\"finish_reason\":\"stop\","
			     "\"usage\":{\"prompt_tokens\":5,\"cached_tokens\":2,\"completion_tokens\":3}}");
	json_t *c = oai_response(OAI_CHAT, "chatcmpl-1", "m.gguf", 7, reply);
	json_t *msg = json_object_get(json_array_get(json_object_get(c, "choices"), 0), "message");
	CHECK(json_string_length(json_object_get(msg, "content")) == 3); /* the NUL kept */
	json_t *u = json_object_get(c, "usage");
	CHECK(json_integer_value(json_object_get(u, "total_tokens")) == 8);
	CHECK(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
						 "cached_tokens")) == 2);
	CHECK(strcmp(json_string_value(json_object_get(c, "object")), "chat.completion") == 0);
	json_decref(c);
	c = oai_response(OAI_COMPLETIONS, "cmpl-1", "m.gguf", 7, reply);
	json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
	CHECK(json_string_length(json_object_get(ch, "text")) == 3);
	CHECK(strcmp(json_string_value(json_object_get(ch, "finish_reason")), "stop") == 0);
	json_decref(c);
	/* a reply without text still makes a response */
	json_t *bare = load("{\"ok\":true}");
	c = oai_response(OAI_CHAT, "chatcmpl-2", "m", 1, bare);
	CHECK(c != NULL);
	json_decref(c);
	json_decref(bare);
	json_decref(reply);

	/* logprobs in both shapes; -inf (null) becomes -9999 */
	json_t *plp = load("[{\"token\":\"Hi\",\"logprob\":-0.5,\"top\":[{\"token\":\"Hi\",\"logprob\":-0.5},"
			   "{\"token\":\"Yo\",\"logprob\":null}]},{\"token\":\"!\",\"logprob\":-1,\"top\":[]}]");
	size_t off = 10;
	json_t *cl = oai_logprobs(OAI_COMPLETIONS, plp, &off);
	CHECK(json_array_size(json_object_get(cl, "tokens")) == 2 && off == 13);
	CHECK(json_integer_value(json_array_get(json_object_get(cl, "text_offset"), 1)) == 12);
	CHECK(json_real_value(json_object_get(json_array_get(json_object_get(cl, "top_logprobs"), 0),
					      "Yo")) == -9999.0);
	json_decref(cl);
	json_t *chl = oai_logprobs(OAI_CHAT, plp, &off);
	json_t *c0 = json_array_get(json_object_get(chl, "content"), 0);
	CHECK(json_real_value(json_object_get(c0, "logprob")) == -0.5);
	CHECK(json_array_size(json_object_get(c0, "bytes")) == 2);
	CHECK(json_array_size(json_object_get(c0, "top_logprobs")) == 2);
	json_decref(chl);
	json_decref(plp);
	json_t *none = oai_logprobs(OAI_CHAT, NULL, &off);
	CHECK(json_is_null(none));
	json_decref(none);

	json_t *k = oai_chunk(OAI_CHAT, "chatcmpl-1", "m", 1, "", 0, true, NULL, NULL);
	json_t *d = json_object_get(json_array_get(json_object_get(k, "choices"), 0), "delta");
	CHECK(strcmp(json_string_value(json_object_get(d, "role")), "assistant") == 0);
	CHECK(json_is_null(json_object_get(json_array_get(json_object_get(k, "choices"), 0),
					   "finish_reason")));
	json_decref(k);
	k = oai_chunk(OAI_CHAT, "chatcmpl-1", "m", 1, NULL, 0, false, "length", NULL);
	d = json_object_get(json_array_get(json_object_get(k, "choices"), 0), "delta");
	CHECK(json_object_size(d) == 0);
	json_decref(k);
	/* bytes that are not UTF-8 never lose the chunk */
	k = oai_chunk(OAI_COMPLETIONS, "cmpl-1", "m", 1, "\xff", 1, false, NULL, NULL);
	CHECK(k && json_string_length(json_object_get(json_array_get(json_object_get(k, "choices"), 0),
						      "text")) > 0);
	json_decref(k);
	k = oai_chunk(OAI_CHAT, "c", "m", 1, NULL, 0, false, NULL, oai_usage(NULL));
	CHECK(json_array_size(json_object_get(k, "choices")) == 0 && json_object_get(k, "usage"));
	json_decref(k);
}

static int translate_embed(const char *body, struct ipc_request **ret, bool *b64,
			   struct oai_err *e)
{
	json_t *j = load(body);
	char *proto = NULL;
	int rc = oai_embed_request(j, &proto, b64, e);
	json_decref(j);
	*ret = NULL;
	if (rc)
		return rc;
	struct cm_err err = {0};
	rc = ipc_request_parse(proto, strlen(proto), NULL, ret, &err);
	CHECK_MSG(rc == 0, "%s: %s", proto, err.msg);
	free(proto);
	return rc;
}

static void test_embeddings(void)
{
	struct ipc_request *r;
	struct oai_err e;
	bool b64;
	CHECK_OK(translate_embed("{\"model\":\"m\",\"input\":\"hello\",\"user\":\"u\"}", &r, &b64,
				 &e));
	CHECK(r && r->op == IPC_OP_EMBED && r->n_inputs == 1 && !b64);
	CHECK(r && strcmp(r->inputs[0], "hello") == 0 && r->pooling == IPC_POOL_DEFAULT);
	ipc_request_free(r);
	CHECK_OK(translate_embed("{\"input\":[\"a\",\"b c\"],\"encoding_format\":\"base64\","
				 "\"pooling\":\"last\",\"truncate\":true}",
				 &r, &b64, &e));
	CHECK(r && r->n_inputs == 2 && strcmp(r->inputs[1], "b c") == 0 && b64);
	CHECK(r && r->pooling == IPC_POOL_LAST && r->truncate);
	ipc_request_free(r);
	static const struct {
		const char *body, *param;
	} bad[] = {
		{"{\"input\":[1,2,3]}", "input"},
		{"{\"input\":[[1,2],[3]]}", "input"},
		{"{\"model\":\"m\"}", "input"},
		{"{\"input\":\"a\",\"encoding_format\":\"int8\"}", "encoding_format"},
		{"{\"input\":\"a\",\"dimensions\":8}", "dimensions"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		CHECK_EQ_INT(translate_embed(bad[i].body, &r, &b64, &e), -EINVAL);
		CHECK_MSG(e.status == 400 && strcmp(e.param, bad[i].param) == 0, "%s: %u %s",
			  bad[i].body, e.status, e.param);
	}
	/* an empty input is the protocol's refusal, named */
	json_t *j = load("{\"input\":[]}");
	char *proto = NULL;
	CHECK_OK(oai_embed_request(j, &proto, &b64, &e));
	struct cm_err err = {0};
	CHECK(ipc_request_parse(proto, strlen(proto), NULL, &r, &err) != 0);
	CHECK(strstr(err.msg, "input") != NULL);
	free(proto);
	json_decref(j);

	json_t *reply = load("{\"v\":1,\"ok\":true,\"op\":\"embed\",\"embeddings\":["
			     "{\"index\":0,\"tokens\":3,\"embedding\":[1.0,-0.5]},"
			     "{\"index\":1,\"tokens\":2,\"embedding\":[0.25,0]}],"
			     "\"pooling\":\"mean\",\"usage\":{\"prompt_tokens\":5}}");
	json_t *out = oai_embed_response("m.gguf", reply, false);
	char *t = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(9));
	CHECK_STREQ(t, "{\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,"
		       "\"embedding\":[1.0,-0.5]},{\"object\":\"embedding\",\"index\":1,"
		       "\"embedding\":[0.25,0]}],\"model\":\"m.gguf\",\"usage\":{"
		       "\"prompt_tokens\":5,\"total_tokens\":5}}");
	free(t);
	json_decref(out);
	/* base64 of float32 little-endian: 1.0 = 00 00 80 3f, -0.5 = 00 00 00 bf */
	out = oai_embed_response("m.gguf", reply, true);
	CHECK_STREQ(json_string_value(json_object_get(json_array_get(json_object_get(out, "data"), 0),
						      "embedding")),
		    "AACAPwAAAL8=");
	json_decref(out);
	json_decref(reply);
}

static void test_keys(void)
{
	char **names, **keys;
	struct cm_err err = {0};
	int n = http_keys_parse("# keys\n\nalice sk-aaaaaaaa\n  sk-bbbbbbbbbb  # a comment\r\n"
				"bob\tsk-cccccccc\n",
				&names, &keys, &err);
	CHECK_EQ_INT(n, 3);
	if (n == 3) {
		CHECK(strcmp(names[0], "alice") == 0 && strcmp(keys[0], "sk-aaaaaaaa") == 0);
		CHECK(strcmp(names[1], "key2") == 0 && strcmp(keys[1], "sk-bbbbbbbbbb") == 0);
		CHECK(strcmp(names[2], "bob") == 0 && strcmp(keys[2], "sk-cccccccc") == 0);
		http_keys_free(names, keys, n);
	}
	static const struct {
		const char *text;
		const char *needle;
	} bad[] = {
		{"", "no key"},
		{"# only a comment\n", "no key"},
		{"alice short\n", "line 1"},
		{"ok sk-aaaaaaaa\na b c\n", "line 2"},
		{"sk-\x01\x02xxxxxxx\n", "line 1"},
	};
	for (size_t i = 0; i < CM_ARRAY_LEN(bad); i++) {
		cm_err_clear(&err);
		CHECK_MSG(http_keys_parse(bad[i].text, &names, &keys, &err) < 0, "accepted: %s",
			  bad[i].text);
		CHECK_MSG(strstr(err.msg, bad[i].needle), "%s: message '%s'", bad[i].text, err.msg);
	}
}

int main(void)
{
	TEST_RUN(test_completion_fields);
	TEST_RUN(test_chat_messages);
	TEST_RUN(test_structured_output);
	TEST_RUN(test_refusals);
	TEST_RUN(test_errors_from_replies);
	TEST_RUN(test_responses);
	TEST_RUN(test_embeddings);
	TEST_RUN(test_keys);
	return test_finish();
}
