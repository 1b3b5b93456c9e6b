/* engine/kernels/formats_quant.c: the formats layer's reference
 * quantizers (docs: gguf-formats.md §2); the type table and the
 * dequantizers are formats.c.
 *
 * The reference quantizers reproduce ggml's scalar `quantize_row_*_ref`
 * arithmetic operation for operation (multiplying by a float reciprocal, not
 * dividing), so our files are bit-identical to llama-quantize's without an
 * importance matrix. Kernel variants are tested against these functions, and
 * the activation converters among them (Q8_0, Q8_1, Q8_K, F16) are the
 * generic kernels' quant_act entries. */
#include "engine/kernels/formats.h"

#include "common/common.h"

#include <float.h>
#include <math.h>

/* ---- block formats: quantizers --------------------------------------------------- */

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

void quant_quantize_row_q8_0_ref(const float *x, void *vy, int64_t k)
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
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
		for (int j = 0; j < QK8_0; j++)
			y[i].qs[j] = (int8_t)roundf(xb[j] * id);
	}
}

void quant_quantize_row_q4_0_ref(const float *x, void *vy, int64_t k)
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
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
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

void quant_quantize_row_f16_ref(const float *x, void *vy, int64_t k)
{
	uint8_t *y = vy;
	for (int64_t i = 0; i < k; i++)
		store_u16(y + 2 * i, quant_fp32_to_fp16(x[i]));
}

void quant_quantize_row_bf16_ref(const float *x, void *vy, int64_t k)
{
	uint8_t *y = vy;
	for (int64_t i = 0; i < k; i++)
		store_u16(y + 2 * i, quant_fp32_to_bf16(x[i]));
}

/* ---- legacy 32-element formats --------------------------------------------------- */

/* Signed element of largest magnitude (the first on ties). */
static float signed_absmax(const float *x, int n)
{
	float amax = 0.0f, max = 0.0f;
	for (int j = 0; j < n; j++) {
		if (amax < fabsf(x[j])) {
			amax = fabsf(x[j]);
			max = x[j];
		}
	}
	return max;
}

void quant_quantize_row_q4_1_ref(const float *x, void *vy, int64_t k)
{
	struct block_q4_1 *y = vy;
	for (int64_t i = 0; i < k / QK4_1; i++) {
		const float *xb = x + i * QK4_1;
		float min = FLT_MAX, max = -FLT_MAX;
		for (int j = 0; j < QK4_1; j++) {
			min = xb[j] < min ? xb[j] : min;
			max = xb[j] > max ? xb[j] : max;
		}
		float d = (max - min) / 15.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
		store_u16(&y[i].m, quant_fp32_to_fp16(min));
		for (int j = 0; j < QK4_1 / 2; j++) {
			/* (x - min) * id is in [0, 15] up to rounding: +0.5 and
			 * truncation round half up, the clamp catches 15.5. */
			int lo = CM_MIN(15, (int8_t)((xb[j] - min) * id + 0.5f));
			int hi = CM_MIN(15, (int8_t)((xb[j + QK4_1 / 2] - min) * id + 0.5f));
			y[i].qs[j] = (uint8_t)(lo | hi << 4);
		}
	}
}

void quant_quantize_row_q5_0_ref(const float *x, void *vy, int64_t k)
{
	struct block_q5_0 *y = vy;
	for (int64_t i = 0; i < k / QK5_0; i++) {
		const float *xb = x + i * QK5_0;
		/* As Q4_0: the extreme element maps to -16. */
		float d = signed_absmax(xb, QK5_0) / -16.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		uint32_t qh = 0;
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
		for (int j = 0; j < QK5_0 / 2; j++) {
			int lo = CM_MIN(31, (int8_t)(xb[j] * id + 16.5f));
			int hi = CM_MIN(31, (int8_t)(xb[j + QK5_0 / 2] * id + 16.5f));
			y[i].qs[j] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
			qh |= (uint32_t)(lo >> 4) << j;
			qh |= (uint32_t)(hi >> 4) << (j + QK5_0 / 2);
		}
		for (int b = 0; b < 4; b++)
			y[i].qh[b] = (uint8_t)(qh >> (8 * b));
	}
}

