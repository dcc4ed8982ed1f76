//! Regression tests for wal bugs found while writing the crash and fixture tests, each through
//! the public API and stating the guarantee it checks. Each failed before the commit named in
//! its doc, which fixed the bug. (An open bug goes here too, `#[ignore]`d with its reason until
//! it is fixed.)

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cairn_wal::{Config, Durability, Error, LogIndex, Record, RecoveryMode, SimFs, Wal};

fn config(recovery: RecoveryMode) -> Config {
    Config {
        segment_size: Config::MIN_SEGMENT_SIZE,
        recovery,
        ..Config::default()
    }
}

fn entry(index: u64) -> Record {
    Record::Entry {
        index: LogIndex(index),
        payload: Bytes::from(format!("entry-{index}")),
    }
}

fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/wal").join(name);
    for entry in std::fs::read_dir(fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

/// "Corruption is loud. Recovery never silently skips a damaged record" (STYLE.md, recovery.rs).
///
/// Fixed in a0d1adf. Before, `Replay::finish` forgot an error the caller had already taken from
/// the iterator (which is fused after it) and started a writer on the corrupt log. The writer
/// appended at the offset where replay stopped in the damaged segment 0, but into the *last*
/// segment file and with segment 0's crc chain: entry 5 overwrote bytes 232..264 of segment 2.
#[test]
fn finish_after_a_replay_error_must_fail() {
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
        let (_tmp, dir) = copy_fixture("corrupt");
        let mut replay = Wal::open(&dir, config(mode)).unwrap();
        let err = replay.by_ref().find_map(Result::err);
        assert!(matches!(err, Some(Error::Corruption { offset: 232, .. })), "{err:?}");
        let seg2 = dir.join("0000000000000002-0000000000000019.wal");
        let before = std::fs::read(&seg2).unwrap();
        match replay.finish() {
            Err(Error::Corruption { .. }) => {}
            Err(other) => panic!("{mode:?}: expected the corruption again, got {other}"),
            Ok(wal) => {
                wal.append(vec![entry(5)], Durability::Durable).unwrap().wait().unwrap();
                wal.close().unwrap();
                let after = std::fs::read(&seg2).unwrap();
                panic!(
                    "{mode:?}: finish() opened a corrupt log for appending; appending entry 5 then \
                     rewrote segment 2 bytes 232..264 ({} bytes changed)",
                    before.iter().zip(&after).filter(|(a, b)| a != b).count()
                );
            }
        }
    }
}

/// Strict mode: "any damage, a torn tail included, is an error" (config.rs, `RecoveryMode`).
///
/// Fixed in a0d1adf; the same bug in strict mode: `finish` after the iterator yielded
/// `TornTail` started the writer, which overwrote the torn frame without a `.broken` copy.
#[test]
fn strict_finish_after_a_torn_tail_must_fail() {
    let (_tmp, dir) = copy_fixture("torn");
    let mut replay = Wal::open(&dir, config(RecoveryMode::Strict)).unwrap();
    let err = replay.by_ref().find_map(Result::err);
    assert!(matches!(err, Some(Error::TornTail { offset: 392, .. })), "{err:?}");
    match replay.finish() {
        Err(Error::TornTail { .. }) => {}
        Err(other) => panic!("expected the torn tail again, got {other}"),
        Ok(_) => panic!("finish() opened the log for appending despite the torn tail, in strict mode"),
    }
}

/// "The log carries the latest state into every new segment, so releasing old segments never
/// loses it" (types.rs, `Record::State`).
///
/// Fixed in 284c2cb. Before, rotation installed the new segment (header synced, renamed,
/// directory synced) and wrote the carried state only with the next group: a crash before that
/// group was synced left a segment without the state, the writer never carried it again, and
/// releasing the older segments lost a durably acknowledged state.
#[test]
fn state_survives_a_crash_after_rotation_and_a_release() {
    let fs = SimFs::new();
    let dir = Path::new("/wal");
    let open = || Wal::open_with(Arc::new(fs.clone()), dir, config(RecoveryMode::TolerateTornTail)).unwrap();
    let hard_state = Record::State(Bytes::from_static(b"hs"));

    let wal = open().finish().unwrap();
    wal.append(vec![hard_state.clone()], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap();
    for i in 1..=13 {
        // Segment 0: header 40 + state 32 + 13 entries of 32 = 488 of 512 bytes.
        wal.append(vec![entry(i)], Durability::Durable).unwrap().wait().unwrap();
    }
    // Entry 14 rotates to segment 1; it and the carried state are written, not synced.
    wal.append(vec![entry(14)], Durability::Buffered)
        .unwrap()
        .wait()
        .unwrap();
    drop(wal);
    fs.crash_tearing(|_, _| 0); // power loss: every unsynced byte is lost

    let records: Vec<Record> = open().collect::<Result<_, _>>().unwrap();
    assert_eq!(records.first(), Some(&hard_state), "the durable state was replayed");
    let wal = open().finish().unwrap();
    wal.append(vec![entry(14)], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(wal.release_before(LogIndex(14)).unwrap(), 1, "segment 0 released");
    wal.close().unwrap();

    let records: Vec<Record> = open().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        records,
        vec![hard_state, entry(14)],
        "the state must survive the release"
    );
}
