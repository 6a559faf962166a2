#!/usr/bin/env bash
# roce_demo between two namespaces of the test bed over UDP 4791, over IPv4
# and then over IPv6, with 1% loss and 5% reordering injected by the fault
# hook, while tshark captures on the server's veth; then every captured
# RoCEv2 frame is checked: ICRC (with the IP header as sent, by
# check_capture.py's independent code), DF, and tshark's decoding, with every
# opcode the demo uses present.
# Usage: testbed_demo_test.sh SOURCE_DIR ROCE_DEMO. Skipped (77) without root
# or tshark.
set -euo pipefail
src=$1 demo=$2
tb=$src/scripts/testbed.sh
[ "$(id -u)" -eq 0 ] || { echo "not root: skipped"; exit 77; }
command -v tshark >/dev/null || { echo "no tshark: skipped"; exit 77; }
export SOFTVERBS_TESTBED=svtbdemo$$ SOFTVERBS_TESTBED_NET=$(( $$ % 200 + 20 ))
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$tb" down
  rm -rf "$work"
}
trap cleanup EXIT
"$tb" up 2
rc=0
for fam in 4 6; do
  echo "== IPv$fam =="
  a0=$("$tb" addr h0 $fam)
  a1=$("$tb" addr h1 $fam)
  : >"$work/tshark.log"
  "$tb" exec h1 tshark -q -i eth0 -F pcap -f "udp port 4791" -w "$work/demo$fam.pcap" 2>"$work/tshark.log" &
  cap=$!
  pids+=($cap)
  for _ in $(seq 50); do grep -q "Capturing on" "$work/tshark.log" 2>/dev/null && break; sleep 0.1; done
  "$tb" exec h1 "$demo" server "$a1" "$a0" --count 40 --size 5000 --loss 0.01 --reorder 0.05 --seed 2 \
    >"$work/server.log" 2>&1 &
  server=$!
  pids+=($server)
  sleep 0.2
  "$tb" exec h0 "$demo" client "$a0" "$a1" --count 40 --size 5000 --loss 0.01 --reorder 0.05 --seed 1 || rc=1
  wait "$server" || rc=1
  cat "$work/server.log"
  sleep 0.5
  kill "$cap" 2>/dev/null || true
  wait "$cap" 2>/dev/null || true
  # SEND First/Middle/Last, WRITE First/Middle/Last, READ request and
  # responses, FetchAdd, ACK, ATOMIC ACK, SEND Only with Immediate.
  /usr/bin/python3 "$src/tests/roce/check_capture.py" --verify-pcap "$work/demo$fam.pcap" \
    0x00,0x01,0x02,0x06,0x07,0x08,0x0c,0x0d,0x0e,0x0f,0x11,0x12,0x14,0x05 || rc=1
done
exit $rc
