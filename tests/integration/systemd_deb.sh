#!/bin/bash
# tests/integration/systemd_deb.sh: the built .debs from install to purge,
# as an operator meets them, under a real systemd in a systemd-nspawn
# container (tests/integration/lib/nspawn.sh; docs/operations.md keeps a
# transcript):
#   1. `apt-get install ./*.deb` of edgelmd, edgelmctl, libedgelm0 (no
#      network: the container root holds the dependencies);
#   2. unconfigured: enabled, not started; a start fails once with the
#      reason at err priority in `systemctl status`, and does not restart;
#   3. configured (model, and a member of group edgelm): start, edgelmctl;
#   4. reload: a good change (0), a bad file (`systemctl reload` fails,
#      nothing changes, still serving), a model swap (info names the new
#      model, same MainPID);
#   5. upgrade to a rebuilt version (the same files, version +1): the
#      running daemon is restarted on it;
#   6. remove: stopped, its conffile kept; purge: nothing left but what
#      Debian policy keeps (the system user).
# Needs root, systemd-nspawn, nsenter, the cached root (`make check-systemd`
# builds it) and the .debs in $EDGELM_DEB_DIR (default build-deb, `make
# deb`); SKIPs without them. EDGELM_E2E_KEEP=1 keeps the scratch folder.
# Prints "N passed, N failed" like every test; with EDGELM_DEB_TRANSCRIPT=FILE
# also the commands run in the container and their key output.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -u
cd "$(dirname "$0")/../.." || exit 1

BUILD=${BUILD:-build}
DEBS=${EDGELM_DEB_DIR:-build-deb}
NAME=edgelm-deb-$$
TRANSCRIPT=${EDGELM_DEB_TRANSCRIPT:-}
# the report, ROOT and ROOT_PKGS (one cached root serves systemd_e2e.sh too)
. tests/integration/lib/nspawn.sh

nspawn_require
command -v dpkg-deb >/dev/null || skip_all "dpkg-deb missing"
deb_of() { ls "$DEBS"/"$1"_*.deb 2>/dev/null | head -n 1; }
for p in edgelmd edgelmctl libedgelm0; do
	[ -n "$(deb_of $p)" ] || skip_all "no $p .deb in $DEBS (\`make deb\` first)"
done
[ -x "$BUILD/bin/edgelm-gguf" ] || skip_all "$BUILD/bin/edgelm-gguf is not built"

nspawn_root_check "$ROOT_PKGS"

T=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/sddeb.XXXXXX")
HTTP_PORT=$((30000 + $$ % 20000))
APP=$T/app
mkdir -p "$APP"
for p in edgelmd edgelmctl libedgelm0; do cp "$(deb_of $p)" "$APP/"; done
for m in a b; do
	if ! out=$("$BUILD/bin/edgelm-gguf" mkmodel --shape tiny --vocab synthetic -o "$APP/tiny-$m.gguf" 2>&1); then
		bad "make the test models" "$out"
		finish
	fi
done
# the rebuilt version: the same package, its version one up
v1=$(dpkg-deb -f "$(deb_of edgelmd)" Version)
v2="$v1+rebuild1"
mkdir -p "$APP/up"
if ! out=$(dpkg-deb -R "$(deb_of edgelmd)" "$T/up" 2>&1 &&
	sed -i "s/^Version: .*/Version: $v2/" "$T/up/DEBIAN/control" &&
	dpkg-deb -b "$T/up" "$APP/up/edgelmd_${v2}.deb" 2>&1); then
	bad "rebuild edgelmd as $v2" "$out"
	finish
fi

trap nspawn_cleanup EXIT
nspawn_boot --bind-ro="$APP":/opt/debs
show() { E systemctl show -p "$1" --value edgelmd; }
jctl() { E journalctl --no-pager -u edgelmd "$@"; }
# run in the container; the transcript keeps the command and its output
C() {
	local out rc
	out=$(E sh -c "$1" 2>&1); rc=$?
	if [ -n "$TRANSCRIPT" ]; then
		{ printf '# %s\n' "$1"
		  [ -n "$out" ] && printf '%s\n' "$out" | grep -v -e '^(Reading database' -e '^debconf:' |
			tail -n "${2:-12}"
		  [ $rc -ne 0 ] && printf '(exit %d)\n' $rc; echo; } >>"$TRANSCRIPT"
	fi
	printf '%s' "$out"
	return $rc
}
[ -n "$TRANSCRIPT" ] && : >"$TRANSCRIPT"

