#!/bin/sh
# Issue 26, a fleet: three edgelmd on three "boxes" (network namespaces on a
# bridge, 10.77.0.1-3; the client on 10.77.0.10), each on its own
# tls+tcp:// address with mutual TLS, certificates made here with openssl
# (docs/fleet.md):
# - load spread: edgelmctl with the three as --socket endpoints; every
#   daemon serves some of the requests (their edgelm_requests_total);
# - one daemon killed (SIGKILL) while requests run: every request completes
#   (a failed one is retried, and the retry lands on a live daemon);
# - refused: a client certificate from another CA, no client certificate,
#   an expired client certificate, a server certificate for another name;
# - a stream belongs to its owner's certificate: alice's stream is
#   not_found for bob (poll, cancel), alice polls and cancels it;
# - edgelm-bench --daemon over TLS, with --compare;
# - a box's certificate rotated in place (mv, SIGHUP): new connections
#   see the new one.
# Needs root and CAP_NET_ADMIN (ip netns), openssl and the stories260K
# model; without them it says SKIP and why.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/fleet
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
sk() { skip=$((skip + 1)); echo "SKIP $*" >&2; }
finish() {
	echo "$pass passed, $fail failed, $skip skipped"
	[ $fail -eq 0 ]
	exit
}

MODEL=${EDGELM_TESTDATA:-}/models/stories260K-f32.gguf
if [ ! -r "$MODEL" ]; then
	sk "fleet: no model at $MODEL (EDGELM_TESTDATA)"
	finish
fi
if ! command -v openssl >/dev/null 2>&1; then
	sk "fleet: openssl not installed, no certificates can be made"
	finish
fi
CALL=$BUILD/tests/integration/fleet_call
[ -x "$CALL" ] || { ko "$CALL not built"; finish; }

# ---- the network: a hub namespace holding a bridge, one namespace per box
N=efl$$ # namespace prefix: unique per run
BOXES="d1 d2 d3 c"
pids=""
cleanup() {
	for p in $pids; do kill -KILL "$p" 2>/dev/null; done
	for p in $pids; do wait "$p" 2>/dev/null; done
	for b in hub $BOXES; do ip netns del "$N$b" 2>/dev/null; done
}
if ! ip netns add "${N}hub" 2>"$T/netns.err"; then
	sk "fleet: ip netns unavailable ($(head -n 1 "$T/netns.err"); needs root and CAP_NET_ADMIN)"
	finish
fi
trap cleanup EXIT
trap 'exit 130' INT TERM HUP PIPE
addr() { # box -> its address
	case $1 in d1) echo 10.77.0.1 ;; d2) echo 10.77.0.2 ;; d3) echo 10.77.0.3 ;; c) echo 10.77.0.10 ;; esac
}
net_ok=true
ip -n "${N}hub" link add br0 type bridge && ip -n "${N}hub" link set br0 up || net_ok=false
for b in $BOXES; do
	ip netns add "$N$b" &&
		ip -n "${N}hub" link add "v$b" type veth peer name eth0 netns "$N$b" &&
		ip -n "${N}hub" link set "v$b" master br0 up &&
		ip -n "$N$b" addr add "$(addr $b)/24" dev eth0 &&
		ip -n "$N$b" link set eth0 up &&
		ip -n "$N$b" link set lo up || net_ok=false
done
# the box with the wrongly named certificate: a second address of d1
ip -n "${N}d1" addr add 10.77.0.4/24 dev eth0 || net_ok=false
if ! $net_ok; then
	sk "fleet: cannot build the namespaces' network (veth, bridge)"
	finish
fi
on() { b=$1; shift; ip netns exec "$N$b" "$@"; }

