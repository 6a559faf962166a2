#!/usr/bin/env python3
"""softverbs benchmark driver.

    python3 bench/run.py [--build build] [--quick]

Runs, in one go, the raw baselines (shared-memory cache-line ping-pong and
single-thread memcpy, from `shm_pingpong`) and the verbs benchmark
(`verbs_bench`) under softverbs (LD_LIBRARY_PATH=<build>/src/verbs), and
optionally UCX's ucx_perftest over posix shared memory as a peer.  Latency and
bandwidth rounds are interleaved so that the ratios compare numbers measured
under the same machine conditions.

Prints a markdown table to stdout, progress to stderr, and writes
bench/results/latest.md, latest.png (if matplotlib is available) and
latest.jsonl (all raw measurements).

The driver's parts: run_util.py (helpers), run_peers.py (perftest and UCX),
run_report.py (the Markdown report), run_plot.py (the plot).

Exit status: 0 all benchmarks ran; 1 a benchmark failed; 2 the softverbs
library is not built (the baseline table is still printed); 64 bad usage.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

from run_peers import run_perftest, run_ucx
from run_plot import make_plot
from run_report import build_report, missing_numbers, targets_section
from run_util import (HERE, KIB, MIB, REPO, BenchError, fmt_ns, fmt_size, log, med, parse_jsonl,
                      parse_sizes, run_cmd, short_failure)


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except Exception:
        return False


def maybe_reexec_for_matplotlib():
    """Debian ships matplotlib for /usr/bin/python3; a pyenv/venv python3 may
    not have it.  Re-run ourselves under the system interpreter in that case."""
    if have_matplotlib() or os.environ.get("SOFTVERBS_BENCH_REEXEC"):
        return
    syspy = "/usr/bin/python3"
    if not os.path.exists(syspy) or os.path.realpath(sys.executable) == os.path.realpath(syspy):
        return
    try:
        ok = subprocess.run([syspy, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if ok:
        env = dict(os.environ, SOFTVERBS_BENCH_REEXEC="1")
        sys.stderr.flush()
        os.execve(syspy, [syspy, os.path.abspath(__file__)] + sys.argv[1:], env)


# ------------------------------------------------------------------- steps --

class Runner:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.raw = []          # every JSON record, annotated
        self.failures = []     # human-readable failure messages
        self.notes = []
        self.rounds = args.rounds or (1 if self.quick else 3)
        self.tmo = 60 if self.quick else 240
        if self.quick:
            self.bw_sizes = [8, 64, 512, 4 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB]
            self.bw_time = 0.05
            # Few iterations: on a loaded 2-vCPU machine a busy-polling
            # ping-pong whose partner is descheduled takes milliseconds per
            # round trip.
            self.shm_iters = 5000
            self.verbs_iters = 1000
            self.memcpy_trials = 3
        else:
            self.bw_sizes = [8 << i for i in range(20)]  # 8 B .. 4 MiB
            self.bw_time = 0.2
            self.shm_iters = 200000
            self.verbs_iters = 100000
            self.memcpy_trials = 5
        if args.sizes:
            self.bw_sizes = sorted(set(parse_sizes(args.sizes)))
        # Latency against size: once (not per round), fewer iterations for
        # large messages (verbs_bench --lat-bytes).
        if self.quick and not args.sizes:
            self.sweep_sizes = [8, 4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB]
        else:
            self.sweep_sizes = list(self.bw_sizes)
        self.sweep_iters = 200 if self.quick else 10000
        self.sweep_bytes = "32M" if self.quick else "256M"
        self.rate_time = 0.05 if self.quick else 0.3
        self.event_iters = 200 if self.quick else 5000
        self.event_poll_iters = 500 if self.quick else 50000
        self.import_iters = 20 if self.quick else 200
        self.perftest_lat_iters = 1000 if self.quick else 20000
        self.perftest_bw_iters = {64 * KIB: 2000 if self.quick else 20000,
                                  1 * MIB: 200 if self.quick else 2000}
        # --pin: the two processes of a ping-pong on CPUs 0 and 1.  On a busy
        # 2-vCPU machine the scheduler otherwise often puts both on one CPU,
        # where every round trip costs a time slice.
        self.pin = ["--pin"] if args.pin else []
        taskset = shutil.which("taskset") if args.pin else None
        # The peers' two processes (servers and clients of their own) the same way.
        self.cpu_prefix = (lambda c: [taskset, "-c", str(c)]) if taskset else (lambda c: [])
        self.step_no = 0
        self.steps_total = 0

    def step(self, text):
        self.step_no += 1
        log("step %d/%d: %s" % (self.step_no, self.steps_total, text))

    def record(self, recs, source, rnd):
        for r in recs:
            r = dict(r)
            r["source"] = source
            r["round"] = rnd
            self.raw.append(r)

    # -- baselines
    def shm_lat(self, rnd):
        self.step("raw shm cache-line ping-pong, 8 B (round %d/%d)" % (rnd + 1, self.rounds))
        out = run_cmd([self.shm_bin, "--test", "lat,lat2", "--iters", str(self.shm_iters),
                       "--warmup", str(min(10000, self.shm_iters // 5))] + self.pin + [
                       "--timeout", str(self.tmo - 5)], self.tmo, what="shm_pingpong lat")
        self.record(parse_jsonl(out, "shm_pingpong lat"), "shm", rnd)

    def memcpy_bw(self, rnd):
        self.step("memcpy bandwidth, %d sizes (round %d/%d)" % (len(self.bw_sizes), rnd + 1, self.rounds))
        out = run_cmd([self.shm_bin, "--test", "bw", "--sizes", ",".join(map(str, self.bw_sizes)),
                       "--time", str(self.bw_time), "--trials", str(self.memcpy_trials),
                       "--timeout", str(self.tmo - 5)], self.tmo, what="shm_pingpong bw")
        self.record(parse_jsonl(out, "shm_pingpong bw"), "memcpy", rnd)

    # -- softverbs
    def verbs_env(self):
        env = dict(os.environ)
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = self.lib_dir + (":" + old if old else "")
        return env

    def verbs(self, tests, rnd, label, sweep=False):
        if self.failures:
            self.step("softverbs %s%s: skipped after the failure above"
                      % (label, "" if sweep else " (round %d/%d)" % (rnd + 1, self.rounds)))
            return
        if sweep:
            self.step("softverbs %s" % label)
            cmd = self.launcher + [self.verbs_bin, "--test", tests,
                   "--lat-sizes", ",".join(map(str, self.sweep_sizes)),
                   "--iters", str(self.sweep_iters), "--lat-bytes", self.sweep_bytes,
                   "--warmup", str(self.sweep_iters // 10), "--timeout", str(self.tmo - 5)]
        else:
            self.step("softverbs %s (round %d/%d)" % (label, rnd + 1, self.rounds))
            cmd = self.launcher + [self.verbs_bin, "--test", tests, "--lat-sizes", "8",
                   "--bw-sizes", ",".join(map(str, self.bw_sizes)), "--iters", str(self.verbs_iters),
                   "--warmup", str(min(2000, self.verbs_iters // 10)),
                   "--time", str(self.bw_time), "--timeout", str(self.tmo - 5)]
        cmd += self.pin
        try:
            out = run_cmd(cmd, self.tmo, env=self.verbs_env(), what="verbs_bench " + tests)
            self.record(parse_jsonl(out, "verbs_bench"), "sweep" if sweep else "softverbs", rnd)
        except BenchError as e:
            self.fail(str(e))

    def aux(self, source, label, args, env_extra=None, fatal=True):
        """Runs one of the other benchmark programs under softverbs; its JSON
        lines are recorded under `source`.  A failure is a benchmark failure
        (fatal) or a note."""
        if not os.access(args[0], os.X_OK):
            self.step("%s: skipped, %s not built" % (label, os.path.basename(args[0])))
            self.notes.append("%s not built: no %s rows" % (os.path.basename(args[0]), label))
            return
        self.step(label)
        env = self.verbs_env()
        env.update(env_extra or {})
        try:
            out = run_cmd(self.launcher + args, self.tmo, env=env, what=os.path.basename(args[0]))
            self.record(parse_jsonl(out, os.path.basename(args[0])), source, 0)
        except BenchError as e:
            if fatal:
                self.fail(str(e))
            else:
                log("warning: " + short_failure(str(e)))
                self.notes.append("%s: %s" % (label, short_failure(str(e))))

    def rate_event_import(self):
        exe = os.path.join(self.bench_bin, "rate_event_bench")
        self.aux("rate", "softverbs message rate, 8 B WRITE, 1/4/16 QPs",
                 [exe, "--qps", "1,4,16", "--time", str(self.rate_time), "--timeout", str(self.tmo - 5),
                  "rate"] + self.pin)
        wake = [exe, "--iters", str(self.event_iters), "--poll-iters", str(self.event_poll_iters),
                "--timeout", str(self.tmo - 5)] + self.pin
        self.aux("event", "event-mode latency (default adaptive spin) + futex/eventfd limits",
                 wake + ["wake", "event"])
        self.aux("event", "event-mode latency, SOFTVERBS_SPIN_US=0 (pure blocking wake-ups)",
                 wake + ["event"], {"SOFTVERBS_SPIN_US": "0"})
        self.aux("import", "import and namespace cost, per call",
                 [os.path.join(self.bench_bin, "import_bench"), str(self.import_iters)])

    # -- perftest's own programs over softverbs (a peer row)
    def perftest(self):
        runs = [("ib_write_lat", 8, self.perftest_lat_iters),
                ("ib_send_lat", 8, self.perftest_lat_iters),
                ("ib_write_bw", 64 * KIB, self.perftest_bw_iters[64 * KIB]),
                ("ib_write_bw", 1 * MIB, self.perftest_bw_iters[1 * MIB])]
        for prog, size, iters in runs:
            exe = shutil.which(prog)
            if not exe:
                self.notes.append("%s not installed (package perftest): no perftest row" % prog)
                continue
            self.step("perftest peer: %s %s over softverbs" % (prog, fmt_size(size)))
            try:
                val = run_perftest(self.launcher, exe, size, iters, self.verbs_env(), self.cpu_prefix,
                                   timeout=60 if self.quick else 120)
            except BenchError as e:
                msg = "perftest %s %s: %s" % (prog, fmt_size(size), short_failure(str(e)))
                log("warning: " + msg)
                self.notes.append(msg)
                continue
            rec = {"bench": "perftest", "test": prog, "size": size, "iters": iters}
            rec.update(val)
            self.record([rec], "perftest", 0)

    def fail(self, msg):
        log("FAILED: " + short_failure(msg))
        self.failures.append(msg)

    # -- UCX peer
    def ucx(self):
        exe = shutil.which("ucx_perftest")
        if not exe or self.args.no_ucx:
            return
        n_lat = 2000 if self.quick else 100000
        runs = [("ucp_put_lat", 8, n_lat, 1000),
                ("ucp_put_bw", 64 * KIB, 5000 if self.quick else 20000, 500),
                ("ucp_put_bw", 1 * MIB, 1000 if self.quick else 5000, 100),
                ("ucp_am_lat", 8, n_lat, 1000)]
        for test, size, iters, warm in runs:
            self.step("UCX peer: %s %s (posix shm)" % (test, fmt_size(size)))
            try:
                val = run_ucx(exe, test, size, iters, warm, self.cpu_prefix, timeout=60 if self.quick else 120)
            except BenchError as e:
                msg = "UCX %s %s: %s" % (test, fmt_size(size), e)
                log("warning: " + msg.splitlines()[0])
                self.notes.append(msg.splitlines()[0])
                continue
            rec = {"bench": "ucx", "test": test, "size": size, "iters": iters}
            rec.update(val)
            self.record([rec], "ucx", 0)

    def verify(self):
        self.step("softverbs data check: RDMA WRITE of each size arrives intact")
        cmd = self.launcher + [self.verbs_bin, "--test", "verify",
                               "--bw-sizes", ",".join(map(str, self.bw_sizes)),
                               "--timeout", str(self.tmo - 5)]
        try:
            out = run_cmd(cmd, self.tmo, env=self.verbs_env(), what="verbs_bench verify")
            self.record(parse_jsonl(out, "verbs_bench verify"), "softverbs", 0)
        except BenchError as e:
            self.fail(str(e))

    def plan(self, do_verbs):
        n = self.rounds * 2  # shm lat + memcpy
        if do_verbs:
            n += self.rounds * 2 + 1
        if do_verbs:
            n += 1 + 4 + int(os.access(os.path.join(self.bench_bin, "reg_atomic_bench"), os.X_OK)) + len([p for p in ("ib_write_lat", "ib_send_lat", "ib_write_bw", "ib_write_bw")
                              if shutil.which(p)])
        if shutil.which("ucx_perftest") and not self.args.no_ucx:
            n += 4
        self.steps_total = n

    def run_all(self, do_verbs):
        self.plan(do_verbs)
        if do_verbs:
            self.verify()
        for rnd in range(self.rounds):
            # Interleave baseline and softverbs so both see the same conditions.
            self.shm_lat(rnd)
            if do_verbs:
                self.verbs("write_lat,send_lat", rnd, "RDMA WRITE + SEND/RECV latency, 8 B")
            self.memcpy_bw(rnd)
            if do_verbs:
                self.verbs("write_bw,read_bw,send_bw", rnd,
                           "RDMA WRITE, READ and SEND/RECV bandwidth, %d sizes" % len(self.bw_sizes))
        if do_verbs:
            self.verbs("write_lat,read_lat,send_lat", 0,
                       "WRITE, READ and SEND/RECV latency against size, %d sizes" % len(self.sweep_sizes),
                       sweep=True)
            self.rate_event_import()
            self.perftest()
        self.ucx()

    # -- aggregation
    def select(self, source, test, size=None):
        return [r for r in self.raw if r["source"] == source and r.get("test") == test
                and (size is None or r.get("size") == size)]

    def agg(self, source, test, key, size=None):
        return med([r.get(key) for r in self.select(source, test, size)])


# ------------------------------------------------------------ machine noise --

class CpuMeter:
    """How much CPU other processes (and the hypervisor, as steal) took while
    we ran: busy time from /proc/stat minus our children's rusage."""

    def __init__(self):
        self.t0 = time.monotonic()
        self.s0 = self._stat()
        self.c0 = self._children()

    @staticmethod
    def _stat():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
            hz = os.sysconf("SC_CLK_TCK")
            busy = v[0] + v[1] + v[2] + v[5] + v[6]  # user nice system irq softirq
            steal = v[7] if len(v) > 7 else 0
            return busy / hz, steal / hz
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _children():
        import resource
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        me = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime + me.ru_utime + me.ru_stime

    def result(self):
        """(other %, steal %) of total CPU capacity during the run, or None."""
        s1 = self._stat()
        if not self.s0 or not s1:
            return None
        wall = max(time.monotonic() - self.t0, 1e-3)
        cap = wall * (os.cpu_count() or 1)
        other = (s1[0] - self.s0[0]) - (self._children() - self.c0)
        steal = s1[1] - self.s0[1]
        return max(0.0, 100.0 * other / cap), max(0.0, 100.0 * steal / cap)


