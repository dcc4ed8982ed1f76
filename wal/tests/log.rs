//! Behaviour of the log through its public API, on the simulated file system: appending,
//! rotation, truncation, release, group commit, poisoning and simulated crashes.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use cairn_wal::{Config, Durability, Error, LogIndex, Record, SimFs, Wal};

const DIR: &str = "/wal";

fn small() -> Config {
    Config {
        segment_size: 512,
        ..Config::default()
    }
}

fn open(fs: &SimFs, config: Config) -> (Vec<Record>, Wal) {
    let mut replay = Wal::open_with(Arc::new(fs.clone()), DIR, config).unwrap();
    let records = replay.by_ref().collect::<Result<Vec<_>, _>>().unwrap();
    (records, replay.finish().unwrap())
}

fn entry(index: u64, payload: &str) -> Record {
    Record::Entry {
        index: LogIndex(index),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
    }
}

fn append(wal: &Wal, records: Vec<Record>) {
    wal.append(records, Durability::Durable).unwrap().wait().unwrap();
}

fn segments(fs: &SimFs) -> Vec<String> {
    let mut names: Vec<String> = fs
        .file_names(Path::new(DIR))
        .into_iter()
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    names
}

#[test]
fn records_survive_reopen_across_many_segments() {
    let fs = SimFs::new();
    let (replayed, wal) = open(&fs, small());
    assert!(replayed.is_empty());
    let written: Vec<Record> = (1..=200).map(|i| entry(i, &format!("value-{i}"))).collect();
    for chunk in written.chunks(7) {
        append(&wal, chunk.to_vec());
    }
    drop(wal);
    assert!(
        segments(&fs).len() > 5,
        "512-byte segments must rotate: {:?}",
        segments(&fs)
    );
    let (replayed, _wal) = open(&fs, small());
    assert_eq!(replayed, written);
}

#[test]
fn append_next_assigns_contiguous_indexes() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    let a = wal
        .append_next(vec!["a".into(), "b".into()], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((a.first_index, a.last_index), (Some(LogIndex(1)), Some(LogIndex(2))));
    append(&wal, vec![entry(3, "c")]);
    let b = wal
        .append_next(vec!["d".into()], Durability::Buffered)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((b.first_index, b.last_index), (Some(LogIndex(4)), Some(LogIndex(4))));
}

#[test]
fn invalid_requests_fail_alone_and_write_nothing() {
    // A request that breaks contiguity is refused whole; the log goes on.
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, vec![entry(1, "a")]);
    type Case = (Vec<Record>, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (vec![entry(2, "ok"), entry(4, "gap")], |e| {
            matches!(
                e,
                Error::NonContiguous {
                    last: LogIndex(2),
                    got: LogIndex(4)
                }
            )
        }),
        (vec![entry(1, "again")], |e| matches!(e, Error::NonContiguous { .. })),
    ];
    for (records, expected) in cases {
        let err = wal.append(records, Durability::Durable).unwrap().wait().unwrap_err();
        assert!(expected(&err), "{err}");
    }
    append(&wal, vec![entry(2, "b")]);
    drop(wal);
    assert_eq!(open(&fs, small()).0, vec![entry(1, "a"), entry(2, "b")]);
}

#[test]
fn oversized_records_are_refused_before_queueing() {
    let fs = SimFs::new();
    let config = Config {
        max_record_bytes: 16,
        ..small()
    };
    let (_, wal) = open(&fs, config);
    let err = wal
        .append(vec![entry(1, "seventeen bytes!!")], Durability::Durable)
        .unwrap_err();
    assert!(matches!(err, Error::RecordTooLarge { size: 17, limit: 16 }), "{err}");
}

#[test]
fn a_truncation_past_the_end_restarts_the_log_there() {
    // A Raft member that installed a snapshot covering entries 1..=99 continues at 100.
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, vec![entry(1, "a"), entry(2, "b")]);
    let err = wal
        .append(vec![entry(100, "too soon")], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::NonContiguous { last: LogIndex(2), .. }), "{err}");
    wal.truncate_suffix(LogIndex(100)).unwrap().wait().unwrap();
    append(&wal, vec![entry(100, "c")]);
    let err = wal
        .append(vec![entry(3, "the old run")], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NonContiguous {
                last: LogIndex(100),
                ..
            }
        ),
        "{err}"
    );
    drop(wal);
    let expected = vec![
        entry(1, "a"),
        entry(2, "b"),
        Record::Truncate { from: LogIndex(100) },
        entry(100, "c"),
    ];
    assert_eq!(open(&fs, small()).0, expected);
}

