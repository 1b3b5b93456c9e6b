#!/bin/sh
# edgelmd with `quantize` (issue 25) against a fake systemd:
# - the start's EXTEND_TIMEOUT_USEC is 120 s plus 1 s per 4 MiB of the
#   file (a synthetic F32 model of 12 MiB: 123 s), and so is a reload's
#   that loads a new model;
# - the log says what was quantized, in what time and to what size;
# - greedy output equals that of edgelmd serving the file edgelm-quantize
#   writes for the same type;
# - a bad name is a configuration error (exit 1) naming the key.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_quantize
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

"$BUILD/bin/edgelm-gguf" mkmodel --shape small --type F32 -o "$T/f32.gguf" >/dev/null 2>&1 ||
	ko mkmodel
"$BUILD/bin/edgelm-quantize" -t 2 "$T/f32.gguf" "$T/q8.gguf" q8_0 >/dev/null 2>&1 ||
	ko edgelm-quantize
cp "$T/f32.gguf" "$T/f32b.gguf"
size=$(stat -c %s "$T/f32.gguf")
want=$(( (120 + size / 4194304) * 1000000 ))

D="$BUILD/bin/edgelmd --metrics-listen off --set socket_group= --set tuning=false --set threads=2"
CTL="$BUILD/bin/edgelmctl --socket ipc://$T/d.sock"

# serve MODEL with EXTRA config lines; the notify log in $T/notify.log
start() {
	printf 'model %s\nlisten ipc://%s/d.sock\nlog_level info\n%s\n' "$1" "$T" "$2" \
		>"$T/edgelm.conf"
	rm -f "$T/notify.log"
	"$BUILD/tests/integration/notify_listener" -t 1 "$T/notify.sock" >"$T/notify.log" 2>&1 &
	lpid=$!
	i=0; while [ ! -S "$T/notify.sock" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	NOTIFY_SOCKET="$T/notify.sock" $D --config "$T/edgelm.conf" >"$T/daemon.log" 2>&1 &
	dpid=$!
	i=0; while ! grep -q "READY=1" "$T/notify.log" && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
	grep -q "READY=1" "$T/notify.log" || ko "$1: no READY ($(cat "$T/daemon.log"))"
}
stop() {
	kill -TERM $dpid; wait $dpid || ko "daemon exit status $?"
	wait $lpid 2>/dev/null
}

start "$T/q8.gguf" ""
ref=$($CTL generate -n 24 --temp 0 "Once upon a time" 2>&1) || ko "generate (file): $ref"
stop

start "$T/f32.gguf" "quantize q8_0"
out=$($CTL generate -n 24 --temp 0 "Once upon a time" 2>&1) || ko "generate (quantize): $out"
if [ -n "$ref" ] && [ "$out" = "$ref" ]; then ok; else ko "quantize q8_0: '$out' vs the file's '$ref'"; fi
if grep -q "EXTEND_TIMEOUT_USEC=$want\$" "$T/notify.log"; then ok
else ko "start: want EXTEND_TIMEOUT_USEC=$want: $(grep EXTEND "$T/notify.log")"; fi
if grep -Eq "quantize: [0-9]+ tensors to Q8_0 in [0-9.]+ s: 12\.[0-9] MiB in the file -> [0-9.]+ MiB" \
	"$T/daemon.log"; then ok; else ko "no quantize log line: $(cat "$T/daemon.log")"; fi
# a reload to another model: the timeout is extended again
sed -i "s|^model .*|model $T/f32b.gguf|" "$T/edgelm.conf"
kill -HUP $dpid
i=0; while [ "$(grep -c 'READY=1' "$T/notify.log")" -lt 2 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
if grep "RELOADING=1" -A100 "$T/notify.log" | grep -q "EXTEND_TIMEOUT_USEC=$want\$"; then ok
else ko "reload: no EXTEND_TIMEOUT_USEC=$want after RELOADING: $(cat "$T/notify.log")"; fi
out=$($CTL generate -n 24 --temp 0 "Once upon a time" 2>&1) || ko "generate (reloaded): $out"
if [ "$out" = "$ref" ]; then ok; else ko "after the reload: '$out' vs '$ref'"; fi
stop

# a name the engine does not take
msg=$($D --config /dev/null --model "$T/f32.gguf" --set quantize=q4_k_x 2>&1); rc=$?
if [ $rc -eq 1 ]; then ok; else ko "quantize=q4_k_x: exit status $rc"; fi
case $msg in *quantize*"unknown type 'q4_k_x'"*) ok ;; *) ko "quantize=q4_k_x: $msg" ;; esac

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
