#!/usr/bin/env bash
# Configures and builds into BUILD_DIR (default build/). Extra args go to cmake;
# TARGETS (space-separated) builds only those targets instead of all.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} -DSOFTVERBS_WERROR=ON "$@" >/dev/null
# shellcheck disable=SC2086
cmake --build "$dir" -j"$(nproc)" ${TARGETS:+--target $TARGETS}
