/* ipc/protocol.c: the JSON codec of the daemon's protocol (docs/protocol.md).
 *
 * Requests are parsed in three steps, cheapest first: the size against
 * max_msg_bytes, a linear scan that bounds nesting depth and the number of
 * JSON values (so jansson, which recurses per level, never sees deep input),
 * then json_loadb with duplicate keys rejected. Every field is then checked
 * for type and range against one table of field names per op; unknown fields
 * are rejected so that a typo never silently falls back to a default.
 *
 * Everything a parsed request or decoded reply points to lives in one arena,
 * freed at once by ipc_request_free / ipc_reply_free. */
#include "ipc/ipc.h"

#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- error codes: the one table ------------------------------------------ */

static const struct errcode_info {
	const char *name;
	int neg_errno;
	const char *describe;
} errcodes[IPC_ERR_COUNT] = {
    [IPC_ERR_NONE] = {"ok", 0, "success"},
    [IPC_ERR_INVALID_JSON] = {"invalid_json", -EBADMSG, "the message is not a valid JSON object"},
    [IPC_ERR_UNSUPPORTED_VERSION] = {"unsupported_version", -EPROTONOSUPPORT,
                                     "unsupported protocol version"},
    [IPC_ERR_UNKNOWN_OP] = {"unknown_op", -ENOSYS, "unknown op"},
    [IPC_ERR_INVALID_FIELD] = {"invalid_field", -EINVAL,
                               "a field is missing, of the wrong type or out of range"},
    [IPC_ERR_TOO_LARGE] = {"too_large", -EMSGSIZE, "the request is too large"},
    [IPC_ERR_PROMPT_TOO_LONG] = {"prompt_too_long", -E2BIG,
                                 "the prompt is longer than the context allows"},
    [IPC_ERR_QUEUE_FULL] = {"queue_full", -EAGAIN, "the queue is full, retry later"},
    [IPC_ERR_DEADLINE_EXCEEDED] = {"deadline_exceeded", -ETIMEDOUT,
                                   "the deadline passed before the request finished"},
    [IPC_ERR_SHUTTING_DOWN] = {"shutting_down", -ESHUTDOWN, "the daemon is shutting down"},
    [IPC_ERR_NOT_FOUND] = {"not_found", -ENOENT, "no such request or stream"},
    [IPC_ERR_NOT_READY] = {"not_ready", -EBUSY,
                           "the daemon is not ready (model loading), retry later"},
    [IPC_ERR_UNSUPPORTED] = {"unsupported", -EOPNOTSUPP, "not supported by this daemon or model"},
    [IPC_ERR_INTERNAL] = {"internal", -EIO, "internal error"},
};

const char *ipc_errcode_name(enum ipc_errcode code)
{
	if ((unsigned)code >= IPC_ERR_COUNT)
		return errcodes[IPC_ERR_INTERNAL].name;
	return errcodes[code].name;
}

const char *ipc_errcode_describe(enum ipc_errcode code)
{
	if ((unsigned)code >= IPC_ERR_COUNT)
		return errcodes[IPC_ERR_INTERNAL].describe;
	return errcodes[code].describe;
}

enum ipc_errcode ipc_errcode_from_name(const char *name)
{
	if (!name)
		return IPC_ERR_NONE;
	for (int i = 1; i < IPC_ERR_COUNT; i++)
		if (strcmp(errcodes[i].name, name) == 0)
			return (enum ipc_errcode)i;
	return IPC_ERR_NONE;
}

int ipc_errcode_to_errno(enum ipc_errcode code)
{
	if ((unsigned)code >= IPC_ERR_COUNT)
		return -EIO;
	return errcodes[code].neg_errno;
}

enum ipc_errcode ipc_errcode_from_errno(int neg_errno)
{
	if (neg_errno == 0)
		return IPC_ERR_NONE;
	for (int i = 1; i < IPC_ERR_COUNT; i++)
		if (errcodes[i].neg_errno == neg_errno)
			return (enum ipc_errcode)i;
	return IPC_ERR_INTERNAL;
}

static int perr(struct cm_err *err, enum ipc_errcode code, const char *fmt, ...) CM_PRINTF(3, 4);
static int perr(struct cm_err *err, enum ipc_errcode code, const char *fmt, ...)
{
	int rc = ipc_errcode_to_errno(code);
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->code = rc;
	}
	return rc;
}

/* ---- names ---------------------------------------------------------------- */

static const char *const op_names[IPC_OP_COUNT] = {
    [IPC_OP_GENERATE] = "generate", [IPC_OP_CHAT] = "chat",
    [IPC_OP_POLL] = "poll",         [IPC_OP_CANCEL] = "cancel",
    [IPC_OP_TOKENIZE] = "tokenize", [IPC_OP_DETOKENIZE] = "detokenize",
    [IPC_OP_INFO] = "info",         [IPC_OP_HEALTH] = "health",
    [IPC_OP_METRICS] = "metrics",
};

const char *ipc_op_name(enum ipc_op op)
{
	if ((unsigned)op >= IPC_OP_COUNT)
		return NULL;
	return op_names[op];
}

static const char *const role_names[IPC_ROLE_COUNT] = {"system", "user", "assistant"};

const char *ipc_role_name(enum ipc_role role)
{
	return (unsigned)role < IPC_ROLE_COUNT ? role_names[role] : NULL;
}

static const char *const finish_names[IPC_FINISH_COUNT] = {
    [IPC_FINISH_NONE] = NULL,           [IPC_FINISH_STOP] = "stop",
    [IPC_FINISH_LENGTH] = "length",     [IPC_FINISH_CANCELLED] = "cancelled",
    [IPC_FINISH_DEADLINE] = "deadline",
};

const char *ipc_finish_name(enum ipc_finish f)
{
	return (unsigned)f < IPC_FINISH_COUNT ? finish_names[f] : NULL;
}

static const char *const health_names[IPC_HEALTH_COUNT] = {"loading", "ready", "draining"};

const char *ipc_health_name(enum ipc_health_status s)
{
	return (unsigned)s < IPC_HEALTH_COUNT ? health_names[s] : NULL;
}

/* Index of `s` (length n) in a table of names, or -1. */
static int name_index(const char *const *names, int count, const char *s, size_t n)
{
	for (int i = 0; i < count; i++)
		if (names[i] && strlen(names[i]) == n && memcmp(names[i], s, n) == 0)
			return i;
	return -1;
}

/* ---- limits --------------------------------------------------------------- */

void ipc_limits_fill(struct ipc_limits *lim)
{
	if (!lim->max_depth)
		lim->max_depth = 32;
	if (!lim->max_values)
		lim->max_values = 1u << 18;
	if (!lim->max_prompt_bytes)
		lim->max_prompt_bytes = IPC_DEFAULT_MAX_PROMPT_BYTES;
	if (!lim->max_messages)
		lim->max_messages = IPC_DEFAULT_MAX_MESSAGES;
	if (!lim->max_stop)
		lim->max_stop = IPC_DEFAULT_MAX_STOP;
	if (!lim->max_stop_bytes)
		lim->max_stop_bytes = IPC_DEFAULT_MAX_STOP_BYTES;
	if (!lim->max_ids)
		lim->max_ids = IPC_DEFAULT_MAX_IDS;
	if (lim->max_tokens <= 0)
		lim->max_tokens = 1 << 20;
	if (!lim->max_wait_ms)
		lim->max_wait_ms = 60000;
	if (!lim->max_msg_bytes) {
		const size_t big = (size_t)1 << 24; /* keeps IPC_MSG_BYTES from overflowing */
		if (lim->max_prompt_bytes > SIZE_MAX / 2 || lim->max_messages > big ||
		    lim->max_stop > big || lim->max_stop_bytes > big || lim->max_ids > big)
			lim->max_msg_bytes = SIZE_MAX;
		else
			lim->max_msg_bytes =
			    IPC_MSG_BYTES(lim->max_prompt_bytes, lim->max_messages, lim->max_stop,
			                  lim->max_stop_bytes, lim->max_ids);
	}
}

/* Bytes of a text inside a JSON string written with the fewest escapes
 * (jansson's, so libedgelm's): what the text limits count (ipc.h). */