# ---- 1. install -------------------------------------------------------------
out=$(C "apt-get install -y /opt/debs/edgelmd_*.deb /opt/debs/edgelmctl_*.deb /opt/debs/libedgelm0_*.deb" 6)
rc=$?
if [ $rc -eq 0 ] && E dpkg -s edgelmd >/dev/null 2>&1; then ok "apt-get install ./edgelmd ./edgelmctl ./libedgelm0"
else bad "apt-get install (exit $rc)" "$out"; finish; fi
E id edgelm >/dev/null 2>&1 && ok "system user edgelm" || bad "no user edgelm"
[ -f /proc/$L/root/etc/edgelm/edgelm.conf ] && ok "/etc/edgelm/edgelm.conf installed" ||
	bad "no /etc/edgelm/edgelm.conf"
for f in grafana/edgelm.json prometheus/edgelm-rules.yml prometheus/scrape-example.yml \
	prometheus/edgelm-fleet.yml prometheus/edgelm-fleet-targets.json; do
	[ -f /proc/$L/root/usr/share/edgelm/$f ] || bad "no /usr/share/edgelm/$f"
done
[ -f /proc/$L/root/usr/share/edgelm/grafana/edgelm.json ] && ok "dashboard and rules in /usr/share/edgelm"

# ---- 2. unconfigured ------------------------------------------------------------
en=$(E systemctl is-enabled edgelmd 2>&1)
[ "$en" = enabled ] && ok "enabled at install" || bad "is-enabled: $en"
[ "$(show ActiveState)" = inactive ] && ok "not started at install (no model yet)" ||
	bad "started at install: $(show ActiveState)/$(show SubState)"
C "systemctl start edgelmd" >/dev/null; rc=$?
sleep 5 # two RestartSec= periods: a restart loop would show
st=$(C "systemctl status --no-pager -n 5 edgelmd" 10)
if [ $rc -ne 0 ] && [ "$(show ActiveState)" = failed ] && [ "$(show NRestarts)" = 0 ]; then
	ok "unconfigured start fails once, no restart loop (status $(show ExecMainStatus))"
else
	bad "unconfigured start: rc $rc, $(show ActiveState), NRestarts $(show NRestarts)" "$st"
fi
printf '%s\n' "$st" | grep -q "no model" && ok "systemctl status shows why (no model)" ||
	bad "status does not say why" "$st"
E journalctl --no-pager -u edgelmd -p err | grep -q "no model" &&
	ok "the reason is at err priority" || bad "no err-priority line" "$(jctl -n 10)"

# ---- 3. configure, start ----------------------------------------------------------
C "install -m 0640 -g edgelm /opt/debs/tiny-a.gguf /var/lib/edgelm/models/tiny-a.gguf &&
   install -m 0640 -g edgelm /opt/debs/tiny-b.gguf /var/lib/edgelm/models/tiny-b.gguf &&
   sed -i 's|^#model .*|model /var/lib/edgelm/models/tiny-a.gguf|' /etc/edgelm/edgelm.conf &&
   sed -i 's|^#metrics_listen .*|metrics_listen off|' /etc/edgelm/edgelm.conf &&
   sed -i 's|^#http_listen .*|http_listen 127.0.0.1:$HTTP_PORT|' /etc/edgelm/edgelm.conf &&
   useradd -m -G edgelm member && systemctl reset-failed edgelmd" >/dev/null
out=$(C "systemctl start edgelmd"); rc=$?
C "systemctl is-active edgelmd; systemctl show -p MainPID edgelmd" >/dev/null
if [ $rc -eq 0 ] && [ "$(show SubState)" = running ]; then ok "configured: started"
else bad "start (rc $rc)" "$out$(printf '\n')$(jctl -n 20)"; finish; fi
ctl() { C "runuser -u member -- timeout 60 edgelmctl --timeout 10000 $1" "${2:-12}"; }
out=$(ctl "--json generate -n 4 --temp 0 --no-stream Hello"); rc=$?
[ $rc -eq 0 ] && ok "edgelmctl generate as a member of edgelm" || bad "generate" "$out"
# the HTTP front under the unit's sandbox (IPAddressAllow=localhost,
# SystemCallFilter): the container shares the host's network
out=$(curl -s -m 20 "http://127.0.0.1:$HTTP_PORT/v1/completions" -d '{"prompt":"Hello","max_tokens":4,"temperature":0}' 2>&1)
printf '%s' "$out" | grep -q '"object":"text_completion"' &&
	ok "the HTTP API answers a completion (http_listen 127.0.0.1:$HTTP_PORT)" || bad "HTTP completion" "$out$(printf '\n')$(jctl -n 10)"
