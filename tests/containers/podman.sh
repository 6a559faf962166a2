#!/bin/bash
# containers.podman.*: the softverbs device in real containers (issue 23),
# injected by the container runtime's own mechanism: `softverbs cdi` writes
# a Container Device Interface spec and Debian's podman applies it for
# `--device KIND=sv0`. The image holds Debian's own rdma-core and perftest
# programs and nothing of softverbs (tests/containers/make_image.sh, from
# this machine's files: no registry).
#   podman.sh BIN_DIR CASE
# CASE:
#   device     the container sees /dev/infiniband/uverbs0 and sv0 with its own
#              network namespace's GID (its eth0 address), PORT_ACTIVE
#   sysfs      /sys/class/infiniband/sv0 in the container (the spec's
#              createContainer hook), its GID the container's address, the
#              container's own classes still there; ibstat reads it
#   rdma       iproute2's rdma in the container (the spec's LD_PRELOAD of the
#              RDMA netlink shim): rdma link names sv0/1 with the
#              container's eth0, rdma statistic show lists rxe's counters
#   pingpong   ibv_rc_pingpong between two containers (RoCEv2 over the
#              container network), 1000 iterations on both sides
#   write_bw   ib_write_bw 64 KiB between two containers, a bandwidth line
#   rping      rping (rdma_cm) between two containers, 5 pings verified
#   isolation  a third container's device holds none of the first's objects
#              and cannot reach its daemon
#   peer_dies  the server's container killed in the middle of ib_write_bw:
#              the client ends with an error completion within seconds,
#              does not hang
#   domain     two containers of one trust domain (the spec's --domain
#              device; the second joins the first's pid and network
#              namespaces, as containers of a pod do): one daemon serves
#              both, ib_write_bw 64 KiB between them takes the shared-memory
#              path (no RoCEv2 QP: SOFTVERBS_ROCE_STATS prints nothing)
#   domain_refused  a container that mounts the domain's directory from
#              another pid namespace is refused by its daemon, says why,
#              and the domain goes on
#   users      a pod of containers of different users (the spec's
#              --users-domain device): the holder runs the pod's system
#              daemon as root; a server as nobody and a client as uid 1000
#              in the pod's pid and network namespaces run ib_write_bw 64 KiB
#              and ibv_rc_pingpong, which the daemon carries between the two
#              users (no RoCEv2 QP). The attacks on that daemon are
#              tests/security's (the same daemon, softverbsd --system)
#   users_peer_dies  in that pod, the server's container (nobody) killed in
#              the middle of ib_write_bw: the client (uid 1000) ends with an
#              error completion within seconds, and the pod's daemon then
#              holds nothing of either (no QP, MR, CQ or PD left)
#   rootless   podman run by a user without privileges (rootless: a user
#              namespace from /etc/subuid, slirp4netns): the device and its
#              /sys view, and a trust domain of two containers exchanging
#              ib_write_bw over shared memory. Skipped without a user that
#              has /etc/subuid ranges (SOFTVERBS_ROOTLESS_USER names one)
#   readme     the README's podman command, as written there (IMAGE and
#              the kind substituted), lists sv0
#   walkthrough  docs/CONTAINERS.md's domain examples in their order, with
#              their waits (the page's `listening`) and clean-ups: root's
#              domain A (holder, server, client), removed; the rootless
#              user's domain B written into the same spec (A's device kept);
#              then A given to the user (--owner, after root's daemon left
#              its files there) and used rootless. Skipped without a rootless
#              user, as rootless is
#   memlock    the host's per-container limit: --ulimit memlock=1 MiB lets a
#              64 KiB registration through and refuses a 4 MiB one; the
#              daemon runs in the container's own cgroup
# Root only (podman as root, --runtime runc: crun refuses this machine's
# hybrid cgroups); skipped (77) where podman cannot run a container.
set -u
SKIP=77
BIN_DIR=$(cd "${1:?usage: $0 BIN_DIR CASE}" && pwd)
CASE=${2:?usage: $0 BIN_DIR CASE}
HERE=$(cd "$(dirname "$0")" && pwd)
log() { printf '%s\n' "$*" >&2; }
failures=0
fail() {
  log "FAIL: $*"
  failures=$((failures + 1))
}

[ "$(id -u)" -eq 0 ] || { log "SKIP: podman's containers here need root"; exit $SKIP; }
command -v podman >/dev/null || { log "SKIP: podman is not installed (apt-get install podman runc)"; exit $SKIP; }
command -v runc >/dev/null || { log "SKIP: runc is not installed"; exit $SKIP; }

