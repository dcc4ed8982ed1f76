#!/usr/bin/env python3
"""The largest Kubernetes cluster a target carries: the largest N (nodes, with N/25 pods created per
second) for which `cairn-bench k8s` keeps the p99 of all writes under 10 ms.

The search starts at 250 nodes and doubles N until a step fails (p99 at or over the limit, more than
1% of the writes sent behind schedule or failed) or the cap (64,000) is reached, then bisects
between the last good N and the first bad one a few times. Every step runs on a fresh data dir:
the caller's `start(members)` starts the target and returns its client endpoints, `stop()` stops it.

    benches/compare/k8s.py --binary target/release/cairn --dir /var/tmp/k8s --step-seconds 20
    benches/compare/k8s.py --binary /usr/bin/etcd --name etcd-3.4 --dir /var/tmp/k8s

From Python (the Target of compare.py, or of targets.py, has the interface):

    best, steps = largest_n(bench_bin, lambda m: target.start(data_dir, m), target.stop, members=1)
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

P99_LIMIT_US = 10_000
BEHIND_LIMIT = 0.01
FAILED_LIMIT = 0.01


def log(*args):
    print("[k8s]", *args, file=sys.stderr, flush=True)


def run_step(bench_bin, endpoints, n, step_seconds, warmup=5, bench_args=(), k8s_args=()):
    """Runs `cairn-bench k8s --nodes n` for `warmup` unmeasured and `step_seconds` measured seconds;
    its JSON report, or {"error": ...} if it printed none."""
    # With the default 15 s a short step would see one compaction or none.
    compact_interval = min(15.0, step_seconds / 2)
    cmd = ([str(bench_bin), "--endpoints", ",".join(endpoints), "--json", "--seconds", str(step_seconds)]
           + list(bench_args)
           + ["k8s", "--nodes", str(n), "--compact-interval", f"{compact_interval:g}", "--warmup", f"{warmup:g}"]
           + list(k8s_args))
    log("$", " ".join(cmd))
    # Creating the objects first takes a while at large N; a stuck target must not hang the search.
    limit = 3 * (warmup + step_seconds) + 300
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"cairn-bench did not finish within {limit:g} s"}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"cairn-bench exited with {p.returncode}: {p.stderr.strip()[-500:]}"}


def verdict(out, p99_limit_us=P99_LIMIT_US):
    """(good, why) for one step's report."""
    if "error" in out:
        return False, out["error"]
    if out.get("failure"):
        return False, out["failure"]
    p99 = out.get("write_p99_us")
    ok, failed = out.get("ok") or 0, out.get("failed") or 0
    behind = out.get("behind_schedule_fraction") or 0.0
    if p99 is None or ok == 0:
        return False, "no write succeeded"
    if failed > FAILED_LIMIT * (ok + failed):
        return False, f"{failed} of {ok + failed} writes failed"
    if behind > BEHIND_LIMIT:
        return False, f"{behind:.1%} of the writes sent behind schedule"
    if p99 >= p99_limit_us:
        return False, f"write p99 {p99 / 1000:.1f} ms"
    return True, f"write p99 {p99 / 1000:.2f} ms"


