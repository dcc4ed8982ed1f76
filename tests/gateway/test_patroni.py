"""Patroni (Debian's, 3.0.2) with Debian's PostgreSQL 15: two PostgreSQL nodes kept by Patroni
through its etcd3 DCS, which is a three-member cairn cluster reached over the HTTP/JSON
gateway. Patroni elects a primary and the other node replicates; Patroni keeps working while
cairn's Raft leader is SIGKILLed and restarted; SIGKILL of the primary's Patroni and
PostgreSQL makes the replica take over. The same scenario runs on a three-member etcd 3.5.1
as the baseline; the times of both disruptions on each are printed and written to
target/gateway-failover.txt."""

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

from cairn import Cluster, free_port, post, wait_for

PG_BIN = "/usr/lib/postgresql/15/bin"
PATRONI = "/usr/bin/patroni"
SCOPE = "cairn"
TTL, LOOP_WAIT, RETRY_TIMEOUT = 10, 2, 4
RESULTS = os.path.join(os.path.dirname(__file__), "..", "..", "target", "gateway-failover.txt")


def b64(text):
    return base64.b64encode(text.encode()).decode()


def as_postgres():
    """Patroni runs as postgres when the test runs as root: PostgreSQL refuses root."""
    return os.geteuid() == 0


class Node:
    def __init__(self, base, name, cluster):
        self.name = name
        self.dir = os.path.join(base, name)
        self.pg_port = free_port()
        self.api_port = free_port()
        self.process = None
        os.makedirs(os.path.join(self.dir, "log"))
        config = f"""scope: {SCOPE}
namespace: /service/
name: {name}
log: {{level: INFO, dir: {self.dir}/log}}
restapi:
  listen: 127.0.0.1:{self.api_port}
  connect_address: 127.0.0.1:{self.api_port}
etcd3:
  hosts: [{", ".join(m.client_url.removeprefix("http://") for m in cluster.members)}]
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    postgresql:
      use_pg_rewind: true
      parameters: {{wal_level: replica, hot_standby: "on", max_wal_senders: 10, max_replication_slots: 10, wal_log_hints: "on"}}
  initdb: [{{encoding: UTF8}}, data-checksums]
postgresql:
  listen: 127.0.0.1:{self.pg_port}
  connect_address: 127.0.0.1:{self.pg_port}
  data_dir: {self.dir}/data
  bin_dir: {PG_BIN}
  pgpass: {self.dir}/pgpass
  authentication:
    superuser: {{username: postgres, password: su-pass}}
    replication: {{username: replicator, password: rep-pass}}
    rewind: {{username: rewind_user, password: rw-pass}}
  parameters: {{unix_socket_directories: {self.dir}}}
  pg_hba:
  - local all all trust
  - host replication replicator 127.0.0.1/32 md5
  - host all all 127.0.0.1/32 md5
"""
        self.config = os.path.join(self.dir, "patroni.yml")
        with open(self.config, "w") as f:
            f.write(config)
        if as_postgres():
            for root, dirs, files in os.walk(self.dir):
                for entry in [root] + [os.path.join(root, e) for e in dirs + files]:
                    shutil.chown(entry, "postgres", "postgres")

    def start(self):
        command = [PATRONI, self.config]
        if as_postgres():
            command = ["runuser", "-u", "postgres", "--"] + command
        out = open(os.path.join(self.dir, "patroni.out"), "ab")
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
        out.close()

    def rest(self, path):
        """The status of GET path on Patroni's REST API (0 if it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}{path}", timeout=2) as answer:
                return answer.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def sql(self, statement):
        env = dict(os.environ, PGPASSWORD="su-pass", PGCONNECT_TIMEOUT="2")
        done = subprocess.run(
            [f"{PG_BIN}/psql", "-h", "127.0.0.1", "-p", str(self.pg_port), "-U", "postgres", "-Atc", statement],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {statement}: {done.stderr}")
        return done.stdout.strip()

    def writable(self):
        return self.sql("select pg_is_in_recovery()") == "f"

    def postmaster(self):
        try:
            with open(os.path.join(self.dir, "data", "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def kill(self):
        """SIGKILL of Patroni and of PostgreSQL, every process of both."""
        victims = []
        if self.process is not None:
            victims.append(self.process.pid)
        postmaster = self.postmaster()
        if postmaster:
            victims.append(postmaster)
        for pid in list(victims):
            victims.extend(descendants(pid))
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            self.process.wait()
            self.process = None

    def log(self):
        text = []
        for name in ["patroni.out"] + [os.path.join("log", f) for f in sorted(os.listdir(os.path.join(self.dir, "log")))]:
            try:
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    text.append(f.read()[-4000:])
            except OSError:
                pass
        return "\n".join(text)


def descendants(pid):
    """Every process below pid, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


ETCD_3_5 = os.path.join(os.path.dirname(__file__), "..", "..", "target", "etcd-3.5", "etcd")
MEASURED = {}