IMAGE=$("$HERE/make_image.sh") || { log "SKIP: could not build the test image"; exit $SKIP; }
# A kind of this run's own: a softverbs spec installed on the machine (or
# another test's) is left alone.
KIND="softverbs.io/test$$"
SPEC="/var/run/cdi/softverbs-test-$$.json"
names=()
cleanup() {
  local i
  # Newest first: a container joined to another's namespaces must go first.
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do podman rm -f -t 0 "${names[i]}" >/dev/null 2>&1; done
  [ -n "${UCLEAN:-}" ] && su -s /bin/sh "$U" -c "cd /tmp && podman rm -f -t 0 $UCLEAN-srv; podman rm -f -t 0 $UCLEAN" >/dev/null 2>&1
  [ -n "${WALK_SPEC:-}" ] && su -s /bin/sh "$U" -c "cd /tmp && podman rm -f -t 0 --depend sv-$$-wa$$; podman rm -f -t 0 --depend sv-$$-wb$$" >/dev/null 2>&1
  rm -f "$SPEC" ${WALK_SPEC:+"$WALK_SPEC"}
  rm -rf "$DOMAIN_DIR" "$UDOMAIN_DIR" ${WALK_DIRS:-}
}
trap cleanup EXIT
mkdir -p /var/run/cdi
# A trust domain's device of this run (its host directory is removed at the end).
DOMAIN="test$$"
DOMAIN_DIR="/run/softverbs/domains/$DOMAIN"
# A users' domain of this run: a pod of several users' containers.
UDOMAIN="users$$"
UDOMAIN_DIR="/run/softverbs/domains/$UDOMAIN"
"$BIN_DIR/softverbs" cdi --kind "$KIND" --domain "$DOMAIN" --users-domain "$UDOMAIN" --output "$SPEC" >/dev/null ||
  { fail "softverbs cdi failed"; exit 1; }

RUN=(podman run --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --device "$KIND=sv0")
if ! timeout 60 "${RUN[@]}" --rm "$IMAGE" /bin/true 2>/tmp/podman-probe.$$; then
  log "SKIP: podman cannot run a container here: $(tail -n 3 /tmp/podman-probe.$$)"
  rm -f /tmp/podman-probe.$$
  exit $SKIP
fi
rm -f /tmp/podman-probe.$$

