/* engine/gguf.c: GGUF container reader (docs: gguf-formats.md §1); the
 * writer is gguf_write.c.
 *
 * The whole file is untrusted input. Parsing is a single forward pass
 * over the header, the kv records and the tensor-info records; every field is
 * read through rd_need(), which checks the bytes are present, and every count
 * or length is bounded by the bytes left in the file before it is used, so no
 * later step can allocate or loop more than the file size allows. After the
 * pass come the cross-record checks: duplicate keys and names (through the
 * hash indexes that also serve lookups), general.alignment, tensor data
 * inside the file and tensors not overlapping. Once gguf_open() succeeds,
 * accessors trust the parsed structures and do no further bounds checks.
 *
 * Messages name what and where: "gguf: offset 24: kv 3: key length ... ".
 * Names and keys taken from the file are escaped (escape_str) before they are
 * put in a message, so a message is always one printable line. */
#include "engine/gguf.h"
#include "engine/kernels/formats.h"

#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Smallest possible records, used to bound the counts in the header.
 * kv: key length, a one-byte key (empty keys are rejected), type, a
 * one-byte value. tensor info: name length, a one-byte name, n_dims, one
 * dimension, type, offset. */
#define MIN_KV_RECORD (8 + 1 + 4 + 1)
#define MIN_TENSOR_RECORD (8 + 1 + 4 + 8 + 4 + 8)

/* Room for a key or name quoted in a message (escaped, maybe truncated). */
#define ESC_MAX 96

/* ---- little-endian loads ------------------------------------------------ */

