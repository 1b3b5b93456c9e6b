/* engine/kernels/formats.c: the formats layer's type table, half/bfloat
 * conversion and the reference dequantizers (docs: gguf-formats.md §2). The
 * reference quantizers are formats_quant.c.
 *
 * The dequantizers are also the generic kernels' dequant entries
 * (kern_generic.c); they and the tables below depend on nothing but libc and
 * common/, so the kernels can stand on this layer (formats.h). */
#include "engine/kernels/formats.h"

#include "common/common.h"

#include <errno.h>
#include <pthread.h>
#include <strings.h>

/* ---- type table ------------------------------------------------------------------ */

/* Indexed by ggml id. Ids that ggml removed (4, 5, 31-33, 36-38) are left
 * zeroed: a NULL name marks them invalid. */
static const struct dtype_info dtype_table[ENGINE_DTYPE_COUNT] = {
	[ENGINE_DTYPE_F32] = { "F32", 1, 4, true },
	[ENGINE_DTYPE_F16] = { "F16", 1, 2, true },
	[ENGINE_DTYPE_Q4_0] = { "Q4_0", 32, 18, true },
	[ENGINE_DTYPE_Q4_1] = { "Q4_1", 32, 20, true },
	[ENGINE_DTYPE_Q5_0] = { "Q5_0", 32, 22, true },
	[ENGINE_DTYPE_Q5_1] = { "Q5_1", 32, 24, true },
	[ENGINE_DTYPE_Q8_0] = { "Q8_0", 32, 34, true },
	[ENGINE_DTYPE_Q8_1] = { "Q8_1", 32, 36, false },
	[ENGINE_DTYPE_Q2_K] = { "Q2_K", 256, 84, true },
	[ENGINE_DTYPE_Q3_K] = { "Q3_K", 256, 110, true },
	[ENGINE_DTYPE_Q4_K] = { "Q4_K", 256, 144, true },
	[ENGINE_DTYPE_Q5_K] = { "Q5_K", 256, 176, true },
	[ENGINE_DTYPE_Q6_K] = { "Q6_K", 256, 210, true },
	[ENGINE_DTYPE_Q8_K] = { "Q8_K", 256, 292, false },
	[ENGINE_DTYPE_IQ2_XXS] = { "IQ2_XXS", 256, 66, false },
	[ENGINE_DTYPE_IQ2_XS] = { "IQ2_XS", 256, 74, false },
	[ENGINE_DTYPE_IQ3_XXS] = { "IQ3_XXS", 256, 98, false },
	[ENGINE_DTYPE_IQ1_S] = { "IQ1_S", 256, 50, false },
	[ENGINE_DTYPE_IQ4_NL] = { "IQ4_NL", 32, 18, true },
	[ENGINE_DTYPE_IQ3_S] = { "IQ3_S", 256, 110, false },
	[ENGINE_DTYPE_IQ2_S] = { "IQ2_S", 256, 82, false },
	[ENGINE_DTYPE_IQ4_XS] = { "IQ4_XS", 256, 136, true },
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

const struct dtype_info *quant_dtype_get(uint32_t type)
{
	if (type >= ENGINE_DTYPE_COUNT || !dtype_table[type].name)
		return NULL;
	return &dtype_table[type];
}

const char *quant_dtype_name(uint32_t type)
{
	const struct dtype_info *ti = quant_dtype_get(type);
	return ti ? ti->name : "?";
}

int quant_dtype_from_name(const char *name)
{
	if (!name)
		return -ENOENT;
	for (uint32_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		const char *tn = dtype_table[t].name;
		if (tn && strcasecmp(tn, name) == 0)
			return (int)t;
	}
	return -ENOENT;
}

size_t quant_dtype_row_size(uint32_t type, int64_t n)
{
	const struct dtype_info *ti = quant_dtype_get(type);
	uint64_t bytes;
	if (!ti || n < 0 || n % ti->blck != 0)
		return 0;
	if (cm_mul_overflow_u64((uint64_t)n / ti->blck, ti->size, &bytes) || bytes > SIZE_MAX)
		return 0;
	return (size_t)bytes;
}

/* ---- half and bfloat ------------------------------------------------------------- */

uint16_t quant_fp32_to_fp16(float f)
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

uint16_t quant_fp32_to_bf16(float f)
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
		quant_fp16_table[h] = quant_fp16_to_f32((uint16_t)h);
}

