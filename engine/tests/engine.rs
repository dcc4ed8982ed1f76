//! The embedded engine end to end: writes survive a reopen with their full history, concurrent
//! writers get unique, dense revisions, and etcd's errors come back.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;

use bytes::Bytes;
use cairn_engine::offline;
use cairn_engine::{
    Compare, CompareResult, CompareTarget, Config, DeleteRangeRequest, Engine, Error, PutRequest, RangeRequest,
    RangeResponse, RequestOp, TxnRequest,
};

fn small() -> Config {
    Config {
        wal: cairn_engine::wal::Config {
            segment_size: 4096,
            ..Default::default()
        },
        ..Config::default()
    }
}

fn put(key: &str, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        ..PutRequest::default()
    }
}

fn all_at(engine: &Engine, revision: i64) -> RangeResponse {
    engine.range(&RangeRequest::all().at_revision(revision)).unwrap()
}

#[test]
fn writes_and_their_history_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    for i in 0..50 {
        let r = engine
            .write(put(&format!("key/{:02}", i % 10), &format!("v{i}")))
            .unwrap();
        assert_eq!(r.revision, i + 2, "the first write of an empty store gets revision 2");
    }
    let deleted = engine
        .write(DeleteRangeRequest {
            key: b"key/00".to_vec(),
            range_end: b"key/05".to_vec(),
            prev_kv: true,
        })
        .unwrap();
    assert_eq!((deleted.response.deleted, deleted.revision), (5, 52));
    let txn = TxnRequest {
        compare: vec![Compare {
            key: b"key/09".to_vec(),
            range_end: vec![],
            target: CompareTarget::Version(5),
            result: CompareResult::Equal,
        }],
        success: vec![RequestOp::Put(put("txn", "yes"))],
        failure: vec![],
    };
    assert!(engine.txn(txn).unwrap().response.succeeded);
    engine.compact(20).unwrap();
    let before: Vec<RangeResponse> = [0, 20, 35, 52].iter().map(|rev| all_at(&engine, *rev)).collect();
    engine.close().unwrap();

    let engine = Engine::open(dir.path(), small()).unwrap();
    let after: Vec<RangeResponse> = [0, 20, 35, 52].iter().map(|rev| all_at(&engine, *rev)).collect();
    assert_eq!(before, after);
    assert_eq!(engine.current_revision(), 53);
    let compacted = engine.range(&RangeRequest {
        key: b"key/00".to_vec(),
        revision: 19,
        ..RangeRequest::default()
    });
    assert!(
        matches!(
            compacted,
            Err(Error::Compacted {
                requested: 19,
                compacted: 20
            })
        ),
        "{compacted:?}"
    );
    // The log continues where it left off.
    assert_eq!(engine.write(put("after", "reopen")).unwrap().revision, 54);
}

#[test]
fn concurrent_writers_get_unique_dense_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), small()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let engine = engine.clone();
            std::thread::spawn(move || {
                (0..25)
                    .map(|i| engine.write(put(&format!("t{t}/{i}"), "v")).unwrap().revision)
                    .collect::<Vec<i64>>()
            })
        })
        .collect();
    let mut revisions: Vec<i64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    revisions.sort_unstable();
    assert_eq!(revisions, (2..=201).collect::<Vec<i64>>());
    assert_eq!(all_at(&engine, 0).count, 200);
}

/// A write is answered once applied, and never before this member reports its entry
/// committed: the status a client reads after its write is never behind it.
#[test]
fn an_answered_write_is_never_ahead_of_the_reported_commit_index() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    for i in 0..300 {
        engine.write(put(&format!("k{i}"), "v")).unwrap();
        let status = engine.status();
        assert!(
            status.commit_index >= status.applied_index,
            "write {i}: applied {} past the commit index {}",
            status.applied_index,
            status.commit_index
        );
    }
}