static inline uint16_t ld16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ld64(const uint8_t *p)
{
	return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

/* ---- value types ------------------------------------------------------------ */

static const char *const vtype_names[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = "UINT8",     [GGUF_TYPE_INT8] = "INT8",     [GGUF_TYPE_UINT16] = "UINT16",
    [GGUF_TYPE_INT16] = "INT16",     [GGUF_TYPE_UINT32] = "UINT32", [GGUF_TYPE_INT32] = "INT32",
    [GGUF_TYPE_FLOAT32] = "FLOAT32", [GGUF_TYPE_BOOL] = "BOOL",     [GGUF_TYPE_STRING] = "STRING",
    [GGUF_TYPE_ARRAY] = "ARRAY",     [GGUF_TYPE_UINT64] = "UINT64", [GGUF_TYPE_INT64] = "INT64",
    [GGUF_TYPE_FLOAT64] = "FLOAT64",
};

static const uint8_t vtype_sizes[GGUF_TYPE_COUNT] = {
    [GGUF_TYPE_UINT8] = 1,   [GGUF_TYPE_INT8] = 1,  [GGUF_TYPE_UINT16] = 2,  [GGUF_TYPE_INT16] = 2,
    [GGUF_TYPE_UINT32] = 4,  [GGUF_TYPE_INT32] = 4, [GGUF_TYPE_FLOAT32] = 4, [GGUF_TYPE_BOOL] = 1,
    [GGUF_TYPE_STRING] = 0,  [GGUF_TYPE_ARRAY] = 0, [GGUF_TYPE_UINT64] = 8,  [GGUF_TYPE_INT64] = 8,
    [GGUF_TYPE_FLOAT64] = 8,
};

const char *gguf_vtype_name(enum gguf_vtype t)
{
	return (unsigned)t < GGUF_TYPE_COUNT ? vtype_names[t] : "?";
}

size_t gguf_vtype_size(enum gguf_vtype t)
{
	return (unsigned)t < GGUF_TYPE_COUNT ? vtype_sizes[t] : 0;
}

static bool vtype_is_uint(enum gguf_vtype t)
{
	return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_UINT32 ||
	       t == GGUF_TYPE_UINT64;
}

static bool vtype_is_sint(enum gguf_vtype t)
{
	return t == GGUF_TYPE_INT8 || t == GGUF_TYPE_INT16 || t == GGUF_TYPE_INT32 ||
	       t == GGUF_TYPE_INT64;
}

bool gguf_str_eq(struct gguf_str s, const char *c)
{
	size_t n = strlen(c);
	return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* Copy at most ESC_MAX-1 bytes of a printable rendering of p[0..len) into
 * buf: printable ASCII as is, everything else as \xNN, "..." when cut. */
static const char *escape_str(char buf[ESC_MAX], const void *p, uint64_t len)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *s = p;
	size_t o = 0;
	for (uint64_t i = 0; i < len; i++) {
		uint8_t c = s[i];
		size_t need = (c >= 0x20 && c < 0x7f && c != '\\') ? 1 : 4;
		if (o + need > ESC_MAX - 4) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (need == 1) {
			buf[o++] = (char)c;
		} else {
			buf[o++] = '\\';
			buf[o++] = 'x';
			buf[o++] = hex[c >> 4];
			buf[o++] = hex[c & 15];
		}
	}
	buf[o] = '\0';
	return buf;
}

/* A tensor name (from the file: may hold any byte but NUL) for a message. */
static const char *esc_name(char buf[ESC_MAX], const char *name)
{
	return escape_str(buf, name, strlen(name));
}

/* ---- hash indexes ----------------------------------------------------------- */

/* Open addressing with linear probing over FNV-1a hashes. Slots hold an
 * element index + 1, 0 meaning empty; capacity is a power of two at least
 * twice the element count, so probes always reach an empty slot. */
struct gguf_index {
	uint64_t kv_mask;
	uint64_t *kv_slots;
	uint64_t t_mask;
	uint64_t *t_slots;
};

static uint64_t fnv1a(const void *p, size_t n)
{
	const uint8_t *s = p;
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++) {
		h ^= s[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static int index_alloc(uint64_t n, uint64_t **ret_slots, uint64_t *ret_mask)
{
	uint64_t cap = 1;
	while (cap < 2 * n) /* n is bounded by the file size: no overflow */
		cap <<= 1;
	if (cap > SIZE_MAX / sizeof(uint64_t))
		return -ENOMEM;
	*ret_slots = cm_calloc((size_t)cap, sizeof(uint64_t));
	if (!*ret_slots)
		return -ENOMEM;
	*ret_mask = cap - 1;
	return 0;
}

static void index_free(struct gguf_index *ix)
{
	if (!ix)
		return;
	cm_free(ix->kv_slots);
	cm_free(ix->t_slots);
	cm_free(ix);
}

static const struct gguf_kv *kv_lookup(const struct gguf_file *f, const char *key, size_t len)
{
	const struct gguf_index *ix = f->index;
	if (!ix)
		return NULL;
	for (uint64_t i = fnv1a(key, len) & ix->kv_mask;; i = (i + 1) & ix->kv_mask) {
		uint64_t s = ix->kv_slots[i];
		if (!s)
			return NULL;
		const struct gguf_kv *kv = &f->kv[s - 1];
		if (kv->key.len == len && memcmp(kv->key.ptr, key, len) == 0)
			return kv;
	}
}

static const struct gguf_tensor *tensor_lookup(const struct gguf_file *f, const char *name,
                                               size_t len)
{
	const struct gguf_index *ix = f->index;
	if (!ix || len >= GGUF_MAX_NAME)
		return NULL;
	for (uint64_t i = fnv1a(name, len) & ix->t_mask;; i = (i + 1) & ix->t_mask) {
		uint64_t s = ix->t_slots[i];
		if (!s)
			return NULL;
		const struct gguf_tensor *t = &f->tensors[s - 1];
		if (memcmp(t->name, name, len) == 0 && t->name[len] == '\0')
			return t;
	}
}

/* ---- reader ----------------------------------------------------------------- */

struct rd {
	const uint8_t *base;
	uint64_t size;
	uint64_t pos;
	struct cm_err *err;
};

static inline uint64_t rd_left(const struct rd *r)
{
	return r->size - r->pos;
}

/* Succeed if n more bytes are available; else fail naming what was read. */
static int CM_PRINTF(3, 4) rd_need(struct rd *r, uint64_t n, const char *fmt, ...)
{
	if (CM_LIKELY(n <= rd_left(r)))
		return 0;
	char what[160];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return cm_err_set(r->err, -EPROTO,
	                  "gguf: file truncated at offset %" PRIu64 " reading %s (%" PRIu64
	                  " bytes needed, %" PRIu64 " left)",
	                  r->pos, what, n, rd_left(r));
}

/* A length or count n (at file offset `at`, in units of `unit` bytes) that
 * does not fit in the `left` bytes that follow it. */
static int len_err(struct rd *r, uint64_t at, uint64_t left, const char *where, const char *what,
                   uint64_t n, size_t unit)
{
	char per[48] = "";
	if (unit > 1)
		snprintf(per, sizeof(per), ", %zu per element", unit);
	if (n > r->size)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: %s %" PRIu64
		                  " exceeds file size %" PRIu64,
		                  at, where, what, n, r->size);
	return cm_err_set(r->err, -EPROTO,
	                  "gguf: offset %" PRIu64 ": %s: %s %" PRIu64
	                  " runs past end of file (%" PRIu64 " bytes left%s)",
	                  at, where, what, n, left, per);
}

static int read_header(struct rd *r, uint32_t *ret_version, uint64_t *ret_nt, uint64_t *ret_nkv)
{
	if (r->size == 0)
		return cm_err_set(r->err, -EPROTO, "gguf: empty file");
	if (r->size < 4)
		return cm_err_set(r->err, -EPROTO, "gguf: not a GGUF file (only %" PRIu64 " bytes)",
		                  r->size);
	uint32_t magic = ld32(r->base);
	if (magic != GGUF_MAGIC)
		return cm_err_set(r->err, -EPROTO, "gguf: not a GGUF file (magic %02x%02x%02x%02x)",
		                  r->base[0], r->base[1], r->base[2], r->base[3]);
	r->pos = 4;
	int rc = rd_need(r, 4, "header version");
	if (rc)
		return rc;
	uint32_t version = ld32(r->base + 4);
	uint32_t swapped = __builtin_bswap32(version);
	if ((version & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: byte-swapped (big-endian) file, version %u; only "
		                  "little-endian files are supported",
		                  swapped);
	if (version < 2 || version > 3)
		return cm_err_set(
		    r->err, -EPROTO,
		    "gguf: unsupported version %u (only versions 2 and 3 are supported)", version);
	r->pos = 8;
	if ((rc = rd_need(r, 16, "header counts")))
		return rc;
	uint64_t nt = ld64(r->base + 8), nkv = ld64(r->base + 16);
	r->pos = GGUF_HEADER_SIZE;
	uint64_t left = rd_left(r);
	if (nkv > left / MIN_KV_RECORD)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset 16: kv_count %" PRIu64
		                  " too large for file size %" PRIu64 " (at most %" PRIu64
		                  " records fit)",
		                  nkv, r->size, (left / MIN_KV_RECORD));
	if (nt > left / MIN_TENSOR_RECORD)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset 8: tensor_count %" PRIu64
		                  " too large for file size %" PRIu64 " (at most %" PRIu64
		                  " records fit)",
		                  nt, r->size, (left / MIN_TENSOR_RECORD));
	/* Both bounded above, so the sum cannot overflow. */
	if (nkv * MIN_KV_RECORD + nt * MIN_TENSOR_RECORD > left)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset 8: tensor_count %" PRIu64 " and kv_count %" PRIu64
		                  " too large for file size %" PRIu64,
		                  nt, nkv, r->size);
	*ret_version = version;
	*ret_nt = nt;
	*ret_nkv = nkv;
	return 0;
}

