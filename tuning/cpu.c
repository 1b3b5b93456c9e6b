/* tuning/cpu.c: CPU identity and the instruction sets that can be used.
 *
 * x86-64: libcpuid names the CPU and its caches; every ISA bit comes from
 * CPUID itself, because libcpuid 0.6 has no AVX-VNNI, AVX512-BF16 or AMX and
 * (0.6.2, seen on this project's AMD Zen box) reports no AVX-512 at all on
 * recent AMD parts. A bit only counts when XGETBV shows that the OS saves the
 * registers it needs (YMM for AVX*, opmask+ZMM for AVX-512, TILECFG+TILEDATA
 * for AMX). AMX further needs a per-process permission from the kernel.
 * aarch64: getauxval hwcaps. Fake trees: the flags of <procfs>/cpuinfo. */
#include "tuning/tuning_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <libcpuid/libcpuid.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

#define BIT(r, n) ((((r) >> (n)) & 1u) != 0)

void tuning_isa_format(const struct tuning_isa *isa, char *buf, size_t len)
{
	const struct {
		const char *name;
		bool on;
	} f[] = {
	    {"sse4.2", isa->sse42},
	    {"avx", isa->avx},
	    {"avx2", isa->avx2},
	    {"fma", isa->fma},
	    {"f16c", isa->f16c},
	    {"avx512f", isa->avx512f},
	    {"avx512cd", isa->avx512cd},
	    {"avx512bw", isa->avx512bw},
	    {"avx512vl", isa->avx512vl},
	    {"avx512dq", isa->avx512dq},
	    {"avx512vbmi", isa->avx512vbmi},
	    {"avx512vnni", isa->avx512vnni},
	    {"avx512bf16", isa->avx512bf16},
	    {"avxvnni", isa->avxvnni},
	    {"amx-tile", isa->amx_tile},
	    {"amx-int8", isa->amx_int8},
	    {"amx-bf16", isa->amx_bf16},
	    {"neon", isa->neon},
	    {"fp16", isa->asimdhp},
	    {"dotprod", isa->dotprod},
	    {"i8mm", isa->i8mm},
	    {"bf16", isa->bf16},
	    {"sve", isa->sve},
	};
	size_t n = 0;
	if (len)
		buf[0] = '\0';
	for (size_t i = 0; i < CM_ARRAY_LEN(f); i++) {
		if (!f[i].on)
			continue;
		int k = snprintf(buf + n, len - n, "%s%s", n ? " " : "", f[i].name);
		if (k < 0 || (size_t)k >= len - n)
			break;
		n += (size_t)k;
	}
	if (n == 0)
		tuning_strlcpy(buf, "(baseline only)", len);
}

/* ---- cpuinfo (fake trees, and the model name on real ones) -------------- */

static const struct {
	int implementer, part;
	const char *name;
} arm_parts[] = {
    {0x41, 0xd03, "Cortex-A53"}, {0x41, 0xd04, "Cortex-A35"},  {0x41, 0xd05, "Cortex-A55"},
    {0x41, 0xd07, "Cortex-A57"}, {0x41, 0xd08, "Cortex-A72"},  {0x41, 0xd09, "Cortex-A73"},
    {0x41, 0xd0a, "Cortex-A75"}, {0x41, 0xd0b, "Cortex-A76"},  {0x41, 0xd0c, "Neoverse-N1"},
    {0x41, 0xd0d, "Cortex-A77"}, {0x41, 0xd40, "Neoverse-V1"}, {0x41, 0xd41, "Cortex-A78"},
    {0x41, 0xd44, "Cortex-X1"},  {0x41, 0xd46, "Cortex-A510"}, {0x41, 0xd47, "Cortex-A710"},
    {0x41, 0xd48, "Cortex-X2"},  {0x41, 0xd49, "Neoverse-N2"}, {0x41, 0xd4f, "Neoverse-V2"},
};

static const char *arm_vendor(int impl)
{
	switch (impl) {
	case 0x41:
		return "ARM";
	case 0x42:
		return "Broadcom";
	case 0x48:
		return "HiSilicon";
	case 0x51:
		return "Qualcomm";
	case 0x61:
		return "Apple";
	case 0xc0:
		return "Ampere";
	default:
		return "unknown";
	}
}

/* Distinct "CPU part" values of an arm64 cpuinfo, in order, as names:
 * "Cortex-A55 + Cortex-A76" on a big.LITTLE box. */
