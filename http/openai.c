/* http/openai.c: OpenAI's request and response shapes, to and from the
 * daemon's protocol (docs/http.md says what maps to what and what differs).
 *
 * Fields the protocol has pass through under their own names and are
 * checked by the protocol's parser, so the ranges and messages are the
 * socket's; fields OpenAI has that edgelm does not serve yet are refused
 * with a 400 that names them rather than ignored, so a client never gets
 * output it did not ask for. Fields neither knows are ignored, as
 * llama-server and ollama do: tools send extras. */
#include "http/http_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void oai_err_set(struct oai_err *e, unsigned status, const char *type, const char *param,
		 const char *code, const char *fmt, ...)
{
	va_list ap;
	e->status = status;
	e->type = type;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	e->code = code;
	e->retry_after_s = 0;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof(e->message), fmt, ap);
	va_end(ap);
}

#define BAD(e, param, ...) \
	(oai_err_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__), -EINVAL)

json_t *oai_err_json(const struct oai_err *e)
{
	return json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type",
			 e->type ? e->type : "server_error", "param",
			 e->param[0] ? json_string(e->param) : json_null(), "code",
			 e->code ? json_string(e->code) : json_null());
}

/* The protocol's error codes, by HTTP status and OpenAI type. */
static const struct {
	const char *code;
	unsigned status;
	const char *type;
	const char *oai_code;
} err_map[] = {
	{"invalid_json", 400, "invalid_request_error", NULL},
	{"unsupported_version", 400, "invalid_request_error", NULL},
	{"unknown_op", 404, "invalid_request_error", NULL},
	{"invalid_field", 400, "invalid_request_error", NULL},
	{"too_large", 413, "invalid_request_error", NULL},
	{"prompt_too_long", 400, "invalid_request_error", "context_length_exceeded"},
	{"queue_full", 429, "rate_limit_error", "queue_full"},
	{"deadline_exceeded", 408, "timeout_error", "deadline_exceeded"},
	{"shutting_down", 503, "server_error", "shutting_down"},
	{"not_found", 404, "invalid_request_error", NULL},
	{"not_ready", 503, "server_error", "not_ready"},
	{"unsupported", 400, "invalid_request_error", "unsupported"},
	{"internal", 500, "server_error", NULL},
};

void oai_err_from_reply(const json_t *reply, struct oai_err *e)
{
	const json_t *err = json_object_get(reply, "error");
	const char *code = json_string_value(json_object_get(err, "code"));
	const char *msg = json_string_value(json_object_get(err, "message"));
	json_int_t retry = json_integer_value(json_object_get(err, "retry_after_ms"));
	oai_err_set(e, 500, "server_error", NULL, NULL, "%s", msg ? msg : "internal error");
	for (size_t i = 0; code && i < CM_ARRAY_LEN(err_map); i++) {
		if (strcmp(code, err_map[i].code) != 0)
			continue;
		e->status = err_map[i].status;
		e->type = err_map[i].type;
		e->code = err_map[i].oai_code;
		break;
	}
	/* the field at fault: the parser says "field 'top_p' ...", the
	 * daemon "max_tokens: ..." */
	if (msg && (e->status == 400 || e->status == 413)) {
		const char *f = msg;
		const char *letters = "abcdefghijklmnopqrstuvwxyz_0123456789";
		if (strncmp(msg, "field '", 7) == 0)
			f = msg + 7;
		size_t n = strspn(f, letters);
		bool ends = f == msg ? f[n] == ':' || f[n] == '[' : f[n] == '\'';
		if (n > 0 && n < sizeof(e->param) && ends) {
			memcpy(e->param, f, n);
			e->param[n] = '\0';
		}
	}
	if (retry > 0)
		e->retry_after_s = (retry + 999) / 1000;
	else if (e->status == 429 || e->status == 503)
		e->retry_after_s = 1;
}

/* ---- requests ----------------------------------------------------------------- */

/* OpenAI's names that are the protocol's too, copied as they are (the
 * parser checks type and range). */
static const char *const pass_fields[] = {
	"temperature", "top_p",    "seed",           "frequency_penalty", "presence_penalty",
	"top_k",       "min_p",    "repeat_penalty", "penalty_last_n",
};