# ---- certificates: a CA, server certificates naming each box's address
# (as a DNS name too: mbedtls 2.28, Debian 12's, matches dNSName and CN
# only), client certificates whose CN is the identity; for the refusals a
# client of another CA, an expired client and a server named otherwise
P=$T/pki
mkdir -p "$P"
ossl() { openssl "$@" >>"$P/openssl.log" 2>&1 || ko "openssl $1 ${2:-}: $(tail -n 3 "$P/openssl.log")"; }
newkey() { ossl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$P/$1.key"; }
mkca() { # name
	newkey "$1"
	ossl req -x509 -new -key "$P/$1.key" -subj "/CN=edgelm test $1" -days 2 -out "$P/$1.crt" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
mkcert() { # name CN ca extensions...
	name=$1 cn=$2 ca=$3
	shift 3
	newkey "$name"
	ossl req -new -key "$P/$name.key" -subj "/CN=$cn" -out "$P/$name.csr"
	printf '%s\n' "$@" >"$P/$name.ext"
	ossl x509 -req -in "$P/$name.csr" -CA "$P/$ca.crt" -CAkey "$P/$ca.key" -CAcreateserial \
		-days 2 -extfile "$P/$name.ext" -out "$P/$name.crt"
}
server_ext() { # name...
	san=""
	for n in "$@"; do
		san="$san${san:+,}DNS:$n"
		case $n in *[!0-9.]*) ;; *) san="$san,IP:$n" ;; esac
	done
	echo "subjectAltName=$san"; echo "extendedKeyUsage=serverAuth"
	echo "keyUsage=critical,digitalSignature"
}
mkca ca
mkca otherca
for b in d1 d2 d3; do
	mkcert "$b" "$(addr $b)" ca $(server_ext "$(addr $b)")
done
mkcert wrong box9.invalid ca $(server_ext box9.invalid)
for u in alice bob; do
	mkcert "$u" "$u" ca "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature"
done
mkcert mallory alice otherca "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature"
# expired: valid for one day in 2020 (openssl ca takes dates; x509 -req cannot)
newkey carol
ossl req -new -key "$P/carol.key" -subj /CN=carol -out "$P/carol.csr"
: >"$P/index.txt"; echo 1000 >"$P/serial"
cat >"$P/ca.cnf" <<EOF
[ ca ]
default_ca = test
[ test ]
database = $P/index.txt
new_certs_dir = $P
serial = $P/serial
default_md = sha256
policy = any
[ any ]
commonName = supplied
[ client ]
extendedKeyUsage = clientAuth
keyUsage = critical,digitalSignature
EOF
ossl ca -batch -config "$P/ca.cnf" -cert "$P/ca.crt" -keyfile "$P/ca.key" -in "$P/carol.csr" \
	-extensions client -startdate 20200101000000Z -enddate 20200102000000Z -notext -out "$P/carol.crt"
