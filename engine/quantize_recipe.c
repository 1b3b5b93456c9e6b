/* engine/quantize_recipe.c: llama-quantize's file types as per-tensor
 * recipes (gguf-formats §3), the one copy that quantizing on load
 * (quantize.c), edgelm-quantize and edgelm-gguf mkmodel use, so a model
 * quantized on load gets the types (and bytes) of the file the tool writes.
 *
 * A recipe has a base tensor type and a few rules that give chosen matrices
 * more bits (dense, non-MoE models, no importance matrix):
 * - the output matrix (output.weight, or token_embd.weight when the model
 *   ties its embedding) is Q6_K for every quantized recipe but Q8_0;
 * - Q4_K_M / Q5_K_M: attn_v and ffn_down are Q6_K in the use_more_bits
 *   layers, a fused attn_qkv Q5_K / Q6_K;
 * - Q4_K_S: attn_v of layers 0-3 and ffn_down of layers < n/8 are Q5_K;
 * - Q3_K_M: attn_v Q5_K in layers 0-1 else Q4_K, ffn_down Q5_K in layers
 *   < n/16 else Q4_K, attn_output and attn_qkv Q4_K;
 * - Q2_K: attn_v Q4_K when n_head / n_head_kv >= 4 else Q3_K, ffn_down and
 *   attn_output Q3_K.
 * Then the row-size fallback: a type whose block does not divide the row
 * becomes Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K / IQ4_XS ->
 * IQ4_NL, and anything that still does not divide becomes F16. */
#include "engine/quant.h"

#include "common/common.h"
#include "engine/gguf.h"

#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>

/* name, base type, general.file_type; the X-macro also spells the list of
 * names (quant_recipe_names), so the two cannot differ */
/* clang-format off */
#define RECIPES(X)                                                                        \
	X(Q4_K_M, Q4_K, 15) X(Q4_K_S, Q4_K, 14) X(Q5_K_M, Q5_K, 17) X(Q5_K_S, Q5_K, 16)   \
	X(Q6_K, Q6_K, 18) X(Q3_K_M, Q3_K, 12) X(Q2_K, Q2_K, 10) X(Q8_0, Q8_0, 7)           \
	X(Q4_0, Q4_0, 2) X(Q4_1, Q4_1, 3) X(Q5_0, Q5_0, 8) X(Q5_1, Q5_1, 9)                \
	X(IQ4_NL, IQ4_NL, 25) X(IQ4_XS, IQ4_XS, 30) X(F16, F16, 1) X(BF16, BF16, 32)        \
	X(F32, F32, 0)
#define RECIPE_ENTRY(n, b, ft) { #n, ENGINE_DTYPE_##b, ft },
#define RECIPE_NAME(n, b, ft) " " #n

/* clang-format on */

static const struct quant_recipe recipes[] = { RECIPES(RECIPE_ENTRY) };

const char *quant_recipe_names(void)
{
	return RECIPES(RECIPE_NAME) + 1;
}

/* Mixes llama-quantize makes only with an importance matrix, which edgelm
 * does not compute: named so that asking for one says why it is refused. */
static const char *const imatrix_only[] = { "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
					    "IQ1_S",   "IQ1_M",  "Q2_K_S" };

/* llama-quantize's aliases: a bare K type names its _M mix. */
static const struct {
	const char *alias, *name;
} aliases[] = { { "Q3_K", "Q3_K_M" }, { "Q4_K", "Q4_K_M" }, { "Q5_K", "Q5_K_M" } };

const struct quant_recipe *quant_recipe_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; i < CM_ARRAY_LEN(aliases); i++)
		if (strcasecmp(name, aliases[i].alias) == 0)
			name = aliases[i].name;
	for (size_t i = 0; i < CM_ARRAY_LEN(recipes); i++)
		if (strcasecmp(name, recipes[i].name) == 0)
			return &recipes[i];
	return NULL;
}

bool quant_recipe_needs_imatrix(const char *name)
{
	for (size_t i = 0; name && i < CM_ARRAY_LEN(imatrix_only); i++)
		if (strcasecmp(name, imatrix_only[i]) == 0)
			return true;
	return false;
}

