#!/bin/sh
# Issue 24, the HTTP front, against a real edgelmd with http_listen and API
# keys (docs/http.md):
# - curl: /health, /v1/models, auth (401, a key per identity), 404/405,
#   SSE framing (data: lines, blank-line separated, [DONE] last, usage
#   chunk with include_usage), greedy text equal to the nng socket's,
#   the page (self-contained: no http(s) URL in it);
# - a client that disconnects mid-stream or mid-request: its sequence is
#   freed (edgelm_sequences_running back to 0, the log says cancelled);
# - queue_full as 429 with Retry-After; SIGTERM with an HTTP stream
#   running: the stream completes and the daemon exits 0;
# - real clients (tests/http/): the official openai SDK, hostile HTTP
#   (malformed, huge, slowloris, 1000 rapid connects) beside a stream that
#   must come out undisturbed, and the page in Debian's Chromium and
#   Firefox (firefox-esr, over WebDriver BiDi with puppeteer-core). Those
#   need node and `npm ci` in tests/http (the npm registry); without them
#   they SKIP and say why, unless EDGELM_REQUIRE_HTTP_CLIENTS=1 (CI);
#   EDGELM_TEST_NO_NETWORK=1 (the package build) skips them too.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/daemon_http
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0; skip=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
sk() {
	if [ "${EDGELM_REQUIRE_HTTP_CLIENTS:-0}" = 1 ]; then
		ko "required: $*"
	else
		skip=$((skip + 1)); echo "SKIP $*" >&2
	fi
}
TOP=$(pwd)

# a model whose greedy text runs long (no early end of text) in a context
# long enough for the long generations below
"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny --vocab synthetic --ctx 4096 -o "$T/m.gguf" \
	2>/dev/null || ko "mkmodel"
KEY_A=sk-alice-0123456789abcdef
KEY_B=sk-bob-fedcba9876543210
printf '# test keys\nalice %s\nbob %s\n' "$KEY_A" "$KEY_B" >"$T/keys"
chmod 600 "$T/keys"
port=$((20000 + ($$ + 11) % 20000))
mport=$((port + 1))
H="http://127.0.0.1:$port"
SOCK="ipc://$T/d.sock"
CTL="$BUILD/bin/edgelmctl --socket $SOCK"
MAXCONN=16
RATE=50
"$BUILD/bin/edgelmd" --model "$T/m.gguf" --listen "$SOCK" --metrics-listen "127.0.0.1:$mport" \
	--set socket_group= --set tuning=false --threads 1 --set parallel=2 --set queue_size=1 \
	--set http_listen="127.0.0.1:$port" --set http_api_key_file="$T/keys" \
	--set http_max_connections=$MAXCONN --set http_rate_limit=$RATE \
	--set tenant_weights=http:alice=3,http:bob=1 --set watchdog_stall_ms=20 --set drain_timeout_ms=20000 --set monitor_interval_ms=200 \
	>"$T/daemon.log" 2>&1 &
