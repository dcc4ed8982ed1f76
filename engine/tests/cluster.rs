//! Three-member groups in one process over a [`LocalNetwork`], with real WALs on disk:
//! election and replication, a member restarted from its data, and a leader partitioned away
//! (the majority goes on; the old leader serves no stale linearizable read and acknowledges no
//! write). At the end of each test, every member's HashKV is the same.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::sync::Arc;

use cairn_engine::{
    Config, Engine, Error, LocalNetwork, ManualClock, Member, MemberAttributes, PutRequest, RangeRequest, RequestOp,
    TxnRequest,
};

const MEMBERS: [u64; 3] = [1, 2, 3];
/// How long anything may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(20);

fn peer_url(id: u64) -> String {
    format!("http://m{id}:2380")
}

/// The group's members, with their names and peer URLs.
fn peers() -> impl Iterator<Item = (u64, MemberAttributes)> {
    MEMBERS.iter().map(|m| {
        let attributes = MemberAttributes {
            name: format!("m{m}"),
            ..MemberAttributes::with_peer_urls(vec![peer_url(*m)])
        };
        (*m, attributes)
    })
}

fn config(_id: u64) -> Config {
    Config {
        raft_tick: Duration::from_millis(10),
        election_ticks: 10,
        heartbeat_ticks: 1,
        request_timeout: Duration::from_secs(1),
        lease_check_interval: None,
        ..Config::default()
    }
}

struct Cluster {
    net: LocalNetwork,
    /// The clock every member's leases expire by.
    clock: ManualClock,
    dirs: Vec<PathBuf>,
    _root: tempfile::TempDir,
    members: Vec<Option<Engine>>,
    /// Each member's configuration.
    config: fn(u64) -> Config,
}

impl Cluster {
    fn new(seed: u64) -> Cluster {
        Cluster::with(seed, config)
    }

    fn with(seed: u64, config: fn(u64) -> Config) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = MEMBERS.iter().map(|id| root.path().join(format!("m{id}"))).collect();
        let mut c = Cluster {
            net: LocalNetwork::new(seed),
            clock: ManualClock::new(),
            dirs,
            _root: root,
            members: MEMBERS.iter().map(|_| None).collect(),
            config,
        };
        for id in MEMBERS {
            c.start(id);
        }
        c
    }

    fn dir(&self, id: u64) -> &Path {
        &self.dirs[(id - 1) as usize]
    }

    fn start(&mut self, id: u64) {
        let config = Config {
            clock: Arc::new(self.clock.clone()),
            ..(self.config)(id)
        };
        let engine = Engine::builder(self.dir(id))
            .member(id)
            .peers(peers())
            .config(config)
            .transport(self.net.transport(id))
            .open()
            .unwrap();
        self.net.attach(id, engine.inbox().unwrap());
        self.members[(id - 1) as usize] = Some(engine);
    }

    fn stop(&mut self, id: u64) {
        self.net.detach(id);
        if let Some(engine) = self.members[(id - 1) as usize].take() {
            engine.close().unwrap();
        }
    }

    fn member(&self, id: u64) -> &Engine {
        self.members[(id - 1) as usize].as_ref().expect("running")
    }

    fn running(&self) -> impl Iterator<Item = &Engine> {
        self.members.iter().flatten()
    }

    /// Waits until the running members `among` agree on a leader among them.
    fn leader(&self, among: &[u64]) -> u64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let seen: Vec<Option<u64>> = among.iter().map(|id| self.member(*id).leader()).collect();
            if let Some(Some(l)) = seen.first() {
                if among.contains(l) && seen.iter().all(|s| *s == Some(*l)) {
                    return *l;
                }
            }
            assert!(Instant::now() < deadline, "no leader among {among:?}: {seen:?}");
            std::thread::yield_now();
        }
    }
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..PutRequest::default()
    }
}

