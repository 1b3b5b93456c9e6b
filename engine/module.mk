# The engine: libc, libm and pthreads only. Kernel variants get their ISA
# flags per file (never globally) and no LTO, so that vector code cannot leak
# into the baseline path.
ENGINE_SRCS := $(wildcard engine/*.c) $(wildcard engine/kernels/*.c)
ENGINE_LIB  := $(BUILD)/engine/libengine.a
$(ENGINE_LIB): $(ENGINE_SRCS:%.c=$(BUILD)/%.o)
ENGINE_LDLIBS := -lm -pthread