/* Decode a fixed-size scalar at p into kv->v. */
static void decode_scalar(struct gguf_kv *kv, const uint8_t *p)
{
	switch (kv->type) {
	case GGUF_TYPE_UINT8:
		kv->v.u64 = p[0];
		break;
	case GGUF_TYPE_INT8:
		kv->v.i64 = (int8_t)p[0];
		break;
	case GGUF_TYPE_UINT16:
		kv->v.u64 = ld16(p);
		break;
	case GGUF_TYPE_INT16:
		kv->v.i64 = (int16_t)ld16(p);
		break;
	case GGUF_TYPE_UINT32:
		kv->v.u64 = ld32(p);
		break;
	case GGUF_TYPE_INT32:
		kv->v.i64 = (int32_t)ld32(p);
		break;
	case GGUF_TYPE_UINT64:
		kv->v.u64 = ld64(p);
		break;
	case GGUF_TYPE_INT64:
		kv->v.i64 = (int64_t)ld64(p);
		break;
	case GGUF_TYPE_BOOL:
		kv->v.b = p[0] != 0;
		break;
	case GGUF_TYPE_FLOAT32: {
		uint32_t bits = ld32(p);
		float x;
		memcpy(&x, &bits, 4);
		kv->v.f64 = x;
		break;
	}
	case GGUF_TYPE_FLOAT64: {
		uint64_t bits = ld64(p);
		memcpy(&kv->v.f64, &bits, 8);
		break;
	}
	default:
		break;
	}
}

/* A string value (length + bytes) at the current position. */
static int read_str(struct rd *r, const char *where, const char *what, struct gguf_str *ret)
{
	uint64_t at = r->pos;
	int rc = rd_need(r, 8, "%s: %s length", where, what);
	if (rc)
		return rc;
	uint64_t len = ld64(r->base + r->pos);
	r->pos += 8;
	if (len > rd_left(r))
		return len_err(r, at, rd_left(r), where, "string length", len, 1);
	ret->ptr = (const char *)r->base + r->pos;
	ret->len = len;
	r->pos += len;
	return 0;
}

