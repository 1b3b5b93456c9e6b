#!/bin/sh
# tests/integration/static_link.sh: a program links statically against
# libedgelm.a with nothing but `pkg-config --static --cflags --libs edgelm`
# and the built edgelm.pc (its libdir and includedir pointed at the build
# and at ipc/): every private library (jansson, nng and the mbedtls that
# Debian's libnng.a is built with) must come from the .pc. The program then
# runs: the version is the .pc's, a URL without a daemon gives
# EDGELM_E_CONNECT, and against edgelmd (tiny synthetic model) health is
# ready and a greedy generation returns text.
#
# Run from the top of the tree: sh tests/integration/static_link.sh
#   BUILD        build directory (default build)
#   CC           compiler (default cc)
#   TEST_TMPDIR  scratch space
# Ends with "N passed, N failed"; exits non-zero on failure.
set -u
BUILD=${BUILD:-build}
CC=${CC:-cc}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
T=${TEST_TMPDIR:-$(mktemp -d)}/static_link
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
finish() {
	echo "$pass passed, $fail failed"
	[ $fail -eq 0 ]
	exit $?
}

PC="$BUILD/ipc/edgelm.pc"
for f in "$PC" "$BUILD/ipc/libedgelm.a"; do
	[ -f "$f" ] || { ko "$f not built (make all)"; finish; }
done

# The .pc as built, found by PKG_CONFIG_PATH; only its locations redirected.
pc() {
	PKG_CONFIG_PATH="$BUILD/ipc" $PKG_CONFIG \
		--define-variable=libdir="$(pwd)/$BUILD/ipc" \
		--define-variable=includedir="$(pwd)/ipc" "$@" edgelm
}
flags=$(pc --static --cflags --libs) || { ko "pkg-config --static edgelm failed"; finish; }
ok

cat >"$T/app.c" <<'EOF'
#include <edgelm.h>
#include <stdio.h>
#include <string.h>

/* app [URL]: the version; without URL, connect where no daemon is; with
 * URL, health and a short greedy generation. */
int main(int argc, char **argv)
{
	struct edgelm_error err;
	edgelm_client *c = NULL;
	printf("version %s\n", edgelm_version());
	if (argc < 2) {
		int rc = edgelm_connect("ipc:///nonexistent/edgelm.sock", &c, &err);
		printf("connect %d\n", rc);
		edgelm_close(c);
		return rc == EDGELM_E_CONNECT ? 0 : 1;
	}
	if (edgelm_connect(argv[1], &c, &err) != 0) {
		fprintf(stderr, "connect: %s\n", err.message);
		return 1;
	}
	enum edgelm_health h;
	int rc = edgelm_health(c, &h, NULL, &err);
	printf("health %d %s\n", rc, rc == 0 && h == EDGELM_HEALTH_READY ? "ready" : "not ready");
	struct edgelm_params p;
	edgelm_params_init(&p);
	p.max_tokens = 4;
	p.temperature = 0;
	struct edgelm_result r;
	if (rc == 0)
		rc = edgelm_generate(c, "Once upon a time", &p, &r, &err);
	if (rc == 0) {
		printf("generated %zu bytes, finish %s\n", r.text_len, edgelm_finish_name(r.finish));
		rc = r.text_len > 0 ? 0 : 1;
		edgelm_result_free(&r);
	} else {
		fprintf(stderr, "edgelm: %d %s\n", rc, err.message);
	}
	edgelm_close(c);
	return rc == 0 ? 0 : 1;
}
EOF

# glibc warns that a static getaddrinfo (nng's resolver) needs its shared
# NSS modules at run time: expected, and not used for ipc://.
# shellcheck disable=SC2086 # $flags is a list of options
if $CC -static -o "$T/app" "$T/app.c" $flags >"$T/link.log" 2>&1; then
	ok
else
	ko "cc -static app.c \$(pkg-config --static --cflags --libs edgelm): $flags"
	sed 's/^/    /' "$T/link.log" | grep -v 'getaddrinfo' | tail -n 15 >&2
	finish
fi
if LC_ALL=C readelf -d "$T/app" 2>/dev/null | grep -q NEEDED; then
	ko "app is not static: $(LC_ALL=C readelf -d "$T/app" | grep NEEDED | tr -s ' ')"
else
	ok
fi

# Without the private libraries the link must fail: the test sees the .pc.
public=$(pc --cflags --libs)
# shellcheck disable=SC2086
if $CC -static -o "$T/app-nopriv" "$T/app.c" $public >/dev/null 2>&1; then
	ko "a static link without Libs.private/Requires.private succeeded: the test proves nothing"
else
	ok
fi

want=$(pc --modversion)
out=$("$T/app" 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qx "version $want" &&
	printf '%s\n' "$out" | grep -qx "connect -3"; then
	ok
else
	ko "app without a daemon: exit $rc, expected version $want and connect -3: $out"
fi

D="$BUILD/bin/edgelmd"
if [ ! -x "$D" ] || [ ! -x "$BUILD/bin/edgelm-gguf" ]; then
	ko "$D or edgelm-gguf not built"
	finish
fi
"$BUILD/bin/edgelm-gguf" mkmodel --shape tiny -o "$T/tiny.gguf" 2>/dev/null || ko mkmodel
URL="ipc://$T/d.sock"
"$D" --config /dev/null --model "$T/tiny.gguf" --metrics-listen off --set socket_group= \
	--set tuning=false --listen "$URL" >"$T/daemon.log" 2>&1 &
dpid=$!
i=0
while ! "$BUILD/bin/edgelmctl" --socket "$URL" health >/dev/null 2>&1 && [ $i -lt 200 ]; do
	sleep 0.05; i=$((i + 1))
done
out=$("$T/app" "$URL" 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -qx "health 0 ready" &&
	printf '%s\n' "$out" | grep -q "^generated [1-9]"; then
	ok
else
	ko "app against edgelmd: exit $rc: $out"
fi
kill -TERM $dpid
wait $dpid; drc=$?
if [ $drc -eq 0 ]; then ok; else ko "daemon exit status $drc: $(tail -n 5 "$T/daemon.log")"; fi

finish
