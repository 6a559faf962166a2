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

Exit status: 0 all benchmarks ran; 1 a benchmark failed; 2 the softverbs
library is not built (the baseline table is still printed); 64 bad usage.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
KIB = 1024
MIB = 1024 * 1024
HIGHLIGHT = (64 * KIB, 1 * MIB)
T0 = time.monotonic()


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


# --------------------------------------------------------------- utilities --

def log(msg):
    sys.stderr.write("[bench %6.1fs] %s\n" % (time.monotonic() - T0, msg))
    sys.stderr.flush()


class BenchError(Exception):
    pass


def kill_group(proc):
    """Kill a process started with start_new_session=True and its children."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def run_cmd(cmd, timeout, env=None, what=None):
    """Run cmd with a hard timeout; returns stdout.  Raises BenchError."""
    what = what or os.path.basename(cmd[0])
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                start_new_session=True, text=True)
    except OSError as e:
        raise BenchError("%s: cannot start %s: %s" % (what, cmd[0], e))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise BenchError("%s: timed out after %ds\n%s" % (what, timeout, tail(err)))
    finally:
        kill_group(proc)  # leftovers of the process group, if any
    if proc.returncode != 0:
        raise BenchError("%s: exit status %d\n  command: %s\n%s"
                         % (what, proc.returncode, " ".join(cmd), tail(err or out)))
    return out


def tail(text, n=12):
    lines = [l for l in (text or "").strip().splitlines() if l.strip()]
    return "\n".join("  | " + l for l in lines[-n:])


def short_failure(msg):
    """First line of a BenchError message plus the first line of the tool's
    own stderr, e.g. 'verbs_bench: exit status 1: no RDMA devices found'."""
    lines = msg.splitlines()
    detail = [l.strip()[2:].strip() for l in lines[1:] if l.strip().startswith("|")]
    return lines[0] + (" — " + detail[0] if detail else "")


def parse_jsonl(text, what):
    recs = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            recs.append(json.loads(line))
        except ValueError:
            raise BenchError("%s: unparsable output line: %s" % (what, line))
    if not recs:
        raise BenchError("%s: produced no results" % what)
    return recs


def fmt_size(n):
    if n >= MIB and n % MIB == 0:
        return "%d MiB" % (n // MIB)
    if n >= KIB and n % KIB == 0:
        return "%d KiB" % (n // KIB)
    return "%d B" % n


def fmt_ns(ns):
    if ns is None:
        return "–"
    if ns >= 1e6:
        return "%.2f ms" % (ns / 1e6)
    if ns >= 10000:
        return "%.1f µs" % (ns / 1000.0)
    if ns >= 1000:
        return "%.2f µs" % (ns / 1000.0)
    return "%.0f ns" % ns


def fmt_gbps(g):
    if g is None:
        return "–"
    return "%.1f GB/s" % g if g >= 10 else "%.3g GB/s" % g


def fmt_ratio(r, pct=False):
    if r is None:
        return "–"
    if pct:
        return "%.0f%%" % (100 * r)
    if r >= 10:
        return "%.1f×" % r
    if r >= 0.1:
        return "%.2f×" % r
    return "%.2g×" % r


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


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


def parse_sizes(spec):
    out = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        m = re.fullmatch(r"(\d+)\s*([kKmM]?)(i?[bB])?", item)
        if not m:
            raise SystemExit("bad size '%s'" % item)
        v = int(m.group(1)) * {"": 1, "k": KIB, "m": MIB}[m.group(2).lower()]
        if v <= 0:
            raise SystemExit("bad size '%s'" % item)
        out.append(v)
    return out


# --------------------------------------------------------------------- UCX --

def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def port_listening(port):
    """True if some socket LISTENs on `port` (reads /proc/net/tcp{,6}; does not
    connect, since ucx_perftest's server accepts exactly one connection)."""
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 3 and parts[3] == "0A" and \
                            int(parts[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            continue
    return False


def parse_ucx(out, test):
    """Parse ucx_perftest's result table.  Columns after 'Final:' are:
    iterations, latency 50%ile/typical, average, overall (usec, one-way for
    *_lat), bandwidth average, overall (MB/s, MB = 2^20), msg rate avg, overall."""
    num = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    row = None
    for line in out.splitlines():
        if line.strip().startswith("Final:"):
            row = [float(x) for x in re.findall(num, line.split("Final:", 1)[1].replace(",", ""))]
    if row is None:  # fall back to the last table row with enough numbers
        for line in out.splitlines():
            vals = re.findall(num, line.replace(",", ""))
            if len(vals) >= 8 and not re.search(r"[A-Za-z]{3,}", line):
                row = [float(x) for x in vals[-8:]]
    if row is None or len(row) < 8:
        raise BenchError("could not find a result line in ucx_perftest output\n" + tail(out))
    row = row[-8:]
    if test.endswith("_lat"):
        return {"median_ns": row[1] * 1000.0, "mean_ns": row[2] * 1000.0}
    return {"gbps": row[5] * MIB / 1e9, "mmsgs_per_s": row[7] / 1e6}


def run_perftest(launcher, exe, size, iters, env, cpu, timeout):
    """perftest's server and client (both under softverbs) on 127.0.0.1.
    Returns {'median_ns', 'mean_ns', 'p99_ns'} (one-way: perftest halves the
    round trip of WRITE and SEND latency) or {'gbps', 'mmsgs_per_s'}.
    perftest calibrates its clock over a busy loop and gives up ('Correlation
    coefficient') when preempted meanwhile: that is retried twice."""
    prog = os.path.basename(exe)
    for attempt in range(3):
        port = free_port()
        args = [exe, "-p", str(port), "-s", str(size), "-n", str(iters)]
        server = subprocess.Popen(cpu(1) + launcher + args, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 15
            while not port_listening(port):
                if server.poll() is not None:
                    out = server.stdout.read() if server.stdout else ""
                    raise BenchError("%s server exited early (%s)\n%s" % (prog, server.returncode, tail(out)))
                if time.monotonic() > deadline:
                    raise BenchError("%s server did not listen on port %d" % (prog, port))
                time.sleep(0.02)
            try:
                out = run_cmd(cpu(0) + launcher + args + ["127.0.0.1"], timeout, env=env, what=prog)
            except BenchError as e:
                if attempt < 2 and "Correlation coefficient" in str(e):
                    continue
                raise
        finally:
            kill_group(server)
            if server.stdout:
                server.stdout.close()
        return parse_perftest(out, prog, size)
    raise BenchError("%s: could not calibrate its clock three times (machine busy)" % prog)


def parse_perftest(out, prog, size):
    """The result row starts with the size: lat programs print #bytes
    #iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (usec);
    bw programs #bytes #iterations BW_peak BW_average (MB/s, MB = 2^20) MsgRate (Mpps)."""
    num = r"[-+]?\d+(?:\.\d+)?"
    for line in out.splitlines():
        vals = re.findall(num, line)
        if not vals or not re.match(r"\s*%d\s" % size, line) or re.search(r"[A-Za-z]", line):
            continue
        v = [float(x) for x in vals]
        if prog.endswith("_lat") and len(v) >= 8:
            return {"median_ns": v[4] * 1000.0, "mean_ns": v[5] * 1000.0, "p99_ns": v[7] * 1000.0}
        if prog.endswith("_bw") and len(v) >= 5:
            return {"gbps": v[3] * MIB / 1e9, "mmsgs_per_s": v[4]}
    raise BenchError("could not find a result row for %d bytes in %s output\n%s" % (size, prog, tail(out)))


def run_ucx(exe, test, size, iters, warm, cpu, timeout):
    env = dict(os.environ, UCX_TLS="posix,self")
    port = free_port()
    server = subprocess.Popen(cpu(1) + [exe, "-p", str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not port_listening(port):
            if server.poll() is not None:
                out = server.stdout.read() if server.stdout else ""
                raise BenchError("ucx_perftest server exited early (%s)\n%s"
                                 % (server.returncode, tail(out)))
            if time.monotonic() > deadline:
                raise BenchError("ucx_perftest server did not listen on port %d" % port)
            time.sleep(0.02)
        out = run_cmd(cpu(0) + [exe, "127.0.0.1", "-p", str(port), "-t", test, "-s", str(size),
                       "-n", str(iters), "-w", str(warm)], timeout, env=env, what="ucx_perftest")
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return parse_ucx(out, test)
    finally:
        kill_group(server)
        if server.stdout:
            server.stdout.close()


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


# ----------------------------------------------------------------- reports --

def host_line():
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d CPUs, Linux %s" % (cpu or "unknown CPU", os.cpu_count() or 0, platform.release())


def latency_limit(R, size):
    """Raw shm one-way latency + the time of one memcpy of `size` bytes."""
    shm = R.agg("shm", "lat", "median_ns")
    m = R.agg("memcpy", "bw", "gbps", size)
    if not shm or not m:
        return None
    return shm + size / m  # bytes / (10^9 B/s) = ns


def memcpy_rate_8(R):
    """The raw limit of an 8 B message rate: single-thread 8 B memcpys into
    shared memory per second (from the bandwidth baseline)."""
    m = R.agg("memcpy", "bw", "gbps", 8)
    return m * 1e9 / 8 if m else None


def event_numbers(R):
    """One-way medians of the event-mode experiment (None where missing)."""
    def pick(test, spin):
        return med([r.get("median_ns") for r in R.raw if r["source"] == "event"
                    and r.get("test") == test and r.get("spin_us") == spin])

    def pick99(test, spin):
        return med([r.get("p99_ns") for r in R.raw if r["source"] == "event"
                    and r.get("test") == test and r.get("spin_us") == spin])
    return {
        "poll": pick("poll_lat", "default"), "poll99": pick99("poll_lat", "default"),
        "spin": pick("event_lat", "default"), "spin99": pick99("event_lat", "default"),
        "block": pick("event_lat", "0"), "block99": pick99("event_lat", "0"),
        "futex": R.agg("event", "futex_lat", "median_ns"), "futex99": R.agg("event", "futex_lat", "p99_ns"),
        "eventfd": R.agg("event", "eventfd_lat", "median_ns"),
        "eventfd99": R.agg("event", "eventfd_lat", "p99_ns"),
    }


def event_summary(ev):
    """What blocking wake-ups cost and what spinning buys back, in words."""
    if not (ev["block"] and ev["poll"]):
        return []
    if ev["block"] > ev["poll"]:
        text = ("A blocking wake-up costs %s per one-way hop over polling (%s vs %s); the kernel's "
                "own futex ping-pong between two processes takes %s." % (
                    fmt_ns(ev["block"] - ev["poll"]), fmt_ns(ev["block"]), fmt_ns(ev["poll"]),
                    fmt_ns(ev["futex"])))
        if ev["spin"]:
            gain = ev["block"] - ev["spin"]
            text += (" The default adaptive spin gives %s: it buys back %s (%.0f%% of the wake-up cost)."
                     % (fmt_ns(ev["spin"]), fmt_ns(gain), 100.0 * gain / (ev["block"] - ev["poll"]))
                     if gain > 0 else
                     " The default adaptive spin gives %s: it buys nothing back in this run." % fmt_ns(ev["spin"]))
    else:
        text = ("In this run polling (%s) was slower than blocking (%s): the CPUs were busy, and a "
                "busy-polling side holds the CPU its descheduled partner needs, while a blocked one "
                "gives it up. Blocking wake-ups themselves cost about the kernel's futex ping-pong "
                "(%s); the adaptive spin gave %s." % (fmt_ns(ev["poll"]), fmt_ns(ev["block"]),
                                                      fmt_ns(ev["futex"]), fmt_ns(ev["spin"])))
    return [text, ""]


IMPORT_ROWS = [
    ("import_device", "`ibv_import_device` + `ibv_close_device`"),
    ("import_pd", "`ibv_import_pd` + `ibv_unimport_pd`"),
    ("import_mr", "`ibv_import_mr` + `ibv_unimport_mr`"),
    ("import_cq", "`svx_import_cq` + `svx_unimport_cq`"),
    ("import_qp", "`svx_import_qp` + `svx_unimport_qp`"),
    ("pack_unpack", "`svx_pack` + `svx_unpack` of PD, MR, CQ, QP (round trip)"),
    ("unpacked_close", "`ibv_close_device` of the unpacked context"),
    ("publish", "`svx_publish` (an MR)"),
    ("open", "`svx_open` + `ibv_close_device`"),
    ("unpublish", "`svx_unpublish`"),
    ("unix_rt", "baseline: raw AF_UNIX SOCK_SEQPACKET round trip, 64 B, two processes"),
]


def extra_sections(R):
    """Message rate, event-mode latency and import cost (markdown lines)."""
    L = []
    raw = memcpy_rate_8(R)
    if any(r["source"] == "rate" for r in R.raw):
        L += ["## Message rate, 8 B RDMA WRITE", "",
              "One client thread, round robin over N RC QPs with one shared send CQ: inline 8 B "
              "WRITEs, one `ibv_post_send` each, every 16th signalled, up to 64 outstanding per QP, "
              "%.2f s per N. Raw limit = single-thread 8 B memcpys into a shared mapping per second "
              "(the 8 B row of the memcpy baseline): any shared-memory transport must at least store "
              "the payload." % R.rate_time, "",
              "| QPs | softverbs | raw limit | ratio |", "|---:|---:|---:|---:|"]
        for q in (1, 4, 16):
            v = med([r.get("mmsgs_per_s") for r in R.raw if r["source"] == "rate" and r.get("qps") == q])
            L.append("| %d | %s | %s | %s |" % (
                q, "%.2f M msg/s" % v if v else "–", "%.0f M msg/s" % (raw / 1e6) if raw else "–",
                fmt_ratio(v * 1e6 / raw if v and raw else None)))
        L.append("")
    ev = event_numbers(R)
    if any(v for v in ev.values()):
        L += ["## Event-mode latency (completion channel), 8 B SEND/RECV", "",
              "Ping-pong where each side waits for its receive completion in `ibv_get_cq_event` "
              "(CQ armed with `ibv_req_notify_cq`), one-way median; beside the same ping-pong "
              "busy-polling the CQ, and two processes waking each other through the kernel "
              "(the limit for any blocking wake-up). `SOFTVERBS_SPIN_US=0`: the library sleeps at "
              "once; default: it spins up to 50 µs first (`spin_for_event`, adaptive).", "",
              "| mode | one-way median | p99 | vs futex ping-pong |", "|---|---:|---:|---:|"]
        for name, k in (("softverbs, polling (busy)", "poll"),
                        ("softverbs, event, `SOFTVERBS_SPIN_US=0` (blocking)", "block"),
                        ("softverbs, event, default adaptive spin", "spin"),
                        ("raw futex ping-pong (FUTEX_WAIT/WAKE on a shared word)", "futex"),
                        ("raw eventfd ping-pong (blocking read/write)", "eventfd")):
            v = ev[k]
            L.append("| %s | %s | %s | %s |" % (name, fmt_ns(v), fmt_ns(ev[k + "99"]),
                                               fmt_ratio(v / ev["futex"] if v and ev["futex"] else None)))
        L.append("")
        L += event_summary(ev)
    if any(r["source"] == "import" for r in R.raw):
        L += ["## Import and namespace cost, per call", "",
              "Between two processes: the owner creates a PD, MR, CQ and QP and hands them over with "
              "`svx_pack`; the importer times each call (median and mean over %d calls). Each is one "
              "or more round trips to the daemon." % R.import_iters, "",
              "| call | median | mean |", "|---|---:|---:|"]
        for test, name in IMPORT_ROWS:
            L.append("| %s | %s | %s |" % (name, fmt_ns(R.agg("import", test, "median_ns")),
                                           fmt_ns(R.agg("import", test, "mean_ns"))))
        L.append("")
        pd, rt = R.agg("import", "import_pd", "median_ns"), R.agg("import", "unix_rt", "median_ns")
        if pd and rt:
            L += ["One control round trip (`ibv_import_pd` is one daemon call; its unimport is local) "
                  "= %s the raw unix-socket round trip of the same run (issue 24's target: at most 2x)."
                  % fmt_ratio(pd / rt), ""]
    return L


def targets_section(R):
    """The targets of issue 7, each with the value measured in this run."""
    shm = R.agg("shm", "lat", "median_ns")
    wl = R.agg("softverbs", "write_lat", "median_ns", 8)
    sl = R.agg("softverbs", "send_lat", "median_ns", 8)
    ucx_put = R.agg("ucx", "ucp_put_lat", "median_ns", 8)
    ucx_am = R.agg("ucx", "ucp_am_lat", "median_ns", 8)

    def verdict(ok):
        return "–" if ok is None else ("met" if ok else "**not met**")

    rows = []
    r = wl / shm if wl and shm else None
    rows.append(("8 B RDMA WRITE one-way ≤ 1.25× raw ping-pong",
                 "%s vs %s = %s" % (fmt_ns(wl), fmt_ns(shm), fmt_ratio(r)), verdict(r and r <= 1.25)))
    shm2 = R.agg("shm", "lat2", "median_ns")
    if shm2:
        rows.append(("(the two-line raw ping-pong, the floor of a WRITE ping-pong)",
                     "%s vs %s = %s" % (fmt_ns(wl), fmt_ns(shm2), fmt_ratio(wl / shm2 if wl else None)),
                     "stated"))
    rows.append(("8 B RDMA WRITE ≤ UCX ucp_put_lat", "%s vs %s" % (fmt_ns(wl), fmt_ns(ucx_put)),
                 verdict(wl <= ucx_put if wl and ucx_put else None)))
    rows.append(("8 B SEND/RECV ≤ UCX ucp_am_lat", "%s vs %s" % (fmt_ns(sl), fmt_ns(ucx_am)),
                 verdict(sl <= ucx_am if sl and ucx_am else None)))
    for size in HIGHLIGHT:
        v = R.agg("softverbs", "write_bw", "gbps", size)
        m = R.agg("memcpy", "bw", "gbps", size)
        u = R.agg("ucx", "ucp_put_bw", "gbps", size)
        rows.append(("%s RDMA WRITE ≥ 90%% of memcpy" % fmt_size(size),
                     "%s vs %s = %s" % (fmt_gbps(v), fmt_gbps(m), fmt_ratio(v / m if v and m else None, pct=True)),
                     verdict(v >= 0.9 * m if v and m else None)))
        rows.append(("%s RDMA WRITE ≥ UCX ucp_put_bw" % fmt_size(size),
                     "%s vs %s" % (fmt_gbps(v), fmt_gbps(u)), verdict(v >= u if v and u else None)))
    ev = event_numbers(R)
    if ev["block"] and ev["poll"]:
        rows.append(("Event mode: what blocking wake-ups cost, what spinning buys back",
                     "blocking %s vs polling %s one-way (futex limit %s); adaptive spin %s" % (
                         fmt_ns(ev["block"]), fmt_ns(ev["poll"]), fmt_ns(ev["futex"]), fmt_ns(ev["spin"])),
                     "stated"))
    sc = [x for x in R.raw if x.get("bench") == "scale"]
    if sc:
        x = sc[-1]
        rows.append(("Scale: %d QPs and %d MRs work; memory per QP and MR" % (x["qps"], x["mrs"]),
                     "QP %.1f KiB process + %.1f KiB daemon; MR %.0f B + %.0f B" % (
                         x["process_bytes_per_qp"] / 1024, x["daemon_bytes_per_qp"] / 1024,
                         x["process_bytes_per_mr"], x["daemon_bytes_per_mr"]), "met"))
    L = ["", "## Targets (issue 7)", "", "| target | measured in this run | |", "|---|---|---|"]
    L += ["| %s | %s | %s |" % row for row in rows]
    bars = issue24_bars(R)
    if bars:
        L += ["", "## Targets (issue 24, items 1 and 2)", "",
              "Each as the measured cost over the target's limit, both from this run (at most 1 = met; "
              "a control round trip is `ibv_import_pd`). Items 3 and 4: `bench/cross_user.py` and "
              "`bench/roce_vs_tcp.sh`; the plot's right panel shows these rows.", "",
              "| measured / limit | ratio | |", "|---|---:|---|"]
        L += ["| %s | %.2f | %s |" % (b[0].replace("\n", " "), b[1], verdict(b[1] <= 1)) for b in bars]
    return "\n".join(L) + "\n"


def missing_numbers(R):
    """Rows of the report that should hold a number and do not (for --check)."""
    want = [("shm", "lat", None, "median_ns"), ("softverbs", "write_lat", 8, "median_ns"),
            ("softverbs", "send_lat", 8, "median_ns")]
    for size in R.bw_sizes:
        want += [("memcpy", "bw", size, "gbps")]
        want += [("softverbs", t, size, "gbps") for t in ("write_bw", "read_bw", "send_bw")]
    for size in R.sweep_sizes:
        want += [("sweep", t, size, "median_iter_ns") for t in ("write_lat", "read_lat", "send_lat")]
    want += [("import", t, None, "median_ns") for t, _ in IMPORT_ROWS]
    want += [("event", t, None, "median_ns") for t in ("futex_lat", "eventfd_lat")]
    for prog, size in (("ib_write_lat", 8), ("ib_send_lat", 8), ("ib_write_bw", 64 * KIB), ("ib_write_bw", MIB)):
        if shutil.which(prog):
            want.append(("perftest", prog, size, "gbps" if prog.endswith("_bw") else "median_ns"))
    if shutil.which("ucx_perftest") and not R.args.no_ucx:
        want += [("ucx", "ucp_put_lat", 8, "median_ns"), ("ucx", "ucp_am_lat", 8, "median_ns"),
                 ("ucx", "ucp_put_bw", 64 * KIB, "gbps"), ("ucx", "ucp_put_bw", MIB, "gbps")]
    out = ["%s %s%s" % (src, t, " %s" % fmt_size(sz) if sz else "") for src, t, sz, k in want
           if not R.agg(src, t, k, sz)]
    for q in (1, 4, 16):
        if not med([r.get("mmsgs_per_s") for r in R.raw if r["source"] == "rate" and r.get("qps") == q]):
            out.append("message rate %d QPs" % q)
    ev = event_numbers(R)
    out += ["event %s" % k for k in ("poll", "block", "spin") if not ev[k]]
    if not any(r.get("bench") == "scale" for r in R.raw):
        out.append("scale")
    if not any(r.get("bench") == "atomic" for r in R.raw):
        out.append("atomic rate")
    return out


def build_report(R, verbs_state):
    """verbs_state: 'ok', 'missing-lib', 'missing-bin', 'failed'."""
    have_ucx = any(r["source"] == "ucx" for r in R.raw)
    L = []
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    L.append("# softverbs benchmark results")
    L.append("")
    L.append("%s · %s mode · %d round(s) interleaved · %s"
             % (now, "quick" if R.quick else "full", R.rounds, host_line()))
    L.append("")
    L.append("Machine noise: %s%s." % (R.load_text, " — **busy machine, expect noisy numbers**"
                                        if R.busy else ""))
    L.append("")
    if verbs_state == "missing-lib":
        L.append("**softverbs library not built** (`%s/libibverbs.so.1` missing): baselines only."
                 % R.lib_dir)
        L.append("")
    elif verbs_state == "missing-bin":
        L.append("**verbs_bench not built**: baselines only.")
        L.append("")
    if R.failures:
        L.append("**Failures:**")
        L.append("")
        for f in R.failures:
            L.append("- " + short_failure(f))
        L.append("")

    # Latency
    shm = R.agg("shm", "lat", "median_ns")
    shm99 = R.agg("shm", "lat", "p99_ns")
    ucx_put = R.agg("ucx", "ucp_put_lat", "median_ns", 8)
    ucx_am = R.agg("ucx", "ucp_am_lat", "median_ns", 8)
    L.append("## Latency, 8 B, one-way (RTT/2)")
    L.append("")
    L.append("Median over the iterations of each run, then median over rounds. "
             "Ratio = softverbs / raw shared-memory cache-line ping-pong (1.0 = the hardware limit). "
             "Peer = UCX over posix shared memory for the same kind of operation "
             "(ucp_put_lat for WRITE, ucp_am_lat for SEND/RECV).")
    L.append("")
    L.append("| operation | median | p99 | raw shm ping-pong | ratio | UCX peer | softverbs / UCX |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    rows = [("RDMA WRITE (verbs_bench)", R.agg("softverbs", "write_lat", "median_ns", 8),
             R.agg("softverbs", "write_lat", "p99_ns", 8), ucx_put),
            ("SEND/RECV (verbs_bench)", R.agg("softverbs", "send_lat", "median_ns", 8),
             R.agg("softverbs", "send_lat", "p99_ns", 8), ucx_am),
            ("RDMA READ, whole round trip (verbs_bench)", R.agg("sweep", "read_lat", "median_ns", 8),
             R.agg("sweep", "read_lat", "p99_ns", 8), None),
            ("perftest `ib_write_lat` over softverbs", R.agg("perftest", "ib_write_lat", "median_ns", 8),
             R.agg("perftest", "ib_write_lat", "p99_ns", 8), ucx_put),
            ("perftest `ib_send_lat` over softverbs", R.agg("perftest", "ib_send_lat", "median_ns", 8),
             R.agg("perftest", "ib_send_lat", "p99_ns", 8), ucx_am)]
    for name, v, v99, peer in rows:
        L.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, fmt_ns(v), fmt_ns(v99), fmt_ns(shm), fmt_ratio(v / shm if v and shm else None),
            fmt_ns(peer), fmt_ratio(v / peer if v and peer else None)))
    L.append("")
    L.append("Raw shm ping-pong p99: %s. UCX / raw shm: put_lat %s, am_lat %s. An RDMA READ is "
             "carried out by the reader alone (a copy out of the target's registered memory), "
             "so its round trip needs no cache line to go and come back." % (
                 fmt_ns(shm99), fmt_ratio(ucx_put / shm if ucx_put and shm else None),
                 fmt_ratio(ucx_am / shm if ucx_am and shm else None)))
    shm2 = R.agg("shm", "lat2", "median_ns")
    wl = R.agg("softverbs", "write_lat", "median_ns", 8)
    if shm2:
        L.append("")
        L.append("Raw two-line ping-pong (`shm_pingpong --test lat2`: each process polls a line of its own "
                 "and writes the other's, the pattern of an RDMA WRITE ping-pong, where each side polls "
                 "its own buffer): %s, %s the one-line ping-pong; RDMA WRITE / two-line = %s." % (
                     fmt_ns(shm2), fmt_ratio(shm2 / shm if shm else None),
                     fmt_ratio(wl / shm2 if wl else None)))
    L.append("")

    # Latency against size
    if any(r["source"] == "sweep" for r in R.raw):
        L.append("## Latency against message size")
        L.append("")
        L.append("One-way (RTT/2) for WRITE and SEND/RECV, the whole round trip for READ; plain median "
                 "of the individual round trips (at large sizes there are too few for the batch median "
                 "of the 8 B table, and one preempted round trip would spoil a whole batch). Measured "
                 "once, not interleaved with the baselines. "
                 "Limit = raw shm ping-pong + one memcpy of the size (from the bandwidth table): "
                 "a message cannot arrive sooner than a cache line plus a copy of the data. "
                 "Large sizes run fewer iterations (at most %s per size)." % R.sweep_bytes)
        L.append("")
        L.append("| size | WRITE | READ | SEND/RECV | limit | WRITE / limit | READ / limit | SEND / limit |")
        L.append("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for size in R.sweep_sizes:
            w = R.agg("sweep", "write_lat", "median_iter_ns", size)
            rd = R.agg("sweep", "read_lat", "median_iter_ns", size)
            sd = R.agg("sweep", "send_lat", "median_iter_ns", size)
            lim = latency_limit(R, size)
            L.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                fmt_size(size), fmt_ns(w), fmt_ns(rd), fmt_ns(sd), fmt_ns(lim),
                *[fmt_ratio(x / lim if x and lim else None) for x in (w, rd, sd)]))
        L.append("")

    # Bandwidth
    L.append("## Bandwidth, RDMA WRITE, READ and SEND/RECV vs single-thread memcpy")
    L.append("")
    L.append("GB/s = 10^9 bytes/s. softverbs: one client, %d-WR window (signalled every 16th), "
             "%.2f s per size; SEND/RECV: the server reposts each receive as it consumes it. "
             "memcpy: hot buffers, same sizes. Ratio = softverbs / memcpy. Rows in bold are the "
             "headline sizes; UCX ucp_put_bw and perftest's ib_write_bw (over softverbs) there." % (64, R.bw_time))
    L.append("")
    L.append("| size | WRITE | READ | SEND/RECV | memcpy | WRITE / memcpy | READ / memcpy | SEND / memcpy "
             "| UCX put_bw | perftest ib_write_bw |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in R.bw_sizes:
        v = [R.agg("softverbs", t, "gbps", size) for t in ("write_bw", "read_bw", "send_bw")]
        m = R.agg("memcpy", "bw", "gbps", size)
        u = R.agg("ucx", "ucp_put_bw", "gbps", size)
        pt = R.agg("perftest", "ib_write_bw", "gbps", size)
        cells = [fmt_size(size)] + [fmt_gbps(x) for x in v] + [fmt_gbps(m)] + \
                [fmt_ratio(x / m if x and m else None) for x in v] + [fmt_gbps(u), fmt_gbps(pt)]
        if size in HIGHLIGHT:
            cells = ["**%s**" % c if c != "–" else c for c in cells]
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L += extra_sections(R)

    # Headline
    head = []
    wl = R.agg("softverbs", "write_lat", "median_ns", 8)
    if wl and shm:
        head.append("WRITE 8 B latency %s = %.2f× raw shm" % (fmt_ns(wl), wl / shm))
    for size in HIGHLIGHT:
        v = R.agg("softverbs", "write_bw", "gbps", size)
        m = R.agg("memcpy", "bw", "gbps", size)
        if v and m:
            head.append("WRITE %s %s = %.0f%% of memcpy" % (fmt_size(size), fmt_gbps(v), 100 * v / m))
    if head:
        L.insert(4, "**Summary:** " + "; ".join(head) + ".")
        L.insert(5, "")
    if R.notes:
        L.append("Notes:")
        L.append("")
        for n in R.notes:
            L.append("- " + n)
        L.append("")
    return "\n".join(L) + "\n"


def make_plot(R, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log("warning: matplotlib not available (%s); no PNG written" % e)
        return False
    fig, (ax1, ax2, ax3, ax4) = plt.subplots(1, 4, figsize=(24, 5.5), gridspec_kw={"width_ratios": [3, 3, 2, 2]})

    def series(source, test):
        xs, ys = [], []
        for size in R.bw_sizes:
            v = R.agg(source, test, "gbps", size)
            if v:
                xs.append(size)
                ys.append(v)
        return xs, ys

    xs, ys = series("memcpy", "bw")
    if xs:
        ax1.plot(xs, ys, "o-", color="gray", label="memcpy (1 thread, hot)")
    xs, ys = series("softverbs", "write_bw")
    if xs:
        ax1.plot(xs, ys, "s-", color="tab:blue", label="softverbs RDMA WRITE")
    ux, uy = [], []
    for size in HIGHLIGHT:
        v = R.agg("ucx", "ucp_put_bw", "gbps", size)
        if v:
            ux.append(size)
            uy.append(v)
    if ux:
        ax1.plot(ux, uy, "D", color="tab:orange", markersize=8, label="UCX ucp_put_bw (posix)")
    for size in HIGHLIGHT:
        ax1.axvline(size, color="lightgray", linestyle=":", zorder=0)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("message size (bytes)")
    ax1.set_ylabel("GB/s (10^9 B/s)")
    ax1.set_title("Bandwidth")
    ticks = [s for s in R.bw_sizes if s in (8, 64, 512, 4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB)]
    ax1.set_xticks(ticks)
    ax1.set_xticklabels([fmt_size(s) for s in ticks])
    ax1.grid(True, which="both", alpha=0.3)

    for test, style, color, label in (("read_bw", "^-", "tab:green", "softverbs RDMA READ"),
                                      ("send_bw", "v-", "tab:cyan", "softverbs SEND/RECV")):
        xs, ys = series("softverbs", test)
        if xs:
            ax1.plot(xs, ys, style, color=color, label=label, markersize=4)
    ax1.legend(loc="lower right", fontsize=8)

    # Latency against size: softverbs beside the limit (ping-pong + memcpy).
    for test, style, color, label in (("write_lat", "s-", "tab:blue", "softverbs WRITE (one-way)"),
                                      ("read_lat", "^-", "tab:green", "softverbs READ (round trip)"),
                                      ("send_lat", "v-", "tab:cyan", "softverbs SEND/RECV (one-way)")):
        pts = [(sz, R.agg("sweep", test, "median_iter_ns", sz)) for sz in R.sweep_sizes]
        pts = [p for p in pts if p[1]]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=label, markersize=4)
    lim = [(sz, latency_limit(R, sz)) for sz in R.sweep_sizes]
    lim = [p for p in lim if p[1]]
    if lim:
        ax2.plot([p[0] for p in lim], [p[1] for p in lim], "o-", color="gray",
                 label="limit: shm ping-pong + memcpy")
    for test, marker, label in (("ucp_put_lat", "D", "UCX ucp_put_lat"), ("ucp_am_lat", "P", "UCX ucp_am_lat")):
        v = R.agg("ucx", test, "median_ns", 8)
        if v:
            ax2.plot([8], [v], marker, color="tab:orange" if test == "ucp_put_lat" else "tab:red",
                     markersize=8, label=label)
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("message size (bytes)")
    ax2.set_ylabel("latency, ns (median)")
    ax2.set_title("Latency")
    ticks = [s for s in R.sweep_sizes if s in (8, 64, 512, 4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB)]
    ax2.set_xticks(ticks)
    ax2.set_xticklabels([fmt_size(s) for s in ticks])
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(loc="upper left", fontsize=8)

    ev = event_numbers(R)
    bars = [("raw shm\nping-pong", R.agg("shm", "lat", "median_ns"), "gray"),
            ("WRITE", R.agg("softverbs", "write_lat", "median_ns", 8), "tab:blue"),
            ("SEND/\nRECV", R.agg("softverbs", "send_lat", "median_ns", 8), "tab:cyan"),
            ("UCX\nput_lat", R.agg("ucx", "ucp_put_lat", "median_ns", 8), "tab:orange"),
            ("UCX\nam_lat", R.agg("ucx", "ucp_am_lat", "median_ns", 8), "tab:red"),
            ("event,\nspin", ev["spin"], "tab:purple"),
            ("event,\nno spin", ev["block"], "tab:pink"),
            ("raw\nfutex", ev["futex"], "dimgray")]
    bars = [b for b in bars if b[1]]
    if bars:
        pos = range(len(bars))
        ax3.bar(pos, [b[1] for b in bars], color=[b[2] for b in bars])
        ax3.set_xticks(list(pos))
        ax3.set_xticklabels([b[0] for b in bars], fontsize=7)
        for i, b in enumerate(bars):
            ax3.text(i, b[1], fmt_ns(b[1]), ha="center", va="bottom", fontsize=7)
        vals = [b[1] for b in bars]
        if max(vals) / min(vals) > 20:
            ax3.set_yscale("log")
    ax3.set_ylabel("one-way latency, ns (median)")
    ax3.set_title("8 B one-way latency")
    ax3.grid(True, axis="y", alpha=0.3)
    issue24_panel(R, ax4)
    fig.suptitle("softverbs vs raw shared memory (%s mode)" % ("quick" if R.quick else "full"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def issue24_bars(R):
    """Issue 24's control-path targets (items 1 and 2) as fractions of their
    limits, from this run: (label, value / limit). At most 1 = met."""
    def reg(size, key):
        v = [r.get(key) for r in R.raw if r.get("bench") == "reg" and r.get("size") == size]
        return med([x for x in v if x is not None and x > 0])
    rt = R.agg("import", "import_pd", "median_ns")  # one control round trip
    unix = R.agg("import", "unix_rt", "median_ns")
    bars = []

    def add(label, value, limit):
        if value and limit:
            bars.append((label, value / limit))
    for size, name in ((4096, "4 KiB"), (1 << 20, "1 MiB")):
        lock = reg(size, "mlock_munlock_ns")
        add("reg+dereg %s\n/ 3x mlock" % name, reg(size, "reg_dereg_ns"), 3 * lock if lock else None)
    add("held 4 KiB\n/ 2 round trips", reg(4096, "reg_dereg_held_ns"), 2 * rt if rt else None)
    add("round trip\n/ 2x unix", rt, 2 * unix if unix else None)
    for test, name in (("import_mr", "import_mr"), ("import_cq", "import_cq"), ("import_qp", "import_qp")):
        add("%s + unimport\n/ 3 round trips" % name, R.agg("import", test, "median_ns"), 3 * rt if rt else None)
    add("import_device\n/ 0.5 ms", R.agg("import", "import_device", "median_ns"), 0.5e6)
    add("svx_open\n/ 0.5 ms", R.agg("import", "open", "median_ns"), 0.5e6)
    return bars


def issue24_panel(R, ax):
    bars = issue24_bars(R)
    if not bars:
        ax.set_visible(False)
        return
    pos = range(len(bars))
    ax.bar(pos, [b[1] for b in bars], color=["tab:green" if b[1] <= 1 else "tab:red" for b in bars])
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="target (issue 24)")
    ax.set_xticks(list(pos))
    ax.set_xticklabels([b[0] for b in bars], fontsize=6, rotation=60, ha="right")
    for i, b in enumerate(bars):
        ax.text(i, b[1], "%.2f" % b[1], ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("measured / target's limit (at most 1 = met)")
    ax.set_title("Control path against issue 24's targets")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)


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


def main():
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
    # SIGTERM unwinds like an exception: run_cmd's `finally` then kills the
    # running benchmark's process group and the private daemon directory goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")

    build = resolve_dir(args.build)

    def first_with(dirs, name):
        for d in dirs:
            if os.path.exists(os.path.join(d, name)):
                return d
        return dirs[0]

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
    # A daemon of this very build, in a directory of its own, unless the
    # caller chose one: the per-user default may hold a daemon of another
    # build (or another engineer's benchmark) and its memory would mix into ours.
    if not os.environ.get("SOFTVERBS_DIR"):
        import atexit
        import tempfile
        private = tempfile.mkdtemp(prefix="softverbs-bench-")  # mode 0700, as the library requires
        os.environ["SOFTVERBS_DIR"] = private
        atexit.register(shutil.rmtree, private, True)
        log("daemon directory %s (set SOFTVERBS_DIR to choose one)" % private)
    if not os.access(R.shm_bin, os.X_OK):
        sys.stderr.write("error: %s not found. Build the benchmarks first, e.g.\n"
                         "  cmake --build %s --target shm_pingpong verbs_bench\n"
                         "or pass --bench-bin DIR.\n" % (R.shm_bin, build))
        return 1

    tool = os.path.join(first_with([os.path.join(build, "src", "tools"),
                                    os.path.join(build, "bin")], "softverbs"), "softverbs")
    R.launcher = []
    if args.launcher == "tool" or (args.launcher == "auto" and os.access(tool, os.X_OK)):
        if not os.access(tool, os.X_OK):
            sys.stderr.write("error: --launcher tool but %s does not exist\n" % tool)
            return 1
        R.launcher = [tool, "run", "--"]
        log("running verbs_bench via '%s run --' (use --launcher env to bypass)" % tool)

    verbs_state = "ok"
    if not os.path.exists(os.path.join(lib_dir, "libibverbs.so.1")):
        verbs_state = "missing-lib"
        log("softverbs library not built (%s/libibverbs.so.1 missing); running baselines only"
            % lib_dir)
    elif not os.access(R.verbs_bin, os.X_OK):
        verbs_state = "missing-bin"
        log("verbs_bench not built (%s); running baselines only" % R.verbs_bin)

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
    if verbs_state == "ok" and R.failures:
        verbs_state = "failed"
    noise = meter.result()
    R.load_text = load_line(load0, noise)
    R.busy = bool(noise and noise[0] + noise[1] > 10)
    if R.busy:
        log("warning: other processes used %.0f%% of the CPUs during the run (steal %.0f%%); "
            "the numbers are noisy" % noise)

    report = build_report(R, verbs_state)
    if verbs_state == "ok":
        report += reg_atomic_section(R, bench_bin)
        report += targets_section(R)
    os.makedirs(args.out, exist_ok=True)
    md_path = os.path.join(args.out, "latest.md")
    png_path = os.path.join(args.out, "latest.png")
    with open(md_path, "w") as f:
        f.write(report)
        if have_matplotlib():
            f.write("\n![plot](latest.png)\n")
    with open(os.path.join(args.out, "latest.jsonl"), "w") as f:
        for r in R.raw:
            f.write(json.dumps(r) + "\n")
    plotted = make_plot(R, png_path)
    sys.stdout.write(report)
    sys.stdout.flush()
    log("wrote %s%s" % (md_path, ", " + png_path if plotted else ""))

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


if __name__ == "__main__":
    maybe_reexec_for_matplotlib()
    sys.exit(main())
