/* engine/kernels/kern_avx2_kq.c: AVX2 kernels for the K-quants Q2_K, Q3_K
 * and Q5_K and for IQ4_XS, in ggml's own block layouts (no repacking), with
 * Q8_K activations. A part table of the avx2 variant (kern_select.c): built
 * with -mavx2 -mfma -mf16c, no LTO.
 *
 * Integer work, per 256-element super-block: the codes are unpacked to
 * bytes, 32 elements (one vector) at a time, and multiplied with
 * vpmaddubsw; vpmaddwd then applies the sub-block scales, one int16 per
 * lane (spread from a broadcast of the block's scales with vpshufb).
 * - Q2_K, Q3_K: codes 0..3 (Q3_K: plus 4 x the hmask bit, 0..7). The groups
 *   whose codes sit at bits 2-3 of a byte are masked in place, i.e. taken 4x
 *   too large, and their partners get 4x the scale instead, so no shift is
 *   needed; every product is then 4x the true one and the sum comes out
 *   exactly after an arithmetic shift by 2. Q3_K's offset (codes - 4) comes
 *   off through the activation's bsums, as do Q2_K's mins.
 * - Q5_K: nibble | fifth bit << 4 (0..31), mins through the bsums.
 * - IQ4_XS: the codebook by vpshufb, kern_avx2.c's sign trick (|K| times
 *   sign(K) a; pair sums within 2 x 127 x 127: our Q8_K quantizer never
 *   makes -128).
 * Pair sums stay within int16 (at most 2 x 31 x 128) and every super-block
 * sum is exact in int32.
 *
 * Float work: each super-block is finished with kern_generic's own
 * expression in its order, without FMA, and added to the row's sum in
 * block order: every entry here gives the reference's result bit for bit,
 * so a (row, token) result never depends on nt, nr or the tiling (kern.h),
 * and vec_dot, gemv and gemm agree exactly.
 *
 * One token (decode, vec_dot, gemv = gemm with nt == 1) walks a row two
 * super-blocks per step, whose integer sums are reduced together (unpack
 * and add), with a software prefetch KQ_PREFETCH bytes down the weight
 * stream. IQ4_XS's gemm first reorders the token's activations once per
 * call (kq_pair_halves) so that a 32-byte load of codes serves two
 * sub-blocks. Decode is memory-bound for Q5_K; Q2_K, Q3_K and IQ4_XS take
 * 0.8-0.95 instructions per weight byte, and on a 2-core Zen 3 that
 * compute is what keeps them near the read bandwidth rather than at it.
 *
 * Prefill: a tile of one row x up to KQ_TOKENS tokens. Each super-block of
 * the row is unpacked once (codes and scale vectors in registers) and met
 * by every token of the tile, the tokens' sums reduced together into
 * vectors whose lanes then take the float steps side by side; Q2_K's tile
 * also multiplies its codes by their scales once (a byte still), which
 * lets two groups' pair sums add in int16 before one vpmaddwd per token.
 * The token tile is the outer loop, so its activations stay in cache while
 * the rows stream by. */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>
#include <string.h>

#ifndef KQ_TOKENS
#define KQ_TOKENS 8
#endif
/* Q8_K block: d (f32), qs[256], bsums[16] */
#define Q8K_SIZE 292
#define Q8K_QS 4
#define Q8K_BSUMS 260

/* The weight stream is asked for this many bytes ahead of the block in use
 * (rows are contiguous: the distance runs on into the next rows). */
#ifndef KQ_PREFETCH
#define KQ_PREFETCH 3072
#endif

#define AI __attribute__((always_inline))

/* every 64-byte line of a bs-byte block, KQ_PREFETCH bytes on */
static inline AI void kq_prefetch(const uint8_t *wb, size_t bs)
{
	if (KQ_PREFETCH > 0)
		_Pragma("GCC unroll 4") for (size_t l = 0; l < bs; l += 64)
			_mm_prefetch((const char *)wb + KQ_PREFETCH + l, _MM_HINT_T0);
}

static inline int32_t ld32(const void *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline float ldf(const void *p)
{
	float v;
	memcpy(&v, p, 4);
	return v;
}

static inline AI __m256i ldu(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

/* Keep v in a register here: GCC would otherwise reassociate a tile's
 * accumulations, computing every product first and spilling them. */
#define KQ_PIN(v) __asm__("" : "+x"(v))

/* int32 lanes += (codes . act pairs) . scale pairs */
static inline AI __m256i dot_acc(__m256i acc, __m256i c, const uint8_t *act, __m256i sv)
{
	acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, ldu(act)), sv));
	KQ_PIN(acc);
	return acc;
}

