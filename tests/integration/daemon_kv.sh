#!/bin/sh
# edgelmd's KV cache options (kv_type, kv_budget_mib):
# - kv_type q8_0 is what the daemon allocates (the start-up log names it)
#   and it serves greedy requests;
# - kv_budget_mib with ctx_size 0 lowers the context until `parallel`
#   sequences fit (the tiny model: 272 bytes of q8_0 KV per token and
#   sequence, 64 sequences in 1 MiB: 60 tokens), and `info` reports it;
# - an explicit ctx_size over the budget is refused with exit status 4
#   and a message naming both keys, before anything is allocated;
# - an unknown kv_type is a configuration error (exit status 1).
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_kv
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny -o "$T/tiny.gguf" 2>/dev/null || ko mkmodel
D="$BUILD/bin/edgelmd --config /dev/null --model $T/tiny.gguf --metrics-listen off \
	--set socket_group= --set tuning=false"
CTL="$BUILD/bin/edgelmctl --socket ipc://$T/d.sock"

$D --listen "ipc://$T/d.sock" --set kv_type=q8_0 --set kv_budget_mib=1 --set parallel=64 \
	>"$T/daemon.log" 2>&1 &
dpid=$!
i=0; while ! $CTL health >/dev/null 2>&1 && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
if grep -q "60 ctx x 64 sequences (1.0 MiB of q8_0 KV)" "$T/daemon.log"; then ok; else ko "start-up log: $(grep 'ctx x' "$T/daemon.log")"; fi
if $CTL info 2>/dev/null | grep -Eq '^context: +60 tokens'; then ok; else ko "info: $($CTL info 2>&1 | grep -i context)"; fi
out=$($CTL generate -n 8 --temp 0 "Once upon" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ -n "$out" ]; then ok; else ko "generate with a q8_0 cache: rc $rc: $out"; fi
kill -TERM $dpid
wait $dpid; drc=$?
if [ $drc -eq 0 ]; then ok; else ko "daemon exit status $drc"; fi

$D --listen "ipc://$T/e.sock" --set kv_budget_mib=1 --set parallel=64 --set ctx_size=256 \
	>"$T/refused.log" 2>&1
rc=$?
if [ $rc -eq 4 ]; then ok; else ko "ctx_size over the budget: exit status $rc, expected 4"; fi
if grep -q "ctx_size 256 x parallel 64 needs 4.0 MiB of f16 KV cache, over kv_budget_mib 1" "$T/refused.log"; then ok; else ko "refusal message: $(cat "$T/refused.log")"; fi

$D --listen "ipc://$T/f.sock" --set kv_type=q4_0 >"$T/badtype.log" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "kv_type" "$T/badtype.log"; then ok; else ko "kv_type q4_0: exit status $rc: $(cat "$T/badtype.log")"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
