//! Recovery of committed, damaged logs (`tests/fixtures/wal/`, described in its README and made
//! by `src/bin/make-wal-fixtures.rs`): the exact records, error, segment and offset each one
//! recovers to. Being bytes on disk rather than generated at test time, they also catch a change
//! to the format or to recovery that reads an old log differently.
//!
//! The rules checked are the recovery module's: a torn tail in the last segment is truncated in
//! tolerant mode (after keeping a `.broken` copy) and an error in strict mode; damage before the
//! tail is corruption in both modes, naming segment and offset, and recovery neither skips it
//! nor touches the directory; `repair` truncates at the damage and sets later segments aside.

use std::path::{Path, PathBuf};

use cairn_wal::{repair, Config, CorruptionReason, Durability, Error, FrameError, Record, RecoveryMode, Wal};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wal");

const TORN_SEG0: &str = "0000000000000000-0000000000000001.wal";
const TORN_SEG1: &str = "0000000000000001-000000000000000b.wal";
/// Where entry 20, the torn last frame, starts in `TORN_SEG1`.
const TORN_OFFSET: u64 = 392;

const CORRUPT_SEG0: &str = "0000000000000000-0000000000000001.wal";
const CORRUPT_SEG1: &str = "0000000000000001-000000000000000d.wal";
const CORRUPT_SEG2: &str = "0000000000000002-0000000000000019.wal";
/// Where entry 5, the damaged frame, starts in `CORRUPT_SEG0`.
const CORRUPT_OFFSET: u64 = 232;

fn config(recovery: RecoveryMode) -> Config {
    Config {
        segment_size: Config::MIN_SEGMENT_SIZE,
        recovery,
        ..Config::default()
    }
}

/// Copies fixture `name` into a fresh directory: opening a log may change it.
fn copy_fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(Path::new(FIXTURES).join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (tmp, dir)
}

fn fixture_bytes(name: &str, segment: &str) -> Vec<u8> {
    std::fs::read(Path::new(FIXTURES).join(name).join(segment)).unwrap()
}

/// The file names in `dir`, sorted, without the lock file.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "LOCK")
        .collect();
    names.sort();
    names
}

fn trim_trailing_zeros(bytes: &[u8]) -> &[u8] {
    let len = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    &bytes[..len]
}

/// `bytes[..cut]` followed by zeros up to the segment size: a segment truncated and
/// preallocated again.
fn cut_at(bytes: &[u8], cut: u64) -> Vec<u8> {
    let mut out = bytes[..cut as usize].to_vec();
    out.resize(Config::MIN_SEGMENT_SIZE as usize, 0);
    out
}

use cairn_tests::fixtures::{entry, state};

/// Everything before the torn entry 20: the carried copy of the second state at the head of
/// segment 1 is not replayed again.
fn torn_survivors() -> Vec<Record> {
    let mut records = vec![state("hard-state term=1 vote=1 commit=0")];
    records.extend((1..=10).map(entry));
    records.push(state("hard-state term=2 vote=3 commit=10"));
    records.extend((11..=19).map(entry));
    records
}

/// Everything before the damaged entry 5.
fn corrupt_survivors() -> Vec<Record> {
    let mut records = vec![state("hard-state term=1 vote=1 commit=0")];
    records.extend((1..=4).map(entry));
    records
}

/// Replays the whole log: the records before the first error, and that error.
fn replay(dir: &Path, recovery: RecoveryMode) -> (Vec<Record>, Option<Error>) {
    let mut records = Vec::new();
    for record in Wal::open(dir, config(recovery)).unwrap() {
        match record {
            Ok(r) => records.push(r),
            Err(e) => return (records, Some(e)),
        }
    }
    (records, None)
}

fn assert_corruption_at_entry_5(err: Option<Error>, dir: &Path) {
    match err {
        Some(Error::Corruption {
            segment,
            offset,
            reason: CorruptionReason::Frame(FrameError::Crc { .. }),
        }) => {
            assert_eq!(segment, dir.join(CORRUPT_SEG0));
            assert_eq!(offset, CORRUPT_OFFSET);
        }
        other => panic!("expected a crc corruption of entry 5, got {other:?}"),
    }
}

#[test]
fn fixtures_are_the_documented_files() {
    // The committed bytes, not a regenerated copy, are what the other tests check.
    assert_eq!(file_names(&Path::new(FIXTURES).join("torn")), [TORN_SEG0, TORN_SEG1]);
    assert_eq!(
        file_names(&Path::new(FIXTURES).join("corrupt")),
        [CORRUPT_SEG0, CORRUPT_SEG1, CORRUPT_SEG2]
    );
}

#[test]
fn torn_tail_is_an_error_in_strict_mode() {
    let (_tmp, dir) = copy_fixture("torn");
    let (records, err) = replay(&dir, RecoveryMode::Strict);
    assert_eq!(records, torn_survivors());
    match err {
        Some(Error::TornTail {
            segment,
            offset,
            reason: FrameError::Crc { .. },
        }) => {
            assert_eq!(segment, dir.join(TORN_SEG1));
            assert_eq!(offset, TORN_OFFSET);
        }
        other => panic!("expected a torn tail at entry 20, got {other:?}"),
    }
    assert!(matches!(
        Wal::open(&dir, config(RecoveryMode::Strict)).unwrap().finish(),
        Err(Error::TornTail { .. })
    ));
    // Strict mode leaves the directory as it was.
    assert_eq!(file_names(&dir), [TORN_SEG0, TORN_SEG1]);
    assert_eq!(
        std::fs::read(dir.join(TORN_SEG1)).unwrap(),
        fixture_bytes("torn", TORN_SEG1)
    );
}