/* vpshufb masks, read from memory (as constants GCC rebuilt them in the
 * loops): kq_pick_b[k], byte 2k zero-extended over the low lane and byte
 * 2k + 1 over the high; kq_pick_w[j], int16 word j over both lanes;
 * kq_pick_w2[g], word 2g over the low lane and 2g + 1 over the high. */
#define KQ_R8(x, y) x, y, x, y, x, y, x, y, x, y, x, y, x, y, x, y
#define KQ_PICK_B(k) {KQ_R8(2 * (k), 0x80), KQ_R8(2 * (k) + 1, 0x80)}
#define KQ_PICK_W(lo, hi) {KQ_R8(2 * (lo), 2 * (lo) + 1), KQ_R8(2 * (hi), 2 * (hi) + 1)}
static const uint8_t kq_pick_b[8][32] __attribute__((aligned(32))) = {
	KQ_PICK_B(0), KQ_PICK_B(1), KQ_PICK_B(2), KQ_PICK_B(3),
	KQ_PICK_B(4), KQ_PICK_B(5), KQ_PICK_B(6), KQ_PICK_B(7),
};
static const uint8_t kq_pick_w[8][32] __attribute__((aligned(32))) = {
	KQ_PICK_W(0, 0), KQ_PICK_W(1, 1), KQ_PICK_W(2, 2), KQ_PICK_W(3, 3),
	KQ_PICK_W(4, 4), KQ_PICK_W(5, 5), KQ_PICK_W(6, 6), KQ_PICK_W(7, 7),
};
static const uint8_t kq_pick_w2[4][32] __attribute__((aligned(32))) = {
	KQ_PICK_W(0, 1), KQ_PICK_W(2, 3), KQ_PICK_W(4, 5), KQ_PICK_W(6, 7),
};

static inline AI __m256i pick(const uint8_t *mask)
{
	return _mm256_load_si256((const __m256i *)mask);
}

/* The weight types, as a compile-time argument of the inline kernels;
 * K_IQ4XP: IQ4_XS against activations in kq_pair_halves' order. */
enum { K_Q2, K_Q3, K_Q5, K_IQ4X, K_IQ4XP };

static inline size_t kq_bs(int T)
{
	return T == K_Q2 ? 84 : T == K_Q3 ? 110 : T == K_Q5 ? 176 : 136;
}

/* the types with mins (d, dmin adjacent at kq_d), the others: d at kq_d */
static inline bool kq_min(int T)
{
	return T == K_Q2 || T == K_Q5;
}

static inline size_t kq_d(int T)
{
	return T == K_Q2 ? 80 : T == K_Q3 ? 108 : 0;
}

/* kq_sb's sums are 1 << kq_shift times the true ones */
static inline int kq_shift(int T)
{
	return T == K_Q2 || T == K_Q3 ? 2 : 0;
}

/* Tables a call loads once: the IQ4_XS codebook in both lanes. */
struct kq_consts {
	__m256i book;
};

