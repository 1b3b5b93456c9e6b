/* engine/kernels/kern_neon.c: aarch64 kernels, two tables.
 *
 * - kern_neon_ops (Advanced SIMD, every armv8-a core): f32 helpers, float
 *   weights, the Q8_0 activation quantizer, and Q8_0/Q4_0 dots with
 *   widening multiplies (smull + sadalp).
 * - kern_neon_dotprod_ops (armv8.2-a dotprod, Cortex-A55/A76 and later,
 *   Apple M, Graviton 2+): Q8_0/Q4_0 dots with sdot, in functions that carry
 *   their own target attribute, so the file's flags stay plain armv8-a.
 *
 * Same contracts as the x86 variants: float weights accumulate in double;
 * the quantizer uses vrndaq_f32 (round half away from zero, which is
 * roundf) and matches the reference bit for bit; axpy multiplies then adds;
 * integer blocks are exact in int32 with per-lane float accumulation. Q4_0
 * nibbles are made signed (minus 8) before the signed dot. Tested under
 * qemu-aarch64 by `make check-aarch64`. */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <arm_neon.h>
#include <string.h>

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

static inline float half(uint16_t h)
{
	return quant_fp16_to_f32(h);
}

/* ---- float --------------------------------------------------------------- */

static inline void fma4_f64(float32x4_t w, float32x4_t a, float64x2_t *s0, float64x2_t *s1)
{
	*s0 = vfmaq_f64(*s0, vcvt_f64_f32(vget_low_f32(w)), vcvt_f64_f32(vget_low_f32(a)));
	*s1 = vfmaq_f64(*s1, vcvt_high_f64_f32(w), vcvt_high_f64_f32(a));
}

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	float64x2_t s0 = vdupq_n_f64(0), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		fma4_f64(vld1q_f32(w + i), vld1q_f32(a + i), &s0, &s1);
		fma4_f64(vld1q_f32(w + i + 4), vld1q_f32(a + i + 4), &s2, &s3);
	}
	double r = vaddvq_f64(vaddq_f64(vaddq_f64(s0, s1), vaddq_f64(s2, s3)));
	for (; i < n; i++)
		r += (double)w[i] * (double)a[i];
	*s = (float)r;
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint16_t *w = vw;
	const float *a = va;
	float64x2_t s0 = vdupq_n_f64(0), s1 = s0;
	int64_t i = 0;
	for (; i + 4 <= n; i += 4) {
		float32x4_t x = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(w + i)));
		fma4_f64(x, vld1q_f32(a + i), &s0, &s1);
	}
	double r = vaddvq_f64(vaddq_f64(s0, s1));
	for (; i < n; i++)
		r += (double)half(w[i]) * (double)a[i];
	*s = (float)r;
}

static float dot_f32(int64_t n, const float *a, const float *b)
{
	float s;
	vec_dot_f32(n, &s, a, b);
	return s;
}

static void axpy_f32(int64_t n, float a, const float *x, float *y)
{
	float32x4_t va = vdupq_n_f32(a);
	int64_t i = 0;
	for (; i + 4 <= n; i += 4)
		vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vmulq_f32(va, vld1q_f32(x + i))));
	for (; i < n; i++)
		y[i] += a * x[i];
}

static uint64_t read_stream(const void *p, size_t n)
{
	const uint64_t *v = p;
	uint64x2_t s0 = vdupq_n_u64(0), s1 = s0, s2 = s0, s3 = s0;
	for (size_t i = 0; i + 8 <= n / 8; i += 8) {
		s0 = veorq_u64(s0, vld1q_u64(v + i));
		s1 = veorq_u64(s1, vld1q_u64(v + i + 2));
		s2 = veorq_u64(s2, vld1q_u64(v + i + 4));
		s3 = veorq_u64(s3, vld1q_u64(v + i + 6));
	}
	uint64x2_t s = veorq_u64(veorq_u64(s0, s1), veorq_u64(s2, s3));
	return vgetq_lane_u64(s, 0) ^ vgetq_lane_u64(s, 1);
}

/* ---- Q8_0 activations ---------------------------------------------------- */

static void quant_q8_0(const float *x, void *vy, int64_t n)
{
	struct block_q8_0 *y = vy;
	for (int64_t i = 0; i < n / QK8_0; i++) {
		const float *xb = x + i * QK8_0;
		float32x4_t v[8];
		float32x4_t m = vdupq_n_f32(0);
		for (int k = 0; k < 8; k++) {
			v[k] = vld1q_f32(xb + 4 * k);
			m = vmaxq_f32(m, vabsq_f32(v[k]));
		}
		float amax = vmaxvq_f32(m);
		float d = amax / 127.0f;
		float id = d != 0.0f ? 1.0f / d : 0.0f;
		y[i].d = quant_fp32_to_fp16(d);
		int16x8_t h[4];
		for (int k = 0; k < 4; k++) {
			int32x4_t a = vcvtq_s32_f32(vrndaq_f32(vmulq_n_f32(v[2 * k], id)));
			int32x4_t b = vcvtq_s32_f32(vrndaq_f32(vmulq_n_f32(v[2 * k + 1], id)));
			h[k] = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
		}
		vst1q_s8(y[i].qs, vcombine_s8(vqmovn_s16(h[0]), vqmovn_s16(h[1])));
		vst1q_s8(y[i].qs + 16, vcombine_s8(vqmovn_s16(h[2]), vqmovn_s16(h[3])));
	}
}

