# Command-line tools: each tools/edgelm-*.c and tools/edgelmctl.c is one
# program; code shared by several tools lives in tools/lib/ (libtools.a).
# edgelmctl's commands live in tools/ctl/, linked into edgelmctl alone.
TOOL_NAMES := $(patsubst tools/%.c,%,$(wildcard tools/edgelm-*.c tools/edgelmctl.c))
TOOL_BINS  := $(TOOL_NAMES:%=$(BUILD)/bin/%)
TOOLS_LIB  := $(BUILD)/tools/libtools.a
$(TOOLS_LIB): $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/lib/*.c))
CTL_OBJS   := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tools/ctl/*.c))
BINS += $(TOOL_BINS)
INSTALL_BINS += $(TOOL_NAMES)

define tool_link
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(EXT_LIBS)
endef

$(BUILD)/bin/%: $(BUILD)/tools/%.o $(TOOLS_LIB) $(MODULE_LIBS)
	$(tool_link)

# Its own rule: extra prerequisites of a pattern rule would follow the
# libraries on the link line.
$(BUILD)/bin/edgelmctl: $(BUILD)/tools/edgelmctl.o $(CTL_OBJS) $(TOOLS_LIB) $(MODULE_LIBS)
	$(tool_link)

# tools/dev/kernel-ab.c is linked only by tools/dev/kernel-ab.sh (against a
# second build of a kernel file); compiling it with the tests keeps it in
# step with the engine's headers.
tests: $(BUILD)/tools/dev/kernel-ab.o
