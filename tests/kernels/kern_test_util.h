/* tests/kernels/kern_test_util.h: helpers the kernel tests share.
 *
 * - A splitmix64 generator. Each test binary seeds it once at the top of
 *   main() with its own constant, so each draws the same inputs run after
 *   run (and the same as before these helpers were shared).
 * - Allocations that exit(2) on failure, so a test never checks for NULL.
 * - rd16: a little-endian u16 from bytes (block scales in the weights). */
#ifndef EDGELM_KERN_TEST_UTIL_H
#define EDGELM_KERN_TEST_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t kt_rng_state;

static inline void kt_rng_seed(uint64_t seed)
{
	kt_rng_state = seed;
}

static inline uint64_t kt_rng_u64(void)
{
	/* splitmix64 */
	uint64_t z = (kt_rng_state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [0, 1), 53 random bits. */
static inline double kt_rng_unit(void)
{
	return (double)(kt_rng_u64() >> 11) * 0x1.0p-53;
}

static inline void *kt_xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		fprintf(stderr, "kernel test: out of memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

/* Zeroed. */
static inline void *kt_xcalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);
	if (!p) {
		fprintf(stderr, "kernel test: out of memory (%zu bytes)\n", n);
		exit(2);
	}
	return p;
}

static inline uint16_t kt_rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

#endif
