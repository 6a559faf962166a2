#!/usr/bin/env bash
# A Linux rxe peer for softverbs on one machine (docs/ROCE.md, "Interoperating
# with Linux rxe"): a Debian 12 guest under qemu whose own kernel runs rdma_rxe
# on its eth0, joined by a tap device to a network namespace of this machine
# where softverbs' daemon owns UDP 4791. Nothing leaves the tap link.
#
#   scripts/rxe-peer.sh image        build the guest in $SOFTVERBS_RXE_DIR (default
#                                    /var/tmp/softverbs-rxe): debootstrap from Debian's
#                                    mirror with rdma-core, ibverbs-utils, perftest and
#                                    python3-pyverbs (rdma-core's tests: pyverbs-compare.sh)
#                                    (a few minutes, ~1 GB; kept for later runs)
#   scripts/rxe-peer.sh ready        exit 0 if the guest is built (and current)
#   scripts/rxe-peer.sh up           the namespace, with tap0 10.77.NET.1/24 and fd77:0:0:NET::1/64
#   scripts/rxe-peer.sh boot SHARE   boot the guest (10.77.NET.2, fd77:0:0:NET::2) with the
#                                    folder SHARE at /share; it runs /share/guest.sh (its output
#                                    in /share/guest.log, exit code in /share/guest.rc), then
#                                    powers off; the console goes to SHARE/console.log;
#                                    killed after $SOFTVERBS_RXE_TIMEOUT s (default 1200)
#   scripts/rxe-peer.sh exec CMD...  run CMD in the namespace
#   scripts/rxe-peer.sh pyverbs OUT  up, boot, run rdma-core's tests (run_tests.py -v) on the
#                                    guest's rxe0, their log to OUT, down (timeout default
#                                    3600 s); compared by scripts/pyverbs-compare.sh
#   scripts/rxe-peer.sh down         delete the namespace (and the tap)
#
# SOFTVERBS_TESTBED (default svtb) prefixes the namespace's name ($P-rxehost),
# SOFTVERBS_TESTBED_NET (default 9) picks the subnet. qemu runs with TCG
# (software emulation, ~25 s to boot) unless SOFTVERBS_RXE_ACCEL=kvm: nested KVM
# hung in early boot on the VM this was written on. Needs root, qemu-system-x86,
# debootstrap and e2fsprogs (scripts/deps.sh rxe).
set -euo pipefail
P=${SOFTVERBS_TESTBED:-svtb}
NET=${SOFTVERBS_TESTBED_NET:-9}
NS=$P-rxehost
DIR=${SOFTVERBS_RXE_DIR:-/var/tmp/softverbs-rxe}
# Bump when the guest's init or package list changes: `ready` then says no.
VERSION=4  # 4: python3-pyverbs (rdma-core's tests); 3: rdmacm-utils (rping, ucmatose, udaddy); 2: the init runs /share/.softverbs-init
PACKAGES=linux-image-amd64,rdma-core,ibverbs-utils,ibverbs-providers,perftest,rdmacm-utils,iproute2,kmod,procps,python3-pyverbs

# The guest's init (PID 1), built into the image: no systemd, so that boot
# is quick; it mounts the shared folder and runs what `boot` put there
# (guest_run), so that changing that needs no new image.
guest_init() {
  cat <<'EOF'
#!/bin/sh
PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
modprobe 9pnet_virtio
modprobe 9p
mkdir -p /share
mount -t 9p -o trans=virtio,version=9p2000.L share /share
sh /share/.softverbs-init
sync
echo o > /proc/sysrq-trigger
sleep 30
EOF
}

# What the guest runs at boot: addresses and MTU from the kernel command
# line, rxe0 on eth0, then /share/guest.sh.
guest_run() {
  cat <<'EOF'
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs shm /dev/shm
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
arg() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" /proc/cmdline; }
ip link set lo up
ip link set eth0 mtu "$(arg sv_mtu)" up
ip addr add "$(arg sv_addr4)" dev eth0
ip addr add "$(arg sv_addr6)" dev eth0 nodad
modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0
{
  echo "guest: Linux $(uname -r), rxe0 on eth0 $(arg sv_addr4) $(arg sv_addr6)"
  sh /share/guest.sh
  echo $? > /share/guest.rc
} > /share/guest.log 2>&1
EOF
}

ready() { [ "$(cat "$DIR/ready" 2>/dev/null)" = "$VERSION" ]; }