/* ---- Q8_K activations: the generic bytes (kern.h's contract) ------------ */
static void quant_q8_K(const float *x, void *vy, int64_t n)
{
	struct block_q8_K *y = vy;
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		float32x4_t m = vdupq_n_f32(0);
		for (int j = 0; j < QK_K; j += 4)
			m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
		float amax = vmaxvq_f32(m), max = amax;
		if (amax == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		for (int j = 0; j < QK_K; j++)
			if (__builtin_fabsf(x[j]) == amax) {
				max = x[j];
				break;
			}
		float iscale = -127.0f / max;
		const int32x4_t c127 = vdupq_n_s32(127);
		for (int g = 0; g < QK_K / 16; g++) {
			int16x4_t h[4]; /* fcvtns: nearest even; vmovn: the low bytes */
			for (int k = 0; k < 4; k++)
				h[k] = vmovn_s32(vminq_s32(
					vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + 16 * g + 4 * k), iscale)),
					c127));
			int8x16_t b = vcombine_s8(vmovn_s16(vcombine_s16(h[0], h[1])),
						  vmovn_s16(vcombine_s16(h[2], h[3])));
			vst1q_s8(y[i].qs + 16 * g, b);
			int16_t sum = vaddlvq_s8(b);
			memcpy(&y[i].bsums[g], &sum, 2);
		}
		float d = 1.0f / iscale;
		memcpy(&y[i].d, &d, 4);
	}
}

/* ---- Q8_0 / Q4_0 weights: plain NEON ------------------------------------- */

static inline int32x4_t dot16(int32x4_t acc, int8x16_t w, int8x16_t a)
{
	int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(a));
	p = vmlal_s8(p, vget_high_s8(w), vget_high_s8(a)); /* |p| <= 2 * 128 * 127 */
	return vpadalq_s16(acc, p);
}

static inline void q4_0_signed(const uint8_t *qs, int8x16_t *lo, int8x16_t *hi)
{
	uint8x16_t q = vld1q_u8(qs);
	int8x16_t eight = vdupq_n_s8(8);
	*lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0f))), eight);
	*hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(q, 4)), eight);
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q8_0 *w = vw, *a = va;
	float32x4_t acc = vdupq_n_f32(0);
	for (int64_t i = 0; i < n / QK8_0; i++) {
		int32x4_t p = dot16(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs));
		p = dot16(p, vld1q_s8(w[i].qs + 16), vld1q_s8(a[i].qs + 16));
		acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), half(w[i].d) * half(a[i].d));
	}
	*s = vaddvq_f32(acc);
}

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_0 *w = vw;
	const struct block_q8_0 *a = va;
	float32x4_t acc = vdupq_n_f32(0);
	for (int64_t i = 0; i < n / QK4_0; i++) {
		int8x16_t lo, hi;
		q4_0_signed(w[i].qs, &lo, &hi);
		int32x4_t p = dot16(vdupq_n_s32(0), lo, vld1q_s8(a[i].qs));
		p = dot16(p, hi, vld1q_s8(a[i].qs + 16));
		acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), half(w[i].d) * half(a[i].d));
	}
	*s = vaddvq_f32(acc);
}

/* ---- Q8_0 / Q4_0 weights: dotprod ---------------------------------------- */

static DOTPROD void vec_dot_q8_0_q8_0_dp(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q8_0 *w = vw, *a = va;
	float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
	int64_t nb = n / QK8_0, i = 0;
	for (; i + 2 <= nb; i += 2) {
		int32x4_t p0 = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs));
		p0 = vdotq_s32(p0, vld1q_s8(w[i].qs + 16), vld1q_s8(a[i].qs + 16));
		int32x4_t p1 =
			vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[i + 1].qs), vld1q_s8(a[i + 1].qs));
		p1 = vdotq_s32(p1, vld1q_s8(w[i + 1].qs + 16), vld1q_s8(a[i + 1].qs + 16));
		acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), half(w[i].d) * half(a[i].d));
		acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), half(w[i + 1].d) * half(a[i + 1].d));
	}
	for (; i < nb; i++) {
		int32x4_t p = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs));
		p = vdotq_s32(p, vld1q_s8(w[i].qs + 16), vld1q_s8(a[i].qs + 16));
		acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p), half(w[i].d) * half(a[i].d));
	}
	*s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

static DOTPROD void vec_dot_q4_0_q8_0_dp(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_0 *w = vw;
	const struct block_q8_0 *a = va;
	float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
	int64_t nb = n / QK4_0, i = 0;
	for (; i + 2 <= nb; i += 2) {
		int8x16_t l0, h0, l1, h1;
		q4_0_signed(w[i].qs, &l0, &h0);
		q4_0_signed(w[i + 1].qs, &l1, &h1);
		int32x4_t p0 = vdotq_s32(vdupq_n_s32(0), l0, vld1q_s8(a[i].qs));
		p0 = vdotq_s32(p0, h0, vld1q_s8(a[i].qs + 16));
		int32x4_t p1 = vdotq_s32(vdupq_n_s32(0), l1, vld1q_s8(a[i + 1].qs));
		p1 = vdotq_s32(p1, h1, vld1q_s8(a[i + 1].qs + 16));
		acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), half(w[i].d) * half(a[i].d));
		acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), half(w[i + 1].d) * half(a[i + 1].d));
	}
	for (; i < nb; i++) {
		int8x16_t l, h;
		q4_0_signed(w[i].qs, &l, &h);
		int32x4_t p = vdotq_s32(vdupq_n_s32(0), l, vld1q_s8(a[i].qs));
		p = vdotq_s32(p, h, vld1q_s8(a[i].qs + 16));
		acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p), half(w[i].d) * half(a[i].d));
	}
	*s = vaddvq_f32(vaddq_f32(acc0, acc1));
}