static int read_kv(struct rd *r, uint64_t i, struct gguf_kv *kv)
{
	char where[ESC_MAX + 32], esc[ESC_MAX];
	int rc;

	kv->offset = r->pos;
	snprintf(where, sizeof(where), "kv %" PRIu64, i);
	if ((rc = rd_need(r, 8, "%s key length", where)))
		return rc;
	uint64_t klen = ld64(r->base + r->pos);
	if (klen == 0)
		return cm_err_set(r->err, -EPROTO, "gguf: offset %" PRIu64 ": %s: empty key",
		                  r->pos, where);
	if (klen > rd_left(r) - 8)
		return len_err(r, r->pos, rd_left(r) - 8, where, "key length", klen, 1);
	r->pos += 8;
	kv->key.ptr = (const char *)r->base + r->pos;
	kv->key.len = klen;
	r->pos += klen;
	snprintf(where, sizeof(where), "kv %" PRIu64 " '%s'", i,
	         escape_str(esc, kv->key.ptr, kv->key.len));

	uint64_t at = r->pos;
	if ((rc = rd_need(r, 4, "%s type", where)))
		return rc;
	uint32_t type = ld32(r->base + r->pos);
	r->pos += 4;
	if (type >= GGUF_TYPE_COUNT)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: unknown value type %u", at, where,
		                  type);
	kv->type = type;
	kv->data = r->base + r->pos;

	if (type == GGUF_TYPE_STRING)
		return read_str(r, where, "string", &kv->v.str);
	if (type != GGUF_TYPE_ARRAY) {
		size_t sz = vtype_sizes[type];
		if ((rc = rd_need(r, sz, "%s %s value", where, vtype_names[type])))
			return rc;
		decode_scalar(kv, kv->data);
		r->pos += sz;
		return 0;
	}

	at = r->pos;
	if ((rc = rd_need(r, 12, "%s array header", where)))
		return rc;
	uint32_t et = ld32(r->base + r->pos);
	uint64_t n = ld64(r->base + r->pos + 4);
	if (et == GGUF_TYPE_ARRAY)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: nested arrays are not supported",
		                  at, where);
	if (et >= GGUF_TYPE_COUNT)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: unknown array element type %u", at,
		                  where, et);
	r->pos += 12;
	kv->arr_type = et;
	kv->arr_n = n;
	kv->data = r->base + r->pos;
	if (et != GGUF_TYPE_STRING) {
		size_t sz = vtype_sizes[et];
		if (n > rd_left(r) / sz)
			return len_err(r, at + 4, rd_left(r), where, "array count", n, sz);
		r->pos += n * sz;
		return 0;
	}
	/* Each string takes at least its 8-byte length. */
	if (n > rd_left(r) / 8)
		return len_err(r, at + 4, rd_left(r), where, "array count", n, 8);
	for (uint64_t j = 0; j < n; j++) {
		/* Inlined read_str: this loop runs over whole vocabularies. */
		if ((rc = rd_need(r, 8, "%s element %" PRIu64 " length", where, j)))
			return rc;
		uint64_t len = ld64(r->base + r->pos);
		if (len > rd_left(r) - 8) {
			char w2[sizeof(where) + 32];
			snprintf(w2, sizeof(w2), "%s element %" PRIu64, where, j);
			return len_err(r, r->pos, rd_left(r) - 8, w2, "string length", len, 1);
		}
		r->pos += 8 + len;
	}
	return 0;
}

