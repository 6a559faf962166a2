#!/usr/bin/env bash
# roce.netns.*: one per-user daemon per network namespace (issue 22, item 7;
# src/common/paths.h). Two fresh namespaces joined by a veth pair (the test
# bed, scripts/testbed.sh), Debian's ibv_rc_pingpong and ibv_devinfo through
# the build's library (`softverbs run`), with no SOFTVERBS_* variable set but
# the one `softverbs run` sets (SOFTVERBSD: the build's daemon) and a
# private XDG_RUNTIME_DIR: the daemons are the default ones, started by the
# library, their UDP 4791 taken by default.
#
#   netns_test.sh SOURCE_DIR BIN_DIR CASE
#   CASE: pingpong   RC between the namespaces over RoCEv2 (GID index 1, the
#                    veth's IPv4 address); two daemons, one per namespace,
#                    each with its namespace's GIDs; `rdma statistic show`
#                    in each counts the packets sent and received
#         isolation  a process of namespace B never reaches A's daemon: not
#                    by the record (BASE/netns), nor when the record is gone
#                    (the daemon refuses it: EXDEV, and it starts its own)
#         rping      rdma_cm between the namespaces (the default daemons'
#                    CM gateways carry its MADs)
#         rstream, riostream, rcopy
#                    rsockets between the namespaces (Debian's programs;
#                    data checked)
#         preload    a plain TCP client/server under librspreload.so
#         udpong     datagram rsockets (UD QPs on the wire): udpong's
#                    bandwidth run and a blocking echo run, h0 -> h1
#         mckey      UD multicast over RoCEv2 (docs/ROCE.md, "Multicast"):
#                    Debian's mckey, two receivers in h1 and a sender in h0
#                    on 239.1.1.1, then a send-only sender (-o) on
#                    239.1.1.2, then the IPv6 group ff0e::1:3; each
#                    receiver gets every message exactly once from the
#                    wire; garbled datagrams and one for a group nobody
#                    joined are dropped first; a member killed leaves
#         mcast_bw   perftest's UD multicast: ib_send_bw -c UD -g (a QP
#                    attached to the group ::ffff:239.1.1.7 in h1, the sender
#                    in h0), 5000 x 1000 B, all received
#         busy       UDP 4791 held by another daemon: same-host QPs work, a QP
#                    to the other namespace fails at RTR saying who holds the
#                    port and what to do; with the holder gone it works
# Exit 0 pass, 1 fail, 77 skip (not root, no namespaces, a program missing).
set -u
src=$1 bin=$2 case=$3
tb=$src/scripts/testbed.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
for p in ibv_rc_pingpong ibv_devinfo ss $(case $case in rping | rstream | riostream | rcopy | udpong | mckey) echo "$case" ;; esac) \
  $([ "$case" = mckey ] && echo python3) $([ "$case" = mcast_bw ] && echo ib_send_bw); do
  command -v $p >/dev/null 2>&1 || { log "SKIP: $p is not installed"; exit $SKIP; }
done
export SOFTVERBS_TESTBED=svn$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
TIMEOUT=${ROCE_NETNS_TIMEOUT:-60}
work=$(mktemp -d "${TMPDIR:-/tmp}/svnetns.XXXXXX") || exit 1
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

# The daemons the library started for this test: their command line names
# a directory under $work (--dir). Killed by pid.
our_daemons() {
  local p
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "^softverbsd --dir $work/" && echo "${p#/proc/}"
  done
}

cleanup() {
  local rc=$? p
  for p in "${pids[@]}" $(our_daemons); do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}" $(our_daemons); do kill -9 "$p" 2>/dev/null; done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then
    for p in $(find "$work" -name daemon.log -size +0); do log "--- $p"; cat "$p" >&2; done
  fi
  "$tb" down 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

for p in softverbs softverbsd; do [ -x "$bin/$p" ] || { log "missing $bin/$p"; exit 1; }; done
"$tb" up 2 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a0=$("$tb" addr h0)
a1=$("$tb" addr h1)
a0_6=$("$tb" addr h0 6)
a1_6=$("$tb" addr h1 6)
ns() { echo "$SOFTVERBS_TESTBED-$1"; }
# No SOFTVERBS_* variable reaches the programs (the test bed's are the script's).
unset_sv=()
for v in $(compgen -e | grep '^SOFTVERBS'); do unset_sv+=(-u "$v"); done

