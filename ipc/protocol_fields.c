/* ipc/protocol_fields.c: every request field of the protocol, one table.
 *
 * A row gives a field's name, JSON type, the member of struct ipc_request
 * it fills, its range (a constant or a limit of struct ipc_limits), default,
 * IPC_SET_* bit, the ops that accept it, and one line of docs. The same rows
 * drive
 *   - the unknown-field check per op and the parsing, with its range checks
 *     and error messages (protocol_request.c),
 *   - ipc_request_init's defaults and ipc_request_encode, which leaves out
 *     a field at its default unless flagged set (protocol_request.c),
 *   - the per-op field tables of docs/protocol.md (protocol_doc.c, through
 *     `make docs`; tests/integration/protocol_doc.sh checks them).
 * Fields of a special shape (id, messages, stop, logit_bias, json_schema, ids) have small handlers
 * below, referenced from their rows; their name, ops and docs are rows too.
 *
 * To add a field: a member in struct ipc_request (ipc.h), a row here, and
 * `make docs`. tests/unit/test_ipc_protocol.c walks the table: every row
 * round-trips through the codec, is refused by the other ops, and has its
 * bounds tried. */
#include "ipc/protocol_impl.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <limits.h>
#include <stddef.h>
#include <string.h>

#define MAX_DEADLINE_MS 86400000LL

/* The member `m` of struct ipc_request (m may be sampling.x). */
#define MEMBER(m)                                                                                  \
	.off = offsetof(struct ipc_request, m), .size = sizeof(((struct ipc_request *)0)->m)
/* An integer member, its signedness taken from its type. */
#define INT_MEMBER(m) MEMBER(m), .is_unsigned = ((__typeof__(((struct ipc_request *)0)->m))-1 > 0)
#define TEXT_MEMBER(m, len) MEMBER(m), .len_off = offsetof(struct ipc_request, len)

/* ---- id ------------------------------------------------------------------- */

static bool id_valid(const char *s, size_t n)
{
	if (n == 0 || n > IPC_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		          (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.' ||
		          ch == ':';
		if (!ok)
			return false;
	}
	return true;
}

static int id_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *v, struct ipc_request *r)
{
	if (!json_is_string(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be a string",
		                f->name);
	if (!id_valid(json_string_value(v), json_string_length(v)))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be 1 to %d characters of [A-Za-z0-9._:-]", f->name,
		                IPC_ID_MAX);
	r->id = ipc_arena_strndup(c->arena, json_string_value(v), json_string_length(v));
	return r->id ? 0 : ipc_parse_oom(c);
}

static int id_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	if (!r->id)
		return 0; /* even where required: the parser says what is missing */
	*ret = ipc_jcstr(r->id);
	return *ret ? 0 : -ENOMEM;
}

static void id_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	snprintf(buf, cap, "1–%d characters of `[A-Za-z0-9._:-]`", IPC_ID_MAX);
}

static const struct ipc_field_kind kind_id = {"string", id_parse, id_encode, id_range_doc};

/* ---- messages ------------------------------------------------------------- */

static int message_parse(struct ipc_pctx *c, json_t *e, size_t i, size_t *total,
                         struct ipc_message *m)
{
	if (!json_is_object(e))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "messages[%zu] must be an object",
		                i);
	const char *key;
	size_t klen;
	json_t *val;
	json_object_keylen_foreach(e, key, klen, val)
	{
		if (!((klen == 4 && memcmp(key, "role", 4) == 0) ||
		      (klen == 7 && memcmp(key, "content", 7) == 0))) {
			char buf[48];
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "messages[%zu]: unknown field '%s'", i,
			                ipc_key_for_msg(key, klen, buf, sizeof(buf)));
		}
	}
	json_t *role = json_object_get(e, "role");
	if (!role || !json_is_string(role))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "messages[%zu].role must be a string", i);
	int ri = ipc_role_index(json_string_value(role), json_string_length(role));
	if (ri < 0)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "messages[%zu].role must be system, user or assistant", i);
	m->role = (enum ipc_role)ri;
	json_t *content = json_object_get(e, "content");
	if (!content || !json_is_string(content))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "messages[%zu].content must be a string", i);
	size_t len = json_string_length(content);
	const char *s = json_string_value(content);
	*total += ipc_json_text_bytes(s, len);
	if (*total > c->lim->max_prompt_bytes)
		return ipc_perr(c->err, IPC_ERR_PROMPT_TOO_LONG,
		                "messages hold more than %zu bytes as JSON (escapes count)",
		                c->lim->max_prompt_bytes);
	if (memchr(s, '\0', len))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "messages[%zu].content contains a NUL character", i);
	m->content = ipc_arena_strndup(c->arena, s, len);
	if (!m->content)
		return ipc_parse_oom(c);
	m->content_len = len;
	return 0;
}