/// Puts through `engine`, retrying while the group has no leader yet.
fn put_through(engine: &Engine, key: &str, value: &str) -> i64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match engine.write(put(key, value)) {
            Ok(applied) => return applied.revision,
            Err(Error::NoLeader | Error::LeaderChanged | Error::Timeout) if Instant::now() < deadline => {}
            Err(e) => panic!("put {key}: {e}"),
        }
    }
}

/// Every key and value, read linearizably through `engine`.
fn everything(engine: &Engine) -> Vec<(Bytes, Bytes)> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match engine.range(&RangeRequest::all()) {
            Ok(r) => return r.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
            Err(Error::Timeout | Error::LeaderChanged | Error::NoLeader) if Instant::now() < deadline => {}
            Err(e) => panic!("range: {e}"),
        }
    }
}

/// All running members have applied the same history.
fn assert_same_everywhere(c: &Cluster) {
    let first = c.running().next().unwrap();
    let expected = everything(first);
    for e in c.running() {
        assert_eq!(everything(e), expected, "member {}", e.member_id());
    }
    let rev = first.current_revision();
    for e in c.running() {
        assert_eq!(e.current_revision(), rev, "member {}", e.member_id());
        assert_eq!(
            e.maintenance().hash_kv(0).unwrap(),
            first.maintenance().hash_kv(0).unwrap(),
            "member {}",
            e.member_id()
        );
    }
}

#[test]
fn three_members_elect_a_leader_and_replicate_writes_through_any_member() {
    let c = Cluster::new(1);
    let leader = c.leader(&MEMBERS);
    for i in 0..30u64 {
        let through = MEMBERS[(i % 3) as usize];
        put_through(c.member(through), &format!("k{i:02}"), &format!("v{i}"));
    }
    assert_eq!(everything(c.member(leader)).len(), 30);
    // Every member knows the others' names and peer URLs from the bootstrap entries.
    for e in c.running() {
        let names: Vec<(u64, String, Vec<String>)> = e
            .members()
            .list()
            .into_iter()
            .map(|m| (m.id, m.name, m.peer_urls))
            .collect();
        let expected: Vec<_> = MEMBERS
            .iter()
            .map(|m| (*m, format!("m{m}"), vec![peer_url(*m)]))
            .collect();
        assert_eq!(names, expected, "member {}", e.member_id());
    }
    // Leases: granted through any member; kept alive by the leader only, which expires them.
    let follower = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
    let lease = c.member(follower).leases().grant(0, 60).unwrap().response.id;
    assert_eq!(c.member(leader).leases().keep_alive(lease).unwrap(), 60);
    assert_eq!(
        pollster::block_on(c.member(leader).leases().keep_alive_async(lease)),
        Ok(60)
    );
    assert_eq!(
        pollster::block_on(c.member(follower).leases().keep_alive_async(lease)),
        Err(Error::NotLeader)
    );
    assert!(matches!(
        c.member(follower).leases().keep_alive(lease),
        Err(Error::NotLeader)
    ));
    assert_same_everywhere(&c);
}

#[test]
fn a_member_restarted_from_its_data_catches_up() {
    let mut c = Cluster::new(2);
    let leader = c.leader(&MEMBERS);
    for i in 0..10 {
        put_through(c.member(leader), &format!("before{i}"), "x");
    }
    let follower = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
    c.stop(follower);
    let rest: Vec<u64> = MEMBERS.iter().copied().filter(|id| *id != follower).collect();
    let leader = c.leader(&rest);
    for i in 0..10 {
        put_through(c.member(leader), &format!("while-down{i}"), "y");
    }
    c.start(follower);
    assert_eq!(everything(c.member(follower)).len(), 20, "it applied what it missed");
    // Everyone restarts, and the group goes on.
    for id in MEMBERS {
        c.stop(id);
    }
    for id in MEMBERS {
        c.start(id);
    }
    let leader = c.leader(&MEMBERS);
    put_through(c.member(leader), "after-restart", "z");
    assert_same_everywhere(&c);
    assert_eq!(everything(c.member(leader)).len(), 21);
}

