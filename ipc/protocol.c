/* ipc/protocol.c: the JSON codec of the daemon's protocol (docs/protocol.md):
 * what requests and replies share. The error-code table, the names of ops,
 * roles, finish reasons and health states, the limits, the arena, the cheap
 * scan and the JSON helpers live here; the request fields are one table in
 * protocol_fields.c, walked by protocol_request.c; replies are in
 * protocol_reply.c (the layout: protocol_impl.h).
 *
 * Requests are parsed in three steps, cheapest first: the size against
 * max_msg_bytes, a linear scan that bounds nesting depth and the number of
 * JSON values (so jansson, which recurses per level, never sees deep input),
 * then json_loadb with duplicate keys rejected. Every field is then checked
 * for type and range against the field table; unknown fields are rejected
 * so that a typo never silently falls back to a default.
 *
 * Everything a parsed request or decoded reply points to lives in one arena,
 * freed at once by ipc_request_free / ipc_reply_free. */
#include "ipc/protocol_impl.h"

#include <float.h>
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

int ipc_perr(struct cm_err *err, enum ipc_errcode code, const char *fmt, ...)
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

int ipc_parse_oom(struct ipc_pctx *c)
{
	return ipc_perr(c->err, IPC_ERR_INTERNAL, "out of memory while parsing the request");
}

/* ---- names ---------------------------------------------------------------- */

static const char *const op_names[IPC_OP_COUNT] = {
    [IPC_OP_GENERATE] = "generate", [IPC_OP_CHAT] = "chat",
    [IPC_OP_POLL] = "poll",         [IPC_OP_CANCEL] = "cancel",
    [IPC_OP_TOKENIZE] = "tokenize", [IPC_OP_DETOKENIZE] = "detokenize",
    [IPC_OP_INFO] = "info",         [IPC_OP_HEALTH] = "health",
    [IPC_OP_METRICS] = "metrics",   [IPC_OP_EMBED] = "embed",
};

static const char *const pooling_names[IPC_POOL_COUNT] = {"default", "mean", "cls", "last"};

const char *ipc_pooling_name(enum ipc_pooling p)
{
	return (unsigned)p < IPC_POOL_COUNT ? pooling_names[p] : NULL;
}


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

int ipc_op_index(const char *s, size_t n)
{
	return name_index(op_names, IPC_OP_COUNT, s, n);
}

int ipc_pooling_index(const char *s, size_t n)
{
	return name_index(pooling_names, IPC_POOL_COUNT, s, n);
}

int ipc_role_index(const char *s, size_t n)
{
	return name_index(role_names, IPC_ROLE_COUNT, s, n);
}

int ipc_finish_index(const char *s, size_t n)
{
	return name_index(finish_names, IPC_FINISH_COUNT, s, n);
}

int ipc_health_index(const char *s, size_t n)
{
	return name_index(health_names, IPC_HEALTH_COUNT, s, n);
}

/* Print a key for a message: printable ASCII, shortened. */
const char *ipc_key_for_msg(const char *key, size_t len, char *buf, size_t cap)
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

/* Bytes of a text as JSON: see protocol_impl.h. */
size_t ipc_json_text_bytes(const char *s, size_t n)
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

void *ipc_arena_alloc(struct ipc_arena *a, size_t n)
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

void *ipc_arena_zalloc(struct ipc_arena *a, size_t count, size_t size)
{
	size_t n;
	if (__builtin_mul_overflow(count, size, &n))
		return NULL;
	void *p = ipc_arena_alloc(a, n);
	if (p)
		memset(p, 0, n);
	return p;
}

char *ipc_arena_strndup(struct ipc_arena *a, const char *s, size_t n)
{
	if (n == SIZE_MAX)
		return NULL;
	char *d = ipc_arena_alloc(a, n + 1);
	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

struct ipc_arena *ipc_arena_new(void)
{
	return cm_calloc(1, sizeof(struct ipc_arena));
}

void ipc_arena_free(struct ipc_arena *a)
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
int ipc_json_prescan(const char *s, size_t n, const struct ipc_limits *lim, struct cm_err *err)
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
				return ipc_perr(err, IPC_ERR_INVALID_JSON,
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
		return ipc_perr(err, IPC_ERR_TOO_LARGE, "more than %zu JSON values in one message",
		                lim->max_values);
	return 0;
}

/* ---- JSON building ----------------------------------------------------- */

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
json_t *ipc_jstr(const char *s, size_t n)
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

json_t *ipc_jcstr(const char *s)
{
	return ipc_jstr(s, s ? strlen(s) : 0);
}

/* A finite double as a JSON real, else null. */
json_t *ipc_jreal(double x)
{
	return isfinite(x) ? json_real(x) : json_null();
}

/* A float as the double of its shortest round-tripping decimal, so that 0.8f
 * is written "0.8" and parses back to 0.8f. */
json_t *ipc_jfloat(float f)
{
	char buf[32];
	for (int prec = 6; prec <= 9; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
		if ((float)strtod(buf, NULL) == f)
			break;
	}
	return ipc_jreal(strtod(buf, NULL));
}

/* Set a key; a NULL value (failed allocation) marks the build as failed. */
void ipc_jset(json_t *obj, const char *key, json_t *val, bool *ok)
{
	if (!val || json_object_set_new(obj, key, val) != 0)
		*ok = false;
}

/* Dump into a cm_malloc'd buffer. Reals print with 15 significant digits:
 * enough for timings, and floats arrive here already rounded (jfloat). */
int ipc_jdump(json_t *root, char **ret_json, size_t *ret_len, struct cm_err *err)
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
