/* engine/kernels/kern_generic.c: the portable scalar kernels.
 *
 * This is the reference every ISA variant is tested against, so it favours
 * clarity and a well-defined error over speed:
 * - float weights (F32, F16, BF16) take f32 activations and accumulate the
 *   products in double, which makes the result the exact dot product rounded
 *   once to float, up to n * 2^-53 of sum |w a|;
 * - integer formats follow ggml's pairing (gguf-formats §2.6): an exact int32
 *   sum per block (per super-block for K-quants, with the integer sub-block
 *   scales inside), scaled by d_w * d_a (rounded to float) and accumulated in
 *   float. Q4_1/Q5_1 add m_w * s_a, K-quants with mins subtract
 *   dmin * d_a * sum(m * bsums).
 * Built without ISA flags; must not include <immintrin.h>. */
#include "engine/kernels/kern.h"

#include "engine/kernels/formats.h"

#include <math.h>

static inline float load_f16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return quant_fp16_to_f32(h);
}

static inline float load_bf16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return quant_bf16_to_f32(h);
}

static inline float block_d(const void *pd)
{
	uint16_t h;
	memcpy(&h, pd, 2);
	return quant_fp16_to_f32(h);
}

/* ---- float weights, f32 activations ------------------------------------------ */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)w[i] * (double)a[i];
	*s = (float)sum;
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint8_t *w = vw;
	const float *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)load_f16(w + 2 * i) * (double)a[i];
	*s = (float)sum;
}

static void vec_dot_bf16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint8_t *w = vw;
	const float *a = va;
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)load_bf16(w + 2 * i) * (double)a[i];
	*s = (float)sum;
}

/* ---- integer formats, Q8_0 activations --------------------------------------- */

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q8_0 *w = vw, *a = va;
	int64_t nb = n / QK8_0;
	float sum = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		/* |isum| <= 32 * 128 * 128 = 2^19: exact in int32 and float. */
		int32_t isum = 0;
		for (int j = 0; j < QK8_0; j++)
			isum += (int32_t)w[i].qs[j] * (int32_t)a[i].qs[j];
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum;
	}
	*s = sum;
}

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_0 *w = vw;
	const struct block_q8_0 *a = va;
	int64_t nb = n / QK4_0;
	float sum = 0.0f;

	for (int64_t i = 0; i < nb; i++) {
		int32_t isum = 0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			int lo = (w[i].qs[j] & 0xf) - 8;
			int hi = (w[i].qs[j] >> 4) - 8;
			isum += lo * a[i].qs[j] + hi * a[i].qs[j + QK4_0 / 2];
		}
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum;
	}
	*s = sum;
}

static void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q5_0 *w = vw;
	const struct block_q8_0 *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK5_0; i++) {
		uint32_t qh;
		memcpy(&qh, w[i].qh, 4); /* little-endian hosts only, like the files */
		int32_t isum = 0;
		for (int j = 0; j < QK5_0 / 2; j++) {
			int lo = ((w[i].qs[j] & 0xf) | (int)((qh >> j) & 1) << 4) - 16;
			int hi = ((w[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
			isum += lo * a[i].qs[j] + hi * a[i].qs[j + QK5_0 / 2];
		}
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum;
	}
	*s = sum;
}

static void vec_dot_iq4_nl_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_iq4_nl *w = vw;
	const struct block_q8_0 *a = va;
	const int8_t *K = quant_iq4nl_values;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK4_NL; i++) {
		/* |isum| <= 32 * 127 * 128 < 2^19. */
		int32_t isum = 0;
		for (int j = 0; j < QK4_NL / 2; j++)
			isum += K[w[i].qs[j] & 0xf] * a[i].qs[j] +
				K[w[i].qs[j] >> 4] * a[i].qs[j + QK4_NL / 2];
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum;
	}
	*s = sum;
}

/* ---- Q4_1 / Q5_1 weights, Q8_1 activations ----------------------------------------
 * x = d q + m, so dot = d_w d_a sum(q qa) + m_w (d_a sum(qa)), and the second
 * factor is the activation block's s. */

