#!/bin/bash
# compat.ibv_asyncwatch: Debian's ibv_asyncwatch opens sv0 and sleeps in
# ibv_get_async_event. A device-wide event is the only kind it can see (it
# creates no QP, CQ or SRQ): the device going away. Killing our daemon must
# wake it with IBV_EVENT_DEVICE_FATAL (IBTA 11.6.3: an unaffiliated
# asynchronous error), delivered on the context's async fd.
#   asyncwatch.sh BIN_DIR
. "$(dirname "$0")/lib.sh"
require ibv_asyncwatch
compat_setup

out="$COMPAT_DIR/asyncwatch.out"
"$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL ibv_asyncwatch -d sv0 >"$out" 2>&1 &
pid=$!
_compat_pids+=("$pid")
# "sv0: async event FD <n>": it has opened the device and waits.
for _ in $(seq 200); do
  grep -q 'async event FD' "$out" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
grep -Eq '^sv0: async event FD [0-9]+$' "$out" || fail "ibv_asyncwatch did not open sv0 and wait"
sleep 0.2
kill -0 "$pid" 2>/dev/null || fail "ibv_asyncwatch exited before any event"

# The device goes away.
kill -9 "$_compat_daemon"
wait "$_compat_daemon" 2>/dev/null
_compat_daemon=""
for _ in $(seq 100); do
  grep -q 'DEVICE_FATAL' "$out" && break
  sleep 0.05
done
grep -Eq 'event_type IBV_EVENT_DEVICE_FATAL \(8\)' "$out" ||
  fail "no IBV_EVENT_DEVICE_FATAL after the daemon died"
[ "$_compat_failures" -eq 0 ] || show ibv_asyncwatch "$out"
# It loops forever on events; done with it.
kill "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if [ "$_compat_failures" -ne 0 ]; then
  log "$_compat_failures check(s) failed"
  exit 1
fi
[ -n "${COMPAT_VERBOSE:-}" ] && show ibv_asyncwatch "$out"
log PASS
exit 0