/* ---- attention over F16 / Q8_0 KV caches ----------------------------------
 * Contracts in kern.h: score_f16 sums in f32 (two accumulators, a scalar
 * tail); score_q8_0 (exact int32 block sums, then the reference's float
 * steps) and both vsums (products then sums, vmulq + vaddq, no fused
 * multiply-add) give the reference's results bit for bit. */

static void attn_score_f16(int hd, int n, const void *vq, const void *k, size_t stride,
			   float scale, float *s)
{
	const float *q = vq;
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)((const uint8_t *)k + (size_t)i * stride);
		float32x4_t a0 = vdupq_n_f32(0), a1 = a0;
		int j = 0;
		for (; j + 8 <= hd; j += 8) {
			a0 = vfmaq_f32(a0, vld1q_f32(q + j),
				       vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + j))));
			a1 = vfmaq_f32(a1, vld1q_f32(q + j + 4),
				       vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + j + 4))));
		}
		if (j + 4 <= hd) {
			a0 = vfmaq_f32(a0, vld1q_f32(q + j),
				       vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + j))));
			j += 4;
		}
		float t = vaddvq_f32(vaddq_f32(a0, a1));
		for (; j < hd; j++)
			t += q[j] * half(r[j]);
		s[i] = t * scale;
	}
}

static inline __attribute__((always_inline)) void
vsum_f16_chunk(const int NA, int j0, int n, const float *w, const uint8_t *v, size_t stride,
	       float *o)
{
	float32x4_t acc[8];
	for (int a = 0; a < NA; a++)
		acc[a] = vdupq_n_f32(0);
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		float c = w[i];
		for (int a = 0; a < NA; a++) {
			float32x4_t x = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + 4 * a)));
			acc[a] = vaddq_f32(acc[a], vmulq_n_f32(x, c));
		}
	}
	for (int a = 0; a < NA; a++)
		vst1q_f32(o + j0 + 4 * a, acc[a]);
}

static void attn_vsum_f16(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	const uint8_t *vb = v;
	int j0 = 0;
	for (; j0 + 32 <= hd; j0 += 32)
		vsum_f16_chunk(8, j0, n, w, vb, stride, o);
	for (; j0 + 4 <= hd; j0 += 4)
		vsum_f16_chunk(1, j0, n, w, vb, stride, o);
	for (int j = j0; j < hd; j++) {
		float acc = 0.0f;
		for (int i = 0; i < n; i++)
			acc += w[i] * half(((const uint16_t *)(vb + (size_t)i * stride))[j]);
		o[j] = acc;
	}
}

/* ---- several query heads against the same F16 rows (kern.h: _mq) ---------
 * score: four rows at a time widened once into `kf`, then per head
 * attn_score_f16's steps on each row (two chains over 8-element steps and
 * a 4-element step, vaddvq, the scalar tail with the same values, the
 * scale), the query's loads shared by the four rows: each head's scores
 * are the single kernel's bits. vsum: two heads at a time over one
 * widening of each row's 32 or 4 elements, lane by lane the single
 * kernel's products and sums; the scalar tail is its loop per head. Rows
 * longer than ATTN_MQ_HD take the single kernels per head. */
enum { ATTN_MQ_HD = 256 };

static inline void attn_cvt_rows(int hd, int rows, const uint8_t *k, size_t stride,
				 float (*kf)[ATTN_MQ_HD])
{
	for (int r = 0; r < rows; r++) {
		const uint16_t *row = (const uint16_t *)(k + (size_t)r * stride);
		int j = 0;
		for (; j + 4 <= hd; j += 4)
			vst1q_f32(kf[r] + j, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(row + j))));
		for (; j < hd; j++)
			kf[r][j] = half(row[j]);
	}
}

static inline __attribute__((always_inline)) void
score_f32_rows(const int R, int hd, const float *q, float (*kf)[ATTN_MQ_HD], float scale,
	       float *s)
{
	float32x4_t a0[4], a1[4];
	for (int r = 0; r < R; r++)
		a0[r] = a1[r] = vdupq_n_f32(0);
	int j = 0;
	for (; j + 8 <= hd; j += 8) {
		float32x4_t q0 = vld1q_f32(q + j), q1 = vld1q_f32(q + j + 4);
		for (int r = 0; r < R; r++) {
			a0[r] = vfmaq_f32(a0[r], q0, vld1q_f32(kf[r] + j));
			a1[r] = vfmaq_f32(a1[r], q1, vld1q_f32(kf[r] + j + 4));
		}
	}
	if (j + 4 <= hd) {
		float32x4_t q0 = vld1q_f32(q + j);
		for (int r = 0; r < R; r++)
			a0[r] = vfmaq_f32(a0[r], q0, vld1q_f32(kf[r] + j));
		j += 4;
	}
	for (int r = 0; r < R; r++) {
		float t = vaddvq_f32(vaddq_f32(a0[r], a1[r]));
		for (int i = j; i < hd; i++)
			t += q[i] * kf[r][i];
		s[r] = t * scale;
	}
}

static void attn_score_f16_mq(int hd, int n, int nq, const float *q, size_t q_stride,
			      const void *k, size_t stride, float scale, float *s, size_t s_stride)
{
	const uint8_t *kb = k;
	if (nq == 1 || hd > ATTN_MQ_HD) {
		for (int h = 0; h < nq; h++)
			attn_score_f16(hd, n, q + (size_t)h * q_stride, k, stride, scale,
				       s + (size_t)h * s_stride);
		return;
	}
	float kf[4][ATTN_MQ_HD] __attribute__((aligned(16)));
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		attn_cvt_rows(hd, 4, kb + (size_t)i * stride, stride, kf);
		for (int h = 0; h < nq; h++)
			score_f32_rows(4, hd, q + (size_t)h * q_stride, kf, scale,
				       s + (size_t)h * s_stride + i);
	}
	for (; i < n; i++) {
		attn_cvt_rows(hd, 1, kb + (size_t)i * stride, stride, kf);
		for (int h = 0; h < nq; h++)
			score_f32_rows(1, hd, q + (size_t)h * q_stride, kf, scale,
				       s + (size_t)h * s_stride + i);
	}
}