static void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_1 *w = vw;
	const struct block_q8_1 *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK4_1; i++) {
		int32_t isum = 0;
		for (int j = 0; j < QK4_1 / 2; j++)
			isum += (w[i].qs[j] & 0xf) * a[i].qs[j] +
				(w[i].qs[j] >> 4) * a[i].qs[j + QK4_1 / 2];
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum +
		       block_d(&w[i].m) * block_d(&a[i].s);
	}
	*s = sum;
}

static void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q5_1 *w = vw;
	const struct block_q8_1 *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK5_1; i++) {
		uint32_t qh;
		memcpy(&qh, w[i].qh, 4);
		int32_t isum = 0;
		for (int j = 0; j < QK5_1 / 2; j++) {
			int lo = (w[i].qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
			int hi = (w[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
			isum += lo * a[i].qs[j] + hi * a[i].qs[j + QK5_1 / 2];
		}
		sum += (block_d(&w[i].d) * block_d(&a[i].d)) * (float)isum +
		       block_d(&w[i].m) * block_d(&a[i].s);
	}
	*s = sum;
}

/* ---- K-quants and IQ4_XS, Q8_K activations ----------------------------------------
 * Per super-block: sum over sub-blocks of (integer scale x exact int32 dot),
 * still exact in int32 (bounds per type below), then one float multiply by
 * d_w d_a; a min term uses the activation's bsums. Super-blocks accumulate
 * in float. */

static inline float q8k_d(const struct block_q8_K *a)
{
	float d;
	memcpy(&d, &a->d, 4);
	return d;
}

static inline int q8k_bsum(const struct block_q8_K *a, int i)
{
	int16_t v;
	memcpy(&v, &a->bsums[i], 2);
	return v;
}

static void vec_dot_q2_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q2_K *w = vw;
	const struct block_q8_K *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK_K; i++) {
		/* |sum q qa| <= 16*3*128 per sub-block, times 15, times 16. */
		int32_t isum = 0, msum = 0;
		for (int j = 0; j < QK_K / 16; j++) {
			int32_t sub = 0;
			for (int t = 0; t < 16; t++) {
				int e = 16 * j + t, h = e / 128, g = (e % 128) / 32, l = e % 32;
				sub += ((w[i].qs[32 * h + l] >> (2 * g)) & 3) * a[i].qs[e];
			}
			isum += (w[i].scales[j] & 0xf) * sub;
			msum += (w[i].scales[j] >> 4) * q8k_bsum(&a[i], j);
		}
		float da = q8k_d(&a[i]);
		sum += da * block_d(&w[i].d) * (float)isum - da * block_d(&w[i].dmin) * (float)msum;
	}
	*s = sum;
}

static void vec_dot_q3_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q3_K *w = vw;
	const struct block_q8_K *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK_K; i++) {
		/* |q| <= 4, |scale| <= 32: |isum| <= 256*4*128*32 = 2^22. */
		int32_t isum = 0;
		for (int j = 0; j < QK_K / 16; j++) {
			int32_t sub = 0;
			for (int t = 0; t < 16; t++) {
				int e = 16 * j + t, h = e / 128, g = (e % 128) / 32, l = e % 32;
				int q2 = (w[i].qs[32 * h + l] >> (2 * g)) & 3;
				int hb = (w[i].hmask[l] >> (e / 32)) & 1;
				sub += ((q2 | hb << 2) - 4) * a[i].qs[e];
			}
			isum += quant_scale_q3_K(j, w[i].scales) * sub;
		}
		sum += (q8k_d(&a[i]) * block_d(&w[i].d)) * (float)isum;
	}
	*s = sum;
}

