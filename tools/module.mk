# Command-line tools: each tools/<name>.c is one program.
TOOL_NAMES := $(patsubst tools/%.c,%,$(wildcard tools/edgelm-*.c))
TOOL_BINS  := $(TOOL_NAMES:%=$(BUILD)/bin/%)
BINS += $(TOOL_BINS)
INSTALL_BINS += $(TOOL_NAMES)

$(BUILD)/bin/%: $(BUILD)/tools/%.o $(ENGINE_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(JANSSON_LIBS) $(ENGINE_LDLIBS)
