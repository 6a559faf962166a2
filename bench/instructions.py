#!/usr/bin/env python3
"""Instructions per work request of the shared-memory post path, counted.

    bench/instructions.py BUILD [BUILD ...] [--tests send,read,write] [--out FILE]

Runs each build's post_cost_bench (one process, two loopback QPs; see its
header) under valgrind's callgrind and prints the instructions one
operation costs: an 8 B inline WRITE, an 8 B READ, or a SEND with the
receive's poll and repost. Each count is the difference between two runs of
different lengths divided by the difference in operations, so that start-up
and set-up cancel out.

A timed A/B (bench/ab.py) of the 8 B latencies on a 2-vCPU VM spreads by
more than 10 % between rounds; these counts repeat to within about 0.5 %,
and they tell a change in the code from a change in its layout or in the
machine, which a VM without performance counters cannot (they once showed
a gap in SEND's cost to be code, not layout). They are
not time: a cache line fetched from the other CPU costs as much as a
hundred instructions.
"""
import argparse
import os
import subprocess
import sys
import tempfile

SHORT, LONG = 4096, 16384  # --iters of the two runs, multiples of 64


def ops(iters):
    # post_cost_bench: a warm-up of min(iters, 20000) rounded down to 64, then
    # --trials 1 trial of iters (a multiple of 64).
    return (min(iters, 20000) & ~63) + iters


def count(build, test, iters, tmp):
    out = os.path.join(tmp, "cg.%p.out")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(build, "lib")
    env["SOFTVERBS_DIR"] = tempfile.mkdtemp(dir=tmp)
    env["SOFTVERBSD"] = os.path.join(build, "bin", "softverbsd")
    for f in os.listdir(tmp):
        if f.startswith("cg."):
            os.unlink(os.path.join(tmp, f))
    # Only the trials' own instructions: not start-up, nor the library's
    # other threads (its progress thread's timers fire more often per
    # operation under valgrind's slowdown than in a real run).
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
           "--toggle-collect=*one_sided_trial*", "--toggle-collect=*send_trial*",
           os.path.join(build, "bench", "post_cost_bench"), "--test", test, "--iters", str(iters), "--trials", "1"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit("instructions.py: %s: exit %d: %s" % (build, r.returncode, r.stderr.strip()[-600:]))
    # The bench's own process is the largest count (a child it forks to
    # start the daemon writes a file of its own).
    best = None
    for name in os.listdir(tmp):
        if not name.startswith("cg."):
            continue
        with open(os.path.join(tmp, name)) as fh:
            for line in fh:
                if line.startswith(("summary:", "totals:")):
                    n = int(line.split()[1])
                    best = n if best is None else max(best, n)
    if best is None:
        sys.exit("instructions.py: no callgrind total for %s" % build)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--tests", default="send,read,write")
    ap.add_argument("--out", default=None, help="also write the table to this file")
    a = ap.parse_args()
    if subprocess.run(["which", "valgrind"], capture_output=True).returncode != 0:
        sys.exit("instructions.py: needs valgrind (apt-get install valgrind; scripts/deps.sh bench)")
    names = {"send": "SEND + poll + repost, 8 B inline", "read": "READ, 8 B", "write": "WRITE, 8 B inline"}
    tests = a.tests.split(",")
    per = {}
    with tempfile.TemporaryDirectory() as tmp:
        for b in a.builds:
            for t in tests:
                lo, hi = count(b, t, SHORT, tmp), count(b, t, LONG, tmp)
                per[(b, t)] = (hi - lo) / (ops(LONG) - ops(SHORT))
                sys.stderr.write("%s %s: %.1f instructions per operation\n" % (b, t, per[(b, t)]))
    base = a.builds[0]
    head = "| operation | " + " | ".join(a.builds) + " |"
    rule = "|---|" + "---:|" * len(a.builds)
    rows = [head, rule]
    for t in tests:
        cells = []
        for b in a.builds:
            v = per[(b, t)]
            cells.append("%.0f" % v if b == base else "%.0f (%.3f)" % (v, v / per[(base, t)]))
        rows.append("| %s | %s |" % (names.get(t, t), " | ".join(cells)))
    text = "\n".join(rows) + "\n\nInstructions per operation (callgrind); in parentheses, the ratio to the first build.\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
