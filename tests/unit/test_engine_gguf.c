/* tests/unit/test_engine_gguf.c: GGUF reader and writer: round trip of every
 * metadata type and several tensor types, typed getters, lookups, writer
 * validation and file output, allocation-failure injection. Damaged files
 * are covered by test_engine_gguf_damaged.c. */
#include "engine/gguf.h"
#include "engine/quant.h"
#include "tests/test.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static const uint8_t u8s[] = {0, 1, 255};
static const int8_t i8s[] = {-128, 0, 127};
static const uint16_t u16s[] = {0, 65535};
static const int16_t i16s[] = {-32768, 32767};
static const uint32_t u32s[] = {0, 1, 4294967295u};
static const int32_t i32s[] = {-2147483647 - 1, -1, 2147483647};
static const float f32s[] = {-1.5f, 0.0f, 3.25e10f};
static const uint8_t bools[] = {0, 1, 1};
static const uint64_t u64s[] = {0, 18446744073709551615ull};
static const int64_t i64s[] = {INT64_MIN, -1, INT64_MAX};
static const double f64s[] = {1e300, -2.5};
static const char *const strs[] = {"", "a", "hello world", "<0x0A>", "\xe2\x96\x81the"};

/* Tensor payloads, filled with a recognisable pattern. */
static float f32_data[4 * 3];
static uint16_t f16_data[64 * 2];
static uint8_t q8_data[34 * 2 * 5];
static uint8_t q4_data[18 * 4];

static void fill_pattern(void *p, size_t n, uint8_t seed)
{
	uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)(seed + i * 7);
}

/* A writer holding every metadata type (scalars and arrays) and four
 * tensors of types F32, F16, Q8_0 and Q4_0. */
static struct gguf_writer *make_rich(void)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	int rc = 0;
	if (gguf_writer_new(&w, &err))
		return NULL;
	uint8_t u8 = 200;
	int8_t i8 = -100;
	uint16_t u16 = 60000;
	int16_t i16 = -30000;
	int64_t i64 = -1234567890123ll;
	double f64 = 2.718281828459045;
	uint8_t b = 1;
	rc |= gguf_writer_set_str(w, "general.architecture", "llama");
	rc |= gguf_writer_set_scalar(w, "t.u8", GGUF_TYPE_UINT8, &u8);
	rc |= gguf_writer_set_scalar(w, "t.i8", GGUF_TYPE_INT8, &i8);
	rc |= gguf_writer_set_scalar(w, "t.u16", GGUF_TYPE_UINT16, &u16);
	rc |= gguf_writer_set_scalar(w, "t.i16", GGUF_TYPE_INT16, &i16);
	rc |= gguf_writer_set_u32(w, "t.u32", 4000000000u);
	rc |= gguf_writer_set_i32(w, "t.i32", -7);
	rc |= gguf_writer_set_f32(w, "t.f32", 1e-5f);
	rc |= gguf_writer_set_scalar(w, "t.bool", GGUF_TYPE_BOOL, &b);
	rc |= gguf_writer_set_bool(w, "t.false", false);
	rc |= gguf_writer_set_str(w, "t.str", "a string");
	rc |= gguf_writer_set_str(w, "t.empty", "");
	rc |= gguf_writer_set_u64(w, "t.u64", 18446744073709551615ull);
	rc |= gguf_writer_set_scalar(w, "t.i64", GGUF_TYPE_INT64, &i64);
	rc |= gguf_writer_set_scalar(w, "t.f64", GGUF_TYPE_FLOAT64, &f64);
	rc |= gguf_writer_set_arr(w, "a.u8", GGUF_TYPE_UINT8, u8s, CM_ARRAY_LEN(u8s));
	rc |= gguf_writer_set_arr(w, "a.i8", GGUF_TYPE_INT8, i8s, CM_ARRAY_LEN(i8s));
	rc |= gguf_writer_set_arr(w, "a.u16", GGUF_TYPE_UINT16, u16s, CM_ARRAY_LEN(u16s));
	rc |= gguf_writer_set_arr(w, "a.i16", GGUF_TYPE_INT16, i16s, CM_ARRAY_LEN(i16s));
	rc |= gguf_writer_set_arr(w, "a.u32", GGUF_TYPE_UINT32, u32s, CM_ARRAY_LEN(u32s));
	rc |= gguf_writer_set_arr(w, "a.i32", GGUF_TYPE_INT32, i32s, CM_ARRAY_LEN(i32s));
	rc |= gguf_writer_set_arr(w, "a.f32", GGUF_TYPE_FLOAT32, f32s, CM_ARRAY_LEN(f32s));
	rc |= gguf_writer_set_arr(w, "a.bool", GGUF_TYPE_BOOL, bools, CM_ARRAY_LEN(bools));
	rc |= gguf_writer_set_arr_str(w, "a.str", strs, NULL, CM_ARRAY_LEN(strs));
	rc |= gguf_writer_set_arr(w, "a.u64", GGUF_TYPE_UINT64, u64s, CM_ARRAY_LEN(u64s));
	rc |= gguf_writer_set_arr(w, "a.i64", GGUF_TYPE_INT64, i64s, CM_ARRAY_LEN(i64s));
	rc |= gguf_writer_set_arr(w, "a.f64", GGUF_TYPE_FLOAT64, f64s, CM_ARRAY_LEN(f64s));
	rc |= gguf_writer_set_arr(w, "a.empty", GGUF_TYPE_INT32, NULL, 0);

	fill_pattern(f32_data, sizeof(f32_data), 1);
	fill_pattern(f16_data, sizeof(f16_data), 2);
	fill_pattern(q8_data, sizeof(q8_data), 3);
	fill_pattern(q4_data, sizeof(q4_data), 4);
	const int64_t ne_f32[] = {4, 3}, ne_f16[] = {64, 2}, ne_q8[] = {32, 2, 5},
	              ne_q4[] = {32, 1, 2, 2};
	rc |= gguf_writer_add_tensor(w, "t.f32", ENGINE_DTYPE_F32, 2, ne_f32, f32_data, &err);
	rc |= gguf_writer_add_tensor(w, "t.f16", ENGINE_DTYPE_F16, 2, ne_f16, f16_data, &err);
	rc |= gguf_writer_add_tensor(w, "t.q8_0", ENGINE_DTYPE_Q8_0, 3, ne_q8, q8_data, &err);
	rc |= gguf_writer_add_tensor(w, "t.q4_0", ENGINE_DTYPE_Q4_0, 4, ne_q4, q4_data, &err);
	if (rc) {
		gguf_writer_free(w);
		return NULL;
	}
	return w;
}