# start NAME CMD...: a detached container; prints nothing.
start() {
  local n="sv-$$-$1"
  shift
  names+=("$n")
  "${RUN[@]}" -d --name "$n" "$IMAGE" "$@" >/dev/null || fail "cannot start container $n"
}
ip_of() { podman inspect -f '{{.NetworkSettings.IPAddress}}' "sv-$$-$1"; }
# finish NAME: waits for it (at most 60 s); its exit code; its output in $OUT.
finish() {
  local n="sv-$$-$1" rc
  rc=$(timeout 60 podman wait "$n" 2>/dev/null) || rc=124
  OUT=$(podman logs "$n" 2>&1)
  return "$rc"
}
# domain_start ARGS...: the trust domain of the domain cases. A holder
# container owns the pid and network namespaces (as a pod's infra container
# does); the server, `podman run -d ARGS` (ARGS: options, image, program),
# and later the client are containers joined to them (JOIN), so that
# neither one's exit races the other. DRUN runs a container with the
# domain's device; the server is "dsrv" for finish.
domain_start() {
  DRUN=(podman run --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --device "$KIND=$DOMAIN")
  h="sv-$$-hold"
  names+=("$h")
  "${DRUN[@]}" -d --name "$h" "$IMAGE" /bin/sleep 300 >/dev/null || fail "cannot start $h"
  JOIN=(--pid "container:$h" --network "container:$h")
  local n="sv-$$-dsrv"
  names+=("$n")
  "${DRUN[@]}" -d --name "$n" "${JOIN[@]}" "$@" >/dev/null || fail "cannot start $n"
  sleep 1
}
# users_pod: the users' domain's pod. Its holder runs the pod's system
# daemon as root; the others join its pid and network namespaces (UJOIN),
# each as a user of its own (URUN runs a container with the pod's device).
users_pod() {
  URUN=(podman run --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 --device "$KIND=$UDOMAIN")
  h="sv-$$-uhold"
  names+=("$h")
  # CAP_SYS_PTRACE: the daemon reads its clients' identities and pid
  # namespaces through /proc and their pidfds, which for another user's
  # process takes ptrace's permission (root has it on a host).
  "${URUN[@]}" -d --cap-add SYS_PTRACE --name "$h" "$IMAGE" /opt/softverbs/bin/softverbsd --system --foreground \
    --dir /run/softverbs-domain --idle 0 >/dev/null || fail "cannot start the pod's daemon"
  UJOIN=(--pid "container:$h" --network "container:$h" -e SOFTVERBS_ROCE_STATS=1)
  local i
  for i in $(seq 100); do [ -S "$UDOMAIN_DIR/control" ] && break; sleep 0.1; done
}
# The page's `listening NAME` (docs/CONTAINERS.md), taken from it: waits
# until the perftest server in container NAME listens. SUDO= runs podman as
# the caller; as_u wraps it for the rootless user.
eval "$(sed -n '/^listening() {$/,/^}$/p' "$HERE/../../docs/CONTAINERS.md")"
declare -F listening >/dev/null || { fail "no listening() in docs/CONTAINERS.md"; exit 1; }
# as_who CMD...: CMD as $AS (the rootless user; in /tmp, their home may be
# unreadable), or as root when AS is empty.
AS=""
as_who() {
  if [ -n "$AS" ]; then su -s /bin/sh "$AS" -c "cd /tmp && $(printf '%q ' "$@")"; else "$@"; fi
}
# domain_walk DOMAIN IMAGE: the domain example of docs/CONTAINERS.md as $AS:
# a holder, a server, the page's wait, a client and the page's clean-up;
# fails unless the client prints its bandwidth line and no container of the
# domain is left.
domain_walk() {
  local d=$1 img=$2 r="--runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096" out who=${AS:-root}
  [ -n "$AS" ] && r="--runtime runc --cgroup-manager cgroupfs"
  local h="sv-$$-$d"
  local J="--pid container:$h --network container:$h --device $KIND=$d"
  if [ -n "$AS" ]; then UCLEAN=$h; else names+=("$h" "$h-srv"); fi
  as_who podman run -d --name "$h" $r --device "$KIND=$d" "$img" sleep infinity >/dev/null || fail "$d ($who): no holder"
  as_who podman run -d --name "$h-srv" $r $J "$img" ib_write_bw -s 65536 -n 5000 >/dev/null ||
    fail "$d ($who): no server"
  out=$(SUDO=as_who listening "$h-srv" 2>&1 &&
    as_who timeout 60 podman run --rm $r $J "$img" ib_write_bw -s 65536 -n 5000 127.0.0.1 2>&1)
  log "$d ($who): $out"
  echo "$out" | grep -Eq '^ *65536 +5000 +[0-9.]+ +[0-9.]+' || fail "$d ($who): no bandwidth line"
  as_who podman rm -f -t 0 --depend "$h" >/dev/null || fail "$d ($who): the clean-up failed"
  [ -z "$(as_who podman ps -a -q --filter name="$h")" ] || fail "$d ($who): containers left after the clean-up"
}
# walkthrough: docs/CONTAINERS.md's domain examples in their order.
walkthrough() {
  U=${SOFTVERBS_ROOTLESS_USER:-$(awk -F: 'NR == 1 {print $1}' /etc/subuid 2>/dev/null)}
  if [ -z "$U" ] || ! id "$U" >/dev/null 2>&1 || ! command -v newuidmap >/dev/null; then
    log "SKIP: no user for rootless podman (scripts/rootless-user.sh adds one)"
    exit $SKIP
  fi
  local a="wa$$" b="wb$$" spec="/var/run/cdi/softverbs-walk-$$.json"
  WALK_DIRS="/run/softverbs/domains/$a /run/softverbs/domains/$b"
  WALK_SPEC=$spec
  # The spec of the page's first example: root's domain A.
  "$BIN_DIR/softverbs" cdi --kind "$KIND" --domain "$a" --output "$spec" >/dev/null || fail "cdi --domain $a"
  domain_walk "$a" "$IMAGE"
  # The rootless example: U's own domain B, written into the same spec.
  out=$("$BIN_DIR/softverbs" cdi --kind "$KIND" --domain "$b" --owner "$U" --output "$spec" 2>&1) ||
    fail "cdi --domain $b --owner $U: $out"
  log "$out"
  grep -q "\"name\": \"$a\"" "$spec" || fail "the rootless example's cdi run dropped $a from the spec"
  UIMAGE=$(su -s /bin/sh "$U" -c "cd /tmp && $HERE/make_image.sh") || { log "SKIP: $U cannot build the image"; exit $SKIP; }
  AS=$U domain_walk "$b" "$UIMAGE"
  # Root's domain A, which root's daemon used, given to U and used rootless.
  out=$("$BIN_DIR/softverbs" cdi --kind "$KIND" --domain "$a" --owner "$U" --output "$spec" 2>&1) ||
    fail "cdi --domain $a --owner $U: $out"
  log "$out"
  AS=$U domain_walk "$a" "$UIMAGE"
}
# The GID of the container's eth0 address is index 1 (0 is 127.0.0.1): see
# the device case.
GID=1

