/* ipc/json_schema.c: JSON Schema to GBNF (llama.cpp's grammar format).
 *
 * Every schema becomes one rule, named after where it sits ("name-3"), or
 * one of the shared rules (string, integer, ...) when it has no
 * constraints of its own. Objects allow only their listed properties, in
 * the schema's order, required ones always; an object's rules are a
 * "head" chain (the first property present) and a "tail" chain (the ones
 * after it, each behind a comma), so n properties make 2n rules rather
 * than one alternative per subset.
 *
 * Whitespace is bounded (at most one space, or one newline and 16 blanks,
 * between two tokens), and so are the digits of numbers: a model that
 * falls into spaces or digits reaches the end of the rule instead of
 * looping until max_tokens. Counts (maxItems, maxLength) expand into
 * chains of optional rules rather than GBNF's {m,n}, which keeps the text
 * within the grammar's core syntax. */
#include "ipc/json_schema.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ANY_DEPTH 8    /* nesting of a free JSON value (an object in JSON mode) */
#define WS_BLANKS 16   /* blanks after a newline */
#define INT_DIGITS 16  /* digits of an integer part */
#define FRAC_DIGITS 16 /* digits after the point */
#define EXP_DIGITS 2   /* digits of an exponent: 1e999 overflows most parsers' doubles */
#define NEST_INLINE 16 /* optional repeats nested inline; more make a chain of rules */

/* ---- a growing string ----------------------------------------------------- */

struct sb {
	char *p;
	size_t n, cap;
	bool oom;
};

static void sb_putn(struct sb *b, const char *s, size_t n)
{
	if (b->oom)
		return;
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = cm_realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = '\0';
}

static void sb_puts(struct sb *b, const char *s)
{
	sb_putn(b, s, strlen(s));
}

static void sb_printf(struct sb *b, const char *fmt, ...) CM_PRINTF(2, 3);
static void sb_printf(struct sb *b, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0) {
		b->oom = true;
		return;
	}
	if ((size_t)n < sizeof(buf)) {
		sb_putn(b, buf, (size_t)n);
		return;
	}
	/* longer: a property's literal can be any length */
	char *big = cm_malloc((size_t)n + 1);
	if (!big) {
		b->oom = true;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	sb_putn(b, big, (size_t)n);
	cm_free(big);
}

/* A GBNF literal of n bytes: "..." with the escapes its parser reads. */
static void sb_lit(struct sb *b, const char *s, size_t n)
{
	sb_putn(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\') {
			char e[2] = {'\\', (char)ch};
			sb_putn(b, e, 2);
		} else if (ch == '\n') {
			sb_puts(b, "\\n");
		} else if (ch == '\r') {
			sb_puts(b, "\\r");
		} else if (ch == '\t') {
			sb_puts(b, "\\t");
		} else if (ch < 0x20 || ch == 0x7f) {
			sb_printf(b, "\\x%02X", ch);
		} else {
			sb_putn(b, (const char *)&ch, 1);
		}
	}
	sb_putn(b, "\"", 1);
}

/* ---- the converter -------------------------------------------------------- */

enum {
	NEED_WS = 1u << 0,
	NEED_STRING = 1u << 1,
	NEED_INTEGER = 1u << 2,
	NEED_NUMBER = 1u << 3,
	NEED_BOOLEAN = 1u << 4,
	NEED_NULL = 1u << 5,
	NEED_VALUE = 1u << 6, /* any JSON value (and its object, array) */
	NEED_INTEGER_NONNEG = 1u << 7,
	NEED_INTEGER_POS = 1u << 8,
	NEED_NUMBER_NONNEG = 1u << 9,
};

struct ref {
	char *ptr;
	char *name;
};

struct conv {
	json_t *root;
	struct sb rules; /* every rule made so far */
	struct sb path;  /* JSON pointer of the schema at hand (without '#') */
	struct ref *refs;
	size_t n_refs, cap_refs;
	unsigned n_names;
	unsigned depth;
	unsigned need;
	struct cm_err *err;
};

static int conv_oom(struct conv *c)
{
	return cm_err_set(c->err, -ENOMEM, "json_schema: out of memory");
}

/* The pointer of the part at hand, as "#/a/b" ("#" for the root). */
static const char *where(struct conv *c)
{
	return c->path.n && c->path.p ? c->path.p : "";
}

