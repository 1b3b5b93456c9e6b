/* engine/kernels/kern_avx2.c: AVX2 + FMA + F16C kernels (Haswell, Zen 1 and
 * later). Built with -mavx2 -mfma -mf16c and no LTO (engine/module.mk); only
 * called after kern_select() has checked the CPU.
 *
 * - Float weights (F32, F16, BF16) accumulate in double, as the reference
 *   does: each product of two floats is exact in double, so the result
 *   differs from kern_generic only by the order of the double additions
 *   (n * 2^-53 of sum |w a|) and is nearly always the same float.
 * - Q8_0 and Q4_0 use the maddubs sign trick (|w| unsigned, sign(w) * a
 *   signed): pair sums stay within int16 because |w| <= 128 and activations
 *   are in [-127, 127] (our quantizer never makes -128). Exact int32 per
 *   block, one FMA per block in float, lanes summed at the end: the float
 *   rounding differs from the scalar's sequential order.
 * - Q4_K and Q6_K (Q8_K activations) keep each super-block's sums exact in
 *   int32 and finish it with the reference's float expression: bit-identical
 *   to kern_generic.
 * - The Q8_0 activation quantizer matches quant_quantize_row_q8_0_ref bit for bit:
 *   same d, same 1/d, same product, and roundf() (half away from zero)
 *   rebuilt from truncation instead of the vector round-to-nearest-even.
 * - dot_f32 accumulates in double like the reference; axpy_f32 multiplies
 *   then adds (no FMA), so it is bit-identical to the reference.
 * - Q4_0 and Q8_0 weights repacked at load (the x16 layout, kern.h) run
 *   gemm_x16 below: bit-identical to kern_gemm_x16_ref, like the VNNI
 *   variants, so boxes without VNNI get the layout too. */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>
#include <string.h>

/* ---- small helpers (file-local: ISA files share none) -------------------- */

static inline float hsum_ps(__m256 v)
{
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	x = _mm_add_ps(x, _mm_movehl_ps(x, x));
	x = _mm_add_ss(x, _mm_movehdup_ps(x));
	return _mm_cvtss_f32(x);
}

static inline double hsum_pd(__m256d v)
{
	__m128d x = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
	x = _mm_add_sd(x, _mm_unpackhi_pd(x, x));
	return _mm_cvtsd_f64(x);
}

static inline float half(uint16_t h)
{
	return _cvtsh_ss(h);
}

/* 8 float products accumulated into two double vectors. */
static inline void fma8_pd(__m256 w, __m256 a, __m256d *s0, __m256d *s1)
{
	*s0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(w)),
			      _mm256_cvtps_pd(_mm256_castps256_ps128(a)), *s0);
	*s1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)),
			      _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)), *s1);
}

/* ---- float weights ------------------------------------------------------- */

static double dot_tail(int64_t i, int64_t n, const float *w, const float *a)
{
	double s = 0;
	for (; i < n; i++)
		s += (double)w[i] * (double)a[i];
	return s;
}

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	__m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		fma8_pd(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), &s0, &s1);
		fma8_pd(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), &s2, &s3);
	}
	for (; i + 8 <= n; i += 8)
		fma8_pd(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), &s0, &s1);
	double r = hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
	*s = (float)(r + dot_tail(i, n, w, a));
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint16_t *w = vw;
	const float *a = va;
	__m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
		__m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i + 8)));
		fma8_pd(w0, _mm256_loadu_ps(a + i), &s0, &s1);
		fma8_pd(w1, _mm256_loadu_ps(a + i + 8), &s2, &s3);
	}
	double r = hsum_pd(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
	for (; i < n; i++)
		r += (double)half(w[i]) * (double)a[i];
	*s = (float)r;
}

static void vec_dot_bf16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint16_t *w = vw;
	const float *a = va;
	__m256d s0 = _mm256_setzero_pd(), s1 = s0;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
		__m256 wf = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
		fma8_pd(wf, _mm256_loadu_ps(a + i), &s0, &s1);
	}
	double r = hsum_pd(_mm256_add_pd(s0, s1));
	for (; i < n; i++)
		r += (double)quant_bf16_to_f32(w[i]) * (double)a[i];
	*s = (float)r;
}

/* ---- Q8_0 / Q4_0 weights, Q8_0 activations ------------------------------- */

