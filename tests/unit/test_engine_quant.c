/* tests/unit/test_engine_quant.c: the ggml type table (gguf-formats §2.1), name
 * lookup and row sizes, the thread-safe fp16 table initialisation, and our
 * reference quantizers byte for byte against llama.cpp's files (skipped
 * without the test data). Conversions, error bounds and kernels are covered
 * by tests/kernels/test_kern.c. */
#include "common/common.h"
#include "engine/gguf.h"
#include "engine/quant.h"

#include "tests/test.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* §2.1, typed in from the spec: id, name, elements and bytes per block. */
static const struct {
	uint32_t id;
	const char *name;
	uint32_t blck, size;
} spec[] = {
	{ 0, "F32", 1, 4 },	    { 1, "F16", 1, 2 },		{ 2, "Q4_0", 32, 18 },
	{ 3, "Q4_1", 32, 20 },	    { 6, "Q5_0", 32, 22 },	{ 7, "Q5_1", 32, 24 },
	{ 8, "Q8_0", 32, 34 },	    { 9, "Q8_1", 32, 36 },	{ 10, "Q2_K", 256, 84 },
	{ 11, "Q3_K", 256, 110 },   { 12, "Q4_K", 256, 144 },	{ 13, "Q5_K", 256, 176 },
	{ 14, "Q6_K", 256, 210 },   { 15, "Q8_K", 256, 292 },	{ 16, "IQ2_XXS", 256, 66 },
	{ 17, "IQ2_XS", 256, 74 },  { 18, "IQ3_XXS", 256, 98 }, { 19, "IQ1_S", 256, 50 },
	{ 20, "IQ4_NL", 32, 18 },   { 21, "IQ3_S", 256, 110 },	{ 22, "IQ2_S", 256, 82 },
	{ 23, "IQ4_XS", 256, 136 }, { 24, "I8", 1, 1 },		{ 25, "I16", 1, 2 },
	{ 26, "I32", 1, 4 },	    { 27, "I64", 1, 8 },	{ 28, "F64", 1, 8 },
	{ 29, "IQ1_M", 256, 56 },   { 30, "BF16", 1, 2 },	{ 34, "TQ1_0", 256, 54 },
	{ 35, "TQ2_0", 256, 66 },
};

static const uint32_t removed[] = { 4, 5, 31, 32, 33, 36, 37, 38 };

static void test_table_sizes(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(spec); i++) {
		const struct dtype_info *ti = quant_dtype_get(spec[i].id);
		CHECK_MSG(ti != NULL, "type %u missing", spec[i].id);
		if (!ti)
			continue;
		CHECK_STREQ(ti->name, spec[i].name);
		CHECK_MSG(ti->blck == spec[i].blck && ti->size == spec[i].size,
			  "%s: %u/%u, expected %u/%u", spec[i].name, ti->blck, ti->size,
			  spec[i].blck, spec[i].size);
		CHECK_STREQ(quant_dtype_name(spec[i].id), spec[i].name);
	}
	CHECK_EQ_INT(CM_ARRAY_LEN(spec) + CM_ARRAY_LEN(removed), ENGINE_DTYPE_COUNT);
}

static void test_table_invalid(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(removed); i++) {
		CHECK_MSG(quant_dtype_get(removed[i]) == NULL, "removed id %u", removed[i]);
		CHECK_STREQ(quant_dtype_name(removed[i]), "?");
		CHECK_EQ_INT(quant_dtype_row_size(removed[i], 32), 0);
	}
	CHECK(quant_dtype_get(ENGINE_DTYPE_COUNT) == NULL);
	CHECK(quant_dtype_get(39) == NULL); /* MXFP4 in later ggml */
	CHECK(quant_dtype_get(133) == NULL);
	CHECK(quant_dtype_get(UINT32_MAX) == NULL);
	CHECK_STREQ(quant_dtype_name(UINT32_MAX), "?");
}

static void test_computable(void)
{
	for (uint32_t t = 0; t < ENGINE_DTYPE_COUNT; t++) {
		const struct dtype_info *ti = quant_dtype_get(t);
		if (!ti)
			continue;
		/* Weight types with kernels; Q8_1/Q8_K are activation-only. */
		bool want = t == ENGINE_DTYPE_F32 || t == ENGINE_DTYPE_F16 ||
			    t == ENGINE_DTYPE_BF16 || t == ENGINE_DTYPE_Q8_0 ||
			    t == ENGINE_DTYPE_Q4_0 || t == ENGINE_DTYPE_Q4_1 ||
			    t == ENGINE_DTYPE_Q5_0 || t == ENGINE_DTYPE_Q5_1 ||
			    (t >= ENGINE_DTYPE_Q2_K && t <= ENGINE_DTYPE_Q6_K) ||
			    t == ENGINE_DTYPE_IQ4_NL || t == ENGINE_DTYPE_IQ4_XS;
		CHECK_MSG(ti->computable == want, "%s computable = %d", ti->name, ti->computable);
	}
}

