#!/usr/bin/env bash
# Installs the Debian packages softverbs needs to build, test and demo.
# Usage: scripts/deps.sh [build|test|bench|rxe|package]   (default: test)
# rxe: also qemu and debootstrap, for the Linux rxe peer (scripts/rxe-peer.sh).
# test: also debootstrap, for the Debian package's clean-root test
# (tests/install/deb.sh), qperf, and podman (tests/containers/). package: only what building the Debian packages
# needs (scripts/package.sh, scripts/ci-install.sh on a CI runner).
set -euo pipefail
what=${1:-test}
pkgs=(cmake g++ make pkg-config libgtest-dev libgmock-dev libibverbs-dev ibverbs-utils perftest
      librdmacm-dev rdmacm-utils libfabric-bin ucx-utils libucx-dev
      python3 python3-pyverbs iproute2 procps psmisc clang libclang-rt-14-dev tshark python3-scapy
      systemd dpkg-dev file)
if [ "$what" = package ]; then
  pkgs=(cmake g++ make pkg-config libgtest-dev libgmock-dev libibverbs-dev librdmacm-dev dpkg-dev file)
fi
# qperf: compat.qperf.* (issue 20: 20 runs in a row of each test, in CI).
# podman and what its containers' network needs: containers.podman.* (issue 23);
# uidmap and slirp4netns: rootless podman (containers.podman.rootless, for a user
# with /etc/subuid ranges); infiniband-diags: ibstat in compat.view.* (it reads the device from sysfs).
if [ "$what" = test ]; then pkgs+=(debootstrap qperf infiniband-diags podman runc netavark aardvark-dns containernetworking-plugins iptables catatonit uidmap slirp4netns); fi
if [ "$what" = bench ]; then pkgs+=(python3-matplotlib qperf valgrind); fi
if [ "$what" = rxe ]; then pkgs+=(qemu-system-x86 debootstrap e2fsprogs); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "softverbs: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