static inline AI struct kq_consts kq_consts_load(int T)
{
	struct kq_consts c = {_mm256_setzero_si256()};
	if (T >= K_IQ4X)
		c.book = _mm256_broadcastsi128_si256(
			_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
	return c;
}

/* ---- one super-block's integer sums --------------------------------------
 * For NT tokens (activation blocks ab + t a_stride): ia[t] the scaled code
 * sums, times 1 << kq_shift(T), in int32 lanes; ma[t] the min sums. */

/* Q2_K: scales[16] (low nibble scale, high nibble min, per 16 elements),
 * qs[64], d, dmin. Group k (32 elements from 32k) is bits 2g..2g+1 of
 * qs[32h ..], h = k / 4, g = k % 4: sub-blocks 2k (low lane), 2k + 1. */
static inline AI void q2_K_sb(int NT, const uint8_t *wb, const uint8_t *ab, size_t a_stride,
			      __m256i *ia, __m256i *ma)
{
	const __m256i m3 = _mm256_set1_epi8(3), m12 = _mm256_set1_epi8(12);
	const __m256i m15 = _mm256_set1_epi8(15);
	__m128i sc = _mm_loadu_si128((const __m128i *)wb);
	__m256i b1 = _mm256_and_si256(_mm256_broadcastsi128_si256(sc), m15);
	__m256i q[4];
	q[0] = ldu(wb + 16);
	q[1] = ldu(wb + 48);
	q[2] = _mm256_srli_epi16(q[0], 4);
	q[3] = _mm256_srli_epi16(q[1], 4);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ia[t] = _mm256_setzero_si256();
	if (NT == 1) {
		__m256i b4 = _mm256_slli_epi16(b1, 2); /* 4 sc, for the in-place groups */
		_Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
			int h = k >> 2, g = k & 3;
			/* g odd: bits 2-3 taken in place (4 x code), scale 1 x */
			__m256i c = _mm256_and_si256(q[h + (g & 2)], g & 1 ? m12 : m3);
			__m256i sv = _mm256_shuffle_epi8(g & 1 ? b1 : b4, pick(kq_pick_b[k]));
			ia[0] = dot_acc(ia[0], c, ab + Q8K_QS + 32 * k, sv);
		}
	} else {
		/* A tile scales the codes once: code x scale (at most 3 x 15)
		 * fits a byte, and as a 16-bit multiply by the zero-extended
		 * scale it cannot carry across the bytes. Two groups' pair
		 * sums (2 x 2 x 45 x 128) then add in int16 before one vpmaddwd
		 * per token. These sums are 4 x the true ones, as NT == 1's. */
		const __m256i four = _mm256_set1_epi16(4);
		_Pragma("GCC unroll 4") for (int k = 0; k < 8; k += 2) {
			__m256i c[2];
			_Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
				int h = (k + u) >> 2, g = (k + u) & 3;
				__m256i x = q[h + (g & 2)];
				if (g & 1)
					x = _mm256_srli_epi16(x, 2);
				__m256i sv = _mm256_shuffle_epi8(b1, pick(kq_pick_b[k + u]));
				c[u] = _mm256_mullo_epi16(_mm256_and_si256(x, m3), sv);
			}
			_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
				const uint8_t *at = ab + (size_t)t * a_stride + Q8K_QS + 32 * k;
				__m256i p0 = _mm256_maddubs_epi16(c[0], ldu(at));
				__m256i p1 = _mm256_maddubs_epi16(c[1], ldu(at + 32));
				__m256i p = _mm256_add_epi16(p0, p1);
				ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(p, four));
				KQ_PIN(ia[t]);
			}
		}
	}
	__m256i mv = _mm256_cvtepu8_epi16(
		_mm_and_si128(_mm_srli_epi16(sc, 4), _mm256_castsi256_si128(m15)));
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ma[t] = _mm256_madd_epi16(mv, ldu(ab + (size_t)t * a_stride + Q8K_BSUMS));
}

/* Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, offset 32), d.
 * Group k as Q2_K's; code = q2 + 4 x bit k of hmask[l] (0..7) and the 4 x
 * bsums of each sub-block come off at the end. */
static inline AI void q3_K_sb(int NT, const uint8_t *wb, const uint8_t *ab, size_t a_stride,
			      __m256i *ia)
{
	const __m256i m3 = _mm256_set1_epi8(3), m12 = _mm256_set1_epi8(12);
	const __m256i b2 = _mm256_set1_epi8(4), b4 = _mm256_set1_epi8(16);
	const __m128i m15 = _mm_set1_epi8(15);
	/* scale i: low 4 bits from byte i % 8 (nibble i / 8), high 2 from
	 * byte 8 + i % 4 (bits 2 (i / 4)) */
	__m128i x = _mm_loadl_epi64((const __m128i *)(wb + 96));
	__m128i lo = _mm_and_si128(_mm_unpacklo_epi64(x, _mm_srli_epi16(x, 4)), m15);
	__m128i hi = _mm_srlv_epi32(_mm_set1_epi32(ld32(wb + 104)), _mm_setr_epi32(0, 2, 4, 6));
	hi = _mm_slli_epi16(_mm_and_si128(hi, _mm_set1_epi8(3)), 4);
	__m128i sc8 = _mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32));
	__m256i sc16 = _mm256_cvtepi8_epi16(sc8);
	/* scales 0-7 and 8-15 over both lanes, and 4 x them */
	__m256i half[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
			   _mm256_permute2x128_si256(sc16, sc16, 0x11)};
	__m256i half4[2] = {_mm256_slli_epi16(half[0], 2), _mm256_slli_epi16(half[1], 2)};
	__m256i corr = _mm256_slli_epi16(sc16, 4); /* 16 sc: 4 x (4 bsum) */
	__m256i hm = ldu(wb);
	__m256i q[4];
	q[0] = ldu(wb + 32);
	q[1] = ldu(wb + 64);
	q[2] = _mm256_srli_epi16(q[0], 4);
	q[3] = _mm256_srli_epi16(q[1], 4);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ia[t] = _mm256_setzero_si256();
	_Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
		int h = k >> 2, g = k & 3;
		/* g odd: 4 x code (bit k of hmask to bit 4), 1 x scale;
		 * g even: code (bit k to bit 2), 4 x scale */
		int pos = g & 1 ? 4 : 2;
		__m256i hb = pos >= k ? _mm256_slli_epi16(hm, pos - k)
				      : _mm256_srli_epi16(hm, k - pos);
		__m256i c = _mm256_or_si256(_mm256_and_si256(q[h + (g & 2)], g & 1 ? m12 : m3),
					    _mm256_and_si256(hb, g & 1 ? b4 : b2));
		__m256i sv = _mm256_shuffle_epi8(g & 1 ? half[h] : half4[h], pick(kq_pick_w2[g]));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			ia[t] = dot_acc(ia[t], c, ab + (size_t)t * a_stride + Q8K_QS + 32 * k, sv);
	}
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ia[t] = _mm256_sub_epi32(
			ia[t], _mm256_madd_epi16(corr, ldu(ab + (size_t)t * a_stride + Q8K_BSUMS)));
}