/// Writes one at a time are applied on the node thread (the apply thread idle) and bursts on
/// the apply thread; switching between the two keeps log order: every write is answered, with
/// the next revision, and the history at that revision holds exactly what it wrote.
#[test]
fn serial_writes_and_bursts_interleave_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), small()).unwrap());
    let mut written: Vec<(i64, String)> = Vec::new();
    for round in 0..4 {
        for i in 0..10 {
            let value = format!("serial {round}/{i}");
            written.push((engine.write(put("k", &value)).unwrap().revision, value));
        }
        let burst: Vec<_> = (0..16)
            .map(|t| {
                let engine = engine.clone();
                std::thread::spawn(move || {
                    (0..5)
                        .map(|i| {
                            let value = format!("burst {round}/{t}/{i}");
                            (engine.write(put("k", &value)).unwrap().revision, value)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        written.extend(burst.into_iter().flat_map(|t| t.join().unwrap()));
    }
    written.sort();
    let revisions: Vec<i64> = written.iter().map(|(r, _)| *r).collect();
    assert_eq!(revisions, (2..2 + 4 * 90).collect::<Vec<i64>>());
    for (revision, value) in &written {
        let at = all_at(&engine, *revision);
        assert_eq!(at.kvs.len(), 1);
        assert_eq!(at.kvs[0].value.as_ref(), value.as_bytes(), "at revision {revision}");
        assert_eq!(at.kvs[0].mod_revision, *revision);
    }
}

/// Asserts that the compactions so far are swept (`wait_compacted` returns), failing after a
/// minute rather than hanging: a bound on a hang, not a timing assertion (a sweep of a few
/// revisions takes milliseconds).
fn assert_swept(engine: &Arc<Engine>) {
    let (done, swept) = std::sync::mpsc::channel();
    let waiter = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let _ = done.send(engine.maintenance().wait_compacted());
        })
    };
    let outcome = swept.recv_timeout(std::time::Duration::from_secs(60));
    assert!(
        matches!(outcome, Ok(Ok(()))),
        "the compaction was not swept: {outcome:?}"
    );
    waiter.join().unwrap();
}

/// A compaction applied on the node thread (one request, nothing else going on) is still
/// swept by the apply thread.
#[test]
fn a_lone_compaction_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), small()).unwrap());
    for i in 0..20 {
        engine.write(put("k", &format!("v{i}"))).unwrap();
    }
    engine.compact(15).unwrap();
    assert_swept(&engine);
    assert!(matches!(
        engine.range(&RangeRequest::all().at_revision(10)),
        Err(Error::Compacted { .. })
    ));
}

/// Writes whatever it is given, but holds the first write until told to go on: a snapshot
/// kept running (so its pin on the store's history held) for as long as a test needs.
struct HeldWriter {
    started: Option<std::sync::mpsc::Sender<()>>,
    go: std::sync::mpsc::Receiver<()>,
}

impl std::io::Write for HeldWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(started) = self.started.take() {
            let _ = started.send(());
            let _ = self.go.recv();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A compaction that begins while a snapshot pins the history waits for it, and is swept once
/// the snapshot ends, with nothing else written.
#[test]
fn a_compaction_during_a_snapshot_is_swept_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open(dir.path(), small()).unwrap());
    for i in 0..20 {
        engine.write(put("k", &format!("v{i}"))).unwrap();
    }
    let (started, has_started) = std::sync::mpsc::channel();
    let (go, held) = std::sync::mpsc::channel();
    let snapshot = {
        let engine = engine.clone();
        std::thread::spawn(move || {
            let mut out = HeldWriter {
                started: Some(started),
                go: held,
            };
            engine.maintenance().snapshot(&mut out)
        })
    };
    has_started.recv().unwrap();
    engine.compact(15).unwrap();
    go.send(()).unwrap();
    snapshot.join().unwrap().unwrap();
    assert_swept(&engine);
}

#[test]
fn etcd_errors_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    assert_eq!(engine.write(put("", "v")).unwrap_err(), Error::EmptyKey);
    engine.write(put("a", "1")).unwrap();
    let future = engine.range(&RangeRequest {
        key: b"a".to_vec(),
        revision: 5,
        ..RangeRequest::default()
    });
    assert!(
        matches!(
            future,
            Err(Error::FutureRevision {
                requested: 5,
                current: 2
            })
        ),
        "{future:?}"
    );
    assert!(matches!(engine.compact(3), Err(Error::FutureRevision { .. })));
    engine.compact(1).unwrap();
    assert!(matches!(engine.compact(1), Err(Error::Compacted { .. })));
    let keep_missing = PutRequest {
        key: b"missing".to_vec(),
        ignore_value: true,
        ..PutRequest::default()
    };
    assert_eq!(engine.write(keep_missing).unwrap_err(), Error::KeyNotFound);
}

#[test]
fn writes_can_be_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    // Both are logged before either is awaited: they share the group commit.
    let first = engine.write_async(put("a", "1")).unwrap();
    let second = engine.write_async(put("b", "2")).unwrap();
    let (first, second) = pollster::block_on(async { (first.await, second.await) });
    assert_eq!((first.unwrap().revision, second.unwrap().revision), (2, 3));
    let err = engine.write_async(put("", "v")).unwrap_err();
    assert_eq!(err, Error::EmptyKey);
}