static inline __attribute__((always_inline)) void
vsum_f16_chunk_mq(const int NA, int j0, int n, const float *w, size_t w_stride, const uint8_t *v,
		  size_t stride, float *o, size_t o_stride)
{
	float32x4_t acc[2][8];
	for (int h = 0; h < 2; h++)
		for (int a = 0; a < NA; a++)
			acc[h][a] = vdupq_n_f32(0);
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		float32x4_t x[8];
		for (int a = 0; a < NA; a++)
			x[a] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(r + 4 * a)));
		for (int h = 0; h < 2; h++) {
			float c = w[(size_t)h * w_stride + i];
			for (int a = 0; a < NA; a++)
				acc[h][a] = vaddq_f32(acc[h][a], vmulq_n_f32(x[a], c));
		}
	}
	for (int h = 0; h < 2; h++)
		for (int a = 0; a < NA; a++)
			vst1q_f32(o + (size_t)h * o_stride + j0 + 4 * a, acc[h][a]);
}

static void attn_vsum_f16_mq(int hd, int n, int nq, const float *w, size_t w_stride,
			     const void *v, size_t stride, float *o, size_t o_stride)
{
	const uint8_t *vb = v;
	int h = 0;
	for (; h + 2 <= nq; h += 2) {
		const float *wh = w + (size_t)h * w_stride;
		float *oh = o + (size_t)h * o_stride;
		int j0 = 0;
		for (; j0 + 32 <= hd; j0 += 32)
			vsum_f16_chunk_mq(8, j0, n, wh, w_stride, vb, stride, oh, o_stride);
		for (; j0 + 4 <= hd; j0 += 4)
			vsum_f16_chunk_mq(1, j0, n, wh, w_stride, vb, stride, oh, o_stride);
		for (int g = 0; g < 2; g++)
			for (int j = j0; j < hd; j++) {
				float acc = 0.0f;
				for (int i = 0; i < n; i++)
					acc += wh[(size_t)g * w_stride + i] *
					       half(((const uint16_t *)(vb + (size_t)i * stride))[j]);
				oh[(size_t)g * o_stride + j] = acc;
			}
	}
	if (h < nq)
		attn_vsum_f16(hd, n, w + (size_t)h * w_stride, v, stride, o + (size_t)h * o_stride);
}

/* score_q8_0 for both tables, one body: DOT is the 16-byte int8 dot into
 * int32 lanes (dot16 in kern_neon_ops, sdot in kern_neon_dotprod_ops) and
 * ATTR the function's target. A macro, not an always_inline function with
 * a constant flag: GCC refuses to inline vdotq_s32 into a function without
 * the dotprod target even in a branch the flag would fold away. */
#define ATTN_SCORE_Q8_0(NAME, ATTR, DOT)                                                     \
	static ATTR void NAME(int hd, int n, const void *vq, const void *k, size_t stride,   \
			      float scale, float *s)                                         \
	{                                                                                    \
		const struct block_q8_0 *q = vq;                                             \
		int nb = (hd + QK8_0 - 1) / QK8_0;                                           \
		for (int i = 0; i < n; i++) {                                                \
			const struct block_q8_0 *r =                                         \
				(const struct block_q8_0 *)((const uint8_t *)k +             \
							    (size_t)i * stride);             \
			float sum = 0.0f;                                                    \
			for (int b = 0; b < nb; b++) {                                       \
				int32x4_t p = DOT(vdupq_n_s32(0), vld1q_s8(r[b].qs),         \
						  vld1q_s8(q[b].qs));                        \
				p = DOT(p, vld1q_s8(r[b].qs + 16), vld1q_s8(q[b].qs + 16));  \
				sum += (half(q[b].d) * half(r[b].d)) * (float)vaddvq_s32(p); \
			}                                                                    \
			s[i] = sum * scale;                                                  \
		}                                                                            \
	}

ATTN_SCORE_Q8_0(attn_score_q8_0, , dot16)
ATTN_SCORE_Q8_0(attn_score_q8_0_dp, DOTPROD, vdotq_s32)
#undef ATTN_SCORE_Q8_0

/* acc[0..8) += c * the 32 codes of a block. */
static inline void vsum_q8_block(float32x4_t acc[8], float c, const int8_t *qs)
{
	for (int h = 0; h < 2; h++) {
		int8x16_t x = vld1q_s8(qs + 16 * h);
		int16x8_t lo = vmovl_s8(vget_low_s8(x)), hi = vmovl_s8(vget_high_s8(x));
		int32x4_t e[4] = {vmovl_s16(vget_low_s16(lo)), vmovl_s16(vget_high_s16(lo)),
				  vmovl_s16(vget_low_s16(hi)), vmovl_s16(vget_high_s16(hi))};
		for (int g = 0; g < 4; g++)
			acc[4 * h + g] =
				vaddq_f32(acc[4 * h + g], vmulq_n_f32(vcvtq_f32_s32(e[g]), c));
	}
}

