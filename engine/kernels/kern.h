/* engine/kernels/kern.h: the kernel table, one instance per ISA variant.
 *
 * A matmul y = W x over a weight of type T first converts the f32
 * activations to T's activation type (act_type: F32 for float weights, Q8_0
 * for Q4_0/Q8_0, Q8_K for K-quants), once per activation row, then calls
 * vec_dot for each weight row. Integer formats multiply int8 by int8 and
 * scale per block, as the fast CPU engines do.
 *
 * kern_generic.c is the portable reference and the oracle for every variant.
 * Variant files (kern_avx2.c, kern_avx512.c, ...) are compiled with their own
 * -m flags and fill the entries they accelerate; the rest fall back to the
 * generic functions. kern_select() runs once at engine init.
 *
 * Part tables: a variant's kernels for more weight types may live in files
 * of their own (kern_avx2_q32.c, kern_avx2_kq.c, kern_neon_q.c), each
 * exporting a table with only those types' entries, which kern_select.c
 * lays over the variant's table in order; to everything above they are
 * the variant's own entries. */
#ifndef EDGELM_KERN_H
#define EDGELM_KERN_H

#include "common/cpu.h"
#include "engine/kernels/formats.h"

#include <stddef.h>
#include <stdint.h>

/* s = dot(weight row w, activation row a), n elements (a multiple of the
 * weight's block size). `a` is in the weight type's act_type layout. */
typedef void (*kern_vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);
/* Convert n f32 activations into act_type layout. */
typedef void (*kern_quant_fn)(const float *x, void *y, int64_t n);
/* The same conversion that also writes kern_act_aux()'s side data for the
 * row in the same pass: the bytes and floats of quant_act followed by
 * kern_act_aux, bit for bit. */
typedef void (*kern_quant_aux_fn)(const float *x, void *y, int64_t n, float *aux);
/* Dequantize n elements of a weight row to f32. */
typedef void (*kern_dequant_fn)(const void *w, float *y, int64_t n);
/* The many-token (tile) kernel:
 *   s[t * s_stride + r] = dot(w + r * w_stride, a + t * a_stride)
 * for r < nr, t < nt (strides in bytes for w and a, in floats for s). The
 * weights of a tile are read (and unpacked) once for all nt tokens. `aux` is
 * what kern_act_aux() made for the activation rows (aux_stride floats apart),
 * or NULL for act types that have none. The result agrees with vec_dot to
 * the kernel's error budget (tests/kernels/test_kern_simd.c), not bitwise:
 * the tile kernel is used for every batch of more than one token, and the
 * choice depends only on the batch, never on the thread count. */
typedef void (*kern_gemm_fn)(int64_t n, int nr, int nt, const void *w, size_t w_stride,
			     const void *a, size_t a_stride, const float *aux, size_t aux_stride,
			     float *s, size_t s_stride);
/* The x16 tile kernel (kern_type_ops.gemm_x16): kern_gemm_fn's arguments,
 * and from_s: the accumulators start from s's values instead of 0. */
typedef void (*kern_gemm_x16_fn)(int64_t n, int nr, int nt, const void *w, size_t w_stride,
				 const void *a, size_t a_stride, const float *aux,
				 size_t aux_stride, float *s, size_t s_stride, bool from_s);

/* Attention over a KV cache (model.c), per KV head: n cached rows of hd
 * elements, row i at (const uint8_t *)k + i * stride. An F16 row is hd
 * halves; a Q8_0 row is ceil(hd / 32) blocks, the last one zero-padded.
 *
 * score: s[i] = dot(q, k_i) * scale, i < n. For F16 rows q is hd floats;
 * for Q8_0 rows q is a Q8_0 row like the cache's (the query quantized,
 * zero-padded). Budgets (tests/kernels/test_kern_attn.c): F16, the
 * reference rounds the exact dot once (double sum) and variants may sum in
 * f32 in any order, within (hd + 8) 2^-24 scale sum_j |q_j k_ij|; Q8_0,
 * every block sum is an exact integer and the float steps are the
 * reference's, in its order (sum += (d_q d_k) isum_b over blocks, then one
 * multiply by scale): every variant gives the reference's result bit for
 * bit.
 *
 * vsum: o[j] = sum_i w[i] v_ij for j < hd (o is overwritten). Every
 * variant takes the reference's steps in its order, lane by lane: o starts
 * at 0, then for i = 0 .. n-1, o[j] = o[j] + c * v_ij, a product then a sum
 * (no FMA), with c = w[i] (F16) or c = w[i] * d_ib (Q8_0, d_ib the row's
 * block scale) and v_ij exact in f32: bit for bit the same everywhere, so
 * the weighted sum never depends on the variant's vector width. */
