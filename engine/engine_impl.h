/* engine/engine_impl.h: structures shared by the engine's own files. Not for
 * use outside engine/ (tests may include it). */
#ifndef EDGELM_ENGINE_IMPL_H
#define EDGELM_ENGINE_IMPL_H

#include "engine/engine.h"
#include "engine/gguf.h"
#include "engine/kernels/kern.h"
#include "engine/quant.h"

#include <stdatomic.h>
#include <string.h>

/* GCC's vector extension for the element-wise loops of forward.c and
 * matmul.c, which -O2 leaves scalar. The baseline ISA's registers are 16
 * bytes: a v4d converts four floats at once but is no loop-carried value
 * (GCC keeps that in memory). Element for element the scalar expressions. */
typedef float v4f __attribute__((vector_size(16)));
typedef double v2d __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline v4f v4f_load(const float *p)
{
	v4f v;
	memcpy(&v, p, sizeof v);
	return v;
}

static inline void v4f_store(float *p, v4f v)
{
	memcpy(p, &v, sizeof v);
}

/* ---- thread pool (threadpool.c) -----------------------------------------
 * A fixed set of persistent workers. engine_pool_run(fn, arg) opens a run of
 * fn(arg, ith, nth): the caller (ith 0) and the workers that join while the
 * run is open; it returns once every participant is done. A descheduled
 * worker may miss a run entirely, so fn must take its work from a shared
 * counter (never assume all nth call it); ith is unique per participant, for
 * per-thread scratch. Workers spin briefly, then sleep. The hot path
 * allocates nothing. */
struct pool;
typedef void (*pool_fn)(void *arg, int ith, int nth);
int engine_pool_new(int n_threads, const int *cpus, int n_cpus, struct pool **ret_pool, struct cm_err *err);
void engine_pool_free(struct pool *p);
int engine_pool_size(const struct pool *p);
void engine_pool_run(struct pool *p, pool_fn fn, void *arg);
/* With pinning (cpus given), pin the calling thread to worker 0's cpu,
 * once per thread that calls it: the thread that decodes, not the one that
 * made the pool or loaded the model (whose affinity stays its own; in
 * edgelmd the main and IPC threads keep the service cpus). */
void engine_pool_bind_caller(struct pool *p);

/* Ask for every cache line of n bytes at p before a serial pass reads
 * them: the rows a parallel run leaves behind sit partly in other cores'
 * caches, and a scalar loop keeps few of those round trips in flight. */
static inline void prefetch_bytes(const void *p, size_t n)
{
	const char *b = p;
	for (size_t i = 0; i < n; i += 64)
		__builtin_prefetch(b + i, 0, 3);
}

/* Work items [0, total) cut into n contiguous ranges, one per participant:
 * engine_pool_ranges_claim(r, ith) gives ith the front of its own range (ith % n),
 * front to back, and when that is empty the back of another's, so each
 * participant walks one long run of items (memory streams the prefetchers
 * follow) while a participant that never comes has its range finished by
 * the others. Every item is handed out exactly once; -1 when none is left.
 * Lock-free (one compare-and-swap per item), no allocation. */
#define POOL_RANGES 64
struct pool_ranges {
	int n;
	struct {
		/* front (low 32 bits) and back (high 32) of the unclaimed ids */
		_Alignas(64) _Atomic uint64_t fb;
	} r[POOL_RANGES];
};
/* n is clamped to [1, POOL_RANGES] and to total; total < 2^32 */
void engine_pool_ranges_init(struct pool_ranges *r, int64_t total, int n);
int64_t engine_pool_ranges_claim(struct pool_ranges *r, int ith);

/* ---- model (model.c; reading a GGUF per architecture: model_load.c) ------ */

enum arch_kind {
	ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_PHI3, ARCH_GEMMA, ARCH_GEMMA2, ARCH_GEMMA3,
	ARCH_COUNT
};
enum rope_kind { ROPE_NORM, ROPE_NEOX };
enum ffn_act { FFN_SILU, FFN_GELU }; /* SwiGLU, or GeGLU with tanh GELU (gemma) */