static void attn_vsum_q8_0(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	const uint8_t *vb = v;
	int nb = (hd + QK8_0 - 1) / QK8_0;
	for (int b = 0; b < nb; b++) {
		float32x4_t acc[8];
		for (int a = 0; a < 8; a++)
			acc[a] = vdupq_n_f32(0);
		for (int i = 0; i < n; i++) {
			const struct block_q8_0 *r =
				(const struct block_q8_0 *)(vb + (size_t)i * stride) + b;
			vsum_q8_block(acc, w[i] * half(r->d), r->qs);
		}
		int m = hd - QK8_0 * b < QK8_0 ? hd - QK8_0 * b : QK8_0;
		if (m == QK8_0) {
			for (int a = 0; a < 8; a++)
				vst1q_f32(o + QK8_0 * b + 4 * a, acc[a]);
		} else { /* the padded last block: its first m elements */
			float t[QK8_0];
			for (int a = 0; a < 8; a++)
				vst1q_f32(t + 4 * a, acc[a]);
			memcpy(o + QK8_0 * b, t, (size_t)m * sizeof(float));
		}
	}
}

/* ---- dotprod: the x16 repacked layout (kern.h) -----------------------------
 * A 64-byte vector of the layout is 4 quarters of 16 bytes, rows 0-3, 4-7,
 * 8-11, 12-15, each 32-bit lane one row's 4 elements: exactly what sdot
 * by lane wants (vdotq_laneq_s32 multiplies each lane by the same 4
 * activation bytes). Codes are made signed (Q4_0: nibble - 8; Q8_0: code ^
 * 0x80), so the integer block dot comes out with the offset already off;
 * it is exact, and the float step is the reference's fma(isum, d_w * d_a,
 * acc): bit-identical to kern_gemm_x16_ref() for any token count. Per
 * block, each quarter's codes are unpacked once for up to 4 tokens. */
#define X16N_TOKENS 4

/* The 32-element types of the x16 layout (signed codes: Q5 with the 5th
 * bit from its mask, minus 16; IQ4_NL through its codebook; Q4_1/Q5_1 as
 * they are, with min x s from their Q8_1 activations added to the block's
 * term first, kern_gemm_x16_ref's steps). */
enum x16n_kind { XN_Q8_0, XN_Q4_0, XN_Q4_1, XN_Q5_0, XN_Q5_1, XN_IQ4_NL };
#define XN_WITH_MIN(k) ((k) == XN_Q4_1 || (k) == XN_Q5_1)

/* Quarter qr of Q5 code vector g: 0x10 where the 5th bit is set (the 16
 * bits of the quarter, one per byte: each byte picks its byte of the two,
 * then tests its bit) */
static inline __attribute__((always_inline)) DOTPROD uint8x16_t x16_q5_bits(const uint8_t *pb,
									    int g, int qr)
{
	static const uint8_t pick[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
	static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128,
					1, 2, 4, 8, 16, 32, 64, 128};
	uint16_t m;
	memcpy(&m, pb + 256 + 8 * g + 2 * qr, 2);
	uint8x16_t v = vqtbl1q_u8(vreinterpretq_u8_u16(vdupq_n_u16(m)), vld1q_u8(pick));
	return vandq_u8(vtstq_u8(v, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

static inline __attribute__((always_inline)) DOTPROD void
x16_panel_dp(int kind, int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride,
	     const float *aux, size_t aux_stride, float *s, size_t s_stride, bool from_s)
{
	const bool min = XN_WITH_MIN(kind), q5 = kind == XN_Q5_0 || kind == XN_Q5_1;
	const size_t cb = kind == XN_Q8_0 ? 512 : q5 ? 320 : 256, mb = min ? 64 : 32;
	const size_t asz = min ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);
	const int8x16_t book = vld1q_s8(quant_iq4nl_values);
	float32x4_t acc[X16N_TOKENS][4];
	for (int t = 0; t < NT; t++)
		for (int qr = 0; qr < 4; qr++)
			acc[t][qr] = from_s ? vld1q_f32(s + (size_t)t * s_stride + 4 * qr)
					    : vdupq_n_f32(0);
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, mb, b);
		const uint16_t *pd =
			(const uint16_t *)(const void *)KERN_X16_META(panel, nb, cb, mb, b);
		for (int qr = 0; qr < 4; qr++) {
			int8x16_t c[8];
			if (kind != XN_Q8_0) {
				for (int j = 0; j < 4; j++) {
					uint8x16_t v = vld1q_u8(pb + 64 * j + 16 * qr);
					uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(v, 4);
					if (q5) {
						lo = vorrq_u8(lo, x16_q5_bits(pb, j, qr));
						hi = vorrq_u8(hi, x16_q5_bits(pb, j + 4, qr));
					}
					if (kind == XN_IQ4_NL) {
						c[j] = vqtbl1q_s8(book, lo);
						c[j + 4] = vqtbl1q_s8(book, hi);
					} else {
						int8_t off = kind == XN_Q4_0 ? 8 : kind == XN_Q5_0 ? 16 : 0;
						c[j] = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(off));
						c[j + 4] = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(off));
					}
				}
			} else {
				for (int g = 0; g < 8; g++)
					c[g] = vreinterpretq_s8_u8(
						veorq_u8(vld1q_u8(pb + 64 * g + 16 * qr), vdupq_n_u8(0x80)));
			}
			uint16_t dh[4], mh[4];
			memcpy(dh, pd + 4 * qr, sizeof(dh));
			float32x4_t dw = {half(dh[0]), half(dh[1]), half(dh[2]), half(dh[3])};
			float32x4_t mw = dw;
			if (min) {
				memcpy(mh, pd + 16 + 4 * qr, sizeof(mh));
				mw = (float32x4_t){half(mh[0]), half(mh[1]), half(mh[2]), half(mh[3])};
			}
			for (int t = 0; t < NT; t++) {
				const uint8_t *ab = a + (size_t)t * a_stride + (size_t)b * asz;
				const int8_t *q = (const int8_t *)ab + (min ? 4 : 2);
				int8x16_t a0 = vld1q_s8(q), a1 = vld1q_s8(q + 16);
				int32x4_t i0 = vdupq_n_s32(0), i1 = i0;
				i0 = vdotq_laneq_s32(i0, c[0], a0, 0);
				i1 = vdotq_laneq_s32(i1, c[1], a0, 1);
				i0 = vdotq_laneq_s32(i0, c[2], a0, 2);
				i1 = vdotq_laneq_s32(i1, c[3], a0, 3);
				i0 = vdotq_laneq_s32(i0, c[4], a1, 0);
				i1 = vdotq_laneq_s32(i1, c[5], a1, 1);
				i0 = vdotq_laneq_s32(i0, c[6], a1, 2);
				i1 = vdotq_laneq_s32(i1, c[7], a1, 3);
				float32x4_t isum = vcvtq_f32_s32(vaddq_s32(i0, i1));
				const float *x = aux + (size_t)t * aux_stride + 2 * b;
				if (min) /* x: the Q8_1 block's d and s */
					acc[t][qr] = vaddq_f32(acc[t][qr],
							       vfmaq_f32(vmulq_n_f32(mw, x[1]), isum,
									 vmulq_n_f32(dw, x[0])));
				else
					acc[t][qr] = vfmaq_f32(acc[t][qr], isum, vmulq_n_f32(dw, x[0]));
			}
		}
	}
	for (int t = 0; t < NT; t++)
		for (int qr = 0; qr < 4; qr++)
			vst1q_f32(s + (size_t)t * s_stride + 4 * qr, acc[t][qr]);
}

