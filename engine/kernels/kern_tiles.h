/* engine/kernels/kern_tiles.h: the token-tiling loop of the tile kernels,
 * and the x16 K-quant gemm built on it.
 *
 * KERN_TILES(nt, TOKENS, CALL, ARG) covers tokens [0, nt): CALL(ARG, t, NT)
 * for each full tile of TOKENS tokens starting at token t (NT = TOKENS),
 * then once for the nt % TOKENS tokens left, if any, with NT that remainder
 * as a literal. The panel functions take NT as a compile-time constant
 * (always_inline, their per-token arrays and loops fully unrolled), so the
 * runtime remainder has to become one: that is the switch, one case per
 * remainder. TOKENS must be a literal 4 or 8 (or a macro for one), as it
 * picks the case list by name. ARG is passed through to CALL unchanged,
 * for callers that are macros themselves and cannot define a CALL around
 * their variable part (KERN_X16K_GEMM below).
 *
 * Only macros live here: ISA files share no inline functions through
 * headers (docs/style.md, "ISA dispatch"), but a macro expands into each
 * file's own code with that file's target flags. */
#ifndef EDGELM_KERN_TILES_H
#define EDGELM_KERN_TILES_H

#define KERN_TILES(nt, TOKENS, CALL, ARG)                                 \
	do {                                                              \
		int kern_t0_ = 0;                                         \
		for (; kern_t0_ + (TOKENS) <= (nt); kern_t0_ += (TOKENS)) \
			CALL(ARG, kern_t0_, TOKENS);                      \
		switch ((nt) - kern_t0_) {                                \
			KERN_TILES_TAIL_(TOKENS, CALL, ARG, kern_t0_)     \
		default:                                                  \
			break;                                            \
		}                                                         \
	} while (0)

/* The remainder cases, by TOKENS. KERN_TILES has expanded a TOKENS macro
 * (X16_TOKENS) to its literal by the time it is pasted here. */
#define KERN_TILES_TAIL_(TOKENS, CALL, ARG, t) KERN_TILES_TAIL_##TOKENS(CALL, ARG, t)
#define KERN_TILES_TAIL_4(CALL, ARG, t)                                   \
	case 1: CALL(ARG, t, 1); break;                                   \
	case 2: CALL(ARG, t, 2); break;                                   \
	case 3: CALL(ARG, t, 3); break;
#define KERN_TILES_TAIL_8(CALL, ARG, t)                                   \
	KERN_TILES_TAIL_4(CALL, ARG, t)                                   \
	case 4: CALL(ARG, t, 4); break;                                   \
	case 5: CALL(ARG, t, 5); break;                                   \
	case 6: CALL(ARG, t, 6); break;                                   \
	case 7: CALL(ARG, t, 7); break;

/* The x16 gemm driver of the 32-element types in the 256-bit files (avx2,
 * avxvnni), whose vectors hold half a panel's rows: ONE(kind, nb, panel, a,
 * aux, s, from_s) walks a panel once for one token, HALF(kind, nb, NT,
 * panel, h, a, a_stride, aux, aux_stride, s, s_stride, from_s) walks half h
 * for up to TOKENS (from_s: kern.h's gemm_x16 contract). `kind` is the
 * file's own type code (avxvnni: Q4_0 or not). */
#define KERN_X16_HALVES_GEMM(NAME, ONE, HALF, TOKENS)                              \
	static inline __attribute__((always_inline)) void NAME(                    \
		int kind, int64_t n, int nr, int nt, const void *vw, size_t w_stride, \
		const void *va, size_t a_stride, const float *aux, size_t aux_stride, \
		float *s, size_t s_stride, bool from_s)                            \
	{                                                                          \
		const uint8_t *w = vw, *a = va;                                    \
		int64_t nb = n / 32;                                               \
		for (int r0 = 0; r0 + KERN_X16_ROWS <= nr; r0 += KERN_X16_ROWS) {  \
			const uint8_t *panel = w + (size_t)r0 * w_stride;          \
			if (nt == 1) {                                             \
				ONE(kind, nb, panel, a, aux, s + r0, from_s);      \
				continue;                                          \
			}                                                          \
			KERN_TILES(nt, TOKENS, KERN_X16_HALVES_TILE_, HALF);       \
		}                                                                  \
	}
#define KERN_X16_HALVES_TILE_(HALF, t, NT)                                         \
	for (int h = 0; h < 2; h++)                                                \
		HALF(kind, nb, NT, panel, h, a + (size_t)(t) * a_stride, a_stride, \
		     aux + (size_t)(t) * aux_stride, aux_stride,                   \
		     s + (size_t)(t) * s_stride + r0, s_stride, from_s)

/* The x16 K-quant gemm (kern.h's gemm_x16 contract) of one ISA file:
 * panels of 16 rows, each walked by PANEL(nb, NT, panel, a, a_stride, s,
 * s_stride, from_s) for tiles of up to TOKENS tokens (the K-quants need no
 * aux).
 * ATTR is the file's target attribute for the function, or nothing. */
#define KERN_X16K_GEMM(NAME, ATTR, PANEL, TOKENS)                                  \
	static ATTR void NAME(int64_t n, int nr, int nt, const void *vw,           \
			      size_t w_stride, const void *va, size_t a_stride,    \
			      const float *aux, size_t aux_stride, float *s,       \
			      size_t s_stride, bool from_s)                        \
	{                                                                          \
		const uint8_t *w = vw, *a = va;                                    \
		int64_t nb = n / QK_K;                                             \
		(void)aux;                                                         \
		(void)aux_stride;                                                  \
		for (int r0 = 0; r0 + KERN_X16_ROWS <= nr; r0 += KERN_X16_ROWS) {  \
			const uint8_t *panel = w + (size_t)r0 * w_stride;          \
			KERN_TILES(nt, TOKENS, KERN_X16K_TILE_, PANEL);            \
		}                                                                  \
	}
#define KERN_X16K_TILE_(PANEL, t, NT)                                              \
	PANEL(nb, NT, panel, a + (size_t)(t) * a_stride, a_stride,                 \
	      s + (size_t)(t) * s_stride + r0, s_stride, from_s)

#endif
