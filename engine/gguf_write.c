/* engine/gguf_write.c: GGUF v3 writer (docs: gguf-formats.md §1); the
 * reader is gguf.c.
 *
 * Keeps kv values serialized (little-endian, exactly as they will be
 * written) in insertion order and tensors as references to caller memory;
 * offsets are computed when writing, so general.alignment may be set at any
 * time. Its input is the program's own (tools, tests), or a file the reader
 * has already validated (gguf_writer_copy_kv). */
#include "engine/gguf.h"
#include "engine/kernels/formats.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- little-endian loads and stores --------------------------------------- */

/* The reader's loads (gguf.c) have their own copy: these four lines are all
 * the two files would share. */
static inline uint32_t ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t ld64(const uint8_t *p)
{
	return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static inline void st32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline void st64(uint8_t *p, uint64_t v)
{
	st32(p, (uint32_t)v);
	st32(p + 4, (uint32_t)(v >> 32));
}

/* ---- building ------------------------------------------------------------- */

struct wkv {
	char *key;
	size_t key_len;
	enum gguf_vtype type;
	enum gguf_vtype arr_type;
	uint64_t arr_n;
	uint8_t *val; /* serialized value after the type field (arrays: the elements) */
	size_t val_len;
};

struct wtensor {
	char name[GGUF_MAX_NAME];
	uint32_t n_dims;
	int64_t ne[GGUF_MAX_DIMS];
	uint32_t type;
	uint64_t nbytes;
	const void *data; /* caller's; NULL writes zeros */
};

struct gguf_writer {
	struct wkv *kv;
	size_t n_kv, cap_kv;
	struct wtensor *t;
	size_t n_t, cap_t;
};

int gguf_writer_new(struct gguf_writer **ret_w, struct cm_err *err)
{
	*ret_w = cm_calloc(1, sizeof(**ret_w));
	if (!*ret_w)
		return cm_err_set(err, -ENOMEM, "gguf writer: out of memory");
	return 0;
}

void gguf_writer_free(struct gguf_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_kv; i++) {
		cm_free(w->kv[i].key);
		cm_free(w->kv[i].val);
	}
	cm_free(w->kv);
	cm_free(w->t);
	cm_free(w);
}

static struct wkv *writer_find(struct gguf_writer *w, const char *key, size_t len)
{
	for (size_t i = 0; i < w->n_kv; i++)
		if (w->kv[i].key_len == len && !memcmp(w->kv[i].key, key, len))
			return &w->kv[i];
	return NULL;
}

/* Set key to a value already serialized in val[0..len) (copied). On failure
 * the writer is unchanged. */
static int writer_set(struct gguf_writer *w, const char *key, size_t key_len, enum gguf_vtype type,
                      enum gguf_vtype arr_type, uint64_t arr_n, const void *val, size_t len)
{
	if (!w || !key || key_len == 0)
		return -EINVAL;
	uint8_t *copy = cm_malloc(len);
	if (!copy)
		return -ENOMEM;
	if (len)
		memcpy(copy, val, len);
	struct wkv *kv = writer_find(w, key, key_len);
	if (!kv) {
		if (w->n_kv == w->cap_kv) {
			size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
			struct wkv *nv = cm_realloc(w->kv, cap * sizeof(*nv));
			if (!nv)
				goto out_nomem;
			w->kv = nv;
			w->cap_kv = cap;
		}
		char *k = cm_strndup(key, key_len);
		if (!k)
			goto out_nomem;
		kv = &w->kv[w->n_kv++];
		kv->key = k;
		kv->key_len = key_len;
		kv->val = NULL;
	}
	cm_free(kv->val);
	kv->type = type;
	kv->arr_type = arr_type;
	kv->arr_n = arr_n;
	kv->val = copy;
	kv->val_len = len;
	return 0;

out_nomem:
	cm_free(copy);
	return -ENOMEM;
}

