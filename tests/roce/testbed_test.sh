#!/usr/bin/env bash
# scripts/testbed.sh: two hosts reach each other over UDP (IPv4 and IPv6) on
# the veth pair, have no other route, and vanish on `down`. Skipped (77)
# without root.
set -euo pipefail
tb=$1/scripts/testbed.sh
[ "$(id -u)" -eq 0 ] || { echo "not root: skipped"; exit 77; }
export SOFTVERBS_TESTBED=svtbtest$$ SOFTVERBS_TESTBED_NET=$(( $$ % 200 + 20 ))
trap '"$tb" down' EXIT
"$tb" up 2
[ "$(ip netns list | grep -c "^$SOFTVERBS_TESTBED-")" -eq 2 ]
for h in h0 h1; do
  links=$("$tb" exec $h ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort | tr '\n' ' ')
  [ "$links" = "eth0 lo " ] || { echo "$h has links: $links"; exit 1; }
  "$tb" exec $h ip -4 route | grep -q default && { echo "$h has a default route"; exit 1; }
  "$tb" exec $h ip -6 route | grep -q default && { echo "$h has an IPv6 default route"; exit 1; }
  mtu=$("$tb" exec $h cat /sys/class/net/eth0/mtu)
  [ "$mtu" = 1500 ] || { echo "$h mtu $mtu"; exit 1; }
done
a1=$("$tb" addr h1)
a16=$("$tb" addr h1 6)
# Datagrams both ways between the namespaces, as RoCEv2 will send them.
for dst in "$a1" "$a16"; do
  fam=AF_INET; [[ $dst == *:* ]] && fam=AF_INET6
  "$tb" exec h1 /usr/bin/python3 -c "
import socket,sys
s=socket.socket(socket.$fam,socket.SOCK_DGRAM); s.bind(('$dst',4791)); s.settimeout(5)
d,a=s.recvfrom(100); s.sendto(d[::-1],a)" &
  srv=$!
  sleep 0.3
  got=$("$tb" exec h0 /usr/bin/python3 -c "
import socket
s=socket.socket(socket.$fam,socket.SOCK_DGRAM); s.settimeout(5)
s.sendto(b'softverbs',('$dst',4791)); print(s.recvfrom(100)[0].decode())")
  wait $srv
  [ "$got" = sbrevtfos ] || { echo "UDP to $dst: got '$got'"; exit 1; }
done
"$tb" down
[ "$(ip netns list | grep -c "^$SOFTVERBS_TESTBED-" || true)" -eq 0 ]
echo "testbed: ok"
