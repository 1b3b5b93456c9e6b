/* tools/lib/tools.h: code shared by the command-line tools. */
#ifndef EDGELM_TOOLS_H
#define EDGELM_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- recipes.c: llama-quantize's file types as per-tensor rules ---------------- */

struct tools_recipe {
	const char *name;   /* "Q4_K_M", "Q8_0", "F16", ... */
	uint32_t base;      /* ENGINE_DTYPE_* of most matrices */
	uint32_t file_type; /* general.file_type (llama_ftype) */
};

/* What the rules look at for one matrix. */
struct tools_tensor {
	const char *name; /* GGUF tensor name ("blk.3.attn_v.weight") */
	int64_t ne0;      /* row length */
	int n_layer;      /* layers in the model */
	int gqa;          /* n_head / n_head_kv, 1 when unknown */
	bool is_output;   /* output.weight, or token_embd.weight when tied */
};

/* A recipe by name, case-insensitive ("q4_k_m"; "Q4_K" means Q4_K_M as in
 * llama-quantize), or NULL. */
const struct tools_recipe *tools_recipe_find(const char *name);
/* The i-th recipe (for usage texts), NULL past the end. */
const struct tools_recipe *tools_recipe_at(size_t i);
/* Whether llama-quantize converts a tensor: a name ending in "weight", at
 * least 2 dimensions not counting trailing 1s, not a norm, router or
 * position/token-type embedding. */
bool tools_recipe_quantizable(const char *name, int eff_dims);
/* The type recipe r gives matrix t. When the chosen type's block does not
 * divide the row, the fallback is returned and `note` (if not NULL) gets
 * "row N not a multiple of B, T1 -> T2"; otherwise note is "". */
uint32_t tools_recipe_type(const struct tools_recipe *r, const struct tools_tensor *t, char *note,
			   size_t note_len);

/* ---- mkmodel.c --------------------------------------------------------------- */

/* `edgelm-gguf mkmodel ...`: write a synthetic model of a named real shape.
 * argv[0] is "mkmodel". Returns the process exit code. */
int tools_mkmodel_main(int argc, char **argv);
void tools_mkmodel_usage(FILE *o);

/* `edgelm-bench --daemon URL ...`: load a running daemon with concurrent
 * clients (tools/lib/bench_daemon.c). Returns the process exit code. */
int tools_bench_daemon_main(int argc, char **argv);
void tools_bench_daemon_usage(FILE *o);

#endif