/* int32 lanes of sum(w * a) over 32 signed bytes each. */
static inline __m256i dot_i8(__m256i w, __m256i a)
{
	__m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
	return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* The 32 Q4_0 codes of a block minus 8, in element order. */
static inline __m256i q4_0_bytes(const uint8_t *qs)
{
	__m128i x = _mm_loadu_si128((const __m128i *)qs);
	__m128i m = _mm_set1_epi8(0x0f);
	__m256i b = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
	return _mm256_sub_epi8(b, _mm256_set1_epi8(8));
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q8_0 *w = vw, *a = va;
	int64_t nb = n / QK8_0, i = 0;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
	for (; i + 2 <= nb; i += 2) {
		__m256i p0 = dot_i8(_mm256_loadu_si256((const __m256i *)w[i].qs),
				    _mm256_loadu_si256((const __m256i *)a[i].qs));
		__m256i p1 = dot_i8(_mm256_loadu_si256((const __m256i *)w[i + 1].qs),
				    _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
				       _mm256_set1_ps(half(w[i + 1].d) * half(a[i + 1].d)), acc1);
	}
	for (; i < nb; i++) {
		__m256i p = dot_i8(_mm256_loadu_si256((const __m256i *)w[i].qs),
				   _mm256_loadu_si256((const __m256i *)a[i].qs));
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
	}
	*s = hsum_ps(_mm256_add_ps(acc0, acc1));
}

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_0 *w = vw;
	const struct block_q8_0 *a = va;
	int64_t nb = n / QK4_0, i = 0;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
	for (; i + 2 <= nb; i += 2) {
		__m256i p0 = dot_i8(q4_0_bytes(w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
		__m256i p1 = dot_i8(q4_0_bytes(w[i + 1].qs),
				    _mm256_loadu_si256((const __m256i *)a[i + 1].qs));
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1),
				       _mm256_set1_ps(half(w[i + 1].d) * half(a[i + 1].d)), acc1);
	}
	for (; i < nb; i++) {
		__m256i p = dot_i8(q4_0_bytes(w[i].qs), _mm256_loadu_si256((const __m256i *)a[i].qs));
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
	}
	*s = hsum_ps(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants, Q8_K activations -------------------------------------------
 * Per super-block the integer sums (isum, and the min term of Q4_K) are
 * exact, then the reference's own float expression finishes the block, in
 * the same order: these two kernels give the reference's result bit for
 * bit. maddubs pairs stay in int16: 2 * 63 * 127 < 2^15. */

static inline int32_t hsum_i32(__m256i v)
{
	__m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
	x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
	x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
	return _mm_cvtsi128_si32(x);
}

static inline float f32_at(const void *p)
{
	float f;
	memcpy(&f, p, 4);
	return f;
}

/* The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block, as bytes, from the
 * 12 packed bytes (quant_scale_min_k4 done four at a time on 32-bit words):
 * j < 4: scale = q[j] & 63, min = q[j + 4] & 63;
 * j >= 4: scale = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4,
 *         min = (q[j + 4] >> 4) | (q[j] >> 6) << 4. */
static inline void k4_scales(const uint8_t *q, uint32_t sc[2], uint32_t mn[2])
{
	uint32_t w0, w1, w2;
	memcpy(&w0, q, 4);
	memcpy(&w1, q + 4, 4);
	memcpy(&w2, q + 8, 4);
	sc[0] = w0 & 0x3f3f3f3fu;
	mn[0] = w1 & 0x3f3f3f3fu;
	sc[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
	mn[1] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
}

static void vec_dot_q4_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_K *w = vw;
	const struct block_q8_K *a = va;
	const __m256i m4 = _mm256_set1_epi8(0x0f);
	/* vpshufb masks that spread int16 scale j over a whole register */
	__m256i spread[8];
	for (int j = 0; j < 8; j++)
		spread[j] = _mm256_set1_epi16((short)(0x0100 * (2 * j + 1) + 2 * j));
	float sum = 0.0f;
	for (int64_t i = 0; i < n / QK_K; i++) {
		uint32_t sc[2], mn[2];
		k4_scales(w[i].scales, sc, mn);
		__m128i sc8 = _mm_cvtsi32_si128((int)sc[0]);
		sc8 = _mm_insert_epi32(sc8, (int)sc[1], 1);
		__m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
		__m256i acc = _mm256_setzero_si256();
		for (int k = 0; k < 4; k++) {
			__m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * k));
			__m256i lo = _mm256_and_si256(q, m4);
			__m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
			__m256i alo = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * k));
			__m256i ahi = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * k + 32));
			__m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, alo),
							_mm256_shuffle_epi8(sc16, spread[2 * k]));
			__m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ahi),
							_mm256_shuffle_epi8(sc16, spread[2 * k + 1]));
			acc = _mm256_add_epi32(acc, _mm256_add_epi32(plo, phi));
		}
		/* min term: sum_j m_j * (bsums[2j] + bsums[2j+1]) */
		__m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[i].bsums),
					       _mm256_set1_epi16(1));
		__m128i mn8 = _mm_insert_epi32(_mm_cvtsi32_si128((int)mn[0]), (int)mn[1], 1);
		__m256i mv = _mm256_cvtepu8_epi32(mn8);
		int32_t isum = hsum_i32(acc);
		int32_t msum = hsum_i32(_mm256_mullo_epi32(bs, mv));
		float da = f32_at(&a[i].d);
		sum += da * half(w[i].d) * (float)isum - da * half(w[i].dmin) * (float)msum;
	}
	*s = sum;
}

static void vec_dot_q6_K_q8_K(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q6_K *w = vw;
	const struct block_q8_K *a = va;
	const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
	/* vpshufb masks: int16 word 2g over the low lane, 2g + 1 over the high */
	__m256i pick[4];
	for (int g = 0; g < 4; g++)
		pick[g] = _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 * (4 * g + 1) + 4 * g)),
					    _mm_set1_epi16((short)(0x0100 * (4 * g + 3) + 4 * g + 2)));
	float sum = 0.0f;
	for (int64_t i = 0; i < n / QK_K; i++) {
		const int8_t *sc = w[i].scales;
		__m256i scs = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
		__m256i acc = _mm256_setzero_si256();
		for (int h = 0; h < 2; h++) {
			/* scales 8h .. 8h + 7 in both lanes */
			__m256i half_sc = h ? _mm256_permute2x128_si256(scs, scs, 0x11)
					    : _mm256_permute2x128_si256(scs, scs, 0x00);
			__m256i ql0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
			__m256i ql1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
			__m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
			__m256i q[4];
			q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4),
					       _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
			q[1] = _mm256_or_si256(
				_mm256_and_si256(ql1, m4),
				_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
			q[2] = _mm256_or_si256(
				_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
				_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
			q[3] = _mm256_or_si256(
				_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
				_mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
			for (int g = 0; g < 4; g++) {
				__m256i av = _mm256_loadu_si256(
					(const __m256i *)(a[i].qs + 128 * h + 32 * g));
				__m256i scv = _mm256_shuffle_epi8(half_sc, pick[g]);
				acc = _mm256_add_epi32(
					acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], av), scv));
			}
		}
		/* the codes are q + 32: take 32 * sum_j sc_j * bsums_j off */
		__m256i corr = _mm256_madd_epi16(
			scs, _mm256_loadu_si256((const __m256i *)a[i].bsums));
		int32_t isum = hsum_i32(acc) - 32 * hsum_i32(corr);
		sum += (f32_at(&a[i].d) * half(w[i].d)) * (float)isum;
	}
	*s = sum;
}

/* ---- activation quantizer ------------------------------------------------ */

/* roundf(v): truncate, then step away from zero when the dropped part is at
 * least one half (v - trunc(v) is exact). */
static inline __m256i round_away(__m256 v)
{
	__m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
	__m256 f = _mm256_sub_ps(v, t);
	__m256 sgn = _mm256_set1_ps(-0.0f);
	__m256 big = _mm256_cmp_ps(_mm256_andnot_ps(sgn, f), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
	__m256 one = _mm256_or_ps(_mm256_and_ps(v, sgn), _mm256_set1_ps(1.0f));
	return _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(big, one)));
}

/* One 32-element block of Q8_0 or Q8_1 activations: codes into qs, the
 * scale d (through F16C: vcvtps2ph rounds to nearest even like
 * quant_fp32_to_fp16, NaN payloads included) as f16 into *dh, the f32 d and
 * sum(q) returned for s and aux. */
