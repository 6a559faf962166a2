#!/bin/bash
# install.activation (issue 22, item 4): the systemd units, tried without
# systemd running: systemd-socket-activate listens as softverbsd.socket
# does and starts the daemon at the first connection, passing the socket by
# systemd's protocol (LISTEN_PID/LISTEN_FDS, descriptor 3).
#   - the units name the socket the daemons serve;
#   - the system daemon, socket-activated: `softverbs status` names it so,
#     with the pid the activator started, and ibv_devinfo reaches it;
#   - the per-user daemon, socket-activated, and started by the library;
#   - a socket at another path than the daemon's is refused with a message
#     and the daemon listens on its own;
#   - the user unit's command (no --dir) serves $XDG_RUNTIME_DIR/softverbs
#     and records its network namespace there, even if the record named
#     another (issue 22, item 7), and the library and `softverbs status`
#     find it there.
#   activation.sh BIN_DIR SOURCE_DIR
set -u
bin=${1:?usage: $0 BIN_DIR SOURCE_DIR}
src=${2:?}
command -v systemd-socket-activate >/dev/null || { echo "SKIP: no systemd-socket-activate" >&2; exit 77; }
work=$(mktemp -d /tmp/softverbs-activation.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; for f in "$work"/*.log; do [ -s "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done; exit 1; }

# 1. The units name the control socket the daemons serve (paths.h socket_path).
grep -qx 'ListenSequentialPacket=/run/softverbs/control' "$src/packaging/systemd/softverbsd.socket" ||
  fail "softverbsd.socket does not listen on /run/softverbs/control"
grep -qx 'ExecStart=softverbsd --system --foreground' "$src/packaging/systemd/softverbsd.service" ||
  fail "softverbsd.service does not start the system daemon"
grep -qx 'ListenSequentialPacket=%t/softverbs/control' "$src/packaging/systemd/user/softverbsd.socket" ||
  fail "the user softverbsd.socket does not listen on \$XDG_RUNTIME_DIR/softverbs/control"

# activate DIR LOG ARGS...: the daemon behind a socket at DIR/control.
activate() {
  local dir=$1 log=$2
  shift 2
  systemd-socket-activate --seqpacket -l "$dir/control" "$bin/softverbsd" "$@" --dir "$dir" 2>"$log" &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$dir/control" ] && return 0; sleep 0.05; done
  fail "systemd-socket-activate did not listen at $dir/control"
}

# 2. The system daemon.
sys=$work/sys
mkdir -m 755 "$sys"
activate "$sys" "$work/system.log" --system --foreground --idle 0
act=${pids[-1]}
out=$(SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR="$sys" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" status 2>&1) ||
  fail "softverbs status through the activated system daemon: $out"
echo "$out" | grep -q "^softverbsd (pid $act) at $sys\$" || fail "not the activated daemon (pid $act): $out"
echo "$out" | grep -q "served by the system daemon (every user's), socket-activated by systemd" ||
  fail "status does not say the system daemon is socket-activated: $out"
if command -v ibv_devinfo >/dev/null; then
  dev=$(SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR="$sys" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" run ibv_devinfo 2>&1) ||
    fail "ibv_devinfo through the activated system daemon: $dev"
  echo "$dev" | grep -q "hca_id:.*sv0" || fail "ibv_devinfo does not list sv0: $dev"
fi

# 3. A user's daemon: socket-activated, then started by the library.
usr=$work/user
mkdir -m 700 "$usr"
activate "$usr" "$work/user.log" --foreground --idle 0
act=${pids[-1]}
out=$(SOFTVERBS_DIR="$usr" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" status 2>&1) || fail "status of the activated user daemon: $out"
echo "$out" | grep -q "^softverbsd (pid $act) at $usr\$" || fail "not the activated user daemon (pid $act): $out"
echo "$out" | grep -q "served by the per-user daemon, socket-activated by systemd --user" ||
  fail "status does not say the user daemon is socket-activated: $out"
ondemand=$work/ondemand
mkdir -m 700 "$ondemand"
if command -v ibv_devinfo >/dev/null; then
  # ibv_devinfo opens the device: the library starts a daemon, which stays
  # SOFTVERBSD_IDLE seconds after its last client.
  SOFTVERBS_DIR="$ondemand" SOFTVERBSD_IDLE=10 "$bin/softverbs" run ibv_devinfo >"$work/ondemand.log" 2>&1 ||
    fail "ibv_devinfo with a daemon started on demand"
  out=$(SOFTVERBS_DIR="$ondemand" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" status 2>&1) || fail "status: $out"
  pids+=("$(echo "$out" | sed -n 's/^softverbsd (pid \([0-9]*\)).*/\1/p')")
  echo "$out" | grep -q "served by the per-user daemon, started on demand" || fail "status of a daemon the library started: $out"
fi

# 4. A socket that is not the daemon's: said, and the daemon listens itself.
odd=$work/odd
mkdir -m 700 "$odd" "$odd/elsewhere"
systemd-socket-activate --seqpacket -l "$odd/elsewhere/control" "$bin/softverbsd" --foreground --idle 0 --dir "$odd" \
  2>"$work/odd.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$odd/elsewhere/control" ] && break; sleep 0.05; done
