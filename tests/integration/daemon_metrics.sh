#!/bin/sh
# Issue 23, "Operator lifecycle", against a real edgelmd:
# - every reply is counted in edgelm_requests_total{op,outcome}: refusals
#   of the parser (top_p 5), the text workers (an id out of the vocabulary)
#   and the handler (cancel of an unknown id) with their error code;
# - edgelm_build_info and edgelm_model_info, the latter current after a
#   SIGHUP that swaps the model;
# - a metrics port in use stops the start (exit 3, an err line) unless
#   metrics_bind_required is no;
# - every edgelm_* name in packaging/grafana/edgelm.json and
#   packaging/prometheus/edgelm-rules.yml is in a live scrape, and
#   `promtool check rules` / `check config` (the one-box and the fleet
#   scrape configurations) pass (SKIP without promtool).
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_metrics
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
sk() { skip=$((skip + 1)); echo "SKIP $*" >&2; }

"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny --vocab synthetic -o "$T/a.gguf" 2>/dev/null || ko "mkmodel a"
"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny --vocab synthetic --type Q8_0 -o "$T/b.gguf" \
	2>/dev/null || ko "mkmodel b"
port=$((20000 + ($$ + 7) % 20000))
CTL="$BUILD/bin/edgelmctl --socket ipc://$T/d.sock"
# the model in the file, not on the command line, so a reload can change it
printf 'model %s\n' "$T/a.gguf" >"$T/edgelm.conf"
# peak_bandwidth_gbs: so the bandwidth ratio the dashboard shows is exported
"$BUILD/bin/edgelmd" --config "$T/edgelm.conf" --listen "ipc://$T/d.sock" \
	--metrics-listen "127.0.0.1:$port" --set socket_group= --set tuning=false \
	--set monitor_interval_ms=250 --set peak_bandwidth_gbs=5 --set drain_timeout_ms=1000 \
	--threads 1 >"$T/daemon.log" 2>&1 &
dpid=$!
i=0; while ! $CTL health >/dev/null 2>&1 && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
scrape() { curl -sf "http://127.0.0.1:$port/metrics" >"$T/$1"; }
has() { grep -qF -- "$2" "$T/$1"; }

# ---- requests by outcome
$CTL generate --no-stream --temp 0 -n 16 "Once upon" >/dev/null 2>&1 || ko "generate"
$CTL generate --no-stream --top-p 5 "Once" >/dev/null 2>&1 && ko "top_p 5 accepted"
$CTL detokenize 99999 >/dev/null 2>&1 && ko "id 99999 detokenized"
$CTL cancel no-such-id >/dev/null 2>&1 && ko "unknown id cancelled"
$CTL tokenize "hello" >/dev/null 2>&1 || ko "tokenize"
sleep 0.6 # a sample, for the derived gauges
scrape s1.txt || ko "no scrape from 127.0.0.1:$port"
for want in 'op="generate",outcome="ok"} 1' 'op="generate",outcome="invalid_field"} 1' \
	'op="detokenize",outcome="invalid_field"} 1' 'op="cancel",outcome="not_found"} 1' \
	'op="tokenize",outcome="ok"} 1'; do
	if has s1.txt "edgelm_requests_total{$want"; then ok; else ko "no edgelm_requests_total{$want"; fi
done
if grep -q 'edgelm_requests_total{op="detokenize",outcome="ok"}' "$T/s1.txt"; then
	ko "the refused detokenize counted as ok"
else
	ok
fi

# ---- info series
if grep -q '^edgelm_build_info{version="[^"]*",isa="[^"]\+",arch="[^"]*",compiler="[^"]*"} 1$' "$T/s1.txt"; then
	ok
else
	ko "no edgelm_build_info: $(grep edgelm_build_info "$T/s1.txt")"
fi
if has s1.txt 'file="a.gguf",arch="llama",type="Q4_0"'; then ok; else ko "edgelm_model_info: $(grep '^edgelm_model_info' "$T/s1.txt")"; fi

# ---- the names the dashboard and the rules use
names() { grep -o 'edgelm_[a-z0-9_]*' "$1" | sort -u; }
for f in packaging/grafana/edgelm.json packaging/prometheus/edgelm-rules.yml; do
	n=0
	for m in $(names "$f"); do
		n=$((n + 1))
		# a histogram's samples are its _bucket, _sum and _count
		if grep -Eq "^$m(_bucket|_sum|_count)?[{ ]" "$T/s1.txt"; then
			ok
		elif [ "${m#edgelm_pressure_}" != "$m" ] && [ ! -r /proc/pressure/cpu ]; then
			sk "$f: $m: this kernel has no PSI (/proc/pressure)"
		else
			ko "$f names $m, which the daemon does not export"
		fi
	done
	[ $n -gt 5 ] && ok || ko "$f: only $n metric names found"
