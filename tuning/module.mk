# tuning/: plain C module; includes only common/ of ours.
TUNING_SRCS := $(wildcard tuning/*.c)
TUNING_LIB  := $(BUILD)/tuning/libtuning.a
$(TUNING_LIB): $(TUNING_SRCS:%.c=$(BUILD)/%.o)
