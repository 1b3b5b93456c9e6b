/* tests/unit/test_engine_gguf_damaged.c: the damaged-file suite.
 *
 * A valid, model-like GGUF is built in memory with our writer; damaged
 * variants are derived from it and each must be rejected by gguf_open_mem()
 * with -EPROTO and a one-line message containing the expected words:
 *   - a table of targeted mutations (counts, lengths, types, dims, offsets,
 *     alignment, duplicates, version/magic/endianness);
 *   - truncation at every byte offset;
 *   - thousands of random byte flips (fixed seed), which must never crash:
 *     they either fail with a message or open (a flip in tensor data is
 *     legal), in which case every accessor is exercised.
 * Each variant is given to the reader in an exact-size heap copy so that the
 * ASan pass catches any read past the end.
 *
 * `test_engine_gguf_damaged --write-dir DIR` writes each table variant to
 * DIR/<name>.gguf with its expected words in DIR/<name>.expect (and the
 * intact file as DIR/valid.gguf), for tests/integration/damaged_gguf.sh. */
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/test.h"

#include <stdint.h>

/* ---- the base file ---------------------------------------------------------- */

#define N_TOK 16
#define N_EMBD 64

static uint8_t *base;
static size_t base_size;

static uint8_t embd[N_EMBD / 32 * 34 * N_TOK]; /* Q8_0 [64, 16] */
static float norm[N_EMBD];                     /* F32 [64] */
static uint8_t wq[N_EMBD / 32 * 18 * N_EMBD];  /* Q4_0 [64, 64] */
static uint8_t wk[N_EMBD / 32 * 18 * N_EMBD];  /* Q4_0 [64, 64] */
static uint16_t out[N_EMBD * N_TOK];           /* F16 [64, 16] */

static int build_base(void)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	static const char *const toks[N_TOK] = {"<unk>",  "<s>", "</s>", "\xe2\x96\x81",
	                                        "a",      "b",   "c",    "\xe2\x96\x81the",
	                                        "<0x0A>", "e",   "f",    "g",
	                                        "h",      "i",   "j",    "k"};
	float scores[N_TOK];
	int32_t types[N_TOK];
	int rc = 0;
	for (int i = 0; i < N_TOK; i++) {
		scores[i] = -(float)i;
		types[i] = i < 3 ? 3 : 1;
	}
	for (size_t i = 0; i < sizeof(embd); i++)
		embd[i] = (uint8_t)(i * 13);
	for (int i = 0; i < N_EMBD; i++)
		norm[i] = 1.0f + (float)i / 64;
	memset(wq, 0x11, sizeof(wq));
	memset(wk, 0x22, sizeof(wk));
	for (size_t i = 0; i < CM_ARRAY_LEN(out); i++)
		out[i] = 0x3c00;

	if (gguf_writer_new(&w, &err))
		return -1;
	/* kv 3 and kv 4 have keys of the same length (17): see "dup-key". */
	rc |= gguf_writer_set_str(w, "general.architecture", "llama");
	rc |= gguf_writer_set_str(w, "general.name", "damage-test");
	rc |= gguf_writer_set_u32(w, "general.alignment", 32);
	rc |= gguf_writer_set_u32(w, "general.file_type", 7);
	rc |= gguf_writer_set_u32(w, "llama.block_count", 1);
	rc |= gguf_writer_set_u32(w, "llama.context_length", 128);
	rc |= gguf_writer_set_u32(w, "llama.embedding_length", N_EMBD);
	rc |= gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
	rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
	rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, N_TOK);
	rc |= gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, N_TOK);
	rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, N_TOK);
	rc |= gguf_writer_set_u64(w, "general.parameter_count", 12345);
	const int64_t ne_embd[] = {N_EMBD, N_TOK}, ne_norm[] = {N_EMBD}, ne_w[] = {N_EMBD, N_EMBD};
	/* tensors 2 and 3 have names of the same length: see "dup-tensor". */
	rc |= gguf_writer_add_tensor(w, "token_embd.weight", ENGINE_DTYPE_Q8_0, 2, ne_embd, embd,
	                             &err);
	rc |= gguf_writer_add_tensor(w, "blk.0.attn_norm.weight", ENGINE_DTYPE_F32, 1, ne_norm,
	                             norm, &err);
	rc |=
	    gguf_writer_add_tensor(w, "blk.0.attn_q.weight", ENGINE_DTYPE_Q4_0, 2, ne_w, wq, &err);
	rc |=
	    gguf_writer_add_tensor(w, "blk.0.attn_k.weight", ENGINE_DTYPE_Q4_0, 2, ne_w, wk, &err);
	rc |= gguf_writer_add_tensor(w, "output.weight", ENGINE_DTYPE_F16, 2, ne_embd, out, &err);
	if (!rc)
		rc = gguf_writer_write_mem(w, &base, &base_size, &err);
	gguf_writer_free(w);
	return rc;
}