static int fail(struct conv *c, int code, const char *fmt, ...) CM_PRINTF(3, 4);
static int fail(struct conv *c, int code, const char *fmt, ...)
{
	char msg[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* a deep pointer keeps its end, which says most */
	const char *w = where(c);
	size_t n = strlen(w);
	return cm_err_set(c->err, code, "json_schema: #%s%s: %s", n > 80 ? "..." : "",
	                  n > 80 ? w + n - 80 : w, msg);
}

/* Enter the member `key` (n bytes) of the part at hand; returns the length
 * to restore with path_pop. JSON pointer escapes: ~ is ~0, / is ~1. */
static size_t path_push(struct conv *c, const char *key, size_t n)
{
	size_t mark = c->path.n;
	sb_putn(&c->path, "/", 1);
	for (size_t i = 0; i < n; i++) {
		if (key[i] == '~')
			sb_putn(&c->path, "~0", 2);
		else if (key[i] == '/')
			sb_putn(&c->path, "~1", 2);
		else
			sb_putn(&c->path, &key[i], 1);
	}
	return mark;
}

static size_t path_push_index(struct conv *c, size_t i)
{
	char buf[24];
	snprintf(buf, sizeof(buf), "%zu", i);
	return path_push(c, buf, strlen(buf));
}

static void path_pop(struct conv *c, size_t mark)
{
	c->path.n = mark;
	if (c->path.p)
		c->path.p[mark] = '\0';
}

/* A fresh rule name from a hint (a property name, a type): lower-case
 * letters and digits, '-' for the rest, and a number that keeps it unique.
 * The shared rules never end in "-<digits>", so none collides with them. */
static char *new_name(struct conv *c, const char *hint)
{
	char base[24];
	size_t n = 0;
	for (const char *p = hint; *p && n < sizeof(base) - 1; p++) {
		char ch = *p;
		if (ch >= 'A' && ch <= 'Z')
			ch = (char)(ch - 'A' + 'a');
		if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')))
			ch = '-';
		if (ch == '-' && (n == 0 || base[n - 1] == '-'))
			continue;
		base[n++] = ch;
	}
	while (n && base[n - 1] == '-')
		n--;
	base[n] = '\0';
	char buf[48];
	snprintf(buf, sizeof(buf), "%s-%u", n ? base : "v", ++c->n_names);
	return cm_strdup(buf);
}

/* Append "name ::= body\n" to the rules. */
static int emit(struct conv *c, const char *name, const struct sb *body)
{
	if (body->oom)
		return conv_oom(c);
	sb_puts(&c->rules, name);
	sb_puts(&c->rules, " ::= ");
	sb_putn(&c->rules, body->p ? body->p : "", body->n);
	sb_puts(&c->rules, "\n");
	if (c->rules.oom)
		return conv_oom(c);
	if (c->rules.n > IPC_SCHEMA_MAX_GBNF)
		return fail(c, -E2BIG, "the grammar grows beyond %zu bytes", IPC_SCHEMA_MAX_GBNF);
	return 0;
}

/* The body in b as a rule named from hint, into *ret_name; b is freed.
 * An rc already nonzero (the body failed) is returned as it is. */
static int emit_named(struct conv *c, int rc, const char *hint, struct sb *b, char **ret_name)
{
	char *name = rc ? NULL : new_name(c, hint);
	if (!rc && !name)
		rc = conv_oom(c);
	if (!rc)
		rc = emit(c, name, b);
	cm_free(b->p);
	if (rc) {
		cm_free(name);
		return rc;
	}
	*ret_name = name;
	return 0;
}

/* `item` repeated lo to hi times (hi < 0: no upper bound), into b. Up to
 * NEST_INLINE optional repeats nest inline, `( x ( x )? )?`; more become
 * rules `<name>-o<k> ::= ( x <name>-o<k-1> )?`, so no parenthesis nests
 * deeper than that whatever the count. */
static int rep(struct conv *c, struct sb *b, const char *item, long lo, long hi, const char *name)
{
	for (long i = 0; i < lo; i++) {
		sb_puts(b, " ");
		sb_puts(b, item);
	}
	if (hi < 0) {
		sb_printf(b, " ( ");
		sb_puts(b, item);
		sb_puts(b, " )*");
		return 0;
	}
	long k = hi - lo;
	if (k <= NEST_INLINE) {
		for (long i = 0; i < k; i++) {
			sb_puts(b, " ( ");
			sb_puts(b, item);
		}
		for (long i = 0; i < k; i++)
			sb_puts(b, " )?");
		return 0;
	}
	for (long j = 1; j <= k; j++) {
		struct sb r = {0};
		sb_puts(&r, "( ");
		sb_puts(&r, item);
		if (j > 1)
			sb_printf(&r, " %s-o%ld", name, j - 1);
		sb_puts(&r, " )?");
		char rn[64];
		snprintf(rn, sizeof(rn), "%s-o%ld", name, j);
		int rc = emit(c, rn, &r);
		cm_free(r.p);
		if (rc)
			return rc;
	}
	sb_printf(b, " %s-o%ld", name, k);
	return 0;
}

/* The shared rules the converted schema uses (`value` uses all of them). */
static int emit_shared(struct conv *c)
{
	struct sb b = {0};
	int rc = 0;
	unsigned need = c->need;
	if (need & NEED_VALUE)
		need |= NEED_WS | NEED_STRING | NEED_NUMBER | NEED_BOOLEAN | NEED_NULL;
	if (need & NEED_NUMBER)
		need |= NEED_INTEGER;
	if (need & NEED_NUMBER_NONNEG)
		need |= NEED_INTEGER_NONNEG;
	if (need & NEED_VALUE) {
		/* value-dN: a value nested N deep; the last level holds no
		 * object or array, so a model cannot open brackets forever */
		for (int d = 0; d < ANY_DEPTH && !rc; d++) {
			char v[24] = "value", o[24] = "object", a[24] = "array", next[24];
			if (d) {
				snprintf(v, sizeof(v), "value-d%d", d);
				snprintf(o, sizeof(o), "object-d%d", d);
				snprintf(a, sizeof(a), "array-d%d", d);
			}
			snprintf(next, sizeof(next), "value-d%d", d + 1);
			b.n = 0;
			sb_printf(&b, "%s | %s | string | number | boolean | null", o, a);
			if ((rc = emit(c, v, &b)))
				break;
			b.n = 0;
			sb_printf(&b, "\"{\" ws ( string \":\" ws %s ( \",\" ws string \":\" ws %s )* ws )? \"}\"",
			          next, next);
			if ((rc = emit(c, o, &b)))
				break;
			b.n = 0;
			sb_printf(&b, "\"[\" ws ( %s ( \",\" ws %s )* ws )? \"]\"", next, next);
			rc = emit(c, a, &b);
		}
		if (!rc) {
			char v[24];
			snprintf(v, sizeof(v), "value-d%d", ANY_DEPTH);
			b.n = 0;
			sb_puts(&b, "string | number | boolean | null");
			rc = emit(c, v, &b);
		}
	}
	if (!rc && (need & NEED_WS)) {
		b.n = 0;
		sb_puts(&b, "( \" \" | \"\\n\"");
		rep(c, &b, "[ \\t]", 0, WS_BLANKS, "ws");
		sb_puts(&b, " )?");
		rc = emit(c, "ws", &b);
	}
	if (!rc && (need & NEED_STRING)) {
		b.n = 0;
		sb_puts(&b, "\"\\\"\" char* \"\\\"\"");
		if (!(rc = emit(c, "string", &b))) {
			b.n = 0;
			sb_puts(&b, "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" "
			            "[0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] )");
			rc = emit(c, "char", &b);
		}
	}
	if (!rc && (need & NEED_INTEGER)) {
		b.n = 0;
		sb_puts(&b, "\"-\"? ( \"0\" | [1-9]");
		rep(c, &b, "[0-9]", 0, INT_DIGITS - 1, "integer");
		sb_puts(&b, " )");
		rc = emit(c, "integer", &b);
	}
	/* minimum 0 and 1: the common bounds (a count, an id) without a sign */
	if (!rc && (need & NEED_INTEGER_NONNEG)) {
		b.n = 0;
		sb_puts(&b, "\"0\" | [1-9]");
		rep(c, &b, "[0-9]", 0, INT_DIGITS - 1, "integer");
		rc = emit(c, "integer-nonneg", &b);
	}
	if (!rc && (need & NEED_INTEGER_POS)) {
		b.n = 0;
		sb_puts(&b, "[1-9]");
		rep(c, &b, "[0-9]", 0, INT_DIGITS - 1, "integer");
		rc = emit(c, "integer-pos", &b);
	}
	for (int k = 0; k < 2 && !rc; k++) {
		if (!(need & (k ? NEED_NUMBER_NONNEG : NEED_NUMBER)))
			continue;
		b.n = 0;
		sb_puts(&b, k ? "integer-nonneg" : "integer");
		sb_puts(&b, " ( \".\" [0-9]");
		rep(c, &b, "[0-9]", 0, FRAC_DIGITS - 1, "number");
		sb_puts(&b, " )? ( [eE] [-+]? [0-9]");
		rep(c, &b, "[0-9]", 0, EXP_DIGITS - 1, "number");
		sb_puts(&b, " )?");
		rc = emit(c, k ? "number-nonneg" : "number", &b);
	}
	if (!rc && (need & NEED_BOOLEAN)) {
		b.n = 0;
		sb_puts(&b, "\"true\" | \"false\"");
		rc = emit(c, "boolean", &b);
	}
	if (!rc && (need & NEED_NULL)) {
		b.n = 0;
		sb_puts(&b, "\"null\"");
		rc = emit(c, "null", &b);
	}
	cm_free(b.p);
	return rc;
}

/* ---- keywords ------------------------------------------------------------- */

/* Keywords that change nothing in what is generated. "format" is among
 * them: it is an annotation unless a validator opts in, and the common
 * ones (date-time, email, uuid) would each need a grammar of their own. */
static const char *const annotations[] = {
    "title",      "description", "$schema",     "$id",    "$comment",    "default", "examples",
    "deprecated", "readOnly",    "writeOnly",   "$defs",  "definitions", "format",
};

enum kw_group { KW_ANY, KW_OBJECT, KW_ARRAY, KW_STRING, KW_NUMERIC };

static const struct {
	const char *name;
	enum kw_group group;
} keywords[] = {
    {"type", KW_ANY},          {"enum", KW_ANY},          {"const", KW_ANY},
    {"$ref", KW_ANY},          {"anyOf", KW_ANY},         {"oneOf", KW_ANY},
    {"properties", KW_OBJECT}, {"required", KW_OBJECT},   {"additionalProperties", KW_OBJECT},
    {"items", KW_ARRAY},       {"minItems", KW_ARRAY},    {"maxItems", KW_ARRAY},
    {"minLength", KW_STRING},  {"maxLength", KW_STRING},
    {"minimum", KW_NUMERIC},   {"exclusiveMinimum", KW_NUMERIC},
};

static bool is_annotation(const char *k)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(annotations); i++)
		if (strcmp(k, annotations[i]) == 0)
			return true;
	return false;
}

