/* engine/kernels/kern_avx2_q32.c: AVX2 kernels for the 32-element weight
 * types read in ggml's own layout (no repacking): Q4_1 and Q5_1 (Q8_1
 * activations), Q5_0 and IQ4_NL (Q8_0 activations). A part table of the
 * avx2 variant (kern_select.c): built with -mavx2 -mfma -mf16c, no LTO.
 *
 * Every entry computes, per (row, token), the same float sequence:
 *   term_b = (d_w * d_a) * isum_b (+ m_w * s_a for Q4_1/Q5_1)
 * with isum_b the block's exact integer sum, which is the reference's own
 * expression, rounding for rounding (no FMA); lane j of an 8-lane vector
 * sums the terms of blocks b = j mod 8 in order, and the lanes are added
 * in the tree ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Only that order
 * differs from kern_generic. The min term is why each block's sum must be
 * whole before its scale: the scale and min parts can be far larger than
 * the block's result, and the usual per-lane FMA of partial sums would be
 * off from the reference by more than the error budget. Decode and prefill
 * thus give a token the same bits whatever nt, nr or the tiling (kern.h);
 * how an entry gets its exact integer sums is its own business.
 *
 * vec_dot keeps each block's bytes in element order: the nibbles by one
 * variable shift of a doubled 16-byte load, Q5's fifth bits spread with
 * vpshufb, IQ4_NL's codebook with vpshufb; vpmaddubsw (Q5_0 and IQ4_NL
 * with kern_avx2.c's sign trick), then eight blocks' 16 pair sums reduced
 * together by unpacking, which leaves block k's sum in lane k.
 *
 * gemm (one token included: decode) transposes instead, so that the
 * reduction costs no shuffles per token: in a group of 8 blocks, vector J
 * holds elements 4J..4J+3 of block u in its 32-bit lane u, for the weights
 * (once per row and group, shared by the tile's tokens) and for the
 * activations (once per call, in a stack buffer shared by all rows). Then
 * 8 vpmaddubsw, int16 adds and two vpmaddwd give the 8 blocks' sums in
 * lanes. Q5_0 codes stay unsigned (0..31) and 16 sum(a) comes off per
 * block; IQ4_NL keeps the sign trick (its pair sums reach 2 x 127 x 127,
 * so they widen before they add). A tile is 1 row x up to 8 tokens, with
 * the row's accumulators kept across K-chunks of the activation buffer. */
#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>
#include <string.h>

/* The weight types, as a compile-time argument of the inline kernels. */
enum { W_Q4_1, W_Q5_0, W_Q5_1, W_IQ4_NL };

/* A gemm tile: tokens, blocks per K-chunk of its activation buffer (a
 * multiple of 8: 16 KiB for 8 tokens), and the rows whose accumulators it
 * keeps between chunks. */
#ifndef Q32_TOKENS
#define Q32_TOKENS 16
#endif
#ifndef Q32_KC
#define Q32_KC (512 / Q32_TOKENS)
#endif
#ifndef Q32_TU_PRAGMA
#define Q32_TU_PRAGMA "GCC unroll 2"
#endif
#ifndef Q32_ROWS
#define Q32_ROWS 64
#endif
#ifndef Q32_PF
#define Q32_PF 4096
#endif
#ifndef Q32_PFH
#define Q32_PFH _MM_HINT_T0
#endif

static inline int32_t ld32(const void *p)
{
	int32_t v;
	memcpy(&v, p, 4);
	return v;
}

static inline uint16_t ld16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* Layout of a type's blocks: weight block bytes, where its nibbles and fifth
 * bits start, and its activation block (Q8_1 when the type has a min). */
static inline bool has_min(int T)
{
	return T == W_Q4_1 || T == W_Q5_1;
}

static inline bool has_qh(int T)
{
	return T == W_Q5_0 || T == W_Q5_1;
}

static inline size_t w_size(int T)
{
	return T == W_Q4_1 ? 20 : T == W_Q5_0 ? 22 : T == W_Q5_1 ? 24 : 18;
}

static inline size_t qs_at(int T)
{
	return T == W_Q4_1 ? 4 : T == W_Q5_0 ? 6 : T == W_Q5_1 ? 8 : 2;
}

static inline size_t qh_at(int T)
{
	return T == W_Q5_0 ? 2 : 4;
}

static inline size_t a_size(int T)
{
	return has_min(T) ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);
}

static inline size_t aq_at(int T)
{
	return has_min(T) ? offsetof(struct block_q8_1, qs) : offsetof(struct block_q8_0, qs);
}

static inline __m256i iq4nl_book(int T)
{
	if (T != W_IQ4_NL)
		return _mm256_setzero_si256();
	return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
}

/* ---- the float steps, shared by every entry -------------------------------- */

/* f16 pairs in the 32-bit lanes of v (lane k: block k) to floats: lo the
 * first half of each, hi the second (when wanted). */
