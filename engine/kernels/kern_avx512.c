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

#include "engine/quant.h"

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
			int t = 0;
			for (; t + TILE_TOKENS <= nt; t += TILE_TOKENS)
				panel_tokens(&P, nbs, TILE_TOKENS, ab + (size_t)t * a_stride,
					     a_stride, xb + (size_t)t * aux_stride, aux_stride,
					     s + (size_t)t * s_stride + r0, s_stride, m, b0 == 0);
			switch (nt - t) {
#define TAIL(k)                                                                            \
	case k:                                                                            \
		panel_tokens(&P, nbs, k, ab + (size_t)t * a_stride, a_stride,              \
			     xb + (size_t)t * aux_stride, aux_stride,                      \
			     s + (size_t)t * s_stride + r0, s_stride, m, b0 == 0);         \
		break;
				TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7)
#undef TAIL
			default:
				break;
			}
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

/* Rows four at a time: their four vectors of partial sums are reduced
 * together (interleave, add, fold the 128-bit lanes), a third of the
 * shuffles of four separate reductions. */
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
		/* per 128-bit lane: [r0 r1 r0 r1] + ..., then [r0 r1 r2 r3] */
		__m512 t01 = _mm512_add_ps(_mm512_unpacklo_ps(r0, r1), _mm512_unpackhi_ps(r0, r1));
		__m512 t23 = _mm512_add_ps(_mm512_unpacklo_ps(r2, r3), _mm512_unpackhi_ps(r2, r3));
		__m512 u = _mm512_add_ps(
			_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))),
			_mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t01), _mm512_castps_pd(t23))));
		__m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
		__m128 v = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
		_mm_storeu_ps(s + i, _mm_mul_ps(v, _mm_set1_ps(scale)));
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
	.dot_f32 = dot_f32,
	.read_stream = read_stream,
	.attn_score_f16 = attn_score_f16_512,
	.attn_vsum_f16 = attn_vsum_f16_512,
	.attn_vsum_q8_0 = attn_vsum_q8_0_512,
};

const struct kern_ops kern_avx512vnni_ops = {
	.name = "avx512vnni",
	.t = {
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q8_0_q8_0, .gemm = gemm_q8_0,
					.gemv = gemv_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0,
					.vec_dot = vec_dot_q4_0_q8_0, .gemm = gemm_q4_0,
					.gemv = gemv_q4_0 },
	},
	.attn_score_q8_0 = attn_score_q8_0_vnni,
};