static int keyword_index(const char *k)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(keywords); i++)
		if (strcmp(k, keywords[i].name) == 0)
			return (int)i;
	return -1;
}

enum jtype { T_STRING, T_INTEGER, T_NUMBER, T_BOOLEAN, T_NULL, T_OBJECT, T_ARRAY, T_COUNT };
static const char *const type_names[T_COUNT] = {"string", "integer", "number", "boolean",
                                                "null",   "object",  "array"};

static bool value_has_type(json_t *v, int t)
{
	switch (t) {
	case T_STRING:
		return json_is_string(v);
	case T_INTEGER:
		if (json_is_real(v)) {
			double x = json_real_value(v);
			return x == (double)(long long)x;
		}
		return json_is_integer(v);
	case T_NUMBER:
		return json_is_number(v);
	case T_BOOLEAN:
		return json_is_boolean(v);
	case T_NULL:
		return json_is_null(v);
	case T_OBJECT:
		return json_is_object(v);
	case T_ARRAY:
		return json_is_array(v);
	}
	return false;
}

/* A count keyword (minItems, ...): an integer in [0, IPC_SCHEMA_MAX_COUNT]
 * (2.0 is the integer 2 in JSON Schema); absent leaves *ret as it is. */
static int get_count(struct conv *c, json_t *s, const char *kw, long *ret)
{
	json_t *v = json_object_get(s, kw);
	if (!v)
		return 0;
	double x = json_is_number(v) ? json_number_value(v) : -1;
	size_t mark = path_push(c, kw, strlen(kw));
	int rc = 0;
	if (!(x >= 0))
		rc = fail(c, -EINVAL, "'%s' must be a non-negative integer", kw);
	else if (x > IPC_SCHEMA_MAX_COUNT)
		rc = fail(c, -ENOTSUP, "'%s' above %d is not supported", kw, IPC_SCHEMA_MAX_COUNT);
	else if (x != (double)(long)x)
		rc = fail(c, -EINVAL, "'%s' must be a non-negative integer", kw);
	else
		*ret = (long)x;
	path_pop(c, mark);
	return rc;
}