image() {
  for t in debootstrap mkfs.ext4 qemu-system-x86_64; do
    command -v "$t" >/dev/null || { echo "rxe-peer: $t missing (scripts/deps.sh rxe)" >&2; exit 1; }
  done
  ready && { echo "rxe-peer: guest already built in $DIR" >&2; return; }
  rm -rf "$DIR"
  mkdir -p "$DIR"
  echo "rxe-peer: debootstrap bookworm into $DIR/root (a few minutes)" >&2
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$DIR/root" \
    "${SOFTVERBS_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$DIR/debootstrap.log" 2>&1 ||
    { tail -20 "$DIR/debootstrap.log" >&2; exit 1; }
  guest_init >"$DIR/root/sbin/softverbs-rxe-init"
  chmod 755 "$DIR/root/sbin/softverbs-rxe-init"
  cp "$(ls "$DIR"/root/boot/vmlinuz-* | sort -V | tail -1)" "$DIR/vmlinuz"
  cp "$(ls "$DIR"/root/boot/initrd.img-* | sort -V | tail -1)" "$DIR/initrd.img"
  mkfs.ext4 -q -F -d "$DIR/root" "$DIR/root.img" 3G
  rm -rf "$DIR/root"
  echo "$VERSION" >"$DIR/ready"
  echo "rxe-peer: guest built in $DIR" >&2
}

up() {
  down
  ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" tuntap add dev tap0 mode tap
  ip -n "$NS" link set tap0 mtu "${SOFTVERBS_RXE_MTU:-1500}" up
  ip -n "$NS" addr add "10.77.$NET.1/24" dev tap0
  ip -n "$NS" addr add "fd77:0:0:$NET::1/64" dev tap0 nodad
}

down() { ip netns del "$NS" 2>/dev/null || true; }

boot() {
  local share=$1
  ready || { echo "rxe-peer: no guest in $DIR (scripts/rxe-peer.sh image)" >&2; exit 1; }
  rm -f "$share/guest.rc" "$share/guest.log"
  guest_run >"$share/.softverbs-init"
  # The guest's root is a snapshot: each boot starts from the image as built.
  # Bounded (a guest that hangs would spin a CPU forever); its PID in
  # SHARE/qemu.pid for whoever must stop it early.
  timeout -k 5 "${SOFTVERBS_RXE_TIMEOUT:-1200}" ip netns exec "$NS" qemu-system-x86_64 -pidfile "$share/qemu.pid" -accel "${SOFTVERBS_RXE_ACCEL:-tcg}" -m 1024 -smp 1 \
    -nographic -no-reboot -kernel "$DIR/vmlinuz" -initrd "$DIR/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 quiet panic=1 init=/sbin/softverbs-rxe-init net.ifnames=0 sv_addr4=10.77.$NET.2/24 sv_addr6=fd77:0:0:$NET::2/64 sv_mtu=${SOFTVERBS_RXE_MTU:-1500}" \
    -drive "file=$DIR/root.img,format=raw,if=virtio,snapshot=on" \
    -netdev tap,id=n0,ifname=tap0,script=no,downscript=no -device virtio-net-pci,netdev=n0 \
    -virtfs "local,path=$share,mount_tag=share,security_model=none" >"$share/console.log" 2>&1
  [ -f "$share/guest.rc" ] || { echo "rxe-peer: the guest did not finish (see $share/console.log)" >&2; return 1; }
}

# What the guest runs for `pyverbs`: rdma-core's tests, as Debian's
# python3-pyverbs ships them (some files gzipped), unpacked to /tmp and run
# verbosely on rxe0; the log, headed by the date and the guest's kernel, in
# /share/pyverbs-rxe.log.
guest_pyverbs() {
  cat <<'EOF'
rdma link show
ibv_devices
mkdir -p /tmp/pyverbs
cp -r /usr/share/doc/rdma-core/tests /tmp/pyverbs/
gunzip -r /tmp/pyverbs/tests
cd /tmp/pyverbs
{
  echo "# rdma-core tests (python3-pyverbs $(dpkg-query -W -f='${Version}' python3-pyverbs)) on Linux rxe"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), guest kernel: Linux $(uname -r), rxe0 on eth0 (qemu, scripts/rxe-peer.sh pyverbs)"
  python3 tests/run_tests.py -v 2>&1
  echo "# exit: $?"
} > /share/pyverbs-rxe.log
EOF
}

pyverbs() {
  local out=$1 share rc=0
  share=$(mktemp -d)
  guest_pyverbs >"$share/guest.sh"
  up
  SOFTVERBS_RXE_TIMEOUT=${SOFTVERBS_RXE_TIMEOUT:-3600} boot "$share" || rc=$?
  down
  cp "$share/pyverbs-rxe.log" "$out" || rc=1
  echo "rxe-peer: the guest's files in $share" >&2
  return $rc
}

case "${1:-}" in
  image) image ;;
  ready) ready ;;
  up) up ;;
  down) down ;;
  boot) [ $# -eq 2 ] || { echo "usage: $0 boot SHARE" >&2; exit 2; }; boot "$2" ;;
  pyverbs) [ $# -eq 2 ] || { echo "usage: $0 pyverbs OUT" >&2; exit 2; }; pyverbs "$2" ;;
  exec) shift; exec ip netns exec "$NS" "$@" ;;
  *) sed -n '2,28p' "$0" >&2; exit 2 ;;
esac