/* ---- where each field of the base file is ----------------------------------- */

#define MAX_KV 16
#define MAX_T 8

struct kv_loc {
	size_t rec;  /* key length */
	size_t type; /* value type */
	size_t val;  /* value; for arrays the element type (count at +4, elements at +12) */
};

struct t_loc {
	size_t rec; /* name length */
	size_t n_dims, dims, type, offset;
};

static struct {
	size_t n_kv, n_t;
	struct kv_loc kv[MAX_KV];
	struct t_loc t[MAX_T];
	size_t info_end;
} lo;

static uint64_t get64(size_t at)
{
	uint64_t v;
	memcpy(&v, base + at, 8);
	return v;
}

static uint32_t get32(size_t at)
{
	uint32_t v;
	memcpy(&v, base + at, 4);
	return v;
}

/* Walk the (valid) base file independently of the reader. */
static void locate(void)
{
	size_t p = 24;
	lo.n_t = get64(8);
	lo.n_kv = get64(16);
	for (size_t i = 0; i < lo.n_kv; i++) {
		struct kv_loc *k = &lo.kv[i];
		k->rec = p;
		k->type = p + 8 + get64(p);
		k->val = k->type + 4;
		uint32_t t = get32(k->type);
		p = k->val;
		if (t == GGUF_TYPE_STRING) {
			p += 8 + get64(p);
		} else if (t == GGUF_TYPE_ARRAY) {
			uint32_t et = get32(p);
			uint64_t n = get64(p + 4);
			p += 12;
			for (uint64_t j = 0; j < n; j++)
				p += et == GGUF_TYPE_STRING ? 8 + get64(p) : gguf_vtype_size(et);
		} else {
			p += gguf_vtype_size(t);
		}
	}
	for (size_t i = 0; i < lo.n_t; i++) {
		struct t_loc *t = &lo.t[i];
		t->rec = p;
		t->n_dims = p + 8 + get64(p);
		t->dims = t->n_dims + 4;
		t->type = t->dims + 8 * get32(t->n_dims);
		t->offset = t->type + 4;
		p = t->offset + 8;
	}
	lo.info_end = p;
}

/* ---- the mutation table ------------------------------------------------------ */

enum field {
	F_SIZE,      /* truncate to value */
	F_SIZE_KV,   /* truncate to the value of kv idx + value */
	F_SIZE_T,    /* truncate to the dims of tensor idx + value */
	F_SIZE_INFO, /* truncate to the end of the tensor infos + value */
	F_SIZE_END,  /* truncate to the file size + value (negative) */
	F_MAGIC,     /* 4 bytes at 0 from value (big-endian notation) */
	F_VERSION,
	F_NT,
	F_NKV,
	F_KEY_LEN,      /* kv idx */
	F_KEY_BYTES,    /* kv idx: key replaced by the key of kv sub (same length) */
	F_VTYPE,        /* kv idx */
	F_VAL32,        /* kv idx: scalar u32 value */
	F_STR_LEN,      /* kv idx: string value length */
	F_ARR_TYPE,     /* kv idx */
	F_ARR_N,        /* kv idx */
	F_ARR_ELEM_LEN, /* kv idx, string element sub */
	F_NAME_LEN,     /* tensor idx */
	F_NAME_BYTE,    /* tensor idx: name byte sub set to value */
	F_NAME_BYTES,   /* tensor idx: name replaced by the name of tensor sub */
	F_NDIMS,
	F_DIM, /* tensor idx, dim sub */
	F_TTYPE,
	F_TOFF,
};

enum vkind {
	V_LIT,       /* value */
	V_LEFT_PLUS, /* bytes left after the field + value */
	V_FIT_KV,    /* most kv records that fit + value */
	V_FIT_T,     /* most tensor records that fit + value */
	V_TOFF,      /* offset of tensor value */
	V_ADD,       /* the field's current value + value */
	V_SIZE_ADD,  /* file size + value (wrapping) */
};

struct mutation {
	const char *name;
	enum field fld;
	int idx, sub;
	enum vkind vk;
	uint64_t value;
	const char *expect;
};

