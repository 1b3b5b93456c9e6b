# daemon/: edgelmd, the only module that includes all the others.
DAEMON_SRCS := $(wildcard daemon/*.c)
ifneq ($(DAEMON_SRCS),)
BINS += $(BUILD)/bin/edgelmd
INSTALL_SBINS += edgelmd
$(BUILD)/bin/edgelmd: $(DAEMON_SRCS:%.c=$(BUILD)/%.o) $(MODULE_LIBS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(EXT_LIBS)
endif
