//! The real crash test (STYLE.md, "Tests"): kill -9 a process appending to the log, reopen,
//! and check every acknowledged write.
//!
//! Each iteration starts `wal-crash-child` on the same directory, so the log accumulates
//! across kills and every start recovers what the previous kill left. The child prints
//! `ack <index>` once an entry is fdatasynced; after a random number of acks the parent sends
//! SIGKILL, with no sleep, so the kill lands wherever the appenders, the group-commit writer and
//! the preallocation thread happen to be (mid-write, mid-fsync, mid-rotation). The acks still
//! in the pipe after the kill count too: each was printed after its fsync.
//!
//! After every kill the parent replays the log itself and checks: no corruption (a torn tail is
//! allowed and counted, nothing else), entries contiguous from 1, each payload equal to
//! `crash_payload(index)`, every index ever acknowledged present, and nothing recovered by an
//! earlier replay lost (the child's `ready` line reports what its own replay found, which must
//! equal what the parent found before it). Every fourth child validates its replay too.
//!
//! `CAIRN_CRASH_SEED` repeats a run's random choices (the seed is printed; the kill timing is
//! still up to the scheduler), `CAIRN_CRASH_ITERATIONS` changes the number of kills (default 40; a
//! long run starts a new log every 50 kills), and `CAIRN_CRASH_KEEP=1` keeps the log directories
//! for inspection.

use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::Duration;

use cairn_tests::child::run_until_killed;
use cairn_tests::{check_crash_log, crash_config};
use cairn_wal::{Config, Error, RecoveryMode, Wal};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD: &str = env!("CARGO_BIN_EXE_wal-crash-child");
const SIGKILL: i32 = 9;
/// Not a timing assertion: only a guard so that a hung child (a deadlocked writer) fails the
/// test instead of hanging it forever. An iteration normally takes well under a second.
const HANG_TIMEOUT: Duration = Duration::from_secs(300);
/// Kills before the test starts over on a new log (only long runs get there).
const KILLS_PER_LOG: usize = 50;

/// How one child process is run.
struct ChildSpec<'a> {
    dir: &'a Path,
    threads: u32,
    /// Whether it validates its replay.
    validate: bool,
    /// Kill it once it has acknowledged this many entries.
    kill_after: usize,
}

/// What one child process did before it died.
struct ChildRun {
    /// The last index its replay found (0 for an empty log).
    ready: u64,
    /// The indexes it acknowledged, in the order it printed them.
    acks: Vec<u64>,
    status: ExitStatus,
    stderr: String,
}

/// Runs the child until it has acknowledged `spec.kill_after` entries, then kills it.
fn run_child(spec: &ChildSpec<'_>, stderr_path: &Path) -> ChildRun {
    let mut command = Command::new(CHILD);
    command.arg(spec.dir).arg(spec.threads.to_string());
    if spec.validate {
        command.arg("--validate");
    }
    let mut ready = None;
    let mut acks = Vec::new();
    let ended = run_until_killed(command, stderr_path, HANG_TIMEOUT, |line| {
        match line.split_once(' ') {
            Some(("ready", n)) if ready.is_none() => ready = Some(n.parse::<u64>().unwrap()),
            Some(("ack", n)) if ready.is_some() => acks.push(n.parse::<u64>().unwrap()),
            _ => panic!("unexpected line from the child: {line:?}"),
        }
        acks.len() >= spec.kill_after
    });
    let (status, stderr) = (ended.status, ended.stderr);
    ChildRun {
        ready: ready.unwrap_or_else(|| panic!("the child died before replaying ({status}); stderr:\n{stderr}")),
        acks,
        status,
        stderr,
    }
}

