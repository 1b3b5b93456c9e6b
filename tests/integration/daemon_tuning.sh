#!/bin/sh
# Tuning on this box, through the real daemon (issue 6, "Must show" 2):
# - under `taskset -c 0` edgelmd uses one worker; pinned, its service
#   threads keep the service cpus (only the decoding thread is pinned);
# - with RLIMIT_MEMLOCK of 64 KiB and no CAP_IPC_LOCK it warns once (naming
#   LimitMEMLOCK=infinity) and serves; with mlock = on it refuses (exit 5);
# - a model whose KV cache cannot fit in memory is refused before anything
#   big is allocated, with exit code 4 and a message that says why;
# - `edgelmd --check` prints the report and changes nothing.
# Uses a synthetic model (edgelm-gguf mkmodel), so it needs no external data.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_tuning
mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny -o "$T/tiny.gguf" 2>/dev/null || ko "mkmodel tiny"
"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny --ctx 100000000 -o "$T/huge.gguf" 2>/dev/null || ko "mkmodel huge"
D="$BUILD/bin/edgelmd --config /dev/null --metrics-listen off --set socket_group="

# Start a daemon with a wrapper, wait until it serves, then stop it; the log
# is in $T/$name.log. Returns the daemon's exit status.
run_daemon() {
	name=$1; shift
	"$@" >"$T/$name.log" 2>&1 &
	pid=$!
	i=0
	while [ $i -lt 100 ] && ! grep -q "serving" "$T/$name.log" 2>/dev/null; do
		kill -0 $pid 2>/dev/null || break
		sleep 0.1; i=$((i + 1))
	done
	kill -TERM $pid 2>/dev/null
	wait $pid
}

# taskset -c 0: one worker
run_daemon taskset taskset -c 0 $D --model "$T/tiny.gguf" --listen "ipc://$T/a.sock"
rc=$?
if [ $rc -eq 0 ] && grep -q "tuning: 1 workers" "$T/taskset.log" && grep -q "1 threads" "$T/taskset.log"; then ok; else ko "taskset -c 0: rc $rc, $(cat "$T/taskset.log")"; fi

# pinned workers, service threads on the service cpus: after a generation
# the decoding thread (sched) and worker 1 are on one cpu each, the main and
# nng threads keep the whole set (they had followed worker 0 to its cpu)
all=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
case $all in
*-*|*,*)
	$D --model "$T/tiny.gguf" --listen "ipc://$T/p.sock" >"$T/pin.log" 2>&1 &
	pid=$!
	i=0
	while [ $i -lt 100 ] && ! grep -q "serving" "$T/pin.log"; do sleep 0.1; i=$((i + 1)); done
	"$BUILD/bin/edgelmctl" --socket "ipc://$T/p.sock" generate -n 3 "hi" >/dev/null 2>&1
	aff() { for t in /proc/$pid/task/*; do
		[ "$(cat "$t/comm")" = "$1" ] && sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$t/status"
	done | head -n 1; }
	main=$(aff edgelmd) nng=$(aff nng:timer) sched=$(aff edgelmd:sched)
	kill -TERM $pid; wait $pid
	case $sched in *-*|*,*|"") sched_one=no ;; *) sched_one=yes ;; esac
	if [ "$main" = "$all" ] && [ "$nng" = "$all" ] && [ $sched_one = yes ]; then ok
	else ko "pinning: main '$main', nng '$nng', sched '$sched' (all '$all')"; fi
	;;
*) echo "SKIP pinning: one cpu" >&2 ;;
esac

# memlock 64 KiB without CAP_IPC_LOCK: one warning, then it serves
if command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
	run_daemon memlock setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
		prlimit --memlock=65536 $D --set mlock=try --model "$T/tiny.gguf" --listen "ipc://$T/b.sock"
	rc=$?
	n=$(grep -c "LimitMEMLOCK=infinity" "$T/memlock.log")
	if [ $rc -eq 0 ] && [ "$n" -eq 1 ] && grep -q "serving unlocked" "$T/memlock.log"; then ok; else ko "memlock: rc $rc, $n warnings: $(cat "$T/memlock.log")"; fi
	# mlock = on refuses with its own exit code (5, which the unit does
	# not restart), not 4 ("does not fit in memory"), and says so once
	setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock prlimit --memlock=65536 \
		$D --set mlock=on --model "$T/tiny.gguf" --listen "ipc://$T/b2.sock" >"$T/mlock-on.log" 2>&1
	rc=$?
	if [ $rc -eq 5 ] && grep -q "refusing to start" "$T/mlock-on.log" &&
		! grep -q "serving unlocked" "$T/mlock-on.log"; then ok; else ko "mlock=on: rc $rc: $(cat "$T/mlock-on.log")"; fi
else
	echo "SKIP memlock: setpriv or prlimit missing" >&2
fi

# a KV cache that cannot fit: refused with exit code 4
$D --model "$T/huge.gguf" --listen "ipc://$T/c.sock" >"$T/huge.log" 2>&1
rc=$?
if [ $rc -eq 4 ] && grep -q "does not fit in memory" "$T/huge.log"; then ok; else ko "huge model: rc $rc: $(cat "$T/huge.log")"; fi

# --check: a report, exit 0, no socket created
$BUILD/bin/edgelmd --check --config /dev/null --model "$T/tiny.gguf" >"$T/check.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "^Plan" "$T/check.log" && grep -q "workers" "$T/check.log"; then ok; else ko "--check: rc $rc"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
