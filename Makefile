# edgelm: one non-recursive Makefile. Each module lists its sources in
# <module>/module.mk; objects go out of tree into $(BUILD).
#
#   make                    build everything into build/
#   make check              all tests (normal build, then ASan+UBSan pass)
#   make SAN=address        sanitizer variant into build-address/ (also
#                           undefined, thread, or address,undefined)
#   make NATIVE=1           add -march=native (local experiments only)
#   make install DESTDIR=... PREFIX=...
#   make deb                the Debian packages into build-deb/
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

# CPPFLAGS/CFLAGS/LDFLAGS belong to the user or distro (dpkg-buildflags puts
# -D_FORTIFY_SOURCE=2 in CPPFLAGS, the hardening in the other two); ours live
# in EDGELM_CFLAGS.
CPPFLAGS ?=
CFLAGS   ?= -O2 -g
LDFLAGS  ?=
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
# mbedTLS has no .pc; ipc/tls_engine.c calls it (nng's TLS is built on it)
MBEDTLS_LIBS    ?= -lmbedtls -lmbedx509 -lmbedcrypto
# Programs link every module library they need; --as-needed keeps unused
# shared libraries out of each binary's NEEDED list.
EXT_LIBS = -Wl,--as-needed $(NNG_LIBS) $(MBEDTLS_LIBS) $(JANSSON_LIBS) $(SYSTEMD_LIBS) $(PROC2_LIBS) \
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
include http/module.mk
# Module libraries in link order (dependents first).
MODULE_LIBS = $(HTTP_LIB) $(IPC_LIB) $(MONITOR_LIB) $(TUNING_LIB) $(ENGINE_LIB) $(COMMON_LIB)
include daemon/module.mk
include tools/module.mk
include packaging/module.mk
include tests/module.mk

all: $(BINS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(ISA_FLAGS) $(EXTRA_CFLAGS) $(CPPFLAGS) $(CFLAGS) $(LATE_CFLAGS) -c -o $@ $<

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

# Module boundaries (docs/design.md), checked on the sources under DEPS_ROOT
# (default: this tree; tests/integration/check_deps.sh points it at a copy
# with violations seeded). Of our headers, a file may include only its own
# layer's and those below it:
#   common/                     common/
#   engine/kernels/formats*     engine/kernels/formats*, common/  (the formats layer)
#   engine/kernels/             engine/kernels/, common/          (formats + kernels)
#   engine/                     engine/, common/
#   tuning/ monitor/ ipc/ http/ its own folder, common/
#   daemon/                     all of the above, but of the engine only its
#                               public header engine/engine.h
#   tools/                      all of the above (the engine's own tools
#                               also use its internal headers)
# Our headers are named by their path from the top ("engine/quant.h", also
# in <>): a bare or relative name ("quant.h", "../quant.h") is refused, so no
# include escapes the check. Besides, vector intrinsics (<*intrin.h>,
# <arm_neon.h>, <arm_sve.h>, <arm_acle.h>) appear only in the per-ISA kernel
# files, the only ones built with -m flags (engine/module.mk), and the
# engine includes no nng, jansson, systemd, microhttpd or libproc2.
DEPS_ROOT ?= .
DEPS_MODULES := common engine tuning monitor ipc http daemon tools
DEPS_ISA_FILES := ^engine\/kernels\/kern_(avx2[a-z0-9_]*|avx512[a-z0-9_]*|avxvnni|amx|neon[a-z0-9_]*)\.c$$
DEPS_AWK := \
  function layer(f) { \
    if (f ~ /^common\//) return "common/"; \
    if (f ~ /^engine\/kernels\/formats/) return "engine/kernels/formats common/"; \
    if (f ~ /^engine\/kernels\//) return "engine/kernels/ common/"; \
    if (f ~ /^engine\//) return "engine/ common/"; \
    if (f ~ /^daemon\//) return "daemon/ common/ engine/engine.h tuning/ monitor/ ipc/ http/"; \
    if (f ~ /^tools\//) return "tools/ common/ engine/ tuning/ monitor/ ipc/ http/"; \
    split(f, d, "/"); return d[1] "/ common/"; \
  } \
  function allowed(p, n, a, i) { \
    n = split(allow, a, " "); \
    for (i = 1; i <= n; i++) if (index(p, a[i]) == 1) return 1; \
    return 0; \
  } \
  function bad(msg) { print "check-deps: " FILENAME ":" FNR ": " msg; nbad++; } \
  FNR == 1 { allow = layer(FILENAME); isa = FILENAME ~ /$(DEPS_ISA_FILES)/; } \
  /^[ \t]*\#[ \t]*include/ { \
    line = $$0; sub(/^[ \t]*\#[ \t]*include[ \t]*/, "", line); \
    q = substr(line, 1, 1); p = substr(line, 2); \
    if (q == "\"") { sub(/".*/, "", p); ours = 1; name = q p q; } \
    else if (q == "<") { sub(/>.*/, "", p); ours = p ~ /^(common|engine|tuning|monitor|ipc|http|daemon|tools)\//; name = "<" p ">"; } \
    else next; \
    if (ours && (p !~ /^[a-z0-9_]+\// || p ~ /\.\./)) \
      bad("includes " name ": name our headers by their path from the top"); \
    else if (ours && !allowed(p)) \
      bad("includes " name ": this layer may include only " allow); \
    if (!isa && (p ~ /intrin\.h$$/ || p ~ /^arm_(neon|sve|acle)\.h$$/)) \
      bad("includes <" p ">: intrinsics only in the per-ISA kernel files (kern_avx2*.c, kern_avx512*.c, kern_avxvnni.c, kern_amx.c, kern_neon*.c)"); \
    if (FILENAME ~ /^engine\// && p ~ /^(nng\/|jansson|systemd\/|microhttpd|proc\/|libproc2)/) \
      bad("includes <" p ">: the engine uses libc, libm, pthreads and PCRE2 only"); \
  } \
  END { exit nbad > 0; }

check-deps:
	@cd $(DEPS_ROOT) || exit 1; \
	dirs=; for d in $(DEPS_MODULES); do [ -d $$d ] && dirs="$$dirs $$d"; done; \
	if find $$dirs -name '*.[ch]' | LC_ALL=C sort | xargs awk '$(DEPS_AWK)'; then \
	  echo "check-deps: module boundaries respected"; \
	else \
	  echo "check-deps: violations above (docs/design.md, Modules)"; exit 1; \
	fi

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
