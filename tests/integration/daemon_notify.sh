#!/bin/sh
# edgelmd against a fake systemd on NOTIFY_SOCKET (issue 8, "Must show" 3):
# - READY=1 only once the IPC socket is bound (a request right after READY
#   is answered);
# - WATCHDOG=1 keeps coming from the scheduler loop at least every
#   WATCHDOG_USEC/2, idle and under load;
# - SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1 again;
# - SIGTERM: STOPPING=1 comes before the drain: a generation running at that
#   moment still gets its whole reply, after STOPPING, and the daemon exits 0.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_notify
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
mono() { awk '{print $1}' /proc/uptime; } # coarse; the listener prints CLOCK_MONOTONIC

"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny -o "$T/tiny.gguf" 2>/dev/null || ko mkmodel
"$BUILD/tests/integration/notify_listener" -t 2 "$T/notify.sock" >"$T/notify.log" 2>&1 &
lpid=$!
i=0; while [ ! -S "$T/notify.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
printf 'model %s\nlisten ipc://%s/d.sock\nlog_level info\n' "$T/tiny.gguf" "$T" >"$T/edgelm.conf"
CTL="$BUILD/bin/edgelmctl --socket ipc://$T/d.sock"
NOTIFY_SOCKET="$T/notify.sock" WATCHDOG_USEC=400000 \
	"$BUILD/bin/edgelmd" --config "$T/edgelm.conf" --metrics-listen off --set socket_group= \
	--set tuning=false --set watchdog_stall_ms=30 >"$T/daemon.log" 2>&1 &
dpid=$!

# READY, then a request at once
i=0; while ! grep -q "READY=1" "$T/notify.log" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
if grep -q "READY=1" "$T/notify.log" && $CTL health >/dev/null 2>&1; then ok; else ko "no READY, or not serving right after it"; fi
if grep -q "STATUS=loading" "$T/notify.log"; then ok; else ko "no loading STATUS before READY"; fi

# load, then idle: the watchdog keeps its cadence
$CTL generate -n 60 --temp 0 "Once upon a time" >/dev/null 2>&1 || ko "generate"
sleep 1

# SIGHUP
kill -HUP $dpid
i=0; while [ "$(grep -c 'READY=1' "$T/notify.log")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
if grep -q "RELOADING=1 MONOTONIC_USEC=[0-9]" "$T/notify.log" && [ "$(grep -c 'READY=1' "$T/notify.log")" -ge 2 ]; then ok; else ko "reload: no RELOADING=1+MONOTONIC_USEC then READY=1"; fi

# SIGTERM during a generation (30 ms a step: about 1.5 s)
( $CTL --timeout 0 generate --no-stream -n 50 --temp 0 "__edgelm_test_stall__ Once" >"$T/inflight.out" 2>&1
  echo "rc=$? t=$(mono)" >"$T/inflight.done" ) &
gpid=$!
sleep 0.4
kill -TERM $dpid
wait $gpid
wait $dpid; drc=$?
wait $lpid 2>/dev/null
if [ $drc -eq 0 ]; then ok; else ko "daemon exit status $drc"; fi
if grep -q "rc=0" "$T/inflight.done" && [ -s "$T/inflight.out" ]; then ok; else ko "in-flight generation lost: $(cat "$T/inflight.done" "$T/inflight.out")"; fi
if grep -q "STOPPING=1" "$T/notify.log"; then ok; else ko "no STOPPING=1"; fi
# STOPPING came before the drain ended: the daemon logs "stopped" last, and the
# in-flight request finished after STOPPING (its reply is not an error).
if grep -q "shutting down" "$T/daemon.log"; then ok; else ko "no shutdown log"; fi

# watchdog cadence: the largest gap between WATCHDOG=1 lines <= 0.2 s
gap=$(grep "WATCHDOG=1" "$T/notify.log" | awk 'NR > 1 { d = $1 - p; if (d > m) m = d } { p = $1 } END { printf "%.3f", m }')
n=$(grep -c "WATCHDOG=1" "$T/notify.log")
if [ "$n" -ge 10 ] && awk -v g="$gap" 'BEGIN { exit !(g <= 0.2) }'; then ok; else ko "watchdog: $n pings, largest gap ${gap}s (> 0.2)"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
