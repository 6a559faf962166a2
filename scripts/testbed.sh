#!/usr/bin/env bash
# A test bed of N "hosts" on one machine: network namespaces joined by veth,
# with private addresses and no route anywhere else (docs/ROCE.md).
#
#   scripts/testbed.sh up [N]          create hosts h0..h(N-1) (default 2)
#   scripts/testbed.sh down            delete them (and everything in them)
#   scripts/testbed.sh exec HOST CMD.. run CMD in host HOST (h0, h1, ...)
#   scripts/testbed.sh addr HOST [6]   print HOST's IPv4 (or IPv6) address
#   scripts/testbed.sh netem           exit 0 if this kernel has netem
#
# Two hosts are one veth pair (h0 eth0 <-> h1 eth0); more hang off a bridge
# in a hub namespace. Host i has 10.77.NET.(i+1)/24 and fd77:0:0:NET::(i+1)/64,
# MTU 1500. Nothing is created in the caller's namespace.
# SOFTVERBS_TESTBED (default "svtb") prefixes the namespace names and
# SOFTVERBS_TESTBED_NET (default 0) picks the subnet, so that test beds of
# parallel test runs do not meet. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
#
# There is no netem in this kernel (checked: "Specified qdisc kind is
# unknown"), so drop/duplicate/reorder is done by the transport's fault hook
# (src/roce/fault.h), not by tc.
set -euo pipefail
P=${SOFTVERBS_TESTBED:-svtb}
NET=${SOFTVERBS_TESTBED_NET:-0}
ns() { echo "$P-$1"; }

hosts() { ip netns list | awk '{print $1}' | grep -E "^$P-h[0-9]+$" | sed "s/^$P-//" | sort -V || true; }

up() {
  local n=${1:-2} i
  [ "$n" -ge 2 ] || { echo "testbed: need at least 2 hosts" >&2; exit 2; }
  down
  for ((i = 0; i < n; i++)); do
    ip netns add "$(ns h$i)"
    ip -n "$(ns h$i)" link set lo up
  done
  if [ "$n" -eq 2 ]; then
    ip link add name eth0 netns "$(ns h0)" type veth peer name eth0 netns "$(ns h1)"
  else
    ip netns add "$(ns hub)"
    ip -n "$(ns hub)" link add br0 type bridge
    ip -n "$(ns hub)" link set br0 up
    for ((i = 0; i < n; i++)); do
      ip link add name eth0 netns "$(ns h$i)" type veth peer name p$i netns "$(ns hub)"
      ip -n "$(ns hub)" link set p$i master br0 mtu 1500 up
    done
  fi
  for ((i = 0; i < n; i++)); do
    local h; h=$(ns h$i)
    ip -n "$h" link set eth0 mtu 1500 up
    ip -n "$h" addr add "10.77.$NET.$((i + 1))/24" dev eth0
    ip -n "$h" addr add "fd77:0:0:$NET::$((i + 1))/64" dev eth0 nodad
  done
}

down() {
  local h
  for h in $(hosts) hub; do
    ip netns del "$(ns "$h")" 2>/dev/null || true
  done
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  down) down ;;
  exec)
    [ $# -ge 3 ] || { echo "usage: $0 exec HOST CMD..." >&2; exit 2; }
    h=$2; shift 2
    exec ip netns exec "$(ns "$h")" "$@" ;;
  addr)
    i=${2#h}
    if [ "${3:-4}" = 6 ]; then echo "fd77:0:0:$NET::$((i + 1))"; else echo "10.77.$NET.$((i + 1))"; fi ;;
  netem)
    probe=$(ns netemprobe)
    ip netns add "$probe"
    trap 'ip netns del "$probe"' EXIT
    ip -n "$probe" link add name pa type veth peer name pb
    tc -n "$probe" qdisc add dev pa root netem loss 1% 2>/dev/null ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
