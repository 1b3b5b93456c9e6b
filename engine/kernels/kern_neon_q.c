/* engine/kernels/kern_neon_q.c: aarch64 kernels for Q4_1, Q5_0, Q5_1 and
 * IQ4_NL (Q8_0/Q8_1 activations), Q2_K, Q3_K, Q5_K and IQ4_XS (Q8_K), in
 * the part tables kern_neon_q_ops and kern_neon_dotprod_q_ops that
 * kern_select.c lays over the "neon" and "neon-dotprod" tables.
 *
 * Each type has a tile kernel (gemm: nr rows x nt tokens) and a vec_dot,
 * which is that kernel on one row and one token. The kernel takes tokens
 * in tiles of 4 (kern_tiles.h) and, inside a tile, the rows one by one:
 * each weight block is unpacked once into int8 codes and dotted against
 * the tile's tokens, whose activations (4 rows, a few KB per 1000
 * elements) stay in L1 while the rows stream from L2.
 *
 * Arithmetic: every block sum is an exact int32 (sdot in the dotprod
 * table; smull, smlal2 and sadalp in the plain one), and the float steps
 * are kern_generic.c's, in its order, one lane per token: a product and a
 * sum per block (no fused multiply-add; -std=c11 keeps GCC from
 * contracting), the K-quants' expression per super-block. So every entry
 * gives the scalar reference's result bit for bit, whatever nt, nr and
 * the tiling, and decode (gemm with nt == 1, matmul.c) gives the same bits
 * as a batch. The accumulation is one chain per (row, token), as the
 * reference's; what runs in parallel is the tokens of a tile (the lanes)
 * and, in decode, consecutive blocks' integer work, which is many times the
 * chain's float add per block.
 *
 * gemv stays NULL: decode runs gemm with nt == 1, the same code as vec_dot.
 *
 * The two tables come from one text: the kernel part at the end of this
 * file is included twice, once for plain NEON (every armv8-a core: A53,
 * A72) and once with the dotprod target attribute on each function
 * (armv8.2-a: A55, A76, Graviton 2+), the file's flags staying armv8-a.
 * GCC will not inline vdotq_s32 into a function without that target, so
 * a kernel that takes its dot as a parameter could not serve both. A
 * helper both share has no target attribute, so it inlines into either. */
#ifndef KERN_NEON_Q_KERNELS

#include "engine/kernels/kern.h"
#include "engine/kernels/kern_tiles.h"

#include "engine/kernels/formats.h"

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#define DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#define INLINE inline __attribute__((always_inline))
#define Q_TOKENS 4 /* tokens per tile: one float lane each */
/* Over the tokens of a tile: unrolled, so that per-token vectors stay in
 * registers (GCC kept a loop over NT = 4 and the vectors on the stack). */
#define FOR_TOKENS(t, NT) _Pragma("GCC unroll 4") for (int t = 0; t < (NT); t++)

/* ---- helpers both tables share ------------------------------------------ */

/* A half at p (blocks are unaligned); fcvt is exact, as quant_fp16_to_f32. */
static INLINE float f16(const uint8_t *p)
{
	__fp16 h;
	memcpy(&h, p, 2);
	return h;
}

static INLINE uint16_t ld16(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return h;
}

static INLINE float ldf(const uint8_t *p)
{
	float f;
	memcpy(&f, p, 4);
	return f;
}

