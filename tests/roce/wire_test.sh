#!/usr/bin/env bash
# roce.wire.*: Debian's unmodified ibv_*_pingpong and perftest programs on
# softverbs between the two hosts (network namespaces) of the test bed, over
# RoCEv2 (docs/ROCE.md, "Integration"). Each host runs its own softverbsd
# (own SOFTVERBS_DIR, SOFTVERBS_ROCE=1: it owns UDP 4791 there); the
# programs use -g/-x with the GID index of the host's veth address (1: IPv4,
# 2: IPv6). Faults (SOFTVERBS_FAULTS, read by the daemons, applied by every
# sender's fault hook) are checked to have happened from the
# SOFTVERBS_ROCE_STATS lines the library prints when a QP is destroyed.
#
#   wire_test.sh SOURCE_DIR BIN_DIR CASE
#   CASE: rc | rc_faults | rc_corrupt | rc_plan | rc_wc | rc_port | rc6_faults | uc | ud | ud_reorder | ud6 | srq | write_bw_faults |
#         send_lat_faults | read_bw_faults | write_bw_uc | send_bw_ud | peer_dies | capture | mw |
#         xsrq | xsrq6 | xsrq_events | xsrq_faults | send_bw_xrc | write_bw_xrc | read_bw_xrc | atomic_bw_xrc |
#         send_lat_xrc_faults | xrc_capture | xrc_peer | sv_capture
# Exit 0 pass, 1 fail, 77 skip (not root, no namespaces, a program missing).
set -u
src=$1 bin=$2 case=$3
tb=$src/scripts/testbed.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
export SOFTVERBS_TESTBED=svw$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
TIMEOUT=${ROCE_WIRE_TIMEOUT:-90}
work=$(mktemp -d "${TMPDIR:-/tmp}/svwire.XXXXXX") || exit 1
chmod 711 "$work"
pids=()
daemons=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

