/* engine/kernels/kern_avxvnni.c: AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake,
 * Zen 5 client parts and CPUs with VNNI but no AVX-512). Built with -mavx2
 * -mfma -mf16c -mavxvnni; builds on kern_avx2_ops and replaces only the
 * integer dot products, with the same unsigned-code scheme as
 * kern_avx512.c (Q4_0: nibble codes minus 8 * sum(a); Q8_0: |w| against
 * sign(w) * a). */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>
#include <string.h>

static inline float half(uint16_t h)
{
	return _cvtsh_ss(h);
}

static inline float hsum_ps(__m256 v)
{
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	x = _mm_add_ps(x, _mm_movehl_ps(x, x));
	x = _mm_add_ss(x, _mm_movehdup_ps(x));
	return _mm_cvtss_f32(x);
}

static inline __m256i q4_0_block(const struct block_q4_0 *w, const struct block_q8_0 *a)
{
	__m128i x = _mm_loadu_si128((const __m128i *)w->qs);
	__m128i m = _mm_set1_epi8(0x0f);
	__m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
	__m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
	__m256i p = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, av);
	__m256i c = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), av);
	return _mm256_sub_epi32(p, c);
}

static inline __m256i q8_0_block(const struct block_q8_0 *w, const struct block_q8_0 *a)
{
	__m256i wv = _mm256_loadu_si256((const __m256i *)w->qs);
	__m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
	return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wv, wv),
				       _mm256_sign_epi8(av, wv));
}

#define DOT_BODY(BLOCK, WT)                                                                  \
	const WT *w = vw;                                                                    \
	const struct block_q8_0 *a = va;                                                     \
	int64_t nb = n / 32, i = 0;                                                          \
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;                                      \
	for (; i + 2 <= nb; i += 2) {                                                        \
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(BLOCK(w + i, a + i)),              \
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);   \
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(BLOCK(w + i + 1, a + i + 1)),      \
				       _mm256_set1_ps(half(w[i + 1].d) * half(a[i + 1].d)), \
				       acc1);                                                \
	}                                                                                    \
	for (; i < nb; i++)                                                                  \
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(BLOCK(w + i, a + i)),              \
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);   \
	*s = hsum_ps(_mm256_add_ps(acc0, acc1))

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	DOT_BODY(q4_0_block, struct block_q4_0);
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	DOT_BODY(q8_0_block, struct block_q8_0);
}

/* ---- the x16 repacked layout (kern.h) --------------------------------------
 * kern_avx512.c's panel walk on ymm: a 64-byte vector of the layout holds
 * rows 0-7 in its first half and rows 8-15 in its second, so each half of
 * the panel is walked in turn (the second walk finds the panel in L1/L2),
 * with the reference's operation sequence per (row, token): bit-identical
 * to kern_gemm_x16_ref() whatever the token count. 16 ymm registers allow
 * 4 tokens per walk. */
#define X16V_TOKENS 4

static inline int32_t ld32(const void *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline __attribute__((always_inline)) void
x16_half(bool q4, int64_t nb, int NT, const uint8_t *panel, int h, const uint8_t *a,
	 size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	 bool from_s)
{
	const size_t cb = q4 ? 256 : 512;
	const __m256i low = _mm256_set1_epi8(0x0f);
	const __m256 offv = _mm256_set1_ps(q4 ? 8.0f : 128.0f);
	__m256 acc[X16V_TOKENS];
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
		acc[t] = from_s ? _mm256_loadu_ps(s + (size_t)t * s_stride + 8 * h)
				: _mm256_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, 32, b) + 32 * h;
		__m256i c[8];
		if (q4) {
			_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
				__m256i v = _mm256_loadu_si256((const __m256i *)(pb + 64 * j));
				c[j] = _mm256_and_si256(v, low);
				c[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
			}
		} else {
			_Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
				c[g] = _mm256_loadu_si256((const __m256i *)(pb + 64 * g));
		}
		__m256 dw = _mm256_cvtph_ps(
			_mm_loadu_si128((const __m128i *)(KERN_X16_META(panel, nb, cb, 32, b) + 16 * h)));
		_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
			const int8_t *q = ((const struct block_q8_0 *)(a + (size_t)t * a_stride))[b].qs;
			const float *x = aux + (size_t)t * aux_stride + 2 * b;
			__m256i s0 = _mm256_setzero_si256(), s1 = s0;
			_Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
				s0 = _mm256_dpbusd_avx_epi32(s0, c[g], _mm256_set1_epi32(ld32(q + 4 * g)));
				s1 = _mm256_dpbusd_avx_epi32(s1, c[g + 1],
							     _mm256_set1_epi32(ld32(q + 4 * g + 4)));
			}
			__m256 f = _mm256_fnmadd_ps(offv, _mm256_set1_ps(x[1]),
						    _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)));
			acc[t] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(x[0])), acc[t]);
		}
	}
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
		_mm256_storeu_ps(s + (size_t)t * s_stride + 8 * h, acc[t]);
}

