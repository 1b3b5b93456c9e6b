/* common/common.c: error helpers, allocation wrappers with failure
 * injection, clock, the AMX permission. */
#include "common/common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

int cm_err_set(struct cm_err *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return code;
}

int cm_err_prefix(struct cm_err *err, const char *fmt, ...)
{
	if (!err)
		return 0;
	char pre[128], old[sizeof(err->msg)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	/* "pre: old", cut to fit (built by hand: snprintf would warn about
	 * the truncation that is intended here) */
	size_t lp = strnlen(pre, sizeof(pre));
	if (lp > sizeof(err->msg) - 3)
		lp = sizeof(err->msg) - 3;
	memcpy(err->msg, pre, lp);
	err->msg[lp] = ':';
	err->msg[lp + 1] = ' ';
	size_t lo = strnlen(old, sizeof(err->msg) - lp - 3);
	memcpy(err->msg + lp + 2, old, lo);
	err->msg[lp + 2 + lo] = '\0';
	return err->code;
}

/* Failure injection: -1 means "never fail". Read lazily from the environment
 * on the first allocation. */
static atomic_long fail_after = -2;
static atomic_long alloc_count;

static bool alloc_should_fail(void)
{
	long fa = atomic_load_explicit(&fail_after, memory_order_relaxed);
	if (fa == -2) {
		const char *s = getenv("CM_FAIL_ALLOC_AFTER");
		fa = s && *s ? strtol(s, NULL, 10) : -1;
		atomic_store(&fail_after, fa);
	}
	if (fa < 0)
		return false;
	return atomic_fetch_add(&alloc_count, 1) >= fa;
}

void cm_alloc_fail_reset(long after)
{
	atomic_store(&alloc_count, 0);
	atomic_store(&fail_after, after);
}

void *cm_malloc(size_t n)
{
	if (alloc_should_fail())
		return NULL;
	return malloc(n ? n : 1);
}

void *cm_calloc(size_t count, size_t size)
{
	if (alloc_should_fail())
		return NULL;
	return calloc(count ? count : 1, size ? size : 1);
}

void *cm_realloc(void *p, size_t n)
{
	if (alloc_should_fail())
		return NULL;
	return realloc(p, n ? n : 1);
}

void *cm_aligned_alloc(size_t n)
{
	if (alloc_should_fail())
		return NULL;
	void *p = NULL;
	if (posix_memalign(&p, CM_ALIGN, n ? n : CM_ALIGN) != 0)
		return NULL;
	return p;
}

char *cm_strndup(const char *s, size_t n)
{
	char *d = cm_malloc(n + 1);
	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = '\0';
	return d;
}

char *cm_strdup(const char *s)
{
	return cm_strndup(s, strlen(s));
}

void cm_free(void *p)
{
	free(p);
}

uint64_t cm_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct timespec cm_deadline(clockid_t clock, int64_t ms)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	ts.tv_sec += (time_t)(ms / 1000);
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

double cm_now(void)
{
	return (double)cm_now_ns() * 1e-9;
}

/* arch_prctl codes (asm/prctl.h) and the AMX tile data's XSAVE component */
#define ARCH_GET_XCOMP_PERM_ 0x1022
#define ARCH_REQ_XCOMP_PERM_ 0x1023
#define XFEATURE_XTILEDATA_ 18

bool cm_amx_permitted(void)
{
#if defined(__x86_64__) && defined(__linux__)
	unsigned long mask = 0;
	if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM_, &mask) != 0)
		return false;
	return (mask >> XFEATURE_XTILEDATA_) & 1;
#else
	return false;
#endif
}

int cm_amx_request(void)
{
#if defined(__x86_64__) && defined(__linux__)
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, (unsigned long)XFEATURE_XTILEDATA_) != 0)
		return -errno;
	return 0;
#else
	return -EOPNOTSUPP;
#endif
}