static inline __attribute__((always_inline)) void halves(__m256i v, bool two, __m256 *lo,
							 __m256 *hi)
{
	/* first halves to bytes 0-7 of each 128-bit lane, second to 8-15,
	 * then the quarters in order: [first 0..7 | second 0..7] */
	const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
					      0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
	v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, pick), 0xd8);
	*lo = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
	if (two)
		*hi = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}

/* acc += the 8 blocks' terms, (d_w d_a) isum (+ m_w s_a): the reference's
 * per-block steps, lane by lane. */
static inline __attribute__((always_inline)) __m256 term(int T, __m256i isum, __m256 dw,
							 __m256 mw, __m256 da, __m256 sa)
{
	__m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(isum));
	if (has_min(T))
		t = _mm256_add_ps(t, _mm256_mul_ps(mw, sa));
	return t;
}

static inline __attribute__((always_inline)) __m256 terms(int T, __m256 acc, __m256i isum,
							  __m256 dw, __m256 mw, __m256 da, __m256 sa)
{
	return _mm256_add_ps(acc, term(T, isum, dw, mw, da, sa));
}

/* The tree of the header: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). */
static inline float hsum8(__m256 v)
{
	v = _mm256_hadd_ps(v, v);
	v = _mm256_hadd_ps(v, v);
	return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

/* hsum8 of 8 vectors at once, lane t that of v[t]: the same additions
 * (hadd adds neighbours, the lower first), four vectors per half. */
static inline __m256 hsum8x8(const __m256 *v)
{
	__m256 h0 = _mm256_hadd_ps(v[0], v[1]), h1 = _mm256_hadd_ps(v[2], v[3]);
	__m256 h2 = _mm256_hadd_ps(v[4], v[5]), h3 = _mm256_hadd_ps(v[6], v[7]);
	__m256 q0 = _mm256_hadd_ps(h0, h1), q1 = _mm256_hadd_ps(h2, h3);
	return _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20),
			     _mm256_permute2f128_ps(q0, q1, 0x31));
}

/* ---- vec_dot: blocks in element order ---------------------------------------- */

/* The 32 nibbles of qs in element order: one 16-byte load into both halves,
 * the upper half shifted by 4 (a variable shift instead of shift + insert). */
static inline __m256i nibbles(const uint8_t *qs)
{
	__m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
	x = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
	return _mm256_and_si256(x, _mm256_set1_epi8(0x0f));
}

/* 0xff in byte e where bit e of the little-endian qh word is set: byte e
 * takes qh byte e / 8, then its bit e % 8 is tested. */
static inline __m256i fifth_bits(const uint8_t *qh)
{
	const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
						  0x0303030303030303);
	const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
	__m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(ld32(qh)), spread);
	return _mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit);
}

/* A block's 32 weights as bytes in element order: unsigned codes for
 * Q4_1/Q5_1, signed values for Q5_0 (q - 16) and IQ4_NL (the codebook). */
static inline __attribute__((always_inline)) __m256i weights(int T, const uint8_t *blk,
							     __m256i book)
{
	__m256i q = nibbles(blk + qs_at(T));
	switch (T) {
	case W_Q4_1:
		return q;
	case W_Q5_1:
		return _mm256_or_si256(q, _mm256_and_si256(fifth_bits(blk + qh_at(T)),
							   _mm256_set1_epi8(0x10)));
	case W_Q5_0:
		/* (q | 16 h) - 16: without h the byte is the nibble - 16, which
		 * is the nibble with the top four bits set; with h the nibble */
		return _mm256_or_si256(q, _mm256_andnot_si256(fifth_bits(blk + qh_at(T)),
							      _mm256_set1_epi8((char)0xf0)));
	default:
		return _mm256_shuffle_epi8(book, q);
	}
}

/* The f16 pairs at the heads of 8 blocks `stride` bytes apart (K of them,
 * 0 past K) as floats (halves()): weights (d, m) or d, activations (d, s)
 * or d. One gather: cheaper here than eight loads and inserts. */
static inline __attribute__((always_inline)) void heads8(const uint8_t *p, size_t stride, int K,
							 bool two, __m256 *lo, __m256 *hi)
{
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	const __m256i idx = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)stride));
	__m256i v;
	if (K == 8) {
		v = _mm256_i32gather_epi32((const int *)p, idx, 1);
	} else {
		__m256i on = _mm256_cmpgt_epi32(_mm256_set1_epi32(K), lane);
		v = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), (const int *)p, idx, on, 1);
	}
	halves(v, two, lo, hi);
}

