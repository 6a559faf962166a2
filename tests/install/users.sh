#!/bin/bash
# install.users: an ordinary user, as a new user meets softverbs on Debian:
# a fresh unprivileged user, with no XDG_RUNTIME_DIR (as after su, runuser,
# setpriv, sudo or in cron's bare environment), runs the README's examples
# with the build tree's `softverbs`:
#   1. `softverbs run -- ibv_rc_pingpong -g 0` as server, then `softverbs run
#      -- ibv_rc_pingpong -g 0 127.0.0.1` as client: each `run` is a user
#      namespace of its own, the daemon started by the first;
#   2. a plain program (started without `run`) next to a `run` one;
#   3. a second pair within the daemon's idle time (through runuser);
#   4. perftest's ib_write_lat pair;
#   5. a daemon started by a plain program, then a `run` pair against it;
#   6. a daemon that lives in a `run`'s user namespace (started from inside
#      the view) serves a `run` of another namespace and a plain program;
#   7. a process of another pid namespace (root's unshare -pf --mount-proc,
#      as the user) is refused by that daemon, and says why on stderr; the
#      daemon goes on serving the user.
# Run as root (to create the user, removed at the end with its files);
# skipped (77) without root or useradd. In a network namespace of its own,
# so that the examples' fixed TCP port meets no other test's.
#   users.sh BIN_DIR
set -u
bin=$(cd "${1:?usage: $0 BIN_DIR}" && pwd) || exit 2
lib=$(cd "$bin/../lib" && pwd) || exit 2