/* A weight matrix or vector: a view into the mapping. */
struct weight {
	const void *data;
	uint32_t type;
	int64_t n_in;  /* ne[0]: row length */
	int64_t n_out; /* ne[1]: rows (1 for vectors) */
	size_t row_bytes;
	const char *name;
	/* rows [0, n_x16) are repacked in the kernels' x16 layout (kern.h),
	 * a multiple of 16; the rest keep the file's layout */
	int64_t n_x16;
	/* blocks per K-segment of the repacked rows (repack.c), the last
	 * segment shorter; the row's block count when it is not cut (read
	 * only where n_x16 > 0) */
	int64_t x16_seg;
};

/* Vectors (norm weights, biases) are f32: a view into the mapping when the
 * file stores F32, else a converted copy owned by the model. NULL = absent. */
struct layer {
	const float *attn_norm, *ffn_norm;
	const float *bq, *bk, *bv, *bo; /* qwen2 (required), llama (optional) */
	const float *q_norm, *k_norm;   /* qwen3, gemma3 */
	/* gemma2/3: each half's output is normed before its residual add */
	const float *post_attn_norm, *post_ffn_norm;
	/* phi3's fused attn_qkv and ffn_up are split into row views here */
	struct weight wq, wk, wv, wo;
	struct weight w_gate, w_up, w_down;
	uint32_t n_swa; /* sliding window (keys a query sees, itself included); 0: full */
	bool rope_local; /* gemma3 sliding layers: the ctx's rope_*_local tables */
};

struct hparams {
	enum arch_kind arch;
	enum rope_kind rope;
	uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff;
	uint32_t head_dim, n_rot, n_ctx_train;
	float eps, rope_base, rope_freq_scale;
	float rope_attn_factor;  /* rope.scaling.attn_factor: multiplies cos and sin */
	uint32_t n_ctx_orig;     /* phi3 longrope: long factors when n_ctx exceeds it */
	float rope_base_local;   /* gemma3: unscaled base of sliding layers, 0: none */
	enum ffn_act act;
	uint32_t n_swa;          /* attention.sliding_window (layers say which use it) */
	float embd_scale;        /* token embeddings are multiplied by it (gemma: sqrt(n_embd)) */
	float attn_scale;        /* q.k multiplier: 1/sqrt(head_dim) unless the arch says */
	float attn_softcap;      /* gemma2: scores become c tanh(s / c); 0: off */
	float final_softcap;     /* gemma2: the same on the logits; 0: off */
	int pooling;             /* pooling_type, ENGINE_POOL_UNSPECIFIED if absent */
};

/* ---- the weight table (model_weights.c) ----------------------------------
 * Every tensor view the model computes with, listed once as loading fills
 * it, and where their bytes lie. Relocation, repacking and the model's info
 * walk this list; none of them knows the model's fields. */
enum engine_wref_kind {
	ENGINE_WREF_MATMUL, /* a matrix the forward pass multiplies by */
	ENGINE_WREF_LOOKUP, /* a matrix read a row at a time: the token embedding */
	ENGINE_WREF_VECTOR, /* an f32 vector: norm, bias, rope factors */
};

struct engine_wref {
	enum engine_wref_kind kind;
	union {
		struct weight *w; /* MATMUL, LOOKUP */
		const float **v;  /* VECTOR */
	};
};

struct engine_weights {
	struct engine_wref *ref; /* in the order loading filled them */
	int n, cap;
	const struct gguf_file *file; /* the bytes the views first point into */
	void *relocated; /* the copy they point into now (engine_weights_rebase), or NULL */
	/* the anonymous copy repacking made, owned (relocated points at it);
	 * own_copy_len is whole 2 MiB pages */
	void *own_copy;
	size_t own_copy_len;
};

/* Add a view the caller has filled; -ENOMEM. */
int engine_weights_add_matrix(struct engine_weights *ws, struct weight *w,
			      enum engine_wref_kind kind);
