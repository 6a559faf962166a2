#!/usr/bin/env bash
# Container to container against process to process on the host and TCP
# between the same two containers, in one run.
#   sudo bench/containers.sh [BUILD_DIR]
# Host: ib_write_lat / ib_write_bw (Debian's perftest), two processes under
# softverbs run (the shared-memory path). Containers: the same programs in
# two podman containers given the device by `softverbs cdi` (RoCEv2 over
# the container network, docs/CONTAINERS.md), and two containers of one
# trust domain (the spec's --domain device, the second container in the
# first's pid and network namespaces: one daemon, shared memory), and two
# containers of different users in one pod (the spec's --users-domain device:
# the pod's system daemon carries every request between them, each key
# checked). TCP: qperf tcp_lat / tcp_bw
# between the same two containers. 8 B latency (one way, perftest's t_typical
# / qperf's latency) and 64 KiB bandwidth. Writes bench/results/containers.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
[ "$(id -u)" -eq 0 ] || { echo "run as root (podman)" >&2; exit 2; }
image=$(tests/containers/make_image.sh)
kind="softverbs.io/bench$$"
spec="/var/run/cdi/softverbs-bench-$$.json"
mkdir -p /var/run/cdi
domain="bench$$"
udomain="ubench$$"
"$build/bin/softverbs" cdi --kind "$kind" --domain "$domain" --users-domain "$udomain" --output "$spec" >/dev/null
base=(podman run --runtime runc --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
run=("${base[@]}" --device "$kind=sv0")
drun=("${base[@]}" --device "$kind=$domain")
urun=("${base[@]}" --device "$kind=$udomain")
trap 'podman rm -f -t 0 svbench-srv >/dev/null 2>&1; podman rm -f -t 0 svbench-hold >/dev/null 2>&1; rm -f "$spec"; rm -rf "/run/softverbs/domains/$domain" "/run/softverbs/domains/$udomain"' EXIT

# perftest: 8 B latency (t_typical, us) and 64 KiB bandwidth (BW average, MB/s).
lat_of() { awk '$1 == 8 && NF >= 5 {print $5}' | tail -n 1; }
bw_of() { awk '$1 == 65536 && NF >= 4 {print $4}' | tail -n 1; }

host() {  # host CMD...: server and client under softverbs run on 127.0.0.1
  "$build/bin/softverbs" run -- "$@" >/dev/null 2>&1 &
  local s=$!
  sleep 0.5
  "$build/bin/softverbs" run -- "$@" 127.0.0.1 2>&1
  wait $s || true
}
cont() {  # cont CMD...: server and client in two containers
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  "${run[@]}" -d --name svbench-srv "$image" "$@" >/dev/null
  sleep 1
  local ip
  ip=$(podman inspect -f '{{.NetworkSettings.IPAddress}}' svbench-srv)
  "${run[@]}" --rm "$image" "$@" "$ip" 2>&1
  podman wait svbench-srv >/dev/null 2>&1 || true
}
dom() {  # dom CMD...: server and client in two containers of one trust domain
  # (both joined to a holder container's pid and network namespaces, as a pod's)
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-hold >/dev/null 2>&1 || true
  "${drun[@]}" -d --name svbench-hold "$image" /bin/sleep 600 >/dev/null
  local join=(--pid container:svbench-hold --network container:svbench-hold)
  "${drun[@]}" -d --name svbench-srv "${join[@]}" "$image" "$@" >/dev/null
  sleep 1
  # until the server listens (the first process of the domain starts its daemon)
  "${drun[@]}" --rm "${join[@]}" "$image" /bin/sh -c \
    'for i in 1 2 3 4 5 6 7 8 9 10; do "$@" 127.0.0.1 && exit 0; sleep 1; done; exit 1' sh "$@" 2>&1
  podman wait svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-hold >/dev/null 2>&1 || true
}
usr() {  # usr CMD...: server (nobody) and client (uid 1000) in one pod of the users' domain
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-hold >/dev/null 2>&1 || true
  "${urun[@]}" -d --cap-add SYS_PTRACE --name svbench-hold "$image" /opt/softverbs/bin/softverbsd --system \
    --foreground --dir /run/softverbs-domain --idle 0 >/dev/null
  local join=(--pid container:svbench-hold --network container:svbench-hold) i
  for i in $(seq 100); do [ -S "/run/softverbs/domains/$udomain/control" ] && break; sleep 0.1; done
  "${urun[@]}" -d --name svbench-srv "${join[@]}" --user 65534:65534 "$image" "$@" >/dev/null
  sleep 1
  "${urun[@]}" --rm "${join[@]}" --user 1000:1000 "$image" /bin/sh -c \
    'for i in 1 2 3 4 5 6 7 8 9 10; do "$@" 127.0.0.1 && exit 0; sleep 1; done; exit 1' sh "$@" 2>&1
  podman wait svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  podman rm -f -t 0 svbench-hold >/dev/null 2>&1 || true
}
echo "host latency..." >&2
h_lat=$(host ib_write_lat -s 8 -n 20000 | lat_of)
echo "host bandwidth..." >&2
h_bw=$(host ib_write_bw -s 65536 -n 20000 | bw_of)
echo "container latency..." >&2
c_lat=$(cont /usr/bin/ib_write_lat -x 1 -s 8 -n 20000 | lat_of)
echo "container bandwidth..." >&2
c_bw=$(cont /usr/bin/ib_write_bw -x 1 -s 65536 -n 20000 | bw_of)
echo "trust-domain containers latency..." >&2
d_lat=$(dom /usr/bin/ib_write_lat -s 8 -n 20000 | lat_of)
echo "trust-domain containers bandwidth..." >&2
d_bw=$(dom /usr/bin/ib_write_bw -s 65536 -n 20000 | bw_of)
echo "containers of two users (daemon-carried) latency..." >&2
u_lat=$(usr /usr/bin/ib_write_lat -s 8 -n 20000 | lat_of)
echo "containers of two users (daemon-carried) bandwidth..." >&2
u_bw=$(usr /usr/bin/ib_write_bw -s 65536 -n 20000 | bw_of)
t_lat="" t_bw=""
if "${base[@]}" --rm "$image" /usr/bin/qperf --version >/dev/null 2>&1; then
  echo "TCP..." >&2
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
  "${base[@]}" -d --name svbench-srv "$image" /usr/bin/qperf >/dev/null
  sleep 1
  ip=$(podman inspect -f '{{.NetworkSettings.IPAddress}}' svbench-srv)
  q=$("${base[@]}" --rm "$image" /usr/bin/qperf -t 2 -m 8 "$ip" tcp_lat -m 65536 tcp_bw 2>&1)
  # qperf prints "latency = 20.1 us" and "bw = 1.23 GB/sec" (or MB/sec).
  t_lat=$(echo "$q" | awk '$1 == "latency" {v=$3; if ($4 == "ms") v*=1000; if ($4 == "ns") v/=1000; print v}' | head -n 1)
  t_bw=$(echo "$q" | awk '$1 == "bw" {v=$3; if ($4 == "GB/sec") v*=1000; if ($4 == "KB/sec") v/=1000; print v}' | head -n 1)
  podman rm -f -t 0 svbench-srv >/dev/null 2>&1 || true
fi
out=bench/results/containers.md
{
  echo "# Containers"
  echo
  echo "$(date -u +%F) on $(nproc) vCPUs, $(uname -r); bench/containers.sh, one run."
  echo "RDMA: Debian's perftest (ib_write_lat 8 B typical one-way latency; ib_write_bw 64 KiB average)."
  echo "TCP: qperf tcp_lat (8 B) / tcp_bw (64 KiB) between the same two containers."
  echo
  echo "| path | 8 B latency (us) | 64 KiB bandwidth (MB/s) |"
  echo "|---|---:|---:|"
  echo "| host, two processes (shared memory) | ${h_lat:-?} | ${h_bw:-?} |"
  echo "| two containers of one trust domain (--domain, shared memory) | ${d_lat:-?} | ${d_bw:-?} |"
  echo "| two containers of two users in one pod (--users-domain, daemon-carried) | ${u_lat:-?} | ${u_bw:-?} |"
  echo "| two containers, RoCEv2 over the container network | ${c_lat:-?} | ${c_bw:-?} |"
  echo "| two containers, TCP (qperf) | ${t_lat:-n/a} | ${t_bw:-n/a} |"
} | tee "$out"
# The plot (bench/results/containers.png; Debian's python3-matplotlib,
# scripts/deps.sh bench): each path's latency and bandwidth, log scale.
py=/usr/bin/python3; [ -x "$py" ] || py=python3  # Debian's, where matplotlib is
"$py" - "$out" <<'PY' || echo "containers.sh: no plot (python3-matplotlib missing?)" >&2
import re, sys
md = sys.argv[1]
rows = []
for line in open(md):
    m = re.match(r"\| (.+?) \| ([^|]+) \| ([^|]+) \|$", line.strip())
    if not m or m.group(1) in ("path", "---"):
        continue
    try:
        rows.append((m.group(1), float(m.group(2)), float(m.group(3)) / 1000))
    except ValueError:
        pass  # a path that did not run
if not rows:
    sys.exit(0)
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
names = [r[0].replace(" (", "\n(") for r in rows]
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
for ax, col, title, unit in ((axes[0], 1, "8 B WRITE latency, one way (lower is better)", "us"),
                             (axes[1], 2, "64 KiB WRITE bandwidth (higher is better)", "GB/s")):
    vals = [r[col] for r in rows]
    ax.barh(range(len(rows)), vals, color=["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#999999"][:len(rows)])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)
    for i, v in enumerate(vals):
        ax.text(v, i, " %.3g" % v, va="center", fontsize=7)
fig.tight_layout()
fig.savefig(md[:-3] + ".png", dpi=90)
with open(md, "a") as f:
    f.write("\n![plot](containers.png)\n")
PY
