//! Fuzzes restoring a snapshot and opening what it restored.
//!
//! The input damages a valid snapshot (taken once from a small engine with puts, deletes, a
//! txn, a leased key and a compaction): bytes flipped or overwritten, the stream cut or
//! extended. With `fix_checksums`, every frame's and record's CRC is recomputed after the
//! damage, so the restore's own semantic checks (record order, revisions, frame kinds, the
//! count) and the rebuild of the index on open are reached, not only the checksums. Or the
//! input is raw bytes.
//!
//! For every input: restore and open never panic; a failed restore leaves no data directory
//! behind; a restore of the undamaged snapshot opens to the original state.

#![no_main]

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use bytes::Bytes;
use cairn_engine::offline;
use cairn_engine::{Config, DeleteRangeRequest, Engine, PutRequest, RangeRequest};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Damage {
        edits: Vec<(u16, u8)>,
        cut: Option<u16>,
        extra: Vec<u8>,
        fix_checksums: bool,
    },
}

fn config() -> Config {
    Config {
        lease_check_interval: None,
        lease_checkpoint_interval: None,
        watch_progress_interval: None,
        data_file_size: 4096,
        ..Config::default()
    }
}

fn put(key: &str, value: &str, lease: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: Bytes::copy_from_slice(value.as_bytes()),
        lease,
        ..PutRequest::default()
    }
}

/// The valid snapshot and the full range it restores to.
fn valid() -> &'static (Vec<u8>, Vec<cairn_engine::KeyValue>) {
    static VALID: OnceLock<(Vec<u8>, Vec<cairn_engine::KeyValue>)> = OnceLock::new();
    VALID.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine = Engine::open(dir.path(), config()).expect("open");
        let lease = engine.leases().grant(7, 3600).expect("grant").response.id;
        for i in 0..12 {
            engine
                .write(put(&format!("k{}", i % 5), &format!("v{i}"), 0))
                .expect("put");
        }
        engine.write(put("leased", "x", lease)).expect("put");
        engine
            .write(DeleteRangeRequest {
                key: b"k3".to_vec(),
                ..DeleteRangeRequest::default()
            })
            .expect("delete");
        engine.compact(8).expect("compact");
        engine.write(put("k1", "after", 0)).expect("put");
        let mut out = Vec::new();
        engine.maintenance().snapshot(&mut out).expect("snapshot");
        let all = engine.range(&RangeRequest::all()).expect("range").kvs;
        engine.close().expect("close");
        (out, all)
    })
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Recomputes the CRC of every frame, and of every record in record frames, as far as the
/// lengths make sense.
fn fix_checksums(snap: &mut [u8]) {
    let mut at = 12;
    while let (Some(kind), Some(len)) = (u32_at(snap, at), u32_at(snap, at + 4)) {
        let body_start = at + 12;
        let Some(body_end) = body_start.checked_add(len as usize).filter(|e| *e <= snap.len()) else {
            return;
        };
        if kind == 2 {
            let mut r = body_start;
            while let Some(rlen) = u32_at(snap, r) {
                let end = r + rlen as usize;
                if rlen < 8 || end > body_end {
                    break;
                }
                let crc = crc32fast::hash(&snap[r + 8..end]);
                snap[r + 4..r + 8].copy_from_slice(&crc.to_le_bytes());
                r += (rlen as usize).div_ceil(8) * 8;
            }
        }
        let crc = crc32fast::hash(&snap[body_start..body_end]);
        snap[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
        at = body_end;
    }
}

fuzz_target!(|input: Input| {
    let (valid, expected) = valid();
    let (snapshot, untouched) = match input {
        Input::Raw(bytes) => (bytes, false),
        Input::Damage {
            edits,
            cut,
            extra,
            fix_checksums: fix,
        } => {
            let mut snap = valid.clone();
            let untouched = edits.is_empty() && cut.is_none() && extra.is_empty();
            for (at, byte) in edits {
                let i = at as usize % snap.len();
                snap[i] = byte;
            }
            if let Some(cut) = cut {
                snap.truncate(cut as usize % (snap.len() + 1));
            }
            snap.extend_from_slice(&extra);
            if fix {
                fix_checksums(&mut snap);
            }
            (snap, untouched)
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("restored");
    match offline::restore(&mut snapshot.as_slice(), &target) {
        Ok(()) => {
            if let Ok(engine) = Engine::open(&target, config()) {
                let all = engine.range(&RangeRequest::all());
                let _ = engine.maintenance().hash_kv(0);
                if untouched {
                    assert_eq!(
                        &all.expect("range").kvs,
                        expected,
                        "an undamaged snapshot restores whole"
                    );
                }
                let _ = engine.close();
            } else {
                assert!(!untouched, "an undamaged snapshot opens");
            }
        }
        Err(_) => {
            assert!(!untouched, "an undamaged snapshot restores");
            assert!(!target.join("data").exists(), "a failed restore leaves no data behind");
        }
    }
});