int engine_weights_add_vector(struct engine_weights *ws, const float **v);
/* The bytes the views lie in: the copy, or the file's. */
void engine_weights_span(const struct engine_weights *ws, void **ret_addr, size_t *ret_len);
/* Point every view into `buf`, a copy of the file's bytes, and let the
 * mapping's pages go. */
void engine_weights_rebase(struct engine_weights *ws, void *buf);
/* Copy the file's bytes into dst (the file's size or more) on the pool,
 * letting the mapping's pages go as it goes, and rebase the views on it
 * (repack.c: the load's one pass, with nothing to repack). */
int engine_weights_copy(struct engine_weights *ws, struct pool *pool, void *dst,
			struct cm_err *err);
/* Free the list and unmap the own copy (views into it dangle after: call
 * it only as the model goes). */
void engine_weights_fini(struct engine_weights *ws);

struct engine_model {
	struct gguf_file *file;
	struct hparams hp;
	struct weight tok_embd, output;
	const float *output_norm, *rope_freqs;
	const float *rope_long, *rope_short; /* phi3 longrope divisors, or NULL */
	struct layer *layers;
	void **owned; /* converted vectors to free */
	int n_owned, cap_owned;
	bool vocab_only;
	struct engine_weights weights; /* every view above, and where it lies */
	engine_tokenizer *tok;
	const struct kern_ops *kern;
	struct pool *pool;
	uint32_t n_ctx; /* cap in force */
	struct engine_model_info info;
};

/* The architecture named in the file (general.architecture) and the
 * model's name into m->hp and m->info (model_load.c). */
int engine_model_read_arch(engine_model *m, struct cm_err *err);
/* The hyperparameters and every tensor the architecture needs, checked
 * against it, into m->hp, m->layers and m->weights; m->kern and
 * m->hp.n_vocab must be set. A tensor the architecture would not use is an
 * error. */
int engine_model_read_weights(engine_model *m, struct cm_err *err);
const char *engine_arch_name(enum arch_kind a);

/* ---- load-time repacking (repack.c) --------------------------------------
 * Repack the MATMUL views of `ws` of the types the kernel variant has x16
 * kernels for into its x16 layout, in place (first moving the weights to
 * an anonymous copy in huge pages where it can). mode: 0 auto (when the
 * repacked bytes are at most half of the RAM), 1 on (whatever the size), -1
 * off. seg_bytes: the K-segment of a panel (engine_params.repack_segment).
 * cache: the repack cache's directory (engine_params.repack_cache) or NULL.
 * Fills info's n_x16_tensors, n_x16_segmented, x16_bytes, weights_anon,
 * weights_cached and repack_cache_note. */
int engine_repack(struct engine_weights *ws, const struct kern_ops *kern, struct pool *pool,
		  int mode, int seg_bytes, const char *cache, struct engine_model_info *info,
		  struct cm_err *err);
/* repack_cache.c: the key of a load's repacked copy; map the entry of that
 * key (0: the views point into it, it is ws->own_copy; else none usable,
 * note says why); write ws->own_copy as that entry (best effort). */
#define REPACK_CACHE_KEY 33
void repack_cache_key(const struct engine_weights *ws, struct weight *const *sel, int n_w,
		      char key[REPACK_CACHE_KEY]);
int repack_cache_map(struct engine_weights *ws, const char *dir, const char *key, char *note,
		     size_t note_cap);
int repack_cache_write(const struct engine_weights *ws, const char *dir, const char *key,
		       char *note, size_t note_cap);
/* Rows per group of the repacked layout: a group's panels are cut into
 * K-segments together (repack.c), and matmul.c's chunks of a repacked
 * weight are whole groups. */
#define ENGINE_X16_GROUP 128
/* Where K-segment `b0` (its first block) of the group holding rows
 * [r0, ..) starts, the group's rows being nr (128, or fewer at the end). */
static inline const uint8_t *engine_x16_segment(const struct weight *w, int64_t r0, int nr,
						int64_t b0)
{
	return (const uint8_t *)w->data + (size_t)r0 * w->row_bytes +
	       (size_t)nr * (size_t)b0 * quant_dtype_get(w->type)->size;
}
/* Row r (< n_x16) of a repacked weight in the file's layout (the token
 * embedding lookup in an output tied to it), `row` row_bytes long. */
