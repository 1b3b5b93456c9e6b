/* engine/kernels/kern_avx512.c: AVX-512 kernels, two tables.
 *
 * - kern_avx512_ops (F, BW, VL, DQ: Skylake-X and later): 512-bit float
 *   dots and the streaming read; everything else from kern_avx2_ops.
 * - kern_avx512vnni_ops (+ VNNI: Ice Lake, Zen 4 and later): vpdpbusd
 *   kernels for Q8_0 and Q4_0, one token (decode) and many (prefill).
 *
 * The file is built with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma
 * -mf16c but not -mavx512vnni: the VNNI functions carry
 * __attribute__((target("avx512vnni"))), so the compiler cannot put a VNNI
 * instruction anywhere the plain table can reach.
 *
 * VNNI multiplies unsigned by signed bytes. The weights are fed as unsigned
 * codes, u = q + off (Q4_0: the raw nibble, off = 8; Q8_0: q ^ 0x80, off =
 * 128), against the signed activations, and off * sum(a) is taken off per
 * block, exactly, in the integer domain. In the decode kernels sum(a) comes
 * from a second vpdpbusd against a vector of `off`; the tile kernel reads it
 * from kern_act_aux().
 *
 * The tile kernel (gemm) follows the "unpack a weight panel once, stream
 * the tokens past it" rule (cpu-kernels.md §3-4): 16 rows x a K slice of
 * 4096 are unpacked to unsigned codes in the interleaved order vpdpbusd
 * wants (one zmm = 4 consecutive k of 16 rows) with their scales, in a
 * stack buffer that stays in L1/L2; then up to 8 tokens at a time run over
 * it, each lane of an accumulator being one output. Per (row, token) the
 * float operations are the same sequence whatever the tiling, so the
 * result does not depend on how the caller splits rows or tokens. */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>

#define VNNI __attribute__((target("avx512vnni")))

static inline float half(uint16_t h)
{
	return _cvtsh_ss(h);
}

static inline int32_t ld32(const void *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* ---- plain AVX-512 ------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *va)
{
	const float *w = vw, *a = va;
	__m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_loadu_ps(w + i), y = _mm512_loadu_ps(a + i);
		s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)),
				     _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s0);
		s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)),
				     _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)), s1);
	}
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		__m512 x = _mm512_maskz_loadu_ps(m, w + i), y = _mm512_maskz_loadu_ps(m, a + i);
		s2 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)),
				     _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s2);
		s3 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)),
				     _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)), s3);
	}
	*s = (float)_mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1),
						       _mm512_add_pd(s2, s3)));
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *va)
{
	const uint16_t *w = vw;
	const float *a = va;
	__m512d s0 = _mm512_setzero_pd(), s1 = s0;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m512 x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w + i)));
		__m512 y = _mm512_loadu_ps(a + i);
		s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)),
				     _mm512_cvtps_pd(_mm512_castps512_ps256(y)), s0);
		s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1)),
				     _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1)), s1);
	}
	double r = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
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

/* exp(x) for x in float range: x = k ln2 + r, |r| <= ln2 / 2, a degree-6
 * Taylor polynomial for exp(r) (truncation < 2e-8 relative), 2^k by
 * vscalefps (which also gives 0 and inf at the ends). */
static inline __m512 exp512(__m512 x)
{
	x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(89.0f)), _mm512_set1_ps(-104.0f));
	__m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
					_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
	r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860676533018e-06f), r);
	__m512 p = _mm512_set1_ps(1.0f / 720.0f);
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
	return _mm512_scalef_ps(p, k);
}

static void silu_mul_f32(int64_t n, float *g, const float *u)
{
	const __m512 one = _mm512_set1_ps(1.0f);
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512 x = _mm512_maskz_loadu_ps(m, g + i);
		__m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), x));
		__m512 y = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)),
					 _mm512_maskz_loadu_ps(m, u + i));
		_mm512_mask_storeu_ps(g + i, m, y);
	}
}

static float exp_sum_f32(int64_t n, float *x, float mx)
{
	const __m512 m = _mm512_set1_ps(mx);
	__m512 sum = _mm512_setzero_ps();
	for (int64_t i = 0; i < n; i += 16) {
		__mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
		__m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m));
		_mm512_mask_storeu_ps(x + i, k, e);
		sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, e));
	}
	return _mm512_reduce_add_ps(sum);
}

static uint64_t read_stream(const void *p, size_t n)
{
	const __m512i *v = p;
	__m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
	for (size_t i = 0; i + 4 <= n / 64; i += 4) {
		s0 = _mm512_xor_si512(s0, _mm512_load_si512(v + i));
		s1 = _mm512_xor_si512(s1, _mm512_load_si512(v + i + 1));
		s2 = _mm512_xor_si512(s2, _mm512_load_si512(v + i + 2));
		s3 = _mm512_xor_si512(s3, _mm512_load_si512(v + i + 3));
	}
	__m512i s = _mm512_xor_si512(_mm512_xor_si512(s0, s1), _mm512_xor_si512(s2, s3));
	/* the xor of all 64-bit words, like the generic loop */
	__m256i h = _mm256_xor_si256(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
	__m128i q = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
	return (uint64_t)_mm_cvtsi128_si64(q) ^ (uint64_t)_mm_extract_epi64(q, 1);
}

/* kern.h: one load per iteration into one chain (GCC would unroll it) */
static uint64_t read_stream_chain(const void *p, size_t n)
{
	const __m512i *v = p;
	__m512i s = _mm512_setzero_si512();
	_Pragma("GCC unroll 1") for (size_t i = 0; i < n / 64; i++)
		s = _mm512_xor_si512(s, _mm512_load_si512(v + i));
	__m256i h = _mm256_xor_si256(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
	__m128i q = _mm_xor_si128(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
	return (uint64_t)_mm_cvtsi128_si64(q) ^ (uint64_t)_mm_extract_epi64(q, 1);
}

/* ---- activation quantizers -------------------------------------------------
 * Bit for bit the generic ones: the same products x * (1 / d) rounded half
 * away from zero, the scale through vcvtps2ph (round to nearest even, as
 * quant_fp32_to_fp16). The _aux form writes kern_act_aux()'s d and sum(q) in the
 * same pass. */

/* Round half away from zero: truncate v + copysign(0.5 - 2^-25, v). The sum
 * rounds up to the next integer exactly when the dropped part is >= 1/2
 * (0.5 - 2^-25 is the float below 1/2); equal to truncating and stepping
 * out (the form this replaced) for all 2^32 bit patterns, NaN and inf
 * included (checked exhaustively), in three instructions instead of seven. */
static inline __m512i round_away_512(__m512 v)
{
	/* (v & sign) | (0.5 - 2^-25) */
	__m512i h = _mm512_ternarylogic_epi32(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN),
					      _mm512_set1_epi32(0x3effffff), 0xea);
	return _mm512_cvttps_epi32(_mm512_add_ps(v, _mm512_castsi512_ps(h)));
}

/* Lane i of the result: the max (float) or sum (int32) of the 16 lanes of
 * v[i], for 16 vectors at once, in 15 steps of two shuffles and an op
 * instead of a horizontal reduction per vector (v is overwritten). Each
 * level halves the vectors, pairing quarters, then halves of quarters, then
 * lanes; the last leaves in lane 4k + j the result of vector k, k + 8,
 * k + 4, k + 12 for j = 0..3, which one permute puts back in order. */
#define HREDUCE16(NAME, T, OP, SHUF, LO, HI, CAST, UNCAST)                                      \
	static inline T NAME(T v[16])                                                            \
	{                                                                                        \
		for (int p = 0; p < 8; p++) /* quarters 0,1 against 2,3 */                       \
			v[p] = OP(SHUF(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),         \
				  SHUF(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));        \
		for (int p = 0; p < 4; p++) /* then 0 against 1: a block per quarter */          \
			v[p] = OP(SHUF(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),         \
				  SHUF(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));        \
		for (int p = 0; p < 2; p++) /* within quarters: pairs of lanes */                \
			v[p] = OP(UNCAST(LO(CAST(v[2 * p]), CAST(v[2 * p + 1]))),                 \
				  UNCAST(HI(CAST(v[2 * p]), CAST(v[2 * p + 1]))));                \
		T r = OP(UNCAST(LO(CAST(v[0]), CAST(v[1]))), UNCAST(HI(CAST(v[0]), CAST(v[1])))); \
		const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, \
							7, 11, 15);                              \
		return UNCAST(_mm512_permutexvar_ps(order, CAST(r)));                              \
	}
#define HR_ID(x) (x)
HREDUCE16(hmax16_ps, __m512, _mm512_max_ps, _mm512_shuffle_f32x4, _mm512_unpacklo_ps,
	  _mm512_unpackhi_ps, HR_ID, HR_ID)
HREDUCE16(hadd16_epi32, __m512i, _mm512_add_epi32, _mm512_shuffle_i32x4, _mm512_unpacklo_ps,
	  _mm512_unpackhi_ps, _mm512_castsi512_ps, _mm512_castps_si512)
#undef HR_ID
#undef HREDUCE16

/* One 32-element block of Q8_0 or Q8_1 activations, the reference's steps:
 * codes into qs, the scale as f16 into *dh and as f32 into *ret_d; returns
 * sum(q) (for Q8_0's aux, Q8_1's s). */
static inline __attribute__((always_inline)) int q8_block_512(const float *xb, int8_t *qs,
							      uint16_t *dh, float *ret_d)
{
	__m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
	float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
	float d = amax / 127.0f;
	float id = d != 0.0f ? 1.0f / d : 0.0f;
	*dh = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
	*ret_d = d;
	__m512 vid = _mm512_set1_ps(id);
	__m512i i0 = round_away_512(_mm512_mul_ps(v0, vid));
	__m512i i1 = round_away_512(_mm512_mul_ps(v1, vid));
	_mm_storeu_si128((__m128i *)qs, _mm512_cvtsepi32_epi8(i0));
	_mm_storeu_si128((__m128i *)(qs + 16), _mm512_cvtsepi32_epi8(i1));
	return _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
}

static inline __attribute__((always_inline)) void quant_q8_0_body(const float *x, void *vy,
								   int64_t n, float *aux)
{
	struct block_q8_0 *y = vy;
	int64_t i = 0;
	/* 16 blocks at a time: their maxima and sums reduced together, the
	 * scales in one division; the same values as the loop below */
	for (; i + 16 <= n / QK8_0; i += 16) {
		const float *xb = x + i * QK8_0;
		__m512 m[16];
		__m512i sum[16];
		for (int j = 0; j < 16; j++)
			m[j] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j)),
					     _mm512_abs_ps(_mm512_loadu_ps(xb + 32 * j + 16)));
		__m512 d = _mm512_div_ps(hmax16_ps(m), _mm512_set1_ps(127.0f));
		/* d != 0.0f ? 1.0f / d : 0.0f, a NaN d included */
		__mmask16 nz = _mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ);
		__m512 id = _mm512_maskz_div_ps(nz, _mm512_set1_ps(1.0f), d);
		__m256i dh = _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT);
		float ids[16];
		uint16_t dhs[16];
		_mm512_storeu_ps(ids, id);
		_mm256_storeu_si256((__m256i *)dhs, dh);
		for (int j = 0; j < 16; j++) {
			__m512 vid = _mm512_set1_ps(ids[j]);
			const float *xj = xb + 32 * j;
			__m512i i0 = round_away_512(_mm512_mul_ps(_mm512_loadu_ps(xj), vid));
			__m512i i1 = round_away_512(_mm512_mul_ps(_mm512_loadu_ps(xj + 16), vid));
			memcpy(&y[i + j].d, &dhs[j], 2);
			_mm_storeu_si128((__m128i *)y[i + j].qs, _mm512_cvtsepi32_epi8(i0));
			_mm_storeu_si128((__m128i *)(y[i + j].qs + 16), _mm512_cvtsepi32_epi8(i1));
			sum[j] = _mm512_add_epi32(i0, i1);
		}
		if (aux) { /* d (as f32) and sum(q), interleaved per block */
			__m512 dv = _mm512_cvtph_ps(dh), sv = _mm512_cvtepi32_ps(hadd16_epi32(sum));
			const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5,
							     21, 6, 22, 7, 23);
			const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
			_mm512_storeu_ps(aux + 2 * i, _mm512_permutex2var_ps(dv, lo, sv));
			_mm512_storeu_ps(aux + 2 * i + 16, _mm512_permutex2var_ps(dv, hi, sv));
		}
	}
	for (; i < n / QK8_0; i++) {
		uint16_t dh;
		float d;
		int sum = q8_block_512(x + i * QK8_0, y[i].qs, &dh, &d);
		memcpy(&y[i].d, &dh, 2);
		if (aux) {
			aux[2 * i] = _cvtsh_ss(dh);
			aux[2 * i + 1] = (float)sum;
		}
	}
}

