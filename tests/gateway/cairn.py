"""A cairn cluster for the gateway's client tests: members on free loopback ports, each in
its own data directory with its log beside it, killed (SIGKILL) and restarted on demand,
stopped at the end."""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

PATIENCE = 60.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, path, body, timeout=5.0):
    """One gateway call: the decoded JSON answer (raises on an HTTP error)."""
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return json.loads(answer.read() or b"{}")


def wait_for(what, check, patience=PATIENCE, every=0.05):
    """Polls check() until it returns something truthy, which it returns; fails after patience."""
    deadline = time.monotonic() + patience
    last = None
    while True:
        try:
            got = check()
            if got:
                return got
        except Exception as e:  # the condition is not there yet: a refused connection, say
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {patience} s (last error: {last!r})")
        time.sleep(every)


class Member:
    def __init__(self, binary, base, name):
        self.binary = binary
        self.name = name
        self.dir = os.path.join(base, name)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.process = None

    @property
    def client_url(self):
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self):
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, cluster):
        os.makedirs(self.dir, exist_ok=True)
        log = open(os.path.join(self.dir, "cairn.log"), "ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                "--name", self.name,
                "--data-dir", os.path.join(self.dir, "data"),
                "--listen-client-urls", self.client_url,
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", cluster,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()

    def healthy(self):
        with urllib.request.urlopen(self.client_url + "/health", timeout=2) as answer:
            return json.loads(answer.read()).get("health") == "true"

    def kill(self):
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def log(self):
        try:
            with open(os.path.join(self.dir, "cairn.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class Cluster:
    """`size` members of one cluster, started and healthy."""

    def __init__(self, size=3, binary=None):
        self.binary = binary or os.environ.get("CAIRN_BIN") or os.path.join(
            os.path.dirname(__file__), "..", "..", "target", "debug", "cairn"
        )
        if not os.path.exists(self.binary):
            raise RuntimeError(f"no cairn binary at {self.binary}: build it (cargo build -p cairn-server)")
        self.base = tempfile.mkdtemp(prefix="cairn-gateway-")
        self.members = [Member(self.binary, self.base, f"m{i}") for i in range(size)]
        self.initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.start(self.initial)
        for m in self.members:
            self.wait_healthy(m)

    def wait_healthy(self, member):
        def check():
            if member.process is not None and member.process.poll() is not None:
                raise AssertionError(f"{member.name} exited:\n{member.log()[-3000:]}")
            return member.healthy()

        wait_for(f"{member.name} healthy", check)

    def restart(self, member):
        member.start(self.initial)
        self.wait_healthy(member)

    def leader(self):
        """The member that leads the Raft group now."""
        for m in self.members:
            if m.process is None:
                continue
            try:
                status = post(m.client_url, "/v3/maintenance/status", {})
            except OSError:
                continue
            if status.get("leader") == status["header"]["member_id"]:
                return m
        return None

    def endpoints(self):
        return [m.client_url for m in self.members]

    def stop(self):
        for m in self.members:
            m.kill()
        shutil.rmtree(self.base, ignore_errors=True)