/* Lane t: the half at p + t * stride, for the NT tokens of a tile (0 past). */
static INLINE float32x4_t f16_lanes(int NT, const uint8_t *p, size_t stride)
{
	uint16x4_t h = {ld16(p), NT > 1 ? ld16(p + stride) : 0, NT > 2 ? ld16(p + 2 * stride) : 0,
			NT > 3 ? ld16(p + 3 * stride) : 0};
	return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* Lane t: the float at p + t * stride (Q8_K's d). */
static INLINE float32x4_t f32_lanes(int NT, const uint8_t *p, size_t stride)
{
	float32x4_t f = {ldf(p), NT > 1 ? ldf(p + stride) : 0.0f,
			 NT > 2 ? ldf(p + 2 * stride) : 0.0f, NT > 3 ? ldf(p + 3 * stride) : 0.0f};
	return f;
}

/* Lane t: the sum of p[t]'s lanes (t < NT; 0 past). Exact in int32. */
static INLINE int32x4_t hsum_lanes(int NT, const int32x4_t *p)
{
	const int32x4_t z = vdupq_n_s32(0);
	int32x4_t p01 = vpaddq_s32(p[0], NT > 1 ? p[1] : z);
	int32x4_t p23 = NT > 2 ? vpaddq_s32(p[2], NT > 3 ? p[3] : z) : z;
	return vpaddq_s32(p01, p23);
}

/* s[t * s_stride] = lane t, t < NT. */
static INLINE void store_lanes(int NT, float32x4_t v, float *s, size_t s_stride)
{
	float o[4];
	vst1q_f32(o, v);
	FOR_TOKENS(t, NT)
		s[(size_t)t * s_stride] = o[t];
}

/* The plain table's dot of 16 int8 pairs into acc: products of two bytes
 * summed in int16 (|w a| <= 127 * 128 for every code here, two of them fit),
 * then pairwise into int32. */
static INLINE int32x4_t dot16_mull(int32x4_t acc, int8x16_t w, int8x16_t a)
{
	int16x8_t p = vmull_s8(vget_low_s8(w), vget_low_s8(a));
	return vpadalq_s16(acc, vmlal_high_s8(p, w, a));
}

/* 16 int8 values to int32, stored at o[0..15] (sub-block scales). */
static INLINE void store_s8_s32(int32_t *o, int8x16_t v)
{
	int16x8_t l = vmovl_s8(vget_low_s8(v)), h = vmovl_high_s8(v);
	vst1q_s32(o, vmovl_s16(vget_low_s16(l)));
	vst1q_s32(o + 4, vmovl_high_s16(l));
	vst1q_s32(o + 8, vmovl_s16(vget_low_s16(h)));
	vst1q_s32(o + 12, vmovl_high_s16(h));
}

/* ---- the 32-element blocks ------------------------------------------------
 * One kernel text for four types, `k` a constant after inlining. Weight
 * codes become int8: Q4_1 and Q5_1 unsigned (their minimum is the m * s
 * term), Q5_0 minus 16, IQ4_NL through its codebook (tbl). */
enum q32 { Q32_Q4_1, Q32_Q5_0, Q32_Q5_1, Q32_IQ4_NL };

static INLINE size_t q32_wsize(enum q32 k)
{
	return k == Q32_Q4_1   ? sizeof(struct block_q4_1)
	       : k == Q32_Q5_0 ? sizeof(struct block_q5_0)
	       : k == Q32_Q5_1 ? sizeof(struct block_q5_1)
			       : sizeof(struct block_iq4_nl);
}

/* Q4_1 and Q5_1 pair with Q8_1 activations (d, s, qs), the others with Q8_0. */
static INLINE bool q32_q8_1(enum q32 k)
{
	return k == Q32_Q4_1 || k == Q32_Q5_1;
}

/* The 5th bits of a Q5 block as 0xff bytes (0 where clear): bit e of the
 * LE u32 at qh is element e's. Each byte of qh is spread over 8 lanes (tbl),
 * then tested against that lane's bit. */
static INLINE void q5_high(const uint8_t *qh, uint8x16_t *lo, uint8x16_t *hi)
{
	static const uint8_t idx[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
					2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
	static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
	uint32_t h;
	memcpy(&h, qh, 4);
	uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(h)), b = vld1q_u8(bit);
	*lo = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(idx)), b);
	*hi = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(idx + 16)), b);
}

