#!/bin/sh
# tools/dev/peer-bench.sh: edgelm-bench and llama.cpp's llama-bench on the
# same GGUF file, threads, prompt and generation lengths, side by side.
#
#   tools/dev/peer-bench.sh [-t THREADS] [-p PROMPT] [-n GEN] [-r REPS] MODEL.gguf
#
# Defaults: -t 2 -p 128 -n 32 -r 5 (llama-bench's repetitions). Both run
# the same work: prefill of PROMPT random tokens from an empty KV cache
# (llama-bench's ppPROMPT), and GEN one-token decode steps from an empty
# one (tgGEN), f16 KV cache, 512-token batches, one after the other (never
# at the same time). The table gives tok/s of both and their ratio, plus
# what only edgelm-bench measures (time to first token, load, peak RSS).
#
# Best against best: edgelm-bench keeps the best of its reps, llama-bench
# reports the mean and standard deviation, and its JSON has every rep
# (samples_ts), from which the best is taken; the mean is shown beside it.
#
# Found: llama-bench as $LLAMA_BENCH, else on PATH (missing: exit 77, as a
# skipped test); edgelm-bench as $EDGELM_BENCH, else $BUILD/bin (default
# build/) of this tree, else on PATH. $EDGELM_BENCH_ARGS and
# $LLAMA_BENCH_ARGS are added to each command line (e.g. "--tuning on",
# "--cpu-mask 0x3 --cpu-strict 1"). JSON is read with jq when installed,
# else with sed and awk (PEER_BENCH_NO_JQ=1 forces that, for testing).
# Exit: 0, 1 a bench failed, 2 usage, 77 no llama-bench.
set -eu

usage() {
	echo "usage: $0 [-t THREADS] [-p PROMPT] [-n GEN] [-r REPS] MODEL.gguf" >&2
	exit 2
}
threads=2
prompt=128
gen=32
reps=5
while getopts t:p:n:r:h opt; do
	case $opt in
	t) threads=$OPTARG ;;
	p) prompt=$OPTARG ;;
	n) gen=$OPTARG ;;
	r) reps=$OPTARG ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || usage
model=$1
for v in "$threads" "$prompt" "$gen" "$reps"; do
	case $v in '' | *[!0-9]* | 0) echo "$0: -t, -p, -n, -r take whole numbers > 0" >&2; exit 2 ;; esac
done
[ -r "$model" ] || { echo "$0: $model: not readable" >&2; exit 2; }

theirs=${LLAMA_BENCH:-$(command -v llama-bench || true)}
if [ -z "$theirs" ] || [ ! -x "$theirs" ]; then
	echo "$0: llama.cpp's llama-bench not found (set LLAMA_BENCH or put it on PATH): skipped" >&2
	exit 77
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
ours=${EDGELM_BENCH:-}
if [ -z "$ours" ]; then
	if [ -x "$root/${BUILD:-build}/bin/edgelm-bench" ]; then
		ours=$root/${BUILD:-build}/bin/edgelm-bench
	else
		ours=$(command -v edgelm-bench || true)
	fi
fi
if [ -z "$ours" ] || [ ! -x "$ours" ]; then
	echo "$0: no edgelm-bench (make it, or set EDGELM_BENCH)" >&2
	exit 1
fi
jq=
[ "${PEER_BENCH_NO_JQ:-}" = 1 ] || jq=$(command -v jq || true)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ---- the runs -----------------------------------------------------------------

echo "edgelm-bench: $ours" >&2
# shellcheck disable=SC2086 # the extra arguments are split on purpose
if ! "$ours" -m "$model" -t "$threads" --prompts "$prompt" --contexts 0 -n "$gen" \
	--reps "$reps" --batch 512 --kv-type f16 --json ${EDGELM_BENCH_ARGS:-} \
	>"$tmp/ours.json" 2>"$tmp/ours.err"; then
	cat "$tmp/ours.err" >&2
	echo "$0: edgelm-bench failed" >&2
	exit 1
fi
echo "llama-bench: $theirs" >&2
# shellcheck disable=SC2086
if ! "$theirs" -m "$model" -t "$threads" -p "$prompt" -n "$gen" -r "$reps" \
	-b 512 -ub 512 -ctk f16 -ctv f16 -o json ${LLAMA_BENCH_ARGS:-} \
	>"$tmp/theirs.json" 2>"$tmp/theirs.err"; then
	cat "$tmp/theirs.err" >&2
	echo "$0: llama-bench failed" >&2
	exit 1
fi

# ---- parsing: one tab-separated line per side --------------------------------

# ours: isa threads prefill_tok_s ttft_ms decode_tok_s load_ms load_peak_mib peak_mib
if [ -n "$jq" ]; then
	ours_line=$("$jq" -r '[.isa, .threads, .prefill[0].tok_s, .prefill[0].ttft_ms,
		.decode[0].tok_s, .load_ms, .load_peak_rss_mib, .peak_rss_mib] | @tsv' "$tmp/ours.json")