static int read_tensor_info(struct rd *r, uint64_t i, uint32_t alignment, struct gguf_tensor *t)
{
	char where[ESC_MAX + 32], esc[ESC_MAX];
	int rc;

	snprintf(where, sizeof(where), "tensor %" PRIu64, i);
	if ((rc = rd_need(r, 8, "%s name length", where)))
		return rc;
	uint64_t at = r->pos;
	uint64_t nlen = ld64(r->base + r->pos);
	if (nlen == 0)
		return cm_err_set(r->err, -EPROTO, "gguf: offset %" PRIu64 ": %s: empty name", at,
		                  where);
	if (nlen >= GGUF_MAX_NAME)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: name length %" PRIu64
		                  " too long (maximum %d)",
		                  at, where, nlen, GGUF_MAX_NAME - 1);
	r->pos += 8;
	if ((rc = rd_need(r, nlen, "%s name", where)))
		return rc;
	const uint8_t *name = r->base + r->pos;
	if (memchr(name, 0, nlen))
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: name '%s' contains a NUL byte",
		                  r->pos, where, escape_str(esc, name, nlen));
	memcpy(t->name, name, nlen);
	t->name[nlen] = '\0';
	r->pos += nlen;
	snprintf(where, sizeof(where), "tensor %" PRIu64 " '%s'", i, escape_str(esc, name, nlen));

	at = r->pos;
	if ((rc = rd_need(r, 4, "%s n_dims", where)))
		return rc;
	uint32_t n_dims = ld32(r->base + r->pos);
	if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: n_dims %u out of range 1..%d", at,
		                  where, n_dims, GGUF_MAX_DIMS);
	r->pos += 4;
	t->n_dims = n_dims;
	if ((rc = rd_need(r, 8ull * n_dims, "%s dims", where)))
		return rc;
	uint64_t nel = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		if (d >= n_dims) {
			t->ne[d] = 1;
			continue;
		}
		int64_t ne = (int64_t)ld64(r->base + r->pos);
		if (ne < 1)
			return cm_err_set(r->err, -EPROTO,
			                  "gguf: offset %" PRIu64 ": %s: dimension %u is %" PRId64
			                  " (must be >= 1)",
			                  r->pos, where, d, ne);
		t->ne[d] = ne;
		if (cm_mul_overflow_u64(nel, (uint64_t)ne, &nel) || nel > INT64_MAX)
			return cm_err_set(r->err, -EPROTO,
			                  "gguf: offset %" PRIu64
			                  ": %s: element count overflows at dimension %u",
			                  r->pos, where, d);
		r->pos += 8;
	}

	at = r->pos;
	if ((rc = rd_need(r, 12, "%s type and offset", where)))
		return rc;
	t->type = ld32(r->base + r->pos);
	t->offset = ld64(r->base + r->pos + 4);
	r->pos += 12;
	const struct dtype_info *di = quant_dtype_get(t->type);
	if (!di || di->blck == 0 || di->size == 0)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: unknown tensor type %u", at, where,
		                  t->type);
	if (t->ne[0] % di->blck != 0)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: ne[0] = %" PRId64
		                  " is not a multiple of the %s block size %u",
		                  at, where, t->ne[0], di->name, di->blck);
	uint64_t rows = nel / (uint64_t)t->ne[0];
	if (cm_mul_overflow_u64((uint64_t)t->ne[0] / di->blck, di->size, &t->row_bytes) ||
	    cm_mul_overflow_u64(t->row_bytes, rows, &t->nbytes))
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: byte size overflows", at, where);
	if (t->offset % alignment != 0)
		return cm_err_set(r->err, -EPROTO,
		                  "gguf: offset %" PRIu64 ": %s: data offset %" PRIu64
		                  " is not a multiple of the alignment %u",
		                  at + 4, where, t->offset, alignment);
	return 0;
}

static int build_kv_index(struct gguf_file *f, struct gguf_index *ix, struct cm_err *err)
{
	char esc[ESC_MAX];
	int rc = index_alloc(f->n_kv, &ix->kv_slots, &ix->kv_mask);
	if (rc)
		return cm_err_set(err, rc, "gguf: out of memory indexing %" PRIu64 " keys",
		                  f->n_kv);
	for (uint64_t k = 0; k < f->n_kv; k++) {
		const struct gguf_kv *kv = &f->kv[k];
		uint64_t i = fnv1a(kv->key.ptr, kv->key.len) & ix->kv_mask;
		for (; ix->kv_slots[i]; i = (i + 1) & ix->kv_mask) {
			const struct gguf_kv *o = &f->kv[ix->kv_slots[i] - 1];
			if (o->key.len == kv->key.len &&
			    !memcmp(o->key.ptr, kv->key.ptr, o->key.len))
				return cm_err_set(err, -EPROTO,
				                  "gguf: offset %" PRIu64 ": kv %" PRIu64
				                  ": duplicate key '%s' (first at kv %" PRIu64 ")",
				                  kv->offset, k,
				                  escape_str(esc, kv->key.ptr, kv->key.len),
				                  (ix->kv_slots[i] - 1));
		}
		ix->kv_slots[i] = k + 1;
	}
	return 0;
}