/* Q4_K and Q5_K share everything but the 5th bit (qh NULL for Q4_K). */
static void dot_k4(const void *pd, const void *pdmin, const uint8_t *scales,
		   const uint8_t *qs, const uint8_t *qh, const struct block_q8_K *a, float *sum)
{
	/* |isum| <= 256 * 31 * 128 * 63 < 2^26; |msum| <= 256 * 128 * 63. */
	int32_t isum = 0, msum = 0;
	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t sc, m;
		quant_scale_min_k4(j, scales, &sc, &m);
		const uint8_t *q = qs + 32 * (j / 2);
		int shift = 4 * (j & 1);
		int32_t sub = 0;
		for (int l = 0; l < 32; l++) {
			int v = (q[l] >> shift) & 0xf;
			if (qh)
				v |= ((qh[l] >> j) & 1) << 4;
			sub += v * a->qs[32 * j + l];
		}
		isum += sc * sub;
		msum += m * (q8k_bsum(a, 2 * j) + q8k_bsum(a, 2 * j + 1));
	}
	float da = q8k_d(a);
	*sum += da * block_d(pd) * (float)isum - da * block_d(pdmin) * (float)msum;
}

static void vec_dot_q4_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_K *w = vw;
	const struct block_q8_K *a = va;
	float sum = 0.0f;
	for (int64_t i = 0; i < n / QK_K; i++)
		dot_k4(&w[i].d, &w[i].dmin, w[i].scales, w[i].qs, NULL, &a[i], &sum);
	*s = sum;
}

static void vec_dot_q5_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q5_K *w = vw;
	const struct block_q8_K *a = va;
	float sum = 0.0f;
	for (int64_t i = 0; i < n / QK_K; i++)
		dot_k4(&w[i].d, &w[i].dmin, w[i].scales, w[i].qs, w[i].qh, &a[i], &sum);
	*s = sum;
}

static void vec_dot_q6_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q6_K *w = vw;
	const struct block_q8_K *a = va;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK_K; i++) {
		/* |q| <= 32, |scale| <= 128: |isum| <= 256*32*128*128 = 2^27. */
		int32_t isum = 0;
		for (int j = 0; j < QK_K / 16; j++) {
			int32_t sub = 0;
			for (int t = 0; t < 16; t++) {
				int e = 16 * j + t, h = e / 128, g = (e % 128) / 32, l = e % 32;
				const uint8_t *ql = w[i].ql + 64 * h + 32 * (g & 1);
				int lo = (ql[l] >> (4 * (g >> 1))) & 0xf;
				int hi = (w[i].qh[32 * h + l] >> (2 * g)) & 3;
				sub += ((lo | hi << 4) - 32) * a[i].qs[e];
			}
			isum += w[i].scales[j] * sub;
		}
		sum += (q8k_d(&a[i]) * block_d(&w[i].d)) * (float)isum;
	}
	*s = sum;
}

static void vec_dot_iq4_xs_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_iq4_xs *w = vw;
	const struct block_q8_K *a = va;
	const int8_t *K = quant_iq4nl_values;
	float sum = 0.0f;

	for (int64_t i = 0; i < n / QK_K; i++) {
		uint16_t sh;
		memcpy(&sh, &w[i].scales_h, 2);
		/* |isum| <= 256 * 127 * 128 * 32 = 2^27. */
		int32_t isum = 0;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			int ls = ((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) |
				 ((sh >> (2 * ib)) & 3) << 4;
			const uint8_t *q = w[i].qs + 16 * ib;
			const int8_t *qa = a[i].qs + 32 * ib;
			int32_t sub = 0;
			for (int j = 0; j < 16; j++)
				sub += K[q[j] & 0xf] * qa[j] + K[q[j] >> 4] * qa[j + 16];
			isum += (ls - 32) * sub;
		}
		sum += (q8k_d(&a[i]) * block_d(&w[i].d)) * (float)isum;
	}
	*s = sum;
}

/* ---- dequantizers ----------------------------------------------------------- */

static void dequant_f32(const void *w, float *y, int64_t n)
{
	if (n > 0)
		memcpy(y, w, (size_t)n * sizeof(float));
}

static void dequant_f16(const void *vw, float *y, int64_t n)
{
	const uint8_t *w = vw;
	for (int64_t i = 0; i < n; i++)
		y[i] = load_f16(w + 2 * i);
}

