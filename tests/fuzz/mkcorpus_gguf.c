/* tests/fuzz/mkcorpus_gguf.c: write the seed corpus for fuzz_gguf.
 *
 * Not part of `make`; build and run from the top of the tree with
 *
 *   cc -std=c11 -D_GNU_SOURCE -I. -o /tmp/mkcorpus_gguf tests/fuzz/mkcorpus_gguf.c \
 *      build/engine/libengine.a build/common/libcommon.a -lm -pthread
 *   /tmp/mkcorpus_gguf tests/fuzz/corpus/gguf
 *
 * Seeds: small valid files made with our writer (every metadata type,
 * arrays, tensors of F32/F16/Q8_0/Q4_0, a vocab-only file with and without
 * its tail padding, other alignments, v2) and damaged variants of them.
 * Fields to damage are found by searching for the key or tensor name they
 * belong to, so the seeds stay correct if the base files change. Output is
 * deterministic. Seeds are named without ".gguf" because the tree ignores
 * *.gguf files. */
#include "engine/gguf.h"
#include "engine/quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *outdir;
static int n_written;
static size_t total_bytes;

static void die(const char *what)
{
	fprintf(stderr, "mkcorpus_gguf: %s\n", what);
	exit(1);
}

static void put(const char *name, const uint8_t *buf, size_t size)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", outdir, name);
	FILE *f = fopen(path, "wb");
	if (!f || (size && fwrite(buf, 1, size, f) != size) || fclose(f) != 0)
		die(path);
	if (size > 16384)
		die("seed larger than 16 KiB");
	n_written++;
	total_bytes += size;
}

static void finish(struct gguf_writer *w, uint8_t **buf, size_t *size)
{
	struct cm_err err = {0};
	if (gguf_writer_write_mem(w, buf, size, &err))
		die(err.msg);
	gguf_writer_free(w);
}

static struct gguf_writer *new_writer(void)
{
	struct gguf_writer *w;
	struct cm_err err;
	if (gguf_writer_new(&w, &err))
		die(err.msg);
	return w;
}

static void add(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                const int64_t *ne, const void *data)
{
	struct cm_err err = {0};
	if (gguf_writer_add_tensor(w, name, type, n_dims, ne, data, &err))
		die(err.msg);
}

static uint8_t payload[8192];

/* Every metadata type, scalar and array; four tensor types. */
static void make_all_types(uint8_t **buf, size_t *size)
{
	struct gguf_writer *w = new_writer();
	uint8_t u8 = 7;
	int8_t i8 = -7;
	uint16_t u16 = 700;
	int16_t i16 = -700;
	int64_t i64 = -70000000000ll;
	double f64 = 0.125;
	static const uint8_t au8[] = {1, 2, 3};
	static const int8_t ai8[] = {-1, 0, 1};
	static const uint16_t au16[] = {1, 65535};
	static const int16_t ai16[] = {-2, 2};
	static const uint32_t au32[] = {32, 64, 4096};
	static const int32_t ai32[] = {-1, 1, 3};
	static const float af32[] = {0.5f, -0.25f};
	static const uint8_t abool[] = {1, 0, 2};
	static const uint64_t au64[] = {1, 1ull << 40};
	static const int64_t ai64[] = {-1, 1ll << 40};
	static const double af64[] = {1e-300, 3.5};
	static const char *const astr[] = {"alpha", "", "\xe2\x96\x81gamma"};
	int rc = 0;
	rc |= gguf_writer_set_str(w, "general.architecture", "llama");
	rc |= gguf_writer_set_scalar(w, "s.u8", GGUF_TYPE_UINT8, &u8);
	rc |= gguf_writer_set_scalar(w, "s.i8", GGUF_TYPE_INT8, &i8);
	rc |= gguf_writer_set_scalar(w, "s.u16", GGUF_TYPE_UINT16, &u16);
	rc |= gguf_writer_set_scalar(w, "s.i16", GGUF_TYPE_INT16, &i16);
	rc |= gguf_writer_set_u32(w, "s.u32", 70000);
	rc |= gguf_writer_set_i32(w, "s.i32", -70000);
	rc |= gguf_writer_set_f32(w, "s.f32", 1e-6f);
	rc |= gguf_writer_set_bool(w, "s.bool", true);
	rc |= gguf_writer_set_str(w, "s.str", "hello");
	rc |= gguf_writer_set_u64(w, "s.u64", 1ull << 50);
	rc |= gguf_writer_set_scalar(w, "s.i64", GGUF_TYPE_INT64, &i64);
	rc |= gguf_writer_set_scalar(w, "s.f64", GGUF_TYPE_FLOAT64, &f64);
	rc |= gguf_writer_set_arr(w, "a.u8", GGUF_TYPE_UINT8, au8, 3);
	rc |= gguf_writer_set_arr(w, "a.i8", GGUF_TYPE_INT8, ai8, 3);
	rc |= gguf_writer_set_arr(w, "a.u16", GGUF_TYPE_UINT16, au16, 2);
	rc |= gguf_writer_set_arr(w, "a.i16", GGUF_TYPE_INT16, ai16, 2);
	rc |= gguf_writer_set_arr(w, "a.u32", GGUF_TYPE_UINT32, au32, 3);
	rc |= gguf_writer_set_arr(w, "a.i32", GGUF_TYPE_INT32, ai32, 3);
	rc |= gguf_writer_set_arr(w, "a.f32", GGUF_TYPE_FLOAT32, af32, 2);
	rc |= gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, abool, 3);
	rc |= gguf_writer_set_arr_str(w, "a.str", astr, NULL, 3);
	rc |= gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, au64, 2);
	rc |= gguf_writer_set_arr(w, "a.i64", GGUF_TYPE_INT64, ai64, 2);
	rc |= gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, af64, 2);
	rc |= gguf_writer_set_arr(w, "a.none", GGUF_TYPE_INT32, NULL, 0);
	if (rc)
		die("set");
	const int64_t ne1[] = {8}, ne2[] = {32, 2}, ne3[] = {32, 2, 2}, ne4[] = {64, 1, 1, 2};
	add(w, "w.f32", ENGINE_DTYPE_F32, 1, ne1, payload);
	add(w, "w.f16", ENGINE_DTYPE_F16, 2, ne2, payload);
	add(w, "w.q8_0", ENGINE_DTYPE_Q8_0, 3, ne3, payload);
	add(w, "w.q4_0", ENGINE_DTYPE_Q4_0, 4, ne4, payload);
	finish(w, buf, size);
}

