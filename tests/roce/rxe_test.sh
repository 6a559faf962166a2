#!/usr/bin/env bash
# roce.rxe: softverbs against Linux rxe over RoCEv2 (docs/ROCE.md,
# "Interoperating with Linux rxe"). The rxe side is a Debian 12 guest under
# qemu (scripts/rxe-peer.sh) with its own kernel's rdma_rxe on its eth0; the
# softverbs side is a daemon owning UDP 4791 in the namespace at the other
# end of the guest's tap. Debian's unmodified ibv_*_pingpong and perftest
# programs run in both: Debian's libibverbs + rxe in the guest, ours here.
#
# Each case is a server on one side and a client on the other; the two
# sides run their halves of the cases in the same order (a client retries
# until its server listens), so one boot of the guest runs them all. One
# case is captured on the tap and every frame, rxe's and ours, has its ICRC
# checked by independent code and is decoded by tshark.
#
#   rxe_test.sh SOURCE_DIR BIN_DIR
# RXE_CASES="NAME..." runs only those cases (and mw), RXE_CAPTURE=NAME
# captures that one instead of rc (RXE_CAPTURE_FILTER: its capture filter,
# "udp port 4791"), RXE_KEEP=1 keeps the logs.
# SOFTVERBS_RXE_MTU=9000 (ctest roce.rxe.jumbo): jumbo frames on the tap and
# in the guest, so that both sides' path MTU is 4096; the pingpongs then run
# with -m 4096, perftest must report 4096, and the capture must hold
# 4096-byte payloads from both sides.
# Exit 0 pass, 1 fail, 77 skip: not root, no qemu, or no guest built
# (scripts/rxe-peer.sh image: it needs Debian's mirror and a few minutes,
# so the suite does not build it itself).
set -u
src=$1 bin=$2
peer=$src/scripts/rxe-peer.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
command -v qemu-system-x86_64 >/dev/null || { log "SKIP: no qemu-system-x86_64 (scripts/deps.sh rxe)"; exit $SKIP; }
"$peer" ready || { log "SKIP: no rxe guest built (scripts/rxe-peer.sh image)"; exit $SKIP; }
for p in softverbs softverbsd mw_wire_peer cm_wire_peer; do [ -x "$bin/$p" ] || { log "missing $bin/$p"; exit 1; }; done
export SOFTVERBS_TESTBED=svx$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
N=$SOFTVERBS_TESTBED_NET
HOST4=10.77.$N.1 GUEST4=10.77.$N.2 HOST6=fd77:0:0:$N::1 GUEST6=fd77:0:0:$N::2
work=$(mktemp -d "${TMPDIR:-/tmp}/svrxe.XXXXXX") || exit 1
chmod 711 "$work"
share=$work/share
mkdir -m 777 "$share"
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }

cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  [ -s "$share/qemu.pid" ] && kill "$(cat "$share/qemu.pid")" 2>/dev/null
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then
    for p in "$work/daemon.log" "$share/guest.log"; do [ -s "$p" ] && { log "--- $p"; tail -40 "$p" >&2; }; done
  fi
  "$peer" down 2>/dev/null
  if [ -n "${RXE_KEEP:-}" ]; then log "kept $work"; else rm -rf "$work"; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$peer" up || { log "SKIP: the namespace and tap cannot be created"; exit $SKIP; }
command -v tshark >/dev/null && capture=1 || capture=0
# Captured frames as the wire carries them: our UDP GSO sends cut by the
# kernel before the tap (as wire_test.sh's capture case does on its veths).
"$peer" exec /usr/bin/python3 "$src/scripts/netdev_feature.py" tap0 tx-udp-segmentation off 2>/dev/null || true
mkdir -m 700 "$work/sv"
SOFTVERBS_ROCE=1 "$peer" exec "$bin/softverbsd" --foreground --idle 0 --dir "$work/sv" 2>"$work/daemon.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/sv/control" ] && break; sleep 0.05; done
[ -S "$work/sv/control" ] || { log "softverbsd did not come up"; exit 1; }