# on HOST RUNDIR CMD...: CMD in HOST on softverbs, XDG_RUNTIME_DIR=RUNDIR.
on() {
  local h=$1 run=$2
  shift 2
  ip netns exec "$(ns "$h")" env "${unset_sv[@]}" XDG_RUNTIME_DIR="$run" \
    "$bin/softverbs" run -- timeout -k 5 "$TIMEOUT" stdbuf -oL "$@"
}

# netns_of HOST: "DEV INO" of HOST's namespace, as the daemons record it.
netns_of() { ip netns exec "$(ns "$1")" stat -L -c '%d %i' /proc/self/ns/net; }

# pair NAME RUNDIR PORT: ibv_rc_pingpong -g 1, server in h1, client in h0;
# outputs in $work/NAME.server and .client, exits in SRC and CRC.
pair() {
  local name=$1 run=$2 port=$3
  on h1 "$run" ibv_rc_pingpong -g 1 -p "$port" >"$work/$name.server" 2>&1 &
  local spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    ip netns exec "$(ns h1)" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.05
  done
  on h0 "$run" ibv_rc_pingpong -g 1 -p "$port" "$a1" >"$work/$name.client" 2>&1
  CRC=$?
  if [ $CRC -ne 0 ]; then kill $spid 2>/dev/null; fi  # it waits for a peer that gave up
  wait $spid
  SRC=$?
}

# rs_server NAME PORT PROG ARGS...: an rsocket server in h1 on rdma_cm port
# PORT (output $work/NAME.server, pid in spid), waited for until it listens
# (its rendezvous socket cm/262-PORT-* exists).
rs_server() {
  local name=$1 port=$2 prog=$3
  shift 3
  on h1 "$run" "$prog" -p "$port" "$@" >"$work/$name.server" 2>&1 &
  spid=$!
  pids+=($spid)
  cm_wait "$port"
}

# cm_wait PORT: until the server $spid listens on rdma_cm port PORT (its
# rendezvous socket, docs/RDMACM.md, is in either daemon's directory), it
# exits, or 10 s pass.
cm_wait() {
  for _ in $(seq 200); do
    compgen -G "$base/cm/*-$1-*" >/dev/null && break
    compgen -G "$base/net-*/cm/*-$1-*" >/dev/null && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.05
  done
}

show() {
  local s
  for s in server client; do
    [ -f "$work/$1.$s" ] || continue
    log "----- $1.$s:"
    cat "$work/$1.$s" >&2
  done
}

# check_pingpong NAME: both exited 0 and printed their summary (4096 bytes,
# 1000 iterations, both ways: 8192000 bytes).
check_pingpong() {
  local side ok=1
  [ "$SRC" -eq 0 ] && [ "$CRC" -eq 0 ] || { fail "$1: server exit $SRC, client exit $CRC"; ok=0; }
  for side in server client; do
    grep -Eq "^8192000 bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" "$work/$1.$side" ||
      { fail "$1 $side: no '8192000 bytes in ... seconds' line"; ok=0; }
  done
  [ $ok -eq 1 ] || show "$1"
}

# gids HOST RUNDIR: the GIDs ibv_devinfo -v lists in HOST.
gids() { on "$1" "$2" ibv_devinfo -v 2>&1 | sed -n 's/.*GID\[ *[0-9]*\]:[[:space:]]*\([^,]*\),.*/\1/p' | tr '\n' ' '; }

# check_gids HOST RUNDIR MINE OTHERS: HOST's device lists its own address and not the other's.
check_gids() {
  local g
  g=$(gids "$1" "$2")
  [[ " $g " == *" ::ffff:$3 "* ]] || fail "$1: its address $3 is not among its GIDs: $g"
  [[ " $g " == *" ::ffff:$4 "* ]] && fail "$1: the other namespace's address $4 is among its GIDs: $g"
}

