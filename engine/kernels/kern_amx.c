/* engine/kernels/kern_amx.c: AMX-INT8 tile kernels for prefill (Sapphire
 * Rapids and later), one table: kern_amx_ops, built on avx512vnni.
 *
 * What it does. The x16 repacked layout (kern.h) stores, per block and
 * panel of 16 rows, 64-byte vectors that each hold 4 consecutive elements
 * of the 16 rows: exactly the rows of an AMX B tile (K/4 rows of N = 16
 * dwords). So a Q8_0 block's 512 bytes of codes are a B tile as they lie
 * (8 rows x 64 bytes); a Q4_0 block's 256 bytes are unpacked to the same
 * 512 bytes first (low nibbles are elements 0..15, high ones 16..31). The
 * A tile is up to 16 tokens' 32 activation codes of the block, loaded
 * straight from the Q8_0 rows (stride: the activation row). One `tdpbsud`
 * (signed activations times unsigned weight codes) gives the 16 x 16
 * integer block dots, each the integer vpdpbusd sums in kern_avx512.c;
 * the tile goes to a stack buffer, and per token the float finish is
 * x16_panel's: f = cvt(isum) - off * sum(a), acc += f * (d_w * d_a), in
 * block order. So every result is kern_gemm_x16_ref's bit for bit (kern.h),
 * whatever nt, and the variant keeps batch invariance with avx512vnni's
 * decode kernels, which it inherits with everything else.
 *
 * Below AMX_MIN_NT tokens per call the avx512vnni kernel runs (decode and
 * small batches are memory-bound; a tile pass would only add the tile
 * store and reload).
 *
 * Tested here through a software model of the tile instructions: this
 * project's box has no AMX (docs/performance.md §1). The same file built
 * with -DKERN_AMX_EMULATE replaces the six tile operations by C functions
 * that follow the instruction set reference (tile configuration, the
 * row/column rules whose violation faults, zeroing past the configured
 * size, the dword dot of signed by unsigned bytes) and check every rule
 * the hardware would fault on; tests/kernels/test_kern.c runs that build
 * through the same x16 cases as every other variant. The real build is
 * compiled here but has not run on AMX hardware: the figures in
 * docs/performance.md do not include it.
 *
 * Linux gives a process the AMX state only after
 * arch_prctl(ARCH_REQ_XCOMP_PERM); the variant is offered only when the
 * permission is already held (kern_select.c), which the tuning knob `amx`
 * requests (docs/tuning.md), and forcing the variant asks for it. */
#include "engine/kernels/kern.h"

#include "engine/kernels/formats.h"

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#ifndef AMX_MIN_NT
#define AMX_MIN_NT 16 /* not measured: no AMX here */
#endif
#define AMX_TOKENS 16 /* rows of an A and a C tile */

/* Tile numbers: C (int32 results) 0 and 1, A (activations) 2 and 3, B
 * (weights) 4 and 5; two of each so that a block's product can run while
 * the block before it is finished in the vector unit. */
#define T_C0 0
#define T_C1 1
#define T_A0 2
#define T_A1 3
#define T_B0 4
#define T_B1 5

/* ldtilecfg's 64-byte operand (palette 1: 8 tiles of up to 16 rows of 64
 * bytes); reserved bytes must be zero. */
struct amx_cfg {
	uint8_t palette;
	uint8_t start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_cfg) == 64, "ldtilecfg takes 64 bytes");

#ifdef KERN_AMX_EMULATE
/* ---- software model of the six tile operations (tests only) ---------------
 * Per thread, like the hardware's tile state. Every condition under which
 * the instruction would raise #UD or #GP aborts, so a configuration or
 * shape mistake fails the tests here instead of faulting on an AMX box. */
#include <stdio.h>
#include <stdlib.h>

static _Thread_local struct {
	bool configured;
	struct amx_cfg cfg;
	uint8_t t[8][16][64];
} amx_emu;

static void amx_emu_fault(const char *what)
{
	fprintf(stderr, "kern_amx (emulated): %s would fault\n", what);
	abort();
}

static void amx_emu_loadcfg(const void *p)
{
	struct amx_cfg c;
	memcpy(&c, p, sizeof(c));
	if (c.palette == 0) { /* palette 0: init state, no tiles */
		memset(&amx_emu, 0, sizeof(amx_emu));
		return;
	}
	if (c.palette != 1)
		amx_emu_fault("ldtilecfg: palette other than 0 or 1");
	for (int i = 0; i < 14; i++)
		if (c.reserved[i])
			amx_emu_fault("ldtilecfg: reserved byte not zero");
	for (int i = 0; i < 16; i++) {
		if (i >= 8 && (c.rows[i] || c.colsb[i]))
			amx_emu_fault("ldtilecfg: a tile past the palette's 8");
		if (c.rows[i] > 16 || c.colsb[i] > 64)
			amx_emu_fault("ldtilecfg: tile larger than 16 x 64 bytes");
		if ((c.rows[i] == 0) != (c.colsb[i] == 0))
			amx_emu_fault("ldtilecfg: tile with rows or colsb alone zero");
	}
	amx_emu.cfg = c;
	amx_emu.configured = true;
	memset(amx_emu.t, 0, sizeof(amx_emu.t));
}

