/* engine/kernels/kern_select.c: CPU feature detection and the choice of
 * kernel variant.
 *
 * Built without ISA flags and without <immintrin.h>: it only asks the CPU
 * what it has. A variant is usable when the CPU implements its instructions
 * AND the OS saves the registers they use (XCR0), otherwise the first vector
 * instruction would fault. */
#include "engine/kernels/kern.h"

#include "common/common.h"

#include <string.h>
#include <strings.h>

#if defined(__x86_64__)
#include <cpuid.h>
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* ---- variants ---------------------------------------------------------------- */

static bool caps_none(const struct kern_caps *c)
{
	(void)c;
	return true;
}

/* The compiled-in variants, best first: {name, table, CPU predicate}. A new
 * variant is one line here (plus its predicate above). */
#define KERN_VARIANTS(X) X("scalar", &kern_generic_ops, caps_none)

static const struct variant {
	const char *name;
	const struct kern_ops *ops;
	bool (*supported)(const struct kern_caps *caps);
} variants[] = {
#define VARIANT_ENTRY(n, o, p) { n, o, p },
	KERN_VARIANTS(VARIANT_ENTRY)
#undef VARIANT_ENTRY
};

static const char *const variant_names[] = {
#define VARIANT_NAME(n, o, p) n,
	KERN_VARIANTS(VARIANT_NAME)
#undef VARIANT_NAME
	NULL,
};

const char *const *kern_variant_names(void)
{
	return variant_names;
}

const struct kern_ops *kern_select(const struct kern_caps *caps, const char *force)
{
	struct kern_caps detected;
	bool any = !force || !*force || strcasecmp(force, "auto") == 0;

	if (!caps) {
		kern_detect_caps(&detected);
		caps = &detected;
	}
	/* "generic" names the scalar table after its file. */
	if (!any && strcasecmp(force, "generic") == 0)
		force = "scalar";
	for (size_t i = 0; i < CM_ARRAY_LEN(variants); i++) {
		const struct variant *v = &variants[i];
		if (!any && strcasecmp(force, v->name) != 0)
			continue;
		if (v->supported(caps))
			return v->ops;
		if (!any)
			return NULL;
	}
	return NULL;
}

/* ---- detection -------------------------------------------------------------- */

#if defined(__x86_64__)

static uint64_t read_xcr0(void)
{
	uint32_t lo, hi;
	/* xgetbv with ecx = 0; only valid when CPUID.1:ECX.OSXSAVE is set. */
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

#define BIT(r, n) (((r) >> (n)) & 1u)

void kern_detect_caps(struct kern_caps *caps)
{
	unsigned a, b, c, d;
	unsigned c1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0;
	uint64_t xcr0 = 0;

	memset(caps, 0, sizeof(*caps));
	if (!__get_cpuid_count(1, 0, &a, &b, &c, &d))
		return;
	c1 = c;
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
		unsigned max_sub = a;
		b7 = b;
		c7 = c;
		d7 = d;
		if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
			a71 = a;
	}
	if (BIT(c1, 27)) /* OSXSAVE: xgetbv is available */
		xcr0 = read_xcr0();

	/* XCR0: 1 SSE, 2 AVX (upper YMM); 5 opmask, 6 ZMM0-15 upper, 7 ZMM16-31;
	 * 17 XTILECFG, 18 XTILEDATA. (On Linux, AMX also needs a per-process
	 * arch_prctl(ARCH_REQ_XCOMP_PERM) before first use; that belongs to
	 * the AMX variant.) */
	bool ymm = (xcr0 & 0x6) == 0x6;
	bool zmm = ymm && (xcr0 & 0xe0) == 0xe0;
	bool tmm = (xcr0 & 0x60000) == 0x60000;
	bool avx = ymm && BIT(c1, 28);

	caps->fma = avx && BIT(c1, 12);
	caps->f16c = avx && BIT(c1, 29);
	caps->avx2 = avx && BIT(b7, 5);
	caps->avxvnni = caps->avx2 && BIT(a71, 4);

	caps->avx512f = zmm && BIT(b7, 16);
	caps->avx512dq = caps->avx512f && BIT(b7, 17);
	caps->avx512bw = caps->avx512f && BIT(b7, 30);
	caps->avx512vl = caps->avx512f && BIT(b7, 31);
	caps->avx512vnni = caps->avx512f && BIT(c7, 11);
	caps->avx512bf16 = caps->avx512f && BIT(a71, 5);

	caps->amx_bf16 = tmm && BIT(d7, 22);
	caps->amx_tile = tmm && BIT(d7, 24);
	caps->amx_int8 = tmm && BIT(d7, 25);
}

#elif defined(__aarch64__) && defined(__linux__)

/* Values from the arm64 ABI (asm/hwcap.h), for older headers. */
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1ul << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1ul << 13)
#endif

void kern_detect_caps(struct kern_caps *caps)
{
	unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);

	memset(caps, 0, sizeof(*caps));
	caps->neon = (hw & HWCAP_ASIMD) != 0;
	caps->dotprod = caps->neon && (hw & HWCAP_ASIMDDP) != 0;
	caps->i8mm = caps->neon && (hw2 & HWCAP2_I8MM) != 0;
}

#else

void kern_detect_caps(struct kern_caps *caps)
{
	memset(caps, 0, sizeof(*caps));
}

#endif