case $CASE in
device)
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /bin/sh -c \
    'ls -l /dev/infiniband/uverbs0; ip -4 -br addr show eth0; ibv_devinfo -v' 2>&1)
  log "$out"
  echo "$out" | grep -q '^crw.* 1, *3 .*/dev/infiniband/uverbs0' || fail "no character device /dev/infiniband/uverbs0"
  echo "$out" | grep -q 'hca_id:.*sv0' || fail "ibv_devinfo lists no sv0"
  echo "$out" | grep -q 'PORT_ACTIVE' || fail "port not active"
  addr=$(echo "$out" | awk '$1 == "eth0" || $1 ~ /^eth0@/ {print $3}' | cut -d/ -f1)
  [ -n "$addr" ] || fail "the container has no eth0 address"
  echo "$out" | grep -q "GID\[ *$GID\]:.*::ffff:$addr, RoCE v2" || fail "GID $GID is not the container's own address $addr"
  ;;
rdma)
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /bin/sh -c \
    '[ -x /usr/bin/rdma ] || exit 77; rdma link show -j; echo; rdma link; rdma dev; rdma statistic show; rdma resource show' 2>&1)
  rc=$?
  [ $rc -eq 77 ] && { log "SKIP: no iproute2 rdma on this machine for the image"; exit $SKIP; }
  log "$out"
  echo "$out" | grep -q '"ifname":"sv0","port":1,"state":"ACTIVE",.*"netdev":"eth0"' ||
    fail "rdma link show -j: no sv0/1, active, on the container's eth0"
  echo "$out" | grep -q '^link sv0/1 state ACTIVE physical_state LINK_UP netdev eth0' || fail "rdma link: no sv0/1"
  echo "$out" | grep -Eq '^[0-9]+: sv0: node_type ca ' || fail "rdma dev: no sv0"
  echo "$out" | grep -Eq '^link sv0/1 sent_pkts [0-9]+ rcvd_pkts [0-9]+ .* rdma_recvs [0-9]+' ||
    fail "rdma statistic show: not rxe's counters"
  echo "$out" | grep -Eq '^[0-9]+: sv0: pd [0-9]+ cq [0-9]+ qp [0-9]+ mr [0-9]+' || fail "rdma resource show: no counts"
  ;;
sysfs)
  # The CDI spec's createContainer hook (softverbs cdi-hook) gives the
  # container /sys/class/infiniband/sv0 with its own GIDs, beside the
  # container's real /sys/class entries; ibstat reads it.
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /bin/sh -c \
    'ip -4 -br addr show eth0; cat /sys/class/infiniband/sv0/node_type /sys/class/infiniband/sv0/ports/1/gids/1 \
      /sys/class/infiniband/sv0/ports/1/gid_attrs/types/1 /sys/class/infiniband_verbs/abi_version;
     echo net: $(ls /sys/class/infiniband/sv0/device/net); echo classes: $(ls /sys/class);
     echo netdevs: $(ls /sys/class/net); [ -x /usr/sbin/ibstat ] && /usr/sbin/ibstat' 2>&1)
  log "$out"
  addr=$(echo "$out" | awk '$1 == "eth0" || $1 ~ /^eth0@/ {print $3}' | cut -d/ -f1)
  [ -n "$addr" ] || fail "the container has no eth0 address"
  gid=$(echo "$addr" | awk -F. '{printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4}')
  echo "$out" | grep -qx '1: CA' || fail "no node_type '1: CA' in /sys/class/infiniband/sv0"
  echo "$out" | grep -qx "$gid" || fail "gids/1 is not the container's own address $addr ($gid)"
  echo "$out" | grep -qx 'RoCE v2' || fail "gid_attrs/types/1 is not RoCE v2"
  echo "$out" | grep -q '^net: .*eth0' || fail "device/net does not name eth0"
  echo "$out" | grep -q '^netdevs: .*eth0' || fail "the container's own /sys/class/net is hidden"
  echo "$out" | grep -q '^classes: .*infiniband .*infiniband_verbs.*net' || fail "/sys/class lacks its classes"
  if echo "$out" | grep -q "^CA 'sv0'"; then
    echo "$out" | grep -q 'State: Active' || fail "ibstat: the port is not Active"
  else
    log "(no ibstat in the image: not checked)"
  fi
  ;;