dpid=$!
i=0; while ! curl -sf "$H/health" >/dev/null 2>&1 && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
A="Authorization: Bearer $KEY_A"
code() { curl -s -o "$T/body" -w '%{http_code}' "$@"; }
running() { curl -s "http://127.0.0.1:$mport/metrics" | sed -n 's/^edgelm_sequences_running \([0-9.]*\)$/\1/p'; }
settles() { # $1: what
	n=0
	while [ "$(running)" != 0 ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
	if [ "$(running)" = 0 ]; then ok; else ko "$1: edgelm_sequences_running stays $(running)"; fi
}

# ---- basics
[ "$(code "$H/health")" = 200 ] && grep -q '"status":"ok"' "$T/body" && ok || ko "/health: $(cat "$T/body")"
[ "$(code "$H/v1/models")" = 401 ] && grep -q '"invalid_api_key"' "$T/body" && ok || ko "no key: $(cat "$T/body")"
[ "$(code -H "Authorization: Bearer sk-wrong-key-000" "$H/v1/models")" = 401 ] && ok || ko "wrong key accepted"
[ "$(code -H "$A" "$H/v1/models")" = 200 ] && grep -q '"id":"m.gguf"' "$T/body" && ok || ko "/v1/models: $(cat "$T/body")"
[ "$(code -H "$A" "$H/v1/nothing")" = 404 ] && grep -q '"error"' "$T/body" && ok || ko "404: $(cat "$T/body")"
[ "$(code -H "$A" "$H/v1/completions")" = 405 ] && ok || ko "GET completions: not 405"
[ "$(code "$H/")" = 200 ] && grep -q '<title>edgelm</title>' "$T/body" && ok || ko "the page"
if grep -Eq '(src|href)="(https?:)?//' "$T/body"; then ko "the page loads something from elsewhere"; else ok; fi
[ "$(code -X OPTIONS "$H/v1/models")" = 405 ] && ok || ko "OPTIONS without CORS configured"
curl -s -D "$T/hdr" -o /dev/null -H "$A" "$H/v1/models"
if grep -qi '^Access-Control' "$T/hdr"; then ko "CORS headers without http_cors_origin"; else ok; fi

# ---- greedy text: HTTP equals the socket (decoded: the two JSON encoders
# escape control characters differently)
$CTL --json generate --no-stream --temp 0 -n 20 "Once upon a time" >"$T/nng.json" || ko "socket generate"
curl -s -H "$A" "$H/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":20,"temperature":0}' >"$T/c.json"
if command -v node >/dev/null 2>&1; then
	node -e 'const fs=require("fs");const a=JSON.parse(fs.readFileSync(process.argv[1])),b=JSON.parse(fs.readFileSync(process.argv[2]));
		process.exit(a.text.length>0&&a.text===b.choices[0].text?0:1)' "$T/nng.json" "$T/c.json" && ok ||
		ko "HTTP text != the socket's: $(cat "$T/c.json") vs $(cat "$T/nng.json")"
else
	sk "node not installed: greedy text over HTTP not compared with the socket's here"
fi

# ---- logit_bias: every token of the greedy answer banned; the daemon's
# answer over HTTP equals edgelm-run's with the same bans, which contains
# none of them
RUN="$BUILD/bin/edgelm-run -m $T/m.gguf -p Once_upon -n 12 --temp 0 -q"
ids=$($RUN --json | sed -n 's/^{"id":\([0-9]*\),.*/\1/p' | sort -un | tr '\n' ' ')
bias=""; flags=""
for i in $ids; do bias="$bias${bias:+,}\"$i\":-100"; flags="$flags --logit-bias $i=-100"; done
curl -s -H "$A" "$H/v1/completions" -d '{"prompt":"Once_upon","max_tokens":12,"temperature":0,"logit_bias":{'"$bias"'}}' >"$T/lb.json"
$RUN $flags --json >"$T/lb.run"
banned=0
for i in $(sed -n 's/^{"id":\([0-9]*\),.*/\1/p' "$T/lb.run"); do
	case " $ids " in *" $i "*) banned=$((banned + 1)) ;; esac
done
[ -n "$ids" ] && [ $banned -eq 0 ] && [ "$(wc -l <"$T/lb.run")" -eq 12 ] && ok ||
	ko "edgelm-run --logit-bias: $banned banned tokens came out of 12 ($ids)"
if command -v node >/dev/null 2>&1; then
	node -e 'const fs=require("fs");const h=JSON.parse(fs.readFileSync(process.argv[1]));
		const r=fs.readFileSync(process.argv[2],"utf8").trim().split("\n").map(l=>JSON.parse(l).text).join("");
		process.exit(h.choices&&h.choices[0].text===r?0:1)' "$T/lb.json" "$T/lb.run" && ok ||
		ko "logit_bias over HTTP != edgelm-run's: $(cat "$T/lb.json")"
fi
[ "$(code -H "$A" "$H/v1/completions" -d '{"prompt":"a","logit_bias":{"999999":-100}}')" = 400 ] &&
	grep -q '"param":"logit_bias"' "$T/body" && ok || ko "an id outside the vocabulary: $(cat "$T/body")"