skip() {
  echo "SKIP: $*"
  exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root to create a user"
command -v useradd >/dev/null || skip "no useradd here (package passwd)"
for t in userdel setpriv runuser unshare ibv_rc_pingpong ss; do
  command -v $t >/dev/null || { echo "FAIL: no $t" >&2; exit 1; }
done

if [ -z "${SV_USERS_NETNS:-}" ] && unshare -n true 2>/dev/null; then
  SV_USERS_NETNS=1 exec unshare -n "$0" "$@"
fi
[ -n "${SV_USERS_NETNS:-}" ] && ip link set lo up

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

name=svu$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')
useradd -M -s /bin/sh -d /nonexistent "$name" || { echo "FAIL: useradd $name" >&2; exit 1; }
uid=$(id -u "$name")
gid=$(id -g "$name")
tmp=$(mktemp -d)
home=$(mktemp -d /tmp/svhome.XXXXXX)
chown "$uid:$gid" "$home"
stage=
cleanup() {
  # Every process of the user this test made (it has no other), then the
  # user and its files.
  pkill -KILL -U "$uid" 2>/dev/null
  sleep 0.2
  userdel "$name" 2>/dev/null
  rm -rf "$tmp" "$home" "/tmp/softverbs-$uid" ${stage:+"$stage"}
  find /tmp /dev/shm -xdev -user "$uid" -delete 2>/dev/null
}
trap cleanup EXIT
cd "$home" || exit 1

# The user's environment: nothing but PATH and HOME (no XDG_RUNTIME_DIR).
as_user() {
  setpriv --reuid="$uid" --regid="$gid" --init-groups env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" "$@"
}

# The build tree, if the user can reach it; else its outputs copied with
# their layout (bin/, lib/) where anyone can read them.
if ! as_user sh -c "test -x '$bin/softverbs' && test -x '$bin/softverbsd' && test -r '$lib/libibverbs.so.1'"; then
  stage=$(mktemp -d)
  chmod 0755 "$stage"
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$bin/softverbs" "$bin/softverbsd" "$stage/bin/"
  cp -a "$lib/." "$stage/lib/"
  chmod -R a+rX "$stage"
  bin=$stage/bin
  lib=$stage/lib
fi
sv=$bin/softverbs

wait_listen() {  # PORT: until a TCP socket listens on it (10 s)
  local i
  for i in $(seq 1 200); do
    [ -n "$(ss -Hltn "sport = :$1")" ] && return 0
    sleep 0.05
  done
  return 1
}

show() {  # LABEL FILE
  echo "--- $1:" >&2
  tail -n 15 "$2" >&2
}

# pair LABEL PORT REGEX SERVER-SHELL CLIENT-SHELL: the server (a shell
# command, as the user) in the background, the client once it listens; both
# must exit 0 and print a line matching REGEX.
pair() {
  local label=$1 port=$2 re=$3 srv=$4 cli=$5 spid crc src
  as_user timeout 60 sh -c "$srv" >"$tmp/$label.server" 2>&1 </dev/null &
  spid=$!
  if ! wait_listen "$port"; then
    fail "$label: the server never listened on port $port"
    kill "$spid" 2>/dev/null
    wait "$spid"
    show "$label server" "$tmp/$label.server"
    return 1
  fi
  as_user timeout 60 sh -c "$cli" >"$tmp/$label.client" 2>&1 </dev/null
  crc=$?
  wait "$spid"
  src=$?
  local bad=0
  [ $src -eq 0 ] || { fail "$label: the server exited $src"; bad=1; }
  [ $crc -eq 0 ] || { fail "$label: the client exited $crc"; bad=1; }
  for side in server client; do
    grep -Eq -- "$re" "$tmp/$label.$side" || { fail "$label: the $side printed no line matching /$re/"; bad=1; }
  done
  if [ $bad -ne 0 ]; then
    show "$label server" "$tmp/$label.server"
    show "$label client" "$tmp/$label.client"
  else
    echo "ok: $label"
  fi
  return $bad
}

bw='[0-9]+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec'

# 1. The README's example, literally.
pair readme 18515 "$bw" "$sv run -- ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"

# 2. A plain program (the library by LD_LIBRARY_PATH, no view) next to a
# `run` one, both ways round.
plain="env LD_LIBRARY_PATH=$lib"
pair plain-server 18515 "$bw" "$plain ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"
pair plain-client 18515 "$bw" "$sv run -- ibv_rc_pingpong -g 0" "$plain ibv_rc_pingpong -g 0 127.0.0.1"

# 3. A second pair within the daemon's idle time, started by runuser as
# sudo-like tools start programs.
as_user_runuser() { runuser -u "$name" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" "$@"; }
as_user_runuser timeout 60 sh -c "$sv run -- ibv_rc_pingpong -g 0" >"$tmp/runuser.server" 2>&1 </dev/null &
rpid=$!
if wait_listen 18515; then
  as_user_runuser timeout 60 sh -c "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1" >"$tmp/runuser.client" 2>&1 </dev/null
  rc=$?
  wait $rpid
  src=$?
  if [ $rc -ne 0 ] || [ $src -ne 0 ] || ! grep -Eq "$bw" "$tmp/runuser.client" "$tmp/runuser.server"; then
    fail "runuser: the second pair failed (server $src, client $rc)"
    show "runuser server" "$tmp/runuser.server"
    show "runuser client" "$tmp/runuser.client"
  else
    echo "ok: runuser"
  fi
else
  fail "runuser: the server never listened"
  kill $rpid 2>/dev/null
  wait $rpid
fi

# 4. perftest's ib_write_lat pair (the README's second example); its clock
# calibration can fail on a busy machine: up to three tries.
if command -v ib_write_lat >/dev/null; then
  for try in 1 2 3; do
    before=$failures
    pair write_lat 18515 '^[[:space:]]*2[[:space:]]+1000[[:space:]]+[0-9.]+' "$sv run -- ib_write_lat" \
      "$sv run -- ib_write_lat 127.0.0.1" && break
    grep -q 'Correlation coefficient' "$tmp/write_lat.server" "$tmp/write_lat.client" || break
    [ $try -lt 3 ] && failures=$before && echo "note: perftest could not calibrate its clock; again" && sleep 1
  done
else
  echo "note: no ib_write_lat (package perftest): step 4 not run"
fi

# The daemon's pid, as `softverbs status` says it ("softverbsd (pid N) at DIR").
daemon_pid() { as_user "$sv" status 2>/dev/null | sed -n 's/^softverbsd (pid \([0-9]*\)).*/\1/p' | head -n1; }
stop_daemon() {
  local p i
  p=$(daemon_pid)
  [ -n "$p" ] || return 0
  kill "$p"
  for i in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
}

# 5. The daemon started by a plain program, then a `run` pair.
stop_daemon
pair plain-first 18515 "$bw" "$plain ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"
pair after-plain 18515 "$bw" "$sv run -- ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"

# 6. A daemon that lives in a `run`'s user namespace: started by the
# library inside the view (as after the daemon's idle exit while a program
# under `run` had not opened the device yet; here `run` is kept from
# starting it first, then the program may), then a `run` of another
# namespace and a plain program against it.
stop_daemon
inview="env SOFTVERBS_NO_SPAWN=1 $sv run -- env -u SOFTVERBS_NO_SPAWN"
pair in-view 18515 "$bw" "$inview ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"
p=$(daemon_pid)
if [ -n "$p" ] && [ "$(readlink "/proc/$p/ns/user")" = "$(readlink /proc/self/ns/user)" ]; then
  fail "in-view: the daemon does not live in a user namespace of its own (the case this step is for)"
fi
pair in-view-plain 18515 "$bw" "$sv run -- ibv_rc_pingpong -g 0" "$plain ibv_rc_pingpong -g 0 127.0.0.1"

# 7. Another pid namespace: refused, and told why. The daemon must be the
# one of step 5 (alive: its idle time has not passed).
if [ -z "$(daemon_pid)" ]; then
  fail "refusal: no daemon answers the user"
else
  unshare -pf --mount-proc setpriv --reuid="$uid" --regid="$gid" --init-groups env -i PATH=/usr/bin:/bin \
    HOME="$home" "$sv" run -- ibv_rc_pingpong -g 0 127.0.0.1 >"$tmp/refused.out" 2>"$tmp/refused.err" </dev/null
  rc=$?
  [ $rc -ne 0 ] || fail "refusal: a process of another pid namespace was served (exit 0)"
  if ! grep -q "refused this process: it is in pid namespace pid:\[[0-9]*\], the daemon serves pid:\[[0-9]*\]" \
    "$tmp/refused.err"; then
    fail "refusal: the reason is not on stderr"
    show "refused stderr" "$tmp/refused.err"
  else
    echo "ok: refusal, said as: $(grep 'refused this process' "$tmp/refused.err")"
  fi
  [ "$(grep -c 'refused this process' "$tmp/refused.err")" -le 1 ] || fail "refusal: said more than once"
  pair after-refusal 18515 "$bw" "$sv run -- ibv_rc_pingpong -g 0" "$sv run -- ibv_rc_pingpong -g 0 127.0.0.1"
fi

if [ $failures -ne 0 ]; then
  echo "install.users: $failures failure(s)" >&2
  exit 1
fi
echo "install.users: the README's examples work for an unprivileged user; another pid namespace is refused and told why"
