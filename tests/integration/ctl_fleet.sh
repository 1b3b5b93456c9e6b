#!/bin/sh
# Issue 26, "Fleet", client side, against three real edgelmd on ipc://
# (stories260K): edgelmctl with --socket repeated, with a comma list and
# with EDGELM_SOCKET reaches every daemon (counted in each one's
# edgelm_requests_total); streamed generations complete, so their polls
# found the daemon that started them (another answers not_found, counted
# too: none); after one daemon is killed every later request completes on
# the other two.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/ctl_fleet
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

MODEL="${EDGELM_TESTDATA:-../shared}/models/stories260K-f32.gguf"
if [ ! -r "$MODEL" ]; then
	echo "SKIP ctl_fleet: no $MODEL" >&2
	echo "0 passed, 0 failed, 1 skipped"
	exit 0
fi
CTL="$BUILD/bin/edgelmctl"
pids=""
for i in 1 2 3; do
	"$BUILD/bin/edgelmd" --model "$MODEL" --listen "ipc://$T/d$i.sock" --set socket_group= \
		--set tuning=false --set metrics_listen=off --threads 1 >"$T/d$i.log" 2>&1 &
	pids="$pids $!"
	eval "pid$i=$!"
done
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
for i in 1 2 3; do
	n=0; while ! $CTL -s "ipc://$T/d$i.sock" health >/dev/null 2>&1 && [ $n -lt 100 ]; do
		sleep 0.1; n=$((n + 1)); done
done
A="ipc://$T/d1.sock" B="ipc://$T/d2.sock" C="ipc://$T/d3.sock"

# count OP OUTCOME on daemon I
count() {
	$CTL -s "ipc://$T/d$1.sock" metrics 2>/dev/null | awk -v k="{op=\"$2\",outcome=\"$3\"}" \
		'$1 == "edgelm_requests_total" k { n = $2 + 0 } END { printf "%d\n", n }'
}

# ---- edgelmctl metrics prints whole counts as such (a count of 20 printed
# as 2e+01: the shortest %g); bring d1's health count to exactly 20
n=$(count 1 health ok)
while [ "$n" -lt 20 ]; do $CTL -s "$A" health >/dev/null 2>&1; n=$((n + 1)); done
m=$($CTL -s "$A" metrics 2>/dev/null)
if echo "$m" | grep -q 'edgelm_requests_total{op="health",outcome="ok"} 20$' &&
	! echo "$m" | grep -q ' [0-9.]*e+[0-9]*$'; then ok
else ko "metrics counts: $(echo "$m" | grep 'requests_total{op="health"')"; fi

# ---- spread: repeated --socket, a comma list, the environment
for k in 1 2 3 4 5 6 7 8 9 10 11 12; do
	$CTL -s "$A" -s "$B,$C" tokenize hi >/dev/null 2>&1 || ko "tokenize $k over -s A -s B,C"
done
for k in 1 2 3 4 5 6 7 8 9 10 11 12; do
	EDGELM_SOCKET="$A, $B ,$C" $CTL tokenize hi >/dev/null 2>&1 || ko "tokenize $k via EDGELM_SOCKET"
done
for i in 1 2 3; do
	c=$(count $i tokenize ok)
	if [ "$c" -gt 0 ]; then ok; else ko "daemon $i got none of 24 tokenize"; fi
done

# ---- streams stay on their daemon
for k in 1 2 3 4 5 6 7 8 9; do
	out=$($CTL -s "$A,$B,$C" generate --stream --temp 0 -n 24 "Once upon a time" 2>&1) ||
		ko "streamed generate $k: $out"
done
started=0 polled=0
for i in 1 2 3; do
	g=$(count $i generate ok); started=$((started + g))
	p=$(count $i poll ok); polled=$((polled + p))
	nf=$(count $i poll not_found)
	if [ "$nf" -eq 0 ]; then ok; else ko "daemon $i: $nf polls for a stream it never started"; fi
done
if [ "$started" -eq 9 ]; then ok; else ko "$started generations started, 9 asked"; fi
if [ "$polled" -ge 9 ]; then ok; else ko "$polled polls for 9 streams: not streamed?"; fi

# ---- one daemon killed: the rest serve everything after
kill -9 "$pid2"
for k in 1 2 3 4 5 6 7 8 9 10; do
	$CTL -s "$A" -s "$B" -s "$C" tokenize hi >/dev/null 2>&1 || ko "tokenize $k after the kill"
done
for k in 1 2 3; do
	$CTL -s "$A,$B,$C" generate --temp 0 -n 8 "Once" >/dev/null 2>&1 || ko "generate $k after the kill"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
