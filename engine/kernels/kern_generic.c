/* engine/kernels/kern_generic.c: the portable scalar kernels.
 *
 * This is the reference every ISA variant is tested against, so it favours
 * clarity and a well-defined error over speed:
 * - float weights (F32, F16, BF16) take f32 activations and accumulate the
 *   products in double, which makes the result the exact dot product rounded
 *   once to float, up to n * 2^-53 of sum |w a|;
 * - integer formats follow ggml: an exact int32 sum per 32-element block,
 *   scaled by d_w * d_a (rounded to float) and accumulated in float.
 * Built without ISA flags; must not include <immintrin.h>. */
#include "engine/kernels/kern.h"

#include "engine/quant.h"

static inline float load_f16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return fp16_to_f32(h);
}

static inline float load_bf16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return bf16_to_f32(h);
}

static inline float block_d(const void *pd)
{
	uint16_t h;
	memcpy(&h, pd, 2);
	return fp16_to_f32(h);
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

static void dequant_q8_0(const void *vw, float *y, int64_t n)
{
	const struct block_q8_0 *w = vw;
	for (int64_t i = 0; i < n / QK8_0; i++) {
		float d = block_d(&w[i].d);
		for (int j = 0; j < QK8_0; j++)
			y[i * QK8_0 + j] = (float)w[i].qs[j] * d;
	}
}

static void dequant_q4_0(const void *vw, float *y, int64_t n)
{
	const struct block_q4_0 *w = vw;
	for (int64_t i = 0; i < n / QK4_0; i++) {
		float d = block_d(&w[i].d);
		float *yb = y + i * QK4_0;
		for (int j = 0; j < QK4_0 / 2; j++) {
			yb[j] = (float)((w[i].qs[j] & 0xf) - 8) * d;
			yb[j + QK4_0 / 2] = (float)((w[i].qs[j] >> 4) - 8) * d;
		}
	}
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

size_t kern_act_row_size(uint32_t act_type, int64_t n)
{
	return dtype_row_size(act_type, n);
}

const struct kern_ops kern_generic_ops = {
	.name = "scalar",
	.t = {
		[ENGINE_DTYPE_F32] = { ENGINE_DTYPE_F32, vec_dot_f32, dequant_f32 },
		[ENGINE_DTYPE_F16] = { ENGINE_DTYPE_F32, vec_dot_f16, dequant_f16 },
		[ENGINE_DTYPE_BF16] = { ENGINE_DTYPE_F32, vec_dot_bf16, dequant_bf16 },
		[ENGINE_DTYPE_Q8_0] = { ENGINE_DTYPE_Q8_0, vec_dot_q8_0_q8_0, dequant_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { ENGINE_DTYPE_Q8_0, vec_dot_q4_0_q8_0, dequant_q4_0 },
	},
	.quant_act = {
		[ENGINE_DTYPE_F32] = quant_act_f32,
		[ENGINE_DTYPE_Q8_0] = quantize_row_q8_0_ref,
	},
	.dot_f32 = dot_f32,
	.axpy_f32 = axpy_f32,
};