static inline __attribute__((always_inline)) int q8_block(const float *xb, int8_t *qs,
							  uint16_t *dh, float *ret_d)
{
	const __m256 sgn = _mm256_set1_ps(-0.0f);
	__m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
	__m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
	__m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sgn, v0), _mm256_andnot_ps(sgn, v1)),
				 _mm256_max_ps(_mm256_andnot_ps(sgn, v2), _mm256_andnot_ps(sgn, v3)));
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_movehdup_ps(h));
	float amax = _mm_cvtss_f32(h);
	float d = amax / 127.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	*dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
	*ret_d = d;
	__m256 vid = _mm256_set1_ps(id);
	__m256i i0 = round_away(_mm256_mul_ps(v0, vid));
	__m256i i1 = round_away(_mm256_mul_ps(v1, vid));
	__m256i i2 = round_away(_mm256_mul_ps(v2, vid));
	__m256i i3 = round_away(_mm256_mul_ps(v3, vid));
	/* packs work per 128-bit lane: fix the order with one permute */
	__m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
	p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
	_mm256_storeu_si256((__m256i *)qs, p);
	__m256i sm = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
	__m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sm), _mm256_extracti128_si256(sm, 1));
	s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
	s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
	return _mm_cvtsi128_si32(s4);
}

/* Q8_0 activations, and their kern_act_aux() side data (d, sum(q)) when
 * aux is not NULL. */
static inline __attribute__((always_inline)) void quant_q8_0_body(const float *x, void *vy,
								   int64_t n, float *aux)
{
	struct block_q8_0 *y = vy;
	for (int64_t i = 0; i < n / QK8_0; i++) {
		uint16_t dh;
		float d;
		int sum = q8_block(x + i * QK8_0, y[i].qs, &dh, &d);
		memcpy(&y[i].d, &dh, 2);
		if (aux) {
			aux[2 * i] = _cvtsh_ss(dh);
			aux[2 * i + 1] = (float)sum;
		}
	}
}

/* Q8_1 (Q4_1/Q5_1's activations): Q8_0's block plus s, the f16 of
 * sum(q) d; aux holds d and s as f32. */
static inline __attribute__((always_inline)) void quant_q8_1_body(const float *x, void *vy,
								   int64_t n, float *aux)
{
	struct block_q8_1 *y = vy;
	for (int64_t i = 0; i < n / QK8_1; i++) {
		uint16_t dh;
		float d;
		int sum = q8_block(x + i * QK8_1, y[i].qs, &dh, &d);
		uint16_t sh = (uint16_t)_cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
		memcpy(&y[i].d, &dh, 2);
		memcpy(&y[i].s, &sh, 2);
		if (aux) {
			aux[2 * i] = _cvtsh_ss(dh);
			aux[2 * i + 1] = _cvtsh_ss(sh);
		}
	}
}

KERN_QUANT_PAIR(quant_q8_1, quant_q8_1_body)
KERN_QUANT_PAIR(quant_q8_0, quant_q8_0_body)

/* Q8_K, the generic bytes (kern.h's contract). */
static void quant_q8_K(const float *x, void *vy, int64_t n)
{
	struct block_q8_K *y = vy;
	const __m256 sgn = _mm256_set1_ps(-0.0f);
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		__m256 am = _mm256_setzero_ps();
		for (int j = 0; j < QK_K; j += 8)
			am = _mm256_max_ps(am, _mm256_andnot_ps(sgn, _mm256_loadu_ps(x + j)));
		__m128 h = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
		h = _mm_max_ps(h, _mm_movehl_ps(h, h));
		h = _mm_max_ss(h, _mm_movehdup_ps(h));
		float amax = _mm_cvtss_f32(h), max = amax;
		if (amax == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		for (int j = 0; j < QK_K; j += 8) {
			int k = _mm256_movemask_ps(_mm256_cmp_ps(
				_mm256_andnot_ps(sgn, _mm256_loadu_ps(x + j)), _mm256_set1_ps(amax),
				_CMP_EQ_OQ));
			if (k) {
				max = x[j + __builtin_ctz((unsigned)k)];
				break;
			}
		}
		float iscale = -127.0f / max;
		__m256 vs = _mm256_set1_ps(iscale);
		const __m256i lo8 = _mm256_set1_epi32(0xff), c127 = _mm256_set1_epi32(127);
		for (int g = 0; g < QK_K; g += 32) {
			__m256i q[4];
			for (int k = 0; k < 4; k++) {
				__m256 v = _mm256_round_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + g + 8 * k)),
							   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
				q[k] = _mm256_and_si256(_mm256_min_epi32(_mm256_cvtps_epi32(v), c127), lo8);
			}
			/* low bytes (the int8 cast), kept by the mask above */
			__m256i p = _mm256_packus_epi16(_mm256_packus_epi32(q[0], q[1]),
							_mm256_packus_epi32(q[2], q[3]));
			p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
			_mm256_storeu_si256((__m256i *)(y[i].qs + g), p);
			/* two bsums: the stored bytes, signed, 16 at a time */
			__m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p),
						      _mm256_set1_epi16(1));
			__m128i s4 = _mm_hadd_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
			s4 = _mm_hadd_epi32(s4, s4);
			int16_t b0 = (int16_t)_mm_cvtsi128_si32(s4);
			int16_t b1 = (int16_t)_mm_extract_epi32(s4, 1);
			memcpy(&y[i].bsums[g / 16], &b0, 2);
			memcpy(&y[i].bsums[g / 16 + 1], &b1, 2);
		}
		float d = 1.0f / iscale;
		memcpy(&y[i].d, &d, 4);
	}
}

/* F16 rows (the F16 KV cache): vcvtps2ph, bit for bit quant_fp32_to_fp16 */
static void quant_f16(const float *x, void *vy, int64_t n)
{
	uint16_t *y = vy;
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(y + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		y[i] = (uint16_t)_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* ---- f32 helpers --------------------------------------------------------- */

static float dot_f32(int64_t n, const float *a, const float *b)
{
	float s;
	vec_dot_f32(n, &s, a, b);
	return s;
}

static void axpy_f32(int64_t n, float a, const float *x, float *y)
{
	__m256 va = _mm256_set1_ps(a);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i),
						      _mm256_mul_ps(va, _mm256_loadu_ps(x + i))));
	for (; i < n; i++)
		y[i] += a * x[i];
}

static uint64_t read_stream(const void *p, size_t n)
{
	const __m256i *v = p;
	__m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
	__m256i s4 = s0, s5 = s0, s6 = s0, s7 = s0;
	for (size_t i = 0; i + 8 <= n / 32; i += 8) {
		s0 = _mm256_xor_si256(s0, _mm256_load_si256(v + i));
		s1 = _mm256_xor_si256(s1, _mm256_load_si256(v + i + 1));
		s2 = _mm256_xor_si256(s2, _mm256_load_si256(v + i + 2));
		s3 = _mm256_xor_si256(s3, _mm256_load_si256(v + i + 3));
		s4 = _mm256_xor_si256(s4, _mm256_load_si256(v + i + 4));
		s5 = _mm256_xor_si256(s5, _mm256_load_si256(v + i + 5));
		s6 = _mm256_xor_si256(s6, _mm256_load_si256(v + i + 6));
		s7 = _mm256_xor_si256(s7, _mm256_load_si256(v + i + 7));
	}
	__m256i s = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(s0, s1),
						      _mm256_xor_si256(s2, s3)),
				     _mm256_xor_si256(_mm256_xor_si256(s4, s5),
						      _mm256_xor_si256(s6, s7)));
	return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 1) ^
	       (uint64_t)_mm256_extract_epi64(s, 2) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

