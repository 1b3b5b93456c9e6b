/* engine/quant.c: the ggml type table, half/bfloat conversion and the
 * reference quantizers and dequantizers (docs: gguf-formats.md §2).
 *
 * The reference quantizers reproduce ggml's scalar `quantize_row_*_ref`
 * arithmetic operation for operation (multiplying by a float reciprocal, not
 * dividing), so our files are bit-identical to llama-quantize's without an
 * importance matrix. Kernel variants are tested against these functions. */
#include "engine/quant.h"

#include "common/common.h"

#include <math.h>
#include <pthread.h>
#include <strings.h>

/* ---- type table ------------------------------------------------------------ */

/* Indexed by ggml id. Ids that ggml removed (4, 5, 31-33, 36-38) are left
 * zeroed: a NULL name marks them invalid. */
static const struct dtype_info dtype_table[ENGINE_DTYPE_COUNT] = {
	[ENGINE_DTYPE_F32] = { "F32", 1, 4, true },
	[ENGINE_DTYPE_F16] = { "F16", 1, 2, true },
	[ENGINE_DTYPE_Q4_0] = { "Q4_0", 32, 18, true },
	[ENGINE_DTYPE_Q4_1] = { "Q4_1", 32, 20, false },
	[ENGINE_DTYPE_Q5_0] = { "Q5_0", 32, 22, false },
	[ENGINE_DTYPE_Q5_1] = { "Q5_1", 32, 24, false },
	[ENGINE_DTYPE_Q8_0] = { "Q8_0", 32, 34, true },
	[ENGINE_DTYPE_Q8_1] = { "Q8_1", 32, 36, false },
	[ENGINE_DTYPE_Q2_K] = { "Q2_K", 256, 84, false },
	[ENGINE_DTYPE_Q3_K] = { "Q3_K", 256, 110, false },
	[ENGINE_DTYPE_Q4_K] = { "Q4_K", 256, 144, false },
	[ENGINE_DTYPE_Q5_K] = { "Q5_K", 256, 176, false },
	[ENGINE_DTYPE_Q6_K] = { "Q6_K", 256, 210, false },
	[ENGINE_DTYPE_Q8_K] = { "Q8_K", 256, 292, false },
	[ENGINE_DTYPE_IQ2_XXS] = { "IQ2_XXS", 256, 66, false },
	[ENGINE_DTYPE_IQ2_XS] = { "IQ2_XS", 256, 74, false },
	[ENGINE_DTYPE_IQ3_XXS] = { "IQ3_XXS", 256, 98, false },
	[ENGINE_DTYPE_IQ1_S] = { "IQ1_S", 256, 50, false },
	[ENGINE_DTYPE_IQ4_NL] = { "IQ4_NL", 32, 18, false },
	[ENGINE_DTYPE_IQ3_S] = { "IQ3_S", 256, 110, false },
	[ENGINE_DTYPE_IQ2_S] = { "IQ2_S", 256, 82, false },
	[ENGINE_DTYPE_IQ4_XS] = { "IQ4_XS", 256, 136, false },
	[ENGINE_DTYPE_I8] = { "I8", 1, 1, false },
	[ENGINE_DTYPE_I16] = { "I16", 1, 2, false },
	[ENGINE_DTYPE_I32] = { "I32", 1, 4, false },
	[ENGINE_DTYPE_I64] = { "I64", 1, 8, false },
	[ENGINE_DTYPE_F64] = { "F64", 1, 8, false },
	[ENGINE_DTYPE_IQ1_M] = { "IQ1_M", 256, 56, false },
	[ENGINE_DTYPE_BF16] = { "BF16", 1, 2, true },
	[ENGINE_DTYPE_TQ1_0] = { "TQ1_0", 256, 54, false },
	[ENGINE_DTYPE_TQ2_0] = { "TQ2_0", 256, 66, false },
};

const struct dtype_info *dtype_get(uint32_t type)
{
	if (type >= ENGINE_DTYPE_COUNT || !dtype_table[type].name)
		return NULL;
	return &dtype_table[type];
}

const char *dtype_name(uint32_t type)
{
	const struct dtype_info *ti = dtype_get(type);
	return ti ? ti->name : "?";
}

