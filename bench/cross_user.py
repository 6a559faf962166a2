#!/usr/bin/env python3
"""The path between users against the same-user path.

    sudo bench/cross_user.py [BUILD_DIR] [--rounds 3] [--uid 65534] [--no-pin]

Starts a private system daemon (softverbsd --system, as the security tests
do) and runs verbs_bench against it in interleaved rounds: both processes
root (same user: shared memory), then the server as UID (another user: the
daemon carries every operation, with the checks of the trust boundary).
WRITE and READ bandwidth at 64 KiB and 1 MiB, 8 B WRITE and READ latency.
Prints a markdown table (medians over rounds and the ratio between users /
same user) and writes it to bench/results/cross_user.md. Needs root.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TESTS = "write_lat,read_lat,write_bw,read_bw"


def run(build, sysdir, uid, pin):
    env = dict(os.environ)
    env.update({"SOFTVERBS_SYSTEM": "1", "SOFTVERBS_SYSTEM_DIR": sysdir,
                "LD_LIBRARY_PATH": os.path.join(build, "lib")})
    cmd = [os.path.join(build, "bench", "verbs_bench"), "--test", TESTS, "--lat-sizes", "8",
           "--bw-sizes", "64K,1M", "--iters", "20000", "--warmup", "500", "--time", "0.5"] + (["--pin"] if pin else [])
    if uid is not None:
        cmd += ["--server-uid", str(uid)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        sys.exit("verbs_bench: exit %d: %s" % (out.returncode, out.stderr.strip()[-400:]))
    res = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r["test"] == "info":
                continue
            key = (r["test"], r["size"])
            res[key] = r["gbps"] if "gbps" in r else r["median_ns"]
    return res


def label(key):
    test, size = key
    size_s = "%d KiB" % (size >> 10) if size < (1 << 20) else "%d MiB" % (size >> 20)
    if size < 1024:
        size_s = "%d B" % size
    if test.endswith("_bw"):
        return "%s %s (GB/s)" % (test[:-3].upper(), size_s)
    what = "one way" if test == "write_lat" else "round trip"
    return "%s %s, %s (ns)" % (test[:-4].upper(), size_s, what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uid", type=int, default=65534)
    ap.add_argument("--no-pin", action="store_true", help="leave the two processes unpinned")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("cross_user.py: run as root (the server runs as another user against a system daemon)")
    sysdir = tempfile.mkdtemp(prefix="softverbs-system-")
    os.chmod(sysdir, 0o755)
    env = {k: v for k, v in os.environ.items() if k != "SOFTVERBSD_IDLE"}
    daemon = subprocess.Popen([os.path.join(a.build, "bin", "softverbsd"), "--system", "--foreground", "--dir",
                               sysdir, "--idle", "0"], env=env)
    try:
        for _ in range(300):
            if os.path.exists(os.path.join(sysdir, "control")):
                break
            time.sleep(0.01)
        got = {"same": {}, "cross": {}}
        for r in range(a.rounds):
            for who in (["same", "cross"] if r % 2 == 0 else ["cross", "same"]):
                for k, v in run(a.build, sysdir, None if who == "same" else a.uid, not a.no_pin).items():
                    got[who].setdefault(k, []).append(v)
            sys.stderr.write("round %d/%d done\n" % (r + 1, a.rounds))
    finally:
        daemon.terminate()
        daemon.wait()
        subprocess.run(["rm", "-rf", sysdir])
    lines = ["# Between users against the same user", "",
             "%s on %d vCPUs, kernel %s; a private system daemon; %d interleaved rounds (bench/cross_user.py)."
             % (time.strftime("%Y-%m-%d", time.gmtime()), os.cpu_count(), os.uname().release, a.rounds),
             "Same user: both processes root. Between users: the server runs as uid %d." % a.uid, "",
             "| test | same user | between users | between / same | target | |", "|---|---:|---:|---:|---|---|"]
    rows = []
    for k in sorted(got["same"], key=lambda k: (k[0].endswith("_bw"), k[0], k[1])):
        s = statistics.median(got["same"][k])
        c = statistics.median(got["cross"].get(k, [float("nan")]))
        ratio = c / s if s else float("nan")
        t = target(k)
        verdict = "" if t is None else ("met" if (ratio >= t[1] if t[0] == ">=" else ratio <= t[1]) else "**not met**")
        lines.append("| %s | %.4g | %.4g | %.3g | %s | %s |" % (label(k), s, c, ratio,
                                                              "" if t is None else "%s %g" % t, verdict))
        rows.append((label(k), ratio, t))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    results = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(results, exist_ok=True)
    with open(os.path.join(results, "cross_user.md"), "w") as f:
        f.write(text)
    plot(rows, os.path.join(results, "cross_user.png"))


def target(key):
    """The target: bandwidth at least half the same-user path's, 8 B
    WRITE latency at most 3x (READ's round trip has no target)."""
    test, size = key
    if test.endswith("_bw"):
        return (">=", 0.5)
    if test == "write_lat":
        return ("<=", 3)
    return None


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        sys.stderr.write("no matplotlib (Debian's: /usr/bin/python3): no plot\n")
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    pos = list(range(len(rows)))
    ok = [t is None or (r >= t[1] if t[0] == ">=" else r <= t[1]) for _, r, t in rows]
    ax.bar(pos, [r for _, r, _ in rows], color=["tab:green" if o else "tab:red" for o in ok])
    for i, (_, r, t) in enumerate(rows):
        ax.text(i, r, "%.3g" % r, ha="center", va="bottom", fontsize=8)
        if t is not None:
            ax.plot([i - 0.4, i + 0.4], [t[1], t[1]], color="black", linestyle="--", linewidth=1)
    ax.set_xticks(pos)
    ax.set_xticklabels([n for n, _, _ in rows], fontsize=7, rotation=30, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("between users / same user (dashed: the target)")
    ax.set_title("Between users against the same user (green: target met or none)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