/* kern.h: one load per iteration into one chain (GCC would unroll it) */
static uint64_t read_stream_chain(const void *p, size_t n)
{
	const __m256i *v = p;
	__m256i s = _mm256_setzero_si256();
	_Pragma("GCC unroll 1") for (size_t i = 0; i < n / 32; i++)
		s = _mm256_xor_si256(s, _mm256_load_si256(v + i));
	__m128i q = _mm_xor_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
	return (uint64_t)_mm_cvtsi128_si64(q) ^ (uint64_t)_mm_extract_epi64(q, 1);
}

/* ---- attention over F16 / Q8_0 KV caches ----------------------------------
 * Contracts in kern.h. score_f16 sums in f32 (two accumulators, then a
 * scalar tail); score_q8_0 and both vsums take the reference's float steps
 * in its order (products then sums, no FMA), so they equal it bit for bit.
 * Q8_0 codes are in [-127, 127] (our quantizer's range), which the maddubs
 * sign trick needs. */

static void attn_score_f16(int hd, int n, const void *vq, const void *k, size_t stride,
			   float scale, float *s)
{
	const float *q = vq;
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)((const uint8_t *)k + (size_t)i * stride);
		__m256 a0 = _mm256_setzero_ps(), a1 = a0;
		int j = 0;
		for (; j + 16 <= hd; j += 16) {
			a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j),
					     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j))), a0);
			a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8),
					     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j + 8))),
					     a1);
		}
		if (j + 8 <= hd) {
			a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j),
					     _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + j))), a0);
			j += 8;
		}
		float t = hsum_ps(_mm256_add_ps(a0, a1));
		for (; j < hd; j++)
			t += q[j] * half(r[j]);
		s[i] = t * scale;
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
			int32_t isum = hsum_i32(dot_i8(_mm256_loadu_si256((const __m256i *)r[b].qs),
						       _mm256_loadu_si256((const __m256i *)q[b].qs)));
			sum += (half(q[b].d) * half(r[b].d)) * (float)isum;
		}
		s[i] = sum * scale;
	}
}

/* o[j0 .. j0 + 8 NA) over all rows, NA accumulators in registers. */
static inline __attribute__((always_inline)) void
vsum_f16_chunk(const int NA, int j0, int n, const float *w, const uint8_t *v, size_t stride,
	       float *o)
{
	__m256 acc[8];
	_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++)
		acc[a] = _mm256_setzero_ps();
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		__m256 c = _mm256_set1_ps(w[i]);
		_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++) {
			__m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * a)));
			acc[a] = _mm256_add_ps(acc[a], _mm256_mul_ps(c, x));
		}
	}
	_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++)
		_mm256_storeu_ps(o + j0 + 8 * a, acc[a]);
}

static void attn_vsum_f16(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	const uint8_t *vb = v;
	int j0 = 0;
	for (; j0 + 64 <= hd; j0 += 64)
		vsum_f16_chunk(8, j0, n, w, vb, stride, o);
	if (j0 + 32 <= hd) {
		vsum_f16_chunk(4, j0, n, w, vb, stride, o);
		j0 += 32;
	}
	for (; j0 + 8 <= hd; j0 += 8)
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
 * attn_score_f16's steps on each row (two chains over 16-element steps and
 * an 8-element step, hsum_ps, the scalar tail with the same values, the
 * scale), the query's loads shared by the four rows: each head's scores
 * are the single kernel's bits. vsum: two heads at a time over one
 * widening of each row's 32 or 8 elements, lane by lane the single
 * kernel's products and sums; the scalar tail is its loop per head. Rows
 * longer than ATTN_MQ_HD take the single kernels per head. */
enum { ATTN_MQ_HD = 256 };

static inline void attn_cvt_rows(int hd, int rows, const uint8_t *k, size_t stride,
				 float (*kf)[ATTN_MQ_HD])
{
	for (int r = 0; r < rows; r++) {
		const uint16_t *row = (const uint16_t *)(k + (size_t)r * stride);
		int j = 0;
		for (; j + 8 <= hd; j += 8)
			_mm256_store_ps(kf[r] + j,
					_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + j))));
		for (; j < hd; j++)
			kf[r][j] = half(row[j]);
	}
}

static inline __attribute__((always_inline)) void
score_f32_rows(const int R, int hd, const float *q, float (*kf)[ATTN_MQ_HD], float scale,
	       float *s)
{
	__m256 a0[4], a1[4];
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		a0[r] = a1[r] = _mm256_setzero_ps();
	int j = 0;
	for (; j + 16 <= hd; j += 16) {
		__m256 q0 = _mm256_loadu_ps(q + j), q1 = _mm256_loadu_ps(q + j + 8);
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
			a0[r] = _mm256_fmadd_ps(q0, _mm256_load_ps(kf[r] + j), a0[r]);
			a1[r] = _mm256_fmadd_ps(q1, _mm256_load_ps(kf[r] + j + 8), a1[r]);
		}
	}
	if (j + 8 <= hd) {
		__m256 q0 = _mm256_loadu_ps(q + j);
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
			a0[r] = _mm256_fmadd_ps(q0, _mm256_load_ps(kf[r] + j), a0[r]);
		j += 8;
	}
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
		float t = hsum_ps(_mm256_add_ps(a0[r], a1[r]));
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
	float kf[4][ATTN_MQ_HD] __attribute__((aligned(32)));
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
vsum_f16_chunk_mq(const int NA, const int NQ, int j0, int n, const float *w, size_t w_stride,
		  const uint8_t *v, size_t stride, float *o, size_t o_stride)
{
	__m256 acc[2][4];
	_Pragma("GCC unroll 2") for (int h = 0; h < NQ; h++)
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			acc[h][a] = _mm256_setzero_ps();
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		__m256 x[4];
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			x[a] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + 8 * a)));
		_Pragma("GCC unroll 2") for (int h = 0; h < NQ; h++) {
			__m256 c = _mm256_set1_ps(w[(size_t)h * w_stride + i]);
			_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
				acc[h][a] = _mm256_add_ps(acc[h][a], _mm256_mul_ps(c, x[a]));
		}
	}
	_Pragma("GCC unroll 2") for (int h = 0; h < NQ; h++)
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			_mm256_storeu_ps(o + (size_t)h * o_stride + j0 + 8 * a, acc[h][a]);
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
			vsum_f16_chunk_mq(4, 2, j0, n, wh, w_stride, vb, stride, oh, o_stride);
		for (; j0 + 8 <= hd; j0 += 8)
			vsum_f16_chunk_mq(1, 2, j0, n, wh, w_stride, vb, stride, oh, o_stride);
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

