#!/bin/sh
# tests/integration/lib_symbols.sh: libedgelm.so exports exactly the
# EDGELM_API functions of ipc/edgelm.h, and debian/libedgelm0.symbols lists
# exactly those (a function added to the header without its symbols line
# would only be a warning in the package build; one removed, a failure).
#
# Run from the top of the tree: sh tests/integration/lib_symbols.sh
#   BUILD   build directory (default build)
# Ends with "N passed, N failed"; exits non-zero on failure.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/lib_symbols
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

SO="$BUILD/ipc/libedgelm.so.0"
if [ ! -f "$SO" ]; then
	ko "$SO not built (make all)"
	echo "$pass passed, $fail failed"
	exit 1
fi

# every defined dynamic symbol, functions or not
LC_ALL=C nm -D --defined-only "$SO" | awk '{ print $3 }' | LC_ALL=C sort >"$T/exported"
grep -oE 'EDGELM_API[^(]*\(' ipc/edgelm.h | sed -E 's/.*[ *]([a-z_0-9]+)\($/\1/' |
	grep -v '^__attribute__$' | LC_ALL=C sort >"$T/api"
sed -n 's/^ \([A-Za-z_0-9]*\)@Base .*/\1/p' debian/libedgelm0.symbols | LC_ALL=C sort >"$T/listed"

if [ -s "$T/api" ]; then ok; else ko "no EDGELM_API functions found in ipc/edgelm.h"; fi
if cmp -s "$T/exported" "$T/api"; then
	ok
else
	ko "libedgelm.so exports (>) other than edgelm.h's EDGELM_API functions (<): $(diff "$T/api" "$T/exported" | grep '^[<>]' | tr '\n' ' ')"
fi
if cmp -s "$T/listed" "$T/api"; then
	ok
else
	ko "debian/libedgelm0.symbols (>) differs from edgelm.h's EDGELM_API functions (<): $(diff "$T/api" "$T/listed" | grep '^[<>]' | tr '\n' ' ')"
fi
if head -n 1 debian/libedgelm0.symbols | grep -qx "libedgelm.so.0 libedgelm0 #MINVER#"; then
	ok
else
	ko "debian/libedgelm0.symbols: first line is not 'libedgelm.so.0 libedgelm0 #MINVER#'"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