static void arm_model(const char *text, int impl, char *buf, size_t len)
{
	int parts[8], n = 0;
	for (const char *p = strstr(text, "CPU part"); p; p = strstr(p + 8, "CPU part")) {
		const char *c = strchr(p, ':');
		if (!c)
			break;
		int part = (int)strtol(c + 1, NULL, 0);
		bool seen = false;
		for (int i = 0; i < n; i++)
			seen |= parts[i] == part;
		if (!seen && n < (int)CM_ARRAY_LEN(parts))
			parts[n++] = part;
	}
	size_t o = 0;
	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		char tmp[32];
		const char *name = NULL;
		for (size_t j = 0; j < CM_ARRAY_LEN(arm_parts); j++)
			if (arm_parts[j].implementer == impl && arm_parts[j].part == parts[i])
				name = arm_parts[j].name;
		if (!name) {
			snprintf(tmp, sizeof(tmp), "part 0x%03x", parts[i]);
			name = tmp;
		}
		int k = snprintf(buf + o, len - o, "%s%s", i ? " + " : "", name);
		if (k < 0 || (size_t)k >= len - o)
			break;
		o += (size_t)k;
	}
}

int tuning_cpu_parse_cpuinfo(const char *text, struct tuning_cpu *cpu)
{
	char v[4096];
	memset(cpu, 0, sizeof(*cpu));
	cpu->l1d_kib = cpu->l2_kib = cpu->l3_kib = -1;
	tuning_strlcpy(cpu->source, "cpuinfo", sizeof(cpu->source));
	struct tuning_isa *i = &cpu->isa;
	if (tuning_text_field(text, "flags", v, sizeof(v)) == 0) {
		tuning_strlcpy(cpu->arch, "x86_64", sizeof(cpu->arch));
		tuning_text_field(text, "vendor_id", cpu->vendor, sizeof(cpu->vendor));
		tuning_text_field(text, "model name", cpu->model, sizeof(cpu->model));
		char num[32];
		if (tuning_text_field(text, "cpu family", num, sizeof(num)) == 0)
			cpu->family = atoi(num);
		if (tuning_text_field(text, "model", num, sizeof(num)) == 0)
			cpu->model_id = atoi(num);
		if (tuning_text_field(text, "stepping", num, sizeof(num)) == 0)
			cpu->stepping = atoi(num);
		i->sse42 = tuning_word_in(v, "sse4_2");
		i->avx = tuning_word_in(v, "avx");
		i->avx2 = tuning_word_in(v, "avx2");
		i->fma = tuning_word_in(v, "fma");
		i->f16c = tuning_word_in(v, "f16c");
		i->avx512f = tuning_word_in(v, "avx512f");
		i->avx512cd = tuning_word_in(v, "avx512cd");
		i->avx512bw = tuning_word_in(v, "avx512bw");
		i->avx512vl = tuning_word_in(v, "avx512vl");
		i->avx512dq = tuning_word_in(v, "avx512dq");
		i->avx512vbmi = tuning_word_in(v, "avx512vbmi");
		i->avx512vnni = tuning_word_in(v, "avx512_vnni");
		i->avx512bf16 = tuning_word_in(v, "avx512_bf16");
		i->avxvnni = tuning_word_in(v, "avx_vnni");
		i->amx_tile = tuning_word_in(v, "amx_tile");
		i->amx_int8 = tuning_word_in(v, "amx_int8");
		i->amx_bf16 = tuning_word_in(v, "amx_bf16");
		cpu->hypervisor = tuning_word_in(v, "hypervisor");
		/* The kernel clears the flags of register state it does not
		 * enable in XCR0, so what is listed is OS-supported. */
		cpu->os_avx = i->avx;
		cpu->os_avx512 = i->avx512f;
		cpu->os_amx = i->amx_tile;
	} else if (tuning_text_field(text, "Features", v, sizeof(v)) == 0) {
		tuning_strlcpy(cpu->arch, "aarch64", sizeof(cpu->arch));
		char num[32];
		int impl = 0;
		if (tuning_text_field(text, "CPU implementer", num, sizeof(num)) == 0)
			impl = (int)strtol(num, NULL, 0);
		cpu->family = impl;
		if (tuning_text_field(text, "CPU part", num, sizeof(num)) == 0)
			cpu->model_id = (int)strtol(num, NULL, 0);
		tuning_strlcpy(cpu->vendor, arm_vendor(impl), sizeof(cpu->vendor));
		arm_model(text, impl, cpu->model, sizeof(cpu->model));
		i->neon = tuning_word_in(v, "asimd");
		i->asimdhp = tuning_word_in(v, "asimdhp");
		i->dotprod = tuning_word_in(v, "asimddp");
		i->i8mm = tuning_word_in(v, "i8mm");
		i->bf16 = tuning_word_in(v, "bf16");
		i->sve = tuning_word_in(v, "sve");
	} else {
		return -EINVAL;
	}
	cpu->cpu_has = cpu->isa;
	return 0;
}

