/* common/common.h: the error type, allocation wrappers, checked arithmetic
 * and compiler macros shared by every module. No dependencies beyond libc.
 *
 * Error convention (see docs/style): functions return 0 on success or a
 * negative errno, and fill an optional struct cm_err with a one-line message
 * that names what went wrong and where. Library code never logs. */
#ifndef EDGELM_COMMON_H
#define EDGELM_COMMON_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#define CM_UNUSED __attribute__((unused))
#define CM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define CM_LIKELY(x) __builtin_expect(!!(x), 1)
#define CM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define CM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define CM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CM_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Cache-line alignment used for every buffer the kernels touch. */
#define CM_ALIGN 64

struct cm_err {
	int code;      /* negative errno, 0 when no error was recorded */
	char msg[256]; /* one line, no trailing newline */
};

/* Record an error and return `code` (a negative errno), so callers can write
 * `return cm_err_set(err, -EPROTO, "gguf: ...", ...);`. `err` may be NULL. */
int cm_err_set(struct cm_err *err, int code, const char *fmt, ...) CM_PRINTF(3, 4);

/* Prefix an existing message: "ctx: old message". Keeps the code. */
int cm_err_prefix(struct cm_err *err, const char *fmt, ...) CM_PRINTF(2, 3);

static inline void cm_err_clear(struct cm_err *err)
{
	if (err) {
		err->code = 0;
		err->msg[0] = '\0';
	}
}

/* Allocation. All of the project's heap allocations go through these so that
 * debug and test builds can inject failures: with CM_FAIL_ALLOC_AFTER=N in the
 * environment, allocation number N+1 and every later one fail (return NULL).
 * cm_aligned_alloc returns CM_ALIGN-aligned memory, freed with cm_free. */
void *cm_malloc(size_t n);
void *cm_calloc(size_t count, size_t size);
void *cm_realloc(void *p, size_t n);
void *cm_aligned_alloc(size_t n);
char *cm_strdup(const char *s);
char *cm_strndup(const char *s, size_t n);
void cm_free(void *p);
/* Re-read CM_FAIL_ALLOC_AFTER and reset the counter (tests). */
void cm_alloc_fail_reset(long after);

/* Checked arithmetic: return true on overflow. */
static inline bool cm_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_mul_overflow(a, b, r);
}
static inline bool cm_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *r)
{
	return __builtin_add_overflow(a, b, r);
}
static inline uint64_t cm_align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}

/* Monotonic clock in seconds / nanoseconds. */
double cm_now(void);
uint64_t cm_now_ns(void);
/* The time ms milliseconds from now on `clock` (the clock of the condition
 * variable it is for), for pthread_cond_timedwait. */
struct timespec cm_deadline(clockid_t clock, int64_t ms);

/* Linux's per-process permission for the AMX tile state (x86-64,
 * arch_prctl(ARCH_GET/REQ_XCOMP_PERM)): whether it is held, and asking for
 * it (process-wide, no way back): 0 or -errno (-EOPNOTSUPP elsewhere). */
bool cm_amx_permitted(void);
int cm_amx_request(void);

#endif