/* ---- schemas -------------------------------------------------------------- */

static int gen(struct conv *c, json_t *s, const char *hint, char **ret_name);

/* The JSON text of a value for a literal: compact, a real in the fewest
 * digits that read back the same, marked as a real ("1.0"). */
static int value_text(struct conv *c, json_t *v, struct sb *b)
{
	if (json_is_real(v)) {
		double x = json_real_value(v);
		char buf[40];
		for (int prec = 15; prec <= 17; prec++) {
			snprintf(buf, sizeof(buf), "%.*g", prec, x);
			if (strtod(buf, NULL) == x)
				break;
		}
		if (!strpbrk(buf, ".eEni"))
			strcat(buf, ".0");
		sb_lit(b, buf, strlen(buf));
		return 0;
	}
	char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
	if (!t)
		return conv_oom(c);
	sb_lit(b, t, strlen(t));
	free(t);
	return 0;
}

/* enum and const: the values as literals, those of the schema's types
 * only when it names types. */
static int gen_enum(struct conv *c, json_t *s, const bool *types, bool any_type, const char *hint,
                    char **ret_name)
{
	json_t *cv = json_object_get(s, "const");
	json_t *ev = json_object_get(s, "enum");
	json_t *one = cv ? json_array() : NULL;
	if (cv && (!one || json_array_append(one, cv))) {
		json_decref(one);
		return conv_oom(c);
	}
	json_t *vals = cv ? one : ev;
	int rc = 0;
	if (!json_is_array(vals) || json_array_size(vals) == 0) {
		size_t mark = path_push(c, "enum", 4);
		rc = fail(c, -EINVAL, "'enum' must be a non-empty array");
		path_pop(c, mark);
		json_decref(one);
		return rc;
	}
	struct sb b = {0};
	size_t i, n = 0;
	json_t *v;
	json_array_foreach (vals, i, v) {
		bool ok = any_type;
		for (int t = 0; t < T_COUNT && !ok; t++)
			ok = types[t] && value_has_type(v, t);
		if (!ok)
			continue;
		if (n++)
			sb_puts(&b, " | ");
		if ((rc = value_text(c, v, &b)))
			break;
	}
	json_decref(one);
	if (!rc && n == 0)
		rc = fail(c, -EINVAL, "no value of '%s' has the schema's type", cv ? "const" : "enum");
	return emit_named(c, rc, hint, &b, ret_name);
}

/* anyOf / oneOf: the alternatives. oneOf's "exactly one" is not enforced:
 * a value the alternatives share passes both ways. */
static int gen_alts(struct conv *c, json_t *s, const char *kw, const char *hint, char **ret_name)
{
	json_t *arr = json_object_get(s, kw);
	size_t mark = path_push(c, kw, strlen(kw));
	int rc = 0;
	struct sb b = {0};
	if (!json_is_array(arr) || json_array_size(arr) == 0) {
		rc = fail(c, -EINVAL, "'%s' must be a non-empty array of schemas", kw);
	} else {
		size_t i;
		json_t *v;
		json_array_foreach (arr, i, v) {
			size_t m2 = path_push_index(c, i);
			char *sub = NULL;
			rc = gen(c, v, hint, &sub);
			path_pop(c, m2);
			if (rc)
				break;
			if (i)
				sb_puts(&b, " | ");
			sb_puts(&b, sub);
			cm_free(sub);
		}
	}
	path_pop(c, mark);
	return emit_named(c, rc, hint, &b, ret_name);
}

/* The value at a JSON pointer ("/a/b", escapes ~0 and ~1) in `root`. */
static json_t *resolve(json_t *root, const char *ptr, struct sb *seg)
{
	json_t *t = root;
	while (*ptr == '/' && t) {
		ptr++;
		seg->n = 0;
		sb_putn(seg, "", 0);
		while (*ptr && *ptr != '/') {
			if (ptr[0] == '~' && (ptr[1] == '0' || ptr[1] == '1')) {
				sb_putn(seg, ptr[1] == '0' ? "~" : "/", 1);
				ptr += 2;
			} else {
				sb_putn(seg, ptr++, 1);
			}
		}
		if (seg->oom)
			return NULL;
		if (json_is_object(t)) {
			t = json_object_getn(t, seg->p, seg->n);
		} else if (json_is_array(t)) {
			char *end;
			unsigned long i = strtoul(seg->p, &end, 10);
			t = seg->n && !*end ? json_array_get(t, i) : NULL;
		} else {
			t = NULL;
		}
	}
	return *ptr ? NULL : t;
}

/* $ref: "#" or "#/<JSON pointer>" into the root document. Each target is
 * one rule, named before its body is made, so recursive schemas work; while
 * it is made, errors name the target's own pointer. */