#[test]
fn torn_tail_is_truncated_in_tolerant_mode() {
    let (_tmp, dir) = copy_fixture("torn");
    let (records, err) = replay(&dir, RecoveryMode::TolerateTornTail);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(records, torn_survivors());

    // Replaying alone changes nothing; finish() truncates, keeping a copy first.
    assert_eq!(file_names(&dir), [TORN_SEG0, TORN_SEG1]);
    drop(
        Wal::open(&dir, config(RecoveryMode::TolerateTornTail))
            .unwrap()
            .finish()
            .unwrap(),
    );
    let broken = format!("{TORN_SEG1}.broken");
    assert_eq!(file_names(&dir), [TORN_SEG0, TORN_SEG1, broken.as_str()]);
    let original = fixture_bytes("torn", TORN_SEG1);
    assert_eq!(
        std::fs::read(dir.join(&broken)).unwrap(),
        trim_trailing_zeros(&original),
        "the .broken copy holds the segment as found (without its zero tail)"
    );
    assert_eq!(
        std::fs::read(dir.join(TORN_SEG1)).unwrap(),
        cut_at(&original, TORN_OFFSET)
    );
    assert_eq!(
        std::fs::read(dir.join(TORN_SEG0)).unwrap(),
        fixture_bytes("torn", TORN_SEG0)
    );

    // The repaired log opens the same way again, even strictly, and continues where it ends.
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
        let (again, err) = replay(&dir, mode);
        assert!(err.is_none(), "{mode:?}: {err:?}");
        assert_eq!(again, torn_survivors(), "{mode:?}");
    }
    let wal = Wal::open(&dir, config(RecoveryMode::Strict)).unwrap().finish().unwrap();
    wal.append(vec![entry(20)], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap();
    wal.close().unwrap();
    let (records, err) = replay(&dir, RecoveryMode::Strict);
    assert!(err.is_none(), "{err:?}");
    let mut expected = torn_survivors();
    expected.push(entry(20));
    assert_eq!(records, expected);
}

#[test]
fn corruption_is_an_error_in_both_modes_and_changes_nothing() {
    for mode in [RecoveryMode::TolerateTornTail, RecoveryMode::Strict] {
        let (_tmp, dir) = copy_fixture("corrupt");
        let (records, err) = replay(&dir, mode);
        assert_eq!(records, corrupt_survivors(), "{mode:?}");
        assert_corruption_at_entry_5(err, &dir);

        let err = Wal::open(&dir, config(mode)).unwrap().finish().err();
        assert_corruption_at_entry_5(err, &dir);
        assert_eq!(file_names(&dir), [CORRUPT_SEG0, CORRUPT_SEG1, CORRUPT_SEG2], "{mode:?}");
        for seg in [CORRUPT_SEG0, CORRUPT_SEG1, CORRUPT_SEG2] {
            assert_eq!(
                std::fs::read(dir.join(seg)).unwrap(),
                fixture_bytes("corrupt", seg),
                "{mode:?}: {seg} changed"
            );
        }
    }
}

#[test]
fn repair_truncates_at_the_damage_and_sets_later_segments_aside() {
    let (_tmp, dir) = copy_fixture("corrupt");
    let report = repair(&dir, config(RecoveryMode::TolerateTornTail)).unwrap();
    assert_eq!(report.truncated, Some((dir.join(CORRUPT_SEG0), CORRUPT_OFFSET)));
    assert_eq!(report.set_aside, [dir.join(CORRUPT_SEG2), dir.join(CORRUPT_SEG1)]);

    let broken = |seg: &str| format!("{seg}.broken");
    assert_eq!(
        file_names(&dir),
        [
            CORRUPT_SEG0.to_string(),
            broken(CORRUPT_SEG0),
            broken(CORRUPT_SEG1),
            broken(CORRUPT_SEG2)
        ]
    );
    let seg0 = fixture_bytes("corrupt", CORRUPT_SEG0);
    assert_eq!(
        std::fs::read(dir.join(CORRUPT_SEG0)).unwrap(),
        cut_at(&seg0, CORRUPT_OFFSET)
    );
    assert_eq!(
        std::fs::read(dir.join(broken(CORRUPT_SEG0))).unwrap(),
        trim_trailing_zeros(&seg0)
    );
    for seg in [CORRUPT_SEG1, CORRUPT_SEG2] {
        assert_eq!(
            std::fs::read(dir.join(broken(seg))).unwrap(),
            fixture_bytes("corrupt", seg)
        );
    }

    let (records, err) = replay(&dir, RecoveryMode::Strict);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(records, corrupt_survivors());

    // A repaired log is healthy: repairing it again does nothing, and it takes entry 5 next.
    let again = repair(&dir, config(RecoveryMode::Strict)).unwrap();
    assert_eq!((again.truncated, again.set_aside), (None, vec![]));
    let wal = Wal::open(&dir, config(RecoveryMode::Strict)).unwrap().finish().unwrap();
    wal.append(vec![entry(5)], Durability::Durable).unwrap().wait().unwrap();
    wal.close().unwrap();
    let (records, err) = replay(&dir, RecoveryMode::Strict);
    assert!(err.is_none(), "{err:?}");
    let mut expected = corrupt_survivors();
    expected.push(entry(5));
    assert_eq!(records, expected);
}