def tearDownModule():
    if not MEASURED:
        return
    lines = [f"Patroni's disruptions (ttl {TTL} s, loop_wait {LOOP_WAIT} s, retry_timeout {RETRY_TIMEOUT} s), seconds:"]
    lines.append(f"  {'DCS':<10} {'Raft leader SIGKILLed':>22} {'primary SIGKILLed':>18}")
    for target, (member, failover) in sorted(MEASURED.items()):
        lines.append(f"  {target:<10} {member:>22.1f} {failover:>18.1f}")
    if len(MEASURED) == 2:
        (cm, cf), (em, ef) = MEASURED["cairn"], MEASURED["etcd 3.5"]
        lines.append(f"  cairn/etcd {cm / em:>22.2f} {cf / ef:>18.2f}")
    report = "\n".join(lines) + "\n"
    print("\n" + report)
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        f.write(report)


class Scenario:
    """The scenario, on the DCS `binary` (a cairn or an etcd) names."""

    target = None
    binary = None

    def setUp(self):
        self.cluster = Cluster(3, binary=self.binary)
        self.base = tempfile.mkdtemp(prefix="patroni-")
        os.chmod(self.base, 0o755)
        self.nodes = [Node(self.base, f"node{i}", self.cluster) for i in (1, 2)]

    def tearDown(self):
        for node in self.nodes:
            node.kill()
        self.cluster.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def dcs(self, key):
        """The DCS's key-value under /service/<scope>/, read from any live cairn member."""
        for member in self.cluster.members:
            if member.process is None:
                continue
            try:
                answer = post(member.client_url, "/v3/kv/range", {"key": b64(f"/service/{SCOPE}/{key}")})
            except OSError:
                continue
            kvs = answer.get("kvs", [])
            return kvs[0] if kvs else None
        return None

    def dcs_value(self, key):
        kv = self.dcs(key)
        return base64.b64decode(kv.get("value", "")).decode() if kv else None

    def wait(self, what, check):
        try:
            return wait_for(what, check, patience=120, every=0.1)
        except AssertionError:
            logs = "\n".join(f"--- {n.name} ---\n{n.log()}" for n in self.nodes)
            raise AssertionError(f"{what}\n{logs}")

    def test_patroni_elects_survives_a_dcs_member_and_fails_over(self):
        first, second = self.nodes
        first.start()
        self.wait("node1 primary", lambda: first.rest("/primary") == 200 and first.writable())
        second.start()
        self.wait("node2 replica", lambda: second.rest("/replica") == 200)
        self.assertEqual(self.dcs_value("leader"), "node1")
        first.sql("create table t(v int); insert into t values (1)")
        self.wait("the row replicated", lambda: second.sql("select count(*) from t") == "1")

        # The DCS's Raft leader is SIGKILLed: Patroni goes on (the primary keeps its leader key,
        # and writes its status again), then the member comes back and catches up.
        leader_key = self.dcs("leader")
        victim = self.wait("a cairn leader", self.cluster.leader)
        status_before = int(self.dcs("status")["mod_revision"])
        killed = time.monotonic()
        victim.kill()
        self.wait(
            "Patroni writes its status through the other members",
            lambda: int(self.dcs("status")["mod_revision"]) > status_before,
        )
        member_disruption = time.monotonic() - killed
        status_after = int(self.dcs("status")["mod_revision"])
        self.wait("and again", lambda: int(self.dcs("status")["mod_revision"]) > status_after)
        self.assertEqual(self.dcs("leader")["create_revision"], leader_key["create_revision"], "no new leader")
        self.assertEqual(first.rest("/primary"), 200)
        self.assertEqual(second.rest("/replica"), 200)
        first.sql("insert into t values (2)")
        self.cluster.restart(victim)
        newest = int(self.dcs("status")["mod_revision"])
        self.wait(
            "the restarted member caught up",
            lambda: int(post(victim.client_url, "/v3/kv/range", {"key": b64("x"), "serializable": True})["header"]["revision"]) >= newest,
        )
        self.wait("the second row replicated", lambda: second.sql("select count(*) from t") == "2")

        # The primary's Patroni and PostgreSQL are SIGKILLed: the replica takes over once the
        # leader key's lease expires.
        killed = time.monotonic()
        first.kill()
        self.wait("node2 primary and writable", lambda: second.rest("/primary") == 200 and second.writable())
        failover = time.monotonic() - killed
        self.assertEqual(self.dcs_value("leader"), "node2")
        second.sql("insert into t values (3)")
        self.assertEqual(second.sql("select count(*) from t"), "3")

        MEASURED[self.target] = (member_disruption, failover)
        print(f"\n{self.target}: Raft leader SIGKILLed {member_disruption:.1f} s, primary SIGKILLed {failover:.1f} s")


class PatroniOnCairn(Scenario, unittest.TestCase):
    target = "cairn"


class PatroniOnEtcd35(Scenario, unittest.TestCase):
    """The baseline: the same scenario on etcd 3.5.1's own gateway."""

    target = "etcd 3.5"
    binary = ETCD_3_5

if __name__ == "__main__":
    unittest.main()