typedef void (*kern_attn_score_fn)(int hd, int n, const void *q, const void *k, size_t stride,
				   float scale, float *s);
typedef void (*kern_attn_vsum_fn)(int hd, int n, const float *w, const void *v, size_t stride,
				  float *o);
/* The query heads that share a KV head (GQA) against the same F16 rows:
 * for h < nq, attn_score_f16(hd, n, q + h q_stride, k, stride, scale,
 * s + h s_stride) and attn_vsum_f16(hd, n, w + h w_stride, v, stride,
 * o + h o_stride) (strides in floats), bit for bit what the variant's
 * single-query kernel gives, so a head's result never depends on how many
 * heads were taken together. What the heads share is the rows' loads and
 * their conversion from F16. */
typedef void (*kern_attn_score_mq_fn)(int hd, int n, int nq, const float *q, size_t q_stride,
				      const void *k, size_t stride, float scale, float *s,
				      size_t s_stride);
typedef void (*kern_attn_vsum_mq_fn)(int hd, int n, int nq, const float *w, size_t w_stride,
				     const void *v, size_t stride, float *o, size_t o_stride);

struct kern_type_ops {
	uint32_t act_type;        /* ENGINE_DTYPE_* of the activation layout */
	kern_vec_dot_fn vec_dot;  /* NULL: type not computable by this variant */
	kern_dequant_fn dequant;
	kern_gemm_fn gemm;        /* NULL: the caller loops vec_dot */
	/* The same contract for one token (nt == 1): decode. It may use aux.
	 * When the type has a tile kernel too, gemv must give that kernel's
	 * results bit for bit (a token's logits may not depend on how many
	 * tokens share its step). NULL: vec_dot, or gemm when there is one. */
	kern_gemm_fn gemv;
	/* The tile kernel over weights repacked by kern_x16_pack() (below):
	 * `w` is the panel of 16 rows, nr a multiple of 16, consecutive panels
	 * 16 * w_stride bytes apart (w_stride: the native row size). Any nt,
	 * one token included: per (row, token) the float operations are one
	 * fixed sequence, so results are bit-identical whatever nt, nr and the
	 * tiling. With from_s the accumulators start from s's values instead
	 * of 0: a row cut into K-segments (engine/repack.c: the first k blocks
	 * packed as panels of their own, then the rest) runs its first segment
	 * without, the others with, into the same s, which gives the whole
	 * row's result bit for bit. NULL: the variant does not read the
	 * repacked layout, and the model keeps the file's layout. */
	kern_gemm_x16_fn gemm_x16;
};