#[test]
fn kill_9_loses_no_acknowledged_append() {
    let seed = std::env::var("CAIRN_CRASH_SEED")
        .map(|s| s.parse::<u64>().expect("CAIRN_CRASH_SEED must be a u64"))
        .unwrap_or_else(|_| rand::random());
    let iterations: usize = std::env::var("CAIRN_CRASH_ITERATIONS")
        .map(|s| s.parse().expect("CAIRN_CRASH_ITERATIONS must be a number"))
        .unwrap_or(40);
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::Builder::new().prefix("cairn-wal-crash-").tempdir().unwrap();
    let mut dir = tmp.path().join("wal-0");
    let stderr_path = tmp.path().join("child.stderr");
    eprintln!(
        "wal_crash: seed {seed} (CAIRN_CRASH_SEED={seed} repeats it), {iterations} kills, logs in {}",
        tmp.path().display()
    );
    let strict = Config {
        recovery: RecoveryMode::Strict,
        ..crash_config()
    };

    let mut acked = BTreeSet::new();
    let mut recovered_last = 0u64;
    let mut torn_tails = 0;
    let mut total_acks = 0;
    let mut most_segments = 0;
    for iteration in 0..iterations {
        if iteration > 0 && iteration % KILLS_PER_LOG == 0 {
            // A fresh log now and then keeps long runs linear: every start replays the log.
            dir = tmp.path().join(format!("wal-{iteration}"));
            acked.clear();
            recovered_last = 0;
        }
        let threads = rng.random_range(1..=4);
        let kill_after = rng.random_range(1..=300);
        let validate = iteration % 4 == 3;
        let spec = ChildSpec {
            dir: &dir,
            threads,
            validate,
            kill_after,
        };
        let run = run_child(&spec, &stderr_path);
        let context = format!(
            "iteration {iteration} (seed {seed}, {threads} threads, kill after {kill_after} acks, \
             validate {validate}): child {}; stderr:\n{}",
            run.status, run.stderr
        );
        assert_eq!(
            run.status.signal(),
            Some(SIGKILL),
            "the child died on its own: {context}"
        );
        assert!(run.acks.len() >= kill_after, "{context}");
        assert_eq!(
            run.ready, recovered_last,
            "the child's replay must find what the last replay found: {context}"
        );
        for &index in &run.acks {
            assert!(
                index > run.ready,
                "ack {index} at or before the replayed end: {context}"
            );
            assert!(acked.insert(index), "index {index} acknowledged twice: {context}");
            total_acks += 1;
        }

        // Strict mode tells a torn tail (allowed after a crash) from anything worse.
        match Wal::open(&dir, strict.clone()).unwrap().find_map(Result::err) {
            None => {}
            Some(Error::TornTail { .. }) => torn_tails += 1,
            Some(e) => panic!("strict replay: {e}; {context}"),
        }
        let mut replay = Wal::open(&dir, crash_config()).unwrap();
        let log = check_crash_log(replay.by_ref()).unwrap_or_else(|e| panic!("replay: {e}; {context}"));
        assert_eq!(log.first, Some(1), "{context}");
        let last = log.last.unwrap_or(0);
        let max_acked = acked.last().copied().unwrap_or(0);
        assert!(
            max_acked <= last,
            "acknowledged entry {max_acked} lost: the log ends at {last}; {context}"
        );
        assert!(last >= recovered_last, "{context}");
        recovered_last = last;
        most_segments = most_segments.max(segment_count(&dir));
        // Half the time the parent's open repairs a torn tail, half the time the next child's.
        if rng.random_bool(0.5) {
            drop(replay.finish().unwrap());
        }
    }

    eprintln!(
        "wal_crash: {total_acks} acks over {iterations} kills, up to {most_segments} segments in a log, \
         {torn_tails} torn tails seen"
    );
    if iterations >= 40 {
        // Some 6,000 acks of 16..716 bytes into 64 KiB segments: rotation is certain.
        assert!(most_segments > 1, "the test must rotate segments");
    }
    if std::env::var_os("CAIRN_CRASH_KEEP").is_some() {
        eprintln!("wal_crash: kept {}", tmp.keep().display());
    }
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".wal"))
        .count()
}

/// A sanity check of the checker itself: a test that cannot fail is a defect.
#[test]
fn check_crash_log_rejects_a_lost_entry_and_a_wrong_payload() {
    use cairn_tests::crash_payload;
    use cairn_wal::{LogIndex, Record};
    let entry = |i: u64| {
        Ok(Record::Entry {
            index: LogIndex(i),
            payload: crash_payload(i),
        })
    };
    assert!(check_crash_log(vec![entry(1), entry(2)]).is_ok());
    assert!(check_crash_log(vec![entry(1), entry(3)]).is_err());
    let wrong = Ok(Record::Entry {
        index: LogIndex(2),
        payload: crash_payload(3),
    });
    assert!(check_crash_log(vec![entry(1), wrong]).is_err());
    let corrupt = Err(Error::Closed);
    assert!(check_crash_log(vec![entry(1), corrupt]).is_err());
}