def largest_n(bench_bin, start_target, stop_target, members=1, step_seconds=20, start_n=250, cap=64_000,
              floor=25, bisect_steps=2, warmup=5, retries=1, p99_limit_us=P99_LIMIT_US, bench_args=(),
              k8s_args=(), cpu_seconds=None):
    """Finds the largest N whose all-writes p99 stays under `p99_limit_us`.

    `start_target(members)` starts the target on a fresh data dir and returns its client endpoints;
    `stop_target()` stops it. If `start_n` is already bad, N is halved down to `floor` (below it a
    10 s step has too few writes for a p99). Each step first runs `warmup` seconds unmeasured: a
    server on a fresh data dir is slower in its first seconds (cairn's p99 at 250 nodes measured
    11 to 108 ms with 2 s of warm-up, 4 ms with 8 s). A bad step is run again, up to `retries`
    times, and counts as good if any run was: on a small VM disk whose fdatasync p99.9 is over
    20 ms, one stall decides a short step's p99. Returns (the largest good N, or None if even the
    smallest tried was bad; the steps in the order run, each a dict with n, good, why, the headline
    figures and the report). With `cpu_seconds` (the target's CPU time so far, in seconds), each
    step also reports the target's CPU per write, `cpu_per_write_us`: its CPU over the whole step
    (the objects' creation and the warm-up included) over the writes of the whole step, counted
    as the measured rate times the step's seconds, warm-up included.
    """
    steps = []
    tried = {}

    def attempt(n):
        endpoints = start_target(members)
        cpu = None
        try:
            cpu_before = cpu_seconds() if cpu_seconds else None
            out = run_step(bench_bin, endpoints, n, step_seconds, warmup, bench_args, k8s_args)
            if cpu_before is not None:
                cpu = cpu_seconds() - cpu_before
        finally:
            stop_target()
        good, why = verdict(out, p99_limit_us)
        rate = out.get("writes_per_sec")
        writes = rate * (warmup + step_seconds) if rate else 0
        s = {"n": n, "good": good, "why": why, "write_p99_us": out.get("write_p99_us"),
             "writes_per_sec": rate, "behind_schedule_fraction": out.get("behind_schedule_fraction"),
             "cpu_per_write_us": cpu * 1e6 / writes if cpu is not None and writes else None,
             "report": out}
        log(f"N={n}: {'good' if good else 'bad'} ({why}; {s['writes_per_sec']} writes/s)")
        steps.append(s)
        return good

    def step(n):
        if n not in tried:
            tried[n] = any(attempt(n) for _ in range(1 + retries))
        return tried[n]

    good_n, bad_n = None, None
    n = start_n
    if step(n):
        good_n = n
        while n < cap:
            n = min(2 * n, cap)
            if not step(n):
                bad_n = n
                break
            good_n = n
    else:
        # Even the start is too much: halve until a step is good, down to the floor.
        bad_n = n
        while n // 2 >= floor:
            n //= 2
            if step(n):
                good_n = n
                break
            bad_n = n
    if good_n is not None and bad_n is not None:
        for _ in range(bisect_steps):
            mid = (good_n + bad_n) // 2
            if mid in (good_n, bad_n):
                break
            if step(mid):
                good_n = mid
            else:
                bad_n = mid
    return good_n, steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=ROOT / "target/release/cairn",
                    help="the server: cairn, or etcd (same flags)")
    ap.add_argument("--name", help="the target's name in the log (default: the binary's)")
    ap.add_argument("--bench", type=Path, default=ROOT / "target/release/cairn-bench")
    ap.add_argument("--dir", type=Path, required=True, help="where the data dir goes")
    ap.add_argument("--members", type=int, default=1)
    ap.add_argument("--step-seconds", type=float, default=20, help="measured seconds of a step")
    ap.add_argument("--warmup", type=float, default=5, help="unmeasured seconds before them")
    ap.add_argument("--start", type=int, default=250, help="the first N")
    ap.add_argument("--cap", type=int, default=64_000, help="the largest N tried")
    ap.add_argument("--floor", type=int, default=25, help="the smallest N tried")
    ap.add_argument("--bisect-steps", type=int, default=2)
    ap.add_argument("--retries", type=int, default=1, help="runs more of a bad step before it counts as bad")
    ap.add_argument("--p99-ms", type=float, default=P99_LIMIT_US / 1000)
    ap.add_argument("--json", type=Path, help="write the steps' reports here")
    a = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.dont_write_bytecode = True  # no __pycache__ in the tree
    try:
        from targets import Target
    except ImportError:  # before compare.py's split
        from compare import Target

    name = a.name or a.binary.name
    target = Target(name, a.binary, "etcd" if "etcd" in name else "cairn")
    started = time.time()
    best, steps = largest_n(a.bench, lambda m: target.start(a.dir / name, m), target.stop, members=a.members,
                            step_seconds=a.step_seconds, start_n=a.start, cap=a.cap, floor=a.floor,
                            bisect_steps=a.bisect_steps, warmup=a.warmup, retries=a.retries,
                            p99_limit_us=a.p99_ms * 1000)
    print(f"{name}, {a.members} member(s), {a.step_seconds:g} s steps, {time.time() - started:.0f} s in all")
    print(f"{'N':>7} {'pods/s':>8} {'writes/s':>9} {'p99 ms':>8} {'behind':>7}  verdict")
    for s in sorted(steps, key=lambda s: s["n"]):
        p99 = s["write_p99_us"]
        behind = s["behind_schedule_fraction"]
        print(f"{s['n']:>7} {s['n'] / 25:>8.1f} {s['writes_per_sec'] or 0:>9.0f} "
              f"{'-' if p99 is None else f'{p99 / 1000:.2f}':>8} {'-' if behind is None else f'{behind:.2%}':>7}  "
              f"{'good' if s['good'] else 'bad'}: {s['why']}")
    print(f"largest N with write p99 under {a.p99_ms:g} ms: {best}")
    if a.json:
        a.json.write_text(json.dumps({"target": name, "largest_n": best, "steps": steps}, indent=1))


if __name__ == "__main__":
    main()
