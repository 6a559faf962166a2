#!/bin/bash
# devns.sh: run a command where /dev/infiniband/uverbs0 exists, for verbs
# clients that look for the device node before they open a device.
#   scripts/devns.sh CMD [ARGS...]
#   e.g. scripts/devns.sh build/bin/softverbs run -- ucx_perftest ...
#
# UCX (libuct_ib, 1.13) skips a verbs device unless "/dev/infiniband/" +
# ibv_device.dev_name is a character device it may open for reading and
# writing (stat + access(R_OK|W_OK)); it never opens it, since softverbs has
# no kernel part. softverbs' dev_name is "uverbs0".
#
# The node exists only in a private mount namespace (unshare -m; as a
# non-root user, inside a user namespace too: unshare -rm), so nothing on the
# host changes: /dev is replaced there by a tmpfs holding bind mounts of every
# entry of the real /dev (so /dev/shm, /dev/pts, /dev/null... are the real
# ones) plus infiniband/uverbs0, a bind mount of /dev/null (a read/write
# character device that needs no mknod). The namespace ends with CMD.
#
# Under a user namespace the command runs as uid 0 of that namespace; the
# daemon still sees the real uid (SO_PEERCRED is translated), and
# SOFTVERBS_DIR is fixed before entering so that the same daemon is found.
set -eu
if [ $# -eq 0 ]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi

if [ -z "${_SOFTVERBS_DEVNS:-}" ]; then
  if [ -z "${SOFTVERBS_DIR:-}" ]; then
    if [ -n "${XDG_RUNTIME_DIR:-}" ]; then
      base="$XDG_RUNTIME_DIR/softverbs"
    else
      base="/tmp/softverbs-$(id -u)"
    fi
    # The daemon of this network namespace (src/common/paths.h): BASE if
    # BASE/netns names no other namespace, else BASE/net-INODE-DEV.
    self=$(stat -L -c '%d %i' /proc/self/ns/net 2>/dev/null || true)
    rec=$(cat "$base/netns" 2>/dev/null || true)
    if [ -n "$rec" ] && [ -n "$self" ] && [ "$rec" != "$self" ]; then
      export SOFTVERBS_DIR="$base/net-${self#* }-${self% *}"
    else
      export SOFTVERBS_DIR="$base"
    fi
  fi
  export _SOFTVERBS_DEVNS=1
  if [ "$(id -u)" -eq 0 ]; then
    exec unshare -m --propagation private "$0" "$@"
  fi
  exec unshare -r -m --propagation private "$0" "$@"
fi
unset _SOFTVERBS_DEVNS

stage=$(mktemp -d "${TMPDIR:-/tmp}/svdevns.XXXXXX")
mount -t tmpfs -o mode=755 softverbs-dev "$stage"
shopt -s nullglob dotglob
# bind ENTRY STAGED: STAGED becomes ENTRY (the same inode, not a copy).
bind() {
  if [ -L "$1" ]; then
    cp -P "$1" "$2"
  elif [ -d "$1" ]; then
    mkdir "$2"
    mount --rbind "$1" "$2"
  else
    : >"$2"
    mount --bind "$1" "$2"
  fi
}
for e in /dev/*; do
  n=${e#/dev/}
  # A real /dev/infiniband is rebuilt entry by entry below, so that adding
  # our node never writes into the host's directory.
  [ "$n" = infiniband ] && continue
  bind "$e" "$stage/$n"
done
mkdir "$stage/infiniband"
for e in /dev/infiniband/*; do
  bind "$e" "$stage/infiniband/${e#/dev/infiniband/}"
done
if [ ! -e "$stage/infiniband/uverbs0" ]; then
  : >"$stage/infiniband/uverbs0"
  mount --bind /dev/null "$stage/infiniband/uverbs0"
fi
# A recursive bind, not a move: in a user namespace the inherited mounts are
# locked and a mount may not be moved out from under them.
mount --rbind "$stage" /dev
umount -l "$stage" 2>/dev/null || true
rmdir "$stage" 2>/dev/null || true
exec "$@"