const struct quant_recipe *quant_recipe_at(size_t i)
{
	return i < CM_ARRAY_LEN(recipes) ? &recipes[i] : NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

bool quant_recipe_quantizable(const char *name, int eff_dims)
{
	return ends_with(name, "weight") && eff_dims >= 2 && !strstr(name, "_norm.weight") &&
	       !strstr(name, "ffn_gate_inp.weight") && strcmp(name, "position_embd.weight") != 0 &&
	       strcmp(name, "token_types.weight") != 0;
}

/* Layer index of "blk.N....", or -1. */
static int layer_of(const char *name)
{
	if (strncmp(name, "blk.", 4) != 0)
		return -1;
	char *end;
	long v = strtol(name + 4, &end, 10);
	return end != name + 4 && *end == '.' && v >= 0 && v < 1 << 20 ? (int)v : -1;
}

/* llama.cpp's use_more_bits(i, n): the first and last eighth of the layers,
 * and every third layer in between. */
static bool more_bits(int i, int n)
{
	return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool has_part(const char *name, const char *part)
{
	return strstr(name, part) != NULL;
}

/* The recipe's choice before the row-size check. */
static uint32_t choose(const struct quant_recipe *r, const struct quant_tensor *t)
{
	const uint32_t base = r->base;
	const int i = layer_of(t->name), n = t->n_layer > 0 ? t->n_layer : 1;
	const char *nm = t->name;
	const bool quantized = base != ENGINE_DTYPE_F32 && base != ENGINE_DTYPE_F16 &&
			       base != ENGINE_DTYPE_BF16;

	if (!quantized)
		return base;
	if (t->is_output)
		return base == ENGINE_DTYPE_Q8_0 ? ENGINE_DTYPE_Q8_0 : ENGINE_DTYPE_Q6_K;
	const bool attn_v = has_part(nm, "attn_v.weight");
	const bool ffn_down = has_part(nm, "ffn_down.weight");
	const bool attn_out = has_part(nm, "attn_output.weight");
	const bool attn_qkv = has_part(nm, "attn_qkv.weight");
	switch (r->file_type) {
	case 15: /* Q4_K_M */
	case 17: /* Q5_K_M */
		if ((attn_v || ffn_down) && i >= 0 && more_bits(i, n))
			return ENGINE_DTYPE_Q6_K;
		if (attn_qkv)
			return r->file_type == 15 ? ENGINE_DTYPE_Q5_K : ENGINE_DTYPE_Q6_K;
		break;
	case 14: /* Q4_K_S */
		if ((attn_v && i >= 0 && i < 4) || (ffn_down && i >= 0 && i < n / 8))
			return ENGINE_DTYPE_Q5_K;
		break;
	case 12: /* Q3_K_M */
		if (attn_v)
			return i >= 0 && i < 2 ? ENGINE_DTYPE_Q5_K : ENGINE_DTYPE_Q4_K;
		if (ffn_down)
			return i >= 0 && i < n / 16 ? ENGINE_DTYPE_Q5_K : ENGINE_DTYPE_Q4_K;
		if (attn_out || attn_qkv)
			return ENGINE_DTYPE_Q4_K;
		break;
	case 10: /* Q2_K */
		if (attn_v)
			return t->gqa >= 4 ? ENGINE_DTYPE_Q4_K : ENGINE_DTYPE_Q3_K;
		if (ffn_down || attn_out)
			return ENGINE_DTYPE_Q3_K;
		break;
	}
	return base;
}

static uint32_t fallback_of(uint32_t type)
{
	switch (type) {
	case ENGINE_DTYPE_Q4_K:
		return ENGINE_DTYPE_Q5_0;
	case ENGINE_DTYPE_Q5_K:
		return ENGINE_DTYPE_Q5_1;
	case ENGINE_DTYPE_Q6_K:
		return ENGINE_DTYPE_Q8_0;
	case ENGINE_DTYPE_Q2_K:
	case ENGINE_DTYPE_Q3_K:
	case ENGINE_DTYPE_IQ4_XS:
		return ENGINE_DTYPE_IQ4_NL;
	default:
		return ENGINE_DTYPE_F16;
	}
}

uint32_t quant_recipe_type(const struct quant_recipe *r, const struct quant_tensor *t, char *note,
			   size_t note_len)
{
	uint32_t want = choose(r, t), type = want;
	if (note && note_len)
		note[0] = '\0';
	if (t->ne0 % quant_dtype_get(want)->blck == 0)
		return want;
	while (t->ne0 % quant_dtype_get(type)->blck != 0 && type != ENGINE_DTYPE_F16)
		type = fallback_of(type);
	if (note && note_len)
		snprintf(note, note_len, "row %lld not a multiple of %u, %s -> %s",
			 (long long)t->ne0, quant_dtype_get(want)->blck, quant_dtype_name(want),
			 quant_dtype_name(type));
	return type;
}

/* ggml_n_dims: dimensions not counting trailing ones. */
static int eff_dims(const struct gguf_tensor *t)
{
	int n = (int)t->n_dims;
	while (n > 1 && t->ne[n - 1] == 1)
		n--;
	return n;
}

/* n_head / n_head_kv from the architecture's keys, 1 when absent. */
static int model_gqa(const struct gguf_file *f)
{
	struct gguf_str arch;
	uint32_t nh = 0, nkv = 0;
	char key[160];
	if (gguf_get_str(f, "general.architecture", &arch, NULL) || arch.len > 64)
		return 1;
	snprintf(key, sizeof(key), "%.*s.attention.head_count", (int)arch.len, arch.ptr);
	if (gguf_get_u32(f, key, &nh, NULL))
		return 1;
	snprintf(key, sizeof(key), "%.*s.attention.head_count_kv", (int)arch.len, arch.ptr);
	if (gguf_get_u32(f, key, &nkv, NULL) || nkv == 0)
		return 1;
	return (int)(nh / nkv);
}

void quant_recipe_shape(const struct gguf_file *f, struct quant_shape *ret)
{
	/* layers: one more than the largest "blk.N." index */
	int n = 0;
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		int l = layer_of(f->tensors[i].name);
		if (l >= n)
			n = l + 1;
	}
	ret->n_layer = n;
	ret->gqa = model_gqa(f);
	ret->has_output = gguf_tensor_by_name(f, "output.weight") != NULL;
}

bool quant_recipe_covers(const struct gguf_tensor *t)
{
	return quant_recipe_quantizable(t->name, eff_dims(t));
}

uint32_t quant_recipe_tensor(const struct quant_recipe *r, const struct quant_shape *s,
			     const struct gguf_tensor *t, char *note, size_t note_len)
{
	if (note && note_len)
		note[0] = '\0';
	if (!quant_recipe_covers(t))
		return t->type;
	struct quant_tensor tt = {
		.name = t->name,
		.ne0 = t->ne[0],
		.n_layer = s->n_layer,
		.gqa = s->gqa,
		.is_output = !strcmp(t->name, "output.weight") ||
			     (!s->has_output && !strcmp(t->name, "token_embd.weight")),
	};
	return quant_recipe_type(r, &tt, note, note_len);
}

int quant_convert_rows(const struct gguf_tensor *t, uint32_t out_type, void *out, int64_t r0,
		       int64_t r1, float *tmp)
{
	const int64_t ne0 = t->ne[0];
	const size_t out_row = quant_dtype_row_size(out_type, ne0);
	const uint8_t *src = t->data;
	/* always through tmp: rows in a mapping need not be aligned for f32
	 * loads when general.alignment is small */
	for (int64_t r = r0; r < r1; r++)
		if (quant_dequantize_row(t->type, src + (uint64_t)r * t->row_bytes, tmp, ne0) ||
		    quant_quantize_row(out_type, tmp, (uint8_t *)out + (uint64_t)r * out_row, ne0))
			return -EINVAL;
	return 0;
}
