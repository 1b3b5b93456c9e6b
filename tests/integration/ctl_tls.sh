#!/bin/sh
# Issue 26, TLS end to end: edgelmctl against edgelmd on tls+tcp://
# (stories260K). With the right CA, host name and client certificate a
# request goes through; a daemon whose certificate names another host, a
# CA the client does not trust, and no client certificate for a daemon
# that requires one are refused (exit 3, a message that says why). Skipped
# while the daemon refuses tls+tcp:// listeners, and without openssl.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/ctl_tls
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
skip() { echo "SKIP ctl_tls: $*" >&2; echo "$pass passed, $fail failed, 1 skipped"; exit 0; }

MODEL="${EDGELM_TESTDATA:-../shared}/models/stories260K-f32.gguf"
[ -r "$MODEL" ] || skip "no $MODEL"
command -v openssl >/dev/null || skip "no openssl"
# certificates made here, never kept in the tree
(
	set -e; cd "$T"
	key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
	ca() { key "$1"; openssl req -x509 -new -key "$1.key" -out "$1.crt" -subj "/CN=$1" -days 2; }
	leaf() {
		key "$1"; openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
		printf 'subjectAltName=DNS:%s\n' "$2" >"$1.ext"
		openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
			-days 2 -extfile "$1.ext"
	}
	ca ca; ca other-ca; leaf srv localhost; leaf wrong otherhost; leaf client client1
) >/dev/null 2>&1 || skip "openssl could not make the certificates"

CTL="$BUILD/bin/edgelmctl"
p1=$((20000 + ($$ + 11) % 20000)); p2=$((p1 + 1))
pids=""
start() { # NAME PORT CERT
	"$BUILD/bin/edgelmd" --model "$MODEL" --listen "tls+tcp://127.0.0.1:$2" --set socket_group= \
		--set tuning=false --set metrics_listen=off --threads 1 \
		--set "tls_cert_file=$T/$3.crt" --set "tls_key_file=$T/$3.key" \
		--set "tls_ca_file=$T/ca.crt" >"$T/$1.log" 2>&1 &
	pids="$pids $!"
}
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
start good "$p1" srv
start wrong "$p2" wrong
TLS="--tls-ca $T/ca.crt --tls-cert $T/client.crt --tls-key $T/client.key"
n=0
while ! $CTL -s "tls+tcp://localhost:$p1" $TLS health >/dev/null 2>&1 && [ $n -lt 100 ]; do
	if ! kill -0 ${pids% *} 2>/dev/null; then break; fi
	sleep 0.1; n=$((n + 1))
done
if ! $CTL -s "tls+tcp://localhost:$p1" $TLS health >/dev/null 2>&1; then
	grep -qi "tls" "$T/good.log" && skip "the daemon has no tls+tcp:// listener: $(head -c 300 "$T/good.log")"
	ko "no TLS daemon: $(head -c 500 "$T/good.log")"
fi

out=$($CTL -s "tls+tcp://localhost:$p1" $TLS generate --temp 0 -n 8 "Once" 2>&1)
if [ $? -eq 0 ]; then ok; else ko "generate over TLS: $out"; fi

out=$($CTL -s "tls+tcp://localhost:$p2" $TLS health 2>&1)
rc=$?
if [ $rc -eq 3 ] && echo "$out" | grep -q certificate; then ok; else ko "wrong host name: exit $rc: $out"; fi

out=$($CTL -s "tls+tcp://localhost:$p1" --tls-ca "$T/other-ca.crt" --tls-cert "$T/client.crt" \
	--tls-key "$T/client.key" health 2>&1)
rc=$?
if [ $rc -eq 3 ] && echo "$out" | grep -q certificate; then ok; else ko "untrusted CA: exit $rc: $out"; fi

out=$($CTL -s "tls+tcp://localhost:$p1" --tls-ca "$T/ca.crt" --timeout 3000 health 2>&1)
rc=$?
if [ $rc -ne 0 ]; then ok; else ko "no client certificate, accepted: $out"; fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
