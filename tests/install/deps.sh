#!/bin/bash
# install.deps: `scripts/deps.sh build` installs what building needs and
# nothing the tests alone need; `test` installs all of build's and more.
# What building needs is read from CMakeLists.txt: each header found with
# find_path(... REQUIRED), GTest's CMake package (with the gmock files its
# targets name, where they do), the compiler, cmake and make; each is looked up
# with dpkg -S on this machine and its package must be in build's list.
#   deps.sh SOURCE_DIR
set -u
src=${1:?usage: $0 SOURCE_DIR}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
build=$("$src/scripts/deps.sh" --print build) || { fail "deps.sh --print build failed"; exit 1; }
test=$("$src/scripts/deps.sh" --print test) || { fail "deps.sh --print test failed"; exit 1; }
echo "build: $(echo $build)"
has() { printf '%s\n' $1 | grep -qx -- "$2"; }
for p in clang tshark ucx-utils libucx-dev perftest python3-pyverbs podman qperf; do
  has "$build" "$p" && fail "build installs $p, which only the tests use"
done
for p in $build; do has "$test" "$p" || fail "test does not install build's $p"; done
# scripts/demo.sh runs Debian's ibv_devices and ibv_rc_pingpong after its deps.sh set.
demo_set=$(sed -n 's|^scripts/deps.sh \([a-z]*\)$|\1|p' "$src/scripts/demo.sh")
has "$("$src/scripts/deps.sh" --print "$demo_set")" ibverbs-utils || fail "demo.sh's 'deps.sh $demo_set' lacks ibverbs-utils"
for p in perftest podman lintian debootstrap tshark; do has "$test" "$p" || fail "test does not install $p"; done
command -v dpkg >/dev/null || { echo "SKIP (partly): no dpkg to map files to packages"; [ "$failures" -eq 0 ]; exit; }
# owner FILE: the Debian package that holds FILE.
owner() { dpkg -S "$1" 2>/dev/null | head -n 1 | cut -d: -f1; }
files=()
while read -r h; do files+=("/usr/include/$h"); done < <(
  cat "$src/CMakeLists.txt" "$src/src/CMakeLists.txt" | grep -oE 'find_path\([A-Z_]+ [^ )]+ REQUIRED' | awk '{print $2}')
[ "${#files[@]}" -ge 2 ] || fail "found ${#files[@]} required headers in CMakeLists.txt, expected verbs.h and rdma_cma.h"
grep -q 'find_package(GTest REQUIRED)' "$src/CMakeLists.txt" &&
  files+=("$(dpkg -L libgtest-dev 2>/dev/null | grep -m 1 '/GTestConfig.cmake$')")
# Where GTest's CMake files name gmock's libraries, CMake fails without them.
grep -qs gmock $(dpkg -L libgtest-dev 2>/dev/null | grep '\.cmake$') &&
  files+=("$(dpkg -L libgmock-dev | grep -m 1 'libgmock\.a$')")
files+=("$(readlink -f "$(command -v g++)")" "$(command -v cmake)" "$(command -v make)")
for f in "${files[@]}"; do
  [ -n "$f" ] || { fail "a file CMake needs was not found on this machine"; continue; }
  p=$(owner "$f")
  p=${p%%:*}
  [ -n "$p" ] || { fail "no package holds $f"; continue; }
  # g++'s binary is g++-12's: build names the g++ that depends on it.
  case $p in g++-*) p=g++ ;; cpp-*) p=g++ ;; esac
  has "$build" "$p" && echo "$f: $p" || fail "$f (package $p) is needed to build but deps.sh build does not install $p"
done
[ "$failures" -eq 0 ] || exit 1
echo PASS
