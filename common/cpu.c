/* common/cpu.c: the CPU feature probe (cpu.h). */
#include "common/cpu.h"

#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <stdint.h>

#define BIT(r, n) ((((r) >> (n)) & 1u) != 0)

static uint64_t xgetbv0(void)
{
	uint32_t lo, hi;
	/* only valid when CPUID.1:ECX.OSXSAVE is set (the caller checks) */
	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

void cm_cpu_probe(struct cm_cpu *ret)
{
	unsigned a, b, c, d;
	unsigned c1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0;

	memset(ret, 0, sizeof(*ret));
	ret->arch = "x86_64";
	ret->source = "cpuid+xgetbv";
	if (!__get_cpuid_count(1, 0, &a, &b, &c, &d))
		return;
	c1 = c;
	if (__get_cpuid_max(0, NULL) >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
		unsigned max_sub = a;
		b7 = b;
		c7 = c;
		d7 = d;
		if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
			a71 = a;
	}
	uint64_t xcr0 = BIT(c1, 27) ? xgetbv0() : 0; /* OSXSAVE */

	struct cm_cpu_isa *h = &ret->has;
	h->sse42 = BIT(c1, 20);
	h->fma = BIT(c1, 12);
	h->avx = BIT(c1, 28);
	h->f16c = BIT(c1, 29);
	h->avx2 = BIT(b7, 5);
	h->avx512f = BIT(b7, 16);
	h->avx512dq = BIT(b7, 17);
	h->avx512cd = BIT(b7, 28);
	h->avx512bw = BIT(b7, 30);
	h->avx512vl = BIT(b7, 31);
	h->avx512vbmi = BIT(c7, 1);
	h->avx512vnni = BIT(c7, 11);
	h->amx_bf16 = BIT(d7, 22);
	h->amx_tile = BIT(d7, 24);
	h->amx_int8 = BIT(d7, 25);
	h->avxvnni = BIT(a71, 4);
	h->avx512bf16 = BIT(a71, 5);
	ret->hypervisor = BIT(c1, 31);

	/* XCR0 bits: 1 SSE, 2 AVX (upper YMM); 5 opmask, 6 ZMM0-15 upper
	 * halves, 7 ZMM16-31; 17 XTILECFG, 18 XTILEDATA. */
	ret->os_avx = (xcr0 & 0x6) == 0x6;
	ret->os_avx512 = ret->os_avx && (xcr0 & 0xe0) == 0xe0;
	ret->os_amx = (xcr0 & 0x60000) == 0x60000;

	struct cm_cpu_isa *u = &ret->usable;
	u->sse42 = h->sse42;
	u->avx = h->avx && ret->os_avx;
	u->fma = u->avx && h->fma;
	u->f16c = u->avx && h->f16c;
	u->avx2 = u->avx && h->avx2;
	u->avxvnni = u->avx2 && h->avxvnni;
	u->avx512f = ret->os_avx512 && h->avx512f;
	u->avx512dq = u->avx512f && h->avx512dq;
	u->avx512cd = u->avx512f && h->avx512cd;
	u->avx512bw = u->avx512f && h->avx512bw;
	u->avx512vl = u->avx512f && h->avx512vl;
	u->avx512vbmi = u->avx512f && h->avx512vbmi;
	u->avx512vnni = u->avx512f && h->avx512vnni;
	u->avx512bf16 = u->avx512f && h->avx512bf16;
	u->amx_tile = ret->os_amx && h->amx_tile;
	u->amx_int8 = u->amx_tile && h->amx_int8;
	u->amx_bf16 = u->amx_tile && h->amx_bf16;
}

#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

/* Values from the arm64 ABI (asm/hwcap.h), for older headers. */
#define HWCAP_ASIMD_ (1ul << 1)
#define HWCAP_ASIMDHP_ (1ul << 10)
#define HWCAP_ASIMDDP_ (1ul << 20)
#define HWCAP_SVE_ (1ul << 22)
#define HWCAP2_I8MM_ (1ul << 13)
#define HWCAP2_BF16_ (1ul << 14)

void cm_cpu_probe(struct cm_cpu *ret)
{
	unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
	memset(ret, 0, sizeof(*ret));
	ret->arch = "aarch64";
	ret->source = "hwcap";
	/* hwcaps are set by the kernel: OS-supported by definition */
	struct cm_cpu_isa *i = &ret->usable;
	i->neon = (hw & HWCAP_ASIMD_) != 0;
	i->asimdhp = i->neon && (hw & HWCAP_ASIMDHP_) != 0;
	i->dotprod = i->neon && (hw & HWCAP_ASIMDDP_) != 0;
	i->sve = (hw & HWCAP_SVE_) != 0;
	i->i8mm = i->neon && (hw2 & HWCAP2_I8MM_) != 0;
	i->bf16 = i->neon && (hw2 & HWCAP2_BF16_) != 0;
	ret->has = *i;
}

#else

void cm_cpu_probe(struct cm_cpu *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->arch = "";
	ret->source = "none";
}

#endif