static bool is_null(const json_t *v)
{
	return !v || json_is_null(v);
}

/* Structured output: OpenAI's response_format, or llama.cpp's grammar and
 * json_schema fields, become the protocol's grammar or json_schema (the
 * daemon converts a schema and checks both). json_object is the schema
 * {"type":"object"}: any object, the grammar ipc_json_object_gbnf makes. */
static int copy_structured(const json_t *b, json_t *out, struct oai_err *e)
{
	const json_t *rf = json_object_get(b, "response_format");
	const json_t *gr = json_object_get(b, "grammar");
	const json_t *js = json_object_get(b, "json_schema");
	json_t *schema = NULL; /* borrowed, or made here (owned) */
	bool owned = false;
	if (!is_null(rf)) {
		const char *t = json_string_value(json_object_get(rf, "type"));
		if (!json_is_object(rf) || !t)
			return BAD(e, "response_format", "response_format: an object with a type is required");
		if (strcmp(t, "json_object") == 0) {
			/* llama-server's extension: a schema beside the type */
			schema = json_object_get(rf, "schema");
			if (!schema) {
				schema = json_pack("{s:s}", "type", "object");
				owned = true;
			}
		} else if (strcmp(t, "json_schema") == 0) {
			const json_t *w = json_object_get(rf, "json_schema");
			if (!json_is_object(w))
				return BAD(e, "response_format",
					   "response_format: type json_schema needs a json_schema object");
			/* name and strict: the schema is always enforced; no schema is
			 * any JSON value */
			schema = json_object_get(w, "schema");
			if (!schema) {
				schema = json_object();
				owned = true;
			}
		} else if (strcmp(t, "text") != 0) {
			return BAD(e, "response_format",
				   "response_format: type %s is not supported (text, json_object, "
				   "json_schema)", t);
		}
	}
	if (schema && (!is_null(gr) || !is_null(js))) {
		if (owned)
			json_decref(schema);
		return BAD(e, "response_format", "response_format: not with %s",
			   !is_null(gr) ? "grammar" : "json_schema");
	}
	if (!schema && !is_null(js))
		schema = (json_t *)js;
	if (schema) {
		const char *from = is_null(rf) ? "json_schema" : "response_format";
		if (!json_is_object(schema)) {
			if (owned)
				json_decref(schema);
			return BAD(e, from, "%s: the schema must be an object", from);
		}
		json_object_set(out, "json_schema", schema);
	}
	if (owned)
		json_decref(schema);
	if (!is_null(gr))
		json_object_set(out, "grammar", (json_t *)gr); /* the parser checks it */
	return 0;
}