KERN_QUANT_PAIR(quant_q8_0, quant_q8_0_body)

/* Q8_1 (Q4_1/Q5_1's activations): Q8_0's steps per block, plus s, the f16
 * of sum(q) d; aux (the x16 kernels') holds d and s as f32. Prefill runs
 * it on every token of every matmul those types have. */
static inline __attribute__((always_inline)) void quant_q8_1_body(const float *x, void *vy,
								   int64_t n, float *aux)
{
	struct block_q8_1 *y = vy;
	for (int64_t i = 0; i < n / QK8_1; i++) {
		uint16_t dh;
		float d;
		int sum = q8_block_512(x + i * QK8_1, y[i].qs, &dh, &d);
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

/* Q8_K, the generic bytes (kern.h's contract). */
static void quant_q8_K(const float *x, void *vy, int64_t n)
{
	struct block_q8_K *y = vy;
	for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
		__m512 am = _mm512_setzero_ps();
		for (int j = 0; j < QK_K; j += 16)
			am = _mm512_max_ps(am, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
		float amax = _mm512_reduce_max_ps(am), max = amax;
		if (amax == 0.0f) {
			memset(&y[i], 0, sizeof(y[i]));
			continue;
		}
		for (int j = 0; j < QK_K; j += 16) {
			__mmask16 k = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)),
							 _mm512_set1_ps(amax), _CMP_EQ_OQ);
			if (k) {
				max = x[j + __builtin_ctz(k)];
				break;
			}
		}
		float iscale = -127.0f / max;
		__m512 vs = _mm512_set1_ps(iscale);
		for (int g = 0; g < QK_K / 16; g++) {
			__m512i q = _mm512_cvt_roundps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g)),
							     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
			/* vpmovdb keeps the low byte, as the int8 cast does */
			__m128i b = _mm512_cvtepi32_epi8(_mm512_min_epi32(q, _mm512_set1_epi32(127)));
			_mm_storeu_si128((__m128i *)(y[i].qs + 16 * g), b);
			int16_t sum = (int16_t)_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(b));
			memcpy(&y[i].bsums[g], &sum, 2);
		}
		float d = 1.0f / iscale;
		memcpy(&y[i].d, &d, 4);
	}
}

static void quant_f16(const float *x, void *vy, int64_t n)
{
	uint16_t *y = vy;
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		_mm256_storeu_si256((__m256i *)(y + i),
				    _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
	if (i < n) {
		__mmask16 m = (__mmask16)((1u << (n - i)) - 1);
		_mm256_mask_storeu_epi16(y + i, m,
					 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
							 _MM_FROUND_TO_NEAREST_INT));
	}
}

/* ---- VNNI: one token ----------------------------------------------------- */

static inline __m256i q4_0_codes(const uint8_t *qs)
{
	__m128i x = _mm_loadu_si128((const __m128i *)qs);
	__m128i m = _mm_set1_epi8(0x0f);
	return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(x, m)),
				       _mm_and_si128(_mm_srli_epi16(x, 4), m), 1);
}

/* sum((u - 8) * a) for one Q4_0 block, as 8 int32 lanes */
static inline VNNI __m256i q4_0_block(const struct block_q4_0 *w, const struct block_q8_0 *a)
{
	__m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
	__m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4_0_codes(w->qs), av);
	__m256i c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), av);
	return _mm256_sub_epi32(p, c);
}

static VNNI void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q4_0 *w = vw;
	const struct block_q8_0 *a = va;
	int64_t nb = n / QK4_0, i = 0;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
	for (; i + 4 <= nb; i += 4) {
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_0_block(w + i, a + i)),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_0_block(w + i + 1, a + i + 1)),
				       _mm256_set1_ps(half(w[i + 1].d) * half(a[i + 1].d)), acc1);
		acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_0_block(w + i + 2, a + i + 2)),
				       _mm256_set1_ps(half(w[i + 2].d) * half(a[i + 2].d)), acc2);
		acc3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_0_block(w + i + 3, a + i + 3)),
				       _mm256_set1_ps(half(w[i + 3].d) * half(a[i + 3].d)), acc3);
	}
	for (; i < nb; i++)
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_0_block(w + i, a + i)),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
	__m256 acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
	x = _mm_add_ps(x, _mm_movehl_ps(x, x));
	x = _mm_add_ss(x, _mm_movehdup_ps(x));
	*s = _mm_cvtss_f32(x);
}

/* sum(w * a) for one Q8_0 block: |w| (unsigned, <= 128) against sign(w) * a */
static inline VNNI __m256i q8_0_block(const struct block_q8_0 *w, const struct block_q8_0 *a)
{
	__m256i wv = _mm256_loadu_si256((const __m256i *)w->qs);
	__m256i av = _mm256_loadu_si256((const __m256i *)a->qs);
	return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(wv),
				   _mm256_sign_epi8(av, wv));
}

static VNNI void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vw, const void *va)
{
	const struct block_q8_0 *w = vw, *a = va;
	int64_t nb = n / QK8_0, i = 0;
	__m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
	for (; i + 4 <= nb; i += 4) {
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_0_block(w + i, a + i)),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
		acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_0_block(w + i + 1, a + i + 1)),
				       _mm256_set1_ps(half(w[i + 1].d) * half(a[i + 1].d)), acc1);
		acc2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_0_block(w + i + 2, a + i + 2)),
				       _mm256_set1_ps(half(w[i + 2].d) * half(a[i + 2].d)), acc2);
		acc3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_0_block(w + i + 3, a + i + 3)),
				       _mm256_set1_ps(half(w[i + 3].d) * half(a[i + 3].d)), acc3);
	}
	for (; i < nb; i++)
		acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_0_block(w + i, a + i)),
				       _mm256_set1_ps(half(w[i].d) * half(a[i].d)), acc0);
	__m256 acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
	__m128 x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
	x = _mm_add_ps(x, _mm_movehl_ps(x, x));
	x = _mm_add_ss(x, _mm_movehdup_ps(x));
	*s = _mm_cvtss_f32(x);
}

/* ---- VNNI: one token, many rows (decode) ----------------------------------
 * Bit-identical to the tile kernel below for one token, so that a token's
 * logits never depend on how many others share its step (continuous
 * batching), yet without the tile kernel's panel transpose. The tile kernel
 * computes, per (row, token) and block b in order,
 *     acc = fma((float)isum_b, d_w * d_a, acc)
 * with isum_b the exact integer block dot. Here 16 rows are the 16 lanes of
 * one accumulator: per block, each row's codes go through one vpdpbusd (ymm,
 * unsigned codes against the activation), three hadds and a lane fold
 * collapse the 16 results into one vector of exact block sums, the offset
 * comes off exactly (off * sum(a), an integer), and the same mul and fma
 * follow. The 16 row scales of a block come from one gather. */

static inline __m128i fold4(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
	__m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
	return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

/* Q4_0 block as unsigned codes (0..15) in element order. */
static inline __m256i q4_0_u(const uint8_t *blk)
{
	const __m256i shift = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
	__m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 2)));
	return _mm256_and_si256(_mm256_srlv_epi16(x, shift), _mm256_set1_epi8(0x0f));
}

/* Q8_0 block as unsigned codes (q + 128). */
static inline __m256i q8_0_u(const uint8_t *blk)
{
	return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(blk + 2)),
				_mm256_set1_epi8((char)0x80));
}

#define GEMV_BODY(BSIZE, CODES, OFF)                                                       \
	const struct block_q8_0 *a = va;                                                   \
	int64_t nb = n / 32;                                                               \
	(void)nt;                                                                          \
	(void)a_stride;                                                                    \
	(void)aux_stride;                                                                  \
	(void)s_stride;                                                                    \
	for (int r0 = 0; r0 < nr; r0 += 16) {                                              \
		int rows = nr - r0 < 16 ? nr - r0 : 16;                                    \
		const uint8_t *rp[16];                                                     \
		int32_t off[16];                                                           \
		for (int r = 0; r < 16; r++) {                                             \
			int rr = r < rows ? r0 + r : r0; /* pad with a real row */         \
			rp[r] = (const uint8_t *)vw + (size_t)rr * w_stride;               \
			off[r] = (int32_t)((size_t)(rp[r] - rp[0]));                       \
		}                                                                          \
		const __m512i idx = _mm512_loadu_si512(off);                               \
		__m512 acc = _mm512_setzero_ps();                                          \
		for (int64_t b = 0; b < nb; b++) {                                         \
			size_t o = (size_t)b * (BSIZE);                                    \
			_mm_prefetch((const char *)rp[b & 15] + o + GEMV_PREFETCH, _MM_HINT_T0); \
			__m256i av = _mm256_loadu_si256((const __m256i *)a[b].qs);         \
			__m256i p[16];                                                     \
			_Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)              \
				p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(),         \
							   CODES(rp[r] + o), av);          \
			__m512i is = _mm512_inserti64x4(                                   \
				_mm512_castsi256_si512(_mm256_inserti128_si256(            \
					_mm256_castsi128_si256(fold4(p[0], p[1], p[2], p[3])), \
					fold4(p[4], p[5], p[6], p[7]), 1)),                \
				_mm256_inserti128_si256(                                   \
					_mm256_castsi128_si256(fold4(p[8], p[9], p[10], p[11])), \
					fold4(p[12], p[13], p[14], p[15]), 1),             \
				1);                                                        \
			is = _mm512_sub_epi32(is, _mm512_set1_epi32((OFF) * (int32_t)aux[2 * b + 1])); \
			__m512i d32 = _mm512_i32gather_epi32(idx, rp[0] + o, 1);           \
			__m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));           \
			acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is),                      \
					      _mm512_mul_ps(dw, _mm512_set1_ps(aux[2 * b])), acc); \
		}                                                                          \
		_mm512_mask_storeu_ps(s + r0, (__mmask16)((1u << rows) - 1), acc);         \
	}

/* Software prefetch distance in bytes along one of the 16 row streams. */
#ifndef GEMV_PREFETCH
#define GEMV_PREFETCH 512
#endif

static VNNI void gemv_q4_0(int64_t n, int nr, int nt, const void *vw, size_t w_stride,
			   const void *va, size_t a_stride, const float *aux, size_t aux_stride,
			   float *s, size_t s_stride)
{
	GEMV_BODY(sizeof(struct block_q4_0), q4_0_u, 8)
}

static VNNI void gemv_q8_0(int64_t n, int nr, int nt, const void *vw, size_t w_stride,
			   const void *va, size_t a_stride, const float *aux, size_t aux_stride,
			   float *s, size_t s_stride)
{
	GEMV_BODY(sizeof(struct block_q8_0), q8_0_u, 128)
}

/* ---- VNNI: many tokens --------------------------------------------------- */

#define PANEL_ROWS 16
#define PANEL_BLOCKS 128 /* K slice of 4096 elements: 64 KiB of codes */
#define TILE_TOKENS 8

struct panel {
	__m512i q[PANEL_BLOCKS][8]; /* [block][k group] = 4 k x 16 rows */
	__m512 dw[PANEL_BLOCKS];    /* row scales */
	float off;                  /* code offset: u = q + off */
};

/* Transpose 16 rows x 8 dwords (r[i] = row i | row i + 8) into 8 k groups x
 * 16 rows (out[g] = dword g of rows 0-7 | of rows 8-15). */
static inline void transpose_16x8(const __m512i r[8], __m512i out[8])
{
	__m512i t[8], u[8];
	for (int i = 0; i < 8; i += 2) {
		t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
		t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
	}
	for (int i = 0; i < 8; i += 4) {
		u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
		u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
		u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
		u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
	}
	const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
	const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
	for (int g = 0; g < 4; g++) {
		out[g] = _mm512_permutex2var_epi64(u[g], lo, u[g + 4]);
		out[g + 4] = _mm512_permutex2var_epi64(u[g], hi, u[g + 4]);
	}
}

