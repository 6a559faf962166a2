#!/usr/bin/env bash
# RoCEv2 between two hosts of the test bed (network namespaces joined by a
# veth pair, scripts/testbed.sh) beside TCP over the same veth pair, measured
# in the same run: perftest's ib_write_bw / ib_write_lat / ib_send_lat on
# softverbs (each host with its own daemon owning UDP 4791) against qperf's
# tcp_bw / tcp_lat, and the kernel alone carrying our datagram layout with no
# RDMA work (bench/udp_ceiling, from BUILD_DIR/bench). Bandwidth with one QP
# (one TCP stream) and with QPS (default 4) QPs (ib_write_bw -q; as many
# qperf streams at once), each with its cost in bytes per busy CPU-second
# (see "Cost per byte" below). Prints a markdown table with the ratios and
# the targets (RoCE bandwidth >= 80% of TCP's single stream, latency at
# most TCP's, bytes per busy CPU-second of the whole machine at least
# TCP's, one QP). Needs root (namespaces, a cpuacct
# cgroup), perftest and qperf. DUR (default 5): seconds per bandwidth run.
#
#   bench/roce_vs_tcp.sh [BUILD_DIR [MTU]]   (defaults: build, 1500)
# MTU: the veth pair's (9000: jumbo frames, RoCE path MTU 4096; TCP gets the
# same link).
# Latency figures are one-way (perftest and qperf both report half the
# round trip).
#
# ROUNDS (default 3) rounds, each measuring every figure of both stacks one
# after the other, so that both see the same machine: the table gives each
# figure's median over the rounds, the ratio of the medians, and the range of
# the rounds' own ratios (this VM's speed drifts by tens of percent from
# minute to minute, for TCP as well). Writes the table and every round's
# numbers to bench/results/roce_vs_tcp_mtu<MTU>.md and a plot to
# roce_vs_tcp_mtu<MTU>.png (with Debian's python3-matplotlib).
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
mtu=${2:-1500}
rounds=${ROUNDS:-3}
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
qss=()
cleanup() {
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "${qs:-}" ] && kill "$qs" 2>/dev/null
  for p in "${qss[@]}"; do kill "$p" 2>/dev/null; done
  "$tb" down >/dev/null 2>&1
  if [ -n "${cg:-}" ]; then
    echo $$ >/sys/fs/cgroup/cpuacct/cgroup.procs
    for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
# Everything this script starts runs in a cpuacct cgroup of its own (see
# "Cost per byte" below); none if cgroup v1's cpuacct is not there.
cg=/sys/fs/cgroup/cpuacct/svroce$$
if mkdir "$cg" 2>/dev/null && echo $$ >"$cg/cgroup.procs"; then :; else cg=; fi
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

# qperf prints "bw  =  1.23 GB/sec" (or MB/sec) and "latency  =  12.3 us".
to_mbs() { awk '$1 == "bw" && $2 == "=" {v=$3; u=$4; if (u ~ /^GB/) v*=1000; if (u ~ /^KB/) v/=1000; print v; exit}'; }
to_us() { awk '$1 == "latency" && $2 == "=" {v=$3; u=$4; if (u ~ /^ms/) v*=1000; if (u ~ /^ns/) v/=1000; print v; exit}'; }
"$tb" exec h1 qperf >/dev/null 2>&1 &
qs=$!
sleep 0.5
qp() { "$tb" exec h0 qperf "$a1" -t 3 "$@" 2>&1; }

# ceiling: the kernel alone carrying our datagram layout (bench/udp_ceiling.cc)
# for 3 s, MB/s of payload received; "-" without the tool.
ceil_bin=$build/bench/udp_ceiling
ceiling() {
  [ -x "$ceil_bin" ] || { echo -; return; }
  local pl=$((mtu >= 4096 + 100 ? 4096 : mtu >= 2048 + 100 ? 2048 : 1024)) out=$work/ceil.out  # the path MTU softverbs picks
  "$tb" exec h1 "$ceil_bin" recv 19499 10 >"$out" 2>&1 &
  local r=$!
  for _ in $(seq 50); do grep -q listening "$out" 2>/dev/null && break; sleep 0.05; done
  "$tb" exec h0 "$ceil_bin" send "$a1" 19499 3 "$pl" >/dev/null 2>&1
  wait $r
  awk '$1 == "udp_ceiling" && $2 == "MB/s" {print $3; exit}' "$out" | grep . || echo -
}

