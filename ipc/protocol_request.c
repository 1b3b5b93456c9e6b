/* ipc/protocol_request.c: requests, parsed, defaulted and encoded by walking
 * the field table (protocol_fields.c). Nothing here names a field but the
 * envelope's `v` and `op`: which fields an op takes, their types, ranges,
 * defaults and the order they are checked and written all come from the
 * table's rows. */
#include "ipc/protocol_impl.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- checks --------------------------------------------------------------- */

/* Every key of the request must be a field of its op (a row that accepts
 * it), so that a typo never falls back to a default. */
static int check_fields(json_t *obj, enum ipc_op op, struct cm_err *err)
{
	const char *key;
	size_t klen;
	json_t *val;
	json_object_keylen_foreach(obj, key, klen, val)
	{
		bool ok = false;
		for (size_t i = 0; i < ipc_n_fields && !ok; i++) {
			const struct ipc_field *f = &ipc_fields[i];
			ok = strlen(f->name) == klen && memcmp(f->name, key, klen) == 0 &&
			     ipc_field_accepts(f, op);
		}
		if (!ok) {
			char buf[48];
			return ipc_perr(
			    err, IPC_ERR_INVALID_FIELD, "unknown field '%s' for op '%s'",
			    ipc_key_for_msg(key, klen, buf, sizeof(buf)), ipc_op_name(op));
		}
	}
	return 0;
}

/* ---- typed getters: a present value `v` into the member of `f` ------------ */

/* A text without NUL, at most its limit as JSON (ipc_json_text_bytes). */
static int get_text(struct ipc_pctx *c, const struct ipc_field *f, json_t *v, struct ipc_request *r)
{
	if (!json_is_string(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be a string",
		                f->name);
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);
	size_t nj = ipc_json_text_bytes(s, n);
	size_t max_len = ipc_field_text_max(f, c->lim);
	if (nj > max_len) {
		if (nj == n)
			return ipc_perr(c->err, f->too_long,
			                "field '%s' is %zu bytes, more than %zu", f->name, n,
			                max_len);
		return ipc_perr(c->err, f->too_long,
		                "field '%s' is %zu bytes as JSON (escapes count), more than %zu",
		                f->name, nj, max_len);
	}
	if (memchr(s, '\0', n))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' contains a NUL character", f->name);
	char *d = ipc_arena_strndup(c->arena, s, n);
	if (!d)
		return ipc_parse_oom(c);
	const char *p = d;
	memcpy((char *)r + f->off, &p, sizeof(p));
	memcpy((char *)r + f->len_off, &n, sizeof(n));
	return 0;
}

static int get_int(struct ipc_pctx *c, const struct ipc_field *f, json_t *v, struct ipc_request *r)
{
	if (!json_is_integer(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be an integer",
		                f->name);
	long long x = json_integer_value(v);
	long long max = ipc_field_max(f, c->lim);
	if (x < f->min || x > max)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' is %lld, not in [%lld, %lld]", f->name, x, f->min, max);
	ipc_field_set_int(f, r, x);
	return 0;
}

/* A number (integer or real) stored as a float, in [fmin, fmax], or
 * (fmin, fmax] with IPC_F_MIN_OPEN. The bounds apply to the float as stored,
 * and a nonzero value that a float holds only as 0 or a denormal is refused:
 * 1e-300 would pass (0, 10] as a double and reach the sampler as 0. */
static int get_num(struct ipc_pctx *c, const struct ipc_field *f, json_t *v, struct ipc_request *r)
{
	if (!json_is_number(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be a number",
		                f->name);
	float min = f->fmin, max = f->fmax;
	bool min_open = (f->flags & IPC_F_MIN_OPEN) != 0;
	double x = json_number_value(v);
	/* min and max are floats, so a double between them rounds to a float
	 * between them: only underflow and an open bound need the float */
	float fl = isfinite(x) && x >= min && x <= max ? (float)x : NAN;
	if (!isnan(fl) && x != 0 && fabsf(fl) < FLT_MIN)
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD,
		                "field '%s' is %g, too close to 0 for a float: nonzero values must "
		                "be at least %g in magnitude (range %c%g, %g])",
		                f->name, x, (double)FLT_MIN, min_open ? '(' : '[', (double)min,
		                (double)max);
	if (isnan(fl) || (min_open && fl <= min))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' is %g, not in %c%g, %g]",
		                f->name, x, min_open ? '(' : '[', (double)min, (double)max);
	ipc_field_set_num(f, r, fl);
	return 0;
}

static int get_bool(struct ipc_pctx *c, const struct ipc_field *f, json_t *v, struct ipc_request *r)
{
	if (!json_is_boolean(v))
		return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "field '%s' must be true or false",
		                f->name);
	ipc_field_set_bool(f, r, json_is_true(v));
	return 0;
}

/* ---- parsing -------------------------------------------------------------- */

