/* tests/test.h: the project's tiny test harness.
 *
 * A test binary defines test functions, lists them in main() with
 * TEST_RUN(fn), and ends with `return test_finish();`, which prints the
 * closing line "N passed, N failed" (plus ", N skipped") and returns the exit
 * status. A test fails when any CHECK in it fails; CHECKs report file:line.
 * A test that cannot run here (a facility this box lacks) calls
 * TEST_SKIP("why") and returns. TEST_ONLY=text runs only the tests whose
 * names contain it. A test that needs reference data it cannot
 * find calls TEST_SKIP_DATA("why"): when $EDGELM_REQUIRE_DATA is set (CI),
 * that skip counts as a failure. */
#ifndef EDGELM_TEST_H
#define EDGELM_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int test_n_pass, test_n_fail, test_n_skip;
static int test_cur_failed, test_cur_skipped; /* 1: environment, 2: data */
static const char *test_cur_name;

#define CHECK(x)                                                                   \
	do {                                                                       \
		if (!(x)) {                                                        \
			fprintf(stderr, "%s:%d: %s: CHECK(%s) failed\n", __FILE__, \
				__LINE__, test_cur_name, #x);                     \
			test_cur_failed++;                                         \
		}                                                                  \
	} while (0)

#define CHECK_MSG(x, ...)                                                            \
	do {                                                                         \
		if (!(x)) {                                                          \
			fprintf(stderr, "%s:%d: %s: CHECK(%s) failed: ", __FILE__,   \
				__LINE__, test_cur_name, #x);                       \
			fprintf(stderr, __VA_ARGS__);                                \
			fputc('\n', stderr);                                         \
			test_cur_failed++;                                           \
		}                                                                    \
	} while (0)

#define CHECK_OK(r)                                                                     \
	do {                                                                            \
		long long r_ = (long long)(r);                                          \
		if (r_ != 0) {                                                          \
			fprintf(stderr, "%s:%d: %s: %s returned %lld\n", __FILE__,      \
				__LINE__, test_cur_name, #r, r_);                        \
			test_cur_failed++;                                              \
		}                                                                       \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                             \
	do {                                                                           \
		long long a_ = (long long)(a), b_ = (long long)(b);                    \
		if (a_ != b_) {                                                        \
			fprintf(stderr, "%s:%d: %s: %s == %lld, expected %s == %lld\n", \
				__FILE__, __LINE__, test_cur_name, #a, a_, #b, b_);     \
			test_cur_failed++;                                             \
		}                                                                      \
	} while (0)

#define CHECK_STREQ(a, b)                                                              \
	do {                                                                           \
		const char *a_ = (a), *b_ = (b);                                       \
		if (!a_ || !b_ || strcmp(a_, b_) != 0) {                               \
			fprintf(stderr, "%s:%d: %s: %s == \"%s\", expected \"%s\"\n",   \
				__FILE__, __LINE__, test_cur_name, #a, a_ ? a_ : "(null)", \
				b_ ? b_ : "(null)");                                   \
			test_cur_failed++;                                             \
		}                                                                      \
	} while (0)

#define CHECK_NEAR(a, b, tol)                                                            \
	do {                                                                             \
		double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);            \
		if (!(fabs(a_ - b_) <= t_)) {                                            \
			fprintf(stderr, "%s:%d: %s: %s == %.9g, expected %.9g +- %.3g\n", \
				__FILE__, __LINE__, test_cur_name, #a, a_, b_, t_);       \
			test_cur_failed++;                                               \
		}                                                                        \
	} while (0)

#define TEST_SKIP(...)                                                 \
	do {                                                           \
		fprintf(stderr, "SKIP %s: ", test_cur_name);           \
		fprintf(stderr, __VA_ARGS__);                          \
		fputc('\n', stderr);                                   \
		test_cur_skipped = 1;                                  \
	} while (0)

#define TEST_SKIP_DATA(...)                                            \
	do {                                                           \
		fprintf(stderr, "SKIP %s: ", test_cur_name);           \
		fprintf(stderr, __VA_ARGS__);                          \
		fputc('\n', stderr);                                   \
		test_cur_skipped = 2;                                  \
	} while (0)

static inline void test_run_one(void (*fn)(void), const char *name)
{
	/* TEST_ONLY=substring runs only the tests whose names contain it */
	const char *only = getenv("TEST_ONLY");
	if (only && *only && !strstr(name, only))
		return;
	test_cur_name = name;
	test_cur_failed = 0;
	test_cur_skipped = 0;
	fn();
	if (test_cur_failed) {
		test_n_fail++;
		fprintf(stderr, "FAIL %s\n", name);
	} else if (test_cur_skipped) {
		const char *req = getenv("EDGELM_REQUIRE_DATA");
		if (test_cur_skipped == 2 && req && *req && strcmp(req, "0") != 0) {
			test_n_fail++;
			fprintf(stderr, "FAIL %s (skipped, but EDGELM_REQUIRE_DATA is set)\n", name);
		} else {
			test_n_skip++;
		}
	} else {
		test_n_pass++;
		if (getenv("TEST_VERBOSE"))
			fprintf(stderr, "ok   %s\n", name);
	}
}

#define TEST_RUN(fn) test_run_one(fn, #fn)

static inline int test_finish(void)
{
	if (test_n_skip)
		printf("%d passed, %d failed, %d skipped\n", test_n_pass, test_n_fail, test_n_skip);
	else
		printf("%d passed, %d failed\n", test_n_pass, test_n_fail);
	return test_n_fail ? 1 : 0;
}

/* Where reference data lives: $EDGELM_TESTDATA, else ../shared next to the
 * source tree (the build runs from the tree's top). Returns a static buffer. */
static inline const char *test_data_path(const char *rel)
{
	static char buf[4096];
	const char *root = getenv("EDGELM_TESTDATA");
	if (!root || !*root)
		root = "../shared";
	snprintf(buf, sizeof(buf), "%s/%s", root, rel);
	return buf;
}

static inline int test_file_exists(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return 0;
	fclose(f);
	return 1;
}

/* A scratch directory for outputs: $TEST_TMPDIR, else $TMPDIR, else /tmp. */
static inline const char *test_tmpdir(void)
{
	const char *t = getenv("TEST_TMPDIR");
	if (!t || !*t)
		t = getenv("TMPDIR");
	return t && *t ? t : "/tmp";
}

/* $BUILD/bin/NAME, the build's own tool (BUILD is the build directory the
 * Makefile runs the tests with; "build" when unset). Four rotating
 * buffers, so one command can name up to four tools. */
static inline const char *test_bin(const char *name)
{
	static char buf[4][4096];
	static int k;
	const char *build = getenv("BUILD");
	char *b = buf[k++ % 4];
	snprintf(b, sizeof(buf[0]), "%s/bin/%s", build && *build ? build : "build", name);
	return b;
}

/* A synthetic model from the build's `edgelm-gguf mkmodel ARGS -o OUT`
 * (ARGS already quoted for the shell), its output silenced; 0, or -1 with
 * the command on stderr. */
static inline int test_mkmodel(const char *out, const char *args)
{
	char cmd[16384];
	snprintf(cmd, sizeof(cmd), "'%s' mkmodel %s -o '%s' >/dev/null 2>&1",
		 test_bin("edgelm-gguf"), args, out);
	if (system(cmd) == 0)
		return 0;
	fprintf(stderr, "failed: %s\n", cmd);
	return -1;
}

/* Run a shell command through popen(), capture its stdout in a malloc'ed,
 * NUL-terminated buffer (*ret_out, the caller frees it) and return its exit
 * status, or -1 when it did not exit normally. When popen() itself fails it
 * returns -1 and leaves *ret_out untouched. */
static inline int test_run_capture(const char *cmd, char **ret_out)
{
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	size_t cap = 1 << 16, n = 0, r;
	char *buf = malloc(cap + 1);
	while ((r = fread(buf + n, 1, cap - n, p)) > 0) {
		n += r;
		if (n == cap)
			buf = realloc(buf, (cap *= 2) + 1);
	}
	buf[n] = '\0';
	int st = pclose(p);
	*ret_out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
