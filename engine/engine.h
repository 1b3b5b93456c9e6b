/* engine/engine.h: the inference engine's public interface.
 *
 * The engine knows nothing of nng, JSON, systemd or logging: it uses libc,
 * libm and pthreads only. Calls are not thread-safe: one thread (the
 * daemon's scheduler, or a tool's main) owns a model and its contexts; the
 * parallelism is inside the engine's worker pool. The exceptions are the
 * functions taking a `const engine_tokenizer *` and the chat template
 * functions: they keep their scratch per call, so any number of threads may
 * tokenize, detokenize and render at once, also while the owner runs the
 * model (tests/unit/test_engine_tokenizer_threads.c).
 *
 * Objects: engine_model (weights, hyperparameters, tokenizer, worker pool),
 * engine_ctx (KV cache for up to n_seq sequences plus scratch for a batch of
 * up to n_batch tokens), engine_tokenizer (inside the model, also loadable
 * from a vocab-only GGUF), engine_sampler. */
#ifndef EDGELM_ENGINE_H
#define EDGELM_ENGINE_H

#include "common/common.h"
#include "common/cpu.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct engine_model engine_model;
typedef struct engine_ctx engine_ctx;
typedef struct engine_tokenizer engine_tokenizer;
typedef struct engine_sampler engine_sampler;
typedef struct engine_grammar engine_grammar;

/* ---- model ------------------------------------------------------------- */

/* Slots for ggml tensor type ids (0..39, engine_dtype_name). */
#define ENGINE_TYPE_SLOTS 40

struct engine_params {
	int n_threads;        /* workers, 0 = one per online CPU */
	const int *cpus;      /* optional CPU list to pin worker i to cpus[i % n_cpus] */
	int n_cpus;
	uint32_t ctx_max;     /* cap on the context length, 0 = the file's */
	const char *isa;      /* force a kernel variant ("scalar", ...), NULL = best */
	/* The instruction sets to choose kernels for (common/cpu.h), e.g. the
	 * daemon's tuning report, so the two cannot disagree; NULL: probe. */
	const struct cm_cpu_isa *cpu;
	bool vocab_only;      /* load only the tokenizer (vocab GGUFs) */
	/* Load-time repacking of Q4_0/Q8_0 weights into the kernels'
	 * interleaved layout: 0 auto (when the kernel variant has kernels for
	 * it and the copy takes at most half of the RAM), 1 on, -1 off. The
	 * repacked tensors become private memory of the process (x16_bytes). */
	int repack;
	/* Bytes of a repacked panel's K-segment (repack.c): 0 the default
	 * for the type, -1 whole rows, > 0 that for every type. For tests and
	 * comparisons. */
	int repack_segment;
	/* A directory for the repacked weights (NULL or "": none). The first
	 * load writes its repacked copy there, keyed by the file's identity
	 * (device, inode, size, mtime) and the layout (the tensors repacked,
	 * their types and segments, the layout version); later loads map that
	 * file instead of building the copy, which costs no fresh memory
	 * (docs/engine.md, "The repack cache"). A stale or damaged entry is
	 * rebuilt; a directory that cannot be written only costs the cache. */
	const char *repack_cache;
	/* Called once the model's shape is known (engine_model_get_info,
	 * engine_model_kv_bytes_per_token work) and before its weights are
	 * read or copied: a caller's memory check runs before the load's
	 * peak, not after it. A nonzero return stops the load with it. NULL:
	 * none. */
	int (*before_weights)(void *ud, const engine_model *m, struct cm_err *err);
	void *before_weights_ud;
};

struct engine_model_info {
	char arch[32];
	char name[128];
	uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, head_dim;
	uint32_t n_ctx_train, n_ctx; /* the file's, and the cap in force */
	float rope_base, norm_eps;
	uint64_t n_params;
	uint64_t weight_bytes;       /* bytes of all tensors */
	uint64_t weight_bytes_token; /* bytes read per decoded token (matmuls) */
	const char *isa;             /* kernel variant chosen */
	int n_threads;
	uint32_t type_counts[ENGINE_TYPE_SLOTS]; /* tensors per ggml type id */
	int n_fallback;              /* tensors kept wider than requested (quantizer) */
	uint32_t n_x16_tensors;      /* tensors repacked at load (engine_params.repack) */
	uint64_t x16_bytes;          /* their bytes, now private memory */
	uint32_t n_x16_segmented;    /* of them, cut into K-segments */
	/* The weights live in the engine's own 2 MiB-aligned anonymous copy
	 * with MADV_HUGEPAGE (made when repacking: the pages become private
	 * memory anyway, and a file mapping never gets huge pages), so a
	 * caller's hugepages copy (engine_model_relocate) has nothing to do. */
	bool weights_anon;
	/* the repacked weights are mapped from the repack cache (the load
	 * built no copy); repack_cache_note says what the cache did */
	bool weights_cached;
	char repack_cache_note[160];
};

