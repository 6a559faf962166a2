#!/usr/bin/env bash
# Builds the Debian packages softverbs and softverbs-dev from this tree
# (CPack's DEB generator, cmake/SoftverbsPackage.cmake) and prints their
# paths. BUILD_DIR (default build-pkg) is configured for /usr (Debian's
# multiarch LIBDIR); only the installed targets are built. Extra args go to
# cmake. Needs scripts/deps.sh package.
#   scripts/package.sh [OUT_DIR]     (default BUILD_DIR/packages)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build-pkg}
out=${1:-$dir/packages}
shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-RelWithDebInfo}" -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON -DSOFTVERBS_BENCH=OFF "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)" --target softverbs softverbsd ibverbs_dropin rdmacm_dropin >/dev/null
mkdir -p "$out"
out=$(cd "$out" && pwd)
cpack --config "$dir/CPackConfig.cmake" -B "$out" >"$dir/cpack.log" 2>&1 || { cat "$dir/cpack.log" >&2; exit 1; }
ls "$out"/softverbs_*.deb "$out"/softverbs-dev_*.deb
