#!/bin/bash
# compat.capture: `softverbs capture` (docs/LAB.md, "Capture") of Debian's
# ibv_rc_pingpong -n 5 -s 4096 over shared memory. tshark must decode every
# packet as RoCE (its infiniband dissector on UDP 4791, no plug-in), with,
# for each of the 10 messages, RC SEND First, Middle, Middle, Last (path
# MTU 1024) to the peer's QPN, PSNs counting up from the sender's (as
# ibv_rc_pingpong prints it), then the responder's RC Acknowledge (MSN
# counting up), UDP lengths 1048 and 28; every ICRC must be right
# (check_capture.py's own computation, IBTA A17.4.1).
#   capture.sh BIN_DIR PORT
. "$(dirname "$0")/lib.sh"
port=${2:?TCP port for ibv_rc_pingpong}
require ibv_rc_pingpong tshark python3
compat_setup
out="$COMPAT_DIR/capture"

"$SV" capture -w "$out.pcapng" -c 50 --duration $((COMPAT_TIMEOUT + 5)) 2>"$out.err" &
cap=$!
_compat_pids+=("$cap")
for _ in $(seq 100); do grep -q capturing "$out.err" 2>/dev/null && break; sleep 0.05; done
grep -q capturing "$out.err" || { cat "$out.err" >&2; fail "softverbs capture did not start"; }

run_pair pingpong "$port" ibv_rc_pingpong -g 0 -p "$port" -s 4096 -n 5 -- \
  ibv_rc_pingpong -g 0 -p "$port" -s 4096 -n 5 127.0.0.1 || fail "ibv_rc_pingpong failed"
wait "$cap" || { cat "$out.err" >&2; fail "softverbs capture exited $?"; }
grep -q "50 packets written, 0 lost" "$out.err" || { cat "$out.err" >&2; fail "softverbs capture: want 50 packets"; }

tshark -r "$out.pcapng" -T fields -E separator=' ' -e frame.protocols -e udp.dstport -e udp.length \
  -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.aeth.msn \
  >"$out.tsv" 2>"$out.tshark.err" || { cat "$out.tshark.err" >&2; fail "tshark -r exited $?"; }
python3 "$(dirname "$0")/capture_check.py" "$out.pcapng" "$out.tsv" "$SERVER_OUT" "$CLIENT_OUT" ||
  fail "the capture is not what ibv_rc_pingpong sent"
check_daemon
log "PASS"