/* engine_params.repack from "auto", "on" or "off" (NULL: auto); -EINVAL
 * for anything else. */
int engine_repack_parse(const char *s, int *ret_mode);

int engine_model_load(const char *path, const struct engine_params *p, engine_model **ret_model,
		      struct cm_err *err);
void engine_model_free(engine_model *m); /* NULL-safe */
/* A ggml tensor type's name ("Q4_0", "F16", ...), "?" for an unknown id. */
const char *engine_dtype_name(uint32_t type);
void engine_model_get_info(const engine_model *m, struct engine_model_info *ret_info);
const engine_tokenizer *engine_model_tokenizer(const engine_model *m);

/* Memory the engine reads on every token, for mlock and prefault: the
 * model's mapping (read-only) and a context's KV cache (writable). */
struct engine_region {
	void *addr;
	size_t len;
	const char *what;
};
void engine_model_region(const engine_model *m, struct engine_region *ret);
/* Fills up to max regions, returns how many. */
int engine_ctx_regions(const engine_ctx *c, struct engine_region *ret, int max);

/* Copy the weights into `buf` (at least the file's size; e.g. 2 MiB-aligned
 * anonymous memory, which the kernel backs with huge pages where a file
 * mapping would not be) and compute from the copy from now on. The caller
 * keeps `buf` alive until engine_model_free. Call from the owning thread,
 * between steps (no decode running). */
int engine_model_relocate(engine_model *m, void *buf, size_t len, struct cm_err *err);

/* ---- KV cache types ------------------------------------------------------ */

/* What the KV cache stores (docs/engine.md, "The KV cache"): f32; f16
 * (half the bytes, the same greedy output on the reference tests: the
 * default); q8_0 (32-element blocks with an f16
 * scale, per head row, zero-padded to whole blocks: about a quarter of
 * f32 for head dimensions that are multiples of 32). Attention reads the
 * cache in its type; a query meets a q8_0 K cache quantized to Q8_0 too. */
enum engine_kv_type {
	ENGINE_KV_DEFAULT = 0, /* ENGINE_KV_F16 */
	ENGINE_KV_F32,
	ENGINE_KV_F16,
	ENGINE_KV_Q8_0,
};
/* "f32", "f16", "q8_0" (ENGINE_KV_DEFAULT: the default's name). */
const char *engine_kv_type_name(enum engine_kv_type t);
/* The type named `name` (as engine_kv_type_name spells it, any case), or
 * -ENOENT. */
int engine_kv_type_from_name(const char *name, enum engine_kv_type *ret);
/* The accepted names, "f32|f16|q8_0", for usage texts and messages. */
const char *engine_kv_type_list(void);

/* Bytes of KV cache per token and sequence (all layers, K and V) in type t. */
uint64_t engine_model_kv_bytes_per_token(const engine_model *m, enum engine_kv_type t);

/* ---- contexts and batches ---------------------------------------------- */

struct engine_ctx_params {
	uint32_t n_ctx;   /* KV positions per sequence, 0 = model's n_ctx */
	uint32_t n_seq;   /* sequences (KV slots), >= 1 */
	uint32_t n_batch; /* max tokens per engine_decode call, 0 = 512; engine_eval
			   * feeds longer inputs in chunks of n_batch */
	enum engine_kv_type kv_type; /* 0: ENGINE_KV_DEFAULT (f16) */
};

int engine_ctx_new(engine_model *m, const struct engine_ctx_params *p, engine_ctx **ret_ctx,
		   struct cm_err *err);