/* 8 codes of a Q8_0 block, from element e, as floats. */
static inline __m256 q8_f32(const int8_t *qs)
{
	return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)qs)));
}

/* Blocks [b0, b0 + NB) of every row (NB whole blocks of 32). */
static inline __attribute__((always_inline)) void
vsum_q8_0_chunk(const int NB, int b0, int n, const float *w, const uint8_t *v, size_t stride,
		float *o)
{
	__m256 acc[8];
	_Pragma("GCC unroll 8") for (int a = 0; a < 4 * NB; a++)
		acc[a] = _mm256_setzero_ps();
	for (int i = 0; i < n; i++) {
		const struct block_q8_0 *r = (const struct block_q8_0 *)(v + (size_t)i * stride) + b0;
		_Pragma("GCC unroll 2") for (int b = 0; b < NB; b++) {
			__m256 c = _mm256_set1_ps(w[i] * half(r[b].d));
			_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
				acc[4 * b + g] = _mm256_add_ps(acc[4 * b + g],
							       _mm256_mul_ps(c, q8_f32(r[b].qs + 8 * g)));
		}
	}
	_Pragma("GCC unroll 8") for (int a = 0; a < 4 * NB; a++)
		_mm256_storeu_ps(o + 32 * b0 + 8 * a, acc[a]);
}

static void attn_vsum_q8_0(int hd, int n, const float *w, const void *v, size_t stride, float *o)
{
	const uint8_t *vb = v;
	int nfull = hd / QK8_0, b = 0;
	for (; b + 2 <= nfull; b += 2)
		vsum_q8_0_chunk(2, b, n, w, vb, stride, o);
	if (b < nfull) {
		vsum_q8_0_chunk(1, b, n, w, vb, stride, o);
		b++;
	}
	int j0 = QK8_0 * b, m = hd - j0; /* the padded last block: m < 32 elements */
	if (m <= 0)
		return;
	int g8 = m / 8;
	__m256 acc[3] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
	float tail[8] = {0};
	for (int i = 0; i < n; i++) {
		const struct block_q8_0 *r = (const struct block_q8_0 *)(vb + (size_t)i * stride) + b;
		float c = w[i] * half(r->d);
		__m256 cv = _mm256_set1_ps(c);
		for (int g = 0; g < g8; g++)
			acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(cv, q8_f32(r->qs + 8 * g)));
		for (int j = 8 * g8; j < m; j++)
			tail[j - 8 * g8] += c * (float)r->qs[j];
	}
	for (int g = 0; g < g8; g++)
		_mm256_storeu_ps(o + j0 + 8 * g, acc[g]);
	for (int j = 8 * g8; j < m; j++)
		o[j0 + j] = tail[j - 8 * g8];
}

/* ---- the x16 repacked layout (kern.h), without VNNI -----------------------
 * kern_avxvnni.c's panel walk (rows 0-7 in the first 32 bytes of each
 * 64-byte vector, rows 8-15 in the second) with vpdpbusd built from
 * vpmaddubsw and vpmaddwd:
 * - Q4_0 codes (0..15) times int8 activations: pair sums within
 *   2 x 15 x 128, no saturation; the code offset 8 comes off in float from
 *   the activation's block sum (aux), as in the reference;
 * - Q8_0 codes, stored as q + 128, are turned back into q (one xor) and go
 *   through the sign trick of dot_i8 (pair sums within 2 x 128 x 127: our
 *   quantizer keeps activations in [-127, 127]), which gives the signed sum
 *   itself: its offset is 0. float(signed sum) is the exact value the
 *   reference's float(unsigned sum) - 128 sum(a) has (integers < 2^24).
 * Per (row, token) the integer sums are exact and the float steps are the
 * reference's, so the results equal kern_gemm_x16_ref bit for bit whatever
 * the token count. One token walks both halves of a panel at once (the
 * memory streams while the compute runs); more walk each half in turn for
 * up to 4 tokens. */
#define X16A_TOKENS 4
/* One token's panel stream prefetched this far ahead (rows cut into
 * K-segments): a longer distance holds up when the memory latency is high
 * (paired runs with tools/dev/kernel-ab.sh, docs/performance.md §4). */
#ifndef X16A_PREFETCH
#define X16A_PREFETCH 8192
#endif
#define PF_T0(p) _mm_prefetch((p), _MM_HINT_T0)

static inline int32_t ld32(const void *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* The 32-element types of the x16 layout. Q8_0 = 0 and Q4_0 = 1, so
 * kern_tiles.h's driver takes the kind where it took "q4". */
enum x16a_kind { XA_Q8_0, XA_Q4_0, XA_Q4_1, XA_Q5_0, XA_Q5_1, XA_IQ4_NL };
#define XA_CB(k) ((k) == XA_Q8_0 ? 512 : (k) == XA_Q5_0 || (k) == XA_Q5_1 ? 320 : 256)
#define XA_WITH_MIN(k) ((k) == XA_Q4_1 || (k) == XA_Q5_1)
#define XA_MB(k) (XA_WITH_MIN(k) ? 64 : 32)
/* the activation block: Q8_1 (d, s, codes) for the types with a min */
#define XA_ASZ(k) (XA_WITH_MIN(k) ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0))

/* int32 lanes += sum of 4 products (codes c, activation bytes broadcast):
 * unsigned codes through vpmaddubsw (pair sums within 2 x 31 x 128), signed
 * ones (Q8_0's, turned back from q + 128, and IQ4_NL's codebook values)
 * through dot_i8's sign trick */
static inline __attribute__((always_inline)) __m256i x16_dot(int kind, __m256i acc, __m256i c,
							     __m256i a)
{
	if (kind == XA_Q8_0)
		return _mm256_add_epi32(acc,
					dot_i8(_mm256_xor_si256(c, _mm256_set1_epi8((char)0x80)), a));
	if (kind == XA_IQ4_NL)
		return _mm256_add_epi32(acc, dot_i8(c, a));
	return _mm256_add_epi32(
		acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, a), _mm256_set1_epi16(1)));
}

/* The codes of half h of code vector g: nibbles (lo/hi of the loaded v),
 * through IQ4_NL's codebook, or with Q5's 5th bits from their 64-bit mask
 * (the 32 bits of this half, one per byte: broadcast, pick each byte's
 * byte, test its bit) */