/* Block b's codes: elements 0..15 in lo, 16..31 in hi. */
static INLINE void q32_unpack(enum q32 k, const uint8_t *b, int8x16_t tab, int8x16_t *lo,
			      int8x16_t *hi)
{
	const uint8x16_t m4 = vdupq_n_u8(0x0f), sixteen = vdupq_n_u8(0x10);
	if (k == Q32_IQ4_NL) {
		uint8x16_t q = vld1q_u8(b + offsetof(struct block_iq4_nl, qs));
		*lo = vqtbl1q_s8(tab, vandq_u8(q, m4));
		*hi = vqtbl1q_s8(tab, vshrq_n_u8(q, 4));
		return;
	}
	if (k == Q32_Q4_1) {
		uint8x16_t q = vld1q_u8(b + offsetof(struct block_q4_1, qs));
		*lo = vreinterpretq_s8_u8(vandq_u8(q, m4));
		*hi = vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
		return;
	}
	bool q50 = k == Q32_Q5_0;
	uint8x16_t q, hl, hh;
	q = vld1q_u8(b + (q50 ? offsetof(struct block_q5_0, qs) : offsetof(struct block_q5_1, qs)));
	q5_high(b + (q50 ? offsetof(struct block_q5_0, qh) : offsetof(struct block_q5_1, qh)), &hl,
		&hh);
	uint8x16_t l = vandq_u8(q, m4), h = vshrq_n_u8(q, 4);
	if (q50) { /* (nibble | bit << 4) - 16: nibble - 16 where the bit is clear */
		*lo = vreinterpretq_s8_u8(vsubq_u8(l, vbicq_u8(sixteen, hl)));
		*hi = vreinterpretq_s8_u8(vsubq_u8(h, vbicq_u8(sixteen, hh)));
	} else {
		*lo = vreinterpretq_s8_u8(vorrq_u8(l, vandq_u8(hl, sixteen)));
		*hi = vreinterpretq_s8_u8(vorrq_u8(h, vandq_u8(hh, sixteen)));
	}
}

/* ---- K-quant scales -------------------------------------------------------- */

/* Q3_K: the 16 signed 6-bit scales of quant_scale_q3_K. Low nibbles: bytes
 * 0..7 (scales 0..7), their high nibbles (8..15); the 2 high bits of scale
 * i: bits 2(i/4).. of byte 8 + i%4. Reads the 12 bytes only. */
static INLINE int8x16_t q3_K_scales(const uint8_t *sc)
{
	static const int8_t shr[16] = {0, 0, 0, 0, -2, -2, -2, -2, -4, -4, -4, -4, -6, -6, -6, -6};
	uint8x8_t l8 = vld1_u8(sc);
	uint8x16_t lo = vcombine_u8(vand_u8(l8, vdup_n_u8(0x0f)), vshr_n_u8(l8, 4));
	uint32_t x;
	memcpy(&x, sc + 8, 4);
	uint8x16_t hi = vshlq_u8(vreinterpretq_u8_u32(vdupq_n_u32(x)), vld1q_s8(shr));
	hi = vshlq_n_u8(vandq_u8(hi, vdupq_n_u8(3)), 4);
	return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, hi)), vdupq_n_s8(32));
}

/* Q4_K/Q5_K: the 8 scales and 8 mins of quant_scale_min_k4, bytes j. In
 * 32-bit words u0..u2 of the 12 bytes: j < 4 the low 6 bits of u0 (scales)
 * and u1 (mins); j >= 4 a nibble of u2, over the top 2 bits of u0 or u1. */
static INLINE void k4_scales(const uint8_t *q, uint8x8_t *sc, uint8x8_t *mn)
{
	uint32_t u[3];
	memcpy(u, q, 12);
	uint32_t sl = u[0] & 0x3f3f3f3f, ml = u[1] & 0x3f3f3f3f;
	uint32_t sh = (u[2] & 0x0f0f0f0f) | ((u[0] >> 2) & 0x30303030);
	uint32_t mh = ((u[2] >> 4) & 0x0f0f0f0f) | ((u[1] >> 2) & 0x30303030);
	*sc = vcreate_u8((uint64_t)sh << 32 | sl);
	*mn = vcreate_u8((uint64_t)mh << 32 | ml);
}

/* IQ4_XS: the 8 scales (ls - 32): nibble ib of scales_l over bits 2ib, 2ib+1
 * of scales_h. */
static INLINE int8x8_t iq4_xs_scales(const uint8_t *b)
{
	static const uint8_t idx[8] = {0, 0, 0, 0, 1, 1, 1, 1};
	static const int8_t shr[8] = {0, -2, -4, -6, 0, -2, -4, -6};
	uint32_t l;
	memcpy(&l, b + offsetof(struct block_iq4_xs, scales_l), 4);
	uint8x8_t lv = vcreate_u8(l);
	uint8x8_t nib = vzip1_u8(vand_u8(lv, vdup_n_u8(0x0f)), vshr_n_u8(lv, 4));
	uint16_t h = ld16(b + offsetof(struct block_iq4_xs, scales_h));
	uint8x8_t hv = vtbl1_u8(vreinterpret_u8_u16(vdup_n_u16(h)), vld1_u8(idx));
	hv = vshl_u8(hv, vld1_s8(shr));
	hv = vshl_n_u8(vand_u8(hv, vdup_n_u8(3)), 4);
	return vsub_s8(vreinterpret_s8_u8(vorr_u8(nib, hv)), vdup_n_s8(32));
}