#[test]
fn a_partitioned_leader_serves_no_stale_read_and_acknowledges_no_write() {
    let c = Cluster::new(3);
    let old = c.leader(&MEMBERS);
    put_through(c.member(old), "k", "1");
    let majority: Vec<u64> = MEMBERS.iter().copied().filter(|id| *id != old).collect();
    c.net.partition(&[old], &MEMBERS);
    let new = c.leader(&majority);
    assert_ne!(new, old);
    put_through(c.member(new), "k", "2");
    // The old leader cannot confirm its leadership: no read of "1" now that "2" is committed.
    match c.member(old).range(&RangeRequest::key(b"k")) {
        Ok(r) => panic!("a stale read on the partitioned leader: {:?}", r.kvs),
        Err(e) => assert!(
            matches!(e, Error::Timeout | Error::LeaderChanged | Error::NoLeader),
            "{e}"
        ),
    }
    // Nor through the async barrier (a ReadIndex round the node thread fails on its own), nor
    // by a read-only txn, which is served locally after the same barrier.
    match pollster::block_on(c.member(old).range_async(&RangeRequest::key(b"k"))) {
        Ok(r) => panic!("a stale async read on the partitioned leader: {:?}", r.kvs),
        Err(e) => assert!(
            matches!(e, Error::Timeout | Error::LeaderChanged | Error::NoLeader),
            "{e}"
        ),
    }
    let read_k = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Range(RangeRequest::key(b"k"))],
        failure: vec![],
    };
    match c.member(old).txn(read_k.clone()) {
        Ok(r) => panic!("a stale read-only txn on the partitioned leader: {:?}", r.response),
        Err(e) => assert!(
            matches!(e, Error::Timeout | Error::LeaderChanged | Error::NoLeader),
            "{e}"
        ),
    }
    // A follower of the majority reads the new value through the async barrier.
    let follower = majority.iter().copied().find(|id| *id != new).unwrap();
    let seen = pollster::block_on(c.member(follower).range_async(&RangeRequest::key(b"k"))).unwrap();
    assert_eq!(seen.kvs[0].value.as_ref(), b"2");
    let seen = pollster::block_on(c.member(follower).read_txn_async(&read_k)).unwrap();
    let cairn_engine::ResponseOp::Range(r) = &seen.response.responses[0] else {
        panic!("{:?}", seen.response)
    };
    assert_eq!(r.kvs[0].value.as_ref(), b"2");
    // Nor can it acknowledge a write.
    match c.member(old).write(put("k", "3")) {
        Ok(a) => panic!("the minority acknowledged a write at revision {}", a.revision),
        Err(e) => assert!(
            matches!(e, Error::Timeout | Error::LeaderChanged | Error::NoLeader),
            "{e}"
        ),
    }
    c.net.heal();
    c.leader(&MEMBERS);
    let value = everything(c.member(old))
        .into_iter()
        .find(|(k, _)| k.as_ref() == b"k")
        .map(|(_, v)| v);
    // "3" may or may not have been applied after the heal (a timed-out write's fate is
    // unknown), but "1" is gone for good.
    assert_ne!(value.as_deref(), Some(&b"1"[..]));
    assert_same_everywhere(&c);
}