#define M64 UINT64_MAX
#define P63 (1ull << 63)

/* Indexes into the base file (see build_base). */
enum {
	KV_NAME = 1,
	KV_ALIGN = 2,
	KV_FTYPE = 3,
	KV_NBLK = 4,
	KV_EPS = 7,
	KV_TOKENS = 10,
	KV_SCORES = 11,
	KV_TTYPE = 12
};
enum { T_EMBD = 0, T_NORM = 1, T_Q = 2, T_K = 3, T_OUT = 4 };

/* clang-format off */
static const struct mutation mutations[] = {
	/* header */
	{ "empty", F_SIZE, 0, 0, V_LIT, 0, "empty file" },
	{ "trunc-3", F_SIZE, 0, 0, V_LIT, 3, "not a GGUF file" },
	{ "trunc-header", F_SIZE, 0, 0, V_LIT, 20, "file truncated at offset 8 reading header" },
	{ "magic-ggml", F_MAGIC, 0, 0, V_LIT, 0x47474d4c, "not a GGUF file (magic 47474d4c)" },
	{ "magic-elf", F_MAGIC, 0, 0, V_LIT, 0x7f454c46, "not a GGUF file (magic 7f454c46)" },
	{ "magic-zero", F_MAGIC, 0, 0, V_LIT, 0, "not a GGUF file (magic 00000000)" },
	{ "version-0", F_VERSION, 0, 0, V_LIT, 0, "unsupported version 0" },
	{ "version-1", F_VERSION, 0, 0, V_LIT, 1, "unsupported version 1" },
	{ "version-4", F_VERSION, 0, 0, V_LIT, 4, "unsupported version 4" },
	{ "version-max", F_VERSION, 0, 0, V_LIT, 0xffffffff, "unsupported version 4294967295" },
	{ "byteswapped-v3", F_VERSION, 0, 0, V_LIT, 0x03000000, "byte-swapped (big-endian)" },
	{ "byteswapped-v2", F_VERSION, 0, 0, V_LIT, 0x02000000, "byte-swapped (big-endian)" },
	{ "tensor-count-2p63", F_NT, 0, 0, V_LIT, P63,
	  "tensor_count 9223372036854775808 too large" },
	{ "tensor-count-max", F_NT, 0, 0, V_LIT, M64,
	  "tensor_count 18446744073709551615 too large" },
	{ "tensor-count-over-fit", F_NT, 0, 0, V_FIT_T, 1, "tensor_count" },
	{ "tensor-count-plus-1", F_NT, 0, 0, V_ADD, 1, "tensor 5" },
	{ "kv-count-2p63", F_NKV, 0, 0, V_LIT, P63, "kv_count 9223372036854775808 too large" },
	{ "kv-count-max", F_NKV, 0, 0, V_LIT, M64, "kv_count 18446744073709551615 too large" },
	{ "kv-count-over-fit", F_NKV, 0, 0, V_FIT_KV, 1, "kv_count" },
	{ "kv-count-plus-1", F_NKV, 0, 0, V_ADD, 1, "gguf: " },
	{ "kv-count-minus-1", F_NKV, 0, 0, V_ADD, M64, "tensor 0" },
	/* kv records */
	{ "key-len-max", F_KEY_LEN, KV_FTYPE, 0, V_LIT, M64,
	  "kv 3: key length 18446744073709551615 exceeds file size" },
	{ "key-len-2p63", F_KEY_LEN, KV_FTYPE, 0, V_LIT, P63, "key length 9223372036854775808" },
	{ "key-len-past-end", F_KEY_LEN, KV_FTYPE, 0, V_LEFT_PLUS, 1, "runs past end of file" },
	{ "key-len-0", F_KEY_LEN, KV_FTYPE, 0, V_LIT, 0, "kv 3: empty key" },
	{ "str-len-max", F_STR_LEN, KV_NAME, 0, V_LIT, M64,
	  "kv 1 'general.name': string length 18446744073709551615 exceeds file size" },
	{ "str-len-past-end", F_STR_LEN, KV_NAME, 0, V_LEFT_PLUS, 1,
	  "'general.name': string length" },
	{ "vtype-13", F_VTYPE, KV_FTYPE, 0, V_LIT, 13,
	  "kv 3 'general.file_type': unknown value type 13" },
	{ "vtype-max", F_VTYPE, KV_FTYPE, 0, V_LIT, 0xffffffff, "unknown value type 4294967295" },
	{ "arr-nested", F_ARR_TYPE, KV_TOKENS, 0, V_LIT, GGUF_TYPE_ARRAY,
	  "'tokenizer.ggml.tokens': nested arrays are not supported" },
	{ "arr-elem-type-13", F_ARR_TYPE, KV_SCORES, 0, V_LIT, 13,
	  "unknown array element type 13" },
	{ "arr-count-max", F_ARR_N, KV_TOKENS, 0, V_LIT, M64,
	  "'tokenizer.ggml.tokens': array count 18446744073709551615 exceeds file size" },
	{ "arr-count-2p61", F_ARR_N, KV_TOKENS, 0, V_LIT, 1ull << 61,
	  "array count 2305843009213693952" },
	{ "arr-count-f32-2p62", F_ARR_N, KV_SCORES, 0, V_LIT, 1ull << 62,
	  "'tokenizer.ggml.scores': array count 4611686018427387904" },
	{ "arr-count-i32-past-end", F_ARR_N, KV_TTYPE, 0, V_LEFT_PLUS, 0,
	  "'tokenizer.ggml.token_type': array count" },
	{ "arr-count-str-past-end", F_ARR_N, KV_TOKENS, 0, V_ADD, 200, "tokenizer.ggml.tokens" },
	{ "arr-str-len-max", F_ARR_ELEM_LEN, KV_TOKENS, 3, V_LIT, M64,
	  "element 3: string length 18446744073709551615 exceeds file size" },
	{ "arr-str-len-past-end", F_ARR_ELEM_LEN, KV_TOKENS, 15, V_LEFT_PLUS, 1,
	  "element 15: string length" },
	{ "dup-key", F_KEY_BYTES, KV_FTYPE, KV_NBLK, V_LIT, 0,
	  "duplicate key 'llama.block_count' (first at kv 3)" },
	{ "align-0", F_VAL32, KV_ALIGN, 0, V_LIT, 0,
	  "kv 'general.alignment': must be a power of two, got 0" },
	{ "align-3", F_VAL32, KV_ALIGN, 0, V_LIT, 3, "must be a power of two, got 3" },
	{ "align-48", F_VAL32, KV_ALIGN, 0, V_LIT, 48, "must be a power of two, got 48" },
	{ "align-int32", F_VTYPE, KV_ALIGN, 0, V_LIT, GGUF_TYPE_INT32,
	  "kv 'general.alignment': must be UINT32, got INT32" },
	{ "align-f32", F_VTYPE, KV_ALIGN, 0, V_LIT, GGUF_TYPE_FLOAT32,
	  "must be UINT32, got FLOAT32" },
	{ "align-2p31", F_VAL32, KV_ALIGN, 0, V_LIT, 1u << 31,
	  "data offset 1088 is not a multiple of the alignment 2147483648" },
	{ "align-64", F_VAL32, KV_ALIGN, 0, V_LIT, 64, "gguf: " },
	/* tensor infos */
	{ "name-len-0", F_NAME_LEN, T_Q, 0, V_LIT, 0, "tensor 2: empty name" },
	{ "name-len-64", F_NAME_LEN, T_Q, 0, V_LIT, 64, "tensor 2: name length 64 too long" },
	{ "name-len-max", F_NAME_LEN, T_Q, 0, V_LIT, M64,
	  "name length 18446744073709551615 too long" },
	{ "name-nul", F_NAME_BYTE, T_Q, 5, V_LIT, 0, "contains a NUL byte" },
	{ "dup-tensor", F_NAME_BYTES, T_K, T_Q, V_LIT, 0,
	  "duplicate tensor name 'blk.0.attn_q.weight' (first at tensor 2)" },
	{ "ndims-0", F_NDIMS, T_Q, 0, V_LIT, 0,
	  "'blk.0.attn_q.weight': n_dims 0 out of range 1..4" },
	{ "ndims-5", F_NDIMS, T_Q, 0, V_LIT, 5, "n_dims 5 out of range" },
	{ "ndims-max", F_NDIMS, T_Q, 0, V_LIT, 0xffffffff, "n_dims 4294967295 out of range" },
	{ "dim0-0", F_DIM, T_Q, 0, V_LIT, 0, "dimension 0 is 0 (must be >= 1)" },
	{ "dim1-0", F_DIM, T_Q, 1, V_LIT, 0, "dimension 1 is 0" },
	{ "dim1-neg", F_DIM, T_Q, 1, V_LIT, M64, "dimension 1 is -1" },
	{ "dim0-min", F_DIM, T_NORM, 0, V_LIT, P63, "dimension 0 is -9223372036854775808" },
	{ "dims-overflow", F_DIM, T_Q, 1, V_LIT, 1ull << 62, "element count overflows" },
	{ "dims-bytes-overflow", F_DIM, T_NORM, 0, V_LIT, 1ull << 62,
	  "'blk.0.attn_norm.weight': byte size overflows" },
	{ "dims-max-i64", F_DIM, T_NORM, 0, V_LIT, P63 - 1, "byte size overflows" },
	{ "dims-huge", F_DIM, T_OUT, 1, V_LIT, 1ull << 56, "'output.weight': data [" },
	{ "ne0-not-block", F_DIM, T_Q, 0, V_LIT, 48,
	  "ne[0] = 48 is not a multiple of the Q4_0 block size 32" },
	{ "ne0-not-block-q8", F_DIM, T_EMBD, 0, V_LIT, 65,
	  "not a multiple of the Q8_0 block size" },
	{ "type-4", F_TTYPE, T_Q, 0, V_LIT, 4, "'blk.0.attn_q.weight': unknown tensor type 4" },
	{ "type-5", F_TTYPE, T_Q, 0, V_LIT, 5, "unknown tensor type 5" },
	{ "type-31", F_TTYPE, T_Q, 0, V_LIT, 31, "unknown tensor type 31" },
	{ "type-36", F_TTYPE, T_Q, 0, V_LIT, 36, "unknown tensor type 36" },
	{ "type-39", F_TTYPE, T_Q, 0, V_LIT, 39, "unknown tensor type 39" },
	{ "type-1000", F_TTYPE, T_Q, 0, V_LIT, 1000, "unknown tensor type 1000" },
	{ "type-max", F_TTYPE, T_Q, 0, V_LIT, 0xffffffff, "unknown tensor type 4294967295" },
	{ "offset-misaligned", F_TOFF, T_Q, 0, V_ADD, 1, "is not a multiple of the alignment 32" },
	{ "offset-misaligned-16", F_TOFF, T_Q, 0, V_ADD, 16, "is not a multiple of the alignment" },
	{ "offset-past-end", F_TOFF, T_Q, 0, V_LIT, 1ull << 40,
	  "tensor 'blk.0.attn_q.weight': data [" },
	{ "offset-at-end", F_TOFF, T_OUT, 0, V_SIZE_ADD, 0, "past end of file" },
	{ "offset-overflow", F_TOFF, T_Q, 0, V_LIT, M64 - 31, "overflows" },
	{ "offset-last-shifted", F_TOFF, T_OUT, 0, V_ADD, 32, "past end of file" },
	{ "overlap-same", F_TOFF, T_K, 0, V_TOFF, T_Q, "overlap" },
	{ "overlap-first", F_TOFF, T_OUT, 0, V_TOFF, T_EMBD, "overlap" },
	{ "overlap-partial", F_TOFF, T_Q, 0, V_ADD, (uint64_t)-32, "overlap" },
	/* truncation at chosen places */
	{ "trunc-in-kv", F_SIZE_KV, 13, 0, V_LIT, 4,
	  "file truncated at offset 892 reading kv 13 'general.parameter_count' UINT64 value" },
	{ "trunc-in-tokens", F_SIZE_KV, KV_TOKENS, 0, V_LIT, 10,
	  "truncated at offset 458 reading kv 10 'tokenizer.ggml.tokens' array header" },
	{ "trunc-in-tensor-info", F_SIZE_T, T_Q, 0, V_LIT, 3,
	  "reading tensor 2 'blk.0.attn_q.weight' dims" },
	{ "trunc-before-data", F_SIZE_INFO, 0, 0, V_LIT, 1,
	  "tensor 'token_embd.weight': data [1184, 2272) past end of file (1183 bytes)" },
	{ "trunc-last-byte", F_SIZE_END, 0, 0, V_LIT, M64,
	  "tensor 'output.weight': data [7136, 9184) past end of file (9183 bytes)" },
};
/* clang-format on */