void engine_ctx_free(engine_ctx *c); /* NULL-safe */
/* The KV cache type (never ENGINE_KV_DEFAULT) and positions per sequence. */
enum engine_kv_type engine_ctx_kv_type(const engine_ctx *c);
uint32_t engine_ctx_n_ctx(const engine_ctx *c);

/* One batch: token i goes to sequence seq[i] at position pos[i]. Positions of
 * one sequence within a batch must be consecutive and increasing, and the
 * first must equal that sequence's current length (KV entries past it are
 * discarded). want_logits[i] asks for the logits of token i (NULL: only the
 * last token of the batch). */
struct engine_batch {
	int n;
	const int32_t *tokens;
	const int32_t *pos;
	const int32_t *seq;
	const bool *want_logits;
};

int engine_decode(engine_ctx *c, const struct engine_batch *b, struct cm_err *err);
/* Logits of batch token i from the last engine_decode (n_vocab floats), or
 * NULL if they were not requested. Valid until the next decode. */
const float *engine_get_logits(const engine_ctx *c, int i);
/* Logits of the last token that asked for them in the last decode. */
const float *engine_get_logits_last(const engine_ctx *c);
/* Forget a sequence's KV from position `pos` on (0 clears it). */
void engine_seq_truncate(engine_ctx *c, int seq, int pos);
int engine_seq_len(const engine_ctx *c, int seq);
/* Copy sequence src's first n KV positions into dst (prefix reuse). */
int engine_seq_copy(engine_ctx *c, int dst, int src, int n);

/* Convenience for one sequence: feed tokens[0..n) at pos.. into seq 0 in
 * chunks of n_batch (prefill in chunks: the scratch buffers are sized for
 * n_batch tokens, whatever the prompt's length), computing logits for the
 * last one (engine_get_logits_last). */
int engine_eval(engine_ctx *c, const int32_t *tokens, int n, int pos, struct cm_err *err);

/* ---- tokenizer ----------------------------------------------------------- */

enum engine_token_attr {
	ENGINE_TOKEN_NORMAL = 1 << 0,
	ENGINE_TOKEN_UNKNOWN = 1 << 1,
	ENGINE_TOKEN_CONTROL = 1 << 2,
	ENGINE_TOKEN_USER_DEFINED = 1 << 3,
	ENGINE_TOKEN_UNUSED = 1 << 4,
	ENGINE_TOKEN_BYTE = 1 << 5,
};

struct gguf_file;
/* Build a tokenizer from a GGUF's tokenizer.* metadata (SPM "llama" model;
 * other models return -ENOTSUP with a message naming the model). */
int engine_tokenizer_new(const struct gguf_file *f, engine_tokenizer **ret_tok, struct cm_err *err);
void engine_tokenizer_free(engine_tokenizer *t); /* NULL-safe */
/* Load just the tokenizer from a file (vocab-only GGUFs). */
int engine_tokenizer_load(const char *path, engine_tokenizer **ret_tok, struct cm_err *err);

int engine_tokenizer_n_vocab(const engine_tokenizer *t);
int32_t engine_tokenizer_bos(const engine_tokenizer *t); /* -1 if none */
int32_t engine_tokenizer_eos(const engine_tokenizer *t);
bool engine_tokenizer_add_bos(const engine_tokenizer *t);
/* End of generation: eos, eot, eom and the end-of-turn tokens. */
bool engine_tokenizer_is_eog(const engine_tokenizer *t, int32_t id);
uint32_t engine_tokenizer_attr(const engine_tokenizer *t, int32_t id);
/* The token's text as stored (SPM: with U+2581), NULL if out of range. */
const char *engine_tokenizer_text(const engine_tokenizer *t, int32_t id, size_t *ret_len);
/* Look up a token by its exact text, -1 if absent. */
int32_t engine_tokenizer_find(const engine_tokenizer *t, const char *text, size_t len);

/* Tokenize text[0..len). add_special: BOS/EOS as the model's flags say.
 * parse_special: match control tokens written in the text ("<s>").
 * Writes up to max ids; *ret_n gets the full count, and -ENOBUFS is
 * returned if it exceeds max (call again with a bigger buffer). */
int engine_tokenize(const engine_tokenizer *t, const char *text, size_t len, bool add_special,
		    bool parse_special, int32_t *out, int max, int *ret_n, struct cm_err *err);