/* ---- x86: CPUID + XGETBV + libcpuid ------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)

static uint64_t xgetbv0(void)
{
	uint32_t lo, hi;
	/* Encoded as bytes so the file needs no -mxsave. Valid only when
	 * CPUID.1:ECX.OSXSAVE is set (checked by the caller). */
	__asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
	return ((uint64_t)hi << 32) | lo;
}

static void trim_right(char *s)
{
	size_t n = strlen(s);
	while (n && s[n - 1] == ' ')
		s[--n] = '\0';
}

static void detect_x86(struct tuning_cpu *cpu)
{
	unsigned a, b, c, d;
	unsigned c1 = 0, b7 = 0, c7 = 0, d7 = 0, a71 = 0;

	tuning_strlcpy(cpu->arch, "x86_64", sizeof(cpu->arch));
	tuning_strlcpy(cpu->source, "cpuid+xgetbv", sizeof(cpu->source));
	if (!__get_cpuid_count(1, 0, &a, &b, &c, &d))
		return;
	c1 = c;
	unsigned max_leaf = __get_cpuid_max(0, NULL);
	if (max_leaf >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d)) {
		unsigned max_sub = a;
		b7 = b;
		c7 = c;
		d7 = d;
		if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d))
			a71 = a;
	}
	uint64_t xcr0 = BIT(c1, 27) ? xgetbv0() : 0; /* OSXSAVE */

	struct tuning_isa *h = &cpu->cpu_has;
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
	cpu->hypervisor = BIT(c1, 31);

	/* XCR0 bits: 1 SSE, 2 AVX (upper YMM); 5 opmask, 6 ZMM0-15 upper
	 * halves, 7 ZMM16-31; 17 XTILECFG, 18 XTILEDATA. */
	cpu->os_avx = (xcr0 & 0x6) == 0x6;
	cpu->os_avx512 = cpu->os_avx && (xcr0 & 0xe0) == 0xe0;
	cpu->os_amx = (xcr0 & 0x60000) == 0x60000;

	struct tuning_isa *u = &cpu->isa;
	u->sse42 = h->sse42;
	u->avx = h->avx && cpu->os_avx;
	u->fma = u->avx && h->fma;
	u->f16c = u->avx && h->f16c;
	u->avx2 = u->avx && h->avx2;
	u->avxvnni = u->avx2 && h->avxvnni;
	u->avx512f = cpu->os_avx512 && h->avx512f;
	u->avx512dq = u->avx512f && h->avx512dq;
	u->avx512cd = u->avx512f && h->avx512cd;
	u->avx512bw = u->avx512f && h->avx512bw;
	u->avx512vl = u->avx512f && h->avx512vl;
	u->avx512vbmi = u->avx512f && h->avx512vbmi;
	u->avx512vnni = u->avx512f && h->avx512vnni;
	u->avx512bf16 = u->avx512f && h->avx512bf16;
	u->amx_tile = cpu->os_amx && h->amx_tile;
	u->amx_int8 = u->amx_tile && h->amx_int8;
	u->amx_bf16 = u->amx_tile && h->amx_bf16;
	cpu->amx_permitted = u->amx_tile && cm_amx_permitted();

	/* Identity and caches from libcpuid; ISA bits above stay authoritative. */
	struct cpu_raw_data_t raw;
	struct cpu_id_t id;
	if (cpuid_present() && cpuid_get_raw_data(&raw) == 0 && cpu_identify(&raw, &id) == 0) {
		tuning_strlcpy(cpu->vendor, id.vendor_str, sizeof(cpu->vendor));
		tuning_strlcpy(cpu->model, id.brand_str, sizeof(cpu->model));
		trim_right(cpu->model);
		cpu->family = id.ext_family;
		cpu->model_id = id.ext_model;
		cpu->stepping = id.stepping;
		cpu->l1d_kib = id.l1_data_cache;
		cpu->l2_kib = id.l2_cache;
		cpu->l3_kib = id.l3_cache;
		/* Say what libcpuid missed, for bug reports. */
		const struct {
			const char *name;
			bool cpuid, lib;
		} cmp[] = {
		    {"avx2", h->avx2, id.flags[CPU_FEATURE_AVX2] != 0},
		    {"fma", h->fma, id.flags[CPU_FEATURE_FMA3] != 0},
		    {"avx512f", h->avx512f, id.flags[CPU_FEATURE_AVX512F] != 0},
		    {"avx512bw", h->avx512bw, id.flags[CPU_FEATURE_AVX512BW] != 0},
		    {"avx512vnni", h->avx512vnni, id.flags[CPU_FEATURE_AVX512VNNI] != 0},
		};
		char miss[96] = "";
		size_t o = 0;
		for (size_t k = 0; k < CM_ARRAY_LEN(cmp); k++) {
			if (!cmp[k].cpuid || cmp[k].lib)
				continue;
			int w = snprintf(miss + o, sizeof(miss) - o, " %s", cmp[k].name);
			if (w > 0 && (size_t)w < sizeof(miss) - o)
				o += (size_t)w;
		}
		if (o)
			snprintf(cpu->notes, sizeof(cpu->notes),
			         "libcpuid %s misses%s (CPUID used)", cpuid_lib_version(), miss);
	} else {
		/* vendor from leaf 0 at least */
		unsigned regs[4];
		if (__get_cpuid(0, &regs[0], &regs[1], &regs[2], &regs[3])) {
			memcpy(cpu->vendor, &regs[1], 4);
			memcpy(cpu->vendor + 4, &regs[3], 4);
			memcpy(cpu->vendor + 8, &regs[2], 4);
			cpu->vendor[12] = '\0';
		}
	}
}

