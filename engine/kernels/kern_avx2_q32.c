/* engine/kernels/kern_avx2_q32.c: filled by the next commit. */
#include "engine/kernels/kern.h"

const struct kern_ops kern_avx2_q32_ops = {
	.name = "avx2",
};
