COMMON_SRCS := $(wildcard common/*.c)
COMMON_LIB  := $(BUILD)/common/libcommon.a
$(COMMON_LIB): $(COMMON_SRCS:%.c=$(BUILD)/%.o)