void quant_init(void)
{
	(void)pthread_once(&quant_once, quant_init_once);
}

/* ---- block formats: dequantizers ------------------------------------------------- */

static inline uint16_t load_u16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

void quant_dequantize_row_q8_0(const void *vx, float *y, int64_t k)
{
	const struct block_q8_0 *x = vx;
	for (int64_t i = 0; i < k / QK8_0; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		for (int j = 0; j < QK8_0; j++)
			y[i * QK8_0 + j] = (float)x[i].qs[j] * d;
	}
}

void quant_dequantize_row_q4_0(const void *vx, float *y, int64_t k)
{
	const struct block_q4_0 *x = vx;
	for (int64_t i = 0; i < k / QK4_0; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float *yb = y + i * QK4_0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			yb[j] = (float)((x[i].qs[j] & 0xf) - 8) * d;
			yb[j + QK4_0 / 2] = (float)((x[i].qs[j] >> 4) - 8) * d;
		}
	}
}

void quant_dequantize_row_q4_1(const void *vx, float *y, int64_t k)
{
	const struct block_q4_1 *x = vx;
	for (int64_t i = 0; i < k / QK4_1; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float m = quant_fp16_to_f32(load_u16(&x[i].m));
		float *yb = y + i * QK4_1;
		for (int j = 0; j < QK4_1 / 2; j++) {
			yb[j] = (float)(x[i].qs[j] & 0xf) * d + m;
			yb[j + QK4_1 / 2] = (float)(x[i].qs[j] >> 4) * d + m;
		}
	}
}

static inline uint32_t load_qh(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void quant_dequantize_row_q5_0(const void *vx, float *y, int64_t k)
{
	const struct block_q5_0 *x = vx;
	for (int64_t i = 0; i < k / QK5_0; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		uint32_t qh = load_qh(x[i].qh);
		float *yb = y + i * QK5_0;
		for (int j = 0; j < QK5_0 / 2; j++) {
			int lo = (x[i].qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
			int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
			yb[j] = (float)(lo - 16) * d;
			yb[j + QK5_0 / 2] = (float)(hi - 16) * d;
		}
	}
}

void quant_dequantize_row_q5_1(const void *vx, float *y, int64_t k)
{
	const struct block_q5_1 *x = vx;
	for (int64_t i = 0; i < k / QK5_1; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float m = quant_fp16_to_f32(load_u16(&x[i].m));
		uint32_t qh = load_qh(x[i].qh);
		float *yb = y + i * QK5_1;
		for (int j = 0; j < QK5_1 / 2; j++) {
			int lo = (x[i].qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
			int hi = (x[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
			yb[j] = (float)lo * d + m;
			yb[j + QK5_1 / 2] = (float)hi * d + m;
		}
	}
}

void quant_dequantize_row_q8_1(const void *vx, float *y, int64_t k)
{
	const struct block_q8_1 *x = vx;
	for (int64_t i = 0; i < k / QK8_1; i++) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		for (int j = 0; j < QK8_1; j++)
			y[i * QK8_1 + j] = (float)x[i].qs[j] * d;
	}
}

/* ---- K-quants: dequantizers ------------------------------------------------------ */

void quant_dequantize_row_q2_K(const void *vx, float *y, int64_t k)
{
	const struct block_q2_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float dmin = quant_fp16_to_f32(load_u16(&x[i].dmin));
		for (int e = 0; e < QK_K; e++) {
			int h = e / 128, g = (e % 128) / 32, l = e % 32;
			int q = (x[i].qs[32 * h + l] >> (2 * g)) & 3;
			uint8_t sc = x[i].scales[e / 16];
			y[e] = d * (float)(sc & 0xf) * (float)q - dmin * (float)(sc >> 4);
		}
	}
}

void quant_dequantize_row_q3_K(const void *vx, float *y, int64_t k)
{
	const struct block_q3_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float dl[QK_K / 16];
		for (int j = 0; j < QK_K / 16; j++)
			dl[j] = d * (float)quant_scale_q3_K(j, x[i].scales);
		for (int e = 0; e < QK_K; e++) {
			int h = e / 128, g = (e % 128) / 32, l = e % 32;
			int q2 = (x[i].qs[32 * h + l] >> (2 * g)) & 3;
			int hb = (x[i].hmask[l] >> (e / 32)) & 1;
			y[e] = dl[e / 16] * (float)((q2 | hb << 2) - 4);
		}
	}
}

void quant_dequantize_row_q4_K(const void *vx, float *y, int64_t k)
{
	const struct block_q4_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float dmin = quant_fp16_to_f32(load_u16(&x[i].dmin));
		for (int j = 0; j < QK_K / 32; j++) {
			uint8_t sc, m;
			quant_scale_min_k4(j, x[i].scales, &sc, &m);
			float dl = d * (float)sc, ml = dmin * (float)m;
			const uint8_t *q = x[i].qs + 32 * (j / 2);
			int shift = 4 * (j & 1);
			for (int l = 0; l < 32; l++)
				y[32 * j + l] = dl * (float)((q[l] >> shift) & 0xf) - ml;
		}
	}
}

void quant_dequantize_row_q5_K(const void *vx, float *y, int64_t k)
{
	const struct block_q5_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		float dmin = quant_fp16_to_f32(load_u16(&x[i].dmin));
		for (int j = 0; j < QK_K / 32; j++) {
			uint8_t sc, m;
			quant_scale_min_k4(j, x[i].scales, &sc, &m);
			float dl = d * (float)sc, ml = dmin * (float)m;
			const uint8_t *q = x[i].qs + 32 * (j / 2);
			int shift = 4 * (j & 1);
			for (int l = 0; l < 32; l++) {
				int v = ((q[l] >> shift) & 0xf) | ((x[i].qh[l] >> j) & 1) << 4;
				y[32 * j + l] = dl * (float)v - ml;
			}
		}
	}
}

