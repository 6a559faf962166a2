# shellcheck shell=bash
# Shared helpers for the compatibility tests: Debian's unmodified rdma-core /
# perftest binaries run against softverbs' drop-in libibverbs.so.1.
#
# A test script sources this file with the build's bin directory (the one
# holding `softverbs` and `softverbsd`) as $1, then calls `compat_setup`.
# Every test gets its own private SOFTVERBS_DIR and its own daemon, started
# here in the foreground and killed (by pid) when the script exits. The
# library is told not to spawn a daemon of its own (SOFTVERBS_NO_SPAWN), so a
# dead daemon shows up as an error instead of a silently spawned replacement.
#
# Exit codes: 0 pass, 1 fail, 77 skip (a Debian binary is not installed).
# Environment: COMPAT_TIMEOUT (seconds a program may run before it is reported
# as hung, default 45); COMPAT_VERBOSE=1 shows the programs' output of passing
# runs too.

set -u

SKIP=77
BIN_DIR=${1:?usage: $0 BIN_DIR (the build directory holding softverbs and softverbsd)}
BIN_DIR=$(cd "$BIN_DIR" && pwd)
SV="$BIN_DIR/softverbs"
SVD="$BIN_DIR/softverbsd"
# How long (seconds) a program may run before the test reports it as hung.
COMPAT_TIMEOUT=${COMPAT_TIMEOUT:-45}

_compat_failures=0
_compat_pids=()
_compat_daemon=""
COMPAT_DIR=""

log() { printf '%s\n' "$*" >&2; }

fail() {
  log "FAIL: $*"
  _compat_failures=$((_compat_failures + 1))
}

# require PROG...: skip the whole test unless every PROG is on PATH.
require() {
  local p
  for p in "$@"; do
    if ! command -v "$p" >/dev/null 2>&1; then
      log "SKIP: $p is not installed"
      exit $SKIP
    fi
  done
}

_compat_cleanup() {
  local rc=$? p
  trap - TERM INT
  # The programs first (each is `timeout`, which passes the signal on), then
  # the daemon; SIGKILL whatever outlives a grace period.
  for p in "${_compat_pids[@]}" $_compat_daemon; do
    kill "$p" 2>/dev/null
  done
  for _ in $(seq 50); do
    local alive=0
    for p in "${_compat_pids[@]}" $_compat_daemon; do
      kill -0 "$p" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${_compat_pids[@]}" $_compat_daemon; do
    kill -9 "$p" 2>/dev/null
  done
  if [ -n "$COMPAT_DIR" ] && [ -d "$COMPAT_DIR" ]; then
    if [ "$rc" -ne 0 ] && [ "$rc" -ne $SKIP ]; then
      for p in "$COMPAT_DIR"/daemon.stderr "$COMPAT_DIR"/daemon.log; do
        [ -s "$p" ] && { log "--- $p"; cat "$p" >&2; }
      done
    fi
    rm -rf "$COMPAT_DIR"
  fi
  exit "$rc"
}

# compat_setup: private runtime dir + private daemon.
compat_setup() {
  [ -x "$SV" ] || { log "missing $SV"; exit 1; }
  [ -x "$SVD" ] || { log "missing $SVD"; exit 1; }
  COMPAT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/svcompat.XXXXXX") || exit 1
  chmod 700 "$COMPAT_DIR"
  trap _compat_cleanup EXIT
  trap 'exit 143' TERM INT
  export SOFTVERBS_DIR="$COMPAT_DIR"
  export SOFTVERBS_NO_SPAWN=1
  export SOFTVERBSD="$SVD"
  export SOFTVERBS_TRACE=1  # the library reports RNR/retry stalls and failed WRs
  # The private daemon leaves the host's UDP 4791 alone (a per-user daemon
  # takes it by default; tests in parallel must not race for it).
  export SOFTVERBS_ROCE=${SOFTVERBS_ROCE:-0}
  # Registrations are charged to RLIMIT_MEMLOCK as on real hardware; perftest
  # -a registers 8 MiB buffers. Raise the soft limit as far as we may.
  ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -H -l)" 2>/dev/null || true
  "$SVD" --foreground --idle 0 --dir "$COMPAT_DIR" 2>"$COMPAT_DIR/daemon.stderr" &
  _compat_daemon=$!
  for _ in $(seq 200); do
    [ -S "$COMPAT_DIR/control" ] && return 0
    kill -0 "$_compat_daemon" 2>/dev/null || break
    sleep 0.05
  done
  log "softverbsd did not come up in $COMPAT_DIR"
  exit 1
}