# ---- embeddings: OpenAI's list, the socket's vectors (the same floats,
# written with different digits: compared as numbers)
$CTL --json embed "Once upon a time" "a cat" >"$T/emb.nng" || ko "socket embed"
[ "$(code -H "$A" "$H/v1/embeddings" -d '{"model":"m.gguf","input":["Once upon a time","a cat"]}')" = 200 ] &&
	grep -q '^{"object":"list","data":\[{"object":"embedding","index":0,"embedding":\[' "$T/body" &&
	grep -q '"model":"m.gguf","usage":{"prompt_tokens":[1-9][0-9]*,"total_tokens":' "$T/body" && ok ||
	ko "/v1/embeddings: $(head -c 300 "$T/body")"
v_http=$(sed -n 's/.*"index":1,"embedding":\[\([^]]*\)\].*/\1/p' "$T/body")
v_nng=$(sed -n 's/.*"embedding":\[\([^]]*\)\]}\]}$/\1/p' "$T/emb.nng")
echo "$v_http" | tr , '\n' >"$T/emb.h"; echo "$v_nng" | tr , '\n' >"$T/emb.n"
[ -n "$v_http" ] && [ "$(wc -l <"$T/emb.h")" -eq "$(wc -l <"$T/emb.n")" ] &&
	paste -d' ' "$T/emb.h" "$T/emb.n" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > 1e-8) bad = 1 } END { exit bad }' &&
	ok || ko "HTTP embedding != the socket's: $v_http vs $v_nng"
[ "$(code -H "$A" "$H/v1/embeddings" -d '{"input":"a cat","encoding_format":"base64"}')" = 200 ] &&
	grep -q '"embedding":"[A-Za-z0-9+/]*=*"' "$T/body" && ok || ko "base64 embedding: $(head -c 200 "$T/body")"
[ "$(code -H "$A" "$H/v1/embeddings" -d '{"input":""}')" = 400 ] && grep -q '"param":"input"' "$T/body" &&
	ok || ko "empty embedding input: $(cat "$T/body")"
[ "$(code -H "$A" "$H/v1/embeddings" -d '{"input":[1,2]}')" = 400 ] && ok || ko "token ids: $(cat "$T/body")"
[ "$(code -H "$A" -X POST "$H/v1/embeddings")" = 400 ] && ok || ko "no body: $(cat "$T/body")"
[ "$(code -H "$A" "$H/v1/embeddings" -X GET)" = 405 ] && ok || ko "GET embeddings: not 405"

# ---- SSE framing
curl -sN -H "$A" "$H/v1/chat/completions" \
	-d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":12,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}' \
	-D "$T/sse.hdr" >"$T/sse.txt"
grep -qi '^Content-Type: text/event-stream' "$T/sse.hdr" && ok || ko "SSE content type: $(cat "$T/sse.hdr")"
# every non-empty line is a data: line, events are separated by one blank line
if grep -v '^$' "$T/sse.txt" | grep -vq '^data: '; then ko "a line that is not data:"; else ok; fi
[ "$(tail -c 14 "$T/sse.txt" | od -An -c | tr -d ' \n')" = 'data:[DONE]\n\n' ] && ok || ko "not ending with data: [DONE] and a blank line"
if awk 'NR % 2 == 0 && $0 != "" { bad = 1 } END { exit bad }' "$T/sse.txt"; then ok; else ko "events not separated by single blank lines"; fi
grep -q '"delta":{"role":"assistant","content":""}' "$T/sse.txt" && ok || ko "no role chunk first"
grep -q '"choices":\[\],"usage":{"prompt_tokens":' "$T/sse.txt" && ok || ko "no usage chunk"
[ "$(grep -c '"finish_reason":"length"' "$T/sse.txt")" = 1 ] && ok || ko "finish_reason chunks: $(grep -c finish_reason\":\"length "$T/sse.txt")"

