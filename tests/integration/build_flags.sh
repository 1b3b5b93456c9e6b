#!/bin/sh
# tests/integration/build_flags.sh: the flags that belong to the user or the
# distribution reach every compile and link (issue 23: the Makefile dropped
# CPPFLAGS, where dpkg-buildflags puts -D_FORTIFY_SOURCE=2, so the packages
# were not fortified). A dry run (make -n -B) of a library object, an ISA
# kernel, a test object and a program link must show each flag. Run from
# the top of the tree.
set -u
MAKE=${MAKE:-make}
BUILD=${BUILD:-build}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

out=$($MAKE -n -B BUILD="$BUILD" CPPFLAGS=-DEDGELM_T_CPP CFLAGS="-O2 -DEDGELM_T_C" \
	LDFLAGS=-Wl,--as-needed,-zEDGELM_T_LD \
	"$BUILD/common/common.o" "$BUILD/engine/kernels/kern_avx2.o" \
	"$BUILD/tests/unit/test_daemon_config.o" "$BUILD/bin/edgelm-gguf" 2>&1)
for o in common/common.o engine/kernels/kern_avx2.o tests/unit/test_daemon_config.o; do
	line=$(printf '%s\n' "$out" | grep -- "-c -o $BUILD/$o " | head -n 1)
	case $line in
	*EDGELM_T_CPP*EDGELM_T_C*) ok ;;
	*) ko "$o: CPPFLAGS or CFLAGS missing: ${line:-no compile line}" ;;
	esac
done
line=$(printf '%s\n' "$out" | grep -- "-o $BUILD/bin/edgelm-gguf " | head -n 1)
case $line in
*EDGELM_T_LD*) ok ;;
*) ko "edgelm-gguf: LDFLAGS missing: ${line:-no link line}" ;;
esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
