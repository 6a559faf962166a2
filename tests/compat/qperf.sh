#!/bin/bash
# compat.qperf.*: Debian's qperf, one server (`qperf -lp PORT`, which forks a
# child per test request) and RUNS client runs in a row
# (`qperf -lp PORT -t 1 127.0.0.1 TEST`), each with its own deadline. qperf
# sleeps on CQ events by default (ibv_req_notify_cq / ibv_get_cq_event) and
# ends a timed test from SIGALRM: its latency tests once hung 3 runs in 4.
#   qperf.sh BIN_DIR PORT RUNS TEST [cm1|refused]
# cm1: connect through rdma_cm (-cm1), as qperf's RC tests must on a real
# RoCE device (the kernel refuses a RoCE address vector without a GRH, and
# without -cm1 qperf gives only a LID).
# refused: qperf's UD tests build their address handle from a LID alone and
# never use rdma_cm (qperf 0.4.11 turns -cm1 off for every non-RC test), so
# on a RoCE port -- rxe, mlx5, softverbs -- ibv_create_ah(3) fails (EINVAL:
# no GRH). The run must fail at once with that message, and the server must
# go on serving (docs/COMPAT.md, "qperf").
# Every run: exit 0, the test's result line with a number, no error or
# warning; a run still going after RUN_TIMEOUT seconds (default 20; a run
# takes ~1.1 s) is reported as hung with every process's stacks.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
runs=${3:?runs}
test=${4:?qperf test}
mode=${5:-}
require qperf
compat_setup
RUN_TIMEOUT=${RUN_TIMEOUT:-20}

case $test in
*_lat) result='latency +=  [0-9.]+ (ns|us|ms|sec)' ;;
*_bw) result='bw +=  [0-9.]+ [KMGT]?B/sec' ;;
*) result='msg_rate +=  [0-9.]+ [KMG]?/sec' ;;
esac
args=(-lp "$port" -t 1)
[ "$mode" = cm1 ] && args+=(-cm1)

# dump_tree NAME PID: the stacks of PID's descendants (qperf's server forks
# a child per test; `softverbs run` and `timeout` stand in between).
dump_tree() {
  local name=$1 pid=$2 c
  for c in $(pgrep -P "$pid"); do
    if [ "$(cat /proc/"$c"/comm 2>/dev/null)" = qperf ]; then
      log "----- $name (pid $c) threads:"
      if command -v gdb >/dev/null 2>&1; then
        timeout 8 gdb -p "$c" -batch -ex 'thread apply all bt' 2>&1 | grep -E '^(#|Thread )' >&2
      fi
    fi
    dump_tree "$name" "$c"
  done
}

server_out="$COMPAT_DIR/server.out"
"$SV" run -- timeout -k 5 $((runs * RUN_TIMEOUT + 60)) stdbuf -oL qperf -lp "$port" >"$server_out" 2>&1 &
spid=$!
_compat_pids+=("$spid")
wait_listen "$port" "$spid" || { fail "qperf server never listened on port $port"; show server "$server_out"; finish; }

passed=0
for i in $(seq "$runs"); do
  out="$COMPAT_DIR/run$i.out"
  "$SV" run -- timeout -k 5 $((RUN_TIMEOUT + 10)) stdbuf -oL qperf "${args[@]}" 127.0.0.1 "$test" >"$out" 2>&1 &
  cpid=$!
  _compat_pids+=("$cpid")
  deadline=$((SECONDS + RUN_TIMEOUT))
  while kill -0 "$cpid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
  if kill -0 "$cpid" 2>/dev/null; then
    fail "$test run $i: still running after ${RUN_TIMEOUT}s"
    dump_tree "client" "$cpid"
    dump_tree "server" "$spid"
    kill "$cpid" 2>/dev/null
  fi
  wait "$cpid"
  rc=$?
  if [ "$mode" = refused ]; then
    # Both sides build the address handle; whichever is refused first ends
    # the run, and a server refused first is reported by the client as
    # "server: ..." (the text itself may not reach it before the server's
    # child exits): its refusal is then in the server's log.
    { grep -q 'failed to create address handle: Invalid argument' "$out" ||
      { grep -q '^server:' "$out" && grep -q 'failed to create address handle: Invalid argument' "$server_out"; }; } &&
      [ "$rc" -ne 0 ] || fail "$test run $i: exit $rc, not the refusal of an address handle without a GRH"
  else
    [ "$rc" -eq 0 ] || fail "$test run $i: exit $rc"
    grep -Eq "^ +$result\$" "$out" || fail "$test run $i: no '$result' line"
    grep -Eiq 'fail|error|warning|invalid|timed out|timeout' "$out" && fail "$test run $i: reported an error"
  fi
  if [ "$_compat_failures" -ne 0 ]; then
    show "run $i" "$out"
    break
  fi
  passed=$((passed + 1))
done
kill -0 "$spid" 2>/dev/null || fail "the qperf server exited"
# (refused: the server's child reports the refusal too, then exits.)
grep -v 'failed to create address handle: Invalid argument' "$server_out" | grep -Eiq 'fail|error|warning' &&
  { fail "the qperf server reported an error"; show server "$server_out"; }
log "$test${mode:+ ($mode)}: $passed of $runs runs passed"
[ -n "${COMPAT_VERBOSE:-}" ] && cat "$COMPAT_DIR"/run*.out >&2
finish