static int messages_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *arr,
                          struct ipc_request *r)
{
	if (!json_is_array(arr))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be an array",
		                f->name);
	size_t n = json_array_size(arr);
	if (n == 0)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' is empty", f->name);
	if (n > c->lim->max_messages)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%zu messages, more than %zu", n,
		                c->lim->max_messages);
	struct ipc_message *m = ipc_arena_zalloc(c->arena, n, sizeof(*m));
	if (!m)
		return ipc_parse_oom(c);
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = message_parse(c, json_array_get(arr, i), i, &total, &m[i]);
		if (rc)
			return rc;
	}
	r->messages = m;
	r->n_messages = n;
	return 0;
}

static int messages_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	json_t *a = json_array();
	bool ok = a != NULL;
	for (size_t i = 0; ok && i < r->n_messages; i++) {
		json_t *m = json_object();
		if (!m) {
			ok = false;
			break;
		}
		ipc_jset(m, "role", ipc_jcstr(ipc_role_name(r->messages[i].role)), &ok);
		ipc_jset(m, "content", ipc_jstr(r->messages[i].content, r->messages[i].content_len),
		         &ok);
		if (json_array_append_new(a, m))
			ok = false;
	}
	if (!ok) {
		json_decref(a);
		return -ENOMEM;
	}
	*ret = a;
	return 0;
}

static void messages_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	char b[32];
	snprintf(buf, cap,
	         "1–%zu messages, contents ≤ %s together (as JSON, see [Limits](#limits))",
	         lim->max_messages, ipc_doc_bytes(lim->max_prompt_bytes, b, sizeof(b)));
}

static const struct ipc_field_kind kind_messages = {
    "array of `{\"role\": \"system\"|\"user\"|\"assistant\", \"content\": string}`", messages_parse,
    messages_encode, messages_range_doc};

/* ---- stop ----------------------------------------------------------------- */

static int stop_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *arr,
                      struct ipc_request *r)
{
	if (!json_is_array(arr))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be an array of strings", f->name);
	size_t n = json_array_size(arr);
	if (n > c->lim->max_stop)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%zu stop strings, more than %zu", n,
		                c->lim->max_stop);
	if (n == 0)
		return 0;
	const char **s = ipc_arena_zalloc(c->arena, n, sizeof(*s));
	size_t *l = ipc_arena_zalloc(c->arena, n, sizeof(*l));
	if (!s || !l)
		return ipc_parse_oom(c);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		if (!json_is_string(e))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "stop[%zu] must be a string",
			                i);
		size_t len = json_string_length(e);
		if (len == 0 || len > c->lim->max_stop_bytes)
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "stop[%zu] must be 1 to %zu bytes", i,
			                c->lim->max_stop_bytes);
		if (memchr(json_string_value(e), '\0', len))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "stop[%zu] contains a NUL character", i);
		s[i] = ipc_arena_strndup(c->arena, json_string_value(e), len);
		if (!s[i])
			return ipc_parse_oom(c);
		l[i] = len;
	}
	r->stop = s;
	r->stop_len = l;
	r->n_stop = n;
	return 0;
}