#[test]
fn reads_read_only_txns_and_keep_alives_can_be_awaited() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    engine.write(put("a", "1")).unwrap();
    let written = engine.write_async(put("b", "2")).unwrap();
    assert_eq!(pollster::block_on(written).unwrap().revision, 3);
    // A linearizable read after a write was acknowledged sees it.
    let read = pollster::block_on(engine.range_async(&RangeRequest::all())).unwrap();
    assert_eq!(read.kvs.len(), 2);
    // A read-only txn answers as applying it would, from the local state, and logs nothing.
    let get = |key: &str, serializable: bool| {
        RequestOp::Range(RangeRequest {
            serializable,
            ..RangeRequest::key(key.as_bytes())
        })
    };
    let read_only = TxnRequest {
        compare: vec![Compare {
            key: b"a".to_vec(),
            range_end: vec![],
            target: CompareTarget::Value(Bytes::from_static(b"1")),
            result: CompareResult::Equal,
        }],
        success: vec![get("b", false)],
        failure: vec![get("a", true)],
    };
    assert!(read_only.is_read_only() && !read_only.is_serializable());
    let before = engine.status();
    let blocking = engine.txn(read_only.clone()).unwrap();
    let awaited = pollster::block_on(engine.read_txn_async(&read_only)).unwrap();
    assert_eq!(blocking, awaited);
    assert_eq!(blocking.revision, 3);
    assert!(blocking.response.succeeded);
    let cairn_engine::ResponseOp::Range(b) = &blocking.response.responses[0] else {
        panic!("{blocking:?}")
    };
    assert_eq!(b.kvs[0].value.as_ref(), b"2");
    assert_eq!(engine.status().commit_index, before.commit_index, "nothing was logged");
    let writes = TxnRequest {
        success: vec![RequestOp::Put(put("c", "3"))],
        ..read_only.clone()
    };
    assert!(matches!(
        pollster::block_on(engine.read_txn_async(&writes)),
        Err(Error::Misuse(_))
    ));
    // Keep-alives: the sole member leads, and an unknown lease is refused.
    let lease = engine.leases().grant(0, 30).unwrap().response.id;
    assert_eq!(pollster::block_on(engine.leases().keep_alive_async(lease)), Ok(30));
    assert_eq!(
        pollster::block_on(engine.leases().keep_alive_async(lease + 1)),
        Err(Error::LeaseNotFound)
    );
}

#[test]
fn a_damaged_checkpoint_is_refused_not_ignored() {
    // The log before a checkpoint is released, so opening without it would lose data.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    for i in 0..20 {
        engine.write(put(&format!("k{i}"), "v")).unwrap();
    }
    engine.close().unwrap();
    let path = dir.path().join("checkpoint");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let err = Engine::open(dir.path(), small()).unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert!(err.io_error().is_none(), "damage, not an I/O failure: {err}");
    bytes[last] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    assert_eq!(all_at(&engine, 0).count, 20);
}

#[test]
fn an_io_failure_keeps_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    Engine::open(dir.path(), small()).unwrap().close().unwrap();
    // A directory where the checkpoint file belongs: reading it fails in the file system.
    let path = dir.path().join("checkpoint");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let err = Engine::open(dir.path(), small()).unwrap_err();
    assert!(matches!(err, Error::Checkpoint(_)), "{err}");
    assert_eq!(
        err.io_error().map(|e| e.kind()),
        Some(std::io::ErrorKind::IsADirectory),
        "{err}"
    );
}