/* The 8 scales and 8 mins of Q4_K/Q5_K as bytes (quant_scale_min_k4, four
 * at a time). */
static inline AI void k4_scales(const uint8_t *q, uint32_t sc[2], uint32_t mn[2])
{
	uint32_t w0 = (uint32_t)ld32(q), w1 = (uint32_t)ld32(q + 4), w2 = (uint32_t)ld32(q + 8);
	sc[0] = w0 & 0x3f3f3f3fu;
	mn[0] = w1 & 0x3f3f3f3fu;
	sc[1] = (w2 & 0x0f0f0f0fu) | (((w0 >> 6) & 0x03030303u) << 4);
	mn[1] = ((w2 >> 4) & 0x0f0f0f0fu) | (((w1 >> 6) & 0x03030303u) << 4);
}

/* Q5_K: d, dmin, scales[12] (8 six-bit scales and mins, per 32 elements),
 * qh[32], qs[128]. Group j: nibble j & 1 of qs[32 (j / 2) ..], fifth bit
 * bit j of qh[l]. */
static inline AI void q5_K_sb(int NT, const uint8_t *wb, const uint8_t *ab, size_t a_stride,
			      __m256i *ia, __m256i *ma)
{
	const __m256i m15 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
	uint32_t sc[2], mn[2];
	k4_scales(wb + 4, sc, mn);
	__m128i sc8 = _mm_insert_epi32(_mm_cvtsi32_si128((int)sc[0]), (int)sc[1], 1);
	__m128i mn8 = _mm_insert_epi32(_mm_cvtsi32_si128((int)mn[0]), (int)mn[1], 1);
	__m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sc8));
	/* min j over both bsums of its 32 elements */
	__m256i mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
	__m256i qh = ldu(wb + 16);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ia[t] = _mm256_setzero_si256();
	_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
		__m256i q = ldu(wb + 48 + 32 * (j >> 1));
		if (j & 1)
			q = _mm256_srli_epi16(q, 4);
		__m256i hb = j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
		__m256i c = _mm256_or_si256(_mm256_and_si256(q, m15), _mm256_and_si256(hb, b4));
		__m256i sv = _mm256_shuffle_epi8(sc16, pick(kq_pick_w[j]));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
			ia[t] = dot_acc(ia[t], c, ab + (size_t)t * a_stride + Q8K_QS + 32 * j, sv);
	}
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ma[t] = _mm256_madd_epi16(mv, ldu(ab + (size_t)t * a_stride + Q8K_BSUMS));
}

/* IQ4_XS: d, scales_h (2 bits per 32 elements), scales_l[4] (nibbles),
 * qs[128]. Sub-block ib: element j of qs[16 ib + j]'s low nibble, 16 + j of
 * its high. Its scales, ls_ib = nibble ib of scales_l | 2 bits ib of
 * scales_h << 4, less 32, as int16 words 0..7 of both lanes: */
static inline AI __m256i iq4_xs_scales(const uint8_t *wb)
{
	__m128i x = _mm_cvtsi32_si128(ld32(wb + 4));
	__m128i lo = _mm_and_si128(_mm_unpacklo_epi8(x, _mm_srli_epi16(x, 4)), _mm_set1_epi8(15));
	uint16_t shv;
	memcpy(&shv, wb + 2, 2);
	__m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32(shv),
				       _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
	hi = _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4);
	__m256i ls = _mm256_or_si256(_mm256_cvtepu8_epi32(lo), hi);
	ls = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
	return _mm256_broadcastsi128_si256(
		_mm_packs_epi32(_mm256_castsi256_si128(ls), _mm256_extracti128_si256(ls, 1)));
}

