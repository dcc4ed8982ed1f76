//! The engine against the in-memory store as a reference (itself checked against a plain model
//! in store_model.rs): random puts, deletes, compare-and-swap txns and compactions, with
//! reopens and defragmentations in between. Every answer must match the reference's, and after every reopen the
//! whole history still readable must be identical: replaying the log is deterministic.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use bytes::Bytes;
use cairn_engine::{
    Compare, CompareResult, CompareTarget, Config, DeleteRangeRequest, Engine, PutRequest, RangeRequest, RequestOp,
    Store, TxnRequest,
};
use proptest::prelude::*;

const KEYS: &[&str] = &["a", "a/1", "a/2", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: usize,
        value: u8,
        prev_kv: bool,
    },
    Delete {
        key: usize,
        prefix: bool,
    },
    /// Put `value` at `key` if its version equals `version`, else read it.
    Cas {
        key: usize,
        version: i64,
        value: u8,
    },
    Compact {
        back: i64,
    },
    Reopen,
    /// Defragment, then check nothing observable changed.
    Defrag,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS.len(), any::<u8>(), any::<bool>()).prop_map(|(key, value, prev_kv)| Op::Put { key, value, prev_kv }),
        2 => (0..KEYS.len(), any::<bool>()).prop_map(|(key, prefix)| Op::Delete { key, prefix }),
        2 => (0..KEYS.len(), 0i64..4, any::<u8>()).prop_map(|(key, version, value)| Op::Cas { key, version, value }),
        1 => (0i64..5).prop_map(|back| Op::Compact { back }),
        1 => Just(Op::Reopen),
        1 => Just(Op::Defrag),
    ]
}

fn config() -> Config {
    Config {
        wal: cairn_engine::wal::Config {
            segment_size: 1024,
            ..Default::default()
        },
        // A checkpoint (and a release of the log before it) every 3 entries: reopening loads
        // a checkpoint and replays the entries after it.
        checkpoint_entries: 3,
        // One key per compaction step: reads, watches and HashKV must not see the difference
        // from the reference's all-at-once compaction, at any point of the sweep.
        compaction_batch: 1,
        // Small data files, so records span several and defragmentation has files to drop.
        data_file_size: 4096,
        ..Config::default()
    }
}

/// Every revision's full range, errors included (compacted ones fail), from the engine and
/// from the reference.
fn history(engine: &Engine, reference: &Store) -> Vec<(i64, bool)> {
    let mut mismatches = Vec::new();
    for rev in 1..=reference.current_revision() {
        let req = RangeRequest {
            key: vec![0],
            range_end: vec![0],
            revision: rev,
            ..RangeRequest::default()
        };
        let (got, expected) = (engine.range(&req), req.apply(reference));
        if got != expected {
            mismatches.push((rev, got.is_ok()));
        }
    }
    mismatches
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_the_store_across_reopens(ops in prop::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Engine::open(dir.path(), config()).unwrap();
        let mut reference = Store::new();
        for op in ops {
            match op {
                Op::Put { key, value, prev_kv } => {
                    let req = PutRequest { key: KEYS[key].into(), value: Bytes::from(vec![value]), prev_kv, ..PutRequest::default() };
                    let got = engine.write(req.clone()).map(|a| (a.response, a.revision));
                    prop_assert_eq!(got, req.apply(&mut reference));
                }
                Op::Delete { key, prefix } => {
                    let range_end = if prefix { cairn_engine::prefix_end(KEYS[key].as_bytes()) } else { Vec::new() };
                    let req = DeleteRangeRequest { key: KEYS[key].into(), range_end, prev_kv: true };
                    let got = engine.write(req.clone()).map(|a| (a.response, a.revision));
                    prop_assert_eq!(got, req.apply(&mut reference));
                }
                Op::Cas { key, version, value } => {
                    let req = TxnRequest {
                        compare: vec![Compare { key: KEYS[key].into(), range_end: vec![], target: CompareTarget::Version(version), result: CompareResult::Equal }],
                        success: vec![RequestOp::Put(PutRequest { key: KEYS[key].into(), value: Bytes::from(vec![value]), ..PutRequest::default() })],
                        failure: vec![RequestOp::Range(RangeRequest { key: KEYS[key].into(), ..RangeRequest::default() })],
                    };
                    let got = engine.txn(req.clone()).map(|a| (a.response, a.revision));
                    prop_assert_eq!(got, req.apply(&mut reference));
                }
                Op::Compact { back } => {
                    let rev = reference.current_revision() - back;
                    let got = engine.compact(rev).map(|a| a.revision);
                    prop_assert_eq!(got, reference.compact(rev).map(|()| reference.current_revision()));
                }
                Op::Reopen => {
                    let hash = engine.maintenance().hash_kv(0).unwrap();
                    prop_assert_eq!(hash, reference.hash_kv(0).unwrap());
                    engine.close().unwrap();
                    engine = Engine::open(dir.path(), config()).unwrap();
                    prop_assert_eq!(engine.current_revision(), reference.current_revision());
                    prop_assert_eq!(history(&engine, &reference), vec![], "revisions whose reads differ after reopening");
                    prop_assert_eq!(engine.maintenance().hash_kv(0).unwrap(), hash, "HashKV is stable across a restart");
                }
                Op::Defrag => {
                    let hash = engine.maintenance().hash_kv(0).unwrap();
                    let in_use = engine.status().size_in_use;
                    let done = engine.maintenance().defragment().unwrap();
                    prop_assert!(done.after <= done.before + 4096, "{:?}", done);
                    // The compaction sweep may have dropped more meanwhile, never less.
                    prop_assert!(engine.status().size_in_use <= in_use);
                    prop_assert_eq!(engine.maintenance().hash_kv(0).unwrap(), hash);
                    prop_assert_eq!(history(&engine, &reference), vec![], "revisions whose reads differ after defragmenting");
                }
            }
            let count = RangeRequest { key: vec![0], range_end: vec![0], count_only: true, ..RangeRequest::default() };
            prop_assert_eq!(engine.status().keys as i64, count.apply(&reference).unwrap().count);
        }
    }
}