#[test]
fn membership_changes_under_load_add_promote_remove_and_transfer() {
    let mut c = Cluster::new(4);
    let leader = c.leader(&MEMBERS);
    for i in 0..20 {
        put_through(c.member(leader), &format!("k{i}"), "v");
    }
    // A fourth member joins as a learner, catches up, and is promoted.
    c.member(leader).members().add_learner(4, vec![peer_url(4)]).unwrap();
    assert!(matches!(
        c.member(leader).members().add(4, vec![peer_url(4)]),
        Err(Error::MemberExists)
    ));
    let summary = |m: &Member| {
        (
            m.id,
            m.is_learner,
            m.name.clone(),
            m.peer_urls.clone(),
            m.client_urls.clone(),
        )
    };
    let added = (4, true, String::new(), vec![peer_url(4)], Vec::new());
    assert_eq!(c.member(leader).members().list().last().map(summary), Some(added));
    let dir4 = c.dir(1).parent().unwrap().join("m4");
    let joiner = Engine::builder(&dir4)
        .member(4)
        .join_existing()
        .config(config(4))
        .transport(c.net.transport(4))
        .open()
        .unwrap();
    c.net.attach(4, joiner.inbox().unwrap());
    // It catches up while writes go on.
    let target = c.member(leader).current_revision();
    let deadline = Instant::now() + PATIENCE;
    while joiner.current_revision() < target {
        assert!(Instant::now() < deadline, "the learner did not catch up");
        put_through(c.member(leader), "writes-go-on", "x");
    }
    assert_eq!(joiner.members().ids().learners, vec![4]);
    // Its attributes: peer URLs updated through the group, name and client URLs published by
    // the member itself (as an etcd member does when it starts).
    joiner
        .server()
        .member_publish("m4".into(), vec!["http://m4:2379".into()])
        .unwrap();
    c.member(leader)
        .members()
        .update(4, vec!["http://m4-new:2380".into()])
        .unwrap();
    assert!(matches!(
        c.member(leader).members().update(9, vec![]),
        Err(Error::MemberNotFound)
    ));
    // The leader may not have heard the learner's last acknowledgement yet: it refuses the
    // promotion until it has, as etcd does.
    let deadline = Instant::now() + PATIENCE;
    loop {
        match c.member(leader).members().promote(4) {
            Ok(()) => break,
            Err(Error::LearnerNotReady) if Instant::now() < deadline => {
                put_through(c.member(leader), "writes-go-on", "y");
            }
            Err(e) => panic!("promote: {e}"),
        }
    }
    assert_eq!(c.member(leader).members().ids().voters.len(), 4);
    let promoted = (
        4,
        false,
        "m4".to_string(),
        vec!["http://m4-new:2380".to_string()],
        vec!["http://m4:2379".to_string()],
    );
    assert_eq!(c.member(leader).members().list().last().map(summary), Some(promoted));
    assert!(matches!(
        c.member(leader).members().promote(4),
        Err(Error::MemberNotLearner)
    ));
    // Leadership moves to another voter, and the old leader is removed. On a loaded machine an
    // election may have moved it already: it then moves from whoever leads.
    let deadline = Instant::now() + PATIENCE;
    let (leader, next) = loop {
        let leader = c.leader(&MEMBERS);
        let next = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
        match c.member(leader).members().move_leader(next) {
            Ok(()) => break (leader, next),
            Err(Error::NotLeader | Error::LeaderChanged) if Instant::now() < deadline => {}
            Err(e) => panic!(
                "move_leader {leader}->{next}: {e}; leaders seen {:?}",
                MEMBERS.iter().map(|id| c.member(*id).leader()).collect::<Vec<_>>()
            ),
        }
    };
    assert_eq!(c.member(next).leader(), Some(next));
    c.member(next).members().remove(leader).unwrap();
    assert!(matches!(
        c.member(next).members().remove(leader),
        Err(Error::MemberNotFound)
    ));
    assert!(!c.member(next).members().ids().voters.contains(&leader));
    assert!(c.member(next).members().list().iter().all(|m| m.id != leader));
    c.stop(leader);
    put_through(&joiner, "after", "changes");
    let remaining: Vec<&Engine> = c.running().chain(std::iter::once(&joiner)).collect();
    let expected = everything(remaining[0]);
    for e in &remaining {
        assert_eq!(everything(e), expected, "member {}", e.member_id());
        assert_eq!(
            e.maintenance().hash_kv(0).unwrap(),
            remaining[0].maintenance().hash_kv(0).unwrap()
        );
    }
    joiner.close().unwrap();
}