static size_t json_text_bytes(const char *s, size_t n)
{
	size_t extra = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\' || ch == '\b' || ch == '\f' || ch == '\n' ||
		    ch == '\r' || ch == '\t')
			extra += 1;
		else if (ch < 0x20)
			extra += IPC_JSON_ESCAPE_MAX - 1;
	}
	return n + extra;
}

/* ---- arena ---------------------------------------------------------------- */

struct arena_block {
	struct arena_block *next;
	size_t used, cap;
	_Alignas(16) unsigned char data[];
};

struct ipc_arena {
	struct arena_block *head;
};

static void *arena_alloc(struct ipc_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (!n)
		n = 16;
	struct arena_block *b = a->head;
	if (!b || b->cap - b->used < n) {
		size_t cap = CM_MAX(n, (size_t)4096 - sizeof(*b));
		b = cm_malloc(sizeof(*b) + cap);
		if (!b)
			return NULL;
		b->cap = cap;
		b->used = 0;
		b->next = a->head;
		a->head = b;
	}
	void *p = b->data + b->used;
	b->used += n;
	return p;
}

static void *arena_zalloc(struct ipc_arena *a, size_t count, size_t size)
{
	size_t n;
	if (__builtin_mul_overflow(count, size, &n))
		return NULL;
	void *p = arena_alloc(a, n);
	if (p)
		memset(p, 0, n);
	return p;
}

static char *arena_strndup(struct ipc_arena *a, const char *s, size_t n)
{
	if (n == SIZE_MAX)
		return NULL;
	char *d = arena_alloc(a, n + 1);
	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

static void arena_free(struct ipc_arena *a)
{
	if (!a)
		return;
	struct arena_block *b = a->head;
	while (b) {
		struct arena_block *next = b->next;
		cm_free(b);
		b = next;
	}
	cm_free(a);
}

/* ---- the cheap scan ------------------------------------------------------- */

/* Bound nesting and the number of values (keys, strings, containers and
 * comma-separated items) in one pass, without recursion. The scan only has to
 * be right for valid JSON; jansson rejects whatever else it lets through. */
static int json_prescan(const char *s, size_t n, const struct ipc_limits *lim, struct cm_err *err)
{
	unsigned depth = 0;
	size_t values = 0;
	bool in_str = false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"')
				in_str = false;
			continue;
		}
		switch (c) {
		case '"':
			in_str = true;
			values++;
			break;
		case '[':
		case '{':
			if (++depth > lim->max_depth)
				return perr(err, IPC_ERR_INVALID_JSON,
				            "JSON nested deeper than %u levels at byte %zu",
				            lim->max_depth, i);
			values++;
			break;
		case ']':
		case '}':
			if (depth)
				depth--;
			break;
		case ',':
			values++;
			break;
		default:
			break;
		}
	}
	if (values > lim->max_values)
		return perr(err, IPC_ERR_TOO_LARGE, "more than %zu JSON values in one message",
		            lim->max_values);
	return 0;
}

/* ---- field table ---------------------------------------------------------- */

#define OPBIT(op) (1u << (op))
#define OPS_GEN (OPBIT(IPC_OP_GENERATE) | OPBIT(IPC_OP_CHAT))
#define OPS_ALL 0xffffffffu

static const struct field_info {
	const char *name;
	uint32_t ops;
} fields[] = {
    {"v", OPS_ALL},
    {"op", OPS_ALL},
    {"id", OPS_GEN | OPBIT(IPC_OP_POLL) | OPBIT(IPC_OP_CANCEL)},
    {"prompt", OPBIT(IPC_OP_GENERATE)},
    {"messages", OPBIT(IPC_OP_CHAT)},
    {"max_tokens", OPS_GEN},
    {"temperature", OPS_GEN},
    {"top_k", OPS_GEN},
    {"top_p", OPS_GEN},
    {"min_p", OPS_GEN},
    {"repeat_penalty", OPS_GEN},
    {"frequency_penalty", OPS_GEN},
    {"presence_penalty", OPS_GEN},
    {"penalty_last_n", OPS_GEN},
    {"seed", OPS_GEN},
    {"stop", OPS_GEN},
    {"stream", OPS_GEN},
    {"deadline_ms", OPS_GEN},
    {"priority", OPS_GEN},
    {"ack", OPBIT(IPC_OP_POLL)},
    {"wait_ms", OPBIT(IPC_OP_POLL)},
    {"text", OPBIT(IPC_OP_TOKENIZE)},
    {"add_special", OPBIT(IPC_OP_TOKENIZE)},
    {"parse_special", OPBIT(IPC_OP_TOKENIZE)},
    {"ids", OPBIT(IPC_OP_DETOKENIZE)},
};

#define MAX_DEADLINE_MS 86400000LL
#define DEFAULT_WAIT_MS 1000

/* Print a key for a message: printable ASCII, shortened. */
static const char *key_for_msg(const char *key, size_t len, char *buf, size_t cap)
{
	size_t j = 0;
	for (size_t i = 0; i < len && j + 4 < cap; i++) {
		unsigned char c = (unsigned char)key[i];
		buf[j++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
	}
	if (len > 0 && j + 4 >= cap) {
		memcpy(buf + j, "...", 3);
		j += 3;
	}
	buf[j] = '\0';
	return buf;
}

static int check_fields(json_t *obj, enum ipc_op op, struct cm_err *err)
{
	const char *key;
	size_t klen;
	json_t *val;
	json_object_keylen_foreach(obj, key, klen, val)
	{
		bool ok = false;
		for (size_t i = 0; i < CM_ARRAY_LEN(fields); i++) {
			if (strlen(fields[i].name) == klen &&
			    memcmp(fields[i].name, key, klen) == 0) {
				ok = (fields[i].ops & OPBIT(op)) != 0;
				break;
			}
		}
		if (!ok) {
			char buf[48];
			return perr(err, IPC_ERR_INVALID_FIELD, "unknown field '%s' for op '%s'",
			            key_for_msg(key, klen, buf, sizeof(buf)), ipc_op_name(op));
		}
	}
	return 0;
}

/* ---- typed getters -------------------------------------------------------- */

struct pctx {
	struct ipc_arena *arena;
	const struct ipc_limits *lim;
	struct cm_err *err;
};

static int oom(struct pctx *c)
{
	return perr(c->err, IPC_ERR_INTERNAL, "out of memory while parsing the request");
}

/* A text field copied into the arena. Absent: *ret stays as it is and, if
 * `required`, the field is reported missing. max_len counts the text as JSON
 * (json_text_bytes). Texts may not contain NUL. */
static int get_text(struct pctx *c, json_t *obj, const char *name, bool required, size_t max_len,
                    enum ipc_errcode too_long, const char **ret, size_t *ret_len)
{
	json_t *v = json_object_get(obj, name);
	if (!v) {
		if (required)
			return perr(c->err, IPC_ERR_INVALID_FIELD, "missing field '%s'", name);
		return 0;
	}
	if (!json_is_string(v))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be a string", name);
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);
	size_t nj = json_text_bytes(s, n);
	if (nj > max_len) {
		if (nj == n)
			return perr(c->err, too_long, "field '%s' is %zu bytes, more than %zu",
			            name, n, max_len);
		return perr(c->err, too_long,
		            "field '%s' is %zu bytes as JSON (escapes count), more than %zu", name,
		            nj, max_len);
	}
	if (memchr(s, '\0', n))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' contains a NUL character",
		            name);
	char *d = arena_strndup(c->arena, s, n);
	if (!d)
		return oom(c);
	*ret = d;
	if (ret_len)
		*ret_len = n;
	return 0;
}

static int get_int(struct pctx *c, json_t *obj, const char *name, long long min, long long max,
                   long long *ret, bool *ret_present)
{
	json_t *v = json_object_get(obj, name);
	if (ret_present)
		*ret_present = v != NULL;
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be an integer", name);
	long long x = json_integer_value(v);
	if (x < min || x > max)
		return perr(c->err, IPC_ERR_INVALID_FIELD,
		            "field '%s' is %lld, not in [%lld, %lld]", name, x, min, max);
	*ret = x;
	return 0;
}

