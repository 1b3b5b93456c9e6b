#!/bin/sh
# tests/integration/quantize.sh: edgelm-quantize on stories260K (F32).
#
# Run from the top of the tree: sh tests/integration/quantize.sh
#   BUILD               build directory (default build)
#   EDGELM_TESTDATA     test data root (default ../shared)
#   TEST_TMPDIR         scratch space (default: a fresh mktemp -d)
#   EDGELM_REQUIRE_DATA when set (and not 0), missing data is a failure
# Checks exit codes, the F16 fallback lines (stories260K's FFN width 172 is
# not a multiple of 32, so every ffn_down stays F16), the tensor types in the
# output as edgelm-gguf lists them (skipped when edgelm-gguf is not built),
# and that the thread count does not change a single byte.
# Ends with "N passed, N failed[, N skipped]"; exits non-zero on failure.
set -u

BUILD=${BUILD:-build}
: "${EDGELM_TESTDATA:=../shared}"
Q="$BUILD/bin/edgelm-quantize"
G="$BUILD/bin/edgelm-gguf"
MODEL="$EDGELM_TESTDATA/models/stories260K-f32.gguf"
N_LAYER=5

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); [ -n "${TEST_VERBOSE:-}" ] && echo "ok   $1" >&2; return 0; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; }
skipped() {
	case "${EDGELM_REQUIRE_DATA:-}" in
	"" | 0) skip=$((skip + 1)); echo "SKIP $1" >&2 ;;
	*) fail=$((fail + 1)); echo "FAIL $1 (skipped, but EDGELM_REQUIRE_DATA is set)" >&2 ;;
	esac
}
check() { # check NAME COMMAND...: passes when COMMAND succeeds
	name=$1
	shift
	if "$@"; then ok "$name"; else bad "$name"; fi
}
finish() {
	if [ "$skip" -gt 0 ]; then
		echo "$pass passed, $fail failed, $skip skipped"
	else
		echo "$pass passed, $fail failed"
	fi
	[ "$fail" -eq 0 ]
	exit $?
}

base=${TEST_TMPDIR:-${TMPDIR:-/tmp}}
mkdir -p "$base" || { bad "scratch directory $base"; finish; }
TMP=$(mktemp -d "$base/quantize.XXXXXX") || { bad "mktemp in $base"; finish; }
trap 'rm -rf "$TMP"' EXIT

# run NAME ARGS...: run the tool, keep stdout+stderr in $TMP/NAME.log, set rc.
run() {
	log="$TMP/$1.log"
	shift
	"$Q" "$@" >"$log" 2>&1
	rc=$?
}

# Type of tensor $2 in file $1, from edgelm-gguf's tensor table.
tensor_type() {
	"$G" "$1" 2>/dev/null | awk -v n="$2" '$2 == n { print $3; exit }'
}

# The tensor-table rows of file $1: "name type".
tensor_list() {
	"$G" "$1" 2>/dev/null |
		awk '/^tensors:/ { t = 1; next } t && $1 ~ /^[0-9]+$/ { print $2, $3 }'
}

