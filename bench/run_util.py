"""Helpers of the benchmark driver (run.py): logging, running a benchmark
program with a hard timeout, parsing its JSON lines, formatting numbers."""

import json
import os
import re
import signal
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