#[test]
fn truncate_suffix_lets_raft_overwrite_a_conflicting_tail() {
    // Raft §5.3: a follower deletes a conflicting entry and all that follow it.
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, (1..=10).map(|i| entry(i, "old")).collect());
    wal.truncate_suffix(LogIndex(6)).unwrap().wait().unwrap();
    let err = wal
        .append(vec![entry(11, "x")], Durability::Durable)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(matches!(err, Error::NonContiguous { last: LogIndex(5), .. }), "{err}");
    append(&wal, vec![entry(6, "new"), entry(7, "new")]);
    drop(wal);
    let (replayed, _) = open(&fs, small());
    let mut expected: Vec<Record> = (1..=10).map(|i| entry(i, "old")).collect();
    expected.push(Record::Truncate { from: LogIndex(6) });
    expected.extend([entry(6, "new"), entry(7, "new")]);
    assert_eq!(replayed, expected);
}

#[test]
fn release_drops_old_segments_and_keeps_the_latest_state() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, vec![Record::State("hard-state-1".into())]);
    append(&wal, (1..=100).map(|i| entry(i, "0123456789")).collect());
    let before = segments(&fs).len();
    assert_eq!(
        wal.release_before(LogIndex(1)).unwrap(),
        0,
        "nothing is entirely below index 1"
    );
    let released = wal.release_before(LogIndex(60)).unwrap();
    assert!(released > 0 && released < before, "released {released} of {before}");
    drop(wal);
    let (replayed, wal) = open(&fs, small());
    // The state written before every released segment is carried, so it comes first.
    assert_eq!(replayed.first(), Some(&Record::State("hard-state-1".into())));
    let entries: Vec<u64> = replayed
        .iter()
        .filter_map(|r| match r {
            Record::Entry { index, .. } => Some(index.0),
            _ => None,
        })
        .collect();
    assert!(
        entries.first().is_some_and(|first| *first <= 60),
        "entries from 60 on must remain"
    );
    assert_eq!(entries.last(), Some(&100));
    assert!(entries.windows(2).all(|w| w[1] == w[0] + 1));
    // Releasing everything keeps the current segment, and the log continues.
    wal.release_before(LogIndex(u64::MAX)).unwrap();
    append(&wal, vec![entry(101, "after")]);
    drop(wal);
    assert_eq!(segments(&fs).len(), 1);
    let (replayed, _) = open(&fs, small());
    assert_eq!(replayed.first(), Some(&Record::State("hard-state-1".into())));
    assert_eq!(replayed.last(), Some(&entry(101, "after")));
}

#[test]
fn group_commit_makes_queued_appends_share_one_fsync() {
    // Requests queued while a sync is in progress are all made durable by the next one.
    let fs = SimFs::new();
    let (_, wal) = open(&fs, Config::default());
    let gate = fs.hold_syncs();
    let first = wal.append_next(vec!["first".into()], Durability::Durable).unwrap();
    gate.wait_for_blocked_sync();
    // The writer is inside the fsync for `first`: these all queue behind it.
    let queued: Vec<_> = (0..50)
        .map(|i| {
            wal.append_next(vec![Bytes::from(format!("queued-{i}"))], Durability::Durable)
                .unwrap()
        })
        .collect();
    let before = wal.stats().fsyncs;
    gate.release();
    first.wait().unwrap();
    let last = queued.into_iter().map(|t| t.wait().unwrap()).last().unwrap();
    assert_eq!(last.last_index, Some(LogIndex(51)));
    let stats = wal.stats();
    assert_eq!(stats.fsyncs - before, 2, "one fsync for `first`, one for all 50 queued");
    assert_eq!(stats.batch_records.max(), 50);
}

#[test]
fn buffered_appends_complete_without_waiting_for_a_sync() {
    // A buffered append is answered once written, even while a durable one waits on fsync.
    let fs = SimFs::new();
    let (_, wal) = open(&fs, Config::default());
    let gate = fs.hold_syncs();
    let durable = wal.append_next(vec!["durable".into()], Durability::Durable).unwrap();
    gate.wait_for_blocked_sync();
    let buffered = wal.append_next(vec!["buffered".into()], Durability::Buffered).unwrap();
    let durable = match durable.try_wait() {
        Err(pending) => pending,
        Ok(done) => panic!("completed before its fsync: {done:?}"),
    };
    gate.release();
    assert_eq!(buffered.wait().unwrap().last_index, Some(LogIndex(2)));
    assert_eq!(durable.wait().unwrap().last_index, Some(LogIndex(1)));
}