static void amx_emu_check(int t)
{
	if (!amx_emu.configured || amx_emu.cfg.start_row != 0)
		amx_emu_fault("tile use without ldtilecfg");
	if (t < 0 || t > 7 || amx_emu.cfg.rows[t] == 0)
		amx_emu_fault("use of an unconfigured tile");
}

static void amx_emu_loadd(int t, const void *base, long stride)
{
	amx_emu_check(t);
	int rows = amx_emu.cfg.rows[t], colsb = amx_emu.cfg.colsb[t];
	memset(amx_emu.t[t], 0, sizeof(amx_emu.t[t]));
	for (int r = 0; r < rows; r++)
		memcpy(amx_emu.t[t][r], (const uint8_t *)base + (ptrdiff_t)r * stride,
		       (size_t)colsb);
}

static void amx_emu_stored(int t, void *base, long stride)
{
	amx_emu_check(t);
	int rows = amx_emu.cfg.rows[t], colsb = amx_emu.cfg.colsb[t];
	for (int r = 0; r < rows; r++)
		memcpy((uint8_t *)base + (ptrdiff_t)r * stride, amx_emu.t[t][r], (size_t)colsb);
}

static void amx_emu_zero(int t)
{
	amx_emu_check(t);
	memset(amx_emu.t[t], 0, sizeof(amx_emu.t[t]));
}

/* tdpbsud c, a, b: c[m].dword[n] += sum over k < a.colsb/4 and i < 4 of
 * (int8)a[m].byte[4k+i] * (uint8)b[k].byte[4n+i] */
static void amx_emu_dpbsud(int c, int a, int b)
{
	amx_emu_check(c);
	amx_emu_check(a);
	amx_emu_check(b);
	const struct amx_cfg *g = &amx_emu.cfg;
	if (c == a || c == b || a == b)
		amx_emu_fault("tdpbsud: tiles not distinct");
	if (g->colsb[c] % 4 || g->colsb[a] % 4 || g->colsb[b] % 4)
		amx_emu_fault("tdpbsud: colsb not a multiple of 4");
	if (g->rows[c] != g->rows[a] || g->colsb[a] / 4 != g->rows[b] ||
	    g->colsb[c] != g->colsb[b])
		amx_emu_fault("tdpbsud: tile shapes do not match");
	int M = g->rows[c], N = g->colsb[c] / 4, K = g->colsb[a] / 4;
	for (int m = 0; m < M; m++)
		for (int n = 0; n < N; n++) {
			int32_t acc;
			memcpy(&acc, &amx_emu.t[c][m][4 * n], 4);
			for (int k = 0; k < K; k++)
				for (int i = 0; i < 4; i++)
					acc += (int32_t)(int8_t)amx_emu.t[a][m][4 * k + i] *
					       (int32_t)amx_emu.t[b][k][4 * n + i];
			memcpy(&amx_emu.t[c][m][4 * n], &acc, 4);
		}
}

static void amx_emu_release(void)
{
	memset(&amx_emu, 0, sizeof(amx_emu));
}

#define AMX_LOADCFG(p) amx_emu_loadcfg(p)
#define AMX_LOADD(t, p, s) amx_emu_loadd(t, p, (long)(s))
#define AMX_STORED(t, p, s) amx_emu_stored(t, p, (long)(s))
#define AMX_ZERO(t) amx_emu_zero(t)
#define AMX_DPBSUD(c, a, b) amx_emu_dpbsud(c, a, b)
#define AMX_RELEASE() amx_emu_release()
#ifndef KERN_AMX_OPS /* tests/module.mk builds the model twice */
#define KERN_AMX_OPS kern_amx_emu_ops
#endif
#else
/* GCC's tile intrinsics are asm statements that do not tell the compiler
 * which memory they read (ldtilecfg names only its first 8 bytes,
 * tileloadd none): a compiler barrier before each makes the stores they
 * depend on (the configuration, an unpacked B tile) happen first. */
#define AMX_BARRIER() __asm__ volatile("" ::: "memory")
#define AMX_LOADCFG(p)                 \
	do {                           \
		AMX_BARRIER();         \
		_tile_loadconfig(p);   \
	} while (0)