static inline __attribute__((always_inline)) DOTPROD void
x16_gemm_dp(int kind, int64_t n, int nr, int nt, const void *vw, size_t w_stride, const void *va,
	    size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	    bool from_s)
{
	const uint8_t *w = vw, *a = va;
	int64_t nb = n / 32;
	for (int r0 = 0; r0 + KERN_X16_ROWS <= nr; r0 += KERN_X16_ROWS) {
		const uint8_t *panel = w + (size_t)r0 * w_stride;
#define X16N_TILE(kind, t, NT)                                                             \
	x16_panel_dp(kind, nb, NT, panel, a + (size_t)(t) * a_stride, a_stride,            \
		     aux + (size_t)(t) * aux_stride, aux_stride,                           \
		     s + (size_t)(t) * s_stride + r0, s_stride, from_s)
		KERN_TILES(nt, X16N_TOKENS, X16N_TILE, kind);
#undef X16N_TILE
	}
}

#define XN_GEMM_FN(NAME, KIND)                                                             \
	static DOTPROD void NAME(int64_t n, int nr, int nt, const void *w, size_t w_stride,  \
				 const void *a, size_t a_stride, const float *aux,           \
				 size_t aux_stride, float *s, size_t s_stride, bool from_s)  \
	{                                                                                  \
		x16_gemm_dp(KIND, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s,  \
			    s_stride, from_s);                                              \
	}
XN_GEMM_FN(gemm_x16_q4_0_dp, XN_Q4_0)
XN_GEMM_FN(gemm_x16_q8_0_dp, XN_Q8_0)
XN_GEMM_FN(gemm_x16_q4_1_dp, XN_Q4_1)
XN_GEMM_FN(gemm_x16_q5_0_dp, XN_Q5_0)
XN_GEMM_FN(gemm_x16_q5_1_dp, XN_Q5_1)
XN_GEMM_FN(gemm_x16_iq4_nl_dp, XN_IQ4_NL)

/* ---- dotprod: x16 K-quants (Q4_K, Q6_K; Q8_K activations) ----------------
 * kern_avx512.c's x16_q4_K_panel and x16_q6_K_panel on 4-row quarters of
 * each super-block (the panel streams once): codes 0..15 or 0..63 are
 * non-negative int8, so sdot gives the exact sub-block sums; the scales,
 * the Q4_K mins against the activation's 16-element sums and the Q6_K
 * code offset 32 stay exact in int32; then the reference's float
 * expression per super-block (-std=c11 keeps GCC from contracting it into
 * fused operations): bit-identical to kern_generic's vec_dot. */
static inline const int16_t *q8k_bsums(const struct block_q8_K *ab)
{
	return (const int16_t *)(const void *)((const uint8_t *)ab +
					       offsetof(struct block_q8_K, bsums));
}

static inline float q8k_d(const struct block_q8_K *ab)
{
	float d;
	memcpy(&d, &ab->d, sizeof(d));
	return d;
}

/* lanes 4qr..4qr+3 of 16 bytes, widened to int32 */
static inline int32x4_t quarter_u8(uint8x16_t v, int qr)
{
	uint16x8_t w = qr < 2 ? vmovl_u8(vget_low_u8(v)) : vmovl_u8(vget_high_u8(v));
	return vreinterpretq_s32_u32((qr & 1) ? vmovl_u16(vget_high_u16(w))
					      : vmovl_u16(vget_low_u16(w)));
}

static inline int32x4_t quarter_s8(const int8_t *p)
{
	int8x8_t v = vcreate_s8(0);
	int32_t x;
	memcpy(&x, p, 4);
	v = vreinterpret_s8_s32(vset_lane_s32(x, vreinterpret_s32_s8(v), 0));
	return vmovl_s16(vget_low_s16(vmovl_s8(v)));
}

static inline float32x4_t quarter_f16(const uint8_t *p)
{
	uint16_t h[4];
	memcpy(h, p, sizeof(h));
	float32x4_t f = {half(h[0]), half(h[1]), half(h[2]), half(h[3])};
	return f;
}