static void test_from_name(void)
{
	for (size_t i = 0; i < CM_ARRAY_LEN(spec); i++)
		CHECK_EQ_INT(quant_dtype_from_name(spec[i].name), spec[i].id);
	CHECK_EQ_INT(quant_dtype_from_name("q4_0"), ENGINE_DTYPE_Q4_0);
	CHECK_EQ_INT(quant_dtype_from_name("q8_0"), ENGINE_DTYPE_Q8_0);
	CHECK_EQ_INT(quant_dtype_from_name("f16"), ENGINE_DTYPE_F16);
	CHECK_EQ_INT(quant_dtype_from_name("Bf16"), ENGINE_DTYPE_BF16);
	CHECK_EQ_INT(quant_dtype_from_name("iq4_nl"), ENGINE_DTYPE_IQ4_NL);
	CHECK_EQ_INT(quant_dtype_from_name("q6_k"), ENGINE_DTYPE_Q6_K);
	CHECK_EQ_INT(quant_dtype_from_name("Q4_K_M"), -ENOENT); /* a file type, not a tensor type */
	CHECK_EQ_INT(quant_dtype_from_name("Q4_"), -ENOENT);
	CHECK_EQ_INT(quant_dtype_from_name("Q4_00"), -ENOENT);
	CHECK_EQ_INT(quant_dtype_from_name(" Q4_0"), -ENOENT);
	CHECK_EQ_INT(quant_dtype_from_name(""), -ENOENT);
	CHECK_EQ_INT(quant_dtype_from_name("?"), -ENOENT);
	CHECK_EQ_INT(quant_dtype_from_name(NULL), -ENOENT);
}

static void test_row_size(void)
{
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_F32, 5), 20);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_F16, 7), 14);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_BF16, 1), 2);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q4_0, 64), 36);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q4_0, 4096), 2304);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q8_0, 4096), 4352);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q8_0, 172), 0); /* stories260K's FFN */
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q4_0, 33), 0);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q6_K, 768), 3 * 210);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q4_K, 896), 0); /* 3.5 super-blocks */
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_IQ4_NL, 896), 28 * 18);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_F32, 0), 0);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_F32, -4), 0);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_Q8_0, -32), 0);
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_COUNT, 32), 0);
	/* Overflow of n / blck * size is refused, not wrapped. */
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_F64, INT64_MAX - 7), 0);
	CHECK(quant_dtype_row_size(ENGINE_DTYPE_Q8_0, (INT64_MAX / 32) * 32) ==
	      (uint64_t)(INT64_MAX / 32) * 34); /* large but representable */
	CHECK_EQ_INT(quant_dtype_row_size(ENGINE_DTYPE_I8, INT64_MAX),
		     (uint64_t)INT64_MAX <= SIZE_MAX ? (long long)INT64_MAX : 0);
	/* Every valid type: one block is `size` bytes, one element short is 0. */
	for (size_t i = 0; i < CM_ARRAY_LEN(spec); i++) {
		CHECK_EQ_INT(quant_dtype_row_size(spec[i].id, spec[i].blck), spec[i].size);
		CHECK_EQ_INT(quant_dtype_row_size(spec[i].id, 3 * (int64_t)spec[i].blck),
			     3 * spec[i].size);
		if (spec[i].blck > 1)
			CHECK_EQ_INT(quant_dtype_row_size(spec[i].id, spec[i].blck - 1), 0);
	}
}