pingpong)
  start srv /usr/bin/ibv_rc_pingpong -g $GID -n 1000
  sleep 1
  ip=$(ip_of srv)
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /usr/bin/ibv_rc_pingpong -g $GID -n 1000 "$ip" 2>&1) || fail "client: $out"
  log "client: $out"
  echo "$out" | grep -q '^1000 iters in' || fail "the client did not complete 1000 iterations"
  finish srv || fail "server exited $?"
  log "server: $OUT"
  echo "$OUT" | grep -q '^1000 iters in' || fail "the server did not complete 1000 iterations"
  ;;
write_bw)
  start srv /usr/bin/ib_write_bw -x $GID -s 65536 -n 5000
  sleep 1
  # SOFTVERBS_ROCE_STATS: a RoCEv2 QP says so when it is destroyed (the
  # domain case relies on its absence).
  out=$(timeout 60 "${RUN[@]}" --rm -e SOFTVERBS_ROCE_STATS=1 "$IMAGE" /usr/bin/ib_write_bw -x $GID -s 65536 -n 5000 \
    "$(ip_of srv)" 2>&1) || fail "client: $out"
  log "$out"
  echo "$out" | grep -Eq '^ *65536 +5000 +[0-9.]+ +[0-9.]+' || fail "no bandwidth line for 65536 B x 5000"
  echo "$out" | grep -q 'softverbs roce: qp' || fail "no RoCEv2 statistics: the QP did not take the wire"
  finish srv || fail "server exited $?"
  ;;
rping)
  start srv /usr/bin/rping -s -a 0.0.0.0 -v -C 5
  sleep 1
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /usr/bin/rping -c -a "$(ip_of srv)" -v -C 5 2>&1) || fail "client: $out"
  log "$out"
  [ "$(echo "$out" | grep -c '^ping data: rdma-ping-')" -eq 5 ] || fail "the client did not get 5 pings back"
  finish srv || fail "server exited $?"
  echo "$OUT" | grep -q 'server ping data: rdma-ping-4' || fail "the server did not see ping 4"
  ;;
isolation)
  # A holds a PD, an MR, CQs and a QP (ibv_rc_pingpong waits for its peer).
  start a /usr/bin/ibv_rc_pingpong -g $GID -n 10
  sleep 1
  mine=$(podman exec "sv-$$-a" /opt/softverbs/bin/softverbs status 2>&1)
  log "A: $mine"
  echo "$mine" | grep -Eq '^ *qps [1-9]' || fail "container A's own device does not hold its QP"
  sock=$(echo "$mine" | sed -n 's/^softverbsd (pid [0-9]*) at \(.*\)$/\1/p')
  [ -n "$sock" ] || fail "no daemon directory in A's status"
  theirs=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /bin/sh -c \
    "ls $sock/control 2>&1; /opt/softverbs/bin/softverbs status 2>&1; ibv_devinfo -v | grep GID" 2>&1)
  log "C: $theirs"
  echo "$theirs" | grep -q "$sock/control: No such file" || fail "container C sees A's daemon socket"
  echo "$theirs" | grep -Eq '^ *qps [1-9]' && fail "container C's device holds a QP"
  aip=$(ip_of a)
  echo "$theirs" | grep -q "::ffff:$aip," && fail "container C's device has A's address $aip as a GID"
  ;;
peer_dies)
  start srv /usr/bin/ib_write_bw -x $GID -s 65536 -D 10
  sleep 1
  ip=$(ip_of srv)
  (sleep 3; podman kill "sv-$$-srv" >/dev/null 2>&1) &
  t0=$(date +%s)
  out=$(timeout 60 "${RUN[@]}" --rm "$IMAGE" /usr/bin/ib_write_bw -x $GID -s 65536 -D 10 "$ip" 2>&1)
  rc=$?
  dt=$(($(date +%s) - t0))
  wait
  log "$out"
  log "client exit $rc after $dt s"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "the client did not fail (exit $rc) when its peer's container died"
  echo "$out" | grep -q 'Failed status 12' || fail "no retry-exceeded error completion (IBV_WC_RETRY_EXC_ERR, 12)"
  [ "$dt" -lt 15 ] || fail "the client took $dt s to notice"
  ;;