/* The 16 int16 pair sums of one block against activation bytes aq. */
static inline __attribute__((always_inline)) __m256i pairs(int T, __m256i w, const uint8_t *aq)
{
	__m256i a = _mm256_loadu_si256((const __m256i *)aq);
	if (has_min(T))
		return _mm256_maddubs_epi16(w, a);
	return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

/* Lane k = the sum of p[k]'s 16 int16: two rounds of unpack-and-add pair
 * the vectors up (4 pair sums per int16: within 4 x 2 x 31 x 128 < 2^15),
 * vpmaddwd widens, one cross-lane add finishes. IQ4_NL's pair sums reach
 * 2 x 127 x 127, so it widens first. */
static inline __attribute__((always_inline)) __m256i reduce8(int T, __m256i *p)
{
	const __m256i one = _mm256_set1_epi16(1);
	__m256i y[2];
	_Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
		__m256i *q = p + 4 * h, x[2];
		if (T == W_IQ4_NL) {
			_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
				q[k] = _mm256_madd_epi16(q[k], one);
			_Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
				x[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(q[2 * i], q[2 * i + 1]),
							_mm256_unpackhi_epi32(q[2 * i], q[2 * i + 1]));
			y[h] = _mm256_add_epi32(_mm256_unpacklo_epi64(x[0], x[1]),
						_mm256_unpackhi_epi64(x[0], x[1]));
		} else {
			_Pragma("GCC unroll 2") for (int i = 0; i < 2; i++)
				x[i] = _mm256_add_epi16(_mm256_unpacklo_epi32(q[2 * i], q[2 * i + 1]),
							_mm256_unpackhi_epi32(q[2 * i], q[2 * i + 1]));
			y[h] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_unpacklo_epi64(x[0], x[1]),
								  _mm256_unpackhi_epi64(x[0], x[1])),
						 one);
		}
	}
	return _mm256_add_epi32(_mm256_permute2x128_si256(y[0], y[1], 0x20),
				_mm256_permute2x128_si256(y[0], y[1], 0x31));
}

/* K blocks (K <= 8) of a row against one token's. */
static inline __attribute__((always_inline)) __m256 row_group(int T, int K, __m256 acc,
							       const uint8_t *wg, const uint8_t *ag,
							       __m256i book)
{
	const size_t WB = w_size(T), AB = a_size(T);
	__m256i p[8];
	_Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)
		p[k] = k < K ? pairs(T, weights(T, wg + k * WB, book), ag + k * AB + aq_at(T))
			     : _mm256_setzero_si256();
	__m256 dw, mw = _mm256_setzero_ps(), da, sa = _mm256_setzero_ps();
	heads8(wg, WB, K, has_min(T), &dw, &mw);
	heads8(ag, AB, K, has_min(T), &da, &sa);
	return terms(T, acc, reduce8(T, p), dw, mw, da, sa);
}

static inline __attribute__((always_inline)) float row_dot(int T, int64_t nb, const uint8_t *w,
							   const uint8_t *a)
{
	const size_t WB = w_size(T), AB = a_size(T);
	const __m256i book = iq4nl_book(T);
	__m256 acc = _mm256_setzero_ps();
	int64_t b = 0;
	for (; b + 8 <= nb; b += 8)
		acc = row_group(T, 8, acc, w + b * WB, a + b * AB, book);
	if (b < nb)
		acc = row_group(T, (int)(nb - b), acc, w + b * WB, a + b * AB, book);
	return hsum8(acc);
}

/* ---- gemm: 8 blocks transposed --------------------------------------------- */

/* [16 bytes at p | 16 bytes at q], zeros for a half whose block is past
 * the row's end. */