# expect_types FILE LABEL MATRIX_TYPE OUTPUT_TYPE FILE_TYPE
expect_types() {
	f=$1 label=$2 mt=$3 ot=$4
	list="$TMP/$label.types"
	tensor_list "$f" >"$list"
	if [ ! -s "$list" ]; then
		bad "$label: edgelm-gguf lists no tensors"
		return
	fi
	wrong=$(awk -v mt="$mt" -v ot="$ot" '
		{ want = "" }
		$1 ~ /_norm\.weight$/            { want = "F32" }
		$1 ~ /ffn_down\.weight$/         { want = "F16" }
		$1 == "output.weight"            { want = ot }
		want == "" && $1 ~ /weight$/     { want = mt }
		want == ""                       { want = "F32" }
		$2 != want { printf "%s is %s, expected %s; ", $1, $2, want }
	' "$list")
	if [ -z "$wrong" ]; then ok "$label: tensor types"; else bad "$label: $wrong"; fi
	n=$(wc -l <"$list")
	check "$label: 48 tensors (got $n)" [ "$n" -eq 48 ]
	ft=$("$G" "$f" 2>/dev/null | awk '$1 == "general.file_type" { print $3 }')
	check "$label: general.file_type" [ "$ft" = "$5" ]
}

if [ ! -x "$Q" ]; then
	bad "$Q not built"
	finish
fi

# ---- usage and errors (no data needed) ---------------------------------------
run help --help
check "--help exits 0" [ "$rc" -eq 0 ]
check "--help prints usage" grep -q "usage: edgelm-quantize" "$TMP/help.log"
run noargs
check "no arguments: exit 1 (got $rc)" [ "$rc" -eq 1 ]
run badtype "$TMP/none.gguf" "$TMP/out.gguf" Q6_K
check "unsupported type: exit 1 (got $rc)" [ "$rc" -eq 1 ]
run missing "$TMP/none.gguf" "$TMP/out.gguf" Q8_0
check "missing input: exit 2 (got $rc)" [ "$rc" -eq 2 ]
printf 'GGUF\003\000\000\000garbage' >"$TMP/bad.gguf"
run badfile "$TMP/bad.gguf" "$TMP/out.gguf" Q8_0
check "damaged input: exit 2 (got $rc)" [ "$rc" -eq 2 ]
check "no output after a failure" [ ! -e "$TMP/out.gguf" ]

if [ ! -f "$MODEL" ]; then
	skipped "quantize: $MODEL not found (set EDGELM_TESTDATA)"
	finish
fi

# ---- Q8_0 ------------------------------------------------------------------
run q8 "$MODEL" "$TMP/q8.gguf" Q8_0
check "Q8_0: exit 0 (got $rc)" [ "$rc" -eq 0 ]
check "Q8_0: output written" [ -s "$TMP/q8.gguf" ]
n=$(grep -c 'ffn_down\.weight: row 172 not a multiple of 32, kept as F16$' "$TMP/q8.log")
check "Q8_0: one fallback line per ffn_down ($n)" [ "$n" -eq "$N_LAYER" ]
check "Q8_0: no other fallback lines" [ "$(grep -c 'kept as F16' "$TMP/q8.log")" -eq "$N_LAYER" ]
check "Q8_0: summary line" grep -q 'tensors:.*Q8_0' "$TMP/q8.log"
smaller=$(($(wc -c <"$TMP/q8.gguf") * 3 < $(wc -c <"$MODEL")))
check "Q8_0: output under a third of the input" [ "$smaller" -eq 1 ]

# ---- Q4_0 --------------------------------------------------------------------
run q4 "$MODEL" "$TMP/q4.gguf" q4_0
check "Q4_0: exit 0 (got $rc)" [ "$rc" -eq 0 ]
n=$(grep -c 'ffn_down\.weight: row 172 not a multiple of 32, kept as F16$' "$TMP/q4.log")
check "Q4_0: one fallback line per ffn_down ($n)" [ "$n" -eq "$N_LAYER" ]
check "Q4_0: output.weight note" grep -q '^edgelm-quantize: output.weight: .*Q8_0' "$TMP/q4.log"

# ---- threads do not change the result -----------------------------------------
run q4t1 -t 1 "$MODEL" "$TMP/q4-t1.gguf" Q4_0
run q4t3 --threads 3 "$MODEL" "$TMP/q4-t3.gguf" Q4_0
check "Q4_0: -t 1 and -t 3 byte-identical" cmp -s "$TMP/q4-t1.gguf" "$TMP/q4-t3.gguf"
check "Q4_0: -t 1 and default byte-identical" cmp -s "$TMP/q4-t1.gguf" "$TMP/q4.gguf"
run badthreads -t 0 "$MODEL" "$TMP/x.gguf" Q4_0
check "-t 0: exit 1 (got $rc)" [ "$rc" -eq 1 ]

# ---- float targets, and quantized input ---------------------------------------
run f16 "$MODEL" "$TMP/f16.gguf" F16
check "F16: exit 0 (got $rc)" [ "$rc" -eq 0 ]
check "F16: no fallback lines" [ "$(grep -c 'kept as' "$TMP/f16.log")" -eq 0 ]
run bf16 "$MODEL" "$TMP/bf16.gguf" BF16
check "BF16: exit 0 (got $rc)" [ "$rc" -eq 0 ]
run back "$TMP/q8.gguf" "$TMP/back.gguf" F32
check "Q8_0 -> F32: exit 0 (got $rc)" [ "$rc" -eq 0 ]

# ---- an unwritable output -------------------------------------------------------
run nodir "$MODEL" "$TMP/no/such/dir/out.gguf" Q8_0
check "unwritable output: exit 3 (got $rc)" [ "$rc" -eq 3 ]

# ---- types as edgelm-gguf sees them ------------------------------------------------
if [ -x "$G" ]; then
	expect_types "$TMP/q8.gguf" q8 Q8_0 Q8_0 7
	expect_types "$TMP/q4.gguf" q4 Q4_0 Q8_0 2
	# F16 target: ffn_down is F16 like everything else; norms stay F32.
	t=$(tensor_type "$TMP/f16.gguf" blk.0.attn_q.weight)
	check "F16: attn_q is F16 (got $t)" [ "$t" = F16 ]
	t=$(tensor_type "$TMP/bf16.gguf" blk.4.ffn_down.weight)
	check "BF16: ffn_down is BF16 (got $t)" [ "$t" = BF16 ]
	t=$(tensor_type "$TMP/bf16.gguf" blk.0.attn_norm.weight)
	check "BF16: attn_norm stays F32 (got $t)" [ "$t" = F32 ]
	# Back to F32: matrices F32, ffn_down (F16 in q8.gguf) F32 too.
	t=$(tensor_type "$TMP/back.gguf" blk.2.ffn_down.weight)
	check "Q8_0 -> F32: ffn_down is F32 (got $t)" [ "$t" = F32 ]
	t=$(tensor_type "$TMP/back.gguf" output.weight)
	check "Q8_0 -> F32: output is F32 (got $t)" [ "$t" = F32 ]
else
	skip=$((skip + 1))
	echo "SKIP tensor-type checks: $G not built" >&2
fi

finish
