#!/bin/bash
# install.cli: the command line as users expect it (issue 22, item 9):
# -h/--help print usage on stdout and exit 0, --version prints the project's
# version, and every usage error is one line on stderr that says what to do
# next, exit 2.
#   cli.sh BIN_DIR VERSION
set -u
bin=${1:?usage: $0 BIN_DIR VERSION}
version=${2:?usage: $0 BIN_DIR VERSION}
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# expect RC STDOUT-REGEX STDERR-REGEX CMD...: CMD exits RC and its stdout and
# stderr match (an empty regex: that stream must be empty).
expect() {
  local rc=$1 out_re=$2 err_re=$3 got
  shift 3
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  got=$?
  [ "$got" -eq "$rc" ] || fail "'$*' exited $got, want $rc"
  for s in out err; do
    local re=$out_re
    [ $s = err ] && re=$err_re
    if [ -z "$re" ]; then
      [ -s "$tmp/$s" ] && fail "'$*' wrote to std$s: $(head -c 300 "$tmp/$s")"
    elif ! grep -Eq -- "$re" "$tmp/$s"; then
      fail "'$*': std$s does not match /$re/: $(head -c 300 "$tmp/$s")"
    fi
  done
  # An error is one line.
  [ "$rc" -eq 2 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ] && fail "'$*': error is not one line"
  true
}

sv=$bin/softverbs
svd=$bin/softverbsd
nodaemon=$tmp/no-daemon  # a directory where no daemon runs

for h in -h --help help; do
  expect 0 '^usage: softverbs COMMAND' '' "$sv" $h
done
expect 0 '^  run \[--no-view\] \[--\] CMD' '' "$sv" --help
expect 0 "^softverbs $version\$" '' "$sv" --version
expect 2 '' "^softverbs: no command; try 'softverbs --help'\$" "$sv"
expect 2 '' "^softverbs: unknown command 'frobnicate'; try 'softverbs --help'\$" "$sv" frobnicate
expect 2 '' "^softverbs: unknown option '--frobnicate'; try 'softverbs --help'\$" "$sv" --frobnicate
expect 0 '^usage: softverbs run' '' "$sv" run --help
expect 2 '' "^softverbs run: no command to run; try 'softverbs run -- " "$sv" run
expect 2 '' "^softverbs run: no command to run; try " "$sv" run --
expect 127 '' "^softverbs run: no-such-program-here: No such file or directory; check the name and PATH\$" \
  "$sv" run -- no-such-program-here
touch "$tmp/not-executable"
expect 126 '' "^softverbs run: $tmp/not-executable: Permission denied; check that it is an executable file\$" \
  "$sv" run "$tmp/not-executable"
expect 0 '^usage: softverbs status \[--json\]$' '' "$sv" status -h
expect 0 '^usage: softverbs ls$' '' "$sv" ls --help
expect 2 '' "^softverbs status: unexpected argument 'x'; try 'softverbs status' or 'softverbs status --json'\$" "$sv" status x
expect 2 '' "^softverbs ls: unexpected argument 'x'; try 'softverbs ls' alone\$" "$sv" ls x
expect 1 "^softverbsd: not running .*; it starts with the first program run under 'softverbs run'" '' \
  env SOFTVERBS_DIR="$nodaemon" "$sv" status
expect 1 '' "^softverbs status: no daemon at .*; it starts with the first program run under 'softverbs run'" \
  env SOFTVERBS_DIR="$nodaemon" "$sv" status --json
expect 1 '' "^softverbs ls: no daemon at .*; it starts with the first program run under 'softverbs run'" \
  env SOFTVERBS_DIR="$nodaemon" "$sv" ls

for h in -h --help; do
  expect 0 '^usage: softverbsd \[--foreground\]' '' "$svd" $h
done
expect 0 "^softverbsd $version\$" '' "$svd" --version
expect 2 '' "^softverbsd: unknown option '--frobnicate'; try 'softverbsd --help'\$" "$svd" --frobnicate
expect 2 '' "^softverbsd: unknown argument 'frobnicate'; try 'softverbsd --help'\$" "$svd" frobnicate
expect 2 '' "^softverbsd: --idle needs a value; try 'softverbsd --help'\$" "$svd" --idle
expect 2 '' "^softverbsd: --dir needs a value; try 'softverbsd --help'\$" "$svd" --dir
expect 2 '' "^softverbsd: --idle 'soon': want a number of seconds" "$svd" --idle soon
# A directory it may not serve in: a file, not a directory.
touch "$tmp/file"
expect 1 '' "^softverbsd: cannot start in $tmp/file: .*; " "$svd" --foreground --dir "$tmp/file"

[ "$failures" -eq 0 ] && echo "install.cli: all passed"
exit $((failures > 0))
