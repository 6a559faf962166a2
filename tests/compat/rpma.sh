#!/bin/bash
# compat.rpma.*: librpma (Debian's librpma 1.2, the RDMA library of PMDK for
# persistent memory) on softverbs' librdmacm.so.1 and libibverbs.so.1:
# rpma_pingpong (tests/compat/rpma_pingpong.c) registers the server's
# memory of one kind with rpma_mr_reg, the client reads it all
# (rpma_read), writes its complement back (rpma_write), makes it visible
# (rpma_flush) and disconnects; the server checks every byte through a
# second mapping of the memory. librpma itself registers an 8-byte
# MAP_SHARED anonymous buffer on every connection (its flush's target), so
# every row needs registration of shared memory (docs/MEMORY.md, "Every
# kind of memory").
#   rpma.sh BIN_DIR PROGRAM PORT KIND
# KIND: private | shared | memfd | shm | sysv | file (rpma_pingpong's).
# Both on 127.0.0.1, the server's bind given the device
# (SOFTVERBS_CM_LOOPBACK_DEVICE=1: librpma asks a loopback bind for its
# device, docs/RDMACM.md "Addresses").
. "$(dirname "$0")/lib.sh"
prog=${2:?program}
port=${3:?port}
kind=${4:?kind}
[ -x "$prog" ] || { log "missing $prog"; exit 1; }
compat_setup
export SOFTVERBS_CM_LOOPBACK_DEVICE=1 TMPDIR="$COMPAT_DIR"
size=$((256 * 1024 + 3))
if cm_pair rpma 262 "$port" "$prog" server 127.0.0.1 "$port" "$kind" "$size" \
  -- "$prog" client 127.0.0.1 "$port" "$size"; then
  expect "$SERVER_OUT" '^server PASS$' 1
  expect "$CLIENT_OUT" '^client PASS$' 1
  no_errors 'rpma_pingpong:|ERROR'
fi
finish
