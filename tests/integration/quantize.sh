#!/bin/sh
# tests/integration/quantize.sh: edgelm-quantize on stories260K and stories3M (F32).
#
# Run from the top of the tree: sh tests/integration/quantize.sh
#   BUILD               build directory (default build)
#   EDGELM_TESTDATA     test data root (default ../shared)
#   TEST_TMPDIR         scratch space (default: a fresh mktemp -d)
#   EDGELM_REQUIRE_DATA when set (and not 0), missing data is a failure
# Checks exit codes, the fallback lines (stories260K's FFN width 172 is not a
# multiple of 32, so every ffn_down becomes F16; its rows of 64 take the
# K-quants' fallbacks), the tensor types in the output as edgelm-gguf lists
# them (skipped when edgelm-gguf is not built), that the thread count does
# not change a single byte, and every recipe on stories3M (rows of 256 and
# 768: no fallback), with llama.cpp's tensor counts for Q4_K_M and Q6_K.
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
run badtype "$TMP/none.gguf" "$TMP/out.gguf" IQ2_XXS
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
n=$(grep -c 'ffn_down\.weight: row 172 not a multiple of 32, Q8_0 -> F16$' "$TMP/q8.log")
check "Q8_0: one fallback line per ffn_down ($n)" [ "$n" -eq "$N_LAYER" ]
check "Q8_0: no other fallback lines" [ "$(grep -c 'not a multiple' "$TMP/q8.log")" -eq "$N_LAYER" ]
check "Q8_0: summary line" grep -q 'tensors:.*Q8_0' "$TMP/q8.log"
smaller=$(($(wc -c <"$TMP/q8.gguf") * 3 < $(wc -c <"$MODEL")))
check "Q8_0: output under a third of the input" [ "$smaller" -eq 1 ]

# ---- Q4_0 --------------------------------------------------------------------
run q4 "$MODEL" "$TMP/q4.gguf" q4_0
check "Q4_0: exit 0 (got $rc)" [ "$rc" -eq 0 ]
n=$(grep -c 'ffn_down\.weight: row 172 not a multiple of 32, Q4_0 -> F16$' "$TMP/q4.log")
check "Q4_0: one fallback line per ffn_down ($n)" [ "$n" -eq "$N_LAYER" ]
check "Q4_0: output.weight Q6_K -> Q8_0" \
	grep -q '^edgelm-quantize: output.weight: row 64 not a multiple of 256, Q6_K -> Q8_0$' \
	"$TMP/q4.log"

# ---- Q4_K_M on rows of 64 and 172: every matrix falls back ----------------------
run q4km "$MODEL" "$TMP/q4km.gguf" Q4_K_M
check "Q4_K_M: exit 0 (got $rc)" [ "$rc" -eq 0 ]
n=$(grep -c 'row 64 not a multiple of 256, Q4_K -> Q5_0$' "$TMP/q4km.log")
# 5 layers x 6 matrices of rows 64, minus attn_v in the use_more_bits layers
# (2 and 4), plus token_embd (untied).
check "Q4_K_M: Q4_K -> Q5_0 lines ($n)" [ "$n" -eq 29 ]
n=$(grep -c 'attn_v.weight: row 64 not a multiple of 256, Q6_K -> Q8_0$' "$TMP/q4km.log")
check "Q4_K_M: attn_v Q6_K -> Q8_0 in 2 layers ($n)" [ "$n" -eq 2 ]
n=$(grep -c 'ffn_down.weight: row 172 not a multiple of 256, Q[46]_K -> F16$' "$TMP/q4km.log")
check "Q4_K_M: ffn_down -> F16 ($n)" [ "$n" -eq "$N_LAYER" ]

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
	t=$(tensor_type "$TMP/q4km.gguf" blk.4.attn_v.weight)
	check "Q4_K_M: blk.4.attn_v is Q8_0 (got $t)" [ "$t" = Q8_0 ]
	t=$(tensor_type "$TMP/q4km.gguf" blk.3.attn_v.weight)
	check "Q4_K_M: blk.3.attn_v is Q5_0 (got $t)" [ "$t" = Q5_0 ]
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

# ---- every recipe on stories3M (rows of 256 and 768) ------------------------------
M3="$EDGELM_TESTDATA/models/stories3M-f32.gguf"
if [ ! -f "$M3" ]; then
	skipped "quantize: $M3 not found"
	finish
fi
# recipe, then the summary's type counts (llama.cpp's files: Q4_K_M has Q4_K
# x25, Q6_K x5; Q4_0 has Q4_0 x29 and a Q6_K output)
while read -r recipe counts; do
	run "3m-$recipe" "$M3" "$TMP/3m-$recipe.gguf" "$recipe"
	log="$TMP/3m-$recipe.log"
	check "3M $recipe: exit 0 (got $rc)" [ "$rc" -eq 0 ]
	check "3M $recipe: no fallback" [ "$(grep -c 'not a multiple' "$log")" -eq 0 ]
	check "3M $recipe: tensor counts $counts" grep -q "tensors: $counts\$" "$log"
done <<EOF
Q4_K_M F32 9, Q4_K 25, Q6_K 5
Q4_K_S F32 9, Q4_K 25, Q5_K 4, Q6_K 1
Q5_K_M F32 9, Q5_K 25, Q6_K 5
Q5_K_S F32 9, Q5_K 29, Q6_K 1
Q6_K F32 9, Q6_K 30
Q3_K_M F32 9, Q3_K 17, Q4_K 10, Q5_K 2, Q6_K 1
Q2_K F32 9, Q2_K 17, Q3_K 12, Q6_K 1
Q8_0 F32 9, Q8_0 30
Q4_0 F32 9, Q4_0 29, Q6_K 1
Q4_1 F32 9, Q4_1 29, Q6_K 1
Q5_0 F32 9, Q5_0 29, Q6_K 1
Q5_1 F32 9, Q5_1 29, Q6_K 1
IQ4_NL F32 9, Q6_K 1, IQ4_NL 29
IQ4_XS F32 9, Q6_K 1, IQ4_XS 29
EOF
if [ -x "$G" ]; then
	ft=$("$G" "$TMP/3m-Q4_K_M.gguf" 2>/dev/null | awk '$1 == "general.file_type" { print $3 }')
	check "3M Q4_K_M: general.file_type 15 (got $ft)" [ "$ft" = 15 ]
	t=$(tensor_type "$TMP/3m-Q4_K_M.gguf" blk.3.ffn_down.weight)
	check "3M Q4_K_M: blk.3.ffn_down is Q6_K (got $t)" [ "$t" = Q6_K ]
	t=$(tensor_type "$TMP/3m-Q4_K_M.gguf" token_embd.weight)
	check "3M Q4_K_M: token_embd (untied) is Q4_K (got $t)" [ "$t" = Q4_K ]
	t=$(tensor_type "$TMP/3m-Q4_K_M.gguf" output.weight)
	check "3M Q4_K_M: output is Q6_K (got $t)" [ "$t" = Q6_K ]
fi
run alias "$M3" "$TMP/3m-alias.gguf" q4_k
check "q4_k means Q4_K_M" cmp -s "$TMP/3m-alias.gguf" "$TMP/3m-Q4_K_M.gguf"

finish
