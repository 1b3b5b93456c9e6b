#!/bin/sh
# edgelmd's command line as an operator meets it:
# - --listen is repeatable: every URL given is served, not only the last;
# - a model path that cannot be served is named with the reason (the
#   errno, or what the path is), exit status 2, never "Success": missing,
#   empty, a directory, /dev/zero, a FIFO;
# - a fatal configuration error is logged at err priority;
# - under prlimit --as too small for nng's threads: a clear error, exit 3;
# - --check-config (ExecReload's guard) passes a good file and refuses a
#   bad one with the configuration's or the model's exit status.
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

# under an address-space limit too small for nng's threads the daemon says
# so and exits 3 (nng 1.5.2 itself segfaulted or hung there)
if command -v prlimit >/dev/null; then
	out=$(timeout 60 prlimit --as=$((180 * 1024 * 1024)) $D --model "$T/tiny.gguf" \
		--listen "ipc://$T/p.sock" 2>&1); rc=$?
	if [ $rc -eq 3 ]; then ok; else ko "prlimit --as 180 MiB: exit status $rc: $out"; fi
	case $out in *"nng cannot start"*"address space limit"*) ok ;; *) ko "prlimit: $out" ;; esac
fi

# --check-config, the unit's ExecReload guard: 0 for a good file, 1 for a
# bad key or value, 2 for a model it cannot read
printf 'model %s\nqueue_size 8\n' "$T/tiny.gguf" >"$T/good.conf"
printf 'model %s\nqueue_size 0\n' "$T/tiny.gguf" >"$T/bad.conf"
printf 'model %s\n' "$T/missing.gguf" >"$T/nomodel.conf"
C="$BUILD/bin/edgelmd --check-config --config"
out=$($C "$T/good.conf" 2>&1); rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "configuration OK"; then ok; else ko "good.conf: $rc $out"; fi
out=$($C "$T/bad.conf" 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q queue_size; then ok; else ko "bad.conf: $rc $out"; fi
out=$($C "$T/nomodel.conf" 2>&1); rc=$?
if [ $rc -eq 2 ] && echo "$out" | grep -q "No such file"; then ok; else ko "nomodel.conf: $rc $out"; fi
out=$($C /nonexistent.conf 2>&1); rc=$?
if [ $rc -eq 1 ]; then ok; else ko "missing file: $rc $out"; fi

# a fatal configuration error reaches the journal at err priority: under
# systemd (INVOCATION_ID) the line carries sd-daemon's <3> prefix
msg=$(INVOCATION_ID=test $D 2>&1); rc=$?
if [ $rc -eq 1 ]; then ok; else ko "no model: exit status $rc"; fi
case $msg in "<3>"*"no model"*) ok ;; *) ko "no model: '$msg' is not at err priority" ;; esac

# chat_template: a name edgelm knows, or refused before anything loads
out=$($D --set chat_template=jinja 2>&1); rc=$?
if [ $rc -eq 1 ] && echo "$out" | grep -q "'jinja' is not a chat format"; then ok; else ko "chat_template=jinja: $rc $out"; fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
