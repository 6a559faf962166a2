#!/bin/bash
# compat.libfabric.*: Debian's libfabric 1.17 verbs provider on sv0.
#   fabric.sh BIN_DIR fi_info
#   fabric.sh BIN_DIR fi_pingpong_dgram PORT
#   fabric.sh BIN_DIR fi_pingpong_rdm PORT [RUNS]
# fi_info: `fi_info -p verbs` lists sv0 with an RC (MSG) endpoint and a UD
# (DGRAM) one. fi_pingpong_dgram: fi_pingpong over a DGRAM endpoint (UD QPs,
# addresses exchanged over fi_pingpong's own TCP control port, PORT), every
# size up to the MTU; the MSG endpoint (rdma_cm) is compat.rdmacm.fi_pingpong.
# fi_pingpong_rdm: reliable datagrams, libfabric's RxM layer over verbs MSG
# endpoints (rdma_cm connections made on demand, eager and rendezvous
# protocols), 64 B .. 1 MiB, RUNS times in a row (default 1): its client or
# server died of SIGSEGV while closing about 1 run in 5 (issue 20, a
# completion of a destroyed QP; see DestroyQp.* in tests/verbs).
. "$(dirname "$0")/lib.sh"
mode=${2:?fi_info or fi_pingpong_dgram}

case $mode in
fi_info)
  require fi_info
  compat_setup
  out="$COMPAT_DIR/fi_info"
  sv_run fi_info -p verbs >"$out" 2>&1 || fail "fi_info -p verbs exited $?"
  # Each entry: "provider: verbs", "domain: ...", "type: ...", "protocol: ...".
  tr -d '\t' <"$out" | tr -s ' ' | awk '
    /^ ?provider:/ { p = $2 } /^ ?domain:/ { d = $2 } /^ ?type:/ { t = $2 }
    /^ ?protocol:/ { print p, d, t, $2 }' >"$out.rows"
  grep -qx 'verbs sv0 FI_EP_MSG FI_PROTO_RDMA_CM_IB_RC' "$out.rows" ||
    fail "fi_info -p verbs: no MSG endpoint on domain sv0"
  grep -qx 'verbs sv0-dgram FI_EP_DGRAM FI_PROTO_IB_UD' "$out.rows" ||
    fail "fi_info -p verbs: no DGRAM endpoint on domain sv0-dgram"
  [ "$_compat_failures" -eq 0 ] || { show fi_info "$out"; show "fi_info entries" "$out.rows"; }
  ;;
fi_pingpong_dgram)
  port=${3:?port}
  require fi_pingpong
  compat_setup
  iters=100
  if run_pair fi_pingpong "$port" fi_pingpong -p verbs -e dgram -B "$port" -I "$iters" -- \
      fi_pingpong -p verbs -e dgram -P "$port" -I "$iters" 127.0.0.1; then
    # "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec" for 64 B .. 4k
    # (a datagram is at most one MTU), every message acknowledged.
    for side in server client; do
      out="$COMPAT_DIR/fi_pingpong.$side"
      for size in 64 256 1k 4k; do
        grep -Eq "^$size +$iters +=$iters " "$out" ||
          fail "$side: no '$size $iters =$iters' row"
      done
      [ "$_compat_failures" -eq 0 ] || show "$side" "$out"
    done
  fi
  ;;
fi_pingpong_rdm)
  port=${3:?port}
  require fi_pingpong
  # rdma_cm under RxM takes only the addresses of non-loopback interfaces as
  # its own (see compat.rdmacm.fi_pingpong).
  ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9.]+$' | head -n 1)
  [ -n "$ip" ] || { log "SKIP: no IPv4 address besides loopback"; exit $SKIP; }
  runs=${4:-1}
  compat_setup
  iters=100
  for run in $(seq "$runs"); do
    run_pair fi_pingpong "$port" fi_pingpong -p 'verbs;ofi_rxm' -e rdm -B "$port" -I "$iters" -- \
      fi_pingpong -p 'verbs;ofi_rxm' -e rdm -P "$port" -I "$iters" "$ip" || { log "(run $run of $runs)"; break; }
    for side in server client; do
      out="$COMPAT_DIR/fi_pingpong.$side"
      for size in 64 256 1k 4k 64k 1m; do
        grep -Eq "^$size +$iters +=$iters " "$out" ||
          fail "$side: no '$size $iters =$iters' row"
      done
      [ "$_compat_failures" -eq 0 ] || { show "$side" "$out"; log "(run $run of $runs)"; }
    done
    [ "$_compat_failures" -eq 0 ] || break
  done
  ;;
*)
  log "unknown mode $mode"
  exit 2
  ;;
esac
finish