chmod 600 "$P"/*.key

# ---- the daemons: one per box; the fourth serves d1's namespace on a
# second address with the wrongly named certificate
PORT=5555
daemon() { # box address cert
	b=$1 a=$2 crt=$3
	# ip netns exec execs edgelmd: $! is the daemon (a shell function
	# run with & would be a subshell, and the signals would miss it)
	ip netns exec "$N$b" "$BUILD/bin/edgelmd" --model "$MODEL" --listen "tls+tcp://$a:$PORT" \
		--metrics-listen "127.0.0.1:$((9477 + ${4:-0}))" --set socket_group= --set tuning=false \
		--threads 1 --set ctx_size=512 --set parallel=4 --set queue_size=64 \
		--set drain_timeout_ms=1000 --set stream_idle_ms=5000 --set monitor_interval_ms=200 \
		--set tls_cert_file="$P/$crt.crt" --set tls_key_file="$P/$crt.key" \
		--set tls_ca_file="$P/ca.crt" --set tenant_weights=tls:alice=3,tls:bob=1 \
		>"$T/$crt.log" 2>&1 &
	pids="$pids $!"
	eval "pid_$crt=$!"
}
daemon d1 10.77.0.1 d1
daemon d2 10.77.0.2 d2
daemon d3 10.77.0.3 d3
daemon d1 10.77.0.4 wrong 1
URL1=tls+tcp://10.77.0.1:$PORT URL2=tls+tcp://10.77.0.2:$PORT URL3=tls+tcp://10.77.0.3:$PORT
# edgelmctl on the client box as an identity: with --tls-cert/--tls-key/
# --tls-ca and the endpoints as repeated --socket where this edgelmctl has
# them, else through the library's EDGELM_TLS_* and a comma-separated list
if "$BUILD/bin/edgelmctl" --help 2>&1 | grep -q -- --tls-cert; then TLS_FLAGS=1; else TLS_FLAGS=0; fi
ctl_tls() { # cert key ca (each may be "-": none), edgelmctl args...
	cert=$1 key=$2 ca=$3
	shift 3
	[ "$cert" = - ] && cert="" && key=""
	[ "$ca" = - ] && ca=""
	if [ $TLS_FLAGS = 1 ]; then
		on c timeout 60 "$BUILD/bin/edgelmctl" ${cert:+--tls-cert "$cert"} ${key:+--tls-key "$key"} \
			${ca:+--tls-ca "$ca"} "$@"
	else
		on c env -u EDGELM_SOCKET EDGELM_TLS_CERT="$cert" EDGELM_TLS_KEY="$key" EDGELM_TLS_CA="$ca" \
			timeout 60 "$BUILD/bin/edgelmctl" "$@"
	fi
}
ctl() { # identity, edgelmctl args...
	who=$1
	shift
	ctl_tls "$P/$who.crt" "$P/$who.key" "$P/ca.crt" "$@"
}
as() { # identity: fleet_call's TLS options
	echo "--tls-cert $P/$1.crt --tls-key $P/$1.key --tls-ca $P/ca.crt"
}
for d in 1 2 3; do
	eval "u=\$URL$d"
	i=0
	while ! ctl alice --socket "$u" health >/dev/null 2>&1 && [ $i -lt 150 ]; do
		sleep 0.1; i=$((i + 1))
	done
	if ctl alice --socket "$u" health >/dev/null 2>"$T/health.err"; then
		ok
	else
		ko "d$d not serving $u: $(cat "$T/health.err"; tail -n 5 "$T/d$d.log")"
	fi
done
if grep -q 'warning.*unauthenticated' "$T/d1.log"; then
	ko "d1 (mutual TLS) warns it is unauthenticated: $(grep unauth "$T/d1.log")"
else
	ok
fi

# generate requests served by daemon box, by its metrics
served() { # box
	on "$1" curl -sf "http://127.0.0.1:9477/metrics" |
		sed -n 's/^edgelm_requests_total{op="generate",outcome="ok"} \([0-9]*\).*/\1/p'
}

workers=""
wait_workers() {
	for j in $workers; do wait "$j"; done
	workers=""
}

# ---- load spread: 24 requests from 6 clients at once, through all three
if [ $TLS_FLAGS = 1 ]; then
	ALL="--socket $URL1 --socket $URL2 --socket $URL3"
else
	ALL="--socket $URL1,$URL2,$URL3"
fi
for w in 1 2 3 4 5 6; do
	(
		for k in 1 2 3 4; do
			ctl alice $ALL generate --no-stream -n 24 --temp 0 "Once upon a time" \
				>/dev/null 2>>"$T/spread.err" && echo ok || echo failed
		done >"$T/spread.$w"
	) &
	workers="$workers $!"
done
wait_workers
n_ok=$(cat "$T"/spread.* | grep -c '^ok$')
[ "$n_ok" -eq 24 ] && ok || ko "spread: $n_ok of 24 requests succeeded: $(head -n 3 "$T/spread.err")"
s1=$(served d1) s2=$(served d2) s3=$(served d3)
echo "fleet: requests served d1=$s1 d2=$s2 d3=$s3" >&2
[ "${s1:-0}" -gt 0 ] && [ "${s2:-0}" -gt 0 ] && [ "${s3:-0}" -gt 0 ] && ok ||
	ko "spread: not every daemon served (d1=$s1 d2=$s2 d3=$s3)"
[ $((${s1:-0} + ${s2:-0} + ${s3:-0})) -eq 24 ] && ok ||
	ko "spread: the daemons served $((${s1:-0} + ${s2:-0} + ${s3:-0})) generations for 24 requests"

# ---- failover: d2 is killed once it has served some of 36 more requests;
# a request that fails (its daemon died under it) is retried, at most 3
# times; every request must complete
before=$(served d2)
for w in 1 2 3 4 5 6; do
	(
		for k in 1 2 3 4 5 6; do
			a=0
			while [ $a -lt 3 ]; do
				a=$((a + 1))
				if ctl bob $ALL generate --no-stream -n 400 --temp 0 "The little dog" \
					>/dev/null 2>>"$T/failover.err"; then
					echo "ok $a"
					break
				fi
			done
			[ $a -eq 3 ] && echo "failed"
		done >"$T/failover.$w"
	) &
	workers="$workers $!"
