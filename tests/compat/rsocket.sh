#!/bin/bash
# compat.rsocket.*: rsockets (rsocket(7)) on softverbs' librdmacm.so.1:
# Debian's unmodified rstream, riostream and rcopy (rdmacm-utils), and a
# TCP program that knows nothing of RDMA under rdma-core's preload library
# (librspreload.so, from librdmacm1), server and client on 127.0.0.1.
#   rsocket.sh BIN_DIR MODE PORT [TCP_PROGRAM]
# MODE: rstream | rstream_all | rstream_async | rstream_nb | rstream_verify |
# rstream_small | rstream6 | rstream_kill | udpong | udpong_blocking | riostream | riostream_async | rcopy | preload.
# PORT is an rdma_cm port in this test's own SOFTVERBS_DIR (the server is
# ready when its rendezvous socket cm/262-PORT-* exists: it is an rsocket,
# not a kernel TCP socket).
. "$(dirname "$0")/lib.sh"
mode=${2:?mode}
port=${3:?port}
TCP=262  # RDMA_PS_TCP
PRELOAD=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so

ERRORS='error|fail|invalid|not implemented|refused|reset'  # what its programs say when they fail (no_errors)

# stream NAME PROG ROW ARGS...: PROG's server and client with ARGS; both
# print one result line matching ROW (name, size, transfers, iterations).
stream() {
  local name=$1 prog=$2 row=$3
  shift 3
  require "$prog"
  compat_setup
  if cm_pair "$name" $TCP "$port" "$prog" -p "$port" "$@" -- "$prog" -s 127.0.0.1 -p "$port" "$@"; then
    expect "$SERVER_OUT" "$row" 1
    expect "$CLIENT_OUT" "$row" 1
    no_errors "$ERRORS"
  fi
}