static void dequant_bf16(const void *vw, float *y, int64_t n)
{
	const uint8_t *w = vw;
	for (int64_t i = 0; i < n; i++)
		y[i] = load_bf16(w + 2 * i);
}

/* ---- activations and f32 helpers ------------------------------------------- */

static void quant_act_f32(const float *x, void *y, int64_t n)
{
	if (n > 0)
		memcpy(y, x, (size_t)n * sizeof(float));
}

static float dot_f32(int64_t n, const float *a, const float *b)
{
	double sum = 0.0;
	for (int64_t i = 0; i < n; i++)
		sum += (double)a[i] * (double)b[i];
	return (float)sum;
}

static void axpy_f32(int64_t n, float a, const float *x, float *y)
{
	for (int64_t i = 0; i < n; i++)
		y[i] += a * x[i];
}

/* ---- attention over F16 / Q8_0 KV caches (contract in kern.h) ------------- */

/* The f16 kernels look halves up in quant_fp16_table (the same values as
 * quant_fp16_to_f32, without its branches, and these run on every cached
 * position); quant_init() is a no-op after its first call. */
static void attn_score_f16(int hd, int n, const void *vq, const void *k, size_t stride,
			   float scale, float *s)
{
	const float *q = vq;
	quant_init();
	for (int i = 0; i < n; i++) {
		const uint8_t *r = (const uint8_t *)k + (size_t)i * stride;
		double sum = 0.0;
		for (int j = 0; j < hd; j++) {
			uint16_t h;
			memcpy(&h, r + 2 * j, 2);
			sum += (double)q[j] * (double)quant_fp16_table[h];
		}
		s[i] = (float)sum * scale;
	}
}

static void attn_score_q8_0(int hd, int n, const void *vq, const void *k, size_t stride,
			    float scale, float *s)
{
	const struct block_q8_0 *q = vq;
	int nb = (hd + QK8_0 - 1) / QK8_0;
	for (int i = 0; i < n; i++) {
		const struct block_q8_0 *r =
			(const struct block_q8_0 *)((const uint8_t *)k + (size_t)i * stride);
		float sum = 0.0f;
		for (int b = 0; b < nb; b++) {
			/* |isum| <= 32 * 128 * 128 = 2^19: exact */
			int32_t isum = 0;
			for (int j = 0; j < QK8_0; j++)
				isum += (int32_t)q[b].qs[j] * (int32_t)r[b].qs[j];
			sum += (block_d(&q[b].d) * block_d(&r[b].d)) * (float)isum;
		}
		s[i] = sum * scale;
	}
}

static void attn_vsum_f16(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	quant_init();
	for (int j = 0; j < hd; j++)
		o[j] = 0.0f;
	for (int i = 0; i < n; i++) {
		const uint8_t *r = (const uint8_t *)v + (size_t)i * stride;
		float c = w[i];
		for (int j = 0; j < hd; j++) {
			uint16_t h;
			memcpy(&h, r + 2 * j, 2);
			o[j] += c * quant_fp16_table[h];
		}
	}
}

static void attn_vsum_q8_0(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	for (int j = 0; j < hd; j++)
		o[j] = 0.0f;
	for (int i = 0; i < n; i++) {
		const struct block_q8_0 *r =
			(const struct block_q8_0 *)((const uint8_t *)v + (size_t)i * stride);
		for (int j0 = 0, b = 0; j0 < hd; j0 += QK8_0, b++) {
			float c = w[i] * block_d(&r[b].d);
			int m = hd - j0 < QK8_0 ? hd - j0 : QK8_0;
			for (int j = 0; j < m; j++)
				o[j0 + j] += c * (float)r[b].qs[j];
		}
	}
}

