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

#include "engine/quant.h"

#include <math.h>
#include <string.h>

bool kern_x16_supported(uint32_t type)
{
	return type == ENGINE_DTYPE_Q4_0 || type == ENGINE_DTYPE_Q8_0;
}

/* Bytes of codes per block of a 16-row panel. */
static size_t codes_per_block(uint32_t type)
{
	return type == ENGINE_DTYPE_Q4_0 ? 256 : 512;
}

void kern_x16_pack(uint32_t type, const void *rows, size_t row_stride, int64_t n, void *panel)
{
	int64_t nb = n / 32;
	size_t cb = codes_per_block(type);
	uint8_t *codes = panel, *scales = (uint8_t *)panel + (size_t)nb * cb;
	for (int r = 0; r < KERN_X16_ROWS; r++) {
		const uint8_t *row = (const uint8_t *)rows + (size_t)r * row_stride;
		for (int64_t b = 0; b < nb; b++) {
			uint8_t *pb = codes + (size_t)b * cb;
			if (type == ENGINE_DTYPE_Q4_0) {
				const struct block_q4_0 *x = (const struct block_q4_0 *)row + b;
				memcpy(scales + (size_t)b * 32 + 2 * r, &x->d, 2);
				for (int j = 0; j < 4; j++)
					memcpy(pb + j * 64 + 4 * r, x->qs + 4 * j, 4);
			} else {
				const struct block_q8_0 *x = (const struct block_q8_0 *)row + b;
				memcpy(scales + (size_t)b * 32 + 2 * r, &x->d, 2);
				for (int g = 0; g < 8; g++)
					for (int i = 0; i < 4; i++)
						pb[g * 64 + 4 * r + i] = (uint8_t)x->qs[4 * g + i] ^ 0x80;
			}
		}
	}
}

void kern_x16_unpack(uint32_t type, const void *panel, int64_t n, void *rows, size_t row_stride)
{
	int64_t nb = n / 32;
	size_t cb = codes_per_block(type);
	const uint8_t *codes = panel, *scales = (const uint8_t *)panel + (size_t)nb * cb;
	for (int r = 0; r < KERN_X16_ROWS; r++) {
		uint8_t *row = (uint8_t *)rows + (size_t)r * row_stride;
		for (int64_t b = 0; b < nb; b++) {
			const uint8_t *pb = codes + (size_t)b * cb;
			if (type == ENGINE_DTYPE_Q4_0) {
				struct block_q4_0 *x = (struct block_q4_0 *)row + b;
				memcpy(&x->d, scales + (size_t)b * 32 + 2 * r, 2);
				for (int j = 0; j < 4; j++)
					memcpy(x->qs + 4 * j, pb + j * 64 + 4 * r, 4);
			} else {
				struct block_q8_0 *x = (struct block_q8_0 *)row + b;
				memcpy(&x->d, scales + (size_t)b * 32 + 2 * r, 2);
				for (int g = 0; g < 8; g++)
					for (int i = 0; i < 4; i++)
						x->qs[4 * g + i] = (int8_t)(pb[g * 64 + 4 * r + i] ^ 0x80);
			}
		}
	}
}

/* Unsigned code of row r, element e of a panel block, and its offset. */
static int code_at(uint32_t type, const uint8_t *pb, int r, int e)
{
	if (type == ENGINE_DTYPE_Q4_0) {
		int lo = e < 16, k = lo ? e : e - 16;
		uint8_t byte = pb[(k / 4) * 64 + 4 * r + k % 4];
		return lo ? byte & 0x0f : byte >> 4;
	}
	return pb[(e / 4) * 64 + 4 * r + e % 4];
}

void kern_gemm_x16_ref(uint32_t type, int64_t n, int nr, int nt, const void *w,
		       size_t w_stride, const void *a, size_t a_stride, const float *aux,
		       size_t aux_stride, float *s, size_t s_stride)
{
	int64_t nb = n / 32;
	size_t cb = codes_per_block(type);
	int32_t off = type == ENGINE_DTYPE_Q4_0 ? 8 : 128;
	(void)aux;
	(void)aux_stride;
	for (int p = 0; p < nr / KERN_X16_ROWS; p++) {
		const uint8_t *panel = (const uint8_t *)w + (size_t)p * KERN_X16_ROWS * w_stride;
		const uint8_t *scales = panel + (size_t)nb * cb;
		for (int t = 0; t < nt; t++) {
			const struct block_q8_0 *ab =
				(const struct block_q8_0 *)((const uint8_t *)a + (size_t)t * a_stride);
			for (int r = 0; r < KERN_X16_ROWS; r++) {
				float acc = 0.0f;
				for (int64_t b = 0; b < nb; b++) {
					const uint8_t *pb = panel + (size_t)b * cb;
					int32_t isum = 0;
					for (int e = 0; e < 32; e++)
						isum += (code_at(type, pb, r, e) - off) * ab[b].qs[e];
					uint16_t dh;
					memcpy(&dh, scales + (size_t)b * 32 + 2 * r, 2);
					float dw = fp16_to_f32(dh), da = fp16_to_f32(ab[b].d);
					acc = fmaf((float)isum, dw * da, acc);
				}
				s[(size_t)t * s_stride + (size_t)p * KERN_X16_ROWS + r] = acc;
			}
		}
	}
}