/* The fields of r->op, in table order; the first bad one is the error. */
static int parse_fields(struct ipc_pctx *c, json_t *root, struct ipc_request *r)
{
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		if (f->type == IPC_FT_ENVELOPE || !ipc_field_accepts(f, r->op))
			continue;
		json_t *v = json_object_get(root, f->name);
		if (!v) {
			if (f->flags & IPC_F_REQUIRED)
				return ipc_perr(c->err, IPC_ERR_INVALID_FIELD, "missing field '%s'",
				                f->name);
			continue;
		}
		int rc = 0;
		switch (f->type) {
		case IPC_FT_INT:
			rc = get_int(c, f, v, r);
			break;
		case IPC_FT_NUM:
			rc = get_num(c, f, v, r);
			break;
		case IPC_FT_BOOL:
			rc = get_bool(c, f, v, r);
			break;
		case IPC_FT_TEXT:
			rc = get_text(c, f, v, r);
			break;
		case IPC_FT_CUSTOM:
			rc = f->kind->parse(c, f, v, r);
			break;
		case IPC_FT_ENVELOPE:
			break;
		}
		if (rc)
			return rc;
		r->sampling.set |= f->set_bit;
	}
	return 0;
}

/* The envelope (`v`, then `op`), the unknown-field check, then the fields. */
static int parse_body(struct ipc_pctx *c, json_t *root, struct ipc_request **ret_req)
{
	struct cm_err *err = c->err;
	int rc;

	if (!json_is_object(root))
		return ipc_perr(err, IPC_ERR_INVALID_JSON, "the message must be a JSON object");

	json_t *v = json_object_get(root, "v");
	if (v) {
		if (!json_is_integer(v))
			return ipc_perr(err, IPC_ERR_INVALID_FIELD, "field 'v' must be an integer");
		if (json_integer_value(v) != IPC_PROTOCOL_VERSION)
			return ipc_perr(
			    err, IPC_ERR_UNSUPPORTED_VERSION,
			    "protocol version %lld is not supported (this daemon speaks %d)",
			    json_integer_value(v), IPC_PROTOCOL_VERSION);
	}
	json_t *jop = json_object_get(root, "op");
	if (!jop)
		return ipc_perr(err, IPC_ERR_INVALID_FIELD, "missing field 'op'");
	if (!json_is_string(jop))
		return ipc_perr(err, IPC_ERR_INVALID_FIELD, "field 'op' must be a string");
	int op = ipc_op_index(json_string_value(jop), json_string_length(jop));
	if (op <= 0) {
		char buf[48];
		return ipc_perr(err, IPC_ERR_UNKNOWN_OP, "unknown op '%s'",
		                ipc_key_for_msg(json_string_value(jop), json_string_length(jop),
		                                buf, sizeof(buf)));
	}
	c->op = (enum ipc_op)op;
	if ((rc = check_fields(root, (enum ipc_op)op, err)))
		return rc;

	struct ipc_request *r = ipc_arena_alloc(c->arena, sizeof(*r));
	if (!r)
		return ipc_parse_oom(c);
	ipc_request_init(r, (enum ipc_op)op);
	if ((rc = parse_fields(c, root, r)))
		return rc;
	*ret_req = r;
	return 0;
}

int ipc_request_parse(const char *json, size_t len, const struct ipc_limits *lim,
                      struct ipc_request **ret_req, struct cm_err *err)
{
	return ipc_request_parse_op(json, len, lim, ret_req, NULL, err);
}

int ipc_request_parse_op(const char *json, size_t len, const struct ipc_limits *lim_in,
                         struct ipc_request **ret_req, enum ipc_op *ret_op, struct cm_err *err)
{
	struct ipc_limits lim = {0};
	if (lim_in)
		lim = *lim_in;
	ipc_limits_fill(&lim);
	*ret_req = NULL;
	if (ret_op)
		*ret_op = IPC_OP_NONE;

	if (len > lim.max_msg_bytes)
		return ipc_perr(err, IPC_ERR_TOO_LARGE, "message of %zu bytes, more than %zu", len,
		                lim.max_msg_bytes);
	if (len == 0 || !json)
		return ipc_perr(err, IPC_ERR_INVALID_JSON, "empty message");
	int rc = ipc_json_prescan(json, len, &lim, err);
	if (rc)
		return rc;

	json_error_t jerr;
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
	if (!root)
		return ipc_perr(err, IPC_ERR_INVALID_JSON, "invalid JSON at byte %d: %s",
		                jerr.position, jerr.text);

	struct ipc_arena *arena = ipc_arena_new();
	if (!arena) {
		json_decref(root);
		return ipc_perr(err, IPC_ERR_INTERNAL, "out of memory while parsing the request");
	}
	struct ipc_pctx c = {.arena = arena, .lim = &lim, .err = err};
	struct ipc_request *r = NULL;
	rc = parse_body(&c, root, &r);
	json_decref(root);
	if (ret_op)
		*ret_op = c.op;
	if (rc) {
		ipc_arena_free(arena);
		return rc;
	}
	r->arena_ = arena;
	*ret_req = r;
	return 0;
}

