# ipc/: plain C module; includes only common/ of ours.
IPC_SRCS := $(wildcard ipc/*.c)
IPC_LIB  := $(BUILD)/ipc/libipc.a
$(IPC_LIB): $(IPC_SRCS:%.c=$(BUILD)/%.o)
