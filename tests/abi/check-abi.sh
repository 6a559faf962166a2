#!/usr/bin/env bash
# Checks a built library against an ABI inventory (tests/abi/*.abi):
#   - every `node NAME PARENT` is a version definition of the library, with
#     that parent (or none);
#   - every `sym NAME NODE default` is exported as NAME@@NODE, every
#     `sym NAME NODE compat` as NAME@NODE or NAME@@NODE;
#   - every `absent NAME NODE` is indeed not exported at NODE (so the list of
#     what softverbs leaves out stays true).
# Prints each difference and exits 1 if there is any; 2 on usage errors.
#
# Usage: tests/abi/check-abi.sh LIBRARY INVENTORY
set -euo pipefail
export LC_ALL=C

lib=${1:?usage: check-abi.sh LIBRARY INVENTORY}
inv=${2:?usage: check-abi.sh LIBRARY INVENTORY}
[ -r "$lib" ] || { echo "cannot read $lib" >&2; exit 2; }
[ -r "$inv" ] || { echo "cannot read $inv" >&2; exit 2; }
command -v readelf >/dev/null || { echo "readelf (binutils) is required" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Defined dynamic symbols as "name node default|compat".
readelf --dyn-syms -W "$lib" | awk '
  $7 != "UND" && $8 ~ /@/ {
    name = $8; kind = "default"
    if (index(name, "@@")) { split(name, p, "@@") } else { split(name, p, "@"); kind = "compat" }
    print p[1], p[2], kind
  }' | sort -u > "$tmp/exports"

# Version definitions as "node parent" ("-" when it has none).
readelf -V -W "$lib" | awk '
  function flush() { if (cur != "") print cur, "-"; cur = "" }
  /Version definition section/ { d = 1; next }
  /Version needs section|Version symbols section/ { flush(); d = 0 }
  d && /Name:/ { flush(); if (!/Flags: BASE/) cur = $NF; next }
  d && /Parent 1:/ { if (cur != "") print cur, $NF; cur = "" }
  END { flush() }' | sort -u > "$tmp/nodes"

[ -s "$tmp/exports" ] || { echo "$lib exports no versioned symbols" >&2; exit 1; }

awk -v lib="$lib" '
  FILENAME == ARGV[1] { have[$1 " " $2] = $3; if ($3 == "default") def[$1 " " $2] = 1; next }
  FILENAME == ARGV[2] { parent[$1] = $2; next }
  /^#/ || NF == 0 { next }
  $1 == "node" {
    n++
    if (!($2 in parent)) { print "MISSING node " $2 " (parent " $3 ")"; bad++ }
    else if (parent[$2] != $3) { print "WRONG parent of " $2 ": " parent[$2] ", expected " $3; bad++ }
    next
  }
  $1 == "sym" {
    s++; key = $2 " " $3
    if (!(key in have)) { print "MISSING " $2 "@" ($4 == "default" ? "@" : "") $3; bad++ }
    else if ($4 == "default" && !(key in def)) { print "NOT DEFAULT " $2 "@@" $3 " (only " $2 "@" $3 ")"; bad++ }
    next
  }
  $1 == "absent" {
    if (($2 " " $3) in have) { print "PRESENT " $2 "@" $3 ": listed as absent, update the inventory"; bad++ }
    next
  }
  { print "inventory line not understood: " $0; bad++ }
  END {
    printf "%s: %d nodes, %d symbol versions checked, %d differences\n", lib, n, s, bad
    exit bad ? 1 : 0
  }' "$tmp/exports" "$tmp/nodes" "$inv"
