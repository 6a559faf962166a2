#!/bin/bash
# compat.view.*: the device where tools look for it. `softverbs run` gives
# its program /dev/infiniband/uverbs0 and /sys/class/infiniband/sv0 (+
# /sys/class/infiniband_verbs) in a private mount namespace
# (src/tools/view_ns.h, src/tools/sysfs_view.h).
#   view.sh BIN_DIR root|user|no_view|fallback
# root      as root: Debian's ibv_devinfo -v and ibstat (infiniband-diags,
#           which reads sysfs through libibumad) see sv0, its port and GIDs;
#           every GID file equals ibv_devinfo's GID, with its type and a net
#           device; nothing of it is left on the host
# user      the same as uid 65534 (setpriv), in a user namespace with its own
#           uid mapped to itself: the program is still uid 65534 and its own
#           daemon (also 65534's) serves it; skipped where unprivileged user
#           namespaces are off
# no_view   --no-view: no /sys/class/infiniband/sv0, the device still works
# fallback  the namespace refused (test hook SOFTVERBS_VIEW_REFUSE=1): one
#           warning line, the program runs without the view
. "$(dirname "$0")/lib.sh"
mode=${2:?root, user, no_view or fallback}
NOBODY=65534

# as_nobody CMD...: CMD as uid/gid 65534 with no supplementary groups.
as_nobody() { setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups "$@"; }

# check_gids DEVINFO_OUT RUNNER...: each "GID[ i]: G, TYPE" line of
# ibv_devinfo -v matches ports/1/gids/i (the kernel's spelling: eight groups
# of four digits), gid_attrs/types/i and a non-empty gid_attrs/ndevs/i, read
# by a program run by RUNNER.
check_gids() {
  local out=$1 n=0 i gid type want got
  shift
  while read -r i gid type; do
    want=$(python3 -c 'import ipaddress, sys; print(ipaddress.IPv6Address(sys.argv[1]).exploded)' "$gid")
    got=$("$@" cat "/sys/class/infiniband/sv0/ports/1/gids/$i")
    [ "$got" = "$want" ] || fail "gids/$i is '$got', ibv_devinfo says $gid ($want)"
    got=$("$@" cat "/sys/class/infiniband/sv0/ports/1/gid_attrs/types/$i")
    [ "$got" = "$type" ] || fail "gid_attrs/types/$i is '$got', ibv_devinfo says '$type'"
    got=$("$@" cat "/sys/class/infiniband/sv0/ports/1/gid_attrs/ndevs/$i")
    [ -n "$got" ] || fail "gid_attrs/ndevs/$i is empty"
    n=$((n + 1))
  done < <(sed -nE 's/^[[:space:]]+GID\[ *([0-9]+)\]:[[:space:]]+([^,]+), (.*)$/\1 \2 \3/p' "$out")
  [ $n -gt 0 ] || fail "ibv_devinfo -v listed no GID"
}

# check_view RUNNER...: ibv_devinfo, ibstat and the files, through RUNNER
# (a command prefix that ends in `softverbs run --`).
check_view() {
  local out="$COMPAT_DIR/ibv_devinfo" st="$COMPAT_DIR/ibstat"
  # The GID table follows the host's addresses, and each `softverbs run`
  # builds its view when it starts: another test that adds or removes an
  # interface meanwhile (a container, a namespace's veth, an IPv6 address
  # leaving its tentative state) changes the table between two runs. A
  # mismatch is tried again, at most three times a second apart; one that
  # persists is a failure.
  local try saved
  for try in 1 2 3; do
    saved=$_compat_failures
    "$@" ibv_devinfo -v >"$out" 2>&1 || fail "ibv_devinfo -v exited $?"
    grep -Eq '^hca_id:[[:space:]]+sv0$' "$out" || fail "ibv_devinfo: no sv0"
    check_gids "$out" "$@"
    [ "$_compat_failures" -eq "$saved" ] && break
    [ "$try" -lt 3 ] || break
    log "attempt $try: the GID table and the view differed (the host's addresses may have changed): again"
    _compat_failures=$saved
    sleep 1
  done
  "$@" test -c /dev/infiniband/uverbs0 || fail "no character device /dev/infiniband/uverbs0"
  [ "$("$@" cat /sys/class/infiniband_verbs/uverbs0/ibdev)" = sv0 ] || fail "infiniband_verbs/uverbs0/ibdev is not sv0"
  [ "$("$@" cat /sys/class/infiniband_verbs/abi_version)" = 6 ] || fail "infiniband_verbs/abi_version is not 6"
  # The node_guid file and ibv_devinfo agree.
  local guid
  guid=$(sed -nE 's/^[[:space:]]+node_guid:[[:space:]]+([0-9a-f:]+)$/\1/p' "$out")
  [ "$("$@" cat /sys/class/infiniband/sv0/node_guid)" = "$guid" ] || fail "node_guid differs from ibv_devinfo's $guid"
  # The port's net devices (rdma-core's tests/base.py looks there).
  "$@" sh -c 'ls /sys/class/infiniband/sv0/device/net/ | grep -qx lo' || fail "device/net/ has no lo"
  if command -v ibstat >/dev/null 2>&1; then
    "$@" ibstat >"$st" 2>&1 || fail "ibstat exited $?"
    grep -Eq "^CA 'sv0'$" "$st" || fail "ibstat: no CA 'sv0'"
    grep -Eq '^[[:space:]]+Number of ports: 1$' "$st" || fail "ibstat: not one port"
    grep -Eq '^[[:space:]]+State: Active$' "$st" || fail "ibstat: port not Active"
    grep -Eq '^[[:space:]]+Physical state: LinkUp$' "$st" || fail "ibstat: not LinkUp"
    grep -Eq '^[[:space:]]+Link layer: Ethernet$' "$st" || fail "ibstat: link layer not Ethernet"
    grep -Eq '^[[:space:]]+Port GUID: 0x0000ffff7f000001$' "$st" || fail "ibstat: port GUID is not GID 0's"
    grep -Eq "^[[:space:]]+Node GUID: 0x${guid//:/}$" "$st" || fail "ibstat: node GUID is not ibv_devinfo's"
  else
    log "ibstat (infiniband-diags) not installed: not checked"
  fi
  [ "$_compat_failures" -eq 0 ] || { show "ibv_devinfo -v" "$out"; [ -f "$st" ] && show ibstat "$st"; }
  # Nothing of the view is left on the host.
  [ -e /sys/class/infiniband/sv0 ] && fail "/sys/class/infiniband/sv0 exists on the host"
  return 0
}