static inline __m512i pair_rows(__m256i a, __m256i b)
{
	return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Unpack blocks [b0, b0 + nbs) of nr <= 16 rows; missing rows are zero. */
static void panel_q4_0(struct panel *P, const uint8_t *w, size_t w_stride, int nr, int64_t b0,
		       int nbs)
{
	const struct block_q4_0 *rows[PANEL_ROWS];
	for (int r = 0; r < PANEL_ROWS; r++)
		rows[r] = r < nr ? (const struct block_q4_0 *)(w + (size_t)r * w_stride) + b0 : NULL;
	for (int b = 0; b < nbs; b++) {
		__m256i c[PANEL_ROWS];
		uint16_t d[PANEL_ROWS];
		for (int r = 0; r < PANEL_ROWS; r++) {
			if (rows[r]) {
				c[r] = q4_0_codes(rows[r][b].qs);
				d[r] = rows[r][b].d;
			} else {
				c[r] = _mm256_setzero_si256();
				d[r] = 0;
			}
		}
		__m512i rr[8];
		for (int i = 0; i < 8; i++)
			rr[i] = pair_rows(c[i], c[i + 8]);
		transpose_16x8(rr, P->q[b]);
		P->dw[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
	}
	P->off = 8.0f;
}

static void panel_q8_0(struct panel *P, const uint8_t *w, size_t w_stride, int nr, int64_t b0,
		       int nbs)
{
	const struct block_q8_0 *rows[PANEL_ROWS];
	const __m256i flip = _mm256_set1_epi8((char)0x80);
	for (int r = 0; r < PANEL_ROWS; r++)
		rows[r] = r < nr ? (const struct block_q8_0 *)(w + (size_t)r * w_stride) + b0 : NULL;
	for (int b = 0; b < nbs; b++) {
		__m256i c[PANEL_ROWS];
		uint16_t d[PANEL_ROWS];
		for (int r = 0; r < PANEL_ROWS; r++) {
			if (rows[r]) {
				c[r] = _mm256_xor_si256(
					_mm256_loadu_si256((const __m256i *)rows[r][b].qs), flip);
				d[r] = rows[r][b].d;
			} else {
				c[r] = _mm256_setzero_si256();
				d[r] = 0;
			}
		}
		__m512i rr[8];
		for (int i = 0; i < 8; i++)
			rr[i] = pair_rows(c[i], c[i + 8]);
		transpose_16x8(rr, P->q[b]);
		P->dw[b] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
	}
	P->off = 128.0f;
}

/* NT tokens against the panel; acc starts from s unless `first`. */
static inline __attribute__((always_inline)) VNNI void
panel_tokens(const struct panel *P, int nbs, int NT, const uint8_t *a, size_t a_stride,
	     const float *aux, size_t aux_stride, float *s, size_t s_stride, __mmask16 m,
	     bool first)
{
	__m512 acc[TILE_TOKENS];
	const int32_t ioff = (int32_t)P->off;
	const __m512i zero = _mm512_setzero_si512();
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		acc[t] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m, s + t * s_stride);
	for (int b = 0; b < nbs; b++) {
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_0 *ab =
				(const struct block_q8_0 *)(a + (size_t)t * a_stride) + b;
			const float *x = aux + (size_t)t * aux_stride + 2 * b;
			/* start from -off * sum(a): the offset comes off in the
			 * integer domain, on the scalar ALUs, exactly */
			__m512i s0 = _mm512_set1_epi32(-ioff * (int32_t)x[1]), s1 = zero;
			_Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
				s0 = _mm512_dpbusd_epi32(s0, P->q[b][g],
							 _mm512_broadcastd_epi32(_mm_loadu_si32(ab->qs + 4 * g)));
				s1 = _mm512_dpbusd_epi32(s1, P->q[b][g + 1],
							 _mm512_broadcastd_epi32(_mm_loadu_si32(ab->qs + 4 * g + 4)));
			}
			__m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
			acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(P->dw[b], _mm512_set1_ps(x[0])),
						 acc[t]);
		}
	}
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		_mm512_mask_storeu_ps(s + t * s_stride, m, acc[t]);
}

typedef void (*panel_fn)(struct panel *P, const uint8_t *w, size_t w_stride, int nr, int64_t b0,
			 int nbs);

static inline __attribute__((always_inline)) VNNI void
gemm_panel(panel_fn unpack, int64_t n, int nr, int nt, const void *vw, size_t w_stride,
	   const void *va, size_t a_stride, const float *aux, size_t aux_stride, float *s,
	   size_t s_stride)
{
	struct panel P;
	const uint8_t *w = vw, *a = va;
	int64_t nb = n / 32;
	for (int r0 = 0; r0 < nr; r0 += PANEL_ROWS) {
		int rows = nr - r0 < PANEL_ROWS ? nr - r0 : PANEL_ROWS;
		__mmask16 m = (__mmask16)((1u << rows) - 1);
		for (int64_t b0 = 0; b0 < nb; b0 += PANEL_BLOCKS) {
			int nbs = nb - b0 < PANEL_BLOCKS ? (int)(nb - b0) : PANEL_BLOCKS;
			unpack(&P, w + (size_t)r0 * w_stride, w_stride, rows, b0, nbs);
			const uint8_t *ab = a + (size_t)b0 * sizeof(struct block_q8_0);
			const float *xb = aux + 2 * b0;
#define PANEL_TILE(P, t, NT)                                                               \
	panel_tokens(P, nbs, NT, ab + (size_t)(t) * a_stride, a_stride,                    \
		     xb + (size_t)(t) * aux_stride, aux_stride,                            \
		     s + (size_t)(t) * s_stride + r0, s_stride, m, b0 == 0)
			KERN_TILES(nt, TILE_TOKENS, PANEL_TILE, &P);
#undef PANEL_TILE
		}
	}
}

static VNNI void gemm_q4_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			   const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			   float *s, size_t s_stride)
{
	gemm_panel(panel_q4_0, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride);
}

static VNNI void gemm_q8_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			   const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			   float *s, size_t s_stride)
{
	gemm_panel(panel_q8_0, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride);
}

/* ---- VNNI: the x16 repacked layout (kern.h), any number of tokens -------
 * One panel = 16 rows; per block, 8 vectors of codes (4 elements x 16
 * rows each) are loaded (Q4_0: 4 loads, split into low and high nibbles)
 * once and serve up to X16_TOKENS tokens, each token's 16 outputs being
 * the 16 lanes of one accumulator. Per (row, token) and block, in order:
 *     isum = exact integer dot of the codes with the activation
 *     f    = isum - off * sum(a)          (exact: every term < 2^24)
 *     acc  = fma(f, d_w * d_a, acc)
 * which is kern_gemm_x16_ref()'s sequence: the results are bit-identical
 * to it, and so to themselves whatever nt (decode = prefill numerics). */

#define X16_TOKENS 8
#ifndef X16_HI_TOKENS
#define X16_HI_TOKENS 2 /* Q4_0: up to this many tokens, high nibbles unshifted */
#endif
/* Software prefetch of the panel stream: how far ahead each type reads,
 * chosen by paired runs (tools/dev/kernel-ab.sh); the distances follow the
 * box's memory latency, so re-measure on another (docs/performance.md §4
 * has the settings tried and what each gave). */
#ifndef X16_PREFETCH
#define X16_PREFETCH 4096 /* bytes ahead; 0: none */
#endif
#ifndef X16_Q8_1T_PREFETCH
#define X16_Q8_1T_PREFETCH 6144 /* Q8_0, fewer than X16_Q8_PF_NT tokens */
#endif
#ifndef X16K_PREFETCH
#define X16K_PREFETCH 8192
#endif
/* A K-quant super-block starts with its scales, which sit after the pair's
 * codes: the stream prefetch reached them only ~2 KiB of codes before use,
 * so each block also asks for the scales of the block this many ahead
 * (docs/performance.md §4). */
#ifndef X16K_META_AHEAD
#define X16K_META_AHEAD 4
#endif
/* A K-quant block's scale prefetches: the pair's, with the stream, and the
 * ones X16K_META_AHEAD blocks on. */
#define X16K_PF_SCALES(panel, nb, pc, cb, mb, b)                                        \
	do {                                                                            \
		KERN_X16_PREFETCH_META(X16_PF, pc, cb, mb, b, X16K_PREFETCH);            \
		if ((b) + X16K_META_AHEAD < (nb))                                       \
			KERN_PF_LINES(X16_PF,                                           \
				      KERN_X16_META(panel, nb, cb, mb, (b) + X16K_META_AHEAD), \
				      mb);                                              \
	} while (0)
/* The K-quant kernels ask for a super-block's code lines a few at a time
 * as they consume it (Q4_K 8 per 512 bytes, Q6_K 3 per 192), not 32 or 48
 * in a burst at its start: a burst outran the core's miss buffers and
 * lines came late (docs/performance.md §4). KERN_PF_LINES is kern.h's. */
#ifndef X16_Q8_PF_NT
#define X16_Q8_PF_NT 2 /* Q8_0: tokens per panel pass from which to prefetch */
#endif
#ifndef X16_HINT
#define X16_HINT _MM_HINT_T0
#endif
#define X16_PF(p) _mm_prefetch((p), X16_HINT)

/* acc += dpbusd(c, broadcast of the 4 bytes at p), with the broadcast
 * folded into the instruction ({1to16}): GCC does not fold
 * _mm512_set1_epi32(load) into vpdpbusd, and the separate vpbroadcastd is
 * one more uop per 64 multiply-adds. */
static inline __attribute__((always_inline)) VNNI __m512i dpbusd_bcst(__m512i acc, __m512i c,
								     const int8_t *p)
{
	__asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(c), "m"(*(const int32_t *)p));
	return acc;
}

/* The 32-element types of the x16 layout; codes are unsigned (Q8_0 as
 * q + 128, IQ4_NL through its codebook shifted by 128, Q5 with the 5th bit
 * ORed in under a mask), the offset comes off per block from the
 * activation's sum, and Q4_1/Q5_1 add min x s from their Q8_1 activations
 * to the block's term before it is summed (kern_gemm_x16_ref's steps). */
enum x16_kind { X16_Q8_0, X16_Q4_0, X16_Q4_1, X16_Q5_0, X16_Q5_1, X16_IQ4_NL };
#define X16_CB(k) ((k) == X16_Q8_0 ? 512 : (k) == X16_Q5_0 || (k) == X16_Q5_1 ? 320 : 256)
#define X16_WITH_MIN(k) ((k) == X16_Q4_1 || (k) == X16_Q5_1)
#define X16_MB(k) (X16_WITH_MIN(k) ? 64 : 32)
#define X16_OFF(k) \
	((k) == X16_Q4_0 ? 8.0f : (k) == X16_Q5_0 ? 16.0f : X16_WITH_MIN(k) ? 0.0f : 128.0f)