static inline __attribute__((always_inline)) DOTPROD void
x16_q4_K_dp(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride, float *s,
	    size_t s_stride, bool from_s)
{
	for (int t = 0; t < NT && !from_s; t++)
		for (int r = 0; r < KERN_X16_ROWS; r += 4)
			vst1q_f32(s + (size_t)t * s_stride + r, vdupq_n_f32(0));
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 2048, 256, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 2048, 256, b);
		/* 6-bit scales and mins of the 8 sub-blocks, 16 rows each */
		uint8x16_t q[12], scb[8], mnb[8];
		for (int k = 0; k < 12; k++)
			q[k] = vld1q_u8(pm + 64 + 16 * k);
		for (int j = 0; j < 8; j++) {
			if (j < 4) {
				scb[j] = vandq_u8(q[j], vdupq_n_u8(63));
				mnb[j] = vandq_u8(q[j + 4], vdupq_n_u8(63));
			} else {
				scb[j] = vorrq_u8(vandq_u8(q[j + 4], vdupq_n_u8(15)),
						  vshlq_n_u8(vshrq_n_u8(q[j - 4], 6), 4));
				mnb[j] = vorrq_u8(vshrq_n_u8(q[j + 4], 4),
						  vshlq_n_u8(vshrq_n_u8(q[j], 6), 4));
			}
		}
		for (int qr = 0; qr < 4; qr++) {
			int32x4_t sumi[X16N_TOKENS], msum[X16N_TOKENS];
			for (int t = 0; t < NT; t++)
				sumi[t] = msum[t] = vdupq_n_s32(0);
			for (int jj = 0; jj < 4; jj++) {
				int8x16_t lo[8], hi[8];
				for (int i = 0; i < 8; i++) {
					uint8x16_t v = vld1q_u8(pc + jj * 512 + i * 64 + 16 * qr);
					lo[i] = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f)));
					hi[i] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
				}
				int32x4_t s0 = quarter_u8(scb[2 * jj], qr), s1 = quarter_u8(scb[2 * jj + 1], qr);
				for (int t = 0; t < NT; t++) {
					const int8_t *aq =
						((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
						64 * jj;
					int8x16_t a0 = vld1q_s8(aq), a1 = vld1q_s8(aq + 16);
					int8x16_t a2 = vld1q_s8(aq + 32), a3 = vld1q_s8(aq + 48);
					int32x4_t i0 = vdupq_n_s32(0), i1 = i0;
					i0 = vdotq_laneq_s32(i0, lo[0], a0, 0);
					i0 = vdotq_laneq_s32(i0, lo[1], a0, 1);
					i0 = vdotq_laneq_s32(i0, lo[2], a0, 2);
					i0 = vdotq_laneq_s32(i0, lo[3], a0, 3);
					i0 = vdotq_laneq_s32(i0, lo[4], a1, 0);
					i0 = vdotq_laneq_s32(i0, lo[5], a1, 1);
					i0 = vdotq_laneq_s32(i0, lo[6], a1, 2);
					i0 = vdotq_laneq_s32(i0, lo[7], a1, 3);
					i1 = vdotq_laneq_s32(i1, hi[0], a2, 0);
					i1 = vdotq_laneq_s32(i1, hi[1], a2, 1);
					i1 = vdotq_laneq_s32(i1, hi[2], a2, 2);
					i1 = vdotq_laneq_s32(i1, hi[3], a2, 3);
					i1 = vdotq_laneq_s32(i1, hi[4], a3, 0);
					i1 = vdotq_laneq_s32(i1, hi[5], a3, 1);
					i1 = vdotq_laneq_s32(i1, hi[6], a3, 2);
					i1 = vdotq_laneq_s32(i1, hi[7], a3, 3);
					sumi[t] = vmlaq_s32(vmlaq_s32(sumi[t], i0, s0), i1, s1);
				}
			}
			float32x4_t dv = quarter_f16(pm + 8 * qr), dmv = quarter_f16(pm + 32 + 8 * qr);
			for (int t = 0; t < NT; t++) {
				const struct block_q8_K *ab =
					(const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
				const int16_t *bs = q8k_bsums(ab);
				for (int j = 0; j < 8; j++)
					msum[t] = vmlaq_n_s32(msum[t], quarter_u8(mnb[j], qr),
							      (int32_t)bs[2 * j] + bs[2 * j + 1]);
				float32x4_t da = vdupq_n_f32(q8k_d(ab));
				/* da * d * isum - da * dmin * msum, the reference's order */
				float32x4_t t1 = vmulq_f32(vmulq_f32(da, dv), vcvtq_f32_s32(sumi[t]));
				float32x4_t t2 = vmulq_f32(vmulq_f32(da, dmv), vcvtq_f32_s32(msum[t]));
				float *o = s + (size_t)t * s_stride + 4 * qr;
				vst1q_f32(o, vaddq_f32(vld1q_f32(o), vsubq_f32(t1, t2)));
			}
		}
	}
}