#define AMX_LOADD(t, p, s)               \
	do {                             \
		AMX_BARRIER();           \
		_tile_loadd(t, p, s);    \
	} while (0)
#define AMX_STORED(t, p, s) _tile_stored(t, p, s)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBSUD(c, a, b) _tile_dpbsud(c, a, b)
#define AMX_RELEASE() _tile_release()
#define KERN_AMX_OPS kern_amx_ops
#endif

extern const struct kern_ops kern_avx512vnni_ops;
extern const struct kern_ops KERN_AMX_OPS;

/* m tokens: C and A tiles of m rows; B tiles of 8 rows (a block's 32
 * elements, 4 per row) of 16 dwords (the panel's rows). */
static void amx_config(int m)
{
	struct amx_cfg c;
	memset(&c, 0, sizeof(c));
	c.palette = 1;
	c.rows[T_C0] = c.rows[T_C1] = (uint8_t)m;
	c.colsb[T_C0] = c.colsb[T_C1] = 64;
	c.rows[T_A0] = c.rows[T_A1] = (uint8_t)m;
	c.colsb[T_A0] = c.colsb[T_A1] = 32;
	c.rows[T_B0] = c.rows[T_B1] = 8;
	c.colsb[T_B0] = c.colsb[T_B1] = 64;
	AMX_LOADCFG(&c);
}

/* Q4_0: a block's 256 bytes of nibbles to the 512 bytes of unsigned codes
 * of a B tile: row j < 4 the low nibbles of vector j (elements 4j..4j+3),
 * row 4 + j its high nibbles (elements 16 + 4j..). */
static inline void unpack_q4(const uint8_t *pb, uint8_t *out)
{
	const __m512i low = _mm512_set1_epi8(0x0f);
	for (int j = 0; j < 4; j++) {
		__m512i v = _mm512_loadu_si512(pb + 64 * j);
		_mm512_store_si512(out + 64 * j, _mm512_and_si512(v, low));
		_mm512_store_si512(out + 64 * (j + 4),
				   _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
	}
}

/* The float finish of one block for m tokens (x16_panel's steps): c is the
 * C tile as stored (row t: token t's 16 integer dots), acc the tokens'
 * running sums. */
static inline __attribute__((always_inline)) void
finish_block(int m, const int32_t *c, __m512 dw, __m512 offv, const float *aux,
	     size_t aux_stride, int64_t b, __m512 *acc)
{
	_Pragma("GCC unroll 16") for (int t = 0; t < m; t++) {
		const float *x = aux + (size_t)t * aux_stride + 2 * b;
		__m512 f = _mm512_fnmadd_ps(offv, _mm512_set1_ps(x[1]),
					    _mm512_cvtepi32_ps(_mm512_load_si512(c + 16 * t)));
		acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(dw, _mm512_set1_ps(x[0])), acc[t]);
	}
}

/* One panel of 16 rows against m <= 16 tokens whose tiles are configured
 * for m. Blocks in pairs: both products are issued (C0, C1), then block b
 * is finished from its buffer while block b + 1's product may still run.
 * No software prefetch: prefill is compute-bound, and a chunk's panels
 * come from L2 for every tile of tokens after the first. */
