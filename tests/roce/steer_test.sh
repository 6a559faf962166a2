#!/usr/bin/env bash
# roce.steer: the daemon steers each arriving datagram, by destination QPN,
# to the socket of the process that owns the QP (docs/ROCE.md, "Steering").
# In host h1 of the test bed, a daemon owning UDP 4791 and probe processes
# (steer_probe: one RC QP on the wire each); from h0, raw datagrams with a
# chosen BTH destination QPN (and a wrong ICRC, so that the engine counts and
# drops them). With the daemon and the probes stopped (SIGSTOP: nobody reads,
# the daemon cannot forward), `ss` shows which socket of the reuseport group
# holds the datagrams:
#   - a probe's QPN: that probe's socket only;
#   - QPN 1 (the CM's), an unknown QPN, a datagram too short for a BTH: the
#     daemon's own socket only;
#   - after a probe is SIGKILLed: its QPN goes to the daemon's socket, and the
#     next probe gets the dead one's socket (same inode, no new socket).
# At the end each probe's SOFTVERBS_ROCE_STATS bad_icrc count is exactly the
# number of datagrams sent to its QPN.
#
#   steer_test.sh SOURCE_DIR BIN_DIR STEER_PROBE
set -u
src=$1 bin=$2 probe=$3
tb=$src/scripts/testbed.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
command -v ss >/dev/null || { log "SKIP: no ss"; exit $SKIP; }
export SOFTVERBS_TESTBED=svs$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
work=$(mktemp -d "${TMPDIR:-/tmp}/svsteer.XXXXXX") || exit 1
chmod 711 "$work"
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ] && [ -s "$work/daemon.log" ] && { log "--- daemon log"; cat "$work/daemon.log" >&2; }
  "$tb" down 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$tb" up 2 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a0=$("$tb" addr h0)
a1=$("$tb" addr h1)
mkdir -m 700 "$work/h1"
SOFTVERBS_ROCE=1 "$tb" exec h1 "$bin/softverbsd" --foreground --idle 0 --dir "$work/h1" 2>"$work/daemon.log" &
daemon=$!
pids+=($daemon)
for _ in $(seq 100); do [ -S "$work/h1/control" ] && break; sleep 0.05; done
[ -S "$work/h1/control" ] || { log "softverbsd did not come up"; exit 1; }

# start NAME: a probe in h1, its stdin a fifo (a line ends it); sets NAME_pid, NAME_qpn.
start() {
  local name=$1
  mkfifo "$work/$name.in"
  SOFTVERBS_DIR=$work/h1 SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
    "$tb" exec h1 "$bin/softverbs" run -- "$probe" "$a0" <"$work/$name.in" >"$work/$name.out" 2>&1 &
  local p=$!
  pids+=($p)
  exec {fd}>"$work/$name.in"
  eval "${name}_fd=$fd"
  for _ in $(seq 100); do grep -q "^qpn " "$work/$name.out" && break; sleep 0.05; done
  local q
  q=$(awk '$1 == "qpn" {print $2}' "$work/$name.out")
  [ -n "$q" ] || { log "probe $name did not attach:"; cat "$work/$name.out" >&2; exit 1; }
  # The pid that holds the socket: the probe itself (softverbs run and ip netns exec exec it).
  eval "${name}_pid=$p ${name}_qpn=$q"
  log "probe $name: pid $p qpn $q"
}
stop_all() { local p; for p in "${pids[@]}"; do kill -STOP "$p" 2>/dev/null; done; }
cont_all() { local p; for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; done; }

# send QPN COUNT [LEN]: COUNT datagrams from h0 to h1:4791, a RC SEND Only for
# QPN with a wrong ICRC (LEN 4: a datagram too short for a BTH).
send() {
  "$tb" exec h0 /usr/bin/python3 - "$a1" "$1" "$2" "${3:-64}" <<'PY'
import socket, struct, sys
dst, qpn, count, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
bth = struct.pack(">BBHI I", 0x04, 0, 0xffff, qpn & 0xffffff, 0)
dg = (bth + bytes(range(48)) + b"\xde\xad\xbe\xef")[:length] if length >= 16 else b"\x04\x00\xff\xff"[:length]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count):
    s.sendto(dg, (dst, 4791))
