#!/bin/bash
# compat.ibv_rc_pingpong.*: Debian's ibv_rc_pingpong, server and client on
# 127.0.0.1 over GID 0, validating the received data (--chk).
#   rc_pingpong.sh BIN_DIR PORT SIZE poll|events|ts [ITERS] [PROGRAM]
# PROGRAM is ibv_rc_pingpong (default), ibv_uc_pingpong, ibv_ud_pingpong or ibv_srq_pingpong.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
size=${3:?size}
mode=${4:?poll or events}
iters=${5:-300}
prog=${6:-ibv_rc_pingpong}
require "$prog"
compat_setup

args=(-g 0 -p "$port" -s "$size" -n "$iters")
# --chk (rdma-core >= 40): the client sends a known pattern and the server
# checks every page of what it received.
if "$prog" --help 2>&1 | grep -q -- '--chk'; then
  args+=(-c)
else
  log "note: this ibv_rc_pingpong has no --chk; data is not validated"
fi
[ "$mode" = events ] && args+=(-e)
# ts: extended CQ with completion timestamps (ibv_create_cq_ex).
[ "$mode" = ts ] && args+=(-t)

if run_pair pingpong "$port" "$prog" "${args[@]}" -- "$prog" "${args[@]}" 127.0.0.1; then
  # "<bytes> bytes in <secs> seconds = <rate> Mbit/sec" and
  # "<iters> iters in <secs> seconds = <usec> usec/iter" on both sides.
  bytes=$((2 * size * iters))
  for side in server client; do
    out="$COMPAT_DIR/pingpong.$side"
    grep -Eq "^$bytes bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" "$out" ||
      fail "$side: no '$bytes bytes in ... seconds' line"
    grep -Eq "^$iters iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" "$out" ||
      fail "$side: no '$iters iters in ... seconds' line"
    # --chk prints "invalid data in page N" on a mismatch and still exits 0.
    if grep -qi 'invalid\|fail\|error\|couldn' "$out"; then
      fail "$side: reported an error"
    fi
    [ "$_compat_failures" -eq 0 ] || show "$side" "$out"
  done
fi
finish
