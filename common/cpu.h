/* common/cpu.h: the one CPU feature probe.
 *
 * What the CPU reports (CPUID on x86-64, the kernel's hwcaps on aarch64)
 * and what a process may use of it: an x86 instruction set counts only when
 * XGETBV shows that the OS saves the registers it needs (YMM for AVX*,
 * opmask+ZMM for AVX-512, TILECFG+TILEDATA for AMX). Tuning reports it and
 * the engine picks its kernels from it; edgelmd hands tuning's result to the
 * engine (engine_params.cpu), so the two cannot disagree. AMX also needs a
 * per-process permission (cm_amx_permitted), which is not part of `usable`. */
#ifndef EDGELM_COMMON_CPU_H
#define EDGELM_COMMON_CPU_H

#include <stdbool.h>

struct cm_cpu_isa {
	bool sse42, avx, fma, f16c, avx2, avxvnni;
	bool avx512f, avx512dq, avx512cd, avx512bw, avx512vl, avx512vbmi, avx512vnni, avx512bf16;
	bool amx_tile, amx_int8, amx_bf16;
	bool neon, asimdhp, dotprod, i8mm, bf16, sve;
};

struct cm_cpu {
	const char *arch;   /* "x86_64", "aarch64", or "" */
	const char *source; /* "cpuid+xgetbv", "hwcap", or "none" */
	struct cm_cpu_isa has;    /* what the CPU reports */
	struct cm_cpu_isa usable; /* and the OS saves the state of */
	bool os_avx;    /* XCR0: YMM */
	bool os_avx512; /* XCR0: opmask + ZMM */
	bool os_amx;    /* XCR0: XTILECFG + XTILEDATA */
	bool hypervisor; /* CPUID.1:ECX[31] */
};

/* This CPU, now. Never fails: what it cannot tell stays false. */
void cm_cpu_probe(struct cm_cpu *ret);

#endif