/* The block structs match the table. */
static void test_block_structs(void)
{
	CHECK_EQ_INT(sizeof(struct block_q4_0), quant_dtype_get(ENGINE_DTYPE_Q4_0)->size);
	CHECK_EQ_INT(sizeof(struct block_q8_0), quant_dtype_get(ENGINE_DTYPE_Q8_0)->size);
	CHECK_EQ_INT(sizeof(struct block_q4_1), quant_dtype_get(ENGINE_DTYPE_Q4_1)->size);
	CHECK_EQ_INT(sizeof(struct block_q5_0), quant_dtype_get(ENGINE_DTYPE_Q5_0)->size);
	CHECK_EQ_INT(sizeof(struct block_q5_1), quant_dtype_get(ENGINE_DTYPE_Q5_1)->size);
	CHECK_EQ_INT(sizeof(struct block_q8_1), quant_dtype_get(ENGINE_DTYPE_Q8_1)->size);
	CHECK_EQ_INT(sizeof(struct block_q2_K), quant_dtype_get(ENGINE_DTYPE_Q2_K)->size);
	CHECK_EQ_INT(sizeof(struct block_q3_K), quant_dtype_get(ENGINE_DTYPE_Q3_K)->size);
	CHECK_EQ_INT(sizeof(struct block_q4_K), quant_dtype_get(ENGINE_DTYPE_Q4_K)->size);
	CHECK_EQ_INT(sizeof(struct block_q5_K), quant_dtype_get(ENGINE_DTYPE_Q5_K)->size);
	CHECK_EQ_INT(sizeof(struct block_q6_K), quant_dtype_get(ENGINE_DTYPE_Q6_K)->size);
	CHECK_EQ_INT(sizeof(struct block_q8_K), quant_dtype_get(ENGINE_DTYPE_Q8_K)->size);
	CHECK_EQ_INT(sizeof(struct block_iq4_nl), quant_dtype_get(ENGINE_DTYPE_IQ4_NL)->size);
	CHECK_EQ_INT(sizeof(struct block_iq4_xs), quant_dtype_get(ENGINE_DTYPE_IQ4_XS)->size);
	/* Field offsets that the formats fix (§2.3-2.5). */
	CHECK_EQ_INT(offsetof(struct block_q2_K, d), 80);
	CHECK_EQ_INT(offsetof(struct block_q3_K, scales), 96);
	CHECK_EQ_INT(offsetof(struct block_q4_K, qs), 16);
	CHECK_EQ_INT(offsetof(struct block_q5_K, qs), 48);
	CHECK_EQ_INT(offsetof(struct block_q6_K, scales), 192);
	CHECK_EQ_INT(offsetof(struct block_q8_K, bsums), 260);
	CHECK_EQ_INT(offsetof(struct block_iq4_xs, qs), 8);
	CHECK_EQ_INT(QK4_0, quant_dtype_get(ENGINE_DTYPE_Q4_0)->blck);
	CHECK_EQ_INT(QK8_0, quant_dtype_get(ENGINE_DTYPE_Q8_0)->blck);
	CHECK_EQ_INT(QK_K, quant_dtype_get(ENGINE_DTYPE_Q4_K)->blck);
}

/* quant_init from many threads at once: every thread sees a full table. */
static void *init_thread(void *arg)
{
	int *bad = arg;
	quant_init();
	/* 0x3c00 = 1, 0xc000 = -2, 0x7bff = 65504, 0x0001 = 2^-24, 0x7c00 = inf */
	*bad = !(quant_fp16_table[0x3c00] == 1.0f && quant_fp16_table[0xc000] == -2.0f &&
		 quant_fp16_table[0x7bff] == 65504.0f && quant_fp16_table[0x0001] == 0x1p-24f &&
		 isinf(quant_fp16_table[0x7c00]) && isnan(quant_fp16_table[0xfe00]) &&
		 quant_fp16_table[0x3555] == 0x1.554p-2f);
	return NULL;
}

static void test_init_threads(void)
{
	pthread_t th[8];
	int bad[8] = { 0 };
	int started = 0;
	for (int i = 0; i < 8; i++)
		if (pthread_create(&th[i], NULL, init_thread, &bad[i]) == 0)
			started++;
		else
			break;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	CHECK(started > 0);
	for (int i = 0; i < started; i++)
		CHECK_EQ_INT(bad[i], 0);
}

/* stories3M-q8_0.gguf, -q4_0, -q6_k and -q4_k_m were written by
 * llama-quantize (no importance matrix) from stories3M-f32.gguf: every tensor
 * of type qtype in them must be what our quantizer makes of the F32 source,
 * byte for byte. The squared error of their dequantized weights and of ours
 * against the source is printed too (for docs/engine.md). */