static int copy_sampling(const json_t *b, json_t *out, struct oai_err *e)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(pass_fields); i++) {
		json_t *v = json_object_get(b, pass_fields[i]);
		if (!is_null(v))
			json_object_set(out, pass_fields[i], v);
	}
	const json_t *mt = json_object_get(b, "max_completion_tokens");
	const char *mt_name = "max_completion_tokens";
	if (is_null(mt)) {
		mt = json_object_get(b, "max_tokens");
		mt_name = "max_tokens";
	}
	if (!is_null(mt)) {
		if (!json_is_integer(mt))
			return BAD(e, mt_name, "%s: an integer is required", mt_name);
		json_object_set(out, "max_tokens", (json_t *)mt);
	}
	const json_t *n = json_object_get(b, "n");
	if (!is_null(n) && !(json_is_integer(n) && json_integer_value(n) == 1))
		return BAD(e, "n", "n: only 1 choice per request is served");
	const json_t *stop = json_object_get(b, "stop");
	if (json_is_string(stop)) {
		json_object_set_new(out, "stop", json_pack("[O]", stop));
	} else if (json_is_array(stop)) {
		if (json_array_size(stop) > 0)
			json_object_set(out, "stop", (json_t *)stop);
	} else if (!is_null(stop)) {
		return BAD(e, "stop", "stop: a string or an array of strings is required");
	}
	/* token ids as OpenAI writes them; the protocol's parser checks it */
	const json_t *lb = json_object_get(b, "logit_bias");
	if (json_is_object(lb) && json_object_size(lb) > 0)
		json_object_set(out, "logit_bias", (json_t *)lb);
	else if (!is_null(lb) && !json_is_object(lb))
		return BAD(e, "logit_bias", "logit_bias: an object of token id to bias is required");
	/* what the engine-features issue brings; until then refused by name */
	/* chat: logprobs true and top_logprobs N; completions: logprobs N
	 * (the sampled token's and N alternatives). The parser checks N. */
	const json_t *lp = json_object_get(b, "logprobs");
	const json_t *tlp = json_object_get(b, "top_logprobs");
	if (json_is_integer(lp) && !tlp) {
		json_object_set_new(out, "logprobs", json_true());
		json_object_set(out, "top_logprobs", (json_t *)lp);
	} else if (json_is_boolean(lp)) {
		json_object_set(out, "logprobs", (json_t *)lp);
	} else if (!is_null(lp)) {
		return BAD(e, "logprobs", "logprobs: a boolean (chat) or an integer (completions) is required");
	}
	if (!is_null(tlp)) {
		if (!json_is_true(lp))
			return BAD(e, "top_logprobs", "top_logprobs: needs logprobs true");
		json_object_set(out, "top_logprobs", (json_t *)tlp);
	}
	int rc = copy_structured(b, out, e);
	if (rc)
		return rc;
	const json_t *tools = json_object_get(b, "tools");
	if (json_is_array(tools) && json_array_size(tools) > 0)
		return BAD(e, "tools", "tools: tool calls are not supported by this server");
	const json_t *fns = json_object_get(b, "functions");
	if (json_is_array(fns) && json_array_size(fns) > 0)
		return BAD(e, "functions", "functions: function calls are not supported by this server");
	return 0;
}

static int copy_prompt(const json_t *b, json_t *out, struct oai_err *e)
{
	const json_t *p = json_object_get(b, "prompt");
	if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
		p = json_array_get(p, 0);
	if (!json_is_string(p))
		return BAD(e, "prompt",
			   "prompt: a string (or an array of one string) is required; token arrays "
			   "and several prompts are not served");
	json_object_set(out, "prompt", (json_t *)p);
	const json_t *echo = json_object_get(b, "echo");
	if (json_is_true(echo))
		return BAD(e, "echo", "echo: not supported");
	const json_t *suffix = json_object_get(b, "suffix");
	if (!is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0))
		return BAD(e, "suffix", "suffix: not supported");
	const json_t *best_of = json_object_get(b, "best_of");
	if (!is_null(best_of) && !(json_is_integer(best_of) && json_integer_value(best_of) == 1))
		return BAD(e, "best_of", "best_of: only 1 is served");
	return 0;
}

/* content: a string, null (an assistant turn with none), or text parts */
static int message_text(const json_t *content, size_t i, json_t **ret, struct oai_err *e)
{
	char param[64];
	snprintf(param, sizeof(param), "messages[%zu].content", i);
	if (is_null(content)) {
		*ret = json_string("");
		return 0;
	}
	if (json_is_string(content)) {
		*ret = json_incref((json_t *)content);
		return 0;
	}
	if (!json_is_array(content))
		return BAD(e, param, "%s: a string or an array of text parts is required", param);
	size_t total = 0, k;
	const json_t *part;
	json_array_foreach (content, k, part) {
		const char *t = json_string_value(json_object_get(part, "type"));
		if (!t || strcmp(t, "text") != 0)
			return BAD(e, param, "%s[%zu]: only text parts are served", param, k);
		const json_t *tx = json_object_get(part, "text");
		if (!json_is_string(tx))
			return BAD(e, param, "%s[%zu].text: a string is required", param, k);
		total += json_string_length(tx);
	}
	char *buf = cm_malloc(total + 1), *p = buf;
	if (!buf)
		return BAD(e, param, "out of memory");
	json_array_foreach (content, k, part) {
		const json_t *tx = json_object_get(part, "text");
		memcpy(p, json_string_value(tx), json_string_length(tx));
		p += json_string_length(tx);
	}
	*ret = json_stringn(buf, total);
	cm_free(buf);
	return *ret ? 0 : BAD(e, param, "%s: not valid UTF-8", param);
}