static int build_tensor_index(struct gguf_file *f, struct gguf_index *ix, struct cm_err *err)
{
	int rc = index_alloc(f->n_tensors, &ix->t_slots, &ix->t_mask);
	if (rc)
		return cm_err_set(err, rc, "gguf: out of memory indexing %" PRIu64 " tensors",
		                  f->n_tensors);
	char esc[ESC_MAX];
	for (uint64_t k = 0; k < f->n_tensors; k++) {
		const char *name = f->tensors[k].name;
		uint64_t i = fnv1a(name, strlen(name)) & ix->t_mask;
		for (; ix->t_slots[i]; i = (i + 1) & ix->t_mask) {
			if (!strcmp(f->tensors[ix->t_slots[i] - 1].name, name))
				return cm_err_set(
				    err, -EPROTO,
				    "gguf: tensor %" PRIu64
				    ": duplicate tensor name '%s' (first at tensor %" PRIu64 ")",
				    k, esc_name(esc, name), ix->t_slots[i] - 1);
		}
		ix->t_slots[i] = k + 1;
	}
	return 0;
}

static int check_alignment(const struct gguf_file *f, uint32_t *ret, struct cm_err *err)
{
	static const char key[] = "general.alignment";
	const struct gguf_kv *kv = kv_lookup(f, key, sizeof(key) - 1);
	*ret = GGUF_DEFAULT_ALIGNMENT;
	if (!kv)
		return 0;
	if (kv->type != GGUF_TYPE_UINT32)
		return cm_err_set(err, -EPROTO, "gguf: kv '%s': must be UINT32, got %s", key,
		                  gguf_vtype_name(kv->type));
	uint64_t a = kv->v.u64;
	if (a == 0 || (a & (a - 1)) != 0)
		return cm_err_set(err, -EPROTO,
		                  "gguf: kv '%s': must be a power of two, got %" PRIu64, key, a);
	*ret = (uint32_t)a;
	return 0;
}