/// A leader stepping down (as a member does when it shuts down) hands its leadership to a
/// caught-up voter, and no write made meanwhile, through any member, fails: raft would drop
/// the proposals made during the handover (the leader's own with "leader changed", the ones
/// followers forwarded silently, their clients waiting out their timeouts); the node holds
/// them and steps them again once the new leader can take them.
#[test]
fn a_leader_stepping_down_loses_no_write_made_during_the_handover() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let c = Cluster::new(11);
    let stop = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let writers: Vec<_> = MEMBERS
            .iter()
            .map(|id| {
                let (engine, stop, done) = (c.member(*id), &stop, &done);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = engine.write(put(&format!("w/{id}/{n}"), "v")) {
                            failures.push(format!("w/{id}/{n}: {e}"));
                        }
                        n += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    failures
                })
            })
            .collect();
        // The writers stop when the test does, a failed assertion too (the scope would wait
        // for them for ever).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop_writers = StopOnDrop(&stop);
        let await_writes = |n: usize| {
            let until = done.load(Ordering::Relaxed) + n;
            let deadline = Instant::now() + PATIENCE;
            while done.load(Ordering::Relaxed) < until {
                assert!(Instant::now() < deadline, "the writers stalled");
                std::thread::yield_now();
            }
        };
        let mut handovers = 0;
        let deadline = Instant::now() + PATIENCE;
        while handovers < 5 {
            assert!(Instant::now() < deadline, "{handovers} handovers in {PATIENCE:?}");
            await_writes(100);
            let leader = c.leader(&MEMBERS);
            // `None`: leadership moved by itself meanwhile (an election on a busy machine).
            if let Some(to) = c.member(leader).members().step_down().unwrap() {
                assert_ne!(to, leader);
                handovers += 1;
            }
        }
        await_writes(100);
        stop.store(true, Ordering::Relaxed);
        let failures: Vec<String> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        assert!(failures.is_empty(), "writes failed during the handovers: {failures:?}");
    });
    assert!(done.load(Ordering::Relaxed) >= 600);
    assert_same_everywhere(&c);
}

#[test]
fn a_new_leader_never_expires_a_lease_early() {
    let c = Cluster::new(5);
    let old = c.leader(&MEMBERS);
    let lease = c.member(old).leases().grant(0, 10).unwrap().response.id;
    put_through(c.member(old), "leased", "v");
    c.clock.advance(Duration::from_secs(8));
    // Leadership moves with 2 s left on the old leader's clock; the new leader gives the
    // lease its full TTL again rather than expiring it early.
    let new = MEMBERS.iter().copied().find(|id| *id != old).unwrap();
    c.member(old).members().move_leader(new).unwrap();
    c.leader(&MEMBERS);
    // Applied through the new leader: it has taken over the leases by then.
    put_through(c.member(new), "after-transfer", "x");
    assert_eq!(c.member(old).leases().expire_now(), 0, "only the leader expires leases");
    c.clock.advance(Duration::from_secs(9));
    assert_eq!(c.member(new).leases().expire_now(), 0, "9 s into its full 10 s");
    c.clock.advance(Duration::from_secs(1));
    assert_eq!(c.member(new).leases().expire_now(), 1);
    for e in c.running() {
        everything(e); // a linearizable read: the revoke is applied here too

        assert_eq!(
            e.leases().time_to_live(lease, false).ttl,
            -1,
            "member {}",
            e.member_id()
        );
    }
}