static const char *const vocab[] = {
    "<unk>", "<s>", "</s>", "<0x0A>", "\xe2\x96\x81", "\xe2\x96\x81\x61", "b", "c"};

static void set_vocab(struct gguf_writer *w)
{
	float scores[8];
	int32_t types[8];
	for (int i = 0; i < 8; i++) {
		scores[i] = -(float)i;
		types[i] = i < 3 ? 3 : i == 3 ? 6 : 1;
	}
	int rc = 0;
	rc |= gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
	rc |= gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", vocab, NULL, 8);
	rc |= gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 8);
	rc |= gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 8);
	rc |= gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
	rc |= gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
	rc |= gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
	if (rc)
		die("vocab");
}

/* A tiny llama-shaped model. */
static void make_model(uint8_t **buf, size_t *size, uint32_t alignment)
{
	struct gguf_writer *w = new_writer();
	int rc = 0;
	rc |= gguf_writer_set_str(w, "general.architecture", "llama");
	rc |= gguf_writer_set_str(w, "general.name", "seed");
	if (alignment)
		rc |= gguf_writer_set_u32(w, "general.alignment", alignment);
	rc |= gguf_writer_set_u32(w, "llama.block_count", 1);
	rc |= gguf_writer_set_u32(w, "llama.context_length", 64);
	rc |= gguf_writer_set_u32(w, "llama.embedding_length", 32);
	rc |= gguf_writer_set_u32(w, "llama.feed_forward_length", 64);
	rc |= gguf_writer_set_u32(w, "llama.attention.head_count", 2);
	rc |= gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
	if (rc)
		die("model");
	set_vocab(w);
	/* Small enough that the whole file fits libFuzzer's -max_len=4096. */
	const int64_t embd[] = {32, 8}, norm[] = {32}, sq[] = {32, 32}, up[] = {32, 8},
	              down[] = {8, 32};
	add(w, "token_embd.weight", ENGINE_DTYPE_Q8_0, 2, embd, payload);
	add(w, "blk.0.attn_norm.weight", ENGINE_DTYPE_F32, 1, norm, payload);
	add(w, "blk.0.attn_q.weight", ENGINE_DTYPE_Q4_0, 2, sq, payload);
	add(w, "blk.0.attn_k.weight", ENGINE_DTYPE_Q4_0, 2, sq, payload);
	add(w, "blk.0.ffn_up.weight", ENGINE_DTYPE_Q8_0, 2, up, payload);
	add(w, "blk.0.ffn_down.weight", ENGINE_DTYPE_F16, 2, down, payload);
	add(w, "output_norm.weight", ENGINE_DTYPE_F32, 1, norm, payload);
	finish(w, buf, size);
}

