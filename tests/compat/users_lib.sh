# users_lib.sh: what the tests between root and nobody through a private
# system daemon share (rdmacm_users.sh, fault_users.sh), sourced with the
# test's own arguments (BIN_DIR PORT): skips (77) unless root with setpriv
# and the programs in USERS_NEEDS, and nobody can load the build's
# libraries; starts the system daemon in a directory of its own and points
# this shell's programs at it; defines log, fail, as_nobody, $work, $pids
# (killed at exit) and $failures.
BIN=$(cd "${1:?usage: $0 BIN_DIR PORT}" && pwd)
PORT=${2:?port}
SKIP=77
log() { printf '%s\n' "$*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "SKIP: not root"; exit $SKIP; }
for p in $USERS_NEEDS setpriv; do command -v $p >/dev/null || { log "SKIP: $p is not installed"; exit $SKIP; }; done
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
# nobody must be able to load our libraries from the build directory.
as_nobody test -r "$BIN/../lib/libibverbs.so.1" ||
  { log "SKIP: the build directory is not readable by nobody"; exit $SKIP; }

work=$(mktemp -d /tmp/svusers.XXXXXX)
chmod 755 "$work"
sysdir=$work/sys
pids=()
failures=0
fail() { log "FAIL: $*"; failures=$((failures + 1)); }
cleanup() {
  local rc=$? p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ "$rc" -ne 0 ] && [ -s "$work/daemon.log" ] && { log "--- daemon:"; cat "$work/daemon.log" >&2; }
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

"$BIN/softverbsd" --system --foreground --dir "$sysdir" 2>"$work/daemon.log" &
pids+=($!)
for _ in $(seq 100); do [ -S "$sysdir/control" ] && break; sleep 0.05; done
[ -S "$sysdir/control" ] || { log "the system daemon did not come up"; exit 1; }
export SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR=$sysdir SOFTVERBS_NO_SPAWN=1
