#!/usr/bin/env bash
# Keep src/verbs/libibverbs.map honest against what is installed here.
#
# This compares with the installed (distribution's) libibverbs.so.1 and its
# clients. Our library is a superset of it: it also carries the nodes of
# newer rdma-core releases (up to v64), which show here as "exported by our
# library only" and as differing version nodes. Every node and symbol up
# to v64 is checked by tests/abi/check-abi.sh (ctest -L abi) against the
# inventory in tests/abi/*.abi.
#
# Lists the (symbol, version) pairs exported by the real libibverbs.so.1 and
# those imported by every installed program or library that links it, then
# checks our built library against both:
#   - MISSING: a client imports sym@VERSION and we don't define it at that
#     version (the loader would refuse to load that client);
#   - export differences from the real library (informational);
#   - version nodes or their parents differing from the real library;
#   - type/size differences for data objects (copy relocations need them equal).
#
# Usage: scripts/abi-inventory.sh [-o DIR] [--ldd] [OUR_LIB]
#   OUR_LIB   default: build/src/verbs/libibverbs.so.1
#   -o DIR    keep the generated lists in DIR
#   --ldd     also run `ldd -r` on every client with OUR_LIB's directory first
#             in LD_LIBRARY_PATH and show libibverbs-related errors
# Environment: REAL_LIB (default /usr/lib/x86_64-linux-gnu/libibverbs.so.1),
#   CLIENT_DIRS (default "/usr/bin /usr/sbin /usr/lib/x86_64-linux-gnu").
# Exit status: 0 if every client import is satisfied, 1 if not, 2 on usage.
set -euo pipefail

REAL_LIB=${REAL_LIB:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
CLIENT_DIRS=${CLIENT_DIRS:-/usr/bin /usr/sbin /usr/lib/x86_64-linux-gnu}
OUT=""
RUN_LDD=0
OURS=""

while [ $# -gt 0 ]; do
  case "$1" in
    -o) OUT=${2:?-o needs a directory}; shift 2 ;;
    --ldd) RUN_LDD=1; shift ;;
    -h|--help) sed -n '2,/^set -e/{/^set -e/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    -*) echo "unknown option: $1" >&2; exit 2 ;;
    *) OURS=$1; shift ;;
  esac
done
if [ -z "$OURS" ]; then
  OURS="$(cd "$(dirname "$0")/.." && pwd)/build/src/verbs/libibverbs.so.1"
fi
for f in "$REAL_LIB" "$OURS"; do
  [ -r "$f" ] || { echo "cannot read $f" >&2; exit 2; }
done
command -v readelf >/dev/null || { echo "readelf (binutils) is required" >&2; exit 2; }

if [ -n "$OUT" ]; then
  mkdir -p "$OUT"
else
  OUT=$(mktemp -d)
  trap 'rm -rf "$OUT"' EXIT
fi
export LC_ALL=C

# Defined dynamic symbols as "name version default|compat type size".
exports() {
  readelf --dyn-syms -W "$1" | awk '
    $7 != "UND" && $8 ~ /@/ {
      name = $8; kind = "default"
      if (index(name, "@@")) { split(name, p, "@@") }
      else { split(name, p, "@"); kind = "compat" }
      print p[1], p[2], kind, $4, $3
    }' | sort -u
}

# Version definitions as "node parent" ("-" when it has none).
version_nodes() {
  readelf -V -W "$1" | awk '
    function flush() { if (cur != "") print cur, "-"; cur = "" }
    /Version definition section/ { d = 1; next }
    /Version needs section|Version symbols section/ { flush(); d = 0 }
    d && /Name:/ { flush(); if (!/Flags: BASE/) cur = $NF; next }
    d && /Parent 1:/ { if (cur != "") print cur, $NF; cur = "" }
    END { flush() }' | sort
}

# 1. Real library.
exports "$REAL_LIB" > "$OUT/real-exports.txt"
version_nodes "$REAL_LIB" > "$OUT/real-nodes.txt"

# 2. Clients: every ELF file under CLIENT_DIRS that NEEDs libibverbs.so.1.
ours_real=$(readlink -f "$OURS")
real_real=$(readlink -f "$REAL_LIB")
: > "$OUT/clients.txt"
for d in $CLIENT_DIRS; do
  [ -d "$d" ] || continue
  if [ "$d" = /usr/bin ] || [ "$d" = /usr/sbin ] || [ "$d" = /bin ] || [ "$d" = /sbin ]; then
    find "$d" -maxdepth 1 -type f
  else
    find "$d" -type f \( -name '*.so' -o -name '*.so.*' \)
  fi
done | sort -u | while read -r f; do
  r=$(readlink -f "$f")
  [ "$r" = "$ours_real" ] && continue
  [ "$r" = "$real_real" ] && continue
  if readelf -d "$f" 2>/dev/null | grep 'NEEDED.*\[libibverbs\.so\.1\]' >/dev/null; then
    echo "$f"
  fi
done > "$OUT/clients.txt"

# Imports as "name version binding client"; version "-" if unversioned.
: > "$OUT/client-imports.txt"
while read -r f; do
  readelf --dyn-syms -W "$f" 2>/dev/null | awk -v f="$f" '
    $7 == "UND" && $8 != "" {
      name = $8; ver = "-"
      if (index(name, "@")) { split(name, p, "@"); name = p[1]; ver = p[2] }
      if (ver ~ /^IBVERBS_/ || ver == "-") print name, ver, $5, f
    }'
