/* engine/quant.c: conversion of a row of any type, chosen by its id, through
 * the formats layer's reference quantizers and dequantizers
 * (engine/kernels/formats.h). The kernels do not need this; the model loader
 * (embedding lookups), edgelm-quantize, the fixture generators and the tests
 * do. */
#include "engine/quant.h"

#include <errno.h>

static inline uint16_t load_u16(const void *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

static void dequant_row_f16(const void *vx, float *y, int64_t k)
{
	const uint8_t *x = vx;
	for (int64_t i = 0; i < k; i++)
		y[i] = quant_fp16_to_f32(load_u16(x + 2 * i));
}

static void dequant_row_bf16(const void *vx, float *y, int64_t k)
{
	const uint8_t *x = vx;
	for (int64_t i = 0; i < k; i++)
		y[i] = quant_bf16_to_f32(load_u16(x + 2 * i));
}

static void copy_f32(const void *x, float *y, int64_t k)
{
	if (k)
		memcpy(y, x, (size_t)k * sizeof(float));
}

static void copy_f32_q(const float *x, void *y, int64_t k)
{
	if (k)
		memcpy(y, x, (size_t)k * sizeof(float));
}

static const struct {
	void (*dequant)(const void *x, float *y, int64_t k);
	void (*quant)(const float *x, void *y, int64_t k);
} row_fns[ENGINE_DTYPE_COUNT] = {
	[ENGINE_DTYPE_F32] = { copy_f32, copy_f32_q },
	[ENGINE_DTYPE_F16] = { dequant_row_f16, quant_quantize_row_f16_ref },
	[ENGINE_DTYPE_BF16] = { dequant_row_bf16, quant_quantize_row_bf16_ref },
	[ENGINE_DTYPE_Q4_0] = { quant_dequantize_row_q4_0, quant_quantize_row_q4_0_ref },
	[ENGINE_DTYPE_Q4_1] = { quant_dequantize_row_q4_1, quant_quantize_row_q4_1_ref },
	[ENGINE_DTYPE_Q5_0] = { quant_dequantize_row_q5_0, quant_quantize_row_q5_0_ref },
	[ENGINE_DTYPE_Q5_1] = { quant_dequantize_row_q5_1, quant_quantize_row_q5_1_ref },
	[ENGINE_DTYPE_Q8_0] = { quant_dequantize_row_q8_0, quant_quantize_row_q8_0_ref },
	[ENGINE_DTYPE_Q8_1] = { quant_dequantize_row_q8_1, quant_quantize_row_q8_1_ref },
	[ENGINE_DTYPE_Q2_K] = { quant_dequantize_row_q2_K, quant_quantize_row_q2_K_ref },
	[ENGINE_DTYPE_Q3_K] = { quant_dequantize_row_q3_K, quant_quantize_row_q3_K_ref },
	[ENGINE_DTYPE_Q4_K] = { quant_dequantize_row_q4_K, quant_quantize_row_q4_K_ref },
	[ENGINE_DTYPE_Q5_K] = { quant_dequantize_row_q5_K, quant_quantize_row_q5_K_ref },
	[ENGINE_DTYPE_Q6_K] = { quant_dequantize_row_q6_K, quant_quantize_row_q6_K_ref },
	[ENGINE_DTYPE_Q8_K] = { quant_dequantize_row_q8_K, quant_quantize_row_q8_K_ref },
	[ENGINE_DTYPE_IQ4_NL] = { quant_dequantize_row_iq4_nl, quant_quantize_row_iq4_nl_ref },
	[ENGINE_DTYPE_IQ4_XS] = { quant_dequantize_row_iq4_xs, quant_quantize_row_iq4_xs_ref },
};

/* A row length the type cannot hold (negative, or not whole blocks). */
static bool bad_length(uint32_t type, int64_t k)
{
	const struct dtype_info *ti = quant_dtype_get(type);
	return !ti || k < 0 || k % ti->blck != 0;
}

int quant_dequantize_row(uint32_t type, const void *x, float *y, int64_t k)
{
	if (bad_length(type, k) || !row_fns[type].dequant)
		return -EINVAL;
	row_fns[type].dequant(x, y, k);
	return 0;
}

int quant_quantize_row(uint32_t type, const float *x, void *y, int64_t k)
{
	if (bad_length(type, k) || !row_fns[type].quant)
		return -EINVAL;
	row_fns[type].quant(x, y, k);
	return 0;
}