static inline __attribute__((always_inline)) VNNI void
x16_panel(enum x16_kind kind, int64_t nb, int NT, const uint8_t *panel, const uint8_t *a,
	  size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	  bool from_s)
{
	const size_t cb = X16_CB(kind), mb = X16_MB(kind);
	const bool q4 = kind != X16_Q8_0, hi = kind == X16_Q4_0 && NT <= X16_HI_TOKENS;
	const bool min = X16_WITH_MIN(kind), q5 = kind == X16_Q5_0 || kind == X16_Q5_1;
	const size_t asz = min ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);
	const __m512i low = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
	const __m512i book = _mm512_broadcast_i32x4(_mm_add_epi8(
		_mm_loadu_si128((const __m128i *)quant_iq4nl_values), _mm_set1_epi8((char)0x80)));
	const __m512 offv = _mm512_set1_ps(X16_OFF(kind));
	__m512 acc[X16_TOKENS];
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		acc[t] = from_s ? _mm512_loadu_ps(s + (size_t)t * s_stride) : _mm512_setzero_ps();
	/* two blocks (a pair: codes, codes, metadata) per iteration: it
	 * paid for Q4_0/Q8_0 decode, not for the K-quant loops (§4) */
	_Pragma("GCC unroll 2") for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, mb, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, cb, mb, b);
		__m512i c[8];
		/* constant per inlined (kind, NT): 0 asks for nothing */
		const size_t pf = q4 || NT >= X16_Q8_PF_NT ? X16_PREFETCH : X16_Q8_1T_PREFETCH;
		if (pf)
			KERN_X16_PREFETCH(X16_PF, pb, cb, mb, b, pf);
		if (hi) {
			/* few tokens: keep the high nibbles in place (16 x code),
			 * one and instead of a shift and an and per vector; the
			 * token's high sum is taken down by 16 once (exact) */
			_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
				__m512i v = _mm512_loadu_si512(pb + 64 * j);
				c[j] = _mm512_and_si512(v, low);
				c[j + 4] = _mm512_andnot_si512(low, v);
			}
		} else if (q4) {
			_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
				__m512i v = _mm512_loadu_si512(pb + 64 * j);
				c[j] = _mm512_and_si512(v, low);
				c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
			}
			if (kind == X16_IQ4_NL)
				_Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
					c[g] = _mm512_shuffle_epi8(book, c[g]);
			if (q5)
				_Pragma("GCC unroll 8") for (int g = 0; g < 8; g++) {
					__mmask64 k;
					memcpy(&k, pb + 256 + 8 * g, 8);
					c[g] = _mm512_mask_add_epi8(c[g], k, c[g], bit4);
				}
		} else {
			_Pragma("GCC unroll 8") for (int g = 0; g < 8; g++)
				c[g] = _mm512_loadu_si512(pb + 64 * g);
		}
		__m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
		__m512 mw = min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pm + 32)))
				: dw;
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const uint8_t *ab = a + (size_t)t * a_stride + (size_t)b * asz;
			const int8_t *q = (const int8_t *)ab + (min ? 4 : 2);
			__m512i s0 = _mm512_setzero_si512(), s1 = s0;
			if (hi) {
				/* s0: low nibbles (elements 0..15), s1: 16 x high */
				_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
					s0 = dpbusd_bcst(s0, c[g], q + 4 * g);
					s1 = dpbusd_bcst(s1, c[g + 4], q + 16 + 4 * g);
				}
				s1 = _mm512_srai_epi32(s1, 4);
			} else {
				_Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
					s0 = dpbusd_bcst(s0, c[g], q + 4 * g);
					s1 = dpbusd_bcst(s1, c[g + 1], q + 4 * g + 4);
				}
			}
			__m512 isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
			const float *x = aux + (size_t)t * aux_stride + 2 * b;
			if (min) {
				/* x: the Q8_1 block's d and s */
				__m512 ms = _mm512_mul_ps(mw, _mm512_set1_ps(x[1]));
				acc[t] = _mm512_add_ps(
					acc[t],
					_mm512_fmadd_ps(isum, _mm512_mul_ps(dw, _mm512_set1_ps(x[0])), ms));
			} else {
				__m512 f = _mm512_fnmadd_ps(offv, _mm512_set1_ps(x[1]), isum);
				acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(x[0])),
							 acc[t]);
			}
		}
	}
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, acc[t]);
}

/* Q8_0, large batches: two panels (32 rows) at a time for tiles of
 * X16_PAIR_TOKENS tokens, each activation broadcast once into a register
 * for both panels (8 broadcasts serve 16 dot products instead of 8), the
 * block's codes in two halves of four vectors per panel so that the two
 * panels' codes, the tile's integer and float accumulators and the
 * broadcast fit the 32 registers. Per (row, token, block) the steps of
 * x16_panel, so the results are its bits (kern_gemm_x16_ref's). It pays
 * only for large calls (fewer tokens per call still read weights from
 * memory) and not for Q4_0, whose nibbles would be unpacked for every 4
 * tokens instead of 8: Q8_0 only, from X16_PAIR_MIN_NT tokens per call
 * (docs/performance.md §4). */
#define X16_PAIR_TOKENS 4
#ifndef X16_PAIR_MIN_NT
#define X16_PAIR_MIN_NT 64
#endif

static inline __attribute__((always_inline)) VNNI void
x16_q8_pair(int64_t nb, int NT, const uint8_t *p0, const uint8_t *p1, const uint8_t *a,
	    size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	    bool from_s)
{
	const size_t cb = 512;
	const __m512 offv = _mm512_set1_ps(128.0f);
	__m512 acc0[X16_PAIR_TOKENS], acc1[X16_PAIR_TOKENS];
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
		const float *st = s + (size_t)t * s_stride;
		acc0[t] = from_s ? _mm512_loadu_ps(st) : _mm512_setzero_ps();
		acc1[t] = from_s ? _mm512_loadu_ps(st + KERN_X16_ROWS) : _mm512_setzero_ps();
	}
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pb0 = KERN_X16_CODES(p0, nb, cb, 32, b);
		const uint8_t *pb1 = KERN_X16_CODES(p1, nb, cb, 32, b);
		KERN_X16_PREFETCH(X16_PF, pb0, cb, 32, b, X16_PREFETCH);
		KERN_X16_PREFETCH(X16_PF, pb1, cb, 32, b, X16_PREFETCH);
		__m512i i0[X16_PAIR_TOKENS], i1[X16_PAIR_TOKENS];
		_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++)
			i0[t] = i1[t] = _mm512_setzero_si512();
		_Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
			__m512i c0[4], c1[4];
			_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
				c0[g] = _mm512_loadu_si512(pb0 + 64 * (4 * h + g));
				c1[g] = _mm512_loadu_si512(pb1 + 64 * (4 * h + g));
			}
			_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
				const int8_t *q =
					((const struct block_q8_0 *)(a + (size_t)t * a_stride))[b].qs +
					16 * h;
				_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
					__m512i bc = _mm512_set1_epi32(ld32(q + 4 * g));
					i0[t] = _mm512_dpbusd_epi32(i0[t], c0[g], bc);
					i1[t] = _mm512_dpbusd_epi32(i1[t], c1[g], bc);
				}
			}
		}
		__m512 dw0 = _mm512_cvtph_ps(
			_mm256_loadu_si256((const __m256i *)KERN_X16_META(p0, nb, cb, 32, b)));
		__m512 dw1 = _mm512_cvtph_ps(
			_mm256_loadu_si256((const __m256i *)KERN_X16_META(p1, nb, cb, 32, b)));
		_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
			const float *x = aux + (size_t)t * aux_stride + 2 * b;
			__m512 d = _mm512_set1_ps(x[0]), sm = _mm512_set1_ps(x[1]);
			__m512 f0 = _mm512_fnmadd_ps(offv, sm, _mm512_cvtepi32_ps(i0[t]));
			__m512 f1 = _mm512_fnmadd_ps(offv, sm, _mm512_cvtepi32_ps(i1[t]));
			acc0[t] = _mm512_fmadd_ps(f0, _mm512_mul_ps(dw0, d), acc0[t]);
			acc1[t] = _mm512_fmadd_ps(f1, _mm512_mul_ps(dw1, d), acc1[t]);
		}
	}
	_Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
		_mm512_storeu_ps(s + (size_t)t * s_stride, acc0[t]);
		_mm512_storeu_ps(s + (size_t)t * s_stride + KERN_X16_ROWS, acc1[t]);
	}
}

static inline __attribute__((always_inline)) VNNI void
x16_gemm(enum x16_kind kind, int64_t n, int nr, int nt, const void *vw, size_t w_stride, const void *va,
	 size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	 bool from_s)
{
	const uint8_t *w = vw, *a = va;
	int64_t nb = n / 32;
	int r0 = 0;
	if (kind == X16_Q8_0 && nt >= X16_PAIR_MIN_NT)
		for (; r0 + 2 * KERN_X16_ROWS <= nr; r0 += 2 * KERN_X16_ROWS) {
			const uint8_t *p0 = w + (size_t)r0 * w_stride;
			const uint8_t *p1 = p0 + KERN_X16_ROWS * w_stride;
#define X16_PAIR_TILE(unused, t, NT)                                                       \
	x16_q8_pair(nb, NT, p0, p1, a + (size_t)(t) * a_stride, a_stride,                  \
		    aux + (size_t)(t) * aux_stride, aux_stride, s + (size_t)(t) * s_stride + r0, \
		    s_stride, from_s)
			KERN_TILES(nt, X16_PAIR_TOKENS, X16_PAIR_TILE, 0);
#undef X16_PAIR_TILE
		}
	for (; r0 + KERN_X16_ROWS <= nr; r0 += KERN_X16_ROWS) {
		const uint8_t *panel = w + (size_t)r0 * w_stride;
#define X16_TILE(kind, t, NT)                                                                \
	x16_panel(kind, nb, NT, panel, a + (size_t)(t) * a_stride, a_stride,                 \
		  aux + (size_t)(t) * aux_stride, aux_stride,                              \
		  s + (size_t)(t) * s_stride + r0, s_stride, from_s)
		KERN_TILES(nt, X16_TOKENS, X16_TILE, kind);
#undef X16_TILE
	}
}

#define X16_GEMM_FN(NAME, KIND)                                                            \
	static VNNI void NAME(int64_t n, int nr, int nt, const void *w, size_t w_stride,     \
			      const void *a, size_t a_stride, const float *aux,               \
			      size_t aux_stride, float *s, size_t s_stride, bool from_s)      \
	{                                                                                  \
		x16_gemm(KIND, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s,     \
			 s_stride, from_s);                                                 \
	}
X16_GEMM_FN(gemm_x16_q4_0, X16_Q4_0)
X16_GEMM_FN(gemm_x16_q8_0, X16_Q8_0)
X16_GEMM_FN(gemm_x16_q4_1, X16_Q4_1)
X16_GEMM_FN(gemm_x16_q5_0, X16_Q5_0)
X16_GEMM_FN(gemm_x16_q5_1, X16_Q5_1)
X16_GEMM_FN(gemm_x16_iq4_nl, X16_IQ4_NL)

/* ---- VNNI: x16 K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) -----------
 * The same panel walk as above over 256-element super-blocks. Per super-
 * block and token the integer parts are exact (kern_generic.c's dot_k4 and
 * Q6_K dot: sub-block dots times their 6- or 8-bit scales, the Q4_K mins
 * against the activation's 16-element sums, the Q6_K code offset 32 taken
 * off the same way; Q2_K, Q3_K, Q5_K and IQ4_XS likewise, below) and the
 * float finish is the scalar reference's own expression, so the results
 * equal kern_generic's vec_dot bit for bit. A super-block's codes are
 * unpacked once per chunk of 64 (Q4_K, Q5_K, IQ4_XS), 32 (Q2_K, Q3_K) or
 * 128 elements (Q6_K) for up to X16K_TOKENS tokens; the accumulators live
 * in the output (one add per token and super-block). */

#define X16K_TOKENS 8

/* The 16-element sums of a Q8_K block (a packed struct: no member address) */
static inline const int16_t *q8k_bsums(const struct block_q8_K *ab)
{
	return (const int16_t *)(const void *)((const uint8_t *)ab +
					       offsetof(struct block_q8_K, bsums));
}

/* acc += dpwssd(c, broadcast of the int16 pair at p) */
static inline __attribute__((always_inline)) VNNI __m512i dpwssd_bcst(__m512i acc, __m512i c,
								     const int16_t *p)
{
	__asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(c), "m"(*(const int32_t *)p));
	return acc;
}

/* Q5_K's fifth bits: the 64-bit mask of code vector (chunk jj, vector i,
 * half h: low or high nibbles) in the x16 layout (kern_x16.c) */
static inline __attribute__((always_inline)) __mmask64 x16_q5_K_mask(const uint8_t *pc, int jj,
								      int i, int h)
{
	__mmask64 k;
	memcpy(&k, pc + jj * 640 + 512 + 16 * i + 8 * h, 8);
	return k;
}

/* Q4_K, and Q5_K (q5): the same walk, Q5_K's chunks of codes 640 bytes
 * apart instead of 512, each code vector's fifth bit added under its
 * mask (the code's bit 4 is clear: the add is an or) */