#[test]
fn a_snapshot_restores_into_an_identical_engine() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    let lease = engine.leases().grant(0, 60).unwrap().response.id;
    for i in 0..30 {
        let mut req = put(&format!("k{}", i % 7), &format!("v{i}"));
        req.lease = if i % 2 == 0 { lease } else { 0 };
        engine.write(req).unwrap();
    }
    engine.compact(10).unwrap();
    let mut snapshot = Vec::new();
    let size = engine.maintenance().snapshot(&mut snapshot).unwrap();
    assert_eq!(size, snapshot.len() as u64);

    let restored_dir = tempfile::tempdir().unwrap();
    let target = restored_dir.path().join("restored");
    offline::restore(&mut snapshot.as_slice(), &target).unwrap();
    let restored = Engine::open(&target, small()).unwrap();
    assert_eq!(
        restored.maintenance().hash_kv(0).unwrap(),
        engine.maintenance().hash_kv(0).unwrap()
    );
    for rev in [10, 20, 30] {
        assert_eq!(all_at(&restored, rev), all_at(&engine, rev), "revision {rev}");
    }
    assert_eq!(
        restored.leases().time_to_live(lease, true).keys,
        engine.leases().time_to_live(lease, true).keys
    );
    // It carries on from where the snapshot was taken.
    assert_eq!(
        restored.write(put("new", "x")).unwrap().revision,
        engine.current_revision() + 1
    );

    // Refused: into a directory in use, or from damaged bytes.
    let err = offline::restore(&mut snapshot.as_slice(), dir.path()).unwrap_err();
    assert!(matches!(err, Error::Snapshot(_)), "{err}");
    for at in [3, 40, snapshot.len() / 2, snapshot.len() - 3] {
        let mut damaged = snapshot.clone();
        damaged[at] ^= 1;
        let other = restored_dir.path().join(format!("other{at}"));
        let err = offline::restore(&mut damaged.as_slice(), &other).unwrap_err();
        assert!(matches!(err, Error::Snapshot(_)), "{err}");
        assert!(
            Engine::open(&other, small())
                .unwrap()
                .range(&RangeRequest::all())
                .unwrap()
                .kvs
                .is_empty(),
            "a failed restore leaves nothing behind"
        );
    }
    let cut = &snapshot[..snapshot.len() - 1];
    assert!(matches!(
        offline::restore(&mut &cut[..], restored_dir.path().join("cut")),
        Err(Error::Snapshot(_))
    ));
}

#[test]
fn get_and_get_prefix_read_current_values() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    for (k, v) in [("a/1", "x"), ("a/2", "y"), ("b", "z"), ("a/1", "x2")] {
        engine.write(PutRequest::new(k, v)).unwrap();
    }
    assert_eq!(engine.get("a/1").unwrap().map(|kv| kv.value), Some(Bytes::from("x2")));
    assert_eq!(engine.get("missing").unwrap(), None);
    let keys: Vec<Vec<u8>> = engine
        .get_prefix("a/")
        .unwrap()
        .into_iter()
        .map(|kv| kv.key.to_vec())
        .collect();
    assert_eq!(keys, vec![b"a/1".to_vec(), b"a/2".to_vec()]);
    engine.write(DeleteRangeRequest::prefix("a/")).unwrap();
    assert!(engine.get_prefix("a/").unwrap().is_empty());
}

#[test]
fn the_builder_refuses_an_identity_that_cannot_be() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |b: cairn_engine::EngineBuilder| match b.open() {
        Err(Error::InvalidConfig(why)) => why,
        other => panic!("opened: {other:?}"),
    };
    assert!(refused(Engine::builder(dir.path()).member(0)).contains("member ID"));
    assert!(refused(Engine::builder(dir.path()).member(4).peers([1, 2, 3])).contains("include this member"));
    assert!(refused(Engine::builder(dir.path()).member(1).peers([1, 0])).contains("must not be 0"));
    // Nothing was created by the refusals, and the defaults open a group of one, member 1.
    assert!(!dir.path().join("wal").exists());
    let engine = Engine::builder(dir.path()).open().unwrap();
    assert_eq!(engine.member_id(), 1);
    assert_eq!(engine.put("k", "v").unwrap(), engine.current_revision());
    assert_eq!(engine.get("k").unwrap().map(|kv| kv.value), Some("v".into()));
    assert!(engine.delete("k").unwrap());
    assert!(!engine.delete("k").unwrap(), "gone already");
}

/// A write through one way in, answering its revision.
type Way<'a> = Box<dyn Fn() -> cairn_engine::Result<i64> + 'a>;

/// `request` proposed through the server's hooks, which check nothing themselves: only the
/// log's edge can refuse it.
fn through_the_log<W: cairn_engine::WriteRequest + Clone + 'static>(engine: &Engine, request: W) -> Way<'_> {
    Box::new(move || {
        engine
            .server()
            .write_async_as(request.clone(), None)?
            .wait()
            .map(|a| a.revision)
    })
}

/// What is sent, through the embedded API and through the log, and the refusal expected.
type Case<'a> = (&'static str, Way<'a>, Way<'a>, Error);