# ---- a disconnect mid-stream frees the sequence at once
curl -sN -H "$A" "$H/v1/completions" -d '{"prompt":"__edgelm_test_stall__ long","max_tokens":4000,"temperature":0,"stream":true}' >"$T/cut.txt" &
cpid=$!
n=0; while [ "$(running)" != 1 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
[ "$(running)" = 1 ] && ok || ko "the stream did not start"
sleep 0.3
kill $cpid; wait $cpid 2>/dev/null
settles "disconnect mid-stream"
grep -q "finished: cancelled" "$T/daemon.log" && ok || ko "the log has no cancelled generation"
[ -s "$T/cut.txt" ] && ok || ko "no text before the disconnect"

# ---- and mid-request, not streaming
curl -s -H "$A" "$H/v1/completions" -d '{"prompt":"__edgelm_test_stall__ long","max_tokens":4000,"temperature":0}' >/dev/null &
cpid=$!
n=0; while [ "$(running)" != 1 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
kill $cpid; wait $cpid 2>/dev/null
settles "disconnect mid-request"
[ "$(grep -c "finished: cancelled" "$T/daemon.log")" -ge 2 ] && ok || ko "the non-streaming disconnect did not cancel"

# ---- queue_full: 429 with Retry-After (2 slots running, then a queue of 1).
# The two first arrive together and both run: requests a free slot will
# take are not counted against queue_size (a burst into an idle daemon
# was refused before).
# curl itself in the background (not a function's subshell), so kill reaches it
body='{"prompt":"__edgelm_test_stall__ q","max_tokens":300,"temperature":0}'
curl -s -H "$A" "$H/v1/completions" -d "$body" >/dev/null & q1=$!
curl -s -H "$A" "$H/v1/completions" -d "$body" >/dev/null & q2=$!
n=0; while [ "$(running)" != 2 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
curl -s -H "$A" "$H/v1/completions" -d "$body" >/dev/null & q3=$!
sleep 0.5
st=$(curl -s -D "$T/q.hdr" -o "$T/q.body" -w '%{http_code}' -H "$A" "$H/v1/completions" -d '{"prompt":"one more","max_tokens":4}')
[ "$st" = 429 ] && grep -qi '^Retry-After: [0-9]' "$T/q.hdr" && grep -q '"queue_full"' "$T/q.body" && ok ||
	ko "queue full: $st $(cat "$T/q.body")"
kill $q1 $q2 $q3 2>/dev/null; wait $q1 $q2 $q3 2>/dev/null
settles "after the queue test"

# ---- real clients
NPMDIR=$TOP/$BUILD/tests/http
clients=no
if [ "${EDGELM_TEST_NO_NETWORK:-0}" = 1 ]; then
	sk "EDGELM_TEST_NO_NETWORK is set (a package build): the npm clients were not fetched"
elif ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	sk "node and npm not installed: the openai SDK, hostile and browser tests did not run"
else
	mkdir -p "$NPMDIR"
	cp tests/http/package.json tests/http/package-lock.json tests/http/*.mjs "$NPMDIR/"
	if [ -d "$NPMDIR/node_modules/openai" ] && [ -d "$NPMDIR/node_modules/playwright-core" ] &&
		[ -d "$NPMDIR/node_modules/puppeteer-core" ] ||
		(cd "$NPMDIR" && npm ci --no-audit --no-fund --loglevel=error >"$T/npm.log" 2>&1); then
		clients=yes
	else
		sk "npm ci in tests/http failed (no npm registry?): $(tail -2 "$T/npm.log")"
	fi
fi
run_node() { # $1: script; the environment is set by the caller
	out=$(cd "$NPMDIR" && node "$1" 2>&1)
	echo "$out" | grep FAIL >&2
	line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -1)
	if [ -n "$line" ]; then
		pass=$((pass + ${line%% passed*}))
		f=${line#*passed, }; fail=$((fail + ${f%% failed}))
	else
		ko "$1 did not finish: $(echo "$out" | tail -5)"
	fi
}
if [ $clients = yes ]; then
	export EDGELM_HTTP=$H EDGELM_KEY=$KEY_B EDGELM_CTL=$TOP/$BUILD/bin/edgelmctl EDGELM_SOCK=$SOCK \
		EDGELM_METRICS="http://127.0.0.1:$mport/metrics" EDGELM_HTTP_MAXCONN=$MAXCONN \
		EDGELM_HTTP_RATE=$RATE
	run_node openai_sdk.mjs
	settles "after the SDK tests"
	# as JSON: $(...) would strip a trailing newline of the text
	EDGELM_EXPECT_JSON=$($CTL --json generate --no-stream --temp 0 -n 150 "__edgelm_test_stall__ Once upon a time" |
		node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.stringify(JSON.parse(s).text)))')
	export EDGELM_EXPECT_JSON
	run_node hostile.mjs
	# both browsers' answer: the socket's greedy chat text
	EDGELM_EXPECT_JSON=$(echo "Hello there" | $CTL --json chat --temp 0 -n 16 |
		node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.stringify(JSON.parse(s.trim().split("\n").pop()).text)))')
	export EDGELM_EXPECT_JSON
	CHROMIUM=${EDGELM_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
	if [ -z "$CHROMIUM" ]; then
		sk "chromium not installed (Debian's package chromium): the page was not tested in a browser"
	else
		export EDGELM_CHROMIUM=$CHROMIUM
		run_node page.mjs
	fi
	FIREFOX=${EDGELM_FIREFOX:-$(command -v firefox-esr || command -v firefox || true)}
	if [ -z "$FIREFOX" ]; then
		sk "firefox not installed (Debian's package firefox-esr): the page was not tested in Firefox"
	else
		export EDGELM_FIREFOX=$FIREFOX
		run_node page_firefox.mjs
	fi
	settles "after the clients"
fi

# ---- identities: an HTTP key is its own identity, which the socket's
# uid does not own (its cancel finds nothing), and tenant_weights names it
curl -sN -H "$A" "$H/v1/completions" -d '{"prompt":"__edgelm_test_stall__ owned","max_tokens":4000,"temperature":0,"stream":true}' >/dev/null &
cpid=$!
n=0; while [ "$(running)" != 1 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
hid=$(sed -n 's/.*\[\(h-[0-9a-f]*\)\] generate queued.*/\1/p' "$T/daemon.log" | tail -1)
$CTL cancel "$hid" >"$T/cancel.out" 2>&1; st=$?
[ -n "$hid" ] && [ $st -eq 2 ] && grep -q not_found "$T/cancel.out" && ok || ko "the socket's caller cancelled HTTP generation '$hid': exit $st $(cat "$T/cancel.out")"
[ "$(running)" = 1 ] && ok || ko "the HTTP generation did not survive another identity's cancel"
kill $cpid; wait $cpid 2>/dev/null
settles "after the identity test"
grep -q "tenant_weights" "$T/daemon.log" && ko "tenant_weights http:alice refused" || ok

# ---- a busy http_listen port stops the start (exit 3, an err line naming it)
"$BUILD/bin/edgelmd" --model "$T/m.gguf" --listen "ipc://$T/d2.sock" --metrics-listen off \
	--set socket_group= --set tuning=false --threads 1 --set http_listen="127.0.0.1:$port" \
	>"$T/busy.log" 2>&1
rc=$?
[ $rc -eq 3 ] && grep -q "err.*http: cannot listen on 127.0.0.1:$port" "$T/busy.log" && ok ||
	ko "busy HTTP port: exit $rc: $(cat "$T/busy.log")"

# ---- SIGTERM with an HTTP stream running: it completes, exit 0
curl -sN -H "$A" "$H/v1/completions" -d '{"prompt":"__edgelm_test_stall__ drain","max_tokens":60,"temperature":0,"stream":true}' >"$T/drain.txt" &
cpid=$!
n=0; while [ "$(running)" != 1 ] && [ $n -lt 100 ]; do sleep 0.05; n=$((n + 1)); done
kill -TERM $dpid
sleep 0.2
[ "$(code -H "$A" "$H/v1/completions" -d '{"prompt":"late","max_tokens":2}')" = 503 ] && ok || ko "a new request while draining: not 503"
wait $cpid
tail -c 14 "$T/drain.txt" | grep -q 'data: \[DONE\]' && grep -q '"finish_reason":"length"' "$T/drain.txt" && ok ||
	ko "the stream did not complete across SIGTERM: $(tail -c 300 "$T/drain.txt")"
wait $dpid; rc=$?
[ $rc -eq 0 ] && ok || ko "daemon exit $rc: $(tail -5 "$T/daemon.log")"

echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
