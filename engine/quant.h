/* engine/quant.h: the engine's side of the tensor formats.
 *
 * The formats themselves (ggml type ids, block layouts, the type table,
 * half/bfloat conversion, the reference quantizers and dequantizers) are the
 * bottom layer of the engine, engine/kernels/formats.h, which the kernels
 * stand on too (docs/design.md). This header adds what the engine and the
 * tools need and the kernels do not: conversion of a row of any type, chosen
 * by its id; and the recipes that pick a type per tensor (llama-quantize's
 * file types, per-tensor fallback: quantize_recipe.c), which quantizing on
 * load (quantize.c), edgelm-quantize and mkmodel share. */
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

/* ---- recipes (quantize_recipe.c) ------------------------------------------ */

struct gguf_file;
struct gguf_tensor;

struct quant_recipe {
	const char *name;   /* "Q4_K_M", "Q8_0", "F16", ... */
	uint32_t base;      /* ENGINE_DTYPE_* of most matrices */
	uint32_t file_type; /* general.file_type (llama_ftype) */
};

/* What the rules look at for one matrix. */
struct quant_tensor {
	const char *name; /* GGUF tensor name ("blk.3.attn_v.weight") */
	int64_t ne0;      /* row length */
	int n_layer;      /* layers in the model */
	int gqa;          /* n_head / n_head_kv, 1 when unknown */
	bool is_output;   /* output.weight, or token_embd.weight when tied */
};

/* A recipe by name, case-insensitive ("q4_k_m"; "Q4_K" means Q4_K_M as in
 * llama-quantize), or NULL. */
const struct quant_recipe *quant_recipe_find(const char *name);
/* The names, "Q4_K_M Q4_K_S ... F32" (usage texts, messages). */
const char *quant_recipe_names(void);
/* The i-th recipe (for usage texts), NULL past the end. */
const struct quant_recipe *quant_recipe_at(size_t i);
/* Whether `name` is a mix llama-quantize makes only with an importance
 * matrix (IQ2_XXS, Q2_K_S, ...): refused, as edgelm computes none. */
bool quant_recipe_needs_imatrix(const char *name);
/* Whether llama-quantize converts a tensor: a name ending in "weight", at
 * least 2 dimensions not counting trailing 1s, not a norm, router or
 * position/token-type embedding. */
bool quant_recipe_quantizable(const char *name, int eff_dims);
/* The type recipe r gives matrix t. When the chosen type's block does not
 * divide the row, the fallback is returned and `note` (if not NULL) gets
 * "row N not a multiple of B, T1 -> T2"; otherwise note is "". */
uint32_t quant_recipe_type(const struct quant_recipe *r, const struct quant_tensor *t, char *note,
			   size_t note_len);

/* What the rules need of a whole file, read once. */
struct quant_shape {
	int n_layer;     /* one more than the largest blk.N */
	int gqa;         /* n_head / n_head_kv, 1 when unknown */
	bool has_output; /* output.weight present (else token_embd is the output) */
};
void quant_recipe_shape(const struct gguf_file *f, struct quant_shape *ret);
/* quant_recipe_quantizable for a file's tensor (its dimensions counted as
 * ggml_n_dims does). */
bool quant_recipe_covers(const struct gguf_tensor *t);
/* The type tensor t of a file of shape s gets under r: its own type when
 * it is not converted (1-D, norms, ...), else quant_recipe_type's (note
 * as there). */
uint32_t quant_recipe_tensor(const struct quant_recipe *r, const struct quant_shape *s,
			     const struct gguf_tensor *t, char *note, size_t note_len);
/* Convert rows [r0, r1) of t (any computable type) to out_type, row r at
 * out + r * quant_dtype_row_size(out_type, ne0), through tmp (ne0
 * floats): dequantized to f32, then the reference quantizer. -EINVAL as
 * the row functions. */
int quant_convert_rows(const struct gguf_tensor *t, uint32_t out_type, void *out, int64_t r0,
		       int64_t r1, float *tmp);

#endif
