//! The backend quota (etcd's NOSPACE alarm, docs/compatibility.md): past `quota_backend_bytes` the NOSPACE alarm is
//! raised, at the limit and not before; puts, writing txns and lease grants fail; reads,
//! deletes, compaction, defragmentation and disarming keep working; the alarm survives a
//! restart until disarmed.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use bytes::Bytes;
use cairn_engine::{Alarm, Config, DeleteRangeRequest, Engine, Error, PutRequest, RangeRequest, RequestOp, TxnRequest};

fn config() -> Config {
    Config {
        quota_backend_bytes: 4096,
        lease_check_interval: None,
        ..Config::default()
    }
}

fn put(engine: &Engine, key: &str) -> Result<i64, Error> {
    engine
        .write(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::from(vec![b'v'; 200]),
            ..PutRequest::default()
        })
        .map(|a| a.revision)
}

#[test]
fn nospace_blocks_growth_but_not_reclaiming() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let mut written = 0;
    // What one put adds: every put writes the same key and value sizes.
    let mut growth = 0;
    let err = loop {
        let before = engine.status().size_in_use;
        match put(&engine, "same-key") {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        growth = engine.status().size_in_use - before;
        assert!(written < 100, "the quota must bite");
    };
    assert_eq!(err, Error::NoSpace);
    // At the limit, not before: every put that fitted was taken, and the one refused would
    // have passed the quota.
    let used = engine.status().size_in_use;
    assert!(growth > 0 && used <= 4096, "{used} bytes in use after puts of {growth}");
    assert!(
        used + growth > 4096,
        "refused with {used} of 4096 bytes used, a put adding {growth}"
    );
    assert_eq!(
        engine.maintenance().alarms(),
        vec![(engine.member_id(), Alarm::NoSpace)],
        "raised for this member"
    );
    assert_eq!(put(&engine, "other").unwrap_err(), Error::NoSpace);
    assert_eq!(engine.leases().grant(0, 10).unwrap_err(), Error::NoSpace);
    let writing_txn = TxnRequest {
        success: vec![RequestOp::DeleteRange(DeleteRangeRequest {
            key: b"x".to_vec(),
            ..DeleteRangeRequest::default()
        })],
        ..TxnRequest::default()
    };
    assert_eq!(engine.txn(writing_txn).unwrap_err(), Error::NoSpace);
    let reading_txn = TxnRequest {
        success: vec![RequestOp::Range(RangeRequest {
            key: b"same-key".to_vec(),
            ..RangeRequest::default()
        })],
        ..TxnRequest::default()
    };
    assert!(
        engine.txn(reading_txn).unwrap().response.succeeded,
        "read-only txns still work"
    );
    let read = engine
        .range(&RangeRequest {
            key: b"same-key".to_vec(),
            ..RangeRequest::default()
        })
        .unwrap();
    assert_eq!(read.kvs[0].version, written);

    // The alarm is durable.
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(
        engine.maintenance().alarms(),
        vec![(engine.member_id(), Alarm::NoSpace)],
        "raised for this member"
    );

    // Reclaim: compact away the old versions, then disarm.
    let before = engine.status().size_in_use;
    engine.compact(engine.current_revision()).unwrap();
    engine.maintenance().wait_compacted().unwrap();
    assert!(
        engine.status().size_in_use < before / 4,
        "{} -> {}",
        before,
        engine.status().size_in_use
    );
    // Defragmentation, etcd's remedy for NOSPACE, runs while the alarm is raised.
    let defragmented = engine.maintenance().defragment().unwrap();
    assert!(defragmented.after <= defragmented.before, "{defragmented:?}");
    let read = engine
        .range(&RangeRequest {
            key: b"same-key".to_vec(),
            ..RangeRequest::default()
        })
        .unwrap();
    assert_eq!(read.kvs[0].version, written, "the current value survives");
    engine
        .maintenance()
        .alarm_disarm(engine.member_id(), Alarm::NoSpace)
        .unwrap();
    assert!(engine.maintenance().alarms().is_empty());
    put(&engine, "other").unwrap();
}