PY
}

# holders PID: "ino recvq" of the h1 sockets on :4791 that PID holds;
# daemon_only: those only the daemon holds.
sockets() { "$tb" exec h1 ss -Huanpe "sport = :4791" 2>/dev/null; }
holders() { sockets | grep "pid=$1," | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^ino:/) print substr($i, 5), $2}'; }
by_ino() { sockets | awk -v ino="ino:$1" '{for (i = 1; i <= NF; i++) if ($i == ino) print $2}'; }
queued() { sockets | awk '{s += $2} END {print s + 0}'; }

# expect_at WHAT PID|daemon QPN COUNT [LEN]: with everyone stopped, the
# datagrams for QPN are queued on that socket and on no other.
expect_at() {
  local what=$1 who=$2
  shift 2
  stop_all
  sleep 0.1
  local before after mine
  before=$(queued)
  send "$@"
  sleep 0.2
  after=$(queued)
  if [ "$who" = daemon ]; then mine=$(by_ino "$daemon_ino"); else mine=$(holders "$who" | awk '{print $2}'); fi
  if [ "$after" -le "$before" ]; then
    fail "$what: nothing queued"
  elif ! [[ "$mine" =~ ^[0-9]+$ ]] || [ "$mine" -ne "$after" ]; then
    fail "$what: queued $after bytes in all, $mine on the expected socket"
    sockets >&2
  else
    log "$what: all $after queued bytes on the expected socket"
  fi
  cont_all
  sleep 0.3
}

# The daemon's own socket on h1's IPv4 address: the group's index 0.
daemon_ino=$(sockets | grep -F "$a1:" | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^ino:/) print substr($i, 5)}')
[[ "$daemon_ino" =~ ^[0-9]+$ ]] || { log "no single daemon socket on $a1:4791:"; sockets >&2; exit 1; }
start A
start B
start D
n_sockets=$(sockets | wc -l)
log "$n_sockets sockets on :4791 in h1"
[ "$(holders "$A_pid" | wc -l)" -eq 1 ] || fail "A holds $(holders "$A_pid" | wc -l) sockets, not 1"
expect_at "QPN of A" "$A_pid" "$A_qpn" 40
expect_at "QPN of B" "$B_pid" "$B_qpn" 25
expect_at "QPN of D" "$D_pid" "$D_qpn" 5
expect_at "QPN 1" daemon 1 10
expect_at "unknown QPN" daemon $((0xabcdef)) 10
expect_at "short datagram" daemon 0 10 4

# D dies: its QPN falls back to the daemon, its socket goes to the next probe.
d_ino=$(holders "$D_pid" | awk '{print $1}')
kill -9 "$D_pid"
wait "$D_pid" 2>/dev/null
sleep 0.3
expect_at "QPN of dead D" daemon "$D_qpn" 20
start C
[ "$(sockets | wc -l)" -eq "$n_sockets" ] || fail "a new socket for C: $(sockets | wc -l), was $n_sockets"
[ "$(holders "$C_pid" | awk '{print $1}')" = "$d_ino" ] || fail "C did not get D's socket (ino $d_ino)"
expect_at "QPN of C (D's old socket)" "$C_pid" "$C_qpn" 15
expect_at "QPN of dead D, C alive" daemon "$D_qpn" 20

# What each probe's engine saw: exactly its own datagrams.
for n in A B C; do
  eval "echo quit >&\$${n}_fd"
  eval "wait \$${n}_pid"
done
for spec in A:40 B:25 C:15; do
  n=${spec%%:*} want=${spec#*:}
  got=$(grep -o "bad_icrc [0-9]*" "$work/$n.out" | awk '{s += $2} END {print s + 0}')
  [ "$got" -eq "$want" ] || { fail "probe $n counted $got datagrams, sent $want"; cat "$work/$n.out" >&2; }
done
kill -0 "$daemon" 2>/dev/null || fail "softverbsd died"
if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "PASS"
exit 0