#[test]
fn buffered_appends_become_durable_with_the_next_sync() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, vec![entry(1, "durable")]);
    wal.append(vec![entry(2, "buffered")], Durability::Buffered)
        .unwrap()
        .wait()
        .unwrap();
    // A crash now loses the buffered entry, never the durable one.
    let crashed = fs.clone();
    let snapshot = SimFs::new();
    for name in fs.file_names(Path::new(DIR)) {
        let path = Path::new(DIR).join(&name);
        snapshot.write_file(&path, &fs.read_file(&path).unwrap());
    }
    crashed.crash_tearing(|_, _| 0);
    drop(wal);
    assert_eq!(open(&crashed, small()).0, vec![entry(1, "durable")]);
    // Without the crash, a sync makes it durable.
    let (replayed, wal) = open(&snapshot, small());
    assert_eq!(replayed.len(), 2);
    wal.sync().unwrap().wait().unwrap();
    snapshot.crash_tearing(|_, _| 0);
    drop(wal);
    assert_eq!(
        open(&snapshot, small()).0,
        vec![entry(1, "durable"), entry(2, "buffered")]
    );
}

#[test]
fn a_failed_fsync_poisons_the_log_until_reopened() {
    for fault in ["fsync", "write"] {
        let fs = SimFs::new();
        let (_, wal) = open(&fs, small());
        append(&wal, vec![entry(1, "safe")]);
        match fault {
            "fsync" => fs.fail_syncs_after(0),
            _ => fs.fail_writes_after(0),
        }
        let err = wal
            .append(vec![entry(2, "lost")], Durability::Durable)
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(matches!(err, Error::Poisoned { .. }), "{fault}: {err}");
        assert!(err.to_string().contains("reopen"), "{err}");
        fs.clear_faults();
        // Never retried: later calls fail at once, even though the disk works again.
        let later = wal.append(vec![entry(2, "later")], Durability::Durable).unwrap_err();
        assert!(matches!(later, Error::Poisoned { .. }), "{fault}: {later}");
        assert!(matches!(wal.sync().unwrap_err(), Error::Poisoned { .. }));
        drop(wal);
        fs.crash_tearing(|_, _| 0);
        let (replayed, _) = open(&fs, small());
        assert_eq!(replayed, vec![entry(1, "safe")], "{fault}");
    }
}

#[test]
fn tickets_can_be_awaited() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    let ticket = wal.append_next(vec!["async".into()], Durability::Durable).unwrap();
    let appended = pollster::block_on(ticket).unwrap();
    assert_eq!(appended.last_index, Some(LogIndex(1)));
}

#[test]
fn a_directory_is_opened_by_one_handle_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let wal = Wal::open(dir.path(), small()).unwrap().finish().unwrap();
    let err = Wal::open(dir.path(), small()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    drop(wal);
    Wal::open(dir.path(), small()).unwrap().finish().unwrap();
}

#[test]
fn real_files_roundtrip_with_preallocation() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        segment_size: 4096,
        ..Config::default()
    };
    let wal = Wal::open(dir.path(), config.clone()).unwrap().finish().unwrap();
    let written: Vec<Record> = (1..=100).map(|i| entry(i, "some bytes of payload")).collect();
    append(&wal, written.clone());
    wal.close().unwrap();
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    assert!(names.len() > 1);
    for name in &names[..names.len() - 1] {
        let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
        assert!(len >= 4096, "{name} is preallocated to the segment size, has {len}");
    }
    let replayed: Vec<Record> = Wal::open(dir.path(), config)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(replayed, written);
}

#[test]
fn corruption_before_the_tail_is_refused_and_finish_will_not_append_after_it() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, (1..=40).map(|i| entry(i, "payload payload")).collect());
    drop(wal);
    let first = Path::new(DIR).join(&segments(&fs)[0]);
    let mut bytes = fs.read_file(&first).unwrap();
    bytes[cairn_wal::SEGMENT_HEADER_LEN + cairn_wal::FRAME_HEADER_LEN] ^= 0x01; // first payload byte
    fs.write_file(&first, &bytes);
    let mut replay = Wal::open_with(Arc::new(fs.clone()), DIR, small()).unwrap();
    let err = replay.by_ref().find_map(Result::err).unwrap();
    match &err {
        Error::Corruption { segment, offset, .. } => {
            assert_eq!(segment, &first);
            assert_eq!(*offset, cairn_wal::SEGMENT_HEADER_LEN as u64);
        }
        other => panic!("expected corruption, got {other}"),
    }
    let refused = replay.finish().unwrap_err();
    assert!(matches!(refused, Error::Corruption { .. }), "{refused}");
}

