#!/bin/bash
# compat.rdmacm.abi: every RDMACM_* symbol that an installed program or
# library imports is exported by our librdmacm.so.1 at that version, and we
# export everything Debian's librdmacm.so.1 exports (and more: the nodes of
# later releases, which abi.librdmacm checks against tests/abi/librdmacm.abi).
#   rdmacm_abi.sh BIN_DIR   (our library is BIN_DIR/../lib/librdmacm.so.1)
set -u
BIN_DIR=${1:?usage: $0 BIN_DIR}
OURS="$BIN_DIR/../lib/librdmacm.so.1"
REAL=${REAL_LIB:-/usr/lib/x86_64-linux-gnu/librdmacm.so.1}
command -v objdump >/dev/null || { echo "SKIP: objdump is not installed" >&2; exit 77; }
[ -e "$REAL" ] || { echo "SKIP: $REAL is not installed" >&2; exit 77; }
[ -e "$OURS" ] || { echo "missing $OURS" >&2; exit 1; }

exports() { objdump -T "$1" | awk '$0 !~ /\*UND\*/ && / RDMACM_/ {print $NF "@" $(NF-1)}' | sort -u; }
ours=$(exports "$OURS")
real=$(exports "$REAL")
rc=0
lacking=$(comm -23 <(echo "$real") <(echo "$ours"))
if [ -n "$lacking" ]; then
  echo "FAIL: $REAL exports what we do not:" $lacking >&2
  rc=1
fi
clients=0
# A file importing RDMACM_* names librdmacm.so.1 in its version needs (its
# dynamic string table): one grep over all files finds the candidates, and
# only those are read by objdump (all of them took up to 60 s on a loaded machine).
candidates=$(find /usr/bin /usr/sbin /usr/lib/x86_64-linux-gnu -maxdepth 2 -type f \
               \( -path '/usr/bin/*' -o -path '/usr/sbin/*' -o -name '*.so*' \) -print0 |
             xargs -0 grep -l -F -s librdmacm.so.1 2>/dev/null)
for f in $candidates; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  imports=$(objdump -T "$f" 2>/dev/null | awk '/\*UND\*/ && /\(RDMACM_/ {v = $(NF-1); gsub(/[()]/, "", v); print $NF "@" v}' | sort -u)
  [ -n "$imports" ] || continue
  clients=$((clients + 1))
  missing=$(comm -23 <(echo "$imports") <(echo "$ours"))
  if [ -n "$missing" ]; then
    echo "FAIL: $f imports what we do not export: $missing" >&2
    rc=1
  fi
done
echo "$clients clients of librdmacm checked" >&2
[ $rc -eq 0 ] && echo PASS >&2
exit $rc