done
# then once a generation runs there (its gauge), so one dies with it
running() { # box
	on "$1" curl -sf "http://127.0.0.1:9477/metrics" | sed -n 's/^edgelm_sequences_running \([0-9]*\).*/\1/p'
}
i=0
while [ "$(served d2)" -lt $((before + 3)) ] 2>/dev/null && [ $i -lt 300 ]; do
	sleep 0.02; i=$((i + 1))
done
i=0
while [ "$(running d2)" = 0 ] && [ $i -lt 100 ]; do
	sleep 0.01; i=$((i + 1))
done
kill -KILL "$pid_d2"
wait "$pid_d2" 2>/dev/null
wait_workers
n_ok=$(cat "$T"/failover.* | grep -c '^ok ')
retried=$(cat "$T"/failover.* | grep -c '^ok [23]')
echo "fleet: after killing d2: $n_ok of 36 completed, $retried after a retry" >&2
[ "$n_ok" -eq 36 ] && ok || ko "failover: $n_ok of 36 requests completed: $(sort "$T/failover.err" | uniq -c | head -n 5)"
if grep -q "failed" "$T"/failover.*; then ko "failover: a request failed 3 times"; else ok; fi

# ---- edgelm-bench over the fleet: d1 alone against d1 and d3
on c env EDGELM_TLS_CERT="$P/alice.crt" EDGELM_TLS_KEY="$P/alice.key" EDGELM_TLS_CA="$P/ca.crt" \
	timeout 60 "$BUILD/bin/edgelm-bench" --daemon "$URL1" --compare "$URL1" --compare "$URL3" \
	--streams 2 -n 8 --reps 1 --json >"$T/bench.json" 2>&1
grep -q '"compare":"'"$URL1,$URL3"'".*"b_over_a":[0-9.]*,"a_latency_ms":[0-9.]*,"b_latency_ms"' \
	"$T/bench.json" && ok || ko "edgelm-bench --daemon --compare over TLS: $(cat "$T/bench.json")"
on c timeout 60 "$BUILD/bin/edgelm-bench" --daemon "$URL1" --tls-cert "$P/bob.crt" \
	--tls-key "$P/bob.key" --tls-ca "$P/ca.crt" --streams 1 -n 4 --long 0 --json >"$T/bench2.json" 2>&1 &&
	grep -q '"tok_s":[0-9]' "$T/bench2.json" && ok || ko "edgelm-bench --tls-cert: $(cat "$T/bench2.json")"

# ---- refusals: another CA's certificate, none, an expired one; a server
# certificate for another name
refused() { # what, cert key ca (or -), edgelmctl args...: exit 3, cannot connect
	what=$1
	shift
	ctl_tls "$@" health >"$T/refused.out" 2>&1
	rc=$?
	if [ $rc -eq 3 ] && grep -q "cannot connect" "$T/refused.out"; then
		ok
	else
		ko "$what: exit $rc, not 3 (cannot connect): $(cat "$T/refused.out")"
	fi
}
refused "a certificate from another CA" "$P/mallory.crt" "$P/mallory.key" "$P/ca.crt" \
	--timeout 5000 --socket "$URL1"
refused "no client certificate" - - "$P/ca.crt" --timeout 5000 --socket "$URL1"
refused "an expired client certificate" "$P/carol.crt" "$P/carol.key" "$P/ca.crt" \
	--timeout 5000 --socket "$URL1"
refused "a server certificate for box9.invalid at 10.77.0.4" "$P/alice.crt" "$P/alice.key" \
	"$P/ca.crt" --timeout 5000 --socket "tls+tcp://10.77.0.4:$PORT"
refused "a server certificate from a CA the client does not trust" "$P/alice.crt" \
	"$P/alice.key" "$P/otherca.crt" --timeout 5000 --socket "$URL1"
# the same daemon with a client that trusts the name it has: it serves
if on c timeout 30 "$CALL" --socket "tls+tcp://10.77.0.4:$PORT" --server-name box9.invalid \
	$(as alice) '{"v":1,"op":"health"}' >"$T/wrong.out" 2>&1; then
	ok