void quant_dequantize_row_q6_K(const void *vx, float *y, int64_t k)
{
	const struct block_q6_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		for (int e = 0; e < QK_K; e++) {
			int h = e / 128, g = (e % 128) / 32, l = e % 32;
			int lo = (x[i].ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 0xf;
			int hi = (x[i].qh[32 * h + l] >> (2 * g)) & 3;
			y[e] = d * (float)x[i].scales[e / 16] * (float)((lo | hi << 4) - 32);
		}
	}
}

void quant_dequantize_row_q8_K(const void *vx, float *y, int64_t k)
{
	const struct block_q8_K *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++) {
		float d;
		memcpy(&d, &x[i].d, 4);
		for (int j = 0; j < QK_K; j++)
			y[i * QK_K + j] = d * (float)x[i].qs[j];
	}
}

/* ---- IQ4_NL and IQ4_XS: codebook and dequantizers -------------------------------- */

const int8_t quant_iq4nl_values[16] = { -127, -104, -83, -65, -49, -35, -22, -10,
					1,    13,   25,  38,  53,  69,  89,  113 };

void quant_dequantize_row_iq4_nl(const void *vx, float *y, int64_t k)
{
	const struct block_iq4_nl *x = vx;
	for (int64_t i = 0; i < k / QK4_NL; i++, y += QK4_NL) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		for (int j = 0; j < 16; j++) {
			y[j] = d * (float)quant_iq4nl_values[x[i].qs[j] & 0xf];
			y[j + 16] = d * (float)quant_iq4nl_values[x[i].qs[j] >> 4];
		}
	}
}

void quant_dequantize_row_iq4_xs(const void *vx, float *y, int64_t k)
{
	const struct block_iq4_xs *x = vx;
	for (int64_t i = 0; i < k / QK_K; i++, y += QK_K) {
		float d = quant_fp16_to_f32(load_u16(&x[i].d));
		uint16_t sh = load_u16(&x[i].scales_h);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
				 ((sh >> (2 * ib)) & 3) << 4;
			float dl = d * (float)(ls - 32);
			const uint8_t *q = x[i].qs + 16 * ib;
			for (int j = 0; j < 16; j++) {
				y[32 * ib + j] = dl * (float)quant_iq4nl_values[q[j] & 0xf];
				y[32 * ib + j + 16] = dl * (float)quant_iq4nl_values[q[j] >> 4];
			}
		}
	}
}