int tuning_cpu_amx_request(struct tuning_cpu *cpu, struct cm_err *err)
{
	if (!cpu->isa.amx_tile)
		return cm_err_set(err, -EOPNOTSUPP, "amx: not supported by this CPU or OS");
	int r = cm_amx_request();
	if (r != 0)
		return cm_err_set(err, r, "amx: arch_prctl(ARCH_REQ_XCOMP_PERM): %s", strerror(-r));
	cpu->amx_permitted = true;
	return 0;
}

void tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct tuning_isa *ret)
{
	*ret = cpu->isa;
	/* Only the live CPU can have the permission; a report read from a fake
	 * tree never grants AMX to the engine. */
	bool ok = strcmp(cpu->source, "cpuid+xgetbv") == 0 && ret->amx_tile && cm_amx_permitted();
	if (!ok)
		ret->amx_tile = ret->amx_int8 = ret->amx_bf16 = false;
}

#elif defined(__aarch64__)

/* Values from the arm64 ABI (asm/hwcap.h), for older headers. */
#define HWCAP_ASIMD_ (1ul << 1)
#define HWCAP_ASIMDHP_ (1ul << 10)
#define HWCAP_ASIMDDP_ (1ul << 20)
#define HWCAP_SVE_ (1ul << 22)
#define HWCAP2_I8MM_ (1ul << 13)
#define HWCAP2_BF16_ (1ul << 14)

static void detect_arm(struct tuning_cpu *cpu)
{
	unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
	struct tuning_isa *i = &cpu->isa;
	tuning_strlcpy(cpu->arch, "aarch64", sizeof(cpu->arch));
	tuning_strlcpy(cpu->source, "hwcap", sizeof(cpu->source));
	/* hwcaps are set by the kernel, so they are OS-supported by definition */
	i->neon = (hw & HWCAP_ASIMD_) != 0;
	i->asimdhp = i->neon && (hw & HWCAP_ASIMDHP_) != 0;
	i->dotprod = i->neon && (hw & HWCAP_ASIMDDP_) != 0;
	i->sve = (hw & HWCAP_SVE_) != 0;
	i->i8mm = i->neon && (hw2 & HWCAP2_I8MM_) != 0;
	i->bf16 = i->neon && (hw2 & HWCAP2_BF16_) != 0;
	cpu->cpu_has = *i;
}

int tuning_cpu_amx_request(struct tuning_cpu *cpu, struct cm_err *err)
{
	return cm_err_set(err, -EOPNOTSUPP, "amx: not an x86 CPU");
}

void tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct tuning_isa *ret)
{
	*ret = cpu->isa;
	ret->amx_tile = ret->amx_int8 = ret->amx_bf16 = false;
}

#else

int tuning_cpu_amx_request(struct tuning_cpu *cpu, struct cm_err *err)
{
	return cm_err_set(err, -EOPNOTSUPP, "amx: not an x86 CPU");
}

void tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct tuning_isa *ret)
{
	*ret = cpu->isa;
	ret->amx_tile = ret->amx_int8 = ret->amx_bf16 = false;
}

#endif

int tuning_cpu_detect(struct tuning_cpu *cpu, struct cm_err *err)
{
	memset(cpu, 0, sizeof(*cpu));
	cpu->l1d_kib = cpu->l2_kib = cpu->l3_kib = -1;
#if defined(__x86_64__) || defined(__i386__)
	detect_x86(cpu);
#elif defined(__aarch64__)
	detect_arm(cpu);
#else
	tuning_strlcpy(cpu->source, "none", sizeof(cpu->source));
#endif
	return 0;
}
