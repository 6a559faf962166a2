#!/bin/bash
# compat.rdmacm.mckey.*: Debian's unmodified mckey (rdmacm-utils), rdma_cm
# multicast on softverbs' librdmacm.so.1 + libibverbs.so.1, on one host.
#   mckey.sh BIN_DIR MODE
# MODE: ipv4 (two receivers and a sender on 239.1.1.1, bound to 127.0.0.1) |
# sendonly (the sender joins as a send-only full member, -o) | ipv6 (ff0e::1:2
# bound to ::1) | sizes (100 datagrams of 4096 bytes, two QPs per process,
# -c 2) | noloop (-l: QPs created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) | error (a group address that is not multicast: MULTICAST_ERROR).
# The receivers are started first; the sender only once each has printed its
# join (its QP is attached to the group before the join's event).
. "$(dirname "$0")/lib.sh"
mode=${2:?mode}

# out NAME: NAME's output file (receivers are "servers", the sender the
# "client", so that COMPAT_VERBOSE=1 shows them).
out() { [ "${1#recv}" != "$1" ] && echo "$COMPAT_DIR/$1.server" || echo "$COMPAT_DIR/$1.client"; }

# start NAME ARGS...: mckey ARGS in the background, output in $(out NAME).
declare -A PID
start() {
  local name=$1
  shift
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL mckey "$@" >"$(out "$name")" 2>&1 &
  PID[$name]=$!
  _compat_pids+=("$!")
}

# joined NAME COUNT: until NAME has printed COUNT joins (or exited).
joined() {
  local f
  f=$(out "$1")
  for _ in $(seq $((COMPAT_TIMEOUT * 20))); do
    [ "$(grep -c '^mckey: joined dgid: ' "$f" 2>/dev/null)" -ge "$2" ] && return 0
    kill -0 "${PID[$1]}" 2>/dev/null || break
    sleep 0.05
  done
  fail "$1 did not join"
  show "$1" "$f"
  return 1
}

# finished NAME: waits for NAME; it must have exited 0 and said so.
finished() {
  local f rc
  f=$(out "$1")
  wait "${PID[$1]}"
  rc=$?
  [ "$rc" -eq 0 ] || { fail "$1 exited $rc"; show "$1" "$f"; }
  expect "$f" '^return status 0$' 1
  if grep -Eqi 'error|fail' "$f"; then
    fail "$1 reports an error"
    show "$1" "$f"
  fi
}

# pair GROUP DGID RECEIVERS CONNECTIONS SENDER_ARGS -- COMMON_ARGS...
pair() {
  local group=$1 dgid=$2 receivers=$3 conns=$4 sargs=$5 i
  shift 6
  for i in $(seq "$receivers"); do start "recv$i" -m "$group" -c "$conns" "$@"; done
  for i in $(seq "$receivers"); do joined "recv$i" "$conns" || return 1; done
  # shellcheck disable=SC2086
  start send -m "$group" -s -c "$conns" $sargs "$@"
  finished send
  for i in $(seq "$receivers"); do finished "recv$i"; done
  for i in $(seq "$receivers"); do
    expect "$(out "recv$i")" "^mckey: joined dgid: $dgid mlid 0x0 sl 0\$" "$conns"
    expect "$(out "recv$i")" '^receiving data transfers$' 1
    expect "$(out "recv$i")" '^data transfers complete$' 1
  done
  expect "$(out send)" "^mckey: joined dgid: $dgid mlid 0x0 sl 0\$" "$conns"
  expect "$(out send)" '^initiating data transfers$' 1
  expect "$(out send)" '^data transfers complete$' 1
}

require mckey
compat_setup
case "$mode" in
  ipv4) pair 239.1.1.1 '::ffff:239\.1\.1\.1' 2 1 "" -- -b 127.0.0.1 ;;
  sendonly) pair 239.1.1.2 '::ffff:239\.1\.1\.2' 2 1 "-o" -- -b 127.0.0.1 ;;
  ipv6) pair ff0e::1:2 'ff0e::1:2' 2 1 "" -- -b ::1 ;;
  noloop) pair 239.1.1.4 '::ffff:239\.1\.1\.4' 2 1 "" -- -b 127.0.0.1 -l ;;
  sizes) pair 239.1.1.3 '::ffff:239\.1\.1\.3' 1 2 "" -- -b 127.0.0.1 -C 100 -S 4096 ;;
  error)
    # 127.0.0.2 resolves (a local address); joining it is refused with the
    # join's event, -EINVAL, which mckey prints.
    start recv -m 127.0.0.2 -b 127.0.0.1
    wait "${PID[recv]}"
    expect "$(out recv)" '^mckey: event: RDMA_CM_EVENT_MULTICAST_ERROR, error: -22$' 1
    expect "$(out recv)" '^mckey: joined' 0
    ;;
  *)
    log "unknown mode $mode"
    exit 1
    ;;
esac
finish
