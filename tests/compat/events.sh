#!/bin/bash
# compat.events.*: a program facing each asynchronous event a fault plan
# raises (docs/LAB.md "Port down and other async events"): async_events.c
# checks what it sees (ibv_query_port, the events and their elements, the
# completions and QP states, recovery); this script gives it the plan and
# checks its exit status and the fault log.
#   events.sh BIN_DIR PROGRAM MODE   (PROGRAM: async_events, or cm_port_down for MODE cm)
. "$(dirname "$0")/lib.sh"
prog=${2:?the async_events program}
mode=${3:?mode}
compat_setup

if [ "$mode" = bad_plan ]; then
  # A bad event clause: the program is refused its device, the reason said.
  require ibv_devinfo
  sv_run env SOFTVERBS_FAULTS='seed=1;port:after_ms=10' ibv_devinfo >"$COMPAT_DIR/bad" 2>&1 && fail "a bad plan: ibv_devinfo exited 0"
  grep -qF "softverbs: SOFTVERBS_FAULTS: clause 2 'port:after_ms=10': a port clause needs down_ms=" "$COMPAT_DIR/bad" ||
    fail "a bad plan: its fault not said on stderr"
  [ "$_compat_failures" -eq 0 ] || show bad "$COMPAT_DIR/bad"
  finish
fi

case $mode in
  port) plan='seed=5; port:after_ms=400,down_ms=600'; want='^port down$|^port down: qp=0x[0-9a-f]+ wr_id=3 opcode=SEND status=RETRY_EXC_ERR$|^port up$' ;;
  port_op) plan='port:op=3,down_ms=400'; want='^port op=3 qp=0x[0-9a-f]+: down for 400 ms$|^port down$|^port down: qp=0x[0-9a-f]+ wr_id=3 opcode=SEND status=RETRY_EXC_ERR$|^port up$' ;;
  qp_fatal) plan='qp_fatal:op=2'; want='^qp_fatal qp=0x[0-9a-f]+ op=2 wr_id=2 opcode=SEND$' ;;
  cq_err) plan='cq_err:cq=1,after_ms=300'; want='^cq_err cq=1$' ;;
  srq_limit) plan='srq_limit:srq=1,after_ms=300'; want='^srq_limit srq=1 limit=4$' ;;
  device_fatal) plan='device_fatal:after_ms=300'; want='^device_fatal$' ;;
  # Single requests delayed or refused with RNR NAKs (docs/LAB.md "Faults").
  delay) plan='wc:op=2,delay_us=300000'; want='^wc qp=0x[0-9a-f]+ op=2 wr_id=2 opcode=SEND delay_us=300000$' ;;
  rnr) plan='rnr:op=2,times=3'; want='^rnr qp=0x[0-9a-f]+ op=2 wr_id=2 opcode=SEND times=3$' ;;
  rnr_exc) plan='rnr:op=2,times=4'; want='^rnr qp=0x[0-9a-f]+ op=2 wr_id=2 opcode=SEND times=4$' ;;
  # cm_port_down.c: rdma_cm while the port is down, on an rdma_cm port of
  # this test's own SOFTVERBS_DIR.
  cm) plan='port:after_ms=400,down_ms=4000'; want='^port down$|^port up$' ;;
  *) log "unknown mode $mode"; exit 2 ;;
esac
out=$COMPAT_DIR/out
arg=$mode
[ "$mode" = cm ] && arg=7471
sv_run env SOFTVERBS_FAULTS="$plan" SOFTVERBS_FAULTS_LOG="$COMPAT_DIR/log" "$prog" "$arg" >"$out" 2>&1
rc=$?
[ "$rc" -eq 0 ] || fail "$(basename "$prog") $mode exited with $rc, not 0"
grep -q '^PASSED$' "$out" || fail "$(basename "$prog") $mode did not pass"
# RNR: the port's retry_rnr_exceeded_err counts the request that ran out of
# RNR retries, and only that one.
if [ "$mode" = rnr ] || [ "$mode" = rnr_exc ]; then
  n=0
  [ "$mode" = rnr_exc ] && n=1
  if command -v rdma >/dev/null; then
    sv_run rdma statistic show >"$COMPAT_DIR/stat" 2>&1 || fail "rdma statistic show exited $?"
    grep -Eq "^link sv0/1 .*\bretry_rnr_exceeded_err $n\b" "$COMPAT_DIR/stat" ||
      fail "rdma statistic show: want retry_rnr_exceeded_err $n: $(cat "$COMPAT_DIR/stat")"
  fi
fi
# The device view that `softverbs run` gives the program follows its port.
if [ "$mode" = port ] || [ "$mode" = port_op ]; then
  grep -q '^sysfs state 1: DOWN$' "$out" || fail "the device view's ports/1/state did not say 1: DOWN"
  grep -q '^sysfs phys_state 3: Disabled$' "$out" || fail "the device view's ports/1/phys_state did not say 3: Disabled"
fi
lines=$(grep -c . "$COMPAT_DIR/log" 2>/dev/null || echo 0)
wanted=$(printf '%s' "$want" | awk -F'|' '{print NF}')
[ "$lines" -eq "$wanted" ] || fail "the fault log has $lines lines, not $wanted"
grep -Evq "$want" "$COMPAT_DIR/log" && fail "the fault log has a line it should not"
i=0
while IFS= read -r line; do
  i=$((i + 1))
  pat=$(printf '%s' "$want" | tr '|' '\n' | sed -n "${i}p")
  printf '%s\n' "$line" | grep -Eq "$pat" || fail "fault log line $i '$line' is not /$pat/"
done <"$COMPAT_DIR/log"
[ "$_compat_failures" -eq 0 ] || { show out "$out"; show log "$COMPAT_DIR/log"; }
finish