case $mode in
root)
  [ "$(id -u)" -eq 0 ] || { log "SKIP: needs root"; exit $SKIP; }
  require ibv_devinfo python3
  compat_setup
  check_view "$SV" run --
  ;;
user)
  [ "$(id -u)" -eq 0 ] || { log "SKIP: needs root (to become uid $NOBODY)"; exit $SKIP; }
  require ibv_devinfo python3 setpriv unshare
  if ! as_nobody unshare --user --map-user=$NOBODY --map-group=$NOBODY --mount true 2>/dev/null; then
    log "SKIP: unprivileged user namespaces do not work here"
    exit $SKIP
  fi
  # nobody's own directory and daemon (the compat_setup of lib.sh, as 65534).
  COMPAT_DIR=$(mktemp -d "${TMPDIR:-/tmp}/svcompat.XXXXXX") || exit 1
  chmod 700 "$COMPAT_DIR" && chown $NOBODY:$NOBODY "$COMPAT_DIR"
  trap _compat_cleanup EXIT
  trap 'exit 143' TERM INT
  export SOFTVERBS_DIR="$COMPAT_DIR" SOFTVERBS_NO_SPAWN=1 SOFTVERBSD="$SVD" SOFTVERBS_ROCE=0
  unset XDG_RUNTIME_DIR
  # exec: the pid is the daemon's, which the cleanup kills.
  (cd / && exec setpriv --reuid=$NOBODY --regid=$NOBODY --clear-groups \
    "$SVD" --foreground --idle 0 --dir "$COMPAT_DIR" 2>"$COMPAT_DIR/daemon.stderr") &
  _compat_daemon=$!
  for _ in $(seq 200); do [ -S "$COMPAT_DIR/control" ] && break; sleep 0.05; done
  [ -S "$COMPAT_DIR/control" ] || { log "nobody's softverbsd did not come up"; exit 1; }
  u=$(cd / && as_nobody "$SV" run -- id -u 2>"$COMPAT_DIR/id.err")
  [ "$u" = $NOBODY ] || fail "the program runs as uid '$u', not $NOBODY ($(cat "$COMPAT_DIR/id.err"))"
  if grep -q 'warning' "$COMPAT_DIR/id.err"; then fail "softverbs run warned: $(cat "$COMPAT_DIR/id.err")"; fi
  # Files the programs write go to nobody's directory.
  check_view as_nobody "$SV" run --
  ;;
no_view)
  require ibv_devinfo
  compat_setup
  "$SV" run --no-view -- test -e /sys/class/infiniband/sv0 && fail "--no-view: /sys/class/infiniband/sv0 exists"
  if [ ! -e /dev/infiniband/uverbs0 ]; then
    "$SV" run --no-view -- test -e /dev/infiniband/uverbs0 && fail "--no-view: /dev/infiniband/uverbs0 exists"
  fi
  "$SV" run --no-view -- ibv_devinfo -d sv0 >"$COMPAT_DIR/out" 2>&1 || fail "--no-view: ibv_devinfo exited $?"
  grep -Eq 'PORT_ACTIVE' "$COMPAT_DIR/out" || { fail "--no-view: ibv_devinfo shows no active port"; show ibv_devinfo "$COMPAT_DIR/out"; }
  ;;
fallback)
  require ibv_devinfo
  compat_setup
  SOFTVERBS_VIEW_REFUSE=1 "$SV" run -- sh -c 'echo ran; test ! -e /sys/class/infiniband/sv0' \
    >"$COMPAT_DIR/out" 2>"$COMPAT_DIR/err" || fail "refused namespace: the program failed (exit $?)"
  grep -qx ran "$COMPAT_DIR/out" || fail "refused namespace: the program did not run"
  [ "$(wc -l <"$COMPAT_DIR/err")" -eq 1 ] || fail "refused namespace: not one line on stderr"
  grep -Eq '^softverbs run: warning: no device view \(.*\)' "$COMPAT_DIR/err" || fail "refused namespace: no warning"
  SOFTVERBS_VIEW_REFUSE=1 "$SV" run -- ibv_devinfo -d sv0 >"$COMPAT_DIR/dev" 2>&1 || fail "refused namespace: ibv_devinfo exited $?"
  grep -Eq 'PORT_ACTIVE' "$COMPAT_DIR/dev" || fail "refused namespace: ibv_devinfo shows no active port"
  [ "$_compat_failures" -eq 0 ] || { show stderr "$COMPAT_DIR/err"; show ibv_devinfo "$COMPAT_DIR/dev"; }
  ;;
*) log "unknown mode $mode"; exit 2 ;;
esac
finish
