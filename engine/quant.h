/* engine/quant.h: tensor element types (ggml ids as stored in GGUF), their
 * block layouts, half-precision conversion and the reference (scalar)
 * quantizers and dequantizers.
 *
 * Layouts follow ggml exactly (docs: ../shared/docs/gguf-formats.md §2), so
 * files made by llama.cpp are read as written and ours are readable there.
 * Block structs are packed; multi-byte fields inside blocks are read with
 * memcpy or byte loads because blocks are not aligned. */
#ifndef EDGELM_ENGINE_QUANT_H
#define EDGELM_ENGINE_QUANT_H

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
#define QK8_0 32
#define QK_K 256

struct block_q4_0 {
	uint16_t d; /* f16 */
	uint8_t qs[QK4_0 / 2];
} __attribute__((packed));

struct block_q8_0 {
	uint16_t d; /* f16 */
	int8_t qs[QK8_0];
} __attribute__((packed));

_Static_assert(sizeof(struct block_q4_0) == 18, "q4_0 block");
_Static_assert(sizeof(struct block_q8_0) == 34, "q8_0 block");

struct dtype_info {
	const char *name; /* "F32", "Q4_0", ... NULL for removed ids */
	uint32_t blck;    /* elements per block */
	uint32_t size;    /* bytes per block */
	bool computable;  /* this engine can run matmuls with it */
};

/* Traits for a ggml type id; NULL for ids that are invalid or removed. */
const struct dtype_info *dtype_get(uint32_t type);
const char *dtype_name(uint32_t type); /* "?" when unknown */
/* Parse a name ("q4_0", "Q8_0", "f16"...). Returns -1 if unknown. */
int dtype_from_name(const char *name);
/* Bytes of a row of n elements; 0 if n is not a multiple of the block. */
size_t dtype_row_size(uint32_t type, int64_t n);

/* IEEE half <-> float, exact (subnormals, inf, nan), round-to-nearest-even. */
static inline float fp16_to_f32(uint16_t h)
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

uint16_t fp32_to_fp16(float f);

static inline float bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t fp32_to_bf16(float f);

/* A table of all 65536 halves, filled by quant_init() (thread-safe, idempotent). */
extern float quant_fp16_table[65536];
void quant_init(void);

/* Reference quantizers (k elements, a multiple of the block size) and
 * dequantizers. These define the formats; SIMD kernels are tested against
 * them. */
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_0_ref(const float *x, void *y, int64_t k);
void quantize_row_f16_ref(const float *x, void *y, int64_t k);
void quantize_row_bf16_ref(const float *x, void *y, int64_t k);
/* Dequantize a row of any computable type to f32. Returns -1 if the type has
 * no dequantizer. */
int dequantize_row(uint32_t type, const void *x, float *y, int64_t k);
/* Quantize a row of f32 to `type`. Returns -1 if the type has no quantizer. */
int quantize_row(uint32_t type, const float *x, void *y, int64_t k);

#endif
