/* ipc/protocol_impl.h: what the files of the protocol codec share, and
 * nothing else includes (tests excepted).
 *
 *   protocol.c          error codes, names, limits, the arena, the cheap
 *                       scan and the JSON helpers both directions use
 *   protocol_fields.c   THE request field table, and the handlers of the
 *                       fields with special shapes (id, messages, stop, ids)
 *   protocol_request.c  requests: parsed, defaulted and encoded by walking
 *                       the table
 *   protocol_reply.c    replies: encoded and decoded
 *   protocol_doc.c      the table as the Markdown of docs/protocol.md
 *
 * The table is the only place a request field is named: adding one is one
 * row (plus a handler if its shape is new), and `make docs` puts it in
 * docs/protocol.md (tests/integration/protocol_doc.sh fails until then). */
#ifndef EDGELM_IPC_PROTOCOL_IMPL_H
#define EDGELM_IPC_PROTOCOL_IMPL_H

#include "ipc/ipc.h"

#include <jansson.h>
#include <stdio.h>

/* ---- errors, names ------------------------------------------------------- */

/* Fill `err` (may be NULL) and return the code's negative errno. */
int ipc_perr(struct cm_err *err, enum ipc_errcode code, const char *fmt, ...) CM_PRINTF(3, 4);

/* "out of memory while parsing the request" (internal). */
struct ipc_pctx;
int ipc_parse_oom(struct ipc_pctx *c);

/* Index of a name of n bytes in each table of names, or -1. */
int ipc_op_index(const char *s, size_t n); /* 0 (IPC_OP_NONE) is never found */
int ipc_role_index(const char *s, size_t n);
int ipc_finish_index(const char *s, size_t n);
int ipc_health_index(const char *s, size_t n);
int ipc_pooling_index(const char *s, size_t n);

/* A key or name quoted in a message: printable ASCII, shortened to fit cap. */
const char *ipc_key_for_msg(const char *key, size_t len, char *buf, size_t cap);

/* Bytes of a text inside a JSON string written with the fewest escapes
 * (jansson's, so libedgelm's): what the text limits count (ipc.h). */
size_t ipc_json_text_bytes(const char *s, size_t n);

/* Bound nesting depth and the number of values before jansson parses. */
int ipc_json_prescan(const char *s, size_t n, const struct ipc_limits *lim, struct cm_err *err);

/* ---- arena --------------------------------------------------------------- */

struct ipc_arena;
struct ipc_arena *ipc_arena_new(void);
void ipc_arena_free(struct ipc_arena *a); /* NULL-safe */
void *ipc_arena_alloc(struct ipc_arena *a, size_t n);
void *ipc_arena_zalloc(struct ipc_arena *a, size_t count, size_t size);
char *ipc_arena_strndup(struct ipc_arena *a, const char *s, size_t n);

/* ---- JSON building ------------------------------------------------------- */

json_t *ipc_jstr(const char *s, size_t n); /* invalid UTF-8 bytes become U+FFFD */
json_t *ipc_jcstr(const char *s);          /* NULL: "" */
json_t *ipc_jreal(double x);               /* non-finite: null */
json_t *ipc_jfloat(float f);               /* shortest decimal that round-trips */
/* Set a key; a NULL value (failed allocation) clears *ok. */
void ipc_jset(json_t *obj, const char *key, json_t *val, bool *ok);
/* Compact text in a cm_malloc'd buffer. */
int ipc_jdump(json_t *root, char **ret_json, size_t *ret_len, struct cm_err *err);

/* ---- the request field table --------------------------------------------- */

#define IPC_OPBIT(op) (1u << (op))
#define IPC_OPS_GEN (IPC_OPBIT(IPC_OP_GENERATE) | IPC_OPBIT(IPC_OP_CHAT))
#define IPC_OPS_ALL 0xffffffffu

/* How a field is written in JSON and held in struct ipc_request. */
enum ipc_ftype {
	IPC_FT_ENVELOPE, /* v, op: read before the table is walked, written first */
	IPC_FT_INT,      /* JSON integer in [min, max]; an int32/int64/uint32/uint64 */
	IPC_FT_NUM,      /* JSON integer or real, held as a float, in [fmin, fmax] */
	IPC_FT_BOOL,     /* true or false, held as a bool */
	IPC_FT_TEXT,     /* string without NUL, counted as JSON bytes (ipc_json_text_bytes)
	                  * against `limit`; a const char * and its length */
	IPC_FT_CUSTOM,   /* a special shape: `kind` reads, writes and documents it */
};

/* A bound that is a daemon setting (struct ipc_limits) rather than a constant. */
enum ipc_flimit {
	IPC_FLIM_NONE,
	IPC_FLIM_MAX_TOKENS,       /* INT: max is lim->max_tokens */
	IPC_FLIM_MAX_WAIT_MS,      /* INT: max is lim->max_wait_ms */
	IPC_FLIM_MAX_PROMPT_BYTES, /* TEXT: at most lim->max_prompt_bytes as JSON */
};

