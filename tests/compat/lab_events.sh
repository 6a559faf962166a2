#!/bin/bash
# compat.lab.*: Debian's unmodified rping (rdmacm-utils) and ucx_perftest
# (ucx-utils) facing a port that a fault plan takes down (docs/LAB.md "Port
# down and other async events"). Each must report the error as it does on
# hardware and exit in failure; then a run with the port up must succeed.
#   lab_events.sh BIN_DIR PORT MODE
# MODE:
#   rping.port_down  the client's port is down from its start: rdma_resolve_addr
#                    ends in RDMA_CM_EVENT_ADDR_ERROR, -ENETUNREACH (-101);
#                    the same server then serves a client whose port is up.
#   rping.retry_exc  the port goes down at the client's 5th send: that SEND
#                    completes with IBV_WC_RETRY_EXC_ERR (status 12).
#   ucx.port_down    UCX finds no usable rc_verbs device on a down port.
#   ucx.retry_exc    the port goes down at the client's 500th send: UCX's
#                    rc_verbs reports "transport retry counter exceeded" and
#                    aborts (no error handling asked for), as on a NIC.
# PORT (and PORT+1) is the rdma_cm port (rping) or TCP port (ucx_perftest).
. "$(dirname "$0")/lib.sh"
port=${2:?port}
mode=${3:?mode}

# faulted NAME PLAN CMD...: runs the client CMD under PLAN; its output in
# $COMPAT_DIR/NAME.faulted, its exit status in FAULTED_RC.
faulted() {
  local name=$1 plan=$2
  shift 2
  sv_run env SOFTVERBS_FAULTS="$plan" SOFTVERBS_FAULTS_LOG="$COMPAT_DIR/$name.log" "$@" \
    >"$COMPAT_DIR/$name.faulted" 2>&1
  FAULTED_RC=$?
}

# has NAME TEXT: the faulted run's output says TEXT.
has() {
  grep -qF -- "$2" "$COMPAT_DIR/$1.faulted" || { fail "$1: no '$2'"; show "$1" "$COMPAT_DIR/$1.faulted"; }
}

# start_server NAME CMD...: a server in the background (SERVER_PID).
start_server() {
  local name=$1
  shift
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL "$@" >"$COMPAT_DIR/$name.server" 2>&1 &
  SERVER_PID=$!
  _compat_pids+=("$SERVER_PID")
}

stop_server() {
  kill "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null
}

TCP=262  # RDMA_PS_TCP
case $mode in
  rping.port_down)
    require rping
    compat_setup
    start_server rping rping -s -v -C 3 -p "$port"
    cm_wait $TCP "$port" "$SERVER_PID" || log "rping: server never listened on rdma_cm port $port"
    faulted down 'port:after_ms=0,down_ms=60000' rping -c -a 127.0.0.1 -v -C 3 -p "$port"
    [ "$FAULTED_RC" -ne 0 ] || fail "rping with its port down exited 0"
    has down "cma event RDMA_CM_EVENT_ADDR_ERROR, error -101"
    has down "softverbs: rdma_resolve_addr: port 1 of sv0 is down"
    grep -qx "port down" "$COMPAT_DIR/down.log" || fail "the fault log has no 'port down'"
    # The same server, a client whose port is up.
    sv_run rping -c -a 127.0.0.1 -v -C 3 -p "$port" >"$COMPAT_DIR/up.client" 2>&1 || fail "rping with its port up failed"
    wait "$SERVER_PID" || fail "the rping server exited $?"
    expect "$COMPAT_DIR/up.client" '^ping data: rdma-ping-' 3
    ;;
  rping.retry_exc)
    require rping
    compat_setup
    start_server rping rping -s -v -C 10 -p "$port"
    cm_wait $TCP "$port" "$SERVER_PID" || log "rping: server never listened on rdma_cm port $port"
    faulted retry 'port:op=5,down_ms=300' rping -c -a 127.0.0.1 -v -C 10 -p "$port"
    [ "$FAULTED_RC" -ne 0 ] || fail "rping whose port went down exited 0"
    has retry "cq completion failed status 12"
    grep -Eq "^port down: qp=0x[0-9a-f]+ wr_id=[0-9]+ opcode=SEND status=RETRY_EXC_ERR$" "$COMPAT_DIR/retry.log" ||
      fail "the fault log has no failed SEND"
    stop_server
    cm_pair rping_up $TCP "$((port + 1))" rping -s -v -C 3 -p "$((port + 1))" -- \
      rping -c -a 127.0.0.1 -v -C 3 -p "$((port + 1))" && expect "$CLIENT_OUT" '^ping data: rdma-ping-' 3
    ;;
  ucx.port_down | ucx.retry_exc)
    require ucx_perftest
    require_view
    compat_setup
    export UCX_TLS=rc_verbs UCX_NET_DEVICES=sv0:1
    args=(-t am_lat -x rc_verbs -d sv0:1 -s 8 -n 1000 -w 100)
    start_server ucx ucx_perftest -p "$port"
    wait_listen "$port" "$SERVER_PID" || log "ucx_perftest: server never listened on port $port"
    if [ "$mode" = ucx.port_down ]; then
      faulted down 'port:after_ms=0,down_ms=60000' ucx_perftest 127.0.0.1 -p "$port" "${args[@]}"
      [ "$FAULTED_RC" -ne 0 ] || fail "ucx_perftest with its port down exited 0"
      has down "Cannot use rc_verbs/sv0:1"
    else
      faulted retry 'port:op=500,down_ms=300' ucx_perftest 127.0.0.1 -p "$port" "${args[@]}"
      [ "$FAULTED_RC" -ne 0 ] || fail "ucx_perftest whose port went down exited 0"
      has retry "send completion with error: transport retry counter exceeded"
      grep -Eq "^port down: qp=0x[0-9a-f]+ wr_id=[0-9]+ opcode=SEND status=RETRY_EXC_ERR$" "$COMPAT_DIR/retry.log" ||
        fail "the fault log has no failed SEND"
    fi
    stop_server
    if run_pair ucx_up "$((port + 1))" ucx_perftest -p "$((port + 1))" -- \
        ucx_perftest 127.0.0.1 -p "$((port + 1))" "${args[@]}"; then
      grep -Eq "^Final:[[:space:]]+1000[[:space:]]" "$CLIENT_OUT" || fail "the run with the port up has no 'Final: 1000'"
    fi
    ;;
  *) log "unknown mode $mode"; exit 2 ;;
esac
finish