static inline AI void iq4_xs_sb(int NT, const uint8_t *wb, const uint8_t *ab, size_t a_stride,
				__m256i *ia, __m256i book)
{
	const __m256i m15 = _mm256_set1_epi8(15);
	/* doubled 16-byte load >> (0 | 4): the low nibbles, then the high */
	const __m256i nib = _mm256_setr_epi64x(0, 0, 4, 4);
	__m256i sc16 = iq4_xs_scales(wb);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		ia[t] = _mm256_setzero_si256();
	_Pragma("GCC unroll 8") for (int ib = 0; ib < 8; ib++) {
		__m256i q = _mm256_broadcastsi128_si256(
			_mm_loadu_si128((const __m128i *)(wb + 8 + 16 * ib)));
		__m256i idx = _mm256_and_si256(_mm256_srlv_epi64(q, nib), m15);
		__m256i sg = _mm256_shuffle_epi8(book, idx);
		__m256i ua = _mm256_abs_epi8(sg);
		__m256i sv = _mm256_shuffle_epi8(sc16, pick(kq_pick_w[ib]));
		_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
			__m256i av = ldu(ab + (size_t)t * a_stride + Q8K_QS + 32 * ib);
			__m256i p = _mm256_maddubs_epi16(ua, _mm256_sign_epi8(av, sg));
			ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(p, sv));
			KQ_PIN(ia[t]);
		}
	}
}

/* IQ4_XS, one token, activations in kq_pair_halves' order: sub-blocks
 * 2p and 2p + 1 straight from one 32-byte load, their low nibbles against
 * [a_2p[0..15] | a_2p+1[0..15]] and their high against the 16..31 halves,
 * which saves the doubling loads and shifts and half the scale shuffles. */
static inline AI void iq4_xs_sb_paired(const uint8_t *wb, const uint8_t *ab, __m256i *ia,
				       __m256i book)
{
	const __m256i m15 = _mm256_set1_epi8(15);
	__m256i sc16 = iq4_xs_scales(wb);
	__m256i acc = _mm256_setzero_si256();
	_Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
		__m256i q = ldu(wb + 8 + 32 * p);
		__m256i sv = _mm256_shuffle_epi8(sc16, pick(kq_pick_w2[p]));
		_Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
			__m256i idx = _mm256_and_si256(u ? _mm256_srli_epi16(q, 4) : q, m15);
			__m256i sg = _mm256_shuffle_epi8(book, idx);
			__m256i av = ldu(ab + Q8K_QS + 64 * p + 32 * u);
			__m256i pr =
				_mm256_maddubs_epi16(_mm256_abs_epi8(sg), _mm256_sign_epi8(av, sg));
			acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, sv));
			KQ_PIN(acc);
		}
	}
	ia[0] = acc;
}

static inline AI void kq_sb(int T, int NT, const uint8_t *wb, const uint8_t *ab, size_t a_stride,
			    __m256i *ia, __m256i *ma, struct kq_consts kc)
{
	kq_prefetch(wb, kq_bs(T));
	switch (T) {
	case K_Q2:
		q2_K_sb(NT, wb, ab, a_stride, ia, ma);
		break;
	case K_Q3:
		q3_K_sb(NT, wb, ab, a_stride, ia);
		break;
	case K_Q5:
		q5_K_sb(NT, wb, ab, a_stride, ia, ma);
		break;
	case K_IQ4X:
		iq4_xs_sb(NT, wb, ab, a_stride, ia, kc.book);
		break;
	default:
		iq4_xs_sb_paired(wb, ab, ia, kc.book);
		break;
	}
}

/* ---- reductions: lane sums of several vectors at once (unpack and add) ---- */