void ipc_request_free(struct ipc_request *req)
{
	if (req)
		ipc_arena_free(req->arena_); /* the request itself lives in its arena */
}

/* Every row's default, whatever the op (so a struct for one op still holds
 * the protocol defaults elsewhere, as encoders expect). */
void ipc_request_init(struct ipc_request *r, enum ipc_op op)
{
	memset(r, 0, sizeof(*r));
	r->op = op;
	r->version = IPC_PROTOCOL_VERSION;
	for (size_t i = 0; i < ipc_n_fields; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		switch (f->type) {
		case IPC_FT_INT:
			ipc_field_set_int(f, r, (long long)f->def);
			break;
		case IPC_FT_NUM:
			ipc_field_set_num(f, r, (float)f->def);
			break;
		case IPC_FT_BOOL:
			ipc_field_set_bool(f, r, f->def != 0);
			break;
		case IPC_FT_ENVELOPE:
		case IPC_FT_TEXT:
		case IPC_FT_CUSTOM:
			break;
		}
	}
}

/* ---- encoding ------------------------------------------------------------- */

/* The JSON value of field `f` of `r`, or 0 with *ret NULL to leave it out:
 * a field is written when required or IPC_F_ALWAYS, when flagged in
 * sampling.set, or when it differs from its default (IPC_F_SET_ONLY: only
 * when flagged). -EINVAL (with `err`) for a value the parser would read as
 * another, -ENOMEM when a JSON value cannot be made. */
static int encode_field(const struct ipc_field *f, const struct ipc_request *r, json_t **ret,
                        struct cm_err *err)
{
	bool flagged = f->set_bit && (r->sampling.set & f->set_bit);
	bool always = (f->flags & (IPC_F_REQUIRED | IPC_F_ALWAYS)) || flagged;
	bool by_value = !(f->flags & IPC_F_SET_ONLY);
	*ret = NULL;
	switch (f->type) {
	case IPC_FT_INT: {
		long long x = ipc_field_get_int(f, r);
		if (!always && !(by_value && x != (long long)f->def))
			return 0;
		/* JSON integers are signed 64-bit here and in the parser: refuse
		 * what would change sign rather than send another value */
		unsigned long long u = ipc_field_get_uint(f, r);
		if (f->is_unsigned && u > (unsigned long long)LLONG_MAX)
			return cm_err_set(err, -EINVAL, "ipc: %s %llu is more than 2^63-1", f->name,
			                  u);
		*ret = json_integer((json_int_t)x);
		break;
	}
	case IPC_FT_NUM: {
		float x = ipc_field_get_num(f, r);
		if (!always && !(by_value && x != (float)f->def))
			return 0;
		*ret = ipc_jfloat(x);
		break;
	}
	case IPC_FT_BOOL: {
		bool x = ipc_field_get_bool(f, r);
		if (!always && !(by_value && x != (f->def != 0)))
			return 0;
		*ret = json_boolean(x);
		break;
	}
	case IPC_FT_TEXT: {
		const char *s;
		size_t n;
		memcpy(&s, (const char *)r + f->off, sizeof(s));
		memcpy(&n, (const char *)r + f->len_off, sizeof(n));
		if (!always && !(by_value && s))
			return 0;
		*ret = ipc_jstr(s, n);
		break;
	}
	case IPC_FT_CUSTOM:
		return f->kind->encode(f, r, ret);
	case IPC_FT_ENVELOPE:
		return 0;
	}
	return *ret ? 0 : -ENOMEM;
}

int ipc_request_encode(const struct ipc_request *r, char **ret_json, size_t *ret_len,
                       struct cm_err *err)
{
	const char *opname = ipc_op_name(r->op);
	if (!opname)
		return cm_err_set(err, -EINVAL, "ipc: cannot encode a request with op %d", r->op);
	json_t *o = json_object();
	if (!o)
		return cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	bool ok = true;
	int rc = 0;
	ipc_jset(o, "v", json_integer(IPC_PROTOCOL_VERSION), &ok);
	ipc_jset(o, "op", json_string(opname), &ok);
	for (size_t i = 0; i < ipc_n_fields && ok && !rc; i++) {
		const struct ipc_field *f = &ipc_fields[i];
		json_t *val = NULL;
		if (!ipc_field_accepts(f, r->op))
			continue;
		rc = encode_field(f, r, &val, err);
		if (val)
			ipc_jset(o, f->name, val, &ok);
	}
	if (rc == -ENOMEM)
		ok = false;
	if (!ok)
		rc = cm_err_set(err, -ENOMEM, "ipc: out of memory encoding JSON");
	else if (!rc)
		rc = ipc_jdump(o, ret_json, ret_len, err);
	json_decref(o);
	return rc;
}