/* A number (integer or real) stored as a float, in [min, max], or (min, max]
 * with min_open. The bounds apply to the float as stored, and a nonzero value
 * that a float holds only as 0 or a denormal is refused: 1e-300 would pass
 * (0, 10] as a double and reach the sampler as 0. */
static int get_num(struct pctx *c, json_t *obj, const char *name, float min, bool min_open,
                   float max, float *ret, bool *ret_present)
{
	json_t *v = json_object_get(obj, name);
	if (ret_present)
		*ret_present = v != NULL;
	if (!v)
		return 0;
	if (!json_is_number(v))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be a number", name);
	double x = json_number_value(v);
	/* min and max are floats, so a double between them rounds to a float
	 * between them: only underflow and an open bound need the float */
	float f = isfinite(x) && x >= min && x <= max ? (float)x : NAN;
	if (!isnan(f) && x != 0 && fabsf(f) < FLT_MIN)
		return perr(c->err, IPC_ERR_INVALID_FIELD,
		            "field '%s' is %g, too close to 0 for a float: nonzero values must "
		            "be at least %g in magnitude (range %c%g, %g])",
		            name, x, (double)FLT_MIN, min_open ? '(' : '[', (double)min,
		            (double)max);
	if (isnan(f) || (min_open && f <= min))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' is %g, not in %c%g, %g]",
		            name, x, min_open ? '(' : '[', (double)min, (double)max);
	*ret = f;
	return 0;
}

static int get_bool(struct pctx *c, json_t *obj, const char *name, bool *ret)
{
	json_t *v = json_object_get(obj, name);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be true or false",
		            name);
	*ret = json_is_true(v);
	return 0;
}

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

static int get_id(struct pctx *c, json_t *obj, bool required, struct ipc_request *r)
{
	json_t *v = json_object_get(obj, "id");
	if (!v) {
		if (required)
			return perr(c->err, IPC_ERR_INVALID_FIELD, "missing field 'id'");
		return 0;
	}
	if (!json_is_string(v))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field 'id' must be a string");
	if (!id_valid(json_string_value(v), json_string_length(v)))
		return perr(c->err, IPC_ERR_INVALID_FIELD,
		            "field 'id' must be 1 to %d characters of [A-Za-z0-9._:-]", IPC_ID_MAX);
	r->id = arena_strndup(c->arena, json_string_value(v), json_string_length(v));
	return r->id ? 0 : oom(c);
}

/* ---- per-op parsing ------------------------------------------------------- */

static int parse_messages(struct pctx *c, json_t *obj, struct ipc_request *r)
{
	json_t *arr = json_object_get(obj, "messages");
	if (!arr)
		return perr(c->err, IPC_ERR_INVALID_FIELD, "missing field 'messages'");
	if (!json_is_array(arr))
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field 'messages' must be an array");
	size_t n = json_array_size(arr);
	if (n == 0)
		return perr(c->err, IPC_ERR_INVALID_FIELD, "field 'messages' is empty");
	if (n > c->lim->max_messages)
		return perr(c->err, IPC_ERR_INVALID_FIELD, "%zu messages, more than %zu", n,
		            c->lim->max_messages);
	struct ipc_message *m = arena_zalloc(c->arena, n, sizeof(*m));
	if (!m)
		return oom(c);
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		if (!json_is_object(e))
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "messages[%zu] must be an object", i);
		const char *key;
		size_t klen;
		json_t *val;
		json_object_keylen_foreach(e, key, klen, val)
		{
			if (!((klen == 4 && memcmp(key, "role", 4) == 0) ||
			      (klen == 7 && memcmp(key, "content", 7) == 0))) {
				char buf[48];
				return perr(c->err, IPC_ERR_INVALID_FIELD,
				            "messages[%zu]: unknown field '%s'", i,
				            key_for_msg(key, klen, buf, sizeof(buf)));
			}
		}
		json_t *role = json_object_get(e, "role");
		if (!role || !json_is_string(role))
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "messages[%zu].role must be a string", i);
		int ri = name_index(role_names, IPC_ROLE_COUNT, json_string_value(role),
		                    json_string_length(role));
		if (ri < 0)
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "messages[%zu].role must be system, user or assistant", i);
		m[i].role = (enum ipc_role)ri;
		json_t *content = json_object_get(e, "content");
		if (!content || !json_is_string(content))
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "messages[%zu].content must be a string", i);
		size_t len = json_string_length(content);
		const char *s = json_string_value(content);
		total += json_text_bytes(s, len);
		if (total > c->lim->max_prompt_bytes)
			return perr(c->err, IPC_ERR_PROMPT_TOO_LONG,
			            "messages hold more than %zu bytes as JSON (escapes count)",
			            c->lim->max_prompt_bytes);
		if (memchr(s, '\0', len))
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "messages[%zu].content contains a NUL character", i);
		m[i].content = arena_strndup(c->arena, s, len);
		if (!m[i].content)
			return oom(c);
		m[i].content_len = len;
	}
	r->messages = m;
	r->n_messages = n;
	return 0;
}

static int parse_stop(struct pctx *c, json_t *obj, struct ipc_request *r)
{
	json_t *arr = json_object_get(obj, "stop");
	if (!arr)
		return 0;
	if (!json_is_array(arr))
		return perr(c->err, IPC_ERR_INVALID_FIELD,
		            "field 'stop' must be an array of strings");
	size_t n = json_array_size(arr);
	if (n > c->lim->max_stop)
		return perr(c->err, IPC_ERR_INVALID_FIELD, "%zu stop strings, more than %zu", n,
		            c->lim->max_stop);
	if (n == 0)
		return 0;
	const char **s = arena_zalloc(c->arena, n, sizeof(*s));
	size_t *l = arena_zalloc(c->arena, n, sizeof(*l));
	if (!s || !l)
		return oom(c);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		if (!json_is_string(e))
			return perr(c->err, IPC_ERR_INVALID_FIELD, "stop[%zu] must be a string", i);
		size_t len = json_string_length(e);
		if (len == 0 || len > c->lim->max_stop_bytes)
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "stop[%zu] must be 1 to %zu bytes", i, c->lim->max_stop_bytes);
		if (memchr(json_string_value(e), '\0', len))
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "stop[%zu] contains a NUL character", i);
		s[i] = arena_strndup(c->arena, json_string_value(e), len);
		if (!s[i])
			return oom(c);
		l[i] = len;
	}
	r->stop = s;
	r->stop_len = l;
	r->n_stop = n;
	return 0;
}

static int parse_sampling(struct pctx *c, json_t *obj, struct ipc_request *r)
{
	struct ipc_sampling *s = &r->sampling;
	long long x;
	bool p;
	int rc;

	if ((rc = get_int(c, obj, "max_tokens", 1, c->lim->max_tokens, &x, &p)))
		return rc;
	if (p) {
		s->max_tokens = (int32_t)x;
		s->set |= IPC_SET_MAX_TOKENS;
	}
	if ((rc = get_num(c, obj, "temperature", 0, false, 100, &s->temperature, &p)))
		return rc;
	s->set |= p ? IPC_SET_TEMPERATURE : 0;
	if ((rc = get_int(c, obj, "top_k", 0, 1 << 20, &x, &p)))
		return rc;
	if (p) {
		s->top_k = (int32_t)x;
		s->set |= IPC_SET_TOP_K;
	}
	if ((rc = get_num(c, obj, "top_p", 0, false, 1, &s->top_p, &p)))
		return rc;
	s->set |= p ? IPC_SET_TOP_P : 0;
	if ((rc = get_num(c, obj, "min_p", 0, false, 1, &s->min_p, &p)))
		return rc;
	s->set |= p ? IPC_SET_MIN_P : 0;
	if ((rc = get_num(c, obj, "repeat_penalty", 0, true, 10, &s->repeat_penalty, &p)))
		return rc;
	s->set |= p ? IPC_SET_REPEAT_PENALTY : 0;
	if ((rc = get_num(c, obj, "frequency_penalty", -2, false, 2, &s->frequency_penalty, &p)))
		return rc;
	s->set |= p ? IPC_SET_FREQUENCY_PENALTY : 0;
	if ((rc = get_num(c, obj, "presence_penalty", -2, false, 2, &s->presence_penalty, &p)))
		return rc;
	s->set |= p ? IPC_SET_PRESENCE_PENALTY : 0;
	if ((rc = get_int(c, obj, "penalty_last_n", -1, 1 << 20, &x, &p)))
		return rc;
	if (p) {
		s->penalty_last_n = (int32_t)x;
		s->set |= IPC_SET_PENALTY_LAST_N;
	}
	if ((rc = get_int(c, obj, "seed", 0, LLONG_MAX, &x, &p)))
		return rc;
	if (p) {
		s->seed = (uint64_t)x;
		s->set |= IPC_SET_SEED;
	}
	if ((rc = parse_stop(c, obj, r)))
		return rc;
	if ((rc = get_bool(c, obj, "stream", &r->stream)))
		return rc;
	if ((rc = get_int(c, obj, "deadline_ms", 0, MAX_DEADLINE_MS, &x, &p)))
		return rc;
	if (p)
		r->deadline_ms = x;
	if ((rc = get_int(c, obj, "priority", -10, 10, &x, &p)))
		return rc;
	if (p)
		r->priority = (int32_t)x;
	return 0;
}