struct kern_ops {
	const char *name; /* "scalar", "avx2", "avx512", ... */
	struct kern_type_ops t[ENGINE_DTYPE_COUNT];
	/* Activation converters, indexed by act_type; F16's makes the rows
	 * of the F16 KV cache. A variant's converter gives the generic one's
	 * bytes exactly. For Q8_K that means quant_quantize_row_q8_K_ref's steps:
	 * the first element of largest magnitude maps to -127, codes are
	 * min(127, rint(iscale * x)) cast to int8 (lrintf rounds to nearest
	 * even; the cast keeps the low byte), bsums from the stored bytes;
	 * NaN inputs give unspecified codes, never a read past the block. */
	kern_quant_fn quant_act[ENGINE_DTYPE_COUNT];
	/* Converters with kern_act_aux() fused in, for the act types that
	 * have side data (NULL: quant_act, then kern_act_aux). */
	kern_quant_aux_fn quant_act_aux[ENGINE_DTYPE_COUNT];
	/* f32 helpers used by attention and norms. */
	float (*dot_f32)(int64_t n, const float *a, const float *b);
	/* y += a * x */
	void (*axpy_f32)(int64_t n, float a, const float *x, float *y);
	/* g[i] = silu(g[i]) * u[i], the SwiGLU activation: the generic one
	 * with libm's expf, the SIMD ones with a polynomial exp (relative
	 * error under 3e-7, tested against the generic one) */
	void (*silu_mul_f32)(int64_t n, float *g, const float *u);
	/* x[i] = exp(x[i] - mx), returns their sum: the softmax numerator
	 * (same exp as silu_mul_f32; the sum's order is fixed per variant) */
	float (*exp_sum_f32)(int64_t n, float *x, float mx);
	/* Streaming read of n bytes (p 64-byte aligned, n a multiple of 256)
	 * with the widest loads the variant has; returns a value that depends
	 * on every byte so the reads cannot be elided. edgelm-bench measures
	 * the box's read bandwidth with it. NULL (the generic table): use
	 * kern_read_stream_generic. */
	uint64_t (*read_stream)(const void *p, size_t n);
	/* The same read as one chain of single loads, one per iteration (NULL:
	 * none). Fewer loads in flight can let the hardware prefetchers run
	 * further ahead on some CPUs (docs/performance.md); edgelm-bench keeps
	 * the better of the two. */
	uint64_t (*read_stream_chain)(const void *p, size_t n);
	/* Attention over F16 and Q8_0 KV caches (contract above; the F32 cache
	 * uses dot_f32 and axpy_f32). */
	kern_attn_score_fn attn_score_f16, attn_score_q8_0;
	kern_attn_vsum_fn attn_vsum_f16, attn_vsum_q8_0;
	/* Several query heads at once (contract above), each paired with the
	 * single-query kernel beside it: a variant that defines that one
	 * defines these too or leaves them NULL, and NULL means the caller
	 * runs the single-query kernel once per head. */
	kern_attn_score_mq_fn attn_score_f16_mq;
	kern_attn_vsum_mq_fn attn_vsum_f16_mq;
};

/* The generic (scalar) table: always available, the reference. */
extern const struct kern_ops kern_generic_ops;

/* Bytes of an activation row of n elements in layout act_type. */
size_t kern_act_row_size(uint32_t act_type, int64_t n);

/* Floats of side data per activation row that the tile kernels use (0 when
 * the layout has none), and its computation from a converted row: for Q8_0,
 * per 32-element block b, aux[2b] = d (as f32) and aux[2b + 1] = sum(q) (an
 * integer, exact in f32), which lets VNNI kernels feed unsigned weight codes
 * and take the offset off exactly once per block; for Q8_1, aux[2b] = d and
 * aux[2b + 1] = s as f32 (the x16 kernels' per-token broadcasts, instead of
 * two f16 conversions per block and token). */
size_t kern_act_aux_len(uint32_t act_type, int64_t n);
void kern_act_aux(uint32_t act_type, const void *a, int64_t n, float *aux);

/* An ISA file's converter pair from one body(x, y, n, aux) that skips the
 * aux writes when aux is NULL: NAME for quant_act, NAME##_aux for
 * quant_act_aux (a macro: the ISA files may share no inline functions). */
#define KERN_QUANT_PAIR(NAME, BODY)                                              \
	static void NAME(const float *x, void *y, int64_t n)                     \
	{                                                                          \
		BODY(x, y, n, NULL);                                               \
	}                                                                          \
	static void NAME##_aux(const float *x, void *y, int64_t n, float *aux)   \
	{                                                                          \
		BODY(x, y, n, aux);                                                \
	}