void quant_quantize_row_q5_1_ref(const float *x, void *vy, int64_t k)
{
	struct block_q5_1 *y = vy;
	for (int64_t i = 0; i < k / QK5_1; i++) {
		const float *xb = x + i * QK5_1;
		float min = FLT_MAX, max = -FLT_MAX;
		for (int j = 0; j < QK5_1; j++) {
			min = xb[j] < min ? xb[j] : min;
			max = xb[j] > max ? xb[j] : max;
		}
		float d = (max - min) / 31.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		uint32_t qh = 0;
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
		store_u16(&y[i].m, quant_fp32_to_fp16(min));
		for (int j = 0; j < QK5_1 / 2; j++) {
			int lo = CM_MIN(31, (int)((xb[j] - min) * id + 0.5f));
			int hi = CM_MIN(31, (int)((xb[j + QK5_1 / 2] - min) * id + 0.5f));
			y[i].qs[j] = (uint8_t)((lo & 0xf) | (hi & 0xf) << 4);
			qh |= (uint32_t)(lo >> 4) << j;
			qh |= (uint32_t)(hi >> 4) << (j + QK5_1 / 2);
		}
		for (int b = 0; b < 4; b++)
			y[i].qh[b] = (uint8_t)(qh >> (8 * b));
	}
}

void quant_quantize_row_q8_1_ref(const float *x, void *vy, int64_t k)
{
	struct block_q8_1 *y = vy;
	for (int64_t i = 0; i < k / QK8_1; i++) {
		const float *xb = x + i * QK8_1;
		float amax = 0.0f;
		for (int j = 0; j < QK8_1; j++)
			amax = fmaxf(amax, fabsf(xb[j]));
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		int sum = 0;
		for (int j = 0; j < QK8_1; j++) {
			y[i].qs[j] = (int8_t)roundf(xb[j] * id);
			sum += y[i].qs[j];
		}
		store_u16(&y[i].d, quant_fp32_to_fp16(d));
		/* The sum is taken over the quantized values, so s describes
		 * exactly what the dot product multiplies (up to its rounding). */
		store_u16(&y[i].s, quant_fp32_to_fp16((float)sum * d));
	}
}

/* ---- K-quants: scale search ------------------------------------------------------
 *
 * The K-quant reference quantizers choose each sub-block's scale (and min)
 * the way llama.cpp's reference does, so that files match llama-quantize's
 * (without an importance matrix). Rounding is to nearest, ties to even
 * (lrintf in the default rounding mode); every float expression keeps the
 * operation order of the reference, since a changed order changes bytes. */

#define GROUP_EPS 1e-15f

static inline int round_even(float v)
{
	return (int)lrintf(v);
}

static inline int clampi(int v, int lo, int hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/* Symmetric quants in [-nmax, nmax - 1] for n values with weights x^2:
 * start from the scale that maps the extreme element to -nmax, then try the
 * 18 neighbouring scales -(nmax +- 0.1 t)/max (t = 1..9) and keep the one
 * whose least-squares scale sum(w x l)^2 / sum(w l^2) explains most of the
 * signal, i.e. has the smallest weighted squared error. L gets l + nmax.
 * Returns the scale (x ~ scale * l). */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0.0f, amax = 0.0f;
	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < GROUP_EPS) {
		memset(L, 0, (size_t)n);
		return 0.0f;
	}
	float iscale = (float)-nmax / max;
	float sumlx = 0.0f, suml2 = 0.0f;
	for (int i = 0; i < n; i++) {
		int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (int8_t)(l + nmax);
		float w = x[i] * x[i];
		sumlx += w * x[i] * (float)l;
		suml2 += w * (float)l * (float)l;
	}
	float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
	float best = scale * sumlx;
	for (int t = -9; t <= 9; t++) {
		if (t == 0)
			continue;
		iscale = -((float)nmax + 0.1f * (float)t) / max;
		sumlx = suml2 = 0.0f;
		for (int i = 0; i < n; i++) {
			int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
			float w = x[i] * x[i];
			sumlx += w * x[i] * (float)l;
			suml2 += w * (float)l * (float)l;
		}
		if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; i++)
				L[i] = (int8_t)(nmax + clampi(round_even(iscale * x[i]), -nmax,
							      nmax - 1));
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/* Q3_K's variant: quants in [-nmax, nmax - 1] (L gets l + nmax), then up to
 * five passes of coordinate descent: each element in turn moves to the quant
 * that is best for the current least-squares scale, when the move raises
 * sum(w x l)^2 / sum(w l^2) (weights x^2). */