static int parse_ids(struct pctx *c, json_t *obj, struct ipc_request *r)
{
	json_t *arr = json_object_get(obj, "ids");
	if (!arr)
		return perr(c->err, IPC_ERR_INVALID_FIELD, "missing field 'ids'");
	if (!json_is_array(arr))
		return perr(c->err, IPC_ERR_INVALID_FIELD,
		            "field 'ids' must be an array of integers");
	size_t n = json_array_size(arr);
	if (n > c->lim->max_ids)
		return perr(c->err, IPC_ERR_TOO_LARGE, "%zu ids, more than %zu", n,
		            c->lim->max_ids);
	int32_t *ids = arena_zalloc(c->arena, n ? n : 1, sizeof(*ids));
	if (!ids)
		return oom(c);
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(arr, i);
		if (!json_is_integer(e) || json_integer_value(e) < 0 ||
		    json_integer_value(e) > INT32_MAX)
			return perr(c->err, IPC_ERR_INVALID_FIELD,
			            "ids[%zu] must be an integer in [0, %d]", i, INT32_MAX);
		ids[i] = (int32_t)json_integer_value(e);
	}
	r->ids = ids;
	r->n_ids = n;
	return 0;
}

void ipc_request_init(struct ipc_request *r, enum ipc_op op)
{
	memset(r, 0, sizeof(*r));
	r->op = op;
	r->version = IPC_PROTOCOL_VERSION;
	r->sampling.max_tokens = 256;
	r->sampling.temperature = 0.8f;
	r->sampling.top_k = 40;
	r->sampling.top_p = 0.95f;
	r->sampling.min_p = 0.05f;
	r->sampling.repeat_penalty = 1.0f;
	r->sampling.penalty_last_n = 64;
	r->wait_ms = DEFAULT_WAIT_MS;
	r->add_special = true;
}

static int parse_body(struct pctx *c, json_t *root, struct ipc_request **ret_req)
{
	struct cm_err *err = c->err;
	int rc;

	if (!json_is_object(root))
		return perr(err, IPC_ERR_INVALID_JSON, "the message must be a JSON object");

	json_t *v = json_object_get(root, "v");
	if (v) {
		if (!json_is_integer(v))
			return perr(err, IPC_ERR_INVALID_FIELD, "field 'v' must be an integer");
		if (json_integer_value(v) != IPC_PROTOCOL_VERSION)
			return perr(
			    err, IPC_ERR_UNSUPPORTED_VERSION,
			    "protocol version %lld is not supported (this daemon speaks %d)",
			    json_integer_value(v), IPC_PROTOCOL_VERSION);
	}
	json_t *jop = json_object_get(root, "op");
	if (!jop)
		return perr(err, IPC_ERR_INVALID_FIELD, "missing field 'op'");
	if (!json_is_string(jop))
		return perr(err, IPC_ERR_INVALID_FIELD, "field 'op' must be a string");
	int op =
	    name_index(op_names, IPC_OP_COUNT, json_string_value(jop), json_string_length(jop));
	if (op <= 0) {
		char buf[48];
		return perr(
		    err, IPC_ERR_UNKNOWN_OP, "unknown op '%s'",
		    key_for_msg(json_string_value(jop), json_string_length(jop), buf, sizeof(buf)));
	}
	if ((rc = check_fields(root, (enum ipc_op)op, err)))
		return rc;

	struct ipc_request *r = arena_alloc(c->arena, sizeof(*r));
	if (!r)
		return oom(c);
	ipc_request_init(r, (enum ipc_op)op);

	switch (r->op) {
	case IPC_OP_GENERATE:
		if ((rc = get_id(c, root, false, r)))
			return rc;
		if ((rc = get_text(c, root, "prompt", true, c->lim->max_prompt_bytes,
		                   IPC_ERR_PROMPT_TOO_LONG, &r->prompt, &r->prompt_len)))
			return rc;
		if ((rc = parse_sampling(c, root, r)))
			return rc;
		break;
	case IPC_OP_CHAT:
		if ((rc = get_id(c, root, false, r)))
			return rc;
		if ((rc = parse_messages(c, root, r)))
			return rc;
		if ((rc = parse_sampling(c, root, r)))
			return rc;
		break;
	case IPC_OP_POLL: {
		long long x;
		bool p;
		if ((rc = get_id(c, root, true, r)))
			return rc;
		if ((rc = get_int(c, root, "ack", 0, LLONG_MAX, &x, &p)))
			return rc;
		if (p)
			r->ack = (uint64_t)x;
		if ((rc = get_int(c, root, "wait_ms", 0, c->lim->max_wait_ms, &x, &p)))
			return rc;
		if (p)
			r->wait_ms = (uint32_t)x;
		break;
	}
	case IPC_OP_CANCEL:
		if ((rc = get_id(c, root, true, r)))
			return rc;
		break;
	case IPC_OP_TOKENIZE:
		if ((rc = get_text(c, root, "text", true, c->lim->max_prompt_bytes,
		                   IPC_ERR_TOO_LARGE, &r->text, &r->text_len)))
			return rc;
		if ((rc = get_bool(c, root, "add_special", &r->add_special)))
			return rc;
		if ((rc = get_bool(c, root, "parse_special", &r->parse_special)))
			return rc;
		break;
	case IPC_OP_DETOKENIZE:
		if ((rc = parse_ids(c, root, r)))
			return rc;
		break;
	case IPC_OP_INFO:
	case IPC_OP_HEALTH:
	case IPC_OP_METRICS:
	default:
		break;
	}
	*ret_req = r;
	return 0;
}

int ipc_request_parse(const char *json, size_t len, const struct ipc_limits *lim_in,
                      struct ipc_request **ret_req, struct cm_err *err)
{
	struct ipc_limits lim = {0};
	if (lim_in)
		lim = *lim_in;
	ipc_limits_fill(&lim);
	*ret_req = NULL;

	if (len > lim.max_msg_bytes)
		return perr(err, IPC_ERR_TOO_LARGE, "message of %zu bytes, more than %zu", len,
		            lim.max_msg_bytes);
	if (len == 0 || !json)
		return perr(err, IPC_ERR_INVALID_JSON, "empty message");
	int rc = json_prescan(json, len, &lim, err);
	if (rc)
		return rc;

	json_error_t jerr;
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return perr(err, IPC_ERR_INVALID_JSON, "invalid JSON at byte %d: %s", jerr.position,
		            jerr.text);

	struct ipc_arena *arena = cm_calloc(1, sizeof(*arena));
	if (!arena) {
		json_decref(root);
		return perr(err, IPC_ERR_INTERNAL, "out of memory while parsing the request");
	}
	struct pctx c = {.arena = arena, .lim = &lim, .err = err};
	struct ipc_request *r = NULL;
	rc = parse_body(&c, root, &r);
	json_decref(root);
	if (rc) {
		arena_free(arena);
		return rc;
	}
	r->arena_ = arena;
	*ret_req = r;
	return 0;
}

