//! A three-process cairn cluster on loopback, bootstrapped with `--initial-cluster`, driven with
//! the real etcdctl: writes through any member; the leader killed with SIGKILL while writes go
//! on, then restarted to catch up; and a fourth member added as a learner with
//! `etcdctl member add --learner`, started with `--initial-cluster-state existing`, refusing what
//! etcd's learners refuse, promoted.
//! And etcd's Go client at 3.5.0, 3.5.9 and 3.6 (tests/goclients) each running a
//! put/get/watch/lease round against a cluster: 3.5.0 and 3.5.9 send the HTTP/2
//! `:authority` as `#initially=[<endpoints>]`, which cairn must accept as Go's server does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How long anything may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);
const ETCDCTL: &str = "/usr/bin/etcdctl";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One member's process.
struct Member {
    name: String,
    dir: PathBuf,
    client: u16,
    peer: u16,
    child: Option<Child>,
    /// More flags for cairn.
    extra: Vec<String>,
}

impl Member {
    fn new(root: &Path, name: &str) -> Member {
        Member {
            name: name.to_string(),
            dir: root.join(name),
            client: free_port(),
            peer: free_port(),
            child: None,
            extra: Vec::new(),
        }
    }

    fn client_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer)
    }

    fn start(&mut self, initial_cluster: &str, state: &str) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["--name", &self.name])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--listen-client-urls", &self.client_url()])
            .args(["--advertise-client-urls", &self.client_url()])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            // Frequent snapshots and a short catch-up margin: a member that was down while
            // the others wrote a little is sent a snapshot over the peer transport.
            .args([
                "--snapshot-count",
                "20",
                "--experimental-snapshot-catchup-entries",
                "10",
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// Sends the process `signal` (`-STOP`, `-CONT`).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    }

    /// SIGKILL, and wait for the process to be gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// `GET path` on the client port: the status code and body, or `None` if unreachable.
    fn http_get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.client)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        Some((code, body))
    }

    /// Waits until the member reports itself healthy: it has a leader and serves a
    /// linearizable read.
    fn wait_healthy(&mut self) {
        assert!(self.try_wait_healthy(), "{} exited: {}", self.name, self.log_tail());
    }

    /// [`Member::wait_healthy`], or false if the process exited because one of its ports was
    /// taken between [`free_port`] and its bind (by another test, or a connection's ephemeral
    /// port on a busy machine).
    fn try_wait_healthy(&mut self) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some((200, body)) = self.http_get("/health") {
                if body.contains(r#""health":"true""#) {
                    return true;
                }
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited && self.log_tail().contains("in use") {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "{} never became healthy: {}",
                self.name,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last lines of the member's log, for a failure's message.
    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

fn etcdctl(endpoints: &[&Member], args: &[&str]) -> Output {
    assert!(
        Path::new(ETCDCTL).exists(),
        "{ETCDCTL} is missing: run tests/run-all.sh, which installs Debian's etcd-client"
    );
    let endpoints: Vec<String> = endpoints.iter().map(|m| m.client_url()).collect();
    Command::new(ETCDCTL)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--command-timeout=3s", "--dial-timeout=2s"])
        .args(args)
        .output()
        .unwrap()
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "etcdctl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Retries an etcdctl command until it succeeds (the cluster may be electing a leader).
fn eventually(endpoints: &[&Member], args: &[&str]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let output = etcdctl(endpoints, args);
        if output.status.success() {
            return String::from_utf8(output.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "etcdctl {args:?} kept failing: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs an etcdctl command that is not idempotent, again while it fails before anything was
/// proposed: while the group has no leader (a busy machine can make it hold an election).
fn retry_unproposed(endpoints: &[&Member], args: &[&str]) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let output = etcdctl(endpoints, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() || !stderr.contains("etcdserver: no leader") || Instant::now() > deadline {
            return ok(output);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of `key` read serializably from `member` (its own applied state).
fn local_value(member: &Member, key: &str) -> Option<String> {
    let out = ok(etcdctl(
        &[member],
        &["get", key, "--consistency=s", "--print-value-only"],
    ));
    let value = out.trim_end_matches('\n');
    (!value.is_empty()).then(|| value.to_string())
}

/// Waits until `member` has applied `key = value`.
fn wait_value(member: &Member, key: &str, value: &str) {
    let deadline = Instant::now() + PATIENCE;
    while local_value(member, key).as_deref() != Some(value) {
        assert!(Instant::now() < deadline, "{} never applied {key}={value}", member.name);
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The leader's member ID, in hex, as `endpoint status` reports it from `member`.
fn leader_of(member: &Member) -> String {
    let out = eventually(&[member], &["endpoint", "status", "-w", "json"]);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    format!("{:x}", status[0]["Status"]["leader"].as_u64().unwrap())
}

/// Every member but `members[skip]`.
fn all_but(members: &[Member], skip: usize) -> Vec<&Member> {
    members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != skip)
        .map(|(_, m)| m)
        .collect()
}

fn member_id(member: &Member) -> String {
    let out = ok(etcdctl(&[member], &["endpoint", "status", "-w", "json"]));
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    format!("{:x}", status[0]["Status"]["header"]["member_id"].as_u64().unwrap())
}

/// Starts members named `names` as one new cluster, and waits until each is healthy.
fn start_cluster(root: &Path, names: &[&str]) -> (Vec<Member>, String) {
    start_cluster_with(root, names, &[])
}

/// Starts members named `names` as one new cluster with `extra` flags, and waits until each is
/// healthy; again on other ports (and in a fresh directory) if a port was taken meanwhile.
fn start_cluster_with(root: &Path, names: &[&str], extra: &[&str]) -> (Vec<Member>, String) {
    for attempt in 0..5 {
        let root = root.join(format!("attempt-{attempt}"));
        let mut members: Vec<Member> = names.iter().map(|n| Member::new(&root, n)).collect();
        for m in &mut members {
            m.extra = extra.iter().map(|s| s.to_string()).collect();
        }
        let initial: Vec<String> = members.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect();
        let initial = initial.join(",");
        for m in &mut members {
            m.start(&initial, "new");
        }
        if members.iter_mut().all(|m| m.try_wait_healthy()) {
            return (members, initial);
        }
    }
    panic!("five clusters in a row lost a port to another process before binding it");
}

/// A lease's TTL and keep-alive asked of every member as soon as the cluster is healthy: a
/// follower sends them on to the leader, and waits for the leader's client URLs if they are
/// not applied there yet (they are published through the log just after start), instead of
/// answering "no leader".
#[test]
fn leader_only_requests_are_served_by_every_member_from_the_start() {
    use cairn_server::pb::etcdserverpb::lease_client::LeaseClient;
    use cairn_server::pb::etcdserverpb::{LeaseGrantRequest, LeaseTimeToLiveRequest};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let (members, _) = start_cluster(root.path(), &["n1", "n2", "n3"]);
    runtime.block_on(async {
        for m in &members {
            let channel = tonic::transport::Channel::from_shared(m.client_url())
                .unwrap()
                .connect_lazy();
            let mut lease = LeaseClient::new(channel);
            let grant = LeaseGrantRequest { ttl: 60, id: 0 };
            let id = lease.lease_grant(grant).await.unwrap().into_inner().id;
            let ask = LeaseTimeToLiveRequest { id, keys: false };
            let ttl = lease.lease_time_to_live(ask).await;
            let ttl = ttl.unwrap_or_else(|e| panic!("{}: {e:?}", m.name)).into_inner();
            assert_eq!(ttl.granted_ttl, 60, "{}", m.name);
        }
    });
}

/// A leader paused (SIGSTOP) while the others elect a new one and write, then resumed, never
/// answers a linearizable read from its old state (etcd #20418): a read sent to it while it
/// sleeps, and served the moment it wakes, sees the new value or fails, never the old one.
#[test]
fn a_paused_leader_that_wakes_never_serves_a_stale_linearizable_read() {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, RangeRequest};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let (members, _) = start_cluster(root.path(), &["s1", "s2", "s3"]);
    let ids: Vec<String> = members.iter().map(member_id).collect();
    for round in 0..3 {
        let before = format!("before-{round}");
        eventually(&[&members[0], &members[1], &members[2]], &["put", "k", &before]);
        let leader = ids.iter().position(|id| *id == leader_of(&members[0])).unwrap();
        let others: Vec<&Member> = (0..3).filter(|i| *i != leader).map(|i| &members[i]).collect();
        // A connection to the leader, open before it sleeps.
        let url = members[leader].client_url();
        let channel = runtime.block_on(async {
            tonic::transport::Channel::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap()
        });
        members[leader].signal("-STOP");
        // The others elect a new leader and write the new value.
        let after = format!("after-{round}");
        eventually(&others, &["put", "k", &after]);
        // A read sent to the sleeping leader waits in its socket; it is served on waking.
        let read = runtime.spawn(async move {
            let range = RangeRequest {
                key: b"k".to_vec().into(),
                ..Default::default()
            };
            let answer = tokio::time::timeout(PATIENCE, KvClient::new(channel).range(range)).await;
            answer
                .unwrap()
                .map(|r| r.into_inner().kvs.first().map(|kv| kv.value.to_vec()))
        });
        // The fault's schedule, not a wait for an event: the leader sleeps 200 ms more with
        // the read in its socket. Should the read reach it only after it wakes, the check
        // holds all the same (a woken leader must not answer from its old state).
        std::thread::sleep(Duration::from_millis(200));
        members[leader].signal("-CONT");
        match runtime.block_on(read).unwrap() {
            Ok(value) => assert_eq!(value.as_deref(), Some(after.as_bytes()), "round {round}: a stale read"),
            Err(status) => eprintln!("round {round}: the woken leader refused the read: {status:?}"),
        }
    }
}

/// `--auto-promote-learners`: a fourth member added as a learner while a client writes is
/// promoted by the leader once it is in sync, with no MemberPromote from anyone.
#[test]
fn a_learner_that_joins_under_load_is_promoted_without_an_operator() {
    let root = tempfile::tempdir().unwrap();
    let (members, initial) = start_cluster_with(root.path(), &["p1", "p2", "p3"], &["--auto-promote-learners"]);
    // The load: puts as fast as one client makes them, until the learner is a voter.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, endpoint) = (stop.clone(), members[0].client_url());
        std::thread::spawn(move || {
            use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest};
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let channel = tonic::transport::Channel::from_shared(endpoint).unwrap().connect_lazy();
                let mut kv = KvClient::new(channel);
                let mut written = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let put = PutRequest {
                        key: format!("load/{}", written % 1000).into_bytes().into(),
                        value: vec![b'x'; 1024].into(),
                        ..Default::default()
                    };
                    if kv.put(put).await.is_ok() {
                        written += 1;
                    }
                }
                written
            })
        })
    };
    let mut fourth = Member::new(root.path(), "p4");
    let peer_urls = format!("--peer-urls={}", fourth.peer_url());
    retry_unproposed(&[&members[0]], &["member", "add", "p4", "--learner", &peer_urls]);
    let fourth_url = fourth.peer_url();
    let is_learner = |list: &serde_json::Value| {
        list["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["peerURLs"][0] == fourth_url.as_str())
            .map(|m| m["isLearner"] == true)
    };
    // Not started yet, it has nothing of the log: a learner.
    let list: serde_json::Value =
        serde_json::from_str(&ok(etcdctl(&[&members[0]], &["member", "list", "-w", "json"]))).unwrap();
    assert_eq!(is_learner(&list), Some(true), "{list}");
    fourth.start(&format!("{initial},p4={}", fourth.peer_url()), "existing");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let list = ok(etcdctl(&[&members[1]], &["member", "list", "-w", "json"]));
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        if is_learner(&list) == Some(false) {
            break;
        }
        assert!(Instant::now() < deadline, "the learner was never promoted: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(written > 0, "the load wrote nothing");
    // A voter now: it serves linearizable reads, and has what was written.
    ok(etcdctl(&[&fourth], &["get", "load/0"]));
    let said = members.iter().any(|m| {
        std::fs::read_to_string(m.dir.with_extension("log"))
            .unwrap_or_default()
            .contains("promoted a learner in sync with the leader")
    });
    assert!(said, "the leader logs the promotion");
}

/// A leader asked to stop (SIGTERM) first hands its leadership to another member, as etcd
/// does on shutdown: the others go on under the leader it named, without an election
/// timeout's pause.
#[test]
fn a_leader_stopped_with_sigterm_hands_its_leadership_over() {
    let root = tempfile::tempdir().unwrap();
    let (mut members, _) = start_cluster(root.path(), &["m1", "m2", "m3"]);
    ok(etcdctl(&[&members[0]], &["put", "before", "stop"]));
    let leader = leader_of(&members[0]);
    let stopped = members.iter().position(|m| member_id(m) == leader).unwrap();
    members[stopped].signal("-TERM");
    let status = members[stopped].child.take().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}");
    let log = std::fs::read_to_string(members[stopped].dir.with_extension("log")).unwrap();
    let handed = log
        .lines()
        .find(|l| l.contains("stopping: handed the leadership over"))
        .unwrap_or_else(|| panic!("no handover in the leader's log:\n{log}"));
    let rest = all_but(&members, stopped);
    let new_leader = leader_of(rest[0]);
    assert_ne!(new_leader, leader);
    assert!(
        handed.contains(&new_leader),
        "{handed} (the others follow {new_leader})"
    );
    ok(etcdctl(&[rest[1]], &["put", "after", "stop"]));
}

#[test]
fn three_processes_replicate_survive_a_killed_leader_and_grow_by_a_learner() {
    let root = tempfile::tempdir().unwrap();
    let (mut members, initial) = start_cluster(root.path(), &["m1", "m2", "m3"]);

    // Writes through any member reach every member.
    for (i, m) in members.iter().enumerate() {
        ok(etcdctl(&[m], &["put", &format!("k{i}"), &format!("v{i}")]));
    }
    for m in &members {
        for i in 0..3 {
            wait_value(m, &format!("k{i}"), &format!("v{i}"));
        }
    }
    let list = ok(etcdctl(&[&members[0]], &["member", "list"]));
    assert_eq!(list.lines().count(), 3, "{list}");
    assert!(list.lines().all(|l| l.contains(", started, m")), "{list}");

    // SIGKILL the leader: the other two elect a new one and take writes.
    let leader = leader_of(&members[0]);
    let killed = members.iter().position(|m| member_id(m) == leader).unwrap();
    members[killed].kill();
    let rest = all_but(&members, killed);
    eventually(&rest, &["put", "after-kill", "x"]);
    let new_leader = leader_of(rest[0]);
    assert_ne!(new_leader, leader);
    for i in 0..60 {
        eventually(&rest, &["put", &format!("while-down-{i}"), "y"]);
    }
    // It restarts from its own data and catches up, by a snapshot streamed over the peer
    // transport: the others' logs no longer hold what it missed.
    members[killed].start(&initial, "new");
    members[killed].wait_healthy();
    wait_value(&members[killed], "after-kill", "x");
    wait_value(&members[killed], "while-down-59", "y");
    let hashes: Vec<String> = members
        .iter()
        .map(|m| {
            let rev = ok(etcdctl(&[m], &["get", "k0", "-w", "json", "--consistency=s"]));
            let rev: serde_json::Value = serde_json::from_str(&rev).unwrap();
            let rev = rev["header"]["revision"].as_i64().unwrap().to_string();
            let out = ok(etcdctl(&[m], &["endpoint", "hashkv", "--rev", &rev, "-w", "json"]));
            let out: serde_json::Value = serde_json::from_str(&out).unwrap();
            format!("{rev}:{}", out[0]["HashKV"]["hash"])
        })
        .collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "members differ: {hashes:?}");
    let metrics = members[killed].http_get("/metrics").unwrap().1;
    assert!(metrics.contains("etcd_server_has_leader 1"), "{metrics}");
    assert!(
        metrics.contains("etcd_network_snapshot_receive_success 1"),
        "it caught up by a snapshot: {metrics}"
    );

    // A fourth member joins as a learner, catches up, and is promoted.
    let mut fourth = Member::new(root.path(), "m4");
    let peer_urls = format!("--peer-urls={}", fourth.peer_url());
    let added = retry_unproposed(&[&members[0]], &["member", "add", "m4", "--learner", &peer_urls]);
    assert!(added.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""), "{added}");
    let joined = format!("{initial},m4={}", fourth.peer_url());
    fourth.start(&joined, "existing");
    wait_value(&fourth, "after-kill", "x");
    // A learner serves serializable ranges (above) and Status, and refuses every other call
    // as etcd's learners do.
    ok(etcdctl(&[&fourth], &["endpoint", "status"]));
    for refused in [
        &["put", "k", "v"][..],
        &["get", "after-kill"],
        &["lease", "grant", "10"],
        &["member", "list"],
    ] {
        let out = etcdctl(&[&fourth], refused);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("etcdserver: rpc not supported for learner"),
            "etcdctl {refused:?} on a learner: {stderr}"
        );
    }
    let list = ok(etcdctl(&[&members[1]], &["member", "list", "-w", "json"]));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let learner = list["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["peerURLs"][0] == fourth.peer_url())
        .unwrap()
        .clone();
    assert_eq!(learner["isLearner"], true);
    let id = format!("{:x}", learner["ID"].as_u64().unwrap());
    // Promotion waits until the leader has seen the learner catch up.
    let promoted = eventually(&[&members[2]], &["member", "promote", &id]);
    assert!(promoted.contains("promoted"), "{promoted}");
    eventually(&[&fourth], &["put", "through-m4", "y"]);
    for m in members.iter().chain(std::iter::once(&fourth)) {
        wait_value(m, "through-m4", "y");
    }
    let list = ok(etcdctl(&[&fourth], &["member", "list"]));
    assert_eq!(list.lines().count(), 4, "{list}");
    assert!(!list.contains("true"), "nobody is a learner any more: {list}");
}

/// A recorded workload for the linearizability checker of `tests/src`: clients on their own
/// runtime put, read (linearizably) and compare-and-set a few keys through whichever members
/// are listed, each call timed on one clock and recorded with what came back. A call that
/// fails or takes over two seconds is indeterminate.
mod recorded {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, RwLock};
    use std::time::{Duration, Instant};

    use cairn_server::pb::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
    use cairn_server::pb::etcdserverpb::kv_client::KvClient;
    use cairn_server::pb::etcdserverpb::request_op::Request;
    use cairn_server::pb::etcdserverpb::{Compare, PutRequest, RangeRequest, RequestOp, TxnRequest};
    use cairn_tests::linearizability::{Input, Operation, Output};
    use tonic::transport::{Channel, Endpoint};

    pub const KEYS: usize = 4;

    pub struct Workload {
        pub runtime: tokio::runtime::Runtime,
        /// The members' client URLs the clients pick from.
        pub members: Arc<RwLock<Vec<Channel>>>,
        pub history: Arc<Mutex<Vec<Operation>>>,
        stop: Arc<AtomicBool>,
        /// While set, the clients ask nothing new.
        paused: Arc<AtomicBool>,
        clients: Vec<tokio::task::JoinHandle<()>>,
        epoch: Instant,
    }

    fn channel(url: &str) -> Channel {
        Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy()
    }

    impl Workload {
        pub fn start(urls: &[String], clients: usize) -> Workload {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let _entered = runtime.enter();
            let members = Arc::new(RwLock::new(urls.iter().map(|u| channel(u)).collect::<Vec<_>>()));
            let history = Arc::new(Mutex::new(Vec::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let paused = Arc::new(AtomicBool::new(false));
            let epoch = Instant::now();
            let clients = (0..clients)
                .map(|id| {
                    let (members, history, stop) = (members.clone(), history.clone(), stop.clone());
                    let paused = paused.clone();
                    runtime.spawn(async move {
                        let mut n = 0u64;
                        while !stop.load(Ordering::Acquire) {
                            if paused.load(Ordering::Acquire) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                            n += 1;
                            let pick = (id as u64 * 7919 + n * 104_729) as usize;
                            let member = {
                                let members = members.read().unwrap();
                                members[pick % members.len()].clone()
                            };
                            let key = format!("lin/{}", pick / 3 % KEYS);
                            let input = match n % 3 {
                                0 => Input::Get { key },
                                1 => Input::Put {
                                    key,
                                    value: format!("{id}-{n}"),
                                },
                                _ => Input::Cas {
                                    key,
                                    expected: Some(format!("{id}-{}", n - 1)),
                                    new: format!("{id}-{n}"),
                                },
                            };
                            let op = call(id, member, input, epoch).await;
                            let failed = op.output == Output::Unknown;
                            history.lock().unwrap().push(op);
                            if failed {
                                // A client's back-off: every failed write is one more the
                                // checker must place anywhere after its call.
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                    })
                })
                .collect();
            Workload {
                runtime,
                members,
                history,
                stop,
                paused,
                clients,
                epoch,
            }
        }

        pub fn set_members(&self, urls: &[String]) {
            let _entered = self.runtime.enter();
            *self.members.write().unwrap() = urls.iter().map(|u| channel(u)).collect();
        }

        /// The clients ask nothing new until `resume`: while the only member is restarted,
        /// calls could only fail.
        pub fn pause(&self) {
            self.paused.store(true, Ordering::Release);
        }

        pub fn resume(&self) {
            self.paused.store(false, Ordering::Release);
        }

        /// Calls acknowledged so far: writes and swaps that took effect.
        pub fn acknowledged_writes(&self) -> usize {
            let history = self.history.lock().unwrap();
            history
                .iter()
                .filter(|op| matches!(op.output, Output::Ok | Output::Swapped(true)))
                .count()
        }

        /// Stops the clients, reads every key through each of `urls`, and returns the
        /// history.
        pub fn finish(self, urls: &[String]) -> Vec<Operation> {
            self.stop.store(true, Ordering::Release);
            let epoch = self.epoch;
            self.runtime.block_on(async {
                for client in self.clients {
                    client.await.unwrap();
                }
                for (i, url) in urls.iter().enumerate() {
                    for k in 0..KEYS {
                        let input = Input::Get {
                            key: format!("lin/{k}"),
                        };
                        let op = call(100 + i, channel(url), input, epoch).await;
                        assert_ne!(op.output, Output::Unknown, "the final read of lin/{k} through {url}");
                        self.history.lock().unwrap().push(op);
                    }
                }
            });
            std::mem::take(&mut *self.history.lock().unwrap())
        }
    }

    async fn call(client: usize, member: Channel, input: Input, epoch: Instant) -> Operation {
        let mut kv = KvClient::new(member);
        let call = epoch.elapsed().as_nanos() as u64;
        let asked = async {
            match &input {
                Input::Get { key } => {
                    let r = kv
                        .range(RangeRequest {
                            key: key.clone().into_bytes().into(),
                            ..RangeRequest::default()
                        })
                        .await?
                        .into_inner();
                    let value = r.kvs.first().map(|kv| String::from_utf8(kv.value.to_vec()).unwrap());
                    Ok::<_, tonic::Status>(Output::Value(value))
                }
                Input::Put { key, value } => {
                    kv.put(PutRequest {
                        key: key.clone().into_bytes().into(),
                        value: value.clone().into_bytes().into(),
                        ..PutRequest::default()
                    })
                    .await?;
                    Ok(Output::Ok)
                }
                Input::Cas { key, expected, new } => {
                    let expected = expected.clone().unwrap_or_default();
                    let r = kv
                        .txn(TxnRequest {
                            compare: vec![Compare {
                                result: CompareResult::Equal as i32,
                                target: CompareTarget::Value as i32,
                                key: key.clone().into_bytes().into(),
                                target_union: Some(TargetUnion::Value(expected.into_bytes().into())),
                                ..Compare::default()
                            }],
                            success: vec![RequestOp {
                                request: Some(Request::RequestPut(PutRequest {
                                    key: key.clone().into_bytes().into(),
                                    value: new.clone().into_bytes().into(),
                                    ..PutRequest::default()
                                })),
                            }],
                            ..TxnRequest::default()
                        })
                        .await?
                        .into_inner();
                    Ok(Output::Swapped(r.succeeded))
                }
            }
        };
        let output = match tokio::time::timeout(Duration::from_secs(2), asked).await {
            Ok(Ok(output)) => output,
            Ok(Err(_)) | Err(_) => Output::Unknown,
        };
        Operation {
            client,
            input,
            output,
            call,
            ret: epoch.elapsed().as_nanos() as u64,
        }
    }
}

/// The survivor's Raft commit index and applied index, as `endpoint status` reports them.
fn raft_indexes(member: &Member) -> Option<(u64, u64)> {
    let out = etcdctl(&[member], &["endpoint", "status", "-w", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let s = &status[0]["Status"];
    Some((s["raftIndex"].as_u64()?, s["raftAppliedIndex"].as_u64()?))
}

/// etcd's recovery from the loss of a quorum: under a recorded workload, two of three members
/// are destroyed for good; the survivor, restarted with `--force-new-cluster`, keeps every
/// acknowledged write and becomes a cluster of one, which two new members then join while
/// the clients go on (docs/operations.md, "Recover from quorum loss"). The whole history,
/// with final reads through every member, must be linearizable.
#[test]
fn a_quorum_lost_for_good_is_recovered_with_force_new_cluster() {
    use cairn_tests::linearizability::{check, Verdict};

    let root = tempfile::tempdir().unwrap();
    let (mut members, initial) = start_cluster(root.path(), &["m1", "m2", "m3"]);
    let urls = |ms: &[Member]| ms.iter().map(Member::client_url).collect::<Vec<_>>();
    let workload = recorded::Workload::start(&urls(&members), 3);
    let deadline = Instant::now() + PATIENCE;
    while workload.acknowledged_writes() < 60 {
        assert!(Instant::now() < deadline, "the workload made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The survivor is the leader, which has every committed entry. Its two followers go
    // first, with their disks, while writes go on; the leader can commit nothing after that.
    let leader = leader_of(&members[0]);
    let survivor = members.iter().position(|m| member_id(m) == leader).unwrap();
    members.swap(0, survivor);
    workload.set_members(&[members[0].client_url()]);
    for m in &mut members[1..] {
        m.kill();
        std::fs::remove_dir_all(&m.dir).unwrap();
    }
    // The operator's check before forcing: the survivor has applied all it committed.
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some((committed, applied)) = raft_indexes(&members[0]) {
            if applied >= committed {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the survivor never applied what it committed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let survivor = &mut members[0];
    workload.pause();
    survivor.kill();
    survivor.extra = vec!["--force-new-cluster".into()];
    survivor.start(&initial, "new");
    survivor.wait_healthy();
    workload.resume();
    let list = ok(etcdctl(&[&*survivor], &["member", "list"]));
    assert_eq!(list.lines().count(), 1, "a cluster of one: {list}");
    // Restarted as any member (without the flag again, as etcd's guide says), it stays so.
    workload.pause();
    survivor.kill();
    survivor.extra.clear();
    survivor.start(&initial, "new");
    survivor.wait_healthy();
    workload.resume();
    // Two new members join it, one at a time, each as any member joins a running cluster.
    let mut cluster = format!("{}={}", members[0].name, members[0].peer_url());
    let mut grown = vec![members.remove(0)];
    for name in ["m4", "m5"] {
        let mut m = Member::new(root.path(), name);
        let peer_urls = format!("--peer-urls={}", m.peer_url());
        retry_unproposed(&[&grown[0]], &["member", "add", name, &peer_urls]);
        cluster = format!("{cluster},{name}={}", m.peer_url());
        m.start(&cluster, "existing");
        m.wait_healthy();
        // Started once it has published its name: only then may the next voter come
        // (--strict-reconfig-check, as in etcd).
        let deadline = Instant::now() + PATIENCE;
        while !ok(etcdctl(&[&grown[0]], &["member", "list"])).contains(&format!(", started, {name},")) {
            assert!(Instant::now() < deadline, "{name} never published its name");
            std::thread::sleep(Duration::from_millis(50));
        }
        grown.push(m);
        workload.set_members(&urls(&grown));
    }
    let list = ok(etcdctl(&[&grown[2]], &["member", "list"]));
    assert_eq!(list.lines().count(), 3, "{list}");
    // The clients go on against the three until they have written through the new ones too.
    let before = workload.acknowledged_writes();
    let deadline = Instant::now() + PATIENCE;
    while workload.acknowledged_writes() < before + 60 {
        assert!(Instant::now() < deadline, "the regrown cluster made no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    let history = workload.finish(&urls(&grown));
    let verdict = check(&history);
    assert_eq!(verdict, Verdict::Linearizable, "{} operations", history.len());
    let leader = leader_of(&grown[2]);
    assert!(grown.iter().any(|m| member_id(m) == leader));
}

/// etcd's Go client 3.5.0 sends `#initially=[<url>]` as the `:authority` even for one
/// endpoint, 3.5.1 to 3.5.9 for several (etcd #13192, #16324): a kube-apiserver 1.22 to 1.27
/// with several `--etcd-servers` does; etcdctl 3.4 sends a whole URL. Every version must run
/// its round; the last runs send such authorities explicitly with grpc-go's `WithAuthority`.
#[test]
fn every_etcd_go_client_version_runs_a_round_against_a_cluster() {
    let root = tempfile::tempdir().unwrap();
    let (members, _) = start_cluster(root.path(), &["g1", "g2", "g3"]);
    let all: Vec<String> = members.iter().map(Member::client_url).collect();
    let all = all.join(",");
    let one = members[1].client_url();
    let runs = [
        ("v3.5.0", one.clone(), None),
        ("v3.5.9", all.clone(), None),
        ("v3.6", all.clone(), None),
        ("v3.6", one.clone(), Some(format!("#initially=[{all}]"))),
        ("v3.6", one.clone(), Some(one.clone())),
    ];
    let rounds: std::collections::HashMap<&str, PathBuf> = ["v3.5.0", "v3.5.9", "v3.6"]
        .into_iter()
        .map(|version| (version, common::go_round(version, root.path())))
        .collect();
    for (i, (version, endpoints, authority)) in runs.into_iter().enumerate() {
        let mut command = Command::new(&rounds[version]);
        command.arg(format!("--endpoints={endpoints}"));
        command.arg(format!("--prefix=round{i}/"));
        if let Some(authority) = &authority {
            command.arg(format!("--authority={authority}"));
        }
        let output = command.output().unwrap();
        assert!(
            output.status.success(),
            "the {version} client against {endpoints} (authority {authority:?}): {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// What the calls of one task through one member came back with.
#[derive(Debug, Default)]
struct Calls {
    before_kill: usize,
    after_kill: usize,
    errors: Vec<String>,
}

/// etcd answers every request within its request timeout (7 s by default), with "request
/// timed out" or sooner "leader changed", whatever raft drops. Puts and linearizable ranges,
/// sent without any client-side retry, are in flight through every member when the leader is
/// SIGKILLed: each call must come back, done or with one of etcd's retryable errors (a call
/// through the killed member may also fail at the transport), never left hanging.
#[test]
fn every_request_in_flight_when_the_leader_is_killed_is_answered() {
    use cairn_server::pb::etcdserverpb::{kv_client::KvClient, PutRequest, RangeRequest};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let root = tempfile::tempdir().unwrap();
    let (mut members, _) = start_cluster(root.path(), &["f1", "f2", "f3"]);
    let leader = leader_of(&members[0]);
    let killed = members.iter().position(|m| member_id(m) == leader).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let kill = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let answered_after_kill = Arc::new(AtomicUsize::new(0));
        // Tasks that have had a call answered before the kill.
        let warmed = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for (i, m) in members.iter().enumerate() {
            for kind in ["put", "range"] {
                let mut client = KvClient::connect(m.client_url()).await.unwrap();
                let (kill, stop, answered) = (kill.clone(), stop.clone(), answered_after_kill.clone());
                let warmed = warmed.clone();
                let through_killed = i == killed;
                tasks.push(tokio::spawn(async move {
                    let mut calls = Calls::default();
                    let mut n = 0;
                    while !stop.load(Ordering::Acquire) {
                        let after = kill.load(Ordering::Acquire);
                        n += 1;
                        let call = async {
                            match kind {
                                "put" => client
                                    .put(PutRequest {
                                        key: format!("m{i}/{n}").into_bytes().into(),
                                        value: b"v".to_vec().into(),
                                        ..PutRequest::default()
                                    })
                                    .await
                                    .map(|_| ()),
                                _ => client
                                    .range(RangeRequest {
                                        key: b"m".to_vec().into(),
                                        range_end: b"n".to_vec().into(),
                                        count_only: true,
                                        ..RangeRequest::default()
                                    })
                                    .await
                                    .map(|_| ()),
                            }
                        };
                        match tokio::time::timeout(PATIENCE, call).await {
                            Err(_) => panic!("a {kind} through member {i} was never answered"),
                            Ok(Ok(())) => {}
                            Ok(Err(status)) => {
                                let etcd_retryable = status.code() == tonic::Code::Unavailable
                                    && [
                                        "etcdserver: request timed out",
                                        "etcdserver: leader changed",
                                        "etcdserver: no leader",
                                    ]
                                    .contains(&status.message());
                                assert!(
                                    etcd_retryable || through_killed,
                                    "a {kind} through member {i}: {status:?}"
                                );
                                calls.errors.push(status.message().to_string());
                                if through_killed {
                                    // Its member is gone: nothing more to ask it.
                                    return calls;
                                }
                            }
                        }
                        if after {
                            calls.after_kill += 1;
                            answered.fetch_add(1, Ordering::AcqRel);
                        } else {
                            calls.before_kill += 1;
                            if calls.before_kill == 1 {
                                warmed.fetch_add(1, Ordering::AcqRel);
                            }
                        }
                    }
                    calls
                }));
            }
        }
        // Requests flow through every member, then the leader dies under them.
        let deadline = Instant::now() + PATIENCE;
        while warmed.load(Ordering::Acquire) < tasks.len() {
            assert!(Instant::now() < deadline, "calls before the kill went unanswered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        kill.store(true, Ordering::Release);
        members[killed].kill();
        // The two others elect a leader and answer again: a dozen calls begun after the kill
        // come back.
        let deadline = Instant::now() + PATIENCE;
        while answered_after_kill.load(Ordering::Acquire) < 12 {
            assert!(Instant::now() < deadline, "calls after the kill went unanswered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Release);
        for task in tasks {
            let calls = task.await.unwrap();
            assert!(calls.before_kill > 0, "{calls:?}");
        }
    });
}

/// etcd ends a stream that asked for a leader (`hasleader` metadata, sent by its clients'
/// `WithRequireLeader`, as kube-apiserver's watches do) with "no leader" once its member has
/// had none for three election timeouts, so that the client moves to another member. A
/// stream that did not ask stays open, and a new one that asks is refused at once.
#[test]
fn streams_that_require_a_leader_end_when_their_member_is_cut_off() {
    use cairn_server::pb::etcdserverpb::{
        lease_client::LeaseClient, watch_client::WatchClient, watch_request::RequestUnion, LeaseGrantRequest,
        LeaseKeepAliveRequest, WatchCreateRequest, WatchRequest, WatchResponse,
    };
    use tokio_stream::StreamExt;

    fn create(key: &str) -> WatchRequest {
        WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: key.as_bytes().to_vec().into(),
                ..WatchCreateRequest::default()
            })),
        }
    }
    fn require_leader<T>(message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.metadata_mut().insert("hasleader", "true".parse().unwrap());
        request
    }

    let root = tempfile::tempdir().unwrap();
    let (mut members, _) = start_cluster(root.path(), &["s1", "s2", "s3"]);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = members[0].client_url();
        let mut watch = WatchClient::connect(url.clone()).await.unwrap();
        let mut lease = LeaseClient::connect(url).await.unwrap();
        // Each stream is open once its first answer came back.
        let (_bound_tx, bound_rx) = tokio::sync::mpsc::unbounded_channel();
        _bound_tx.send(create("a")).unwrap();
        let bound_requests = tokio_stream::wrappers::UnboundedReceiverStream::new(bound_rx);
        let mut bound = watch.watch(require_leader(bound_requests)).await.unwrap().into_inner();
        let (_free_tx, free_rx) = tokio::sync::mpsc::unbounded_channel();
        _free_tx.send(create("b")).unwrap();
        let free_requests = tokio_stream::wrappers::UnboundedReceiverStream::new(free_rx);
        let mut free = watch.watch(free_requests).await.unwrap().into_inner();
        for stream in [&mut bound, &mut free] {
            let created: WatchResponse = stream.next().await.unwrap().unwrap();
            assert!(created.created, "{created:?}");
        }
        let id = lease
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .unwrap()
            .into_inner()
            .id;
        // A follower forwards keep-alives to the leader's client URLs, which the leader
        // publishes shortly after it starts: until then a keep-alive fails, and is tried again.
        let deadline = Instant::now() + PATIENCE;
        let (_keep_tx, mut keep) = loop {
            let (keep_tx, keep_rx) = tokio::sync::mpsc::unbounded_channel();
            keep_tx.send(LeaseKeepAliveRequest { id }).unwrap();
            let keep_requests = tokio_stream::wrappers::UnboundedReceiverStream::new(keep_rx);
            let mut keep = lease
                .lease_keep_alive(require_leader(keep_requests))
                .await
                .unwrap()
                .into_inner();
            match keep.next().await.unwrap() {
                Ok(answer) => {
                    assert_eq!(answer.id, id);
                    break (keep_tx, keep);
                }
                Err(status) => assert!(Instant::now() < deadline, "keep-alives kept failing: {status:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };

        // The member is cut off: the other two are gone.
        members[1].kill();
        members[2].kill();
        for (what, ended) in [
            (
                "watch",
                tokio::time::timeout(PATIENCE, bound.next())
                    .await
                    .map(|m| m.map(|r| r.map(|_| ()))),
            ),
            (
                "keep-alive",
                tokio::time::timeout(PATIENCE, keep.next())
                    .await
                    .map(|m| m.map(|r| r.map(|_| ()))),
            ),
        ] {
            let status = match ended {
                Ok(Some(Err(status))) => status,
                other => panic!("the {what} stream that asked for a leader went on: {other:?}"),
            };
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert_eq!(status.message(), "etcdserver: no leader");
        }
        // The watch that did not ask is still open (nothing was written: no message came).
        assert!(
            futures_now(free.next()).is_none(),
            "the watch that did not ask for a leader ended"
        );
        // A new stream that asks is refused at once.
        let (_again_tx, again_rx) = tokio::sync::mpsc::unbounded_channel::<WatchRequest>();
        let again = tokio_stream::wrappers::UnboundedReceiverStream::new(again_rx);
        let refused = match watch.watch(require_leader(again)).await {
            Ok(response) => response.into_inner().next().await.unwrap().unwrap_err(),
            Err(status) => status,
        };
        assert_eq!(refused.message(), "etcdserver: no leader", "{refused:?}");
    });
}

/// The value of `future` if it is ready now, without waiting.
fn futures_now<F: std::future::Future>(future: F) -> Option<F::Output> {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

/// Stops `member` with SIGTERM, as an operator would, and waits until it has exited.
fn stop(member: &mut Member) {
    member.signal("-TERM");
    member.child.take().unwrap().wait().unwrap();
}

/// Changes the value `from` of one record in `member`'s data files to `to` (as long), and
/// rewrites the record's CRC: its data now differs from the others' without a checksum to
/// tell (a bug, or a flip the CRC happens to miss). Record layout: engine/src/backend/record.rs.
fn change_record_silently(member: &Member, key: &str, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let data = member.dir.join("member").join("data");
    let mut changed = 0;
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let needle = [key.as_bytes(), from.as_bytes()].concat();
        let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) else {
            continue;
        };
        let start = at - 64;
        let len = u32::from_le_bytes(bytes[start..start + 4].try_into().unwrap()) as usize;
        assert_eq!(len, 64 + needle.len(), "not the record of {key}");
        bytes[at + key.len()..at + needle.len()].copy_from_slice(to.as_bytes());
        let crc = crc32fast::hash(&bytes[start + 8..start + len]);
        bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        changed += 1;
    }
    assert_eq!(changed, 1, "{key}={from} is in one data file of {}", member.name);
}

/// Waits until `alarm list` on `member` names `id` (hex) with CORRUPT.
fn wait_corrupt_alarm(member: &Member, id: &str) {
    let decimal = u64::from_str_radix(id, 16).unwrap();
    let wanted = format!("memberID:{decimal} alarm:CORRUPT");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let out = eventually(&[member], &["alarm", "list"]);
        if out.lines().any(|l| l.trim() == wanted) {
            return;
        }
        assert!(Instant::now() < deadline, "no CORRUPT alarm for {id}: {out:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A cluster with the hash checks `extra` turns on, where one follower's copy of `victim`
/// (written before `compact` if asked) is changed while it is stopped, and it is started
/// again: returns the members, the changed follower's index and its ID.
fn diverged_follower(root: &Path, extra: &[&str], compact: bool) -> (Vec<Member>, usize, String) {
    let (mut members, _) = start_cluster_with(root, &["d1", "d2", "d3"], extra);
    let all: Vec<&Member> = members.iter().collect();
    retry_unproposed(&all, &["put", "victim", "value-as-written"]);
    if compact {
        let status = eventually(&all, &["endpoint", "status", "-w", "json"]);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        let revision = status[0]["Status"]["header"]["revision"].as_i64().unwrap();
        retry_unproposed(&all, &["compact", &revision.to_string()]);
    }
    // Enough writes after it that a checkpoint holds it (--snapshot-count 20): on restart the
    // member reads it from its data files, not from its log.
    for i in 0..30 {
        retry_unproposed(&all, &["put", "filler", &i.to_string()]);
    }
    for m in &members {
        wait_value(m, "filler", "29");
        // Alarms name their member once the cluster version is 0.2 (before, they are member
        // 0's, and CORRUPT would stop reads everywhere): wait until the members agreed it.
        let deadline = Instant::now() + PATIENCE;
        while !m
            .http_get("/version")
            .is_some_and(|(_, v)| v.contains(r#""cairncluster":"0.2""#))
        {
            assert!(Instant::now() < deadline, "{}: no cluster version 0.2", m.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let ids: Vec<String> = members.iter().map(member_id).collect();
    let leader = ids.iter().position(|id| *id == leader_of(&members[0])).unwrap();
    let victim = (leader + 1) % 3;
    stop(&mut members[victim]);
    change_record_silently(&members[victim], "victim", "value-as-written", "value-changed!!!");
    (members, victim, ids[victim].clone())
}

/// The initial check: a member whose data differs from its peers' refuses to start, with
/// etcd's message; started without the check, the leader's periodic check
/// (`--experimental-corrupt-check-time`) raises CORRUPT naming it. Then writes fail
/// everywhere and the member named refuses reads, with "etcdserver: corrupt cluster", while
/// the others go on serving reads from their (right) data.
#[test]
fn a_member_whose_data_silently_changed_is_refused_at_start_and_alarmed_by_the_leader() {
    let root = tempfile::tempdir().unwrap();
    let (mut members, victim, id) = diverged_follower(root.path(), &["--experimental-corrupt-check-time=1s"], false);
    let initial = members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer_url()))
        .collect::<Vec<_>>()
        .join(",");

    members[victim]
        .extra
        .push("--experimental-initial-corrupt-check".into());
    members[victim].start(&initial, "new");
    let status = members[victim].child.as_mut().unwrap().wait().unwrap();
    assert!(!status.success(), "a member with changed data started");
    let log = std::fs::read_to_string(members[victim].dir.with_extension("log")).unwrap();
    assert!(
        log.contains(&format!("{id} found data inconsistency with peers")),
        "{log}"
    );
    members[victim].child = None;

    members[victim].extra.pop();
    members[victim].start(&initial, "new");
    let healthy = (victim + 1) % 3;
    wait_corrupt_alarm(&members[healthy], &id);
    let refused = etcdctl(&[&members[healthy]], &["put", "after", "x"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcdserver: corrupt cluster"),
        "{refused:?}"
    );
    let refused = etcdctl(&[&members[victim]], &["get", "victim", "--consistency=s"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcdserver: corrupt cluster"),
        "{refused:?}"
    );
    assert_eq!(
        local_value(&members[healthy], "victim").as_deref(),
        Some("value-as-written")
    );
    let (_, health) = members[victim].http_get("/health").unwrap();
    assert!(health.contains("CORRUPT"), "{health}");
}

/// The compaction hash check (`--experimental-compact-hash-check-enabled`): with the
/// latest-revision check off, a follower whose copy of a value as of the last compaction
/// changed is named CORRUPT by the leader.
#[test]
fn the_compaction_hash_check_names_a_member_whose_state_at_a_compaction_differs() {
    let root = tempfile::tempdir().unwrap();
    let checks = [
        "--experimental-compact-hash-check-enabled",
        "--experimental-compact-hash-check-time=1s",
    ];
    let (mut members, victim, id) = diverged_follower(root.path(), &checks, true);
    let initial = members
        .iter()
        .map(|m| format!("{}={}", m.name, m.peer_url()))
        .collect::<Vec<_>>()
        .join(",");
    members[victim].start(&initial, "new");
    wait_corrupt_alarm(&members[(victim + 1) % 3], &id);
}
