/* engine/grammar_impl.h: the grammar's parse state, shared by grammar.c
 * and the sampler (and reached by tests). Not for use outside engine/.
 *
 * A state is a set of pushdown stacks (element positions of the compiled
 * grammar, the top at the end; every non-empty stack has a terminal on
 * top, an empty one means "accepting") plus an unfinished UTF-8 sequence. */
#ifndef EDGELM_GRAMMAR_IMPL_H
#define EDGELM_GRAMMAR_IMPL_H

#include "engine/engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct grammar_state;

int grammar_state_new(const engine_grammar *g, struct grammar_state **ret_st, struct cm_err *err);
void grammar_state_free(struct grammar_state *st); /* NULL-safe */
/* Back to the start symbol. */
void grammar_state_reset(struct grammar_state *st);
/* Feed text bytes (UTF-8, possibly a partial character at either end): 0,
 * or -EINVAL if the grammar refuses them (state unchanged). */
int grammar_state_feed(struct grammar_state *st, const char *s, size_t n);
/* Feed a token's piece; an end-of-generation token only where accepting. */
int grammar_state_advance(struct grammar_state *st, int32_t id);
/* The text so far is a complete match. */
bool grammar_state_accepting(const struct grammar_state *st);
/* Accepting, and nothing but the end may follow. */
bool grammar_state_done(const struct grammar_state *st);
/* Would grammar_state_advance(st, id) succeed? (no change) */
bool grammar_state_allows(struct grammar_state *st, int32_t id);
/* mask[0..n_vocab) = 1 for every token the grammar allows next, else 0;
 * returns how many (the trie walk of docs/engine.md, "Constrained
 * sampling"). */
int grammar_state_allowed(struct grammar_state *st, uint8_t *mask);
/* The grammar's vocabulary size (0: compiled without a tokenizer) and the
 * token to give when nothing is allowed (the tokenizer's EOS, or 0). */
int grammar_n_vocab(const engine_grammar *g);
int32_t grammar_fallback_token(const engine_grammar *g);

#endif
