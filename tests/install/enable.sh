#!/bin/bash
# install.enable (issue 22, item 5): `softverbs enable` / `disable`, the
# machine-wide mode, on a copy of /etc in a private mount namespace (the
# machine's own /etc is never touched: the script that enables runs only
# once the copy is mounted over it), with a private /dev (a tmpfs holding
# bind mounts of the real entries) for the device node.
#   - enable: Debian's ibv_devinfo and rping, unwrapped, load softverbs'
#     libraries and ibv_devinfo lists sv0; the device node
#     /dev/infiniband/uverbs0 (char 1:3) exists, and a tmpfiles.d entry
#     makes it again at boot; enabling twice is harmless;
#   - disable: they load the machine's libibverbs again and sv0 is gone, so
#     are the node and the tmpfiles.d entry;
#   - a user that is not root is refused with what to do;
#   - a machine with RDMA devices of its own (a fake /sys/class/infiniband)
#     is refused, naming them, unless --force.
#   enable.sh BIN_DIR
set -u
bin=$(cd "${1:?usage: $0 BIN_DIR}" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root (the machine-wide mode writes /etc)" >&2; exit 77; }
command -v ibv_devinfo >/dev/null || { echo "SKIP: no ibv_devinfo (ibverbs-utils)" >&2; exit 77; }
unshare --mount --propagation private true 2>/dev/null || { echo "SKIP: no private mount namespace" >&2; exit 77; }
work=$(mktemp -d /tmp/softverbs-enable.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cp -a /etc "$work/etc" 2>/dev/null || fail "cannot copy /etc"
rm -f "$work/etc/ld.so.conf.d/00-softverbs.conf"
mkdir -m 700 "$work/daemon"

cat >"$work/inner.sh" <<INNER
#!/bin/bash
set -u
fail() { echo "FAIL: \$*" >&2; exit 1; }
export SOFTVERBS_DIR=$work/daemon SOFTVERBSD_IDLE=10
[ -e /etc/.softverbs-enable-test ] || fail "not the copy of /etc"
"$bin/softverbs" enable || fail "softverbs enable"
grep -qx "\$(cd "$bin/../lib" && pwd -P)" /etc/ld.so.conf.d/00-softverbs.conf || fail "the file does not name the library directory"
ldd "\$(command -v ibv_devinfo)" | grep -q "libibverbs.so.1 => \$(cd "$bin/../lib" && pwd -P)/libibverbs.so.1" ||
  fail "ibv_devinfo does not load softverbs' libibverbs: \$(ldd "\$(command -v ibv_devinfo)" | grep verbs)"
if command -v rping >/dev/null; then
  ldd "\$(command -v rping)" | grep -q "librdmacm.so.1 => \$(cd "$bin/../lib" && pwd -P)/librdmacm.so.1" ||
    fail "rping does not load softverbs' librdmacm"
fi
ibv_devinfo | grep -q "hca_id:.*sv0" || fail "ibv_devinfo, unwrapped, does not list sv0"
[ -c /dev/infiniband/uverbs0 ] || fail "enable made no character device /dev/infiniband/uverbs0"
[ "\$(stat -c %t:%T /dev/infiniband/uverbs0)" = 1:3 ] || fail "the node is not 1:3 (/dev/null's numbers)"
[ "\$(stat -c %a /dev/infiniband/uverbs0)" = 666 ] || fail "the node is not mode 0666"
grep -qx "c /dev/infiniband/uverbs0 0666 root root - 1:3" /etc/tmpfiles.d/softverbs.conf ||
  fail "no tmpfiles.d entry for the node"
if command -v systemd-tmpfiles >/dev/null; then
  rm /dev/infiniband/uverbs0
  systemd-tmpfiles --create /etc/tmpfiles.d/softverbs.conf || fail "systemd-tmpfiles --create failed"
  [ -c /dev/infiniband/uverbs0 ] || fail "systemd-tmpfiles did not make the node again"
fi
"$bin/softverbs" enable >/dev/null || fail "enabling twice"
"$bin/softverbs" status | grep -q "machine-wide mode: enabled" || fail "status does not say enabled"
"$bin/softverbs" disable || fail "softverbs disable"
[ ! -e /etc/ld.so.conf.d/00-softverbs.conf ] || fail "disable left the file"
[ ! -e /dev/infiniband/uverbs0 ] || fail "disable left the device node"
[ ! -e /etc/tmpfiles.d/softverbs.conf ] || fail "disable left the tmpfiles.d entry"
ldd "\$(command -v ibv_devinfo)" | grep -q "libibverbs.so.1 => $bin" && fail "still softverbs' libibverbs after disable"
ibv_devinfo 2>/dev/null | grep -q "sv0" && fail "sv0 still listed after disable"
"$bin/softverbs" disable | grep -q "not enabled" || fail "disabling twice"
# Not root: refused, nothing written.
if setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$bin/softverbs"; then
  msg=\$(setpriv --reuid=65534 --regid=65534 --clear-groups "$bin/softverbs" enable 2>&1) && fail "nobody enabled it"
  echo "\$msg" | grep -q "run it as root" || fail "no advice for a user: \$msg"
  [ ! -e /etc/ld.so.conf.d/00-softverbs.conf ] || fail "a refused enable wrote the file"
fi
# A machine with RDMA devices of its own.
mount -t tmpfs softverbs-fake-sysclass /sys/class || fail "cannot mount over /sys/class"
mkdir -p /sys/class/infiniband/mlx5_0
msg=\$("$bin/softverbs" enable 2>&1) && fail "enabled over a real device"
echo "\$msg" | grep -q "RDMA devices of its own (mlx5_0)" || fail "the refusal does not name the device: \$msg"
[ ! -e /etc/ld.so.conf.d/00-softverbs.conf ] || fail "a refused enable wrote the file"
"$bin/softverbs" enable --force >/dev/null || fail "enable --force"
"$bin/softverbs" disable >/dev/null || fail "disable after --force"
echo "install.enable: ok"
INNER
chmod +x "$work/inner.sh"
touch "$work/etc/.softverbs-enable-test"
# The private /dev: every real entry bound (or its symlink copied) into a tmpfs
# mounted over /dev, so that the node enable makes is the namespace's only.
cat >"$work/dev.sh" <<'DEV'
set -e
old=$1
mkdir "$old"
mount --rbind /dev "$old"
mount -t tmpfs softverbs-enable-dev /dev
for e in "$old"/* "$old"/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=${e#"$old"/}
  [ "$n" = infiniband ] && continue
  if [ -L "$e" ]; then cp -P "$e" "/dev/$n"
  elif [ -d "$e" ]; then mkdir "/dev/$n"; mount --rbind "$e" "/dev/$n"
  else : >"/dev/$n"; mount --bind "$e" "/dev/$n"
  fi
done
DEV
unshare --mount --propagation private sh -c "mount --bind '$work/etc' /etc && bash '$work/dev.sh' '$work/olddev' && exec '$work/inner.sh'"