# daemon_dir_of NETNS_RECORD BASE: the directory whose daemon serves it.
served_in() {
  local rec=$1 base=$2 d
  for d in "$base" "$base"/net-*; do
    [ -S "$d/control" ] && [ "$(cat "$d/netns" 2>/dev/null)" = "$rec" ] && echo "$d"
  done
}

run=$work/run
mkdir -m 700 "$run"
base=$run/softverbs

case $case in
pingpong)
  pair pingpong "$run" 18515
  check_pingpong pingpong
  # The wire's counts, as `rdma statistic show` reads them from each
  # namespace's daemon (src/nldev/, Op::WireCounters): the QPs are gone,
  # their counts stay; 1000 round trips sent and received on each side.
  if command -v rdma >/dev/null 2>&1; then
    for h in h0 h1; do
      on $h "$run" rdma statistic show >"$work/stat.$h" 2>&1 || fail "rdma statistic show in $h exited $?"
      sent=$(sed -nE 's/.* sent_pkts ([0-9]+) .*/\1/p' "$work/stat.$h")
      rcvd=$(sed -nE 's/.* rcvd_pkts ([0-9]+) .*/\1/p' "$work/stat.$h")
      [ "${sent:-0}" -ge 1000 ] && [ "${rcvd:-0}" -ge 1000 ] ||
        fail "rdma statistic show in $h: sent_pkts '$sent', rcvd_pkts '$rcvd' (want >= 1000): $(cat "$work/stat.$h")"
      # ... and exactly its 1000 SENDs and 1000 receives (ibv_rc_pingpong's default -n).
      grep -Eq ' rdma_sends 1000 rdma_recvs 1000 ' "$work/stat.$h" ||
        fail "rdma statistic show in $h: want rdma_sends 1000 rdma_recvs 1000: $(cat "$work/stat.$h")"
    done
  fi
  # One daemon per namespace: BASE serves one, BASE/net-INO-DEV the other.
  for h in h0 h1; do
    rec=$(netns_of $h)
    d=$(served_in "$rec" "$base")
    [ -n "$d" ] || fail "no daemon directory records $h's namespace ($rec)"
    ino=${rec#* } dev=${rec% *}
    [ "$d" = "$base" ] || [ "$d" = "$base/net-$ino-$dev" ] || fail "$h served in $d"
  done
  [ "$(ls -d "$base"/net-* 2>/dev/null | wc -l)" -eq 1 ] || fail "not one namespace directory: $(ls "$base")"
  check_gids h0 "$run" "$a0" "$a1"
  check_gids h1 "$run" "$a1" "$a0"
  ;;
isolation)
  # By the record: A (h0) starts in BASE; B (h1) reads A in BASE/netns.
  check_gids h0 "$run" "$a0" "$a1"
  [ "$(cat "$base/netns")" = "$(netns_of h0)" ] || fail "BASE/netns does not record h0's namespace"
  check_gids h1 "$run" "$a1" "$a0"
  rec=$(netns_of h1)
  [ -S "$base/net-${rec#* }-${rec% *}/control" ] || fail "h1's daemon is not in BASE/net-INO-DEV: $(ls "$base")"
  # Without the record: B connects to A's daemon in BASE, which refuses it
  # (EXDEV); B starts its own daemon in its namespace's directory.
  run2=$work/run2
  mkdir -m 700 "$run2"
  check_gids h0 "$run2" "$a0" "$a1"
  rm -f "$run2/softverbs/netns"
  check_gids h1 "$run2" "$a1" "$a0"
  [ -S "$run2/softverbs/net-${rec#* }-${rec% *}/control" ] ||
    fail "h1 did not get its own daemon after A's refused it: $(ls "$run2/softverbs")"
  check_gids h0 "$run2" "$a0" "$a1"  # A's daemon still serves h0
  ;;