# The cases: NAME SERVER(host|guest) COMMAND (each on its own -p port). @G4@/@G6@ become the side's
# own GID index of its IPv4/IPv6 address, @DEV@ the guest's "-d rxe0"; the
# client adds the server's address. --chk: the pingpongs compare every
# byte received; perftest's programs count completions.
cases=(
  "rc host ibv_rc_pingpong @DEV@ @MTU@ -p 18601 -g @G4@ -n 200 -s 4096 --chk"
  "rc_rxe_serves guest ibv_rc_pingpong @DEV@ @MTU@ -p 18602 -g @G4@ -n 200 -s 8192 --chk"
  "rc6 host ibv_rc_pingpong @DEV@ @MTU@ -p 18603 -g @G6@ -n 100 -s 4096 --chk"
  "uc guest ibv_uc_pingpong @DEV@ @MTU@ -p 18604 -g @G4@ -n 200 -s 1024 --chk"
  "ud host ibv_ud_pingpong @DEV@ -p 18605 -g @G4@ -n 200 -s 512 --chk"
  "srq guest ibv_srq_pingpong @DEV@ @MTU@ -p 18606 -g @G4@ -n 100 -q 4 -s 2048 --chk"
  "write_bw host ib_write_bw @DEV@ -p 18607 -x @G4@ -F -s 65536 -n 200"
  "read_bw guest ib_read_bw @DEV@ -p 18608 -x @G4@ -F -s 65536 -n 200"
  "send_bw host ib_send_bw @DEV@ -p 18609 -x @G4@ -F -s 65536 -n 200"
  "atomic_fadd guest ib_atomic_bw @DEV@ -p 18610 -x @G4@ -F -A FETCH_AND_ADD -n 500"
  "atomic_cas host ib_atomic_bw @DEV@ -p 18611 -x @G4@ -F -A CMP_AND_SWAP -n 500"
  "write_lat guest ib_write_lat @DEV@ -p 18612 -x @G4@ -F -s 8 -n 500"
  "read_lat host ib_read_lat @DEV@ -p 18613 -x @G4@ -F -s 8 -n 500"
  "send_lat guest ib_send_lat @DEV@ -p 18614 -x @G4@ -F -s 8 -n 500"
  "write_bw_uc host ib_write_bw @DEV@ -p 18615 -x @G4@ -F -c UC -s 65536 -n 200"
  "send_bw_ud guest ib_send_bw @DEV@ -p 18616 -x @G4@ -F -c UD -s 1024 -n 500"
  "write_bw6 guest ib_write_bw @DEV@ -p 18617 -x @G6@ -F -s 65536 -n 200"
  "write_bw_q4 host ib_write_bw @DEV@ -p 18630 -x @G4@ -F -q 4 -s 65536 -n 200"
  "send_bw_bidir guest ib_send_bw @DEV@ -p 18631 -x @G4@ -F -b -s 65536 -n 200"
  # The connection manager: the kernel's rdma_cm and CM in the guest, ours
  # here (docs/RDMACM.md, "Between hosts"). perftest -R only with rxe as
  # the client: its client connects a second time right after a handshake
  # that its server leaves only then to listen, and Linux's CM rejects a REQ
  # that comes first, which, against a guest under emulation, ours always does.
  "write_bw_cm host ib_write_bw @DEV@ -p 18618 -R -F -s 65536 -n 200"
  "send_bw_ud_cm host ib_send_bw @DEV@ -p 18619 -R -F -c UD -s 1024 -n 500"
  "rping host rping -s -a @SELF4@ -v -C 20 -p 18620 -- rping -c -v -C 20 -p 18620 -a"
  "rping_rxe_serves guest rping -s -a @SELF4@ -v -C 20 -p 18621 -- rping -c -v -C 20 -p 18621 -a"
  "rping6_rxe_serves guest rping -s -a @SELF6@ -v -C 20 -p 18622 -- rping -c -v -C 20 -p 18622 -a @PEER6@"
  "ucmatose host ucmatose -p 18623 -c 4 -C 20 -- ucmatose -p 18623 -c 4 -C 20 -s"
  "ucmatose_rxe_serves guest ucmatose -p 18624 -c 4 -C 20 -- ucmatose -p 18624 -c 4 -C 20 -s"
  "udaddy host udaddy -- udaddy -s"
  "udaddy_rxe_serves guest udaddy -- udaddy -s"
  "rdma_server host rdma_server -p 18625 -- rdma_client -p 18625 -s"
  "rdma_server_rxe_serves guest rdma_server -p 18626 -- rdma_client -p 18626 -s"
  # tests/roce/cm_wire_peer (built here; in the guest on Debian's librdmacm):
  # private data both ways, in a REQ and in the REJ (consumer reason 28).
  "cm_reject host @BIN@cm_wire_peer reject 18627 -- @BIN@cm_wire_peer connect @PEER4@ 18627"
  "cm_reject_rxe_serves guest @BIN@cm_wire_peer reject 18628 -- @BIN@cm_wire_peer connect @PEER4@ 18628"
)
JUMBO=0
[ "${SOFTVERBS_RXE_MTU:-1500}" -ge 4200 ] && JUMBO=1
CAPTURED=${RXE_CAPTURE:-rc}
# RXE_CASES="rc rc6 ...": run only these (while debugging one).
if [ -n "${RXE_CASES:-}" ]; then
  keep=()
  for c in "${cases[@]}"; do [[ " $RXE_CASES " == *" ${c%% *} "* ]] && keep+=("$c"); done
  cases=("${keep[@]}")
