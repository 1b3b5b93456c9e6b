# Tests. Every tests/unit/test_*.c and tests/kernels/test_*.c is one binary
# that prints "N passed, N failed". tests/run-tests.sh runs them all and
# prints the total.
UNIT_TESTS   := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/unit/test_*.c tests/kernels/test_*.c))
FUZZ_TARGETS := $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_REPLAY  := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/replay_%)
TESTS += $(UNIT_TESTS) $(FUZZ_REPLAY)

TEST_LDLIBS = $(EXT_LIBS)

$(BUILD)/tests/unit/%: $(BUILD)/tests/unit/%.o $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

# The daemon's own tests also link its code (daemon/module.mk: libdaemon.a,
# everything but main.c).
$(BUILD)/tests/unit/test_daemon_%: $(BUILD)/tests/unit/test_daemon_%.o $(DAEMON_LIB) $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

# A fake systemd for integration tests: prints every sd_notify datagram
# received on a socket path (tests/integration/notify_listener.c).
NOTIFY_LISTENER := $(BUILD)/tests/integration/notify_listener
TESTS += $(NOTIFY_LISTENER)
$(NOTIFY_LISTENER): $(BUILD)/tests/integration/notify_listener.o
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^

# One protocol request over nng with TLS options, for the fleet test
# (tests/integration/fleet_call.c).
FLEET_CALL := $(BUILD)/tests/integration/fleet_call
TESTS += $(FLEET_CALL)
$(FLEET_CALL): $(BUILD)/tests/integration/fleet_call.o
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(NNG_LIBS)

$(BUILD)/tests/kernels/%: $(BUILD)/tests/kernels/%.o $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

# x86_64: test_kern also runs the AMX kernels (engine/kernels/kern_amx.c)
# through a software model of the tile instructions (-DKERN_AMX_EMULATE),
# since this project's box has no AMX: once with every token count through
# the tiles (AMX_MIN_NT=1), once as built (below 16 tokens a call goes to
# avx512vnni's kernel).
ifeq ($(ARCH),x86_64)
KERN_AMX_EMU := $(BUILD)/tests/kernels/kern_amx_emu.o $(BUILD)/tests/kernels/kern_amx_emu16.o
$(BUILD)/tests/kernels/kern_amx_emu.o: AMX_EMU_FLAGS = -DAMX_MIN_NT=1
$(BUILD)/tests/kernels/kern_amx_emu16.o: AMX_EMU_FLAGS = -DKERN_AMX_OPS=kern_amx_emu16_ops
$(KERN_AMX_EMU): engine/kernels/kern_amx.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $@ (AMX emulated)")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(KERN_AMX_BASE_FLAGS) -DKERN_AMX_EMULATE $(AMX_EMU_FLAGS) \
		$(CPPFLAGS) $(CFLAGS) -c -o $@ $<
$(BUILD)/tests/kernels/test_kern: $(KERN_AMX_EMU)
$(BUILD)/tests/kernels/test_kern.o: EXTRA_CFLAGS += -DKERN_TEST_AMX_EMU
endif

# Fuzz targets replayed over their checked-in corpus by a plain driver, so no
# clang is needed for `make check`. `make fuzz` builds the libFuzzer versions.
$(BUILD)/tests/fuzz/replay_%: $(BUILD)/tests/fuzz/fuzz_%.o $(BUILD)/tests/fuzz/replay.o $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

FUZZ_CC ?= clang
FUZZ_BUILD := build-fuzz
fuzz: $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz_%)
# The fuzz build compiles the module sources directly (no ISA variants: the
# generic kernels are the ones that see untrusted data first).
FUZZ_SRCS = $(COMMON_SRCS) $(filter-out engine/kernels/kern_avx% engine/kernels/kern_amx% engine/kernels/kern_neon%,$(ENGINE_SRCS)) $(IPC_SRCS) $(MONITOR_SRCS) $(TUNING_SRCS) http/openai.c
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRCS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -DEDGELM_NO_ISA_VARIANTS -I. -g -O1 -pthread \
		-fsanitize=fuzzer,address,undefined \
		-o $@ $^ $(EXT_LIBS)

tests: $(TESTS) $(BINS)

