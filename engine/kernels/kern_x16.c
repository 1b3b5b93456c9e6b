/* engine/kernels/kern_x16.c: the x16 repacked weight layout (kern.h) and
 * its scalar reference kernel.
 *
 * Why repack: a decode kernel over the file's layout reads 16 rows as 16
 * separate streams and must collapse each row's block products with
 * horizontal adds (kern_avx512.c, gemv_*). In the x16 layout one 64-byte
 * load gives 4 elements of each of 16 rows in the lanes where vpdpbusd
 * accumulates them, so the 16 outputs of a panel build up in one register
 * and the panel is one forward stream (cpu-kernels.md §2: the interleaved
 * layouts of the fastest engines). The layout is the same size as the
 * rows it replaces, so repacking happens in place.
 *
 * Built without ISA flags, like kern_generic.c. */
#include "engine/kernels/kern.h"

#include "engine/kernels/formats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool kern_x16_supported(uint32_t type)
{
	switch (type) {
	case ENGINE_DTYPE_Q4_0:
	case ENGINE_DTYPE_Q4_1:
	case ENGINE_DTYPE_Q5_0:
	case ENGINE_DTYPE_Q5_1:
	case ENGINE_DTYPE_IQ4_NL:
	case ENGINE_DTYPE_Q8_0:
	case ENGINE_DTYPE_Q4_K:
	case ENGINE_DTYPE_Q5_K:
	case ENGINE_DTYPE_Q6_K:
	case ENGINE_DTYPE_IQ4_XS:
	case ENGINE_DTYPE_Q3_K:
	case ENGINE_DTYPE_Q2_K: return true;
	default: return false;
	}
}

/* Bytes of codes and of metadata per block of a 16-row panel; blocks are
 * the type's own (32 elements, or 256 for the K-quants). */
static size_t codes_per_block(uint32_t type)
{
	switch (type) {
	case ENGINE_DTYPE_Q4_0:
	case ENGINE_DTYPE_Q4_1:
	case ENGINE_DTYPE_IQ4_NL: return 256;
	case ENGINE_DTYPE_Q5_0:
	case ENGINE_DTYPE_Q5_1: return 320; /* the Q4 nibbles, then 8 bit masks */
	case ENGINE_DTYPE_Q8_0: return 512;
	case ENGINE_DTYPE_Q4_K:
	case ENGINE_DTYPE_IQ4_XS: return 2048;
	case ENGINE_DTYPE_Q5_K: return 2560; /* 4 x (512 of nibbles, 128 of masks) */
	case ENGINE_DTYPE_Q3_K: return 1536; /* 2 x (512 of 2-bit codes, 256 of masks) */
	case ENGINE_DTYPE_Q2_K: return 1024;
	default: return 3072; /* Q6_K */
	}
}

static size_t meta_per_block(uint32_t type)
{
	switch (type) {
	case ENGINE_DTYPE_Q4_0:
	case ENGINE_DTYPE_Q5_0:
	case ENGINE_DTYPE_IQ4_NL:
	case ENGINE_DTYPE_Q8_0: return 32;
	case ENGINE_DTYPE_Q4_1:
	case ENGINE_DTYPE_Q5_1: return 64; /* 16 scales, then 16 mins */
	case ENGINE_DTYPE_Q4_K:
	case ENGINE_DTYPE_Q5_K: return 256;
	case ENGINE_DTYPE_IQ4_XS: return 128; /* 16 d, 64 scales_l, 32 scales_h */
	case ENGINE_DTYPE_Q3_K: return 224; /* 16 d, 192 scale bytes */
	case ENGINE_DTYPE_Q2_K: return 320; /* 16 d, 16 dmin, 256 scale bytes */
	default: return 288; /* Q6_K */
	}
}

/* The 8 bit planes of the 8 bytes at p: byte b of the result holds bit b
 * of each byte (bit m from p[m]), an 8x8 bit transpose. The fifth / high
 * bits of 8 consecutive elements, for the masks of Q5_K and Q3_K (a load's
 * repack moves every byte through here). */
