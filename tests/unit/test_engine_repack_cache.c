/* tests/unit/test_engine_repack_cache.c: the repack cache
 * (engine_params.repack_cache, engine/repack_cache.c):
 * - the first load writes an entry, the second maps it (weights_cached)
 *   and builds nothing; both give the same logits, bit for bit, as a load
 *   without the cache;
 * - an entry for another layout (another K-segment) is another key; the
 *   newer entry of a model replaces the older;
 * - a damaged entry (truncated, another magic, another key in the header,
 *   flipped bytes in the header's size) is not mapped, the load rebuilds it
 *   and says so; a model file rewritten in place (new mtime) misses;
 * - a directory that cannot be written costs only the cache. */
#include "engine/engine.h"
#include "tests/test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { N = 9 };

static char dir[4096], model[4096];

/* N prompt tokens' logits at the last position into out (n_vocab floats) */
static int run(const char *cache, int segment, float *out, struct engine_model_info *info)
{
	struct engine_params p = {.n_threads = 2, .repack = 1, .repack_segment = segment,
				  .repack_cache = cache};
	engine_model *m = NULL;
	engine_ctx *c = NULL;
	struct cm_err err = {0};
	int r = engine_model_load(model, &p, &m, &err);
	CHECK_MSG(r == 0, "load: %s", err.msg);
	if (r)
		return r;
	engine_model_get_info(m, info);
	struct engine_ctx_params cp = {.n_ctx = 64, .n_seq = 1};
	r = engine_ctx_new(m, &cp, &c, &err);
	CHECK_MSG(r == 0, "ctx: %s", err.msg);
	int32_t toks[N];
	for (int i = 0; i < N; i++)
		toks[i] = 1 + (i * 37) % ((int)info->n_vocab - 1);
	if (r == 0 && (r = engine_eval(c, toks, N, 0, &err)) == 0)
		memcpy(out, engine_get_logits_last(c), info->n_vocab * sizeof(float));
	CHECK_MSG(r == 0, "eval: %s", err.msg);
	engine_ctx_free(c);
	engine_model_free(m);
	return r;
}

static int count_entries(char *name, size_t cap)
{
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (strstr(e->d_name, ".x16") && e->d_name[0] != '.') {
			n++;
			snprintf(name, cap, "%s/%s", dir, e->d_name);
		}
	if (d)
		closedir(d);
	return n;
}

static void test_cache(void)
{
	snprintf(dir, sizeof(dir), "%s/edgelm-rcache-%d", test_tmpdir(), (int)getpid());
	snprintf(model, sizeof(model), "%s/edgelm-rcache-%d.gguf", test_tmpdir(), (int)getpid());
	mkdir(dir, 0700);
	if (test_mkmodel(model, "--shape small --vocab synthetic --type Q8_0") != 0) {
		CHECK_MSG(false, "mkmodel failed");
		return;
	}
	struct engine_model_info a, b, c;
	float *ref = calloc(1 << 16, sizeof(float)), *got = calloc(1 << 16, sizeof(float));
	char entry[8192];
	if (run(NULL, 0, ref, &a))
		goto out;
	if (a.n_x16_tensors == 0) {
		TEST_SKIP("kernel variant %s repacks no Q8_0", a.isa);
		goto out;
	}
	CHECK(!a.weights_cached && a.repack_cache_note[0] == '\0');

	/* first load: written; second: mapped, the same logits */
	CHECK_OK(run(dir, 0, got, &b));
	CHECK_MSG(!b.weights_cached && strstr(b.repack_cache_note, "wrote"), "%s",
		  b.repack_cache_note);
	CHECK(memcmp(ref, got, a.n_vocab * sizeof(float)) == 0);
	CHECK_EQ_INT(count_entries(entry, sizeof(entry)), 1);
	memset(got, 0, a.n_vocab * sizeof(float));
	CHECK_OK(run(dir, 0, got, &c));
	CHECK_MSG(c.weights_cached && strstr(c.repack_cache_note, "mapped"), "%s",
		  c.repack_cache_note);
	CHECK(!c.weights_anon && c.n_x16_tensors == a.n_x16_tensors);
	CHECK(memcmp(ref, got, a.n_vocab * sizeof(float)) == 0);

	/* another layout (segments) is another key; it replaces the older */
	CHECK_OK(run(dir, 4096, got, &b));
	CHECK_MSG(!b.weights_cached, "a segmented layout mapped the whole-row entry");
	CHECK_EQ_INT(count_entries(entry, sizeof(entry)), 1);
	CHECK_OK(run(dir, 4096, got, &b));
	CHECK(b.weights_cached);
	CHECK_OK(run(dir, 0, got, &b)); /* back: rebuilt */
	CHECK(!b.weights_cached);

	/* damaged entries: rebuilt, and said so */
	static const struct {
		off_t at;
		const char *bytes;
		size_t n;
		const char *why;
	} harm[] = {
		{0, "XXXX", 4, "another format"},
		{16, "00000000", 8, "another model"},    /* the key */
		{-1, NULL, 0, "truncated"},
	};
	for (size_t k = 0; k < CM_ARRAY_LEN(harm); k++) {
		CHECK_EQ_INT(count_entries(entry, sizeof(entry)), 1);
		int fd = open(entry, O_WRONLY);
		CHECK(fd >= 0);
		if (harm[k].bytes)
			CHECK(pwrite(fd, harm[k].bytes, harm[k].n, harm[k].at) == (ssize_t)harm[k].n);
		else {
			struct stat st;
			CHECK(fstat(fd, &st) == 0 && ftruncate(fd, st.st_size - 4096) == 0);
		}
		close(fd);
		memset(got, 0, a.n_vocab * sizeof(float));
		CHECK_OK(run(dir, 0, got, &b));
		CHECK_MSG(!b.weights_cached && strstr(b.repack_cache_note, "wrote"),
			  "%s: %s", harm[k].why, b.repack_cache_note);
		CHECK(memcmp(ref, got, a.n_vocab * sizeof(float)) == 0);
		CHECK_OK(run(dir, 0, got, &b)); /* and mapped again after */
		CHECK_MSG(b.weights_cached, "%s: not rebuilt: %s", harm[k].why, b.repack_cache_note);
	}

	/* the model rewritten in place (a new mtime): a miss */
	struct timespec ts[2] = {{.tv_sec = 1000000000}, {.tv_sec = 1000000000}};
	CHECK(utimensat(AT_FDCWD, model, ts, 0) == 0);
	CHECK_OK(run(dir, 0, got, &b));
	CHECK_MSG(!b.weights_cached, "a rewritten model mapped the old entry");
	CHECK_EQ_INT(count_entries(entry, sizeof(entry)), 1);

	/* a directory that cannot be written: the load stands */
	char ro[4200];
	snprintf(ro, sizeof(ro), "%s/missing/sub", dir);
	CHECK_OK(run(ro, 0, got, &b));
	CHECK(!b.weights_cached && b.weights_anon);
	CHECK_MSG(strstr(b.repack_cache_note, "cannot write"), "%s", b.repack_cache_note);
	CHECK(memcmp(ref, got, a.n_vocab * sizeof(float)) == 0);
out:
	free(ref);
	free(got);
	if (count_entries(entry, sizeof(entry)) == 1)
		unlink(entry);
	rmdir(dir);
	unlink(model);
}

int main(void)
{
	TEST_RUN(test_cache);
	return test_finish();
}