/* ---- the x16 repacked layout ----------------------------------------------
 * Load-time repacking (model.c) turns each group of 16 rows of a matrix
 * (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q8_0, Q4_K, Q5_K, Q6_K) into one panel of the
 * same size, laid out the way a vpdpbusd (or sdot) kernel reads it: one
 * 64-byte vector holds 4 consecutive elements of each of the 16 rows, so a
 * decode kernel streams the panel front to back with no transpose and no
 * horizontal sums. For nb blocks:
 *   Q4_0: per block 256 bytes of codes and 32 of scales. Chunk j (0..3),
 *         byte j*64 + 4r + i of the codes is byte 4j + i of row r's block
 *         (low nibble: element 4j + i, high: 16 + 4j + i). IQ4_NL the same
 *         (its nibbles are codebook indices).
 *   Q4_1: Q4_0's codes; 64 bytes of metadata, 16 f16 scales then 16 mins.
 *   Q5_0, Q5_1: Q4_0's nibbles, then 64 bytes of 5th bits: the 64-bit mask
 *         of code vector g (g < 4: chunk g's low nibbles, else chunk g-4's
 *         high ones) at byte 256 + 8g, bit 4r + i for row r's element i
 *         there; metadata as Q4_0 and Q4_1.
 *   Q8_0: per block 512 bytes of codes and 32 of scales. Group g (0..7),
 *         byte g*64 + 4r + i of the codes is element 4g + i of row r,
 *         stored as an unsigned code q + 128.
 *   scales: 16 f16, 2r: row r's block b scale.
 * The K-quants (256-element super-blocks; details in kern_x16.c):
 *   Q4_K: 2048 bytes of codes, 4 chunks of 512: chunk j, byte i*64 + 4r + k
 *         is qs[32j + 4i + k] of row r (low nibble: sub-block 2j, high:
 *         2j + 1); 256 of metadata: 16 d, 16 dmin (f16), then the 12
 *         scale bytes, byte k of row r at 64 + 16k + r.
 *   Q5_K: Q4_K's, each chunk of nibbles followed by its 128 bytes of 5th
 *         bits (chunks 640 bytes apart, 2560 of codes): one 64-bit mask per
 *         code vector, as Q5_0's, so that a masked byte add places them.
 *   Q6_K: 3072 bytes of codes (ql, ql, qh per 64 bytes of each half) and
 *         288 of metadata (16 int8 scales per sub-block, then 16 d).
 *   IQ4_XS: per 32-element sub-block, a Q4_0 block's 256 bytes of codes
 *         (codebook indices); 128 of metadata: 16 d, the 4 scales_l bytes
 *         (byte k of row r at 32 + 16k + r), the 2 scales_h bytes (96 +
 *         16k + r).
 *   Q3_K: per half (128 elements) 768 bytes: 512 of the 2-bit codes, byte
 *         64i + 4r + k is qs[32h + 4i + k] (bits 2g..2g+1: element 128h +
 *         32g + 4i + k), then the high bits as one 64-bit mask per code
 *         vector (g, i) at 512 + 64g + 8i; 224 of metadata: 16 d, the 12
 *         scale bytes (byte k of row r at 32 + 16k + r).
 *   Q2_K: Q3_K's 2-bit codes without the masks (1024 bytes); 320 of
 *         metadata: 16 d, 16 dmin, then scales[2p + s] of row r at 64 +
 *         32p + 2r + s (a row's pair in one dword once widened to int16).
 * The blocks go in pairs: block 2p's codes, block 2p+1's codes, then the
 * two blocks' metadata (scales; the K-quants' scales and mins, kern_x16.c),
 * so that a panel is one forward stream (an odd last block: codes, then
 * metadata). With the whole panel's metadata at its end (the first layout)
 * a kernel read two streams per thread, which the hardware prefetcher
 * served much slower than one (docs/performance.md §4).
 * A panel is exactly 16 native rows long, so a matrix is repacked in place
 * panel by panel; rows past the last full group of 16 stay native. */
#define KERN_X16_ROWS 16
/* Block b's codes and metadata in a panel of nb blocks with cb bytes of
 * codes and mb of metadata per block (macros: the ISA files may share no
 * inline functions). */
#define KERN_X16_PAIR(panel, cb, mb, b) ((panel) + (size_t)((b) >> 1) * 2 * ((cb) + (mb)))
#define KERN_X16_CODES(panel, nb, cb, mb, b) \
	(KERN_X16_PAIR(panel, cb, mb, b) + (size_t)((b)&1) * (cb))
