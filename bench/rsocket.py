#!/usr/bin/env python3
"""rsockets against TCP on the same path: Debian's rstream.

    bench/rsocket.py [BUILD_DIR] [--rounds 3]

Runs rstream's default test (latency and bandwidth, 64 B .. 1 MiB) on
127.0.0.1 twice per round, in alternating order: over rsockets (softverbs'
librdmacm under `softverbs run`: shared memory on one host) and over
standard TCP sockets (`rstream -T s`, the kernel's loopback). Prints a
markdown table of the medians (rstream's usec/xfer for the latency rows,
its Gb/sec for the bandwidth rows) with the ratio rsockets / TCP, and
writes it to bench/results/rsocket.md.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(build, tcp, sv_dir):
    env = dict(os.environ, SOFTVERBS_DIR=sv_dir)
    wrap = [] if tcp else [os.path.join(build, "bin", "softverbs"), "run", "--"]
    opt = ["-T", "s"] if tcp else []
    port = str(free_port())
    srv = subprocess.Popen(wrap + ["rstream", "-b", "127.0.0.1", "-p", port] + opt, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out = subprocess.run(wrap + ["rstream", "-s", "127.0.0.1", "-p", port] + opt, env=env, capture_output=True,
                         text=True, timeout=300)
    srv.wait(timeout=60)
    if out.returncode != 0:
        sys.exit("rstream%s: exit %d: %s" % (" -T s" if tcp else "", out.returncode, out.stderr[-300:]))
    res = {}
    # name bytes xfers iters total time Gb/sec usec/xfer
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 8 and f[0].endswith(("_lat", "_bw")):
            res[f[0]] = float(f[7]) if f[0].endswith("_lat") else float(f[6])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    got = {"rs": {}, "tcp": {}}
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o700)
        for r in range(a.rounds):
            for who in (["rs", "tcp"] if r % 2 == 0 else ["tcp", "rs"]):
                for k, v in run(a.build, who == "tcp", d).items():
                    got[who].setdefault(k, []).append(v)
            sys.stderr.write("round %d/%d done\n" % (r + 1, a.rounds))
    lines = ["# rsockets against TCP", "",
             "%s on %d vCPUs, kernel %s; Debian's rstream on 127.0.0.1, %d alternating rounds (bench/rsocket.py)."
             % (time.strftime("%Y-%m-%d", time.gmtime()), os.cpu_count(), os.uname().release, a.rounds),
             "rsockets: softverbs' librdmacm under `softverbs run` (shared memory). TCP: `rstream -T s`.",
             "Latency rows: usec per transfer (lower is better); bandwidth rows: Gb/s (higher is better).", "",
             "| test | rsockets | TCP | rsockets / TCP |", "|---|---:|---:|---:|"]
    for k in got["rs"]:
        rs = statistics.median(got["rs"][k])
        tcp = statistics.median(got["tcp"].get(k, [float("nan")]))
        lines.append("| %s | %.3g | %.3g | %.2f |" % (k, rs, tcp, rs / tcp if tcp else float("nan")))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    res = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(res, exist_ok=True)
    with open(os.path.join(res, "rsocket.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
