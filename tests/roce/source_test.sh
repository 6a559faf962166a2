#!/usr/bin/env bash
# roce.source: a connected QP takes packets from its peer's address only
# (IBTA 9.6; Linux rxe, rxe_recv.c check_addr). Three hosts of the test bed:
# in h1 a daemon and source_probe (a UC and an RC QP connected to h0, PSN 0
# expected, receives posted). From h2, a third host, valid datagrams for
# them (SEND Only, PSN 0, right P_Key, a correct ICRC for h2's headers): no
# receive completes, and each QP counts them (wrong_source). The very same
# datagrams from h0 (ICRC for h0's headers, any UDP source port) complete
# one receive on each QP.
#
#   source_test.sh SOURCE_DIR BIN_DIR SOURCE_PROBE
set -u
src=$1 bin=$2 probe=$3
tb=$src/scripts/testbed.sh
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
ip netns list >/dev/null 2>&1 || { log "SKIP: no network namespaces"; exit $SKIP; }
export SOFTVERBS_TESTBED=svo$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
work=$(mktemp -d "${TMPDIR:-/tmp}/svsrc.XXXXXX") || exit 1
chmod 711 "$work"
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ] && for p in "$work"/*.log "$work"/*.out; do
    [ -s "$p" ] && { log "--- $p"; cat "$p" >&2; }
  done
  "$tb" down 2>/dev/null
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

"$tb" up 3 || { log "SKIP: the test bed cannot be created"; exit $SKIP; }
a0=$("$tb" addr h0)
a1=$("$tb" addr h1)
a2=$("$tb" addr h2)
mkdir -m 700 "$work/h1"
SOFTVERBS_ROCE=1 "$tb" exec h1 "$bin/softverbsd" --foreground --idle 0 --dir "$work/h1" 2>"$work/daemon.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$work/h1/control" ] && break; sleep 0.05; done
[ -S "$work/h1/control" ] || { log "softverbsd did not come up"; exit 1; }
mkfifo "$work/probe.in"
SOFTVERBS_DIR=$work/h1 SOFTVERBS_NO_SPAWN=1 SOFTVERBS_ROCE_STATS=1 \
  "$tb" exec h1 "$bin/softverbs" run -- "$probe" "$a0" <"$work/probe.in" >"$work/probe.out" 2>&1 &
probe_pid=$!
pids+=($probe_pid)
exec {probe_fd}>"$work/probe.in"
for _ in $(seq 200); do grep -q "^rc " "$work/probe.out" && break; sleep 0.05; done
uc=$(awk '$1 == "uc" {print $2}' "$work/probe.out")
rc=$(awk '$1 == "rc" {print $2}' "$work/probe.out")
[ -n "$uc" ] && [ -n "$rc" ] || { log "source_probe did not come up"; exit 1; }
log "UC QP $uc, RC QP $rc in h1"

# send HOST SRC_IP MARK COUNT: COUNT times a UC SEND Only and an RC SEND Only
# (PSN 0, 32 bytes of MARK) from HOST to h1:4791, the ICRC over the headers
# as they leave (IPv4 ID 0: DF on an unconnected socket; IBTA A17.4.1).
send() {
  "$tb" exec "$1" /usr/bin/python3 - "$2" "$a1" "$uc" "$rc" "$3" "$4" <<'PY'
import socket, struct, sys, zlib
src, dst, uc, rc, mark, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5], 0), int(sys.argv[6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
s.bind((src, 0))
sport = s.getsockname()[1]
def icrc(udp_payload):
    n = 20 + 8 + len(udp_payload) + 4
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0xff, n, 0, 0x4000, 0xff, 17, 0xffff,
                     socket.inet_aton(src), socket.inet_aton(dst))
    udp = struct.pack(">HHHH", sport, 4791, n - 20, 0xffff)
    p = bytearray(udp_payload)
    p[4] = 0xff  # BTH resv8a
    return struct.pack("<I", zlib.crc32(b"\xff" * 8 + ip + udp + bytes(p)) & 0xffffffff)
for qpn, opcode in ((uc, 0x24), (rc, 0x04)):  # UC / RC SEND Only
    bth = struct.pack(">BBHII", opcode, 0, 0xffff, qpn, (1 << 31) if opcode == 0x04 else 0)
    dg = bth + bytes([mark]) * 32
    dg += icrc(dg)
    for _ in range(count):
        s.sendto(dg, (dst, 4791))
PY
}

send h2 "$a2" 0x33 3
sleep 1
if grep -q "^recv" "$work/probe.out"; then
  fail "datagrams from the third host $a2 completed receives: $(grep '^recv' "$work/probe.out" | tr '\n' ';')"
fi
send h0 "$a0" 0x44 1
for _ in $(seq 100); do [ "$(grep -c "^recv" "$work/probe.out")" -ge 2 ] && break; sleep 0.05; done
for q in "$uc" "$rc"; do
  grep -q "^recv $q 32 68 status 0$" "$work/probe.out" || fail "QP $q: the peer's datagram was not received"
done
echo quit >&$probe_fd
wait $probe_pid
for q in "$uc" "$rc"; do
  got=$(grep "^softverbs roce: qp $q:" "$work/probe.out" | grep -o "wrong_source [0-9]*" | awk '{print $2}')
  [ "${got:-x}" = 3 ] || fail "QP $q counted ${got:-no} datagrams from a wrong source, 3 were sent"
  bad=$(grep "^softverbs roce: qp $q:" "$work/probe.out" | grep -o "bad_icrc [0-9]*" | awk '{print $2}')
  [ "${bad:-x}" = 0 ] || fail "QP $q: $bad datagrams with a bad ICRC (the test's ICRC is wrong?)"
done
if [ $failures -ne 0 ]; then
  log "$failures check(s) failed"
  cat "$work/probe.out" >&2
  exit 1
fi
log "PASS"
exit 0
