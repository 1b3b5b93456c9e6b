#!/bin/sh
# Run every test binary of $BUILD and the integration scripts; sum their
# closing lines into one "N passed, N failed" line.
set -u
BUILD=${BUILD:-build}
PASS_NAME=${TEST_PASS:-normal}
: "${EDGELM_TESTDATA:=$(cd "$(dirname "$0")/.." && pwd)/../shared}"
export EDGELM_TESTDATA BUILD
export TEST_TMPDIR=$(mktemp -d "${TMPDIR:-/tmp}/edgelm-test.XXXXXX")
# searchable, not listable: tests that run a client as another user put a
# socket in a directory of their own in here (test_daemon_core)
chmod 0711 "$TEST_TMPDIR"
trap 'rm -rf "$TEST_TMPDIR"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

total_p=0; total_f=0; total_s=0; failed=""

# Tests that judge this box's live load (a CPU hog must raise the monitor's
# cpu_contention flag, then clear): another build on the same machine fails
# them. EDGELM_TEST_NO_LIVE=1 (the package build, debian/rules) skips them;
# daemon_monitor.sh, which checks more, skips only its hog case then.
LIVE_TESTS="test_monitor_live"
is_live() {
	case "${EDGELM_TEST_NO_LIVE:-0}" in "" | 0) return 1 ;; esac
	case " $LIVE_TESTS " in *" $1 "*) return 0 ;; esac
	return 1
}

# A test that hangs fails (exit 124) instead of stalling the run; the
# longest ones (real model shapes under ASan) take a few minutes.
TEST_TIMEOUT=${TEST_TIMEOUT:-900}
# RUN_ONLY=SUBSTRING runs only the tests whose names contain it (TEST_ONLY,
# read by tests/test.h, picks cases inside each binary instead).
run_one() {
	name=$1; shift
	case "$name" in *"${RUN_ONLY:-}"*) ;; *) return 0 ;; esac
	t0=$(date +%s%N)
	out=$(timeout --kill-after=10 "$TEST_TIMEOUT" "$@" 2>"$TEST_TMPDIR/stderr"); rc=$?
	# the wall time of each test, so the suite's 15-minute budget can be kept
	dt=$(( ($(date +%s%N) - t0) / 100000000 ))
	dt="$((dt / 10)).$((dt % 10)) s"
	case $rc in
	124) echo "timed out after $TEST_TIMEOUT s (TEST_TIMEOUT)" >>"$TEST_TMPDIR/stderr" ;;
	137) echo "killed (SIGKILL: 10 s after TEST_TIMEOUT, or from outside)" >>"$TEST_TMPDIR/stderr" ;;
	esac
	line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
	if [ -z "$line" ]; then
		p=0; f=1; s=0
	else
		p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
		f=$(echo "$line" | sed -E 's/^[0-9]+ passed, ([0-9]+) failed.*/\1/')
		s=$(echo "$line" | sed -nE 's/.*, ([0-9]+) skipped.*/\1/p'); s=${s:-0}
	fi
	[ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && f=1
	total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + s))
	if [ "$f" -ne 0 ]; then
		failed="$failed $name"
		printf 'FAIL  %-40s %s (exit %d, %s)\n' "$name" "${line:-no closing line}" "$rc" "$dt"
		sed 's/^/      /' "$TEST_TMPDIR/stderr" | tail -n 40
	else
		printf 'ok    %-40s %-40s %8s\n' "$name" "$line" "$dt"
		grep '^SKIP' "$TEST_TMPDIR/stderr" | sed 's/^/      /'
	fi
}

echo "== tests ($PASS_NAME build: $BUILD)"
for t in "$BUILD"/tests/unit/test_* "$BUILD"/tests/kernels/test_*; do
	case "$t" in *.o|*.d) continue ;; esac
	[ -x "$t" ] || continue
	if is_live "$(basename "$t")"; then
		total_s=$((total_s + 1))
		printf 'skip  %-40s live-load test (EDGELM_TEST_NO_LIVE is set)\n' "$(basename "$t")"
		continue
	fi
	run_one "$(basename "$t")" "$t"
done
for r in "$BUILD"/tests/fuzz/replay_*; do
	case "$r" in *.o|*.d) continue ;; esac
	[ -x "$r" ] || continue
	tgt=${r##*/replay_}
	run_one "fuzz-replay-$tgt" "$r" "tests/fuzz/corpus/$tgt"
done
if [ "$PASS_NAME" = normal ]; then
	for s in tests/integration/*.sh; do
		[ -f "$s" ] || continue
		run_one "$(basename "$s" .sh)" sh "$s"
	done
fi
echo "== $PASS_NAME: $total_p passed, $total_f failed, $total_s skipped"
[ -n "$failed" ] && echo "failed:$failed"
printf '%d passed, %d failed\n' "$total_p" "$total_f"
[ -n "${TEST_TOTALS:-}" ] && echo "$total_p $total_f $total_s" >>"$TEST_TOTALS"
[ "$total_f" -eq 0 ]