static float fit_symmetric_q3(int n, int nmax, const float *x, int8_t *L)
{
	float max = 0.0f, amax = 0.0f;
	for (int i = 0; i < n; i++) {
		if (fabsf(x[i]) > amax) {
			amax = fabsf(x[i]);
			max = x[i];
		}
	}
	if (amax < GROUP_EPS) {
		memset(L, 0, (size_t)n);
		return 0.0f;
	}
	float iscale = (float)-nmax / max;
	float sumlx = 0.0f, suml2 = 0.0f;
	for (int i = 0; i < n; i++) {
		int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
		L[i] = (int8_t)l;
		float w = x[i] * x[i];
		sumlx += w * x[i] * (float)l;
		suml2 += w * (float)l * (float)l;
	}
	for (int pass = 0; pass < 5; pass++) {
		int changed = 0;
		for (int i = 0; i < n; i++) {
			float w = x[i] * x[i];
			float slx = sumlx - w * x[i] * (float)L[i];
			if (slx <= 0.0f)
				continue;
			float sl2 = suml2 - w * (float)L[i] * (float)L[i];
			int nl = clampi(round_even(x[i] * sl2 / slx), -nmax, nmax - 1);
			if (nl == L[i])
				continue;
			slx += w * x[i] * (float)nl;
			sl2 += w * (float)nl * (float)nl;
			if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
				L[i] = (int8_t)nl;
				sumlx = slx;
				suml2 = sl2;
				changed++;
			}
		}
		if (!changed)
			break;
	}
	for (int i = 0; i < n; i++)
		L[i] = (int8_t)(L[i] + nmax);
	return sumlx / suml2;
}

/* Asymmetric quants x ~ scale * l - min, l in [0, nmax], min >= 0 (the range
 * always includes 0). Starts from the plain min/max fit, then tries nstep+1
 * candidate inverse scales (rmin + rdelta t + nmax) / (max - min); for each,
 * rounds, solves the weighted least-squares problem for (scale, offset)
 * exactly (offset clamped to <= 0, then scale refitted alone), and keeps the
 * candidate with the least weighted error (absolute error when use_abs, else
 * squared). Returns the scale; *ret_min gets the min (a positive number). */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
			   float *ret_min, float rmin, float rdelta, int nstep, bool use_abs)
{
	uint8_t Lt[32];
	float min = x[0], max = x[0];
	float sum_w = w[0], sum_x = sum_w * x[0];
	for (int i = 1; i < n; i++) {
		min = x[i] < min ? x[i] : min;
		max = x[i] > max ? x[i] : max;
		sum_w += w[i];
		sum_x += w[i] * x[i];
	}
	if (min > 0.0f)
		min = 0.0f;
	if (max == min) {
		memset(L, 0, (size_t)n);
		*ret_min = -min;
		return 0.0f;
	}
	float iscale = (float)nmax / (max - min);
	float scale = 1.0f / iscale;
	float best = 0.0f;
	for (int i = 0; i < n; i++) {
		L[i] = (uint8_t)clampi(round_even(iscale * (x[i] - min)), 0, nmax);
		float diff = scale * (float)L[i] + min - x[i];
		best += w[i] * (use_abs ? fabsf(diff) : diff * diff);
	}
	for (int t = 0; t <= nstep; t++) {
		iscale = (rmin + rdelta * (float)t + (float)nmax) / (max - min);
		float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
		for (int i = 0; i < n; i++) {
			int l = clampi(round_even(iscale * (x[i] - min)), 0, nmax);
			Lt[i] = (uint8_t)l;
			sum_l += w[i] * (float)l;
			sum_l2 += w[i] * (float)l * (float)l;
			sum_xl += w[i] * (float)l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D <= 0.0f)
			continue;
		float s = (sum_w * sum_xl - sum_x * sum_l) / D;
		float m = (sum_l2 * sum_x - sum_l * sum_xl) / D;
		if (m > 0.0f) {
			m = 0.0f;
			s = sum_xl / sum_l2;
		}
		float err = 0.0f;
		for (int i = 0; i < n; i++) {
			float diff = s * (float)Lt[i] + m - x[i];
			err += w[i] * (use_abs ? fabsf(diff) : diff * diff);
		}
		if (err < best) {
			memcpy(L, Lt, (size_t)n);
			best = err;
			scale = s;
			min = m;
		}
	}
	*ret_min = -min;
	return scale;
}