static inline __attribute__((always_inline)) __m256i load2x16(bool lo_ok, bool hi_ok,
							      const uint8_t *p, const uint8_t *q)
{
	__m128i lo = lo_ok ? _mm_loadu_si128((const __m128i *)p) : _mm_setzero_si128();
	__m128i hi = hi_ok ? _mm_loadu_si128((const __m128i *)q) : _mm_setzero_si128();
	return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* In each 128-bit lane, y[j] becomes the 32-bit words j of y[0..3]. With
 * y[k] = [16 bytes of block k | of block k + 4], word j of blocks 0..7 in
 * order. */
static inline __attribute__((always_inline)) void tr4x4(__m256i *y)
{
	__m256i t0 = _mm256_unpacklo_epi32(y[0], y[1]), t1 = _mm256_unpackhi_epi32(y[0], y[1]);
	__m256i t2 = _mm256_unpacklo_epi32(y[2], y[3]), t3 = _mm256_unpackhi_epi32(y[2], y[3]);
	y[0] = _mm256_unpacklo_epi64(t0, t2);
	y[1] = _mm256_unpackhi_epi64(t0, t2);
	y[2] = _mm256_unpacklo_epi64(t1, t3);
	y[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* The qs words of a group of 8 weight blocks (K of them, zeros past K),
 * transposed: y[j] lane u = word j of block u's qs, so that its low
 * nibbles are elements 4j..4j+3 and its high ones 16+4j..16+4j+3. With
 * wg2 (decode's paired row tails, K <= 4) blocks 4..7 are the K at wg2. */
static inline __attribute__((always_inline)) void wg_words(int T, int K, const uint8_t *wg,
							   const uint8_t *wg2, __m256i *y)
{
	const size_t WB = w_size(T);
	_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
		y[k] = wg2 ? load2x16(k < K, k < K, wg + k * WB + qs_at(T), wg2 + k * WB + qs_at(T))
			   : load2x16(k < K, k + 4 < K, wg + k * WB + qs_at(T),
				      wg + (k + 4) * WB + qs_at(T));
	tr4x4(y);
}

/* The group's scales (and mins) in lanes, and for Q5 the qh words. */
static inline __attribute__((always_inline)) void wg_head(int T, int K, const uint8_t *wg,
							  const uint8_t *wg2, __m256 *dw,
							  __m256 *mw, __m256i *qh)
{
	const size_t WB = w_size(T);
	__m256i h[4];
	/* the blocks' first 16 bytes: words 0 and 1 hold d, m and qh */
	_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
		h[k] = wg2 ? load2x16(k < K, k < K, wg + k * WB, wg2 + k * WB)
			   : load2x16(k < K, k + 4 < K, wg + k * WB, wg + (k + 4) * WB);
	__m256i t0 = _mm256_unpacklo_epi32(h[0], h[1]), t2 = _mm256_unpacklo_epi32(h[2], h[3]);
	__m256i w0 = _mm256_unpacklo_epi64(t0, t2);
	*mw = _mm256_setzero_ps();
	halves(w0, has_min(T), dw, mw);
	if (has_qh(T)) {
		__m256i w1 = _mm256_unpackhi_epi64(t0, t2);
		*qh = w1;
		if (T == W_Q5_0) /* qh at byte 2: the halves of words 0 and 1 */
			*qh = _mm256_or_si256(_mm256_srli_epi32(w0, 16), _mm256_slli_epi32(w1, 16));
	}
}

/* Vector J's codes from the words: the nibbles, for Q5 the fifth bits on
 * top (element 4J + i's is bit 4 (J & 1) + i of qh byte J / 2: that byte
 * spread over each lane, its high nibble tested for odd J, its low one
 * moved up by 4 for even J, and min() makes a set bit 16), for IQ4_NL the
 * codebook values. */
static inline __attribute__((always_inline)) __m256i codes(int T, const __m256i *y, int J,
							   __m256i qh, __m256i book)
{
	const __m256i low = _mm256_set1_epi8(0x0f);
	__m256i v = J < 4 ? y[J] : _mm256_srli_epi16(y[J - 4], 4);
	v = _mm256_and_si256(v, low);
	if (has_qh(T)) {
		const __m256i lane = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0,
						       0x04040404, 0x08080808, 0x0c0c0c0c);
		const __m256i bit = _mm256_set1_epi32((int)0x80402010);
		__m256i c = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane, _mm256_set1_epi8(
									  (char)(J >> 1))));
		if (!(J & 1))
			c = _mm256_slli_epi16(c, 4);
		v = _mm256_or_si256(v, _mm256_min_epu8(_mm256_and_si256(c, bit),
							_mm256_set1_epi8(16)));
	}
	if (T == W_IQ4_NL)
		v = _mm256_shuffle_epi8(book, v);
	return v;
}

/* A group of 8 weight blocks, transposed: v[J] lane u holds elements
 * 4J..4J+3 of block u (codes(): unsigned codes, Q5_0's q + 16, or IQ4_NL's
 * values and u[J] their magnitudes); the scales (and mins) in lanes. */
struct wgroup {
	__m256i v[8], u[8];
	__m256 dw, mw;
};

static inline __attribute__((always_inline)) void wgroup_load(int T, int K, const uint8_t *wg,
							      __m256i book, struct wgroup *g)
{
	__m256i y[4], qh = _mm256_setzero_si256();
	wg_words(T, K, wg, NULL, y);
	wg_head(T, K, wg, NULL, &g->dw, &g->mw, &qh);
	_Pragma("GCC unroll 8") for (int J = 0; J < 8; J++) {
		g->v[J] = codes(T, y, J, qh, book);
		if (T == W_IQ4_NL)
			g->u[J] = _mm256_abs_epi8(g->v[J]);
	}
}

/* One group of a token's activations (q32_acts), for decode_group(). */
struct agroup {
	const __m256i *q, *qa;
	const float *d, *s;
	const int32_t *off;
};

/* The activations of a tile's K-chunk: per token t and group, the 8
 * transposed vectors; per block the scales d (and s), and for Q5_0 16
 * sum(q) (its codes' offset). */
struct q32_acts {
	__m256i q[Q32_TOKENS * Q32_KC];
	/* IQ4_NL, one token: |q|, so that decode's sign trick takes the
	 * activations' signs (no |w| per weight vector) */
	__m256i qa[Q32_TOKENS * Q32_KC];
	float d[Q32_TOKENS * Q32_KC], s[Q32_TOKENS * Q32_KC];
	int32_t off[Q32_TOKENS * Q32_KC];
	/* per token, the row's last group (blocks past nb % 8 <= 4 zero)
	 * with lanes 0-3 copied to 4-7, for the paired row tails */
	__m256i tq[Q32_TOKENS * 8], tqa[8];
	float td[Q32_TOKENS * 8], ts[Q32_TOKENS * 8];
	int32_t toff[Q32_TOKENS * 8];
};

/* Lane k = the sum of the int16 in v[k]... over all 8 J, the 4-sums of
 * each lane: the transposed layout's reduction (no shuffles). 4 pair sums
 * per int16 stay within 2^15 (pairs of at most 2 x 31 x 128). */
static inline __attribute__((always_inline)) __m256i sum_lanes(const __m256i *p)
{
	const __m256i one = _mm256_set1_epi16(1);
	__m256i s0 = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
	__m256i s1 = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
	return _mm256_add_epi32(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one));
}

