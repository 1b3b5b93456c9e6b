#!/bin/sh
# tools/dev/kernel-ab.sh: time two builds of a kernel file in one process.
#
#   tools/dev/kernel-ab.sh [-f FILE] [-s SOURCE] [-v VARIANT] [-D FLAG]... -- MODEL [options]
#
# Build A is the tree as it is (`make` first); build B is FILE (default
# engine/kernels/kern_avx512.c) compiled with the extra -D flags, its table
# kern_VARIANT_ops (default avx512vnni) renamed and handed to
# tools/dev/kernel-ab.c. Example, the Q4_0 prefetch distance:
#   tools/dev/kernel-ab.sh -D X16_PREFETCH=8192 -- /tmp/tl-q4_0.gguf -r 12
# prints per-rep tok/s of A and B and the median of B/A. A setting must be
# reachable by a -D (an #ifndef default in the file) to be compared. Another
# variant: -f engine/kernels/kern_avx2.c -v avx2 -- MODEL -i avx2. An older
# version of the file as B: -s /tmp/old.c (compiled with FILE's flags), e.g.
#   git show HEAD~1:engine/kernels/kern_avx512.c >/tmp/old.c
set -eu
file=engine/kernels/kern_avx512.c
src=""
variant=avx512vnni
defs=""
while [ $# -gt 0 ]; do
	case "$1" in
	-f) file=$2; shift 2 ;;
	-s) src=$2; shift 2 ;;
	-v) variant=$2; shift 2 ;;
	-D) defs="$defs -D$2"; shift 2 ;;
	--) shift; break ;;
	*) echo "usage: $0 [-f FILE] [-s SOURCE] [-v VARIANT] [-D FLAG]... -- MODEL [options]" >&2
	   exit 1 ;;
	esac
done
[ $# -ge 1 ] || { echo "$0: no model" >&2; exit 1; }
[ -n "$src" ] && src=$(realpath "$src")
cd "$(dirname "$0")/../.."
[ -n "$src" ] || src=$file
make -s -j2 >/dev/null
out=build/dev/kernel-ab
mkdir -p "$out"
# the ISA flags the Makefile gives this file
flags=$(make -s -n -B "build/${file%.c}.o" | grep -- " -c -o build/${file%.c}.o" | head -1 |
	sed -e 's/ -c -o .*//' -e 's/^[^ ]* //')
eval "${CC:-cc} $flags $defs -c -o $out/b.o $src"
objcopy --redefine-sym "kern_${variant}_ops=ab_b_${variant}_ops" $out/b.o
# the other tables of the file stay, renamed out of the way
for s in $(nm -g --defined-only $out/b.o | awk '$3 ~ /^kern_.*_ops$/ {print $3}'); do
	objcopy --redefine-sym "$s=ab_unused_$s" $out/b.o
done
{
	echo '#include "engine/kernels/kern.h"'
	echo "extern const struct kern_ops ab_b_${variant}_ops;"
	echo "const struct kern_ops *const ab_b_ops = &ab_b_${variant}_ops;"
} >$out/stub.c
${CC:-cc} -O2 -std=c11 -D_GNU_SOURCE -I. -pthread -o $out/kernel-ab tools/dev/kernel-ab.c \
	$out/stub.c $out/b.o build/engine/libengine.a build/tuning/libtuning.a \
	build/common/libcommon.a -lpcre2-8 -lcpuid -lnuma -lm
exec $out/kernel-ab "$@"