done < "$OUT/clients.txt" | sort -u > "$OUT/client-imports.txt.all"
# Unversioned imports are kept only if the real library defines that name
# (otherwise they belong to some other library).
awk 'NR == FNR { real[$1] = 1; next } $2 != "-" || ($1 in real)' \
  "$OUT/real-exports.txt" "$OUT/client-imports.txt.all" > "$OUT/client-imports.txt"
rm -f "$OUT/client-imports.txt.all"

# 3. Ours.
exports "$OURS" > "$OUT/our-exports.txt"
version_nodes "$OURS" > "$OUT/our-nodes.txt"

echo "real library: $REAL_LIB ($(wc -l < "$OUT/real-exports.txt") symbol versions)"
echo "our library:  $OURS ($(wc -l < "$OUT/our-exports.txt") symbol versions)"
echo "clients:      $(wc -l < "$OUT/clients.txt") files, $(awk '{print $1"@"$2}' "$OUT/client-imports.txt" | sort -u | wc -l) distinct imports"
echo

status=0

# Imports we do not satisfy.
awk '
  NR == FNR { have[$1 "@" $2] = 1; any[$1] = 1; next }
  {
    ok = ($2 == "-") ? ($1 in any) : (($1 "@" $2) in have)
    if (!ok) { key = $1 "@" $2; if ($3 == "WEAK") key = key " (weak)"
               n = split($4, parts, "/"); who[key] = who[key] " " parts[n] }
  }
  END { for (k in who) print "MISSING " k ":" who[k] }' \
  "$OUT/our-exports.txt" "$OUT/client-imports.txt" | sort > "$OUT/missing.txt"
if [ -s "$OUT/missing.txt" ]; then
  echo "== client imports our library does not satisfy"
  cat "$OUT/missing.txt"
  grep -qv '(weak)' "$OUT/missing.txt" && status=1
else
  echo "== every client import is satisfied"
fi

# Client imports of non-default (compat) versions of the real library.
awk 'NR == FNR { if ($3 == "compat") c[$1 "@" $2] = 1; next }
     ($1 "@" $2) in c { n = split($4, p, "/"); print "  " $1 "@" $2 " <- " p[n] }' \
  "$OUT/real-exports.txt" "$OUT/client-imports.txt" | sort -u > "$OUT/compat-imports.txt"
if [ -s "$OUT/compat-imports.txt" ]; then
  echo
  echo "== clients importing a non-default (compat) version (need .symver aliases)"
  cat "$OUT/compat-imports.txt"
fi

# Version nodes.
if ! cmp -s "$OUT/real-nodes.txt" "$OUT/our-nodes.txt"; then
  echo
  echo "== version nodes differ (node parent; < real, > ours)"
  diff "$OUT/real-nodes.txt" "$OUT/our-nodes.txt" | grep '^[<>]' || true
fi

# Export differences: name, version, default/compat.
cut -d' ' -f1-3 "$OUT/real-exports.txt" > "$OUT/.r"
cut -d' ' -f1-3 "$OUT/our-exports.txt" > "$OUT/.o"
only_real=$(comm -23 "$OUT/.r" "$OUT/.o")
only_ours=$(comm -13 "$OUT/.r" "$OUT/.o")
if [ -n "$only_real" ]; then
  imported=$(awk '{print $1 " " $2}' "$OUT/client-imports.txt" | sort -u)
  echo
  echo "== exported by the real library only (no client imports these)"
  while read -r n v k; do
    if ! grep -qx "$n $v" <<< "$imported"; then echo "  $n@$v ($k)"; fi
  done <<< "$only_real"
fi
if [ -n "$only_ours" ]; then
  echo
  echo "== exported by our library only"
  sed 's/^\([^ ]*\) \([^ ]*\) \(.*\)/  \1@\2 (\3)/' <<< "$only_ours"
fi
rm -f "$OUT/.r" "$OUT/.o"

# Type and size of data objects must match (copy relocations use the size).
awk 'NR == FNR { t[$1 "@" $2] = $4; s[$1 "@" $2] = $5; next }
     ($1 "@" $2) in t && ($4 == "OBJECT" || t[$1 "@" $2] == "OBJECT") &&
     ($4 != t[$1 "@" $2] || $5 != s[$1 "@" $2]) {
       print "  " $1 "@" $2 ": real " t[$1 "@" $2] "/" s[$1 "@" $2] ", ours " $4 "/" $5 }' \
  "$OUT/real-exports.txt" "$OUT/our-exports.txt" > "$OUT/object-mismatch.txt"
if [ -s "$OUT/object-mismatch.txt" ]; then
  echo
  echo "== data objects whose type or size differs"
  cat "$OUT/object-mismatch.txt"
  status=1
fi

if [ "$RUN_LDD" = 1 ]; then
  echo
  echo "== ldd -r with $(dirname "$ours_real") first in LD_LIBRARY_PATH"
  ldd_bad=0
  while read -r f; do
    out=$(LD_LIBRARY_PATH="$(dirname "$ours_real")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
          ldd -r "$f" 2>&1 || true)
    if ! grep -q "libibverbs.so.1 => $(dirname "$ours_real")/" <<< "$out"; then
      echo "  $f: did not resolve libibverbs.so.1 to our library"; ldd_bad=1
    fi
    errs=$(grep -E 'not found|undefined symbol' <<< "$out" | grep -Ei 'ibverbs|IBVERBS' || true)
    if [ -n "$errs" ]; then echo "  $f:"; sed 's/^/    /' <<< "$errs"; ldd_bad=1; fi
  done < "$OUT/clients.txt"
  [ "$ldd_bad" = 0 ] && echo "  no libibverbs errors in $(wc -l < "$OUT/clients.txt") clients"
  [ "$ldd_bad" = 0 ] || status=1
fi

exit "$status"