#[test]
fn a_member_far_behind_catches_up_by_snapshot() {
    // Frequent checkpoints and a small catch-up margin: the leader soon holds none of the
    // entries a stopped member needs, and must send it the state instead.
    fn compact_often(id: u64) -> Config {
        Config {
            checkpoint_entries: 20,
            snapshot_catch_up_entries: 10,
            data_file_size: 64 << 10,
            ..config(id)
        }
    }
    let mut c = Cluster::with(6, compact_often);
    let leader = c.leader(&MEMBERS);
    for i in 0..10 {
        put_through(c.member(leader), &format!("before{i}"), "x");
    }
    let behind = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
    c.stop(behind);
    let rest: Vec<u64> = MEMBERS.iter().copied().filter(|id| *id != behind).collect();
    let leader = c.leader(&rest);
    // While it is down: writes, overwrites, deletes, a lease with a key, users and a role
    // (the auth store), and a compaction.
    for change in [
        cairn_engine::AuthChange::UserAdd {
            name: "root".into(),
            password_hash: Some("hash".into()),
            no_password: false,
        },
        cairn_engine::AuthChange::UserGrantRole {
            user: "root".into(),
            role: "root".into(),
        },
        cairn_engine::AuthChange::RoleAdd { name: "app".into() },
        cairn_engine::AuthChange::Enable,
    ] {
        c.member(leader)
            .server()
            .auth_change_async(change, None)
            .unwrap()
            .wait()
            .unwrap();
    }
    let lease = c.member(leader).leases().grant(0, 600).unwrap().response.id;
    c.member(leader)
        .write(PutRequest {
            lease,
            ..put("leased", "v")
        })
        .unwrap();
    let mut compact_at = 0;
    for i in 0..200 {
        compact_at = put_through(c.member(leader), &format!("while-down{}", i % 50), &format!("v{i}"));
    }
    c.member(leader)
        .write(cairn_engine::DeleteRangeRequest {
            key: b"before0".to_vec(),
            ..Default::default()
        })
        .unwrap();
    c.member(leader).compact(compact_at).unwrap();
    c.member(leader).maintenance().wait_compacted().unwrap();
    c.start(behind);
    assert_eq!(
        everything(c.member(behind)),
        everything(c.member(leader)),
        "it caught up"
    );
    assert_eq!(c.member(behind).status().snapshots_installed, 1, "by a snapshot");
    assert_eq!(c.member(behind).status().compacted_revision, compact_at);
    assert_eq!(c.member(behind).leases().list(), vec![lease]);
    assert_eq!(c.member(behind).members().list(), c.member(leader).members().list());
    assert_eq!(
        c.member(behind).server().auth_status(),
        c.member(leader).server().auth_status()
    );
    assert!(
        c.member(behind).server().auth_status().0,
        "auth came enabled with the snapshot"
    );
    assert_eq!(
        c.member(behind)
            .server()
            .auth_read(|a| (a.user_names(), a.role_names(), a.is_root("root"))),
        (vec!["root".to_string()], vec!["app".to_string()], true)
    );
    assert_eq!(
        c.member(behind).leases().time_to_live(lease, true).keys,
        vec![Bytes::from("leased")]
    );
    // Entries after the snapshot follow it, and the member restarts from what it installed.
    put_through(c.member(leader), "after-snapshot", "y");
    assert_same_everywhere(&c);
    c.stop(behind);
    c.start(behind);
    put_through(c.member(behind), "after-restart", "z");
    assert_same_everywhere(&c);
}

/// Runs `future` on this thread until it is ready; panics if it is not within [`PATIENCE`]
/// (a request never answered), so a test fails instead of hanging.
fn within_patience<F: std::future::IntoFuture>(future: F) -> F::Output {
    use std::future::Future as _;
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future.into_future());
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "a request was never answered");
        std::thread::park_timeout(left);
    }
}

/// A write past the quota is refused with NOSPACE whatever becomes of the alarm it raises. On
/// a member cut off from the others the alarm cannot commit: the refusal still comes, once the
/// alarm's proposal times out, and as NOSPACE, not as that proposal's failure. It comes through
/// the pending write, not from the call that logs it: a server's async thread is not held for a
/// consensus round while the members that would commit the alarm may need that thread (a
/// cluster once stalled so until its requests timed out). Healed, the alarm is raised for all.
#[test]
fn a_write_past_the_quota_on_a_cut_off_member_is_refused_with_nospace() {
    fn tiny_quota(id: u64) -> Config {
        Config {
            quota_backend_bytes: 1,
            ..config(id)
        }
    }
    let c = Cluster::with(4, tiny_quota);
    let leader = c.leader(&MEMBERS);
    let cut = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
    c.net.partition(&[cut], &MEMBERS);
    let pending = c
        .member(cut)
        .write_async(put("k", "v"))
        .expect("the refusal is answered through the pending write");
    assert_eq!(within_patience(pending).unwrap_err(), Error::NoSpace);
    assert!(
        c.member(cut).maintenance().alarms().is_empty(),
        "nothing commits on a member cut off"
    );
    c.net.heal();
    let deadline = Instant::now() + PATIENCE;
    while !c.running().all(|m| !m.maintenance().alarms().is_empty()) {
        // The cut-off member's proposal was lost: the next refusal raises the alarm.
        assert_eq!(c.member(leader).write(put("k", "v")).unwrap_err(), Error::NoSpace);
        assert!(Instant::now() < deadline, "the alarm was never raised everywhere");
    }
    assert_same_everywhere(&c);
}