domain)
  domain_start -e SOFTVERBS_ROCE_STATS=1 "$IMAGE" /usr/bin/ib_write_bw -s 65536 -n 20000
  out=$(timeout 60 "${DRUN[@]}" --rm "${JOIN[@]}" -e SOFTVERBS_ROCE_STATS=1 "$IMAGE" /bin/sh -c \
    '# until the server listens (it starts the daemon first: slow under load)
     for i in 1 2 3 4 5 6 7 8 9 10; do /opt/softverbs/bin/softverbs status | grep -q "clients [2-9]" && break; sleep 1; done
     /opt/softverbs/bin/softverbs status
     for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/ib_write_bw -s 65536 -n 20000 127.0.0.1 && exit 0; sleep 1; done
     exit 1' 2>&1) || fail "client: $out"
  log "$out"
  echo "$out" | grep -q '^softverbsd (pid [0-9]*) at /run/softverbs-domain' || fail "not the domain's daemon"
  echo "$out" | grep -Eq '^ *clients [2-9]' || fail "the domain's daemon does not serve the server's container too"
  echo "$out" | grep -Eq '^ *65536 +20000 +[0-9.]+ +[0-9.]+' || fail "no bandwidth line for 65536 B x 20000"
  echo "$out" | grep -q 'softverbs roce: qp' && fail "the client's QP took RoCEv2, not shared memory"
  finish dsrv || fail "server exited $?"
  echo "$OUT" | grep -q 'softverbs roce: qp' && fail "the server's QP took RoCEv2, not shared memory"
  log "domain (shared memory): $(echo "$out" | grep -E '^ *65536 +20000')"
  ;;
domain_refused)
  domain_start "$IMAGE" /usr/bin/ibv_rc_pingpong -n 100
  # The domain's directory, mounted from another pid namespace (its network
  # namespace shared, so that nothing but the pid namespace differs).
  out=$(timeout 60 "${DRUN[@]}" --rm --network "container:$h" "$IMAGE" /bin/sh -c \
    '/usr/bin/ibv_devinfo; echo "devinfo exit $?"; /usr/bin/ibv_rc_pingpong -n 100 127.0.0.1; echo "pingpong exit $?"' 2>&1)
  log "outsider: $out"
  echo "$out" | grep -q 'devinfo exit 0' && fail "a container of another pid namespace opened the domain's device"
  echo "$out" | grep -q "serves only its own pid namespace.s processes" || fail "the refusal does not say why"
  echo "$out" | grep -q 'pingpong exit 0' && fail "a container of another pid namespace joined the domain's QP"
  # The domain goes on: its member's peer is served.
  out=$(timeout 60 "${DRUN[@]}" --rm "${JOIN[@]}" "$IMAGE" /bin/sh -c \
    'for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/ibv_rc_pingpong -n 100 127.0.0.1 && exit 0; sleep 1; done; exit 1' 2>&1) ||
    fail "member: $out"
  echo "$out" | grep -q '^100 iters in' || fail "the domain's member did not complete 100 iterations after the refusal"
  finish dsrv || fail "server exited $?"
  ;;
