"""compare.py's plots, drawn with matplotlib (run by the virtualenv's python, which has it):

    plot.py SPEC.json

SPEC names the latency logs (cairn-bench --latency-log: a `#` line, then `<answered µs since
the run started>,<latency µs>` lines) and where the PNGs go; the names of the files drawn are
printed, one a line.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter  # noqa: E402

COLORS = {"cairn": "tab:blue", "etcd-3.4": "tab:orange", "etcd-3.5": "tab:green", "etcd-3.7": "tab:red"}
# Points per CDF curve (quantiles of the sorted latencies).
CDF_POINTS = 2000
# The fractions marked on a CDF's axis.
CDF_TICKS = [0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999]
# The defragmentation timeline's bins, in seconds.
BIN = 0.5


def read_log(path):
    """[(answered s, latency s)] of a latency log."""
    out = []
    with open(path) as f:
        for line in f:
            if not line.startswith("#"):
                at, took = line.split(",")
                out.append((int(at) / 1e6, int(took) / 1e6))
    return out


def latency_cdfs(panels, targets, out):
    """One panel per workload: the fraction of requests answered within a latency, per target,
    on a logit scale so that the tail (p99, p99.9) gets room."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for t in targets:
            if t not in panel["series"]:
                continue
            lat = sorted(took * 1000 for _, took in read_log(panel["series"][t]))
            n = len(lat)
            if n < 2:
                continue
            idx = sorted({min(n - 1, int(i * n / CDF_POINTS)) for i in range(CDF_POINTS)} | {n - 1})
            xs = [lat[i] for i in idx]
            ys = [(i + 0.5) / n for i in idx]
            ax.plot(xs, ys, label=f"{t} ({n:,} requests)", color=COLORS.get(t))
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("logit")
        ax.set_ylim(0.01, 0.9999)
        ax.yaxis.set_major_locator(FixedLocator(CDF_TICKS))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v * 100:g}%"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("requests answered within")
        ax.set_title(panel["title"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def binned(answers):
    """(bin's middle in s, answers per second in it, their p99 in ms) for each whole BIN of the
    run (the last, partial one left out)."""
    bins = {}
    for at, took in answers:
        bins.setdefault(int(at / BIN), []).append(took)
    out = []
    for b in range(0, max(bins) if bins else 0):
        xs = sorted(bins.get(b, []))
        p99 = xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000 if xs else None
        out.append(((b + 0.5) * BIN, len(xs) / BIN, p99))
    return out


def defrag_timelines(series, targets, rate, out):
    """One row per target: writes answered per second (left axis) and the p99 of each BIN
    (right axis, log), with the compaction and the defragmentation shaded."""
    shown = [t for t in targets if t in series]
    fig, axes = plt.subplots(len(shown), 1, figsize=(10, 2.8 * len(shown)), sharex=True, squeeze=False)
    for ax, t in zip(axes[:, 0], shown):
        s = series[t]
        rows = binned(read_log(s["latency_log"]))
        ax.axvspan(*s["compact"], color="0.85", label="compaction")
        ax.axvspan(*s["defrag"], color="0.6", label="defragmentation")
        ax.plot([r[0] for r in rows], [r[1] for r in rows], color=COLORS.get(t), label="answers/s")
        ax.axhline(rate, color="0.4", linestyle=":", linewidth=1)
        ax.set_ylabel("answers/s")
        # Headroom above the curves for the legend.
        ax.set_ylim(0, max([r[1] for r in rows] + [rate]) * 1.45)
        right = ax.twinx()
        right.plot([r[0] for r in rows if r[2]], [r[2] for r in rows if r[2]], color="tab:red",
                   linestyle="--", linewidth=1, label=f"p99 of each {BIN:g} s (ms)")
        right.set_yscale("log")
        right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        right.set_ylabel("p99 (ms)")
        ax.set_title(f"{t}: compaction {s['compact'][1] - s['compact'][0]:.1f} s, "
                     f"defragmentation {s['defrag'][1] - s['defrag'][0]:.1f} s", fontsize="medium")
        handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left", fontsize="small", ncol=4)
    axes[-1, 0].set_xlabel("seconds since the writes started")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    spec = json.loads(Path(sys.argv[1]).read_text())
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    files = spec["files"]
    if spec.get("cdf"):
        latency_cdfs(spec["cdf"], spec["targets"], out_dir / files["cdf"])
        print(files["cdf"])
    if spec.get("defrag"):
        defrag_timelines(spec["defrag"], spec["targets"], spec.get("defrag_rate", 0), out_dir / files["defrag"])
        print(files["defrag"])


if __name__ == "__main__":
    main()