static int set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type, uint64_t bits)
{
	uint8_t b[8];
	st64(b, bits);
	return writer_set(w, key, key ? strlen(key) : 0, type, 0, 0, b, gguf_vtype_size(type));
}

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
	return set_scalar(w, key, GGUF_TYPE_UINT32, v);
}

int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v)
{
	return set_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v);
}

int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v)
{
	return set_scalar(w, key, GGUF_TYPE_UINT64, v);
}

int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v)
{
	uint32_t bits;
	memcpy(&bits, &v, 4);
	return set_scalar(w, key, GGUF_TYPE_FLOAT32, bits);
}

int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v)
{
	return set_scalar(w, key, GGUF_TYPE_BOOL, v ? 1 : 0);
}

int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type,
                           const void *v)
{
	size_t sz = gguf_vtype_size(type);
	if (sz == 0 || !v)
		return -EINVAL;
	if (type == GGUF_TYPE_BOOL) /* normalise: any non-zero byte is true */
		return gguf_writer_set_bool(w, key, *(const uint8_t *)v != 0);
	return writer_set(w, key, key ? strlen(key) : 0, type, 0, 0, v, sz);
}

int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v)
{
	if (!v)
		return -EINVAL;
	size_t n = strlen(v);
	if (n > SIZE_MAX - 8)
		return -EINVAL;
	uint8_t *buf = cm_malloc(8 + n);
	if (!buf)
		return -ENOMEM;
	st64(buf, n);
	memcpy(buf + 8, v, n);
	int rc = writer_set(w, key, key ? strlen(key) : 0, GGUF_TYPE_STRING, 0, 0, buf, 8 + n);
	cm_free(buf);
	return rc;
}

/* Elements are copied as they are: the engine runs on little-endian hosts
 * only, so host order is file order. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type,
                        const void *data, uint64_t n)
{
	size_t sz = gguf_vtype_size(elem_type);
	if (sz == 0 || n > SIZE_MAX / sz || (n && !data))
		return -EINVAL;
	return writer_set(w, key, key ? strlen(key) : 0, GGUF_TYPE_ARRAY, elem_type, n, data,
	                  (size_t)n * sz);
}

int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                            const size_t *lens, uint64_t n)
{
	if (n && !strs)
		return -EINVAL;
	size_t total = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (!strs[i])
			return -EINVAL;
		size_t l = lens ? lens[i] : strlen(strs[i]);
		if (__builtin_add_overflow(total, l, &total) ||
		    __builtin_add_overflow(total, (size_t)8, &total))
			return -EINVAL;
	}
	uint8_t *buf = cm_malloc(total);
	if (!buf)
		return -ENOMEM;
	uint8_t *p = buf;
	for (uint64_t i = 0; i < n; i++) {
		size_t l = lens ? lens[i] : strlen(strs[i]);
		st64(p, l);
		if (l)
			memcpy(p + 8, strs[i], l);
		p += 8 + l;
	}
	int rc = writer_set(w, key, key ? strlen(key) : 0, GGUF_TYPE_ARRAY, GGUF_TYPE_STRING, n,
	                    buf, total);
	cm_free(buf);
	return rc;
}

void gguf_writer_remove(struct gguf_writer *w, const char *key)
{
	if (!w || !key)
		return;
	struct wkv *kv = writer_find(w, key, strlen(key));
	if (!kv)
		return;
	cm_free(kv->key);
	cm_free(kv->val);
	size_t i = (size_t)(kv - w->kv);
	memmove(kv, kv + 1, (w->n_kv - i - 1) * sizeof(*kv));
	w->n_kv--;
}

/* Bytes of a validated kv's value after the type field (and, for arrays,
 * after the element type and count). */
static size_t kv_value_len(const struct gguf_kv *kv)
{
	if (kv->type == GGUF_TYPE_STRING)
		return 8 + (size_t)kv->v.str.len;
	if (kv->type != GGUF_TYPE_ARRAY)
		return gguf_vtype_size(kv->type);
	if (kv->arr_type != GGUF_TYPE_STRING)
		return (size_t)kv->arr_n * gguf_vtype_size(kv->arr_type);
	const uint8_t *p = kv->data;
	for (uint64_t i = 0; i < kv->arr_n; i++)
		p += 8 + ld64(p);
	return (size_t)(p - kv->data);
}

