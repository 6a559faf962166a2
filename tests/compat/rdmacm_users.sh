#!/bin/bash
# compat.rdmacm.users: rdma_cm between users of one host, through the system
# daemon (softverbsd --system, docs/RDMACM.md "Users"): the port space is the
# host's, as on Linux. Debian's rping: a server as root and a client as
# nobody (uid 65534), then the other way round; each side checks the data
# (-v prints every ping). A port below 1024 is refused to nobody (EACCES,
# as Linux's CAP_NET_BIND_SERVICE rule). Needs root; skipped otherwise.
#   rdmacm_users.sh BIN_DIR PORT
set -u
USERS_NEEDS="rping"
. "$(dirname "$0")/users_lib.sh"

# run NAME SERVER_USER CLIENT_USER: rping -C 5 -v; both must pass.
run() {
  local name=$1 su=$2 cu=$3 port=$4 s c
  local -a srv=("$BIN/softverbs" run -- timeout 30 rping -s -v -C 5 -p "$port" -a 127.0.0.1)
  local -a cli=("$BIN/softverbs" run -- timeout 30 rping -c -v -C 5 -p "$port" -a 127.0.0.1)
  if [ "$su" = nobody ]; then as_nobody "${srv[@]}"; else "${srv[@]}"; fi >"$work/$name.server" 2>&1 &
  s=$!
  pids+=($s)
  for _ in $(seq 200); do [ -S "$sysdir/cm/262-$port-127.0.0.1" ] && break; sleep 0.05; done
  [ -S "$sysdir/cm/262-$port-127.0.0.1" ] || fail "$name: the server's rendezvous socket did not appear"
  if [ "$cu" = nobody ]; then as_nobody "${cli[@]}"; else "${cli[@]}"; fi >"$work/$name.client" 2>&1
  c=$?
  wait $s
  s=$?
  [ $s -eq 0 ] && [ $c -eq 0 ] || fail "$name: server exit $s, client exit $c"
  [ "$(grep -c '^server ping data: rdma-ping-' "$work/$name.server")" -eq 5 ] || fail "$name: the server did not see 5 pings"
  [ "$(grep -c '^ping data: rdma-ping-' "$work/$name.client")" -eq 5 ] || fail "$name: the client did not see 5 pings"
  if [ $failures -ne 0 ]; then
    log "----- $name.server:"; cat "$work/$name.server" >&2
    log "----- $name.client:"; cat "$work/$name.client" >&2
  fi
}

run root_serves_nobody root nobody "$PORT"
run nobody_serves_root nobody root $((PORT + 1))
# The daemon holds the ports: only it writes the directory.
[ "$(stat -c %a "$sysdir/cm")" = 755 ] || fail "the rendezvous directory is not 755"

# A privileged port: refused to nobody, at rdma_bind_addr.
as_nobody "$BIN/softverbs" run -- timeout 10 rping -s -C 1 -p 999 -a 127.0.0.1 >"$work/low.out" 2>&1
rc=$?
[ $rc -ne 0 ] || fail "nobody listened on port 999"
grep -qi "bind" "$work/low.out" || { fail "nobody's rping on port 999 did not fail at bind"; cat "$work/low.out" >&2; }
[ -e "$sysdir/cm/262-999-127.0.0.1" ] && fail "a rendezvous socket for port 999 exists"

[ $failures -eq 0 ] && log "PASS" && exit 0
exit 1