/// What one client thread saw: answers before and after the leader was cut off.
#[derive(Debug, Default)]
struct Answers {
    before: usize,
    after: usize,
    errors: Vec<Error>,
}

/// etcd answers every request within its request timeout, whatever raft drops: a write
/// forwarded to a leader that is gone, a ReadIndex round with no leader to answer it. Async
/// writes and linearizable reads (what the server awaits) run on every member while the
/// leader is cut off; each must come back, done or failed with an error a client retries on.
/// A proposal raft lost used to leave its future waiting forever.
#[test]
fn every_request_in_flight_when_the_leader_is_cut_off_is_answered() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;

    let c = Cluster::new(7);
    let leader = c.leader(&MEMBERS);
    let others: Vec<u64> = MEMBERS.iter().copied().filter(|m| *m != leader).collect();
    let cut = AtomicBool::new(false);
    let stop = AtomicBool::new(false);
    let (done_tx, done_rx) = mpsc::channel::<(u64, &str, Answers)>();
    let (answered_tx, answered_rx) = mpsc::channel::<()>();
    // Each thread says when its first request before the cut is answered.
    let (running_tx, running_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        for id in MEMBERS {
            for kind in ["put", "read"] {
                let (engine, done_tx, answered_tx) = (c.member(id), done_tx.clone(), answered_tx.clone());
                let running_tx = running_tx.clone();
                let (cut, stop) = (&cut, &stop);
                s.spawn(move || {
                    let mut seen = Answers::default();
                    let mut i = 0;
                    while !stop.load(Ordering::Acquire) {
                        let after = cut.load(Ordering::Acquire);
                        i += 1;
                        let answer = match kind {
                            "put" => match engine.write_async(put(&format!("m{id}/{i}"), "v")) {
                                Ok(pending) => within_patience(pending).map(|_| ()),
                                Err(e) => Err(e),
                            },
                            _ => within_patience(engine.range_async(&RangeRequest::all())).map(|_| ()),
                        };
                        match answer {
                            Ok(()) => {}
                            Err(e @ (Error::Timeout | Error::LeaderChanged | Error::NoLeader)) => seen.errors.push(e),
                            Err(e) => panic!("{kind} through member {id}: {e}"),
                        }
                        if after {
                            seen.after += 1;
                            let _ = answered_tx.send(());
                        } else {
                            seen.before += 1;
                            if seen.before == 1 {
                                let _ = running_tx.send(());
                            }
                        }
                    }
                    let _ = done_tx.send((id, kind, seen));
                });
            }
        }
        drop(done_tx);
        // Let requests flow on every thread, then cut the leader off from the others with
        // requests in flight everywhere.
        for _ in 0..(2 * MEMBERS.len()) {
            running_rx
                .recv_timeout(PATIENCE)
                .expect("every thread's first request is answered before the cut");
        }
        cut.store(true, Ordering::Release);
        c.net.partition(&[leader], &MEMBERS);
        // Every thread answers at least three requests begun after the cut: with the fault
        // answered within request_timeout, each gets there.
        for _ in 0..(3 * 2 * MEMBERS.len()) {
            answered_rx
                .recv_timeout(PATIENCE)
                .expect("requests after the cut went unanswered");
        }
        let deadline = Instant::now() + PATIENCE;
        let mut finished = Vec::new();
        while finished.len() < 2 * MEMBERS.len() {
            stop.store(true, Ordering::Release);
            let left = deadline.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(f) => finished.push(f),
                Err(_) => panic!("requests never answered; finished: {finished:?}"),
            }
        }
        for (id, kind, seen) in &finished {
            assert!(seen.before > 0, "member {id}'s {kind}s ran before the cut: {seen:?}");
        }
        // The cut-off leader cannot commit: its requests failed rather than hung.
        let cut_off: Vec<_> = finished.iter().filter(|(id, _, _)| *id == leader).collect();
        assert!(
            cut_off.iter().all(|(_, _, seen)| !seen.errors.is_empty()),
            "the cut-off leader answered errors: {cut_off:?}"
        );
    });
    c.net.heal();
    c.leader(&MEMBERS);
    put_through(c.member(others[0]), "healed", "yes");
    assert_same_everywhere(&c);
}