/* The 2-bit pattern shared by Q2_K's and Q3_K's qs: element 32 g + l of each
 * 128-half goes to bits 2 g of byte l of that half's 32 bytes. */
static void pack_2bit(const uint8_t *L, uint8_t *qs)
{
	for (int h = 0; h < QK_K; h += 128)
		for (int l = 0; l < 32; l++)
			qs[h / 4 + l] = (uint8_t)(L[h + l] | L[h + l + 32] << 2 |
						  L[h + l + 64] << 4 | L[h + l + 96] << 6);
}

/* ---- K-quants: quantizers -------------------------------------------------------- */

void quant_quantize_row_q2_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q2_K *y = vy;
	uint8_t L[QK_K];
	float w[16], scales[QK_K / 16], mins[QK_K / 16];

	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		float max_scale = 0.0f, max_min = 0.0f;
		for (int j = 0; j < QK_K / 16; j++) {
			for (int l = 0; l < 16; l++)
				w[l] = fabsf(x[16 * j + l]);
			scales[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f,
						  0.1f, 15, true);
			max_scale = scales[j] > max_scale ? scales[j] : max_scale;
			max_min = mins[j] > max_min ? mins[j] : max_min;
		}
		/* 4-bit scales and mins relative to the largest of each. */
		if (max_scale > 0.0f) {
			float is = 15.0f / max_scale;
			for (int j = 0; j < QK_K / 16; j++)
				y[i].scales[j] = (uint8_t)round_even(is * scales[j]);
			store_u16(&y[i].d, quant_fp32_to_fp16(max_scale / 15.0f));
		} else {
			memset(y[i].scales, 0, sizeof(y[i].scales));
			store_u16(&y[i].d, 0);
		}
		if (max_min > 0.0f) {
			float im = 15.0f / max_min;
			for (int j = 0; j < QK_K / 16; j++)
				y[i].scales[j] |= (uint8_t)(round_even(im * mins[j]) << 4);
			store_u16(&y[i].dmin, quant_fp32_to_fp16(max_min / 15.0f));
		} else {
			store_u16(&y[i].dmin, 0);
		}
		/* Requantize against the stored (rounded) scales. */
		float d = quant_fp16_to_f32(load_u16(&y[i].d));
		float dmin = quant_fp16_to_f32(load_u16(&y[i].dmin));
		for (int j = 0; j < QK_K / 16; j++) {
			float dl = d * (float)(y[i].scales[j] & 0xf);
			if (dl == 0.0f)
				continue;
			float ml = dmin * (float)(y[i].scales[j] >> 4);
			for (int l = 0; l < 16; l++) {
				int q = round_even((x[16 * j + l] + ml) / dl);
				L[16 * j + l] = (uint8_t)clampi(q, 0, 3);
			}
		}
		pack_2bit(L, y[i].qs);
	}
}

