#!/usr/bin/env bash
# Installs the Debian packages softverbs needs to build, test and demo.
# Usage: scripts/deps.sh [--print] [build|demo|test|bench|rxe|package]   (default: test)
# build: only what building needs (CMakeLists.txt: a C++20 compiler, CMake,
#   make, <infiniband/verbs.h> and <rdma/rdma_cma.h>, GTest's CMake package;
#   nothing uses gmock, and Debian 12's GTest package does not name it).
# demo: build's, and Debian's ibverbs-utils (ibv_devices, ibv_rc_pingpong)
# that scripts/demo.sh runs.
# test: also what the tests run: rdma-core's and perftest's programs, UCX,
# libfabric, pyverbs, clang (fuzz), tshark and scapy (the wire checks),
# debootstrap and lintian for the Debian package's clean-root test
# (tests/install/deb.sh), qperf, and podman (tests/containers/).
# rxe: also qemu and debootstrap, for the Linux rxe peer (scripts/rxe-peer.sh).
# package: only what building the Debian packages needs (scripts/package.sh,
# scripts/ci-install.sh on a CI runner).
# --print: prints the packages, one a line, and installs nothing.
set -euo pipefail
print=0
if [ "${1:-}" = --print ]; then
  print=1
  shift
fi
what=${1:-test}
build=(cmake g++ make libgtest-dev libibverbs-dev librdmacm-dev)
case $what in
build) pkgs=("${build[@]}") ;;
demo) pkgs=("${build[@]}" ibverbs-utils) ;;
package) pkgs=("${build[@]}" libgmock-dev pkg-config dpkg-dev file) ;;
test | bench | rxe)
  pkgs=("${build[@]}" libgmock-dev pkg-config ibverbs-utils perftest rdmacm-utils libfabric-bin ucx-utils libucx-dev librpma-dev
        python3 python3-pyverbs iproute2 procps psmisc clang libclang-rt-14-dev tshark python3-scapy
        systemd dpkg-dev file)
  ;;
*)
  echo "deps.sh: unknown set '$what'; use build, demo, test, bench, rxe or package" >&2
  exit 2
  ;;
esac
# qperf: compat.qperf.* (issue 20: 20 runs in a row of each test, in CI).
# podman and what its containers' network needs: containers.podman.* (issue 23);
# uidmap and slirp4netns: rootless podman (containers.podman.rootless, for a user
# with /etc/subuid ranges); infiniband-diags: ibstat in compat.view.* (it reads the device from sysfs).
if [ "$what" = test ]; then pkgs+=(debootstrap lintian qperf infiniband-diags podman runc netavark aardvark-dns containernetworking-plugins iptables catatonit uidmap slirp4netns); fi
if [ "$what" = bench ]; then pkgs+=(python3-matplotlib qperf valgrind); fi
if [ "$what" = rxe ]; then pkgs+=(qemu-system-x86 debootstrap e2fsprogs); fi
if [ "$print" = 1 ]; then
  printf '%s\n' "${pkgs[@]}"
  exit 0
fi
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