# The first connection starts it; it refuses the socket and makes its own.
python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sys.argv[1])" \
  "$odd/elsewhere/control" 2>/dev/null
for _ in $(seq 100); do [ -S "$odd/control" ] && break; sleep 0.05; done
[ -S "$odd/control" ] || fail "the daemon given a foreign socket did not listen on its own"
grep -q "is not a listening SOCK_SEQPACKET socket at $odd/control" "$work/odd.log" ||
  fail "the daemon did not say why it refused the socket"
out=$(SOFTVERBS_DIR="$odd" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" status 2>&1) || fail "status after a refused socket: $out"
echo "$out" | grep -q "started on demand" || fail "a refused socket still counts as activation: $out"

# 5. The user unit's command line: no --dir, no SOFTVERBS_DIR.
xdg=$work/xdg
mkdir -m 700 "$xdg" "$xdg/softverbs"
printf '4 1\n' >"$xdg/softverbs/netns"  # a namespace that is not ours
# (systemd-socket-activate passes only the -E variables on.)
systemd-socket-activate --seqpacket -l "$xdg/softverbs/control" -E XDG_RUNTIME_DIR="$xdg" -E SOFTVERBS_ROCE=0 \
  "$bin/softverbsd" --foreground --idle 0 2>"$work/unit.log" &
pids+=($!)
act=$!
for _ in $(seq 100); do [ -S "$xdg/softverbs/control" ] && break; sleep 0.05; done
out=$(env -u SOFTVERBS_DIR XDG_RUNTIME_DIR="$xdg" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" status 2>&1) ||
  fail "status of the unit's daemon: $out"
echo "$out" | grep -q "^softverbsd (pid $act) at $xdg/softverbs\$" || fail "not the unit's daemon in the base directory: $out"
echo "$out" | grep -q "network namespace .*, this one" || fail "status does not say it serves this namespace: $out"
[ "$(cat "$xdg/softverbs/netns")" = "$(stat -L -c '%d %i' /proc/self/ns/net)" ] ||
  fail "the unit's daemon did not record its namespace: $(cat "$xdg/softverbs/netns")"
if command -v ibv_devinfo >/dev/null; then
  env -u SOFTVERBS_DIR XDG_RUNTIME_DIR="$xdg" SOFTVERBS_NO_SPAWN=1 "$bin/softverbs" run ibv_devinfo >"$work/unitdev.log" 2>&1 ||
    fail "ibv_devinfo through the unit's daemon"
  [ ! -e "$xdg/softverbs/net-"* ] || fail "a namespace directory was made beside the unit's daemon: $(ls "$xdg/softverbs")"
fi
echo "install.activation: ok"