#define KERN_X16_META(panel, nb, cb, mb, b)                                           \
	(KERN_X16_PAIR(panel, cb, mb, b) + (((b) | 1) < (nb) ? 2 : 1) * (size_t)(cb) + \
	 (size_t)((b)&1) * (mb))
/* Prefetch the n bytes at p, one PF per 64-byte line (n a constant of at
 * most 48 lines). PF(p) is the ISA file's prefetch of one line. */
#define KERN_PF_LINES(PF, p, n)                                               \
	do {                                                                  \
		_Pragma("GCC unroll 48") for (size_t l_ = 0; l_ < (size_t)(n); \
					      l_ += 64)                        \
			PF((const char *)(p) + l_);                           \
	} while (0)
/* Prefetch the panel stream `dist` bytes ahead of block b's codes `pc`:
 * cb bytes of codes and, at a pair's second block, the pair's 2 * mb bytes
 * of metadata (KERN_X16_PREFETCH_META), so every 64-byte line of the stream
 * is asked for once. The K-quant kernels ask for their codes a few lines at
 * a time as they consume them and use only the _META part here. */
#define KERN_X16_PREFETCH_META(PF, pc, cb, mb, b, dist)                     \
	do {                                                                \
		if ((b)&1)                                                  \
			KERN_PF_LINES(PF, (const char *)(pc) + (cb) + (dist), \
				      2 * (size_t)(mb));                    \
	} while (0)
#define KERN_X16_PREFETCH(PF, pc, cb, mb, b, dist)                        \
	do {                                                              \
		KERN_PF_LINES(PF, (const char *)(pc) + (dist), (cb));     \
		KERN_X16_PREFETCH_META(PF, pc, cb, mb, b, dist);          \
	} while (0)
bool kern_x16_supported(uint32_t type);
/* Pack 16 native rows (`rows`, row_stride bytes apart, n elements each)
 * into `panel` (16 * row size bytes; must not overlap `rows`). */
void kern_x16_pack(uint32_t type, const void *rows, size_t row_stride, int64_t n, void *panel);
/* The inverse, for tests and tools. */
void kern_x16_unpack(uint32_t type, const void *panel, int64_t n, void *rows, size_t row_stride);
/* Row r (0..15) of a panel in the native layout: an embedding lookup in a
 * matrix that is repacked because it is also the (tied) output. */
void kern_x16_unpack_row(uint32_t type, const void *panel, int64_t n, int r, void *row);
/* The scalar reference of gemm_x16 (the oracle for the variants' kernels):
 * acc = from_s ? s : 0, then exact integer block dots, per block acc +=
 * (float)isum * (d_w * d_a), blocks in order, which is the sequence every
 * gemm_x16 follows (the K-quants: s += the generic vec_dot of each
 * super-block). */
void kern_gemm_x16_ref(uint32_t type, int64_t n, int nr, int nt, const void *w,
		       size_t w_stride, const void *a, size_t a_stride, const float *aux,
		       size_t aux_stride, float *s, size_t s_stride, bool from_s);

/* Portable streaming read (8 independent 64-bit lanes). */
uint64_t kern_read_stream_generic(const void *p, size_t n);

/* Pick the best variant the instruction sets allow (common/cpu.h's usable
 * set; NULL: probe now), or the one named by `force` ("scalar", "avx2", ...;
 * NULL or "" or "auto" for the best). Returns NULL when `force` names a
 * variant that is not compiled in or not supported by the CPU. */
const struct kern_ops *kern_select(const struct cm_cpu_isa *caps, const char *force);
/* List the names of compiled-in variants, best first (NULL-terminated). */
const char *const *kern_variant_names(void);
/* The usable set of the common probe (cm_cpu_probe), for tests. */
void kern_detect_caps(struct cm_cpu_isa *caps);
/* Ask Linux for the AMX tile state for this process
 * (arch_prctl(ARCH_REQ_XCOMP_PERM); process-wide, no way back). The "amx"
 * variant is offered only while the permission is held: edgelmd's tuning
 * knob `amx` asks for it, and a caller that forces "amx" (engine_params.isa)
 * asks here. False where there is no AMX or the kernel refuses. */
bool kern_amx_request(void);

#endif
