# monitor/: plain C module; includes only common/ of ours.
MONITOR_SRCS := $(wildcard monitor/*.c)
MONITOR_LIB  := $(BUILD)/monitor/libmonitor.a
$(MONITOR_LIB): $(MONITOR_SRCS:%.c=$(BUILD)/%.o)