static int open_writer(struct gguf_writer *w, uint8_t **buf, struct gguf_file **f)
{
	size_t size;
	struct cm_err err = {0};
	int rc = gguf_writer_write_mem(w, buf, &size, &err);
	if (rc)
		return rc;
	rc = gguf_open_mem(*buf, size, f, &err);
	if (rc)
		fprintf(stderr, "open: %s\n", err.msg);
	return rc;
}

static void check_arr(const struct gguf_file *f, const char *key, enum gguf_vtype t,
                      const void *want, uint64_t n)
{
	const void *data;
	uint64_t got_n;
	struct cm_err err = {0};
	CHECK_OK(gguf_get_arr(f, key, t, &data, &got_n, &err));
	CHECK_EQ_INT(got_n, n);
	if (got_n == n)
		CHECK(n == 0 || memcmp(data, want, n * gguf_vtype_size(t)) == 0);
}

static void test_roundtrip(void)
{
	struct gguf_writer *w = make_rich();
	uint8_t *buf = NULL;
	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	CHECK(w != NULL);
	if (!w)
		return;
	CHECK_OK(open_writer(w, &buf, &f));
	if (!f)
		goto out;
	CHECK_EQ_INT(f->version, 3);
	CHECK_EQ_INT(f->alignment, 32);
	CHECK_EQ_INT(f->data_start % 32, 0);
	CHECK_EQ_INT(f->n_kv, 28);
	CHECK_EQ_INT(f->n_tensors, 4);
	/* Insertion order preserved. */
	CHECK(gguf_str_eq(f->kv[0].key, "general.architecture"));
	CHECK(gguf_str_eq(f->kv[1].key, "t.u8"));
	CHECK(gguf_str_eq(f->kv[27].key, "a.empty"));

	/* Scalars, decoded and through the getters. */
	const struct gguf_kv *kv = gguf_find_kv(f, "t.u8");
	CHECK(kv && kv->type == GGUF_TYPE_UINT8 && kv->v.u64 == 200);
	kv = gguf_find_kv(f, "t.i8");
	CHECK(kv && kv->type == GGUF_TYPE_INT8 && kv->v.i64 == -100);
	kv = gguf_find_kv(f, "t.u16");
	CHECK(kv && kv->type == GGUF_TYPE_UINT16 && kv->v.u64 == 60000);
	kv = gguf_find_kv(f, "t.i16");
	CHECK(kv && kv->type == GGUF_TYPE_INT16 && kv->v.i64 == -30000);
	kv = gguf_find_kv(f, "t.f64");
	CHECK(kv && kv->type == GGUF_TYPE_FLOAT64 && kv->v.f64 == 2.718281828459045);
	kv = gguf_find_kv(f, "t.bool");
	CHECK(kv && kv->type == GGUF_TYPE_BOOL && kv->v.b);

	uint32_t u32 = 0;
	int64_t i64 = 0;
	float f32 = 0;
	bool b = false;
	struct gguf_str s = {0};
	CHECK_OK(gguf_get_u32(f, "t.u32", &u32, &err));
	CHECK_EQ_INT(u32, 4000000000u);
	CHECK_OK(gguf_get_u32(f, "t.u8", &u32, &err));
	CHECK_EQ_INT(u32, 200);
	CHECK_OK(gguf_get_i64(f, "t.i32", &i64, &err));
	CHECK_EQ_INT(i64, -7);
	CHECK_OK(gguf_get_i64(f, "t.i64", &i64, &err));
	CHECK_EQ_INT(i64, -1234567890123ll);
	CHECK_OK(gguf_get_i64(f, "t.u16", &i64, &err));
	CHECK_EQ_INT(i64, 60000);
	CHECK_OK(gguf_get_f32(f, "t.f32", &f32, &err));
	CHECK(f32 == 1e-5f);
	CHECK_OK(gguf_get_f32(f, "t.f64", &f32, &err));
	CHECK_NEAR(f32, 2.7182817, 1e-6);
	CHECK_OK(gguf_get_bool(f, "t.bool", &b, &err));
	CHECK(b);
	CHECK_OK(gguf_get_bool(f, "t.false", &b, &err));
	CHECK(!b);
	CHECK_OK(gguf_get_str(f, "t.str", &s, &err));
	CHECK(gguf_str_eq(s, "a string"));
	CHECK_OK(gguf_get_str(f, "t.empty", &s, &err));
	CHECK(s.len == 0 && gguf_str_eq(s, ""));
	CHECK_OK(gguf_get_str(f, "general.architecture", &s, &err));
	CHECK(gguf_str_eq(s, "llama"));
	CHECK(!gguf_str_eq(s, "llam"));
	CHECK(!gguf_str_eq(s, "llamas"));

	/* Arrays. */
	check_arr(f, "a.u8", GGUF_TYPE_UINT8, u8s, CM_ARRAY_LEN(u8s));
	check_arr(f, "a.i8", GGUF_TYPE_INT8, i8s, CM_ARRAY_LEN(i8s));
	check_arr(f, "a.u16", GGUF_TYPE_UINT16, u16s, CM_ARRAY_LEN(u16s));
	check_arr(f, "a.i16", GGUF_TYPE_INT16, i16s, CM_ARRAY_LEN(i16s));
	check_arr(f, "a.u32", GGUF_TYPE_UINT32, u32s, CM_ARRAY_LEN(u32s));
	check_arr(f, "a.i32", GGUF_TYPE_INT32, i32s, CM_ARRAY_LEN(i32s));
	check_arr(f, "a.f32", GGUF_TYPE_FLOAT32, f32s, CM_ARRAY_LEN(f32s));
	check_arr(f, "a.bool", GGUF_TYPE_BOOL, bools, CM_ARRAY_LEN(bools));
	check_arr(f, "a.u64", GGUF_TYPE_UINT64, u64s, CM_ARRAY_LEN(u64s));
	check_arr(f, "a.i64", GGUF_TYPE_INT64, i64s, CM_ARRAY_LEN(i64s));
	check_arr(f, "a.f64", GGUF_TYPE_FLOAT64, f64s, CM_ARRAY_LEN(f64s));
	check_arr(f, "a.empty", GGUF_TYPE_INT32, NULL, 0);
	struct gguf_str *sv = NULL;
	uint64_t n = 0;
	CHECK_OK(gguf_arr_strings(f, "a.str", &sv, &n, &err));
	CHECK_EQ_INT(n, CM_ARRAY_LEN(strs));
	for (uint64_t i = 0; sv && i < n && i < CM_ARRAY_LEN(strs); i++)
		CHECK(gguf_str_eq(sv[i], strs[i]));
	cm_free(sv);

	/* Tensors. */
	static const struct {
		const char *name;
		uint32_t type, n_dims;
		int64_t ne[4];
		const void *data;
		size_t nbytes, row_bytes;
	} want[] = {
	    {"t.f32", ENGINE_DTYPE_F32, 2, {4, 3, 1, 1}, f32_data, sizeof(f32_data), 16},
	    {"t.f16", ENGINE_DTYPE_F16, 2, {64, 2, 1, 1}, f16_data, sizeof(f16_data), 128},
	    {"t.q8_0", ENGINE_DTYPE_Q8_0, 3, {32, 2, 5, 1}, q8_data, sizeof(q8_data), 34},
	    {"t.q4_0", ENGINE_DTYPE_Q4_0, 4, {32, 1, 2, 2}, q4_data, sizeof(q4_data), 18},
	};
	uint64_t expect_off = 0;
	for (size_t i = 0; i < CM_ARRAY_LEN(want); i++) {
		const struct gguf_tensor *t = gguf_tensor_by_name(f, want[i].name);
		CHECK(t == &f->tensors[i]);
		if (!t)
			continue;
		CHECK_STREQ(t->name, want[i].name);
		CHECK_EQ_INT(t->type, want[i].type);
		CHECK_EQ_INT(t->n_dims, want[i].n_dims);
		for (int d = 0; d < 4; d++)
			CHECK_EQ_INT(t->ne[d], want[i].ne[d]);
		CHECK_EQ_INT(t->nbytes, want[i].nbytes);
		CHECK_EQ_INT(t->row_bytes, want[i].row_bytes);
		CHECK_EQ_INT(t->offset, expect_off);
		CHECK((const uint8_t *)t->data == buf + f->data_start + t->offset);
		CHECK(memcmp(t->data, want[i].data, want[i].nbytes) == 0);
		expect_off += cm_align_up(want[i].nbytes, 32);
	}
	CHECK_EQ_INT(f->size, f->data_start + expect_off);
	CHECK(gguf_tensor_by_name(f, "t.f3") == NULL);
	CHECK(gguf_tensor_by_name(f, "nope") == NULL);
	CHECK(gguf_tensor_by_name(f, "") == NULL);
	CHECK(gguf_tensor_by_name(f, NULL) == NULL);
	CHECK(gguf_find_kv(f, "t.u3") == NULL);
	CHECK(gguf_find_kv(f, "") == NULL);
	CHECK(gguf_find_kv(NULL, "t.u8") == NULL);
out:
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
}

