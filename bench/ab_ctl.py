#!/usr/bin/env python3
"""Same-run A/B of two builds' control path: open + alloc PD + dealloc + close.

    bench/ab_ctl.py OLD_BUILD NEW_BUILD [--rounds 8] [--iters 300] [--bench PATH]

One ctl_bench binary (NEW's bench/ctl_bench unless --bench; public verbs API
only) runs against each build's library (LD_LIBRARY_PATH) and daemon
(SOFTVERBSD, a private SOFTVERBS_DIR per build), the two in alternating
order each round. Per build the table gives the median over rounds of:
the wall time of one iteration (ctl_bench's median), the client's CPU time
per iteration (all its threads), and the daemon's (the sum of its threads'
/proc/PID/task/*/schedstat run time over the run, divided by the
iterations). CPU time is what a loaded machine disturbs least.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile


def daemon_pid(build, sv_dir):
    want = os.path.realpath(os.path.join(build, "bin", "softverbsd"))
    for p in glob.glob("/proc/[0-9]*"):
        try:
            if os.path.realpath(p + "/exe") != want:
                continue
            with open(p + "/cmdline", "rb") as f:
                if sv_dir.encode() in f.read().split(b"\0"):
                    return int(p[6:])
        except OSError:
            pass
    return None


def daemon_ns(pid):
    total = 0
    for t in glob.glob("/proc/%d/task/*/schedstat" % pid):
        try:
            with open(t) as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def run(bench, build, iters, sv_dir):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(build, "lib")
    env["SOFTVERBS_DIR"] = sv_dir
    env["SOFTVERBSD"] = os.path.join(build, "bin", "softverbsd")
    env["SOFTVERBSD_IDLE"] = "600"  # one daemon for the whole run
    # Started (and warmed) first, so that its CPU time can be read around the run.
    subprocess.run([bench, "3", "0"], env=env, capture_output=True, timeout=120, check=True)
    pid = daemon_pid(build, sv_dir)
    before = daemon_ns(pid) if pid else 0
    out = subprocess.run([bench, str(iters), "20"], env=env, capture_output=True, text=True, timeout=600)
    after = daemon_ns(pid) if pid else 0
    if out.returncode != 0:
        sys.exit("%s: exit %d: %s" % (bench, out.returncode, out.stderr.strip()[-400:]))
    r = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    r["daemon_ns"] = (after - before) / (iters + 20) if pid else float("nan")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--bench", default=None)
    a = ap.parse_args()
    bench = a.bench or os.path.join(a.new, "bench", "ctl_bench")
    got = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as d_old, tempfile.TemporaryDirectory() as d_new:
        dirs = {"old": d_old, "new": d_new}
        for d in dirs.values():
            os.chmod(d, 0o700)
        builds = {"old": a.old, "new": a.new}
        for r in range(a.rounds):
            for who in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                got[who].append(run(bench, builds[who], a.iters, dirs[who]))
            sys.stderr.write("round %d/%d done\n" % (r + 1, a.rounds))
    print("| open+alloc_pd+dealloc+close | old | new | new / old | old spread | new spread |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, label in (("median_ns", "wall time"), ("cpu_ns", "client CPU"), ("daemon_ns", "daemon CPU")):
        o = [x[key] / 1000 for x in got["old"]]
        n = [x[key] / 1000 for x in got["new"]]
        mo, mn = statistics.median(o), statistics.median(n)
        print("| %s | %.1f us | %.1f us | %.3f | %.0f-%.0f | %.0f-%.0f |"
              % (label, mo, mn, mn / mo, min(o), max(o), min(n), max(n)))
    tot_o = statistics.median([(x["cpu_ns"] + x["daemon_ns"]) / 1000 for x in got["old"]])
    tot_n = statistics.median([(x["cpu_ns"] + x["daemon_ns"]) / 1000 for x in got["new"]])
    print("| client + daemon CPU | %.1f us | %.1f us | %.3f | | |" % (tot_o, tot_n, tot_n / tot_o))


if __name__ == "__main__":
    main()
