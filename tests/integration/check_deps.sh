#!/bin/sh
# tests/integration/check_deps.sh: `make check-deps` enforces the module
# rules of docs/design.md. It passes on this tree and on a copy of its
# sources; then, in that copy (DEPS_ROOT), each seeded violation in turn
# must make it fail and name the file and line. Run from the top of the
# tree.
set -u
MAKE=${MAKE:-make}

pass=0
fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

if [ ! -f Makefile ] || [ ! -d engine/kernels ]; then
	echo "check_deps: run from the top of the tree" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/check_deps.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
tree=$tmp/tree
mkdir "$tree"
for m in common engine tuning monitor ipc http daemon tools; do
	[ -d "$m" ] && cp -R "$m" "$tree/"
done

# check-deps on DIR; its output goes to $tmp/out.
run() {
	# a make from `make check` must not hand this one its jobserver or goals
	MAKEFLAGS= MFLAGS= $MAKE -s --no-print-directory check-deps DEPS_ROOT="$1" \
		>"$tmp/out" 2>&1
}

if run . && grep -q 'module boundaries respected' "$tmp/out"; then
	ok
else
	ko "check-deps fails on the tree itself:"
	cat "$tmp/out" >&2
fi
if run "$tree"; then
	ok
else
	ko "check-deps fails on the copy of the tree:"
	cat "$tmp/out" >&2
fi

# expect fail|pass FILE LINE: put LINE first in the copy's FILE, run
# check-deps, restore FILE. "fail" wants a failure whose message names
# FILE:1; "pass" wants success (what the rules allow).
expect() {
	want=$1 file=$2 line=$3
	if [ ! -f "$tree/$file" ]; then
		ko "$file: not in the tree"
		return
	fi
	cp "$tree/$file" "$tmp/saved"
	{ printf '%s\n' "$line"; cat "$tmp/saved"; } >"$tree/$file"
	if run "$tree"; then rc=0; else rc=1; fi
	cp "$tmp/saved" "$tree/$file"
	case $want in
	fail)
		if [ $rc -eq 0 ]; then
			ko "$file: '$line' passed check-deps"
		elif grep -q "^check-deps: $file:1: " "$tmp/out"; then
			ok
		else
			ko "$file: '$line' failed without naming $file:1:"
			cat "$tmp/out" >&2
		fi
		;;
	pass)
		if [ $rc -eq 0 ]; then
			ok
		else
			ko "$file: '$line' is allowed but check-deps failed:"
			cat "$tmp/out" >&2
		fi
		;;
	esac
}

first() { (cd "$tree" && ls $1 2>/dev/null | head -n 1); }

# kernels stand on their own layer (formats + kernels) and common/ only
expect fail engine/kernels/kern_generic.c '#include "engine/quant.h"'
expect fail engine/kernels/kern_avx2.c '#include "engine/engine_impl.h"'
expect fail engine/kernels/kern.h '#include "engine/quant.h"'
expect fail engine/kernels/kern_x16.c '#  include <engine/gguf.h>'
expect fail engine/kernels/kern_generic.c '#include "../quant.h"'
expect fail engine/kernels/kern_generic.c '#include "kern_tiles.h"'
expect pass engine/kernels/kern_generic.c '#include "engine/kernels/kern_tiles.h"'
expect pass engine/kernels/kern_select.c '#include "common/common.h"'
# the formats layer is the bottom: no kernels
expect fail engine/kernels/formats.h '#include "engine/kernels/kern.h"'
expect fail engine/kernels/formats.c '#include "engine/kernels/kern.h"'
expect pass engine/model.c '#include "engine/kernels/formats.h"'
# intrinsics only in the per-ISA kernel files
expect fail engine/kernels/kern_generic.c '#include <immintrin.h>'
expect fail engine/kernels/kern_select.c '#include <immintrin.h>'
expect fail engine/kernels/kern_x16.c '#include <arm_neon.h>'
expect fail engine/kernels/formats.c '#include <x86intrin.h>'
expect fail engine/model.c '#include <immintrin.h>'
expect fail "$(first 'tools/*.c')" '#include <immintrin.h>'
expect pass engine/kernels/kern_avx2.c '#include <immintrin.h>'
# no module includes one above it or a sibling
expect fail "$(first 'tuning/*.c')" '#include "daemon/daemon.h"'
expect fail "$(first 'tuning/*.c')" '#include "engine/engine.h"'
expect fail "$(first 'monitor/*.c')" '#include "tuning/tuning.h"'
expect fail "$(first 'ipc/*.c')" '#include "engine/engine.h"'
expect fail engine/gguf.c '#include "ipc/ipc.h"'
expect fail common/common.c '#include "engine/engine.h"'
expect fail "$(first 'daemon/*.c')" '#include "tools/lib/tools.h"'
expect pass "$(first 'daemon/*.c')" '#include "engine/engine.h"'
expect fail "$(first 'daemon/*.c')" '#include "engine/quant.h"'
# the engine uses no nng, JSON or systemd
expect fail engine/model.c '#include <nng/nng.h>'
expect fail engine/tokenizer.c '#include <jansson.h>'

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
