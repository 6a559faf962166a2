#!/bin/bash
# compat.ibv_devices / compat.ibv_devinfo: the device and port as Debian's
# ibverbs-utils see them.
#   devinfo.sh BIN_DIR devices|devinfo
. "$(dirname "$0")/lib.sh"
what=${2:?devices or devinfo}

case $what in
devices)
  require ibv_devices
  compat_setup
  out="$COMPAT_DIR/ibv_devices"
  sv_run ibv_devices >"$out" 2>&1 || fail "ibv_devices exited $?"
  # "    sv0    <16 hex digit node GUID>"
  grep -Eq '^[[:space:]]+sv0[[:space:]]+[0-9a-f]{16}$' "$out" || fail "ibv_devices does not list sv0 with a node GUID"
  [ "$_compat_failures" -eq 0 ] || show ibv_devices "$out"
  ;;
devinfo)
  require ibv_devinfo
  compat_setup
  out="$COMPAT_DIR/ibv_devinfo"
  sv_run ibv_devinfo -v >"$out" 2>&1 || fail "ibv_devinfo -v exited $?"
  check() {  # check DESCRIPTION EXTENDED-REGEX
    grep -Eq "$2" "$out" || fail "ibv_devinfo -v: no $1 (want /$2/)"
  }
  check "hca_id sv0" '^hca_id:[[:space:]]+sv0$'
  check "port 1" '^[[:space:]]+port:[[:space:]]+1$'
  check "PORT_ACTIVE" '^[[:space:]]+state:[[:space:]]+PORT_ACTIVE \(4\)$'
  check "Ethernet link layer" '^[[:space:]]+link_layer:[[:space:]]+Ethernet$'
  check "GID 0 ::ffff:127.0.0.1 RoCE v2" '^[[:space:]]+GID\[ *0\]:[[:space:]]+::ffff:127\.0\.0\.1, RoCE v2$'
  check "phys_port_cnt 1" '^[[:space:]]+phys_port_cnt:[[:space:]]+1$'
  # VLCap 1: VL0 only, as Linux rxe reports it (0 prints "invalid value (0)").
  check "max_vl_num 1" '^[[:space:]]+max_vl_num:[[:space:]]+1 \(1\)$'
  grep -q 'invalid value' "$out" && fail "ibv_devinfo -v: an attribute has an invalid value: $(grep 'invalid value' "$out")"
  # Also the short form.
  sv_run ibv_devinfo -d sv0 -i 1 >"$out.short" 2>&1 || fail "ibv_devinfo -d sv0 -i 1 exited $?"
  grep -Eq '^[[:space:]]+state:[[:space:]]+PORT_ACTIVE' "$out.short" || fail "ibv_devinfo -d sv0 -i 1: port not active"
  [ "$_compat_failures" -eq 0 ] || { show "ibv_devinfo -v" "$out"; show "ibv_devinfo -d sv0 -i 1" "$out.short"; }
  ;;
*) log "unknown mode $what"; exit 2 ;;
esac
finish
