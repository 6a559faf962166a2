#!/usr/bin/env bash
# RoCEv2 between two hosts of the test bed (network namespaces joined by a
# veth pair, scripts/testbed.sh) beside TCP over the same veth pair, measured
# in the same run: perftest's ib_write_bw / ib_write_lat / ib_send_lat on
# softverbs (each host with its own daemon owning UDP 4791) against qperf's
# tcp_bw / tcp_lat. Prints a markdown table with the ratios and the issue's
# targets (RoCE bandwidth >= 80% of TCP's single stream, latency <= 1.5x
# TCP's). Needs root (namespaces), perftest and qperf.
#
#   bench/roce_vs_tcp.sh [BUILD_DIR [MTU]]   (defaults: build, 1500)
# MTU: the veth pair's (9000: jumbo frames, RoCE path MTU 4096; TCP gets the
# same link).
# Latency figures are one-way (perftest and qperf both report half the
# round trip). Run it on an idle machine: the ratios drift with load.
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
mtu=${2:-1500}
bin=$build/bin
tb=$PWD/scripts/testbed.sh
[ "$(id -u)" -eq 0 ] || { echo "roce_vs_tcp: needs root (network namespaces)" >&2; exit 2; }
for p in ib_write_bw ib_write_lat ib_send_lat qperf; do
  command -v $p >/dev/null || { echo "roce_vs_tcp: $p is not installed" >&2; exit 2; }
done
export SOFTVERBS_TESTBED=svb$$ SOFTVERBS_TESTBED_NET=$(($$ % 200 + 20))
work=$(mktemp -d /tmp/svroce-bench.XXXXXX)
chmod 711 "$work"
daemons=()
cleanup() {
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  "$tb" down >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '[roce_vs_tcp] %s\n' "$*" >&2; }

step "test bed up"
"$tb" up 2 >/dev/null || { echo "roce_vs_tcp: cannot create the test bed" >&2; exit 2; }
a1=$("$tb" addr h1)
for h in h0 h1; do "$tb" exec $h ip link set eth0 mtu "$mtu" || exit 2; done
for h in h0 h1; do
  mkdir -m 700 "$work/$h"
  SOFTVERBS_ROCE=1 "$tb" exec $h "$bin/softverbsd" --foreground --idle 0 --dir "$work/$h" 2>"$work/$h.log" &
  daemons+=($!)
done
for h in h0 h1; do
  for _ in $(seq 100); do [ -S "$work/$h/control" ] && break; sleep 0.05; done
done
on() {
  local h=$1
  shift
  SOFTVERBS_DIR=$work/$h SOFTVERBS_NO_SPAWN=1 "$tb" exec "$h" "$bin/softverbs" run -- timeout 120 "$@"
}

# perftest PROGRAM ARGS...: server in h1, client in h0; the client's output.
port=19500
perftest() {
  local prog=$1
  shift
  port=$((port + 1))
  on h1 "$prog" -x 1 -p $port "$@" >"$work/srv.out" 2>&1 &
  local s=$!
  sleep 0.5
  on h0 "$prog" -x 1 -p $port "$@" "$a1" 2>&1
  wait $s
}

step "softverbs RoCEv2: ib_write_bw 64 KiB and 1 MiB"
bw64=$(perftest ib_write_bw -s 65536 -D 3 | awk '$1 == 65536 {print $4}')
bw1m=$(perftest ib_write_bw -s 1048576 -D 3 | awk '$1 == 1048576 {print $4}')
step "softverbs RoCEv2: ib_write_lat and ib_send_lat 8 B"
wlat=$(perftest ib_write_lat -s 8 -n 5000 | awk '$1 == 8 {print $5}')
slat=$(perftest ib_send_lat -s 8 -n 5000 | awk '$1 == 8 {print $5}')

step "TCP over the same veth: qperf tcp_bw 64 KiB and 1 MiB, tcp_lat 8 B"
"$tb" exec h1 qperf >/dev/null 2>&1 &
qs=$!
sleep 0.5
qp() { "$tb" exec h0 qperf "$a1" -t 3 "$@" 2>&1; }
# qperf prints "bw  =  1.23 GB/sec" (or MB/sec) and "latency  =  12.3 us".
to_mbs() { awk '$1 == "bw" && $2 == "=" {v=$3; u=$4; if (u ~ /^GB/) v*=1000; if (u ~ /^KB/) v/=1000; print v; exit}'; }
to_us() { awk '$1 == "latency" && $2 == "=" {v=$3; u=$4; if (u ~ /^ms/) v*=1000; if (u ~ /^ns/) v/=1000; print v; exit}'; }
tbw64=$(qp -m 65536 tcp_bw | to_mbs)
tbw1m=$(qp -m 1048576 tcp_bw | to_mbs)
tlat=$(qp -m 8 tcp_lat | to_us)
kill $qs 2>/dev/null

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "n/a"; else printf "%.2f", a / b }'; }
verdict() { awk -v r="$1" -v t="$2" -v dir="$3" 'BEGIN { if (r == "n/a") print "no number"; else if ((dir == "ge" && r >= t) || (dir == "le" && r <= t)) print "met"; else print "not met" }'; }
r64=$(ratio "$bw64" "$tbw64")
r1m=$(ratio "$bw1m" "$tbw1m")
rw=$(ratio "$wlat" "$tlat")
rs=$(ratio "$slat" "$tlat")
echo "## RoCEv2 between two namespaces vs TCP over the same veth pair (MTU $mtu)"
echo
echo "| measure | softverbs RoCEv2 | TCP (qperf) | ratio | target | verdict |"
echo "| --- | --- | --- | --- | --- | --- |"
echo "| bandwidth 64 KiB (MB/s) | $bw64 (ib_write_bw) | $tbw64 (tcp_bw) | $r64 | >= 0.80 | $(verdict "$r64" 0.8 ge) |"
echo "| bandwidth 1 MiB (MB/s) | $bw1m (ib_write_bw) | $tbw1m (tcp_bw) | $r1m | >= 0.80 | $(verdict "$r1m" 0.8 ge) |"
echo "| latency 8 B one-way (us) | $wlat (ib_write_lat) | $tlat (tcp_lat) | $rw | <= 1.5 | $(verdict "$rw" 1.5 le) |"
echo "| latency 8 B one-way (us) | $slat (ib_send_lat) | $tlat (tcp_lat) | $rs | <= 1.5 | $(verdict "$rs" 1.5 le) |"