static int copy_messages(const json_t *b, json_t *out, struct oai_err *e)
{
	const json_t *msgs = json_object_get(b, "messages");
	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return BAD(e, "messages", "messages: a non-empty array is required");
	json_t *list = json_array();
	json_object_set_new(out, "messages", list);
	size_t i;
	const json_t *m;
	json_array_foreach (msgs, i, m) {
		const char *role = json_string_value(json_object_get(m, "role"));
		char param[48];
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		if (!role)
			return BAD(e, param, "%s: a string is required", param);
		if (strcmp(role, "developer") == 0)
			role = "system"; /* OpenAI's newer name for it */
		if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
		    strcmp(role, "assistant") != 0)
			return BAD(e, param, "%s: %s is not served (system, developer, user, assistant)",
				   param, role);
		json_t *text;
		int rc = message_text(json_object_get(m, "content"), i, &text, e);
		if (rc)
			return rc;
		json_array_append_new(list, json_pack("{s:s,s:o}", "role", role, "content", text));
	}
	return 0;
}

int oai_request(const json_t *body, enum oai_kind kind, const char *id, char **ret_json,
		struct oai_opts *o, struct oai_err *e)
{
	if (!json_is_object(body))
		return BAD(e, NULL, "the body must be a JSON object");
	const json_t *st = json_object_get(body, "stream");
	if (!is_null(st) && !json_is_boolean(st))
		return BAD(e, "stream", "stream: a boolean is required");
	o->stream = json_is_true(st);
	const json_t *so = json_object_get(body, "stream_options");
	o->include_usage = json_is_true(json_object_get(so, "include_usage"));
	json_t *out = json_pack("{s:i,s:s,s:s,s:b}", "v", 1, "op",
				kind == OAI_CHAT ? "chat" : "generate", "id", id, "stream", o->stream);
	if (!out)
		return BAD(e, NULL, "out of memory");
	int rc = kind == OAI_CHAT ? copy_messages(body, out, e) : copy_prompt(body, out, e);
	if (rc == 0)
		rc = copy_sampling(body, out, e);
	if (rc == 0 && !(*ret_json = json_dumps(out, JSON_COMPACT)))
		rc = BAD(e, NULL, "out of memory");
	json_decref(out);
	return rc;
}

/* ---- responses ----------------------------------------------------------------- */

const char *oai_finish(const char *proto)
{
	if (!proto)
		return NULL;
	if (strcmp(proto, "deadline") == 0)
		return "length"; /* a time limit: cut short, as by max_tokens */
	return proto;            /* stop, length; cancelled (docs/http.md) */
}

json_t *oai_usage(const json_t *usage)
{
	json_int_t p = json_integer_value(json_object_get(usage, "prompt_tokens"));
	json_int_t c = json_integer_value(json_object_get(usage, "completion_tokens"));
	json_int_t k = json_integer_value(json_object_get(usage, "cached_tokens"));
	return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)p,
			 "completion_tokens", (json_int_t)c, "total_tokens", (json_int_t)(p + c),
			 "prompt_tokens_details", "cached_tokens", (json_int_t)k);
}

/* OpenAI has no -inf: the value it sends for "never" */
static json_t *lp_number(const json_t *v)
{
	return json_real(json_is_number(v) ? json_number_value(v) : -9999.0);
}

static json_t *utf8_bytes(const char *s, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)s[i]));
	return a;
}

