#!/bin/bash
# install.cdi: `softverbs cdi --output` as the docs have a newcomer run it.
#   - the file's missing parent directories are made, 0755 whatever the
#     umask, and named (/etc/cdi does not exist on a fresh machine)
#   - a second run for another domain keeps the first one's devices
#     (merged, not rewritten); sv0 stays one device; the file is JSON
#   - a file that is not a spec is left alone, and the run says why
#   - --owner USER gives a domain's directory that was root's, and the files
#     a root daemon left in it, to USER (the rootless example after the
#     rootful one), never following a symbolic link
# The domain parts make directories in /run/softverbs/domains: root only
# (skipped, saying so, otherwise).
#   cdi.sh BIN_DIR
set -u
bin=${1:?usage: $0 BIN_DIR}
sv=$bin/softverbs
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
tmp=$(mktemp -d)
doms=()
cleanup() {
  rm -rf "$tmp"
  for d in "${doms[@]}"; do rm -rf "/run/softverbs/domains/$d"; done
}
trap cleanup EXIT
mode() { stat -c %a "$1"; }

# 1. Missing parents, under a umask that would make them 0700.
spec=$tmp/etc/cdi/softverbs.json
out=$( (umask 077 && "$sv" cdi --output "$spec") 2>&1) || fail "cdi --output into a missing directory: $out"
echo "$out"
[ -f "$spec" ] || fail "no $spec"
for d in "$tmp/etc" "$tmp/etc/cdi"; do
  [ "$(mode "$d")" = 755 ] || fail "$d is mode $(mode "$d"), not 755"
  echo "$out" | grep -q "made the directory $d (0755)" || fail "not said that $d was made"
done
[ "$(mode "$spec")" = 644 ] || fail "$spec is mode $(mode "$spec"), not 644 (runtimes of every user read it)"
out=$("$sv" cdi --output "$spec" 2>&1) || fail "cdi --output again: $out"
echo "$out" | grep -q "made the directory" && fail "a directory said made twice: $out"

# 2. A file that is not a spec is not overwritten.
echo 'not a spec' >"$tmp/other.json"
out=$("$sv" cdi --output "$tmp/other.json" 2>&1) && fail "cdi overwrote a file that is no spec"
echo "$out"
echo "$out" | grep -q "cannot be merged with: not a CDI spec" || fail "the refusal does not say why: $out"
[ "$(cat "$tmp/other.json")" = 'not a spec' ] || fail "the file that is no spec was changed"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP (partly): the domain cases make /run/softverbs/domains/NAME: root only"
  [ "$failures" -eq 0 ] || exit 1
  exit 0
fi

# 3. Two domains, one run each, then a users' domain: all kept.
a="cdit$$a" b="cdit$$b" u="cdit$$u" o="cdit$$o"
doms=("$a" "$b" "$u" "$o")
"$sv" cdi --domain "$a" --output "$spec" >/dev/null || fail "cdi --domain $a"
out=$("$sv" cdi --domain "$b" --output "$spec" 2>&1) || fail "cdi --domain $b: $out"
echo "$out"
echo "$out" | grep -q "kept the devices already in $spec that this run does not name: $a" || fail "not said that $a was kept"
"$sv" cdi --users-domain "$u" --output "$spec" >/dev/null || fail "cdi --users-domain $u"
names=$(python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print(" ".join(sorted(d["name"] for d in s["devices"])))' "$spec") ||
  fail "the merged spec is not JSON: $(cat "$spec")"
echo "devices: $names"
[ "$names" = "$(printf '%s\n' "$a" "$b" "$u" sv0 | sort | tr '\n' ' ' | sed 's/ $//')" ] ||
  fail "the spec's devices are '$names', not $a $b $u sv0"

# 4. --owner after the domain was root's, with a root daemon's files in it.
nobody=$(id -u nobody)
"$sv" cdi --domain "$o" --output "$spec" >/dev/null || fail "cdi --domain $o"
dir=/run/softverbs/domains/$o
touch "$dir/daemon.log" "$dir/lock" && mkdir "$dir/sub" && touch "$dir/sub/file" && touch "$tmp/target" && ln -s "$tmp/target" "$dir/link"
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$dir/control"
out=$("$sv" cdi --domain "$o" --owner nobody --output "$spec" 2>&1) || fail "cdi --owner nobody: $out"
echo "$out"
echo "$out" | grep -q "$dir and the 6 files in it now belong to uid $nobody" || fail "not said what was given to nobody"
for f in "$dir" "$dir/daemon.log" "$dir/lock" "$dir/control" "$dir/sub" "$dir/sub/file"; do
  [ "$(stat -c %u "$f")" = "$nobody" ] || fail "$f is uid $(stat -c %u "$f"), not nobody's"
done
[ "$(stat -c %u "$dir/link")" = "$nobody" ] || fail "the symbolic link itself was not given"
[ "$(stat -L -c %u "$dir/link")" = 0 ] || fail "a symbolic link was followed: its target changed owner"
[ "$(mode "$dir")" = 700 ] || fail "$dir is mode $(mode "$dir")"
grep -q "\"name\": \"$a\"" "$spec" || fail "--owner's run dropped $a"

[ "$failures" -eq 0 ] || exit 1
echo "PASS"