/* Token t's Q8_K block at ai (token 0's), and its codes. */
static INLINE const uint8_t *q8k_at(const uint8_t *ai, size_t a_stride, int t)
{
	return ai + (size_t)t * a_stride;
}

static INLINE const int8_t *q8k_qs(const uint8_t *ai, size_t a_stride, int t)
{
	return (const int8_t *)(q8k_at(ai, a_stride, t) + offsetof(struct block_q8_K, qs));
}

static INLINE const int16_t *q8k_bsums(const uint8_t *ab)
{
	return (const int16_t *)(const void *)(ab + offsetof(struct block_q8_K, bsums));
}

/* The Q8_K activation's 16-element sums, paired into the 8 sums of 32. */
static INLINE int16x8_t bsums32(const uint8_t *ab)
{
	const int16_t *bs = q8k_bsums(ab);
	return vpaddq_s16(vld1q_s16(bs), vld1q_s16(bs + 8));
}

/* The K-quants' float step per super-block, lane t for token t: */
/* Q2_K, Q5_K: acc + (da * d * isum - da * dmin * msum) */
static INLINE float32x4_t k_min_step(float32x4_t acc, float32x4_t da, float d, float dmin,
				     int32x4_t isum, int32x4_t msum)
{
	float32x4_t x = vmulq_f32(vmulq_n_f32(da, d), vcvtq_f32_s32(isum));
	float32x4_t y = vmulq_f32(vmulq_n_f32(da, dmin), vcvtq_f32_s32(msum));
	return vaddq_f32(acc, vsubq_f32(x, y));
}

/* Q3_K, IQ4_XS: acc + (da * d) * isum */
static INLINE float32x4_t k_step(float32x4_t acc, float32x4_t da, float d, int32x4_t isum)
{
	return vaddq_f32(acc, vmulq_f32(vmulq_n_f32(da, d), vcvtq_f32_s32(isum)));
}

/* ---- the kernels, twice ------------------------------------------------------ */

#define KERN_NEON_Q_KERNELS
/* plain NEON: widening products */
#define TPL(name) name
#define TPL_ATTR
#define DOT16(acc, w, a) dot16_mull(acc, w, a)
#include "engine/kernels/kern_neon_q.c"
#undef TPL
#undef TPL_ATTR
#undef DOT16
/* dotprod: sdot */
#define TPL(name) name##_dp
#define TPL_ATTR DOTPROD
#define DOT16(acc, w, a) vdotq_s32(acc, w, a)
#include "engine/kernels/kern_neon_q.c"
#undef TPL
#undef TPL_ATTR
#undef DOT16

/* ---- tables -------------------------------------------------------------- */