rping)
  on h1 "$run" rping -s -a "$a1" -C 10 -v >"$work/rping.server" 2>&1 &
  spid=$!
  pids+=($spid)
  cm_wait 7174  # rping's port
  on h0 "$run" rping -c -a "$a1" -C 10 -v >"$work/rping.client" 2>&1
  CRC=$?
  [ $CRC -eq 0 ] || kill $spid 2>/dev/null
  wait $spid
  SRC=$?
  [ "$SRC" -eq 0 ] && [ "$CRC" -eq 0 ] || fail "rping: server exit $SRC, client exit $CRC"
  grep -q "^server ping data: rdma-ping-9: " "$work/rping.server" || fail "rping: the server did not see ping 9"
  grep -q "^ping data: rdma-ping-9: " "$work/rping.client" || fail "rping: the client did not see ping 9"
  [ $failures -eq 0 ] || show rping
  ;;
rstream | riostream)
  # rsockets (issue 21) between the two "hosts": rdma_cm over the CM
  # gateways, the data as RDMA WRITEs with immediate over RoCEv2; the
  # received data checked (-T v). riostream: the same through riomap'd
  # buffers (riowrite).
  rs_server "$case" 7471 "$case" -b "$a1" -T v -S 65536 -C 500
  on h0 "$run" "$case" -s "$a1" -p 7471 -T v -S 65536 -C 500 >"$work/$case.client" 2>&1
  CRC=$?
  [ $CRC -eq 0 ] || kill $spid 2>/dev/null
  wait $spid
  SRC=$?
  [ "$SRC" -eq 0 ] && [ "$CRC" -eq 0 ] || fail "$case: server exit $SRC, client exit $CRC"
  for side in server client; do
    grep -Eq '^custom +64k +500 +1 ' "$work/$case.$side" || fail "$case: no 64k x 500 line on the $side"
  done
  [ $failures -eq 0 ] || show "$case"
  log "$case h0 -> h1: $(grep -E '^custom' "$work/$case.client")"
  ;;
rcopy)
  # Debian's rcopy: a 3,333,333-byte file from h0 to h1's server over
  # rsockets, twice (the server serves clients until killed); the copies
  # compared byte for byte (the namespaces share the file system).
  head -c 3333333 /dev/urandom >"$work/src.bin"
  rs_server rcopy 7472 rcopy
  for i in 1 2; do
    on h0 "$run" rcopy "$work/src.bin" "$a1:$work/dst.$i" -p 7472 >>"$work/rcopy.client" 2>&1 ||
      fail "rcopy client $i: exit $?"
    cmp -s "$work/src.bin" "$work/dst.$i" || fail "rcopy: copy $i differs from the source"
  done
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  [ "$(grep -c '^3333333 bytes in ' "$work/rcopy.client")" -eq 2 ] || fail "rcopy: not two '3333333 bytes in' lines"
  [ "$(grep -c 'transferring\.\.\.3333333 bytes\.\.\.closing\.\.\.done' "$work/rcopy.server")" -eq 2 ] ||
    fail "rcopy: the server did not report two whole files"
  [ $failures -eq 0 ] || show rcopy
  ;;
preload)
  # A TCP client and server that know nothing of RDMA (rsocket_tcp.c), under
  # rdma-core's librspreload.so on our librdmacm, between the namespaces:
  # 7,777,777 bytes over rsockets on RoCEv2, both sides' hashes equal.
  preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
  [ -e "$preload" ] || { log "SKIP: $preload is not installed"; exit $SKIP; }
  tcp=$bin/rsocket_tcp
  [ -x "$tcp" ] || { log "missing $tcp"; exit 1; }
  on h1 "$run" env LD_PRELOAD="$preload" RSOCKET_TCP_ADDR="$a1" "$tcp" server 7473 >"$work/preload.server" 2>&1 &
  spid=$!
  pids+=($spid)
  cm_wait 7473
  on h0 "$run" env LD_PRELOAD="$preload" RSOCKET_TCP_ADDR="$a1" "$tcp" client 7473 7777777 >"$work/preload.client" 2>&1
  CRC=$?
  [ $CRC -eq 0 ] || kill $spid 2>/dev/null
  wait $spid
  SRC=$?
  [ "$SRC" -eq 0 ] && [ "$CRC" -eq 0 ] || fail "preload: server exit $SRC, client exit $CRC"
  hash=$(sed -n 's/^client: OK 7777777 bytes hash \([0-9a-f]*\)$/\1/p' "$work/preload.client")
  [ -n "$hash" ] || fail "preload: no OK line from the client"
  grep -qx "server: 7777777 bytes hash $hash" "$work/preload.server" || fail "preload: the server's hash differs"
  [ $failures -eq 0 ] || show preload
  ;;