int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src,
                        bool (*skip)(const char *key, void *ctx), void *ctx)
{
	if (!w || !src)
		return -EINVAL;
	for (uint64_t i = 0; i < src->n_kv; i++) {
		const struct gguf_kv *kv = &src->kv[i];
		if (skip) {
			char *k = cm_strndup(kv->key.ptr, (size_t)kv->key.len);
			if (!k)
				return -ENOMEM;
			bool s = skip(k, ctx);
			cm_free(k);
			if (s)
				continue;
		}
		int rc = writer_set(w, kv->key.ptr, (size_t)kv->key.len, kv->type, kv->arr_type,
		                    kv->arr_n, kv->data, kv_value_len(kv));
		if (rc)
			return rc;
	}
	return 0;
}

int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const int64_t *ne, const void *data, struct cm_err *err)
{
	if (!w || !name || !ne)
		return cm_err_set(err, -EINVAL, "gguf writer: add_tensor: NULL argument");
	size_t len = strlen(name);
	if (len == 0 || len >= GGUF_MAX_NAME)
		return cm_err_set(err, -EINVAL,
		                  "gguf writer: tensor '%.*s': name length %zu not in 1..%d",
		                  GGUF_MAX_NAME, name, len, GGUF_MAX_NAME - 1);
	if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
		return cm_err_set(err, -EINVAL,
		                  "gguf writer: tensor '%s': n_dims %u out of range 1..%d", name,
		                  n_dims, GGUF_MAX_DIMS);
	const struct dtype_info *di = quant_dtype_get(type);
	if (!di || di->blck == 0 || di->size == 0)
		return cm_err_set(err, -EINVAL, "gguf writer: tensor '%s': unknown tensor type %u",
		                  name, type);
	uint64_t nel = 1;
	for (uint32_t d = 0; d < n_dims; d++) {
		if (ne[d] < 1)
			return cm_err_set(err, -EINVAL,
			                  "gguf writer: tensor '%s': dimension %u is %" PRId64
			                  " (must be >= 1)",
			                  name, d, ne[d]);
		if (cm_mul_overflow_u64(nel, (uint64_t)ne[d], &nel) || nel > INT64_MAX)
			return cm_err_set(err, -EINVAL,
			                  "gguf writer: tensor '%s': element count overflows",
			                  name);
	}
	if (ne[0] % di->blck != 0)
		return cm_err_set(err, -EINVAL,
		                  "gguf writer: tensor '%s': ne[0] = %" PRId64
		                  " is not a multiple of the %s block size %u",
		                  name, ne[0], di->name, di->blck);
	uint64_t nbytes;
	if (cm_mul_overflow_u64(nel / di->blck, di->size, &nbytes) || nbytes > SIZE_MAX)
		return cm_err_set(err, -EINVAL, "gguf writer: tensor '%s': byte size overflows",
		                  name);
	for (size_t i = 0; i < w->n_t; i++)
		if (!strcmp(w->t[i].name, name))
			return cm_err_set(err, -EINVAL, "gguf writer: duplicate tensor name '%s'",
			                  name);
	if (w->n_t == w->cap_t) {
		size_t cap = w->cap_t ? 2 * w->cap_t : 16;
		struct wtensor *nt = cm_realloc(w->t, cap * sizeof(*nt));
		if (!nt)
			return cm_err_set(err, -ENOMEM, "gguf writer: out of memory");
		w->t = nt;
		w->cap_t = cap;
	}
	struct wtensor *t = &w->t[w->n_t++];
	memset(t, 0, sizeof(*t));
	memcpy(t->name, name, len + 1);
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->type = type;
	t->nbytes = nbytes;
	t->data = data;
	return 0;
}

