#!/bin/sh
# tests/integration/damaged_gguf.sh: edgelm-gguf on damaged GGUF files.
#
# test_engine_gguf_damaged --write-dir writes every damaged variant of its table as
# DIR/<name>.gguf with the words its message must contain in DIR/<name>.expect,
# plus the intact file DIR/valid.gguf. For each damaged file, edgelm-gguf must
# exit 2, print nothing on stdout and exactly one line on stderr, starting
# with "edgelm-gguf: " and containing the expected words; the intact file
# must print its info and exit 0. Run from the top of the tree.
set -u
BUILD=${BUILD:-build}
TOOL=$BUILD/bin/edgelm-gguf
GEN=$BUILD/tests/unit/test_engine_gguf_damaged

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*" >&2; }

if [ ! -x "$TOOL" ] || [ ! -x "$GEN" ]; then
	echo "damaged_gguf: missing $TOOL or $GEN (run make first)" >&2
	echo "0 passed, 1 failed"
	exit 1
fi

tmp=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/damaged_gguf.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
dir=$tmp/files
mkdir "$dir"

if ! "$GEN" --write-dir "$dir"; then
	echo "0 passed, 1 failed"
	exit 1
fi

# The intact file.
"$TOOL" "$dir/valid.gguf" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && [ ! -s "$tmp/err" ] && grep -q 'tensor count: 5' "$tmp/out" &&
	grep -q 'blk.0.attn_q.weight' "$tmp/out"; then
	ok
else
	bad "valid.gguf: exit $rc: $(cat "$tmp/err")"
fi
"$TOOL" info --json "$dir/valid.gguf" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && grep -q '"name": "output.weight"' "$tmp/out"; then
	ok
else
	bad "valid.gguf --json: exit $rc"
fi

n=0
for f in "$dir"/*.gguf; do
	name=$(basename "$f" .gguf)
	[ "$name" = valid ] && continue
	n=$((n + 1))
	if [ ! -f "$dir/$name.expect" ]; then
		bad "$name: no .expect file"
		continue
	fi
	expect=$(cat "$dir/$name.expect")
	"$TOOL" "$f" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	lines=$(wc -l <"$tmp/err" | tr -d ' ')
	msg=$(cat "$tmp/err")
	if [ $rc -ne 2 ]; then
		bad "$name: exit $rc, expected 2 ($msg)"
	elif [ -s "$tmp/out" ]; then
		bad "$name: output on stdout"
	elif [ "$lines" != 1 ]; then
		bad "$name: $lines lines on stderr"
	else
		case $msg in
		"edgelm-gguf: "*) ;;
		*) bad "$name: message lacks the prefix: $msg"; continue ;;
		esac
		case $msg in
		*"$expect"*) ok ;;
		*) bad "$name: message '$msg' lacks '$expect'" ;;
		esac
	fi
done
if [ $n -lt 50 ]; then
	bad "only $n damaged files were written"
fi

# Usage errors exit 1; a missing file is a bad input file (2).
"$TOOL" >/dev/null 2>&1
[ $? -eq 1 ] && ok || bad "no arguments: expected exit 1"
"$TOOL" info --bogus "$dir/valid.gguf" >/dev/null 2>&1
[ $? -eq 1 ] && ok || bad "unknown option: expected exit 1"
"$TOOL" "$dir/no-such-file.gguf" >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && grep -q '^edgelm-gguf: .*no-such-file.gguf: No such file' "$tmp/err"; then
	ok
else
	bad "missing file: exit $rc: $(cat "$tmp/err")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
