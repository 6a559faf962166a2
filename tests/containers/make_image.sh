#!/bin/bash
# Builds (once per content) a container image of Debian's own RDMA programs
# from this machine's files: each program with the libraries ldd names, a
# shell and a few tools. Nothing of softverbs: `softverbs cdi` brings it.
# No registry is used. Prints the image's name.
set -eu
progs=(/usr/bin/ibv_devinfo /usr/bin/ibv_rc_pingpong /usr/bin/ib_write_bw /usr/bin/rping
       /bin/sh /bin/true /bin/sleep /bin/cat /bin/ls /bin/grep /usr/bin/head /usr/sbin/ip)
for p in "${progs[@]}"; do [ -x "$p" ] || { echo "make_image: $p is not installed" >&2; exit 1; }; done
# Optional: the baselines of bench/containers.sh; iproute2's rdma.
for p in /usr/bin/ib_write_lat /usr/bin/qperf /usr/sbin/ibstat /usr/bin/rdma; do [ -x "$p" ] && progs+=("$p"); done
files=()
for p in "${progs[@]}"; do
  files+=("$p")
  while read -r f; do files+=("$f"); done < <(ldd "$p" 2>/dev/null | grep -o '/[^ ]*')
done
# glibc loads libgcc_s at run time (pthread_exit, pthread_cancel), as any
# Debian image has it.
files+=(/lib/x86_64-linux-gnu/libgcc_s.so.1)
tag=$(for f in "${files[@]}"; do readlink -f "$f"; done | sort -u | xargs sha256sum | sha256sum | cut -c1-12)
name="localhost/softverbs-test:$tag"
if podman image exists "$name"; then
  echo "$name"
  exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for f in "${files[@]}"; do
  mkdir -p "$root$(dirname "$f")"
  cp -L "$f" "$root$f"
done
mkdir -p "$root"/{etc,tmp,dev,proc,sys,run,root}
chmod 1777 "$root/tmp"
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"
tar -C "$root" -c . | podman import - "$name" >/dev/null
echo "$name"