static int stop_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	if (!r->n_stop)
		return 0;
	json_t *a = json_array();
	bool ok = a != NULL;
	for (size_t i = 0; ok && i < r->n_stop; i++)
		if (json_array_append_new(
		        a, ipc_jstr(r->stop[i], r->stop_len ? r->stop_len[i] : strlen(r->stop[i]))))
			ok = false;
	if (!ok) {
		json_decref(a);
		return -ENOMEM;
	}
	*ret = a;
	return 0;
}

static void stop_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	snprintf(buf, cap, "≤ %zu strings of 1–%zu bytes", lim->max_stop, lim->max_stop_bytes);
}

static const struct ipc_field_kind kind_stop = {"array of strings", stop_parse, stop_encode,
                                                stop_range_doc};

/* ---- logit_bias ----------------------------------------------------------- */

/* OpenAI's shape: {"TOKEN_ID": bias, ...}, ids as decimal strings. */
static int bias_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *obj,
                      struct ipc_request *r)
{
	if (!json_is_object(obj))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be an object of token id to bias", f->name);
	size_t n = json_object_size(obj);
	if (n > IPC_MAX_LOGIT_BIAS)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%s: %zu tokens, more than %d",
		                f->name, n, IPC_MAX_LOGIT_BIAS);
	if (n == 0)
		return 0;
	int32_t *ids = ipc_arena_zalloc(c->arena, n, sizeof(*ids));
	float *bias = ipc_arena_zalloc(c->arena, n, sizeof(*bias));
	if (!ids || !bias)
		return ipc_parse_oom(c);
	const char *key;
	json_t *v;
	size_t i = 0;
	json_object_foreach (obj, key, v) {
		char *end;
		errno = 0;
		unsigned long long id = strtoull(key, &end, 10);
		if (key[0] < '0' || key[0] > '9' || *end || errno || id > INT32_MAX)
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "%s: key '%.32s' is not a token id (a decimal integer)",
			                f->name, key);
		if (!json_is_number(v))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%s[%llu] must be a number",
			                f->name, id);
		double b = json_number_value(v);
		if (!(b >= -100 && b <= 100))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "%s[%llu] is %g, not in [-100, 100]", f->name, id, b);
		ids[i] = (int32_t)id;
		bias[i] = (float)b;
		i++;
	}
	r->bias_ids = ids;
	r->bias = bias;
	r->n_bias = n;
	return 0;
}

static int bias_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	if (!r->n_bias)
		return 0;
	json_t *o = json_object();
	bool ok = o != NULL;
	for (size_t i = 0; ok && i < r->n_bias; i++) {
		char key[16];
		snprintf(key, sizeof(key), "%d", (int)r->bias_ids[i]);
		ok = json_object_set_new(o, key, json_real(r->bias[i])) == 0;
	}
	if (!ok) {
		json_decref(o);
		return -ENOMEM;
	}
	*ret = o;
	return 0;
}

static void bias_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	(void)lim;
	snprintf(buf, cap, "≤ %d tokens, biases in [-100, 100]", IPC_MAX_LOGIT_BIAS);
}

static const struct ipc_field_kind kind_bias = {"object of token id to number", bias_parse,
                                                bias_encode, bias_range_doc};

/* ---- json_schema ---------------------------------------------------------- */

/* Kept as compact JSON text: the daemon converts it to GBNF (ipc/json_schema.c)
 * off the transport's threads, and the limit counts what libedgelm sends. */
static int schema_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *v,
                        struct ipc_request *r)
{
	if (!json_is_object(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be an object",
		                f->name);
	if (r->grammar) /* its row comes first */
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "fields 'grammar' and '%s' exclude each other", f->name);
	char *t = json_dumps(v, JSON_COMPACT);
	if (!t)
		return ipc_parse_oom(c);
	size_t n = strlen(t);
	if (n > IPC_MAX_GRAMMAR_BYTES) {
		free(t);
		return ipc_perr(c->err, IPC_ERR_TOO_LARGE,
		                "field '%s' is %zu bytes as compact JSON, more than %zu", f->name, n,
		                IPC_MAX_GRAMMAR_BYTES);
	}
	r->json_schema = ipc_arena_strndup(c->arena, t, n);
	free(t);
	if (!r->json_schema)
		return ipc_parse_oom(c);
	r->json_schema_len = n;
	return 0;
}

