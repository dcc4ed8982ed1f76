"""The workloads compare.py runs against each target, and the figures each reports.

A workload runs against a target started for it (fresh data dir; `members` processes) and
returns {figure key: value}; `Context.keep` remembers files for the plots (latency logs, the
defrag timeline). Every request is made by `cairn-bench` (benches/src/bin/cairn-bench); the
Maintenance calls by Debian's etcdctl 3.4.
"""

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from k8s import largest_n
from targets import etcdctl, log, status

MIB = 1 << 20
# The million-key rows: 16-byte keys (`bench/` and a zero-padded number) and 256-byte values.
BIG_KEY_SIZE = 16
BIG_VAL_SIZE = 256
# The write load served during compaction and defragmentation.
DEFRAG_RATE = 1000
DEFRAG_CLIENTS = 100


@dataclass
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool


@dataclass
class Workload:
    name: str  # what --only matches
    title: str
    figures: list
    run: object  # run(ctx, target, endpoints, name) -> {figure key: value}
    members: int = 1
    # Starts and stops the target itself, as often as it needs: run(ctx, target, data_dir, name).
    owns_target: bool = False
    # Runs in the first round only (a search is long, and its result a single number).
    once: bool = False
    # (the server's CPUs, the load generator's), as taskset lists; None: both anywhere.
    cpus: tuple = None
    # The targets it runs against (their names); None: every one.
    targets: tuple = None
    # Needs kube-apiserver and the apiserver-level load tool (targets.ensure_kube).
    kube: bool = False
    # Runs against secured targets: "mtls" (client and peer TLS with client certificates) or
    # "auth" (authentication on, a user allowed the load's keys); see targets.Target.
    security: str = None
    # --quota-backend-bytes; None: targets.DEFAULT_QUOTA.
    quota: int = None


@dataclass
class Context:
    bench_bin: Path
    seconds: float
    keys: int
    scale_val_size: int
    expiry_leases: int
    expiry_ttl: int
    defrag_baseline: float
    defrag_budget: float
    k8s_step: float  # measured seconds of each step of the Kubernetes-shaped search
    logs: Path  # this round's latency logs
    kept: dict = field(default_factory=dict)  # (workload, target) -> what the plots need
    # kube-apiserver's binaries and the apiserver-level load tool, when a workload needs them.
    kube_bin_dir: Path = None
    apiload_bin: Path = None
    # What cairn-bench needs to reach the current target (certificates, a user).
    bench_flags: list = field(default_factory=list)

    def log_path(self, workload, target):
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.logs / f"{workload}-{target.name}.csv"

    def keep(self, workload, target, what):
        self.kept[(workload, target.name)] = what


class BenchFailed(Exception):
    pass


def bench_cmd(ctx, endpoints, args, seconds=None, latency_log=None, cpus=None):
    cmd = [str(ctx.bench_bin), "--endpoints", ",".join(endpoints), "--json", *ctx.bench_flags]
    if cpus is not None:
        cmd = ["taskset", "-c", cpus] + cmd
    if seconds is not None:
        cmd += ["--seconds", f"{seconds:g}"]
    if latency_log is not None:
        cmd += ["--latency-log", str(latency_log)]
    return cmd + args


def bench(ctx, endpoints, args, seconds=None, latency_log=None, timeout=1800, cpus=None):
    """Runs cairn-bench to the end (on the CPUs `cpus` names, if given); its JSON report."""
    cmd = bench_cmd(ctx, endpoints, args, seconds, latency_log, cpus)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return bench_output(cmd, p.returncode, p.stdout, p.stderr)


def bench_output(cmd, code, stdout, stderr):
    try:
        out = json.loads(stdout)
    except json.JSONDecodeError:
        out = None
    if code != 0 or out is None:
        tail = (stderr or "").strip().splitlines()[-5:]
        raise BenchFailed(f"{' '.join(cmd[-6:])} exited {code}: " + " | ".join(tail))
    return out


def ms(us):
    return None if us is None else us / 1000


# --- latency logs -------------------------------------------------------------------------


def read_latency_log(path):
    """(the run's start as Unix seconds, [(answered s since the start, latency s)])."""
    origin, answers = 0.0, []
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                origin = int(line.rsplit("started_unix_us=", 1)[1]) / 1e6
                continue
            at, took = line.split(",")
            answers.append((int(at) / 1e6, int(took) / 1e6))
    return origin, answers


def p99(latencies):
    """Nearest-rank 99th percentile, or None for none."""
    if not latencies:
        return None
    xs = sorted(latencies)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def overlapping(answers, start, end):
    """Latencies of the requests in flight at some time in [start, end]."""
    return [took for at, took in answers if at >= start and at - took <= end]