static void check_llama_cpp_file(const char *qfile, uint32_t qtype, int min_tensors)
{
	char src_path[4096], q_path[4096];
	snprintf(src_path, sizeof(src_path), "%s", test_data_path("models/stories3M-f32.gguf"));
	snprintf(q_path, sizeof(q_path), "%s", test_data_path(qfile));
	if (!test_file_exists(src_path) || !test_file_exists(q_path)) {
		TEST_SKIP_DATA("%s or %s not found (set EDGELM_TESTDATA)", src_path, q_path);
		return;
	}
	struct gguf_file *src = NULL, *q = NULL;
	struct cm_err err = { 0 };
	CHECK_OK(gguf_open(src_path, &src, &err));
	CHECK_OK(gguf_open(q_path, &q, &err));
	if (!src || !q) {
		fprintf(stderr, "  %s\n", err.msg);
		gguf_close(src);
		gguf_close(q);
		return;
	}
	int n_checked = 0;
	double se_ours = 0, se_theirs = 0, sx2 = 0;
	for (uint64_t i = 0; i < q->n_tensors; i++) {
		const struct gguf_tensor *tq = &q->tensors[i];
		if (tq->type != qtype)
			continue;
		const struct gguf_tensor *ts = gguf_tensor_by_name(src, tq->name);
		int64_t ne0 = tq->ne[0], rows = tq->ne[1] * tq->ne[2] * tq->ne[3];
		bool match = ts && ts->type == ENGINE_DTYPE_F32 && ts->ne[0] == ne0 &&
			     ts->nbytes == (uint64_t)(ne0 * rows) * 4;
		CHECK_MSG(match, "%s: no matching F32 source", tq->name);
		if (!match)
			continue;
		float *row = malloc((size_t)ne0 * sizeof(float));
		float *deq = malloc((size_t)ne0 * sizeof(float));
		uint8_t *out = malloc(tq->row_bytes);
		int bad_rows = 0;
		for (int64_t r = 0; row && deq && out && r < rows; r++) {
			const uint8_t *theirs = (const uint8_t *)tq->data + r * tq->row_bytes;
			memcpy(row, (const uint8_t *)ts->data + r * ts->row_bytes,
			       (size_t)ne0 * sizeof(float));
			CHECK_OK(quant_quantize_row(qtype, row, out, ne0));
			bad_rows += memcmp(out, theirs, tq->row_bytes) != 0;
			CHECK_OK(quant_dequantize_row(qtype, theirs, deq, ne0));
			for (int64_t j = 0; j < ne0; j++)
				se_theirs += ((double)deq[j] - row[j]) * ((double)deq[j] - row[j]);
			CHECK_OK(quant_dequantize_row(qtype, out, deq, ne0));
			for (int64_t j = 0; j < ne0; j++) {
				se_ours += ((double)deq[j] - row[j]) * ((double)deq[j] - row[j]);
				sx2 += (double)row[j] * row[j];
			}
		}
		free(deq);
		CHECK_MSG(bad_rows == 0, "%s: %d of %lld rows differ from llama.cpp's", tq->name,
			  bad_rows, (long long)rows);
		free(row);
		free(out);
		n_checked++;
	}
	CHECK_MSG(n_checked >= min_tensors, "only %d %s tensors compared", n_checked,
		  quant_dtype_name(qtype));
	fprintf(stderr, "%s: %d %s tensors, relative squared error ours %.4g, llama.cpp's %.4g\n",
		qfile, n_checked, quant_dtype_name(qtype), se_ours / sx2, se_theirs / sx2);
	gguf_close(src);
	gguf_close(q);
}

static void test_llama_cpp_q8_0(void)
{
	check_llama_cpp_file("models/stories3M-q8_0.gguf", ENGINE_DTYPE_Q8_0, 29);
}

static void test_llama_cpp_q4_0(void)
{
	check_llama_cpp_file("models/stories3M-q4_0.gguf", ENGINE_DTYPE_Q4_0, 29);
}

/* The Q6_K output matrix of the Q4_0 file, and the Q6_K / Q4_K_M files. */
static void test_llama_cpp_q6_k(void)
{
	check_llama_cpp_file("models/stories3M-q4_0.gguf", ENGINE_DTYPE_Q6_K, 1);
	check_llama_cpp_file("models/stories3M-q6_k.gguf", ENGINE_DTYPE_Q6_K, 29);
}

static void test_llama_cpp_q4_k(void)
{
	check_llama_cpp_file("models/stories3M-q4_k_m.gguf", ENGINE_DTYPE_Q4_K, 25);
	check_llama_cpp_file("models/stories3M-q4_k_m.gguf", ENGINE_DTYPE_Q6_K, 5);
}

int main(void)
{
	TEST_RUN(test_table_sizes);
	TEST_RUN(test_table_invalid);
	TEST_RUN(test_computable);
	TEST_RUN(test_from_name);
	TEST_RUN(test_row_size);
	TEST_RUN(test_block_structs);
	TEST_RUN(test_init_threads);
	TEST_RUN(test_llama_cpp_q8_0);
	TEST_RUN(test_llama_cpp_q4_0);
	TEST_RUN(test_llama_cpp_q6_k);
	TEST_RUN(test_llama_cpp_q4_k);
	return test_finish();
}