static inline __attribute__((always_inline)) void acts_load(int T, int NT, const uint8_t *a,
							    size_t a_stride, int kn, int kc,
							    struct q32_acts *A)
{
	const size_t AB = a_size(T), AQ = aq_at(T);
	for (int t = 0; t < NT; t++)
		for (int g = 0; 8 * g < kn; g++) {
			const uint8_t *ag = a + (size_t)t * a_stride + (size_t)(8 * g) * AB;
			int K = kn - 8 * g < 8 ? kn - 8 * g : 8;
			__m256i *q = A->q + t * kc + 8 * g, y[4];
			_Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
				_Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)
					y[k] = load2x16(k < K, k + 4 < K, ag + k * AB + AQ + 16 * h,
							ag + (k + 4) * AB + AQ + 16 * h);
				tr4x4(y);
				_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
					q[4 * h + j] = y[j];
					if (T == W_IQ4_NL && NT == 1)
						A->qa[8 * g + 4 * h + j] = _mm256_abs_epi8(y[j]);
				}
			}
			for (int k = 0; k < 8; k++) {
				A->d[t * kc + 8 * g + k] = k < K ? _cvtsh_ss(ld16(ag + k * AB)) : 0.0f;
				if (has_min(T))
					A->s[t * kc + 8 * g + k] =
						k < K ? _cvtsh_ss(ld16(ag + k * AB + 2)) : 0.0f;
			}
			if (T == W_Q5_0) {
				__m256i p[8];
				_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
					p[j] = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q[j]);
				_mm256_storeu_si256((__m256i *)(A->off + t * kc + 8 * g),
						    _mm256_slli_epi32(sum_lanes(p), 4));
			}
			if (K <= 4) { /* the paired row tails */
				const __m256i dup = _mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3);
				int b = t * kc + 8 * g;
				_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
					A->tq[8 * t + j] = _mm256_permute2x128_si256(q[j], q[j], 0);
					if (T == W_IQ4_NL && NT == 1)
						A->tqa[j] = _mm256_abs_epi8(A->tq[j]);
				}
				_mm256_storeu_ps(A->td + 8 * t, _mm256_permutevar8x32_ps(
									_mm256_loadu_ps(A->d + b), dup));
				if (has_min(T))
					_mm256_storeu_ps(A->ts + 8 * t,
							 _mm256_permutevar8x32_ps(_mm256_loadu_ps(A->s + b),
										  dup));
				if (T == W_Q5_0)
					_mm256_storeu_si256(
						(__m256i *)(A->toff + 8 * t),
						_mm256_permutevar8x32_epi32(
							_mm256_loadu_si256((const __m256i *)(A->off + b)), dup));
			}
		}
}

/* The exact sums of a weight group's 8 blocks against one token's. */
static inline __attribute__((always_inline)) __m256i group_isum(int T, const struct wgroup *g,
								 const __m256i *q, const int32_t *off)
{
	__m256i p[8];
	if (T == W_IQ4_NL) {
		const __m256i one = _mm256_set1_epi16(1);
		_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
			p[j] = _mm256_madd_epi16(
				_mm256_maddubs_epi16(g->u[j], _mm256_sign_epi8(q[j], g->v[j])), one);
		return _mm256_add_epi32(
			_mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3])),
			_mm256_add_epi32(_mm256_add_epi32(p[4], p[5]), _mm256_add_epi32(p[6], p[7])));
	}
	_Pragma("GCC unroll 8") for (int j = 0; j < 8; j++)
		p[j] = _mm256_maddubs_epi16(g->v[j], q[j]);
	__m256i s = sum_lanes(p);
	if (T == W_Q5_0)
		s = _mm256_sub_epi32(s, _mm256_loadu_si256((const __m256i *)off));
	return s;
}

static inline struct agroup agroup_at(const struct q32_acts *A, int g)
{
	return (struct agroup){A->q + 8 * g, A->qa + 8 * g, A->d + 8 * g, A->s + 8 * g,
			       A->off + 8 * g};
}

static inline struct agroup agroup_tail(const struct q32_acts *A)
{
	return (struct agroup){A->tq, A->tqa, A->td, A->ts, A->toff};
}

/* One token (decode): a group's terms. Its codes are made and used a
 * vector at a time (a whole group's would not stay in registers). */
