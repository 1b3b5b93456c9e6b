# edgelm: one non-recursive Makefile. Each module lists its sources in
# <module>/module.mk; objects go out of tree into $(BUILD).
#
#   make                    build everything into build/
#   make check              all tests (normal build, then ASan+UBSan pass)
#   make SAN=address        sanitizer variant into build-address/ (also
#                           undefined, thread, or address,undefined)
#   make NATIVE=1           add -march=native (local experiments only)
#   make install DESTDIR=... PREFIX=...
#   make V=1                print full commands

comma := ,
SAN ?=
ifeq ($(SAN),)
BUILD ?= build
else
BUILD ?= build-$(subst $(comma),-,$(SAN))
endif

CC         ?= cc
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SBINDIR    ?= $(PREFIX)/sbin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
SYSCONFDIR ?= /etc
MANDIR     ?= $(PREFIX)/share/man
PKG_CONFIG ?= pkg-config

# CFLAGS/LDFLAGS belong to the user or distro; ours live in EDGELM_CFLAGS.
CFLAGS  ?= -O2 -g
LDFLAGS ?=
EDGELM_CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wshadow -Wmissing-prototypes \
		-Wno-unused-parameter -fno-strict-aliasing -pthread -MMD -MP -I.
ifneq ($(SAN),)
EDGELM_CFLAGS += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SAN)
endif
ifeq ($(NATIVE),1)
EDGELM_CFLAGS += -march=native
endif

# External libraries (Debian packages, see packaging/build-deps). nng installs
# no nng.pc (upstream or Debian), so it falls back to -lnng.
pc_libs = $(or $(shell $(PKG_CONFIG) --libs $(1) 2>/dev/null),$(2))
JANSSON_LIBS    ?= $(call pc_libs,jansson,-ljansson)
NNG_LIBS        ?= $(call pc_libs,nng,-lnng)
CPUID_LIBS      ?= $(call pc_libs,libcpuid,-lcpuid)
PROC2_LIBS      ?= $(call pc_libs,libproc2,-lproc2)
MHD_LIBS        ?= $(call pc_libs,libmicrohttpd,-lmicrohttpd)
SYSTEMD_LIBS    ?= $(call pc_libs,libsystemd,-lsystemd)
PCRE2_LIBS      ?= $(call pc_libs,libpcre2-8,-lpcre2-8)
NUMA_LIBS       ?= -lnuma
# Programs link every module library they need; --as-needed keeps unused
# shared libraries out of each binary's NEEDED list.
EXT_LIBS = -Wl,--as-needed $(NNG_LIBS) $(JANSSON_LIBS) $(SYSTEMD_LIBS) $(PROC2_LIBS) \
	   $(MHD_LIBS) $(CPUID_LIBS) $(NUMA_LIBS) $(PCRE2_LIBS) -lm -pthread

ifeq ($(V),1)
Q :=
else
Q := @
endif

all:

# Each module.mk appends to these.
LIBS_ALL :=
BINS :=
TESTS :=
CLEAN_EXTRA :=

include common/module.mk
include engine/module.mk
include tuning/module.mk
include monitor/module.mk
include ipc/module.mk
# Module libraries in link order (dependents first).
MODULE_LIBS = $(IPC_LIB) $(MONITOR_LIB) $(TUNING_LIB) $(ENGINE_LIB) $(COMMON_LIB)
include daemon/module.mk
include tools/module.mk
include packaging/module.mk
include tests/module.mk

all: $(BINS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(ISA_FLAGS) $(EXTRA_CFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.a:
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ && $(AR) rcs $@ $^

DEPS := $(shell find $(BUILD) -name '*.d' 2>/dev/null)
-include $(DEPS)

# Keep intermediate objects (tests, tools): no rebuilds on every run. Only
# this bare form: a .SECONDARY with prerequisites anywhere limits it to those.
.SECONDARY:

.PHONY: all check test clean format docs check-deps install install-programs uninstall fuzz

clean:
	rm -rf build build-* $(CLEAN_EXTRA)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# docs/configuration.md: its intro, then the table edgelmd prints from the
# configuration table itself (tests/integration/config_doc.sh checks it).
# docs/protocol.md: its `<!-- generated: fields of OP -->` sections, from the
# request field table (ipc/protocol_fields.c) through test_ipc_protocol's
# --doc mode (tests/integration/protocol_doc.sh checks them).
docs: $(BUILD)/bin/edgelmd $(BUILD)/tests/unit/test_ipc_protocol
	@{ sed '/^<!-- generated/q' docs/configuration.md; $(BUILD)/bin/edgelmd --print-config-doc; } \
		>docs/configuration.md.new && mv docs/configuration.md.new docs/configuration.md
	@echo "  DOCS    docs/configuration.md"
	@$(BUILD)/tests/unit/test_ipc_protocol --doc <docs/protocol.md >docs/protocol.md.new \
		&& mv docs/protocol.md.new docs/protocol.md || { rm -f docs/protocol.md.new; exit 1; }
	@echo "  DOCS    docs/protocol.md"

# Module boundaries (docs/design.md): lower modules include only common/.
check-deps:
	@bad=0; \
	for m in engine tuning monitor ipc; do \
	  for o in engine tuning monitor ipc daemon tools; do \
	    [ $$m = $$o ] && continue; \
	    if grep -rnE "#include \"$$o/" $$m 2>/dev/null; then bad=1; fi; \
	  done; \
	done; \
	if grep -rnE '#include <(nng|jansson|systemd)' engine 2>/dev/null; then bad=1; fi; \
	if grep -rln 'immintrin.h' engine | grep -vE 'engine/kernels/kern_[a-z0-9]+\.c$$' | grep -v kern_generic; then bad=1; fi; \
	if [ $$bad = 0 ]; then echo "check-deps: module boundaries respected"; else echo "check-deps: violations above"; exit 1; fi

# install = programs + client library (install-ipc) + unit, config, man
# pages (install-packaging); debian/rules takes the first two and lets
# debhelper place the packaging files.
install: install-programs install-ipc install-packaging

install-programs: all
	install -d $(DESTDIR)$(BINDIR)
	for b in $(INSTALL_BINS); do install -m 0755 $(BUILD)/bin/$$b $(DESTDIR)$(BINDIR)/$$b; done
	install -d $(DESTDIR)$(SBINDIR)
	for b in $(INSTALL_SBINS); do install -m 0755 $(BUILD)/bin/$$b $(DESTDIR)$(SBINDIR)/$$b; done

uninstall: uninstall-ipc uninstall-packaging
	for b in $(INSTALL_BINS); do rm -f $(DESTDIR)$(BINDIR)/$$b; done
	for b in $(INSTALL_SBINS); do rm -f $(DESTDIR)$(SBINDIR)/$$b; done