static void silu_mul_f32(int64_t n, float *g, const float *u)
{
	for (int64_t i = 0; i < n; i++)
		g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static float exp_sum_f32(int64_t n, float *x, float mx)
{
	float sum = 0.0f;
	for (int64_t i = 0; i < n; i++) {
		x[i] = expf(x[i] - mx);
		sum += x[i];
	}
	return sum;
}

size_t kern_act_row_size(uint32_t act_type, int64_t n)
{
	return quant_dtype_row_size(act_type, n);
}

const struct kern_ops kern_generic_ops = {
	.name = "scalar",
	.t = {
		[ENGINE_DTYPE_F32] = { ENGINE_DTYPE_F32, vec_dot_f32, dequant_f32 },
		[ENGINE_DTYPE_F16] = { ENGINE_DTYPE_F32, vec_dot_f16, dequant_f16 },
		[ENGINE_DTYPE_BF16] = { ENGINE_DTYPE_F32, vec_dot_bf16, dequant_bf16 },
		[ENGINE_DTYPE_Q8_0] = { ENGINE_DTYPE_Q8_0, vec_dot_q8_0_q8_0,
					  quant_dequantize_row_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { ENGINE_DTYPE_Q8_0, vec_dot_q4_0_q8_0,
					  quant_dequantize_row_q4_0 },
		[ENGINE_DTYPE_Q5_0] = { ENGINE_DTYPE_Q8_0, vec_dot_q5_0_q8_0,
					  quant_dequantize_row_q5_0 },
		[ENGINE_DTYPE_IQ4_NL] = { ENGINE_DTYPE_Q8_0, vec_dot_iq4_nl_q8_0,
					  quant_dequantize_row_iq4_nl },
		[ENGINE_DTYPE_Q4_1] = { ENGINE_DTYPE_Q8_1, vec_dot_q4_1_q8_1,
					  quant_dequantize_row_q4_1 },
		[ENGINE_DTYPE_Q5_1] = { ENGINE_DTYPE_Q8_1, vec_dot_q5_1_q8_1,
					  quant_dequantize_row_q5_1 },
		[ENGINE_DTYPE_Q2_K] = { ENGINE_DTYPE_Q8_K, vec_dot_q2_K_q8_K,
					  quant_dequantize_row_q2_K },
		[ENGINE_DTYPE_Q3_K] = { ENGINE_DTYPE_Q8_K, vec_dot_q3_K_q8_K,
					  quant_dequantize_row_q3_K },
		[ENGINE_DTYPE_Q4_K] = { ENGINE_DTYPE_Q8_K, vec_dot_q4_K_q8_K,
					  quant_dequantize_row_q4_K },
		[ENGINE_DTYPE_Q5_K] = { ENGINE_DTYPE_Q8_K, vec_dot_q5_K_q8_K,
					  quant_dequantize_row_q5_K },
		[ENGINE_DTYPE_Q6_K] = { ENGINE_DTYPE_Q8_K, vec_dot_q6_K_q8_K,
					  quant_dequantize_row_q6_K },
		[ENGINE_DTYPE_IQ4_XS] = { ENGINE_DTYPE_Q8_K, vec_dot_iq4_xs_q8_K,
					  quant_dequantize_row_iq4_xs },
	},
	.quant_act = {
		[ENGINE_DTYPE_F32] = quant_act_f32,
		[ENGINE_DTYPE_F16] = quant_quantize_row_f16_ref, /* the F16 KV cache's rows */
		[ENGINE_DTYPE_Q8_0] = quant_quantize_row_q8_0_ref,
		[ENGINE_DTYPE_Q8_1] = quant_quantize_row_q8_1_ref,
		[ENGINE_DTYPE_Q8_K] = quant_quantize_row_q8_K_ref,
	},
	.dot_f32 = dot_f32,
	.axpy_f32 = axpy_f32,
	.attn_score_f16 = attn_score_f16,
	.attn_score_q8_0 = attn_score_q8_0,
	.attn_vsum_f16 = attn_vsum_f16,
	.attn_vsum_q8_0 = attn_vsum_q8_0,
	.silu_mul_f32 = silu_mul_f32,
	.exp_sum_f32 = exp_sum_f32,
};
