"""The benchmark driver's (run.py) Markdown report: each section from the
records a Runner gathered, every softverbs number beside its baseline from
the same run."""

import datetime
import os
import platform
import shutil

from run_util import HIGHLIGHT, KIB, MIB, fmt_gbps, fmt_ns, fmt_ratio, fmt_size, med, short_failure

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
                  "= %s the raw unix-socket round trip of the same run (the target: at most 2x)."
                  % fmt_ratio(pd / rt), ""]
    return L


def targets_section(R):
    """The one-host data-path targets (docs/PERFORMANCE.md), each with the value measured in this run."""
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
    L = ["", "## Targets: the data path on one host", "", "| target | measured in this run | |", "|---|---|---|"]
    L += ["| %s | %s | %s |" % row for row in rows]
    bars = control_bars(R)
    if bars:
        L += ["", "## Targets: registration and control calls", "",
              "Each as the measured cost over the target's limit, both from this run (at most 1 = met; "
              "a control round trip is `ibv_import_pd`). Between users and between hosts: `bench/cross_user.py` and "
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


def report_header(R, verbs_state):
    """Title, date, machine noise and what did not run or failed (lines)."""
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
    return L


def latency_section(R):
    """8 B one-way latency beside the raw ping-pong and the UCX peer (lines)."""
    L = []
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
    return L


def sweep_section(R):
    """Latency against message size beside its limit (lines; none if not run)."""
    if not any(r["source"] == "sweep" for r in R.raw):
        return []
    L = []
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
    return L


def bandwidth_section(R):
    """WRITE, READ and SEND/RECV bandwidth beside memcpy and the peers (lines)."""
    L = []
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
    return L


def headline(R):
    """The summary's phrases: 8 B WRITE latency and the headline bandwidths."""
    shm = R.agg("shm", "lat", "median_ns")
    head = []
    wl = R.agg("softverbs", "write_lat", "median_ns", 8)
    if wl and shm:
        head.append("WRITE 8 B latency %s = %.2f× raw shm" % (fmt_ns(wl), wl / shm))
    for size in HIGHLIGHT:
        v = R.agg("softverbs", "write_bw", "gbps", size)
        m = R.agg("memcpy", "bw", "gbps", size)
        if v and m:
            head.append("WRITE %s %s = %.0f%% of memcpy" % (fmt_size(size), fmt_gbps(v), 100 * v / m))
    return head


def build_report(R, verbs_state):
    """verbs_state: 'ok', 'missing-lib', 'missing-bin', 'failed'."""
    L = report_header(R, verbs_state)
    L += latency_section(R)
    L += sweep_section(R)
    L += bandwidth_section(R)
    L += extra_sections(R)
    head = headline(R)
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


def control_bars(R):
    """The registration and control-path targets as fractions of their
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