static int cmp_tensor_offset(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Tensor data inside the file, and no two tensors sharing bytes. */
static int check_tensor_data(struct gguf_file *f, struct cm_err *err)
{
	char esc[ESC_MAX], esc2[ESC_MAX];
	for (uint64_t k = 0; k < f->n_tensors; k++) {
		struct gguf_tensor *t = &f->tensors[k];
		uint64_t start, end;
		if (cm_add_overflow_u64(f->data_start, t->offset, &start) ||
		    cm_add_overflow_u64(start, t->nbytes, &end))
			return cm_err_set(err, -EPROTO,
			                  "gguf: tensor '%s': data offset %" PRIu64 " + %" PRIu64
			                  " bytes overflows",
			                  esc_name(esc, t->name), t->offset, t->nbytes);
		if (end > f->size)
			return cm_err_set(err, -EPROTO,
			                  "gguf: tensor '%s': data [%" PRIu64 ", %" PRIu64
			                  ") past end of file (%" PRIu64 " bytes)",
			                  esc_name(esc, t->name), start, end, f->size);
		t->data = f->base + start;
	}
	if (f->n_tensors < 2)
		return 0;
	if (f->n_tensors > SIZE_MAX / sizeof(struct gguf_tensor *))
		return cm_err_set(err, -ENOMEM, "gguf: out of memory");
	struct gguf_tensor **v = cm_malloc((size_t)f->n_tensors * sizeof(*v));
	if (!v)
		return cm_err_set(err, -ENOMEM, "gguf: out of memory checking tensor overlap");
	for (uint64_t k = 0; k < f->n_tensors; k++)
		v[k] = &f->tensors[k];
	qsort(v, (size_t)f->n_tensors, sizeof(*v), cmp_tensor_offset);
	int rc = 0;
	for (uint64_t k = 1; k < f->n_tensors; k++) {
		const struct gguf_tensor *a = v[k - 1], *b = v[k];
		if (a->offset + a->nbytes > b->offset) { /* in bounds: no overflow */
			rc = cm_err_set(err, -EPROTO,
			                "gguf: tensors '%s' [%" PRIu64 ", %" PRIu64
			                ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
			                esc_name(esc, a->name), a->offset, a->offset + a->nbytes,
			                esc_name(esc2, b->name), b->offset, b->offset + b->nbytes);
			break;
		}
	}
	cm_free(v);
	return rc;
}

static int parse(struct gguf_file *f, struct cm_err *err)
{
	struct rd r = {.base = f->base, .size = f->size, .pos = 0, .err = err};
	int rc = read_header(&r, &f->version, &f->n_tensors, &f->n_kv);
	if (rc)
		return rc;
	/* The counts are bounded by the file size, so these allocations are too. */
	f->kv = cm_calloc((size_t)f->n_kv, sizeof(*f->kv));
	f->tensors = cm_calloc((size_t)f->n_tensors, sizeof(*f->tensors));
	f->index = cm_calloc(1, sizeof(struct gguf_index));
	if (!f->kv || !f->tensors || !f->index)
		return cm_err_set(err, -ENOMEM,
		                  "gguf: out of memory (%" PRIu64 " keys, %" PRIu64 " tensors)",
		                  f->n_kv, f->n_tensors);
	for (uint64_t i = 0; i < f->n_kv; i++)
		if ((rc = read_kv(&r, i, &f->kv[i])))
			return rc;
	if ((rc = build_kv_index(f, f->index, err)))
		return rc;
	if ((rc = check_alignment(f, &f->alignment, err)))
		return rc;
	for (uint64_t i = 0; i < f->n_tensors; i++)
		if ((rc = read_tensor_info(&r, i, f->alignment, &f->tensors[i])))
			return rc;
	if ((rc = build_tensor_index(f, f->index, err)))
		return rc;
	/* r.pos <= size and alignment <= 2^31: no overflow. Files without
	 * tensors may end before data_start (vocab-only files lack the pad). */
	f->data_start = cm_align_up(r.pos, f->alignment);
	return check_tensor_data(f, err);
}

void gguf_close(struct gguf_file *f)
{
	if (!f)
		return;
	if (f->mapped && f->size)
		munmap((void *)f->base, f->size);
	cm_free(f->kv);
	cm_free(f->tensors);
	index_free(f->index);
	cm_free(f);
}

/* Take ownership of a mapping (mapped) or borrow memory, and parse it. */
static int open_common(const void *base, size_t size, bool mapped, struct gguf_file **ret_file,
                       struct cm_err *err)
{
	struct gguf_file *f = cm_calloc(1, sizeof(*f));
	if (!f) {
		if (mapped && size)
			munmap((void *)base, size);
		return cm_err_set(err, -ENOMEM, "gguf: out of memory");
	}
	f->base = base;
	f->size = size;
	f->mapped = mapped;
	int rc = parse(f, err);
	if (rc) {
		gguf_close(f);
		return rc;
	}
	*ret_file = f;
	return 0;
}

int gguf_open_mem(const void *buf, size_t size, struct gguf_file **ret_file, struct cm_err *err)
{
	*ret_file = NULL;
	if (!buf)
		size = 0;
	return open_common(buf, size, false, ret_file, err);
}

int gguf_open(const char *path, struct gguf_file **ret_file, struct cm_err *err)
{
	*ret_file = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cm_err_set(err, -errno, "gguf: %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return cm_err_set(err, -e, "gguf: %s: %s", path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		int e = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
		return cm_err_set(err, -e, "gguf: %s: %s", path,
		                  e == EISDIR ? strerror(e) : "not a regular file");
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		close(fd);
		return cm_err_set(err, -EFBIG, "gguf: %s: %s", path, strerror(EFBIG));
	}
	size_t size = (size_t)st.st_size;
	void *base = NULL;
	if (size) {
		base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (base == MAP_FAILED) {
			int e = errno;
			close(fd);
			return cm_err_set(err, -e, "gguf: %s: mmap: %s", path, strerror(e));
		}
	}
	close(fd);
	int r = open_common(base, size, true, ret_file, err);
	if (r == 0) {
		(*ret_file)->dev = (uint64_t)st.st_dev;
		(*ret_file)->ino = (uint64_t)st.st_ino;
		(*ret_file)->mtime_ns =
		    (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
		snprintf((*ret_file)->path, sizeof((*ret_file)->path), "%s", path);
	}
	return r;
}

/* ---- lookups and typed getters -------------------------------------------- */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key)
{
	if (!f || !key)
		return NULL;
	return kv_lookup(f, key, strlen(key));
}

const struct gguf_tensor *gguf_tensor_by_name(const struct gguf_file *f, const char *name)
{
	if (!f || !name)
		return NULL;
	return tensor_lookup(f, name, strlen(name));
}

/* An integer-typed kv (or bool) as a signed/unsigned pair. Returns false if
 * the kv is not an integer. *neg tells which member holds the value. */
static bool kv_int(const struct gguf_kv *kv, bool *neg, uint64_t *u, int64_t *s)
{
	if (vtype_is_uint(kv->type)) {
		*neg = false;
		*u = kv->v.u64;
		return true;
	}
	if (vtype_is_sint(kv->type)) {
		*s = kv->v.i64;
		*neg = *s < 0;
		*u = (uint64_t)*s;
		return true;
	}
	if (kv->type == GGUF_TYPE_BOOL) {
		*neg = false;
		*u = kv->v.b;
		return true;
	}
	return false;
}

static int wrong_type(const char *key, const char *expected, const struct gguf_kv *kv,
                      struct cm_err *err)
{
	if (kv->type == GGUF_TYPE_ARRAY)
		return cm_err_set(err, -EPROTO, "gguf: kv '%s': expected %s, got ARRAY of %s", key,
		                  expected, gguf_vtype_name(kv->arr_type));
	return cm_err_set(err, -EPROTO, "gguf: kv '%s': expected %s, got %s", key, expected,
	                  gguf_vtype_name(kv->type));
}

int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret, struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	bool neg;
	uint64_t u;
	int64_t s;
	if (!kv)
		return -ENOENT;
	if (!kv_int(kv, &neg, &u, &s))
		return wrong_type(key, "an integer", kv, err);
	if (neg)
		return cm_err_set(err, -EPROTO,
		                  "gguf: kv '%s': value %" PRId64 " out of range for u32", key, s);
	if (u > UINT32_MAX)
		return cm_err_set(err, -EPROTO,
		                  "gguf: kv '%s': value %" PRIu64 " out of range for u32", key, u);
	*ret = (uint32_t)u;
	return 0;
}

