#!/usr/bin/env bash
# The whole test suite: install what is missing, build, run every test
# (unit, verbs, and Debian's own binaries under softverbs), then the same
# gtest suites under ASan+UBSan and under TSan.
# SOFTVERBS_SANITIZERS=0 skips the sanitizer builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
status=0
echo "== build and test (RelWithDebInfo) =="
BUILD_DIR=build scripts/build.sh
(cd build && ctest -j2 --output-on-failure --timeout 120) || status=1
if [ "${SOFTVERBS_SANITIZERS:-1}" != 0 ]; then
  for san in address thread; do
    echo "== build and test with SANITIZE=$san (gtest suites) =="
    BUILD_DIR=build-$san scripts/build.sh -DSANITIZE=$san
    (cd build-$san && ctest -j2 -LE compat --output-on-failure --timeout 300) || status=1
  done
fi
exit $status