/* [i0, m0, i1, m1]: the lane sums of i0, m0, i1, m1 */
static inline AI __m128i red_2x2(__m256i i0, __m256i m0, __m256i i1, __m256i m1)
{
	__m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(i0, m0), _mm256_unpackhi_epi32(i0, m0));
	__m256i b = _mm256_add_epi32(_mm256_unpacklo_epi32(i1, m1), _mm256_unpackhi_epi32(i1, m1));
	__m256i c = _mm256_add_epi32(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
	return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* [i0, i1, ., .] */
static inline AI __m128i red_2(__m256i i0, __m256i i1)
{
	__m256i a = _mm256_add_epi32(_mm256_unpacklo_epi32(i0, i1), _mm256_unpackhi_epi32(i0, i1));
	__m128i x = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
	return _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
}

/* [i0 .. i3 | m0 .. m3] (missing tokens: zero vectors) */
static inline AI __m256i red_4x2(const __m256i *i, const __m256i *m)
{
	__m256i s[4];
	_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
		const __m256i *v = k < 2 ? i : m;
		int j = 2 * (k & 1);
		s[k] = _mm256_add_epi32(_mm256_unpacklo_epi32(v[j], v[j + 1]),
					_mm256_unpackhi_epi32(v[j], v[j + 1]));
	}
	__m256i ti = _mm256_add_epi32(_mm256_unpacklo_epi64(s[0], s[1]),
				      _mm256_unpackhi_epi64(s[0], s[1]));
	__m256i tm = _mm256_add_epi32(_mm256_unpacklo_epi64(s[2], s[3]),
				      _mm256_unpackhi_epi64(s[2], s[3]));
	return _mm256_add_epi32(_mm256_blend_epi32(ti, tm, 0xf0),
				_mm256_permute2x128_si256(ti, tm, 0x21));
}

/* [i0 .. i3] */
static inline AI __m128i red_4(const __m256i *i)
{
	__m256i s0 = _mm256_add_epi32(_mm256_unpacklo_epi32(i[0], i[1]),
				      _mm256_unpackhi_epi32(i[0], i[1]));
	__m256i s1 = _mm256_add_epi32(_mm256_unpacklo_epi32(i[2], i[3]),
				      _mm256_unpackhi_epi32(i[2], i[3]));
	__m256i t = _mm256_add_epi32(_mm256_unpacklo_epi64(s0, s1), _mm256_unpackhi_epi64(s0, s1));
	return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

static inline AI float half_at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return _cvtsh_ss(h);
}

/* ---- one token: a row, two super-blocks per step -------------------------
 * Each block's float steps are the reference's: with mins
 *   S = S + ((da * d) * isum - (da * dmin) * msum),
 * without S = S + (da * d) * isum, lane by lane and in block order. */
static inline AI void kq_row(int T, int64_t nb, const uint8_t *w, const uint8_t *a, float *s,
			     struct kq_consts kc)
{
	const size_t bs = kq_bs(T);
	const int sh = kq_shift(T);
	__m128 S = _mm_setzero_ps();
	int64_t b = 0;
	for (; b + 2 <= nb; b += 2) {
		const uint8_t *wb = w + (size_t)b * bs, *ab = a + (size_t)b * Q8K_SIZE;
		__m256i i0, m0, i1, m1;
		kq_sb(T, 1, wb, ab, 0, &i0, &m0, kc);
		kq_sb(T, 1, wb + bs, ab + Q8K_SIZE, 0, &i1, &m1, kc);
		__m128 da = _mm_setr_ps(ldf(ab), ldf(ab), ldf(ab + Q8K_SIZE), ldf(ab + Q8K_SIZE));
		if (kq_min(T)) {
			__m128i x = red_2x2(i0, m0, i1, m1); /* i0, m0, i1, m1 */
			if (sh)
				x = _mm_srav_epi32(x, _mm_setr_epi32(sh, 0, sh, 0));
			__m128i dp = _mm_unpacklo_epi32(_mm_cvtsi32_si128(ld32(wb + kq_d(T))),
							_mm_cvtsi32_si128(ld32(wb + bs + kq_d(T))));
			__m128 p = _mm_mul_ps(_mm_mul_ps(da, _mm_cvtph_ps(dp)), _mm_cvtepi32_ps(x));
			__m128 t = _mm_sub_ps(p, _mm_movehdup_ps(p)); /* block 0, ., block 1, . */
			S = _mm_add_ss(S, t);
			S = _mm_add_ss(S, _mm_movehl_ps(t, t));
		} else {
			__m128i x = red_2(i0, i1); /* i0, i1 */
			if (sh)
				x = _mm_srai_epi32(x, sh);
			__m128 dd = _mm_setr_ps(half_at(wb + kq_d(T)), 0.0f,
						half_at(wb + bs + kq_d(T)), 0.0f);
			__m128 p = _mm_mul_ps(_mm_mul_ps(da, dd),
					      _mm_cvtepi32_ps(_mm_unpacklo_epi32(x, x)));
			S = _mm_add_ss(S, p);
			S = _mm_add_ss(S, _mm_movehl_ps(p, p));
		}
	}
	if (b < nb) {
		const uint8_t *wb = w + (size_t)b * bs, *ab = a + (size_t)b * Q8K_SIZE;
		__m256i i0, m0;
		kq_sb(T, 1, wb, ab, 0, &i0, &m0, kc);
		__m128 da = _mm_set1_ps(ldf(ab));
		if (kq_min(T)) {
			__m128i x = red_2x2(i0, m0, _mm256_setzero_si256(), _mm256_setzero_si256());
			if (sh)
				x = _mm_srav_epi32(x, _mm_setr_epi32(sh, 0, sh, 0));
			__m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(ld32(wb + kq_d(T))));
			__m128 p = _mm_mul_ps(_mm_mul_ps(da, dd), _mm_cvtepi32_ps(x));
			S = _mm_add_ss(S, _mm_sub_ss(p, _mm_movehdup_ps(p)));
		} else {
			__m128i x = red_2(i0, _mm256_setzero_si256());
			if (sh)
				x = _mm_srai_epi32(x, sh);
			__m128 p = _mm_mul_ss(_mm_mul_ss(da, _mm_set_ss(half_at(wb + kq_d(T)))),
					      _mm_cvtepi32_ps(x));
			S = _mm_add_ss(S, p);
		}
	}
	_mm_store_ss(s, S);
}