# Cost per byte: bytes moved per busy CPU-second, two ways, both sampled
# from 1 s after a bandwidth run (DUR s) starts to 1 s before it ends, when
# the traffic is steady: bytes per busy CPU-second = bandwidth / busy CPUs.
# - machine: the whole machine's busy time (/proc/stat's first line: user,
#   nice, system, irq, softirq; idle, iowait and steal are not busy), both
#   hosts and the kernel included, since the two namespaces share it; other
#   processes on the machine count too.
# - own: the CPU time of this script's processes (a cpuacct cgroup of their
#   own: the daemons, perftest, qperf, with the kernel's work in their
#   context, softirqs included as this kernel has no IRQ_TIME_ACCOUNTING)
#   plus the ksoftirqd threads' (softirqs deferred to them, whoever caused
#   them): what a busy machine's other load does not blur.
dur=${DUR:-5}
nq=${QPS:-4}
hz=$(getconf CLK_TCK)
busy_now() { awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8; exit}' /proc/stat; }
# ns of CPU: the cgroup's and the ksoftirqd threads'
own_now() {
  local ks=0 p
  for p in $(pgrep -x 'ksoftirqd/[0-9]+'); do
    ks=$((ks + $(awk '{print $14 + $15}' /proc/$p/stat 2>/dev/null || echo 0)))
  done
  echo $(( $(cat "$cg/cpuacct.usage") + ks * 1000000000 / hz ))
}
# cost CMD...: run CMD (a bandwidth run of $dur s), print its output, and
# write "machine own" busy CPUs of the middle of the run to $work/busy.
cost() {
  local out=$work/cost.out
  "$@" >"$out" 2>&1 &
  local c=$!
  sleep 1
  local b0 t0 o0 b1 t1 o1
  b0=$(busy_now) t0=$(date +%s.%N) o0=$([ -n "$cg" ] && own_now || echo 0)
  sleep $((dur - 2))
  b1=$(busy_now) t1=$(date +%s.%N) o1=$([ -n "$cg" ] && own_now || echo 0)
  wait $c
  awk -v b0="$b0" -v b1="$b1" -v t0="$t0" -v t1="$t1" -v hz="$hz" -v o0="$o0" -v o1="$o1" -v cg="$cg" \
    'BEGIN {w = t1 - t0; printf "%.3f %s\n", (b1 - b0) / hz / w, cg == "" ? "-" : sprintf("%.3f", (o1 - o0) / 1e9 / w)}' >"$work/busy"
  cat "$out"
}
# perftest's MB is 2^20 bytes, qperf's 10^6: everything below is 10^6.
mib_to_mb() { awk '{printf "%.1f\n", $1 * 1.048576}'; }
# rdma_bw SIZE QPS -> "MB/s machine_busy_cpus own_busy_cpus"
rdma_bw() {
  local bw
  bw=$(cost perftest ib_write_bw -s "$1" -q "$2" -D "$dur" | awk -v s="$1" '$1 == s {print $4}' | mib_to_mb)
  echo "${bw:--} $(cat "$work/busy")"
}
# tcp_streams SIZE STREAMS -> "MB/s busy_cpus": STREAMS qperf clients at once,
# each to its own server, their bandwidths summed.
tcp_streams() {
  local i
  for i in $(seq "$2"); do
    "$tb" exec h0 qperf "$a1" -lp $((19700 + i)) -t "$dur" -m "$1" tcp_bw >"$work/tcp$i.out" 2>&1 &
  done
  wait
  for i in $(seq "$2"); do to_mbs <"$work/tcp$i.out"; done | awk '{s += $1; n++} END {if (n) print s}'
}
tcp_bw() {
  local bw
  bw=$(cost tcp_streams "$1" "$2")
  echo "${bw:--} $(cat "$work/busy")"
}
or_dash() { [ -n "$1" ] && echo "$1" || echo -; }
qss=()
for i in $(seq "$nq"); do
  "$tb" exec h1 qperf -lp $((19700 + i)) >/dev/null 2>&1 &
  qss+=($!)
done