users)
  users_pod
  n="sv-$$-usrv"
  names+=("$n")
  "${URUN[@]}" -d --name "$n" "${UJOIN[@]}" --user 65534:65534 "$IMAGE" /bin/sh -c \
    '/usr/bin/ib_write_bw -s 65536 -n 5000 && /usr/bin/ibv_rc_pingpong -n 1000' >/dev/null || fail "cannot start $n"
  # The client, uid 1000, once the server listens; then the pingpong.
  out=$(timeout 90 "${URUN[@]}" --rm "${UJOIN[@]}" --user 1000:1000 "$IMAGE" /bin/sh -c \
    'for i in 1 2 3 4 5 6 7 8 9 10; do /opt/softverbs/bin/softverbs status | grep -q "qps [1-9]" && break; sleep 1; done
     /opt/softverbs/bin/softverbs status
     for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/ib_write_bw -s 65536 -n 5000 127.0.0.1 && break; sleep 1; done
     for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/ibv_rc_pingpong -n 1000 127.0.0.1 && exit 0; sleep 1; done
     exit 1' 2>&1) || fail "client: $out"
  log "client (uid 1000): $out"
  echo "$out" | grep -q 'served by the system daemon' || fail "the pod's members are not served by its system daemon"
  echo "$out" | grep -Eq '^ *65536 +5000 +[0-9.]+ +[0-9.]+' || fail "no bandwidth line for 65536 B x 5000 between users"
  echo "$out" | grep -q '^1000 iters in' || fail "ibv_rc_pingpong between users did not complete 1000 iterations"
  echo "$out" | grep -q 'softverbs roce: qp' && fail "the client's QP took RoCEv2, not the daemon"
  finish usrv || fail "server (nobody) exited $?"
  log "server (nobody): $OUT"
  echo "$OUT" | grep -q '^1000 iters in' || fail "the server did not complete 1000 iterations"
  echo "$OUT" | grep -q 'softverbs roce: qp' && fail "the server's QP took RoCEv2, not the daemon"
  log "users (daemon-carried): $(echo "$out" | grep -E '^ *65536 +5000')"
  ;;
users_peer_dies)
  users_pod
  n="sv-$$-usrv"
  names+=("$n")
  "${URUN[@]}" -d --name "$n" "${UJOIN[@]}" --user 65534:65534 "$IMAGE" /usr/bin/ib_write_bw -s 65536 -D 10 \
    >/dev/null || fail "cannot start $n"
  # `podman exec` gets the spec's mounts but not its environment.
  ustatus() {
    podman exec -e SOFTVERBS_SYSTEM=1 -e SOFTVERBS_SYSTEM_DIR=/run/softverbs-domain "$h" /opt/softverbs/bin/softverbs status 2>&1
  }
  # Killed two seconds into the transfer: once both QPs exist.
  (for i in $(seq 100); do ustatus | grep -Eq '^ *qps [2-9]' && break; sleep 0.2; done
   sleep 2; podman kill "$n" >/dev/null 2>&1) &
  t0=$(date +%s)
  out=$(timeout 60 "${URUN[@]}" --rm "${UJOIN[@]}" --user 1000:1000 "$IMAGE" /bin/sh -c \
    'for i in 1 2 3 4 5 6 7 8 9 10; do /opt/softverbs/bin/softverbs status | grep -q "qps [1-9]" && break; sleep 0.3; done
     /usr/bin/ib_write_bw -s 65536 -D 10 127.0.0.1; echo "client exit $?"' 2>&1)
  dt=$(($(date +%s) - t0))
  wait
  log "$out"
  log "client done after $dt s"
  echo "$out" | grep -q 'client exit 0' && fail "the client did not fail when its peer's container died"
  echo "$out" | grep -q 'Failed status' || fail "no error completion at the client"
  [ "$dt" -lt 20 ] || fail "the client took $dt s to notice"
  # Both gone: the pod's daemon holds nothing of either.
  left=""
  for i in $(seq 50); do
    left=$(ustatus)
    echo "$left" | grep -Eq '^ *(qps|mrs|cqs|pds) [1-9]' || break
    sleep 0.2
  done
  log "the pod's daemon afterwards: $left"
  echo "$left" | grep -q '^ *clients 1 ' || fail "the pod's daemon still has clients of the dead containers"
  echo "$left" | grep -Eq '^ *(qps|mrs|cqs|pds) [1-9]' && fail "the pod's daemon kept objects of the dead containers"
  ;;
rootless)
  U=${SOFTVERBS_ROOTLESS_USER:-$(awk -F: 'NR == 1 {print $1}' /etc/subuid 2>/dev/null)}
  if [ -z "$U" ] || ! id "$U" >/dev/null 2>&1 || ! command -v newuidmap >/dev/null; then
    log "SKIP: no user for rootless podman (a user with /etc/subuid and /etc/subgid ranges, and newuidmap:"
    log "      apt-get install uidmap slirp4netns; usermod --add-subuids 200000-265535 --add-subgids 200000-265535 USER)"
    exit $SKIP
  fi
  as_u() { su -s /bin/sh "$U" -c "cd /tmp && $*"; }
  # The spec is read by the user's podman; the domain's directory is the user's.
  chmod 644 "$SPEC"
  "$BIN_DIR/softverbs" cdi --kind "$KIND" --domain "$DOMAIN" --owner "$U" --output "$SPEC" >/dev/null ||
    fail "softverbs cdi --owner $U failed"
  chmod 644 "$SPEC"
  UIMAGE=$(as_u "$HERE/make_image.sh") || { log "SKIP: $U cannot build the test image"; exit $SKIP; }
  URUN="podman run --runtime runc --cgroup-manager cgroupfs"
  out=$(as_u "timeout 60 $URUN --rm --device $KIND=sv0 $UIMAGE /bin/sh -c 'ibv_devinfo; cat /sys/class/infiniband/sv0/node_type; ls -l /dev/infiniband/uverbs0'" 2>&1)
  log "rootless sv0: $out"
  if echo "$out" | grep -q 'cannot\|Error'; then
    echo "$out" | grep -q 'hca_id:' || { log "SKIP: rootless podman cannot run a container here"; exit $SKIP; }
  fi
  echo "$out" | grep -q 'hca_id:.*sv0' || fail "rootless: ibv_devinfo lists no sv0"
  echo "$out" | grep -q 'PORT_ACTIVE' || fail "rootless: port not active"
  echo "$out" | grep -qx '1: CA' || fail "rootless: no /sys/class/infiniband/sv0 view"
  echo "$out" | grep -q '^crw.* 1, *3 .*/dev/infiniband/uverbs0' || fail "rootless: no /dev/infiniband/uverbs0"
  # A trust domain of the user's containers: a holder, a server, a client.
  h="sv-$$-uhold"
  UCLEAN=$h
  as_u "$URUN -d --name $h --device $KIND=$DOMAIN $UIMAGE /bin/sleep 300" >/dev/null || fail "rootless: no holder"
  J="--pid container:$h --network container:$h --device $KIND=$DOMAIN -e SOFTVERBS_ROCE_STATS=1"
  as_u "$URUN -d --name $h-srv $J $UIMAGE /usr/bin/ib_write_bw -s 65536 -n 20000" >/dev/null || fail "rootless: no server"
  sleep 1
  out=$(as_u "timeout 60 $URUN --rm $J $UIMAGE /bin/sh -c 'for i in 1 2 3 4 5 6 7 8 9 10; do /usr/bin/ib_write_bw -s 65536 -n 20000 127.0.0.1 && exit 0; sleep 1; done; exit 1'" 2>&1) ||
    fail "rootless client: $out"
  log "rootless domain: $out"
  echo "$out" | grep -Eq '^ *65536 +20000 +[0-9.]+ +[0-9.]+' || fail "rootless: no bandwidth line for 65536 B x 20000"
  echo "$out" | grep -q 'softverbs roce: qp' && fail "rootless: the client's QP took RoCEv2, not shared memory"
  as_u "timeout 60 podman wait $h-srv" >/dev/null 2>&1 || true
  ;;