else
	# one line of JSON that edgelm-bench writes; the first "key": is the
	# top-level one for these keys (nested objects come after them)
	j=$(cat "$tmp/ours.json")
	get() { printf '%s\n' "$j" | grep -o "\"$1\":[^,}]*" | head -1 | sed 's/^[^:]*://; s/"//g'; }
	pre=$(printf '%s\n' "$j" | sed -n 's/.*"prefill":\[{"tokens":[0-9]*,"tok_s":\([0-9.]*\),"ttft_ms":\([0-9.]*\)}.*/\1	\2/p')
	dec=$(printf '%s\n' "$j" | sed -n 's/.*"decode":\[{"context":0,"tok_s":\([0-9.]*\),.*/\1/p')
	ours_line=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(get isa)" "$(get threads)" "$pre" \
		"$dec" "$(get load_ms)" "$(get load_peak_rss_mib)" "$(get peak_rss_mib)")
fi

# theirs, per test: n_prompt n_gen avg_ts stddev_ts best_ts build_commit build_number
# backends n_threads
if [ -n "$jq" ]; then
	"$jq" -r '.[] | [.n_prompt, .n_gen, .avg_ts, .stddev_ts,
		((.samples_ts // [.avg_ts]) | max), .build_commit, .build_number, .backends,
		.n_threads] | @tsv' "$tmp/theirs.json" >"$tmp/theirs.tsv"
else
	# llama-bench -o json: one "key": value per line, "samples_ts": [ a, b ]
	awk '
	function val(s) { sub(/^[^:]*: */, "", s); sub(/,$/, "", s); gsub(/"/, "", s); return s }
	/^ *"n_prompt":/ { np = val($0) }
	/^ *"n_gen":/ { ng = val($0) }
	/^ *"avg_ts":/ { avg = val($0) }
	/^ *"stddev_ts":/ { sd = val($0) }
	/^ *"build_commit":/ { bc = val($0) }
	/^ *"build_number":/ { bn = val($0) }
	/^ *"backends":/ { be = val($0) }
	/^ *"n_threads":/ { nt = val($0) }
	/^ *"samples_ts":/ {
		s = $0; sub(/.*\[/, "", s); sub(/\].*/, "", s)
		n = split(s, a, /, */); best = ""
		for (i = 1; i <= n; i++) if (a[i] != "" && (best == "" || a[i] + 0 > best + 0)) best = a[i]
	}
	/^ *}/ {
		if (best == "") best = avg
		printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", np, ng, avg, sd, best, bc, bn, be, nt
		best = ""
	}' "$tmp/theirs.json" >"$tmp/theirs.tsv"
fi
pp=$(awk -F '\t' -v p="$prompt" '$1 == p && $2 == 0' "$tmp/theirs.tsv" | head -1)
tg=$(awk -F '\t' -v n="$gen" '$1 == 0 && $2 == n' "$tmp/theirs.tsv" | head -1)
if [ -z "$pp" ] || [ -z "$tg" ] || [ -z "$ours_line" ]; then
	echo "$0: could not read the results; edgelm-bench:" >&2
	cat "$tmp/ours.json" >&2
	echo "llama-bench:" >&2
	cat "$tmp/theirs.json" >&2
	exit 1
fi

# ---- the table ------------------------------------------------------------------

# this tree's commit, when the edgelm-bench is this tree's build
rev=-
case $ours in
"$root"/*) rev=$(git -C "$root" describe --always --dirty 2>/dev/null || echo -) ;;
esac
printf '%s\n%s\n%s\n' "$ours_line" "$pp" "$tg" | awk -F '\t' \
	-v model="$model" -v prompt="$prompt" -v gen="$gen" -v reps="$reps" \
	-v ours="$ours" -v theirs="$theirs" -v rev="$rev" '
function ratio(a, b) { return b > 0 ? sprintf("%.2f", a / b) : "-" }
function row(name, a, best, avg, sd) {
	printf "%-22s %10.2f %10.2f %10.2f +- %-7.2f %9s %9s\n", name, a, best, avg, sd,
	       ratio(a, best), ratio(a, avg)
}
NR == 1 { isa = $1; threads = $2; pre = $3; ttft = $4; dec = $5; load = $6; lpeak = $7; peak = $8 }
NR == 2 { pavg = $3; psd = $4; pbest = $5; commit = $6; number = $7; backends = $8; lthreads = $9 }
NR == 3 { tavg = $3; tsd = $4; tbest = $5 }
END {
	printf "peer-bench: %s, %d reps each\n", model, reps
	printf "edgelm     %s (%s): %s kernels, %s threads\n", ours, rev, isa, threads
	printf "llama.cpp  %s: %s, %s threads\n\n", theirs, backends, lthreads
	printf "%-22s %10s %10s %-21s %19s\n", "", "edgelm", "llama.cpp", "   llama.cpp",
	       "edgelm / llama.cpp"
	printf "%-22s %10s %10s %-21s %9s %9s\n", "tok/s", "best", "best", "   mean +- sd",
	       "best", "mean"
	row("pp" prompt " (prefill)", pre, pbest, pavg, psd)
	row("tg" gen " (decode from 0)", dec, tbest, tavg, tsd)
	printf "%-22s edgelm %s, llama.cpp %s (build %s)\n", "build", rev, commit, number
	printf "\nedgelm only: time to first token (%d tokens) %.1f ms; load %.0f ms, peak RSS %.1f " \
	       "MiB during it; peak RSS %.1f MiB\n", prompt, ttft, load, lpeak, peak
}'