#[test]
fn hostile_sequence_numbers_neither_panic_nor_wrap() {
    // Found by the wal_recovery fuzz target: segment sequence u64::MAX.
    let fs = SimFs::new();
    for first in [1u64, 2] {
        let h = cairn_wal::SegmentHeader {
            seq: cairn_wal::SegmentSeq(u64::MAX),
            first_index: LogIndex(first),
            crc_seed: 0,
        };
        fs.write_file(
            &Path::new(DIR).join(cairn_wal::segment_name(h.seq, h.first_index)),
            &h.encode(),
        );
    }
    let err = Wal::open_with(Arc::new(fs), DIR, small()).unwrap_err();
    assert!(matches!(err, Error::Corruption { .. }), "{err}");

    let fs = SimFs::new();
    let h = cairn_wal::SegmentHeader {
        seq: cairn_wal::SegmentSeq(u64::MAX),
        first_index: LogIndex(1),
        crc_seed: 0,
    };
    fs.write_file(
        &Path::new(DIR).join(cairn_wal::segment_name(h.seq, h.first_index)),
        &h.encode(),
    );
    let (_, wal) = open(&fs, small());
    let results: Vec<_> = (0..4)
        .map(|_| {
            wal.append_next(vec![Bytes::from(vec![7u8; 200])], Durability::Durable)
                .and_then(cairn_wal::Ticket::wait)
        })
        .collect();
    // The segment fills, rotation cannot number the next one: the log is poisoned, not wrapped.
    assert!(
        results.iter().any(|r| matches!(r, Err(Error::Poisoned { .. }))),
        "{results:?}"
    );
    drop(wal);
    let (replayed, _) = open(&fs, small());
    let acked = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        replayed.len(),
        acked,
        "every acknowledged entry, and only those, is there"
    );
}

/// Runs `f` on a thread named `name`, so that `SimFs::syncs_by` can tell its syncs apart.
fn on_thread<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(name.into())
            .spawn_scoped(s, f)
            .unwrap()
            .join()
            .unwrap()
    })
}

#[test]
fn an_append_here_on_an_idle_log_is_written_and_synced_by_the_caller() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    append(&wal, vec![entry(1, "queued")]);
    // Answered before the writer's thread lets go of the log: wait until it has.
    wal.wait_until_idle();
    let ticket = on_thread("appender", || {
        wal.append_here(vec![entry(2, "here")], Durability::Durable).unwrap()
    });
    assert_eq!(fs.syncs_by("appender"), 1, "the caller synced its own append");
    let appended = match ticket.try_wait() {
        Ok(done) => done.unwrap(),
        Err(_) => panic!("an inline append returned before it was durable"),
    };
    assert_eq!(appended.last_index, Some(LogIndex(2)));
    // The writer's thread goes on after it, in order.
    append(&wal, vec![entry(3, "queued again")]);
    fs.crash_tearing(|_, _| 0);
    drop(wal);
    assert_eq!(
        open(&fs, small()).0,
        vec![entry(1, "queued"), entry(2, "here"), entry(3, "queued again")]
    );
}

#[test]
fn an_append_here_while_the_writer_is_busy_queues_behind_it() {
    let fs = SimFs::new();
    let (_, wal) = open(&fs, small());
    let gate = fs.hold_syncs();
    let first = wal.append_next(vec!["first".into()], Durability::Durable).unwrap();
    gate.wait_for_blocked_sync();
    // The writer's thread is inside the fsync for `first`.
    let second = on_thread("appender", || {
        wal.append_here(vec![entry(2, "second")], Durability::Durable).unwrap()
    });
    let second = match second.try_wait() {
        Err(pending) => pending,
        Ok(done) => panic!("written beside a busy writer: {done:?}"),
    };
    gate.release();
    first.wait().unwrap();
    assert_eq!(second.wait().unwrap().last_index, Some(LogIndex(2)));
    assert_eq!(fs.syncs_by("appender"), 0);
    fs.crash_tearing(|_, _| 0);
    drop(wal);
    assert_eq!(open(&fs, small()).0, vec![entry(1, "first"), entry(2, "second")]);
}

#[test]
fn unsafe_no_fsync_acknowledges_appends_unsynced_so_a_machine_crash_loses_them() {
    let fs = SimFs::new();
    let config = Config {
        segment_size: 1 << 20,
        unsafe_no_fsync: true,
        ..Config::default()
    };
    let (_, wal) = open(&fs, config.clone());
    on_thread("appender", || {
        wal.append_here(vec![entry(1, "here")], Durability::Durable)
            .unwrap()
            .wait()
            .unwrap()
    });
    append(&wal, vec![entry(2, "queued")]);
    assert_eq!(fs.syncs_by("appender"), 0, "nothing synced on the caller's thread");
    // The process goes on: a clean reopen reads both back from the page cache.
    drop(wal);
    let (records, wal) = open(&fs, config.clone());
    assert_eq!(records, vec![entry(1, "here"), entry(2, "queued")]);
    append(&wal, vec![entry(3, "lost")]);
    // The machine crashes: what was never synced is gone, which is what the flag risks.
    fs.crash_tearing(|_, _| 0);
    drop(wal);
    let (records, _) = open(&fs, config);
    assert!(!records.contains(&entry(3, "lost")), "{records:?}");
}
