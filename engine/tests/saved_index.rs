//! The saved key index end to end: closing saves it, a running member refreshes it after its
//! checkpoints, and a reopen from it (with records after it, a compaction and leased keys)
//! is the state a full scan would give. One that is torn, stale (a defragmentation since)
//! or another store's is never trusted: opening falls back to the scan, and nothing differs.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_engine::{Config, DeleteRangeRequest, Engine, PutRequest, RangeRequest, RangeResponse};

/// The saved index's file, beside the checkpoint.
const INDEX: &str = "index";

/// Small data files (histories span many), the index saved whenever anything is not covered.
fn config() -> Config {
    Config {
        data_file_size: 4096,
        saved_index_bytes: 0,
        lease_check_interval: None,
        ..Config::default()
    }
}

fn put(engine: &Engine, key: &str, value: &str, lease: i64) -> i64 {
    engine
        .write(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::copy_from_slice(value.as_bytes()),
            lease,
            ..PutRequest::default()
        })
        .unwrap()
        .revision
}

/// Every key at `revision` (0: now), values and versions included.
fn all(engine: &Engine, revision: i64) -> RangeResponse {
    engine.range(&RangeRequest::all().at_revision(revision)).unwrap()
}

/// A history with overwrites, deletes, a compaction and keys on a lease; returns the lease
/// and a revision after the compaction to read at.
fn history(engine: &Engine) -> (i64, i64) {
    let lease = engine.leases().grant(7, 3600).unwrap().response.id;
    for i in 0..120 {
        let key = format!("key/{:03}", i % 40);
        put(engine, &key, &format!("value {i}"), if i % 3 == 0 { lease } else { 0 });
    }
    engine
        .write(DeleteRangeRequest {
            key: b"key/010".to_vec(),
            range_end: b"key/020".to_vec(),
            prev_kv: false,
        })
        .unwrap();
    let compact_at = put(engine, "key/005", "after the deletes", 0);
    engine.compact(compact_at).unwrap();
    let read_at = put(engine, "key/030", "after the compaction", lease);
    put(engine, "key/031", "last", 0);
    (lease, read_at)
}

/// What a reopened engine must show: every key now and at `read_at`, and the keys on `lease`.
fn observed(engine: &Engine, lease: i64, read_at: i64) -> (RangeResponse, RangeResponse, Vec<Bytes>) {
    let mut keys = engine.leases().time_to_live(lease, true).keys;
    keys.sort();
    (all(engine, 0), all(engine, read_at), keys)
}

/// A closed store of 40 keys named `prefix` with values `value` and a number, all on lease
/// 7, and what it showed.
fn leased_store(prefix: &str, value: &str) -> (tempfile::TempDir, (RangeResponse, RangeResponse, Vec<Bytes>)) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let lease = engine.leases().grant(7, 3600).unwrap().response.id;
    for i in 0..40 {
        put(&engine, &format!("{prefix}{i:03}"), &format!("{value} {i}"), lease);
    }
    let shown = observed(&engine, lease, 0);
    drop(engine);
    (dir, shown)
}

fn reopen(dir: &Path, config: Config) -> Engine {
    Engine::open(dir, config).unwrap()
}

#[test]
fn a_reopen_from_the_saved_index_is_what_the_scan_gives() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let (lease, read_at) = history(&engine);
    let before = observed(&engine, lease, read_at);
    drop(engine);
    assert!(dir.path().join(INDEX).exists(), "closing saves the key index");
    let engine = reopen(dir.path(), config());
    assert_eq!(observed(&engine, lease, read_at), before);
    // More records after the index (closing saves none: they stay for the next open to scan).
    put(&engine, "key/032", "not covered", lease);
    let before = observed(&engine, lease, read_at);
    drop(engine);
    let never = Config {
        saved_index_bytes: u64::MAX,
        ..config()
    };
    let engine = reopen(dir.path(), never.clone());
    assert_eq!(observed(&engine, lease, read_at), before);
    // Revoking the lease deletes exactly the keys the reopened lessor knows.
    engine.leases().revoke(lease).unwrap();
    assert!(all(&engine, 0).kvs.iter().all(|kv| kv.lease != lease));
}

#[test]
fn a_running_member_refreshes_the_saved_index_after_its_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        checkpoint_entries: 20,
        ..config()
    };
    let engine = Engine::open(dir.path(), config.clone()).unwrap();
    let (lease, read_at) = history(&engine);
    // The checkpointer thread writes it after a checkpoint: wait for it, up to a deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.path().join(INDEX).exists() {
        assert!(Instant::now() < deadline, "no saved index after the checkpoints");
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = observed(&engine, lease, read_at);
    drop(engine);
    let engine = reopen(dir.path(), config);
    assert_eq!(observed(&engine, lease, read_at), before);
}

#[test]
fn a_torn_stale_or_foreign_saved_index_is_never_trusted() {
    let never = Config {
        saved_index_bytes: u64::MAX,
        ..config()
    };
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let (lease, read_at) = history(&engine);
    let before = observed(&engine, lease, read_at);
    drop(engine);
    let saved = std::fs::read(dir.path().join(INDEX)).unwrap();

    // Torn: every cut of it opens to the same state.
    for len in [0, 1, 12, saved.len() / 2, saved.len() - 1] {
        std::fs::write(dir.path().join(INDEX), &saved[..len]).unwrap();
        let engine = reopen(dir.path(), never.clone());
        assert_eq!(observed(&engine, lease, read_at), before, "an index cut at {len}");
    }

    // Stale: the files defragmented since (another layout epoch), the old index put back.
    std::fs::write(dir.path().join(INDEX), &saved).unwrap();
    let engine = reopen(dir.path(), never.clone());
    engine.maintenance().defragment().unwrap();
    put(&engine, "key/033", "after the defragmentation", 0);
    let before = observed(&engine, lease, read_at);
    drop(engine);
    std::fs::write(dir.path().join(INDEX), &saved).unwrap();
    let engine = reopen(dir.path(), never.clone());
    assert_eq!(observed(&engine, lease, read_at), before);
    drop(engine);

    // Foreign: another store's index, its files the same ids and lengths (same history, the
    // keys' names and values changed but not their lengths).
    let (other, before) = leased_store("yek/", "eulav");
    let (mine, mine_before) = leased_store("key/", "value");
    assert_ne!(before, mine_before);
    std::fs::copy(other.path().join(INDEX), mine.path().join(INDEX)).unwrap();
    let engine = reopen(mine.path(), never);
    assert_eq!(observed(&engine, 7, 0), mine_before);
}