static void make_vocab(uint8_t **buf, size_t *size)
{
	struct gguf_writer *w = new_writer();
	if (gguf_writer_set_str(w, "general.architecture", "llama"))
		die("vocab");
	set_vocab(w);
	finish(w, buf, size);
}

/* ---- damage ----------------------------------------------------------------------- */

static size_t find(const uint8_t *buf, size_t size, const char *s)
{
	size_t n = strlen(s);
	const uint8_t *p = memmem(buf, size, s, n);
	if (!p)
		die(s);
	return (size_t)(p - buf);
}

/* Fields of kv `key`: the key length, the type, the value. */
static size_t kv_len_at(const uint8_t *b, size_t n, const char *key)
{
	return find(b, n, key) - 8;
}

static size_t kv_type_at(const uint8_t *b, size_t n, const char *key)
{
	return find(b, n, key) + strlen(key);
}

static size_t kv_val_at(const uint8_t *b, size_t n, const char *key)
{
	return kv_type_at(b, n, key) + 4;
}

/* Fields of tensor `name`: n_dims, dim d, type, offset. */
static size_t t_ndims_at(const uint8_t *b, size_t n, const char *name)
{
	return find(b, n, name) + strlen(name);
}

static size_t t_dim_at(const uint8_t *b, size_t n, const char *name, int d)
{
	return t_ndims_at(b, n, name) + 4 + 8 * (size_t)d;
}

static size_t t_type_at(const uint8_t *b, size_t n, const char *name)
{
	uint32_t nd;
	memcpy(&nd, b + t_ndims_at(b, n, name), 4);
	return t_dim_at(b, n, name, (int)nd);
}

static size_t t_off_at(const uint8_t *b, size_t n, const char *name)
{
	return t_type_at(b, n, name) + 4;
}