# One line per round, "key value" pairs: bw_<stack>_<size>_q<n> (MB/s) and
# cpu_<stack>_<size>_q<n> (busy CPUs), wlat slat tlat (us), ceil (MB/s).
rows=$work/rows
: >"$rows"
for r in $(seq "$rounds"); do
  line=""
  for q in 1 "$nq"; do
    for s in 65536 1048576; do
      step "round $r of $rounds: ib_write_bw -q $q / $q tcp_bw stream(s), $s B"
      read -r b c o <<<"$(rdma_bw "$s" "$q")"
      line+=" bw_roce_${s}_q$q $b cpu_roce_${s}_q$q $c own_roce_${s}_q$q $o"
      read -r b c o <<<"$(tcp_bw "$s" "$q")"
      line+=" bw_tcp_${s}_q$q $b cpu_tcp_${s}_q$q $c own_tcp_${s}_q$q $o"
    done
  done
  line+=" ceil $(ceiling)"
  step "round $r of $rounds: ib_write_lat, ib_send_lat / tcp_lat 8 B"
  wlat=$(perftest ib_write_lat -s 8 -n 5000 | awk '$1 == 8 {print $5}')
  slat=$(perftest ib_send_lat -s 8 -n 5000 | awk '$1 == 8 {print $5}')
  tlat=$(qp -m 8 tcp_lat | to_us)
  line+=" wlat $(or_dash "$wlat") slat $(or_dash "$slat") tlat $(or_dash "$tlat")"
  echo "${line# }" >>"$rows"
  step "round $r: $(tail -1 "$rows")"
done

mkdir -p bench/results
out=bench/results/roce_vs_tcp_mtu$mtu
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3  # Debian's, with matplotlib
"$py" - "$rows" "$mtu" "$rounds" "$out" "$nq" "$dur" <<'PY'
import statistics, sys, datetime, platform, os
rows_file, mtu, rounds, out, nq, dur = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
num = lambda v: None if v == "-" else float(v)
rows = []
for l in open(rows_file):
    t = l.split()
    rows.append({t[i]: num(t[i + 1]) for i in range(0, len(t) - 1, 2)})
col = lambda k: [r.get(k) for r in rows]
med = lambda c: statistics.median([v for v in c if v is not None]) if any(v is not None for v in c) else None
# bytes per busy CPU-second (MB per CPU-s) of each round for a bandwidth key
def per_cpu(stack, sz, q, which="cpu"):
    return [b / c if b is not None and c else None for b, c in zip(col(f"bw_{stack}_{sz}_q{q}"), col(f"{which}_{stack}_{sz}_q{q}"))]
series = {}
for q in ("1", nq):
    for sz, name in (("65536", "64 KiB"), ("1048576", "1 MiB")):
        for st in ("roce", "tcp"):
            series[f"bw_{st}_{sz}_q{q}"] = col(f"bw_{st}_{sz}_q{q}")
            series[f"pc_{st}_{sz}_q{q}"] = per_cpu(st, sz, q)
            series[f"po_{st}_{sz}_q{q}"] = per_cpu(st, sz, q, "own")
            series[f"cpu_{st}_{sz}_q{q}"] = col(f"cpu_{st}_{sz}_q{q}")
            series[f"own_{st}_{sz}_q{q}"] = col(f"own_{st}_{sz}_q{q}")
for k in ("wlat", "slat", "tlat", "ceil"):
    series[k] = col(k)
# (label, ours, theirs, our tool, their tool, direction, target). Targets:
# bandwidth >= 0.8x TCP, latency at most TCP's, bytes per busy CPU-second
# at least TCP's at MTU 1500, one QP.
measures = []
for q in ("1", nq):
    qs = "1 QP / 1 stream" if q == "1" else f"{q} QPs / {q} streams"
    for sz, name in (("65536", "64 KiB"), ("1048576", "1 MiB")):
        measures.append((f"bandwidth {name}, {qs} (MB/s)", f"bw_roce_{sz}_q{q}", f"bw_tcp_{sz}_q{q}", f"ib_write_bw -q {q}", "tcp_bw", "ge", 0.8 if q == "1" else None))
        measures.append((f"bytes per busy CPU-second {name}, {qs}, machine (MB/CPU-s)", f"pc_roce_{sz}_q{q}", f"pc_tcp_{sz}_q{q}", f"ib_write_bw -q {q}", "tcp_bw", "ge", 1.0 if q == "1" else None))
        measures.append((f"bytes per busy CPU-second {name}, {qs}, own (MB/CPU-s)", f"po_roce_{sz}_q{q}", f"po_tcp_{sz}_q{q}", f"ib_write_bw -q {q}", "tcp_bw", "ge", None))
