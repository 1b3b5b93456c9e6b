# The engine: libc, libm, pthreads and PCRE2 (the BPE pre-tokenizer's
# regexes). Kernel variants get their ISA flags per file (never globally)
# and no LTO, so that vector code cannot leak into the baseline path
# (docs: ../shared/docs/style.md, "ISA dispatch").
#
# ARCH (default: the compiler's) picks the variant files: kern_avx*.c on
# x86_64, kern_neon.c on aarch64; other architectures build the generic
# kernels only. The formats layer under the kernels (engine/kernels/
# formats*.c: block layouts, type table, reference (de)quantizers) is built
# for the baseline CPU like kern_generic.c.
ARCH ?= $(shell $(CC) -dumpmachine 2>/dev/null | cut -d- -f1)
ENGINE_ISA_SRCS_x86_64  := $(wildcard engine/kernels/kern_avx*.c) engine/kernels/kern_amx.c
ENGINE_ISA_SRCS_aarch64 := $(wildcard engine/kernels/kern_neon*.c)
ENGINE_ISA_SRCS := $(ENGINE_ISA_SRCS_$(ARCH))
ENGINE_SRCS := $(wildcard engine/*.c) \
	       $(filter-out engine/kernels/kern_avx% engine/kernels/kern_amx% engine/kernels/kern_neon%,$(wildcard engine/kernels/*.c)) \
	       $(ENGINE_ISA_SRCS)
ENGINE_LIB  := $(BUILD)/engine/libengine.a
$(ENGINE_LIB): $(ENGINE_SRCS:%.c=$(BUILD)/%.o)
ENGINE_LDLIBS := -lpcre2-8 -lm -pthread

KERN_NOLTO := -fno-lto
$(BUILD)/engine/kernels/kern_avx2.o: ISA_FLAGS = -mavx2 -mfma -mf16c $(KERN_NOLTO)
# avx2's part tables (kern_select.c): more weight types, same flags.
$(BUILD)/engine/kernels/kern_avx2_q32.o $(BUILD)/engine/kernels/kern_avx2_kq.o: \
	ISA_FLAGS = -mavx2 -mfma -mf16c $(KERN_NOLTO)
ifneq ($(SAN),)
# Under the sanitizers GCC spends ~8 CPU-minutes at -O2 on these files'
# always-inline tile kernels (~3 at -O1), the longest step of make check's
# sanitizer pass: that pass builds them at -O1 (after CFLAGS' -O2).
$(BUILD)/engine/kernels/kern_avx2_q32.o $(BUILD)/engine/kernels/kern_avx2_kq.o: \
	LATE_CFLAGS = -O1
endif
$(BUILD)/engine/kernels/kern_avxvnni.o: ISA_FLAGS = -mavx2 -mfma -mf16c -mavxvnni $(KERN_NOLTO)
# VNNI functions in kern_avx512.c enable -mavx512vnni per function.
$(BUILD)/engine/kernels/kern_avx512.o: ISA_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq \
	-mfma -mf16c $(KERN_NOLTO)
# AMX-INT8 tiles for prefill, over the AVX-512 finish (kern_amx.c).
KERN_AMX_BASE_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c $(KERN_NOLTO)
$(BUILD)/engine/kernels/kern_amx.o: ISA_FLAGS = $(KERN_AMX_BASE_FLAGS) -mamx-tile -mamx-int8
# Two tables from one file: plain NEON, and dotprod (per-function target).
$(BUILD)/engine/kernels/kern_neon.o $(BUILD)/engine/kernels/kern_neon_q.o: \
	ISA_FLAGS = -march=armv8-a $(KERN_NOLTO)
# Without variants (fuzz builds, other architectures) kern_select.c lists
# only the scalar table.
ifeq ($(ENGINE_ISA_SRCS),)
$(BUILD)/engine/kernels/kern_select.o: ISA_FLAGS = -DEDGELM_NO_ISA_VARIANTS
endif