cleanup() {
  local rc=$? p
  for p in "${pids[@]}" "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}" "${daemons[@]}"; do kill -9 "$p" 2>/dev/null; done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then
    for p in "$work"/*.dlog; do [ -s "$p" ] && { log "--- $p"; cat "$p" >&2; }; done
  fi
  "$tb" down 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

for p in softverbs softverbsd; do [ -x "$bin/$p" ] || { log "missing $bin/$p"; exit 1; }; done
"$tb" up 2 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a1=$("$tb" addr h1)

# start_daemons FAULTS: a fresh softverbsd in each host.
start_daemons() {
  local h p
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  daemons=()
  for h in h0 h1; do
    rm -rf "${work:?}/$h"
    mkdir -m 700 "$work/$h"
    SOFTVERBS_ROCE=1 SOFTVERBS_FAULTS=$1 "$tb" exec "$h" "$bin/softverbsd" --foreground --idle 0 \
      --dir "$work/$h" 2>"$work/$h.dlog" &
    daemons+=($!)
  done
  for h in h0 h1; do
    for _ in $(seq 100); do [ -S "$work/$h/control" ] && break; sleep 0.05; done
    [ -S "$work/$h/control" ] || { log "softverbsd did not come up in $h"; exit 1; }
  done
}

# on HOST CMD...: CMD in HOST on softverbs (its own daemon), stats on.
on() {
  local h=$1
  shift
  SOFTVERBS_DIR=$work/$h SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
    "$tb" exec "$h" "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" stdbuf -oL "$@"
}

# pair NAME PORT SERVER_CMD... -- CLIENT_CMD...: the server in h1, the client
# in h0; outputs in $work/NAME.server and .client. Returns 0 iff both exit 0.
pair() {
  local name=$1 port=$2
  shift 2
  local -a server=() client=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  on h1 "${server[@]}" >"$work/$name.server" 2>&1 &
  local spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    "$tb" exec h1 ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.05
  done
  on h0 "${client[@]}" >"$work/$name.client" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    fail "$name: server exit $src, client exit $crc"
    show "$name"
    return 1
  fi
  return 0
}

show() {
  local s
  for s in server client; do
    log "----- $1.$s:"
    cat "$work/$1.$s" >&2
  done
}

# stat NAME SIDE FIELD: the sum of FIELD over the QPs' stats lines.
stat() {
  grep -o "$3 [0-9]*" "$work/$1.$2" | awk '{s += $2} END {print s + 0}'
}

# check_pingpong NAME SIZE ITERS: both sides' summary lines (as
# tests/compat/rc_pingpong.sh), no error reported, every QP on the wire
# (a stats line) with a clean ICRC.
check_pingpong() {
  local name=$1 size=$2 iters=$3 side out bytes=$(($2 * $3 * 2))
  for side in server client; do
    out=$work/$name.$side
    grep -Eq "^$bytes bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" "$out" ||
      fail "$name $side: no '$bytes bytes in ... seconds' line"
    grep -Eq "^$iters iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" "$out" ||
      fail "$name $side: no '$iters iters in ... seconds' line"
    # --chk prints "invalid data in page N" on a mismatch and still exits 0.
    grep -qi 'invalid\|fail\|error\|couldn' "$out" && fail "$name $side: reported an error"
    grep -q "^softverbs roce: qp" "$out" || fail "$name $side: the QP was not on the wire"
    # (rc_corrupt corrupts datagrams on purpose.)
    [ "$name" = rc_corrupt ] || [ "$(stat "$name" "$side" bad_icrc)" -eq 0 ] || fail "$name $side: datagrams with a bad ICRC"
  done
}

# pingpong_fails NAME PORT PLAN: Debian's ibv_rc_pingpong between the hosts,
# the server (h1) with fault plan PLAN (its log in $work/NAME.log), which
# fails its third SEND: the server must say "transport retry counter
# exceeded (12)" for wr_id 2 and exit 1, as on hardware; its client, left
# waiting for a pong, is stopped.
pingpong_fails() {
  local name=$1 port=$2 plan=$3 spid cpid src
  command -v ibv_rc_pingpong >/dev/null || { log "SKIP: ibv_rc_pingpong not installed"; exit $SKIP; }
  start_daemons ""
  local -a args=(-g 1 -s 64 -n 20 -p "$port")
  on h1 env SOFTVERBS_FAULTS="$plan" SOFTVERBS_FAULTS_LOG="$work/$name.log" \
    timeout -k 5 "$TIMEOUT" ibv_rc_pingpong "${args[@]}" >"$work/$name.server" 2>&1 &
  spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    "$tb" exec h1 ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  on h0 timeout -k 5 30 ibv_rc_pingpong "${args[@]}" "$a1" >"$work/$name.client" 2>&1 &
  cpid=$!
  pids+=($cpid)
  wait $spid
  src=$?
  kill $cpid 2>/dev/null
  [ $src -eq 1 ] || fail "$name: server exit $src, not 1"
  grep -qF "Failed status transport retry counter exceeded (12) for wr_id 2" "$work/$name.server" ||
    fail "$name: server: no 'Failed status transport retry counter exceeded (12) for wr_id 2'"
}

# check_faults NAME: drops and reordering did happen, and were recovered from.
check_faults() {
  local d r
  d=$(($(stat "$1" server fault_dropped) + $(stat "$1" client fault_dropped)))
  r=$(($(stat "$1" server fault_delayed) + $(stat "$1" client fault_delayed)))
  log "$1: $d datagrams dropped, $r delayed by the fault hook"
  [ "$d" -gt 0 ] || fail "$1: no datagram was dropped: faults not injected?"
  [ "$r" -gt 0 ] || fail "$1: no datagram was reordered: faults not injected?"
}

# pingpong NAME PROG GIDX SERVER_ADDR SIZE ITERS [ARGS...]
pingpong() {
  local name=$1 prog=$2 g=$3 addr=$4 size=$5 iters=$6
  shift 6
  command -v "$prog" >/dev/null || { log "SKIP: $prog not installed"; exit $SKIP; }
  local -a args=(-g "$g" -c -s "$size" -n "$iters" -p 18515 "$@")
  pair "$name" 18515 "$prog" "${args[@]}" -- "$prog" "${args[@]}" "$addr" && check_pingpong "$name" "$size" "$iters"
}

# perf NAME PROG ITERS SIZE [ARGS...]: perftest over GID 1; the result line
# "SIZE ITERS ..." on both sides.
perf() {
  local name=$1 prog=$2 iters=$3 size=$4
  shift 4
  command -v "$prog" >/dev/null || { log "SKIP: $prog not installed"; exit $SKIP; }
  local -a args=(-x 1 -n "$iters" -s "$size" -p 18515 "$@")
  pair "$name" 18515 "$prog" "${args[@]}" -- "$prog" "${args[@]}" "$a1" || return 1
  local side
  for side in server client; do
    grep -Eq "^ *$size +$iters +[0-9.]+" "$work/$name.$side" || fail "$name $side: no '$size $iters ...' result line"
    grep -qi 'fail\|error\|couldn' "$work/$name.$side" && fail "$name $side: reported an error"
    grep -q "^softverbs roce: qp" "$work/$name.$side" || fail "$name $side: the QP was not on the wire"
  done
  [ $failures -eq 0 ] || show "$name"
}

# xsrq NAME SIZE ITERS [ARGS...]: Debian's ibv_xsrq_pingpong (XRC, IBTA annex A14:
# an XRC domain, an XRC SRQ, XRC send and receive QPs on each side, each
# send naming the peer's SRQ) between the hosts over GID 1. Checked as
# tests/compat/xsrq_pingpong.sh does on one host: "success" and the peer's
# address line on both sides, no error; and every QP on the wire.
xsrq() {
  local name=$1 size=$2 iters=$3 side out
  shift 3
  command -v ibv_xsrq_pingpong >/dev/null || { log "SKIP: ibv_xsrq_pingpong not installed"; exit $SKIP; }
  local -a args=(-g 1 -p 18515 -s "$size" -n "$iters" "$@")
  pair "$name" 18515 ibv_xsrq_pingpong "${args[@]}" -- ibv_xsrq_pingpong "${args[@]}" "$a1" || return 1
  for side in server client; do
    out=$work/$name.$side
    grep -q '^success$' "$out" || fail "$name $side: no 'success' line"
    grep -Eq 'remote: LID [0-9a-f]+, QPN RECV [0-9a-f]+ SEND [0-9a-f]+, PSN [0-9a-f]+, SRQN [0-9a-f]+' "$out" ||
      fail "$name $side: no remote address line"
    grep -qi 'fail\|error\|couldn\|unable' "$out" && fail "$name $side: reported an error"
    # Its XRC send and receive QPs: two stats lines each side.
    [ "$(grep -c "^softverbs roce: qp" "$out")" -ge 2 ] || fail "$name $side: the XRC QPs were not on the wire"
    [ "$(stat "$name" "$side" bad_icrc)" -eq 0 ] || fail "$name $side: datagrams with a bad ICRC"
  done
  [ $failures -eq 0 ] || show "$name"
  [ $failures -eq 0 ]
}

lanes() {
  # roce.wire.lanes: several RoCE threads per process (docs/ROCE.md, "Several engine
  # threads"): 4 RC QPs of one process on one CQ, each served by its own
  # lane, with loss and reordering; every byte, every completion and each
  # QP's order checked (tests/roce/lanes_wire_peer.cc); the server's
  # threads named; each side's QPs spread over the 4 lanes.
  start_daemons "$faults"
  mkdir -m 777 "$work/lanes"
  # Each lane sends from a UDP port of its own (docs/ROCE.md): h1's veth
  # sees 4 source ports from each host, none of them 4791.
  have_tshark=0
  if command -v tshark >/dev/null; then
    have_tshark=1
    "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp dst port 4791" -w "$work/lanes.pcap" 2>"$work/lanes.tshark" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/lanes.tshark" 2>/dev/null && break; sleep 0.1; done
  fi
  on h1 env SOFTVERBS_ROCE_THREADS=4 "$bin/lanes_wire_peer" server "$work/lanes" 4 300 >"$work/lanes.server" 2>&1 &
  spid=$!
  pids+=($spid)
  on h0 env SOFTVERBS_ROCE_THREADS=4 "$bin/lanes_wire_peer" client "$work/lanes" 4 300 >"$work/lanes.client" 2>&1
  crc=$?
  wait $spid
  src=$?
  if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
    fail "lanes: server exit $src, client exit $crc"
  fi
  for side in server client; do
    grep -q "^lanes_wire_peer $side: ok" "$work/lanes.$side" || fail "lanes $side: no 'ok'"
    lanes=$(grep "^softverbs roce: qp" "$work/lanes.$side" | grep -o "lane [0-9]*" | sort -u | wc -l)
    [ "$lanes" -eq 4 ] || fail "lanes $side: its 4 QPs were served by $lanes lanes, not 4"
    [ "$(stat lanes "$side" bad_icrc)" -eq 0 ] || fail "lanes $side: datagrams with a bad ICRC"
  done
  log "lanes server: $(grep "^threads:" "$work/lanes.server")"
  log "lanes server: $(grep -o "qp [0-9]*:\|lane [0-9]*" "$work/lanes.server" | paste -sd ' ')"
  for t in 0 1 2 3; do
    grep -q "^threads:.* sv-roce-$t\b" "$work/lanes.server" || fail "lanes server: no thread sv-roce-$t"
  done
  check_faults lanes
  if [ $have_tshark -eq 1 ]; then
    sleep 0.5
    kill $cap 2>/dev/null
    wait $cap 2>/dev/null
    tshark -r "$work/lanes.pcap" -T fields -e ip.src -e udp.srcport 2>/dev/null | sort -u >"$work/lanes.ports"
    log "lanes: source address and port pairs: $(tr '\t\n' ': ' <"$work/lanes.ports")"
    for a in "$("$tb" addr h0)" "$a1"; do
      n=$(awk -v a="$a" '$1 == a && $2 != 4791' "$work/lanes.ports" | wc -l)
      [ "$n" -eq 4 ] || fail "lanes: $a sent from $n ports other than 4791, not 4 (one per lane)"
    done
    grep -q "[[:space:]]4791$" "$work/lanes.ports" && fail "lanes: a lane sent from port 4791"
  fi
  r=$(($(stat lanes server retransmit_timeouts) + $(stat lanes client retransmit_timeouts) +
    $(stat lanes server seq_naks_received) + $(stat lanes client seq_naks_received)))
  log "lanes: $r retransmissions (timeouts and sequence NAKs)"
  [ "$r" -gt 0 ] || fail "lanes: nothing was retransmitted: loss not recovered by retransmission?"
  [ $failures -eq 0 ] || show lanes
}

# Fixed seeds: each run drops and delays the same datagrams (as far as the
# timing of retransmissions allows), so a failure can be replayed.
seed=${ROCE_WIRE_SEED:-7}
faults="drop=0.01,reorder=0.01,seed=$seed"
case $case in
  rc)
    start_daemons ""
    pingpong rc ibv_rc_pingpong 1 "$a1" 4096 200
    ;;
  mw)
    # A type 2 window bound with IBV_WR_BIND_MW, written and read through
    # from the other host, invalidated by its SEND with Invalidate; bound
    # again and invalidated with IBV_WR_LOCAL_INV, after which the other
    # host's WRITE gets a remote access error (tests/roce/mw_wire_peer.cc).
    start_daemons ""
    mkdir -m 777 "$work/mw"
    on h1 "$bin/mw_wire_peer" server "$work/mw" >"$work/mw.server" 2>&1 &
    spid=$!
    pids+=($spid)
    on h0 "$bin/mw_wire_peer" client "$work/mw" >"$work/mw.client" 2>&1
    crc=$?
    wait $spid
    src=$?
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
      fail "mw: server exit $src, client exit $crc"
      show mw
    fi
    for side in server client; do
      grep -q "^softverbs roce: qp" "$work/mw.$side" || fail "mw $side: the QP was not on the wire"
    done
    ;;
  lanes)
    lanes
    ;;
  lanes_forwarded)
    # roce.wire.lanes_forwarded: the same with the daemons' steering
    # programs holding no QPN (SOFTVERBS_TEST_STEER_LIMIT=0, as when a
    # program is full): every datagram reaches the daemon, is forwarded on
    # the process's arrival socket, read by lane 0 and handed to the QP's
    # lane (roce_hub.cc, Hub::hand).
    export SOFTVERBS_TEST_STEER_LIMIT=0
    lanes
    ;;
  xrc_peer)
    # XRC's checks on the wire (tests/roce/xrc_wire_peer.cc): each SEND in
    # the SRQ it names, keys checked in that SRQ's PD, an unknown SRQ and an
    # SRQ of another XRC domain refused (IBV_WC_REM_INV_REQ_ERR), another
    # PD's key refused (IBV_WC_REM_ACCESS_ERR). 1% loss and reordering are
    # injected, though a run of some 25 datagrams is seldom hit. The client
    # asks ibv_query_qp right after polling each error: with the daemon's
    # record of the error state delayed 5 ms (SOFTVERBS_TEST_SLOW_ERROR), it
    # must still be told ERR (it was told RTS once in CI, before the error
    # state was recorded ahead of the completion).
    start_daemons "$faults"
    mkdir -m 777 "$work/xrc"
    on h1 "$bin/xrc_wire_peer" server "$work/xrc" >"$work/xrc.server" 2>&1 &
    spid=$!
    pids+=($spid)
    on h0 env SOFTVERBS_TEST_SLOW_ERROR=5000 "$bin/xrc_wire_peer" client "$work/xrc" >"$work/xrc.client" 2>&1
    crc=$?
    wait $spid
    src=$?
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
      fail "xrc_peer: server exit $src, client exit $crc"
      show xrc
    fi
    for side in server client; do
      grep -q "^xrc_wire_peer $side: ok" "$work/xrc.$side" || fail "xrc_peer $side: no 'ok'"
      [ "$(grep -c "^softverbs roce: qp" "$work/xrc.$side")" -eq 4 ] || fail "xrc_peer $side: not 4 QPs on the wire"
    done
    ;;
  rc_faults)
    start_daemons "$faults"
    pingpong rc_faults ibv_rc_pingpong 1 "$a1" 4096 500 && check_faults rc_faults
    ;;
  rc_corrupt)
    # A fault plan (docs/LAB.md "Faults") that corrupts packets: each one
    # corrupted fails the receiver's ICRC check, is dropped there and
    # recovered by retransmission; the pingpong completes.
    start_daemons "seed=$seed;wire:corrupt=0.02"
    pingpong rc_corrupt ibv_rc_pingpong 1 "$a1" 4096 300 || exit 1
    c=$(($(stat rc_corrupt server fault_corrupted) + $(stat rc_corrupt client fault_corrupted)))
    i=$(($(stat rc_corrupt server bad_icrc) + $(stat rc_corrupt client bad_icrc)))
    log "rc_corrupt: $c datagrams corrupted, $i refused for their ICRC"
    [ "$c" -gt 0 ] || fail "rc_corrupt: no datagram was corrupted: plan not applied?"
    [ "$i" -gt 0 ] || fail "rc_corrupt: no corrupted datagram was refused by the ICRC check"
    ;;
  rc_plan)
    # The programs' own plan (daemons without one): their senders drop and
    # delay datagrams, and log each (SOFTVERBS_FAULTS_LOG): one "drop" line
    # per datagram the endpoint counts as dropped by the fault hook.
    command -v ibv_rc_pingpong >/dev/null || { log "SKIP: ibv_rc_pingpong not installed"; exit $SKIP; }
    start_daemons ""
    p="seed=$seed;wire:drop=0.02,reorder=0.02,delay_us=300"
    args=(-g 1 -c -s 4096 -n 300 -p 18515)
    pair rc_plan 18515 env SOFTVERBS_FAULTS="$p" SOFTVERBS_FAULTS_LOG="$work/rc_plan.log.server" ibv_rc_pingpong "${args[@]}" \
      -- env SOFTVERBS_FAULTS="$p" SOFTVERBS_FAULTS_LOG="$work/rc_plan.log.client" ibv_rc_pingpong "${args[@]}" "$a1" &&
      check_pingpong rc_plan 4096 300 && check_faults rc_plan
    for side in server client; do
      d=$(stat rc_plan $side fault_dropped)
      l=$(grep -c '^wire dqp=0x[0-9a-f]* psn=[0-9]* opcode=0x[0-9a-f]* drop$' "$work/rc_plan.log.$side")
      log "rc_plan $side: $d dropped, $l drops logged, $(wc -l <"$work/rc_plan.log.$side") faults logged"
      [ "$d" -eq "$l" ] || fail "rc_plan $side: $d datagrams dropped but $l drops logged"
    done
    ;;
  rc_wc)
    # A completion in error from the server's own plan on the wire path: its
    # third SEND (its third pong) fails with RETRY_EXC_ERR once the two
    # before it completed; Debian's ibv_rc_pingpong says so for wr_id 2 and
    # exits 1, as on hardware; the plan's log names op 3.
    pingpong_fails rc_wc 18517 "wc:op=3,status=RETRY_EXC_ERR"
    grep -Eq "^wc qp=0x[0-9a-f]+ op=3 wr_id=2 opcode=SEND status=RETRY_EXC_ERR$" "$work/rc_wc.log" ||
      fail "rc_wc: the fault log does not name op 3"
    [ "$failures" -eq 0 ] || show rc_wc
    ;;
  rc_port)
    # The server's own plan takes its port down just before its third SEND
    # (its third pong), for 2 s: on the wire as on shared memory, that
    # request completes with RETRY_EXC_ERR (no packet leaves a port that is
    # down; its retries would run out). Debian's ibv_rc_pingpong says so
    # for wr_id 2 and exits 1, as on hardware; the plan's log has the port
    # going down and the failed request.
    pingpong_fails rc_port 18518 "port:op=3,down_ms=2000"
    grep -Eq "^port op=3 qp=0x[0-9a-f]+: down for 2000 ms$" "$work/rc_port.log" ||
      fail "rc_port: the fault log does not have the port going down at op 3"
    grep -Eq "^port down: qp=0x[0-9a-f]+ wr_id=2 opcode=SEND status=RETRY_EXC_ERR$" "$work/rc_port.log" ||
      fail "rc_port: the fault log does not name the failed request"
    [ "$failures" -eq 0 ] || { show rc_port; cat "$work/rc_port.log" >&2; }
    ;;
  rc6_faults)
    start_daemons "$faults,dup=0.01"
    # The out-of-band exchange stays on IPv4 (the pingpong server listens on
    # the first address getaddrinfo gives); the RoCE traffic is IPv6.
    pingpong rc6_faults ibv_rc_pingpong 2 "$a1" 4096 500 && check_faults rc6_faults
    ;;
  uc)
    # UC has no recovery (IBTA 9.8): a lost message is gone, and
    # ibv_uc_pingpong would wait for it for ever. No faults.
    start_daemons ""
    pingpong uc ibv_uc_pingpong 1 "$a1" 4096 200
    ;;
  ud)
    # UD: one MTU per message; the veth's 1500 bytes carry 1024.
    start_daemons ""
    pingpong ud ibv_ud_pingpong 1 "$a1" 1024 200
    ;;
  ud_reorder)
    start_daemons "reorder=0.05,seed=$seed"
    pingpong ud_reorder ibv_ud_pingpong 1 "$a1" 1024 300
    ;;
  ud6)
    # UD over the IPv6 GID: the QP's second address (docs/ROCE.md,
    # "Multicast": a UD QP listens on GID 1 and also attaches to the first
    # GID of the other family), steered there too.
    start_daemons ""
    pingpong ud6 ibv_ud_pingpong 2 "$a1" 1024 200
    ;;
  srq)
    # 16 RC QPs taking their receives from one SRQ, on demand.
    start_daemons ""
    pingpong srq ibv_srq_pingpong 1 "$a1" 4096 200
    ;;
  write_bw_uc)
    start_daemons ""
    perf write_bw_uc ib_write_bw 1000 65536 -c UC
    ;;
  xsrq)
    start_daemons ""
    xsrq xsrq 4096 200
    ;;
  xsrq6)
    # RoCEv2 over IPv6 (GID 2; the out-of-band exchange stays on IPv4).
    start_daemons ""
    xsrq xsrq6 4096 200 -g 2
    ;;
  xsrq_events)
    # -e: each side sleeps on its CQs' completion channel.
    start_daemons ""
    xsrq xsrq_events 4096 200 -e
    ;;
  xsrq_faults)
    start_daemons "$faults,dup=0.01"
    xsrq xsrq_faults 4096 300 && check_faults xsrq_faults
    ;;
  send_bw_xrc)
    # perftest's XRC: the server's XRC SRQ receives, the client's XRC send
    # QP names it in every SEND's XRCETH.
    start_daemons ""
    perf send_bw_xrc ib_send_bw 1000 65536 -c XRC
    ;;
  write_bw_xrc)
    start_daemons ""
    perf write_bw_xrc ib_write_bw 1000 65536 -c XRC
    ;;
  read_bw_xrc)
    start_daemons ""
    perf read_bw_xrc ib_read_bw 500 65536 -c XRC
    ;;
  atomic_bw_xrc)
    start_daemons ""
    perf atomic_bw_xrc ib_atomic_bw 1000 8 -c XRC
    ;;
  send_lat_xrc_faults)
    start_daemons "$faults"
    perf send_lat_xrc ib_send_lat 1000 64 -c XRC && check_faults send_lat_xrc
    ;;
  xrc_capture)
    # XRC traffic captured on h1's veth: every frame's ICRC (independent
    # code) and DF; tshark names the XRC opcodes (it decodes nothing after
    # their BTH): SEND Only (ibv_xsrq_pingpong's messages fit one MTU) and
    # the XRC ACK; each XRC request's XRCETH has its reserved byte 0.
    command -v tshark >/dev/null || { log "SKIP: no tshark"; exit $SKIP; }
    start_daemons ""
    "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/wire.pcap" 2>"$work/tshark.log" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
    xsrq xrc_capture 512 20
    sleep 0.5
    kill $cap 2>/dev/null
    wait $cap 2>/dev/null
    /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/wire.pcap" 0xa4,0xb1 ||
      fail "xrc_capture: check_capture.py"
    ;;
  send_bw_ud)
    start_daemons ""
    perf send_bw_ud ib_send_bw 1000 1024 -c UD
    ;;
  peer_dies)
    # The server is killed mid-run while the client always has WRITEs in
    # flight (ib_write_bw -D): the retransmissions go unanswered and a WR
    # completes with IBV_WC_RETRY_EXC_ERR (12; IBTA 9.7.6.1.3) after
    # retry_cnt retries, instead of hanging. (A pingpong is no good here: if
    # the server dies between acknowledging and answering, the client waits
    # for its receive for ever, as on any RDMA device.)
    command -v ib_write_bw >/dev/null || { log "SKIP: ib_write_bw not installed"; exit $SKIP; }
    start_daemons ""
    on h1 timeout -s KILL 3 ib_write_bw -x 1 -D 30 -p 18515 >"$work/dies.server" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do
      "$tb" exec h1 ss -Hltn "sport = :18515" 2>/dev/null | grep -q . && break
      sleep 0.05
    done
    start=$SECONDS
    on h0 ib_write_bw -x 1 -D 30 -p 18515 "$a1" >"$work/dies.client" 2>&1 && fail "peer_dies: the client succeeded"
    grep -q "Failed status 12" "$work/dies.client" || { fail "peer_dies: no RETRY_EXC_ERR completion"; show dies; }
    [ $((SECONDS - start)) -lt 25 ] || fail "peer_dies: took $((SECONDS - start)) s"
    ;;
  write_bw_faults)
    start_daemons "$faults"
    perf write_bw ib_write_bw 2000 65536 && check_faults write_bw
    ;;
  send_lat_faults)
    start_daemons "$faults"
    perf send_lat ib_send_lat 1000 64 && check_faults send_lat
    ;;
  read_bw_faults)
    # Loss costs a READ an ACK timeout (perftest's timeout 14: 67 ms) each.
    start_daemons "drop=0.002,reorder=0.01,seed=$seed"
    perf read_bw ib_read_bw 200 65536 && check_faults read_bw
    ;;
  capture)
    # One run captured on h1's veth: every frame's ICRC (independent code)
    # and DF, and tshark decodes each as InfiniBand with the opcodes an RC
    # SEND of 4 MTUs and its ACKs use. The senders use UDP GSO (a message's
    # packets in one send); with the veths' tx-udp-segmentation off the
    # kernel cuts those sends before the veth, as it does before a NIC
    # without UDP segmentation offload, so the capture shows the datagrams
    # as a wire would carry them: IPv4 IDs 0, 1, 2... within a send, each
    # ICRC computed over its real ID (an rxe peer checks exactly that).
    command -v tshark >/dev/null || { log "SKIP: no tshark"; exit $SKIP; }
    for h in h0 h1; do
      "$tb" exec $h /usr/bin/python3 "$src/scripts/netdev_feature.py" eth0 tx-udp-segmentation off ||
        fail "capture: cannot turn tx-udp-segmentation off"
    done
    start_daemons ""
    "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/wire.pcap" 2>"$work/tshark.log" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
    pingpong capture ibv_rc_pingpong 1 "$a1" 4096 50
    sleep 0.5
    kill $cap 2>/dev/null
    wait $cap 2>/dev/null
    # SEND First, Middle, Last; ACK.
    /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/wire.pcap" 0x00,0x01,0x02,0x11 ||
      fail "capture: check_capture.py"
    # The GSO sends happened, and were cut into datagrams with IDs 1, 2, 3.
    gso=$(($(stat capture server gso_sends) + $(stat capture client gso_sends)))
    log "capture: $gso GSO sends"
    [ "$gso" -gt 0 ] || fail "capture: no UDP GSO send"
    ids=$(tshark -r "$work/wire.pcap" -T fields -e ip.id 2>/dev/null | sort -u | wc -l)
    [ "$ids" -ge 4 ] || fail "capture: $ids distinct IP IDs: GSO sends were not cut by the kernel?"
    ;;
  sv_capture)
    # `softverbs capture` of the wire path (docs/LAB.md, "Capture"): on h1,
    # beside tshark on h1's veth, during one ibv_rc_pingpong. The datagrams
    # h1's process sent and received, as `softverbs capture` has them, must
    # be those on the veth (opcode, destination QP, PSN and UDP length each,
    # as tshark decodes them), each with a right ICRC (check_capture.py).
    # The senders' UDP GSO sends are cut into datagrams before the veth
    # (as the capture case), so that tshark sees each one.
    command -v tshark >/dev/null || { log "SKIP: no tshark"; exit $SKIP; }
    for h in h0 h1; do
      "$tb" exec $h /usr/bin/python3 "$src/scripts/netdev_feature.py" eth0 tx-udp-segmentation off ||
        fail "sv_capture: cannot turn tx-udp-segmentation off"
    done
    start_daemons ""
    "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/wire.pcap" 2>"$work/tshark.log" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
    SOFTVERBS_DIR=$work/h1 "$tb" exec h1 "$bin/softverbs" capture -w "$work/sv.pcapng" --duration 60 \
      2>"$work/svcap.log" &
    svcap=$!
    pids+=($svcap)
    for _ in $(seq 100); do grep -q capturing "$work/svcap.log" 2>/dev/null && break; sleep 0.05; done
    pingpong sv_capture ibv_rc_pingpong 1 "$a1" 4096 20
    sleep 0.5
    kill $cap $svcap 2>/dev/null
    wait $cap $svcap 2>/dev/null
    cat "$work/svcap.log" >&2
    fields=(-T fields -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn -e udp.length)
    tshark -r "$work/wire.pcap" "${fields[@]}" 2>/dev/null | sort >"$work/wire.tsv"
    tshark -r "$work/sv.pcapng" "${fields[@]}" 2>/dev/null | sort >"$work/sv.tsv"
    n=$(wc -l <"$work/sv.tsv")
    log "sv_capture: $n packets captured by softverbs capture, $(wc -l <"$work/wire.tsv") on the veth"
    [ "$n" -ge 100 ] || fail "sv_capture: only $n packets"
    cmp -s "$work/wire.tsv" "$work/sv.tsv" || { diff "$work/wire.tsv" "$work/sv.tsv" | head >&2; fail "sv_capture: not the veth's packets"; }
    tshark -r "$work/sv.pcapng" -F pcap -w "$work/sv.pcap" 2>/dev/null || fail "sv_capture: tshark cannot convert"
    /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/sv.pcap" 0x00,0x01,0x02,0x11 ||
      fail "sv_capture: check_capture.py"
    ;;
  *)
    log "unknown case $case"
    exit 2
    ;;
esac
for p in "${daemons[@]}"; do kill -0 "$p" 2>/dev/null || fail "a softverbsd died"; done
if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "PASS"
exit 0