static inline __attribute__((always_inline)) VNNI void
x16_k4_panel(bool q5, int64_t nb, int NT, const uint8_t *panel, const uint8_t *a,
	     size_t a_stride, float *s, size_t s_stride, bool from_s)
{
	const __m512i low = _mm512_set1_epi8(0x0f), bit4 = _mm512_set1_epi8(0x10);
	const __m128i m63 = _mm_set1_epi8(63), m15 = _mm_set1_epi8(15), m48 = _mm_set1_epi8(0x30);
	const size_t cb = q5 ? 2560 : 2048, cs = q5 ? 640 : 512;
	_Pragma("GCC unroll 8") for (int t = 0; t < NT && !from_s; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, _mm512_setzero_ps());
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, cb, 256, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, cb, 256, b);
#if X16_PREFETCH
		/* the codes' lines are asked for inside the jj loops below */
		X16K_PF_SCALES(panel, nb, pc, cb, 256, b);
#endif
		/* 6-bit scales and mins of the 8 sub-blocks, 16 rows each
		 * (quant_scale_min_k4 on 16 lanes); mins as (m, m) int16 pairs */
		__m128i q[12];
		for (int k = 0; k < 12; k++)
			q[k] = _mm_loadu_si128((const __m128i *)(pm + 64 + 16 * k));
		__m512i sc[8], mp[8];
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
			sc[j] = _mm512_cvtepu8_epi32(sj);
			__m512i m32 = _mm512_cvtepu8_epi32(mj);
			mp[j] = _mm512_or_si512(m32, _mm512_slli_epi32(m32, 16));
		}
		__m512i sumi[X16K_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
		for (int jj = 0; jj < 4 && NT == 1; jj++) {
			/* one token: each code vector goes straight into its
			 * dot (holding all 16 across tokens spilled them) */
			const int8_t *aq = ((const struct block_q8_K *)a)[b].qs + 64 * jj;
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)pc + X16K_PREFETCH + cs * jj, cs);
#endif
			__m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
			_Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 2) {
				__m512i v0 = _mm512_loadu_si512(pc + jj * cs + i * 64);
				__m512i v1 = _mm512_loadu_si512(pc + jj * cs + i * 64 + 64);
				__m512i l0 = _mm512_and_si512(v0, low);
				__m512i h0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low);
				__m512i l1 = _mm512_and_si512(v1, low);
				__m512i h1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low);
				if (q5) {
					l0 = _mm512_mask_add_epi8(l0, x16_q5_K_mask(pc, jj, i, 0), l0, bit4);
					h0 = _mm512_mask_add_epi8(h0, x16_q5_K_mask(pc, jj, i, 1), h0, bit4);
					l1 = _mm512_mask_add_epi8(l1, x16_q5_K_mask(pc, jj, i + 1, 0), l1,
								  bit4);
					h1 = _mm512_mask_add_epi8(h1, x16_q5_K_mask(pc, jj, i + 1, 1), h1,
								  bit4);
				}
				i0 = dpbusd_bcst(i0, l0, aq + 4 * i);
				i1 = dpbusd_bcst(i1, h0, aq + 32 + 4 * i);
				i2 = dpbusd_bcst(i2, l1, aq + 4 * i + 4);
				i3 = dpbusd_bcst(i3, h1, aq + 36 + 4 * i);
			}
			i0 = _mm512_add_epi32(i0, i2);
			i1 = _mm512_add_epi32(i1, i3);
			sumi[0] = _mm512_add_epi32(
				sumi[0], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[2 * jj]),
							  _mm512_mullo_epi32(i1, sc[2 * jj + 1])));
		}
		for (int jj = 0; jj < 4 && NT > 1; jj++) {
			__m512i lo[8], hi[8];
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)pc + X16K_PREFETCH + cs * jj, cs);
#endif
			_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
				__m512i v = _mm512_loadu_si512(pc + jj * cs + i * 64);
				lo[i] = _mm512_and_si512(v, low);
				hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
				if (q5) {
					lo[i] = _mm512_mask_add_epi8(lo[i], x16_q5_K_mask(pc, jj, i, 0),
								     lo[i], bit4);
					hi[i] = _mm512_mask_add_epi8(hi[i], x16_q5_K_mask(pc, jj, i, 1),
								     hi[i], bit4);
				}
			}
			_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
				const int8_t *aq =
					((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
					64 * jj;
				/* four chains of four, not two of eight: the sums
				 * are exact integers, so the split changes nothing
				 * but the latency a one-token step waits on */
				__m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
				_Pragma("GCC unroll 8") for (int i = 0; i < 8; i += 2) {
					i0 = dpbusd_bcst(i0, lo[i], aq + 4 * i);
					i1 = dpbusd_bcst(i1, hi[i], aq + 32 + 4 * i);
					i2 = dpbusd_bcst(i2, lo[i + 1], aq + 4 * i + 4);
					i3 = dpbusd_bcst(i3, hi[i + 1], aq + 36 + 4 * i);
				}
				i0 = _mm512_add_epi32(i0, i2);
				i1 = _mm512_add_epi32(i1, i3);
				sumi[t] = _mm512_add_epi32(
					sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[2 * jj]),
								  _mm512_mullo_epi32(i1, sc[2 * jj + 1])));
			}
		}
		__m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
		__m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pm + 32)));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_K *ab = (const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
			__m512i msum = _mm512_setzero_si512();
			_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
				msum = dpwssd_bcst(msum, mp[j], q8k_bsums(ab) + 2 * j);
			float daf;
			memcpy(&daf, &ab->d, sizeof(daf));
			__m512 da = _mm512_set1_ps(daf);
			/* da * d * isum - da * dmin * msum, the reference's order */
			__m512 t1 = _mm512_mul_ps(_mm512_mul_ps(da, dv), _mm512_cvtepi32_ps(sumi[t]));
			__m512 t2 = _mm512_mul_ps(_mm512_mul_ps(da, dmv), _mm512_cvtepi32_ps(msum));
			float *o = s + (size_t)t * s_stride;
			_mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_sub_ps(t1, t2)));
		}
	}
}

static inline __attribute__((always_inline)) VNNI void
x16_q6_K_panel(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride,
	       float *s, size_t s_stride, bool from_s)
{
	const __m512i low = _mm512_set1_epi8(0x0f), two = _mm512_set1_epi8(0x30);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT && !from_s; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, _mm512_setzero_ps());
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 3072, 288, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 3072, 288, b);
#if X16_PREFETCH
		/* the codes' lines are asked for inside the i loop below */
		X16K_PF_SCALES(panel, nb, pc, 3072, 288, b);
#endif
		/* int8 scales of the 16 sub-blocks; as (sc 2p, sc 2p+1) int16
		 * pairs for the offset term */
		__m512i sp[8];
		for (int p = 0; p < 8; p++) {
			__m512i s0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(pm + 32 * p)));
			__m512i s1 = _mm512_cvtepi8_epi32(
				_mm_loadu_si128((const __m128i *)(pm + 32 * p + 16)));
			sp[p] = _mm512_or_si512(_mm512_and_si512(s0, _mm512_set1_epi32(0xffff)),
						_mm512_slli_epi32(s1, 16));
		}
		__m512i sumi[X16K_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
		for (int h = 0; h < 2; h++)
			for (int i0 = 0; i0 < 8; i0 += 4) {
				/* codes of elements 128h + 32 tt + 4i (tt = 0..3, i = i0..i0+3):
				 * sub-block 8h + i0/4 + 2tt */
				__m512i c[4][4];
				_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
					const uint8_t *ph = pc + h * 1536 + (i0 + i) * 64;
#if X16_PREFETCH
					KERN_PF_LINES(X16_PF,
						      (const char *)pc + X16K_PREFETCH +
							      192 * (8 * h + i0 + i),
						      192);
#endif
					__m512i A = _mm512_loadu_si512(ph), B = _mm512_loadu_si512(ph + 512);
					__m512i H = _mm512_loadu_si512(ph + 1024);
					c[0][i] = _mm512_or_si512(_mm512_and_si512(A, low),
								  _mm512_and_si512(_mm512_slli_epi16(H, 4), two));
					c[1][i] = _mm512_or_si512(_mm512_and_si512(B, low),
								  _mm512_and_si512(_mm512_slli_epi16(H, 2), two));
					c[2][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(A, 4), low),
								  _mm512_and_si512(H, two));
					c[3][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(B, 4), low),
								  _mm512_and_si512(_mm512_srli_epi16(H, 2), two));
				}
				_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
					const int8_t *aq =
						((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
						128 * h;
					_Pragma("GCC unroll 4") for (int tt = 0; tt < 4; tt++) {
						__m512i is = _mm512_setzero_si512();
						_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
							is = dpbusd_bcst(is, c[tt][i], aq + 32 * tt + 4 * (i0 + i));
						int j = 8 * h + i0 / 4 + 2 * tt;
						__m512i scj = _mm512_cvtepi8_epi32(
							_mm_loadu_si128((const __m128i *)(pm + 16 * j)));
						sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(is, scj));
					}
				}
			}
		__m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pm + 256)));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_K *ab = (const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
			__m512i off = _mm512_setzero_si512();
			_Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
				off = dpwssd_bcst(off, sp[p], q8k_bsums(ab) + 2 * p);
			__m512i isum = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(off, 5));
			float daf;
			memcpy(&daf, &ab->d, sizeof(daf));
			/* (da * d) * isum, the reference's order */
			__m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(daf), dv),
						 _mm512_cvtepi32_ps(isum));
			float *o = s + (size_t)t * s_stride;
			_mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), f));
		}
	}
}

/* IQ4_XS: per sub-block of 32, Q4_0's code vectors in the x16 layout
 * through IQ4_NL's codebook shifted to unsigned (+128), the 6-bit scale
 * ls - 32 per sub-block; isum = sum_ib sc_ib * (U_ib - 128 B_ib), B_ib the
 * sub-block's activation sum (two Q8_K bsums), all exact; then the
 * reference's (da * d) * isum. A super-block's codes are unpacked per pair
 * of sub-blocks (512 bytes) for up to X16K_TOKENS tokens. */
static inline __attribute__((always_inline)) VNNI void
x16_iq4_xs_panel(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride,
		 float *s, size_t s_stride, bool from_s)
{
	const __m512i low = _mm512_set1_epi8(0x0f);
	const __m512i book = _mm512_broadcast_i32x4(_mm_add_epi8(
		_mm_loadu_si128((const __m128i *)quant_iq4nl_values), _mm_set1_epi8((char)0x80)));
	const __m128i m15 = _mm_set1_epi8(15), m48 = _mm_set1_epi8(0x30), m32 = _mm_set1_epi8(32);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT && !from_s; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, _mm512_setzero_ps());
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 2048, 128, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 2048, 128, b);
#if X16_PREFETCH
		X16K_PF_SCALES(panel, nb, pc, 2048, 128, b);
