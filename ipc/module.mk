# ipc/: plain C module; includes only common/ of ours.
IPC_SRCS := $(wildcard ipc/*.c)
IPC_LIB  := $(BUILD)/ipc/libipc.a
$(IPC_LIB): $(IPC_SRCS:%.c=$(BUILD)/%.o)

# libedgelm: the public client library (ipc/edgelm.h installs as edgelm.h).
# It is built from its own position-independent objects with hidden
# visibility, so only the EDGELM_API (edgelm_*) symbols leave the .so; the
# codec it shares with the server (protocol*.c, common.c) stays internal.
# protocol_doc.c (the Markdown of docs/protocol.md) is for `make docs` only.
EDGELM_VERSION    ?= 0.1.0
EDGELM_SOVERSION  := 0
LIBEDGELM_SRCS    := ipc/client.c ipc/protocol.c ipc/protocol_fields.c ipc/protocol_request.c \
                     ipc/protocol_reply.c common/common.c
LIBEDGELM_OBJS    := $(LIBEDGELM_SRCS:%.c=$(BUILD)/ipc/pic/%.o)
LIBEDGELM_A       := $(BUILD)/ipc/libedgelm.a
LIBEDGELM_SO      := $(BUILD)/ipc/libedgelm.so.$(EDGELM_SOVERSION)
EDGELM_PC         := $(BUILD)/ipc/edgelm.pc
PKGCONFIGDIR      ?= $(LIBDIR)/pkgconfig

$(BUILD)/ipc/client.o: EXTRA_CFLAGS += -DEDGELM_VERSION='"$(EDGELM_VERSION)"'

$(BUILD)/ipc/pic/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) -fPIC -fvisibility=hidden \
		-DEDGELM_VERSION='"$(EDGELM_VERSION)"' $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(LIBEDGELM_A): $(LIBEDGELM_OBJS)

$(LIBEDGELM_SO): $(LIBEDGELM_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -shared -Wl,-soname,libedgelm.so.$(EDGELM_SOVERSION) $(CFLAGS) $(LDFLAGS) \
		-o $@ $^ $(NNG_LIBS) $(JANSSON_LIBS) -lm -pthread

# A static link (pkg-config --static) needs all of libnng.a's own libraries:
# an nng.pc names them, but nng installs none (Debian's 1.5.2 neither), and
# Debian's libnng.a is built with TLS over mbedtls (libnng-dev depends on
# libmbedtls-dev, which has no .pc either). Set NNG_STATIC_LIBS for an nng
# built without TLS. tests/integration/static_link.sh checks the result.
NNG_HAS_PC       := $(shell $(PKG_CONFIG) --exists nng 2>/dev/null && echo yes)
NNG_STATIC_LIBS  ?= -lnng -lmbedtls -lmbedx509 -lmbedcrypto
EDGELM_PC_REQS   := jansson$(if $(NNG_HAS_PC), nng)
EDGELM_PC_PRIV   := $(if $(NNG_HAS_PC),,$(NNG_STATIC_LIBS) )-lm -pthread

# Regenerated whenever this file changes; `install-ipc` writes its own copy
# so that PREFIX/LIBDIR given at install time are the ones recorded.
edgelm_pc_text = prefix=$(PREFIX)\nlibdir=$(LIBDIR)\nincludedir=$(INCLUDEDIR)\n\nName: edgelm\nDescription: client library of the edgelm local LLM daemon\nVersion: $(EDGELM_VERSION)\nRequires.private: $(EDGELM_PC_REQS)\nCflags: -I$${includedir}\nLibs: -L$${libdir} -ledgelm\nLibs.private: $(EDGELM_PC_PRIV)\n

$(EDGELM_PC): ipc/module.mk
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q)printf '$(edgelm_pc_text)' > $@

all: $(LIBEDGELM_A) $(LIBEDGELM_SO) $(EDGELM_PC)
# tests/integration/static_link.sh and lib_symbols.sh read them: `make
# check` in a fresh clone builds the tests, not `all`.
tests: $(LIBEDGELM_A) $(LIBEDGELM_SO) $(EDGELM_PC)

.PHONY: install-ipc uninstall-ipc
install-ipc: $(LIBEDGELM_A) $(LIBEDGELM_SO)
	install -D -m 0644 ipc/edgelm.h $(DESTDIR)$(INCLUDEDIR)/edgelm.h
	install -D -m 0644 $(LIBEDGELM_A) $(DESTDIR)$(LIBDIR)/libedgelm.a
	install -D -m 0755 $(LIBEDGELM_SO) $(DESTDIR)$(LIBDIR)/libedgelm.so.$(EDGELM_SOVERSION)
	ln -sf libedgelm.so.$(EDGELM_SOVERSION) $(DESTDIR)$(LIBDIR)/libedgelm.so
	install -d $(DESTDIR)$(PKGCONFIGDIR)
	printf '$(edgelm_pc_text)' > $(DESTDIR)$(PKGCONFIGDIR)/edgelm.pc
	chmod 0644 $(DESTDIR)$(PKGCONFIGDIR)/edgelm.pc

uninstall-ipc:
	rm -f $(DESTDIR)$(INCLUDEDIR)/edgelm.h $(DESTDIR)$(LIBDIR)/libedgelm.a \
	      $(DESTDIR)$(LIBDIR)/libedgelm.so.$(EDGELM_SOVERSION) $(DESTDIR)$(LIBDIR)/libedgelm.so \
	      $(DESTDIR)$(PKGCONFIGDIR)/edgelm.pc
