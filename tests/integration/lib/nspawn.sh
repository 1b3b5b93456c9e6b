# tests/integration/lib/nspawn.sh: boot a Debian root under systemd-nspawn
# for the systemd tests (systemd_e2e.sh, systemd_deb.sh; sourced, not run).
# How and why: shared docs/systemd-testing.md.
#
# It gives the caller the report (ok NAME, bad NAME [DETAIL], finish,
# skip_all REASON: "N passed, N failed" like every test), ROOT (the cached
# root, $EDGELM_E2E_ROOT) and ROOT_PKGS (its packages). The caller sets NAME
# (the machine name) and T (its scratch folder), and calls:
#   nspawn_require           root, systemd-nspawn and nsenter (else skip_all)
#   nspawn_root_check PKGS   the root holds PKGS (else build it when
#                            EDGELM_E2E_BUILD_ROOT=1, or skip_all)
#   nspawn_boot [ARGS...]    boot it (ARGS: more nspawn options, e.g.
#                            --bind-ro=DIR:/opt/x); sets N (nspawn's pid) and
#                            L (the container's systemd), defines E CMD...
#                            (run CMD in the container)
#   nspawn_cleanup           (an EXIT trap) power off, kill, remove cgroups

ROOT=${EDGELM_E2E_ROOT:-/var/cache/edgelm-test/root}
# Packages of the container: systemd, procps (/bin/kill, the unit's
# ExecReload=), and the shared libraries edgelmd and edgelmctl link (same
# Debian release as the host, so host binaries run). A root made with
# another list is rebuilt (the list is recorded in $ROOT/.edgelm-e2e).
ROOT_PKGS=systemd,systemd-sysv,dbus,procps,libnng1,libjansson4,libproc2-0,libmicrohttpd12,libcpuid16,libnuma1,libpcre2-8-0,libsystemd0

pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); echo "ok   $1" >&2; }
bad() {
	fail=$((fail + 1))
	echo "FAIL $1" >&2
	[ $# -gt 1 ] && printf '%s\n' "$2" | tail -n 30 | sed 's/^/     /' >&2
	return 0
}
finish() {
	if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"
	else echo "$pass passed, $fail failed"; fi
	[ $fail -eq 0 ]
	exit
}
skip_all() { echo "SKIP $(basename "$0" .sh): $1" >&2; skip=1; finish; }

nspawn_require() {
	[ "$(id -u)" = 0 ] || skip_all "needs root (systemd-nspawn)"
	command -v systemd-nspawn >/dev/null && command -v nsenter >/dev/null ||
		skip_all "systemd-nspawn/nsenter missing (apt-get install systemd-container)"
}

nspawn_build_root() {
	command -v debootstrap >/dev/null || { echo "debootstrap missing (apt-get install debootstrap)" >&2; return 1; }
	local suite
	suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
	echo "building the container root in $ROOT (debootstrap $suite, ~90 s)" >&2
	mkdir -p "$(dirname "$ROOT")" && rm -rf "$ROOT.tmp" &&
		debootstrap --variant=minbase --include="$1" "$suite" "$ROOT.tmp" \
			>"$(dirname "$ROOT")/debootstrap.log" 2>&1 &&
		echo "$1" >"$ROOT.tmp/.edgelm-e2e" &&
		rm -rf "$ROOT" && mv "$ROOT.tmp" "$ROOT"
}

# A root made with another package list is rebuilt (the list is recorded in
# $ROOT/.edgelm-e2e).
nspawn_root_check() {
	[ "$(cat "$ROOT/.edgelm-e2e" 2>/dev/null)" = "$1" ] && return 0
	if [ "${EDGELM_E2E_BUILD_ROOT:-0}" = 1 ]; then
		nspawn_build_root "$1" && return 0
		bad "build the container root" "$(tail -n 20 "$(dirname "$ROOT")/debootstrap.log" 2>/dev/null)"
		finish
	fi
	skip_all "no cached container root at $ROOT (or one with other packages); \`make check-systemd\` builds it (debootstrap, ~90 s)"
}

N= L=
nspawn_cleanup() {
	if [ -n "$N" ] && kill -0 "$N" 2>/dev/null; then
		[ -n "$L" ] && nsenter -t "$L" -a systemctl --no-block poweroff >/dev/null 2>&1
		for _ in $(seq 100); do kill -0 "$N" 2>/dev/null || break; sleep 0.1; done
		kill -TERM "$N" 2>/dev/null
		for _ in $(seq 50); do kill -0 "$N" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$N" 2>/dev/null
	fi
	for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified /sys/fs/cgroup; do
		[ -d "$h/$NAME" ] && find "$h/$NAME" -depth -type d -exec rmdir {} \; 2>/dev/null
	done
	rm -rf /run/systemd/nspawn/propagate/"$NAME" 2>/dev/null
	rmdir /run/systemd/nspawn/propagate /run/systemd/nspawn/locks /run/systemd/nspawn 2>/dev/null
	if [ "${EDGELM_E2E_KEEP:-0}" = 1 ]; then echo "kept $T" >&2; else rm -rf "$T"; fi
	return 0
}

# The launching shell gets its own cgroup first: with --keep-unit nspawn
# uses the caller's cgroup, which is / on this kind of host. --volatile=
# overlay: whatever the test installs is gone with the container.
nspawn_boot() {
	(
		for h in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
			[ -d "$h" ] && mkdir -p "$h/$NAME" && echo $BASHPID >"$h/$NAME/cgroup.procs"
		done
		exec setsid systemd-nspawn -D "$ROOT" -b --machine="$NAME" --register=no --keep-unit \
			--console=pipe --volatile=overlay "$@" </dev/null >"$T/nspawn.log" 2>&1
	) &
	N=$!
	for _ in $(seq 200); do L=$(pgrep -P "$N" -x systemd || true); [ -n "$L" ] && break; sleep 0.05; done
	if [ -z "$L" ]; then bad "boot the container" "$(cat "$T/nspawn.log")"; finish; fi
	for _ in $(seq 200); do [ -S /proc/$L/root/run/systemd/private ] && break; sleep 0.05; done
	local state
	state=$(E systemctl is-system-running --wait 2>/dev/null)
	case $state in
	running | degraded) ok "boot: $state" ;;
	*) bad "boot: $state" "$(cat "$T/nspawn.log")"; finish ;;
	esac
}
E() { nsenter -t "$L" -a "$@"; }