/* Where a field is, and its width in bytes (4 or 8). */
static size_t field_at(const struct mutation *m, int *width)
{
	*width = 8;
	switch (m->fld) {
	case F_MAGIC:
	case F_VERSION:
		*width = 4;
		return m->fld == F_MAGIC ? 0 : 4;
	case F_NT:
		return 8;
	case F_NKV:
		return 16;
	case F_KEY_LEN:
		return lo.kv[m->idx].rec;
	case F_VTYPE:
		*width = 4;
		return lo.kv[m->idx].type;
	case F_VAL32:
		*width = 4;
		return lo.kv[m->idx].val;
	case F_STR_LEN:
		return lo.kv[m->idx].val;
	case F_ARR_TYPE:
		*width = 4;
		return lo.kv[m->idx].val;
	case F_ARR_N:
		return lo.kv[m->idx].val + 4;
	case F_ARR_ELEM_LEN: {
		size_t p = lo.kv[m->idx].val + 12;
		for (int j = 0; j < m->sub; j++)
			p += 8 + get64(p);
		return p;
	}
	case F_NAME_LEN:
		return lo.t[m->idx].rec;
	case F_NDIMS:
		*width = 4;
		return lo.t[m->idx].n_dims;
	case F_DIM:
		return lo.t[m->idx].dims + 8 * (size_t)m->sub;
	case F_TTYPE:
		*width = 4;
		return lo.t[m->idx].type;
	case F_TOFF:
		return lo.t[m->idx].offset;
	default:
		return 0;
	}
}