static int gen_ref(struct conv *c, json_t *s, char **ret_name)
{
	json_t *r = json_object_get(s, "$ref");
	const char *ref = json_is_string(r) ? json_string_value(r) : NULL;
	size_t mark = path_push(c, "$ref", 4);
	int rc = 0;
	if (!ref)
		rc = fail(c, -EINVAL, "'$ref' must be a string");
	else if (ref[0] != '#' || (ref[1] && ref[1] != '/'))
		rc = fail(c, -ENOTSUP,
		          "'%.64s': only references into this document (#/...) are supported", ref);
	if (rc)
		return rc;
	for (size_t i = 0; i < c->n_refs; i++)
		if (strcmp(c->refs[i].ptr, ref) == 0) {
			path_pop(c, mark);
			*ret_name = cm_strdup(c->refs[i].name);
			return *ret_name ? 0 : conv_oom(c);
		}
	struct sb seg = {0};
	json_t *t = resolve(c->root, ref + 1, &seg);
	if (seg.oom || !t) {
		cm_free(seg.p);
		return seg.oom ? conv_oom(c) : fail(c, -EINVAL, "'%.64s' points at nothing", ref);
	}
	path_pop(c, mark);
	/* named after the pointer's last member */
	char hint[32];
	snprintf(hint, sizeof(hint), "%s", seg.n ? seg.p : "root");
	cm_free(seg.p);

	if (c->n_refs >= c->cap_refs) {
		/* the first array is the root's entry alone, not ours to realloc */
		size_t cap = c->n_refs * 2 + 4;
		struct ref *nr = cm_malloc(cap * sizeof(*nr));
		if (!nr)
			return conv_oom(c);
		memcpy(nr, c->refs, c->n_refs * sizeof(*nr));
		if (c->cap_refs)
			cm_free(c->refs);
		c->refs = nr;
		c->cap_refs = cap;
	}
	char *name = new_name(c, hint);
	char *ptr = cm_strdup(ref);
	char *saved = cm_strndup(where(c), c->path.n);
	if (!name || !ptr || !saved) {
		cm_free(name);
		cm_free(ptr);
		cm_free(saved);
		return conv_oom(c);
	}
	c->refs[c->n_refs].ptr = ptr;
	c->refs[c->n_refs].name = name;
	c->n_refs++;

	path_pop(c, 0);
	sb_puts(&c->path, ref + 1);
	char *body = NULL;
	rc = gen(c, t, hint, &body);
	path_pop(c, 0);
	sb_puts(&c->path, saved);
	cm_free(saved);
	if (!rc) {
		struct sb b = {0};
		sb_puts(&b, body);
		rc = emit(c, name, &b);
		cm_free(b.p);
	}
	cm_free(body);
	if (rc)
		return rc;
	*ret_name = cm_strdup(name);
	return *ret_name ? 0 : conv_oom(c);
}

static int gen_string(struct conv *c, json_t *s, const char *hint, char **ret_name)
{
	long lo = 0, hi = -1;
	int rc;
	if ((rc = get_count(c, s, "minLength", &lo)) || (rc = get_count(c, s, "maxLength", &hi)))
		return rc;
	c->need |= NEED_STRING;
	if (lo == 0 && hi < 0) {
		*ret_name = cm_strdup("string");
		return *ret_name ? 0 : conv_oom(c);
	}
	if (hi >= 0 && hi < lo)
		return fail(c, -EINVAL, "'maxLength' is less than 'minLength'");
	char *name = new_name(c, hint);
	if (!name)
		return conv_oom(c);
	struct sb b = {0};
	sb_puts(&b, "\"\\\"\"");
	rc = rep(c, &b, "char", lo, hi, name);
	sb_puts(&b, " \"\\\"\"");
	if (!rc)
		rc = emit(c, name, &b);
	cm_free(b.p);
	if (rc) {
		cm_free(name);
		return rc;
	}
	*ret_name = name;
	return 0;
}

static int gen_array(struct conv *c, json_t *s, const char *hint, char **ret_name)
{
	long lo = 0, hi = -1;
	int rc;
	if ((rc = get_count(c, s, "minItems", &lo)) || (rc = get_count(c, s, "maxItems", &hi)))
		return rc;
	if (hi >= 0 && hi < lo)
		return fail(c, -EINVAL, "'maxItems' is less than 'minItems'");
	json_t *items = json_object_get(s, "items");
	char *item = NULL;
	if (items) {
		size_t mark = path_push(c, "items", 5);
		if (json_is_array(items))
			rc = fail(c, -ENOTSUP, "'items' as an array (tuples) is not supported");
		else
			rc = gen(c, items, hint, &item);
		path_pop(c, mark);
	} else {
		c->need |= NEED_VALUE;
		item = cm_strdup("value");
		rc = item ? 0 : conv_oom(c);
	}
	if (rc)
		return rc;
	c->need |= NEED_WS;
	char *name = new_name(c, hint);
	struct sb b = {0}, next = {0};
	if (!name) {
		cm_free(item);
		return conv_oom(c);
	}
	sb_printf(&next, "\",\" ws %s", item);
	if (next.oom) {
		rc = conv_oom(c);
	} else if (hi == 0) {
		sb_puts(&b, "\"[\" ws \"]\"");
	} else if (lo == 0) {
		sb_printf(&b, "\"[\" ws ( %s", item);
		rc = rep(c, &b, next.p, 0, hi < 0 ? -1 : hi - 1, name);
		sb_puts(&b, " ws )? \"]\"");
	} else {
		sb_printf(&b, "\"[\" ws %s", item);
		rc = rep(c, &b, next.p, lo - 1, hi < 0 ? -1 : hi - 1, name);
		sb_puts(&b, " ws \"]\"");
	}
	if (!rc)
		rc = emit(c, name, &b);
	cm_free(b.p);
	cm_free(next.p);
	cm_free(item);
	if (rc) {
		cm_free(name);
		return rc;
	}
	*ret_name = name;
	return 0;
}

/* An object of listed properties. With prop i of n, value rule v[i]:
 *   <name>-t<i> ::= ( "," ws KV_i )? <name>-t<i+1>   (KV_i required: no ?)
 *   <name>-h<i> ::= KV_i <name>-t<i+1> | <name>-h<i+1> (the second only when i is optional)
 *   <name>     ::= "{" ws <name>-h0 ws "}"            (( <name>-h0 ws )? when all are optional)
 * with KV_i = "\"key\"" ":" ws v[i], and the -t<n> reference left out. */