static inline __attribute__((always_inline)) DOTPROD void
x16_q6_K_dp(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride, float *s,
	    size_t s_stride, bool from_s)
{
	const uint8x16_t low = vdupq_n_u8(0x0f), two = vdupq_n_u8(0x30);
	for (int t = 0; t < NT && !from_s; t++)
		for (int r = 0; r < KERN_X16_ROWS; r += 4)
			vst1q_f32(s + (size_t)t * s_stride + r, vdupq_n_f32(0));
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 3072, 288, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 3072, 288, b);
		for (int qr = 0; qr < 4; qr++) {
			int32x4_t sumi[X16N_TOKENS];
			for (int t = 0; t < NT; t++)
				sumi[t] = vdupq_n_s32(0);
			for (int h = 0; h < 2; h++)
				for (int i0 = 0; i0 < 8; i0 += 4) {
					/* codes of elements 128h + 32tt + 4i, i = i0..i0+3:
					 * sub-block 8h + i0/4 + 2tt */
					int8x16_t c[4][4];
					for (int i = 0; i < 4; i++) {
						const uint8_t *ph = pc + h * 1536 + (i0 + i) * 64 + 16 * qr;
						uint8x16_t A = vld1q_u8(ph), B = vld1q_u8(ph + 512);
						uint8x16_t H = vld1q_u8(ph + 1024);
						c[0][i] = vreinterpretq_s8_u8(vorrq_u8(
							vandq_u8(A, low), vandq_u8(vshlq_n_u8(H, 4), two)));
						c[1][i] = vreinterpretq_s8_u8(vorrq_u8(
							vandq_u8(B, low), vandq_u8(vshlq_n_u8(H, 2), two)));
						c[2][i] = vreinterpretq_s8_u8(
							vorrq_u8(vshrq_n_u8(A, 4), vandq_u8(H, two)));
						c[3][i] = vreinterpretq_s8_u8(vorrq_u8(
							vshrq_n_u8(B, 4), vandq_u8(vshrq_n_u8(H, 2), two)));
					}
					for (int tt = 0; tt < 4; tt++) {
						int j = 8 * h + i0 / 4 + 2 * tt;
						int32x4_t scj = quarter_s8((const int8_t *)pm + 16 * j + 4 * qr);
						for (int t = 0; t < NT; t++) {
							const int8_t *aq =
								((const struct block_q8_K *)(a + (size_t)t *
													 a_stride))[b]
									.qs +
								128 * h + 32 * tt + 4 * i0;
							int8x16_t av = vld1q_s8(aq);
							int32x4_t is = vdupq_n_s32(0);
							is = vdotq_laneq_s32(is, c[tt][0], av, 0);
							is = vdotq_laneq_s32(is, c[tt][1], av, 1);
							is = vdotq_laneq_s32(is, c[tt][2], av, 2);
							is = vdotq_laneq_s32(is, c[tt][3], av, 3);
							sumi[t] = vmlaq_s32(sumi[t], is, scj);
						}
					}
				}
			float32x4_t dv = quarter_f16(pm + 256 + 8 * qr);
			for (int t = 0; t < NT; t++) {
				const struct block_q8_K *ab =
					(const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
				const int16_t *bs = q8k_bsums(ab);
				int32x4_t off = vdupq_n_s32(0);
				for (int j = 0; j < 16; j++)
					off = vmlaq_n_s32(off, quarter_s8((const int8_t *)pm + 16 * j + 4 * qr),
							  bs[j]);
				int32x4_t isum = vsubq_s32(sumi[t], vshlq_n_s32(off, 5));
				/* (da * d) * isum, the reference's order */
				float32x4_t f = vmulq_f32(vmulq_f32(vdupq_n_f32(q8k_d(ab)), dv),
							  vcvtq_f32_s32(isum));
				float *o = s + (size_t)t * s_stride + 4 * qr;
				vst1q_f32(o, vaddq_f32(vld1q_f32(o), f));
			}
		}
	}
}

KERN_X16K_GEMM(gemm_x16_q4_K_dp, DOTPROD, x16_q4_K_dp, X16N_TOKENS)
KERN_X16K_GEMM(gemm_x16_q6_K_dp, DOTPROD, x16_q6_K_dp, X16N_TOKENS)

/* ---- tables -------------------------------------------------------------- */

const struct kern_ops kern_neon_ops = {
	.name = "neon",
	.t = {
		[ENGINE_DTYPE_F32] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f32 },
		[ENGINE_DTYPE_F16] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f16 },
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0 },
	},
	.quant_act = {
		[ENGINE_DTYPE_Q8_0] = quant_q8_0,
		[ENGINE_DTYPE_Q8_K] = quant_q8_K,
	},
	.dot_f32 = dot_f32,
	.axpy_f32 = axpy_f32,
	.read_stream = read_stream,
	.attn_score_f16 = attn_score_f16,
	.attn_score_q8_0 = attn_score_q8_0,
	.attn_vsum_f16 = attn_vsum_f16,
	.attn_vsum_q8_0 = attn_vsum_q8_0,
	.attn_score_f16_mq = attn_score_f16_mq,
	.attn_vsum_f16_mq = attn_vsum_f16_mq,
};

const struct kern_ops kern_neon_dotprod_ops = {
	.name = "neon-dotprod",
	.t = {
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0_dp, .gemm_x16 = gemm_x16_q8_0_dp },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0_dp, .gemm_x16 = gemm_x16_q4_0_dp },
		[ENGINE_DTYPE_Q4_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q4_K_dp },
		[ENGINE_DTYPE_Q6_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q6_K_dp },
		/* x16 only: their other kernels are kern_neon_q.c's */
		[ENGINE_DTYPE_Q4_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q4_1_dp },
		[ENGINE_DTYPE_Q5_0] = { .act_type = ENGINE_DTYPE_Q8_0, .gemm_x16 = gemm_x16_q5_0_dp },
		[ENGINE_DTYPE_Q5_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q5_1_dp },
		[ENGINE_DTYPE_IQ4_NL] = { .act_type = ENGINE_DTYPE_Q8_0,
					  .gemm_x16 = gemm_x16_iq4_nl_dp },
	},
	.attn_score_q8_0 = attn_score_q8_0_dp,
};
