/* tests/fuzz/fuzz_gguf.c: libFuzzer entry point for the GGUF reader.
 *
 * Every input goes through gguf_open_mem(). A rejected input must come with
 * a one-line "gguf: " message and the same code in err; an accepted one has
 * every accessor exercised (keys, typed getters on every key, string
 * arrays, tensors by name, first and last byte of every value and tensor)
 * and is then re-serialized with the writer (copy_kv + the same tensors):
 * the copy must open and hold the same keys and tensors. Invariant
 * violations trap, so both libFuzzer and the replay driver report them. */
#include "engine/gguf.h"

#include <stdint.h>
#include <string.h>

#define REQUIRE(x)                                                                                 \
	do {                                                                                       \
		if (!(x))                                                                          \
			__builtin_trap();                                                          \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n)
{
	if (n) {
		sink ^= ((const uint8_t *)p)[0];
		sink ^= ((const uint8_t *)p)[n - 1];
	}
}

static void exercise(const struct gguf_file *f)
{
	struct cm_err err;
	char key[256];
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *kv = &f->kv[i];
		touch(kv->key.ptr, kv->key.len);
		if (kv->key.len >= sizeof(key) || memchr(kv->key.ptr, 0, (size_t)kv->key.len))
			continue; /* not reachable through a C string */
		memcpy(key, kv->key.ptr, (size_t)kv->key.len);
		key[kv->key.len] = '\0';
		REQUIRE(gguf_find_kv(f, key) == kv);
		uint32_t u32;
		int64_t i64;
		float f32;
		bool b;
		struct gguf_str s;
		const void *arr;
		uint64_t n;
		int rc;
		rc = gguf_get_u32(f, key, &u32, &err);
		REQUIRE(rc == 0 || rc == -EPROTO);
		rc = gguf_get_i64(f, key, &i64, &err);
		REQUIRE(rc == 0 || rc == -EPROTO);
		rc = gguf_get_f32(f, key, &f32, &err);
		REQUIRE(rc == 0 || rc == -EPROTO);
		rc = gguf_get_bool(f, key, &b, &err);
		REQUIRE(rc == 0 || rc == -EPROTO);
		if (gguf_get_str(f, key, &s, &err) == 0)
			touch(s.ptr, s.len);
		for (int t = 0; t < GGUF_TYPE_COUNT; t++) {
			rc = gguf_get_arr(f, key, (enum gguf_vtype)t, &arr, &n, &err);
			REQUIRE(rc == 0 || rc == -EPROTO);
			if (rc == 0 && t != GGUF_TYPE_STRING)
				touch(arr, n * gguf_vtype_size((enum gguf_vtype)t));
		}
		struct gguf_str *sv = NULL;
		rc = gguf_arr_strings(f, key, &sv, &n, &err);
		REQUIRE(rc == 0 || rc == -EPROTO);
		if (rc == 0) {
			REQUIRE(n == kv->arr_n);
			for (uint64_t j = 0; j < n; j++)
				touch(sv[j].ptr, sv[j].len);
			cm_free(sv);
		}
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		REQUIRE(gguf_tensor_by_name(f, t->name) == t);
		REQUIRE(t->nbytes > 0);
		REQUIRE((const uint8_t *)t->data >= f->base + f->data_start);
		REQUIRE((const uint8_t *)t->data + t->nbytes <= f->base + f->size);
		touch(t->data, t->nbytes);
	}
}

/* The writer reproduces what the reader accepted. */
static void rewrite(const struct gguf_file *f)
{
	struct gguf_writer *w = NULL;
	struct gguf_file *g = NULL;
	struct cm_err err;
	uint8_t *buf = NULL;
	size_t size = 0;
	/* A huge general.alignment pads the copy to that size: skip. */
	if (f->alignment > 4096)
		return;
	REQUIRE(gguf_writer_new(&w, &err) == 0);
	REQUIRE(gguf_writer_copy_kv(w, f, NULL, NULL) == 0);
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *t = &f->tensors[i];
		REQUIRE(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data,
		                               &err) == 0);
	}
	REQUIRE(gguf_writer_write_mem(w, &buf, &size, &err) == 0);
	REQUIRE(gguf_open_mem(buf, size, &g, &err) == 0);
	REQUIRE(g->n_kv == f->n_kv && g->n_tensors == f->n_tensors);
	REQUIRE(g->alignment == f->alignment);
	for (uint64_t i = 0; i < f->n_kv; i++) {
		const struct gguf_kv *a = &f->kv[i], *b = &g->kv[i];
		REQUIRE(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
		REQUIRE(a->type == b->type);
		REQUIRE(a->type != GGUF_TYPE_ARRAY ||
		        (a->arr_type == b->arr_type && a->arr_n == b->arr_n));
	}
	for (uint64_t i = 0; i < f->n_tensors; i++) {
		const struct gguf_tensor *a = &f->tensors[i], *b = &g->tensors[i];
		REQUIRE(!strcmp(a->name, b->name) && a->type == b->type && a->nbytes == b->nbytes);
		REQUIRE(!memcmp(a->ne, b->ne, sizeof(a->ne)));
		REQUIRE(!memcmp(a->data, b->data, (size_t)a->nbytes));
	}
	gguf_close(g);
	cm_free(buf);
	gguf_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_file *f = NULL;
	struct cm_err err = {0};
	int rc = gguf_open_mem(data, size, &f, &err);
	if (rc != 0) {
		REQUIRE(rc == -EPROTO && err.code == rc && f == NULL);
		REQUIRE(strncmp(err.msg, "gguf: ", 6) == 0);
		for (const char *c = err.msg; *c; c++)
			REQUIRE((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f);
		return 0;
	}
	exercise(f);
	rewrite(f);
	gguf_close(f);
	return 0;
}