readme)
  cmd=$(grep -m 1 '^sudo podman run .*--device softverbs.io/rdma=sv0 \$IMAGE ibv_devinfo' "$HERE/../../README.md")
  [ -n "$cmd" ] || { fail "no 'sudo podman run ... \$IMAGE ibv_devinfo' line in README.md"; exit 1; }
  cmd=${cmd#sudo }
  cmd=${cmd/softverbs.io\/rdma=/$KIND=}
  log "README: $cmd"
  out=$(eval "timeout 60 $cmd" 2>&1) || fail "the README's command failed: $out"
  log "$out"
  echo "$out" | grep -q 'hca_id:.*sv0' || fail "the README's command lists no sv0"
  ;;
walkthrough)
  walkthrough
  ;;
memlock)
  out=$(timeout 60 "${RUN[@]}" --rm --ulimit memlock=1048576:1048576 "$IMAGE" /bin/sh -c \
    '/usr/bin/ibv_rc_pingpong -g 1 -s 4194304; echo "4MiB exit $?"
     /usr/bin/ibv_rc_pingpong -g 1 -s 65536 >/dev/null 2>&1 & p=$!; sleep 1
     /opt/softverbs/bin/softverbs status
     for d in /proc/[0-9]*; do echo "cgroup $(cat $d/comm) $(grep -E "^0::|memory" $d/cgroup | head -n 1)"; done
     kill $p' 2>&1)
  log "$out"
  echo "$out" | grep -q "Couldn't register MR" || fail "a 4 MiB registration got past a 1 MiB RLIMIT_MEMLOCK"
  echo "$out" | grep -q '4MiB exit 0' && fail "ibv_rc_pingpong -s 4 MiB did not fail"
  echo "$out" | grep -Eq '^ +[0-9]+ +0 +65536 +1048576$' || fail "no 64 KiB charge against the container's 1 MiB limit"
  d=$(echo "$out" | awk '$1 == "cgroup" && $2 == "softverbsd" {print $3}')
  s=$(echo "$out" | awk '$1 == "cgroup" && $2 == "sh" {print $3}')
  [ -n "$d" ] && [ "$d" = "$s" ] || fail "the daemon is not in the container's cgroup ('$d' vs '$s')"
  ;;
*)
  log "unknown case $CASE"
  exit 2
  ;;
esac
[ "$failures" -eq 0 ] || exit 1
log "PASS: $CASE"
