/* engine/kernels/kern_avxvnni.c: AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake,
 * Zen 5 client parts and CPUs with VNNI but no AVX-512). Built with -mavx2
 * -mfma -mf16c -mavxvnni; builds on kern_avx2_ops and replaces only the
 * integer dot products, with the same unsigned-code scheme as
 * kern_avx512.c (Q4_0: nibble codes minus 8 * sum(a); Q8_0: |w| against
 * sign(w) * a). */
#include "engine/kernels/kern.h"

#include "engine/quant.h"

#include <immintrin.h>

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

const struct kern_ops kern_avxvnni_ops = {
	.name = "avxvnni",
	.t = {
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0 },
	},
};