static inline __attribute__((always_inline)) __m256i x16_codes(int kind, __m256i nib,
							       const uint8_t *pb, int g, int h)
{
	if (kind == XA_IQ4_NL)
		return _mm256_shuffle_epi8(
			_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values)),
			nib);
	if (kind == XA_Q5_0 || kind == XA_Q5_1) {
		const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
						      2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
		const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
		__m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32(ld32(pb + 256 + 8 * g + 4 * h)),
						pick);
		m = _mm256_cmpeq_epi8(_mm256_and_si256(m, bit), bit);
		return _mm256_or_si256(nib, _mm256_and_si256(m, _mm256_set1_epi8(0x10)));
	}
	return nib;
}

/* 8 rows (half h of the panel) x one block: the exact integer sums */
static inline __attribute__((always_inline)) __m256i x16_isum(int kind, const uint8_t *pb, int h,
							      const int8_t *q)
{
	__m256i s0 = _mm256_setzero_si256(), s1 = s0;
	if (kind != XA_Q8_0) {
		const __m256i low = _mm256_set1_epi8(0x0f);
		_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
			__m256i v = _mm256_loadu_si256((const __m256i *)(pb + 64 * j + 32 * h));
			__m256i lo = x16_codes(kind, _mm256_and_si256(v, low), pb, j, h);
			__m256i hi = x16_codes(kind, _mm256_and_si256(_mm256_srli_epi16(v, 4), low),
					       pb, j + 4, h);
			s0 = x16_dot(kind, s0, lo, _mm256_set1_epi32(ld32(q + 4 * j)));
			s1 = x16_dot(kind, s1, hi, _mm256_set1_epi32(ld32(q + 16 + 4 * j)));
		}
	} else {
		_Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
			s0 = x16_dot(kind, s0,
				     _mm256_loadu_si256((const __m256i *)(pb + 64 * g + 32 * h)),
				     _mm256_set1_epi32(ld32(q + 4 * g)));
			s1 = x16_dot(kind, s1,
				     _mm256_loadu_si256((const __m256i *)(pb + 64 * (g + 1) + 32 * h)),
				     _mm256_set1_epi32(ld32(q + 4 * g + 4)));
		}
	}
	return _mm256_add_epi32(s0, s1);
}

/* The reference's float steps for one block: acc += (isum - off sum(a)) *
 * (d_w * d_a), or with a min acc += fma(isum, d_w * d_a, m_w * s_a); x is
 * the activation block's aux. */
static inline __attribute__((always_inline)) __m256 x16_step(int kind, __m256 acc, __m256i isum,
							     const uint8_t *sb, int h, const float *x)
{
	__m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
	if (XA_WITH_MIN(kind)) {
		/* x: the Q8_1 block's d and s */
		__m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 32 + 16 * h)));
		__m256 ms = _mm256_mul_ps(mw, _mm256_set1_ps(x[1]));
		__m256 dd = _mm256_mul_ps(dw, _mm256_set1_ps(x[0]));
		return _mm256_add_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, ms));
	}
	float off = kind == XA_Q4_0 ? 8.0f : kind == XA_Q5_0 ? 16.0f : 0.0f;
	__m256 f = _mm256_fnmadd_ps(_mm256_set1_ps(off), _mm256_set1_ps(x[1]),
				    _mm256_cvtepi32_ps(isum));
	return _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(x[0])), acc);
}

static inline __attribute__((always_inline)) void
x16a_one(int kind, int64_t nb, const uint8_t *panel, const uint8_t *a, const float *aux, float *s,
	 bool from_s)
{
	const size_t cb = XA_CB(kind), mb = XA_MB(kind), asz = XA_ASZ(kind);
	const int qo = XA_WITH_MIN(kind) ? 4 : 2;
	__m256 acc0 = from_s ? _mm256_loadu_ps(s) : _mm256_setzero_ps();
	__m256 acc1 = from_s ? _mm256_loadu_ps(s + 8) : _mm256_setzero_ps();
	/* two blocks per iteration, as on avx512vnni (§4) */
	_Pragma("GCC unroll 2") for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, mb, b);
		const uint8_t *sb = KERN_X16_META(panel, nb, cb, mb, b);
		KERN_X16_PREFETCH(PF_T0, pb, cb, mb, b, X16A_PREFETCH);
		const int8_t *q = (const int8_t *)(a + (size_t)b * asz) + qo;
		acc0 = x16_step(kind, acc0, x16_isum(kind, pb, 0, q), sb, 0, aux + 2 * b);
		acc1 = x16_step(kind, acc1, x16_isum(kind, pb, 1, q), sb, 1, aux + 2 * b);
	}
	_mm256_storeu_ps(s, acc0);
	_mm256_storeu_ps(s + 8, acc1);
}

static inline __attribute__((always_inline)) void
x16a_half(int kind, int64_t nb, int NT, const uint8_t *panel, int h, const uint8_t *a,
	  size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	  bool from_s)
{
	const size_t cb = XA_CB(kind), mb = XA_MB(kind), asz = XA_ASZ(kind);
	const int qo = XA_WITH_MIN(kind) ? 4 : 2;
	__m256 acc[X16A_TOKENS];
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
		acc[t] = from_s ? _mm256_loadu_ps(s + (size_t)t * s_stride + 8 * h)
				: _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, mb, b);
		const uint8_t *sb = KERN_X16_META(panel, nb, cb, mb, b);
		_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
			const int8_t *q =
				(const int8_t *)(a + (size_t)t * a_stride + (size_t)b * asz) + qo;
			acc[t] = x16_step(kind, acc[t], x16_isum(kind, pb, h, q), sb, h,
					  aux + (size_t)t * aux_stride + 2 * b);
		}
	}
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(s + (size_t)t * s_stride + 8 * h, acc[t]);
}

KERN_X16_HALVES_GEMM(x16a_gemm, x16a_one, x16a_half, X16A_TOKENS)

/* ---- x16 K-quants (Q4_K, Q6_K; Q8_K activations), without VNNI ----------
 * kern_avx512.c's x16_q4_K_panel and x16_q6_K_panel on ymm, half a panel
 * (8 rows) at a time inside each super-block, so the panel still streams
 * once: the same exact sub-block sums (codes 0..15 or 0..63 times int8
 * activations through vpmaddubsw, within int16 for any activation byte),
 * scales, mins and offsets, and the reference's float expression per
 * super-block: bit-identical to kern_generic's vec_dot. */
