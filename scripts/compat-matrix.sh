#!/bin/bash
# compat-matrix.sh: run unmodified Debian programs on softverbs and write the
# compatibility matrix (docs/COMPAT.md): one row per program and variant,
# pass, fail or skipped, with the reason for the last two.
#
#   scripts/compat-matrix.sh [-b BUILD_DIR] [-o FILE | -n] [-k REGEX]
#     -b  the build tree (default build/; needs softverbs, softverbsd and the
#         libraries: cmake --build build --target softverbs softverbsd
#         ibverbs_dropin rdmacm_dropin)
#     -o  the document whose results table is replaced (default docs/COMPAT.md);
#         -n prints the table instead
#     -k  run only the rows whose id matches REGEX (others are left out)
#
# Each row runs one of the compatibility tests in tests/compat/ (the same
# scripts ctest runs, label compat), one at a time, each with its own daemon
# and SOFTVERBS_DIR. TCP ports: SOFTVERBS_COMPAT_PORT_BASE (default 18600)
# + 200 on, clear of the ctest rows (BASE+1 .. BASE+199), so the two can run
# side by side. A full run takes 5 to 15 minutes, mostly perftest -a
# (perftest measures its clock before every size).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
build="$here/build"
out="$here/docs/COMPAT.md"
only=""
while getopts "b:o:nk:" opt; do
  case $opt in
  b) build=$OPTARG ;;
  o) out=$OPTARG ;;
  n) out="" ;;
  k) only=$OPTARG ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
bin="$build/bin"
[ -x "$bin/softverbs" ] && [ -x "$bin/softverbsd" ] || { echo "no softverbs in $bin (build it first)" >&2; exit 2; }
T="$here/tests/compat"
base=${SOFTVERBS_COMPAT_PORT_BASE:-18600}
port=$((base + 200))
logs=$(mktemp -d "${TMPDIR:-/tmp}/svmatrix.XXXXXX")
trap 'rm -rf "$logs"' EXIT

rows=()   # "id|program|variant|result|reason"
npass=0 nfail=0 nskip=0

# reason LOG: the line that says why a row failed or was skipped.
reason() {
  local log=$1 r
  r=$(grep -m1 '^SKIP: ' "$log" | sed 's/^SKIP: //')
  if [ -z "$r" ]; then
    # A program's own complaint says more than "exit 1"; else the test's.
    r=$(grep -v '^FAIL: \|^softverbs: \|^---\|^-----\|^\*\|^#\|check(s) failed' "$log" |
      grep -m1 -Ei "couldn't|can't|cannot|unable|error|fail|not supported|refus|invalid|killed" |
      sed 's/^[[:space:]]*//')
    [ -n "$r" ] || r=$(grep -m1 '^FAIL: ' "$log" | sed 's/^FAIL: //')
  fi
  r=${r//|/\\|}
  printf '%s' "${r:0:140}"
}

# row ID PROGRAM VARIANT SCRIPT ARGS...: run one row; "@PORT" in ARGS is
# replaced by this row's TCP port.
row() {
  local id=$1 prog=$2 variant=$3 script=$4
  shift 4
  [ -n "$only" ] && ! [[ $id =~ $only ]] && return 0
  local -a args=()
  local a
  for a in "$@"; do args+=("${a//@PORT/$port}"); done
  port=$((port + 1))
  local log="$logs/$id.log" rc result
  printf '%-46s ' "$id" >&2
  COMPAT_TIMEOUT=${ROW_TIMEOUT:-45} "$T/$script" "$bin" "${args[@]}" >"$log" 2>&1
  rc=$?
  case $rc in
  0) result=pass; npass=$((npass + 1)) ;;
  77) result=skipped; nskip=$((nskip + 1)) ;;
  *) result=fail; nfail=$((nfail + 1)) ;;
  esac
  local why=""
  [ "$result" = pass ] || why=$(reason "$log")
  printf '%s %s\n' "$result" "$why" >&2
  rows+=("$id|$prog|$variant|$result|$why")
}

# --- ibverbs-utils ---------------------------------------------------------------
row devinfo ibv_devinfo "-v" devinfo.sh devinfo
row asyncwatch ibv_asyncwatch "device fatal when the daemon dies" asyncwatch.sh
for p in rc uc ud srq; do
  size=4096
  [ $p = ud ] && size=2048
  row "ibv_${p}_pingpong.poll" "ibv_${p}_pingpong" "-g 0 -s $size --chk" rc_pingpong.sh @PORT $size poll 300 "ibv_${p}_pingpong"
  row "ibv_${p}_pingpong.events" "ibv_${p}_pingpong" "-g 0 -s $size --chk -e" rc_pingpong.sh @PORT $size events 300 "ibv_${p}_pingpong"
done
row ibv_xsrq_pingpong.poll ibv_xsrq_pingpong "-g 0 -s 4096" xsrq_pingpong.sh @PORT 4096 poll 100
row ibv_xsrq_pingpong.events ibv_xsrq_pingpong "-g 0 -s 4096 -e" xsrq_pingpong.sh @PORT 4096 events 100