static inline uint64_t bit_planes8(const uint8_t *p)
{
	uint64_t x, t;
	memcpy(&x, p, 8);
	t = (x ^ (x >> 7)) & 0x00aa00aa00aa00aaull;
	x = x ^ t ^ (t << 7);
	t = (x ^ (x >> 14)) & 0x0000cccc0000ccccull;
	x = x ^ t ^ (t << 14);
	t = (x ^ (x >> 28)) & 0x00000000f0f0f0f0ull;
	return x ^ t ^ (t << 28);
}

/* Q5_K's qh and Q3_K's hmask (32 bytes, hb) and their panel masks: before
 * the moves, pl gets the bit planes of hb's 4 groups of 8 bytes (pack), or
 * hb is cleared for the bits to be ORed back (unpack). */
static inline __attribute__((always_inline)) void x16_masks_begin(bool pack, uint8_t *hb,
								  uint64_t pl[4])
{
	if (pack)
		for (int q = 0; q < 4; q++)
			pl[q] = bit_planes8(hb + 8 * q);
	else
		memset(hb, 0, 32);
}

/* One nibble of a panel mask byte `mb` (the nibble of row r): the bit
 * `bit` of hb's elements 4i .. 4i + 3, one way or the other. */
static inline __attribute__((always_inline)) void x16_mask_nibble(bool pack, uint8_t *mb,
								  const uint64_t pl[4], int bit,
								  int i, int r, uint8_t *hb)
{
	uint8_t sh = (uint8_t)(4 * (r & 1));
	if (pack) {
		/* elements 4i .. 4i + 3: a nibble of the plane of elements
		 * 8(i/2) .. */
		uint8_t v = (uint8_t)(pl[i / 2] >> (8 * bit + 4 * (i & 1)));
		*mb = (uint8_t)((*mb & ~(0x0f << sh)) | ((v & 0x0f) << sh));
	} else {
		for (int k = 0; k < 4; k++)
			hb[4 * i + k] |= (uint8_t)(((*mb >> (sh + k)) & 1) << bit);
	}
}

/* Move one block of row r between the native layout (`blk`) and the panel
 * (codes `pc`, metadata `pm` of that block); `pack` says which way. Every
 * byte of the block has exactly one place in the panel (kern.h). */