/* ---- a tile: one row x NT (2..KQ_TOKENS) tokens ---------------------------- */

/* The activation scales of tokens 4q .. 4q + 3 at super-block b, twice:
 * [da_0 .. da_3 | da_0 .. da_3] (missing tokens 0). */
static inline AI __m256 tile_da(int NT, int q, const uint8_t *ab, size_t a_stride)
{
	float d[4] = {0, 0, 0, 0};
	_Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
		if (4 * q + u < NT)
			d[u] = ldf(ab + (size_t)(4 * q + u) * a_stride);
	__m128 x = _mm_loadu_ps(d);
	return _mm256_set_m128(x, x);
}

static inline AI void kq_tile(int T, int NT, int64_t nb, const uint8_t *w, const uint8_t *a,
			      size_t a_stride, float *s, size_t s_stride, struct kq_consts kc)
{
	const size_t bs = kq_bs(T);
	const int sh = kq_shift(T);
	const int NQ = (NT + 3) / 4; /* token quads: one float vector each */
	const __m256i z = _mm256_setzero_si256();
	__m128 S[KQ_TOKENS / 4];
	_Pragma("GCC unroll 2") for (int q = 0; q < NQ; q++)
		S[q] = _mm_setzero_ps();
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *wb = w + (size_t)b * bs, *ab = a + (size_t)b * Q8K_SIZE;
		__m256i ia[KQ_TOKENS], ma[KQ_TOKENS];
		_Pragma("GCC unroll 8") for (int t = 0; t < 4 * NQ; t++)
			ia[t] = ma[t] = z;
		kq_sb(T, NT, wb, ab, a_stride, ia, ma, kc);
		_Pragma("GCC unroll 2") for (int q = 0; q < NQ; q++) {
			__m256 da = tile_da(NT, q, ab, a_stride);
			if (kq_min(T)) {
				__m256i r = red_4x2(ia + 4 * q, ma + 4 * q); /* isum | msum */
				if (sh) /* the isums, not the msums */
					r = _mm256_srav_epi32(
						r, _mm256_setr_epi32(sh, sh, sh, sh, 0, 0, 0, 0));
				__m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(ld32(wb + kq_d(T))));
				__m256 d4 = _mm256_set_m128(_mm_permute_ps(dd, 0x55),
							    _mm_permute_ps(dd, 0x00));
				__m256 p = _mm256_mul_ps(_mm256_mul_ps(da, d4),
							 _mm256_cvtepi32_ps(r));
				S[q] = _mm_add_ps(S[q], _mm_sub_ps(_mm256_castps256_ps128(p),
								   _mm256_extractf128_ps(p, 1)));
			} else {
				__m128i r = red_4(ia + 4 * q);
				if (sh)
					r = _mm_srai_epi32(r, sh);
				__m128 dd = _mm_mul_ps(_mm256_castps256_ps128(da),
						       _mm_set1_ps(half_at(wb + kq_d(T))));
				S[q] = _mm_add_ps(S[q], _mm_mul_ps(dd, _mm_cvtepi32_ps(r)));
			}
		}
	}
	float v[KQ_TOKENS];
	_Pragma("GCC unroll 2") for (int q = 0; q < NQ; q++)
		_mm_storeu_ps(v + 4 * q, S[q]);
	_Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)
		s[(size_t)t * s_stride] = v[t];
}

/* ---- entry points ----------------------------------------------------------- */

/* One token's activation row for K_IQ4XP: per pair of 32-element sub-blocks
 * the two first halves, then the two second halves (d copied, bsums not).
 * Made once per gemm call, it serves every row of the call. */