static void put_patched(const char *name, const uint8_t *b, size_t n, size_t at, uint64_t v,
                        int width)
{
	uint8_t *c = malloc(n);
	if (!c)
		die("oom");
	memcpy(c, b, n);
	memcpy(c + at, &v, (size_t)width);
	put(name, c, n);
	free(c);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mkcorpus_gguf OUTDIR\n");
		return 1;
	}
	outdir = argv[1];
	for (size_t i = 0; i < sizeof(payload); i++)
		payload[i] = (uint8_t)(i * 37 + 11);

	uint8_t *all, *model, *vocabf, *b;
	size_t all_n, model_n, vocab_n, n;
	make_all_types(&all, &all_n);
	make_model(&model, &model_n, 0);
	make_vocab(&vocabf, &vocab_n);

	/* valid */
	put("valid-all-types", all, all_n);
	put("valid-model", model, model_n);
	put("valid-vocab-only", vocabf, vocab_n);
	size_t unpadded = vocab_n;
	while (unpadded > 0 && vocabf[unpadded - 1] == 0)
		unpadded--; /* the last token_type/bool byte is non-zero: only padding goes */
	put("valid-vocab-only-unpadded", vocabf, unpadded);
	make_model(&b, &n, 8);
	put("valid-model-align8", b, n);
	cm_free(b);
	make_model(&b, &n, 64);
	put("valid-model-align64", b, n);
	cm_free(b);
	put_patched("valid-model-v2", model, model_n, 4, 2, 4);
	{
		struct gguf_writer *w = new_writer();
		finish(w, &b, &n);
		put("valid-empty", b, n);
		put("valid-empty-unpadded", b, 24);
		cm_free(b);
	}
	{
		/* Two same-size tensors with swapped offsets. */
		struct gguf_writer *w = new_writer();
		const int64_t ne[] = {8};
		add(w, "x", ENGINE_DTYPE_F32, 1, ne, payload);
		add(w, "y", ENGINE_DTYPE_F32, 1, ne, payload + 32);
		finish(w, &b, &n);
		uint8_t *c = malloc(n);
		memcpy(c, b, n);
		uint64_t o0 = 0, o1 = 32;
		memcpy(c + t_off_at(b, n, "x"), &o1, 8);
		memcpy(c + t_off_at(b, n, "y"), &o0, 8);
		put("valid-offsets-swapped", c, n);
		free(c);
		cm_free(b);
	}

	/* header */
	put("bad-empty", model, 0);
	put("bad-trunc-header", model, 20);
	put_patched("bad-magic", model, model_n, 0, 0x4c4d4747, 4);
	put_patched("bad-version-1", model, model_n, 4, 1, 4);
	put_patched("bad-version-4", model, model_n, 4, 4, 4);
	put_patched("bad-byteswapped", model, model_n, 4, 0x03000000, 4);
	put_patched("bad-tensor-count-huge", model, model_n, 8, 1ull << 63, 8);
	put_patched("bad-kv-count-huge", model, model_n, 16, UINT64_MAX, 8);
	uint64_t n_kv;
	memcpy(&n_kv, model + 16, 8);
	put_patched("bad-kv-count-plus1", model, model_n, 16, n_kv + 1, 8);
	/* kv records */
	put_patched("bad-key-len", model, model_n, kv_len_at(model, model_n, "general.name"),
	            UINT64_MAX, 8);
	put_patched("bad-str-len", model, model_n, kv_val_at(model, model_n, "general.name"),
	            1ull << 40, 8);
	put_patched("bad-vtype", model, model_n, kv_type_at(model, model_n, "llama.block_count"),
	            13, 4);
	put_patched("bad-nested-array", vocabf, vocab_n,
	            kv_val_at(vocabf, vocab_n, "tokenizer.ggml.tokens"), GGUF_TYPE_ARRAY, 4);
	put_patched("bad-array-count", vocabf, vocab_n,
	            kv_val_at(vocabf, vocab_n, "tokenizer.ggml.scores") + 4, 1ull << 62, 8);
	put_patched("bad-array-str-len", vocabf, vocab_n,
	            kv_val_at(vocabf, vocab_n, "tokenizer.ggml.tokens") + 12, 1000000, 8);
	{
		/* Two keys of the same length made equal. */
		b = malloc(all_n);
		memcpy(b, all, all_n);
		memcpy(b + find(all, all_n, "s.u16"), "s.i16", 5);
		put("bad-dup-key", b, all_n);
		memcpy(b, all, all_n);
		memcpy(b + find(all, all_n, "w.q8_0"), "w.q4_0", 6);
		put("bad-dup-tensor", b, all_n);
		free(b);
	}
	make_model(&b, &n, 64);
	put_patched("bad-align-48", b, n, kv_val_at(b, n, "general.alignment"), 48, 4);
	put_patched("bad-align-0", b, n, kv_val_at(b, n, "general.alignment"), 0, 4);
	put_patched("bad-align-type", b, n, kv_type_at(b, n, "general.alignment"), GGUF_TYPE_INT32,
	            4);
	cm_free(b);
	/* tensor infos */
	const char *q = "blk.0.attn_q.weight";
	put_patched("bad-name-len", model, model_n, find(model, model_n, q) - 8, 64, 8);
	put_patched("bad-ndims-5", model, model_n, t_ndims_at(model, model_n, q), 5, 4);
	put_patched("bad-ndims-0", model, model_n, t_ndims_at(model, model_n, q), 0, 4);
	put_patched("bad-dim-0", model, model_n, t_dim_at(model, model_n, q, 1), 0, 8);
	put_patched("bad-dim-neg", model, model_n, t_dim_at(model, model_n, q, 1), UINT64_MAX, 8);
	put_patched("bad-dim-overflow", model, model_n, t_dim_at(model, model_n, q, 1), 1ull << 62,
	            8);
	put_patched("bad-ne0-block", model, model_n, t_dim_at(model, model_n, q, 0), 48, 8);
	put_patched("bad-type-4", model, model_n, t_type_at(model, model_n, q), 4, 4);
	put_patched("bad-type-39", model, model_n, t_type_at(model, model_n, q), 39, 4);
	put_patched("bad-type-1000", model, model_n, t_type_at(model, model_n, q), 1000, 4);
	put_patched("bad-offset-misaligned", model, model_n, t_off_at(model, model_n, q), 33, 8);
	put_patched("bad-offset-past-end", model, model_n, t_off_at(model, model_n, q), 1ull << 40,
	            8);
	put_patched("bad-offset-overflow", model, model_n, t_off_at(model, model_n, q),
	            UINT64_MAX - 31, 8);
	put_patched("bad-overlap", model, model_n, t_off_at(model, model_n, q), 0, 8);
	/* truncations */
	put("bad-trunc-kv", model, kv_val_at(model, model_n, "llama.context_length") + 2);
	put("bad-trunc-tensor-info", model, t_dim_at(model, model_n, q, 1) + 3);
	put("bad-trunc-data", model, model_n - 1);

	cm_free(all);
	cm_free(model);
	cm_free(vocabf);
	printf("mkcorpus_gguf: %d files, %zu bytes in %s\n", n_written, total_bytes, outdir);
	return 0;
}