#define Q_ENTRY(T, ACT, SFX)                                                       \
	[ENGINE_DTYPE_##T] = { .act_type = ENGINE_DTYPE_##ACT, .vec_dot = vec_dot_##T##SFX, \
			       .gemm = gemm_##T##SFX }

const struct kern_ops kern_neon_q_ops = {
	.name = "neon",
	.t = {
		Q_ENTRY(Q4_1, Q8_1, ),
		Q_ENTRY(Q5_0, Q8_0, ),
		Q_ENTRY(Q5_1, Q8_1, ),
		Q_ENTRY(IQ4_NL, Q8_0, ),
		Q_ENTRY(Q2_K, Q8_K, ),
		Q_ENTRY(Q3_K, Q8_K, ),
		Q_ENTRY(Q5_K, Q8_K, ),
		Q_ENTRY(IQ4_XS, Q8_K, ),
	},
};

const struct kern_ops kern_neon_dotprod_q_ops = {
	.name = "neon-dotprod",
	.t = {
		Q_ENTRY(Q4_1, Q8_1, _dp),
		Q_ENTRY(Q5_0, Q8_0, _dp),
		Q_ENTRY(Q5_1, Q8_1, _dp),
		Q_ENTRY(IQ4_NL, Q8_0, _dp),
		Q_ENTRY(Q2_K, Q8_K, _dp),
		Q_ENTRY(Q3_K, Q8_K, _dp),
		Q_ENTRY(Q5_K, Q8_K, _dp),
		Q_ENTRY(IQ4_XS, Q8_K, _dp),
	},
};

#else /* KERN_NEON_Q_KERNELS: the kernel part, once per table ------------- */

/* A tile: one weight row (nb blocks at w) against NT <= Q_TOKENS tokens
 * (activation rows a_stride bytes apart), s[t * s_stride] = the dot with
 * token t. */

/* Q4_1, Q5_0, Q5_1, IQ4_NL, block b (ai: token 0's activation block):
 * lane t of acc + (d_w d_t) isum_t (+ m_w s_t for the Q8_1 pairs), the
 * reference's expression. */
static INLINE TPL_ATTR float32x4_t TPL(q32_block)(enum q32 k, int NT, const uint8_t *b,
						  const uint8_t *ai, size_t a_stride, int8x16_t tab,
						  float32x4_t acc)
{
	const size_t aq =
		q32_q8_1(k) ? offsetof(struct block_q8_1, qs) : offsetof(struct block_q8_0, qs);
	int8x16_t lo, hi;
	q32_unpack(k, b, tab, &lo, &hi);
	int32x4_t p[Q_TOKENS];
	FOR_TOKENS(t, NT) {
		const int8_t *q = (const int8_t *)(ai + (size_t)t * a_stride + aq);
		p[t] = DOT16(DOT16(vdupq_n_s32(0), lo, vld1q_s8(q)), hi, vld1q_s8(q + 16));
	}
	float32x4_t dd = vmulq_n_f32(f16_lanes(NT, ai, a_stride), f16(b));
	float32x4_t x = vmulq_f32(dd, vcvtq_f32_s32(hsum_lanes(NT, p)));
	if (q32_q8_1(k)) /* m_w * s_a */
		x = vaddq_f32(x, vmulq_n_f32(f16_lanes(NT, ai + 2, a_stride), f16(b + 2)));
	return vaddq_f32(acc, x);
}

static INLINE TPL_ATTR void TPL(tile_q32)(enum q32 k, int64_t nb, int NT, const uint8_t *w,
					  const uint8_t *a, size_t a_stride, float *s,
					  size_t s_stride)
{
	const size_t wb = q32_wsize(k);
	const size_t ab = q32_q8_1(k) ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);
	const int8x16_t tab = vld1q_s8(quant_iq4nl_values);
	float32x4_t acc = vdupq_n_f32(0);
	int64_t i = 0;
	/* decode: two blocks per step, so that an in-order core (A55) has the
	 * second block's integer work to issue beside the first's */
	for (; NT == 1 && i + 2 <= nb; i += 2) {
		acc = TPL(q32_block)(k, NT, w + (size_t)i * wb, a + (size_t)i * ab, a_stride, tab,
				     acc);
		acc = TPL(q32_block)(k, NT, w + (size_t)(i + 1) * wb, a + (size_t)(i + 1) * ab,
				     a_stride, tab, acc);
	}
	for (; i < nb; i++)
		acc = TPL(q32_block)(k, NT, w + (size_t)i * wb, a + (size_t)i * ab, a_stride, tab,
				     acc);
	store_lanes(NT, acc, s, s_stride);
}

#define Q32_TILE(T, K)                                                                      \
	static INLINE TPL_ATTR void TPL(tile_##T)(int64_t nb, int NT, const uint8_t *w,     \
						  const uint8_t *a, size_t a_stride, float *s, \
						  size_t s_stride)                            \
	{                                                                                   \
		TPL(tile_q32)(K, nb, NT, w, a, a_stride, s, s_stride);                      \
	}
Q32_TILE(Q4_1, Q32_Q4_1)
Q32_TILE(Q5_0, Q32_Q5_0)
Q32_TILE(Q5_1, Q32_Q5_1)
Q32_TILE(IQ4_NL, Q32_IQ4_NL)
#undef Q32_TILE

/* The K-quants: per super-block an exact int32 isum per token (lanes of
 * int32x4, each sub-block's dot times its scale), reduced into lane t,
 * then the reference's float expression on the lanes. Sub-block scales
 * are widened to int32 once per row and super-block (sc[]), for every
 * token of the tile. */

