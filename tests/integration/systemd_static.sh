#!/bin/bash
# tests/integration/systemd_static.sh: static checks of the systemd files in
# packaging/, no running systemd needed (docs: shared systemd-testing.md).
#
#  - `systemd-analyze verify` of edgelmd.service in a throwaway root (its
#    binaries must exist, so the root holds stubs) with an EMPTY stderr:
#    verify reports bad keys and values as warnings with rc 0;
#  - `systemd-analyze security --offline=true`: exposure <= 2.5;
#  - sysusers.d and tmpfiles.d files applied to that root: the user, group
#    and /var/lib/edgelm/models come out as the unit expects;
#  - the unit names only edgelmd flags that its man page documents.
# Prints "N passed, N failed" (and skipped) like every test.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -u
cd "$(dirname "$0")/../.." || exit 1

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); [ -n "${TEST_VERBOSE:-}" ] && echo "ok   $1" >&2; return 0; }
bad() { fail=$((fail + 1)); echo "FAIL $1" >&2; [ $# -gt 1 ] && printf '%s\n' "$2" | sed 's/^/     /' >&2; return 0; }
skipped() { skip=$((skip + 1)); echo "SKIP $1" >&2; }
finish() {
	if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
	else echo "$pass passed, $fail failed"; fi
	[ $fail -eq 0 ]
	exit
}

UNIT=packaging/systemd/edgelmd.service
MAX_EXPOSURE=${MAX_EXPOSURE:-2.5}
if ! command -v systemd-analyze >/dev/null; then
	skipped "systemd-analyze not installed (apt-get install systemd)"
	finish
fi

T=$(mktemp -d "${TEST_TMPDIR:-${TMPDIR:-/tmp}}/sdstatic.XXXXXX")
# verify/security leave an empty timestamp file on the host; remove it only
# if it was not there before.
units_load=/run/systemd/systemd-units-load
[ -e $units_load ] && had_units_load=1 || had_units_load=0
cleanup() {
	rm -rf "$T"
	[ $had_units_load = 0 ] && rm -f $units_load 2>/dev/null
	rmdir /run/systemd 2>/dev/null
	return 0
}
trap cleanup EXIT

# The root: the host's own units (sysinit.target & co., which the unit's
# default dependencies pull in), stub binaries at the paths the unit runs,
# and our files where the packages install them.
R=$T/root
mkdir -p "$R/usr/sbin" "$R/bin" "$R/usr/lib/systemd" "$R/etc/systemd/system" \
	"$R/usr/lib/sysusers.d" "$R/usr/lib/tmpfiles.d" "$R/etc/edgelm"
for d in /usr/lib/systemd/system /lib/systemd/system; do
	[ -d $d ] && { cp -a $d "$R/usr/lib/systemd/" && break; }
done
printf '#!/bin/sh\nexit 0\n' >"$R/usr/sbin/edgelmd"
chmod 0755 "$R/usr/sbin/edgelmd"
cp "$(ls /bin/kill /usr/bin/kill 2>/dev/null | head -n 1)" "$R/bin/kill"
cp $UNIT "$R/etc/systemd/system/edgelmd.service"
cp packaging/sysusers.d/edgelm.conf "$R/usr/lib/sysusers.d/edgelm.conf"
cp packaging/tmpfiles.d/edgelm.conf "$R/usr/lib/tmpfiles.d/edgelm.conf"
cp packaging/edgelm.conf "$R/etc/edgelm/edgelm.conf"
touch "$R/etc/passwd" "$R/etc/group"

# 1. verify: rc 0 and nothing on stderr.
out=$(systemd-analyze verify --root="$R" --man=no --generators=no \
	/etc/systemd/system/edgelmd.service 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 0 ] && [ -z "$out" ]; then ok "verify"; else bad "verify (rc $rc)" "$out"; fi

# verify must be able to fail: a typo in a copy of the unit shows up.
sed 's/^Type=notify$/Type=notfy/' $UNIT >"$R/etc/systemd/system/edgelmd-typo.service"
out=$(systemd-analyze verify --root="$R" --man=no --generators=no \
	/etc/systemd/system/edgelmd-typo.service 2>&1 >/dev/null)
if printf '%s' "$out" | grep -q 'notfy'; then ok "verify sees a typo"; else bad "verify sees a typo" "$out"; fi
rm -f "$R/etc/systemd/system/edgelmd-typo.service"

# 2. security: the "Overall exposure level" line.
out=$(systemd-analyze security --offline=true --root="$R" edgelmd.service 2>&1)
level=$(printf '%s\n' "$out" | sed -nE 's/.*Overall exposure level for edgelmd\.service: ([0-9.]+).*/\1/p')
if [ -z "$level" ]; then
	bad "security: no exposure line" "$(printf '%s\n' "$out" | tail -n 5)"
elif awk -v l="$level" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(l <= m) }'; then
	ok "security: exposure $level <= $MAX_EXPOSURE"
	echo "exposure level: $level" >&2
else
	bad "security: exposure $level > $MAX_EXPOSURE" "$(printf '%s\n' "$out" | grep '✗')"
fi

# 3. sysusers + tmpfiles in the root.
if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
	out=$(systemd-sysusers --root="$R" edgelm.conf 2>&1)
	if [ $? -eq 0 ] && grep -q '^edgelm:x:[0-9]*:[0-9]*:.*:/var/lib/edgelm:' "$R/etc/passwd" &&
		grep -q '^edgelm:x:' "$R/etc/group"; then
		ok "sysusers: user and group edgelm"
	else
		bad "sysusers" "$out"
	fi
	out=$(systemd-tmpfiles --root="$R" --create edgelm.conf 2>&1)
	uid=$(awk -F: '$1 == "edgelm" { print $3 }' "$R/etc/passwd")
	st=$(stat -c '%a %u' "$R/var/lib/edgelm/models" 2>/dev/null)
	if [ "$st" = "750 $uid" ]; then ok "tmpfiles: /var/lib/edgelm/models"; else bad "tmpfiles ($st)" "$out"; fi
else
	skipped "systemd-sysusers/systemd-tmpfiles not installed"
fi

# 4. Every edgelmd flag of the unit is documented in edgelmd.8, and the unit
# runs the paths the packages install.
missing=
for f in $(grep -E '^Exec' $UNIT | grep -oE ' --[a-z-]+' | sort -u); do
	roff=$(printf '%s' "$f" | sed 's/^ //; s/-/\\-/g') # --x-y -> \-\-x\-y
	grep -qF -- "$roff" packaging/man/edgelmd.8 || missing="$missing$f"
done
if [ -z "$missing" ]; then ok "unit flags documented"; else bad "flags not in edgelmd.8:$missing"; fi
if grep -qx 'usr/sbin/edgelmd' debian/edgelmd.install 2>/dev/null &&
	grep -qE '^ExecStart=/usr/sbin/edgelmd ' $UNIT; then
	ok "unit runs what debian/edgelmd.install installs"
else
	bad "unit runs what debian/edgelmd.install installs"
fi

# the exit codes that no restart can fix stop the restarts (edgelmd(8):
# 1 configuration, 2 model, 5 mlock = on refused): an unconfigured box must
# not restart forever; and each code is edgelmd's own (daemon/main.c)
prevent=$(sed -n 's/^RestartPreventExitStatus=//p' "$UNIT")
if [ "$prevent" = "1 2 5" ]; then ok "RestartPreventExitStatus=1 2 5"
else bad "RestartPreventExitStatus is '$prevent', want '1 2 5'"; fi
if grep -q "EXIT_USAGE = 1, EXIT_MODEL = 2, .* EXIT_MLOCK = 5" daemon/main.c; then
	ok "the codes are edgelmd's"
else bad "daemon/main.c's exit codes moved: check RestartPreventExitStatus"; fi

finish