/* The serialized header, kvs and tensor infos, padded to data_start; the
 * alignment to use; the total file size. */
struct layout {
	uint8_t *meta;
	size_t meta_len; /* = data_start */
	uint32_t alignment;
	uint64_t total;
};

static int writer_layout(const struct gguf_writer *w, struct layout *lo, struct cm_err *err)
{
	lo->meta = NULL;
	lo->alignment = GGUF_DEFAULT_ALIGNMENT;
	for (size_t i = 0; i < w->n_kv; i++) {
		const struct wkv *kv = &w->kv[i];
		if (kv->key_len != 17 || memcmp(kv->key, "general.alignment", 17))
			continue;
		uint32_t a = kv->type == GGUF_TYPE_UINT32 ? ld32(kv->val) : 0;
		if (a == 0 || (a & (a - 1)))
			return cm_err_set(
			    err, -EINVAL,
			    "gguf writer: general.alignment must be a UINT32 power of two");
		lo->alignment = a;
	}
	/* Everything here is already in memory, so sizes cannot really
	 * overflow; check anyway (32-bit hosts). */
	uint64_t n = GGUF_HEADER_SIZE;
	bool ovf = false;
	for (size_t i = 0; i < w->n_kv; i++) {
		const struct wkv *kv = &w->kv[i];
		ovf |= cm_add_overflow_u64(n, 8 + 4 + (uint64_t)kv->key_len, &n);
		ovf |= cm_add_overflow_u64(n, kv->type == GGUF_TYPE_ARRAY ? 12 : 0, &n);
		ovf |= cm_add_overflow_u64(n, kv->val_len, &n);
	}
	for (size_t i = 0; i < w->n_t; i++)
		ovf |= cm_add_overflow_u64(
		    n, 8 + strlen(w->t[i].name) + 4 + 8 * w->t[i].n_dims + 4 + 8, &n);
	uint64_t meta_len = cm_align_up(n, lo->alignment), total = meta_len;
	for (size_t i = 0; i < w->n_t; i++)
		ovf |=
		    cm_add_overflow_u64(total, cm_align_up(w->t[i].nbytes, lo->alignment), &total);
	if (ovf || meta_len < n || meta_len > SIZE_MAX)
		return cm_err_set(err, -EFBIG, "gguf writer: file too large");
	lo->meta_len = (size_t)meta_len;
	lo->total = total;
	uint8_t *p = lo->meta = cm_calloc(1, lo->meta_len);
	if (!p)
		return cm_err_set(err, -ENOMEM, "gguf writer: out of memory");
	st32(p, GGUF_MAGIC);
	st32(p + 4, 3);
	st64(p + 8, w->n_t);
	st64(p + 16, w->n_kv);
	p += GGUF_HEADER_SIZE;
	for (size_t i = 0; i < w->n_kv; i++) {
		const struct wkv *kv = &w->kv[i];
		st64(p, kv->key_len);
		memcpy(p + 8, kv->key, kv->key_len);
		p += 8 + kv->key_len;
		st32(p, kv->type);
		p += 4;
		if (kv->type == GGUF_TYPE_ARRAY) {
			st32(p, kv->arr_type);
			st64(p + 4, kv->arr_n);
			p += 12;
		}
		if (kv->val_len)
			memcpy(p, kv->val, kv->val_len);
		p += kv->val_len;
	}
	uint64_t off = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		size_t len = strlen(t->name);
		st64(p, len);
		memcpy(p + 8, t->name, len);
		p += 8 + len;
		st32(p, t->n_dims);
		p += 4;
		for (uint32_t d = 0; d < t->n_dims; d++, p += 8)
			st64(p, (uint64_t)t->ne[d]);
		st32(p, t->type);
		st64(p + 4, off);
		p += 12;
		off += cm_align_up(t->nbytes, lo->alignment);
	}
	return 0;
}

