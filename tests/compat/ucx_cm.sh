#!/bin/bash
# compat.ucx.rdmacm.*: a UCP client/server connection made through UCX's
# rdmacm connection manager (Debian's UCX 1.13) over softverbs' librdmacm.so.1
# and libibverbs.so.1: ucx_cm_pingpong (tests/compat/ucx_cm_pingpong.c)
# exchanges tagged messages of 8 B .. 1 MiB both ways, one GET and one PUT of
# a packed rkey, and closes (rdma_disconnect, DISCONNECTED on both sides).
#   ucx_cm.sh BIN_DIR PROGRAM PORT ROW
# ROW: rc (UCX_TLS=rc_verbs) | ud (ud_verbs) | rc_ud (rc_verbs,ud_verbs: RC
# for data, UD for keepalive) | ipv6 (rc_verbs; the server on ::, the client
# dials ::1) | reject (ucp_listener_reject: the client's endpoint fails with
# UCS_ERR_REJECTED, from UCX's header in the REJ's private data) |
# no_listener (the CM's REJ "invalid service ID": UCS_ERR_CONNECTION_RESET) |
# peer_dies (the server is killed once connected: the client's endpoint
# fails, after our librdmacm's DISCONNECTED, instead of waiting forever).
# PORT is an rdma_cm port, in this test's own SOFTVERBS_DIR.
#
# UCX is held to what is under test: UCX_SOCKADDR_TLS_PRIORITY=rdmacm (no
# TCP sockcm), UCX_TLS the verbs transports only (no tcp, posix, sysv, cma,
# self), UCX_NET_DEVICES=sv0:1. The checks: both sides print PASS, their
# endpoints' lanes are exactly "cm rdmacm" plus the expected transports on
# sv0:1, and our librdmacm's trace (SOFTVERBS_CM_TRACE) shows the
# connection's events, so it went through this library.
#
# UCX skips a verbs device without a /dev/infiniband node: `softverbs run`
# provides it, as in ucx.sh.
. "$(dirname "$0")/lib.sh"
prog=${2:?program}
port=${3:?port}
row=${4:?row}
[ -x "$prog" ] || { log "missing $prog"; exit 1; }
require_view

saddr=()
caddr=127.0.0.1
case $row in
rc) tls=rc_verbs; lanes=(rc_verbs) ;;
ud) tls=ud_verbs; lanes=(ud_verbs) ;;
rc_ud) tls=rc_verbs,ud_verbs; lanes=(rc_verbs ud_verbs) ;;
ipv6) tls=rc_verbs; lanes=(rc_verbs); saddr=(::); caddr=::1 ;;
reject | no_listener | peer_dies) tls=rc_verbs ;;
*) log "unknown row $row"; exit 2 ;;
esac

# expect FILE REGEX COUNT: exactly COUNT lines of FILE match REGEX.
expect() {
  local n
  n=$(grep -Ec -- "$2" "$1")
  [ "$n" -eq "$3" ] || fail "$(basename "$1"): $n lines match '$2', expected $3"
}

compat_setup
export UCX_TLS=$tls UCX_NET_DEVICES=sv0:1 UCX_SOCKADDR_TLS_PRIORITY=rdmacm
export SOFTVERBS_CM_TRACE=1
# The program's own deadline, before lib.sh's watchdog.
export CM_PINGPONG_TIMEOUT=$((COMPAT_TIMEOUT - 10))

if [ "$row" = reject ]; then
  if cm_pair ucx_cm 262 "$port" "$prog" reject "$port" -- \
      "$prog" refused 127.0.0.1 "$port" rejected; then
    s=$COMPAT_DIR/ucx_cm.server
    c=$COMPAT_DIR/ucx_cm.client
    expect "$s" '^PASS reject$' 1
    expect "$s" 'softverbs-cm.* event RDMA_CM_EVENT_CONNECT_REQUEST status 0$' 1
    expect "$c" '^PASS refused$' 1
    expect "$c" 'softverbs-cm.* event RDMA_CM_EVENT_REJECTED status 28$' 1
    expect "$c" '^refused: the endpoint failed with "Operation rejected by remote peer"' 1
    [ "$_compat_failures" -eq 0 ] || { show server "$s"; show client "$c"; }
  fi
  finish