static inline __attribute__((always_inline)) __m256 decode_group(int T, int K, const uint8_t *wg,
								  const uint8_t *wg2,
								  struct agroup ag, __m256i book)
{
	const __m256i one = _mm256_set1_epi16(1);
	__m256i y[4], qh = _mm256_setzero_si256(), s[2];
	__m256 dw, mw;
	wg_words(T, K, wg, wg2, y);
	wg_head(T, K, wg, wg2, &dw, &mw, &qh);
	_Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
		__m256i p[4];
		_Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
			int J = 4 * h + j;
			__m256i v = codes(T, y, J, qh, book);
			if (T == W_IQ4_NL) /* |a| times sign(a) w */
				p[j] = _mm256_madd_epi16(
					_mm256_maddubs_epi16(ag.qa[J], _mm256_sign_epi8(v, ag.q[J])), one);
			else
				p[j] = _mm256_maddubs_epi16(v, ag.q[J]);
		}
		if (T == W_IQ4_NL)
			s[h] = _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
		else /* 4 pair sums per int16, as in sum_lanes() */
			s[h] = _mm256_madd_epi16(
				_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
				one);
	}
	__m256i isum = _mm256_add_epi32(s[0], s[1]);
	if (T == W_Q5_0)
		isum = _mm256_sub_epi32(isum, _mm256_loadu_si256((const __m256i *)ag.off));
	__m256 da = _mm256_loadu_ps(ag.d);
	__m256 sa = has_min(T) ? _mm256_loadu_ps(ag.s) : _mm256_setzero_ps();
	return term(T, isum, dw, mw, da, sa);
}

/* A row's whole groups (ng of them). */
static inline __attribute__((always_inline)) __m256 decode_groups(int T, int ng, const uint8_t *w,
								   const struct q32_acts *A,
								   __m256i book)
{
	const size_t WB = w_size(T);
	__m256 acc = _mm256_setzero_ps();
	for (int g = 0; g < ng; g++) {
		const uint8_t *wg = w + (size_t)(8 * g) * WB;
#if Q32_PF
		/* rows are contiguous: the stream runs on into the next ones */
		_Pragma("GCC unroll 3") for (int l = 0; l < 3; l++)
			_mm_prefetch((const char *)wg + Q32_PF + 64 * l, Q32_PFH);
#endif
		acc = _mm256_add_ps(acc, decode_group(T, 8, wg, NULL, agroup_at(A, g), book));
	}
	return acc;
}

/* Rows [0, nr), one token. A row's last K blocks (K = nb % 8) make a group
 * of their own, zeros past them; when K <= 4 (Qwen2.5 0.5B's 896 = 3 x 256
 * + 128) two rows share that group, row r's blocks in lanes 0-3 and row
 * r + 1's in 4-7 against the tail's activations twice (A->tail), and the
 * lanes are moved back to each row's 0-3: the same floats as the rows'
 * own tail groups, half the work. */
static inline __attribute__((always_inline)) void decode_rows(int T, int64_t nb, int nr,
							      const uint8_t *w, size_t w_stride,
							      const struct q32_acts *A,
							      __m256i book, float *s)
{
	const size_t WB = w_size(T);
	int ng = (int)(nb / 8), K = (int)(nb % 8), r = 0;
	const uint8_t *tail = w + (size_t)(8 * ng) * WB;
	if (K && K <= 4)
		for (; r + 2 <= nr; r += 2) {
			const uint8_t *w0 = w + (size_t)r * w_stride, *w1 = w0 + w_stride;
			__m256 a0 = decode_groups(T, ng, w0, A, book);
			__m256 a1 = decode_groups(T, ng, w1, A, book);
			__m256 t = decode_group(T, K, tail + (size_t)r * w_stride,
						tail + (size_t)(r + 1) * w_stride, agroup_tail(A), book);
			a0 = _mm256_add_ps(a0, _mm256_blend_ps(t, _mm256_setzero_ps(), 0xf0));
			a1 = _mm256_add_ps(a1, _mm256_permute2f128_ps(t, t, 0x81));
			s[r] = hsum8(a0);
			s[r + 1] = hsum8(a1);
		}
	for (; r < nr; r++) {
		const uint8_t *wr = w + (size_t)r * w_stride;
		__m256 acc = decode_groups(T, ng, wr, A, book);
		if (K)
			acc = _mm256_add_ps(acc, decode_group(T, K, wr + (size_t)(8 * ng) * WB, NULL,
							      agroup_at(A, ng), book));
		s[r] = hsum8(acc);
	}
}

/* acc[t] += token t's terms of the weight group at wg (K blocks; with
 * wg2, decode_rows()' paired tails, against the tail activations). */