#endif
		/* the 8 sub-blocks' scales ls - 32 on 16 lanes; as (sc, sc) int16
		 * pairs against the bsums pair of the sub-block */
		__m512i sc[8], mp[8];
		_Pragma("GCC unroll 8") for (int ib = 0; ib < 8; ib++) {
			__m128i l = _mm_loadu_si128((const __m128i *)(pm + 32 + 16 * (ib / 2)));
			__m128i h = _mm_loadu_si128((const __m128i *)(pm + 96 + 16 * (ib / 4)));
			l = ib & 1 ? _mm_and_si128(_mm_srli_epi16(l, 4), m15) : _mm_and_si128(l, m15);
			/* bits 2(ib % 4), +1 of h to bits 4, 5 (the mask drops what
			 * the 16-bit shift brings from the next byte) */
			switch (ib & 3) {
			case 0: h = _mm_slli_epi16(h, 4); break;
			case 1: h = _mm_slli_epi16(h, 2); break;
			case 2: break;
			default: h = _mm_srli_epi16(h, 2); break;
			}
			__m128i ls = _mm_ternarylogic_epi32(l, h, m48, 0xf8); /* l | (h & m48) */
			sc[ib] = _mm512_cvtepi8_epi32(_mm_sub_epi8(ls, m32));
			mp[ib] = _mm512_or_si512(_mm512_and_si512(sc[ib], _mm512_set1_epi32(0xffff)),
						 _mm512_slli_epi32(sc[ib], 16));
		}
		__m512i sumi[X16K_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
		for (int jj = 0; jj < 4 && NT == 1; jj++) {
			const int8_t *aq = ((const struct block_q8_K *)a)[b].qs + 64 * jj;
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)pc + X16K_PREFETCH + 512 * jj, 512);
#endif
			__m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
			_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
				__m512i v0 = _mm512_loadu_si512(pc + jj * 512 + g * 64);
				__m512i v1 = _mm512_loadu_si512(pc + jj * 512 + 256 + g * 64);
				i0 = dpbusd_bcst(i0, _mm512_shuffle_epi8(book, _mm512_and_si512(v0, low)),
						 aq + 4 * g);
				i1 = dpbusd_bcst(i1,
						 _mm512_shuffle_epi8(book, _mm512_and_si512(
										   _mm512_srli_epi16(v0, 4), low)),
						 aq + 16 + 4 * g);
				i2 = dpbusd_bcst(i2, _mm512_shuffle_epi8(book, _mm512_and_si512(v1, low)),
						 aq + 32 + 4 * g);
				i3 = dpbusd_bcst(i3,
						 _mm512_shuffle_epi8(book, _mm512_and_si512(
										   _mm512_srli_epi16(v1, 4), low)),
						 aq + 48 + 4 * g);
			}
			i0 = _mm512_add_epi32(i0, i1);
			i2 = _mm512_add_epi32(i2, i3);
			sumi[0] = _mm512_add_epi32(
				sumi[0], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[2 * jj]),
							  _mm512_mullo_epi32(i2, sc[2 * jj + 1])));
		}
		for (int jj = 0; jj < 4 && NT > 1; jj++) {
			__m512i c[16];
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)pc + X16K_PREFETCH + 512 * jj, 512);
#endif
			/* c[8h + 4lo/hi + g]: sub-block 2jj + h, g's low or high nibbles */
			_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
				__m512i v = _mm512_loadu_si512(pc + jj * 512 + i * 64);
				int h = i / 4, g = i % 4;
				c[8 * h + g] = _mm512_shuffle_epi8(book, _mm512_and_si512(v, low));
				c[8 * h + 4 + g] = _mm512_shuffle_epi8(
					book, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
			}
			_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
				const int8_t *aq =
					((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
					64 * jj;
				__m512i i0 = _mm512_setzero_si512(), i1 = i0, i2 = i0, i3 = i0;
				_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
					i0 = dpbusd_bcst(i0, c[g], aq + 4 * g);
					i1 = dpbusd_bcst(i1, c[4 + g], aq + 16 + 4 * g);
					i2 = dpbusd_bcst(i2, c[8 + g], aq + 32 + 4 * g);
					i3 = dpbusd_bcst(i3, c[12 + g], aq + 48 + 4 * g);
				}
				i0 = _mm512_add_epi32(i0, i1);
				i2 = _mm512_add_epi32(i2, i3);
				sumi[t] = _mm512_add_epi32(
					sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[2 * jj]),
								  _mm512_mullo_epi32(i2, sc[2 * jj + 1])));
			}
		}
		__m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_K *ab = (const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
			__m512i off = _mm512_setzero_si512();
			_Pragma("GCC unroll 8") for (int ib = 0; ib < 8; ib++)
				off = dpwssd_bcst(off, mp[ib], q8k_bsums(ab) + 2 * ib);
			__m512i isum = _mm512_sub_epi32(sumi[t], _mm512_slli_epi32(off, 7));
			float daf;
			memcpy(&daf, &ab->d, sizeof(daf));
			/* (da * d) * isum, the reference's order */
			__m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(daf), dv),
						 _mm512_cvtepi32_ps(isum));
			float *o = s + (size_t)t * s_stride;
			_mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), f));
		}
	}
}

/* Q3_K: per half of a super-block, 8 vectors of 2-bit codes (4 code
 * vectors each, g = 0..3: elements 32g + 4i + k of the half) and the high
 * bits as masks (kern_x16.c). Code vector g < 3 stays in place, v & (3 <<
 * 2g) with 4 << 2g added under its mask: 4^g x the 3-bit code, which the
 * sub-block's scale makes up for (sc << (6 - 2g), the sums come out 64
 * times the reference's and are shifted back exactly); g = 3 is shifted
 * down (sc << 6). A sub-block (16 elements) has one g. The offset 4 comes
 * off through the Q8_K bsums as Q6_K's 32 does; then the reference's
 * (da * d) * isum. */
static inline __attribute__((always_inline)) VNNI __m512i x16_q3_K_code(__m512i v, int g,
									 const uint8_t *mk)
{
	__mmask64 k;
	memcpy(&k, mk, 8);
	__m512i c = g < 3 ? _mm512_and_si512(v, _mm512_set1_epi8((char)(3 << (2 * g))))
			  : _mm512_and_si512(_mm512_srli_epi16(v, 6), _mm512_set1_epi8(3));
	return _mm512_mask_add_epi8(c, k, c, _mm512_set1_epi8((char)(g < 3 ? 4 << (2 * g) : 4)));
}

static inline __attribute__((always_inline)) VNNI void
x16_q3_K_panel(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride,
	       float *s, size_t s_stride, bool from_s)
{
	const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(0x30);
	const __m512i m32 = _mm512_set1_epi8(32);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT && !from_s; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, _mm512_setzero_ps());
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 1536, 224, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 1536, 224, b);
#if X16_PREFETCH
		X16K_PF_SCALES(panel, nb, pc, 1536, 224, b);
#endif
		/* the 16 scales (quant_scale_q3_K) four sub-blocks at a time:
		 * lane k of quarter q is sub-block 4q + k, byte r its row */
		__m512i L0 = _mm512_loadu_si512(pm + 32), L1 = _mm512_loadu_si512(pm + 96);
		__m512i H = _mm512_loadu_si512(pm + 160);
		__m512i sc[16], sp[8];
		_Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {
			__m512i lo = q < 2 ? _mm512_and_si512(q ? L1 : L0, m15)
					   : _mm512_and_si512(_mm512_srli_epi16(q == 3 ? L1 : L0, 4), m15);
			__m512i hs = q == 0 ? _mm512_slli_epi16(H, 4)
				     : q == 1 ? _mm512_slli_epi16(H, 2)
				     : q == 2 ? H
					      : _mm512_srli_epi16(H, 2);
			__m512i v = _mm512_sub_epi8(_mm512_ternarylogic_epi32(lo, hs, m48, 0xf8), m32);
			/* immediates spelled out: at -O1 (make check's sanitizer
			 * pass) an unrolled loop index is not a constant */
			sc[4 * q + 0] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 0));
			sc[4 * q + 1] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 1));
			sc[4 * q + 2] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 2));
			sc[4 * q + 3] = _mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(v, 3));
		}
		_Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
			sp[p] = _mm512_or_si512(_mm512_and_si512(sc[2 * p], _mm512_set1_epi32(0xffff)),
						_mm512_slli_epi32(sc[2 * p + 1], 16));
		_Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
			int g = (j % 8) / 2;
			sc[j] = _mm512_slli_epi32(sc[j], g < 3 ? 6 - 2 * g : 6);
		}
		__m512i sumi[X16K_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
		for (int h = 0; h < 2; h++) {
			const uint8_t *ph = pc + 768 * h;
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)ph + X16K_PREFETCH, 768);
#endif
			__m512i v[8];
			_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
				v[i] = _mm512_loadu_si512(ph + 64 * i);
			_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
				const uint8_t *mk = ph + 512 + 64 * g;
				int j = 8 * h + 2 * g;
				if (NT == 1) {
					const int8_t *aq = ((const struct block_q8_K *)a)[b].qs + 128 * h + 32 * g;
					__m512i i0 = _mm512_setzero_si512(), i1 = i0;
					_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
						i0 = dpbusd_bcst(i0, x16_q3_K_code(v[i], g, mk + 8 * i),
								 aq + 4 * i);
						i1 = dpbusd_bcst(i1, x16_q3_K_code(v[i + 4], g, mk + 8 * i + 32),
								 aq + 16 + 4 * i);
					}
					sumi[0] = _mm512_add_epi32(
						sumi[0], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[j]),
									  _mm512_mullo_epi32(i1, sc[j + 1])));
					continue;
				}
				__m512i c[8];
				_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
					c[i] = x16_q3_K_code(v[i], g, mk + 8 * i);
				_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
					const int8_t *aq =
						((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
						128 * h + 32 * g;
					__m512i i0 = _mm512_setzero_si512(), i1 = i0;
					_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
						i0 = dpbusd_bcst(i0, c[i], aq + 4 * i);
						i1 = dpbusd_bcst(i1, c[i + 4], aq + 16 + 4 * i);
					}
					sumi[t] = _mm512_add_epi32(
						sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[j]),
									  _mm512_mullo_epi32(i1, sc[j + 1])));
				}
			}
		}
		__m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_K *ab = (const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
			__m512i off = _mm512_setzero_si512();
			_Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
				off = dpwssd_bcst(off, sp[p], q8k_bsums(ab) + 2 * p);
			__m512i isum = _mm512_sub_epi32(_mm512_srai_epi32(sumi[t], 6),
							_mm512_slli_epi32(off, 2));
			float daf;
			memcpy(&daf, &ab->d, sizeof(daf));
			/* (da * d) * isum, the reference's order */
			__m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(daf), dv),
						 _mm512_cvtepi32_ps(isum));
			float *o = s + (size_t)t * s_stride;
			_mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), f));
		}
	}
}

/* Q2_K: Q3_K's code vectors without the high bits, all four in place (v &
 * (3 << 2g), 4^g x the code, unsigned up to 192), the scales made up for
 * as in Q3_K; the mins against the bsums as Q4_K's; then the reference's
 * da * d * isum - da * dmin * msum. */
static inline __attribute__((always_inline)) VNNI void
x16_q2_K_panel(int64_t nb, int NT, const uint8_t *panel, const uint8_t *a, size_t a_stride,
	       float *s, size_t s_stride, bool from_s)
{
	_Pragma("GCC unroll 8") for (int t = 0; t < NT && !from_s; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, _mm512_setzero_ps());
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *pc = KERN_X16_CODES(panel, nb, 1024, 320, b);
		const uint8_t *pm = KERN_X16_META(panel, nb, 1024, 320, b);
#if X16_PREFETCH
		X16K_PF_SCALES(panel, nb, pc, 1024, 320, b);
#endif
		/* per pair p of sub-blocks, each row's two scale bytes as an
		 * int16 pair in its dword: the mins (high nibbles) as (m 2p,
		 * m 2p+1) pairs, the scales (low nibbles) shifted by 6 - 2g to
		 * make up for the codes' 4^g (2p and 2p + 1 share g) */
		__m512i sc[16], mp[8];
		_Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {
			__m512i X = _mm512_cvtepu8_epi16(
				_mm256_loadu_si256((const __m256i *)(pm + 64 + 32 * p)));
			int sh = 6 - 2 * ((2 * p % 8) / 2);
			__m512i m = _mm512_set1_epi32(15 << sh);
			mp[p] = _mm512_srli_epi16(X, 4);
			sc[2 * p] = _mm512_and_si512(_mm512_slli_epi32(X, sh), m);
			sc[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi32(X, 16 - sh), m);
		}
		__m512i sumi[X16K_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			sumi[t] = _mm512_setzero_si512();
		for (int h = 0; h < 2; h++) {
			const uint8_t *ph = pc + 512 * h;
#if X16_PREFETCH
			KERN_PF_LINES(X16_PF, (const char *)ph + X16K_PREFETCH, 512);
#endif
			__m512i v[8];
			_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
				v[i] = _mm512_loadu_si512(ph + 64 * i);
			_Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
				const __m512i m = _mm512_set1_epi8((char)(3 << (2 * g)));
				int j = 8 * h + 2 * g;
				if (NT == 1) {
					const int8_t *aq = ((const struct block_q8_K *)a)[b].qs + 128 * h + 32 * g;
					__m512i i0 = _mm512_setzero_si512(), i1 = i0;
					_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
						i0 = dpbusd_bcst(i0, _mm512_and_si512(v[i], m), aq + 4 * i);
						i1 = dpbusd_bcst(i1, _mm512_and_si512(v[i + 4], m),
								 aq + 16 + 4 * i);
					}
					sumi[0] = _mm512_add_epi32(
						sumi[0], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[j]),
									  _mm512_mullo_epi32(i1, sc[j + 1])));
					continue;
				}
				__m512i c[8];
				_Pragma("GCC unroll 8") for (int i = 0; i < 8; i++)
					c[i] = _mm512_and_si512(v[i], m);
				_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
					const int8_t *aq =
						((const struct block_q8_K *)(a + (size_t)t * a_stride))[b].qs +
						128 * h + 32 * g;
					__m512i i0 = _mm512_setzero_si512(), i1 = i0;
					_Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
						i0 = dpbusd_bcst(i0, c[i], aq + 4 * i);
						i1 = dpbusd_bcst(i1, c[i + 4], aq + 16 + 4 * i);
					}
					sumi[t] = _mm512_add_epi32(
						sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(i0, sc[j]),
									  _mm512_mullo_epi32(i1, sc[j + 1])));
				}
			}
		}
		__m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pm));
		__m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pm + 32)));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			const struct block_q8_K *ab = (const struct block_q8_K *)(a + (size_t)t * a_stride) + b;
			__m512i msum = _mm512_setzero_si512();
			_Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
				msum = dpwssd_bcst(msum, mp[p], q8k_bsums(ab) + 2 * p);
			float daf;
			memcpy(&daf, &ab->d, sizeof(daf));
			__m512 da = _mm512_set1_ps(daf);
			/* da * d * isum - da * dmin * msum, the reference's order */
			__m512 t1 = _mm512_mul_ps(_mm512_mul_ps(da, dv),
						  _mm512_cvtepi32_ps(_mm512_srai_epi32(sumi[t], 6)));
			__m512 t2 = _mm512_mul_ps(_mm512_mul_ps(da, dmv), _mm512_cvtepi32_ps(msum));
			float *o = s + (size_t)t * s_stride;
			_mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), _mm512_sub_ps(t1, t2)));
		}
	}
}