enum {
	IPC_F_REQUIRED = 1u << 0, /* missing: "missing field 'x'"; always written
	                           * (a custom shape decides: `id` only when set) */
	IPC_F_ALWAYS = 1u << 1,   /* written even at its default */
	IPC_F_SET_ONLY = 1u << 2, /* written only when flagged in sampling.set (the
	                           * default stands for "not given": seed) */
	IPC_F_MIN_OPEN = 1u << 3, /* NUM: the range is (fmin, fmax] */
};

struct ipc_field;

/* The parsing state every field handler gets. */
struct ipc_pctx {
	struct ipc_arena *arena;
	const struct ipc_limits *lim; /* filled */
	struct cm_err *err;
	enum ipc_op op; /* the envelope's op once known, for ipc_request_parse_op */
};

/* Handlers of a field with a special shape. */
struct ipc_field_kind {
	const char *json_type; /* for the docs: "array of strings", ... */
	/* `v` is the field's value (present); store it in `r`. */
	int (*parse)(struct ipc_pctx *c, const struct ipc_field *f, json_t *v,
	             struct ipc_request *r);
	/* The value to write, or 0 with *ret NULL to leave the field out;
	 * -ENOMEM when a JSON value cannot be made. */
	int (*encode)(const struct ipc_field *f, const struct ipc_request *r, json_t **ret);
	/* The range column of the docs, under the limits `lim`. */
	void (*range_doc)(const struct ipc_limits *lim, char *buf, size_t cap);
};

/* One request field for the ops in `ops`. A name may have several rows with
 * disjoint ops when it means something else per op (`id`). Rows are in the
 * order fields are checked (so which error a request with two bad fields
 * gets) and written. */
struct ipc_field {
	const char *name;
	enum ipc_ftype type;
	uint32_t ops;              /* IPC_OPBIT()s of the ops that accept it */
	unsigned flags;            /* IPC_F_* */
	size_t off;                /* INT, NUM, BOOL, TEXT: offsetof(struct ipc_request, member),
	                            * sampling.x included */
	size_t size;               /* sizeof the member */
	size_t len_off;            /* TEXT: offsetof its length (size_t) */
	bool is_unsigned;          /* INT: the member is unsigned */
	long long min, max;        /* INT: inclusive range */
	float fmin, fmax;          /* NUM: range, [fmin, fmax] or (fmin, fmax] */
	enum ipc_flimit limit;     /* INT: replaces max; TEXT: the byte limit */
	enum ipc_errcode too_long; /* TEXT: the code of a text over its limit */
	double def;                /* INT, NUM, BOOL: default (ipc_request_init) */
	uint32_t set_bit;          /* IPC_SET_* given when present (0: none) */
	const struct ipc_field_kind *kind; /* CUSTOM */
	const char *def_doc; /* docs: the default in words, replacing `def` ("random"), or
	                      * after it when it starts with '(' ("0 (none)"); NULL:
	                      * `def`, or "required" */
	const char *doc;     /* docs: one line */
};

extern const struct ipc_field ipc_fields[];
extern const size_t ipc_n_fields;

static inline bool ipc_field_accepts(const struct ipc_field *f, enum ipc_op op)
{
	return (unsigned)op < 32 && (f->ops & IPC_OPBIT(op)) != 0;
}

/* The upper bound of an INT field under `lim`; the byte limit of a TEXT one. */
long long ipc_field_max(const struct ipc_field *f, const struct ipc_limits *lim);
size_t ipc_field_text_max(const struct ipc_field *f, const struct ipc_limits *lim);

/* Members by the table. INT: any member as long long (an unsigned one above
 * LLONG_MAX wraps: read those with ipc_field_get_uint). */
long long ipc_field_get_int(const struct ipc_field *f, const struct ipc_request *r);
unsigned long long ipc_field_get_uint(const struct ipc_field *f, const struct ipc_request *r);
void ipc_field_set_int(const struct ipc_field *f, struct ipc_request *r, long long x);
float ipc_field_get_num(const struct ipc_field *f, const struct ipc_request *r);
void ipc_field_set_num(const struct ipc_field *f, struct ipc_request *r, float x);
bool ipc_field_get_bool(const struct ipc_field *f, const struct ipc_request *r);
void ipc_field_set_bool(const struct ipc_field *f, struct ipc_request *r, bool x);

/* "1 MiB", "1000 bytes": a byte count for the docs. */
const char *ipc_doc_bytes(size_t n, char *buf, size_t cap);

/* ---- the docs (protocol_doc.c) ------------------------------------------- */

/* The Markdown table of the fields of `op`; with `beyond` (not
 * IPC_OP_NONE), only the rows `beyond` lacks and one line for the rest. */
void ipc_fields_doc(FILE *out, enum ipc_op op, enum ipc_op beyond);

/* Copy a Markdown text from `in` to `out`, replacing the body of each
 * section between `<!-- generated: fields of OP [beyond OP2] ... -->` and
 * `<!-- end generated -->` by ipc_fields_doc. Returns 0, or -EINVAL (a
 * marker naming no op, or not closed) with a message in `err`. */
int ipc_protocol_doc_update(FILE *in, FILE *out, struct cm_err *err);

#endif