/* Q2_K and Q3_K (q3) share their 2-bit layout: element 128h + 32g + l is
 * bits 2g of qs[32h + l], in sub-block j = 8h + 2g + l/16 (below, chunk
 * c = 4h + g of 32 elements). Q2_K: scale and min the nibbles of
 * scales[j]. Q3_K: minus 4 where bit c of hmask[l] is clear, signed 6-bit
 * scales, no min. */
static INLINE TPL_ATTR void TPL(tile_k2)(bool q3, int64_t nb, int NT, const uint8_t *w,
					 const uint8_t *a, size_t a_stride, float *s,
					 size_t s_stride)
{
	const size_t wb = q3 ? sizeof(struct block_q3_K) : sizeof(struct block_q2_K);
	const size_t oq = q3 ? offsetof(struct block_q3_K, qs) : offsetof(struct block_q2_K, qs);
	const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
	float32x4_t acc = vdupq_n_f32(0);
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *b = w + (size_t)i * wb;
		const uint8_t *ai = a + (size_t)i * sizeof(struct block_q8_K);
		int32_t sc[16];
		int32x4_t isum[Q_TOKENS], msum[Q_TOKENS];
		uint8x16_t h0 = vdupq_n_u8(0), h1 = h0, bit = vdupq_n_u8(1);
		if (q3) {
			store_s8_s32(sc, q3_K_scales(b + offsetof(struct block_q3_K, scales)));
			h0 = vld1q_u8(b + offsetof(struct block_q3_K, hmask));
			h1 = vld1q_u8(b + offsetof(struct block_q3_K, hmask) + 16);
		} else {
			uint8x16_t v = vld1q_u8(b + offsetof(struct block_q2_K, scales));
			store_s8_s32(sc, vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))));
			uint8x16_t mn = vshrq_n_u8(v, 4);
			int16x8_t m0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
			int16x8_t m1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
			FOR_TOKENS(t, NT) {
				const int16_t *bs = q8k_bsums(q8k_at(ai, a_stride, t));
				int16x8_t b0 = vld1q_s16(bs), b1 = vld1q_s16(bs + 8);
				int32x4_t m = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
				m = vmlal_high_s16(m, m0, b0);
				m = vmlal_s16(m, vget_low_s16(m1), vget_low_s16(b1));
				msum[t] = vmlal_high_s16(m, m1, b1);
			}
		}
		FOR_TOKENS(t, NT)
			isum[t] = vdupq_n_s32(0);
		uint8x16_t q0 = vdupq_n_u8(0), q1 = q0;
		for (int c = 0; c < 8; c++) { /* elements 32c.., sub-blocks 2c, 2c + 1 */
			if (c % 4 == 0) { /* h = c / 4 */
				q0 = vld1q_u8(b + oq + 8 * c);
				q1 = vld1q_u8(b + oq + 8 * c + 16);
			}
			uint8x16_t c0 = vandq_u8(q0, m3), c1 = vandq_u8(q1, m3);
			q0 = vshrq_n_u8(q0, 2);
			q1 = vshrq_n_u8(q1, 2);
			if (q3) {
				c0 = vsubq_u8(c0, vbicq_u8(four, vtstq_u8(h0, bit)));
				c1 = vsubq_u8(c1, vbicq_u8(four, vtstq_u8(h1, bit)));
				bit = vshlq_n_u8(bit, 1);
			}
			int8x16_t w0 = vreinterpretq_s8_u8(c0), w1 = vreinterpretq_s8_u8(c1);
			int32x4_t s0 = vld1q_dup_s32(sc + 2 * c);
			int32x4_t s1 = vld1q_dup_s32(sc + 2 * c + 1);
			FOR_TOKENS(t, NT) {
				const int8_t *q = q8k_qs(ai, a_stride, t) + 32 * c;
				int32x4_t z = vdupq_n_s32(0);
				isum[t] = vmlaq_s32(isum[t], DOT16(z, w0, vld1q_s8(q)), s0);
				isum[t] = vmlaq_s32(isum[t], DOT16(z, w1, vld1q_s8(q + 16)), s1);
			}
		}
		float32x4_t da = f32_lanes(NT, ai, a_stride);
		if (q3)
			acc = k_step(acc, da, f16(b + offsetof(struct block_q3_K, d)),
				     hsum_lanes(NT, isum));
		else
			acc = k_min_step(acc, da, f16(b + offsetof(struct block_q2_K, d)),
					 f16(b + offsetof(struct block_q2_K, dmin)),
					 hsum_lanes(NT, isum), hsum_lanes(NT, msum));
	}
	store_lanes(NT, acc, s, s_stride);
}