# check_daemon: fail if our daemon died.
check_daemon() {
  if ! kill -0 "$_compat_daemon" 2>/dev/null; then
    fail "softverbsd (pid $_compat_daemon) died"
    return 1
  fi
}

# require_view: skip unless `softverbs run` can give its program the device
# view (/dev/infiniband/uverbs0, /sys/class/infiniband/sv0: a private mount
# namespace, as root or in a user namespace; src/tools/view_ns.h).
require_view() {
  if ! "$SV" run -- test -c /dev/infiniband/uverbs0 2>/dev/null; then
    log "SKIP: softverbs run cannot make its device view here (no mount namespace: needs root or unprivileged user namespaces)"
    exit $SKIP
  fi
}

# sv_run CMD...: run a one-shot CMD on softverbs, killed after COMPAT_TIMEOUT.
sv_run() {
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL "$@"
}

# wait_listen PORT PID: wait until a TCP listener is on PORT (the server has
# opened the device and is waiting for its client) or PID is gone.
wait_listen() {
  local port=$1 pid=$2
  if ! command -v ss >/dev/null 2>&1; then
    sleep 1
    return 0
  fi
  for _ in $(seq 400); do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# dump_state NAME PID: for a hung program (PID is its `timeout`), log the
# stacks of its threads (if gdb is installed and may attach).
dump_state() {
  local name=$1 pid=$2 child
  kill -0 "$pid" 2>/dev/null || return 0
  child=$(pgrep -P "$pid" | head -n 1)
  [ -n "$child" ] || return 0
  log "----- $name (pid $child) threads:"
  if command -v gdb >/dev/null 2>&1; then
    timeout 4 gdb -p "$child" -batch -ex 'thread apply all bt' 2>&1 |
      grep -E '^(#|Thread )' >&2
  else
    log "(gdb not installed)"
  fi
}

# show NAME FILE: dump a program's output to the test log.
show() {
  log "----- $1 output ($2):"
  cat "$2" >&2
  log "-----"
}

# run_pair NAME PORT SERVER_ARGS... -- CLIENT_ARGS...
# Starts the server (SERVER_ARGS is the full command), waits for it to listen
# on TCP PORT, runs the client, waits for both. Output goes to
# $COMPAT_DIR/NAME.server and $COMPAT_DIR/NAME.client; the exit codes are in
# SERVER_RC and CLIENT_RC. Returns 0 iff both exited 0.
run_pair() {
  local name=$1 port=$2
  shift 2
  local -a server=() client=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do server+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  client=("$@")
  SERVER_OUT="$COMPAT_DIR/$name.server"
  CLIENT_OUT="$COMPAT_DIR/$name.client"
  SERVER_RC=-1
  CLIENT_RC=-1
  if command -v ss >/dev/null 2>&1 && ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    fail "$name: TCP port $port is already in use by someone else"
    return 1
  fi
  # Started directly (not through a shell function) so that $! is the
  # process that becomes `timeout`, which passes a kill on to the program.
  # `timeout` is only a backstop: the watchdog below fires first.
  local backstop=$((COMPAT_TIMEOUT + 10))
  "$SV" run -- timeout -k 5 "$backstop" stdbuf -oL "${server[@]}" >"$SERVER_OUT" 2>&1 &
  local spid=$!
  _compat_pids+=("$spid")
  if ! wait_listen "$port" "$spid"; then
    log "$name: server never listened on port $port"
  fi
  # In the background too, so that a TERM from ctest is handled at once.
  "$SV" run -- timeout -k 5 "$backstop" stdbuf -oL "${client[@]}" >"$CLIENT_OUT" 2>&1 &
  local cpid=$!
  _compat_pids+=("$cpid")
  # Watchdog: a pair still running after COMPAT_TIMEOUT seconds is reported
  # with its threads' stacks, then killed.
  local deadline=$((SECONDS + COMPAT_TIMEOUT)) hung=0
  while kill -0 "$spid" 2>/dev/null || kill -0 "$cpid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      hung=1
      log "$name: still running after ${COMPAT_TIMEOUT}s"
      dump_state "$name server" "$spid"
      dump_state "$name client" "$cpid"
      log "----- softverbs status:"
      timeout 2 "$SV" status >&2 2>&1
      kill "$spid" "$cpid" 2>/dev/null
      break
    fi
    sleep 0.1
  done
  wait "$cpid"
  CLIENT_RC=$?
  wait "$spid"
  SERVER_RC=$?
  PAIR_HUNG=$hung  # 1: the watchdog killed the pair (its exit codes are then what the kill left)
  if [ $hung -eq 1 ]; then
    fail "$name: killed after ${COMPAT_TIMEOUT}s (server exit $SERVER_RC, client exit $CLIENT_RC)"
    show "$name server" "$SERVER_OUT"
    show "$name client" "$CLIENT_OUT"
    return 1
  fi
  if [ "$SERVER_RC" -ne 0 ] || [ "$CLIENT_RC" -ne 0 ]; then
    fail "$name: server exit $SERVER_RC, client exit $CLIENT_RC"
    show "$name server" "$SERVER_OUT"
    show "$name client" "$CLIENT_OUT"
    return 1
  fi
  return 0
}

# cm_wait PS PORT PID: wait until a listener has bound (PS, PORT): its
# rendezvous socket appears in $COMPAT_DIR/cm (see docs/RDMACM.md); for the
# librdmacm tests (rdmacm.sh, ucx_cm.sh).
cm_wait() {
  local ps=$1 p=$2 pid=$3
  for _ in $(seq 400); do
    compgen -G "$COMPAT_DIR/cm/$ps-$p-*" >/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# cm_pair NAME PS PORT SERVER... -- CLIENT...: like run_pair, but
# the server is ready when it listens on the rdma_cm port.
cm_pair() {
  local name=$1 ps=$2 p=$3
  shift 3
  local -a server=() client=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do server+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  client=("$@")
  SERVER_OUT="$COMPAT_DIR/$name.server"
  CLIENT_OUT="$COMPAT_DIR/$name.client"
  local backstop=$((COMPAT_TIMEOUT + 10))
  "$SV" run -- timeout -k 5 "$backstop" stdbuf -oL "${server[@]}" >"$SERVER_OUT" 2>&1 &
  local spid=$!
  _compat_pids+=("$spid")
  cm_wait "$ps" "$p" "$spid" || log "$name: server never listened on rdma_cm port $p"
  "$SV" run -- timeout -k 5 "$backstop" stdbuf -oL "${client[@]}" >"$CLIENT_OUT" 2>&1 &
  local cpid=$!
  _compat_pids+=("$cpid")
  local deadline=$((SECONDS + COMPAT_TIMEOUT)) hung=0
  while kill -0 "$spid" 2>/dev/null || kill -0 "$cpid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      hung=1
      log "$name: still running after ${COMPAT_TIMEOUT}s"
      dump_state "$name server" "$spid"
      dump_state "$name client" "$cpid"
      kill "$spid" "$cpid" 2>/dev/null
      break
    fi
    sleep 0.1
  done
  wait "$cpid"
  CLIENT_RC=$?
  wait "$spid"
  SERVER_RC=$?
  if [ $hung -eq 1 ] || [ "$SERVER_RC" -ne 0 ] || [ "$CLIENT_RC" -ne 0 ]; then
    fail "$name: server exit $SERVER_RC, client exit $CLIENT_RC"
    show "$name server" "$SERVER_OUT"
    show "$name client" "$CLIENT_OUT"
    return 1
  fi
  return 0
}

# finish: exit with the test's verdict.
finish() {
  if [ -n "${COMPAT_VERBOSE:-}" ]; then
    local f
    for f in "$COMPAT_DIR"/*.server "$COMPAT_DIR"/*.client; do
      [ -f "$f" ] && show "$(basename "$f")" "$f"
    done
  fi
  check_daemon
  if [ "$_compat_failures" -ne 0 ]; then
    log "$_compat_failures check(s) failed"
    exit 1
  fi
  log "PASS"
  exit 0
}

# expect FILE REGEX COUNT: exactly COUNT lines of FILE match REGEX.
expect() {
  local n
  n=$(grep -Ec -- "$2" "$1")
  [ "$n" -eq "$3" ] || { fail "$(basename "$1"): $n lines match '$2', expected $3"; show "$(basename "$1")" "$1"; }
}

# no_errors REGEX: no server or client output of this test matches REGEX
# (case-insensitive), the words its programs report a failure with.
no_errors() {
  local f
  for f in "$COMPAT_DIR"/*.server "$COMPAT_DIR"/*.client; do
    if grep -Eqi -- "$1" "$f"; then
      fail "$(basename "$f") reports an error"
      show "$(basename "$f")" "$f"
    fi
  done
}
