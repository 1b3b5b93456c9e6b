/* engine/quant.h: the engine's side of the tensor formats.
 *
 * The formats themselves (ggml type ids, block layouts, the type table,
 * half/bfloat conversion, the reference quantizers and dequantizers) are the
 * bottom layer of the engine, engine/kernels/formats.h, which the kernels
 * stand on too (docs/design.md). This header adds what the engine and the
 * tools need and the kernels do not: conversion of a row of any type, chosen
 * by its id. The recipes that pick a type per tensor (llama-quantize's file
 * types, per-tensor fallback) are tools/lib/recipes.c.
 *
 * It also keeps, as static inline forwarders (no symbols of those names are
 * exported), the names callers used before the formats became a layer of
 * their own; new code uses the quant_ names. */
#ifndef EDGELM_ENGINE_QUANT_H
#define EDGELM_ENGINE_QUANT_H

#include "engine/kernels/formats.h"

/* Dequantize a row of k elements to f32: F32, F16, BF16 and every block type
 * with a reference dequantizer. Returns 0, or -EINVAL if the type has none or
 * k is not a whole number of its blocks. */
int quant_dequantize_row(uint32_t type, const void *x, float *y, int64_t k);
/* Quantize a row of k f32 elements to `type` with its reference quantizer.
 * Returns 0, or -EINVAL as quant_dequantize_row. */
int quant_quantize_row(uint32_t type, const float *x, void *y, int64_t k);

/* ---- former names (callers outside the formats layer) ----------------------- */

static inline const struct dtype_info *dtype_get(uint32_t type)
{
	return quant_dtype_get(type);
}

static inline const char *dtype_name(uint32_t type)
{
	return quant_dtype_name(type);
}

/* As before: -1 (not -ENOENT) for an unknown name. */
static inline int dtype_from_name(const char *name)
{
	int t = quant_dtype_from_name(name);
	return t < 0 ? -1 : t;
}

static inline size_t dtype_row_size(uint32_t type, int64_t n)
{
	return quant_dtype_row_size(type, n);
}

static inline float fp16_to_f32(uint16_t h)
{
	return quant_fp16_to_f32(h);
}

static inline uint16_t fp32_to_fp16(float f)
{
	return quant_fp32_to_fp16(f);
}

static inline float bf16_to_f32(uint16_t h)
{
	return quant_bf16_to_f32(h);
}

static inline uint16_t fp32_to_bf16(float f)
{
	return quant_fp32_to_bf16(f);
}

static inline void quantize_row_q8_0_ref(const float *x, void *y, int64_t k)
{
	quant_quantize_row_q8_0_ref(x, y, k);
}

static inline void quantize_row_q4_0_ref(const float *x, void *y, int64_t k)
{
	quant_quantize_row_q4_0_ref(x, y, k);
}

/* These now return -EINVAL where they returned -1. */
static inline int dequantize_row(uint32_t type, const void *x, float *y, int64_t k)
{
	return quant_dequantize_row(type, x, y, k);
}

static inline int quantize_row(uint32_t type, const float *x, void *y, int64_t k)
{
	return quant_quantize_row(type, x, y, k);
}

#endif