# --- perftest: every program, every transport it may offer, -e, -a --------------
for prog in ib_send_bw ib_send_lat ib_write_bw ib_write_lat ib_read_bw ib_read_lat ib_atomic_bw ib_atomic_lat; do
  mode=default
  [[ $prog == ib_atomic_* ]] && mode=FETCH_AND_ADD
  iters_all=100
  [[ $prog == *_lat ]] && iters_all=20
  # The transports this perftest offers (its --help: "-c, --connection=<RC/XRC/UC/...>");
  # DC and SRD need mlx5 and EFA hardware.
  conns=$("$prog" --help 2>/dev/null | grep -o -- '--connection=<[^>]*>' | grep -oE '\b(RC|UC|UD|XRC)\b')
  [ -n "$conns" ] || conns=RC
  for conn in $conns; do
    row "$prog.$conn" "$prog" "-c $conn" perftest.sh @PORT "$prog" $mode 1000 $conn poll
    row "$prog.$conn.e" "$prog" "-c $conn -e" perftest.sh @PORT "$prog" $mode 1000 $conn events
    # -a: 23 sizes (UD: 12), each after a clock calibration; latency
    # ping-pongs crawl when both sides share a CPU.
    ROW_TIMEOUT=110 row "$prog.$conn.a" "$prog" "-c $conn -a" perftest.sh @PORT "$prog" all $iters_all $conn poll
  done
  if [[ $prog == ib_atomic_* ]]; then
    row "$prog.RC.cas" "$prog" "-c RC -A CMP_AND_SWAP" perftest.sh @PORT "$prog" CMP_AND_SWAP 1000 RC poll
  fi
done

# --- rdma_cm programs (our librdmacm.so.1) -----------------------------------------
for m in rping rping_q rping6 ucmatose ucmatose4 ucmatose_m udaddy rdma_server ib_send_bw ib_write_lat ib_read_bw; do
  row "rdmacm.$m" "$m" "rdma_cm ($m)" rdmacm.sh "$m" @PORT
done
# mckey: receivers, then a sender (-s) on one group (tests/compat/mckey.sh).
declare -A mckey_variant=(
  [ipv4]="-m 239.1.1.1 -b 127.0.0.1: 2 receivers, -s"
  [sendonly]="-m 239.1.1.2 -b 127.0.0.1: 2 receivers, -s -o"
  [ipv6]="-m ff0e::1:2 -b ::1: 2 receivers, -s"
  [sizes]="-c 2 -C 100 -S 4096"
  [noloop]="-l"
  [error]="-m 127.0.0.2 (not multicast)"
)
for m in ipv4 sendonly ipv6 sizes noloop error; do
  row "rdmacm.mckey.$m" mckey "${mckey_variant[$m]}" mckey.sh "$m"
done

# --- UCX 1.13: ucx_perftest over rc_verbs and ud_verbs --------------------------------
for r in rc_verbs.put_lat rc_verbs.put_bw rc_verbs.get rc_verbs.am_lat rc_verbs.fadd rc_verbs.cswap \
  ud_verbs.am_lat ud_verbs.am_bw rc_verbs.tag_lat rc_verbs.tag_bw rc_verbs.ucp_put_bw ud_verbs.tag_lat ud_verbs.tag_bw; do
  row "ucx.$r" ucx_perftest "${r%%.*}: ${r#*.}" ucx.sh @PORT "$r"
done

# --- libfabric 1.17, verbs provider ------------------------------------------------------
row libfabric.fi_info fi_info "-p verbs" fabric.sh fi_info
row libfabric.fi_pingpong.dgram fi_pingpong "-p verbs -e dgram" fabric.sh fi_pingpong_dgram @PORT
row libfabric.fi_pingpong.msg fi_pingpong "-p verbs -e msg (rdma_cm)" rdmacm.sh fi_pingpong @PORT
row libfabric.fi_pingpong.rdm fi_pingpong "-p 'verbs;ofi_rxm' -e rdm" fabric.sh fi_pingpong_rdm @PORT

# --- the table ------------------------------------------------------------------------
table() {
  echo "<!-- matrix: generated by scripts/compat-matrix.sh; do not edit by hand -->"
  echo
  echo "Run $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(nproc) CPUs:" \
    "**$npass pass, $nfail fail, $nskip skipped** of ${#rows[@]} rows."
  echo
  echo "| row | program | variant | result | why (fail/skipped) |"
  echo "| --- | --- | --- | --- | --- |"
  local r id prog variant result why
  for r in "${rows[@]}"; do
    IFS='|' read -r id prog variant result why <<<"$r"
    case $result in pass) result="pass" ;; fail) result="**FAIL**" ;; esac
    echo "| \`$id\` | $prog | \`$variant\` | $result | $why |"
  done
  echo
  echo "<!-- matrix end -->"
}

if [ -z "$out" ]; then
  table
elif [ -f "$out" ] && grep -q '^<!-- matrix: generated' "$out"; then
  # Replace the generated part, keep the prose around it.
  table >"$logs/table.md"
  awk -v t="$logs/table.md" '
    /^<!-- matrix: generated/ { while ((getline l < t) > 0) print l; skip = 1; next }
    /^<!-- matrix end -->/ { skip = 0; next }
    !skip { print }' "$out" >"$logs/new.md" && cp "$logs/new.md" "$out"
  echo "updated $out" >&2
else
  table >"$out"
  echo "wrote $out" >&2
fi
[ "$nfail" -eq 0 ]