static int gen_props(struct conv *c, json_t *s, json_t *props, const char *name)
{
	size_t n = json_object_size(props);
	json_t *req = json_object_get(s, "required");
	char **vals = cm_calloc(n ? n : 1, sizeof(*vals));
	bool *required = cm_calloc(n ? n : 1, sizeof(*required));
	struct sb *kv = cm_calloc(n ? n : 1, sizeof(*kv));
	struct sb b = {0};
	int rc = 0;
	if (!vals || !required || !kv) {
		rc = conv_oom(c);
		goto out;
	}
	if (req) {
		size_t mark = path_push(c, "required", 8);
		size_t i;
		json_t *r;
		if (!json_is_array(req))
			rc = fail(c, -EINVAL, "'required' must be an array of strings");
		json_array_foreach (req, i, r) {
			if (rc)
				break;
			if (!json_is_string(r)) {
				rc = fail(c, -EINVAL, "'required' must be an array of strings");
				break;
			}
			size_t j = 0;
			const char *key;
			size_t klen;
			json_t *v;
			bool found = false;
			json_object_keylen_foreach(props, key, klen, v)
			{
				if (klen == json_string_length(r) &&
				    memcmp(key, json_string_value(r), klen) == 0) {
					required[j] = found = true;
					break;
				}
				j++;
			}
			if (!found) {
				size_t m2 = path_push_index(c, i);
				rc = fail(c, -ENOTSUP,
				          "required property '%.64s' is not in 'properties' (only listed "
				          "properties are generated)",
				          json_string_value(r));
				path_pop(c, m2);
			}
		}
		path_pop(c, mark);
		if (rc)
			goto out;
	}
	size_t mark = path_push(c, "properties", 10);
	const char *key;
	size_t klen;
	json_t *v;
	size_t i = 0;
	json_object_keylen_foreach(props, key, klen, v)
	{
		size_t m2 = path_push(c, key, klen);
		char hint[32];
		snprintf(hint, sizeof(hint), "%.*s", (int)CM_MIN(klen, 24), key);
		rc = gen(c, v, hint, &vals[i]);
		if (rc)
			break;
		path_pop(c, m2);
		json_t *js = json_stringn(key, klen);
		char *kt = js ? json_dumps(js, JSON_ENCODE_ANY) : NULL;
		json_decref(js);
		if (!kt) {
			rc = conv_oom(c);
			break;
		}
		sb_lit(&kv[i], kt, strlen(kt));
		free(kt);
		sb_printf(&kv[i], " \":\" ws %s", vals[i]);
		if (kv[i].oom) {
			rc = conv_oom(c);
			break;
		}
		i++;
	}
	if (rc)
		goto out;
	path_pop(c, mark);
	for (size_t k = n; k-- > 0 && !rc;) {
		char rn[64];
		b.n = 0;
		if (required[k])
			sb_printf(&b, "\",\" ws %s", kv[k].p);
		else
			sb_printf(&b, "( \",\" ws %s )?", kv[k].p);
		if (k + 1 < n)
			sb_printf(&b, " %s-t%zu", name, k + 1);
		snprintf(rn, sizeof(rn), "%s-t%zu", name, k);
		if (k > 0) /* t0 is never used: the first property has no comma */
			rc = emit(c, rn, &b);
		if (rc)
			break;
		b.n = 0;
		sb_puts(&b, kv[k].p);
		if (k + 1 < n)
			sb_printf(&b, " %s-t%zu", name, k + 1);
		if (!required[k] && k + 1 < n)
			sb_printf(&b, " | %s-h%zu", name, k + 1);
		snprintf(rn, sizeof(rn), "%s-h%zu", name, k);
		rc = emit(c, rn, &b);
	}
	if (rc)
		goto out;
	bool any_required = false;
	for (size_t k = 0; k < n; k++)
		any_required |= required[k];
	b.n = 0;
	if (n == 0)
		sb_puts(&b, "\"{\" ws \"}\"");
	else if (any_required)
		sb_printf(&b, "\"{\" ws %s-h0 ws \"}\"", name);
	else
		sb_printf(&b, "\"{\" ws ( %s-h0 ws )? \"}\"", name);
	rc = emit(c, name, &b);
out:
	for (size_t k = 0; vals && kv && k < n; k++) {
		cm_free(vals[k]);
		cm_free(kv[k].p);
	}
	cm_free(vals);
	cm_free(required);
	cm_free(kv);
	cm_free(b.p);
	return rc;
}

static int gen_object(struct conv *c, json_t *s, const char *hint, char **ret_name)
{
	json_t *props = json_object_get(s, "properties");
	json_t *addl = json_object_get(s, "additionalProperties");
	const char *bad = NULL;
	int code = -ENOTSUP;
	if (addl && !json_is_boolean(addl) && !(json_is_object(addl) && json_object_size(addl) == 0))
		bad = "additionalProperties";
	else if (props && !json_is_object(props))
		bad = "properties", code = -EINVAL;
	else if (!props && json_object_get(s, "required"))
		bad = "required";
	if (bad) {
		size_t mark = path_push(c, bad, strlen(bad));
		int rc = fail(c, code,
		              code == -EINVAL ? "'properties' must be an object"
		              : bad[0] == 'a' ? "'additionalProperties' as a schema is not supported"
		                              : "'required' without 'properties' is not supported");
		path_pop(c, mark);
		return rc;
	}
	c->need |= NEED_WS;
	if (!props && !json_is_false(addl)) {
		c->need |= NEED_VALUE; /* no properties listed: any object */
		*ret_name = cm_strdup("object");
		return *ret_name ? 0 : conv_oom(c);
	}
	char *name = new_name(c, hint);
	if (!name)
		return conv_oom(c);
	int rc;
	if (props) {
		rc = gen_props(c, s, props, name);
	} else {
		struct sb b = {0};
		sb_puts(&b, "\"{\" ws \"}\"");
		rc = emit(c, name, &b);
		cm_free(b.p);
	}
	if (rc) {
		cm_free(name);
		return rc;
	}
	*ret_name = name;
	return 0;
}