static inline __attribute__((always_inline)) void
amx_panel(bool q4, int m, int64_t nb, const uint8_t *panel, const uint8_t *a, size_t a_stride,
	  const float *aux, size_t aux_stride, float *s, size_t s_stride, bool from_s)
{
	const size_t cb = q4 ? 256 : 512;
	const __m512 offv = _mm512_set1_ps(q4 ? 8.0f : 128.0f);
	_Alignas(64) int32_t cbuf[2][AMX_TOKENS * 16];
	_Alignas(64) uint8_t bbuf[2][512];
	__m512 acc[AMX_TOKENS];
	for (int t = 0; t < m; t++)
		acc[t] = from_s ? _mm512_loadu_ps(s + (size_t)t * s_stride) : _mm512_setzero_ps();
	/* the activation codes of block b for the m tokens: rows a_stride apart */
	const size_t qs = offsetof(struct block_q8_0, qs);
	for (int64_t b = 0; b < nb; b += 2) {
		bool two = b + 1 < nb;
		const uint8_t *p0 = KERN_X16_CODES(panel, nb, cb, 32, b);
		const uint8_t *p1 = KERN_X16_CODES(panel, nb, cb, 32, b + 1);
		if (q4) {
			unpack_q4(p0, bbuf[0]);
			if (two)
				unpack_q4(p1, bbuf[1]);
			p0 = bbuf[0];
			p1 = bbuf[1];
		}
		AMX_LOADD(T_B0, p0, 64);
		AMX_LOADD(T_A0, a + (size_t)b * sizeof(struct block_q8_0) + qs, a_stride);
		AMX_ZERO(T_C0);
		AMX_DPBSUD(T_C0, T_A0, T_B0);
		if (two) {
			AMX_LOADD(T_B1, p1, 64);
			AMX_LOADD(T_A1, a + (size_t)(b + 1) * sizeof(struct block_q8_0) + qs,
				  a_stride);
			AMX_ZERO(T_C1);
			AMX_DPBSUD(T_C1, T_A1, T_B1);
		}
		AMX_STORED(T_C0, cbuf[0], 64);
		__m512 dw = _mm512_cvtph_ps(
			_mm256_loadu_si256((const __m256i *)KERN_X16_META(panel, nb, cb, 32, b)));
		finish_block(m, cbuf[0], dw, offv, aux, aux_stride, b, acc);
		if (two) {
			AMX_STORED(T_C1, cbuf[1], 64);
			dw = _mm512_cvtph_ps(_mm256_loadu_si256(
				(const __m256i *)KERN_X16_META(panel, nb, cb, 32, b + 1)));
			finish_block(m, cbuf[1], dw, offv, aux, aux_stride, b + 1, acc);
		}
	}
	for (int t = 0; t < m; t++)
		_mm512_storeu_ps(s + (size_t)t * s_stride, acc[t]);
}

/* Below AMX_MIN_NT tokens, avx512vnni's kernel (the file comment). */
static inline __attribute__((always_inline)) void
amx_gemm(bool q4, int64_t n, int nr, int nt, const void *vw, size_t w_stride, const void *va,
	 size_t a_stride, const float *aux, size_t aux_stride, float *s, size_t s_stride,
	 bool from_s)
{
	if (nt < AMX_MIN_NT) {
		uint32_t type = q4 ? ENGINE_DTYPE_Q4_0 : ENGINE_DTYPE_Q8_0;
		kern_avx512vnni_ops.t[type].gemm_x16(n, nr, nt, vw, w_stride, va, a_stride, aux,
						     aux_stride, s, s_stride, from_s);
		return;
	}
	const uint8_t *w = vw, *a = va;
	int64_t nb = n / 32;
	int configured = 0;
	/* token tiles outside, panels inside: one configuration per tile
	 * size, and the call's panels (a chunk: at most a group of 128 rows)
	 * stay in the core's caches for the next tile of tokens */
	for (int t0 = 0; t0 < nt; t0 += AMX_TOKENS) {
		int m = nt - t0 < AMX_TOKENS ? nt - t0 : AMX_TOKENS;
		if (m != configured) {
			amx_config(m);
			configured = m;
		}
		for (int r0 = 0; r0 + KERN_X16_ROWS <= nr; r0 += KERN_X16_ROWS) {
			const uint8_t *at = a + (size_t)t0 * a_stride;
			const float *xt = aux + (size_t)t0 * aux_stride;
			float *st = s + (size_t)t0 * s_stride + r0;
			/* full tiles with a constant count: their finish unrolls
			 * and keeps the accumulators in registers */
			if (m == AMX_TOKENS)
				amx_panel(q4, AMX_TOKENS, nb, w + (size_t)r0 * w_stride, at,
					  a_stride, xt, aux_stride, st, s_stride, from_s);
			else
				amx_panel(q4, m, nb, w + (size_t)r0 * w_stride, at, a_stride, xt,
					  aux_stride, st, s_stride, from_s);
		}
	}
	AMX_RELEASE();
}

static void gemm_x16_q4_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			  const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			  float *s, size_t s_stride, bool from_s)
{
	amx_gemm(true, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride, from_s);
}

static void gemm_x16_q8_0(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			  const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			  float *s, size_t s_stride, bool from_s)
{
	amx_gemm(false, n, nr, nt, w, w_stride, a, a_stride, aux, aux_stride, s, s_stride,
		 from_s);
}

/* Only the tile kernels; everything else (the decode kernels these agree
 * with bit for bit, the converters, attention) is avx512vnni's. */
const struct kern_ops KERN_AMX_OPS = {
#ifdef KERN_AMX_EMULATE
	.name = "amx (emulated)",
#else
	.name = "amx",
#endif
	.t = {
		[ENGINE_DTYPE_Q8_0] = { .act_type = ENGINE_DTYPE_Q8_0, .gemm_x16 = gemm_x16_q8_0 },
		[ENGINE_DTYPE_Q4_0] = { .act_type = ENGINE_DTYPE_Q8_0, .gemm_x16 = gemm_x16_q4_0 },
	},
};