fi

# The shell functions both sides run (the guest's is /bin/sh: POSIX only).
# run_side NAME ROLE SERVER_ADDR CMD: CMD as server, or as client with the
# server's address last unless SERVER_ADDR is "-" (retried while it "Couldn't connect", or with rdma_cm
# while its REQ is rejected or unanswered, as before the server listens), its
# output in $OUT/NAME.log, exit code in .rc.
side_lib() {
  cat <<'EOF'
run_side() {
  name=$1 role=$2 addr=$3
  shift 3
  i=0
  while :; do
    if [ "$role" = client ]; then
      if [ "$addr" = - ]; then
        $WRAP timeout -k 5 ${RXE_TIMEOUT:-120} "$@" >"$OUT/$name.log" 2>&1
      else
        $WRAP timeout -k 5 ${RXE_TIMEOUT:-120} "$@" "$addr" >"$OUT/$name.log" 2>&1
      fi
    else
      $WRAP timeout -k 5 ${RXE_TIMEOUT:-120} "$@" >"$OUT/$name.log" 2>&1
    fi
    rc=$?
    # (cm_wire_peer exits 0 with any answer: "status 8" is "nobody listens")
    { [ "$role" = client ] && [ $rc -ne 0 ] && grep -Eq "Couldn't connect|Unexpected CM event bl blka 8|RDMA_CM_EVENT_(REJECTED|UNREACHABLE)|rdma_connect: Connection refused" "$OUT/$name.log" ||
      grep -q "^event RDMA_CM_EVENT_REJECTED status 8 " "$OUT/$name.log"; } &&
      [ $i -lt 240 ] || break
    i=$((i + 1))
    sleep 0.5
  done
  echo $rc >"$OUT/$name.rc"
}
EOF
}