/* Apply a mutation to a copy of the base file. Returns the damaged size;
 * *ret_buf is an exact-size heap buffer (NULL when the size is 0). */
static size_t apply(const struct mutation *m, uint8_t **ret_buf)
{
	size_t size = base_size;
	uint8_t *b = malloc(base_size);
	memcpy(b, base, base_size);
	*ret_buf = b;
	if (m->fld == F_SIZE) {
		size = (size_t)m->value;
	} else if (m->fld == F_SIZE_KV) {
		size = lo.kv[m->idx].val + (size_t)m->value;
	} else if (m->fld == F_SIZE_T) {
		size = lo.t[m->idx].dims + (size_t)m->value;
	} else if (m->fld == F_SIZE_INFO) {
		size = lo.info_end + (size_t)m->value;
	} else if (m->fld == F_SIZE_END) {
		size = base_size + (size_t)m->value;
	} else if (m->fld == F_KEY_BYTES) {
		const struct kv_loc *a = &lo.kv[m->idx], *s = &lo.kv[m->sub];
		memcpy(b + a->rec + 8, base + s->rec + 8, get64(s->rec));
	} else if (m->fld == F_NAME_BYTES) {
		const struct t_loc *a = &lo.t[m->idx], *s = &lo.t[m->sub];
		memcpy(b + a->rec + 8, base + s->rec + 8, get64(s->rec));
	} else if (m->fld == F_NAME_BYTE) {
		b[lo.t[m->idx].rec + 8 + (size_t)m->sub] = (uint8_t)m->value;
	} else if (m->fld == F_MAGIC) {
		for (int i = 0; i < 4; i++)
			b[i] = (uint8_t)(m->value >> (24 - 8 * i));
	} else {
		int width;
		size_t at = field_at(m, &width);
		uint64_t cur = width == 4 ? get32(at) : get64(at), v = m->value;
		switch (m->vk) {
		case V_LIT:
			break;
		case V_LEFT_PLUS:
			v = base_size - (at + width) + m->value;
			break;
		case V_FIT_KV:
			v = (base_size - 24) / 14 + m->value;
			break;
		case V_FIT_T:
			v = (base_size - 24) / 33 + m->value;
			break;
		case V_TOFF:
			v = get64(lo.t[m->value].offset);
			break;
		case V_ADD:
			v = cur + m->value;
			break;
		case V_SIZE_ADD:
			v = base_size + m->value;
			break;
		}
		if (m->vk == V_SIZE_ADD)
			v = cm_align_up(v, 32);
		if (width == 4) {
			uint32_t v32 = (uint32_t)v;
			memcpy(b + at, &v32, 4);
		} else {
			memcpy(b + at, &v, 8);
		}
	}
	if (size != base_size) {
		uint8_t *t = size ? malloc(size) : NULL;
		if (size)
			memcpy(t, b, size);
		free(b);
		*ret_buf = t;
	}
	return size;
}