void ipc_request_free(struct ipc_request *req)
{
	if (req)
		arena_free(req->arena_); /* the request itself lives in its arena */
}

/* ---- encoding helpers ----------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. The
 * rules match jansson's: no overlong forms, no surrogates, <= U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	size_t len;
	uint32_t cp;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
		cp = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		cp = c & 0x0f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		cp = c & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (s[i] & 0x3f);
	}
	if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* A JSON string of n bytes; invalid UTF-8 bytes become U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
	if (!s)
		return json_stringn("", 0);
	const unsigned char *u = (const unsigned char *)s;
	size_t bad = 0;
	for (size_t i = 0; i < n;) {
		size_t l = utf8_seq(u + i, n - i);
		if (!l) {
			bad++;
			l = 1;
		}
		i += l;
	}
	if (!bad)
		return json_stringn(s, n);
	if (bad > (SIZE_MAX - n) / 2)
		return NULL;
	char *d = cm_malloc(n + bad * 2);
	if (!d)
		return NULL;
	size_t j = 0;
	for (size_t i = 0; i < n;) {
		size_t l = utf8_seq(u + i, n - i);
		if (!l) {
			memcpy(d + j, "\xef\xbf\xbd", 3);
			j += 3;
			i++;
		} else {
			memcpy(d + j, s + i, l);
			j += l;
			i += l;
		}
	}
	json_t *r = json_stringn(d, j);
	cm_free(d);
	return r;
}

static json_t *jcstr(const char *s)
{
	return jstr(s, s ? strlen(s) : 0);
}

/* A finite double as a JSON real, else null. */
static json_t *jreal(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

/* A float as the double of its shortest round-tripping decimal, so that 0.8f
 * is written "0.8" and parses back to 0.8f. */
static json_t *jfloat(float f)
{
	char buf[32];
	for (int prec = 6; prec <= 9; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
		if ((float)strtod(buf, NULL) == f)
			break;
	}
	return jreal(strtod(buf, NULL));
}

/* Set a key; a NULL value (failed allocation) marks the build as failed. */
static void jset(json_t *obj, const char *key, json_t *val, bool *ok)
{
	if (!val || json_object_set_new(obj, key, val) != 0)
		*ok = false;
}

/* Dump into a cm_malloc'd buffer. Reals print with 15 significant digits:
 * enough for timings, and floats arrive here already rounded (jfloat). */
static int dump(json_t *root, char **ret_json, size_t *ret_len, struct cm_err *err)
{
	size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(15);
	size_t n = json_dumpb(root, NULL, 0, flags);
	if (n == 0)
		return cm_err_set(err, -ENOMEM, "ipc: cannot encode JSON");
	char *buf = cm_malloc(n + 1);
	if (!buf)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	if (json_dumpb(root, buf, n, flags) != n) {
		cm_free(buf);
		return cm_err_set(err, -ENOMEM, "ipc: cannot encode JSON");
	}
	buf[n] = '\0';
	*ret_json = buf;
	if (ret_len)
		*ret_len = n;
	return 0;
}

/* ---- request encoding ----------------------------------------------------- */

int ipc_request_encode(const struct ipc_request *r, char **ret_json, size_t *ret_len,
                       struct cm_err *err)
{
	const char *opname = ipc_op_name(r->op);
	if (!opname)
		return cm_err_set(err, -EINVAL, "ipc: cannot encode a request with op %d", r->op);
	/* JSON integers are signed 64-bit here and in the parser: refuse what
	 * would change sign rather than send another value */
	if ((r->op == IPC_OP_GENERATE || r->op == IPC_OP_CHAT) &&
	    (r->sampling.set & IPC_SET_SEED) && r->sampling.seed > (uint64_t)LLONG_MAX)
		return cm_err_set(err, -EINVAL, "ipc: seed %llu is more than 2^63-1",
		                  (unsigned long long)r->sampling.seed);
	if (r->op == IPC_OP_POLL && r->ack > (uint64_t)LLONG_MAX)
		return cm_err_set(err, -EINVAL, "ipc: ack %llu is more than 2^63-1",
		                  (unsigned long long)r->ack);
	json_t *o = json_object();
	if (!o)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	bool ok = true;
	struct ipc_request def;
	ipc_request_init(&def, r->op);
	const struct ipc_sampling *s = &r->sampling;

	jset(o, "v", json_integer(IPC_PROTOCOL_VERSION), &ok);
	jset(o, "op", json_string(opname), &ok);
	if (r->id)
		jset(o, "id", jcstr(r->id), &ok);
	switch (r->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT:
		if (r->op == IPC_OP_GENERATE) {
			jset(o, "prompt", jstr(r->prompt, r->prompt_len), &ok);
		} else {
			json_t *a = json_array();
			for (size_t i = 0; a && i < r->n_messages; i++) {
				json_t *m = json_object();
				if (!m) {
					ok = false;
					break;
				}
				jset(m, "role", jcstr(ipc_role_name(r->messages[i].role)), &ok);
				jset(m, "content",
				     jstr(r->messages[i].content, r->messages[i].content_len), &ok);
				if (json_array_append_new(a, m))
					ok = false;
			}
			jset(o, "messages", a, &ok);
		}
#define SETI(bit, key, field)                                                                      \
	if ((s->set & (bit)) || s->field != def.sampling.field)                                    \
		jset(o, key, json_integer(s->field), &ok);
#define SETF(bit, key, field)                                                                      \
	if ((s->set & (bit)) || s->field != def.sampling.field)                                    \
		jset(o, key, jfloat(s->field), &ok);
		SETI(IPC_SET_MAX_TOKENS, "max_tokens", max_tokens)
		SETF(IPC_SET_TEMPERATURE, "temperature", temperature)
		SETI(IPC_SET_TOP_K, "top_k", top_k)
		SETF(IPC_SET_TOP_P, "top_p", top_p)
		SETF(IPC_SET_MIN_P, "min_p", min_p)
		SETF(IPC_SET_REPEAT_PENALTY, "repeat_penalty", repeat_penalty)
		SETF(IPC_SET_FREQUENCY_PENALTY, "frequency_penalty", frequency_penalty)
		SETF(IPC_SET_PRESENCE_PENALTY, "presence_penalty", presence_penalty)
		SETI(IPC_SET_PENALTY_LAST_N, "penalty_last_n", penalty_last_n)
#undef SETI
#undef SETF
		if (s->set & IPC_SET_SEED)
			jset(o, "seed", json_integer((json_int_t)s->seed), &ok);
		if (r->n_stop) {
			json_t *a = json_array();
			for (size_t i = 0; a && i < r->n_stop; i++)
				if (json_array_append_new(
				        a, jstr(r->stop[i],
				                r->stop_len ? r->stop_len[i] : strlen(r->stop[i]))))
					ok = false;
			jset(o, "stop", a, &ok);
		}
		if (r->stream)
			jset(o, "stream", json_true(), &ok);
		if (r->deadline_ms)
			jset(o, "deadline_ms", json_integer(r->deadline_ms), &ok);
		if (r->priority)
			jset(o, "priority", json_integer(r->priority), &ok);
		break;
	case IPC_OP_POLL:
		jset(o, "ack", json_integer((json_int_t)r->ack), &ok);
		jset(o, "wait_ms", json_integer(r->wait_ms), &ok);
		break;
	case IPC_OP_TOKENIZE:
		jset(o, "text", jstr(r->text, r->text_len), &ok);
		if (!r->add_special)
			jset(o, "add_special", json_false(), &ok);
		if (r->parse_special)
			jset(o, "parse_special", json_true(), &ok);
		break;
	case IPC_OP_DETOKENIZE: {
		json_t *a = json_array();
		for (size_t i = 0; a && i < r->n_ids; i++)
			if (json_array_append_new(a, json_integer(r->ids[i])))
				ok = false;
		jset(o, "ids", a, &ok);
		break;
	}
	default:
		break;
	}
	int rc = ok ? dump(o, ret_json, ret_len, err)
	            : cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	json_decref(o);
	return rc;
}

/* ---- reply encoding ------------------------------------------------------- */

static json_t *enc_usage(const struct ipc_usage *u)
{
	return json_pack("{sIsIsI}", "prompt_tokens", (json_int_t)u->prompt_tokens, "cached_tokens",
	                 (json_int_t)u->cached_tokens, "completion_tokens",
	                 (json_int_t)u->completion_tokens);
}

static json_t *enc_timings(const struct ipc_timings *t)
{
	json_t *o = json_object();
	bool ok = o != NULL;
	if (!ok)
		return NULL;
	jset(o, "queue_ms", jreal(t->queue_ms), &ok);
	jset(o, "ttft_ms", jreal(t->ttft_ms), &ok);
	jset(o, "prefill_ms", jreal(t->prefill_ms), &ok);
	jset(o, "decode_ms", jreal(t->decode_ms), &ok);
	jset(o, "total_ms", jreal(t->total_ms), &ok);
	jset(o, "prefill_tps", jreal(t->prefill_tps), &ok);
	jset(o, "decode_tps", jreal(t->decode_tps), &ok);
	if (!ok) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static void enc_final(json_t *o, enum ipc_finish f, const struct ipc_usage *u,
                      const struct ipc_timings *t, bool *ok)
{
	const char *fn = ipc_finish_name(f);
	jset(o, "finish_reason", fn ? json_string(fn) : json_null(), ok);
	jset(o, "usage", enc_usage(u), ok);
	jset(o, "timings", enc_timings(t), ok);
}

static json_t *enc_strings(const char *const *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a && i < n; i++) {
		if (json_array_append_new(a, jcstr(v[i]))) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

/* Whether a text handed in by the daemon is one JSON object. Such a member
 * ("tuning" of info, "metrics") is spliced into the reply as it is, so the
 * daemon's number formatting survives (see splice_raw). */
static bool is_object_text(const char *text)
{
	json_error_t jerr;
	json_t *t = json_loadb(text, strlen(text), JSON_ALLOW_NUL, &jerr);
	bool ok = t && json_is_object(t);
	json_decref(t);
	return ok;
}

/* Append `"key":raw` to the compact object text *json (which ends in '}'). */
static int splice_raw(char **json, size_t *len, const char *key, const char *raw,
                      struct cm_err *err)
{
	size_t klen = strlen(key), rlen = strlen(raw), n = *len;
	bool empty = n == 2; /* "{}" */
	size_t total = n - 1 + (empty ? 0 : 1) + klen + 3 + rlen + 1;
	char *d = cm_malloc(total + 1);
	if (!d)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	size_t j = n - 1;
	memcpy(d, *json, j);
	if (!empty)
		d[j++] = ',';
	d[j++] = '"';
	memcpy(d + j, key, klen);
	j += klen;
	d[j++] = '"';
	d[j++] = ':';
	memcpy(d + j, raw, rlen);
	j += rlen;
	d[j++] = '}';
	d[j] = '\0';
	cm_free(*json);
	*json = d;
	*len = j;
	return 0;
}

static int enc_ok_body(json_t *o, const struct ipc_reply *r, struct cm_err *err)
{
	bool ok = true;
	switch (r->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: {
		const struct ipc_gen_reply *g = &r->u.gen;
		jset(o, "stream", json_boolean(g->stream), &ok);
		if (!g->stream) {
			jset(o, "text", jstr(g->text, g->text_len), &ok);
			enc_final(o, g->finish, &g->usage, &g->timings, &ok);
		}
		break;
	}
	case IPC_OP_POLL: {
		const struct ipc_poll_reply *p = &r->u.poll;
		if (p->offset > (uint64_t)LLONG_MAX - p->text_len)
			return cm_err_set(err, -EINVAL, "ipc: poll offset out of range");
		jset(o, "offset", json_integer((json_int_t)p->offset), &ok);
		jset(o, "next", json_integer((json_int_t)(p->offset + p->text_len)), &ok);
		jset(o, "text", jstr(p->text, p->text_len), &ok);
		jset(o, "done", json_boolean(p->done), &ok);
		if (p->done)
			enc_final(o, p->finish, &p->usage, &p->timings, &ok);
		break;
	}
	case IPC_OP_CANCEL:
		jset(o, "cancelled", json_boolean(r->u.cancel.cancelled), &ok);
		break;
	case IPC_OP_TOKENIZE: {
		json_t *a = json_array();
		for (size_t i = 0; a && i < r->u.tokenize.n_ids; i++)
			if (json_array_append_new(a, json_integer(r->u.tokenize.ids[i])))
				ok = false;
		jset(o, "ids", a, &ok);
		jset(o, "count", json_integer((json_int_t)r->u.tokenize.n_ids), &ok);
		break;
	}
	case IPC_OP_DETOKENIZE:
		jset(o, "text", jstr(r->u.detokenize.text, r->u.detokenize.text_len), &ok);
		break;
	case IPC_OP_INFO: {
		const struct ipc_info_reply *in = &r->u.info;
#define SETS(key, v)                                                                               \
	if (v)                                                                                     \
		jset(o, key, jcstr(v), &ok);
		SETS("version", in->version)
		SETS("model", in->model)
		SETS("architecture", in->architecture)
		jset(o, "quant_types", enc_strings(in->quant_types, in->n_quant_types), &ok);
		jset(o, "n_ctx", json_integer(in->n_ctx), &ok);
		jset(o, "n_vocab", json_integer(in->n_vocab), &ok);
		SETS("isa", in->isa)
		SETS("kernels", in->kernels)
#undef SETS
		jset(o, "threads", json_integer(in->threads), &ok);
		if (in->tuning_json && !is_object_text(in->tuning_json))
			return cm_err_set(err, -EINVAL,
			                  "ipc: info tuning_json is not a JSON object");
		break;
	}
	case IPC_OP_HEALTH: {
		const char *st = ipc_health_name(r->u.health.status);
		if (!st)
			return cm_err_set(err, -EINVAL, "ipc: bad health status %d",
			                  r->u.health.status);
		jset(o, "status", json_string(st), &ok);
		jset(o, "ready", json_boolean(r->u.health.status == IPC_HEALTH_READY), &ok);
		jset(o, "reasons", enc_strings(r->u.health.reasons, r->u.health.n_reasons), &ok);
		break;
	}
	case IPC_OP_METRICS: {
		if (r->u.metrics.json) {
			if (!is_object_text(r->u.metrics.json))
				return cm_err_set(err, -EINVAL,
				                  "ipc: metrics json is not a JSON object");
			break; /* spliced in by ipc_reply_encode */
		}
		json_t *a = json_array();
		for (size_t i = 0; a && i < r->u.metrics.n_items; i++) {
			const struct ipc_metric *m = &r->u.metrics.items[i];
			json_t *e = json_object(), *l = json_object();
			if (!e || !l) {
				json_decref(e);
				json_decref(l);
				ok = false;
				break;
			}
			for (size_t k = 0; k < m->n_labels; k++)
				if (m->labels[k].name)
					jset(l, m->labels[k].name, jcstr(m->labels[k].value), &ok);
			jset(e, "name", jcstr(m->name), &ok);
			jset(e, "type", jcstr(m->type ? m->type : "untyped"), &ok);
			jset(e, "labels", l, &ok);
			jset(e, "value", jreal(m->value), &ok);
			if (json_array_append_new(a, e))
				ok = false;
		}
		jset(o, "metrics", a, &ok);
		break;
	}
	default:
		return cm_err_set(err, -EINVAL, "ipc: cannot encode a reply with op %d", r->op);
	}
	return ok ? 0 : cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
}

int ipc_reply_encode(const struct ipc_reply *r, char **ret_json, size_t *ret_len,
                     struct cm_err *err)
{
	json_t *o = json_object();
	if (!o)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	bool ok = true;
	int rc = 0;
	bool is_err = r->error != IPC_ERR_NONE;
	jset(o, "v", json_integer(IPC_PROTOCOL_VERSION), &ok);
	jset(o, "ok", json_boolean(!is_err), &ok);
	if (ipc_op_name(r->op))
		jset(o, "op", json_string(ipc_op_name(r->op)), &ok);
	if (r->id)
		jset(o, "id", jcstr(r->id), &ok);
	if (is_err) {
		json_t *e = json_object();
		if (e) {
			jset(e, "code", json_string(ipc_errcode_name(r->error)), &ok);
			jset(e, "message",
			     jcstr(r->message ? r->message : ipc_errcode_describe(r->error)), &ok);
			if (r->retry_after_ms >= 0)
				jset(e, "retry_after_ms", json_integer(r->retry_after_ms), &ok);
		}
		jset(o, "error", e, &ok);
	} else if (ok) {
		rc = enc_ok_body(o, r, err);
	}
	char *json = NULL;
	size_t len = 0;
	if (!rc)
		rc = ok ? dump(o, &json, &len, err)
		        : cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	json_decref(o);
	if (!rc && !is_err && r->op == IPC_OP_INFO && r->u.info.tuning_json)
		rc = splice_raw(&json, &len, "tuning", r->u.info.tuning_json, err);
	if (!rc && !is_err && r->op == IPC_OP_METRICS && r->u.metrics.json)
		rc = splice_raw(&json, &len, "metrics", r->u.metrics.json, err);
	if (rc) {
		cm_free(json);
		return rc;
	}
	*ret_json = json;
	if (ret_len)
		*ret_len = len;
	return 0;
}

int ipc_error_encode(enum ipc_errcode code, const char *id, const char *msg, int64_t retry_after_ms,
                     char **ret_json, size_t *ret_len)
{
	struct ipc_reply r = {.op = IPC_OP_NONE,
	                      .id = id,
	                      .error = code == IPC_ERR_NONE ? IPC_ERR_INTERNAL : code,
	                      .message = msg,
	                      .retry_after_ms = retry_after_ms};
	return ipc_reply_encode(&r, ret_json, ret_len, NULL);
}

/* ---- reply decoding ------------------------------------------------------- */

struct dctx {
	struct ipc_arena *arena;
	struct cm_err *err;
};

static int bad_reply(struct dctx *c, const char *what)
{
	return cm_err_set(c->err, -EPROTO, "ipc: malformed reply: %s", what);
}

/* Optional string: absent or null leaves *ret NULL. */
static int dec_str(struct dctx *c, json_t *o, const char *key, const char **ret, size_t *ret_len)
{
	json_t *v = json_object_get(o, key);
	*ret = NULL;
	if (ret_len)
		*ret_len = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return bad_reply(c, key);
	char *d = arena_strndup(c->arena, json_string_value(v), json_string_length(v));
	if (!d)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	*ret = d;
	if (ret_len)
		*ret_len = json_string_length(v);
	return 0;
}

static int dec_int(struct dctx *c, json_t *o, const char *key, int64_t *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_integer(v))
		return bad_reply(c, key);
	*ret = json_integer_value(v);
	return 0;
}

static int dec_real(struct dctx *c, json_t *o, const char *key, double *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = NAN;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_number(v))
		return bad_reply(c, key);
	*ret = json_number_value(v);
	return 0;
}

static int dec_bool(struct dctx *c, json_t *o, const char *key, bool *ret)
{
	json_t *v = json_object_get(o, key);
	*ret = false;
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return bad_reply(c, key);
	*ret = json_is_true(v);
	return 0;
}

static int dec_strings(struct dctx *c, json_t *o, const char *key, const char *const **ret,
                       size_t *ret_n)
{
	json_t *a = json_object_get(o, key);
	*ret = NULL;
	*ret_n = 0;
	if (!a || json_is_null(a))
		return 0;
	if (!json_is_array(a))
		return bad_reply(c, key);
	size_t n = json_array_size(a);
	const char **v = arena_zalloc(c->arena, n ? n : 1, sizeof(*v));
	if (!v)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_array_get(a, i);
		if (!json_is_string(e))
			return bad_reply(c, key);
		v[i] = arena_strndup(c->arena, json_string_value(e), json_string_length(e));
		if (!v[i])
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	}
	*ret = v;
	*ret_n = n;
	return 0;
}