json_t *oai_logprobs(enum oai_kind kind, const json_t *proto, size_t *text_offset)
{
	if (!json_is_array(proto))
		return json_null();
	size_t i;
	const json_t *e;
	if (kind == OAI_CHAT) {
		json_t *content = json_array();
		json_array_foreach (proto, i, e) {
			const json_t *tok = json_object_get(e, "token");
			json_t *tops = json_array();
			size_t k;
			const json_t *t;
			json_array_foreach (json_object_get(e, "top"), k, t) {
				const json_t *tt = json_object_get(t, "token");
				json_array_append_new(
				    tops, json_pack("{s:O,s:o,s:o}", "token", tt, "logprob",
						    lp_number(json_object_get(t, "logprob")), "bytes",
						    utf8_bytes(json_string_value(tt), json_string_length(tt))));
			}
			json_array_append_new(
			    content, json_pack("{s:O,s:o,s:o,s:o}", "token", tok, "logprob",
					       lp_number(json_object_get(e, "logprob")), "bytes",
					       utf8_bytes(json_string_value(tok), json_string_length(tok)),
					       "top_logprobs", tops));
		}
		return json_pack("{s:o}", "content", content);
	}
	json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
	       *offs = json_array();
	json_array_foreach (proto, i, e) {
		const json_t *tok = json_object_get(e, "token");
		json_array_append(tokens, (json_t *)tok);
		json_array_append_new(lps, lp_number(json_object_get(e, "logprob")));
		json_t *top = json_object();
		size_t k;
		const json_t *t;
		json_array_foreach (json_object_get(e, "top"), k, t) {
			const char *tt = json_string_value(json_object_get(t, "token"));
			if (tt && !json_object_get(top, tt))
				json_object_set_new(top, tt, lp_number(json_object_get(t, "logprob")));
		}
		json_array_append_new(tops, top);
		json_array_append_new(offs, json_integer((json_int_t)*text_offset));
		*text_offset += json_string_length(tok);
	}
	return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

json_t *oai_response(enum oai_kind kind, const char *cid, const char *model, int64_t created,
		     const json_t *reply)
{
	json_t *empty = json_string("");
	const json_t *text = json_object_get(reply, "text");
	if (!json_is_string(text))
		text = empty;
	const char *finish = oai_finish(json_string_value(json_object_get(reply, "finish_reason")));
	json_t *choice;
	if (kind == OAI_CHAT)
		choice = json_pack("{s:i,s:{s:s,s:O},s:n,s:s}", "index", 0, "message", "role",
				   "assistant", "content", text, "logprobs", "finish_reason",
				   finish ? finish : "stop");
	else
		choice = json_pack("{s:s?,s:i,s:n,s:s}", "text", NULL, "index", 0, "logprobs",
				   "finish_reason", finish ? finish : "stop");
	if (choice && kind != OAI_CHAT)
		json_object_set(choice, "text", (json_t *)text);
	const json_t *plp = json_object_get(reply, "logprobs");
	if (choice && plp) {
		size_t off = 0;
		json_object_set_new(choice, "logprobs", oai_logprobs(kind, plp, &off));
	}
	json_decref(empty);
	return json_pack("{s:s,s:s,s:I,s:s,s:[o],s:o,s:s}", "id", cid, "object",
			 kind == OAI_CHAT ? "chat.completion" : "text_completion", "created",
			 (json_int_t)created, "model", model, "choices", choice, "usage",
			 oai_usage(json_object_get(reply, "usage")), "system_fingerprint",
			 "edgelm");
}

json_t *oai_chunk(enum oai_kind kind, const char *cid, const char *model, int64_t created,
		  const char *text, size_t len, bool role, const char *finish, json_t *usage)
{
	json_t *choices = json_array();
	if (!usage) {
		json_t *tx = json_stringn(text ? text : "", len);
		if (!tx) /* the core sends valid UTF-8; never lose the chunk */
			tx = json_string("\xef\xbf\xbd");
		json_t *c;
		if (kind == OAI_CHAT) {
			json_t *delta = json_object();
			if (role)
				json_object_set_new(delta, "role", json_string("assistant"));
			if (len || role)
				json_object_set_new(delta, "content", tx);
			else
				json_decref(tx);
			c = json_pack("{s:i,s:o,s:n,s:o}", "index", 0, "delta", delta, "logprobs",
				      "finish_reason", finish ? json_string(finish) : json_null());
		} else {
			c = json_pack("{s:o,s:i,s:n,s:o}", "text", tx, "index", 0, "logprobs",
				      "finish_reason", finish ? json_string(finish) : json_null());
		}
		json_array_append_new(choices, c);
	}
	json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:o}", "id", cid, "object",
			      kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
			      (json_int_t)created, "model", model, "system_fingerprint", "edgelm",
			      "choices", choices);
	if (o && usage)
		json_object_set_new(o, "usage", usage);
	return o;
}

/* ---- embeddings ---------------------------------------------------------------- */