/* ---- checks ------------------------------------------------------------------ */

static bool one_printable_line(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

static volatile uint8_t sink;

/* Read the first and last byte of a range (ASan checks both). */
static void touch(const void *p, uint64_t n)
{
	if (n) {
		sink ^= ((const uint8_t *)p)[0];
		sink ^= ((const uint8_t *)p)[n - 1];
	}
}

/* Use everything an opened file offers, as a consumer would. */
static void exercise(const struct gguf_file *f)
{
	struct cm_err err;
	char key[512];
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		size_t n = kv->key.len < sizeof(key) - 1 ? (size_t)kv->key.len : sizeof(key) - 1;
		memcpy(key, kv->key.ptr, n);
		key[n] = '\0';
		uint32_t u32;
		int64_t i64;
		float f32;
		bool b;
		struct gguf_str s;
		const void *data;
		uint64_t an;
		(void)gguf_get_u32(f, key, &u32, &err);
		(void)gguf_get_i64(f, key, &i64, &err);
		(void)gguf_get_f32(f, key, &f32, &err);
		(void)gguf_get_bool(f, key, &b, &err);
		if (gguf_get_str(f, key, &s, &err) == 0)
			touch(s.ptr, s.len);
		if (kv->type == GGUF_TYPE_ARRAY && kv->arr_type != GGUF_TYPE_STRING &&
		    gguf_get_arr(f, key, kv->arr_type, &data, &an, &err) == 0)
			touch(data, an * gguf_vtype_size(kv->arr_type));
		struct gguf_str *sv = NULL;
		if (gguf_arr_strings(f, key, &sv, &an, &err) == 0) {
			for (uint64_t j = 0; j < an; j++)
				touch(sv[j].ptr, sv[j].len);
			cm_free(sv);
		}
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		CHECK(gguf_tensor_by_name(f, t->name) == t);
		touch(t->data, t->nbytes);
		CHECK((const uint8_t *)t->data + t->nbytes <= f->base + f->size);
	}
}