#define x16_q4_K_panel(...) x16_k4_panel(false, __VA_ARGS__)
#define x16_q5_K_panel(...) x16_k4_panel(true, __VA_ARGS__)
KERN_X16K_GEMM(gemm_x16_q4_K, VNNI, x16_q4_K_panel, X16K_TOKENS)
KERN_X16K_GEMM(gemm_x16_q5_K, VNNI, x16_q5_K_panel, X16K_TOKENS)
KERN_X16K_GEMM(gemm_x16_iq4_xs, VNNI, x16_iq4_xs_panel, X16K_TOKENS)
KERN_X16K_GEMM(gemm_x16_q3_K, VNNI, x16_q3_K_panel, X16K_TOKENS)
KERN_X16K_GEMM(gemm_x16_q2_K, VNNI, x16_q2_K_panel, X16K_TOKENS)
KERN_X16K_GEMM(gemm_x16_q6_K, VNNI, x16_q6_K_panel, X16K_TOKENS)

/* ==== attention over F16 / Q8_0 KV caches ====================================
 * (Kept apart from the matmul kernels above; contracts in kern.h.)
 * - score_f16: per cached row, 16 lanes x 2 accumulators of f32 FMAs, a
 *   masked tail; four rows reduced together (the reference's budget, not
 *   its bits).
 * - score_q8_0 (VNNI): 16 rows at a time, one row per lane, as the decode
 *   kernel does: per block, each row's codes go unsigned (k ^ 0x80 = k +
 *   128) through one vpdpbusd against the query's signed codes, the 16
 *   partial vectors fold into one vector of exact block sums, 128 * sum(q)
 *   comes off as an integer, then the reference's float steps per lane
 *   ((d_q d_k) isum added to the row's sum): bit for bit the reference.
 * - vsum_f16 / vsum_q8_0: the output in up to 8 zmm accumulators over all
 *   rows, products then sums (no FMA): bit for bit the reference. */

static inline __m128i attn_fold4(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
	__m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
	return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

static inline __mmask16 attn_mask(int k)
{
	return (__mmask16)((1u << k) - 1);
}

/* q . row over hd elements into one vector of 16 partial sums. */
static inline __m512 score_f16_row_512(int hd, __mmask16 tm, const float *q, const uint16_t *r)
{
	__m512 a0 = _mm512_setzero_ps(), a1 = a0;
	int j = 0;
	for (; j + 32 <= hd; j += 32) {
		a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + j),
				     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + j))), a0);
		a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + j + 16),
				     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + j + 16))),
				     a1);
	}
	if (j + 16 <= hd) {
		a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + j),
				     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(r + j))), a0);
		j += 16;
	}
	if (tm)
		a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tm, q + j),
				     _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tm, r + j)), a1);
	return _mm512_add_ps(a0, a1);
}

/* The sums of four vectors: per 128-bit lane [r0 r1 r0 r1] + ..., then
 * [r0 r1 r2 r3], then the lanes folded. */
static inline __m128 attn_reduce4(__m512 r0, __m512 r1, __m512 r2, __m512 r3)
{
	__m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(r0, r1), _mm512_unpackhi_ps(r0, r1));
	__m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(r2, r3), _mm512_unpackhi_ps(r2, r3));
	__m512 u = _mm512_add_ps(
		_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
		_mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
	__m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
	return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* Rows four at a time: their four vectors of partial sums are reduced
 * together (attn_reduce4), a third of the shuffles of four separate
 * reductions. */
static void attn_score_f16_512(int hd, int n, const void *vq, const void *k, size_t stride,
			       float scale, float *s)
{
	const float *q = vq;
	const uint8_t *kb = k;
	const __mmask16 tm = attn_mask(hd % 16);
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		__m512 r0 = score_f16_row_512(hd, tm, q, (const uint16_t *)(kb + (size_t)i * stride));
		__m512 r1 = score_f16_row_512(hd, tm, q,
					      (const uint16_t *)(kb + (size_t)(i + 1) * stride));
		__m512 r2 = score_f16_row_512(hd, tm, q,
					      (const uint16_t *)(kb + (size_t)(i + 2) * stride));
		__m512 r3 = score_f16_row_512(hd, tm, q,
					      (const uint16_t *)(kb + (size_t)(i + 3) * stride));
		_mm_storeu_ps(s + i, _mm_mul_ps(attn_reduce4(r0, r1, r2, r3), _mm_set1_ps(scale)));
	}
	for (; i < n; i++)
		s[i] = _mm512_reduce_add_ps(score_f16_row_512(
			       hd, tm, q, (const uint16_t *)(kb + (size_t)i * stride))) *
		       scale;
}

/* o[j0 .. j0 + 16 NA) over all rows, NA accumulators; the last one only
 * on the lanes of `last`. */
static inline __attribute__((always_inline)) void
vsum_f16_chunk_512(const int NA, __mmask16 last, int j0, int n, const float *w, const uint8_t *v,
		   size_t stride, float *o)
{
	__m512 acc[8];
	_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++)
		acc[a] = _mm512_setzero_ps();
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		__m512 c = _mm512_set1_ps(w[i]);
		_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++) {
			__m256i h = a == NA - 1 && last != 0xffff
					    ? _mm256_maskz_loadu_epi16(last, r + 16 * a)
					    : _mm256_loadu_si256((const __m256i *)(r + 16 * a));
			acc[a] = _mm512_add_ps(acc[a], _mm512_mul_ps(c, _mm512_cvtph_ps(h)));
		}
	}
	_Pragma("GCC unroll 8") for (int a = 0; a < NA; a++)
		_mm512_mask_storeu_ps(o + j0 + 16 * a, a == NA - 1 ? last : 0xffff, acc[a]);
}

static void attn_vsum_f16_512(int hd, int n, const float *w, const void *v, size_t stride,
			      float *o)
{
	const uint8_t *vb = v;
	int j0 = 0;
	for (; j0 + 128 <= hd; j0 += 128)
		vsum_f16_chunk_512(8, 0xffff, j0, n, w, vb, stride, o);
	if (j0 + 64 <= hd) {
		vsum_f16_chunk_512(4, 0xffff, j0, n, w, vb, stride, o);
		j0 += 64;
	}
	if (j0 + 32 <= hd) {
		vsum_f16_chunk_512(2, 0xffff, j0, n, w, vb, stride, o);
		j0 += 32;
	}
	if (j0 + 16 <= hd) {
		vsum_f16_chunk_512(1, 0xffff, j0, n, w, vb, stride, o);
		j0 += 16;
	}
	if (j0 < hd)
		vsum_f16_chunk_512(1, attn_mask(hd - j0), j0, n, w, vb, stride, o);
}

/* ---- several query heads against the same F16 rows (kern.h: _mq) ---------
 * score: four rows at a time are converted once into `kf` (f32, zeros past
 * hd up to the next 16, which is what the single-head kernel's masked
 * loads give), then each head runs score_f16_row_512's steps on them: the
 * same two chains per row (a0 over full 32-element steps and a 16-element
 * step, a1 over the second halves and the masked tail), the same
 * attn_reduce4, the tail rows through _mm512_reduce_add_ps, so each head's
 * scores are the single kernel's bits. Per head and row that leaves the
 * FMAs and their loads of kf (the query's loads are shared by the four
 * rows), against the single kernel's loads of the query and the row and
 * a conversion per 16 elements. Rows longer than ATTN_MQ_HD take the
 * single kernel per head. */
enum { ATTN_MQ_HD = 256, ATTN_MQ_VHEADS = 4 };

static inline void attn_cvt_rows(int hd, int rows, __mmask16 tm, const uint8_t *k, size_t stride,
				 float (*kf)[ATTN_MQ_HD])
{
	for (int r = 0; r < rows; r++) {
		const uint16_t *row = (const uint16_t *)(k + (size_t)r * stride);
		int j = 0;
		for (; j + 16 <= hd; j += 16)
			_mm512_store_ps(kf[r] + j,
					_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + j))));
		if (tm)
			_mm512_store_ps(kf[r] + j, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tm, row + j)));
	}
}

/* score_f16_row_512 for rows R (1 or 4) of kf at once, one load of q per
 * step for all of them; out[r] is row r's vector of partial sums. */
static inline __attribute__((always_inline)) void
score_f32_rows_512(const int R, int hd, __mmask16 tm, const float *q, float (*kf)[ATTN_MQ_HD],
		   __m512 *out)
{
	__m512 a0[4], a1[4];
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		a0[r] = a1[r] = _mm512_setzero_ps();
	int j = 0;
	for (; j + 32 <= hd; j += 32) {
		__m512 q0 = _mm512_loadu_ps(q + j), q1 = _mm512_loadu_ps(q + j + 16);
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {
			a0[r] = _mm512_fmadd_ps(q0, _mm512_load_ps(kf[r] + j), a0[r]);
			a1[r] = _mm512_fmadd_ps(q1, _mm512_load_ps(kf[r] + j + 16), a1[r]);
		}
	}
	if (j + 16 <= hd) {
		__m512 q0 = _mm512_loadu_ps(q + j);
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
			a0[r] = _mm512_fmadd_ps(q0, _mm512_load_ps(kf[r] + j), a0[r]);
		j += 16;
	}
	if (tm) {
		__m512 q1 = _mm512_maskz_loadu_ps(tm, q + j);
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
			a1[r] = _mm512_fmadd_ps(q1, _mm512_load_ps(kf[r] + j), a1[r]);
	}
	_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)
		out[r] = _mm512_add_ps(a0[r], a1[r]);
}

static void attn_score_f16_mq_512(int hd, int n, int nq, const float *q, size_t q_stride,
				  const void *k, size_t stride, float scale, float *s,
				  size_t s_stride)
{
	const uint8_t *kb = k;
	if (nq == 1 || hd > ATTN_MQ_HD) {
		for (int h = 0; h < nq; h++)
			attn_score_f16_512(hd, n, q + (size_t)h * q_stride, k, stride, scale,
					   s + (size_t)h * s_stride);
		return;
	}
	const __mmask16 tm = attn_mask(hd % 16);
	float kf[4][ATTN_MQ_HD] __attribute__((aligned(64)));
	int i = 0;
	for (; i + 4 <= n; i += 4) {
		attn_cvt_rows(hd, 4, tm, kb + (size_t)i * stride, stride, kf);
		for (int h = 0; h < nq; h++) {
			__m512 r[4];
			score_f32_rows_512(4, hd, tm, q + (size_t)h * q_stride, kf, r);
			_mm_storeu_ps(s + (size_t)h * s_stride + i,
				      _mm_mul_ps(attn_reduce4(r[0], r[1], r[2], r[3]),
						 _mm_set1_ps(scale)));
		}
	}
	for (; i < n; i++) {
		attn_cvt_rows(hd, 1, tm, kb + (size_t)i * stride, stride, kf);
		for (int h = 0; h < nq; h++) {
			__m512 r;
			score_f32_rows_512(1, hd, tm, q + (size_t)h * q_stride, kf, &r);
			s[(size_t)h * s_stride + i] = _mm512_reduce_add_ps(r) * scale;
		}
	}
}

