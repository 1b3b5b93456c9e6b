/* engine/kernels/formats.h: the tensor formats, the bottom layer of the
 * engine: ggml's type ids (as stored in GGUF), their block layouts, the type
 * table (names, block sizes, type sizes), half/bfloat conversion and the
 * reference (scalar) quantizers and dequantizers, which define the formats.
 *
 * The kernels (engine/kernels/kern*.c) and the rest of the engine both stand
 * on this layer; it includes only common/ and libc (docs/design.md, checked
 * by `make check-deps`). What only the engine and tools need on top of it
 * (conversion of a row of any type by id) is engine/quant.h.
 *
 * Layouts follow ggml exactly (docs: ../shared/docs/gguf-formats.md §2), so
 * files made by llama.cpp are read as written and ours are readable there.
 * Block structs are packed; multi-byte fields inside blocks are read with
 * memcpy or byte loads because blocks are not aligned.
 *
 * Every function is named quant_*: the bare names these had in engine/quant.h
 * (dequantize_row_q4_0, ...) are ggml's public API and would collide with it
 * in a program that links both. */
#ifndef EDGELM_KERN_FORMATS_H
#define EDGELM_KERN_FORMATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum engine_dtype {
	ENGINE_DTYPE_F32 = 0,
	ENGINE_DTYPE_F16 = 1,
	ENGINE_DTYPE_Q4_0 = 2,
	ENGINE_DTYPE_Q4_1 = 3,
	ENGINE_DTYPE_Q5_0 = 6,
	ENGINE_DTYPE_Q5_1 = 7,
	ENGINE_DTYPE_Q8_0 = 8,
	ENGINE_DTYPE_Q8_1 = 9,
	ENGINE_DTYPE_Q2_K = 10,
	ENGINE_DTYPE_Q3_K = 11,
	ENGINE_DTYPE_Q4_K = 12,
	ENGINE_DTYPE_Q5_K = 13,
	ENGINE_DTYPE_Q6_K = 14,
	ENGINE_DTYPE_Q8_K = 15,
	ENGINE_DTYPE_IQ2_XXS = 16,
	ENGINE_DTYPE_IQ2_XS = 17,
	ENGINE_DTYPE_IQ3_XXS = 18,
	ENGINE_DTYPE_IQ1_S = 19,
	ENGINE_DTYPE_IQ4_NL = 20,
	ENGINE_DTYPE_IQ3_S = 21,
	ENGINE_DTYPE_IQ2_S = 22,
	ENGINE_DTYPE_IQ4_XS = 23,
	ENGINE_DTYPE_I8 = 24,
	ENGINE_DTYPE_I16 = 25,
	ENGINE_DTYPE_I32 = 26,
	ENGINE_DTYPE_I64 = 27,
	ENGINE_DTYPE_F64 = 28,
	ENGINE_DTYPE_IQ1_M = 29,
	ENGINE_DTYPE_BF16 = 30,
	ENGINE_DTYPE_TQ1_0 = 34,
	ENGINE_DTYPE_TQ2_0 = 35,
	ENGINE_DTYPE_COUNT = 39
};

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK4_NL 32
#define QK_K 256
/* 6-bit scale/min pairs of Q4_K/Q5_K, packed in 12 bytes. */
#define K_SCALE_SIZE 12

struct block_q4_0 {
	uint16_t d; /* f16 */
	uint8_t qs[QK4_0 / 2];
} __attribute__((packed));

struct block_q8_0 {
	uint16_t d; /* f16 */
	int8_t qs[QK8_0];
} __attribute__((packed));

struct block_q4_1 {
	uint16_t d; /* f16 */
	uint16_t m; /* f16: the block minimum */
	uint8_t qs[QK4_1 / 2];
} __attribute__((packed));

struct block_q5_0 {
	uint16_t d;    /* f16 */
	uint8_t qh[4]; /* 5th bits, LE u32, bit e for element e */
	uint8_t qs[QK5_0 / 2];
} __attribute__((packed));

struct block_q5_1 {
	uint16_t d; /* f16 */
	uint16_t m; /* f16 */
	uint8_t qh[4];
	uint8_t qs[QK5_1 / 2];
} __attribute__((packed));

/* Activations of Q4_1/Q5_1 weights: s = fp16(d * sum(qs)) carries the
 * weight minimum's share of the dot product. */
struct block_q8_1 {
	uint16_t d; /* f16 */
	uint16_t s; /* f16 */
	int8_t qs[QK8_1];
} __attribute__((packed));

struct block_q2_K {
	uint8_t scales[QK_K / 16]; /* low nibble scale, high nibble min */
	uint8_t qs[QK_K / 4];
	uint16_t d;    /* f16, super-block scale of the scales */
	uint16_t dmin; /* f16, super-block scale of the mins */
} __attribute__((packed));

struct block_q3_K {
	uint8_t hmask[QK_K / 8];
	uint8_t qs[QK_K / 4];
	uint8_t scales[12]; /* 16 six-bit scales, offset 32 */
	uint16_t d;	    /* f16 */
} __attribute__((packed));

struct block_q4_K {
	uint16_t d;    /* f16 */
	uint16_t dmin; /* f16 */
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qs[QK_K / 2];
} __attribute__((packed));

struct block_q5_K {
	uint16_t d;    /* f16 */
	uint16_t dmin; /* f16 */
	uint8_t scales[K_SCALE_SIZE];
	uint8_t qh[QK_K / 8];
	uint8_t qs[QK_K / 2];
} __attribute__((packed));

