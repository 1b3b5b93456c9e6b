/* engine/kernels/kern_avx2_kq.c: filled by the next commit. */
#include "engine/kernels/kern.h"

const struct kern_ops kern_avx2_kq_ops = {
	.name = "avx2",
};
