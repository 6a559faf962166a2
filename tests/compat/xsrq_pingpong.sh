#!/bin/bash
# compat.ibv_xsrq_pingpong.*: Debian's ibv_xsrq_pingpong (XRC: an XRC domain
# opened through /tmp/xrc_domain, an XRC SRQ, XRC send and receive QPs, sends
# naming the remote SRQ), server and client on 127.0.0.1 over GID 0.
#   xsrq_pingpong.sh BIN_DIR PORT SIZE poll|events [ITERS]
. "$(dirname "$0")/lib.sh"
port=${2:?port}
size=${3:?size}
mode=${4:?poll or events}
iters=${5:-100}
require ibv_xsrq_pingpong
compat_setup

args=(-g 0 -p "$port" -s "$size" -n "$iters")
[ "$mode" = events ] && args+=(-e)

if run_pair xsrq "$port" ibv_xsrq_pingpong "${args[@]}" -- ibv_xsrq_pingpong "${args[@]}" 127.0.0.1; then
  for side in server client; do
    out="$COMPAT_DIR/xsrq.$side"
    # Each side prints its and the peer's QPNs and SRQ number, then "success".
    grep -q '^success$' "$out" || fail "$side: no 'success' line"
    grep -Eq 'remote: LID [0-9a-f]+, QPN RECV [0-9a-f]+ SEND [0-9a-f]+, PSN [0-9a-f]+, SRQN [0-9a-f]+' "$out" ||
      fail "$side: no remote address line"
    if grep -qi 'fail\|error\|couldn\|unable' "$out"; then
      fail "$side: reported an error"
    fi
    [ "$_compat_failures" -eq 0 ] || show "$side" "$out"
  done
fi
finish