void engine_x16_row(const struct weight *w, int64_t r, void *row);

/* 2 MiB-aligned anonymous memory of len bytes (a multiple of 2 MiB)
 * advised MADV_HUGEPAGE, not yet touched (repack.c), or NULL. */
uint8_t *engine_anon_alloc(size_t len);

/* ---- quantizing on load (quantize.c) -------------------------------------
 * plan, once the file is open and before the model reads its tensors:
 * point the file's tensor table at an anonymous region with the recipe's
 * types (the region's matrices not yet filled) and fill the quant_* info;
 * *ret stays NULL when the file is loaded as stored (info.quant_note says
 * why). run, once the pool exists: fill the matrices and hand the region
 * to m->weights as its own copy. */
struct quant_load;
int engine_quantize_plan(engine_model *m, const char *name, struct quant_load **ret,
			 struct cm_err *err);
int engine_quantize_run(engine_model *m, struct quant_load *q, struct cm_err *err);
void engine_quantize_free(struct quant_load *q); /* NULL-safe */

/* ---- context (ctx.c; the forward pass: forward.c) ------------------------ */

struct engine_ctx {
	engine_model *m;
	uint32_t n_ctx, n_seq, n_batch;
	/* KV cache: [seq][layer][pos][n_head_kv][head row], a head row being
	 * head_dim elements of kv_type (f32, f16) or ceil(head_dim / 32) Q8_0
	 * blocks, zero-padded (engine_kv_type) */
	enum engine_kv_type kv_type;
	uint8_t *k_cache, *v_cache;
	size_t kv_head_bytes;                  /* one head row */
	size_t kv_row_bytes;                   /* one position of one layer */
	size_t kv_seq_stride, kv_layer_stride; /* in bytes */
	float *kv_pad;  /* Q8_0 with head_dim % 32: a zero-padded head row */
	void *attn_q8;  /* Q8_0 K: [n_threads] the query head as Q8_0 */
	float *attn_qpad; /* [n_threads] the query head zero-padded to whole blocks */
	int32_t *eval_pos; /* engine_eval's positions, n_batch */
	int32_t *seq_len;
	float *rope_cos, *rope_sin; /* [n_ctx][n_rot/2] */
	float *rope_cos_local, *rope_sin_local; /* the same for gemma3's sliding layers */
	/* per-batch scratch, sized for n_batch tokens */
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
	void *act;        /* quantized activations, n_batch rows */
	size_t act_cap;   /* bytes */
	float *scores;    /* [n_threads][attn_mq][n_ctx] */
	int attn_mq;      /* query heads scored together (several-head kernels), or 1 */
	float *logits;    /* [n_batch][n_vocab] */
	int32_t *logit_row; /* batch index -> row in logits, -1 if none */
	float *embd;        /* [n_batch][n_embd] final hidden states (want_embd) */
	bool *embd_set;     /* which rows of embd the last decode wrote */
	bool *embd_want;    /* engine_embed's want_embd, n_batch */
	int32_t *zero_seq;  /* n_batch zeros: the seq array when a batch has none */
	uint8_t *embd_row;  /* one token_embd row, native layout (repacked tied output) */
	const float *last_logits;
	int n_logits;
	/* the batch being processed */
	int n_tok;
	const int32_t *pos, *seq;
	/* the attention's work counter, on its own cache line: every worker
	 * hits it, and sharing a line with read-mostly fields costs dearly */
	_Alignas(64) atomic_int chunk;
	char chunk_pad_[64 - sizeof(atomic_int)];
};

/* ---- matmul (matmul.c) ---------------------------------------------------- */

/* out[n_tok][w->n_out] (+)= x[n_tok][w->n_in] . W^T (+ bias), on the pool. */
void engine_matmul(engine_ctx *c, const struct weight *w, const float *x, size_t x_stride,
		   int n_tok, float *out, size_t out_stride, const float *bias, bool accumulate);

#endif