#define X16K_PREFETCH 4096
/* A super-block's code lines are asked for a few at a time as the first
 * half-panel pass consumes them (Q4_K 8 per 512 bytes, Q6_K 12 per step),
 * not all 32 or 48 at its start: a burst outran the miss buffers (as on
 * avx512vnni; docs/performance.md §4). KERN_PF_LINES and
 * KERN_X16_PREFETCH_META are kern.h's. */

static inline __attribute__((always_inline)) __m256i dot_u8i8(__m256i acc, __m256i c,
							      const int8_t *a4)
{
	return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(
							       c, _mm256_set1_epi32(ld32(a4))),
						       _mm256_set1_epi16(1)));
}

/* int32 lanes += (int16 pair in each lane) . (the int16 pair at p) */
static inline __attribute__((always_inline)) __m256i madd_pair(__m256i acc, __m256i pairs,
							       const int16_t *p)
{
	return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi32(ld32(p))));
}

static inline const int16_t *bsums_of(const struct block_q8_K *ab)
{
	return (const int16_t *)(const void *)((const uint8_t *)ab +
					       offsetof(struct block_q8_K, bsums));
}

static inline float d_of(const struct block_q8_K *ab)
{
	float d;
	memcpy(&d, &ab->d, sizeof(d));
	return d;
}

static inline __attribute__((always_inline)) void
x16a_q4_K(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride, float *s,
	  size_t s_stride, bool from_s)
{
	const __m256i low = _mm256_set1_epi8(0x0f);
	const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m48 = _mm_set1_epi8(0x30);
	for (int t = 0; t < NT && !from_s; t++) {
		_mm256_storeu_ps(s + (size_t)t * s_stride, _mm256_setzero_ps());
		_mm256_storeu_ps(s + (size_t)t * s_stride + 8, _mm256_setzero_ps());
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 2048, 256, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 2048, 256, b);
		/* the pair's scales here, the codes' lines in the jj loop */
		KERN_X16_PREFETCH_META(PF_T0, pc, 2048, 256, b, X16K_PREFETCH);
		for (int hv = 0; hv < 2; hv++) {
			/* 6-bit scales and mins of the 8 sub-blocks, rows 8hv.. */
			__m128i q[12];
			for (int k = 0; k < 12; k++)
				q[k] = _mm_loadl_epi64((const __m128i *)(pm + 64 + 16 * k + 8 * hv));
			__m256i sc[8], mp[8];
			for (int j = 0; j < 8; j++) {
				__m128i sj, mj;
				if (j < 4) {
					sj = _mm_and_si128(q[j], m63);
					mj = _mm_and_si128(q[j + 4], m63);
				} else {
					sj = _mm_or_si128(_mm_and_si128(q[j + 4], m15),
							  _mm_and_si128(_mm_srli_epi16(q[j - 4], 2), m48));
					mj = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q[j + 4], 4), m15),
							  _mm_and_si128(_mm_srli_epi16(q[j], 2), m48));
				}
				sc[j] = _mm256_cvtepu8_epi32(sj);
				__m256i m32 = _mm256_cvtepu8_epi32(mj);
				mp[j] = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
			}
			__m256i sumi[X16A_TOKENS];
			_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
				sumi[t] = _mm256_setzero_si256();
			for (int jj = 0; jj < 4; jj++) {
				__m256i i0[X16A_TOKENS], i1[X16A_TOKENS];
				if (hv == 0)
					KERN_PF_LINES(PF_T0, (const char *)pc + X16K_PREFETCH + 512 * jj,
						      512);
				_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
					i0[t] = i1[t] = _mm256_setzero_si256();
				_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
					__m256i v = _mm256_loadu_si256(
						(const __m256i *)(pc + jj * 512 + i * 64 + 32 * hv));
					__m256i lo = _mm256_and_si256(v, low);
					__m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
					_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
						const int8_t *aq =
							((const struct block_q8_K *)(a + (size_t)t * a_stride))[b]
								.qs +
							64 * jj;
						i0[t] = dot_u8i8(i0[t], lo, aq + 4 * i);
						i1[t] = dot_u8i8(i1[t], hi, aq + 32 + 4 * i);
					}
				}
				_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
					sumi[t] = _mm256_add_epi32(
						sumi[t],
						_mm256_add_epi32(_mm256_mullo_epi32(i0[t], sc[2 * jj]),
								 _mm256_mullo_epi32(i1[t], sc[2 * jj + 1])));
			}
			__m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pm + 16 * hv)));
			__m256 dmv = _mm256_cvtph_ps(
				_mm_loadu_si128((const __m128i *)(pm + 32 + 16 * hv)));
			_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
				const struct block_q8_K *ab =
					(const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
				__m256i msum = _mm256_setzero_si256();
				for (int j = 0; j < 8; j++)
					msum = madd_pair(msum, mp[j], bsums_of(ab) + 2 * j);
				__m256 da = _mm256_set1_ps(d_of(ab));
				/* da * d * isum - da * dmin * msum, the reference's order */
				__m256 t1 = _mm256_mul_ps(_mm256_mul_ps(da, dv), _mm256_cvtepi32_ps(sumi[t]));
				__m256 t2 = _mm256_mul_ps(_mm256_mul_ps(da, dmv), _mm256_cvtepi32_ps(msum));
				float *o = s + (size_t)t * s_stride + 8 * hv;
				_mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_sub_ps(t1, t2)));
			}
		}
	}
}

