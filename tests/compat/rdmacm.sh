#!/bin/bash
# compat.rdmacm.*: Debian's unmodified librdmacm programs (rdmacm-utils,
# perftest -R) on softverbs' librdmacm.so.1 + libibverbs.so.1, server and
# client on 127.0.0.1.
#   rdmacm.sh BIN_DIR MODE PORT
# MODE: rping | rping_q (the application creates and moves its QP:
# CONNECT_RESPONSE, rdma_init_qp_attr, rdma_establish) | rping6 (over ::1) |
# rping_lo (the server bound to 127.0.0.1, then to ::1) |
# ucmatose | ucmatose4 | ucmatose_m (rdma_migrate_id) | udaddy | rdma_server |
# ib_send_bw | ib_write_lat | ib_read_bw | fi_pingpong (its PORT is TCP). PORT is an rdma_cm port: it lives in this
# test's own SOFTVERBS_DIR (the rendezvous sockets), not in TCP.
. "$(dirname "$0")/lib.sh"
mode=${2:?mode}
port=${3:?port}

ERRORS='error|fail|unhandled|invalid'  # what its programs say when they fail (no_errors)

TCP=262  # RDMA_PS_TCP
UDP=273  # RDMA_PS_UDP

case "$mode" in
  rping | rping_q | rping6)
    require rping
    compat_setup
    sargs=(-s -v -C 10 -p "$port")
    cargs=(-c -a 127.0.0.1 -v -C 10 -p "$port")
    [ "$mode" = rping_q ] && { sargs+=(-q); cargs+=(-q); }
    [ "$mode" = rping6 ] && { sargs+=(-a ::1); cargs+=(-a ::1); }
    if cm_pair rping $TCP "$port" rping "${sargs[@]}" -- rping "${cargs[@]}"; then
      # -v prints each ping's payload: "rdma-ping-<n>: " and 50 characters of
      # the ASCII range A..z rotating from 'A' + n, exactly.
      for i in $(seq 0 9); do
        line="rdma-ping-$i: "
        for k in $(seq 0 49); do
          line+=$(printf "\\$(printf '%03o' $((65 + (i + k) % 58)))")
        done
        grep -Fxq -- "ping data: $line" "$CLIENT_OUT" || fail "client: no line 'ping data: $line'"
        grep -Fxq -- "server ping data: $line" "$SERVER_OUT" || fail "server: no line 'server ping data: $line'"
      done
      expect "$CLIENT_OUT" '^ping data: ' 10
      expect "$SERVER_OUT" '^server ping data: ' 10
      expect "$SERVER_OUT" '^server DISCONNECT EVENT' 1
      no_errors "$ERRORS"
    fi
    ;;
  rping_lo)
    # A server bound to the loopback address itself (not the wildcard), as
    # the README runs it: rping -s -a 127.0.0.1 -C 3, rping -c -a 127.0.0.1
    # -C 3 -v, then the same on ::1; rping's default port (7174, in this
    # test's own directory). Then all of it again with
    # SOFTVERBS_CM_LOOPBACK_DEVICE=1, where the server's bind already gives
    # it sv0 (docs/RDMACM.md, "Addresses").
    require rping
    compat_setup
    for run in 127.0.0.1 ::1 dev:127.0.0.1 dev:::1; do
      addr=${run#dev:}
      if [ "$run" != "$addr" ]; then export SOFTVERBS_CM_LOOPBACK_DEVICE=1; else unset SOFTVERBS_CM_LOOPBACK_DEVICE; fi
      name=rping_lo${run//[.:]/_}
      if cm_pair "$name" $TCP 7174 rping -s -a "$addr" -C 3 -- rping -c -a "$addr" -C 3 -v; then
        for i in 0 1 2; do
          line="rdma-ping-$i: "
          for k in $(seq 0 49); do
            line+=$(printf "\\$(printf '%03o' $((65 + (i + k) % 58)))")
          done
          grep -Fxq -- "ping data: $line" "$CLIENT_OUT" || fail "$run: client: no line 'ping data: $line'"
        done
        expect "$CLIENT_OUT" '^ping data: ' 3
        expect "$SERVER_OUT" '^server DISCONNECT EVENT' 1
      fi
    done
    no_errors "$ERRORS"
    ;;
  ucmatose | ucmatose4 | ucmatose_m)
    require ucmatose
    compat_setup
    args=(-p "$port")
    [ "$mode" = ucmatose4 ] && args+=(-c 4)
    [ "$mode" = ucmatose_m ] && args+=(-m)
    if cm_pair ucmatose $TCP "$port" ucmatose "${args[@]}" -- ucmatose -s 127.0.0.1 "${args[@]}"; then
      expect "$SERVER_OUT" '^data transfers complete$' 1
      expect "$CLIENT_OUT" '^data transfers complete$' 1
      expect "$SERVER_OUT" '^disconnected$' 1
      expect "$SERVER_OUT" '^return status 0$' 1
      expect "$CLIENT_OUT" '^return status 0$' 1
      no_errors "$ERRORS"
    fi
    ;;
  udaddy)
    require udaddy
    compat_setup
    # udaddy has no port option: 7174, in this test's own directory.
    if cm_pair udaddy $UDP 7174 udaddy -- udaddy -s 127.0.0.1; then
      expect "$SERVER_OUT" '^sending replies$' 1
      expect "$CLIENT_OUT" '^data transfers complete$' 1
      expect "$SERVER_OUT" '^return status 0$' 1
      expect "$CLIENT_OUT" '^return status 0$' 1
      no_errors "$ERRORS"
    fi
    ;;
  rdma_server)
    require rdma_server rdma_client
    compat_setup
    if cm_pair rdma_server $TCP "$port" rdma_server -p "$port" -- rdma_client -s 127.0.0.1 -p "$port"; then
      expect "$SERVER_OUT" '^rdma_server: end 0$' 1
      expect "$CLIENT_OUT" '^rdma_client: end 0$' 1
    fi
    ;;
  ib_send_bw | ib_read_bw | ib_write_lat)
    require "$mode"
    compat_setup
    if cm_pair "$mode" $TCP "$port" "$mode" -R -p "$port" -n 1000 -- "$mode" -R -p "$port" -n 1000 127.0.0.1; then
      # The result line: size, iterations, then numbers.
      expect "$CLIENT_OUT" '^ *[0-9]+ +1000 +[0-9.]+ +[0-9.]+' 1
      grep -q 'rdma_cm' "$CLIENT_OUT" "$SERVER_OUT" ||
        fail "perftest did not report using rdma_cm"
    fi
    ;;
  fi_pingpong)
    # libfabric's verbs provider, MSG endpoints (rdma_cm). It lists only the
    # addresses of non-loopback interfaces as its own; PORT is the TCP
    # control port fi_pingpong exchanges addresses on.
    require fi_pingpong
    ip=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9.]+$' | head -n 1)
    [ -n "$ip" ] || { log "SKIP: no IPv4 address besides loopback"; exit $SKIP; }
    compat_setup
    if run_pair fi_pingpong "$port" fi_pingpong -p verbs -e msg -B "$port" -I 100 -- \
        fi_pingpong -p verbs -e msg -P "$port" -I 100 "$ip"; then
      expect "$CLIENT_OUT" '^1m +100 +=100 ' 1
      expect "$SERVER_OUT" '^1m +100 +=100 ' 1
    fi
    ;;
  *)
    log "unknown mode $mode"
    exit 1
    ;;
esac
finish
