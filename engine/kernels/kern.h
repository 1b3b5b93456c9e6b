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
 * generic functions. kern_select() runs once at engine init. */
#ifndef EDGELM_KERN_H
#define EDGELM_KERN_H

#include "engine/quant.h"

#include <stddef.h>
#include <stdint.h>

/* s = dot(weight row w, activation row a), n elements (a multiple of the
 * weight's block size). `a` is in the weight type's act_type layout. */
typedef void (*kern_vec_dot_fn)(int64_t n, float *s, const void *w, const void *a);
/* Convert n f32 activations into act_type layout. */
typedef void (*kern_quant_fn)(const float *x, void *y, int64_t n);
/* Dequantize n elements of a weight row to f32. */
typedef void (*kern_dequant_fn)(const void *w, float *y, int64_t n);

struct kern_type_ops {
	uint32_t act_type;        /* ENGINE_DTYPE_* of the activation layout */
	kern_vec_dot_fn vec_dot;  /* NULL: type not computable by this variant */
	kern_dequant_fn dequant;
};

/* CPU features the dispatcher looks at (filled by tuning/ or by
 * kern_detect_caps() when the engine runs standalone). */
struct kern_caps {
	bool avx2, fma, f16c;
	bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16;
	bool avxvnni;
	bool amx_tile, amx_int8, amx_bf16;
	bool neon, dotprod, i8mm;
};

struct kern_ops {
	const char *name; /* "scalar", "avx2", "avx512", ... */
	struct kern_type_ops t[ENGINE_DTYPE_COUNT];
	/* Activation converters, indexed by act_type. */
	kern_quant_fn quant_act[ENGINE_DTYPE_COUNT];
	/* f32 helpers used by attention and norms. */
	float (*dot_f32)(int64_t n, const float *a, const float *b);
	/* y += a * x */
	void (*axpy_f32)(int64_t n, float a, const float *x, float *y);
};

/* The generic (scalar) table: always available, the reference. */
extern const struct kern_ops kern_generic_ops;

/* Bytes of an activation row of n elements in layout act_type. */
size_t kern_act_row_size(uint32_t act_type, int64_t n);

/* Pick the best variant the caps allow, or the one named by `force`
 * ("scalar", "avx2", ...; NULL or "" or "auto" for the best). Returns NULL and
 * sets *ret_missing (if not NULL) when `force` names a variant that is not
 * compiled in or not supported by the CPU. */
const struct kern_ops *kern_select(const struct kern_caps *caps, const char *force);
/* List the names of compiled-in variants, best first (NULL-terminated). */
const char *const *kern_variant_names(void);
/* Minimal CPUID/XGETBV detection for standalone use (edgelm-run, tests). */
void kern_detect_caps(struct kern_caps *caps);

#endif