# --- throughput workloads -----------------------------------------------------------------

THROUGHPUT = [Figure("ops", "throughput", "ops/s", True), Figure("p99", "p99 latency", "ms", False),
              Figure("cpu_us", "server CPU per request", "µs", False)]


def throughput(args, logged=False, bench_cpus=None):
    """A cairn-bench workload run for --seconds: requests answered per second, their p99, and
    the server's CPU time per answered request (user and system, all its processes). On two
    cores the load generator takes about as much CPU as the server, so throughput understates
    differences between servers; CPU per request shows them. With `bench_cpus`, the load
    generator runs on those CPUs only (the workload's `cpus` keep the server on the others)."""

    def run(ctx, t, endpoints, name):
        log_file = ctx.log_path(name, t) if logged else None
        cpu_before = t.cpu_seconds()
        out = bench(ctx, endpoints, args, seconds=ctx.seconds, latency_log=log_file, cpus=bench_cpus)
        cpu = t.cpu_seconds() - cpu_before
        if logged:
            ctx.keep(name, t, {"latency_log": str(log_file)})
        ok = out.get("ok") or 0
        # Setup (a range's load) is in the CPU time too; it is small against a timed run.
        cpu_us = cpu * 1e6 / ok if ok else None
        return {"ops": out.get("ops_per_sec"), "p99": ms(out.get("p99_us")), "cpu_us": cpu_us, "raw": out}

    return run


SERIAL = [Figure("ops", "throughput", "ops/s", True), Figure("p50", "p50 latency", "ms", False),
          Figure("p99", "p99 latency", "ms", False), Figure("cpu_us", "server CPU per request", "µs", False),
          Figure("fsync_p50", "raw pwrite+fdatasync p50 on the same disk, measured right after", "ms", False),
          Figure("p50_over_fsync", "put p50 / raw fdatasync p50", "×", False),
          Figure("rtt_p50", "serializable get p50, 1 client, right after (the round trip without a disk)", "ms",
                 False),
          Figure("p50_over_floor", "put p50 / its floor (round trip + raw fdatasync p50)", "×", False)]


def serial_put(args):
    """The throughput workload with one client, then the two floors a put's latency sits on:
    the disk's (`fsync-latency`'s raw pwrite+fdatasync loop in the target's data directory's
    parent, the same disk) and the round trip's (a serializable get, one client), each measured
    right after the run."""
    timed = throughput(args)

    def run(ctx, t, endpoints, name):
        out = timed(ctx, t, endpoints, name)
        out["p50"] = ms(out["raw"].get("p50_us"))
        fsync_bin = ctx.bench_bin.parent / "fsync-latency"
        p = subprocess.run([str(fsync_bin), "--dir", str(t.data_dir.parent), "--seconds", "2", "--appenders", "1",
                            "--json"], capture_output=True, text=True, timeout=120)
        raw = bench_output([str(fsync_bin)], p.returncode, p.stdout, p.stderr).get("raw_p50_us")
        out["fsync_p50"] = ms(raw)
        out["p50_over_fsync"] = out["p50"] / out["fsync_p50"] if raw and out["p50"] else None
        get = bench(ctx, endpoints, ["--conns", "1", "--clients", "1", "range", "--load", "100", "--consistency", "s"],
                    seconds=2)
        out["rtt_p50"] = ms(get.get("p50_us"))
        floor = (out["fsync_p50"] or 0) + (out["rtt_p50"] or 0)
        out["p50_over_floor"] = out["p50"] / floor if out["fsync_p50"] and out["rtt_p50"] and out["p50"] else None
        return out

    return run


def watch_fanout(bench_cpus=None):
    """1,000 watchers of a prefix while 10 writers put as fast as they are answered: events
    delivered per second, put-to-event latency (which grows when delivery falls behind), and
    the server's CPU time per event delivered. With `bench_cpus`, the load generator runs on
    those CPUs only (the workload's `cpus` keep the server on the others)."""

    def run(ctx, t, endpoints, name):
        args = ["--conns", "10", "--clients", "10", "watch", "--watchers", "1000", "--streams", "10"]
        cpu_before = t.cpu_seconds()
        out = bench(ctx, endpoints, args, seconds=ctx.seconds, cpus=bench_cpus)
        cpu = t.cpu_seconds() - cpu_before
        events = out.get("ok") or 0
        return {"ops": out.get("ops_per_sec"), "p99": ms(out.get("p99_us")),
                "cpu_us": cpu * 1e6 / events if events else None,
                "puts": out.get("put_ops_per_sec"), "raw": out}

    return run