int dtype_from_name(const char *name)
{
	if (!name)
		return -1;
	for (uint32_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		const char *tn = dtype_table[t].name;
		if (tn && strcasecmp(tn, name) == 0)
			return (int)t;
	}
	return -1;
}

size_t dtype_row_size(uint32_t type, int64_t n)
{
	const struct dtype_info *ti = dtype_get(type);
	uint64_t bytes;
	if (!ti || n < 0 || n % ti->blck != 0)
		return 0;
	if (cm_mul_overflow_u64((uint64_t)n / ti->blck, ti->size, &bytes) || bytes > SIZE_MAX)
		return 0;
	return (size_t)bytes;
}

/* ---- half and bfloat ---------------------------------------------------------- */

uint16_t fp32_to_fp16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	uint32_t ax = x & 0x7fffffffu;

	if (ax >= 0x7f800000u) {
		if (ax == 0x7f800000u)
			return sign | 0x7c00;
		/* NaN: keep the top of the payload, set the quiet bit so a
		 * payload living only in the low 13 bits cannot become inf. */
		return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
	}
	/* 65520 = 0x477ff000 is the midpoint between 65504 (odd mantissa) and
	 * 2^16: ties go to even, which is the overflow, so >= means inf. */
	if (ax >= 0x477ff000u)
		return sign | 0x7c00;

	uint32_t e = ax >> 23;
	uint32_t h, rem, half;
	if (e >= 113) {
		/* Normal half: rebias the exponent, drop 13 mantissa bits. A
		 * rounding carry runs into the exponent, which is right. */
		h = ((e - 112) << 10) | ((ax >> 13) & 0x3ff);
		rem = ax & 0x1fff;
		half = 0x1000;
	} else {
		/* Subnormal half: value / 2^-24 = m * 2^(e - 126) with the
		 * implicit bit restored. Shifts above 24 leave < 0.5 units. */
		if (e < 102)
			return sign;
		uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
		h = m >> shift;
		rem = m & ((1u << shift) - 1);
		half = 1u << (shift - 1);
	}
	if (rem > half || (rem == half && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

uint16_t fp32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
	/* Round to nearest even; overflow carries into inf. */
	x += 0x7fffu + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

float quant_fp16_table[65536];

static pthread_once_t quant_once = PTHREAD_ONCE_INIT;

static void quant_init_once(void)
{
	for (uint32_t h = 0; h < 65536; h++)
		quant_fp16_table[h] = fp16_to_f32((uint16_t)h);
}

void quant_init(void)
{
	(void)pthread_once(&quant_once, quant_init_once);
}

/* ---- block formats -------------------------------------------------------- */

static inline uint16_t load_u16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

static inline void store_u16(void *p, uint16_t v)
{
	memcpy(p, &v, 2);
}

void quantize_row_q8_0_ref(const float *x, void *vy, int64_t k)
{
	struct block_q8_0 *y = vy;
	int64_t nb = k / QK8_0;

	for (int64_t i = 0; i < nb; i++) {
		const float *xb = x + i * QK8_0;
		float amax = 0.0f;
		for (int j = 0; j < QK8_0; j++)
			amax = fmaxf(amax, fabsf(xb[j]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		store_u16(&y[i].d, fp32_to_fp16(d));
		for (int j = 0; j < QK8_0; j++)
			y[i].qs[j] = (int8_t)roundf(xb[j] * id);
	}
}

void quantize_row_q4_0_ref(const float *x, void *vy, int64_t k)
{
	struct block_q4_0 *y = vy;
	int64_t nb = k / QK4_0;

	for (int64_t i = 0; i < nb; i++) {
		const float *xb = x + i * QK4_0;
		/* The signed element of largest magnitude (first one on ties) maps
		 * to -8, so the full range [-8, 7] is used on its side. */
		float amax = 0.0f, max = 0.0f;
		for (int j = 0; j < QK4_0; j++) {
			if (amax < fabsf(xb[j])) {
				amax = fabsf(xb[j]);
				max = xb[j];
			}
		}
		float d = max / -8.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		store_u16(&y[i].d, fp32_to_fp16(d));
		for (int j = 0; j < QK4_0 / 2; j++) {
			/* x*id + 8.5 lies in [0.5, 16.5]; truncation rounds half
			 * up and 16 (the far side of the range) clamps to 15. */
			int lo = (int8_t)(xb[j] * id + 8.5f);
			int hi = (int8_t)(xb[j + QK4_0 / 2] * id + 8.5f);
			lo = CM_MIN(15, lo);
			hi = CM_MIN(15, hi);
			y[i].qs[j] = (uint8_t)(lo | (hi << 4));
		}
	}
}

void quantize_row_f16_ref(const float *x, void *vy, int64_t k)
{
	uint8_t *y = vy;
	for (int64_t i = 0; i < k; i++)
		store_u16(y + 2 * i, fp32_to_fp16(x[i]));
}

void quantize_row_bf16_ref(const float *x, void *vy, int64_t k)
{
	uint8_t *y = vy;
	for (int64_t i = 0; i < k; i++)
		store_u16(y + 2 * i, fp32_to_bf16(x[i]));
}

static void dequantize_row_q8_0(const void *vx, float *y, int64_t k)
{
	const struct block_q8_0 *x = vx;
	int64_t nb = k / QK8_0;

	for (int64_t i = 0; i < nb; i++) {
		float d = fp16_to_f32(load_u16(&x[i].d));
		for (int j = 0; j < QK8_0; j++)
			y[i * QK8_0 + j] = (float)x[i].qs[j] * d;
	}
}

static void dequantize_row_q4_0(const void *vx, float *y, int64_t k)
{
	const struct block_q4_0 *x = vx;
	int64_t nb = k / QK4_0;

	for (int64_t i = 0; i < nb; i++) {
		float d = fp16_to_f32(load_u16(&x[i].d));
		float *yb = y + i * QK4_0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			yb[j] = (float)((x[i].qs[j] & 0xf) - 8) * d;
			yb[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
		}
	}
}

static void dequantize_row_f16(const void *vx, float *y, int64_t k)
{
	const uint8_t *x = vx;
	for (int64_t i = 0; i < k; i++)
		y[i] = fp16_to_f32(load_u16(x + 2 * i));
}

static void dequantize_row_bf16(const void *vx, float *y, int64_t k)
{
	const uint8_t *x = vx;
	for (int64_t i = 0; i < k; i++)
		y[i] = bf16_to_f32(load_u16(x + 2 * i));
}

/* A row length the type cannot hold (negative, or not whole blocks). */
static bool bad_length(uint32_t type, int64_t k)
{
	const struct dtype_info *ti = dtype_get(type);
	return !ti || k < 0 || k % ti->blck != 0;
}

int dequantize_row(uint32_t type, const void *x, float *y, int64_t k)
{
	if (bad_length(type, k))
		return -1;
	switch (type) {
	case ENGINE_DTYPE_F32:
		if (k)
			memcpy(y, x, (size_t)k * sizeof(float));
		return 0;
	case ENGINE_DTYPE_F16:
		dequantize_row_f16(x, y, k);
		return 0;
	case ENGINE_DTYPE_BF16:
		dequantize_row_bf16(x, y, k);
		return 0;
	case ENGINE_DTYPE_Q8_0:
		dequantize_row_q8_0(x, y, k);
		return 0;
	case ENGINE_DTYPE_Q4_0:
		dequantize_row_q4_0(x, y, k);
		return 0;
	default:
		return -1;
	}
}

int quantize_row(uint32_t type, const float *x, void *y, int64_t k)
{
	if (bad_length(type, k))
		return -1;
	switch (type) {
	case ENGINE_DTYPE_F32:
		if (k)
			memcpy(y, x, (size_t)k * sizeof(float));
		return 0;
	case ENGINE_DTYPE_F16:
		quantize_row_f16_ref(x, y, k);
		return 0;
	case ENGINE_DTYPE_BF16:
		quantize_row_bf16_ref(x, y, k);
		return 0;
	case ENGINE_DTYPE_Q8_0:
		quantize_row_q8_0_ref(x, y, k);
		return 0;
	case ENGINE_DTYPE_Q4_0:
		quantize_row_q4_0_ref(x, y, k);
		return 0;
	default:
		return -1;
	}
}
