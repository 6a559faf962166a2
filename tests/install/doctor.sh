#!/bin/bash
# install.doctor: `softverbs doctor` passes on a healthy set-up (a private
# SOFTVERBS_DIR, its daemon started) and, for each broken one, fails and
# names the cause with its path or value:
#   - a runtime directory of mode 0755;
#   - a daemon of another pid namespace (one started under unshare -p, and
#     the reverse: doctor run under unshare -p against the test's daemon);
#   - RLIMIT_MEMLOCK of 64 KiB, without CAP_IPC_LOCK;
#   - UDP 4791 held by another process (python3, in a network namespace of
#     its own).
# Runs in a private network namespace (UDP 4791 is the test's own) and
# mount namespace (no CDI spec of the machine's is looked at). Root only
# (namespaces, capabilities): skipped otherwise.
#   doctor.sh BIN_DIR
set -u
bin=${1:?usage: $0 BIN_DIR}
bin=$(cd "$bin" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null || ! command -v python3 >/dev/null; then
  echo "SKIP: needs root, unshare and python3" >&2
  exit 77
fi
if [ -z "${DOCTOR_TEST_IN_NS:-}" ]; then
  DOCTOR_TEST_IN_NS=1 exec unshare --net --mount --propagation private -- "$0" "$@"
fi
ip link set lo up
# CDI specs and domains: the test's own (empty directories where the
# machine has none; they stay, as podman would make them).
mkdir -p /etc/cdi /run/softverbs
for d in /etc/cdi /var/run/cdi /run/softverbs; do [ -d "$d" ] && mount -t tmpfs none "$d"; done

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
tmp=$(mktemp -d)
pids=()
cleanup() {
  # unshare --fork waits out SIGTERM: its child (a daemon) goes first.
  for p in "${pids[@]}"; do kill $(ps -o pid= --ppid "$p") "$p" 2>/dev/null; done
  wait 2>/dev/null
  [ -n "${KEEP:-}" ] && cp -r "$tmp" /tmp/doctor-keep; rm -rf "$tmp"
}
trap cleanup EXIT
sv=$bin/softverbs
export SOFTVERBS_DIR=$tmp/healthy
unset SOFTVERBS_SYSTEM XDG_RUNTIME_DIR
mkdir -m 0700 "$SOFTVERBS_DIR"

# doctor EXPECTED-RC NAME CMD...: runs CMD (a doctor), which must exit
# EXPECTED-RC; its output is in $tmp/NAME.
doctor() {
  local want=$1 name=$2 rc
  shift 2
  "$@" >"$tmp/out.$name" 2>&1
  rc=$?
  [ "$rc" = "$want" ] || fail "$name: exit $rc, want $want: $(cat "$tmp/out.$name")"
}
# has NAME REGEX: NAME's output has a line matching REGEX.
has() { grep -Eq -- "$2" "$tmp/out.$1" || fail "$1: no line matches /$2/ in: $(cat "$tmp/out.$1")"; }

wait_socket() {  # wait_socket DIR: its daemon answers
  for _ in $(seq 100); do [ -S "$1/control" ] && return 0; sleep 0.05; done
  fail "no daemon at $1"
}

"$bin/softverbsd" --foreground --idle 0 --dir "$SOFTVERBS_DIR" 2>"$tmp/daemon.err" &
pids+=($!)
wait_socket "$SOFTVERBS_DIR"

# Healthy: every check passes (warnings allowed: no device view outside
# `softverbs run`, no CDI spec).
doctor 0 healthy "$sv" doctor
has healthy "^ok +runtime directory \(SOFTVERBS_DIR\): $SOFTVERBS_DIR \(uid 0.*mode 0700\)"
has healthy "^ok +daemon: softverbsd answers at $SOFTVERBS_DIR/control"
has healthy "^ok +daemon pid namespace: the same"
has healthy "^ok +daemon network namespace: serves this one"
has healthy "^ok +UDP 4791 \(RoCEv2\): (free|held by this daemon)"
has healthy "^warn +device node: /dev/infiniband/uverbs0 absent"
has healthy "^ok +view under softverbs run: /dev/infiniband/uverbs0 and /sys/class/infiniband/sv0 are there"
has healthy "no check failed"
grep -q '^FAIL' "$tmp/out.healthy" && fail "healthy: a check failed: $(cat "$tmp/out.healthy")"
# Under `softverbs run`: the view is there, and the library is ours.
doctor 0 in_run "$sv" run -- "$sv" doctor
has in_run "^ok +device node: /dev/infiniband/uverbs0"
has in_run "^ok +sysfs device: /sys/class/infiniband/sv0"
if command -v ibv_devinfo >/dev/null; then
  has in_run "^ok +library under softverbs run: .*ibv_devinfo loads .*libibverbs.so.1 \(softverbs'\)"
  has in_run "^ok +library here \(under softverbs run\): .*\(softverbs'\)"
fi

# A runtime directory others may read: named, with its mode and the fix.
chmod 0755 "$SOFTVERBS_DIR"
doctor 1 mode "$sv" doctor
has mode "^FAIL +runtime directory \(SOFTVERBS_DIR\): $SOFTVERBS_DIR has mode 0755, must be 0700.*fix: chmod 0700 $SOFTVERBS_DIR"
chmod 0700 "$SOFTVERBS_DIR"

# The same failure found by the library's own choice of directory
# (XDG_RUNTIME_DIR/softverbs), not only an explicit one.
mkdir -m 0700 "$tmp/xdg" && mkdir -m 0755 "$tmp/xdg/softverbs"
doctor 1 xdg_mode env -u SOFTVERBS_DIR XDG_RUNTIME_DIR="$tmp/xdg" "$sv" doctor
has xdg_mode "^FAIL +runtime directory: $tmp/xdg/softverbs has mode 0755"

# A daemon of another pid namespace (a child of ours: its pid is visible,
# its namespace is not ours).
mkdir -m 0700 "$tmp/pidns"
unshare --pid --fork --kill-child --mount-proc "$bin/softverbsd" --foreground --idle 0 --dir "$tmp/pidns" \
  2>"$tmp/pidns.err" &
pids+=($!)
wait_socket "$tmp/pidns"
doctor 1 pidns env SOFTVERBS_DIR="$tmp/pidns" "$sv" doctor
has pidns "^FAIL +daemon pid namespace: the daemon \(pid [0-9]+ here\) is in pid:\[[0-9]+\], this process in pid:\[[0-9]+\]"
# The reverse: this daemon seen from a pid namespace of its own (SO_PEERCRED: pid 0).
doctor 1 pidns_rev unshare --pid --fork --kill-child --mount-proc "$sv" doctor
has pidns_rev "^FAIL +daemon pid namespace: the daemon at $SOFTVERBS_DIR/control is in another pid namespace \(SO_PEERCRED gives pid 0"

# RLIMIT_MEMLOCK of 64 KiB, and no CAP_IPC_LOCK to go beyond it.
if command -v prlimit >/dev/null && command -v setpriv >/dev/null; then
  doctor 1 memlock prlimit --memlock=65536 setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock "$sv" doctor
  has memlock "^FAIL +RLIMIT_MEMLOCK: 65536 bytes \(ulimit -l 64\) is below the 8388608 bytes.*fix: raise it to at least 8192 KiB: ulimit -l 8192"
  has memlock "LimitMEMLOCK=8192K.*podman run --ulimit memlock=8388608"
  # With the capability, the same limit is no failure.
  doctor 0 memlock_cap prlimit --memlock=65536 "$sv" doctor
  has memlock_cap "^ok +RLIMIT_MEMLOCK: 65536 bytes .*CAP_IPC_LOCK"
else
  fail "prlimit and setpriv (util-linux) are needed"
fi

# UDP 4791 held by another process, in a network namespace of its own
# (where no daemon runs).
cat >"$tmp/hold.sh" <<EOF
ip link set lo up
python3 -c 'import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 4791))
print("bound", flush=True)
time.sleep(120)' >"$tmp/hold.out" &
holder=\$!
for _ in \$(seq 100); do grep -q bound "$tmp/hold.out" 2>/dev/null && break; sleep 0.05; done
echo "\$holder" >"$tmp/holder.pid"
SOFTVERBS_DIR="$tmp/none" "$sv" doctor
rc=\$?
kill \$holder
exit \$rc
EOF
mkdir -m 0700 "$tmp/none"
doctor 1 port unshare --net bash "$tmp/hold.sh"
holder=$(cat "$tmp/holder.pid" 2>/dev/null)
has port "^FAIL +UDP 4791 \(RoCEv2\): held by python3[.0-9]* \(pid $holder, user 0\).*fix: stop it \(kill $holder\)"

# A CDI spec with a trust domain whose directory others may read: named.
"$sv" cdi --domain job1 --output /etc/cdi/softverbs-doctor.json >/dev/null || fail "softverbs cdi failed"
doctor 0 cdi "$sv" doctor
has cdi "^ok +CDI spec: /etc/cdi/softverbs-doctor.json: kind softverbs.io/rdma, devices sv0, job1"
has cdi "^ok +CDI domain job1: /run/softverbs/domains/job1 \(uid 0 \(root\), mode 0700\)"
chmod 0755 /run/softverbs/domains/job1
doctor 1 cdi_mode "$sv" doctor
has cdi_mode "^FAIL +CDI domain job1: /run/softverbs/domains/job1 \(uid 0 \(root\), mode 0755\): a domain's directory must be 0700; fix: chmod 0700 /run/softverbs/domains/job1"
rm -f /etc/cdi/softverbs-doctor.json

[ "$failures" = 0 ] && echo "install.doctor: all checks passed"
exit $((failures > 0))
