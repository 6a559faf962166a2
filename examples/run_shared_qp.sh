#!/usr/bin/env bash
# Runs the shared-QP server with two clients and checks that both greetings
# arrived through the one QP they share.
set -euo pipefail
server=$1 client=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"; kill $spid 2>/dev/null || true' EXIT
export SOFTVERBS_DIR=$dir/sv SOFTVERBSD_IDLE=3
"$server" "$dir/sock" 2 > "$dir/server.out" 2>&1 &
spid=$!
for i in $(seq 100); do [ -S "$dir/sock" ] && break; sleep 0.05; done
"$client" "$dir/sock" 0
"$client" "$dir/sock" 1
wait $spid
cat "$dir/server.out"
grep -q "client 0 wrote: hello from client 0" "$dir/server.out"
grep -q "client 1 wrote: hello from client 1" "$dir/server.out"
echo "shared QP example: ok"
