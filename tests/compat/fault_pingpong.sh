#!/bin/bash
# compat.faults.*: Debian's unmodified ibv_rc_pingpong facing a completion
# in error from a fault plan (docs/LAB.md "Faults"). The server runs with
# SOFTVERBS_FAULTS failing its third SEND (its third pong) with STATUS: it
# must report that status for that work request on stderr and exit 1, as it
# would on hardware. Its client, which then waits for a pong that never
# comes (ibv_rc_pingpong has no timeout), is stopped.
# With `bad`, the plan has a status no plan injects: the program must be
# refused its device context, with the plan's fault said on stderr.
#   fault_pingpong.sh BIN_DIR PORT STATUS "TEXT (N)" [plan|file|bad|time]
. "$(dirname "$0")/lib.sh"
port=${2:?port}
status=${3:?status}
text=${4:?the status as ibv_wc_status_str says it, with its number}
how=${5:-plan}
require ibv_rc_pingpong
compat_setup

args=(-g 0 -p "$port" -s 64 -n 20)
if [ "$how" = bad ]; then
  sv_run env SOFTVERBS_FAULTS="wc:op=3,status=$status" ibv_rc_pingpong "${args[@]}" >"$COMPAT_DIR/bad" 2>&1
  rc=$?
  [ "$rc" -eq 1 ] || fail "a bad plan: exit status $rc, not 1"
  grep -qF "softverbs: SOFTVERBS_FAULTS: clause 1 'wc:op=3,status=$status': bad value '$status' for status" \
    "$COMPAT_DIR/bad" || fail "a bad plan: its fault not said on stderr"
  grep -q "Couldn't get context" "$COMPAT_DIR/bad" || fail "a bad plan: the context was not refused"
  [ "$_compat_failures" -eq 0 ] || show bad "$COMPAT_DIR/bad"
  finish
fi
# `time`: the first SEND carried out 300 ms or more after the plan was read
# fails (a run long enough to get there: ibv_rc_pingpong -n 1000000).
if [ "$how" = time ]; then
  plan=(SOFTVERBS_FAULTS="wc:after_ms=300,status=$status" SOFTVERBS_FAULTS_LOG="$COMPAT_DIR/log")
  args=(-g 0 -p "$port" -s 64 -n 1000000)
  t0=$(date +%s%N)
elif [ "$how" = file ]; then
  printf '# the third SEND of each QP fails\nseed=3\nwc:op=3,status=%s\n' "$status" >"$COMPAT_DIR/plan"
  plan=(SOFTVERBS_FAULT_PLAN="$COMPAT_DIR/plan" SOFTVERBS_FAULTS_LOG="$COMPAT_DIR/log")
else
  plan=(SOFTVERBS_FAULTS="wc:op=3,status=$status" SOFTVERBS_FAULTS_LOG="$COMPAT_DIR/log")
fi
out=$COMPAT_DIR/server
"$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" env "${plan[@]}" ibv_rc_pingpong "${args[@]}" >"$out" 2>&1 &
spid=$!
_compat_pids+=("$spid")
wait_listen "$port" "$spid" || log "server never listened on port $port"
"$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" ibv_rc_pingpong "${args[@]}" 127.0.0.1 >"$COMPAT_DIR/client" 2>&1 &
cpid=$!
_compat_pids+=("$cpid")
wait "$spid"
rc=$?
kill "$cpid" 2>/dev/null
wait "$cpid" 2>/dev/null
[ "$rc" -eq 1 ] || fail "server exited with $rc, not 1"
grep -qF "Failed status $text for wr_id 2" "$out" || fail "server: no 'Failed status $text for wr_id 2'"
lines=$(wc -l <"$COMPAT_DIR/log")
[ "$lines" -eq 1 ] || fail "the fault log has $lines lines, not 1"
if [ "$how" = time ]; then
  ms=$((($(date +%s%N) - t0) / 1000000))
  [ "$ms" -ge 300 ] || fail "the fault came after $ms ms, before 300"
  op=$(sed -n 's/^wc qp=0x[0-9a-f]* op=\([0-9]*\) wr_id=2 opcode=SEND status='"$status"'$/\1/p' "$COMPAT_DIR/log")
  [ -n "$op" ] && [ "$op" -gt 3 ] || fail "the fault log does not name a later SEND: $(cat "$COMPAT_DIR/log")"
  log "by time: op $op failed, $ms ms after the server started"
else
  grep -Eq "^wc qp=0x[0-9a-f]+ op=3 wr_id=2 opcode=SEND status=$status$" "$COMPAT_DIR/log" || fail "the fault log does not name op 3"
fi
[ "$_compat_failures" -eq 0 ] || { show server "$out"; show log "$COMPAT_DIR/log"; }
finish