int gguf_writer_write_mem(struct gguf_writer *w, uint8_t **ret_buf, size_t *ret_size,
                          struct cm_err *err)
{
	struct layout lo;
	if (!w)
		return cm_err_set(err, -EINVAL, "gguf writer: NULL writer");
	int rc = writer_layout(w, &lo, err);
	if (rc)
		return rc;
	if (lo.total > SIZE_MAX) {
		cm_free(lo.meta);
		return cm_err_set(err, -EFBIG, "gguf writer: file too large for memory");
	}
	uint8_t *buf = cm_calloc(1, (size_t)lo.total);
	if (!buf) {
		cm_free(lo.meta);
		return cm_err_set(err, -ENOMEM, "gguf writer: out of memory (%" PRIu64 " bytes)",
		                  lo.total);
	}
	memcpy(buf, lo.meta, lo.meta_len);
	uint8_t *p = buf + lo.meta_len;
	for (size_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		if (t->data)
			memcpy(p, t->data, (size_t)t->nbytes);
		p += cm_align_up(t->nbytes, lo.alignment); /* padding already zero */
	}
	cm_free(lo.meta);
	*ret_buf = buf;
	*ret_size = (size_t)lo.total;
	return 0;
}

/* Write all n bytes, retrying short writes and EINTR. */
static int write_all(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -ENOSPC;
		p += k;
		n -= (size_t)k;
	}
	return 0;
}

static int write_zeros(int fd, uint64_t n)
{
	static const uint8_t zeros[4096];
	while (n) {
		size_t k = n > sizeof(zeros) ? sizeof(zeros) : (size_t)n;
		int rc = write_all(fd, zeros, k);
		if (rc)
			return rc;
		n -= k;
	}
	return 0;
}

int gguf_writer_write(struct gguf_writer *w, const char *path, struct cm_err *err)
{
	struct layout lo;
	if (!w || !path)
		return cm_err_set(err, -EINVAL, "gguf writer: NULL argument");
	size_t plen = strlen(path);
	char *tmp = cm_malloc(plen + 5);
	if (!tmp)
		return cm_err_set(err, -ENOMEM, "gguf writer: out of memory");
	memcpy(tmp, path, plen);
	memcpy(tmp + plen, ".tmp", 5);
	int rc = writer_layout(w, &lo, err);
	if (rc)
		goto out_free_tmp;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = cm_err_set(err, -errno, "gguf: %s: %s", tmp, strerror(errno));
		goto out_free_meta;
	}
	rc = write_all(fd, lo.meta, lo.meta_len);
	for (size_t i = 0; !rc && i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		uint64_t pad = cm_align_up(t->nbytes, lo.alignment) - t->nbytes;
		if (t->data)
			rc = write_all(fd, t->data, (size_t)t->nbytes);
		else
			rc = write_zeros(fd, t->nbytes);
		if (!rc)
			rc = write_zeros(fd, pad);
	}
	if (rc) {
		cm_err_set(err, rc, "gguf: write %s: %s", tmp, strerror(-rc));
		goto out_close;
	}
	if (fsync(fd) < 0 && errno != EINVAL && errno != EROFS) {
		rc = cm_err_set(err, -errno, "gguf: fsync %s: %s", tmp, strerror(errno));
		goto out_close;
	}
	/* close() may report a deferred write error (NFS, quota). */
	int crc = close(fd);
	fd = -1;
	if (crc < 0) {
		rc = cm_err_set(err, -errno, "gguf: close %s: %s", tmp, strerror(errno));
		goto out_unlink;
	}
	if (rename(tmp, path) < 0) {
		rc = cm_err_set(err, -errno, "gguf: rename %s to %s: %s", tmp, path,
		                strerror(errno));
		goto out_unlink;
	}
	goto out_free_meta;

out_close:
	if (fd >= 0)
		close(fd);
out_unlink:
	(void)unlink(tmp);
out_free_meta:
	cm_free(lo.meta);
out_free_tmp:
	cm_free(tmp);
	return rc;
}