measures += [("latency 8 B one-way (us)", "wlat", "tlat", "ib_write_lat", "tcp_lat", "le", 1.0),
             ("latency 8 B one-way (us)", "slat", "tlat", "ib_send_lat", "tcp_lat", "le", 1.0),
             ("1 MiB against the kernel alone (MB/s)", "bw_roce_1048576_q1", "ceil", "ib_write_bw", "udp_ceiling", None, None),
             ("TCP against the kernel alone (MB/s)", "bw_tcp_1048576_q1", "ceil", "tcp_bw 1 MiB", "udp_ceiling", None, None)]
lines = [f"## RoCEv2 between two namespaces vs TCP over the same veth pair (MTU {mtu})", "",
         f"{datetime.datetime.now():%Y-%m-%d %H:%M} · {rounds} interleaved round(s) of {dur} s runs · {os.cpu_count()} CPUs, Linux {platform.release()} · load average at the end {os.getloadavg()[0]:.2f}", "",
         "Medians over the rounds; ratio = median ours / median TCP; rounds' ratios = each round's own ratio, lowest to highest. "
         "MB = 10^6 bytes (perftest's MiB converted). Bytes per busy CPU-second: bandwidth divided by the busy CPUs of the whole machine "
         "(/proc/stat, kernel and both hosts included; machine) or by the CPU time of the benchmark's own processes and ksoftirqd (own), in the middle of the run.", "",
         "| measure | softverbs RoCEv2 | TCP (qperf) or ceiling | ratio | rounds' ratios | target | verdict |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
for label, a, b, ta, tb, d, t in measures:
    ca, cb = series[a], series[b]
    ma, mb = med(ca), med(cb)
    ratio = ma / mb if ma is not None and mb else None
    per = sorted(x / y for x, y in zip(ca, cb) if x is not None and y)
    rng = f"{per[0]:.2f}-{per[-1]:.2f}" if per else "n/a"
    ok = ratio is not None and t is not None and (ratio >= t if d == "ge" else ratio <= t)
    verdict = "no number" if ratio is None else "-" if t is None else ("met" if ok else "not met")
    target = "-" if t is None else f"{'>=' if d == 'ge' else '<='} {t:.2f}"
    fmt = lambda v: "n/a" if v is None else f"{v:.4g}"
    lines.append(f"| {label} | {fmt(ma)} ({ta}) | {fmt(mb)} ({tb}) | {'n/a' if ratio is None else f'{ratio:.2f}'} | {rng} | {target} | {verdict} |")
keys = [k for k in series if not k.startswith(("pc_", "po_"))]
lines += ["", "Every round (bw_*: MB/s; cpu_*, own_*: busy CPUs, machine and own; *lat: us; ceil: udp_ceiling MB/s):", "",
          "| round | " + " | ".join(keys) + " |", "| --- " * (len(keys) + 1) + "|"]
fmt = lambda v: "-" if v is None else f"{v:.4g}"
for i in range(len(rows)):
    lines.append(f"| {i + 1} | " + " | ".join(fmt(series[k][i]) for k in keys) + " |")
text = "\n".join(lines) + "\n"
print(text, end="")
open(out + ".md", "w").write(text)
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except Exception:
    sys.exit(0)
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
x = list(range(1, len(rows) + 1))
panels = [("bandwidth", [(f"bw_{st}_{sz}_q{q}", f"{'RoCEv2' if st == 'roce' else 'TCP'} {n} x{q}") for q in ("1", nq) for sz, n in (("65536", "64K"), ("1048576", "1M")) for st in ("roce", "tcp")] + [("ceil", "kernel alone")], "MB/s"),
          ("bytes per own busy CPU-second", [(f"po_{st}_{sz}_q{q}", f"{'RoCEv2' if st == 'roce' else 'TCP'} {n} x{q}") for q in ("1", nq) for sz, n in (("65536", "64K"), ("1048576", "1M")) for st in ("roce", "tcp")], "MB per CPU-s"),
          ("latency 8 B one-way", [("wlat", "ib_write_lat"), ("slat", "ib_send_lat"), ("tlat", "tcp_lat")], "us")]
for ax, (title, pairs, unit) in zip(axes, panels):
    for k, name in pairs:
        ax.plot(x, [v if v is not None else float("nan") for v in series[k]], marker="o",
                linestyle="-" if "roce" in k or k in ("wlat", "slat") else "--", label=name)
    ax.set_title(f"{title}, MTU {mtu}")
    ax.set_xlabel("round")
    ax.set_xticks(x)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=6)
fig.tight_layout()
fig.savefig(out + ".png", dpi=90)
PY