static int schema_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	if (!r->json_schema)
		return 0;
	json_t *v = json_loadb(r->json_schema, r->json_schema_len, JSON_REJECT_DUPLICATES, NULL);
	if (!json_is_object(v)) {
		json_decref(v);
		return -EINVAL; /* libedgelm checks the text before it gets here */
	}
	*ret = v;
	return 0;
}

static void schema_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	char b[32];
	(void)lim;
	snprintf(buf, cap, "≤ %s as compact JSON; not with `grammar`",
	         ipc_doc_bytes(IPC_MAX_GRAMMAR_BYTES, b, sizeof(b)));
}

static const struct ipc_field_kind kind_schema = {"object (a JSON Schema)", schema_parse,
                                                  schema_encode, schema_range_doc};

/* ---- ids ------------------------------------------------------------------ */

static int ids_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *arr,
                     struct ipc_request *r)
{
	if (!json_is_array(arr))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be an array of integers", f->name);
	size_t n = json_array_size(arr);
	if (n > c->lim->max_ids)
		return ipc_perr(c->err, IPC_ERR_TOO_LARGE, "%zu ids, more than %zu", n,
		                c->lim->max_ids);
	int32_t *ids = ipc_arena_zalloc(c->arena, n ? n : 1, sizeof(*ids));
	if (!ids)
		return ipc_parse_oom(c);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) > INT32_MAX)
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "ids[%zu] must be an integer in [0, %d]", i, INT32_MAX);
		ids[i] = (int32_t)json_integer_value(e);
	}
	r->ids = ids;
	r->n_ids = n;
	return 0;
}

static int ids_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	json_t *a = json_array();
	bool ok = a != NULL;
	for (size_t i = 0; ok && i < r->n_ids; i++)
		if (json_array_append_new(a, json_integer(r->ids[i])))
			ok = false;
	if (!ok) {
		json_decref(a);
		return -ENOMEM;
	}
	*ret = a;
	return 0;
}

static void ids_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	snprintf(buf, cap, "≤ %zu ids, each 0 .. 2^31-1", lim->max_ids);
}

static const struct ipc_field_kind kind_ids = {"array of integers", ids_parse, ids_encode,
                                               ids_range_doc};

/* ---- input (embed) ---------------------------------------------------------- */

/* OpenAI's shape: a string or an array of strings. The texts count against
 * max_prompt_bytes together and against max_messages in number (one limit
 * for "texts in one request"); an empty text has nothing to embed. */
static int input_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *v,
                       struct ipc_request *r)
{
	bool one = json_is_string(v);
	if (!one && !json_is_array(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be a string or an array of strings", f->name);
	size_t n = one ? 1 : json_array_size(v);
	if (n == 0)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' is empty", f->name);
	if (n > c->lim->max_messages)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%s: %zu texts, more than %zu",
		                f->name, n, c->lim->max_messages);
	const char **t = ipc_arena_zalloc(c->arena, n, sizeof(*t));
	size_t *l = ipc_arena_zalloc(c->arena, n, sizeof(*l));
	if (!t || !l)
		return ipc_parse_oom(c);
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *e = one ? v : json_array_get(v, i);
		if (!json_is_string(e))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "%s[%zu] must be a string",
			                f->name, i);
		size_t len = json_string_length(e);
		const char *str = json_string_value(e);
		if (len == 0)
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                one ? "%s: an empty string" : "%s[%zu] is an empty string",
			                f->name, i);
		total += ipc_json_text_bytes(str, len);
		if (total > c->lim->max_prompt_bytes)
			return ipc_perr(c->err, IPC_ERR_PROMPT_TOO_LONG,
			                "%s holds more than %zu bytes as JSON (escapes count)",
			                f->name, c->lim->max_prompt_bytes);
		if (memchr(str, '\0', len))
			return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
			                "%s[%zu] contains a NUL character", f->name, i);
		t[i] = ipc_arena_strndup(c->arena, str, len);
		if (!t[i])
			return ipc_parse_oom(c);
		l[i] = len;
	}
	r->inputs = t;
	r->input_lens = l;
	r->n_inputs = n;
	return 0;
}

