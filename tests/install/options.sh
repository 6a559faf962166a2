#!/bin/bash
# install.options: every option softverbs' parser accepts is documented in
# `softverbs --help` and in softverbs(1). The options are the string literals
# of the form "--word" or "-x" that the tool's sources compare arguments with
# (src/tools/*.cc, tests aside): a new option without its documentation
# fails here.
#   options.sh BIN_DIR SOURCE_DIR
set -u
bin=${1:?usage: $0 BIN_DIR SOURCE_DIR}
src=${2:?usage: $0 BIN_DIR SOURCE_DIR}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

sources=()
for f in "$src"/src/tools/*.cc; do
  case $f in *_test.cc) continue ;; esac
  sources+=("$f")
done
# Literals compared with an argument: == "--x" or strcmp(ARG, "--x"), and
# the short forms "-x".
lit='(==|strcmp\([^,]*,) *"--?[a-z][a-z0-9-]*"'
opts=$(grep -ohE "$lit" "${sources[@]}" | grep -oE '"[^"]*"' | tr -d '"' | sort -u)
[ -n "$opts" ] || { fail "no options found in ${sources[*]}"; exit 1; }
echo "options in the sources: $(echo $opts)"

help=$("$bin/softverbs" --help) || fail "softverbs --help failed"
# The man page as text: roff's escaped hyphens unescaped, fonts dropped.
man=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$src/docs/man/softverbs.1")
for o in $opts; do
  re="(^|[^a-z0-9-])$o([^a-z0-9-]|\$)"
  echo "$help" | grep -Eq -- "$re" || fail "softverbs --help does not list $o"
  echo "$man" | grep -Eq -- "$re" || fail "softverbs(1) (docs/man/softverbs.1) does not list $o"
done
# Each command's own --help lists its options too (cdi's, the most).
cdi_help=$("$bin/softverbs" cdi --help) || fail "softverbs cdi --help failed"
for o in $(grep -ohE "$lit" "$src/src/tools/cdi.cc" | grep -oE '"[^"]*"' | tr -d '"' | sort -u); do
  echo "$cdi_help" | grep -Eq -- "(^|[^a-z0-9-])$o([^a-z0-9-]|\$)" || fail "softverbs cdi --help does not list $o"
done
[ "$failures" -eq 0 ] || exit 1
echo "PASS: $(echo $opts | wc -w) options, each in --help and softverbs(1)"