def watch_at_scale(watchers, put_rate):
    """Issue #38's goal 5: `watchers` watchers of one prefix over 10 streams on 10 connections
    while 20 writers put `put_rate` times a second in all. The writers' p99 is measured first
    with one watcher, then with all of them: put-to-event p99, events delivered and missing,
    and the writers' p99 against their own before."""

    def run(ctx, t, endpoints, name):
        common = ["--conns", "10", "--clients", "20"]
        alone = bench(ctx, endpoints, common + ["watch", "--watchers", "1", "--streams", "1",
                                                "--put-rate", str(put_rate)], seconds=ctx.seconds)
        cpu_before = t.cpu_seconds()
        out = bench(ctx, endpoints, common + ["watch", "--watchers", str(watchers), "--streams", "10",
                                              "--put-rate", str(put_rate)], seconds=ctx.seconds)
        cpu = t.cpu_seconds() - cpu_before
        events = out.get("ok") or 0
        expected = out.get("events_expected") or 0
        before, during = ms(alone.get("put_p99_us")), ms(out.get("put_p99_us"))
        return {"p99": ms(out.get("p99_us")), "ops": out.get("ops_per_sec"),
                "delivered": events / expected if expected else None,
                "puts": out.get("put_ops_per_sec"),
                "put_p99_before": before, "put_p99": during,
                "put_p99_over_before": during / before if before and during else None,
                "cpu_us": cpu * 1e6 / events if events else None, "raw": {"alone": alone, "watched": out}}

    return run


WATCH_AT_SCALE = [Figure("p99", "put-to-event p99 latency", "ms", False),
                  Figure("ops", "events delivered", "events/s", True),
                  Figure("delivered", "events delivered / expected", "×", True),
                  Figure("puts", "puts", "puts/s", True),
                  Figure("put_p99_before", "put p99, one watcher", "ms", False),
                  Figure("put_p99", "put p99, every watcher", "ms", False),
                  Figure("put_p99_over_before", "put p99 with every watcher / one", "×", False),
                  Figure("cpu_us", "server CPU per event (its puts' included)", "µs", False)]


WATCH = [Figure("ops", "events delivered", "events/s", True),
         Figure("p99", "put-to-event p99 latency", "ms", False),
         Figure("cpu_us", "server CPU per event (its puts' included)", "µs", False)]


def lease_expiry(ctx, t, endpoints, name):
    """Leases, each with one key, expiring together while 10 probe writers put: seconds from
    the first lease's TTL until every key is gone, and the probes' p99 meanwhile."""
    args = ["--conns", "10", "--clients", "10", "lease-expiry", "--leases", str(ctx.expiry_leases),
            "--ttl", str(ctx.expiry_ttl), "--keys-per-lease", "1", "--val-size", str(BIG_VAL_SIZE)]
    cpu_before = t.cpu_seconds()
    out = bench(ctx, endpoints, args)
    cpu = t.cpu_seconds() - cpu_before
    # Every request the run made: the grants, the keys attached, and the probes' puts before
    # and during the expiry (the expiries themselves are the server's own work on top).
    requests = sum(out.get(k) or 0 for k in ("leases_granted", "keys_attached", "ok", "probe_before_ok"))
    return {"expire_s": out.get("all_gone_after_earliest_s"), "p99": ms(out.get("p99_us")),
            "p99_over_before": out.get("probe_p99_during_over_before"),
            "cpu_us": cpu * 1e6 / requests if requests else None, "raw": out}


# --- a million keys: footprint, restart, compaction and defragmentation while serving ------


def loaded(ctx, t, endpoints, val_size):
    """Loads --keys keys of `val_size` bytes (each key written once) with 100 clients; the
    load's report, and the footprint figures (`FOOTPRINT`) after it."""
    cpu_before = t.cpu_seconds()
    args = ["--conns", "10", "--clients", "100", "--total", str(ctx.keys), "put", "--key-size", str(BIG_KEY_SIZE),
            "--val-size", str(val_size), "--key-space-size", str(ctx.keys), "--sequential-keys"]
    load = bench(ctx, endpoints, args, timeout=6 * 3600)
    cpu = t.cpu_seconds() - cpu_before
    if load.get("failed"):
        log(f"{t.name}: {load['failed']} of the {ctx.keys} puts failed: {load.get('errors')}")
    time.sleep(1)
    puts = load.get("ok") or 0
    return load, {"load": load.get("ops_per_sec"), "load_cpu_us": cpu * 1e6 / puts if puts else None,
                  "rss": t.rss_bytes() / MIB, "disk": t.disk_bytes() / MIB}