/* vsum: vsum_f16_chunk_512's products and sums, lane by lane in row order,
 * for up to ATTN_MQ_VHEADS heads over one conversion of each row's 16 NA
 * elements from j0. */
static inline __attribute__((always_inline)) void
vsum_f16_chunk_mq_512(const int NA, const int NQ, __mmask16 last, int j0, int n, const float *w,
		      size_t w_stride, const uint8_t *v, size_t stride, float *o, size_t o_stride)
{
	__m512 acc[ATTN_MQ_VHEADS][4];
	_Pragma("GCC unroll 4") for (int h = 0; h < NQ; h++)
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			acc[h][a] = _mm512_setzero_ps();
	for (int i = 0; i < n; i++) {
		const uint16_t *r = (const uint16_t *)(v + (size_t)i * stride) + j0;
		__m512 x[4];
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			x[a] = _mm512_cvtph_ps(a == NA - 1 && last != 0xffff
						       ? _mm256_maskz_loadu_epi16(last, r + 16 * a)
						       : _mm256_loadu_si256((const __m256i *)(r + 16 * a)));
		_Pragma("GCC unroll 4") for (int h = 0; h < NQ; h++) {
			__m512 c = _mm512_set1_ps(w[(size_t)h * w_stride + i]);
			_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
				acc[h][a] = _mm512_add_ps(acc[h][a], _mm512_mul_ps(c, x[a]));
		}
	}
	_Pragma("GCC unroll 4") for (int h = 0; h < NQ; h++)
		_Pragma("GCC unroll 4") for (int a = 0; a < NA; a++)
			_mm512_mask_storeu_ps(o + (size_t)h * o_stride + j0 + 16 * a,
					      a == NA - 1 ? last : 0xffff, acc[h][a]);
}

/* One group of NQ heads: the row in chunks of 64 elements, then 32, 16 and
 * the masked tail. */
static inline __attribute__((always_inline)) void
vsum_f16_heads_512(const int NQ, int hd, int n, const float *w, size_t w_stride, const uint8_t *v,
		   size_t stride, float *o, size_t o_stride)
{
	int j0 = 0;
	for (; j0 + 64 <= hd; j0 += 64)
		vsum_f16_chunk_mq_512(4, NQ, 0xffff, j0, n, w, w_stride, v, stride, o, o_stride);
	if (j0 + 32 <= hd) {
		vsum_f16_chunk_mq_512(2, NQ, 0xffff, j0, n, w, w_stride, v, stride, o, o_stride);
		j0 += 32;
	}
	if (j0 + 16 <= hd) {
		vsum_f16_chunk_mq_512(1, NQ, 0xffff, j0, n, w, w_stride, v, stride, o, o_stride);
		j0 += 16;
	}
	if (j0 < hd)
		vsum_f16_chunk_mq_512(1, NQ, attn_mask(hd - j0), j0, n, w, w_stride, v, stride, o,
				      o_stride);
}

static void attn_vsum_f16_mq_512(int hd, int n, int nq, const float *w, size_t w_stride,
				 const void *v, size_t stride, float *o, size_t o_stride)
{
	const uint8_t *vb = v;
	int h = 0;
	for (; h + 4 <= nq; h += 4)
		vsum_f16_heads_512(4, hd, n, w + (size_t)h * w_stride, w_stride, vb, stride,
				   o + (size_t)h * o_stride, o_stride);
	switch (nq - h) {
	case 3:
		vsum_f16_heads_512(3, hd, n, w + (size_t)h * w_stride, w_stride, vb, stride,
				   o + (size_t)h * o_stride, o_stride);
		break;
	case 2:
		vsum_f16_heads_512(2, hd, n, w + (size_t)h * w_stride, w_stride, vb, stride,
				   o + (size_t)h * o_stride, o_stride);
		break;
	case 1:
		attn_vsum_f16_512(hd, n, w + (size_t)h * w_stride, v, stride,
				  o + (size_t)h * o_stride);
		break;
	default:
		break;
	}
}

/* 16 codes of a Q8_0 block as floats. */
static inline __m512 q8_f32_512(const int8_t *qs)
{
	return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
}

/* Blocks [b0, b0 + NB) of every row; the last block stores only `m` of
 * its 32 elements (m = 32: whole). A padded block still holds 32 codes
 * (zeros past the head), so reading it whole stays inside the row. */
static inline __attribute__((always_inline)) void
vsum_q8_0_chunk_512(const int NB, int m, int b0, int n, const float *w, const uint8_t *v,
		    size_t stride, float *o)
{
	__m512 acc[8];
	_Pragma("GCC unroll 8") for (int a = 0; a < 2 * NB; a++)
		acc[a] = _mm512_setzero_ps();
	for (int i = 0; i < n; i++) {
		const struct block_q8_0 *r = (const struct block_q8_0 *)(v + (size_t)i * stride) + b0;
		_Pragma("GCC unroll 4") for (int b = 0; b < NB; b++) {
			__m512 c = _mm512_set1_ps(w[i] * half(r[b].d));
			acc[2 * b] = _mm512_add_ps(acc[2 * b], _mm512_mul_ps(c, q8_f32_512(r[b].qs)));
			acc[2 * b + 1] =
				_mm512_add_ps(acc[2 * b + 1], _mm512_mul_ps(c, q8_f32_512(r[b].qs + 16)));
		}
	}
	_Pragma("GCC unroll 8") for (int a = 0; a < 2 * NB; a++) {
		__mmask16 k = 0xffff;
		if (a >= 2 * NB - 2 && m < 32)
			k = a == 2 * NB - 2 ? attn_mask(m < 16 ? m : 16)
					    : attn_mask(m > 16 ? m - 16 : 0);
		_mm512_mask_storeu_ps(o + 32 * b0 + 16 * a, k, acc[a]);
	}
}

static void attn_vsum_q8_0_512(int hd, int n, const float *w, const void *v, size_t stride,
			       float *o)
{
	const uint8_t *vb = v;
	int nb = (hd + QK8_0 - 1) / QK8_0, b = 0;
	int m = hd - QK8_0 * (nb - 1); /* elements of the last block */
	for (; b + 4 < nb || (b + 4 == nb && m == 32); b += 4)
		vsum_q8_0_chunk_512(4, 32, b, n, w, vb, stride, o);
	for (; b + 1 < nb; b++)
		vsum_q8_0_chunk_512(1, 32, b, n, w, vb, stride, o);
	if (b < nb)
		vsum_q8_0_chunk_512(1, m, b, n, w, vb, stride, o);
}

static VNNI void attn_score_q8_0_vnni(int hd, int n, const void *vq, const void *k,
				      size_t stride, float scale, float *s)
{
	const struct block_q8_0 *q = vq;
	const uint8_t *kb = k;
	int nb = (hd + QK8_0 - 1) / QK8_0;
	const __m256i flip = _mm256_set1_epi8((char)0x80);
	for (int i0 = 0; i0 < n; i0 += 16) {
		int rows = n - i0 < 16 ? n - i0 : 16;
		const uint8_t *rp[16];
		int32_t off[16];
		for (int r = 0; r < 16; r++) {
			rp[r] = kb + (size_t)(i0 + (r < rows ? r : 0)) * stride; /* pad: a real row */
			off[r] = (int32_t)(rp[r] - rp[0]);
		}
		const __m512i idx = _mm512_loadu_si512(off);
		__m512 acc = _mm512_setzero_ps();
		for (int b = 0; b < nb; b++) {
			size_t o = (size_t)b * sizeof(struct block_q8_0);
			__m256i qv = _mm256_loadu_si256((const __m256i *)q[b].qs);
			int32_t qsum = 0;
			for (int j = 0; j < QK8_0; j++)
				qsum += q[b].qs[j];
			__m256i p[16];
			_Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)
				p[r] = _mm256_dpbusd_epi32(
					_mm256_setzero_si256(),
					_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rp[r] + o + 2)),
							 flip),
					qv);
			__m512i is = _mm512_inserti64x4(
				_mm512_castsi256_si512(_mm256_inserti128_si256(
					_mm256_castsi128_si256(attn_fold4(p[0], p[1], p[2], p[3])),
					attn_fold4(p[4], p[5], p[6], p[7]), 1)),
				_mm256_inserti128_si256(
					_mm256_castsi128_si256(attn_fold4(p[8], p[9], p[10], p[11])),
					attn_fold4(p[12], p[13], p[14], p[15]), 1),
				1);
			is = _mm512_sub_epi32(is, _mm512_set1_epi32(128 * qsum));
			__m512i d32 = _mm512_i32gather_epi32(idx, rp[0] + o, 1);
			__m512 dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
			acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(half(q[b].d)), dk),
							       _mm512_cvtepi32_ps(is)));
		}
		_mm512_mask_storeu_ps(s + i0, attn_mask(rows),
				      _mm512_mul_ps(acc, _mm512_set1_ps(scale)));
	}
}

/* ---- tables -------------------------------------------------------------- */

const struct kern_ops kern_avx512_ops = {
	.name = "avx512",
	.t = {
		[ENGINE_DTYPE_F32] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f32 },
		[ENGINE_DTYPE_F16] = { .act_type = ENGINE_DTYPE_F32, .vec_dot = vec_dot_f16 },
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
	.silu_mul_f32 = silu_mul_f32,
	.exp_sum_f32 = exp_sum_f32,
	.read_stream = read_stream,
	.read_stream_chain = read_stream_chain,
	.attn_score_f16 = attn_score_f16_512,
	.attn_vsum_f16 = attn_vsum_f16_512,
	.attn_score_f16_mq = attn_score_f16_mq_512,
	.attn_vsum_f16_mq = attn_vsum_f16_mq_512,
	.attn_vsum_q8_0 = attn_vsum_q8_0_512,
};

const struct kern_ops kern_avx512vnni_ops = {
	.name = "avx512vnni",
	.t = {
		/* the K-quants keep avx2's vec_dot (same activations) and add
		 * the x16 kernels */
		[ENGINE_DTYPE_Q4_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q4_K },
		[ENGINE_DTYPE_Q5_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q5_K },
		[ENGINE_DTYPE_Q6_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q6_K },
		[ENGINE_DTYPE_Q2_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q2_K },
		[ENGINE_DTYPE_Q3_K] = { .act_type = ENGINE_DTYPE_Q8_K, .gemm_x16 = gemm_x16_q3_K },
		[ENGINE_DTYPE_IQ4_XS] = { .act_type = ENGINE_DTYPE_Q8_K,
					  .gemm_x16 = gemm_x16_iq4_xs },
		/* so do these (their vec_dot: kern_avx2_q32.c) */
		[ENGINE_DTYPE_Q4_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q4_1 },
		[ENGINE_DTYPE_Q5_0] = { .act_type = ENGINE_DTYPE_Q8_0, .gemm_x16 = gemm_x16_q5_0 },
		[ENGINE_DTYPE_Q5_1] = { .act_type = ENGINE_DTYPE_Q8_1, .gemm_x16 = gemm_x16_q5_1 },
		[ENGINE_DTYPE_IQ4_NL] = { .act_type = ENGINE_DTYPE_Q8_0,
					  .gemm_x16 = gemm_x16_iq4_nl },
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0, .gemm = gemm_q8_0,
					.gemv = gemv_q8_0, .gemm_x16 = gemm_x16_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0, .gemm = gemm_q4_0,
					.gemv = gemv_q4_0, .gemm_x16 = gemm_x16_q4_0 },
	},
	.attn_score_q8_0 = attn_score_q8_0_vnni,
};