mcast_bw)
  # ib_send_bw -g: the server's QP joins the group (-M: the MGID as 16
  # decimal bytes, an IPv4-mapped one to match GID 1's family), the client
  # sends to it. UD has no flow control: the 5000 messages all arriving
  # says the daemon's hop keeps up. 1000 bytes: a UD message must fit the
  # veth's path MTU (1024) to go on the wire.
  mgid=0:0:0:0:0:0:0:0:0:0:255:255:239:1:1:7
  on h1 "$run" env SOFTVERBS_ROCE_STATS=1 ib_send_bw -c UD -g -x 1 -M $mgid -s 1000 -n 5000 \
    >"$work/mcast_bw.server" 2>&1 &
  spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    ip netns exec "$(ns h1)" ss -Hltn "sport = :18515" 2>/dev/null | grep -q . && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.05
  done
  on h0 "$run" ib_send_bw -c UD -g -x 1 -M $mgid -s 1000 -n 5000 "$a1" >"$work/mcast_bw.client" 2>&1
  CRC=$?
  [ $CRC -eq 0 ] || kill $spid 2>/dev/null
  wait $spid
  SRC=$?
  [ "$SRC" -eq 0 ] && [ "$CRC" -eq 0 ] || fail "mcast_bw: server exit $SRC, client exit $CRC"
  for side in server client; do
    grep -Eq '^ 1000 +5000 ' "$work/mcast_bw.$side" || fail "mcast_bw: no 1000 x 5000 line on the $side"
  done
  grep -q 'multicast_received 5000$' "$work/mcast_bw.server" || fail "mcast_bw: the server's QP did not get 5000 multicast datagrams"
  [ $failures -eq 0 ] || show mcast_bw
  log "ib_send_bw -c UD -g h0 -> h1: $(grep -E '^ 1000 +5000 ' "$work/mcast_bw.server")"
  ;;
udpong)
  # The server serves until it is killed; ready when its UDP port is bound.
  n=0
  for args in "-S 1000 -C 10000" "-T b -T e -S 1000 -C 2000"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    on h1 "$run" udpong -b "$a1" -p $((7480 + n)) $args >"$work/udpong$n.server" 2>&1 &
    spid=$!
    pids+=($spid)
    for _ in $(seq 200); do
      ip netns exec "$(ns h1)" ss -Hlun "sport = :$((7480 + n))" 2>/dev/null | grep -q . && break
      kill -0 $spid 2>/dev/null || break
      sleep 0.05
    done
    # shellcheck disable=SC2086
    on h0 "$run" udpong -s "$a1" -p $((7480 + n)) $args >"$work/udpong$n.client" 2>&1 || fail "udpong $args: the client exited $?"
    # xfers: what the server says it received (UD may drop some), or the echoes.
    row='^custom +1000 +[0-9.]+k? '
    [ $n -eq 2 ] && row='^custom +1000 +4k '
    grep -Eq "$row" "$work/udpong$n.client" || fail "udpong $args: no result line"
    grep -Eqi 'error|fail|invalid' "$work/udpong$n.client" && fail "udpong $args: the client reports an error"
    tree() { local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; tree "$c"; done; }
    for p in $(tree $spid); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = udpong ] && kill "$p"; done
    wait $spid 2>/dev/null
    [ $failures -eq 0 ] || show "udpong$n"
    log "udpong $args h0 -> h1: $(grep -E '^custom' "$work/udpong$n.client")"
  done
  ;;