static int dec_final(struct dctx *c, json_t *o, enum ipc_finish *f, struct ipc_usage *u,
                     struct ipc_timings *t)
{
	json_t *fr = json_object_get(o, "finish_reason");
	*f = IPC_FINISH_NONE;
	if (fr && json_is_string(fr)) {
		int i = name_index(finish_names, IPC_FINISH_COUNT, json_string_value(fr),
		                   json_string_length(fr));
		if (i < 0)
			return bad_reply(c, "finish_reason");
		*f = (enum ipc_finish)i;
	} else if (fr && !json_is_null(fr)) {
		return bad_reply(c, "finish_reason");
	}
	json_t *uo = json_object_get(o, "usage");
	if (uo && !json_is_object(uo))
		return bad_reply(c, "usage");
	if (uo && (dec_int(c, uo, "prompt_tokens", &u->prompt_tokens) ||
	           dec_int(c, uo, "cached_tokens", &u->cached_tokens) ||
	           dec_int(c, uo, "completion_tokens", &u->completion_tokens)))
		return -EPROTO;
	json_t *to = json_object_get(o, "timings");
	if (to && !json_is_object(to))
		return bad_reply(c, "timings");
	if (to &&
	    (dec_real(c, to, "queue_ms", &t->queue_ms) || dec_real(c, to, "ttft_ms", &t->ttft_ms) ||
	     dec_real(c, to, "prefill_ms", &t->prefill_ms) ||
	     dec_real(c, to, "decode_ms", &t->decode_ms) ||
	     dec_real(c, to, "total_ms", &t->total_ms) ||
	     dec_real(c, to, "prefill_tps", &t->prefill_tps) ||
	     dec_real(c, to, "decode_tps", &t->decode_tps)))
		return -EPROTO;
	return 0;
}