void quant_quantize_row_q3_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q3_K *y = vy;
	int8_t L[QK_K];
	float scales[QK_K / 16];

	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		float max_scale = 0.0f, amax = 0.0f;
		for (int j = 0; j < QK_K / 16; j++) {
			scales[j] = fit_symmetric_q3(16, 4, x + 16 * j, L + 16 * j);
			if (fabsf(scales[j]) > amax) {
				amax = fabsf(scales[j]);
				max_scale = scales[j];
			}
		}
		memset(y[i].scales, 0, sizeof(y[i].scales));
		if (max_scale != 0.0f) {
			float iscale = -32.0f / max_scale;
			for (int j = 0; j < QK_K / 16; j++) {
				int l = clampi(round_even(iscale * scales[j]), -32, 31) + 32;
				if (j < 8)
					y[i].scales[j] = (uint8_t)(l & 0xf);
				else
					y[i].scales[j - 8] |= (uint8_t)((l & 0xf) << 4);
				y[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
			}
			store_u16(&y[i].d, quant_fp32_to_fp16(1.0f / iscale));
		} else {
			store_u16(&y[i].d, 0);
		}
		float d = quant_fp16_to_f32(load_u16(&y[i].d));
		for (int j = 0; j < QK_K / 16; j++) {
			float dl = d * (float)quant_scale_q3_K(j, y[i].scales);
			if (dl == 0.0f)
				continue;
			for (int l = 0; l < 16; l++)
				L[16 * j + l] =
					(int8_t)(clampi(round_even(x[16 * j + l] / dl), -4, 3) + 4);
		}
		/* High bit of element e into hmask[e % 32] bit e / 32. */
		memset(y[i].hmask, 0, sizeof(y[i].hmask));
		uint8_t U[QK_K];
		for (int e = 0; e < QK_K; e++) {
			int v = L[e];
			if (v > 3) {
				y[i].hmask[e % 32] |= (uint8_t)(1u << (e / 32));
				v -= 4;
			}
			U[e] = (uint8_t)v;
		}
		pack_2bit(U, y[i].qs);
	}
}

/* Q4_K and Q5_K: 8 sub-blocks of 32 with a 6-bit scale and min each. */
static void quantize_k4_scales(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
			       uint8_t *sc12, uint16_t *ret_d, uint16_t *ret_dmin)
{
	float w[32], scales[QK_K / 32], mins[QK_K / 32];
	float max_scale = 0.0f, max_min = 0.0f;

	for (int j = 0; j < QK_K / 32; j++) {
		/* Weights favour large elements over a floor of the RMS. */
		float sum_x2 = 0.0f;
		for (int l = 0; l < 32; l++)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		float av_x = sqrtf(sum_x2 / 32.0f);
		for (int l = 0; l < 32; l++)
			w[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, 0.1f,
					  nstep, false);
		max_scale = scales[j] > max_scale ? scales[j] : max_scale;
		max_min = mins[j] > max_min ? mins[j] : max_min;
	}
	float is = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
	float im = max_min > 0.0f ? 63.0f / max_min : 0.0f;
	memset(sc12, 0, K_SCALE_SIZE);
	for (int j = 0; j < QK_K / 32; j++) {
		int ls = CM_MIN(63, (uint8_t)round_even(is * scales[j]));
		int lm = CM_MIN(63, (uint8_t)round_even(im * mins[j]));
		if (j < 4) {
			sc12[j] = (uint8_t)ls;
			sc12[j + 4] = (uint8_t)lm;
		} else {
			sc12[j + 4] = (uint8_t)((ls & 0xf) | (lm & 0xf) << 4);
			sc12[j - 4] |= (uint8_t)((ls >> 4) << 6);
			sc12[j] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	*ret_d = quant_fp32_to_fp16(max_scale / 63.0f);
	*ret_dmin = quant_fp32_to_fp16(max_min / 63.0f);
	/* Requantize against the stored scales and mins. */
	float d = quant_fp16_to_f32(*ret_d), dmin = quant_fp16_to_f32(*ret_dmin);
	for (int j = 0; j < QK_K / 32; j++) {
		uint8_t sc, m;
		quant_scale_min_k4(j, sc12, &sc, &m);
		float dl = d * (float)sc;
		if (dl == 0.0f)
			continue;
		float ml = dmin * (float)m;
		for (int l = 0; l < 32; l++)
			L[32 * j + l] =
				(uint8_t)clampi(round_even((x[32 * j + l] + ml) / dl), 0, nmax);
	}
}

void quant_quantize_row_q4_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q4_K *y = vy;
	uint8_t L[QK_K];
	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		uint16_t d, dmin;
		quantize_k4_scales(x, 15, -1.0f, 20, L, y[i].scales, &d, &dmin);
		store_u16(&y[i].d, d);
		store_u16(&y[i].dmin, dmin);
		/* Each 64-element chunk: 32 low nibbles, then 32 high ones. */
		for (int c = 0; c < QK_K; c += 64)
			for (int l = 0; l < 32; l++)
				y[i].qs[c / 2 + l] = (uint8_t)(L[c + l] | L[c + l + 32] << 4);
	}
}

