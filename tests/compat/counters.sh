#!/bin/bash
# compat.counters: the device's counters (docs/LAB.md, "Counters") against
# known traffic. Debian's ibv_rc_pingpong -n 100 -s 4096 (both sides send
# and receive 100 messages of 4096 bytes over shared memory), then:
# `rdma statistic show` (iproute2, through the netlink stand-in) must show
# exactly rdma_sends 200, rdma_recvs 200, sent_bytes and rcvd_bytes 819200,
# shm_ops 200 and no packet; so must the sysfs view's
# ports/1/hw_counters files; `softverbs status --json` must parse
# (python3 -m json.tool) and say the same.
#   counters.sh BIN_DIR PORT
. "$(dirname "$0")/lib.sh"
port=${2:?TCP port for ibv_rc_pingpong}
require rdma ibv_rc_pingpong python3
compat_setup
out="$COMPAT_DIR/counters"

run_pair pingpong "$port" ibv_rc_pingpong -g 0 -p "$port" -s 4096 -n 100 -- \
  ibv_rc_pingpong -g 0 -p "$port" -s 4096 -n 100 127.0.0.1 || fail "ibv_rc_pingpong failed"

sv_run rdma statistic show >"$out.stat" 2>&1 || fail "rdma statistic show exited $?"
for want in "sent_pkts 0" "rcvd_pkts 0" "rdma_sends 200" "rdma_recvs 200" "sent_bytes 819200" \
  "rcvd_bytes 819200" "shm_ops 200" "mediated_ops 0" "shm_errors 0"; do
  grep -Eq "^link sv0/1 .*\\b$want\\b" "$out.stat" || fail "rdma statistic show: want '$want'"
done

# The sysfs view's hw_counters (rxe's files), refreshed every second while
# the program runs: read after the first refresh.
hw=/sys/class/infiniband/sv0/ports/1/hw_counters
sv_run sh -c "sleep 1.5; for f in rdma_sends rdma_recvs sent_bytes shm_ops sent_pkts; do echo \$f \$(cat $hw/\$f); done" \
  >"$out.hw" 2>&1 || fail "reading $hw exited $?"
for want in "rdma_sends 200" "rdma_recvs 200" "sent_bytes 819200" "shm_ops 200" "sent_pkts 0"; do
  grep -qx "$want" "$out.hw" || fail "$hw: want '$want'"
done

# `rdma statistic qp show`: a live QP's own counters (ibv_rc_pingpong's
# server, waiting for its client), one counter object per QP.
qport=$((port + 1000))
"$SV" run -- timeout -k 5 $((COMPAT_TIMEOUT + 10)) ibv_rc_pingpong -g 0 -p "$qport" >"$out.server" 2>&1 &
spid=$!
_compat_pids+=("$spid")
wait_listen "$qport" "$spid" || fail "ibv_rc_pingpong never listened on $qport"
sv_run rdma statistic qp show >"$out.qp" 2>&1 || fail "rdma statistic qp show exited $?"
grep -Eq '^link sv0/1 cntn [0-9]+ pid [0-9]+ comm ibv_rc_pingpong .*rdma_sends 0 .*shm_ops 0 ' "$out.qp" ||
  fail "rdma statistic qp show: the server's QP with its pid and counters"
grep -Eq '^ +LQPN: <[0-9]+>' "$out.qp" || fail "rdma statistic qp show: the QP's number"
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null

"$SV" status --json >"$out.json" 2>"$out.json.err" || fail "softverbs status --json exited $?"
python3 -m json.tool "$out.json" >/dev/null || fail "softverbs status --json: not JSON"
python3 - "$out.json" "$out.stat" <<'PY' || fail "softverbs status --json: not what rdma statistic show says"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["schema"] == "softverbs-status/1", doc["schema"]
port = doc["ports"][0]
assert port["device"] == "sv0" and port["port"] == 1, port
assert list(port["counters"]) == doc["counter_names"], "counters in counter_names' order"
words = open(sys.argv[2]).read().split()
stat = {words[i]: int(words[i + 1]) for i in range(2, len(words) - 1, 2)}
assert stat == port["counters"], (stat, port["counters"])
assert doc["contexts"] == [], "no QP lives once ibv_rc_pingpong exited"
PY

if [ "$_compat_failures" -ne 0 ]; then
  for f in "$out".*; do show "$(basename "$f")" "$f"; done
fi
finish