/* An embedded object back to compact text in the arena. */
static int dec_object(struct dctx *c, json_t *t, const char **ret)
{
	size_t flags = JSON_COMPACT | JSON_REAL_PRECISION(17);
	size_t n = json_dumpb(t, NULL, 0, flags);
	char *s = n ? arena_alloc(c->arena, n + 1) : NULL;
	if (!s || json_dumpb(t, s, n, flags) != n)
		return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
	s[n] = '\0';
	*ret = s;
	return 0;
}

static int dec_ok_body(struct dctx *c, json_t *o, struct ipc_reply *r)
{
	int64_t x;
	switch (r->op) {
	case IPC_OP_GENERATE:
	case IPC_OP_CHAT: {
		struct ipc_gen_reply *g = &r->u.gen;
		if (dec_bool(c, o, "stream", &g->stream))
			return -EPROTO;
		if (g->stream)
			return 0;
		if (dec_str(c, o, "text", &g->text, &g->text_len))
			return -EPROTO;
		return dec_final(c, o, &g->finish, &g->usage, &g->timings);
	}
	case IPC_OP_POLL: {
		struct ipc_poll_reply *p = &r->u.poll;
		int64_t next;
		if (dec_int(c, o, "offset", &x) || dec_int(c, o, "next", &next) ||
		    dec_str(c, o, "text", &p->text, &p->text_len) ||
		    dec_bool(c, o, "done", &p->done))
			return -EPROTO;
		if (x < 0)
			return bad_reply(c, "offset");
		p->offset = (uint64_t)x;
		/* `next` counts the daemon's bytes, which differ from text_len where
		 * the encoder replaced invalid UTF-8. */
		if (!json_object_get(o, "next")) {
			if (p->text_len > (uint64_t)(INT64_MAX - x))
				return bad_reply(c, "offset");
			next = x + (int64_t)p->text_len;
		}
		if (next < x)
			return bad_reply(c, "next");
		p->next = (uint64_t)next;
		if (p->done)
			return dec_final(c, o, &p->finish, &p->usage, &p->timings);
		return 0;
	}
	case IPC_OP_CANCEL:
		return dec_bool(c, o, "cancelled", &r->u.cancel.cancelled);
	case IPC_OP_TOKENIZE: {
		json_t *a = json_object_get(o, "ids");
		if (!a || !json_is_array(a))
			return bad_reply(c, "ids");
		size_t n = json_array_size(a);
		int32_t *ids = arena_zalloc(c->arena, n ? n : 1, sizeof(*ids));
		if (!ids)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory decoding a reply");
		for (size_t i = 0; i < n; i++) {
			json_t *e = json_array_get(a, i);
			if (!json_is_integer(e) || json_integer_value(e) < INT32_MIN ||
			    json_integer_value(e) > INT32_MAX)
				return bad_reply(c, "ids");
			ids[i] = (int32_t)json_integer_value(e);
		}
		r->u.tokenize.ids = ids;
		r->u.tokenize.n_ids = n;
		return 0;
	}
	case IPC_OP_DETOKENIZE:
		return dec_str(c, o, "text", &r->u.detokenize.text, &r->u.detokenize.text_len);
	case IPC_OP_INFO: {
		struct ipc_info_reply *in = &r->u.info;
		if (dec_str(c, o, "version", &in->version, NULL) ||
		    dec_str(c, o, "model", &in->model, NULL) ||
		    dec_str(c, o, "architecture", &in->architecture, NULL) ||
		    dec_strings(c, o, "quant_types", &in->quant_types, &in->n_quant_types) ||
		    dec_int(c, o, "n_ctx", &in->n_ctx) || dec_int(c, o, "n_vocab", &in->n_vocab) ||
		    dec_str(c, o, "isa", &in->isa, NULL) ||
		    dec_str(c, o, "kernels", &in->kernels, NULL) || dec_int(c, o, "threads", &x))
			return -EPROTO;
		if (x < INT32_MIN || x > INT32_MAX)
			return bad_reply(c, "threads");
		in->threads = (int32_t)x;
		json_t *t = json_object_get(o, "tuning");
		if (t && json_is_object(t))
			return dec_object(c, t, &in->tuning_json);
		return 0;
	}
	case IPC_OP_HEALTH: {
		json_t *st = json_object_get(o, "status");
		if (!st || !json_is_string(st))
			return bad_reply(c, "status");
		int i = name_index(health_names, IPC_HEALTH_COUNT, json_string_value(st),
		                   json_string_length(st));
		if (i < 0)
			return bad_reply(c, "status");
		r->u.health.status = (enum ipc_health_status)i;
		return dec_strings(c, o, "reasons", &r->u.health.reasons, &r->u.health.n_reasons);
	}
	case IPC_OP_METRICS: {
		json_t *a = json_object_get(o, "metrics");
		if (a && json_is_object(a))
			return dec_object(c, a, &r->u.metrics.json);
		if (!a || !json_is_array(a))
			return bad_reply(c, "metrics");
		size_t n = json_array_size(a);
		struct ipc_metric *m = arena_zalloc(c->arena, n ? n : 1, sizeof(*m));
		if (!m)
			return cm_err_set(c->err, -ENOMEM, "ipc: out of memory");
		for (size_t i = 0; i < n; i++) {
			json_t *e = json_array_get(a, i);
			if (!json_is_object(e))
				return bad_reply(c, "metrics");
			if (dec_str(c, e, "name", &m[i].name, NULL) ||
			    dec_str(c, e, "type", &m[i].type, NULL) ||
			    dec_real(c, e, "value", &m[i].value))
				return -EPROTO;
			json_t *l = json_object_get(e, "labels");
			if (l && !json_is_object(l))
				return bad_reply(c, "labels");
			size_t nl = l ? json_object_size(l) : 0, k = 0;
			struct ipc_metric_label *lb =
			    arena_zalloc(c->arena, nl ? nl : 1, sizeof(*lb));
			if (!lb)
				return cm_err_set(c->err, -ENOMEM, "ipc: out of memory");
			const char *key;
			json_t *val;
			if (l) {
				json_object_foreach(l, key, val)
				{
					if (!json_is_string(val) || k >= nl)
						return bad_reply(c, "labels");
					lb[k].name = arena_strndup(c->arena, key, strlen(key));
					lb[k].value =
					    arena_strndup(c->arena, json_string_value(val),
					                  json_string_length(val));
					if (!lb[k].name || !lb[k].value)
						return cm_err_set(c->err, -ENOMEM,
						                  "ipc: out of memory");
					k++;
				}
			}
			m[i].labels = lb;
			m[i].n_labels = k;
		}
		r->u.metrics.items = m;
		r->u.metrics.n_items = n;
		return 0;
	}
	default:
		return cm_err_set(c->err, -EINVAL, "ipc: cannot decode replies to op %d", r->op);
	}
}