void quant_quantize_row_q5_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q5_K *y = vy;
	uint8_t L[QK_K];
	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		uint16_t d, dmin;
		quantize_k4_scales(x, 31, -0.5f, 15, L, y[i].scales, &d, &dmin);
		store_u16(&y[i].d, d);
		store_u16(&y[i].dmin, dmin);
		memset(y[i].qh, 0, sizeof(y[i].qh));
		for (int c = 0; c < QK_K; c += 64) {
			for (int l = 0; l < 32; l++) {
				int a = L[c + l], b = L[c + l + 32];
				int sh = c / 32; /* sub-block of a; b is the next one */
				y[i].qh[l] |= (uint8_t)((a >> 4) << sh | (b >> 4) << (sh + 1));
				y[i].qs[c / 2 + l] = (uint8_t)((a & 0xf) | (b & 0xf) << 4);
			}
		}
	}
}

void quant_quantize_row_q6_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q6_K *y = vy;
	int8_t L[QK_K];
	float scales[QK_K / 16];

	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		float max_scale = 0.0f, amax = 0.0f;
		for (int j = 0; j < QK_K / 16; j++) {
			scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
			if (fabsf(scales[j]) > amax) {
				amax = fabsf(scales[j]);
				max_scale = scales[j];
			}
		}
		if (amax < GROUP_EPS) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		/* int8 scales: the largest maps to -128. */
		float iscale = -128.0f / max_scale;
		store_u16(&y[i].d, quant_fp32_to_fp16(1.0f / iscale));
		for (int j = 0; j < QK_K / 16; j++)
			y[i].scales[j] = (int8_t)CM_MIN(127, round_even(iscale * scales[j]));
		float d = quant_fp16_to_f32(load_u16(&y[i].d));
		for (int j = 0; j < QK_K / 16; j++) {
			float dl = d * (float)y[i].scales[j];
			if (dl == 0.0f)
				continue;
			for (int l = 0; l < 16; l++) {
				int q = round_even(x[16 * j + l] / dl);
				L[16 * j + l] = (int8_t)(clampi(q, -32, 31) + 32);
			}
		}
		for (int h = 0; h < QK_K; h += 128) {
			uint8_t *ql = y[i].ql + h / 2, *qh = y[i].qh + h / 4;
			for (int l = 0; l < 32; l++) {
				const int8_t *q = L + h + l;
				ql[l] = (uint8_t)((q[0] & 0xf) | (q[64] & 0xf) << 4);
				ql[l + 32] = (uint8_t)((q[32] & 0xf) | (q[96] & 0xf) << 4);
				qh[l] = (uint8_t)((q[0] >> 4) | (q[32] >> 4) << 2 |
						  (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
			}
		}
	}
}

void quant_quantize_row_q8_K_ref(const float *x, void *vy, int64_t k)
{
	struct block_q8_K *y = vy;
	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		float max = signed_absmax(x, QK_K);
		if (max == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		/* The extreme element maps to -127 exactly; d may be negative. */
		float iscale = -127.0f / max;
		for (int j = 0; j < QK_K; j++)
			y[i].qs[j] = (int8_t)CM_MIN(127, round_even(iscale * x[j]));
		for (int j = 0; j < QK_K / 16; j++) {
			int sum = 0;
			for (int l = 0; l < 16; l++)
				sum += y[i].qs[16 * j + l];
			int16_t s16 = (int16_t)sum;
			memcpy(&y[i].bsums[j], &s16, 2);
		}
		float d = 1.0f / iscale;
		memcpy(&y[i].d, &d, 4);
	}
}

/* ---- IQ4_NL and IQ4_XS: quantizers ----------------------------------------------- */