mckey)
  # mckey_run NAME GROUP COUNT SENDER_ARGS: two receivers in h1 (started
  # first, each until it printed its join), the sender in h0; every
  # program's QPs print their wire counters (SOFTVERBS_ROCE_STATS) when
  # destroyed.
  mckey_run() {
    local name=$1 group=$2 count=$3 sargs=$4 i rp=() f b0=$a0 b1=$a1
    [ "${group#*:}" != "$group" ] && b0=$a0_6 b1=$a1_6
    for i in 1 2; do
      on h1 "$run" env SOFTVERBS_ROCE_STATS=1 mckey -m "$group" -b "$b1" -C "$count" -S 1000 \
        >"$work/$name$i.server" 2>&1 &
      rp+=($!)
      pids+=($!)
    done
    for i in 1 2; do
      for _ in $(seq 200); do
        grep -q '^mckey: joined dgid: ' "$work/$name$i.server" 2>/dev/null && break
        kill -0 "${rp[$((i - 1))]}" 2>/dev/null || break
        sleep 0.05
      done
      grep -q '^mckey: joined dgid: ' "$work/$name$i.server" || fail "$name: receiver $i did not join"
    done
    # Before the sender: garbage for the group (4 bytes; a UD SEND Only to
    # the multicast QPN with a bad ICRC; a RC opcode to it; a unicast
    # DestQP) and a well-formed header for a group nobody joined. Each must
    # be dropped without harm (daemon, receivers).
    ip netns exec "$(ns h0)" python3 - "$group" "$b0" <<'PY'
import socket, struct, sys
group, src = sys.argv[1], sys.argv[2]
v6 = ':' in group
s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
def ud(opcode, dqpn, qkey=0x1234567, payload=b'x' * 64):
    bth = struct.pack('!BBHI I', opcode, 0, 0xffff, dqpn & 0xffffff, 1)
    deth = struct.pack('!II', qkey, 0x99)
    return bth + deth + payload + b'\0\0\0\0'
for d in (b'\x64\0\xff\xff', ud(0x64, 0xffffff), ud(0x04, 0xffffff), ud(0x64, 0x12), ud(0x64, 0xffffff)[:30]):
    s.sendto(d, (group, 4791))
s.sendto(ud(0x64, 0xffffff), ('ff0e::1:99' if v6 else '239.1.1.99', 4791))
PY
    on h0 "$run" env SOFTVERBS_ROCE_STATS=1 mckey -m "$group" -b "$b0" -s -C "$count" -S 1000 $sargs \
      >"$work/$name.client" 2>&1
    CRC=$?
    [ $CRC -eq 0 ] || fail "$name: the sender exited $CRC"
    for i in 1 2; do
      wait "${rp[$((i - 1))]}"
      SRC=$?
      f=$work/$name$i.server
      [ $SRC -eq 0 ] || fail "$name: receiver $i exited $SRC"
      grep -q '^data transfers complete$' "$f" || fail "$name: receiver $i did not receive every message"
      grep -Eqi 'error|fail' "$f" && fail "$name: receiver $i reports an error"
      # Exactly COUNT multicast datagrams reached its QP from the wire (one
      # copy each: no IP loopback twin), and the garbled one with a good
      # header failed its ICRC there.
      grep -q "multicast_received $count\$" "$f" || fail "$name: receiver $i: not $count multicast datagrams: $(grep 'softverbs roce' "$f")"
      grep -q " bad_icrc 2 " "$f" || fail "$name: receiver $i: not 2 bad ICRCs (the garbled SEND and the cut one): $(grep 'softverbs roce' "$f")"
    done
    grep -q '^data transfers complete$' "$work/$name.client" || fail "$name: the sender did not finish"
    grep -q "multicast_received 0\$" "$work/$name.client" || fail "$name: the sender received its own multicast from the wire"
    [ $failures -eq 0 ] || { show "${name}1"; show "${name}2"; show "$name"; }
  }
  mckey_run mckey 239.1.1.1 100 ""
  mckey_run mckey_sendonly 239.1.1.2 20 "-o"
  # IPv6 (the veths' fd77:: addresses): the group is the MGID itself.
  mckey_run mckey6 ff0e::1:3 100 ""
  # A member that dies (SIGKILL) leaves the group: h1's daemon joined it
  # (a socket bound to the group, and the kernel's membership), and drops
  # both when the process is gone.
  on h1 "$run" mckey -m 239.1.1.5 -b "$a1" >"$work/killed.server" 2>&1 &
  kp=$!
  pids+=($kp)
  for _ in $(seq 200); do
    grep -q '^mckey: joined dgid: ' "$work/killed.server" 2>/dev/null && break
    sleep 0.05
  done
  ip netns exec "$(ns h1)" ss -Hlun | grep -q '239\.1\.1\.5:4791' || fail "killed: h1's daemon holds no socket for 239.1.1.5"
  ip netns exec "$(ns h1)" ip maddr show | grep -q '239\.1\.1\.5' || fail "killed: h1 did not join 239.1.1.5"
  # mckey itself, a descendant of the background job (softverbs run, timeout).
  tree() { local c; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; tree "$c"; done; }
  for p in $(tree $kp); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = mckey ] && kill -KILL "$p"; done
  wait $kp 2>/dev/null
  # The groups are left when their last member is gone: no socket of either
  # daemon is bound to a group any more.
  for h in h0 h1; do
    for _ in $(seq 60); do
      ip netns exec "$(ns $h)" ss -Hlun | grep -Eq '239\.1\.1\.|ff0e::' || break
      sleep 0.05
    done
    ip netns exec "$(ns $h)" ss -Hlun | grep -Eq '239\.1\.1\.|ff0e::' && fail "$h: a group socket is left: $(ip netns exec "$(ns $h)" ss -Hlun)"
  done
  ip netns exec "$(ns h1)" ip maddr show | grep -Eq '239\.1\.1\.|ff0e::1:' && fail "h1 is still in a group: $(ip netns exec "$(ns h1)" ip maddr show)"
  [ $failures -eq 0 ] || cat "$work/killed.server" >&2
  ;;