static inline __attribute__((always_inline)) void
tile_group(int T, int NT, int K, const uint8_t *wg, const uint8_t *wg2, const struct q32_acts *A,
	   int kc, int g, __m256i book, __m256 *acc)
{
	struct wgroup G;
	if (wg2) {
		__m256i y[4], qh = _mm256_setzero_si256();
		wg_words(T, K, wg, wg2, y);
		wg_head(T, K, wg, wg2, &G.dw, &G.mw, &qh);
		_Pragma("GCC unroll 8") for (int J = 0; J < 8; J++) {
			G.v[J] = codes(T, y, J, qh, book);
			if (T == W_IQ4_NL)
				G.u[J] = _mm256_abs_epi8(G.v[J]);
		}
	} else {
		wgroup_load(T, K, wg, book, &G);
	}
	_Pragma(Q32_TU_PRAGMA) for (int t = 0; t < NT; t++) {
		int b = t * kc + 8 * g;
		const __m256i *q = wg2 ? A->tq + 8 * t : A->q + b;
		const int32_t *off = wg2 ? A->toff + 8 * t : A->off + b;
		__m256 da = _mm256_loadu_ps(wg2 ? A->td + 8 * t : A->d + b);
		__m256 sa = has_min(T) ? _mm256_loadu_ps(wg2 ? A->ts + 8 * t : A->s + b)
				       : _mm256_setzero_ps();
		acc[t] = terms(T, acc[t], group_isum(T, &G, q, off), G.dw, G.mw, da, sa);
	}
}

/* acc[t] += a row's whole groups of a K-chunk (ng of them). */
static inline __attribute__((always_inline)) void
tile_groups(int T, int NT, int ng, bool pf, const uint8_t *wr, const struct q32_acts *A, int kc,
	    __m256i book, __m256 *acc)
{
	const size_t WB = w_size(T);
	for (int g = 0; g < ng; g++) {
		const uint8_t *wg = wr + (size_t)(8 * g) * WB;
#if Q32_PF
		/* the weights stream on (rows are contiguous) unless a row is
		 * cut into chunks */
		if (pf)
			_Pragma("GCC unroll 3") for (int l = 0; l < 3; l++)
				_mm_prefetch((const char *)wg + Q32_PF + 64 * l, Q32_PFH);
#endif
		tile_group(T, NT, 8, wg, NULL, A, kc, g, book, acc);
	}
}

static inline __attribute__((always_inline)) void tile_store(int NT, const __m256 *acc, float *s,
							     size_t s_stride)
{
	float out[Q32_TOKENS];
	_Pragma("GCC unroll 2") for (int t = 0; t < NT; t += 8)
		_mm256_storeu_ps(out + t, hsum8x8(acc + t));
	_Pragma("GCC unroll 16") for (int t = 0; t < NT; t++)
		s[(size_t)t * s_stride] = out[t];
}

/* Rows [0, nr) against tokens [0, NT) of a tile: s[t * s_stride + r]. A
 * row's last K = nb % 8 blocks pair up with the next row's as in
 * decode_rows() when K <= 4 and the rows are whole (not chunked). */
static inline __attribute__((always_inline)) void
tile(int T, int NT, int64_t nb, int nr, const uint8_t *w, size_t w_stride, const uint8_t *a,
     size_t a_stride, float *s, size_t s_stride)
{
	const size_t WB = w_size(T), AB = a_size(T);
	const __m256i book = iq4nl_book(T);
	/* the buffer holds Q32_KC blocks of Q32_TOKENS tokens: fewer tokens
	 * take longer chunks (decode: whole rows up to 16384 elements) */
	const int kc = Q32_KC * Q32_TOKENS / NT / 8 * 8;
	struct q32_acts A;
	__m256 keep[Q32_ROWS][Q32_TOKENS];
	for (int r0 = 0; r0 < nr; r0 += Q32_ROWS) {
		int rn = nr - r0 < Q32_ROWS ? nr - r0 : Q32_ROWS;
		for (int64_t k0 = 0; k0 < nb; k0 += kc) {
			int kn = nb - k0 < kc ? (int)(nb - k0) : kc;
			bool first = k0 == 0, last = k0 + kn == nb, whole = kn == nb;
			int ng = kn / 8, K = kn % 8;
			acts_load(T, NT, a + (size_t)k0 * AB, a_stride, kn, kc, &A);
			if (NT == 1 && whole) {
				decode_rows(T, nb, rn, w + (size_t)r0 * w_stride, w_stride, &A, book,
					    s + r0);
				continue;
			}
			for (int r = 0; r < rn; r++) {
				const uint8_t *wr = w + (size_t)(r0 + r) * w_stride + (size_t)k0 * WB;
				__m256 acc[Q32_TOKENS], acc2[Q32_TOKENS];
				_Pragma("GCC unroll 16") for (int t = 0; t < Q32_TOKENS; t++)
					acc[t] = first || t >= NT ? _mm256_setzero_ps() : keep[r][t];
				tile_groups(T, NT, ng, whole, wr, &A, kc, book, acc);
				if (K && K <= 4 && whole && r + 1 < rn) {
					/* this row's and the next one's tails together */
					_Pragma("GCC unroll 16") for (int t = 0; t < Q32_TOKENS; t++)
						acc2[t] = _mm256_setzero_ps();
					tile_groups(T, NT, ng, whole, wr + w_stride, &A, kc, book, acc2);
					__m256 tt[Q32_TOKENS];
					_Pragma("GCC unroll 16") for (int t = 0; t < Q32_TOKENS; t++)
						tt[t] = _mm256_setzero_ps();
					tile_group(T, NT, K, wr + (size_t)(8 * ng) * WB,
						   wr + w_stride + (size_t)(8 * ng) * WB, &A, kc, ng, book,
						   tt);
					_Pragma("GCC unroll 16") for (int t = 0; t < NT; t++) {
						acc[t] = _mm256_add_ps(acc[t], _mm256_blend_ps(
										       tt[t], _mm256_setzero_ps(),
										       0xf0));
						acc2[t] = _mm256_add_ps(acc2[t],
									_mm256_permute2f128_ps(tt[t], tt[t],
											       0x81));
					}
					tile_store(NT, acc, s + r0 + r, s_stride);
					tile_store(NT, acc2, s + r0 + r + 1, s_stride);
					r++;
					continue;
				}
				if (K) /* the row's last blocks, zeros past them */
					tile_group(T, NT, K, wr + (size_t)(8 * ng) * WB, NULL, &A, kc, ng,
						   book, acc);
				if (!last) {
					_Pragma("GCC unroll 16") for (int t = 0; t < NT; t++)
						keep[r][t] = acc[t];
					continue;
				}
				tile_store(NT, acc, s + r0 + r, s_stride);
			}
		}
	}
}