/* Index of the codebook entry nearest to v (the lower one on ties). */
static int iq4_nearest(float v)
{
	const int8_t *K = quant_iq4nl_values;
	if (v <= K[0])
		return 0;
	if (v >= K[15])
		return 15;
	int lo = 0, hi = 15;
	while (hi - lo > 1) {
		int mid = (lo + hi) / 2;
		if (v < K[mid])
			hi = mid;
		else
			lo = mid;
	}
	return v - K[hi - 1] < K[hi] - v ? hi - 1 : hi;
}

/* Best scale for n values on the codebook, weights x^2: candidates are the
 * scale that maps the extreme element onto +127 and 2 ntry + 1 inverse scales
 * (t - 127) / max that map it near -127 (the codebook is asymmetric). Each
 * candidate's rounding is refitted by least squares, and the one explaining
 * most of the signal (least weighted squared error) wins. */
static float iq4_fit(const float *x, int n, int ntry)
{
	const int8_t *K = quant_iq4nl_values;
	float max = signed_absmax(x, n);
	if (fabsf(max) < GROUP_EPS)
		return 0.0f;
	float best = -1.0f, d = 0.0f;
	for (int t = -ntry - 1; t <= ntry; t++) {
		/* t = -ntry - 1 stands for the plain scale max / 127 (the
		 * extreme element on +127); the others put it near -127. */
		float id = t < -ntry ? -(float)K[0] / max : ((float)t + (float)K[0]) / max;
		float sumqx = 0.0f, sumq2 = 0.0f;
		for (int j = 0; j < n; j++) {
			float q = K[iq4_nearest(id * x[j])];
			float w = x[j] * x[j];
			sumqx += w * q * x[j];
			sumq2 += w * q * q;
		}
		if (sumq2 > 0.0f && (best < 0.0f || sumqx * sumqx > best * sumq2)) {
			d = sumqx / sumq2;
			best = d * sumqx;
		}
	}
	return d;
}

static void iq4_pack(const float *x, float d, uint8_t *qs)
{
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	for (int j = 0; j < 16; j++)
		qs[j] = (uint8_t)(iq4_nearest(id * x[j]) | iq4_nearest(id * x[j + 16]) << 4);
}

void quant_quantize_row_iq4_nl_ref(const float *x, void *vy, int64_t k)
{
	struct block_iq4_nl *y = vy;
	for (int64_t i = 0; i < k / QK4_NL; i++, x += QK4_NL) {
		float d = iq4_fit(x, QK4_NL, 7);
		uint16_t dh = quant_fp32_to_fp16(d);
		store_u16(&y[i].d, dh);
		iq4_pack(x, quant_fp16_to_f32(dh), y[i].qs);
	}
}

void quant_quantize_row_iq4_xs_ref(const float *x, void *vy, int64_t k)
{
	struct block_iq4_xs *y = vy;
	float scales[QK_K / 32];
	for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
		float max_scale = 0.0f, amax = 0.0f;
		for (int ib = 0; ib < QK_K / 32; ib++) {
			scales[ib] = iq4_fit(x + 32 * ib, 32, 7);
			if (fabsf(scales[ib]) > amax) {
				amax = fabsf(scales[ib]);
				max_scale = scales[ib];
			}
		}
		/* 6-bit sub-block scales ls - 32 in [-32, 31] of d. */
		float d = -max_scale / 32.0f;
		uint16_t dh = quant_fp32_to_fp16(d);
		d = quant_fp16_to_f32(dh);
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		uint16_t sh = 0;
		memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
		store_u16(&y[i].d, dh);
		for (int ib = 0; ib < QK_K / 32; ib++) {
			int l = clampi(round_even(id * scales[ib]), -32, 31);
			iq4_pack(x + 32 * ib, d * (float)l, y[i].qs + 16 * ib);
			l += 32;
			y[i].scales_l[ib / 2] |= (uint8_t)((l & 0xf) << (4 * (ib % 2)));
			sh |= (uint16_t)((l >> 4) << (2 * ib));
		}
		store_u16(&y[i].scales_h, sh);
	}
}