static INLINE TPL_ATTR void TPL(tile_Q2_K)(int64_t nb, int NT, const uint8_t *w, const uint8_t *a,
					   size_t a_stride, float *s, size_t s_stride)
{
	TPL(tile_k2)(false, nb, NT, w, a, a_stride, s, s_stride);
}

static INLINE TPL_ATTR void TPL(tile_Q3_K)(int64_t nb, int NT, const uint8_t *w, const uint8_t *a,
					   size_t a_stride, float *s, size_t s_stride)
{
	TPL(tile_k2)(true, nb, NT, w, a, a_stride, s, s_stride);
}

/* Q5_K: sub-block j of 32 is nibble j%2 of qs[32(j/2) + l] over bit j of
 * qh[l]; mins against the activation's sums of 32. */
static INLINE TPL_ATTR void TPL(tile_Q5_K)(int64_t nb, int NT, const uint8_t *w, const uint8_t *a,
					   size_t a_stride, float *s, size_t s_stride)
{
	const uint8x16_t m4 = vdupq_n_u8(0x0f), sixteen = vdupq_n_u8(0x10);
	float32x4_t acc = vdupq_n_f32(0);
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *b = w + (size_t)i * sizeof(struct block_q5_K);
		const uint8_t *ai = a + (size_t)i * sizeof(struct block_q8_K);
		uint8x8_t sc8, mn8;
		k4_scales(b + offsetof(struct block_q5_K, scales), &sc8, &mn8);
		int32_t sc[16];
		store_s8_s32(sc, vreinterpretq_s8_u8(vcombine_u8(sc8, vdup_n_u8(0))));
		int16x8_t mn = vreinterpretq_s16_u16(vmovl_u8(mn8));
		int32x4_t isum[Q_TOKENS], msum[Q_TOKENS];
		FOR_TOKENS(t, NT) {
			int16x8_t bs = bsums32(q8k_at(ai, a_stride, t));
			int32x4_t m = vmull_s16(vget_low_s16(mn), vget_low_s16(bs));
			msum[t] = vmlal_high_s16(m, mn, bs);
			isum[t] = vdupq_n_s32(0);
		}
		const uint8_t *qh = b + offsetof(struct block_q5_K, qh);
		uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16), bit = vdupq_n_u8(1);
		uint8x16_t r0 = vdupq_n_u8(0), r1 = r0;
		for (int j = 0; j < 8; j++) {
			if (j % 2 == 0) { /* the 32 bytes of sub-blocks j and j + 1 */
				r0 = vld1q_u8(b + offsetof(struct block_q5_K, qs) + 16 * j);
				r1 = vld1q_u8(b + offsetof(struct block_q5_K, qs) + 16 * j + 16);
			}
			uint8x16_t q0 = j % 2 ? vshrq_n_u8(r0, 4) : vandq_u8(r0, m4);
			uint8x16_t q1 = j % 2 ? vshrq_n_u8(r1, 4) : vandq_u8(r1, m4);
			int8x16_t w0 = vreinterpretq_s8_u8(
				vorrq_u8(q0, vandq_u8(vtstq_u8(h0, bit), sixteen)));
			int8x16_t w1 = vreinterpretq_s8_u8(
				vorrq_u8(q1, vandq_u8(vtstq_u8(h1, bit), sixteen)));
			bit = vshlq_n_u8(bit, 1);
			int32x4_t sj = vld1q_dup_s32(&sc[j]);
			FOR_TOKENS(t, NT) {
				const int8_t *q = q8k_qs(ai, a_stride, t) + 32 * j;
				int32x4_t p = DOT16(vdupq_n_s32(0), w0, vld1q_s8(q));
				p = DOT16(p, w1, vld1q_s8(q + 16));
				isum[t] = vmlaq_s32(isum[t], p, sj);
			}
		}
		acc = k_min_step(acc, f32_lanes(NT, ai, a_stride),
				 f16(b + offsetof(struct block_q5_K, d)),
				 f16(b + offsetof(struct block_q5_K, dmin)), hsum_lanes(NT, isum),
				 hsum_lanes(NT, msum));
	}
	store_lanes(NT, acc, s, s_stride);
}