/* Open a damaged buffer; it must fail with -EPROTO and a printable
 * one-line message. Returns the message (static) or NULL if it opened. */
static const char *open_damaged(const uint8_t *buf, size_t size, const char *what)
{
	static struct cm_err err;
	struct gguf_file *f = NULL;
	memset(&err, 0, sizeof(err));
	int rc = gguf_open_mem(buf, size, &f, &err);
	if (rc == 0) {
		exercise(f);
		gguf_close(f);
		return NULL;
	}
	CHECK_MSG(rc == -EPROTO, "%s: rc %d (%s)", what, rc, err.msg);
	CHECK_MSG(f == NULL, "%s: file set on failure", what);
	CHECK_MSG(err.code == rc, "%s: err.code %d, rc %d", what, err.code, rc);
	CHECK_MSG(one_printable_line(err.msg), "%s: message not one printable line: '%s'", what,
	          err.msg);
	CHECK_MSG(strncmp(err.msg, "gguf: ", 6) == 0, "%s: message '%s'", what, err.msg);
	return err.msg;
}

static void test_base_valid(void)
{
	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	CHECK_OK(gguf_open_mem(base, base_size, &f, &err));
	if (!f)
		return;
	CHECK_EQ_INT(f->n_kv, 14);
	CHECK_EQ_INT(f->n_tensors, 5);
	CHECK_EQ_INT(lo.n_kv, 14);
	CHECK_EQ_INT(lo.n_t, 5);
	for (size_t i = 0; i < lo.n_kv; i++)
		CHECK_EQ_INT(f->kv[i].offset, lo.kv[i].rec);
	CHECK(gguf_str_eq(f->kv[KV_FTYPE].key, "general.file_type"));
	CHECK(gguf_str_eq(f->kv[KV_NBLK].key, "llama.block_count"));
	CHECK(gguf_str_eq(f->kv[KV_ALIGN].key, "general.alignment"));
	CHECK(gguf_str_eq(f->kv[KV_TOKENS].key, "tokenizer.ggml.tokens"));
	CHECK_STREQ(f->tensors[T_Q].name, "blk.0.attn_q.weight");
	CHECK_EQ_INT(f->data_start, cm_align_up(lo.info_end, 32));
	exercise(f);
	gguf_close(f);
}

static void test_mutations(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(mutations); i++) {
		const struct mutation *m = &mutations[i];
		uint8_t *buf;
		size_t size = apply(m, &buf);
		const char *msg = open_damaged(buf, size, m->name);
		CHECK_MSG(msg != NULL, "%s: damaged file opened", m->name);
		if (msg)
			CHECK_MSG(strstr(msg, m->expect) != NULL, "%s: message '%s' lacks '%s'",
			          m->name, msg, m->expect);
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "  %-24s %s\n", m->name, msg ? msg : "(opened)");
		free(buf);
	}
}