#define KQ_PAIR_MAX 64 /* super-blocks; longer rows keep the plain layout */
static void kq_pair_halves(const uint8_t *a, int64_t nb, uint8_t *out)
{
	for (int64_t b = 0; b < nb; b++) {
		const uint8_t *ab = a + (size_t)b * Q8K_SIZE;
		uint8_t *ob = out + (size_t)b * Q8K_SIZE;
		memcpy(ob, ab, 4);
		for (int p = 0; p < 4; p++) {
			__m256i v0 = ldu(ab + Q8K_QS + 64 * p), v1 = ldu(ab + Q8K_QS + 64 * p + 32);
			_mm256_storeu_si256((__m256i *)(ob + Q8K_QS + 64 * p),
					    _mm256_permute2x128_si256(v0, v1, 0x20));
			_mm256_storeu_si256((__m256i *)(ob + Q8K_QS + 64 * p + 32),
					    _mm256_permute2x128_si256(v0, v1, 0x31));
		}
	}
}

/* gemm: a tile of tokens over every row (its activations stay in cache);
 * a lone token is kq_row, as vec_dot (kq_tile's NT is never 1, which only
 * spares the compiler an unused copy) */
#define KQ_TILE_(T, t, NT)                                                                 \
	for (int r = 0; r < nr; r++) {                                                     \
		if ((NT) == 1)                                                             \
			kq_row(T, nb, w + (size_t)r * w_stride, a + (size_t)(t)*a_stride,  \
			       s + (size_t)(t)*s_stride + r, kc);                          \
		else                                                                       \
			kq_tile(T, (NT) == 1 ? 2 : (NT), nb, w + (size_t)r * w_stride,     \
				a + (size_t)(t)*a_stride, a_stride,                        \
				s + (size_t)(t)*s_stride + r, s_stride, kc);               \
	}

/* The table's gemv is gemm itself: the same function for one token, which
 * also puts the decode path under test_kern_simd's gemv checks. */
#define KQ_ENTRIES(NAME, T)                                                                \
	static void vec_dot_##NAME(int64_t n, float *s, const void *w, const void *a)      \
	{                                                                                  \
		kq_row(T, n / QK_K, w, a, s, kq_consts_load(T));                           \
	}                                                                                  \
	static void gemm_##NAME(int64_t n, int nr, int nt, const void *vw, size_t w_stride, \
				const void *va, size_t a_stride, const float *aux,         \
				size_t aux_stride, float *s, size_t s_stride)              \
	{                                                                                  \
		const uint8_t *w = vw, *a = va;                                            \
		int64_t nb = n / QK_K;                                                     \
		struct kq_consts kc = kq_consts_load(T);                                   \
		(void)aux;                                                                 \
		(void)aux_stride;                                                          \
		if ((T) == K_IQ4X && nt == 1 && nb <= KQ_PAIR_MAX) {                       \
			uint8_t ap[KQ_PAIR_MAX * Q8K_SIZE];                                \
			kq_pair_halves(a, nb, ap);                                         \
			for (int r = 0; r < nr; r++)                                       \
				kq_row(K_IQ4XP, nb, w + (size_t)r * w_stride, ap,          \
				       s + r, kc);                                         \
			return;                                                            \
		}                                                                          \
		KERN_TILES(nt, KQ_TOKENS, KQ_TILE_, T);                                    \
	}

KQ_ENTRIES(q2_K, K_Q2)
KQ_ENTRIES(q3_K, K_Q3)
KQ_ENTRIES(q5_K, K_Q5)
KQ_ENTRIES(iq4_xs, K_IQ4X)

const struct kern_ops kern_avx2_kq_ops = {
	.name = "avx2",
	.t = {
		[ENGINE_DTYPE_Q2_K] = { .act_type = ENGINE_DTYPE_Q8_K, .vec_dot = vec_dot_q2_K,
					.gemm = gemm_q2_K, .gemv = gemm_q2_K },
		[ENGINE_DTYPE_Q3_K] = { .act_type = ENGINE_DTYPE_Q8_K, .vec_dot = vec_dot_q3_K,
					.gemm = gemm_q3_K, .gemv = gemm_q3_K },
		[ENGINE_DTYPE_Q5_K] = { .act_type = ENGINE_DTYPE_Q8_K, .vec_dot = vec_dot_q5_K,
					.gemm = gemm_q5_K, .gemv = gemm_q5_K },
		[ENGINE_DTYPE_IQ4_XS] = { .act_type = ENGINE_DTYPE_Q8_K, .vec_dot = vec_dot_iq4_xs,
					  .gemm = gemm_iq4_xs, .gemv = gemm_iq4_xs },
	},
};
