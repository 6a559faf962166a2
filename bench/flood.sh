#!/usr/bin/env bash
# Another user's ibv_open_device + ibv_reg_mr + 8 B ping-pong while one user
# floods the system daemon, against idle, in interleaved rounds (the fair
# daemon; bench/flood_bench.cc). Needs root (the flooder runs as
# nobody). Writes bench/results/flood.md.
#   bench/flood.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
cmake --build "$build" --target flood_bench softverbsd >/dev/null
out=bench/results/flood.md
{
  echo "# Another user during a flood of the system daemon"
  echo
  echo "$(date -u +%F) on $(nproc) vCPUs, $(uname -r); $rounds interleaved rounds (bench/flood.sh)."
  echo "Setup: ibv_open_device + ibv_alloc_pd + ibv_reg_mr (1 MiB) + teardown, median of 10."
  echo "8 B lat: one-way, RDMA WRITE ping-pong between two threads' RC QPs, median of 2000."
  echo "Flood: user nobody's pipelined mediated 4 MiB RDMA WRITEs on two connections (64 in flight each)."
  echo
  "$build/bench/flood_bench" "$rounds"
} | tee "$out.tmp"
mv "$out.tmp" "$out"