/* The bytes a token stands for (SPM: U+2581 -> ' ', <0xNN> -> byte;
 * control tokens: empty unless `special`). Returns the length written (not
 * NUL-terminated), or -ENOBUFS if cap is too small, -EINVAL for a bad id. */
int engine_token_to_piece(const engine_tokenizer *t, int32_t id, bool special, char *buf, size_t cap);

/* Streaming detokenizer: never emits half a UTF-8 character. Feed each
 * generated token; complete characters are appended to out (cap bytes),
 * the length is returned. Incomplete trailing bytes wait for the next token;
 * engine_detok_flush() emits whatever is left (invalid sequences as U+FFFD). */
struct engine_detok {
	char pend[8];
	int n_pend;
	bool first; /* strip the leading space of the first piece (SPM) */
};
void engine_detok_init(struct engine_detok *d, const engine_tokenizer *t);
int engine_detok_push(struct engine_detok *d, const engine_tokenizer *t, int32_t id, char *out,
		      size_t cap);
int engine_detok_flush(struct engine_detok *d, char *out, size_t cap);
/* Whole-sequence detokenization into a malloc'ed NUL-terminated string. */
int engine_detokenize(const engine_tokenizer *t, const int32_t *ids, int n, bool special,
		      char **ret_text, struct cm_err *err);

/* ---- chat templates ------------------------------------------------------ */

/* The known prompt formats (../shared/docs/gguf-formats.md §6); the names
 * (engine_chat_format_name) are llama.cpp's where it has one. */
enum engine_chat_format {
	ENGINE_CHAT_CHATML,            /* "chatml": Qwen 2/2.5, SmolLM, Hermes */
	ENGINE_CHAT_QWEN3,             /* "qwen3": chatml, thinking off */
	ENGINE_CHAT_LLAMA2,            /* "llama2": [INST], no <<SYS>> */
	ENGINE_CHAT_LLAMA2_SYS,        /* "llama2-sys" */
	ENGINE_CHAT_LLAMA2_SYS_BOS,    /* "llama2-sys-bos" */
	ENGINE_CHAT_LLAMA2_SYS_STRIP,  /* "llama2-sys-strip" */
	ENGINE_CHAT_MISTRAL_V1,        /* "mistral-v1" */
	ENGINE_CHAT_MISTRAL_V3,        /* "mistral-v3" */
	ENGINE_CHAT_MISTRAL_V3_TEKKEN, /* "mistral-v3-tekken" */
	ENGINE_CHAT_MISTRAL_V7,        /* "mistral-v7" */
	ENGINE_CHAT_LLAMA3,            /* "llama3": Llama 3, 3.1, 3.2 */
	ENGINE_CHAT_PHI3,              /* "phi3" */
	ENGINE_CHAT_PHI4,              /* "phi4" */
	ENGINE_CHAT_ZEPHYR,            /* "zephyr": <|endoftext|> ends a message */
	ENGINE_CHAT_ZEPHYR_EOS,        /* "zephyr-eos": TinyLlama, Zephyr-beta: </s> */
	ENGINE_CHAT_FALCON3,           /* "falcon3" */
	ENGINE_CHAT_GEMMA,             /* "gemma": Gemma 1/2/3 */
	ENGINE_CHAT_DEEPSEEK3,         /* "deepseek3": DeepSeek V3, R1 distills */
	ENGINE_CHAT_N_FORMATS
};
enum engine_chat_role { ENGINE_CHAT_SYSTEM, ENGINE_CHAT_USER, ENGINE_CHAT_ASSISTANT };

struct engine_chat_msg {
	enum engine_chat_role role;
	const char *content;
	size_t len;
};

/* The model's format from its tokenizer.chat_template (chatml when it has
 * none), or the one named by `override`. -ENOTSUP with a message naming the
 * override option for an unknown template. */
int engine_chat_detect(const engine_model *m, const char *override, enum engine_chat_format *ret,
		       struct cm_err *err);
/* The same for a template text (NULL or empty: chatml); a text equal to a
 * format name selects that format. */
int engine_chat_detect_template(const char *tmpl, size_t len, enum engine_chat_format *ret,
				struct cm_err *err);
