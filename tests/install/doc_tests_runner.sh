#!/bin/bash
# install.doc_tests_runner: scripts/doc-tests.py on tests/install/doc_fixture.md:
# one line per block with its verdict (ok, FAIL, skip with the doc's reason),
# exit 1 for the failing block with its stderr in the digest, shell variables
# and files carried from one block to the next, the background server ended
# afterwards, and as root the same blocks again as a made user, removed after.
#   doc_tests_runner.sh PYTHON SOURCE_DIR BUILD_DIR
set -u
py=${1:?usage: $0 PYTHON SOURCE_DIR BUILD_DIR}
src=${2:?}
build=${3:?}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
users_before=$(getent passwd | grep -c '^svdoc')
"$py" "$src/scripts/doc-tests.py" --build "$build" --source "$src" "$src/tests/install/doc_fixture.md" >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" = 1 ] || fail "exit $rc, want 1 (one block fails)"
f=tests/install/doc_fixture.md
who='[a-z0-9_]+'
has() { grep -Eq -- "$1" "$out" || fail "no line matches /$1/"; }
has "^$f:5 +$who +ok "
has "^$f:15 +$who +ok "
has "^$f:22 +$who +FAIL \(exit 1\)"
has "^$f:29 +$who +skip \(needs a second host\)"
has "^$f:34 +$who +ok \(lines 2 not run: not on this machine\)"
grep -q "^$f:41 " "$out" && fail "a block that is not sh was run"
has "^-- $f:22 as $who: FAIL"
has "this block fails on purpose"
grep -q "^ *not reached" "$out" && fail "the failing block went on after its failure"
if [ "$(id -u)" = 0 ]; then
  has "^$f:5 +root +ok"
  has "^$f:15 +svdoc[0-9a-f]+ +ok"
  [ "$(getent passwd | grep -c '^svdoc')" = "$users_before" ] || fail "the made user was not removed"
  has "^$f:47 +root +ok"
  grep -Eq "^$f:47 +svdoc" "$out" && fail "a block with sudo was run as the made user"
fi
sleep 0.2
for p in /proc/[0-9]*; do
  [ "$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" = "sleep 987654 " ] && fail "the background server ${p#/proc/} was left running"
done
[ "$failures" = 0 ] && echo "install.doc_tests_runner: all checks passed"
exit $((failures > 0))
