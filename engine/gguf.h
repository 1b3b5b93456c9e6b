/* engine/gguf.h: GGUF container reader (mmap, fully validated; gguf.c) and
 * writer (gguf_write.c).
 *
 * The reader treats the file as untrusted. gguf_open() checks every count,
 * length, offset and dimension against the file size with overflow-checked
 * arithmetic before using it; a damaged file yields -EPROTO (or -EINVAL,
 * -ENOMEM, -errno from the OS) and a one-line message naming what and where,
 * e.g. "gguf: kv 'llama.context_length' (offset 1234): string length 99999999
 * exceeds file size". After a successful open, every kv and tensor is known
 * to lie inside the mapping, so accessors need no further checks.
 *
 * Supported: GGUF v2 and v3, little-endian, every metadata type (nested
 * arrays rejected, as llama.cpp does), general.alignment, any aligned,
 * in-bounds, non-overlapping tensor offsets, files without the trailing pad
 * (vocab-only files). Tensor types must be known ggml types
 * (engine/kernels/formats.h); whether the engine can compute with a type is
 * decided later, by the model loader.
 *
 * Tools and tests use this header directly (edgelm-gguf, edgelm-quantize, the
 * fixture generators); it is part of the engine's semi-public surface. */
#ifndef EDGELM_ENGINE_GGUF_H
#define EDGELM_ENGINE_GGUF_H

#include "common/common.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
	GGUF_TYPE_COUNT
};

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_HEADER_SIZE 24     /* magic, version, tensor count, kv count */
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64 /* tensor names must be shorter (llama.cpp's rule) */
#define GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapping: not NUL-terminated. */
struct gguf_str {
	const char *ptr;
	uint64_t len;
};

struct gguf_kv {
	struct gguf_str key;
	enum gguf_vtype type;   /* value type; GGUF_TYPE_ARRAY for arrays */
	enum gguf_vtype arr_type; /* element type when type == ARRAY */
	uint64_t arr_n;         /* element count when type == ARRAY */
	const uint8_t *data;    /* the raw value (scalar) or first element (array) */
	uint64_t offset;        /* file offset of the record, for messages */
	/* Scalar values decoded once at open time. */
	union {
		uint64_t u64;
		int64_t i64;
		double f64;
		bool b;
		struct gguf_str str;
	} v;
};

struct gguf_tensor {
	char name[GGUF_MAX_NAME];
	uint32_t n_dims;
	int64_t ne[GGUF_MAX_DIMS]; /* missing dims are 1 */
	uint32_t type;             /* ggml type id (enum engine_dtype) */
	uint64_t offset;           /* relative to data_start */
	uint64_t nbytes;
	uint64_t row_bytes;        /* bytes of one ne[0] row */
	const void *data;          /* inside the mapping */
};

struct gguf_file {
	const uint8_t *base; /* mapping (or caller memory for gguf_open_mem) */
	size_t size;
	bool mapped;
	/* gguf_open: the file's identity as opened (the repack cache's key) */
	uint64_t dev, ino, mtime_ns;
	char path[4096];
	uint32_t version;
	uint32_t alignment;
	uint64_t data_start;
	uint64_t n_kv;
	struct gguf_kv *kv;
	uint64_t n_tensors;
	struct gguf_tensor *tensors;
	void *index; /* private: hash indexes for key/name lookup */
};

/* Open and validate a file. On success *ret_file owns the mapping. */
int gguf_open(const char *path, struct gguf_file **ret_file, struct cm_err *err);
/* Same over caller memory (fuzzing, tests). `buf` must outlive the result. */
int gguf_open_mem(const void *buf, size_t size, struct gguf_file **ret_file, struct cm_err *err);
void gguf_close(struct gguf_file *f); /* NULL-safe */

const struct gguf_kv *gguf_find_kv(const struct gguf_file *f, const char *key);
const struct gguf_tensor *gguf_tensor_by_name(const struct gguf_file *f, const char *name);

/* Typed getters. They return 0, -ENOENT when the key is missing (err is then
 * left untouched so callers can apply a default), or -EPROTO with a message
 * when the key has an incompatible type or an out-of-range value. Integer
 * getters accept any integer type (and bool) and range-check; float getters
 * accept FLOAT32/FLOAT64 and integers. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *ret, struct cm_err *err);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *ret, struct cm_err *err);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *ret, struct cm_err *err);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *ret, struct cm_err *err);
int gguf_get_str(const struct gguf_file *f, const char *key, struct gguf_str *ret, struct cm_err *err);
/* An array with a given element type (-EPROTO if the type differs). For
 * numeric arrays *ret_data points at the packed little-endian elements (not
 * necessarily aligned: read with memcpy). For string arrays use
 * gguf_arr_strings(). */
int gguf_get_arr(const struct gguf_file *f, const char *key, enum gguf_vtype elem_type,
		 const void **ret_data, uint64_t *ret_n, struct cm_err *err);
/* Decode a string array into a freshly allocated vector of gguf_str that
 * point into the mapping. The caller frees *ret_strs with cm_free. */
int gguf_arr_strings(const struct gguf_file *f, const char *key, struct gguf_str **ret_strs,
		     uint64_t *ret_n, struct cm_err *err);

const char *gguf_vtype_name(enum gguf_vtype t);
/* Size in bytes of one element of a fixed-size type, 0 for STRING/ARRAY. */
size_t gguf_vtype_size(enum gguf_vtype t);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(struct gguf_str s, const char *c);

/* ---- writer ------------------------------------------------------------ */

/* Builds a GGUF v3 file in memory (metadata) and writes it out with tensor
 * data streamed from the caller's buffers. Keys keep insertion order; setting
 * an existing key replaces its value. */
struct gguf_writer;

int gguf_writer_new(struct gguf_writer **ret_w, struct cm_err *err);
void gguf_writer_free(struct gguf_writer *w); /* NULL-safe */

int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(struct gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_u64(struct gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *v);
/* Any fixed-size scalar type (UINT8..FLOAT64, BOOL): `v` points at one value
 * of that type in host order (copied). -EINVAL for STRING/ARRAY. */
int gguf_writer_set_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype type,
			   const void *v);
/* Numeric array: `data` holds n packed elements of elem_type (copied). */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type,
			const void *data, uint64_t n);
/* String array: strs[i] with lengths lens[i] (lens may be NULL: strlen). */
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
			    const size_t *lens, uint64_t n);
/* Copy every kv of `src` except those for which skip(key) returns true. */
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src,
			bool (*skip)(const char *key, void *ctx), void *ctx);
void gguf_writer_remove(struct gguf_writer *w, const char *key);

/* Add a tensor. `data` (nbytes as implied by type and ne) is NOT copied: it
 * must stay valid until gguf_writer_write(). */
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
			   uint32_t n_dims, const int64_t *ne, const void *data, struct cm_err *err);

/* Write the file (to path.tmp, then rename). Returns 0 or -errno. */
int gguf_writer_write(struct gguf_writer *w, const char *path, struct cm_err *err);
/* Serialize into a malloc'ed buffer (tests, fuzz seeds). */
int gguf_writer_write_mem(struct gguf_writer *w, uint8_t **ret_buf, size_t *ret_size,
			  struct cm_err *err);

#endif
