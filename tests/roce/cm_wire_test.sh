#!/usr/bin/env bash
# roce.wire.cm.*: the connection manager between hosts (docs/RDMACM.md,
# "Between hosts"). Debian's unmodified rdma_cm programs (rdmacm-utils,
# perftest -R, libfabric) on softverbs, the server in one namespace of the
# test bed and the client in the other, each host with its own softverbsd
# (SOFTVERBS_ROCE=1), whose CM gateway carries the CM's MADs on QP1 over
# RoCEv2; the QPs then run over RoCEv2 too. Plus rejection with private
# data and an unreachable host (cm_wire_peer).
#
#   cm_wire_test.sh SOURCE_DIR BIN_DIR CASE
#   CASE: rping | rping6 | rping_q | rping_lossy | ucmatose | udaddy | rdma_server | send_bw | write_lat | read_bw |
#         reject | no_listener | unreachable | peer_dies | capture | rtt | fi_pingpong | ucx | users | rpma
# Exit 0 pass, 1 fail, 77 skip (not root, no namespaces, a program missing).
set -u
src=$1 bin=$2 case=$3
tb=$src/scripts/testbed.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
export SOFTVERBS_TESTBED=svc$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
TIMEOUT=${ROCE_WIRE_TIMEOUT:-90}
work=$(mktemp -d "${TMPDIR:-/tmp}/svcmwire.XXXXXX") || exit 1
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
    for p in "$work"/*.dlog "$work"/*.client "$work"/*.server; do
      [ -s "$p" ] && { log "--- $p"; tail -n 40 "$p" >&2; }
    done
  fi
  "$tb" down 2>/dev/null
  [ -n "${CM_WIRE_KEEP:-}" ] && cp -r "$work/." "$CM_WIRE_KEEP/"  # debugging: keep the logs
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

require() {
  local p
  for p in "$@"; do command -v "$p" >/dev/null || { log "SKIP: $p not installed"; exit $SKIP; }; done
}
for p in softverbs softverbsd; do [ -x "$bin/$p" ] || { log "missing $bin/$p"; exit 1; }; done
"$tb" up 2 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a1=$("$tb" addr h1)
a1_6=$("$tb" addr h1 6)

# start_daemons HOST...: a fresh softverbsd in each HOST (trace on: the
# gateway's steps go to HOST.dlog).
# start_daemons [--system] HOST...: a per-user daemon in $work/HOST, or with
# --system the system daemon (every user's) in $work/HOST/sys.
start_daemons() {
  local h d sys=""
  [ "$1" = --system ] && { sys=1; shift; }
  for h in "$@"; do
    rm -rf "${work:?}/$h"
    if [ -n "$sys" ]; then
      mkdir -m 755 "$work/$h"
      d=$work/$h/sys
      "$tb" exec "$h" env SOFTVERBS_TRACE=1 "$bin/softverbsd" --system --foreground --dir "$d" 2>"$work/$h.dlog" &
    else
      mkdir -m 700 "$work/$h"
      d=$work/$h
      SOFTVERBS_ROCE=1 SOFTVERBS_TRACE=1 "$tb" exec "$h" "$bin/softverbsd" --foreground --idle 0 \
        --dir "$d" 2>"$work/$h.dlog" &
    fi
    daemons+=($!)
  done
  for h in "$@"; do
    d=$work/$h${sys:+/sys}
    for _ in $(seq 100); do [ -S "$d/cm-gateway" ] && break; sleep 0.05; done
    [ -S "$d/cm-gateway" ] || { log "softverbsd's CM gateway did not come up in $h"; exit 1; }
  done
}

# on HOST CMD...: CMD in HOST on softverbs (its own daemon), RoCE stats on.
on() {
  local h=$1
  shift
  SOFTVERBS_DIR=$work/$h SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
    "$tb" exec "$h" "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" stdbuf -oL "$@"
}

# cm_wait PS PORT PID: the server in h1 listens on rdma_cm port PORT (its
# rendezvous socket is there).
cm_wait() {
  for _ in $(seq 400); do
    compgen -G "$work/h1/cm/$1-$2-*" >/dev/null && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

show() {
  local s
  for s in server client; do
    [ -f "$work/$1.$s" ] || continue
    log "----- $1.$s:"
    cat "$work/$1.$s" >&2
  done
}

# pair NAME PS PORT SERVER... -- CLIENT...: the server in h1, the client in
# h0 once the server listens (PS 0: wait for TCP port PORT instead).
pair() {
  local name=$1 ps=$2 port=$3
  shift 3
  local -a server=() client=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  on h1 "${server[@]}" >"$work/$name.server" 2>&1 &
  local spid=$!
  pids+=($spid)
  if [ "$ps" -eq 0 ]; then
    for _ in $(seq 200); do
      "$tb" exec h1 ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
      sleep 0.05
    done
  else
    cm_wait "$ps" "$port" $spid || log "$name: the server never listened on rdma_cm port $port"
  fi
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

# expect NAME SIDE REGEX COUNT: exactly COUNT lines match.
expect() {
  local n
  n=$(grep -Ec -- "$3" "$work/$1.$2")
  [ "$n" -eq "$4" ] || { fail "$1.$2: $n lines match '$3', expected $4"; show "$1"; }
}

# on_wire NAME: both sides' QPs ran over RoCEv2 (a stats line each) with
# clean ICRCs, and the MADs went through both gateways.
on_wire() {
  local side
  for side in server client; do
    grep -q "^softverbs roce: qp" "$work/$1.$side" || fail "$1 $side: the QP was not on the wire"
    if grep -o "bad_icrc [0-9]*" "$work/$1.$side" | grep -vq "bad_icrc 0"; then
      fail "$1 $side: datagrams with a bad ICRC"
    fi
  done
  grep -q "cm gateway: REQ\|cm gateway: SIDR_REQ" "$work/h0.dlog" || fail "$1: h0's gateway sent no request"
  grep -q "cm gateway: attr 0x1[07]" "$work/h1.dlog" || fail "$1: h1's gateway received no request"
}

no_errors() {
  local side
  for side in server client; do
    if grep -Eqi 'error|fail|unhandled|invalid' "$work/$1.$side"; then
      fail "$1.$side reports an error"
      show "$1"
    fi
  done
}

TCP=262  # RDMA_PS_TCP
UDP=273  # RDMA_PS_UDP

# rping's -v lines: "rdma-ping-<n>: " then characters of A..z from 'A' + n.
check_rping() {
  local name=$1 count=$2 i k line
  for i in $(seq 0 $((count - 1))); do
    line="rdma-ping-$i: "
    # (the line is 64 bytes: a longer number leaves fewer characters)
    for k in $(seq 0 $((50 - ${#i}))); do line+=$(printf "\\$(printf '%03o' $((65 + (i + k) % 58)))"); done
    grep -Fxq -- "ping data: $line" "$work/$name.client" || fail "$name client: no line 'ping data: $line'"
    grep -Fxq -- "server ping data: $line" "$work/$name.server" || fail "$name server: no 'server ping data: $line'"
  done
  expect "$name" client '^ping data: ' "$count"
  expect "$name" server '^server ping data: ' "$count"
  expect "$name" server '^server DISCONNECT EVENT' 1
}

case $case in
  users)
    # Each host runs the system daemon (--system), which serves every user:
    # a listener of nobody (uid 65534) in h1 gets the REQ of root's client in
    # h0 through h1's CM gateway, and the two users' QPs talk over RoCEv2.
    require rping
    require setpriv
    setpriv --reuid=65534 --regid=65534 --clear-groups test -r "$bin/../lib/libibverbs.so.1" ||
      { log "SKIP: the build directory is not readable by nobody"; exit $SKIP; }
    start_daemons --system h0 h1
    sys_on() {
      local h=$1
      shift
      SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR=$work/$h/sys SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
        "$tb" exec "$h" "$@"
    }
    sys_on h1 setpriv --reuid=65534 --regid=65534 --clear-groups "$bin/softverbs" run -- \
      timeout -k 5 "$TIMEOUT" stdbuf -oL rping -s -a "$a1" -v -C 20 -p 7000 >"$work/users.server" 2>&1 &
    spid=$!
    pids+=($spid)
    for _ in $(seq 200); do compgen -G "$work/h1/sys/cm/262-7000-*" >/dev/null && break; sleep 0.05; done
    # nobody's port, held for it by the daemon, which alone writes the directory.
    [ "$(stat -c %u:%a "$work/h1/sys/cm/262-7000-$a1" 2>/dev/null)" = 0:666 ] || fail "users: no rendezvous socket for nobody's port"
    sys_on h0 "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" stdbuf -oL rping -c -a "$a1" -v -C 20 -p 7000 \
      >"$work/users.client" 2>&1
    crc=$?
    wait $spid
    src=$?
    if [ $crc -ne 0 ] || [ $src -ne 0 ]; then
      fail "users: server exit $src, client exit $crc"
      show users
    else
      check_rping users 20
      on_wire users
      no_errors users
    fi
    ;;
  rping | rping6 | rping_q)
    # rping_q: the application creates and moves its QP (CONNECT_RESPONSE,
    # rdma_init_qp_attr, rdma_establish sends the RTU later).
    require rping
    start_daemons h0 h1
    addr=$a1
    q=()
    [ "$case" = rping6 ] && addr=$a1_6
    [ "$case" = rping_q ] && q=(-q)
    if pair "$case" $TCP 7000 rping -s -a "$addr" -v -C 20 -p 7000 "${q[@]}" -- \
        rping -c -a "$addr" -v -C 20 -p 7000 "${q[@]}"; then
      check_rping "$case" 20
      on_wire "$case"
      no_errors "$case"
    fi
    ;;
  rpma)
    # librpma (tests/compat/rpma_pingpong.c over Debian's librpma): the
    # server in h1 registers 256 KiB + 3 bytes of a memfd mapped MAP_SHARED
    # (through its owner, docs/MEMORY.md), the client in h0 reads it all,
    # writes it back complemented and flushes, over RoCEv2.
    [ -x "$bin/rpma_pingpong" ] || { log "SKIP: rpma_pingpong not built (librpma-dev)"; exit $SKIP; }
    start_daemons h0 h1
    if pair rpma $TCP 7480 "$bin/rpma_pingpong" server "$a1" 7480 memfd 262147 -- \
        "$bin/rpma_pingpong" client "$a1" 7480 262147; then
      expect rpma server '^server PASS$' 1
      expect rpma client '^client PASS$' 1
      on_wire rpma
    fi
    ;;
  ucmatose)
    require ucmatose
    start_daemons h0 h1
    if pair ucmatose $TCP 7471 ucmatose -c 4 -C 20 -- ucmatose -s "$a1" -c 4 -C 20; then
      expect ucmatose server '^data transfers complete$' 1
      expect ucmatose client '^data transfers complete$' 1
      expect ucmatose server '^disconnected$' 1
      expect ucmatose server '^return status 0$' 1
      expect ucmatose client '^return status 0$' 1
      on_wire ucmatose
      no_errors ucmatose
    fi
    ;;
  udaddy)
    require udaddy
    start_daemons h0 h1
    # Captured when tshark is there: udaddy sends its QPN as the immediate
    # data (htobe32), and its server replies to the QPN it reads there, so
    # the wire's ImmDt must be the sender's QPN in network order, whatever
    # the two softverbs ends make of it (rxe read it byte-swapped once).
    cap=
    if command -v tshark >/dev/null; then
      "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/ud.pcap" 2>"$work/tshark.log" &
      cap=$!
      pids+=($cap)
      for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
    fi
    # udaddy has no port option: 7174.
    if pair udaddy $UDP 7174 udaddy -- udaddy -s "$a1"; then
      expect udaddy server '^sending replies$' 1
      expect udaddy client '^data transfers complete$' 1
      expect udaddy server '^return status 0$' 1
      expect udaddy client '^return status 0$' 1
      grep -q "cm gateway: SIDR_REQ" "$work/h0.dlog" || fail "udaddy: no SIDR_REQ through h0's gateway"
      no_errors udaddy
    fi
    if [ -n "$cap" ]; then
      sleep 0.3
      kill $cap 2>/dev/null
      wait $cap 2>/dev/null
      # Each SEND with immediate: its DETH source QP, then its ImmDt bytes.
      tshark -r "$work/ud.pcap" -Y infiniband.immdt -T fields -e infiniband.deth.srcqp -e infiniband.immdt \
        >"$work/ud.imm" 2>/dev/null
      n=$(wc -l <"$work/ud.imm")
      [ "$n" -ge 2 ] || fail "udaddy: $n SENDs with immediate data captured"
      while read -r srcqp immdt; do
        immdt=${immdt%%,*}  # (Wireshark 3.6 lists the field twice)
        [ $((srcqp)) -eq $((16#${immdt//:/})) ] || fail "udaddy: ImmDt $immdt is not the sender's QPN $srcqp"
      done <"$work/ud.imm"
    fi
    ;;
  rdma_server)
    require rdma_server rdma_client
    start_daemons h0 h1
    if pair rdma_server $TCP 7471 rdma_server -p 7471 -- rdma_client -s "$a1" -p 7471; then
      expect rdma_server server '^rdma_server: end 0$' 1
      expect rdma_server client '^rdma_client: end 0$' 1
      on_wire rdma_server
    fi
    ;;
  send_bw | write_lat | read_bw)
    prog=ib_${case}
    require "$prog"
    start_daemons h0 h1
    if pair "$case" $TCP 18515 "$prog" -R -p 18515 -n 1000 -- "$prog" -R -p 18515 -n 1000 "$a1"; then
      expect "$case" client '^ *[0-9]+ +1000 +[0-9.]+ +[0-9.]+' 1
      grep -q 'rdma_cm' "$work/$case.client" || fail "$case: perftest did not report using rdma_cm"
      on_wire "$case"
    fi
    ;;
  reject)
    # The server rejects with private data; the client gets REJECTED,
    # status 28 (consumer reject) and the bytes.
    start_daemons h0 h1
    if pair reject $TCP 7600 "$bin/cm_wire_peer" reject 7600 -- "$bin/cm_wire_peer" connect "$a1" 7600; then
      expect reject client '^event RDMA_CM_EVENT_REJECTED status 28 data no-thanks-from-h1$' 1
      expect reject server '^rejected$' 1
      expect reject server '^request data hello$' 1
    fi
    ;;
  no_listener)
    # Nobody listens on the port in h1: its gateway rejects the REQ with
    # reason 8 (invalid service ID), as a remote CM does.
    start_daemons h0 h1
    on h0 "$bin/cm_wire_peer" connect "$a1" 7601 >"$work/nol.client" 2>&1 || fail "no_listener: client exit $?"
    expect nol client '^event RDMA_CM_EVENT_REJECTED status 8 ' 1
    ;;
  unreachable)
    # No softverbsd in h1, so nothing answers on QP1 there: h0's gateway
    # retransmits the REQ, gives up, and the client gets UNREACHABLE with
    # -ETIMEDOUT (-110), as Linux reports a REQ never answered.
    export SOFTVERBS_CM_RETRY_MS=200 SOFTVERBS_CM_RETRIES=3
    start_daemons h0
    start=$SECONDS
    on h0 "$bin/cm_wire_peer" connect "$a1" 7602 >"$work/unr.client" 2>&1 || fail "unreachable: client exit $?"
    expect unr client '^event RDMA_CM_EVENT_UNREACHABLE status -110 ' 1
    n=$(grep -c "cm gateway: retransmit" "$work/h0.dlog")
    [ "$n" -eq 3 ] || fail "unreachable: $n retransmissions, expected 3"
    [ $((SECONDS - start)) -lt 20 ] || fail "unreachable: took $((SECONDS - start)) s"
    ;;
  rtt)
    # A measurement: the time from rdma_connect to its answer (a REJ) for
    # 50 requests from h1 itself (unix sockets, no daemon) and 50 from h0
    # (both gateways, the wire), in one run.
    start_daemons h0 h1
    on h1 "$bin/cm_wire_peer" reject 7604 100 >"$work/rtt.server" 2>&1 &
    spid=$!
    pids+=($spid)
    cm_wait $TCP 7604 $spid || fail "rtt: the server never listened"
    on h1 "$bin/cm_wire_peer" connect "$a1" 7604 50 >"$work/rtt.local" 2>&1 || fail "rtt: local client"
    on h0 "$bin/cm_wire_peer" connect "$a1" 7604 50 >"$work/rtt.client" 2>&1 || fail "rtt: remote client"
    wait $spid || fail "rtt: server exit $?"
    for f in local client; do
      grep -q '^event RDMA_CM_EVENT_REJECTED status 28 ' "$work/rtt.$f" || fail "rtt $f: not rejected"
      [ "$(grep -c '^elapsed_us ' "$work/rtt.$f")" -eq 50 ] || fail "rtt $f: not 50 answers"
    done
    log "rtt: REQ -> REJ median: one host $(sed -n 's/^median_us //p' "$work/rtt.local") us," \
      "between hosts $(sed -n 's/^median_us //p' "$work/rtt.client") us"
    ;;
  capture)
    # One rping captured on h1's veth: every frame's ICRC (an independent
    # implementation, check_capture.py) and DF; tshark decodes the MADs as the
    # IB CM's (a dissector written from the spec, as Linux's CM reads them).
    require rping tshark
    # rping's RC data leaves in UDP GSO sends: with tx-udp-segmentation off
    # the kernel cuts them before the veth, so the capture holds the
    # datagrams as a wire carries them (see wire_test.sh's capture case).
    for h in h0 h1; do
      "$tb" exec $h /usr/bin/python3 "$src/scripts/netdev_feature.py" eth0 tx-udp-segmentation off ||
        fail "capture: cannot turn tx-udp-segmentation off"
    done
    start_daemons h0 h1
    "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/cm.pcap" 2>"$work/tshark.log" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
    pair capture $TCP 7002 rping -s -a "$a1" -C 3 -p 7002 -- rping -c -a "$a1" -C 3 -p 7002 || true
    sleep 0.5
    kill $cap 2>/dev/null
    wait $cap 2>/dev/null
    # UD SEND Only (the MADs) and the RC traffic of rping.
    /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/cm.pcap" 0x64 ||
      fail "capture: check_capture.py"
    tshark -r "$work/cm.pcap" -V -Y "infiniband.bth.destqp == 1" >"$work/cm.txt" 2>&1
    a0=$("$tb" addr h0)
    # The handshake and the teardown, one MAD each (nothing was lost), to
    # QP1 from QP1 with the GSI's Q_Key (IBTA 13.5.1).
    for m in ConnectRequest ConnectReply ReadyToUse DisconnectRequest DisconnectReply; do
      n=$(grep -c "^    CM $m\$" "$work/cm.txt")
      [ "$n" -eq 1 ] || fail "capture: $n CM $m MADs, expected 1"
    done
    [ "$(grep -c 'Queue Key: 0x0000000080010000' "$work/cm.txt")" -eq 5 ] || fail "capture: not the GSI Q_Key"
    [ "$(grep -c 'Source Queue Pair: 0x00000001' "$work/cm.txt")" -eq 5 ] || fail "capture: not from QP1"
    # The REQ as Linux's rdma_cm builds and reads it: the service ID of
    # RDMA_PS_TCP port 7002 (0x1b5a), the GIDs of both ends, the path MTU of
    # the veth (1024), the IP CM header with both addresses.
    for want in "Prefix: 0000000001" "Protocol: 0x06" "Destination Port: 0x1b5a" \
        "Primary Local Port GID: $a0" "Primary Remote Port GID: $a1" "Path Packet Payload MTU: 0x3" \
        "IP CM IP Version: 0x4" "IP CM Source IP: $a0" "IP CM Destination IP: $a1"; do
      grep -q -- "$want" "$work/cm.txt" || fail "capture: the REQ has no '$want'"
    done
    [ $failures -eq 0 ] || cat "$work/cm.txt" >&2
    ;;
  peer_dies)
    # The server process is killed once connected: its daemon ends the
    # connection for it (a DREQ on the wire) and the client, which is
    # waiting, gets DISCONNECTED.
    start_daemons h0 h1
    on h1 "$bin/cm_wire_peer" accept 7603 >"$work/dies.server" 2>&1 &
    spid=$!
    pids+=($spid)
    cm_wait $TCP 7603 $spid || fail "peer_dies: the server never listened"
    on h0 "$bin/cm_wire_peer" connect "$a1" 7603 wait >"$work/dies.client" 2>&1 &
    cpid=$!
    pids+=($cpid)
    for _ in $(seq 200); do grep -q '^pid ' "$work/dies.server" && break; sleep 0.05; done
    victim=$(sed -n 's/^pid \([0-9]*\)$/\1/p' "$work/dies.server")
    [ -n "$victim" ] && kill -KILL "$victim" || fail "peer_dies: not established"
    wait $cpid || fail "peer_dies: client exit $?"
    expect dies client '^event RDMA_CM_EVENT_ESTABLISHED status 0 ' 1
    expect dies client '^event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
    grep -q "cm gateway: attr 0x15 from" "$work/h0.dlog" || fail "peer_dies: no DREQ reached h0"
    ;;
  rping_lossy)
    # Every 2nd MAD each gateway sends is lost: REQ, REP and DREQ are
    # retransmitted, duplicates answered (a lost RTU: the duplicate REP
    # gets it again), and rping still completes.
    require rping
    export SOFTVERBS_CM_DROP_EVERY=2 SOFTVERBS_CM_RETRY_MS=200
    start_daemons h0 h1
    if pair rping_lossy $TCP 7001 rping -s -a "$a1" -v -C 5 -p 7001 -- rping -c -a "$a1" -v -C 5 -p 7001; then
      check_rping rping_lossy 5
      no_errors rping_lossy
      n=$(cat "$work"/h*.dlog | grep -c "cm gateway: retransmit")
      d=$(cat "$work"/h*.dlog | grep -c "cm gateway: dropped")
      log "rping_lossy: $d MADs dropped, $n retransmitted"
      [ "$d" -gt 0 ] && [ "$n" -gt 0 ] || fail "rping_lossy: nothing dropped or retransmitted"
    fi
    ;;
  fi_pingpong)
    # libfabric's verbs provider, MSG endpoints over rdma_cm; 9228 is the
    # TCP port fi_pingpong exchanges nothing but its start on.
    require fi_pingpong
    start_daemons h0 h1
    if pair fi_pingpong 0 9228 fi_pingpong -p verbs -e msg -B 9228 -I 100 -- \
        fi_pingpong -p verbs -e msg -P 9228 -I 100 "$a1"; then
      expect fi_pingpong client '^1m +100 +=100 ' 1
      expect fi_pingpong server '^1m +100 +=100 ' 1
      on_wire fi_pingpong
    fi
    ;;
  ucx)
    # UCX's rdmacm connection manager (tests/compat/ucx_cm_pingpong.c, built
    # where libucx-dev is): UCP's client/server API, tagged messages of 8 B ..
    # 1 MiB both ways, one GET and one PUT of a packed rkey, then a
    # disconnect; UCX held to the rdmacm CM and rc_verbs on sv0 (as in
    # tests/compat/ucx_cm.sh); `softverbs run` gives it the device node.
    prog=$bin/ucx_cm_pingpong
    [ -x "$prog" ] || { log "SKIP: $prog not built (no UCX headers)"; exit $SKIP; }
    export UCX_TLS=rc_verbs UCX_NET_DEVICES=sv0:1 UCX_SOCKADDR_TLS_PRIORITY=rdmacm
    export SOFTVERBS_CM_TRACE=1 CM_PINGPONG_TIMEOUT=$((TIMEOUT - 10))
    start_daemons h0 h1
    if pair ucx $TCP 7605 "$prog" server 7605 "$a1" -- "$prog" client "$a1" 7605; then
      for side in server client; do
        expect ucx $side "^PASS $side\$" 1
        expect ucx $side '^ *# +lane\[[0-9]+\]:' 2
        expect ucx $side '^ *# +lane\[0\]: cm rdmacm$' 1
        expect ucx $side '^ *# +lane\[1\]: +0:rc_verbs/sv0:1\.0 ' 1
        grep -Eq 'UCX +(ERROR|WARN)' "$work/ucx.$side" && fail "ucx $side: UCX reported an error or warning"
      done
      expect ucx server "^server: connection request from $("$tb" addr h0)\$" 1
      expect ucx server '^server: the client.s GET and PUT of 1048576 bytes verified$' 1
      expect ucx client '^client: GET of 1048576 bytes verified$' 1
      expect ucx server 'softverbs-cm.* event RDMA_CM_EVENT_ESTABLISHED status 0$' 1
      expect ucx server 'softverbs-cm.* event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
      expect ucx client 'softverbs-cm.* event RDMA_CM_EVENT_CONNECT_RESPONSE status 0$' 1
      expect ucx client 'softverbs-cm.* event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
      on_wire ucx
      # The DREQ of the client's close crossed the wire too.
      grep -q "cm gateway: attr 0x15 from" "$work/h1.dlog" || fail "ucx: no DREQ reached h1"
    fi
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
