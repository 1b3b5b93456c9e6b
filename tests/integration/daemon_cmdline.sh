#!/bin/sh
# edgelmd's command line as an operator meets it:
# - --listen is repeatable: every URL given is served, not only the last;
# - a model path that cannot be served is named with the reason (the
#   errno, or what the path is), exit status 2, never "Success": missing,
#   empty, a directory, /dev/zero, a FIFO.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_cmdline
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
D="$BUILD/bin/edgelmd --config /dev/null --metrics-listen off --set socket_group= --set tuning=false"

# both listen URLs, in order, in the effective configuration and served
out=$($D --listen "ipc://$T/a.sock" --listen "ipc://$T/b.sock" --print-config | grep '^listen')
want=$(printf 'listen ipc://%s/a.sock\nlisten ipc://%s/b.sock' "$T" "$T")
if [ "$out" = "$want" ]; then ok; else ko "--print-config: $out"; fi
"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny -o "$T/tiny.gguf" 2>/dev/null || ko mkmodel
$D --model "$T/tiny.gguf" --listen "ipc://$T/a.sock" --listen "ipc://$T/b.sock" \
	>"$T/daemon.log" 2>&1 &
dpid=$!
for s in a b; do
	i=0
	while ! "$BUILD/bin/edgelmctl" --socket "ipc://$T/$s.sock" health >/dev/null 2>&1 &&
		[ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
	if "$BUILD/bin/edgelmctl" --socket "ipc://$T/$s.sock" health >/dev/null 2>&1; then ok
	else ko "nothing serves $s.sock"; fi
done
kill -TERM $dpid; wait $dpid || ko "daemon exit status $?"

# model paths that cannot be served
: >"$T/empty.gguf"
mkfifo "$T/fifo.gguf"
for c in "$T/missing.gguf|No such file or directory" "$T/empty.gguf|the file is empty" \
	"$T|a directory" "/dev/zero|not a regular file" "$T/fifo.gguf|not a regular file"; do
	path=${c%%|*}; why=${c#*|}
	msg=$(timeout 20 $D --model "$path" 2>&1); rc=$?
	if [ $rc -eq 2 ]; then ok; else ko "$path: exit status $rc"; fi
	case $msg in
	*"cannot read model $path: $why"*) ok ;;
	*) ko "$path: $msg" ;;
	esac
	case $msg in *Success*) ko "$path: says Success: $msg" ;; *) ok ;; esac
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