/* Every truncation fails, and says so in terms of the file's end. */
static void test_truncation(void)
{
	for (size_t s = 0; s < base_size; s++) {
		uint8_t *buf = s ? malloc(s) : NULL;
		char what[48];
		if (s)
			memcpy(buf, base, s);
		snprintf(what, sizeof(what), "truncated to %zu", s);
		const char *msg = open_damaged(buf, s, what);
		CHECK_MSG(msg != NULL, "%s: opened", what);
		if (msg)
			CHECK_MSG(strstr(msg, "truncated") || strstr(msg, "end of file") ||
			              strstr(msg, "file size") || strstr(msg, "empty file") ||
			              strstr(msg, "not a GGUF file"),
			          "%s: message '%s'", what, msg);
		free(buf);
	}
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* Random damage with a fixed seed: never a crash, a leak or an overread. */
static void test_random_flips(void)
{
	static const uint64_t interesting[] = {
	    0, 1, 2, 4, 31, 32, 64, 0xff, 0x7fffffff, 0xffffffff, 1ull << 32, P63, M64, M64 - 1};
	size_t data_start = cm_align_up(lo.info_end, 32);
	int opened = 0, failed = 0, data_ok = 0;
	for (int it = 0; it < 6000; it++) {
		uint8_t *buf = malloc(base_size);
		memcpy(buf, base, base_size);
		int kind = (int)(rng() % 4);
		size_t pos;
		if (kind == 3) { /* anywhere in the data: must still open */
			pos = data_start + (size_t)(rng() % (base_size - data_start));
			buf[pos] ^= (uint8_t)(1 + rng() % 255);
		} else if (kind == 2) { /* an interesting value at a random place */
			uint64_t v = interesting[rng() % CM_ARRAY_LEN(interesting)];
			pos = (size_t)(rng() % (lo.info_end - 8));
			memcpy(buf + pos, &v, rng() % 2 ? 8 : 4);
		} else { /* 1..4 bytes in the metadata */
			int n = 1 + (int)(rng() % 4);
			for (int j = 0; j < n; j++) {
				pos = (size_t)(rng() % lo.info_end);
				if (kind == 0)
					buf[pos] ^= (uint8_t)(1u << (rng() % 8));
				else
					buf[pos] = (uint8_t)rng();
			}
		}
		char what[48];
		snprintf(what, sizeof(what), "flip %d (kind %d)", it, kind);
		const char *msg = open_damaged(buf, base_size, what);
		if (msg) {
			failed++;
			CHECK_MSG(kind != 3, "%s: data flip rejected: %s", what, msg);
		} else {
			opened++;
			data_ok += kind == 3;
		}
		free(buf);
	}
	/* The mix must have exercised both outcomes. */
	CHECK(opened > 1000);
	CHECK(failed > 1000);
	if (getenv("TEST_VERBOSE"))
		fprintf(stderr, "  flips: %d opened (%d data), %d failed\n", opened, data_ok,
		        failed);
}

/* ---- --write-dir ------------------------------------------------------------- */

static int write_file(const char *dir, const char *name, const char *ext, const void *p, size_t n)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s%s", dir, name, ext);
	FILE *f = fopen(path, "wb");
	if (!f) {
		perror(path);
		return -1;
	}
	size_t w = n ? fwrite(p, 1, n, f) : 0;
	if (fclose(f) != 0 || w != n) {
		perror(path);
		return -1;
	}
	return 0;
}

static int write_dir(const char *dir)
{
	int bad = 0;
	bad |= write_file(dir, "valid", ".gguf", base, base_size);
	for (size_t i = 0; i < CM_ARRAY_LEN(mutations); i++) {
		const struct mutation *m = &mutations[i];
		uint8_t *buf;
		size_t size = apply(m, &buf);
		bad |= write_file(dir, m->name, ".gguf", buf, size);
		bad |= write_file(dir, m->name, ".expect", m->expect, strlen(m->expect));
		free(buf);
	}
	return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (build_base() != 0) {
		fprintf(stderr, "test_engine_gguf_damaged: cannot build the base file\n");
		return 1;
	}
	locate();
	if (argc == 3 && strcmp(argv[1], "--write-dir") == 0) {
		int rc = write_dir(argv[2]);
		cm_free(base);
		return rc;
	}
	if (argc != 1) {
		fprintf(stderr, "usage: %s [--write-dir DIR]\n", argv[0]);
		cm_free(base);
		return 2;
	}
	TEST_RUN(test_base_valid);
	TEST_RUN(test_mutations);
	TEST_RUN(test_truncation);
	TEST_RUN(test_random_flips);
	cm_free(base);
	return test_finish();
}