/* One token (decode): both halves in one walk, so the panel streams from
 * memory once while the compute runs (two walks left the memory idle
 * during the second), the stream prefetched X16V_PREFETCH ahead,
 * and for Q4_0 the high nibbles fed unshifted (16 x code, the sum taken
 * down by 16 once, exact). Per (row, token) the same float steps as
 * x16_half: bit-identical. */
#ifndef X16V_PREFETCH
#define X16V_PREFETCH 2048
#endif
#define PF_T0(p) _mm_prefetch((p), _MM_HINT_T0)

static inline __attribute__((always_inline)) void
x16_one(bool q4, int64_t nb, const uint8_t *panel, const uint8_t *a, const float *aux, float *s,
	bool from_s)
{
	const size_t cb = q4 ? 256 : 512;
	const __m256i low = _mm256_set1_epi8(0x0f);
	const __m256 offv = _mm256_set1_ps(q4 ? 8.0f : 128.0f);
	__m256 acc[2] = {from_s ? _mm256_loadu_ps(s) : _mm256_setzero_ps(),
			 from_s ? _mm256_loadu_ps(s + 8) : _mm256_setzero_ps()};
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, 32, b);
		const uint8_t *sb = KERN_X16_META(panel, nb, cb, 32, b);
		KERN_X16_PREFETCH(PF_T0, pb, cb, 32, b, X16V_PREFETCH);
		const int8_t *q = ((const struct block_q8_0 *)a)[b].qs;
		const float *x = aux + 2 * b;
		_Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
			__m256i s0 = _mm256_setzero_si256(), s1 = s0;
			if (q4) {
				_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
					__m256i v = _mm256_loadu_si256(
						(const __m256i *)(pb + 64 * j + 32 * h));
					s0 = _mm256_dpbusd_avx_epi32(s0, _mm256_and_si256(v, low),
								     _mm256_set1_epi32(ld32(q + 4 * j)));
					s1 = _mm256_dpbusd_avx_epi32(
						s1, _mm256_andnot_si256(low, v),
						_mm256_set1_epi32(ld32(q + 16 + 4 * j)));
				}
				s1 = _mm256_srai_epi32(s1, 4);
			} else {
				_Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
					s0 = _mm256_dpbusd_avx_epi32(
						s0, _mm256_loadu_si256((const __m256i *)(pb + 64 * g + 32 * h)),
						_mm256_set1_epi32(ld32(q + 4 * g)));
					s1 = _mm256_dpbusd_avx_epi32(
						s1,
						_mm256_loadu_si256(
							(const __m256i *)(pb + 64 * (g + 1) + 32 * h)),
						_mm256_set1_epi32(ld32(q + 4 * g + 4)));
				}
			}
			__m256 dw = _mm256_cvtph_ps(
				_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
			__m256 f = _mm256_fnmadd_ps(offv, _mm256_set1_ps(x[1]),
						    _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)));
			acc[h] = _mm256_fmadd_ps(f, _mm256_mul_ps(dw, _mm256_set1_ps(x[0])), acc[h]);
		}
	}
	_mm256_storeu_ps(s, acc[0]);
	_mm256_storeu_ps(s + 8, acc[1]);
}

KERN_X16_HALVES_GEMM(x16_gemm, x16_one, x16_half, X16V_TOKENS)

static void gemm_x16_q4_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			  const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			  float *s, size_t s_stride, bool from_s)
{
	x16_gemm(true, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride, from_s);
}

static void gemm_x16_q8_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			  const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			  float *s, size_t s_stride, bool from_s)
{
	x16_gemm(false, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride, from_s);
}

const struct kern_ops kern_avxvnni_ops = {
	.name = "avxvnni",
	.t = {
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0, .gemm_x16 = gemm_x16_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0, .gemm_x16 = gemm_x16_q4_0 },
	},
};
