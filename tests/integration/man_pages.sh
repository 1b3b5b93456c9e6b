#!/bin/sh
# tests/integration/man_pages.sh: every program in $BUILD/bin has a man page
# in packaging/man/, installed by `make install` (PACKAGING_MAN) and by its
# Debian package (debian/*.manpages); each page renders without warnings
# (where man is installed) and names every long option the program's
# --help lists (edgelmctl: each command's --help; edgelm-gguf: mkmodel's).
#
# Run from the top of the tree: sh tests/integration/man_pages.sh
#   BUILD   build directory (default build)
# Ends with "N passed, N failed"; exits non-zero on failure.
set -u
BUILD=${BUILD:-build}
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

progs=$(cd "$BUILD/bin" 2>/dev/null && ls)
[ -n "$progs" ] || { ko "no programs in $BUILD/bin (make all)"; echo "$pass passed, $fail failed"; exit 1; }

# The --help texts of program $1, commands included.
helps() {
	"$BUILD/bin/$1" --help 2>&1
	case $1 in
	edgelmctl)
		for c in generate chat info health tokenize detokenize metrics cancel top; do
			"$BUILD/bin/$1" "$c" --help 2>&1
		done
		;;
	edgelm-gguf) "$BUILD/bin/$1" mkmodel --help 2>&1 ;;
	edgelm-bench) "$BUILD/bin/$1" --help --daemon 2>&1 ;;
	esac
}

for p in $progs; do
	page=
	for s in 1 8; do [ -f "packaging/man/$p.$s" ] && page="packaging/man/$p.$s"; done
	if [ -z "$page" ]; then
		ko "$p: no packaging/man/$p.1 or .8"
		continue
	fi
	ok
	if grep -qx "$page" debian/*.manpages; then ok; else ko "$page: not in debian/*.manpages"; fi
	if grep -q "$page" packaging/module.mk; then ok; else ko "$page: not in PACKAGING_MAN"; fi
	if command -v man >/dev/null 2>&1; then
		w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$page" 2>&1 >/dev/null)
		if [ -z "$w" ]; then ok; else ko "$page: man --warnings: $w"; fi
	fi
	# the page's text with roff's escapes for - and fonts undone
	text=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$page")
	missing=
	for o in $(helps "$p" | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u); do
		printf '%s\n' "$text" | grep -q -- "$o" || missing="$missing $o"
	done
	if [ -z "$missing" ]; then ok; else ko "$page lacks options of $p --help:$missing"; fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