[ "$(curl -s -o /dev/null -w '%{http_code}' -m 10 "http://127.0.0.1:$HTTP_PORT/")" = 200 ] &&
	ok "the web page is served" || bad "no web page"
pid1=$(show MainPID)

# ---- 4. reloads --------------------------------------------------------------------
C "sed -i 's|^#log_level .*|log_level debug|' /etc/edgelm/edgelm.conf" >/dev/null
out=$(C "systemctl reload edgelmd"); rc=$?
[ $rc -eq 0 ] && [ "$(show MainPID)" = "$pid1" ] && [ "$(show ActiveState)" = active ] &&
	ok "reload, good change: 0, same MainPID" || bad "good reload: rc $rc" "$out"
C "cp /etc/edgelm/edgelm.conf /tmp/good.conf && echo 'queue_size banana' >>/etc/edgelm/edgelm.conf" >/dev/null
out=$(C "systemctl reload edgelmd"); rc=$?
sleep 0.5
C "journalctl -u edgelmd --no-pager -o cat -n 2 -p err" >/dev/null
if [ $rc -ne 0 ] && [ "$(show MainPID)" = "$pid1" ] && [ "$(show ActiveState)" = active ] &&
	ctl health >/dev/null; then
	ok "reload, bad file: refused (exit $rc), still serving"
else
	bad "bad reload: rc $rc, $(show ActiveState), MainPID $(show MainPID)" "$out"
fi
C "cp /tmp/good.conf /etc/edgelm/edgelm.conf && sed -i 's|tiny-a.gguf|tiny-b.gguf|' /etc/edgelm/edgelm.conf" >/dev/null
out=$(C "systemctl reload edgelmd"); rc=$?
for _ in $(seq 100); do
	E runuser -u member -- edgelmctl --json info 2>/dev/null | grep -q tiny-b && break
	sleep 0.1
done
info=$(ctl "info")
if [ $rc -eq 0 ] && printf '%s' "$info" | grep -q tiny-b && [ "$(show MainPID)" = "$pid1" ]; then
	ok "reload, model swap: info names tiny-b.gguf, same MainPID"
else
	bad "model swap: rc $rc" "$out$(printf '\n')$info"
fi

# ---- 5. upgrade ---------------------------------------------------------------------
out=$(C "apt-get install -y /opt/debs/up/edgelmd_*.deb" 6); rc=$?
for _ in $(seq 100); do [ "$(show SubState)" = running ] && break; sleep 0.1; done
pid2=$(show MainPID)
ver=$(E dpkg-query -W -f '${Version}' edgelmd)
C "dpkg-query -W edgelmd; systemctl show -p MainPID -p ActiveState edgelmd" >/dev/null
if [ $rc -eq 0 ] && [ "$ver" = "$v2" ] && [ "$pid2" != "$pid1" ] && [ "$(show SubState)" = running ]; then
	ok "upgrade to $v2: restarted (MainPID $pid1 -> $pid2)"
else
	bad "upgrade: rc $rc, version $ver, MainPID $pid1 -> $pid2, $(show SubState)" \
		"$(printf '%s\n' "$out" | tail -n 3)$(printf '\n')$(jctl -n 15)"
fi
ctl health >/dev/null && ok "serves after the upgrade" || bad "health after upgrade"

# ---- 6. remove, purge --------------------------------------------------------------
out=$(C "apt-get remove -y edgelmd" 6); rc=$?
sleep 0.5
procs=$(E pgrep -x edgelmd)
C "pgrep -a edgelmd || echo 'no edgelmd process'; systemctl is-active edgelmd" >/dev/null
if [ $rc -eq 0 ] && [ -z "$procs" ] && [ "$(show ActiveState)" != active ]; then
	ok "remove: the daemon is stopped"
else
	bad "remove: rc $rc, edgelmd pids '$procs', $(show ActiveState)" "$out"
fi
[ -f /proc/$L/root/etc/edgelm/edgelm.conf ] && ok "remove keeps the conffile" ||
	bad "remove took /etc/edgelm/edgelm.conf"
out=$(C "apt-get purge -y edgelmd" 6); rc=$?
left=$(E sh -c 'ls -d /etc/edgelm /run/edgelm /usr/sbin/edgelmd /lib/systemd/system/edgelmd.service \
	/usr/lib/systemd/system/edgelmd.service /etc/systemd/system/multi-user.target.wants/edgelmd.service \
	2>/dev/null')
if [ $rc -eq 0 ] && [ -z "$left" ]; then ok "purge: no config, unit, binary or runtime dir left"
else bad "purge: rc $rc, left: $left" "$out"; fi
C "ls -d /etc/edgelm 2>&1; id edgelm; ls /var/lib/edgelm/models" >/dev/null
finish