/* integer and number, with the lower bounds the shared rules have:
 * integers from 0 or from 1, numbers from 0; other bounds are refused. */
static int gen_numeric(struct conv *c, json_t *s, int t, char **ret_name)
{
	json_t *mn = json_object_get(s, "minimum");
	json_t *xm = json_object_get(s, "exclusiveMinimum");
	const char *kw = mn ? "minimum" : "exclusiveMinimum";
	json_t *v = mn ? mn : xm;
	const char *name = t == T_INTEGER ? "integer" : "number";
	unsigned need = t == T_INTEGER ? NEED_INTEGER : NEED_NUMBER;
	if (v) {
		size_t mark = path_push(c, kw, strlen(kw));
		int rc = 0;
		double x = json_is_number(v) ? json_number_value(v) : NAN;
		/* the least integer allowed */
		double lo = mn ? ceil(x) : floor(x) + 1;
		if (mn && xm)
			rc = fail(c, -ENOTSUP, "'minimum' beside 'exclusiveMinimum' is not supported");
		else if (!json_is_number(v))
			rc = fail(c, -EINVAL, "'%s' must be a number", kw);
		else if (t == T_INTEGER && lo == 0)
			name = "integer-nonneg", need = NEED_INTEGER_NONNEG;
		else if (t == T_INTEGER && lo == 1)
			name = "integer-pos", need = NEED_INTEGER_POS;
		else if (t == T_NUMBER && mn && x == 0)
			name = "number-nonneg", need = NEED_NUMBER_NONNEG;
		else
			rc = fail(c, -ENOTSUP, "'%s' %g is not supported (%s)", kw, x,
			          t == T_INTEGER ? "integers: minimum 0 or 1" : "numbers: minimum 0");
		path_pop(c, mark);
		if (rc)
			return rc;
	}
	c->need |= need;
	*ret_name = cm_strdup(name);
	return *ret_name ? 0 : conv_oom(c);
}

static int gen_type(struct conv *c, json_t *s, int t, const char *hint, char **ret_name)
{
	switch (t) {
	case T_STRING:
		return gen_string(c, s, hint, ret_name);
	case T_OBJECT:
		return gen_object(c, s, hint, ret_name);
	case T_ARRAY:
		return gen_array(c, s, hint, ret_name);
	case T_INTEGER:
	case T_NUMBER:
		return gen_numeric(c, s, t, ret_name);
	case T_BOOLEAN:
		c->need |= NEED_BOOLEAN;
		break;
	case T_NULL:
		c->need |= NEED_NULL;
		break;
	}
	*ret_name = cm_strdup(type_names[t]);
	return *ret_name ? 0 : conv_oom(c);
}

/* The schema's types from "type" (a name or an array of names). */
static int read_types(struct conv *c, json_t *tv, bool *types)
{
	size_t mark = path_push(c, "type", 4);
	int rc = 0;
	json_t *one = json_is_string(tv) ? tv : NULL;
	size_t n = one ? 1 : json_is_array(tv) ? json_array_size(tv) : 0;
	if (n == 0)
		rc = fail(c, -EINVAL, "'type' must be a type name or a non-empty array of them");
	for (size_t i = 0; i < n && !rc; i++) {
		json_t *e = one ? one : json_array_get(tv, i);
		int t = T_COUNT;
		if (json_is_string(e))
			for (t = 0; t < T_COUNT; t++)
				if (strcmp(json_string_value(e), type_names[t]) == 0)
					break;
		if (t == T_COUNT)
			rc = fail(c, -EINVAL, "unknown type '%.32s'",
			          json_is_string(e) ? json_string_value(e) : "(not a string)");
		else
			types[t] = true;
	}
	path_pop(c, mark);
	return rc;
}

