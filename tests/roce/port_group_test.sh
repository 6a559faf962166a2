#!/usr/bin/env bash
# roce.port_group: no user gets a member of the RoCE port's reuseport group
# (docs/ROCE.md, "Steering"). Host h1 of the test bed runs the system daemon
# (--system: every user's), h0 a daemon of its own. In h1 a process of
# nobody (port_attack) puts a QP on the wire and attacks every socket the
# daemon handed it: none may be bound to UDP 4791 or be in a reuseport
# group, no steering program may be taken, and a socket of its own may not
# join the group. Meanwhile root's ibv_rc_pingpong between h1 and h0
# (root's process under the system daemon, steered) and nobody's (its
# datagrams forwarded by the daemon, sent from its own socket) run to the
# end, and the attacker received no datagram of theirs. `ss` in h1 shows no
# socket on :4791 held by the attacker.
#
#   port_group_test.sh SOURCE_DIR BIN_DIR PORT_ATTACK
set -u
src=$1 bin=$2 attack=$3
tb=$src/scripts/testbed.sh
SKIP=77
TIMEOUT=${ROCE_WIRE_TIMEOUT:-90}
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
for p in setpriv ss ibv_rc_pingpong; do command -v $p >/dev/null || { log "SKIP: no $p"; exit $SKIP; }; done
setpriv --reuid=65534 --regid=65534 --clear-groups test -r "$bin/../lib/libibverbs.so.1" ||
  { log "SKIP: the build directory is not readable by nobody"; exit $SKIP; }
export SOFTVERBS_TESTBED=svp$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
work=$(mktemp -d "${TMPDIR:-/tmp}/svport.XXXXXX") || exit 1
chmod 711 "$work"
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ] && for p in "$work"/*.dlog "$work"/*.out; do
    [ -s "$p" ] && { log "--- $p"; cat "$p" >&2; }
  done
  "$tb" down 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$tb" up 2 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a0=$("$tb" addr h0)
a1=$("$tb" addr h1)
mkdir -m 755 "$work/h1"
"$tb" exec h1 "$bin/softverbsd" --system --foreground --dir "$work/h1/sys" 2>"$work/h1.dlog" &
pids+=($!)
mkdir -m 700 "$work/h0"
SOFTVERBS_ROCE=1 "$tb" exec h0 "$bin/softverbsd" --foreground --idle 0 --dir "$work/h0" 2>"$work/h0.dlog" &
pids+=($!)
for d in "$work/h1/sys" "$work/h0"; do
  for _ in $(seq 100); do [ -S "$d/control" ] && break; sleep 0.05; done
  [ -S "$d/control" ] || { log "softverbsd did not come up in $d"; exit 1; }
done

# sys [--nobody] CMD...: CMD in h1 under the system daemon; on0 CMD...: in h0.
sys() {
  local -a as=()
  [ "$1" = --nobody ] && { as=(setpriv --reuid=65534 --regid=65534 --clear-groups); shift; }
  SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR=$work/h1/sys SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
    "$tb" exec h1 "${as[@]}" "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" "$@"
}
on0() {
  SOFTVERBS_DIR=$work/h0 SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
    "$tb" exec h0 "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" "$@"
}

# The attacker, left running (its stdin a fifo) while the others talk.
mkfifo "$work/attack.in"
# Four lanes: its QPs ask for lanes 0-3 (docs/ROCE.md, "Several engine threads").
sys --nobody env SOFTVERBS_ROCE_THREADS=4 "$attack" "$a0" "$a1" <"$work/attack.in" >"$work/attack.out" 2>&1 &
attacker=$!
pids+=($attacker)
exec {attack_fd}>"$work/attack.in"
for _ in $(seq 200); do grep -q "^checked " "$work/attack.out" && break; sleep 0.05; done
grep -q "^checked " "$work/attack.out" || { log "port_attack did not get its QP on the wire"; exit 1; }
log "attacker: $(tr '\n' ';' <"$work/attack.out")"
grep -E "^(exposed|attached|joined)" "$work/attack.out" >&2 && fail "the attacker has a way into the port's group"
held=$("$tb" exec h1 ss -Huanp "sport = :4791" | grep -c "pid=$attacker,")
[ "$held" -eq 0 ] || fail "the attacker holds $held sockets on :4791"

# pingpong NAME [--nobody]: ibv_rc_pingpong, server in h1 (system daemon), client in h0.
pingpong() {
  local name=$1
  shift
  local -a args=(-g 1 -c -s 4096 -n 200 -p 18515)
  sys "$@" ibv_rc_pingpong "${args[@]}" >"$work/$name.server.out" 2>&1 &
  local spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    "$tb" exec h1 ss -Hltn "sport = :18515" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  on0 ibv_rc_pingpong "${args[@]}" "$a1" >"$work/$name.client.out" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  [ $crc -eq 0 ] && [ $src -eq 0 ] || { fail "$name: server exit $src, client exit $crc"; return; }
  local side
  for side in server client; do
    grep -Eq "^200 iters in [0-9.]+ seconds" "$work/$name.$side.out" || fail "$name $side: no '200 iters' line"
    grep -q "^softverbs roce: qp" "$work/$name.$side.out" || fail "$name $side: the QP was not on the wire"
  done
  log "$name: $(grep -h "iters in" "$work/$name.server.out")"
}
pingpong root
pingpong nobody --nobody

echo done >&$attack_fd
wait $attacker
arc=$?
grep "^foreign" "$work/attack.out" >&2
[ $arc -eq 0 ] || fail "port_attack exit $arc: $(tr '\n' ';' <"$work/attack.out")"
if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "PASS"
exit 0