def million_keys(ctx, t, endpoints, name):
    """Loads --keys keys (one revision each) with 100 clients; RSS, disk and db size; a restart
    on that data; then compaction to the current revision and a defragmentation while writes
    go on at a fixed rate."""
    load, r = loaded(ctx, t, endpoints, BIG_VAL_SIZE)
    r["db_size"] = status(endpoints[0])["db_size"] / MIB
    stop_s, start_s = t.restart()
    r.update(stop_s=stop_s, restart_s=start_s)
    time.sleep(1)
    r["rss_restarted"] = t.rss_bytes() / MIB
    r.update(defrag_while_serving(ctx, t, endpoints, name))
    r["raw"] = {"load": load, **{k: v for k, v in r.items() if k != "raw"}}
    return r


# --- scale: what the object count costs (issue #38) ---------------------------------------

# Keys the scale workload lists, keys only, in one request (kube-apiserver lists a resource's
# whole prefix keys-only each minute).
SCALE_LIST = 500_000
# A prefix of 1,000,000 keys in any key space of at least that many: 16-byte keys are
# `bench/` and 10 digits, so `bench/0000` holds 0 to 999,999.
COUNT_PREFIX, COUNT_PREFIX_KEYS = "bench/0000", 1_000_000
# Paged lists: kube-apiserver's page size, the clients listing, and for how long.
PAGE, LISTERS, PAGED_SECONDS = 500, 10, 20


def scale(ctx, t, endpoints, name):
    """Loads --keys keys of --scale-val-size bytes (each key once) with 100 clients; then what
    the count of objects costs: RSS and disk, a count of every key, a keys-only list of
    500,000 keys and a count of a 1,000,000-key prefix (each one request), paged lists under
    writes, a compaction of every revision under writes, and restarts until /health with the
    page cache warm, then cold (dropped after the stop, where the machine lets the run drop
    it; else None)."""
    load, r = loaded(ctx, t, endpoints, ctx.scale_val_size)
    puts = load.get("ok") or 0
    # One request each, timed by cairn-bench (etcdctl's start and its printing of 500,000
    # lines would be most of what it timed): a count (count_only, as kube-apiserver asks it),
    # then keys only.
    count = bench(ctx, endpoints, ["--total", "1", "range", "--prefix", "--count-only"])
    r["count_s"] = (count.get("max_us") or 0) / 1e6 or None
    listed = bench(ctx, endpoints, ["--total", "1", "range", "--prefix", "--keys-only", "--limit", str(SCALE_LIST)])
    r["list_s"] = (listed.get("max_us") or 0) / 1e6 or None
    if listed.get("kvs_per_read") != min(SCALE_LIST, puts):
        log(f"{t.name}: the list returned {listed.get('kvs_per_read')} keys, not {min(SCALE_LIST, puts)}")
    counted = bench(ctx, endpoints, ["--key-prefix", COUNT_PREFIX, "--total", "1", "range", "--prefix",
                                     "--count-only"])
    r["count_prefix_s"] = (counted.get("max_us") or 0) / 1e6 or None
    if counted.get("kvs_per_read") != min(COUNT_PREFIX_KEYS, puts):
        log(f"{t.name}: the count of {COUNT_PREFIX} found {counted.get('kvs_per_read')} keys, "
            f"not {min(COUNT_PREFIX_KEYS, puts)}")
    r.update(paged_lists_while_writing(ctx, t, endpoints, name))
    compacted = defrag_while_serving(ctx, t, endpoints, name, defrag=False, val_size=ctx.scale_val_size)
    r.update({k: compacted[k] for k in ("p99_before", "p99_compact", "compact_over_before", "compact_s")})
    r["stop_s"], r["restart_s"] = t.restart()
    time.sleep(1)
    r["rss_restarted"] = t.rss_bytes() / MIB
    _, r["restart_cold_s"] = t.restart(cold=True)
    r["raw"] = {"load": load, **{k: v for k, v in r.items() if k != "raw"}}
    return r


# --- a quota of tens of GB: filled, compacted and defragmented, then NOSPACE (issue #38) -----

# The share of the quota the history fills before it is compacted and defragmented.
QUOTA_FILL = 0.9
NOSPACE_ERROR = "database space exceeded"