else
	ko "the box9.invalid daemon does not serve a client that expects that name: $(cat "$T/wrong.out")"
fi
# a plain tcp:// client cannot talk to a TLS listener
refused "a plain tcp:// client of a tls+tcp:// listener" - - - --timeout 3000 \
	--socket "tcp://10.77.0.1:$PORT"

# ---- a stream is its owner's: alice starts one on d1, bob can neither
# poll nor cancel it (not_found, as for an unknown id), alice can
call() { who=$1; shift; on c timeout 30 "$CALL" --socket "$URL1" $(as "$who") "$@"; }
call alice '{"v":1,"op":"generate","id":"s-alice","prompt":"Once upon a time","max_tokens":200,"stream":true}' \
	>"$T/s.start" 2>&1 && grep -q '"ok":true' "$T/s.start" && ok || ko "alice's stream: $(cat "$T/s.start")"
for op in poll cancel; do
	call bob "{\"v\":1,\"op\":\"$op\",\"id\":\"s-alice\"}" >"$T/s.bob" 2>&1
	grep -q '"code":"not_found"' "$T/s.bob" && ok || ko "bob's $op of alice's stream: $(cat "$T/s.bob")"
done
call alice '{"v":1,"op":"poll","id":"s-alice","ack":0,"wait_ms":0}' >"$T/s.poll" 2>&1
grep -q '"ok":true,"op":"poll"' "$T/s.poll" && ok || ko "alice's poll: $(cat "$T/s.poll")"
call alice '{"v":1,"op":"cancel","id":"s-alice"}' >"$T/s.cancel" 2>&1
grep -q '"ok":true' "$T/s.cancel" && ok || ko "alice's cancel: $(cat "$T/s.cancel")"
# with edgelmctl over TLS: bob's cancel of alice's id is not_found
call alice '{"v":1,"op":"generate","id":"s-alice2","prompt":"Once","max_tokens":200,"stream":true}' \
	>/dev/null 2>&1
if ctl bob --socket "$URL1" cancel s-alice2 >"$T/s.ctl" 2>&1; then
	ko "bob cancelled alice's stream with edgelmctl"
else
	grep -qi 'not.found' "$T/s.ctl" && ok || ko "bob's edgelmctl cancel: $(cat "$T/s.ctl")"
fi
ctl alice --socket "$URL1" cancel s-alice2 >"$T/s.ctl" 2>&1 && ok ||
	ko "alice's edgelmctl cancel: $(cat "$T/s.ctl")"

# ---- rotation in place: d1's certificate replaced by one of the other CA
# (mv over the old files) and SIGHUP; new connections get the new one, so
# a client that trusts only the first CA refuses d1, one that trusts the
# other CA is served (its own certificate still from the first CA)
mkcert d1new "$(addr d1)" otherca $(server_ext "$(addr d1)")
chmod 600 "$P/d1new.key"
mv "$P/d1new.key" "$P/d1.key" && mv "$P/d1new.crt" "$P/d1.crt"
kill -HUP "$pid_d1"
i=0
while ! grep -q "TLS certificates read again" "$T/d1.log" && [ $i -lt 100 ]; do
	sleep 0.05; i=$((i + 1))
done
grep -q "TLS certificates read again" "$T/d1.log" && ok || ko "d1's reload: $(tail -n 3 "$T/d1.log")"
refused "d1 after its rotation to the other CA" "$P/alice.crt" "$P/alice.key" "$P/ca.crt" \
	--timeout 5000 --socket "$URL1"
ctl_tls "$P/alice.crt" "$P/alice.key" "$P/otherca.crt" --socket "$URL1" health >"$T/rot.out" 2>&1 &&
	ok || ko "d1 after its rotation, with the other CA trusted: $(cat "$T/rot.out")"

# ---- the survivors stop cleanly
for b in d1 d3 wrong; do
	eval "p=\$pid_$b"
	kill -TERM "$p"; wait "$p"; rc=$?
	[ $rc -eq 0 ] && ok || ko "$b: exit $rc: $(tail -n 5 "$T/$b.log")"
done
pids=""
finish
