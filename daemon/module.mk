# daemon/: edgelmd, the only module that includes all the others.
# Everything but main.c goes into libdaemon.a, so unit tests
# (tests/unit/test_daemon_*.c) link the daemon's code without its main().
DAEMON_SRCS := $(filter-out daemon/main.c,$(wildcard daemon/*.c))
DAEMON_LIB  := $(BUILD)/daemon/libdaemon.a
$(DAEMON_LIB): $(DAEMON_SRCS:%.c=$(BUILD)/%.o)

ifneq ($(wildcard daemon/main.c),)
BINS += $(BUILD)/bin/edgelmd
INSTALL_SBINS += edgelmd
$(BUILD)/bin/edgelmd: $(BUILD)/daemon/main.o $(DAEMON_LIB) $(MODULE_LIBS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(EDGELM_CFLAGS) $(CFLAGS) $(LDFLAGS) -o $@ $^ $(EXT_LIBS)
endif