def quota(ctx, t, endpoints, name):
    """Fills the workload's quota with history: --keys keys of --scale-val-size bytes, put once
    each, then again at random, with 100 clients, up to `QUOTA_FILL` of the quota in use; a
    compaction to the current revision and a defragmentation while writes go on at
    DEFRAG_RATE (`defrag_while_serving`); then puts until NOSPACE refuses them, and what was
    in use then, against the quota; a restart at that size."""
    load, r = loaded(ctx, t, endpoints, ctx.scale_val_size)
    in_use = status(endpoints[0])["db_size_in_use"]
    per_put = in_use / max(load.get("ok") or 1, 1)

    def put(total):
        args = ["--conns", "10", "--clients", "100", "--total", str(total), "put", "--key-size", str(BIG_KEY_SIZE),
                "--val-size", str(ctx.scale_val_size), "--key-space-size", str(ctx.keys)]
        return bench(ctx, endpoints, args, timeout=6 * 3600)

    more = int((QUOTA_FILL * t.quota - in_use) / per_put)
    if more > 0:
        filled = put(more)
        if filled.get("failed"):
            log(f"{t.name}: {filled['failed']} of {more} puts failed below the quota: {filled.get('errors')}")
    r["filled_gib"] = status(endpoints[0])["db_size_in_use"] / (1 << 30)
    r.update(defrag_while_serving(ctx, t, endpoints, name))

    # Past the quota by a twentieth: the last puts must be refused, and only those.
    in_use = status(endpoints[0])["db_size_in_use"]
    past = put(int((t.quota - in_use) / per_put * 1.05) + 1000)
    errors = json.dumps(past.get("errors") or {})
    if not past.get("failed") or NOSPACE_ERROR not in errors:
        log(f"{t.name}: no NOSPACE past the quota ({past.get('failed')} failed: {errors})")
    at = status(endpoints[0])
    r["nospace_in_use"] = at["db_size_in_use"] / t.quota
    r["nospace_db"] = at["db_size"] / t.quota
    r["refused"] = past.get("failed")
    r["alarm"] = "NOSPACE" in etcdctl(endpoints, "alarm", "list")
    # Raised, the NOSPACE alarm fails /health (as etcd's), so the restart waits for the rest.
    t.health_path = "/health?exclude=NOSPACE"
    r["stop_s"], r["restart_s"] = t.restart()
    r["raw"] = {"load": load, "past_quota": past, **{k: v for k, v in r.items() if k != "raw"}}
    return r