case "$mode" in
  # One size, blocking calls (rstream's default mode).
  rstream) stream rstream rstream '^custom +64k +1k +1 ' -S 65536 -C 1000 ;;
  # rstream's whole default run: latency and bandwidth, 64 B .. 1 MiB.
  rstream_all)
    stream rstream rstream '^1m_bw +1m +100 +1 '
    expect "$CLIENT_OUT" '^(64|4k|64k|1m)_(lat|bw) ' 8
    ;;
  # Asynchronous: rpoll before every call (-T a), nonblocking sockets.
  rstream_async) stream rstream rstream '^custom +4k +2k +1 ' -T a -S 4096 -C 2000 ;;
  # Nonblocking calls retried on EAGAIN (-T n), nonblocking connect.
  rstream_nb) stream rstream rstream '^custom +976k +50 +1 ' -T n -S 1000000 -C 50 ;;
  # The received data is checked (-T v).
  rstream_verify) stream rstream rstream '^custom +97k +200 +1 ' -T v -S 100000 -C 200 ;;
  # Small buffers (SO_SNDBUF/SO_RCVBUF 8 KiB) and no inline data: the
  # credits and the control messages' own buffer.
  rstream_small) stream rstream rstream '^custom +1000 +2k +1 ' -T v -B 8192 -i 0 -S 1000 -C 2000 ;;
  rstream6)
    require rstream
    compat_setup
    if cm_pair rstream $TCP "$port" rstream -b ::1 -f ipv6 -p "$port" -S 4096 -C 500 -T v \
      -- rstream -s ::1 -f ipv6 -p "$port" -S 4096 -C 500 -T v; then
      expect "$SERVER_OUT" '^custom +4k +500 +1 ' 1
      expect "$CLIENT_OUT" '^custom +4k +500 +1 ' 1
      no_errors "$ERRORS"
    fi
    ;;
  # riomap / riowrite: RDMA writes straight into the peer's buffer.
  riostream) stream riostream riostream '^custom +64k +200 +1 ' -T v -S 65536 -C 200 ;;
  riostream_async) stream riostream riostream '^custom +4k +500 +1 ' -T a -S 4096 -C 500 ;;
  # The client dies (SIGKILL) mid-transfer: the server's rrecv fails with
  # ECONNRESET (no DISCONNECT message came), it does not hang or see EOF.
  rstream_kill)
    require rstream
    compat_setup
    SERVER_OUT="$COMPAT_DIR/rstream.server"
    CLIENT_OUT="$COMPAT_DIR/rstream.client"
    "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL rstream -p "$port" -S 1000000 -C 1000000 >"$SERVER_OUT" 2>&1 &
    spid=$!
    _compat_pids+=($spid)
    cm_wait $TCP "$port" $spid || fail "rstream server never listened on rdma_cm port $port"
    "$SV" run -- stdbuf -oL rstream -s 127.0.0.1 -p "$port" -S 1000000 -C 1000000 >"$CLIENT_OUT" 2>&1 &
    cpid=$!
    _compat_pids+=($cpid)
    sleep 1
    pkill -KILL -P "$cpid" rstream 2>/dev/null || kill -KILL "$cpid"
    for _ in $(seq 100); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$spid" 2>/dev/null; then
      fail "rstream server still running 10 s after its client died"
    else
      wait "$spid"
      rc=$?
      [ "$rc" -ne 0 ] || fail "rstream server exit 0 after its client died"
      expect "$SERVER_OUT" '^rrecv: Connection reset by peer$' 1
    fi
    ;;
  # Datagram rsockets (UD): udpong's bandwidth test (nonblocking calls; the
  # server counts what arrived, UD may drop), and a blocking echo run. Not
  # its default run: its echo tests resend after 1 ms without an answer and
  # then read stale answers; on a loaded 2-CPU runner a backlog builds up
  # and the run takes minutes. The server serves until it is killed.
  udpong | udpong_blocking)
    require udpong
    compat_setup
    SERVER_OUT="$COMPAT_DIR/udpong.server"
    CLIENT_OUT="$COMPAT_DIR/udpong.client"
    args=(-S 1000 -C 10000)
    [ "$mode" = udpong_blocking ] && args=(-T b -T e -S 1000 -C 2000)
    # The UDP port is the kernel's, shared with the host: ours is free if
    # nothing holds it now (the rdma_cm port space is this test's own).
    # Started directly, not through sv_run (a function: $! would be the
    # subshell, and killing it left udpong holding the UDP port for its
    # whole timeout, so that the next run's rbind failed with EADDRINUSE).
    "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL udpong -b 127.0.0.1 -p "$port" "${args[@]}" \
      >"$SERVER_OUT" 2>&1 &
    spid=$!
    _compat_pids+=($spid)
    # Ready when its UDP socket is bound.
    for _ in $(seq 200); do
      ss -Hlun "sport = :$port" 2>/dev/null | grep -q . && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.05
    done
    sv_run udpong -s 127.0.0.1 -p "$port" "${args[@]}" >"$CLIENT_OUT" 2>&1 || {
      fail "udpong client: exit $?"
      show "udpong server" "$SERVER_OUT"
    }
    if [ "$mode" = udpong ]; then
      # xfers: the datagrams the server says it received (UD may drop some).
      expect "$CLIENT_OUT" '^custom +1000 +[0-9.]+k? ' 1
    else
      expect "$CLIENT_OUT" '^custom +1000 +4k ' 1
    fi
    no_errors "$ERRORS"
    ;;
  rcopy)
    # The rcopy server serves clients until it is killed.
    require rcopy
    compat_setup
    src="$COMPAT_DIR/src.bin"
    dst="$COMPAT_DIR/dst.bin"
    head -c 3333333 /dev/urandom >"$src"
    SERVER_OUT="$COMPAT_DIR/rcopy.server"
    CLIENT_OUT="$COMPAT_DIR/rcopy.client"
    "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL rcopy -p "$port" >"$SERVER_OUT" 2>&1 &
    _compat_pids+=($!)
    cm_wait $TCP "$port" $! || fail "rcopy server never listened on rdma_cm port $port"
    for i in 1 2; do
      sv_run rcopy "$src" "127.0.0.1:$dst.$i" -p "$port" >>"$CLIENT_OUT" 2>&1 || fail "rcopy client $i: exit $?"
      cmp -s "$src" "$dst.$i" || fail "rcopy: $dst.$i differs from $src"
    done
    expect "$CLIENT_OUT" '^opening\.\.\.transferring\.\.\.closing\.\.\.done$' 2
    expect "$CLIENT_OUT" '^3333333 bytes in ' 2
    expect "$SERVER_OUT" 'transferring\.\.\.3333333 bytes\.\.\.closing\.\.\.done' 2
    ;;
  preload)
    prog=${4:?the TCP program}
    [ -e "$PRELOAD" ] || { log "SKIP: $PRELOAD is not installed"; exit $SKIP; }
    compat_setup
    if cm_pair tcp $TCP "$port" env LD_PRELOAD="$PRELOAD" "$prog" server "$port" \
      -- env LD_PRELOAD="$PRELOAD" "$prog" client "$port" 7777777; then
      hash=$(sed -n 's/^client: OK 7777777 bytes hash \([0-9a-f]*\)$/\1/p' "$CLIENT_OUT")
      [ -n "$hash" ] || { fail "client: no OK line"; show client "$CLIENT_OUT"; }
      expect "$SERVER_OUT" "^server: 7777777 bytes hash $hash\$" 1
    fi
    ;;
  *)
    log "unknown mode $mode"
    exit 1
    ;;
esac
finish