def load_line(load_start, noise):
    text = "load average %s at start" % load_start
    if noise:
        text += "; other processes used %.0f%% and the hypervisor stole %.0f%% of the CPUs " \
                "during the run" % noise
    return text


# -------------------------------------------------------------------- main --

def reg_atomic_section(R, bench_bin):
    """Registration cost and atomic rate (reg_atomic_bench), each beside its
    baseline from the same run.  Returns markdown, or '' if not built."""
    exe = os.path.join(bench_bin, "reg_atomic_bench")
    if not os.access(exe, os.X_OK):
        return ""
    R.step("registration cost, scale (10,000 QPs, 100,000 MRs) and atomic rate (reg_atomic_bench)")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = R.lib_dir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    try:
        recs = parse_jsonl(run_cmd(R.launcher + [exe], 300, env=env), "reg_atomic_bench")
    except BenchError as e:
        R.failures.append(short_failure(str(e)))
        return ""
    for r in recs:
        r["source"] = "reg_atomic"
    R.raw.extend(recs)
    out = ["", "## Registration cost", "",
           "`ibv_reg_mr` + `ibv_dereg_mr` of a `posix_memalign` buffer (softverbs copies the pages "
           "into its backing file and back), beside memcpy of the same size and the kernel's "
           "`mlock`+`munlock` of it, all in this run. \"held\": the same, while another "
           "registration of the buffer is held (a registration cache's pattern: its pages are "
           "already backed, one control round trip per call).", "",
           "| size | reg+dereg | per MiB | held | memcpy | mlock+munlock | reg / memcpy | reg / mlock |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        if r.get("bench") != "reg":
            continue
        size = r["size"]
        reg = r["reg_dereg_ns"]
        per_mib = "%.2f ms" % (reg / 1e6 * (1 << 20) / size) if size >= (1 << 20) else "–"
        lock = fmt_ns(r["mlock_munlock_ns"]) if r["mlock_munlock_ns"] >= 0 else "n/a"
        held = fmt_ns(r["reg_dereg_held_ns"]) if "reg_dereg_held_ns" in r else "–"
        vs_lock = "%.0f×" % (reg / r["mlock_munlock_ns"]) if r["mlock_munlock_ns"] > 0 else "n/a"
        out.append("| %s | %s | %s | %s | %s | %s | %.0f× | %s |" % (
            fmt_size(size), fmt_ns(reg), per_mib, held, fmt_ns(r["memcpy_ns"]), lock,
            reg / max(r["memcpy_ns"], 1e-9), vs_lock))
    try:
        scale = parse_jsonl(run_cmd(R.launcher + [exe, "scale", "10000", "100000"], 300, env=env),
                            "reg_atomic_bench scale")
        for r in scale:
            r["source"] = "reg_atomic"
        R.raw.extend(scale)
        recs = recs + scale
    except BenchError as e:
        R.failures.append(short_failure(str(e)))
    for r in recs:
        if r.get("bench") == "scale":
            out += ["", "## Scale", "",
                    "%d QPs (16-deep queues) and %d MRs (4 KiB each, overlapping) in one process; "
                    "memory is the growth of resident memory (VmRSS)." % (r["qps"], r["mrs"]), "",
                    "| object | create | process memory each | daemon memory each |",
                    "|---|---:|---:|---:|",
                    "| QP | %s | %.1f KiB | %.1f KiB |" % (fmt_ns(r["create_qp_ns"]), r["process_bytes_per_qp"] / 1024,
                                                     r["daemon_bytes_per_qp"] / 1024),
                    "| MR | %s | %.0f B | %.0f B |" % (fmt_ns(r["reg_mr_ns"]), r["process_bytes_per_mr"],
                                                   r["daemon_bytes_per_mr"])]
    for r in recs:
        if r.get("bench") == "atomic":
            out += ["", "## Atomic rate", "",
                    "FETCH_AND_ADD between two processes, one RC QP pair, 32 in flight, beside "
                    "`__atomic_fetch_add` on one cache line shared by two processes.", "",
                    "| softverbs | raw shared line | ratio |", "|---:|---:|---:|",
                    "| %.1f M ops/s | %.1f M ops/s | %.2f× |" % (
                        r["softverbs_ops_per_s"] / 1e6, r["raw_shared_line_ops_per_s"] / 1e6,
                        r["softverbs_ops_per_s"] / r["raw_shared_line_ops_per_s"])]
    return "\n".join(out) + "\n"


def resolve_dir(path):
    if os.path.isabs(path):
        return path
    if os.path.exists(path):
        return os.path.abspath(path)
    return os.path.join(REPO, path)


def parse_args():
    ap = argparse.ArgumentParser(description="softverbs benchmark suite (ratios against "
                                             "baselines measured in the same run)")
    ap.add_argument("--build", default="build", help="CMake build dir (default: build)")
    ap.add_argument("--quick", action="store_true", help="short run (< 30 s)")
    ap.add_argument("--bench-bin", help="dir with shm_pingpong/verbs_bench "
                                        "(default <build>/bench, else <build>/bin)")
    ap.add_argument("--lib-dir", help="dir with softverbs' libibverbs.so.1 "
                                      "(default <build>/src/verbs, else <build>/lib)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="results dir")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 3, quick 1)")
    ap.add_argument("--sizes", help="bandwidth sizes, e.g. 8,64K,1M")
    ap.add_argument("--no-ucx", action="store_true", help="skip the UCX peer")
    ap.add_argument("--pin", action="store_true",
                    help="pin the two processes of shm_pingpong and verbs_bench to CPUs 0 and 1")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every row of the report holds a number (smoke test; "
                         "never judges the numbers)")
    ap.add_argument("--launcher", choices=("auto", "env", "tool"), default="auto",
                    help="how to run verbs_bench under softverbs: 'env' = LD_LIBRARY_PATH only, "
                         "'tool' = also wrap in '<build>/{src/tools,bin}/softverbs run --', "
                         "'auto' (default) = 'tool' if that program exists")
    args = ap.parse_args()
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")
    return args


def first_with(dirs, name):
    """The first of dirs that holds `name`, else the first."""
    for d in dirs:
        if os.path.exists(os.path.join(d, name)):
            return d
    return dirs[0]


def use_private_daemon():
    """A daemon of this very build, in a directory of its own, unless the
    caller chose one: the per-user default may hold a daemon of another
    build (or another engineer's benchmark) and its memory would mix into ours."""
    if os.environ.get("SOFTVERBS_DIR"):
        return
    import atexit
    import tempfile
    private = tempfile.mkdtemp(prefix="softverbs-bench-")  # mode 0700, as the library requires
    os.environ["SOFTVERBS_DIR"] = private
    atexit.register(shutil.rmtree, private, True)
    log("daemon directory %s (set SOFTVERBS_DIR to choose one)" % private)


def make_runner(args, build):
    """The Runner, with its programs found under the build; None (said on
    stderr) if the benchmarks or the chosen launcher are not built."""
    bench_bin = (resolve_dir(args.bench_bin) if args.bench_bin else
                 first_with([os.path.join(build, "bench"), os.path.join(build, "bin")],
                            "shm_pingpong"))
    lib_dir = (resolve_dir(args.lib_dir) if args.lib_dir else
               first_with([os.path.join(build, "src", "verbs"), os.path.join(build, "lib")],
                          "libibverbs.so.1"))
    R = Runner(args)
    R.shm_bin = os.path.join(bench_bin, "shm_pingpong")
    R.verbs_bin = os.path.join(bench_bin, "verbs_bench")
    R.bench_bin = bench_bin
    R.lib_dir = lib_dir
    use_private_daemon()
    if not os.access(R.shm_bin, os.X_OK):
        sys.stderr.write("error: %s not found. Build the benchmarks first, e.g.\n"
                         "  cmake --build %s --target shm_pingpong verbs_bench\n"
                         "or pass --bench-bin DIR.\n" % (R.shm_bin, build))
        return None
    tool = os.path.join(first_with([os.path.join(build, "src", "tools"),
                                    os.path.join(build, "bin")], "softverbs"), "softverbs")
    R.launcher = []
    if args.launcher == "tool" or (args.launcher == "auto" and os.access(tool, os.X_OK)):
        if not os.access(tool, os.X_OK):
            sys.stderr.write("error: --launcher tool but %s does not exist\n" % tool)
            return None
        R.launcher = [tool, "run", "--"]
        log("running verbs_bench via '%s run --' (use --launcher env to bypass)" % tool)
    return R


def verbs_state_of(R):
    """'ok', or what keeps the softverbs rows from running."""
    if not os.path.exists(os.path.join(R.lib_dir, "libibverbs.so.1")):
        log("softverbs library not built (%s/libibverbs.so.1 missing); running baselines only"
            % R.lib_dir)
        return "missing-lib"
    if not os.access(R.verbs_bin, os.X_OK):
        log("verbs_bench not built (%s); running baselines only" % R.verbs_bin)
        return "missing-bin"
    return "ok"


def run_measuring_noise(R, verbs_state):
    """Runs every step and records the machine's load meanwhile in R.
    Returns an exit status if the run cannot be reported, else None."""
    try:
        with open("/proc/loadavg") as f:
            load0 = f.read().split()[0]
    except OSError:
        load0 = "?"
    meter = CpuMeter()
    try:
        R.run_all(verbs_state == "ok")
    except BenchError as e:  # a baseline failed: nothing meaningful to report
        sys.stderr.write("error: baseline benchmark failed: %s\n" % e)
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    noise = meter.result()
    R.load_text = load_line(load0, noise)
    R.busy = bool(noise and noise[0] + noise[1] > 10)
    if R.busy:
        log("warning: other processes used %.0f%% of the CPUs during the run (steal %.0f%%); "
            "the numbers are noisy" % noise)
    return None


def write_results(R, out_dir, report):
    """latest.md, latest.jsonl and latest.png into out_dir; the report on stdout."""
    os.makedirs(out_dir, exist_ok=True)
    md_path = os.path.join(out_dir, "latest.md")
    png_path = os.path.join(out_dir, "latest.png")
    with open(md_path, "w") as f:
        f.write(report)
        if have_matplotlib():
            f.write("\n![plot](latest.png)\n")
    with open(os.path.join(out_dir, "latest.jsonl"), "w") as f:
        for r in R.raw:
            f.write(json.dumps(r) + "\n")
    plotted = make_plot(R, png_path)
    sys.stdout.write(report)
    sys.stdout.flush()
    log("wrote %s%s" % (md_path, ", " + png_path if plotted else ""))


def exit_status(R, args, verbs_state):
    """The exit status (see the module's docstring), said on stderr."""
    if verbs_state == "missing-lib":
        sys.stderr.write("softverbs library not built: baseline table only (exit 2)\n")
        return 2
    if verbs_state == "missing-bin":
        sys.stderr.write("verbs_bench not built: baseline table only (exit 2)\n")
        return 2
    if args.check and verbs_state == "ok":
        missing = missing_numbers(R)
        if missing:
            sys.stderr.write("\n--check: no number for: %s\n" % ", ".join(missing))
            return 1
        log("--check: every row holds a number")
    if R.failures:
        sys.stderr.write("\nbenchmark FAILED:\n")
        for f in R.failures:
            sys.stderr.write("- %s\n" % f)
        return 1
    return 0


def main():
    args = parse_args()
    # SIGTERM unwinds like an exception: run_cmd's `finally` then kills the
    # running benchmark's process group and the private daemon directory goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    R = make_runner(args, resolve_dir(args.build))
    if R is None:
        return 1
    verbs_state = verbs_state_of(R)
    rc = run_measuring_noise(R, verbs_state)
    if rc is not None:
        return rc
    if verbs_state == "ok" and R.failures:
        verbs_state = "failed"
    report = build_report(R, verbs_state)
    if verbs_state == "ok":
        report += reg_atomic_section(R, R.bench_bin)
        report += targets_section(R)
    write_results(R, args.out, report)
    return exit_status(R, args, verbs_state)


if __name__ == "__main__":
    maybe_reexec_for_matplotlib()
    sys.exit(main())
