/* tools/lib/recipes.c: llama-quantize's file types as per-tensor recipes
 * (gguf-formats §3), shared by edgelm-quantize and edgelm-gguf mkmodel.
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
#include "tools/lib/tools.h"

#include "common/common.h"
#include "engine/quant.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct tools_recipe recipes[] = {
	{ "Q4_K_M", ENGINE_DTYPE_Q4_K, 15 }, { "Q4_K_S", ENGINE_DTYPE_Q4_K, 14 },
	{ "Q5_K_M", ENGINE_DTYPE_Q5_K, 17 }, { "Q5_K_S", ENGINE_DTYPE_Q5_K, 16 },
	{ "Q6_K", ENGINE_DTYPE_Q6_K, 18 },   { "Q3_K_M", ENGINE_DTYPE_Q3_K, 12 },
	{ "Q2_K", ENGINE_DTYPE_Q2_K, 10 },   { "Q8_0", ENGINE_DTYPE_Q8_0, 7 },
	{ "Q4_0", ENGINE_DTYPE_Q4_0, 2 },    { "Q4_1", ENGINE_DTYPE_Q4_1, 3 },
	{ "Q5_0", ENGINE_DTYPE_Q5_0, 8 },    { "Q5_1", ENGINE_DTYPE_Q5_1, 9 },
	{ "IQ4_NL", ENGINE_DTYPE_IQ4_NL, 25 }, { "IQ4_XS", ENGINE_DTYPE_IQ4_XS, 30 },
	{ "F16", ENGINE_DTYPE_F16, 1 },	     { "BF16", ENGINE_DTYPE_BF16, 32 },
	{ "F32", ENGINE_DTYPE_F32, 0 },
};

/* llama-quantize's aliases: a bare K type names its _M mix. */
static const struct {
	const char *alias, *name;
} aliases[] = { { "Q3_K", "Q3_K_M" }, { "Q4_K", "Q4_K_M" }, { "Q5_K", "Q5_K_M" } };

const struct tools_recipe *tools_recipe_find(const char *name)
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

const struct tools_recipe *tools_recipe_at(size_t i)
{
	return i < CM_ARRAY_LEN(recipes) ? &recipes[i] : NULL;
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

bool tools_recipe_quantizable(const char *name, int eff_dims)
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
static uint32_t choose(const struct tools_recipe *r, const struct tools_tensor *t)
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

uint32_t tools_recipe_type(const struct tools_recipe *r, const struct tools_tensor *t, char *note,
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
