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

$(BUILD)/tests/kernels/%: $(BUILD)/tests/kernels/%.o $(MODULE_LIBS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(TEST_LDLIBS)

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
FUZZ_SRCS = $(COMMON_SRCS) $(filter-out engine/kernels/kern_avx% engine/kernels/kern_amx% engine/kernels/kern_neon%,$(ENGINE_SRCS)) $(IPC_SRCS) $(MONITOR_SRCS) $(TUNING_SRCS)
$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRCS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -I. -g -O1 -pthread -fsanitize=fuzzer,address,undefined \
		-o $@ $^ $(EXT_LIBS)

tests: $(TESTS) $(BINS)

# `make check`: the whole suite in the normal build, then the engine's unit
# tests and the fuzz replays again under ASan+UBSan.
check: check-deps tests
	@BUILD=$(BUILD) tests/run-tests.sh
	@$(MAKE) --no-print-directory SAN=address,undefined CFLAGS="-O1 -g" check-san

check-san: tests
	@BUILD=$(BUILD) TEST_PASS=asan+ubsan EDGELM_AGREE_STORIES=$${EDGELM_AGREE_STORIES:-24} tests/run-tests.sh

test: check
.PHONY: tests check-san