/* KERN_TILES' CALL: the tile of NT tokens from token t. */
#define Q32_TILE(T, t, NT)                                                                   \
	tile(T, NT, nb, nr, w, w_stride, a + (size_t)(t) * a_stride, a_stride,               \
	     s + (size_t)(t) * s_stride, s_stride)

static inline __attribute__((always_inline)) void
q32_gemm(int T, int64_t n, int nr, int nt, const void *vw, size_t w_stride, const void *va,
	 size_t a_stride, float *s, size_t s_stride)
{
	const uint8_t *w = vw, *a = va;
	int64_t nb = n / 32;
#if Q32_TOKENS == 16
	/* tiles of 16, then what is left by KERN_TILES' 8 and less */
	int t16 = 0;
	for (; t16 + 16 <= nt; t16 += 16)
		Q32_TILE(T, t16, 16);
	a += (size_t)t16 * a_stride;
	s += (size_t)t16 * s_stride;
	KERN_TILES(nt - t16, 8, Q32_TILE, T);
#else
	KERN_TILES(nt, Q32_TOKENS, Q32_TILE, T);
#endif
}

/* ---- entry points ----------------------------------------------------------- */

#define Q32_ENTRIES(name, T)                                                                 \
	static void vec_dot_##name(int64_t n, float *s, const void *w, const void *a)        \
	{                                                                                    \
		*s = row_dot(T, n / 32, w, a);                                               \
	}                                                                                    \
	static void gemm_##name(int64_t n, int nr, int nt, const void *w, size_t w_stride,   \
				const void *a, size_t a_stride, const float *aux,            \
				size_t aux_stride, float *s, size_t s_stride)                \
	{                                                                                    \
		(void)aux;                                                                   \
		(void)aux_stride;                                                            \
		q32_gemm(T, n, nr, nt, w, w_stride, a, a_stride, s, s_stride);               \
	}                                                                                    \
	/* decode: gemm's own one-token path, named so that the tests run it */              \
	static void gemv_##name(int64_t n, int nr, int nt, const void *w, size_t w_stride,   \
				const void *a, size_t a_stride, const float *aux,            \
				size_t aux_stride, float *s, size_t s_stride)                \
	{                                                                                    \
		gemm_##name(n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride);  \
	}

Q32_ENTRIES(q4_1, W_Q4_1)
Q32_ENTRIES(q5_0, W_Q5_0)
Q32_ENTRIES(q5_1, W_Q5_1)
Q32_ENTRIES(iq4_nl, W_IQ4_NL)

#ifdef Q32_NO_GEMM
#define gemm_q4_1 NULL
#define gemm_q5_0 NULL
#define gemm_q5_1 NULL
#define gemm_iq4_nl NULL
#define gemv_q4_1 NULL
#define gemv_q5_0 NULL
#define gemv_q5_1 NULL
#define gemv_iq4_nl NULL
#endif
const struct kern_ops kern_avx2_q32_ops = {
	.name = "avx2",
	.t = {
		[ENGINE_DTYPE_Q4_1] = { .act_type = ENGINE_DTYPE_Q8_1, .vec_dot = vec_dot_q4_1,
					.gemm = gemm_q4_1, .gemv = gemv_q4_1 },
		[ENGINE_DTYPE_Q5_0] = { .act_type = ENGINE_DTYPE_Q8_0, .vec_dot = vec_dot_q5_0,
					.gemm = gemm_q5_0, .gemv = gemv_q5_0 },
		[ENGINE_DTYPE_Q5_1] = { .act_type = ENGINE_DTYPE_Q8_1, .vec_dot = vec_dot_q5_1,
					.gemm = gemm_q5_1, .gemv = gemv_q5_1 },
		[ENGINE_DTYPE_IQ4_NL] = { .act_type = ENGINE_DTYPE_Q8_0, .vec_dot = vec_dot_iq4_nl,
					  .gemm = gemm_iq4_nl, .gemv = gemv_iq4_nl },
	},
};
