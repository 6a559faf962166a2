#!/bin/bash
# compat.perftest.*: Debian's perftest (ib_{write,read,send,atomic}_{bw,lat}),
# server and client on 127.0.0.1, against softverbs.
#   perftest.sh BIN_DIR PORT PROGRAM default|all|FETCH_AND_ADD|CMP_AND_SWAP [ITERS [RC|UC|UD|XRC [poll|events]]]
# default: one run at the program's default size; all: -a (2 B .. 8 MiB, UD:
# 2 B .. the MTU); FETCH_AND_ADD, CMP_AND_SWAP: ib_atomic_{bw,lat} with -A
# (8 B). The transport is passed as -c (default RC); events adds -e (sleep on
# CQ events instead of polling).
# Checks exit codes and that the result table has a numeric row for every
# size run, with the right iteration count. Timings are not judged: both
# sides busy-poll and this machine may be loaded.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
prog=${3:?program}
mode=${4:?default or all}
iters=${5:-}
conn=${6:-RC}
wait_mode=${7:-poll}
require "$prog"
# A transport or -e the program does not offer is not a softverbs matter.
help=$("$prog" --help 2>&1)
if ! grep -q -- "--connection=<[^>]*\b$conn\b" <<<"$help"; then
  log "SKIP: $prog has no -c $conn"
  exit $SKIP
fi
if [ "$wait_mode" = events ] && ! grep -q -- '--events' <<<"$help"; then
  log "SKIP: $prog has no -e (events)"
  exit $SKIP
fi
case $prog/$mode in ib_atomic_*/all)
  # perftest: "Message size cannot be changed for Atomic tests".
  log "SKIP: $prog refuses -a (an atomic is always 8 bytes)"
  exit $SKIP ;;
esac
compat_setup

case $prog in
ib_atomic_*) [ -n "$iters" ] || iters=1000; default_size=8 ;;
*_bw) [ -n "$iters" ] || iters=1000; default_size=65536 ;;
*_lat) [ -n "$iters" ] || iters=1000; default_size=2 ;;
*) log "unknown program $prog"; exit 2 ;;
esac

args=(-p "$port" -n "$iters")
[ "$conn" = RC ] || args+=(-c "$conn")
[ "$wait_mode" = events ] && args+=(-e)
# UD messages are at most one MTU: perftest clamps its sizes to the port's
# active MTU (4096 on sv0).
max_log=23
if [ "$conn" = UD ]; then
  max_log=12
  [ "$default_size" -gt 4096 ] && default_size=4096
fi
sizes=("$default_size")
case $mode in FETCH_AND_ADD | CMP_AND_SWAP) args+=(-A "$mode") ;; esac
if [ "$mode" = all ]; then
  args+=(-a)
  sizes=()
  for i in $(seq 1 $max_log); do sizes+=($((1 << i))); done
fi

# table_rows FILE SIZE...: every SIZE has a "SIZE ITERS number number
# number ..." row. After the first three, a column may be perftest's "-nan":
# its latency report computes the standard deviation from sums of squares,
# which on a loaded machine (iterations of 6 us and of 260 ms in one row)
# can go negative under rounding; that is perftest's arithmetic, not a
# missing result.
table_rows() {
  local file=$1 side=$2 s
  shift 2
  for s in "$@"; do
    grep -Eq "^[[:space:]]*${s}[[:space:]]+${iters}([[:space:]]+[0-9]+\.?[0-9]*){3}([[:space:]]+([0-9]+\.?[0-9]*|-?nan))*[[:space:]]*$" "$file" ||
      fail "$prog $mode $side: no numeric result row for $s bytes x $iters iterations"
  done
}

# perftest calibrates its clock (get_cpu_mhz) by regression over a 0.2 s busy
# loop, per size; if the process is preempted meanwhile it prints
# "Correlation coefficient r^2: ... < 0.9", "Can't produce a report" and
# fails. That is the machine being busy, not the device: run again (twice).
attempt=1
while :; do
  failures_before=$_compat_failures
  run_pair "$prog" "$port" "$prog" "${args[@]}" -- "$prog" "${args[@]}" 127.0.0.1
  ok=$?
  if [ "$ok" -eq 0 ]; then
    # It may also go on and print "inf" for the size it could not time.
    if [ $attempt -ge 3 ] || ! grep -q 'Correlation coefficient r^2' "$SERVER_OUT" "$CLIENT_OUT"; then
      break
    fi
    log "note: perftest could not calibrate its clock for one size (machine busy); run again"
    attempt=$((attempt + 1))
    sleep 1
    continue
  fi
  if [ $attempt -lt 3 ] && grep -q 'Correlation coefficient r^2' "$SERVER_OUT" "$CLIENT_OUT"; then
    log "note: perftest could not calibrate its clock (machine busy); run again"
    _compat_failures=$failures_before
    attempt=$((attempt + 1))
    sleep 1  # let the server's port go
    continue
  fi
  break
done

if [ "$ok" -eq 0 ]; then
  # The client (the active side) reports every size.
  table_rows "$CLIENT_OUT" client "${sizes[@]}"
  # Where the server measures too it reports every size; the passive side of
  # RDMA write/read bandwidth reports the last size only; that of ib_read_lat
  # reports nothing.
  case $prog in
  ib_send_bw | ib_send_lat | ib_write_lat) table_rows "$SERVER_OUT" server "${sizes[@]}" ;;
  ib_write_bw | ib_read_bw) table_rows "$SERVER_OUT" server "${sizes[-1]}" ;;
  esac
  for side in server client; do
    out="$COMPAT_DIR/$prog.$side"
    if grep -Eiq 'fail|error|unable|couldn|invalid' "$out"; then
      fail "$prog $mode $side: reported an error"
    fi
  done
  if [ "$_compat_failures" -ne 0 ]; then
    show server "$SERVER_OUT"
    show client "$CLIENT_OUT"
  fi
fi
finish