static inline __attribute__((always_inline)) void x16_block(uint32_t type, bool pack,
							    uint8_t *blk, uint8_t *pc,
							    uint8_t *pm, int r)
{
#define MOVE(nat, pan, len)                         \
	do {                                        \
		if (pack)                           \
			memcpy((pan), (nat), (len)); \
		else                                \
			memcpy((nat), (pan), (len)); \
	} while (0)
	switch (type) {
	case ENGINE_DTYPE_Q4_0:
	case ENGINE_DTYPE_IQ4_NL: {
		/* the same bytes: d, then 16 bytes of nibbles */
		struct block_q4_0 *x = (struct block_q4_0 *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		for (int j = 0; j < 4; j++)
			MOVE(x->qs + 4 * j, pc + j * 64 + 4 * r, 4);
		break;
	}
	case ENGINE_DTYPE_Q4_1: {
		struct block_q4_1 *x = (struct block_q4_1 *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		MOVE(&x->m, pm + 32 + 2 * r, 2);
		for (int j = 0; j < 4; j++)
			MOVE(x->qs + 4 * j, pc + j * 64 + 4 * r, 4);
		break;
	}
	case ENGINE_DTYPE_Q5_0:
	case ENGINE_DTYPE_Q5_1: {
		bool one = type == ENGINE_DTYPE_Q5_1;
		uint8_t *qs = blk + (one ? 8 : 6), *qh = blk + (one ? 4 : 2);
		MOVE(blk, pm + 2 * r, 2);
		if (one)
			MOVE(blk + 2, pm + 32 + 2 * r, 2);
		for (int j = 0; j < 4; j++)
			MOVE(qs + 4 * j, pc + j * 64 + 4 * r, 4);
		/* the 5th bits as the 64-bit masks of the 8 code vectors:
		 * vector g (elements 4g..4g+3 for g < 4, 16 + 4(g-4).. else),
		 * bit 4r + i for element i of row r, so that a kernel ORs
		 * 0x10 into the code bytes under a mask register */
		uint8_t *m = pc + 256;
		for (int g = 0; g < 8; g++) {
			uint8_t *mb = m + 8 * g + r / 2, sh = (uint8_t)(4 * (r & 1));
			int e0 = g < 4 ? 4 * g : 16 + 4 * (g - 4);
			if (pack) {
				uint8_t bits = (uint8_t)((qh[e0 / 8] >> (e0 % 8)) & 0x0f);
				*mb = (uint8_t)((*mb & ~(0x0f << sh)) | (bits << sh));
			} else {
				uint8_t bits = (uint8_t)((*mb >> sh) & 0x0f);
				qh[e0 / 8] = (uint8_t)((qh[e0 / 8] & ~(0x0f << (e0 % 8))) |
						       (bits << (e0 % 8)));
			}
		}
		break;
	}
	case ENGINE_DTYPE_Q8_0: {
		struct block_q8_0 *x = (struct block_q8_0 *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		/* four codes at a time: the load's repack moves every byte of
		 * a Q8_0 model through here */
		for (int g = 0; g < 8; g++) {
			uint32_t v;
			uint8_t *c = pc + g * 64 + 4 * r;
			memcpy(&v, pack ? (uint8_t *)x->qs + 4 * g : c, 4);
			v ^= 0x80808080u;
			memcpy(pack ? c : (uint8_t *)x->qs + 4 * g, &v, 4);
		}
		break;
	}
	case ENGINE_DTYPE_Q4_K: {
		struct block_q4_K *x = (struct block_q4_K *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		MOVE(&x->dmin, pm + 32 + 2 * r, 2);
		for (int k = 0; k < K_SCALE_SIZE; k++)
			MOVE(&x->scales[k], pm + 64 + 16 * k + r, 1);
		for (int j = 0; j < 4; j++)
			for (int i = 0; i < 8; i++)
				MOVE(x->qs + 32 * j + 4 * i, pc + j * 512 + i * 64 + 4 * r, 4);
		break;
	}
	case ENGINE_DTYPE_Q5_K: {
		/* Q4_K's metadata; Q4_K's nibbles in chunks of 640 bytes, each
		 * followed by the 16 bit masks of its code vectors: chunk j,
		 * vector i, h = 0 (low nibbles, sub-block 2j) or 1 (high,
		 * 2j + 1): 8 bytes at 640j + 512 + 16i + 8h, bit 4r + k for row
		 * r's element 64j + 32h + 4i + k, whose 5th bit is bit 2j + h
		 * of qh[4i + k] */
		struct block_q5_K *x = (struct block_q5_K *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		MOVE(&x->dmin, pm + 32 + 2 * r, 2);
		for (int k = 0; k < K_SCALE_SIZE; k++)
			MOVE(&x->scales[k], pm + 64 + 16 * k + r, 1);
		for (int j = 0; j < 4; j++)
			for (int i = 0; i < 8; i++)
				MOVE(x->qs + 32 * j + 4 * i, pc + j * 640 + i * 64 + 4 * r, 4);
		uint64_t pl[4] = { 0 }; /* the planes of qh's elements 8q .. 8q + 7 */
		x16_masks_begin(pack, x->qh, pl);
		for (int j = 0; j < 4; j++)
			for (int i = 0; i < 8; i++)
				for (int h = 0; h < 2; h++)
					x16_mask_nibble(pack, pc + j * 640 + 512 + 16 * i + 8 * h + r / 2,
							pl, 2 * j + h, i, r, x->qh);
		break;
	}
	case ENGINE_DTYPE_IQ4_XS: {
		/* sub-block ib (32 elements) as a Q4_0 block's codes at 256 ib:
		 * vector g, byte 4r + i is qs[16 ib + 4g + i] (low nibble:
		 * element 32 ib + 4g + i, high: + 16); d at 2r, scales_l byte k
		 * at 32 + 16k + r, scales_h's low byte at 96 + r, high at 112 + r */
		struct block_iq4_xs *x = (struct block_iq4_xs *)blk;
		uint8_t *sh = (uint8_t *)&x->scales_h;
		MOVE(&x->d, pm + 2 * r, 2);
		for (int k = 0; k < QK_K / 64; k++)
			MOVE(&x->scales_l[k], pm + 32 + 16 * k + r, 1);
		MOVE(sh, pm + 96 + r, 1);
		MOVE(sh + 1, pm + 112 + r, 1);
		for (int ib = 0; ib < QK_K / 32; ib++)
			for (int g = 0; g < 4; g++)
				MOVE(x->qs + 16 * ib + 4 * g, pc + ib * 256 + g * 64 + 4 * r, 4);
		break;
	}
	case ENGINE_DTYPE_Q3_K: {
		/* half h (elements 128h ..) at 768h: 8 vectors of the 2-bit
		 * codes, byte 64i + 4r + k is qs[32h + 4i + k] of row r (bits 2g,
		 * 2g + 1: element 128h + 32g + 4i + k), then the high bits as
		 * the 64-bit masks of the 32 code vectors: (g, i) at 512 + 64g +
		 * 8i, bit 4r + k is bit 4h + g of hmask[4i + k]; d at 2r, scale
		 * byte k at 32 + 16k + r */
		struct block_q3_K *x = (struct block_q3_K *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		for (int k = 0; k < 12; k++)
			MOVE(&x->scales[k], pm + 32 + 16 * k + r, 1);
		for (int h = 0; h < 2; h++)
			for (int i = 0; i < 8; i++)
				MOVE(x->qs + 32 * h + 4 * i, pc + 768 * h + 64 * i + 4 * r, 4);
		uint64_t pl[4] = { 0 }; /* as Q5_K's */
		x16_masks_begin(pack, x->hmask, pl);
		for (int h = 0; h < 2; h++)
			for (int g = 0; g < 4; g++)
				for (int i = 0; i < 8; i++)
					x16_mask_nibble(pack, pc + 768 * h + 512 + 64 * g + 8 * i + r / 2,
							pl, 4 * h + g, i, r, x->hmask);
		break;
	}
	case ENGINE_DTYPE_Q2_K: {
		/* Q3_K's 2-bit codes without the masks (halves 512 bytes
		 * apart); d at 2r, dmin at 32 + 2r, the scale bytes in pairs:
		 * scales[2p + s] at 64 + 32p + 2r + s, so that one widening to
		 * int16 gives each row's (2p, 2p + 1) pair in its dword */
		struct block_q2_K *x = (struct block_q2_K *)blk;
		MOVE(&x->d, pm + 2 * r, 2);
		MOVE(&x->dmin, pm + 32 + 2 * r, 2);
		for (int j = 0; j < QK_K / 16; j++)
			MOVE(&x->scales[j], pm + 64 + 32 * (j / 2) + 2 * r + (j & 1), 1);
		for (int h = 0; h < 2; h++)
			for (int i = 0; i < 8; i++)
				MOVE(x->qs + 32 * h + 4 * i, pc + 512 * h + 64 * i + 4 * r, 4);
		break;
	}
	default: { /* Q6_K */
		struct block_q6_K *x = (struct block_q6_K *)blk;
		for (int j = 0; j < QK_K / 16; j++)
			MOVE(&x->scales[j], pm + 16 * j + r, 1);
		MOVE(&x->d, pm + 256 + 2 * r, 2);
		for (int h = 0; h < 2; h++)
			for (int i = 0; i < 8; i++) {
				uint8_t *ph = pc + h * 1536 + i * 64 + 4 * r;
				MOVE(x->ql + 64 * h + 4 * i, ph, 4);
				MOVE(x->ql + 64 * h + 32 + 4 * i, ph + 512, 4);
				MOVE(x->qh + 32 * h + 4 * i, ph + 1024, 4);
			}
		break;
	}
	}
#undef MOVE
}

static inline __attribute__((always_inline)) void
x16_move_t(uint32_t type, bool pack, uint8_t *rows, size_t row_stride, int64_t n, uint8_t *panel)
{
	const struct dtype_info *di = quant_dtype_get(type);
	int64_t nb = n / di->blck;
	size_t cb = codes_per_block(type), mb = meta_per_block(type);
	for (int r = 0; r < KERN_X16_ROWS; r++)
		for (int64_t b = 0; b < nb; b++)
			x16_block(type, pack, rows + (size_t)r * row_stride + (size_t)b * di->size,
				  KERN_X16_CODES(panel, nb, cb, mb, b),
				  KERN_X16_META(panel, nb, cb, mb, b), r);
}

/* One copy of the loop per type and direction, so that each block's moves
 * compile to a few loads and stores: a load's repack moves every byte of
 * the model through here. */
static void x16_move(uint32_t type, bool pack, uint8_t *rows, size_t row_stride, int64_t n,
		     uint8_t *panel)
{
#define X16_MOVE_CASE(T)                                                  \
	case T:                                                           \
		if (pack)                                                 \
			x16_move_t(T, true, rows, row_stride, n, panel);  \
		else                                                      \
			x16_move_t(T, false, rows, row_stride, n, panel); \
		break;
	switch (type) {
	X16_MOVE_CASE(ENGINE_DTYPE_Q4_0)
	X16_MOVE_CASE(ENGINE_DTYPE_Q4_1)
	X16_MOVE_CASE(ENGINE_DTYPE_Q5_0)
	X16_MOVE_CASE(ENGINE_DTYPE_Q5_1)
	X16_MOVE_CASE(ENGINE_DTYPE_IQ4_NL)
	X16_MOVE_CASE(ENGINE_DTYPE_Q8_0)
	X16_MOVE_CASE(ENGINE_DTYPE_Q4_K)
	X16_MOVE_CASE(ENGINE_DTYPE_Q5_K)
	X16_MOVE_CASE(ENGINE_DTYPE_IQ4_XS)
	X16_MOVE_CASE(ENGINE_DTYPE_Q3_K)
	X16_MOVE_CASE(ENGINE_DTYPE_Q2_K)
	default: X16_MOVE_CASE(ENGINE_DTYPE_Q6_K)
	}
#undef X16_MOVE_CASE
}

void kern_x16_unpack_row(uint32_t type, const void *panel, int64_t n, int r, void *row)
{
	const struct dtype_info *di = quant_dtype_get(type);
	int64_t nb = n / di->blck;
	size_t cb = codes_per_block(type), mb = meta_per_block(type);
	uint8_t *p = (uint8_t *)(uintptr_t)panel; /* only read when unpacking */
	for (int64_t b = 0; b < nb; b++)
		x16_block(type, false, (uint8_t *)row + (size_t)b * di->size,
			  KERN_X16_CODES(p, nb, cb, mb, b), KERN_X16_META(p, nb, cb, mb, b), r);
}

void kern_x16_pack(uint32_t type, const void *rows, size_t row_stride, int64_t n, void *panel)
{
	/* x16_move only reads `rows` when packing */
	x16_move(type, true, (uint8_t *)(uintptr_t)rows, row_stride, n, panel);
}

void kern_x16_unpack(uint32_t type, const void *panel, int64_t n, void *rows, size_t row_stride)
{
	x16_move(type, false, rows, row_stride, n, (uint8_t *)(uintptr_t)panel);
}

/* The code of row r, element e of a panel block: unsigned (Q8_0 as q + 128,
 * Q5 with its 5th bit), IQ4_NL's codebook index. */
static int code_at(uint32_t type, const uint8_t *pb, int r, int e)
{
	if (type == ENGINE_DTYPE_Q8_0)
		return pb[(e / 4) * 64 + 4 * r + e % 4];
	int lo = e < 16, k = lo ? e : e - 16;
	uint8_t byte = pb[(k / 4) * 64 + 4 * r + k % 4];
	int c = lo ? byte & 0x0f : byte >> 4;
	if (type == ENGINE_DTYPE_Q5_0 || type == ENGINE_DTYPE_Q5_1) {
		int g = (lo ? 0 : 4) + k / 4, bit = 4 * r + k % 4;
		c |= ((pb[256 + 8 * g + bit / 8] >> (bit % 8)) & 1) << 4;
	}
	return c;
}

/* The signed weight value (before scales) a code stands for. */
static int value_of(uint32_t type, int code)
{
	switch (type) {
	case ENGINE_DTYPE_Q4_0: return code - 8;
	case ENGINE_DTYPE_Q5_0: return code - 16;
	case ENGINE_DTYPE_Q8_0: return code - 128;
	case ENGINE_DTYPE_IQ4_NL: return quant_iq4nl_values[code];
	default: return code; /* Q4_1, Q5_1: offset by the block's min */
	}
}

/* The K-quants: their SIMD kernels finish each super-block with the scalar
 * reference's own float expression (kern_generic.c), so the reference of
 * the x16 kernel is the generic vec_dot over the unpacked rows. */
static void gemm_x16_ref_k(uint32_t type, int64_t n, int nr, int nt, const void *w,
			   size_t w_stride, const void *a, size_t a_stride, float *s,
			   size_t s_stride, bool from_s)
{
	uint8_t *rows = malloc(KERN_X16_ROWS * w_stride);
	size_t wb = quant_dtype_get(type)->size; /* bytes per super-block */
	if (!rows)
		abort(); /* a test-only oracle: no way to report */
	for (int p = 0; p < nr / KERN_X16_ROWS; p++) {
		kern_x16_unpack(type, (const uint8_t *)w + (size_t)p * KERN_X16_ROWS * w_stride, n,
				rows, w_stride);
		/* one super-block at a time, added to the accumulator (0, or
		 * s with from_s): vec_dot's own sum (0 + the first block's
		 * term, + the next, ...), which a K-segment continues */
		for (int t = 0; t < nt; t++)
			for (int r = 0; r < KERN_X16_ROWS; r++) {
				float *o = &s[(size_t)t * s_stride + (size_t)p * KERN_X16_ROWS + r];
				if (!from_s)
					*o = 0.0f;
				for (int64_t b = 0; b < n / QK_K; b++) {
					float x;
					const uint8_t *wr =
						rows + (size_t)r * w_stride + (size_t)b * wb;
					const uint8_t *ar =
						(const uint8_t *)a + (size_t)t * a_stride +
						(size_t)b * sizeof(struct block_q8_K);
					kern_generic_ops.t[type].vec_dot(QK_K, &x, wr, ar);
					*o = *o + x;
				}
			}
	}
	free(rows);
}

void kern_gemm_x16_ref(uint32_t type, int64_t n, int nr, int nt, const void *w,
		       size_t w_stride, const void *a, size_t a_stride, const float *aux,
		       size_t aux_stride, float *s, size_t s_stride, bool from_s)
{
	if (quant_dtype_get(type)->blck == QK_K) {
		gemm_x16_ref_k(type, n, nr, nt, w, w_stride, a, a_stride, s, s_stride, from_s);
		return;
	}
	int64_t nb = n / 32;
	size_t cb = codes_per_block(type), mb = meta_per_block(type);
	/* Q4_1 and Q5_1 read Q8_1 activations and add min x the block's s */
	bool with_min = type == ENGINE_DTYPE_Q4_1 || type == ENGINE_DTYPE_Q5_1;
	size_t ab_size = with_min ? sizeof(struct block_q8_1) : sizeof(struct block_q8_0);
	(void)aux;
	(void)aux_stride;
	for (int p = 0; p < nr / KERN_X16_ROWS; p++) {
		const uint8_t *panel = (const uint8_t *)w + (size_t)p * KERN_X16_ROWS * w_stride;
		for (int t = 0; t < nt; t++) {
			const uint8_t *at = (const uint8_t *)a + (size_t)t * a_stride;
			for (int r = 0; r < KERN_X16_ROWS; r++) {
				float *o = &s[(size_t)t * s_stride + (size_t)p * KERN_X16_ROWS + r];
				float acc = from_s ? *o : 0.0f;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *pb = KERN_X16_CODES(panel, nb, cb, mb, b);
					const uint8_t *pm = KERN_X16_META(panel, nb, cb, mb, b);
					const uint8_t *ab = at + (size_t)b * ab_size;
					const int8_t *q = (const int8_t *)ab + (with_min ? 4 : 2);
					int32_t isum = 0;
					for (int e = 0; e < 32; e++)
						isum += value_of(type, code_at(type, pb, r, e)) * q[e];
					uint16_t dh, ah;
					memcpy(&dh, pm + 2 * r, 2);
					memcpy(&ah, ab, 2);
					float dw = quant_fp16_to_f32(dh);
					float da = quant_fp16_to_f32(ah);
					if (with_min) {
						/* the block's two terms first, as vec_dot: they
						 * can be large and of opposite signs */
						uint16_t mh, sh;
						memcpy(&mh, pm + 32 + 2 * r, 2);
						memcpy(&sh, ab + 2, 2);
						float ms = quant_fp16_to_f32(mh) * quant_fp16_to_f32(sh);
						acc = acc + fmaf((float)isum, dw * da, ms);
					} else {
						acc = fmaf((float)isum, dw * da, acc);
					}
				}
				*o = acc;
			}
		}
	}
}