static inline __attribute__((always_inline)) void
x16a_q6_K(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride, float *s,
	  size_t s_stride, bool from_s)
{
	const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(0x30);
	for (int t = 0; t < NT && !from_s; t++) {
		_mm256_storeu_ps(s + (size_t)t * s_stride, _mm256_setzero_ps());
		_mm256_storeu_ps(s + (size_t)t * s_stride + 8, _mm256_setzero_ps());
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 3072, 288, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 3072, 288, b);
		/* the pair's scales here, the codes' lines in the loop below */
		KERN_X16_PREFETCH_META(PF_T0, pc, 3072, 288, b, X16K_PREFETCH);
		for (int hv = 0; hv < 2; hv++) {
			/* int8 scales of the 16 sub-blocks as (sc 2p, sc 2p+1)
			 * int16 pairs, rows 8hv.., for the offset term */
			__m256i sp[8];
			for (int p = 0; p < 8; p++) {
				__m256i s0 = _mm256_cvtepi8_epi32(
					_mm_loadl_epi64((const __m128i *)(pm + 32 * p + 8 * hv)));
				__m256i s1 = _mm256_cvtepi8_epi32(
					_mm_loadl_epi64((const __m128i *)(pm + 32 * p + 16 + 8 * hv)));
				sp[p] = _mm256_or_si256(_mm256_and_si256(s0, _mm256_set1_epi32(0xffff)),
							_mm256_slli_epi32(s1, 16));
			}
			__m256i sumi[X16A_TOKENS];
			_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
				sumi[t] = _mm256_setzero_si256();
			for (int h = 0; h < 2; h++)
				for (int i0 = 0; i0 < 8; i0 += 4) {
					if (hv == 0) /* the 12 code lines of this step */
						_Pragma("GCC unroll 3") for (int k = 0; k < 3; k++)
							KERN_PF_LINES(PF_T0,
								      (const char *)pc + X16K_PREFETCH +
									      h * 1536 + i0 * 64 + 512 * k,
								      256);
					for (int tt = 0; tt < 4; tt++) {
						/* sub-block 8h + i0/4 + 2tt: codes of
						 * elements 128h + 32tt + 4i, i = i0..i0+3 */
						__m256i is[X16A_TOKENS];
						_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
							is[t] = _mm256_setzero_si256();
						_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
							const uint8_t *ph =
								pc + h * 1536 + (i0 + i) * 64 + 32 * hv;
							__m256i L = _mm256_loadu_si256(
								(const __m256i *)(ph + (tt & 1) * 512));
							__m256i H = _mm256_loadu_si256(
								(const __m256i *)(ph + 1024));
							if (tt >= 2)
								L = _mm256_srli_epi16(L, 4);
							H = tt == 0   ? _mm256_slli_epi16(H, 4)
							    : tt == 1 ? _mm256_slli_epi16(H, 2)
							    : tt == 2 ? H
								      : _mm256_srli_epi16(H, 2);
							__m256i c = _mm256_or_si256(
								_mm256_and_si256(L, low),
								_mm256_and_si256(H, two));
							_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
								const int8_t *aq =
									((const struct block_q8_K *)(a + (size_t)t *
														 a_stride))[b]
										.qs +
									128 * h;
								is[t] = dot_u8i8(is[t], c,
										 aq + 32 * tt + 4 * (i0 + i));
							}
						}
						int j = 8 * h + i0 / 4 + 2 * tt;
						__m256i scj = _mm256_cvtepi8_epi32(
							_mm_loadl_epi64((const __m128i *)(pm + 16 * j + 8 * hv)));
						_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
							sumi[t] = _mm256_add_epi32(sumi[t],
										   _mm256_mullo_epi32(is[t], scj));
					}
				}
			__m256 dv = _mm256_cvtph_ps(
				_mm_loadu_si128((const __m128i *)(pm + 256 + 16 * hv)));
			_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
				const struct block_q8_K *ab =
					(const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
				__m256i off = _mm256_setzero_si256();
				for (int p = 0; p < 8; p++)
					off = madd_pair(off, sp[p], bsums_of(ab) + 2 * p);
				__m256i isum = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(off, 5));
				/* (da * d) * isum, the reference's order */
				__m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d_of(ab)), dv),
							 _mm256_cvtepi32_ps(isum));
				float *o = s + (size_t)t * s_stride + 8 * hv;
				_mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), f));
			}
		}
	}
}

KERN_X16K_GEMM(gemm_x16_q4_K, , x16a_q4_K, X16A_TOKENS)
KERN_X16K_GEMM(gemm_x16_q6_K, , x16a_q6_K, X16A_TOKENS)

#define XA_GEMM_FN(NAME, KIND)                                                             \
	static void NAME(int64_t n, int nr, int nt, const void *w, size_t w_stride,          \
			 const void *a, size_t a_stride, const float *aux, size_t aux_stride,  \
			 float *s, size_t s_stride, bool from_s)                              \
	{                                                                                  \
		x16a_gemm(KIND, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s,    \
			  s_stride, from_s);                                                \
	}
XA_GEMM_FN(gemm_x16_q4_0, XA_Q4_0)
XA_GEMM_FN(gemm_x16_q8_0, XA_Q8_0)
XA_GEMM_FN(gemm_x16_q4_1, XA_Q4_1)
XA_GEMM_FN(gemm_x16_q5_0, XA_Q5_0)
XA_GEMM_FN(gemm_x16_q5_1, XA_Q5_1)
XA_GEMM_FN(gemm_x16_iq4_nl, XA_IQ4_NL)

const struct kern_ops kern_avx2_ops = {
	.name = "avx2",
	.t = {
		[ENGINE_DTYPE_F32] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f32 },
		[ENGINE_DTYPE_F16] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f16 },
		[ENGINE_DTYPE_BF16] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_bf16 },
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0, .gemm_x16 = gemm_x16_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0, .gemm_x16 = gemm_x16_q4_0 },
		[ENGINE_DTYPE_Q4_K] = { .act_type = ENGINE_DTYPE_Q8_K,
					.vec_dot = vec_dot_q4_K_q8_K, .gemm_x16 = gemm_x16_q4_K },
		[ENGINE_DTYPE_Q6_K] = { .act_type = ENGINE_DTYPE_Q8_K,
					.vec_dot = vec_dot_q6_K_q8_K, .gemm_x16 = gemm_x16_q6_K },
		/* x16 only: their vec_dot and tile kernels are kern_avx2_q32.c's,
		 * on the same activations */
		[ENGINE_DTYPE_Q4_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q4_1 },
		[ENGINE_DTYPE_Q5_0] = { .act_type = ENGINE_DTYPE_Q8_0, .gemm_x16 = gemm_x16_q5_0 },
		[ENGINE_DTYPE_Q5_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q5_1 },
		[ENGINE_DTYPE_IQ4_NL] = { .act_type = ENGINE_DTYPE_Q8_0,
					  .gemm_x16 = gemm_x16_iq4_nl },
	},
	.quant_act = {
		[ENGINE_DTYPE_F16] = quant_f16,
		[ENGINE_DTYPE_Q8_0] = quant_q8_0,
		[ENGINE_DTYPE_Q8_1] = quant_q8_1,
		[ENGINE_DTYPE_Q8_K] = quant_q8_K,
	},
	.quant_act_aux = {
		[ENGINE_DTYPE_Q8_0] = quant_q8_0_aux,
		[ENGINE_DTYPE_Q8_1] = quant_q8_1_aux,
	},
	.dot_f32 = dot_f32,
	.axpy_f32 = axpy_f32,
	.read_stream = read_stream,
	.read_stream_chain = read_stream_chain,
	.attn_score_f16 = attn_score_f16,
	.attn_score_q8_0 = attn_score_q8_0,
	.attn_vsum_f16 = attn_vsum_f16,
	.attn_vsum_q8_0 = attn_vsum_q8_0,
	.attn_score_f16_mq = attn_score_f16_mq,
	.attn_vsum_f16_mq = attn_vsum_f16_mq,
};
