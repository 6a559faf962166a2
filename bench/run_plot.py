"""The benchmark driver's (run.py) plot, latest.png: bandwidth and latency
against size, 8 B latency, and the control path against its targets."""

from run_report import control_bars, event_numbers, latency_limit
from run_util import HIGHLIGHT, KIB, MIB, fmt_ns, fmt_size, log

def bw_series(R, source, test):
    """(sizes, GB/s) of one bandwidth test, where it has a number."""
    xs, ys = [], []
    for size in R.bw_sizes:
        v = R.agg(source, test, "gbps", size)
        if v:
            xs.append(size)
            ys.append(v)
    return xs, ys


def size_axis(ax, sizes):
    """Log-log axes over message sizes, ticks at the usual sizes."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ticks = [s for s in sizes if s in (8, 64, 512, 4 * KIB, 64 * KIB, 1 * MIB, 4 * MIB)]
    ax.set_xticks(ticks)
    ax.set_xticklabels([fmt_size(s) for s in ticks])
    ax.grid(True, which="both", alpha=0.3)


def bandwidth_panel(R, ax1):
    """Bandwidth against size: softverbs beside memcpy and UCX."""
    xs, ys = bw_series(R, "memcpy", "bw")
    if xs:
        ax1.plot(xs, ys, "o-", color="gray", label="memcpy (1 thread, hot)")
    xs, ys = bw_series(R, "softverbs", "write_bw")
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
    size_axis(ax1, R.bw_sizes)
    ax1.set_ylabel("GB/s (10^9 B/s)")
    ax1.set_title("Bandwidth")

    for test, style, color, label in (("read_bw", "^-", "tab:green", "softverbs RDMA READ"),
                                      ("send_bw", "v-", "tab:cyan", "softverbs SEND/RECV")):
        xs, ys = bw_series(R, "softverbs", test)
        if xs:
            ax1.plot(xs, ys, style, color=color, label=label, markersize=4)
    ax1.legend(loc="lower right", fontsize=8)


def latency_panel(R, ax2):
    """Latency against size: softverbs beside the limit (ping-pong + memcpy)."""
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
    size_axis(ax2, R.sweep_sizes)
    ax2.set_ylabel("latency, ns (median)")
    ax2.set_title("Latency")
    ax2.legend(loc="upper left", fontsize=8)


def small_latency_panel(R, ax3):
    """8 B one-way latency of each kind, as bars."""
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


def make_plot(R, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log("warning: matplotlib not available (%s); no PNG written" % e)
        return False
    fig, (ax1, ax2, ax3, ax4) = plt.subplots(1, 4, figsize=(24, 5.5), gridspec_kw={"width_ratios": [3, 3, 2, 2]})
    bandwidth_panel(R, ax1)
    latency_panel(R, ax2)
    small_latency_panel(R, ax3)
    control_panel(R, ax4)
    fig.suptitle("softverbs vs raw shared memory (%s mode)" % ("quick" if R.quick else "full"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def control_panel(R, ax):
    bars = control_bars(R)
    if not bars:
        ax.set_visible(False)
        return
    pos = range(len(bars))
    ax.bar(pos, [b[1] for b in bars], color=["tab:green" if b[1] <= 1 else "tab:red" for b in bars])
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="target")
    ax.set_xticks(list(pos))
    ax.set_xticklabels([b[0] for b in bars], fontsize=6, rotation=60, ha="right")
    for i, b in enumerate(bars):
        ax.text(i, b[1], "%.2f" % b[1], ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("measured / target's limit (at most 1 = met)")
    ax.set_title("Control path against its targets")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