done
if command -v jq >/dev/null 2>&1; then
	if jq -e '.panels | length > 10' packaging/grafana/edgelm.json >/dev/null; then ok; else ko "edgelm.json: not JSON, or few panels"; fi
	# the fleet's file_sd targets: a list of {targets, labels}
	if jq -e 'all(.[]; (.targets | length > 0) and (.labels | type == "object"))' \
		packaging/prometheus/edgelm-fleet-targets.json >/dev/null; then ok; else ko "edgelm-fleet-targets.json: not file_sd JSON"; fi
else
	sk "jq: not installed, edgelm.json not parsed"
fi
PROMTOOL=${PROMTOOL:-$(command -v promtool || true)}
if [ -n "$PROMTOOL" ] && [ -x "$PROMTOOL" ]; then
	if "$PROMTOOL" check rules packaging/prometheus/edgelm-rules.yml >"$T/promtool.txt" 2>&1; then ok; else ko "promtool check rules: $(cat "$T/promtool.txt")"; fi
	for f in scrape-example.yml edgelm-fleet.yml; do
		if "$PROMTOOL" check config "packaging/prometheus/$f" >"$T/promtool.txt" 2>&1; then ok; else ko "promtool check config $f: $(cat "$T/promtool.txt")"; fi
	done
	if "$PROMTOOL" check metrics <"$T/s1.txt" >"$T/promtool.txt" 2>&1; then ok; else ko "promtool check metrics: $(head -5 "$T/promtool.txt")"; fi
else
	sk "promtool: not installed (Debian's prometheus package), rules not checked"
fi

# ---- a busy metrics port
"$BUILD/bin/edgelmd" --config "$T/edgelm.conf" --listen "ipc://$T/d2.sock" \
	--metrics-listen "127.0.0.1:$port" --set socket_group= --set tuning=false --threads 1 \
	>"$T/busy.log" 2>&1
rc=$?
if [ $rc -eq 3 ]; then ok; else ko "busy metrics port: exit $rc, expected 3"; fi
if grep -q "err.*metrics endpoint 127.0.0.1:$port: .*in use" "$T/busy.log"; then ok; else ko "busy metrics port: no err line: $(cat "$T/busy.log")"; fi
"$BUILD/bin/edgelmd" --config "$T/edgelm.conf" --listen "ipc://$T/d3.sock" \
	--metrics-listen "127.0.0.1:$port" --set metrics_bind_required=no --set socket_group= \
	--set tuning=false --threads 1 >"$T/lenient.log" 2>&1 &
lpid=$!
i=0; while ! $BUILD/bin/edgelmctl --socket "ipc://$T/d3.sock" health >/dev/null 2>&1 && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if $BUILD/bin/edgelmctl --socket "ipc://$T/d3.sock" health >/dev/null 2>&1; then ok; else ko "metrics_bind_required=no: not serving: $(cat "$T/lenient.log")"; fi
if grep -q "warning.*metrics endpoint.*ignoring" "$T/lenient.log"; then ok; else ko "metrics_bind_required=no: no warning"; fi
kill -TERM $lpid 2>/dev/null; wait $lpid

# ---- a reload that swaps the model: edgelm_model_info follows
printf 'model %s\n' "$T/b.gguf" >"$T/edgelm.conf"
kill -HUP $dpid
i=0
while [ $i -lt 100 ]; do
	scrape s2.txt && has s2.txt 'file="b.gguf"' && break
	sleep 0.1; i=$((i + 1))
done
if has s2.txt 'file="b.gguf",arch="llama",type="Q8_0"'; then ok; else ko "after the reload: $(grep '^edgelm_model_info' "$T/s2.txt")"; fi
if [ "$(grep -c '^edgelm_model_info' "$T/s2.txt")" -eq 1 ]; then ok; else ko "more than one edgelm_model_info: $(grep '^edgelm_model_info' "$T/s2.txt")"; fi

kill -TERM $dpid; wait $dpid; rc=$?
if [ $rc -eq 0 ]; then ok; else ko "daemon exit $rc"; fi
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