def paged_lists_while_writing(ctx, t, endpoints, name):
    """Paged lists of every key, `PAGE` at a time at one revision (as kube-apiserver lists),
    by `LISTERS` clients for `PAGED_SECONDS`, while writes go on at `DEFRAG_RATE`: pages per
    second and their p99, and the writes' p99 meanwhile."""
    writes = subprocess.Popen(
        bench_cmd(ctx, endpoints, ["--conns", "10", "--clients", str(DEFRAG_CLIENTS), "--rate", str(DEFRAG_RATE),
                                   "put", "--key-size", str(BIG_KEY_SIZE), "--val-size", str(ctx.scale_val_size),
                                   "--key-space-size", str(ctx.keys)], seconds=PAGED_SECONDS + 2),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # The writes' first second warms up their connections.
        time.sleep(1)
        pages = bench(ctx, endpoints, ["--conns", str(LISTERS), "--clients", str(LISTERS), "range", "--prefix",
                                       "--limit", str(PAGE), "--paged"], seconds=PAGED_SECONDS)
    finally:
        stdout, stderr = writes.communicate(timeout=PAGED_SECONDS + 600)
    written = bench_output(["put"], writes.returncode, stdout, stderr)
    if pages.get("kvs_per_read") != PAGE:
        log(f"{t.name}: pages of {pages.get('kvs_per_read')} keys, not {PAGE}")
    return {"paged_ops": pages.get("ops_per_sec"), "paged_p99": ms(pages.get("p99_us")),
            "paged_write_p99": ms(written.get("p99_us"))}


def defrag_while_serving(ctx, t, endpoints, name, defrag=True, val_size=BIG_VAL_SIZE):
    """Puts `val_size`-byte values at DEFRAG_RATE over the loaded keys; after a baseline,
    compacts to the current revision (physically: etcdctl returns once it is done) and, if
    `defrag`, defragments. Write p99 before, during each, and their durations, from the
    latency log."""
    log_file = ctx.log_path(name, t)
    seconds = ctx.defrag_baseline + ctx.defrag_budget
    args = ["--conns", "10", "--clients", str(DEFRAG_CLIENTS), "--rate", str(DEFRAG_RATE), "put",
            "--key-size", str(BIG_KEY_SIZE), "--val-size", str(val_size), "--key-space-size", str(ctx.keys)]
    cmd = bench_cmd(ctx, endpoints, args, seconds=seconds, latency_log=log_file)
    writes = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(ctx.defrag_baseline)
        revision = status(endpoints[0])["revision"]
        compact_started = time.time()
        etcdctl(endpoints, "compact", str(revision), "--physical")
        defrag_started = time.time()
        if defrag:
            etcdctl(endpoints, "defrag")
        defrag_ended = time.time()
        db_after = status(endpoints[0])["db_size"] / MIB
    finally:
        stdout, stderr = writes.communicate(timeout=seconds + 600)
    out = bench_output(cmd, writes.returncode, stdout, stderr)

    origin, answers = read_latency_log(log_file)
    compact = (compact_started - origin, defrag_started - origin)
    defrag = (defrag_started - origin, defrag_ended - origin)
    end = max((at for at, _ in answers), default=0.0)
    if defrag[1] > end:
        log(f"{t.name}: the defragmentation ended {defrag[1] - end:.1f} s after the writes did: "
            f"give it a longer --defrag-budget")
    ctx.keep(name, t, {"latency_log": str(log_file), "compact": compact, "defrag": defrag})
    # The first second warms up connections; the baseline is the rest before the compaction.
    before = [took for at, took in answers if 1.0 <= at < compact[0]]
    during = overlapping(answers, *defrag)
    base_p99, defrag_p99, compact_p99 = p99(before), p99(during), p99(overlapping(answers, *compact))
    in_window = sum(1 for at, _ in answers if defrag[0] <= at <= defrag[1])
    defrag_s = defrag[1] - defrag[0]
    return {
        "p99_before": ms_s(base_p99),
        "p99_compact": ms_s(compact_p99),
        "compact_over_before": compact_p99 / base_p99 if base_p99 and compact_p99 else None,
        "p99_defrag": ms_s(defrag_p99),
        "defrag_over_before": defrag_p99 / base_p99 if base_p99 and defrag_p99 else None,
        "ops_defrag": in_window / defrag_s if defrag_s > 0 else None,
        "compact_s": compact[1] - compact[0],
        "defrag_s": defrag_s,
        "db_after": db_after,
        "writes": {k: out.get(k) for k in ("ok", "failed", "ops_per_sec", "p99_us", "max_us", "errors")},
    }


# --- the Kubernetes-shaped workload: the largest cluster a target carries --------------------

K8S = [Figure("largest_n", "largest N (nodes; N/25 pods/s) with write p99 under 10 ms", "nodes", True),
       Figure("writes_per_sec", "writes per second at that N", "ops/s", True),
       Figure("write_p99", "write p99 at that N", "ms", False),
       Figure("cpu_per_write_us", "server CPU per write at that N (set-up and warm-up included)", "µs", False)]


def k8s_search(members):
    """benches/compare/k8s.py's search: N doubles from 1,000 until a step's write p99 reaches
    10 ms (or writes fall behind), then two bisections; every step on a fresh data dir."""

    def run(ctx, t, data_dir, name):
        best, steps = largest_n(ctx.bench_bin, lambda m: t.start(data_dir, members=m), t.stop, members=members,
                                step_seconds=ctx.k8s_step, start_n=1000, cpu_seconds=t.cpu_seconds)
        at_best = [s for s in steps if s["n"] == best and s["good"]]
        last = at_best[-1] if at_best else {}
        for s in steps:
            s.pop("report", None)
        return {"largest_n": best, "writes_per_sec": last.get("writes_per_sec"),
                "write_p99": ms(last.get("write_p99_us")), "cpu_per_write_us": last.get("cpu_per_write_us"),
                "raw": {"steps": steps}}

    return run


# --- kube-apiserver on the target: the same client-go load through it -----------------------

# The verbs tests/kubernetes/apiload sends, each at its own fixed rate (its defaults).
APISERVER_VERBS = [("create", "ConfigMap creates"), ("update", "ConfigMap updates"), ("get", "ConfigMap gets"),
                   ("list", "paged lists of 500 ConfigMaps (pages of 50)"), ("lease", "Lease renewals")]


def apiserver_load(ctx, t, endpoints, name):
    """kube-apiserver 1.37 on the target's members, and tests/kubernetes/apiload's open-loop
    client-go load through it (creates, updates, gets, paged lists and Lease renewals, each at
    a fixed rate, the same for every target): per verb, answers per second and p99 latency;
    the p99 of all writes and of all reads; the storage's and kube-apiserver's CPU time per
    request."""
    cmd = [str(ctx.apiload_bin), "--json", "--kube-bin-dir", str(ctx.kube_bin_dir),
           "--etcd-servers", ",".join(f"http://{e}" for e in endpoints),
           "--seconds", f"{max(ctx.seconds, 30):g}", "--warmup", "10"]
    log("$", " ".join(cmd))
    cpu_before = t.cpu_seconds()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    cpu = t.cpu_seconds() - cpu_before
    out = bench_output(cmd, p.returncode, p.stdout, p.stderr)
    verbs = out.get("verbs", {})
    r = {"write_p99": out.get("write_p99_ms"), "read_p99": out.get("read_p99_ms"), "raw": out}
    answered = 0
    for verb, _ in APISERVER_VERBS:
        v = verbs.get(verb, {})
        r[f"{verb}_ops"] = v.get("per_sec")
        r[f"{verb}_p99"] = v.get("p99_ms")
        answered += v.get("count") or 0
    # The storage's CPU over the whole run (kube-apiserver's start and the setup included);
    # per request of the measured window, so a comparison between targets, not an absolute.
    r["storage_cpu_us"] = cpu * 1e6 / answered if answered else None
    apiserver_cpu = out.get("apiserver_cpu_seconds")
    r["apiserver_cpu_us"] = apiserver_cpu * 1e6 / answered if answered and apiserver_cpu else None
    return r


APISERVER = ([Figure("write_p99", "p99 of every write (creates, updates, renewals)", "ms", False),
              Figure("read_p99", "p99 of every read (gets, paged lists)", "ms", False)]
             + [f for verb, label in APISERVER_VERBS
                for f in (Figure(f"{verb}_ops", f"{label}: answered", "ops/s", True),
                          Figure(f"{verb}_p99", f"{label}: p99", "ms", False))]
             + [Figure("storage_cpu_us", "storage CPU (all members) per request", "µs", False),
                Figure("apiserver_cpu_us", "kube-apiserver CPU per request", "µs", False)])


def ms_s(seconds):
    return None if seconds is None else seconds * 1000


# What `loaded` reports.
FOOTPRINT = [
    Figure("load", "load with 100 clients: throughput", "ops/s", True),
    Figure("load_cpu_us", "load: server CPU per put", "µs", False),
    Figure("rss", "RSS after the load", "MiB", False),
    Figure("disk", "data dir on disk after the load", "MiB", False),
]


# What `defrag_while_serving` reports.
DEFRAG = [
    Figure("p99_before", f"writes at {DEFRAG_RATE}/s: p99 before compacting", "ms", False),
    Figure("p99_compact", "writes: p99 during the compaction", "ms", False),
    Figure("p99_defrag", "writes: p99 during the defragmentation", "ms", False),
    Figure("defrag_over_before", "writes: p99 during defrag / p99 before", "×", False),
    Figure("ops_defrag", "writes answered per second during defrag", "ops/s", True),
    Figure("compact_s", "compaction (physical) took", "s", False),
    Figure("defrag_s", "defragmentation took", "s", False),
    Figure("db_after", "db size after compaction and defrag", "MiB", False),
]


MILLION = FOOTPRINT + [
    Figure("db_size", "db size (Maintenance Status)", "MiB", False),
    Figure("restart_s", "restart: start until /health answers", "s", False),
    Figure("rss_restarted", "RSS after the restart", "MiB", False),
] + DEFRAG


SCALE = FOOTPRINT + [
    Figure("count_s", "count of every key (count_only)", "s", False),
    Figure("list_s", f"{SCALE_LIST:,} keys, keys only, in one request", "s", False),
    Figure("count_prefix_s", f"count of a prefix holding {COUNT_PREFIX_KEYS:,} keys", "s", False),
    Figure("paged_ops", f"paged lists ({PAGE} a page, {LISTERS} clients) under {DEFRAG_RATE} writes/s: pages",
           "pages/s", True),
    Figure("paged_p99", "paged lists: p99 of a page", "ms", False),
    Figure("paged_write_p99", "paged lists: the writes' p99 meanwhile", "ms", False),
    Figure("p99_before", f"writes at {DEFRAG_RATE}/s: p99 before compacting", "ms", False),
    Figure("p99_compact", "writes: p99 during the compaction of every revision", "ms", False),
    Figure("compact_over_before", "writes: p99 during the compaction / p99 before", "×", False),
    Figure("compact_s", "compaction (physical) took", "s", False),
    Figure("stop_s", "stop after the load: SIGTERM until the process exits", "s", False),
    Figure("restart_s", "restart, page cache warm: start until /health answers", "s", False),
    Figure("rss_restarted", "RSS after the restart", "MiB", False),
    Figure("restart_cold_s", "restart, page cache dropped: start until /health answers", "s", False),
]


QUOTA = FOOTPRINT + [
    Figure("filled_gib", f"history in use before compacting ({QUOTA_FILL:.0%} of the quota)", "GiB", True),
] + DEFRAG + [
    Figure("nospace_in_use", "in use when NOSPACE refused a put, over the quota", "×", True),
    Figure("nospace_db", "db size when NOSPACE refused a put, over the quota", "×", True),
    Figure("refused", "puts refused past the quota (of a twentieth more than fits)", "puts", False),
    Figure("stop_s", "stop at the quota: SIGTERM until the process exits", "s", False),
    Figure("restart_s", "restart at the quota: start until /health answers", "s", False),
]


def workloads(keys, expiry_leases, scale_val_size=1024, quota_bytes=20 << 30, watch_scale=(10_000, 2_000)):
    """Every workload, in the order they run."""
    kk = f"{keys:,}"
    return [
        Workload("put-serial", "serial put (1 client)", SERIAL,
                 serial_put(["--conns", "1", "--clients", "1", "put", "--key-space-size", "100000"])),
        Workload("put-100", "put, 100 clients", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "put", "--key-space-size", "100000"], logged=True)),
        Workload("range-l-100", "linearizable range, 100 clients", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "l"])),
        Workload("put-100-mtls", "put, 100 clients, client and peer mTLS", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "put", "--key-space-size", "100000"]),
                 security="mtls"),
        Workload("range-l-100-mtls", "linearizable range, 100 clients, client and peer mTLS", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "l"]),
                 security="mtls"),
        Workload("put-100-auth", "put, 100 clients, auth on (simple token, a user with a prefix)", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "put", "--key-space-size", "100000"]),
                 security="auth"),
        Workload("range-l-100-auth", "linearizable range, 100 clients, auth on", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "l"]),
                 security="auth"),
        Workload("range-s-100", "serializable range, 100 clients", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "s"],
                            logged=True)),
        Workload("range-s-pinned-100", "the same, the server on one core and the load generator on the other",
                 THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "s"],
                            bench_cpus="1"), cpus=("0", "1")),
        Workload("txn-put-100", "txn-put, 100 clients", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "txn-put", "--key-space-size", "100000"])),
        Workload("watch-1000", "watch fan-out: 1,000 watchers, 10 unthrottled writers", WATCH, watch_fanout()),
        Workload("watch-pinned-1000", "the same, the server on one core and the load generator on the other",
                 WATCH, watch_fanout(bench_cpus="1"), cpus=("0", "1")),
        Workload("watch-scale", f"watch fan-out at scale: {watch_scale[0]:,} watchers of one prefix over 10 "
                                f"connections, {watch_scale[1]:,} puts/s", WATCH_AT_SCALE, watch_at_scale(*watch_scale)),
        Workload("keepalive-10k", "lease keep-alive, 10,000 leases, 100 streams",
                 [Figure("ops", "renewals", "ops/s", True), Figure("p99", "p99 latency", "ms", False),
                  Figure("cpu_us", "server CPU per renewal", "µs", False)],
                 throughput(["--conns", "10", "--clients", "100", "lease-keepalive", "--leases", "10000"])),
        Workload("expiry", f"mass lease expiry: {expiry_leases:,} leases with a key each",
                 [Figure("expire_s", "first TTL until every key is gone", "s", False),
                  Figure("p99", "probe writes during expiry: p99", "ms", False),
                  Figure("p99_over_before", "probe p99 during expiry / before", "×", False),
                  Figure("cpu_us", "server CPU per request (grants, keys, probes; expiries on top)",
                         "µs", False)], lease_expiry),
        Workload("million", f"{kk} keys ({BIG_KEY_SIZE}-byte keys, {BIG_VAL_SIZE}-byte values)", MILLION,
                 million_keys),
        Workload("scale", f"{kk} keys of {scale_val_size:,} bytes: footprint, count, list, restart", SCALE,
                 scale),
        Workload("quota", f"a {quota_bytes / (1 << 30):g} GiB quota, filled with {kk} keys of {scale_val_size:,} bytes "
                          f"put again and again: compaction and defrag while writing, then NOSPACE", QUOTA, quota,
                 quota=quota_bytes),
        Workload("cluster-put-100", "3-member cluster on loopback: put, 100 clients", THROUGHPUT,
                 throughput(["--conns", "10", "--clients", "100", "put", "--key-space-size", "100000"]), members=3),
        Workload("apiserver-3", "kube-apiserver 1.37 on a 3-member cluster: client-go load at a fixed rate",
                 APISERVER, apiserver_load, members=3, targets=("cairn", "etcd-3.7"), kube=True),
        Workload("k8s-1", "Kubernetes-shaped load, 1 member (first round only)", K8S, k8s_search(1),
                 owns_target=True, once=True),
        Workload("k8s-3", "Kubernetes-shaped load, 3 members (first round only)", K8S, k8s_search(3),
                 members=3, owns_target=True, once=True),
    ]
