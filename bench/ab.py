#!/usr/bin/env python3
"""Same-run A/B of two builds' data path: verbs_bench latencies, interleaved.

    bench/ab.py OLD_BUILD NEW_BUILD [--rounds 9] [--iters 200000] [--tests write_lat,read_lat,send_lat]

Each round runs OLD's and NEW's verbs_bench (8 B, pinned to CPUs 0 and 1),
in alternating order, each against its own library and daemon (a private
SOFTVERBS_DIR per build). The table gives, per test, the median over rounds
of each build's per-run median and the ratio NEW / OLD (1.00 = no change),
with the spread over rounds, so that a restructuring can show the post path
is no slower and the fast path within its bound (docs/PERFORMANCE.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(build, tests, iters, sv_dir):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(build, "lib")
    env["SOFTVERBS_DIR"] = sv_dir
    env["SOFTVERBSD"] = os.path.join(build, "bin", "softverbsd")
    cmd = [os.path.join(build, "bench", "verbs_bench"), "--test", tests, "--lat-sizes", "8",
           "--iters", str(iters), "--warmup", str(min(2000, iters // 10)), "--pin"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("%s: exit %d: %s" % (cmd[0], out.returncode, out.stderr.strip()[-400:]))
    res = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if "median_ns" in r:
                res[r["test"]] = r["median_ns"]
    return res


def warn_unity(build):
    """A unity build lays the data path's code out differently: SEND's 8 B
    latency moved by 10-15 % with the layout alone (docs/PERFORMANCE.md,
    "The post path"). Compare builds made alike; the bench's are not unity."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            if any(l.startswith("CMAKE_UNITY_BUILD:") and l.strip().endswith("=ON") for l in f):
                sys.stderr.write("ab.py: warning: %s is a unity build (CMAKE_UNITY_BUILD=ON): "
                                 "its code layout differs from a plain build's\n" % build)
    except OSError:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--iters", type=int, default=200000)
    ap.add_argument("--tests", default="write_lat,read_lat,send_lat")
    a = ap.parse_args()
    for b in (a.old, a.new):
        warn_unity(b)
    got = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as d_old, tempfile.TemporaryDirectory() as d_new:
        dirs = {"old": d_old, "new": d_new}
        builds = {"old": a.old, "new": a.new}
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for who in order:
                for t, v in run(builds[who], a.tests, a.iters, dirs[who]).items():
                    got[who].setdefault(t, []).append(v)
            sys.stderr.write("round %d/%d done\n" % (r + 1, a.rounds))
    print("| test (8 B) | old median | new median | new / old | old spread | new spread |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in a.tests.split(","):
        o, n = got["old"].get(t), got["new"].get(t)
        if not o or not n:
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        print("| %s | %.0f ns | %.0f ns | %.3f | %.0f-%.0f | %.0f-%.0f |"
              % (t, mo, mn, mn / mo, min(o), max(o), min(n), max(n)))


if __name__ == "__main__":
    main()