struct block_q6_K {
	uint8_t ql[QK_K / 2];
	uint8_t qh[QK_K / 4];
	int8_t scales[QK_K / 16];
	uint16_t d; /* f16 */
} __attribute__((packed));

/* Activations of the K-quants (never in files): d is a plain float and may be
 * negative; bsums[i] is the sum of qs[16 i .. 16 i + 15]. */
struct block_q8_K {
	float d;
	int8_t qs[QK_K];
	int16_t bsums[QK_K / 16];
} __attribute__((packed));

struct block_iq4_nl {
	uint16_t d; /* f16 */
	uint8_t qs[QK4_NL / 2];
} __attribute__((packed));

struct block_iq4_xs {
	uint16_t d; /* f16 */
	uint16_t scales_h;
	uint8_t scales_l[QK_K / 64];
	uint8_t qs[QK_K / 2];
} __attribute__((packed));

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct block_q4_1) == 20, "q4_1 block");
_Static_assert(sizeof(struct block_q5_0) == 22, "q5_0 block");
_Static_assert(sizeof(struct block_q5_1) == 24, "q5_1 block");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block");
_Static_assert(sizeof(struct block_q8_1) == 36, "q8_1 block");
_Static_assert(sizeof(struct block_q2_K) == 84, "q2_K block");
_Static_assert(sizeof(struct block_q3_K) == 110, "q3_K block");
_Static_assert(sizeof(struct block_q4_K) == 144, "q4_K block");
_Static_assert(sizeof(struct block_q5_K) == 176, "q5_K block");
_Static_assert(sizeof(struct block_q6_K) == 210, "q6_K block");
_Static_assert(sizeof(struct block_q8_K) == 292, "q8_K block");
_Static_assert(sizeof(struct block_iq4_nl) == 18, "iq4_nl block");
_Static_assert(sizeof(struct block_iq4_xs) == 136, "iq4_xs block");

/* The IQ4_NL / IQ4_XS codebook (gguf-formats §2.5). */
extern const int8_t quant_iq4nl_values[16];

/* Scale j (0..7) and min of a Q4_K/Q5_K scales[12] array. */
static inline void quant_scale_min_k4(int j, const uint8_t *q, uint8_t *ret_sc, uint8_t *ret_m)
{
	if (j < 4) {
		*ret_sc = q[j] & 63;
		*ret_m = q[j + 4] & 63;
	} else {
		*ret_sc = (uint8_t)((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
		*ret_m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
	}
}

/* Signed 6-bit scale i (0..15) of a Q3_K block, in [-32, 31]. */
static inline int quant_scale_q3_K(int i, const uint8_t *scales)
{
	int lo = i < 8 ? scales[i] & 0xf : scales[i - 8] >> 4;
	int hi = (scales[8 + i % 4] >> (2 * (i / 4))) & 3;
	return (lo | hi << 4) - 32;
}

struct dtype_info {
	const char *name; /* "F32", "Q4_0", ... NULL for removed ids */
	uint32_t blck;    /* elements per block */
	uint32_t size;    /* bytes per block */
	bool computable;  /* this engine can run matmuls with it */
};

/* Traits for a ggml type id; NULL for ids that are invalid or removed. */
const struct dtype_info *quant_dtype_get(uint32_t type);
const char *quant_dtype_name(uint32_t type); /* "?" when unknown */
/* Parse a name ("q4_0", "Q8_0", "f16"...): the type id, or -ENOENT. */
int quant_dtype_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block. */
size_t quant_dtype_row_size(uint32_t type, int64_t n);

/* IEEE half <-> float, exact (subnormals, inf, nan), round-to-nearest-even. */
static inline float quant_fp16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
	if (exp == 0) {
		if (man == 0) {
			bits = sign;
		} else { /* subnormal: normalise */
			int e = -1;
			do {
				e++;
				man <<= 1;
			} while (!(man & 0x400));
			bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
		}
	} else if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else {
		bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t quant_fp32_to_fp16(float f);

static inline float quant_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t quant_fp32_to_bf16(float f);

/* A table of all 65536 halves, filled by quant_init() (thread-safe, idempotent). */
extern float quant_fp16_table[65536];
void quant_init(void);

/* Reference quantizers (k elements, a multiple of the block size; in
 * formats_quant.c) and dequantizers (formats.c). These define the formats;
 * SIMD kernels are tested against them. */
void quant_quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q4_0_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q4_1_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q5_0_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q5_1_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q8_1_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q2_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q3_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q5_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q6_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_q8_K_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_iq4_nl_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_iq4_xs_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_f16_ref(const float *x, void *y, int64_t k);
void quant_quantize_row_bf16_ref(const float *x, void *y, int64_t k);
/* Per-type dequantizers (k a multiple of the block), also the kernels'
 * dequant entries. */
void quant_dequantize_row_q8_0(const void *x, float *y, int64_t k);
void quant_dequantize_row_q4_0(const void *x, float *y, int64_t k);
void quant_dequantize_row_q4_1(const void *x, float *y, int64_t k);
void quant_dequantize_row_q5_0(const void *x, float *y, int64_t k);
void quant_dequantize_row_q5_1(const void *x, float *y, int64_t k);
void quant_dequantize_row_q8_1(const void *x, float *y, int64_t k);
void quant_dequantize_row_q2_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_q3_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_q4_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_q5_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_q6_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_q8_K(const void *x, float *y, int64_t k);
void quant_dequantize_row_iq4_nl(const void *x, float *y, int64_t k);
void quant_dequantize_row_iq4_xs(const void *x, float *y, int64_t k);

#endif
