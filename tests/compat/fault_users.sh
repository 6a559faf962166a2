#!/bin/bash
# compat.faults.users: a request delayed and one refused with RNR NAKs on the
# mediated path (docs/LAB.md "Faults"): Debian's ibv_rc_pingpong between two
# users of one host through the system daemon (softverbsd --system), the
# server as root with the plan, the client as nobody (uid 65534). The
# server's third SEND is held 400 ms and its fifth refused 3 times (the
# pingpong's rnr_retry is 7, infinite): both sides finish all 20 round
# trips, the server's run takes 400 ms more, the plan's log has both, and
# the daemon counted the QPs' requests as mediated. Needs root.
#   fault_users.sh BIN_DIR PORT
set -u
USERS_NEEDS="ibv_rc_pingpong"
. "$(dirname "$0")/users_lib.sh"

args=(-g 0 -p "$PORT" -s 64 -n 20)
"$BIN/softverbs" run -- timeout 30 env SOFTVERBS_FAULTS='wc:op=3,delay_us=400000;rnr:op=5,times=3' \
  SOFTVERBS_FAULTS_LOG="$work/log" ibv_rc_pingpong "${args[@]}" >"$work/server" 2>&1 &
s=$!
pids+=($s)
for _ in $(seq 200); do ss -Hltn "sport = :$PORT" 2>/dev/null | grep -q . && break; sleep 0.05; done
as_nobody "$BIN/softverbs" run -- timeout 30 ibv_rc_pingpong "${args[@]}" 127.0.0.1 >"$work/client" 2>&1
c=$?
wait $s
s=$?
[ $s -eq 0 ] && [ $c -eq 0 ] || fail "server exit $s, client exit $c"
secs=$(sed -n 's/^20 iters in \([0-9.]*\) seconds.*/\1/p' "$work/server")
[ -n "$secs" ] || fail "the server did not finish its 20 round trips"
[ -n "$secs" ] && awk -v s="$secs" 'BEGIN { exit !(s >= 0.4) }' || fail "the server's run took ${secs:-?} s, not 0.4 s or more"
grep -Eq '^wc qp=0x[0-9a-f]+ op=3 wr_id=2 opcode=SEND delay_us=400000$' "$work/log" || fail "the log has no delay of op 3"
grep -Eq '^rnr qp=0x[0-9a-f]+ op=5 wr_id=2 opcode=SEND times=3$' "$work/log" || fail "the log has no RNR of op 5"
"$BIN/softverbs" run -- rdma statistic show >"$work/stat" 2>&1
grep -Eq '^link sv0/1 .*\bmediated_ops [1-9]' "$work/stat" || fail "the requests were not mediated: $(cat "$work/stat")"
if [ $failures -ne 0 ]; then
  for f in server client log; do log "----- $f:"; cat "$work/$f" >&2; done
  exit 1
fi
log PASS
exit 0