const char *engine_chat_format_name(enum engine_chat_format f);
/* A format by name (as engine_chat_format_name gives it); -ENOENT if none. */
int engine_chat_format_from_name(const char *name, enum engine_chat_format *ret);
/* Every format name, comma-separated, for usage texts and messages. */
const char *engine_chat_format_list(void);
/* Render messages into prompt text (cm_malloc'ed, NUL-terminated). BOS is
 * not written: tokenize the result with add_special and parse_special. */
int engine_chat_render(enum engine_chat_format f, const struct engine_chat_msg *msgs, size_t n,
		       bool add_generation_prompt, char **ret_text, size_t *ret_len,
		       struct cm_err *err);

/* ---- grammars (docs/grammar.md) ------------------------------------------ */

/* Compile a GBNF grammar (llama.cpp's format; start symbol `root`) for a
 * tokenizer's vocabulary. Errors name the line and column. The compiled
 * grammar is immutable and may be shared by several samplers (and
 * threads) at once; it must outlive them. A token's text is its piece
 * (engine_token_to_piece: SPM's U+2581 is a space, also at the start of
 * the output). tok NULL: only check the grammar (no sampler takes it). */
int engine_grammar_new(const engine_tokenizer *tok, const char *gbnf, size_t len,
		       engine_grammar **ret_g, struct cm_err *err);
void engine_grammar_free(engine_grammar *g); /* NULL-safe */

/* ---- sampler ------------------------------------------------------------- */

struct engine_sampler_params {
	float temp;             /* <= 0: greedy */
	int32_t top_k;          /* <= 0: off */
	float top_p;            /* >= 1: off */
	float min_p;            /* <= 0: off */
	float repeat_penalty;   /* 1: off */
	float freq_penalty;     /* 0: off */
	float presence_penalty; /* 0: off */
	int32_t penalty_last_n; /* window, 0 = off, -1 = whole history */
	uint64_t seed;
	/* logit_bias: n_bias token ids and what to add to their logits before
	 * anything else (a bias of -100 or less bans the token); read by
	 * engine_sampler_new only, which keeps its own copy */
	const int32_t *bias_ids;
	const float *bias;
	int n_bias;
	/* Constrained sampling (docs/engine.md): only tokens the grammar
	 * allows are chosen. Borrowed; it must outlive the sampler. */
	const engine_grammar *grammar; /* NULL: none */
};

/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05, no
 * penalties, window 64, seed 0. */
void engine_sampler_params_default(struct engine_sampler_params *p);
int engine_sampler_new(const struct engine_sampler_params *p, int n_vocab, engine_sampler **ret_s,
		       struct cm_err *err);
void engine_sampler_free(engine_sampler *s); /* NULL-safe */
/* Record a token in the penalty history (prompt tokens too). */
void engine_sampler_accept(engine_sampler *s, int32_t id);
void engine_sampler_reset(engine_sampler *s);
/* The model's log-probability of token `id` under n_vocab logits (a log
 * softmax of the raw logits: temperature 1, no bias, penalties or filters;
 * NaN logits count as -inf), and the n_top most likely tokens best first
 * (ties to the lower id) into top_ids/top_lps (n_top <= 64). Returns the
 * log-probability of `id`. */
float engine_logprobs(const float *logits, int n_vocab, int32_t id, int n_top, int32_t *top_ids,
		      float *top_lps);

/* Choose the next token from n_vocab logits (not modified). Chain as
 * llama.cpp: logit_bias -> penalties -> top_k -> top_p -> min_p ->
 * temperature -> draw. A banned token is never chosen while any other
 * token is left. */
int32_t engine_sampler_sample(engine_sampler *s, const float *logits);

/* With a grammar, engine_sampler_sample() only returns tokens the grammar
 * allows (end-of-generation tokens only where the grammar is in an
 * accepting state; the tokenizer's EOS when it allows nothing at all);
 * greedy sampling picks the best allowed token. engine_sampler_reset
 * also resets the grammar state to the start. */
/* Advance the grammar with a generated token (call after sampling it;
 * engine_sampler_accept stays the penalty history, prompt tokens too).
 * 0, or -EINVAL if the grammar refuses the token (state unchanged).
 * Without a grammar: 0. */
int engine_sampler_advance(engine_sampler *s, int32_t id);
/* The grammar has matched a complete value and allows no further
 * token except end-of-generation: generation should end ("stop"). */
bool engine_sampler_grammar_done(const engine_sampler *s);

#endif
