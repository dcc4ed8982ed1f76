#!/usr/bin/env python3
"""Moving a million keys between etcd and cairn through etcd's snapshot format, timed in one run.

1. etcd 3.7 is loaded with --keys keys (16-byte keys, 256-byte values, one revision each, 100
   clients, as compare.py's `million` row) and saved with `etcdctl snapshot save`.
2. Restore, round after round: `etcdutl snapshot restore` of etcd 3.7 and 3.5 against
   `cairn snapshot restore` of the same file, each into a new data dir. Wall time, and the
   peak resident memory of the restoring process (its rusage high-water mark).
3. Save: etcd 3.7 and 3.5 on their restored data dirs and cairn on its own each answer
   `etcdctl snapshot save` in turn, round after round. Wall time of etcdctl, which ends when
   the file is whole and synced.

Every server and tool uses the same disk (--dir). The report gives medians over the rounds and
the cairn/etcd ratios, and checks that every restore holds the snapshot's revision and keys.

    benches/compare/snapshots.py --dir /var/tmp/snap              # 1,000,000 keys, 3 rounds
    benches/compare/snapshots.py --dir /tmp/snap --keys 100000 --rounds 1   # a smoke run
    benches/compare/snapshots.py --dir /tmp/snap --snapshot /var/tmp/1m.db  # made once, kept
    benches/compare/snapshots.py --dir /var/tmp/snap --compact     # a history compacted at its end
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ next to the modules in the source tree
from targets import ROOT, Target, build, ensure_etcd37, ensure_venv, log, run  # noqa: E402
from workloads import BIG_KEY_SIZE, BIG_VAL_SIZE, MIB  # noqa: E402


def timed(cmd):
    """Runs `cmd` to completion: (wall seconds, peak RSS in MiB), or raises with its stderr."""
    started = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.monotonic() - started
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {stderr[-2000:]}")
    return took, usage.ru_maxrss / 1024


def snapshot_status(cairn, path):
    out = subprocess.run([str(cairn), "snapshot", "status", str(path), "-w", "json"],
                         check=True, capture_output=True, text=True).stdout
    s = json.loads(out)
    return s["revision"], s["totalKey"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, type=Path, help="where the data dirs and snapshots go (one disk)")
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compact", action="store_true",
                    help="compact etcd at its last revision before saving (the history then holds "
                         "each key's last put at or before the compacted revision, as kube-apiserver's "
                         "compactions leave it)")
    ap.add_argument("--snapshot", type=Path,
                    help="an etcd snapshot to use instead of loading etcd 3.7 (kept afterwards); "
                         "written there first when missing")
    a = ap.parse_args()

    etcd35 = ensure_venv()
    etcd37 = ensure_etcd37()
    cairn, bench_bin = build()
    etcdctl = etcd37.with_name("etcdctl")
    etcdutl = {"etcd-3.7": etcd37.with_name("etcdutl"), "etcd-3.5": etcd35.with_name("etcdutl")}
    servers = {"etcd-3.7": etcd37, "etcd-3.5": etcd35}
    shutil.rmtree(a.dir, ignore_errors=True)
    a.dir.mkdir(parents=True)
    snap = a.snapshot or a.dir / "snap.db"

    # 1. The source: etcd 3.7 with the keys.
    if not snap.exists():
        source = Target("etcd-3.7", etcd37)
        endpoints = source.start(a.dir / "source")
        run([bench_bin, "--endpoints", ",".join(endpoints), "--conns", "10", "--clients", "100", "--total",
             str(a.keys), "put", "--key-size", str(BIG_KEY_SIZE), "--val-size", str(BIG_VAL_SIZE),
             "--key-space-size", str(a.keys), "--sequential-keys"], stdout=subprocess.DEVNULL)
        if a.compact:
            current = json.loads(subprocess.run([etcdctl, "--endpoints", endpoints[0], "endpoint", "status", "-w",
                                                 "json"], check=True, capture_output=True).stdout)
            revision = current[0]["Status"]["header"]["revision"]
            run([etcdctl, "--endpoints", endpoints[0], "--command-timeout", "300s", "compact", str(revision),
                 "--physical"], stdout=subprocess.DEVNULL)
        run([etcdctl, "--endpoints", endpoints[0], "snapshot", "save", snap],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        source.stop()
        source.remove_data()
    revision, keys = snapshot_status(cairn, snap)
    log(f"snapshot: {snap.stat().st_size / MIB:.0f} MiB, revision {revision}, {keys} keys")
    if keys != a.keys:
        sys.exit(f"the snapshot holds {keys} keys, not {a.keys}")

    # 2. Restore.
    restore = {"cairn": [], "etcd-3.7": [], "etcd-3.5": []}
    restore_rss = {name: [] for name in restore}

    def restore_cmd(name, member_dir, member, peer_url, cluster):
        if name == "cairn":
            return [cairn, "snapshot", "restore", snap, "--data-dir", member_dir, "--name", member,
                    "--initial-cluster", cluster, "--initial-advertise-peer-urls", peer_url]
        return [etcdutl[name], "snapshot", "restore", snap, "--data-dir", member_dir, "--name", member,
                "--initial-cluster", cluster, "--initial-advertise-peer-urls", peer_url]

    for r in range(a.rounds):
        for name in restore:
            out = a.dir / f"restore-{name}"
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            took, rss = timed(restore_cmd(name, out, "m0", "http://127.0.0.1:2380", "m0=http://127.0.0.1:2380"))
            restore[name].append(took)
            restore_rss[name].append(rss)
            log(f"round {r + 1}: {name} restored in {took:.2f} s, peak RSS {rss:.0f} MiB")
            shutil.rmtree(out)

    # 3. Save: each server on its own restore of the snapshot.
    save = {"cairn": [], "etcd-3.7": [], "etcd-3.5": []}
    targets = {"cairn": Target("cairn", cairn), **{n: Target(n, servers[n]) for n in servers}}
    for r in range(a.rounds):
        for name, t in targets.items():
            eps = t.start(a.dir / f"serve-{name}",
                          prepare=lambda d, m, url, cluster, name=name: timed(restore_cmd(name, d, m, url, cluster)))
            served = a.dir / f"saved-{name}.db"
            subprocess.run(["sync"], check=True)
            took, _ = timed([etcdctl, "--endpoints", eps[0], "--command-timeout", "300s", "snapshot", "save", served])
            save[name].append(took)
            got = snapshot_status(cairn, served)
            t.stop()
            t.remove_data()
            if got != (revision, keys):
                sys.exit(f"{name}'s snapshot holds revision {got[0]} and {got[1]} keys, not {revision} and {keys}")
            log(f"round {r + 1}: {name} saved in {took:.2f} s ({served.stat().st_size / MIB:.0f} MiB)")
            served.unlink()

    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"| {a.keys:,} keys, snapshot {snap.stat().st_size / MIB:.0f} MiB, {a.rounds} rounds (median) "
          f"| cairn | etcd 3.7 | etcd 3.5 | cairn / 3.7 | cairn / 3.5 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, d, unit in (("restore (s)", restore, "s"), ("restore peak RSS (MiB)", restore_rss, "MiB"),
                           ("save, `etcdctl snapshot save` (s)", save, "s")):
        c, e37, e35 = med(d["cairn"]), med(d["etcd-3.7"]), med(d["etcd-3.5"])
        fmt = (lambda v: f"{v:.2f}") if unit == "s" else (lambda v: f"{v:.0f}")
        print(f"| {label} | {fmt(c)} | {fmt(e37)} | {fmt(e35)} | {c / e37:.2f}× | {c / e35:.2f}× |")
    (a.dir / "results.json").write_text(json.dumps(
        {"keys": a.keys, "revision": revision, "snapshot_bytes": snap.stat().st_size,
         "restore_s": restore, "restore_rss_mib": restore_rss, "save_s": save}, indent=1))
    if a.snapshot is None:
        snap.unlink()


if __name__ == "__main__":
    main()