/* Always a list: the reply is one either way. */
static int input_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	json_t *a = json_array();
	bool ok = a != NULL;
	for (size_t i = 0; ok && i < r->n_inputs; i++)
		if (json_array_append_new(a, ipc_jstr(r->inputs[i], r->input_lens
		                                                        ? r->input_lens[i]
		                                                        : strlen(r->inputs[i]))))
			ok = false;
	if (!ok) {
		json_decref(a);
		return -ENOMEM;
	}
	*ret = a;
	return 0;
}

static void input_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	char b[32];
	snprintf(buf, cap, "1–%zu non-empty texts, ≤ %s together (as JSON)", lim->max_messages,
	         ipc_doc_bytes(lim->max_prompt_bytes, b, sizeof(b)));
}

static const struct ipc_field_kind kind_input = {"string or array of strings", input_parse,
                                                 input_encode, input_range_doc};

static int pooling_parse(struct ipc_pctx *c, const struct ipc_field *f, json_t *v,
                         struct ipc_request *r)
{
	int i = json_is_string(v) ? ipc_pooling_index(json_string_value(v), json_string_length(v))
	                          : -1;
	if (i <= IPC_POOL_DEFAULT) /* "default" is the field left out */
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' must be \"mean\", \"cls\" or \"last\"", f->name);
	r->pooling = i;
	return 0;
}

static int pooling_encode(const struct ipc_field *f, const struct ipc_request *r, json_t **ret)
{
	(void)f;
	if (r->pooling == IPC_POOL_DEFAULT)
		return 0;
	const char *name = ipc_pooling_name((enum ipc_pooling)r->pooling);
	if (!name)
		return -EINVAL;
	*ret = ipc_jcstr(name);
	return *ret ? 0 : -ENOMEM;
}

static void pooling_range_doc(const struct ipc_limits *lim, char *buf, size_t cap)
{
	(void)lim;
	snprintf(buf, cap, "`mean`, `cls`, `last`");
}

static const struct ipc_field_kind kind_pooling = {"string", pooling_parse, pooling_encode,
                                                   pooling_range_doc};

/* ---- the table ------------------------------------------------------------ */

#define GENERATE IPC_OPBIT(IPC_OP_GENERATE)
#define CHAT IPC_OPBIT(IPC_OP_CHAT)
#define POLL IPC_OPBIT(IPC_OP_POLL)
#define CANCEL IPC_OPBIT(IPC_OP_CANCEL)
#define TOKENIZE IPC_OPBIT(IPC_OP_TOKENIZE)
#define DETOKENIZE IPC_OPBIT(IPC_OP_DETOKENIZE)
#define EMBED IPC_OPBIT(IPC_OP_EMBED)

