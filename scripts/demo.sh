#!/usr/bin/env bash
# The main job: install what is missing, build, and run a real RDMA exchange
# between two processes on the softverbs device: Debian's unmodified
# ibv_rc_pingpong, server and client, over RC on GID index 0 (loopback).
# The daemon starts on demand when the server opens the device.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh demo
# Only what the demo runs (the daemon, the tool, the two drop-in libraries),
# sources compiled together: about a minute on 2 CPUs from nothing, where
# the whole tree (tests, benchmarks) takes several; scripts/test.sh builds all.
TARGETS="softverbs softverbsd ibverbs_dropin rdmacm_dropin" scripts/build.sh -DCMAKE_UNITY_BUILD=ON
sv=build/bin/softverbs
echo "== device ==" 
$sv run -- ibv_devices
echo "== ibv_rc_pingpong: server and client on 127.0.0.1, GID index 0, 4 KiB x 1000 =="
port=$((20000 + RANDOM % 10000))
$sv run -- ibv_rc_pingpong -g 0 -p "$port" -n 1000 -s 4096 -c > /tmp/softverbs-demo-server.$$ 2>&1 &
server=$!
ok=1
for i in $(seq 50); do
  if $sv run -- ibv_rc_pingpong -g 0 -p "$port" -n 1000 -s 4096 -c 127.0.0.1; then ok=0; break; fi
  sleep 0.2
done
wait "$server" || ok=1
echo "-- server said:"; cat /tmp/softverbs-demo-server.$$; rm -f /tmp/softverbs-demo-server.$$
echo "== daemon =="
$sv status || true
exit $ok