# `make check`: the whole suite in the normal build, then the engine's unit
# tests and the fuzz replays again under ASan+UBSan.
# Both passes always run; the last line is the sum of both.
check: check-deps tests
	@rc=0; rm -f $(BUILD)/.totals; \
	BUILD=$(BUILD) TEST_TOTALS=$(CURDIR)/$(BUILD)/.totals tests/run-tests.sh || rc=1; \
	$(MAKE) --no-print-directory SAN=address,undefined CFLAGS="-O1 -g" \
		TEST_TOTALS=$(CURDIR)/$(BUILD)/.totals check-san || rc=1; \
	awk '{ p += $$1; f += $$2; s += $$3 } END { \
		printf "== make check: both passes\n%d passed, %d failed, %d skipped\n", p, f, s }' \
		$(BUILD)/.totals; \
	exit $$rc

check-san: tests
	@BUILD=$(BUILD) TEST_PASS=asan+ubsan EDGELM_AGREE_STORIES=$${EDGELM_AGREE_STORIES:-24} \
		EDGELM_AGREE_3M=$${EDGELM_AGREE_3M:-0} \
		TEST_TOTALS=$(TEST_TOTALS) tests/run-tests.sh

test: check
.PHONY: tests check-san

# aarch64: cross-build the engine and the kernel tests (static), run them
# under qemu-user. Needs the Debian packages gcc-aarch64-linux-gnu and
# qemu-user-static; `make check` runs this when both are installed and says
# so when they are not.
AARCH64_CC    ?= aarch64-linux-gnu-gcc
QEMU_AARCH64  ?= qemu-aarch64-static
AARCH64_BUILD := build-aarch64
# test_kern and test_kern_attn run every compiled variant (NEON, dotprod)
# against the scalar reference; test_kern_simd's kernel tests (the tile
# kernels' agreement and batch invariance) run as test_kern_simd_k, built
# without its model tests, which need PCRE2 for aarch64.
AARCH64_TESTS := test_kern test_kern_attn test_kern_simd_k
# Debian's gcc-aarch64-linux-gnu 12.2 hits an internal error vectorizing a
# reduction in tests/kernels/test_kern.c; the kernels use intrinsics anyway.
AARCH64_CFLAGS ?= -O2 -g -fno-tree-vectorize

$(BUILD)/tests/kernels/%.static: $(BUILD)/tests/kernels/%.o $(ENGINE_LIB) $(COMMON_LIB)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -static -o $@ $^ -lm -pthread

$(BUILD)/tests/kernels/test_kern_simd_k.o: tests/kernels/test_kern_simd.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $@ (kernel tests only)")
	$(Q)$(CC) $(EDGELM_CFLAGS) -DKERN_TEST_KERNELS_ONLY $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

aarch64-kernel-tests: $(AARCH64_TESTS:%=$(BUILD)/tests/kernels/%.static)

check-aarch64:
	@if ! command -v $(AARCH64_CC) >/dev/null 2>&1 || \
	    ! command -v $(QEMU_AARCH64) >/dev/null 2>&1; then \
	  echo "check-aarch64: SKIPPED: $(AARCH64_CC) or $(QEMU_AARCH64) not found" \
	       "(apt-get install gcc-aarch64-linux-gnu qemu-user-static)"; \
	else \
	  $(MAKE) --no-print-directory ARCH=aarch64 CC=$(AARCH64_CC) SAN= \
	    BUILD=$(AARCH64_BUILD) CFLAGS="$(AARCH64_CFLAGS)" aarch64-kernel-tests || exit 1; \
	  for t in $(AARCH64_TESTS); do \
	    printf 'aarch64 (qemu) %s: ' $$t; \
	    log=$(AARCH64_BUILD)/tests/kernels/$$t.log; \
	    $(QEMU_AARCH64) $(AARCH64_BUILD)/tests/kernels/$$t.static >$$log 2>&1; st=$$?; \
	    tail -n 1 $$log; \
	    if [ $$st != 0 ]; then cat $$log; exit 1; fi; \
	  done; \
	fi

check: check-aarch64
.PHONY: check-aarch64 aarch64-kernel-tests

# Load-sensitive checks (latency bounds that a busy box would break):
# `make check-load`, never part of `make check`. docs/performance.md keeps
# their figures.
LOAD_TESTS := $(patsubst %.c,$(BUILD)/%,$(wildcard tests/load/test_*.c))
$(BUILD)/tests/load/%: $(BUILD)/tests/load/%.o $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

.PHONY: check-load
check-load: $(LOAD_TESTS) $(BINS)
	@rc=0; for t in $(LOAD_TESTS); do echo "== $$t"; \
	  BUILD=$(BUILD) TEST_TMPDIR=$$(mktemp -d) $$t || rc=1; done; exit $$rc