/* clang-format off */
const struct ipc_field ipc_fields[] = {
	{ "v", IPC_FT_ENVELOPE, IPC_OPS_ALL, 0,
	  .doc = "protocol version; optional, must be 1 if present" },
	{ "op", IPC_FT_ENVELOPE, IPC_OPS_ALL, IPC_F_REQUIRED,
	  .doc = "the op" },

	{ "id", IPC_FT_CUSTOM, IPC_OPS_GEN, 0, .kind = &kind_id,
	  .def_doc = "assigned by the daemon (`r-` + 32 hex digits)",
	  .doc = "a name for `poll`/`cancel`, unique among the caller's live generations" },
	{ "id", IPC_FT_CUSTOM, POLL, IPC_F_REQUIRED, .kind = &kind_id,
	  .doc = "the stream" },
	{ "id", IPC_FT_CUSTOM, CANCEL, IPC_F_REQUIRED, .kind = &kind_id,
	  .doc = "the generation, streaming or not" },
	{ "prompt", IPC_FT_TEXT, GENERATE, IPC_F_REQUIRED, TEXT_MEMBER(prompt, prompt_len),
	  .limit = IPC_FLIM_MAX_PROMPT_BYTES, .too_long = IPC_ERR_PROMPT_TOO_LONG,
	  .doc = "may be empty" },
	{ "messages", IPC_FT_CUSTOM, CHAT, IPC_F_REQUIRED, .kind = &kind_messages,
	  .doc = "the conversation; a message has no other keys" },

	{ "max_tokens", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(sampling.max_tokens),
	  .min = 1, .limit = IPC_FLIM_MAX_TOKENS, .def = 256, .set_bit = IPC_SET_MAX_TOKENS,
	  .def_doc = "(`max_tokens_default`)",
	  .doc = "above the daemon's `max_tokens_limit` (8192) it is refused with `invalid_field`, "
	         "not cut; a generation also ends at the context" },
	{ "temperature", IPC_FT_NUM, IPC_OPS_GEN, 0, MEMBER(sampling.temperature),
	  .fmin = 0, .fmax = 100, .def = 0.8, .set_bit = IPC_SET_TEMPERATURE,
	  .doc = "0 is greedy" },
	{ "top_k", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(sampling.top_k),
	  .min = 0, .max = 1 << 20, .def = 40, .set_bit = IPC_SET_TOP_K,
	  .doc = "0 is off" },
	{ "top_p", IPC_FT_NUM, IPC_OPS_GEN, 0, MEMBER(sampling.top_p),
	  .fmin = 0, .fmax = 1, .def = 0.95, .set_bit = IPC_SET_TOP_P,
	  .doc = "1 is off" },
	{ "min_p", IPC_FT_NUM, IPC_OPS_GEN, 0, MEMBER(sampling.min_p),
	  .fmin = 0, .fmax = 1, .def = 0.05, .set_bit = IPC_SET_MIN_P,
	  .doc = "0 is off" },
	{ "repeat_penalty", IPC_FT_NUM, IPC_OPS_GEN, IPC_F_MIN_OPEN, MEMBER(sampling.repeat_penalty),
	  .fmin = 0, .fmax = 10, .def = 1.0, .set_bit = IPC_SET_REPEAT_PENALTY,
	  .doc = "1 is off" },
	{ "frequency_penalty", IPC_FT_NUM, IPC_OPS_GEN, 0, MEMBER(sampling.frequency_penalty),
	  .fmin = -2, .fmax = 2, .def = 0, .set_bit = IPC_SET_FREQUENCY_PENALTY,
	  .doc = "0 is off" },
	{ "presence_penalty", IPC_FT_NUM, IPC_OPS_GEN, 0, MEMBER(sampling.presence_penalty),
	  .fmin = -2, .fmax = 2, .def = 0, .set_bit = IPC_SET_PRESENCE_PENALTY,
	  .doc = "0 is off" },
	{ "penalty_last_n", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(sampling.penalty_last_n),
	  .min = -1, .max = 1 << 20, .def = 64, .set_bit = IPC_SET_PENALTY_LAST_N,
	  .doc = "tokens the penalties look back over; -1 is the whole context, 0 is off" },
	{ "seed", IPC_FT_INT, IPC_OPS_GEN, IPC_F_SET_ONLY, INT_MEMBER(sampling.seed),
	  .min = 0, .max = LLONG_MAX, .def = 0, .set_bit = IPC_SET_SEED,
	  .def_doc = "random", .doc = "seeds the sampler's random numbers" },
	{ "stop", IPC_FT_CUSTOM, IPC_OPS_GEN, 0, .kind = &kind_stop,
	  .def_doc = "none", .doc = "generation stops before the first match, which is not returned" },
	{ "logit_bias", IPC_FT_CUSTOM, IPC_OPS_GEN, 0, .kind = &kind_bias,
	  .def_doc = "none", .doc = "added to the token's logit before sampling (OpenAI's `logit_bias`); -100 bans the token; an id outside the vocabulary is `invalid_field`" },
	{ "grammar", IPC_FT_TEXT, IPC_OPS_GEN, 0, TEXT_MEMBER(grammar, grammar_len),
	  .max = IPC_MAX_GRAMMAR_BYTES, .too_long = IPC_ERR_TOO_LARGE, .def_doc = "none",
	  .doc = "a GBNF grammar (llama.cpp's format, start symbol `root`) the generated text must match; generation ends with `stop` once it is complete; see [Structured output](#structured-output)" },
	{ "json_schema", IPC_FT_CUSTOM, IPC_OPS_GEN, 0, .kind = &kind_schema,
	  .def_doc = "none",
	  .doc = "the generated text is a JSON value valid under this schema (the subset in docs/grammar.md); see [Structured output](#structured-output)" },
	{ "stream", IPC_FT_BOOL, IPC_OPS_GEN, 0, MEMBER(stream),
	  .def = 0, .doc = "see [Streaming](#streaming)" },
	{ "logprobs", IPC_FT_BOOL, IPC_OPS_GEN, 0, MEMBER(logprobs),
	  .def = 0, .doc = "the reply (and each poll) carries `logprobs`: every generated token's log-probability under the model (a log softmax of the raw logits, before sampling)" },
	{ "top_logprobs", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(top_logprobs),
	  .min = 0, .max = IPC_MAX_TOP_LOGPROBS, .def = 0,
	  .doc = "with `logprobs`, this many most likely tokens at each step, best first" },
	{ "deadline_ms", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(deadline_ms),
	  .min = 0, .max = MAX_DEADLINE_MS, .def = 0,
	  .def_doc = "(none)", .doc = "counted from arrival" },
	{ "priority", IPC_FT_INT, IPC_OPS_GEN, 0, INT_MEMBER(priority),
	  .min = -10, .max = 10, .def = 0, .doc = "higher is admitted first" },

	{ "ack", IPC_FT_INT, POLL, IPC_F_ALWAYS, INT_MEMBER(ack),
	  .min = 0, .max = LLONG_MAX, .def = 0,
	  .doc = "bytes of *T* the client holds: the `next` of the last reply it received" },
	{ "wait_ms", IPC_FT_INT, POLL, IPC_F_ALWAYS, INT_MEMBER(wait_ms),
	  .min = 0, .limit = IPC_FLIM_MAX_WAIT_MS, .def = 1000,
	  .doc = "how long the daemon may hold the poll while there is nothing new" },

	{ "text", IPC_FT_TEXT, TOKENIZE, IPC_F_REQUIRED, TEXT_MEMBER(text, text_len),
	  .limit = IPC_FLIM_MAX_PROMPT_BYTES, .too_long = IPC_ERR_TOO_LARGE,
	  .doc = "the text to tokenize" },
	{ "add_special", IPC_FT_BOOL, TOKENIZE, 0, MEMBER(add_special),
	  .def = 1, .doc = "add the BOS/EOS tokens the model's metadata asks for" },
	{ "parse_special", IPC_FT_BOOL, TOKENIZE, 0, MEMBER(parse_special),
	  .def = 0, .doc = "when true, special-token text such as `<s>` becomes its id" },

	{ "ids", IPC_FT_CUSTOM, DETOKENIZE, IPC_F_REQUIRED, .kind = &kind_ids,
	  .doc = "the tokens to turn into text" },
	{ "special", IPC_FT_BOOL, DETOKENIZE, 0, MEMBER(special),
	  .def = 0, .doc = "when true, control tokens (`<s>`, `<|im_end|>`, ...) are rendered as their text instead of left out" },

	{ "input", IPC_FT_CUSTOM, EMBED, IPC_F_REQUIRED, .kind = &kind_input,
	  .doc = "the texts to embed, each tokenized with the model's BOS/EOS" },
	{ "pooling", IPC_FT_CUSTOM, EMBED, 0, .kind = &kind_pooling,
	  .def_doc = "the model's `pooling_type`, else `mean`",
	  .doc = "how the tokens' final hidden states become one vector: their mean, the first token's (`cls`) or the last one's" },
	{ "truncate", IPC_FT_BOOL, EMBED, 0, MEMBER(truncate),
	  .def = 0, .doc = "when true, an input longer than the context is cut to its first tokens; when false it is refused with `prompt_too_long`" },
};
/* clang-format on */

