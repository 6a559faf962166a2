#!/bin/bash
# compat.ucx.*: Debian's ucx_perftest (UCX 1.13) over UCX's verbs transports
# on sv0, server and client on 127.0.0.1.
#   ucx.sh BIN_DIR PORT ROW
# ROW is TRANSPORT.TEST: the UCT rows drive one transport directly (-x, -d
# sv0:1); the UCP rows restrict UCX_TLS to the verbs transports, so that a
# missing or broken one makes the run fail instead of falling back to shared
# memory or TCP. rc_verbs cannot wire itself up (it connects to an endpoint,
# not an interface), so UCP over RC also needs ud_verbs as its auxiliary.
#
# UCX skips a verbs device without a /dev/infiniband node: `softverbs run`
# provides one in its device view (src/tools/view_ns.h: a private mount
# namespace; root or unprivileged user namespaces), skipped if it cannot.
. "$(dirname "$0")/lib.sh"
port=${2:?port}
row=${3:?row}
require ucx_perftest
require_view

iters=1000
case $row in
# UCT: one transport, one operation.
rc_verbs.put_lat) tls=rc_verbs; args=(-t put_lat -x rc_verbs -d sv0:1 -s 8) ;;         # RDMA WRITE, inline
rc_verbs.put_bw) tls=rc_verbs; args=(-t put_bw -x rc_verbs -d sv0:1 -D zcopy -s 65536) ;; # RDMA WRITE, zero copy
rc_verbs.get) tls=rc_verbs; args=(-t get -x rc_verbs -d sv0:1 -D zcopy -s 65536) ;;       # RDMA READ
rc_verbs.am_lat) tls=rc_verbs; args=(-t am_lat -x rc_verbs -d sv0:1 -s 8) ;;           # SEND
rc_verbs.fadd) tls=rc_verbs; args=(-t fadd -x rc_verbs -d sv0:1 -s 8) ;;               # fetch-and-add
rc_verbs.cswap) tls=rc_verbs; args=(-t cswap -x rc_verbs -d sv0:1 -s 8) ;;             # compare-and-swap
ud_verbs.am_lat) tls=ud_verbs; args=(-t am_lat -x ud_verbs -d sv0:1 -s 8) ;;
ud_verbs.am_bw) tls=ud_verbs; args=(-t am_bw -x ud_verbs -d sv0:1 -D bcopy -s 1024) ;;
# UCP: the protocols on top (tag matching, rendezvous, one-sided).
rc_verbs.tag_lat) tls=rc_verbs,ud_verbs; args=(-t tag_lat -s 8) ;;
rc_verbs.tag_bw) tls=rc_verbs,ud_verbs; args=(-t tag_bw -s 1048576); iters=200 ;;      # rendezvous: RDMA READ
rc_verbs.ucp_put_bw) tls=rc_verbs,ud_verbs; args=(-t ucp_put_bw -s 1048576); iters=200 ;;
ud_verbs.tag_lat) tls=ud_verbs; args=(-t tag_lat -s 8) ;;
ud_verbs.tag_bw) tls=ud_verbs; args=(-t tag_bw -s 65536); iters=200 ;;
*) log "unknown row $row"; exit 2 ;;
esac
compat_setup
export UCX_TLS=$tls UCX_NET_DEVICES=sv0:1
# Fewer warm-up iterations than the default 10,000: this is about working,
# not about numbers.
args+=(-n "$iters" -w 100 -p "$port")

# run_pair runs each under `softverbs run`, which gives it the device node.
if run_pair ucx "$port" ucx_perftest -p "$port" -- \
    ucx_perftest 127.0.0.1 "${args[@]}"; then
  # "Final:  <iters>  <latency columns>  <bandwidth columns> ..."
  grep -Eq "^Final:[[:space:]]+$iters([[:space:]]+[0-9]+(\.[0-9]+)?){7}[[:space:]]*$" "$CLIENT_OUT" ||
    fail "$row: no 'Final: $iters ...' result line"
  if grep -Eq 'UCX +(ERROR|WARN)' "$SERVER_OUT" "$CLIENT_OUT"; then
    fail "$row: UCX reported an error or warning"
  fi
  [ "$_compat_failures" -eq 0 ] || { show server "$SERVER_OUT"; show client "$CLIENT_OUT"; }
fi
finish
