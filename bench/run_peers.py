"""The peers the benchmark driver (run.py) measures beside softverbs:
perftest's programs over softverbs, and UCX's ucx_perftest over posix shared
memory, each a server and a client on 127.0.0.1."""

import os
import re
import socket
import subprocess
import time

from run_util import MIB, BenchError, kill_group, run_cmd, tail

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