/// A request that breaks etcd's rules is refused wherever it enters, each check made once:
/// by the embedded API before it is logged, and by the log's edge for an entry nothing
/// checked before (here proposed through the server's hooks, which trust their caller to have
/// checked it, as the server does at its gRPC and gateway edge: `server/tests/differential.rs`
/// and `server/tests/gateway.rs` send the same requests there). Nothing refused takes a
/// revision, and a valid request goes on through both.
#[test]
fn an_invalid_request_is_refused_where_it_enters_and_at_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), Config::default()).unwrap();
    let before = engine.put("kept", "v").unwrap();
    let value_with_ignore_value = PutRequest {
        ignore_value: true,
        ..put("kept", "v2")
    };
    let lease_with_ignore_lease = PutRequest {
        ignore_lease: true,
        lease: 7,
        ..put("kept", "v2")
    };
    let twice = TxnRequest::when([]).then([put("a", "1"), put("a", "2")]);
    let empty_key_in_txn = TxnRequest::when([]).then([put("", "1")]);
    let cases: Vec<Case<'_>> = vec![
        (
            "a put of no key",
            Box::new(|| engine.write(put("", "v")).map(|a| a.revision)),
            through_the_log(&engine, put("", "v")),
            Error::EmptyKey,
        ),
        (
            "a value with ignore_value",
            Box::new(|| engine.write(value_with_ignore_value.clone()).map(|a| a.revision)),
            through_the_log(&engine, value_with_ignore_value.clone()),
            Error::ValueProvided,
        ),
        (
            "a lease with ignore_lease",
            Box::new(|| engine.write(lease_with_ignore_lease.clone()).map(|a| a.revision)),
            through_the_log(&engine, lease_with_ignore_lease.clone()),
            Error::LeaseProvided,
        ),
        (
            "a delete of no key",
            Box::new(|| engine.write(DeleteRangeRequest::key("")).map(|a| a.revision)),
            through_the_log(&engine, DeleteRangeRequest::key("")),
            Error::EmptyKey,
        ),
        (
            "a txn that puts a key twice",
            Box::new(|| engine.txn(twice.clone()).map(|a| a.revision)),
            through_the_log(&engine, twice.clone()),
            Error::DuplicateKey,
        ),
        (
            "a txn that puts no key",
            Box::new(|| engine.txn(empty_key_in_txn.clone()).map(|a| a.revision)),
            through_the_log(&engine, empty_key_in_txn.clone()),
            Error::EmptyKey,
        ),
    ];
    for (what, embedded, logged, refusal) in &cases {
        assert_eq!(
            embedded().err().as_ref(),
            Some(refusal),
            "{what}, through the embedded API"
        );
        assert_eq!(logged().err().as_ref(), Some(refusal), "{what}, through the log");
    }
    assert_eq!(engine.range(&RangeRequest::key("")).err(), Some(Error::EmptyKey));
    assert_eq!(engine.current_revision(), before, "nothing refused took a revision");
    let valid = engine
        .server()
        .write_async_as(put("fine", "v"), None)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(valid.revision, before + 1);
    assert_eq!(engine.write(put("fine", "w")).unwrap().revision, before + 2);
    drop(cases);
    engine.close().unwrap();
}

/// Response headers read the current revision, and permission checks the auth store's status,
/// without the state's lock: both must follow every write and every auth change (a refused
/// one changes nothing), and come back the same after a reopen.
#[test]
fn the_lock_free_revision_and_auth_status_follow_every_change_and_a_reopen() {
    use cairn_engine::AuthChange;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    for i in 0..5 {
        let revision = engine.put(format!("k{i}"), "v").unwrap();
        assert_eq!(engine.current_revision(), revision);
    }
    assert!(engine.delete("k0").unwrap());
    let revision = engine.current_revision();
    assert_eq!(engine.range(&RangeRequest::all()).unwrap().revision, revision);
    let change = |change: AuthChange| engine.server().auth_change_async(change, None).unwrap().wait();
    assert_eq!(
        engine.server().auth_status(),
        (false, 1),
        "a new auth store is at revision 1"
    );
    let steps = [
        (
            AuthChange::UserAdd {
                name: "root".into(),
                password_hash: Some("hash".into()),
                no_password: false,
            },
            (false, 2),
        ),
        (
            AuthChange::UserGrantRole {
                user: "root".into(),
                role: "root".into(),
            },
            (false, 3),
        ),
        // etcd does not bump the revision on enabling.
        (AuthChange::Enable, (true, 3)),
        (AuthChange::RoleAdd { name: "app".into() }, (true, 4)),
    ];
    for (step, status) in steps {
        change(step).unwrap();
        assert_eq!(engine.server().auth_status(), status);
    }
    assert!(
        change(AuthChange::RoleAdd { name: "app".into() }).is_err(),
        "the role exists"
    );
    assert_eq!(
        engine.server().auth_status(),
        (true, 4),
        "a refused change changes nothing"
    );
    change(AuthChange::Disable).unwrap();
    assert_eq!(engine.server().auth_status(), (false, 5));
    assert_eq!(engine.current_revision(), revision, "auth changes take no revision");
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), small()).unwrap();
    assert_eq!(engine.current_revision(), revision);
    assert_eq!(engine.server().auth_status(), (false, 5));
}