static int gen(struct conv *c, json_t *s, const char *hint, char **ret_name)
{
	int rc = 0;
	if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
		c->need |= NEED_VALUE;
		*ret_name = cm_strdup("value");
		return *ret_name ? 0 : conv_oom(c);
	}
	if (json_is_false(s))
		return fail(c, -ENOTSUP, "the schema false allows no value");
	if (!json_is_object(s))
		return fail(c, -EINVAL, "a schema must be an object or a boolean");
	if (c->depth >= IPC_SCHEMA_MAX_DEPTH)
		return fail(c, -ENOTSUP, "schemas nested deeper than %d are not supported",
		            IPC_SCHEMA_MAX_DEPTH);

	/* every keyword must be one we generate or an annotation */
	bool group[KW_NUMERIC + 1] = {false};
	int n_struct = 0;
	const char *key;
	json_t *v;
	json_object_foreach (s, key, v) {
		int k = keyword_index(key);
		if (k < 0 && is_annotation(key))
			continue;
		if (k < 0) {
			size_t mark = path_push(c, key, strlen(key));
			rc = fail(c, -ENOTSUP, "keyword '%.48s' is not supported", key);
			path_pop(c, mark);
			return rc;
		}
		group[keywords[k].group] = true;
		if (strcmp(key, "type") != 0)
			n_struct++;
	}
	json_t *ref = json_object_get(s, "$ref");
	json_t *any_of = json_object_get(s, "anyOf");
	json_t *one_of = json_object_get(s, "oneOf");
	json_t *en = json_object_get(s, "enum");
	json_t *cn = json_object_get(s, "const");
	const char *alone = ref ? "$ref" : any_of ? "anyOf" : one_of ? "oneOf" : NULL;
	if (alone && (n_struct > 1 || json_object_get(s, "type")))
		return fail(c, -ENOTSUP, "'%s' beside other keywords (but annotations) is not supported",
		            alone);
	if (en && cn)
		return fail(c, -ENOTSUP, "'enum' beside 'const' is not supported");

	c->depth++;
	if (ref) {
		rc = gen_ref(c, s, ret_name);
		c->depth--;
		return rc;
	}
	if (alone) {
		rc = gen_alts(c, s, alone, hint, ret_name);
		c->depth--;
		return rc;
	}

	bool types[T_COUNT] = {false};
	bool has_type = json_object_get(s, "type") != NULL;
	if (has_type && (rc = read_types(c, json_object_get(s, "type"), types)))
		goto out;
	if (en || cn) {
		if (group[KW_OBJECT] || group[KW_ARRAY] || group[KW_STRING] || group[KW_NUMERIC]) {
			rc = fail(c, -ENOTSUP, "'%s' beside keywords of a type is not supported",
			          en ? "enum" : "const");
			goto out;
		}
		rc = gen_enum(c, s, types, !has_type, hint, ret_name);
		goto out;
	}
	if (!has_type) {
		/* the type its keywords imply */
		int ng = group[KW_OBJECT] + group[KW_ARRAY] + group[KW_STRING] + group[KW_NUMERIC];
		if (ng > 1) {
			rc = fail(c, -ENOTSUP, "keywords of several types without 'type'");
			goto out;
		}
		if (ng == 0) {
			c->need |= NEED_VALUE;
			*ret_name = cm_strdup("value");
			rc = *ret_name ? 0 : conv_oom(c);
			goto out;
		}
		types[group[KW_OBJECT]   ? T_OBJECT
		      : group[KW_ARRAY]  ? T_ARRAY
		      : group[KW_STRING] ? T_STRING
		                         : T_NUMBER] = true;
	}
	static const struct {
		enum kw_group g;
		int t;
		const char *what;
	} owner[] = {{KW_OBJECT, T_OBJECT, "object"},
	             {KW_ARRAY, T_ARRAY, "array"},
	             {KW_STRING, T_STRING, "string"}};
	for (size_t i = 0; i < CM_ARRAY_LEN(owner); i++)
		if (group[owner[i].g] && !types[owner[i].t]) {
			rc = fail(c, -ENOTSUP, "keywords of type %s on a schema of other types",
			          owner[i].what);
			goto out;
		}
	if (group[KW_NUMERIC] && !types[T_INTEGER] && !types[T_NUMBER]) {
		rc = fail(c, -ENOTSUP, "keywords of numbers on a schema of other types");
		goto out;
	}
	if (types[T_NUMBER])
		types[T_INTEGER] = false; /* an integer is a number already */
	int nt = 0, first = -1;
	for (int t = 0; t < T_COUNT; t++)
		if (types[t]) {
			nt++;
			if (first < 0)
				first = t;
		}
	if (nt == 1) {
		rc = gen_type(c, s, first, hint, ret_name);
		goto out;
	}
	struct sb b = {0};
	for (int t = 0; t < T_COUNT && !rc; t++) {
		if (!types[t])
			continue;
		char *sub = NULL;
		rc = gen_type(c, s, t, hint, &sub);
		if (rc)
			break;
		if (b.n)
			sb_puts(&b, " | ");
		sb_puts(&b, sub);
		cm_free(sub);
	}
	rc = emit_named(c, rc, hint, &b, ret_name);
out:
	c->depth--;
	return rc;
}

int ipc_json_schema_to_gbnf(const char *schema_json, size_t len, char **ret_gbnf,
                            struct cm_err *err)
{
	*ret_gbnf = NULL;
	json_error_t jerr;
	json_t *root = json_loadb(schema_json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
	if (!root)
		return cm_err_set(err, -EINVAL, "json_schema: invalid JSON at byte %d: %s",
		                  jerr.position, jerr.text);
	/* "#" names the root rule itself, for schemas that refer to it */
	struct ref self = {"#", "root"};
	struct conv c = {.root = root, .err = err, .refs = &self, .n_refs = 1, .cap_refs = 0};
	char *top = NULL;
	int rc = gen(&c, root, "root", &top);
	if (!rc)
		rc = emit_shared(&c);
	struct sb out = {0};
	if (!rc) {
		sb_printf(&out, "root ::= %s\n", top);
		sb_putn(&out, c.rules.p, c.rules.n);
		if (out.oom)
			rc = conv_oom(&c);
	}
	cm_free(top);
	for (size_t i = 1; i < c.n_refs; i++) {
		cm_free(c.refs[i].ptr);
		cm_free(c.refs[i].name);
	}
	if (c.refs != &self)
		cm_free(c.refs);
	cm_free(c.rules.p);
	cm_free(c.path.p);
	json_decref(root);
	if (rc) {
		cm_free(out.p);
		return rc;
	}
	*ret_gbnf = out.p;
	return 0;
}

/* ---- JSON mode ------------------------------------------------------------ */

static pthread_mutex_t object_lock = PTHREAD_MUTEX_INITIALIZER;
static char *object_gbnf; /* made once, kept for the process's life */

const char *ipc_json_object_gbnf(void)
{
	static const char schema[] = "{\"type\":\"object\"}";
	pthread_mutex_lock(&object_lock);
	if (!object_gbnf &&
	    ipc_json_schema_to_gbnf(schema, sizeof(schema) - 1, &object_gbnf, NULL) != 0)
		object_gbnf = NULL; /* out of memory: NULL now, another try next time */
	const char *g = object_gbnf;
	pthread_mutex_unlock(&object_lock);
	return g;
}