busy)
  # Another daemon (a private directory) holds UDP 4791 in h0.
  mkdir -m 700 "$work/holder"
  ip netns exec "$(ns h0)" env "${unset_sv[@]}" "$bin/softverbsd" --foreground --idle 0 --dir "$work/holder" \
    2>"$work/holder.log" &
  holder=$!
  pids+=($holder)
  for _ in $(seq 100); do
    ip netns exec "$(ns h0)" ss -Hlun "sport = :4791" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  ip netns exec "$(ns h0)" ss -Hlun "sport = :4791" | grep -q . || fail "the holder did not take UDP 4791"
  # Same-host QPs of h0's default daemon do not need the port.
  on h0 "$run" ibv_rc_pingpong -g 1 -p 18516 >"$work/local.server" 2>&1 &
  spid=$!
  pids+=($spid)
  for _ in $(seq 200); do
    ip netns exec "$(ns h0)" ss -Hltn "sport = :18516" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  on h0 "$run" ibv_rc_pingpong -g 1 -p 18516 "$a0" >"$work/local.client" 2>&1
  CRC=$?
  wait $spid
  SRC=$?
  check_pingpong local
  # A QP to h1 fails at RTR, saying who holds the port and what to do.
  pair held "$run" 18517
  [ "$CRC" -ne 0 ] || fail "held: the client succeeded although UDP 4791 is held"
  out=$work/held.client
  grep -q "Failed to modify QP to RTR" "$out" || fail "held: no RTR failure"
  grep -q "UDP port 4791 (RoCEv2) on $a0, which is held by softverbsd (pid $holder, user 0) serving $work/holder" "$out" ||
    fail "held: the holder is not named"
  grep -q "SOFTVERBS_DIR=$work/holder" "$out" || fail "held: no advice to share the holder's daemon"
  [ "$(grep -c 'held by' "$out")" -eq 1 ] || fail "held: the message is not said once"
  [ "$CRC" -ne 0 ] && grep -q "held by" "$out" || show held
  # The holder stops: the next QP takes the port.
  kill $holder
  wait $holder 2>/dev/null
  pair freed "$run" 18518
  check_pingpong freed
  ;;
*) log "unknown case $case"; exit 2 ;;
esac

if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "PASS"
