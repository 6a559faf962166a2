#!/bin/bash
# compat.rdma_tool: iproute2's `rdma` (Debian's, unmodified), which speaks
# only RDMA netlink, under `softverbs run` (the stand-in of src/nldev/):
# `rdma link` (and `rdma link show -j`, parsed as rdma-core's tests/base.py
# parses it to find the port's net device), `rdma dev`, `rdma resource show`
# with ibv_rc_pingpong holding a PD, an MR, a CQ and a QP (each listed with
# its pid and command), `rdma statistic show` (rxe's counter names), and a
# command the stand-in does not answer (refused at once, never a hang).
#   rdma_tool.sh BIN_DIR PORT
. "$(dirname "$0")/lib.sh"
port=${2:?TCP port for ibv_rc_pingpong}
require rdma ibv_rc_pingpong python3
compat_setup
out="$COMPAT_DIR/rdma"

# check FILE DESCRIPTION EXTENDED-REGEX
check() { grep -Eq "$3" "$1" || fail "$2 (want /$3/)"; }

sv_run rdma link >"$out.link" 2>&1 || fail "rdma link exited $?"
check "$out.link" "rdma link: sv0's port, active, with its net device" \
  '^link sv0/1 state ACTIVE physical_state LINK_UP netdev [^ ]+ *$'

sv_run rdma link show -j >"$out.json" 2>"$out.json.err" || fail "rdma link show -j exited $?"
python3 - "$out.json" <<'EOF' || fail "rdma link show -j: not what rdma-core's tests/base.py needs"
import json, os, sys
rows = json.load(open(sys.argv[1]))
row = [r for r in rows if r.get('ifname') == 'sv0' and r.get('port') == 1]
assert row, rows
netdev = row[0]['netdev']
assert os.path.isdir('/sys/class/net/' + netdev), netdev
EOF

sv_run rdma dev >"$out.dev" 2>&1 || fail "rdma dev exited $?"
check "$out.dev" "rdma dev: sv0, a CA, its firmware and GUIDs" \
  '^[0-9]+: sv0: node_type ca fw softverbs [^ ]+ node_guid [0-9a-f]{4}(:[0-9a-f]{4}){3} sys_image_guid [0-9a-f]{4}(:[0-9a-f]{4}){3} *$'

# A program holding objects: ibv_rc_pingpong's server has its QP in INIT
# while it waits for its client.
"$SV" run -- timeout -k 5 $((COMPAT_TIMEOUT + 10)) ibv_rc_pingpong -g 0 -p "$port" >"$out.server" 2>&1 &
spid=$!
_compat_pids+=("$spid")
wait_listen "$port" "$spid" || fail "ibv_rc_pingpong never listened on $port"
sv_run rdma resource show >"$out.res" 2>&1 || fail "rdma resource show exited $?"
check "$out.res" "rdma resource show: the counts" '^[0-9]+: sv0: pd 1 cq 1 qp 1 mr 1 *$'
sv_run rdma resource show qp >"$out.qp" 2>&1 || fail "rdma resource show qp exited $?"
check "$out.qp" "rdma resource show qp: the server's QP with its pid" \
  '^link sv0/1 lqpn [0-9]+ rqpn [0-9]+ type RC state INIT .*pid [0-9]+ comm ibv_rc_pingpong *$'
for kind in cq mr pd; do
  sv_run rdma resource show $kind >"$out.$kind" 2>&1 || fail "rdma resource show $kind exited $?"
  check "$out.$kind" "rdma resource show $kind: the server's with its pid" '^dev sv0 .*pid [0-9]+ comm ibv_rc_pingpong *$'
done
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null

sv_run rdma statistic show >"$out.stat" 2>&1 || fail "rdma statistic show exited $?"
for c in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_rnr_err send_rnr_err rcvd_seq_err \
  ack_deferred retry_exceeded_err retry_rnr_exceeded_err completer_retry_err send_err link_downed rdma_sends rdma_recvs; do
  check "$out.stat" "rdma statistic show: counter $c" "^link sv0/1 .*\\b$c [0-9]+"
done

# Not answered by the stand-in: refused with EOPNOTSUPP at once.
start=$SECONDS
if sv_run rdma resource show cm_id >"$out.cm_id" 2>&1; then
  fail "rdma resource show cm_id succeeded; the stand-in has no cm_id list"
fi
[ $((SECONDS - start)) -lt 10 ] || fail "rdma resource show cm_id took $((SECONDS - start)) s"
check "$out.cm_id" "rdma resource show cm_id: the refusal" 'Operation not supported'

if [ "$_compat_failures" -ne 0 ]; then
  for f in "$out".*; do show "$(basename "$f")" "$f"; done
fi
finish