int oai_embed_request(const json_t *body, char **ret_json, bool *ret_base64, struct oai_err *e)
{
	if (!json_is_object(body))
		return BAD(e, NULL, "the body must be a JSON object");
	const json_t *in = json_object_get(body, "input");
	if (is_null(in))
		return BAD(e, "input", "input: a string or an array of strings is required");
	/* token ids (an array of integers, or of arrays of them): the
	 * protocol takes text only, so say so rather than embed "[1, 2]" */
	const json_t *first = json_is_array(in) ? json_array_get(in, 0) : NULL;
	if (json_is_integer(first) || json_is_array(first))
		return BAD(e, "input", "input: token ids are not supported; send the text");
	const json_t *fmt = json_object_get(body, "encoding_format");
	*ret_base64 = false;
	if (!is_null(fmt)) {
		const char *f = json_string_value(fmt);
		if (!f || (strcmp(f, "float") != 0 && strcmp(f, "base64") != 0))
			return BAD(e, "encoding_format",
				   "encoding_format: \"float\" or \"base64\" is required");
		*ret_base64 = strcmp(f, "base64") == 0;
	}
	if (!is_null(json_object_get(body, "dimensions")))
		return BAD(e, "dimensions",
			   "dimensions: not supported; vectors have the model's embedding length");
	json_t *out = json_pack("{s:i,s:s,s:O}", "v", 1, "op", "embed", "input", in);
	if (!out)
		return BAD(e, NULL, "out of memory");
	/* edgelm's own options, checked by the protocol's parser */
	static const char *const extra[] = {"pooling", "truncate"};
	for (size_t i = 0; i < CM_ARRAY_LEN(extra); i++) {
		json_t *v = json_object_get(body, extra[i]);
		if (!is_null(v))
			json_object_set(out, extra[i], v);
	}
	int rc = (*ret_json = json_dumps(out, JSON_COMPACT)) ? 0 : BAD(e, NULL, "out of memory");
	json_decref(out);
	return rc;
}

/* OpenAI's base64: the float32 values' little-endian bytes. */
static json_t *floats_base64(const json_t *values)
{
	static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = json_array_size(values), nb = n * 4;
	unsigned char *b = cm_malloc(nb ? nb : 1);
	char *s = cm_malloc((nb + 2) / 3 * 4 + 1);
	json_t *r = NULL;
	if (b && s) {
		for (size_t i = 0; i < n; i++) {
			float f = (float)json_number_value(json_array_get(values, i));
			uint32_t u;
			memcpy(&u, &f, 4);
			for (int k = 0; k < 4; k++)
				b[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
		}
		size_t o = 0;
		for (size_t i = 0; i < nb; i += 3) {
			uint32_t v = (uint32_t)b[i] << 16;
			if (i + 1 < nb)
				v |= (uint32_t)b[i + 1] << 8;
			if (i + 2 < nb)
				v |= b[i + 2];
			s[o++] = tab[v >> 18 & 63];
			s[o++] = tab[v >> 12 & 63];
			s[o++] = i + 1 < nb ? tab[v >> 6 & 63] : '=';
			s[o++] = i + 2 < nb ? tab[v & 63] : '=';
		}
		s[o] = '\0';
		r = json_stringn(s, o);
	}
	cm_free(b);
	cm_free(s);
	return r;
}

json_t *oai_embed_response(const char *model, const json_t *reply, bool base64)
{
	const json_t *list = json_object_get(reply, "embeddings");
	json_t *data = json_array();
	for (size_t i = 0; data && i < json_array_size(list); i++) {
		json_t *v = json_object_get(json_array_get(list, i), "embedding");
		json_t *emb = base64 ? floats_base64(v) : json_incref(v);
		if (!emb || json_array_append_new(data, json_pack("{s:s,s:I,s:o}", "object",
								   "embedding", "index", (json_int_t)i,
								   "embedding", emb))) {
			json_decref(data);
			return NULL;
		}
	}
	json_int_t p = json_integer_value(json_object_get(json_object_get(reply, "usage"),
							  "prompt_tokens"));
	return json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model",
			 model, "usage", "prompt_tokens", p, "total_tokens", p);
}