/* Re-serializing an opened file (copy_kv + the same tensors) gives the
 * same bytes. */
static void test_copy_identical(void)
{
	struct gguf_writer *w = make_rich(), *w2 = NULL;
	uint8_t *buf = NULL, *buf2 = NULL;
	size_t size2 = 0;
	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	CHECK(w != NULL);
	if (!w || open_writer(w, &buf, &f))
		goto out;
	CHECK_OK(gguf_writer_new(&w2, &err));
	CHECK_OK(gguf_writer_copy_kv(w2, f, NULL, NULL));
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		CHECK_OK(
		    gguf_writer_add_tensor(w2, t->name, t->type, t->n_dims, t->ne, t->data, &err));
	}
	CHECK_OK(gguf_writer_write_mem(w2, &buf2, &size2, &err));
	CHECK_EQ_INT(size2, f->size);
	CHECK(buf2 && size2 == f->size && memcmp(buf2, buf, size2) == 0);
out:
	cm_free(buf2);
	gguf_writer_free(w2);
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
}

static bool skip_t(const char *key, void *ctx)
{
	(*(int *)ctx)++;
	return strncmp(key, "t.", 2) == 0;
}

static void test_writer_kv_ops(void)
{
	struct gguf_writer *w = make_rich(), *w2 = NULL;
	uint8_t *buf = NULL, *buf2 = NULL;
	struct gguf_file *f = NULL, *f2 = NULL;
	struct cm_err err = {0};
	CHECK(w != NULL);
	if (!w)
		return;
	/* Replacing keeps the position and may change the type. */
	CHECK_OK(gguf_writer_set_str(w, "t.u8", "now a string"));
	gguf_writer_remove(w, "t.i8");
	gguf_writer_remove(w, "missing");
	gguf_writer_remove(w, NULL);
	CHECK_EQ_INT(gguf_writer_set_u32(w, "", 1), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_u32(w, NULL, 1), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_str(w, "x", NULL), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_arr(w, "x", GGUF_TYPE_STRING, "", 1), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_arr(w, "x", GGUF_TYPE_ARRAY, "", 1), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_arr(w, "x", GGUF_TYPE_INT32, NULL, 3), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_scalar(w, "x", GGUF_TYPE_STRING, "a"), -EINVAL);
	CHECK_EQ_INT(gguf_writer_set_scalar(w, "x", 13, "abcdefgh"), -EINVAL);
	if (open_writer(w, &buf, &f))
		goto out;
	CHECK_EQ_INT(f->n_kv, 27);
	CHECK(gguf_str_eq(f->kv[1].key, "t.u8"));
	CHECK(gguf_str_eq(f->kv[2].key, "t.u16"));
	CHECK(gguf_find_kv(f, "t.i8") == NULL);
	struct gguf_str s;
	CHECK_OK(gguf_get_str(f, "t.u8", &s, &err));
	CHECK(gguf_str_eq(s, "now a string"));

	/* copy_kv with a filter. */
	int calls = 0;
	CHECK_OK(gguf_writer_new(&w2, &err));
	CHECK_OK(gguf_writer_set_u32(w2, "a.u8", 5)); /* replaced by the copy */
	CHECK_OK(gguf_writer_copy_kv(w2, f, skip_t, &calls));
	CHECK_EQ_INT(calls, 27);
	size_t size2;
	CHECK_OK(gguf_writer_write_mem(w2, &buf2, &size2, &err));
	CHECK_OK(gguf_open_mem(buf2, size2, &f2, &err));
	if (f2) {
		CHECK_EQ_INT(f2->n_kv, 14); /* general.architecture + 13 arrays */
		CHECK(gguf_str_eq(f2->kv[0].key, "a.u8"));
		CHECK(gguf_find_kv(f2, "t.u32") == NULL);
		check_arr(f2, "a.u8", GGUF_TYPE_UINT8, u8s, CM_ARRAY_LEN(u8s));
		check_arr(f2, "a.f64", GGUF_TYPE_FLOAT64, f64s, CM_ARRAY_LEN(f64s));
		struct gguf_str *sv = NULL;
		uint64_t n = 0;
		CHECK_OK(gguf_arr_strings(f2, "a.str", &sv, &n, &err));
		CHECK_EQ_INT(n, CM_ARRAY_LEN(strs));
		cm_free(sv);
		CHECK_EQ_INT(f2->n_tensors, 0);
	}
out:
	gguf_close(f2);
	cm_free(buf2);
	gguf_writer_free(w2);
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
}