#[test]
fn a_survivor_forced_into_a_new_cluster_keeps_every_committed_write_and_takes_new_members() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug")
        .with_test_writer()
        .try_init();
    let mut c = Cluster::new(7);
    let leader = c.leader(&MEMBERS);
    for i in 0..20 {
        put_through(c.member(leader), &format!("k{i}"), "v");
    }
    // The quorum is lost for good: two members' machines are gone.
    let survivor = MEMBERS.iter().copied().find(|id| *id != leader).unwrap();
    for id in MEMBERS {
        c.stop(id);
    }
    let config = Config {
        clock: Arc::new(c.clock.clone()),
        ..config(survivor)
    };
    let engine = Engine::builder(c.dir(survivor))
        .member(survivor)
        .peers(peers())
        .config(config.clone())
        .transport(c.net.transport(survivor))
        .force_new_cluster()
        .open()
        .unwrap();
    c.net.attach(survivor, engine.inbox().unwrap());
    // It is its own leader, alone, with everything it knew committed.
    let deadline = Instant::now() + PATIENCE;
    while engine.leader() != Some(survivor) {
        assert!(Instant::now() < deadline, "the survivor did not lead");
        std::thread::yield_now();
    }
    let ids: Vec<u64> = engine.members().list().iter().map(|m| m.id).collect();
    assert_eq!(ids, [survivor]);
    assert_eq!(everything(&engine).len(), 20);
    put_through(&engine, "after", "forced");
    // A new member joins it as any member joins a running cluster.
    let newcomer = 9;
    engine.members().add(newcomer, vec![peer_url(newcomer)]).unwrap();
    let joined = Engine::builder(c._root.path().join("m9"))
        .member(newcomer)
        .join_existing()
        .config(config.clone())
        .transport(c.net.transport(newcomer))
        .open()
        .unwrap();
    c.net.attach(newcomer, joined.inbox().unwrap());
    put_through(&engine, "with-two", "members");
    let target = engine.current_revision();
    let deadline = Instant::now() + PATIENCE;
    while joined.current_revision() < target {
        assert!(Instant::now() < deadline, "the newcomer did not catch up");
        std::thread::yield_now();
    }
    assert_eq!(everything(&joined).len(), 22);
    // Both restarted plainly, they are the new cluster of two, with everything.
    c.net.detach(newcomer);
    joined.close().unwrap();
    c.net.detach(survivor);
    engine.close().unwrap();
    let reopen = |id: u64, dir: &Path| {
        let engine = Engine::builder(dir)
            .member(id)
            .config(config.clone())
            .transport(c.net.transport(id))
            .open()
            .unwrap();
        c.net.attach(id, engine.inbox().unwrap());
        engine
    };
    let again = reopen(survivor, c.dir(survivor));
    let newcomer_again = reopen(newcomer, &c._root.path().join("m9"));
    let mut ids: Vec<u64> = again.members().list().iter().map(|m| m.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [survivor, newcomer]);
    assert_eq!(everything(&again).len(), 22);
    assert_eq!(everything(&newcomer_again).len(), 22);
}
