#!/bin/bash
# install.errors: every way a program can fail to reach a daemon says why on
# its stderr, in one line with what to do (not only "Failed to open device"):
# no daemon binary to start, starting forbidden (SOFTVERBS_NO_SPAWN), no
# system daemon, a runtime directory of the wrong mode.
#   errors.sh BIN_DIR   (BIN_DIR/../lib holds our libibverbs.so.1)
set -u
bin=${1:?usage: $0 BIN_DIR}
lib=$(cd "$bin/../lib" && pwd)
command -v ibv_devinfo >/dev/null || { echo "SKIP: no ibv_devinfo (ibverbs-utils)"; exit 77; }
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# said NAME REGEX ENV...: ibv_devinfo under ENV fails, and its stderr has
# exactly one softverbs line, matching REGEX.
said() {
  local name=$1 re=$2
  shift 2
  env LD_LIBRARY_PATH="$lib" SOFTVERBS_ROCE=0 "$@" timeout 60 ibv_devinfo >"$tmp/out" 2>"$tmp/err" </dev/null
  local n
  n=$(grep -c '^softverbs: ' "$tmp/err")
  [ "$n" -eq 1 ] || fail "$name: $n softverbs lines on stderr, want 1: $(head -c 400 "$tmp/err")"
  grep -Eq -- "$re" "$tmp/err" || fail "$name: stderr does not say why (/$re/): $(head -c 400 "$tmp/err")"
  grep -q 'softverbs doctor' "$tmp/err" || fail "$name: stderr does not point to softverbs doctor"
  echo "ok: $name: $(grep '^softverbs: ' "$tmp/err")"
}

d=$(mktemp -d -p "$tmp")
said "no daemon binary" "could not be started: /nonexistent/softverbsd" SOFTVERBS_DIR="$d" SOFTVERBSD=/nonexistent/softverbsd
d=$(mktemp -d -p "$tmp")
said "spawning forbidden" "SOFTVERBS_NO_SPAWN is set" SOFTVERBS_DIR="$d" SOFTVERBS_NO_SPAWN=1
d=$(mktemp -d -p "$tmp")
chmod 0755 "$d"
said "a 0755 runtime directory" "has mode 0755; it must be 0700" SOFTVERBS_DIR="$d"
if [ "$(id -u)" -eq 0 ]; then
  d=$(mktemp -d -p "$tmp")
  chmod 0755 "$d"
  said "no system daemon" "no system daemon answers in $d" SOFTVERBS_SYSTEM=1 SOFTVERBS_SYSTEM_DIR="$d"
fi
[ "$failures" -eq 0 ] && echo "install.errors: every refusal said why"
exit $((failures > 0))
