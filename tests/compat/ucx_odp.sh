#!/bin/bash
# compat.ucx.odp.*: Debian's UCX 1.13 with UCX_IB_REG_METHODS=odp, where UCX
# registers one implicit ODP MR over the whole address space (ibv_reg_mr(pd,
# NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND | ...), its "global ODP key") at md
# open, uses its keys for every buffer and deregisters it at md close.
#   ucx_odp.sh BIN_DIR PORT ROW
# ROW: info (ucx_info -d opens and closes every md), put_bw (ucx_perftest
# RDMA WRITE, zero copy, over rc_verbs with the global ODP key on both
# sides). Each checks that UCX took the global ODP key (its debug log says
# "using odp global key"), that every process exits 0 (UCX 1.13's md close
# crashed on keys whose low bits it misreads: src/daemon/mr.cc install_mr)
# and that UCX reports no error, warning or backtrace.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
row=${3:?row}
require ucx_info
require ucx_perftest
require_view
compat_setup
export UCX_IB_REG_METHODS=odp UCX_LOG_LEVEL=debug UCX_NET_DEVICES=sv0:1

# check_out FILE...: UCX used the global ODP key and reported no failure.
check_out() {
  local f
  for f in "$@"; do
    grep -q 'sv0: using odp global key' "$f" ||
      { fail "$(basename "$f"): UCX did not take the global ODP key"; show "$(basename "$f")" "$f"; }
    if grep -Eq 'UCX +(ERROR|WARN)|backtrace|Segmentation fault' "$f"; then
      fail "$(basename "$f"): UCX reported an error, a warning or a crash"
      show "$(basename "$f")" "$f"
    fi
  done
}

case $row in
info)
  out="$COMPAT_DIR/info.client"
  sv_run ucx_info -d >"$out" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] || { fail "ucx_info -d: exit $rc"; show ucx_info "$out"; }
  grep -q 'Transport: rc_verbs' "$out" || { fail "ucx_info -d: no rc_verbs transport on sv0"; show ucx_info "$out"; }
  check_out "$out"
  ;;
put_bw)
  export UCX_TLS=rc_verbs
  args=(-t put_bw -x rc_verbs -d sv0:1 -D zcopy -s 65536 -n 1000 -w 100 -p "$port")
  if run_pair ucx_odp "$port" ucx_perftest -p "$port" -- ucx_perftest 127.0.0.1 "${args[@]}"; then
    grep -Eq "^Final:[[:space:]]+1000([[:space:]]+[0-9]+(\.[0-9]+)?){7}[[:space:]]*$" "$CLIENT_OUT" ||
      { fail "put_bw: no 'Final: 1000 ...' result line"; show client "$CLIENT_OUT"; }
    check_out "$SERVER_OUT" "$CLIENT_OUT"
  fi
  ;;
*) log "unknown row $row"; exit 2 ;;
esac
finish
