//! The CORRUPT alarm (raised by the server's hash checks, server/src/corruption.rs): while it
//! is raised nothing that writes is applied, and the member it names refuses reads; disarming
//! lifts both. And the hashes the checks compare: HashKV read a chunk at a time while writes
//! go on, and the hash of the state at the latest compaction.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use bytes::Bytes;
use cairn_engine::{Alarm, Config, Engine, Error, PutRequest, RangeRequest, RequestOp, TxnRequest};

fn config() -> Config {
    Config {
        lease_check_interval: None,
        ..Config::default()
    }
}

fn put(engine: &Engine, key: &str, value: &str) -> Result<i64, Error> {
    engine
        .write(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::from(value.as_bytes().to_vec()),
            ..PutRequest::default()
        })
        .map(|a| a.revision)
}

fn get(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec(),
        serializable: true,
        ..RangeRequest::default()
    }
}

#[test]
fn a_corrupt_alarm_stops_writes_and_the_named_members_reads_until_disarmed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let revision = put(&engine, "k", "v").unwrap();

    // Named for another member: writes stop, reads here go on.
    engine.maintenance().alarm_activate(0x1234, Alarm::Corrupt).unwrap();
    assert_eq!(put(&engine, "k", "w").unwrap_err(), Error::Corrupt);
    assert_eq!(engine.leases().grant(0, 10).unwrap_err(), Error::Corrupt);
    assert_eq!(engine.compact(revision).unwrap_err(), Error::Corrupt);
    assert_eq!(engine.range(&get("k")).unwrap().kvs.len(), 1);

    // Named for this member: its reads stop too, in a range and a read-only txn.
    engine
        .maintenance()
        .alarm_activate(engine.member_id(), Alarm::Corrupt)
        .unwrap();
    assert_eq!(engine.range(&get("k")).unwrap_err(), Error::Corrupt);
    let reading = TxnRequest {
        success: vec![RequestOp::Range(get("k"))],
        ..TxnRequest::default()
    };
    assert_eq!(engine.txn(reading.clone()).unwrap_err(), Error::Corrupt);

    // The alarm outlives a restart; disarming both lifts it.
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(engine.range(&get("k")).unwrap_err(), Error::Corrupt);
    engine
        .maintenance()
        .alarm_disarm(engine.member_id(), Alarm::Corrupt)
        .unwrap();
    engine.maintenance().alarm_disarm(0x1234, Alarm::Corrupt).unwrap();
    assert_eq!(engine.txn(reading).unwrap().response.responses.len(), 1);
    put(&engine, "k", "w").unwrap();
}

#[test]
fn hashes_read_a_chunk_at_a_time_equal_the_stores_and_compaction_hashes_cover_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(engine.maintenance().compaction_hash().unwrap(), None, "never compacted");
    // More records than one chunk of the engine's hash (4096).
    for i in 0..5000 {
        put(&engine, &format!("k{}", i % 700), &format!("v{i}")).unwrap();
    }
    let at = engine.current_revision();
    let whole = engine.maintenance().hash_kv(0).unwrap();
    assert_eq!(whole.hash_revision, at);
    assert_eq!(engine.maintenance().hash_kv(at).unwrap(), whole);
    assert_ne!(engine.maintenance().hash_kv(at - 1).unwrap().hash, whole.hash);

    engine.compact(at).unwrap();
    let mine = engine.maintenance().compaction_hash().unwrap().unwrap();
    assert_eq!((mine.hash_revision, mine.compact_revision), (at, at));
    // Writes after the compaction change nothing in its hash.
    put(&engine, "later", "x").unwrap();
    assert_eq!(engine.maintenance().compaction_hash().unwrap().unwrap(), mine);
}

#[test]
fn a_compaction_hash_depends_on_the_state_at_the_compaction_not_the_history_before() {
    let hash_after = |values: [&str; 3]| {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), config()).unwrap();
        put(&engine, "a", values[0]).unwrap();
        put(&engine, "b", values[1]).unwrap();
        let at = put(&engine, "a", values[2]).unwrap();
        engine.compact(at).unwrap();
        engine.maintenance().compaction_hash().unwrap().unwrap().hash
    };
    let written = hash_after(["1", "1", "2"]);
    assert_eq!(
        hash_after(["9", "1", "2"]),
        written,
        "a's value before the compaction is gone"
    );
    assert_ne!(
        hash_after(["1", "7", "2"]),
        written,
        "b's value at the compaction differs"
    );
}