static void test_getter_errors(void)
{
	struct gguf_writer *w = make_rich();
	uint8_t *buf = NULL;
	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	uint32_t u32 = 77;
	int64_t i64;
	float f32;
	bool b;
	struct gguf_str s;
	const void *data;
	uint64_t n;
	if (!w || open_writer(w, &buf, &f)) {
		CHECK(0);
		goto out;
	}
	/* Missing: -ENOENT, err untouched, output untouched. */
	strcpy(err.msg, "sentinel");
	CHECK_EQ_INT(gguf_get_u32(f, "nope", &u32, &err), -ENOENT);
	CHECK_EQ_INT(gguf_get_i64(f, "nope", &i64, &err), -ENOENT);
	CHECK_EQ_INT(gguf_get_f32(f, "nope", &f32, &err), -ENOENT);
	CHECK_EQ_INT(gguf_get_bool(f, "nope", &b, &err), -ENOENT);
	CHECK_EQ_INT(gguf_get_str(f, "nope", &s, &err), -ENOENT);
	CHECK_EQ_INT(gguf_get_arr(f, "nope", GGUF_TYPE_INT32, &data, &n, &err), -ENOENT);
	CHECK_STREQ(err.msg, "sentinel");
	CHECK_EQ_INT(err.code, 0);
	CHECK_EQ_INT(u32, 77);

	/* Range. */
	CHECK_EQ_INT(gguf_get_u32(f, "t.u64", &u32, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.u64': value 18446744073709551615 out of range for u32");
	CHECK_EQ_INT(gguf_get_u32(f, "t.i8", &u32, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.i8': value -100 out of range for u32");
	CHECK_EQ_INT(gguf_get_i64(f, "t.u64", &i64, &err), -EPROTO);
	CHECK(strstr(err.msg, "out of range for i64") != NULL);
	CHECK_EQ_INT(gguf_get_f32(f, "t.f64", &f32, &err), 0);

	/* Type. */
	CHECK_EQ_INT(gguf_get_u32(f, "t.str", &u32, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.str': expected an integer, got STRING");
	CHECK_EQ_INT(gguf_get_u32(f, "t.f32", &u32, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.f32': expected an integer, got FLOAT32");
	CHECK_EQ_INT(gguf_get_i64(f, "a.i32", &i64, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 'a.i32': expected an integer, got ARRAY of INT32");
	CHECK_EQ_INT(gguf_get_f32(f, "t.str", &f32, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.str': expected a number, got STRING");
	CHECK_EQ_INT(gguf_get_f32(f, "t.bool", &f32, &err), -EPROTO);
	CHECK_EQ_INT(gguf_get_bool(f, "t.str", &b, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.str': expected BOOL, got STRING");
	CHECK_EQ_INT(gguf_get_str(f, "t.u32", &s, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.u32': expected STRING, got UINT32");
	CHECK_EQ_INT(gguf_get_arr(f, "a.i32", GGUF_TYPE_FLOAT32, &data, &n, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 'a.i32': expected ARRAY of FLOAT32, got ARRAY of INT32");
	CHECK_EQ_INT(gguf_get_arr(f, "t.u32", GGUF_TYPE_UINT32, &data, &n, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: kv 't.u32': expected ARRAY of UINT32, got UINT32");
	struct gguf_str *sv = NULL;
	CHECK_EQ_INT(gguf_arr_strings(f, "a.u8", &sv, &n, &err), -EPROTO);
	CHECK(sv == NULL);
	CHECK_EQ_INT(gguf_arr_strings(f, "nope", &sv, &n, &err), -ENOENT);

	/* Conversions that are allowed. */
	CHECK_OK(gguf_get_f32(f, "t.i32", &f32, &err));
	CHECK(f32 == -7.0f);
	CHECK_OK(gguf_get_f32(f, "t.u32", &f32, &err));
	CHECK(f32 == 4e9f);
	CHECK_OK(gguf_get_bool(f, "t.u32", &b, &err));
	CHECK(b);
	CHECK_OK(gguf_get_u32(f, "t.bool", &u32, &err));
	CHECK_EQ_INT(u32, 1);
out:
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
}

/* Any non-zero bool byte reads as true; values are decoded from bytes. */
static void test_bool_nonzero(void)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	uint8_t *buf = NULL;
	size_t size;
	struct gguf_file *f = NULL;
	CHECK_OK(gguf_writer_new(&w, &err));
	CHECK_OK(gguf_writer_set_bool(w, "b", true));
	CHECK_OK(gguf_writer_write_mem(w, &buf, &size, &err));
	/* header 24 + key len 8 + "b" + type 4 = value at 37 */
	CHECK(buf && buf[37] == 1);
	if (!buf)
		goto out;
	for (int v = 0; v < 256; v++) {
		buf[37] = (uint8_t)v;
		bool b = !v;
		CHECK_OK(gguf_open_mem(buf, size, &f, &err));
		CHECK_OK(gguf_get_bool(f, "b", &b, &err));
		CHECK(b == (v != 0));
		gguf_close(f);
		f = NULL;
	}
out:
	cm_free(buf);
	gguf_writer_free(w);
}

/* Hash lookups over many keys and tensors, including long keys and
 * names that collide in prefix. */
static void test_many_lookups(void)
{
	enum { NK = 500, NT = 300 };
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	uint8_t *buf = NULL;
	struct gguf_file *f = NULL;
	char key[128];
	static float one[32];
	CHECK_OK(gguf_writer_new(&w, &err));
	for (int i = 0; i < NK; i++) {
		snprintf(key, sizeof(key), "k.%d.some.longer.key.name.%d", i, i * 31);
		CHECK_OK(gguf_writer_set_u32(w, key, (uint32_t)i));
	}
	for (int i = 0; i < NT; i++) {
		snprintf(key, sizeof(key), "blk.%d.attn_q.weight", i);
		int64_t ne[1] = {1 + i % 7};
		CHECK_OK(gguf_writer_add_tensor(w, key, ENGINE_DTYPE_F32, 1, ne, one, &err));
	}
	/* A name of the maximum length. */
	char longname[GGUF_MAX_NAME];
	memset(longname, 'n', GGUF_MAX_NAME - 1);
	longname[GGUF_MAX_NAME - 1] = '\0';
	int64_t ne1 = 1;
	CHECK_OK(gguf_writer_add_tensor(w, longname, ENGINE_DTYPE_F32, 1, &ne1, one, &err));
	if (open_writer(w, &buf, &f)) {
		CHECK(0);
		goto out;
	}
	CHECK_EQ_INT(f->n_kv, NK);
	CHECK_EQ_INT(f->n_tensors, NT + 1);
	for (int i = 0; i < NK; i++) {
		uint32_t v = 0;
		snprintf(key, sizeof(key), "k.%d.some.longer.key.name.%d", i, i * 31);
		CHECK_OK(gguf_get_u32(f, key, &v, &err));
		CHECK_EQ_INT(v, i);
		snprintf(key, sizeof(key), "k.%d.some.longer.key.name.%d", i, i * 31 + 1);
		CHECK(gguf_find_kv(f, key) == NULL);
	}
	for (int i = 0; i < NT; i++) {
		snprintf(key, sizeof(key), "blk.%d.attn_q.weight", i);
		const struct gguf_tensor *t = gguf_tensor_by_name(f, key);
		CHECK(t == &f->tensors[i]);
		CHECK(t && t->ne[0] == 1 + i % 7);
		snprintf(key, sizeof(key), "blk.%d.attn_k.weight", i);
		CHECK(gguf_tensor_by_name(f, key) == NULL);
	}
	CHECK(gguf_tensor_by_name(f, longname) == &f->tensors[NT]);
	char toolong[GGUF_MAX_NAME + 1];
	memset(toolong, 'n', GGUF_MAX_NAME);
	toolong[GGUF_MAX_NAME] = '\0';
	CHECK(gguf_tensor_by_name(f, toolong) == NULL);
out:
	gguf_close(f);
	cm_free(buf);
	gguf_writer_free(w);
}

static void test_writer_validation(void)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	static uint8_t data[4096];
	int64_t ne[4] = {32, 2, 1, 1};
	CHECK_OK(gguf_writer_new(&w, &err));
	if (!w)
		return;
	char longname[GGUF_MAX_NAME + 1];
	memset(longname, 'x', GGUF_MAX_NAME);
	longname[GGUF_MAX_NAME] = '\0';
	CHECK_EQ_INT(gguf_writer_add_tensor(w, longname, 0, 1, ne, data, &err), -EINVAL);
	CHECK(strstr(err.msg, "name length 64") != NULL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "", 0, 1, ne, data, &err), -EINVAL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, NULL, 0, 1, ne, data, &err), -EINVAL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 0, 0, ne, data, &err), -EINVAL);
	CHECK(strstr(err.msg, "n_dims 0") != NULL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 0, 5, ne, data, &err), -EINVAL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 4, 2, ne, data, &err), -EINVAL);
	CHECK_STREQ(err.msg, "gguf writer: tensor 'a': unknown tensor type 4");
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 39, 2, ne, data, &err), -EINVAL);
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 1000, 2, ne, data, &err), -EINVAL);
	int64_t bad[2] = {48, 2};
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", ENGINE_DTYPE_Q4_0, 2, bad, data, &err),
	             -EINVAL);
	CHECK(strstr(err.msg, "not a multiple of the Q4_0 block size 32") != NULL);
	bad[0] = 0;
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 0, 2, bad, data, &err), -EINVAL);
	CHECK(strstr(err.msg, "dimension 0 is 0") != NULL);
	bad[0] = 4;
	bad[1] = -3;
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 0, 2, bad, data, &err), -EINVAL);
	int64_t big[3] = {1ll << 31, 1ll << 31, 4};
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", 0, 3, big, data, &err), -EINVAL);
	CHECK(strstr(err.msg, "overflows") != NULL);
	CHECK_OK(gguf_writer_add_tensor(w, "a", ENGINE_DTYPE_Q4_0, 2, ne, data, &err));
	CHECK_EQ_INT(gguf_writer_add_tensor(w, "a", ENGINE_DTYPE_Q4_0, 2, ne, data, &err), -EINVAL);
	CHECK(strstr(err.msg, "duplicate") != NULL);

	/* Bad general.alignment is refused when writing. */
	uint8_t *buf = NULL;
	size_t size;
	CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 48));
	CHECK_EQ_INT(gguf_writer_write_mem(w, &buf, &size, &err), -EINVAL);
	CHECK(strstr(err.msg, "general.alignment") != NULL);
	CHECK_OK(gguf_writer_set_u32(w, "general.alignment", 0));
	CHECK_EQ_INT(gguf_writer_write_mem(w, &buf, &size, &err), -EINVAL);
	CHECK_OK(gguf_writer_set_u64(w, "general.alignment", 64));
	CHECK_EQ_INT(gguf_writer_write_mem(w, &buf, &size, &err), -EINVAL);
	CHECK(buf == NULL);
	gguf_writer_free(w);
	gguf_writer_free(NULL);
}

/* general.alignment other than 32, and tensor data NULL (zeros). */
static void test_alignment(void)
{
	static const uint32_t aligns[] = {1, 8, 64, 4096};
	static float x[5] = {1, 2, 3, 4, 5};
	for (size_t k = 0; k < CM_ARRAY_LEN(aligns); k++) {
		struct gguf_writer *w = NULL;
		struct cm_err err = {0};
		uint8_t *buf = NULL;
		struct gguf_file *f = NULL;
		int64_t ne[1] = {5};
		CHECK_OK(gguf_writer_new(&w, &err));
		CHECK_OK(gguf_writer_add_tensor(w, "a", ENGINE_DTYPE_F32, 1, ne, x, &err));
		CHECK_OK(gguf_writer_add_tensor(w, "z", ENGINE_DTYPE_F32, 1, ne, NULL, &err));
		CHECK_OK(gguf_writer_add_tensor(w, "b", ENGINE_DTYPE_F32, 1, ne, x, &err));
		CHECK_OK(gguf_writer_set_u32(w, "general.alignment", aligns[k]));
		if (open_writer(w, &buf, &f)) {
			CHECK(0);
		} else {
			CHECK_EQ_INT(f->alignment, aligns[k]);
			CHECK_EQ_INT(f->data_start % aligns[k], 0);
			uint64_t step = cm_align_up(20, aligns[k]);
			CHECK_EQ_INT(f->tensors[1].offset, step);
			CHECK_EQ_INT(f->tensors[2].offset, 2 * step);
			CHECK(memcmp(f->tensors[2].data, x, 20) == 0);
			static const float zero[5];
			CHECK(memcmp(f->tensors[1].data, zero, 20) == 0);
		}
		gguf_close(f);
		cm_free(buf);
		gguf_writer_free(w);
	}
}

/* A vocab-only file (no tensors) opens with or without its tail padding;
 * v2 files open; any aligned non-overlapping order of offsets is fine. */
static void test_liberal_inputs(void)
{
	struct gguf_writer *w = NULL;
	struct cm_err err = {0};
	uint8_t *buf = NULL;
	size_t size = 0;
	struct gguf_file *f = NULL;
	static const char *const toks[] = {"<unk>", "<s>", "</s>", "a"};
	CHECK_OK(gguf_writer_new(&w, &err));
	CHECK_OK(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama"));
	CHECK_OK(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 4));
	CHECK_OK(gguf_writer_write_mem(w, &buf, &size, &err));
	size_t unpadded = 24 + (8 + 20 + 4 + 8 + 5) + (8 + 21 + 4 + 12 + 4 * 8 + 5 + 3 + 4 + 1);
	CHECK_EQ_INT(size, cm_align_up(unpadded, 32));
	for (size_t s = unpadded; buf && s <= size; s++) {
		CHECK_OK(gguf_open_mem(buf, s, &f, &err));
		gguf_close(f);
		f = NULL;
	}
	if (buf && size >= unpadded) {
		CHECK(gguf_open_mem(buf, unpadded - 1, &f, &err) == -EPROTO);
		buf[4] = 2; /* version 2 */
		CHECK_OK(gguf_open_mem(buf, size, &f, &err));
		CHECK(f && f->version == 2);
		gguf_close(f);
		f = NULL;
	}
	cm_free(buf);
	buf = NULL;
	gguf_writer_free(w);

	/* Two same-size tensors with their offsets swapped. */
	static float x[8];
	int64_t ne[1] = {8};
	CHECK_OK(gguf_writer_new(&w, &err));
	CHECK_OK(gguf_writer_add_tensor(w, "a", ENGINE_DTYPE_F32, 1, ne, x, &err));
	CHECK_OK(gguf_writer_add_tensor(w, "b", ENGINE_DTYPE_F32, 1, ne, x, &err));
	CHECK_OK(gguf_writer_write_mem(w, &buf, &size, &err));
	/* infos: 24 | 8+1+4+8+4 then offset (u64) at 24+25 and 24+33+25 */
	if (buf) {
		CHECK_EQ_INT(buf[24 + 33 + 25], 32);
		buf[24 + 25] = 32;
		buf[24 + 33 + 25] = 0;
		CHECK_OK(gguf_open_mem(buf, size, &f, &err));
		CHECK(f && f->tensors[0].offset == 32 && f->tensors[1].offset == 0);
		gguf_close(f);
		f = NULL;
	}
	cm_free(buf);
	gguf_writer_free(w);
}

static void test_file_io(void)
{
	struct gguf_writer *w = make_rich();
	struct cm_err err = {0};
	struct gguf_file *f = NULL;
	uint8_t *buf = NULL;
	size_t size = 0;
	char path[512], tmp[520];
	snprintf(path, sizeof(path), "%s/test_gguf_%d.gguf", test_tmpdir(), (int)getpid());
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	CHECK(w != NULL);
	if (!w)
		return;
	CHECK_OK(gguf_writer_write(w, path, &err));
	CHECK(access(tmp, F_OK) != 0);
	CHECK_OK(gguf_writer_write_mem(w, &buf, &size, &err));
	CHECK_OK(gguf_open(path, &f, &err));
	if (f && buf) {
		CHECK(f->mapped);
		CHECK_EQ_INT(f->size, size);
		CHECK(memcmp(f->base, buf, size) == 0);
		CHECK(gguf_tensor_by_name(f, "t.q4_0") != NULL);
	}
	gguf_close(f);
	f = NULL;

	/* Allocation failures while opening a file: every path cleans up. */
	for (long n = 0;; n++) {
		cm_alloc_fail_reset(n);
		int rc = gguf_open(path, &f, &err);
		cm_alloc_fail_reset(-1);
		if (rc == 0)
			break;
		CHECK_EQ_INT(rc, -ENOMEM);
		CHECK(f == NULL);
		if (rc != -ENOMEM || n > 100)
			break;
	}
	gguf_close(f);
	f = NULL;
	unlink(path);

	/* OS errors name the path. */
	char missing[600];
	snprintf(missing, sizeof(missing), "%s/no-such-dir-%d/x.gguf", test_tmpdir(),
	         (int)getpid());
	CHECK_EQ_INT(gguf_open(missing, &f, &err), -ENOENT);
	CHECK(strstr(err.msg, missing) != NULL && strstr(err.msg, "No such file") != NULL);
	CHECK_EQ_INT(gguf_writer_write(w, missing, &err), -ENOENT);
	CHECK(strstr(err.msg, missing) != NULL);
	CHECK_EQ_INT(gguf_open(test_tmpdir(), &f, &err), -EISDIR);
	CHECK(f == NULL);

	/* An empty file. */
	FILE *fp = fopen(path, "wb");
	CHECK(fp != NULL);
	if (fp)
		fclose(fp);
	CHECK_EQ_INT(gguf_open(path, &f, &err), -EPROTO);
	CHECK_STREQ(err.msg, "gguf: empty file");
	unlink(path);

	/* A short write (file size limit): error, no file, no tmp left. */
	struct rlimit old, lim;
	if (getrlimit(RLIMIT_FSIZE, &old) == 0) {
		void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
		lim = old;
		lim.rlim_cur = 100;
		if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
			int rc = gguf_writer_write(w, path, &err);
			setrlimit(RLIMIT_FSIZE, &old);
			CHECK_EQ_INT(rc, -EFBIG);
			CHECK(strstr(err.msg, tmp) != NULL);
			CHECK(access(tmp, F_OK) != 0);
			CHECK(access(path, F_OK) != 0);
		}
		signal(SIGXFSZ, oldsig);
	}
	cm_free(buf);
	gguf_writer_free(w);
}

/* Every allocation failure while writing and opening is reported as
 * -ENOMEM and leaks nothing (checked by the ASan pass). */
static void test_alloc_failures(void)
{
	struct cm_err err = {0};
	uint8_t *ref = NULL;
	size_t ref_size = 0;
	struct gguf_writer *w = make_rich();
	CHECK(w != NULL);
	if (!w)
		return;
	CHECK_OK(gguf_writer_write_mem(w, &ref, &ref_size, &err));
	gguf_writer_free(w);

	long n;
	for (n = 0; n < 10000; n++) {
		struct gguf_file *f = NULL;
		cm_alloc_fail_reset(n);
		int rc = gguf_open_mem(ref, ref_size, &f, &err);
		cm_alloc_fail_reset(-1);
		if (rc == 0) {
			gguf_close(f);
			break;
		}
		CHECK_EQ_INT(rc, -ENOMEM);
		CHECK(f == NULL);
		CHECK(strstr(err.msg, "out of memory") != NULL);
	}
	CHECK(n > 0 && n < 10000);

	/* Writer construction, serialization and string arrays. */
	for (n = 0; n < 10000; n++) {
		uint8_t *buf = NULL;
		size_t size = 0;
		cm_alloc_fail_reset(n);
		w = make_rich();
		int rc = w ? gguf_writer_write_mem(w, &buf, &size, &err) : -ENOMEM;
		struct gguf_file *f = NULL;
		struct gguf_str *sv = NULL;
		uint64_t ns = 0;
		if (!rc)
			rc = gguf_open_mem(buf, size, &f, &err);
		if (!rc)
			rc = gguf_arr_strings(f, "a.str", &sv, &ns, &err);
		cm_alloc_fail_reset(-1);
		if (rc == 0) {
			CHECK(size == ref_size && memcmp(buf, ref, size) == 0);
			CHECK_EQ_INT(ns, CM_ARRAY_LEN(strs));
		} else {
			CHECK_EQ_INT(rc, -ENOMEM);
		}
		cm_free(sv);
		gguf_close(f);
		cm_free(buf);
		gguf_writer_free(w);
		if (rc == 0)
			break;
	}
	CHECK(n > 0 && n < 10000);
	cm_free(ref);
}

static void test_vtype_names(void)
{
	CHECK_STREQ(gguf_vtype_name(GGUF_TYPE_UINT8), "UINT8");
	CHECK_STREQ(gguf_vtype_name(GGUF_TYPE_FLOAT64), "FLOAT64");
	CHECK_STREQ(gguf_vtype_name(GGUF_TYPE_ARRAY), "ARRAY");
	CHECK_STREQ(gguf_vtype_name(GGUF_TYPE_COUNT), "?");
	CHECK_STREQ(gguf_vtype_name((enum gguf_vtype) - 1), "?");
	CHECK_EQ_INT(gguf_vtype_size(GGUF_TYPE_INT16), 2);
	CHECK_EQ_INT(gguf_vtype_size(GGUF_TYPE_BOOL), 1);
	CHECK_EQ_INT(gguf_vtype_size(GGUF_TYPE_INT64), 8);
	CHECK_EQ_INT(gguf_vtype_size(GGUF_TYPE_STRING), 0);
	CHECK_EQ_INT(gguf_vtype_size(GGUF_TYPE_ARRAY), 0);
	CHECK_EQ_INT(gguf_vtype_size(99), 0);
	gguf_close(NULL);
}

int main(void)
{
	TEST_RUN(test_roundtrip);
	TEST_RUN(test_copy_identical);
	TEST_RUN(test_writer_kv_ops);
	TEST_RUN(test_getter_errors);
	TEST_RUN(test_bool_nonzero);
	TEST_RUN(test_many_lookups);
	TEST_RUN(test_writer_validation);
	TEST_RUN(test_alignment);
	TEST_RUN(test_liberal_inputs);
	TEST_RUN(test_file_io);
	TEST_RUN(test_alloc_failures);
	TEST_RUN(test_vtype_names);
	return test_finish();
}
