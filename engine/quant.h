/* engine/quant.h: the engine's side of the tensor formats.
 *
 * The formats themselves (ggml type ids, block layouts, the type table,
 * half/bfloat conversion, the reference quantizers and dequantizers) are the
 * bottom layer of the engine, engine/kernels/formats.h, which the kernels
 * stand on too (docs/design.md). This header adds what the engine and the
 * tools need and the kernels do not: conversion of a row of any type, chosen
 * by its id. The recipes that pick a type per tensor (llama-quantize's file
 * types, per-tensor fallback) are tools/lib/recipes.c. */
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

#endif