/* IQ4_XS: sub-block ib of 32 is the codebook at the nibbles of
 * qs[16ib + l] (low: l, high: 16 + l), scale ls - 32. */
static INLINE TPL_ATTR void TPL(tile_IQ4_XS)(int64_t nb, int NT, const uint8_t *w,
					     const uint8_t *a, size_t a_stride, float *s,
					     size_t s_stride)
{
	const int8x16_t tab = vld1q_s8(quant_iq4nl_values);
	const uint8x16_t m4 = vdupq_n_u8(0x0f);
	float32x4_t acc = vdupq_n_f32(0);
	for (int64_t i = 0; i < nb; i++) {
		const uint8_t *b = w + (size_t)i * sizeof(struct block_iq4_xs);
		const uint8_t *ai = a + (size_t)i * sizeof(struct block_q8_K);
		int32_t sc[16];
		store_s8_s32(sc, vcombine_s8(iq4_xs_scales(b), vdup_n_s8(0)));
		int32x4_t isum[Q_TOKENS];
		FOR_TOKENS(t, NT)
			isum[t] = vdupq_n_s32(0);
		for (int ib = 0; ib < 8; ib++) {
			uint8x16_t q = vld1q_u8(b + offsetof(struct block_iq4_xs, qs) + 16 * ib);
			int8x16_t w0 = vqtbl1q_s8(tab, vandq_u8(q, m4));
			int8x16_t w1 = vqtbl1q_s8(tab, vshrq_n_u8(q, 4));
			int32x4_t sj = vld1q_dup_s32(&sc[ib]);
			FOR_TOKENS(t, NT) {
				const int8_t *qa = q8k_qs(ai, a_stride, t) + 32 * ib;
				int32x4_t p = DOT16(vdupq_n_s32(0), w0, vld1q_s8(qa));
				p = DOT16(p, w1, vld1q_s8(qa + 16));
				isum[t] = vmlaq_s32(isum[t], p, sj);
			}
		}
		acc = k_step(acc, f32_lanes(NT, ai, a_stride),
			     f16(b + offsetof(struct block_iq4_xs, d)), hsum_lanes(NT, isum));
	}
	store_lanes(NT, acc, s, s_stride);
}

/* The entries of type T (QK elements per block): gemm takes tokens in tiles
 * of Q_TOKENS, inside a tile the rows one by one; vec_dot is the tile of
 * one row and one token. */
#define Q_ROWS(TILE, t, NT)                                                                  \
	for (int r = 0; r < nr; r++)                                                         \
		TILE(nb, NT, w + (size_t)r * w_stride, a + (size_t)(t) * a_stride, a_stride, \
		     s + (size_t)(t) * s_stride + r, s_stride)
#define Q_ENTRIES(T, QK)                                                                    \
	static TPL_ATTR void TPL(gemm_##T)(int64_t n, int nr, int nt, const void *vw,       \
					   size_t w_stride, const void *va, size_t a_stride, \
					   const float *aux, size_t aux_stride, float *s,   \
					   size_t s_stride)                                 \
	{                                                                                   \
		const uint8_t *w = vw, *a = va;                                             \
		int64_t nb = n / (QK);                                                      \
		(void)aux;                                                                  \
		(void)aux_stride;                                                           \
		KERN_TILES(nt, Q_TOKENS, Q_ROWS, TPL(tile_##T));                            \
	}                                                                                   \
	static TPL_ATTR void TPL(vec_dot_##T)(int64_t n, float *s, const void *w,           \
					      const void *a)                                \
	{                                                                                   \
		TPL(tile_##T)(n / (QK), 1, w, a, 0, s, 0);                                  \
	}

Q_ENTRIES(Q4_1, QK4_1)
Q_ENTRIES(Q5_0, QK5_0)
Q_ENTRIES(Q5_1, QK5_1)
Q_ENTRIES(IQ4_NL, QK4_NL)
Q_ENTRIES(Q2_K, QK_K)
Q_ENTRIES(Q3_K, QK_K)
Q_ENTRIES(Q5_K, QK_K)
Q_ENTRIES(IQ4_XS, QK_K)

#undef Q_ROWS
#undef Q_ENTRIES

#endif /* KERN_NEON_Q_KERNELS */
