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

set -u

SKIP=77
BIN_DIR=${1:?usage: $0 BIN_DIR (the build directory holding softverbs and softverbsd)}
BIN_DIR=$(cd "$BIN_DIR" && pwd)
SV="$BIN_DIR/softverbs"
SVD="$BIN_DIR/softverbsd"
# Per-process timeout for every program a test runs (seconds).
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
  local rc=$? p i
  trap - TERM INT
  # The programs first (each is `timeout`, which passes the signal on), then
  # the daemon; SIGKILL whatever outlives a grace period.
  for p in "${_compat_pids[@]}" $_compat_daemon; do
    kill "$p" 2>/dev/null
  done
  for i in $(seq 50); do
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
  # Registrations are charged to RLIMIT_MEMLOCK as on real hardware; perftest
  # -a registers 8 MiB buffers. Raise the soft limit as far as we may.
  ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -H -l)" 2>/dev/null || true
  "$SVD" --foreground --idle 0 --dir "$COMPAT_DIR" 2>"$COMPAT_DIR/daemon.stderr" &
  _compat_daemon=$!
  local i
  for i in $(seq 200); do
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

# sv_run CMD...: run CMD on softverbs, bounded by COMPAT_TIMEOUT, its stdout
# line-buffered so that a program killed by the timeout still shows how far
# it got.
sv_run() {
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL "$@"
}

# wait_listen PORT PID: wait until a TCP listener is on PORT (the server has
# opened the device and is waiting for its client) or PID is gone.
wait_listen() {
  local port=$1 pid=$2 i
  for i in $(seq 400); do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
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
  if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    fail "$name: TCP port $port is already in use by someone else"
    return 1
  fi
  # Started directly (not through a shell function) so that $! is the
  # process that becomes `timeout`, which passes a kill on to the program.
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL "${server[@]}" >"$SERVER_OUT" 2>&1 &
  local spid=$!
  _compat_pids+=("$spid")
  if ! wait_listen "$port" "$spid"; then
    log "$name: server never listened on port $port"
  fi
  # In the background too, so that a TERM from ctest is handled at once.
  "$SV" run -- timeout -k 5 "$COMPAT_TIMEOUT" stdbuf -oL "${client[@]}" >"$CLIENT_OUT" 2>&1 &
  local cpid=$!
  _compat_pids+=("$cpid")
  wait "$cpid"
  CLIENT_RC=$?
  wait "$spid"
  SERVER_RC=$?
  if [ "$SERVER_RC" -ne 0 ] || [ "$CLIENT_RC" -ne 0 ]; then
    fail "$name: server exit $SERVER_RC, client exit $CLIENT_RC"
    show "$name server" "$SERVER_OUT"
    show "$name client" "$CLIENT_OUT"
    return 1
  fi
  return 0
}

# finish: exit with the test's verdict.
finish() {
  check_daemon
  if [ "$_compat_failures" -ne 0 ]; then
    log "$_compat_failures check(s) failed"
    exit 1
  fi
  log "PASS"
  exit 0
}