const size_t ipc_n_fields = CM_ARRAY_LEN(ipc_fields);

/* ---- members by the table ------------------------------------------------- */

long long ipc_field_max(const struct ipc_field *f, const struct ipc_limits *lim)
{
	switch (f->limit) {
	case IPC_FLIM_MAX_TOKENS:
		return lim->max_tokens;
	case IPC_FLIM_MAX_WAIT_MS:
		return lim->max_wait_ms;
	case IPC_FLIM_MAX_PROMPT_BYTES:
		return lim->max_prompt_bytes > LLONG_MAX ? LLONG_MAX
		                                         : (long long)lim->max_prompt_bytes;
	case IPC_FLIM_NONE:
		break;
	}
	return f->max;
}

size_t ipc_field_text_max(const struct ipc_field *f, const struct ipc_limits *lim)
{
	return f->limit == IPC_FLIM_MAX_PROMPT_BYTES ? lim->max_prompt_bytes : (size_t)f->max;
}

unsigned long long ipc_field_get_uint(const struct ipc_field *f, const struct ipc_request *r)
{
	const char *p = (const char *)r + f->off;
	assert(f->type == IPC_FT_INT && (f->size == 4 || f->size == 8));
	if (f->size == 4) {
		if (f->is_unsigned) {
			uint32_t v;
			memcpy(&v, p, sizeof(v));
			return v;
		}
		int32_t v;
		memcpy(&v, p, sizeof(v));
		return (unsigned long long)(long long)v;
	}
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

long long ipc_field_get_int(const struct ipc_field *f, const struct ipc_request *r)
{
	return (long long)ipc_field_get_uint(f, r);
}

void ipc_field_set_int(const struct ipc_field *f, struct ipc_request *r, long long x)
{
	char *p = (char *)r + f->off;
	assert(f->type == IPC_FT_INT && (f->size == 4 || f->size == 8));
	if (f->size == 4) {
		int32_t v = (int32_t)(uint32_t)x; /* in range: the bits of the member */
		memcpy(p, &v, sizeof(v));
	} else {
		int64_t v = x;
		memcpy(p, &v, sizeof(v));
	}
}

float ipc_field_get_num(const struct ipc_field *f, const struct ipc_request *r)
{
	float v;
	assert(f->type == IPC_FT_NUM && f->size == sizeof(v));
	memcpy(&v, (const char *)r + f->off, sizeof(v));
	return v;
}

void ipc_field_set_num(const struct ipc_field *f, struct ipc_request *r, float x)
{
	assert(f->type == IPC_FT_NUM && f->size == sizeof(x));
	memcpy((char *)r + f->off, &x, sizeof(x));
}

bool ipc_field_get_bool(const struct ipc_field *f, const struct ipc_request *r)
{
	bool v;
	assert(f->type == IPC_FT_BOOL && f->size == sizeof(v));
	memcpy(&v, (const char *)r + f->off, sizeof(v));
	return v;
}

void ipc_field_set_bool(const struct ipc_field *f, struct ipc_request *r, bool x)
{
	assert(f->type == IPC_FT_BOOL && f->size == sizeof(x));
	memcpy((char *)r + f->off, &x, sizeof(x));
}

const char *ipc_doc_bytes(size_t n, char *buf, size_t cap)
{
	if (n >= ((size_t)1 << 20) && n % ((size_t)1 << 20) == 0)
		snprintf(buf, cap, "%zu MiB", n >> 20);
	else if (n >= 1024 && n % 1024 == 0)
		snprintf(buf, cap, "%zu KiB", n >> 10);
	else
		snprintf(buf, cap, "%zu bytes", n);
	return buf;
}
