//! Fuzzes restoring a snapshot in etcd's format (a bbolt database) and opening what it restored.
//!
//! The input damages a real snapshot (`etcdctl snapshot save` from etcd 3.7 after 300 puts over
//! 50 keys and a delete, which `fuzz/etcd-snapshot.sh` writes to `fuzz/target/etcd-snapshot.db`,
//! or the file `CAIRN_ETCD_SNAPSHOT` names): bytes overwritten, the file cut or extended. Or the
//! input is raw bytes. The SHA-256 check is skipped, so that the
//! damage reaches the bbolt reader and the etcd layout behind it.
//!
//! For every input: restore and open never panic, and a failed restore leaves no data behind;
//! the undamaged snapshot restores to its revision, 302.

#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use cairn_engine::offline;
use cairn_engine::{Engine, MemberAttributes, RangeRequest};
use libfuzzer_sys::fuzz_target;

/// The undamaged snapshot, read once. Without it the target cannot run: it says how to make it
/// and exits (not a panic, which libFuzzer would report as a finding).
fn snapshot() -> &'static [u8] {
    static SNAPSHOT: OnceLock<Vec<u8>> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let path = std::env::var_os("CAIRN_ETCD_SNAPSHOT").map_or_else(
            || concat!(env!("CARGO_MANIFEST_DIR"), "/target/etcd-snapshot.db").into(),
            std::path::PathBuf::from,
        );
        std::fs::read(&path).unwrap_or_else(|e| {
            eprintln!("cannot read {}: {e}; fuzz/etcd-snapshot.sh writes it", path.display());
            std::process::exit(2)
        })
    })
}

#[derive(Arbitrary, Debug)]
enum Input {
    Raw(Vec<u8>),
    Damage {
        edits: Vec<(u16, u8)>,
        cut: Option<u16>,
        extra: Vec<u8>,
    },
}

fuzz_target!(|input: Input| {
    let (bytes, pristine) = match input {
        Input::Raw(bytes) => (bytes, false),
        Input::Damage { edits, cut, extra } => {
            let snapshot = snapshot();
            let mut bytes = snapshot.to_vec();
            for (at, value) in &edits {
                let at = usize::from(*at) * bytes.len() / usize::from(u16::MAX);
                if let Some(b) = bytes.get_mut(at) {
                    *b = *value;
                }
            }
            if let Some(cut) = cut {
                bytes.truncate(usize::from(cut) * snapshot.len() / usize::from(u16::MAX));
            }
            bytes.extend_from_slice(&extra);
            let pristine = bytes == snapshot;
            (bytes, pristine)
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("snap.db");
    std::fs::write(&file, &bytes).expect("write");
    let member = dir.path().join("member");
    let members = BTreeMap::from([(1u64, MemberAttributes::default())]);
    match offline::import_etcd(&file, &member, &members, true) {
        Ok(()) => {
            // What restored opens, or fails to, without panicking.
            if let Ok(engine) = Engine::builder(&member).member(1).open() {
                let all = engine.range(&RangeRequest::all());
                if pristine {
                    assert_eq!(engine.current_revision(), 302);
                    assert_eq!(all.expect("range").count, 49);
                }
                let _ = engine.close();
            } else {
                assert!(!pristine, "the undamaged snapshot must open");
            }
        }
        Err(_) => {
            assert!(!pristine, "the undamaged snapshot must restore");
            assert!(!member.join("data").exists(), "a failed restore leaves its data behind");
        }
    }
});
