//! Leases through the engine, on a manual clock (etcd's leases, docs/compatibility.md): keys attach to a
//! lease and go with it in one revision; leases never expire early, not even across a
//! restart; mass expiry is revoked in bounded batches.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_engine::{Config, Engine, Error, ManualClock, PutRequest, RangeRequest};

fn config(clock: &ManualClock) -> Config {
    Config {
        wal: cairn_engine::wal::Config {
            segment_size: 64 << 10,
            ..Default::default()
        },
        lease_check_interval: None,
        lease_revoke_batch: 10,
        clock: Arc::new(clock.clone()),
        ..Config::default()
    }
}

fn put(engine: &Engine, key: &str, lease: i64) -> Result<i64, Error> {
    engine
        .write(PutRequest {
            key: key.as_bytes().to_vec(),
            value: Bytes::from_static(b"v"),
            lease,
            ..PutRequest::default()
        })
        .map(|a| a.revision)
}

fn count(engine: &Engine, prefix: &str) -> i64 {
    engine
        .range(&RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: cairn_engine::prefix_end(prefix.as_bytes()),
            count_only: true,
            ..RangeRequest::default()
        })
        .unwrap()
        .count
}

#[test]
fn keys_go_with_their_lease_in_one_revision() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let lease = engine.leases().grant(0, 1).unwrap().response;
    assert!(lease.id > 0, "the engine chose an ID");
    assert_eq!(lease.ttl, 2, "raised to the minimum TTL");
    assert_eq!(engine.leases().grant(lease.id, 10).unwrap_err(), Error::LeaseExists);
    assert_eq!(put(&engine, "x", 12345).unwrap_err(), Error::LeaseNotFound);
    for key in ["a/1", "a/2", "a/3"] {
        put(&engine, key, lease.id).unwrap();
    }
    put(&engine, "a/3", 0).unwrap(); // detached again
    let status = engine.leases().time_to_live(lease.id, true);
    assert_eq!(status.keys, vec![Bytes::from("a/1"), Bytes::from("a/2")]);
    let before = engine.current_revision();
    let revoked = engine.leases().revoke(lease.id).unwrap();
    assert_eq!(revoked.revision, before + 1, "both keys deleted in one revision");
    assert_eq!(count(&engine, "a/"), 1);
    assert_eq!(engine.leases().revoke(lease.id).unwrap_err(), Error::LeaseNotFound);
    assert_eq!(engine.leases().time_to_live(lease.id, false).ttl, -1);
}

#[test]
fn leases_expire_on_time_and_not_before() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let short = engine.leases().grant(0, 10).unwrap().response.id;
    let long = engine.leases().grant(0, 30).unwrap().response.id;
    put(&engine, "short", short).unwrap();
    put(&engine, "long", long).unwrap();
    clock.advance(Duration::from_millis(9_999));
    assert_eq!(engine.leases().expire_now(), 0);
    clock.advance(Duration::from_millis(1));
    assert_eq!(engine.leases().expire_now(), 1);
    assert_eq!(count(&engine, "short"), 0);
    assert_eq!(count(&engine, "long"), 1);
    assert_eq!(engine.leases().keep_alive(long).unwrap(), 30);
    clock.advance(Duration::from_secs(29));
    assert_eq!(engine.leases().expire_now(), 0, "the keep-alive restarted its TTL");
    assert_eq!(engine.leases().list(), vec![long]);
}

#[test]
fn a_restart_never_expires_a_lease_early() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let checkpointed = engine.leases().grant(0, 100).unwrap().response.id;
    put(&engine, "k", checkpointed).unwrap();
    clock.advance(Duration::from_secs(60));
    engine.leases().checkpoint_now().unwrap();
    // Granted after the checkpoint: a restart gives it its full TTL again.
    let plain = engine.leases().grant(0, 100).unwrap().response.id;
    assert_ne!(plain, checkpointed);
    engine.close().unwrap();

    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    assert_eq!(
        engine.leases().time_to_live(checkpointed, true).keys,
        vec![Bytes::from("k")]
    );
    clock.advance(Duration::from_secs(39));
    assert_eq!(engine.leases().expire_now(), 0, "40 s were left at the checkpoint");
    clock.advance(Duration::from_secs(1));
    assert_eq!(engine.leases().expire_now(), 1);
    assert_eq!(count(&engine, "k"), 0);
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        engine.leases().expire_now(),
        0,
        "never checkpointed: a full TTL from the restart"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(engine.leases().expire_now(), 1);
}

#[test]
fn mass_expiry_is_revoked_in_batches() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    for l in 0..25 {
        let id = engine.leases().grant(0, 5).unwrap().response.id;
        for k in 0..4 {
            put(&engine, &format!("l{l}/k{k}"), id).unwrap();
        }
    }
    clock.advance(Duration::from_secs(5));
    assert_eq!(engine.leases().expire_now(), 10, "one batch at a time");
    // Other writes go on between batches.
    put(&engine, "unrelated", 0).unwrap();
    assert_eq!(engine.leases().expire_now(), 10);
    assert_eq!(engine.leases().expire_now(), 5);
    assert_eq!(engine.leases().expire_now(), 0);
    assert_eq!(count(&engine, "l"), 0);
    assert_eq!(count(&engine, "unrelated"), 1);
}

#[test]
fn a_renewal_after_a_checkpoint_survives_a_restart() {
    // Found in review: a keep-alive must clear the checkpointed remaining TTL durably.
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    let id = engine.leases().grant(0, 100).unwrap().response.id;
    clock.advance(Duration::from_secs(95));
    engine.leases().checkpoint_now().unwrap(); // 5 s left, durably
    assert_eq!(engine.leases().keep_alive(id).unwrap(), 100);
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config(&clock)).unwrap();
    clock.advance(Duration::from_secs(99));
    assert_eq!(
        engine.leases().expire_now(),
        0,
        "renewed for 100 s; the stale 5 s checkpoint is gone"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(engine.leases().expire_now(), 1);
}

#[test]
fn a_round_of_revokes_is_bounded_by_the_keys_it_deletes() {
    let clock = ManualClock::new();
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        lease_revoke_keys: 100,
        ..config(&clock)
    };
    let engine = Engine::open(dir.path(), config).unwrap();
    // Three leases of 40 keys, then one of 250 (more than a round's worth alone).
    let mut leases = Vec::new();
    for (l, keys) in [40, 40, 40, 250].into_iter().enumerate() {
        let id = engine.leases().grant(0, 5).unwrap().response.id;
        for k in 0..keys {
            put(&engine, &format!("l{l}/k{k}"), id).unwrap();
        }
        leases.push(id);
    }
    clock.advance(Duration::from_secs(5));
    assert_eq!(engine.leases().expire_now(), 2, "80 keys; a third lease would make 120");
    assert_eq!(engine.leases().expire_now(), 1, "40 + 250 is over the bound: one lease");
    assert_eq!(engine.leases().expire_now(), 1, "alone, a lease goes whatever its keys");
    assert_eq!(engine.leases().expire_now(), 0);
    assert_eq!(count(&engine, "l"), 0);
}