# subst SIDE ROLE CMD: the ROLE's half of CMD ("SERVER -- CLIENT", or one
# command for both) with the side's GID indices, device, own addresses
# (@SELF4@, @SELF6@), the other's (@PEER4@, @PEER6@: then run_side is given
# "-" for the address), where cm_wire_peer is (@BIN@) and, in jumbo mode,
# the pingpongs' MTU.
subst() {
  local c=$3
  if [[ "$c" == *" -- "* ]]; then
    if [ "$2" = server ]; then c=${c%% -- *}; else c=${c#* -- }; fi
  fi
  if [ $JUMBO -eq 1 ]; then c=${c//@MTU@/-m 4096}; else c=${c//@MTU@ /}; fi
  if [ "$1" = guest ]; then
    c=${c//@SELF4@/$GUEST4}
    c=${c//@SELF6@/$GUEST6}
    c=${c//@PEER4@/$HOST4}
    c=${c//@PEER6@/$HOST6}
    c=${c//@BIN@//tmp/}
    c=${c//@DEV@/-d rxe0}
    c=${c//@G4@/\$G4}
    c=${c//@G6@/\$G6}
  else
    c=${c//@SELF4@/$HOST4}
    c=${c//@SELF6@/$HOST6}
    c=${c//@PEER4@/$GUEST4}
    c=${c//@PEER6@/$GUEST6}
    c=${c//@BIN@/$bin/}
    c=${c//@DEV@ /}
    c=${c//@G4@/$HG4}
    c=${c//@G6@/$HG6}
  fi
  echo "$c"
}

# Our GID indices: from ibv_devinfo on softverbs, as a user would find them.
on_sv() {
  SOFTVERBS_DIR=$work/sv SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 "$peer" exec "$bin/softverbs" run -- "$@"
}
gid_of() { on_sv ibv_devinfo -v | grep -F "$1, RoCE v2" | sed -n 's/.*GID\[ *\([0-9]*\)\].*/\1/p' | head -1; }
HG4=$(gid_of "::ffff:$HOST4")
HG6=$(gid_of "fd77:0:0:$N::1")
[ -n "$HG4" ] && [ -n "$HG6" ] || { log "no RoCE v2 GID for $HOST4 / fd77:0:0:$N::1 in ibv_devinfo"; on_sv ibv_devinfo -v >&2; exit 1; }

# The guest's script: its GID indices (from ibv_devinfo, as ours), then its halves.
{
  echo "OUT=/share WRAP="
  echo "cp /share/cm_wire_peer /tmp/"
  side_lib
  cat <<EOF
gid() { ibv_devinfo -v -d rxe0 | grep -F "\$1, RoCE v2" | sed -n 's/.*GID\\[ *\\([0-9]*\\)\\].*/\\1/p' | head -1; }
G4=\$(gid ::ffff:$GUEST4)
G6=\$(gid fd77:0:0:$N::2)
echo "rxe0 GID indices: IPv4 \$G4, IPv6 \$G6"
ibv_devinfo -v -d rxe0 | grep -E 'GID|active_mtu'
EOF
  for c in "${cases[@]}"; do
    read -r name server cmd <<<"$c"
    role=client
    [ "$server" = guest ] && role=server
    addr=$HOST4
    [ $role = client ] && [[ "$cmd" == *@PEER[46]@* ]] && addr=-
    echo "echo '== $name'; run_side $name $role $addr $(subst guest $role "$cmd")"
  done
  # The memory-window peer (tests/roce/mw_wire_peer.cc) on Debian's
  # libibverbs: a type 2 window of rxe's, written, read and invalidated by us.
  echo "echo '== mw'; cp /share/mw_wire_peer /tmp/"
  echo 'timeout -k 5 120 /tmp/mw_wire_peer server /share/mwdir >/share/mw.log 2>&1; echo $? >/share/mw.rc'
} >"$share/guest.sh"
cp "$bin/mw_wire_peer" "$bin/cm_wire_peer" "$share/"
mkdir -m 777 "$share/mwdir"

log "booting the rxe guest (qemu, ${SOFTVERBS_RXE_ACCEL:-tcg}) ..."
"$peer" boot "$share" &
guest=$!
pids+=($guest)

eval "$(side_lib)"
OUT=$work WRAP=on_sv
for c in "${cases[@]}"; do
  read -r name server cmd <<<"$c"
  role=server
  [ "$server" = guest ] && role=client
  if [ "$name" = "$CAPTURED" ] && [ $capture -eq 1 ]; then
    "$peer" exec tshark -q -i tap0 -F pcap -f "${RXE_CAPTURE_FILTER:-udp port 4791}" -w "$work/rxe.pcap" 2>"$work/tshark.log" &
    cap=$!
    pids+=($cap)
    for _ in $(seq 100); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
  fi
  # shellcheck disable=SC2046
  addr=$GUEST4
  [ $role = client ] && [[ "$cmd" == *@PEER[46]@* ]] && addr=-
  run_side "$name" "$role" "$addr" $(subst host $role "$cmd")
  log "$name: softverbs $role exit $(cat "$work/$name.rc")"
  if [ "$name" = "$CAPTURED" ] && [ $capture -eq 1 ]; then
    sleep 0.5
    kill $cap 2>/dev/null
    wait $cap 2>/dev/null
  fi
done
# mw: the guest serves; our client meets it through the shared folder,
# once the guest has reached it (mw_wire_peer waits 30 s for a file).
for _ in $(seq 400); do [ -s "$share/mwdir/server.qp" ] && break; kill -0 $guest 2>/dev/null || break; sleep 0.5; done
on_sv timeout -k 5 150 "$bin/mw_wire_peer" client "$share/mwdir" >"$work/mw.log" 2>&1
echo $? >"$work/mw.rc"
log "mw: softverbs client exit $(cat "$work/mw.rc")"

wait $guest || fail "the guest did not finish its script"
pids=("${pids[@]/$guest/}")
cat "$share/guest.log" >&2

# rping -v's lines: "rdma-ping-<n>: " then 64 - 1 bytes' worth of the
# characters from 'A' + n on (of the 58 from 'A'), as many as fit.
rping_lines() {
  local i k line
  for i in $(seq 0 $(($1 - 1))); do
    line="rdma-ping-$i: "
    for k in $(seq 0 $((50 - ${#i}))); do line+=$(printf "\\$(printf '%03o' $((65 + (i + k) % 58)))"); done
    echo "$line"
  done
}
# has FILE COUNT REGEX: exactly COUNT lines of FILE match.
has() { [ "$(grep -Ec -- "$3" "$1")" -eq "$2" ] || fail "$(basename "$1" .log) ($1): not $2 lines matching '$3'"; }

# check NAME [SERVER]: both halves exited 0, said what the program says on
# success (perftest's READ latency test reports on its client only; rping
# each of its 20 lines, checked by byte), reported no error, and our QP
# went over the wire with a clean ICRC.
check() {
  local name=$1 server=${2:-} side f role
  for side in host guest; do
    f=$work/$name.log
    [ $side = guest ] && f=$share/$name.log
    role=client
    [ "$side" = "$server" ] && role=server
    if [ "$(cat "${f%.log}.rc" 2>/dev/null)" != 0 ]; then
      fail "$name: $side side exit $(cat "${f%.log}.rc" 2>/dev/null)"
      log "----- $name on the $side:"
      cat "$f" >&2 2>/dev/null
      continue
    fi
    case $name in
      mw) ;;
      rping*)
        local prefix="ping data: "
        [ $role = server ] && prefix="server ping data: "
        rping_lines 20 | sed "s/^/$prefix/" | grep -Fxvf "$f" >"$work/$name.$side.missing"
        [ -s "$work/$name.$side.missing" ] && fail "$name $side: rping lines missing or wrong, the first: $(head -1 "$work/$name.$side.missing")"
        has "$f" 20 "^${prefix}"
        grep -qi 'error\|fail' "$f" && fail "$name $side: reported an error" ;;
      ucmatose*)
        has "$f" 1 '^data transfers complete$'
        has "$f" 1 '^return status 0$' ;;
      cm_reject*)
        if [ $role = server ]; then
          has "$f" 1 '^request data hello$'
          has "$f" 1 '^rejected$'
        else
          has "$f" 1 '^event RDMA_CM_EVENT_REJECTED status 28 data no-thanks-from-h1$'
        fi ;;
      rdma_server*)
        has "$f" 1 "^$([ $role = server ] && echo rdma_server || echo rdma_client): end 0\$" ;;
      udaddy*)
        [ $role = server ] && has "$f" 1 '^sending replies$'
        [ $role = client ] && has "$f" 1 '^data transfers complete$'
        has "$f" 1 '^return status 0$' ;;
      rc* | uc | ud | srq)
        grep -Eq "^[0-9]+ iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" "$f" || fail "$name $side: no 'iters in' line"
        grep -qi 'invalid\|fail\|error\|couldn' "$f" && fail "$name $side: reported an error" ;;
      read_lat)
        [ $side = "$server" ] || grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$f" || fail "$name $side: no result line"
        grep -qi 'error\|fail\|couldn' "$f" && fail "$name $side: reported an error" ;;
      *)
        grep -Eq '^ *[0-9]+ +[0-9]+ +[0-9.]+' "$f" || fail "$name $side: no result line"
        grep -qi 'error\|fail\|couldn' "$f" && fail "$name $side: reported an error"
        # perftest's MTU is the port's active_mtu: the same on both sides.
        [ $JUMBO -eq 1 ] && ! grep -Eq '^ *Mtu *: 4096\[B\]' "$f" && fail "$name $side: perftest's MTU is not 4096"
        [[ $name == *_cm ]] && ! grep -q 'rdma_cm' "$f" && fail "$name $side: perftest did not say it used rdma_cm" ;;
    esac
    if [ $side = host ] && [[ $name != cm_reject* ]]; then  # (no QP reaches RTR there)
      grep -q "softverbs roce: qp" "$f" || fail "$name: our QP was not on the wire"
      grep -o "bad_icrc [0-9]*" "$f" | grep -qv "bad_icrc 0$" && fail "$name: datagrams from rxe with a bad ICRC"
    fi
  done
}
for c in "${cases[@]}"; do
  read -r name server _ <<<"$c"
  check "$name" "$server"
done
check mw
# rxe's IPv4 packets carry a non-zero IP ID (docs/ROCE.md): seen and accepted.
if [ -f "$work/rc.log" ]; then
  ids=$(grep -ho "nonzero_ipv4_id [0-9]*" "$work"/rc.log | awk '{s += $2} END {print s + 0}')
  log "rc: $ids datagrams from rxe with a non-zero IPv4 ID accepted"
  [ "$ids" -gt 0 ] || fail "rc: no datagram with a non-zero IPv4 ID: was rxe really the peer?"
fi

if [ $capture -eq 1 ] && [ -f "$work/rxe.pcap" ]; then
  # SEND First/Middle/Last, ACK; rxe's frames and ours. In jumbo mode the
  # 4096-byte messages are SEND Only, and both sides' carry 4096 bytes:
  # UDP length 8 + BTH 12 + 4096 + ICRC 4.
  need=0x00,0x01,0x02,0x11
  [ $JUMBO -eq 1 ] && need=0x04,0x11
  /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/rxe.pcap" $need ||
    fail "capture: check_capture.py"
  if [ $JUMBO -eq 1 ]; then
    big=$(tshark -r "$work/rxe.pcap" -Y "udp.length == 4120" -T fields -e ip.src 2>/dev/null | sort | uniq -c | tr '\n' ' ')
    log "capture: 4096-byte payloads (count, from): $big"
    [[ "$big" == *" $HOST4 "* && "$big" == *" $GUEST4 "* ]] || fail "capture: not both sides sent 4096-byte payloads"
  fi
  srcs=$(tshark -r "$work/rxe.pcap" -T fields -e ip.src 2>/dev/null | sort -u | tr '\n' ' ')
  log "capture: frames from $srcs"
  [[ "$srcs" == *"$HOST4"* && "$srcs" == *"$GUEST4"* ]] || fail "capture: not both sides' frames"
fi
if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  exit 1
fi
log "all ${#cases[@]} cases and mw passed against rxe"
exit 0