int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret, struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	bool neg;
	uint64_t u;
	int64_t s;
	if (!kv)
		return -ENOENT;
	if (!kv_int(kv, &neg, &u, &s))
		return wrong_type(key, "an integer", kv, err);
	if (!neg && u > INT64_MAX)
		return cm_err_set(err, -EPROTO,
		                  "gguf: kv '%s': value %" PRIu64 " out of range for i64", key, u);
	*ret = (int64_t)u;
	return 0;
}

int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret, struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	bool neg;
	uint64_t u;
	int64_t s;
	if (!kv)
		return -ENOENT;
	if (kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64) {
		double d = kv->v.f64;
		if (isfinite(d) && (d > FLT_MAX || d < -FLT_MAX))
			return cm_err_set(err, -EPROTO,
			                  "gguf: kv '%s': value %g out of range for f32", key, d);
		*ret = (float)d;
		return 0;
	}
	if (kv->type != GGUF_TYPE_BOOL && kv_int(kv, &neg, &u, &s)) {
		*ret = neg ? (float)s : (float)u;
		return 0;
	}
	return wrong_type(key, "a number", kv, err);
}

int gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret, struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	bool neg;
	uint64_t u;
	int64_t s;
	if (!kv)
		return -ENOENT;
	if (!kv_int(kv, &neg, &u, &s)) /* BOOL, or an integer: non-zero is true */
		return wrong_type(key, "BOOL", kv, err);
	*ret = u != 0;
	return 0;
}

int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret,
                 struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_TYPE_STRING)
		return wrong_type(key, "STRING", kv, err);
	*ret = kv->v.str;
	return 0;
}

int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem_type,
                 const void **ret_data, uint64_t *ret_n, struct cm_err *err)
{
	const struct gguf_kv *kv = gguf_find_kv(f, key);
	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != elem_type) {
		char want[32];
		snprintf(want, sizeof(want), "ARRAY of %s", gguf_vtype_name(elem_type));
		return wrong_type(key, want, kv, err);
	}
	*ret_data = kv->data;
	*ret_n = kv->arr_n;
	return 0;
}

int gguf_arr_strings(const struct gguf_file *f, const char *key, struct gguf_str **ret_strs,
                     uint64_t *ret_n, struct cm_err *err)
{
	const void *data = NULL;
	uint64_t n = 0;
	int rc = gguf_get_arr(f, key, GGUF_TYPE_STRING, &data, &n, err);
	if (rc)
		return rc;
	/* n <= file size / 8, so the product fits; calloc checks it anyway. */
	struct gguf_str *v = cm_calloc((size_t)n, sizeof(*v));
	if (!v)
		return cm_err_set(err, -ENOMEM,
		                  "gguf: kv '%s': out of memory for %" PRIu64 " strings", key, n);
	const uint8_t *p = data;
	for (uint64_t i = 0; i < n; i++) { /* validated at open */
		v[i].len = ld64(p);
		v[i].ptr = (const char *)p + 8;
		p += 8 + v[i].len;
	}
	*ret_strs = v;
	*ret_n = n;
	return 0;
}
