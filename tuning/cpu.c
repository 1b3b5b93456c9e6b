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

#include "common/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <libcpuid/libcpuid.h>
#endif

#define BIT(r, n) ((((r) >> (n)) & 1u) != 0)

void tuning_isa_format(const struct cm_cpu_isa *isa, char *buf, size_t len)
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
	struct cm_cpu_isa *i = &cpu->isa;
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

/* The ISA bits of the common probe (common/cpu.h), as the engine sees them. */
static void take_probe(struct tuning_cpu *cpu)
{
	struct cm_cpu p;
	cm_cpu_probe(&p);
	tuning_strlcpy(cpu->arch, p.arch, sizeof(cpu->arch));
	tuning_strlcpy(cpu->source, p.source, sizeof(cpu->source));
	cpu->cpu_has = p.has;
	cpu->isa = p.usable;
	cpu->os_avx = p.os_avx;
	cpu->os_avx512 = p.os_avx512;
	cpu->os_amx = p.os_amx;
	cpu->hypervisor = p.hypervisor;
	cpu->amx_permitted = cpu->isa.amx_tile && cm_amx_permitted();
}

/* ---- x86: CPUID + XGETBV + libcpuid ------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)

static void trim_right(char *s)
{
	size_t n = strlen(s);
	while (n && s[n - 1] == ' ')
		s[--n] = '\0';
}

static void detect_x86(struct tuning_cpu *cpu)
{
	take_probe(cpu);
	const struct cm_cpu_isa *h = &cpu->cpu_has;

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

bool tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct cm_cpu_isa *ret)
{
	*ret = cpu->isa;
	/* Only the live CPU can have the permission; a report read from a fake
	 * tree never grants AMX to the engine. */
	bool live = strcmp(cpu->source, "cpuid+xgetbv") == 0;
	if (!(live && ret->amx_tile && cm_amx_permitted()))
		ret->amx_tile = ret->amx_int8 = ret->amx_bf16 = false;
	return live;
}

#else

int tuning_cpu_amx_request(struct tuning_cpu *cpu, struct cm_err *err)
{
	return cm_err_set(err, -EOPNOTSUPP, "amx: not an x86 CPU");
}

bool tuning_cpu_engine_isa(const struct tuning_cpu *cpu, struct cm_cpu_isa *ret)
{
	*ret = cpu->isa;
	ret->amx_tile = ret->amx_int8 = ret->amx_bf16 = false;
	return strcmp(cpu->source, "hwcap") == 0;
}

#endif

int tuning_cpu_detect(struct tuning_cpu *cpu, struct cm_err *err)
{
	memset(cpu, 0, sizeof(*cpu));
	cpu->l1d_kib = cpu->l2_kib = cpu->l3_kib = -1;
#if defined(__x86_64__) || defined(__i386__)
	detect_x86(cpu);
#else
	take_probe(cpu);
#endif
	return 0;
}