fi
if [ "$row" = no_listener ]; then
  c=$COMPAT_DIR/ucx_cm.client
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" "$prog" refused 127.0.0.1 "$port" reset >"$c" 2>&1 ||
    fail "client exit $?"
  expect "$c" '^PASS refused$' 1
  expect "$c" 'softverbs-cm.* event RDMA_CM_EVENT_REJECTED status 8$' 1
  expect "$c" '^refused: the endpoint failed with "Connection reset by remote peer"' 1
  [ "$_compat_failures" -eq 0 ] || show client "$c"
  finish
fi

if [ "$row" = peer_dies ]; then
  s=$COMPAT_DIR/ucx_cm.server
  c=$COMPAT_DIR/ucx_cm.client
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" "$prog" hold "$port" >"$s" 2>&1 &
  spid=$!
  _compat_pids+=("$spid")
  cm_wait 262 "$port" "$spid" || fail "the server never listened on rdma_cm port $port"
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" "$prog" orphan 127.0.0.1 "$port" >"$c" 2>&1 &
  cpid=$!
  _compat_pids+=("$cpid")
  victim=
  for _ in $(seq $((COMPAT_TIMEOUT * 10))); do
    victim=$(sed -n 's/^pid \([0-9]*\)$/\1/p' "$s")
    [ -n "$victim" ] && grep -q '^orphan: connected$' "$c" && break
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -n "$victim" ] && grep -q '^orphan: connected$' "$c"; then
    kill -KILL "$victim"
    wait "$spid" 2>/dev/null  # (killed)
    wait "$cpid" || fail "client exit $?"
    expect "$c" '^PASS orphan$' 1
    expect "$c" 'softverbs-cm.* event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
    expect "$c" '^orphan: the endpoint failed after [0-9.]+ s: ' 1
  else
    fail "not connected"
  fi
  [ "$_compat_failures" -eq 0 ] || { show server "$s"; show client "$c"; }
  finish
fi

if cm_pair ucx_cm 262 "$port" "$prog" server "$port" "${saddr[@]}" -- \
    "$prog" client "$caddr" "$port"; then
  for side in server client; do
    f=$COMPAT_DIR/ucx_cm.$side
    expect "$f" "^PASS $side\$" 1
    expect "$f" '^ *# +lane\[0\]: cm rdmacm$' 1
    # Every other lane: one of the expected transports on sv0:1 (nothing else).
    n=$(grep -Ec '^ *# +lane\[[0-9]+\]:' "$f")
    [ "$n" -eq $((${#lanes[@]} + 1)) ] || fail "$side: $n lanes, expected $((${#lanes[@]} + 1))"
    for tl in "${lanes[@]}"; do
      expect "$f" "^ *# +lane\\[[0-9]+\\]: +[0-9]+:$tl/sv0:1\\.0 " 1
    done
    expect "$f" "$side: [0-9] sizes x [0-9] round trips verified" 1
    if grep -Eq 'UCX +(ERROR|WARN)' "$f"; then
      fail "$side: UCX reported an error or warning"
    fi
  done
  s=$COMPAT_DIR/ucx_cm.server
  c=$COMPAT_DIR/ucx_cm.client
  expect "$s" "^server: connection request from $caddr\$" 1
  expect "$s" '^server: the client.s GET and PUT of 1048576 bytes verified$' 1
  expect "$c" '^client: GET of 1048576 bytes verified$' 1
  # Our librdmacm's trace: the passive side's request, establishment and the
  # client's disconnect; the active side's CONNECT_RESPONSE (UCX moves its
  # own QPs and calls rdma_establish) and the DREP's DISCONNECTED.
  expect "$s" 'softverbs-cm.* event RDMA_CM_EVENT_CONNECT_REQUEST status 0$' 1
  expect "$s" 'softverbs-cm.* event RDMA_CM_EVENT_ESTABLISHED status 0$' 1
  expect "$s" 'softverbs-cm.* event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
  expect "$c" 'softverbs-cm.* event RDMA_CM_EVENT_CONNECT_RESPONSE status 0$' 1
  expect "$c" 'softverbs-cm.* event RDMA_CM_EVENT_DISCONNECTED status 0$' 1
  expect "$s" '^server: endpoint error handler: Connection reset by remote peer' 1
  expect "$c" '^client: closed$' 1
  [ "$_compat_failures" -eq 0 ] || { show server "$s"; show client "$c"; }
fi
finish