int ipc_reply_decode(const char *json, size_t len, enum ipc_op expect, struct ipc_reply **ret_reply,
                     struct cm_err *err)
{
	*ret_reply = NULL;
	if (!json || len == 0)
		return cm_err_set(err, -EPROTO, "ipc: empty reply");
	/* Replies come from our daemon, but a client must not trust them with
	 * its stack either. */
	struct ipc_limits lim = {.max_msg_bytes = SIZE_MAX, .max_values = SIZE_MAX};
	ipc_limits_fill(&lim);
	lim.max_depth = 8;
	if (json_prescan(json, len, &lim, NULL))
		return cm_err_set(err, -EPROTO, "ipc: malformed reply: nested too deep");
	json_error_t jerr;
	json_t *o = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
	if (!o)
		return cm_err_set(err, -EPROTO, "ipc: reply is not JSON: %s", jerr.text);
	int rc;
	struct ipc_arena *arena = cm_calloc(1, sizeof(*arena));
	struct ipc_reply *r = arena ? arena_zalloc(arena, 1, sizeof(*r)) : NULL;
	if (!r) {
		rc = cm_err_set(err, -ENOMEM, "ipc: out of memory decoding a reply");
		goto out;
	}
	r->arena_ = arena;
	r->retry_after_ms = -1;
	struct dctx c = {.arena = arena, .err = err};
	if (!json_is_object(o)) {
		rc = bad_reply(&c, "not an object");
		goto out;
	}
	json_t *v = json_object_get(o, "v");
	if (v && (!json_is_integer(v) || json_integer_value(v) != IPC_PROTOCOL_VERSION)) {
		rc = cm_err_set(err, -EPROTO, "ipc: reply of an unsupported protocol version");
		goto out;
	}
	json_t *okv = json_object_get(o, "ok");
	if (!okv || !json_is_boolean(okv)) {
		rc = bad_reply(&c, "ok");
		goto out;
	}
	json_t *opv = json_object_get(o, "op");
	r->op = expect;
	if (opv && json_is_string(opv)) {
		int i = name_index(op_names, IPC_OP_COUNT, json_string_value(opv),
		                   json_string_length(opv));
		if (i <= 0 || (expect != IPC_OP_NONE && i != (int)expect)) {
			rc = bad_reply(&c, "op does not match the request");
			goto out;
		}
		r->op = (enum ipc_op)i;
	}
	if ((rc = dec_str(&c, o, "id", &r->id, NULL)))
		goto out;
	if (json_is_false(okv)) {
		json_t *e = json_object_get(o, "error");
		json_t *code = e ? json_object_get(e, "code") : NULL;
		if (!e || !json_is_object(e) || !code || !json_is_string(code)) {
			rc = bad_reply(&c, "error");
			goto out;
		}
		r->error = ipc_errcode_from_name(json_string_value(code));
		if (r->error == IPC_ERR_NONE)
			r->error = IPC_ERR_INTERNAL; /* a code newer than this client */
		int64_t ra;
		if ((rc = dec_str(&c, e, "message", &r->message, NULL)) ||
		    (rc = dec_int(&c, e, "retry_after_ms", &ra)))
			goto out;
		r->retry_after_ms = json_object_get(e, "retry_after_ms") ? ra : -1;
	} else if (r->op == IPC_OP_NONE) {
		rc = bad_reply(&c, "op");
		goto out;
	} else if ((rc = dec_ok_body(&c, o, r))) {
		goto out;
	}
	*ret_reply = r;
	arena = NULL;
	rc = 0;
out:
	json_decref(o);
	arena_free(arena);
	return rc;
}

void ipc_reply_free(struct ipc_reply *r)
{
	if (r)
		arena_free(r->arena_);
}
