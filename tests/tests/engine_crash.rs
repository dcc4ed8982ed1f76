//! The engine's real crash test (STYLE.md, "Tests"): kill -9 a process writing to an `Engine`,
//! reopen, and check every acknowledged write, compaction and compare-and-swap.
//!
//! Each iteration starts `engine-crash-child` on the same directory, so the log and the store's
//! history accumulate across kills and every start replays what the previous kill left. The
//! child prints one line per acknowledged request (the protocol is in
//! `cairn_tests::engine_crash`); after a random number of acknowledged writes the parent sends
//! SIGKILL, with no sleep, so the kill lands wherever the writers, the apply thread, the WAL's
//! group-commit writer and its preallocation happen to be. Lines still in the pipe after the
//! kill count too: each was printed after the engine answered.
//!
//! After every kill the parent opens the engine itself and checks, for every line any child
//! ever printed:
//! 1. a put reads back at its revision with its value and `mod_revision == revision`, a delete
//!    reads back as absent at its revision, and a compare-and-swap finds the counter as it said
//!    (at its revision, and just before it for a successful one), unless that revision is below
//!    the compacted one, where the read must fail with `Error::Compacted`;
//! 2. the current revision is at least every revision answered;
//! 3. the compacted revision is at least the highest acknowledged compaction (a read just below
//!    it fails with `Error::Compacted`), and is one a child asked for;
//! 4. a second open finds exactly the same current and compacted revisions, HashKV and full
//!    range at every revision still readable (replay is deterministic), and every revision that
//!    the previous iteration's open could read reads the same now (nothing recovered is lost or
//!    changed, by a crash or by compaction);
//! 5. writes have unique revisions, and each writer thread's revisions never go back;
//! 6. leases: an acknowledged grant whose revoke was never asked for is still there (listed
//!    by `leases()`, TTL left), with every key acknowledged under it attached (`lease_time_to_live`)
//!    and current; an acknowledged revoke's lease is gone (TTL -1) and its keys are deleted at
//!    the revoke's revision (present just before it) and at the current one; a revoke asked for
//!    but not acknowledged left either of the two; and every lease the engine has (acknowledged
//!    or not) holds only keys under its own prefix. A second open finds the same leases with the
//!    same keys.
//!
//! The child's `ready` line reports the revision its own replay found, which must equal what
//! the parent found before it.
//!
//! `CAIRN_CRASH_SEED` repeats a run's random choices (the seed is printed; the kill timing is
//! still up to the scheduler), `CAIRN_CRASH_ITERATIONS` changes the number of kills (default 30),
//! and `CAIRN_CRASH_KEEP=1` keeps the directory for inspection.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use cairn_engine::{Engine, Error, HashKv, KeyValue, RangeRequest};
use cairn_tests::child::run_until_killed;
use cairn_tests::engine_crash::{self, Line, COUNTER, LEASE_TTL};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CHILD: &str = env!("CARGO_BIN_EXE_engine-crash-child");
const SIGKILL: i32 = 9;
/// Not a timing assertion: only a guard so that a hung child (a deadlocked writer) fails the
/// test instead of hanging it forever. An iteration normally takes well under a second.
const HANG_TIMEOUT: Duration = Duration::from_secs(300);

/// How one child process is run.
struct ChildSpec<'a> {
    dir: &'a Path,
    threads: u32,
    compact_every: u64,
    seed: u64,
    prefix: String,
    /// Kill it once it has acknowledged this many write requests.
    kill_after: usize,
}

/// What one child process did before it died.
struct ChildRun {
    /// The current revision its open found.
    ready: i64,
    /// Everything it printed after `ready`, in order.
    lines: Vec<Line>,
    writes: usize,
    status: ExitStatus,
    stderr: String,
}

/// Runs the child until it has acknowledged `spec.kill_after` writes, then kills it.
fn run_child(spec: &ChildSpec<'_>, stderr_path: &Path) -> ChildRun {
    let mut command = Command::new(CHILD);
    command
        .arg(spec.dir)
        .arg(spec.threads.to_string())
        .arg(spec.compact_every.to_string())
        .arg(spec.seed.to_string())
        .arg(&spec.prefix);
    let mut ready = None;
    let mut lines = Vec::new();
    let mut writes = 0;
    let ended = run_until_killed(command, stderr_path, HANG_TIMEOUT, |text| {
        let line: Line = text.parse().unwrap_or_else(|e| panic!("from the child: {e}"));
        match line {
            Line::Ready { revision } if ready.is_none() => ready = Some(revision),
            Line::Ready { .. } => panic!("a second ready line from the child: {text:?}"),
            _ if ready.is_none() => panic!("a line before ready from the child: {text:?}"),
            line => {
                writes += usize::from(line.write().is_some());
                lines.push(line);
            }
        }
        writes >= spec.kill_after
    });
    let (status, stderr) = (ended.status, ended.stderr);
    ChildRun {
        ready: ready
            .unwrap_or_else(|| panic!("the child died before opening the engine ({status}); stderr:\n{stderr}")),
        lines,
        writes,
        status,
        stderr,
    }
}

/// Everything the children promised, over all iterations.
#[derive(Default)]
struct Promises {
    /// Every line after `ready`, with the iteration that printed it.
    lines: Vec<(usize, Line)>,
    /// The revision of every write that changed the store, with the line (for uniqueness).
    changed: BTreeMap<i64, String>,
    /// Every revision a child asked to compact at, acknowledged or not.
    compactions_asked: BTreeSet<i64>,
    /// The highest acknowledged compaction (0 for none).
    compacted: i64,
    /// The highest revision answered.
    revision: i64,
    /// Every acknowledged grant, by lease ID.
    leases: BTreeMap<i64, LeasePromise>,
}

/// What the children said about one lease.
#[derive(Debug, Default)]
struct LeasePromise {
    /// The keys acknowledged as put under it.
    keys: BTreeSet<String>,
    /// A revoke was asked for (and may have landed).
    revoking: bool,
    /// The revision of its acknowledged revoke.
    revoked: Option<i64>,
}

/// What one open of the engine finds.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    current: i64,
    compacted: i64,
    /// etcd's HashKV at the current revision: a hash of all the history kept.
    hash: Option<HashKv>,
    /// The full range at every revision from `max(compacted, 1)` to `current`.
    history: BTreeMap<i64, Vec<KeyValue>>,
    /// Every lease: its ID, granted TTL and keys, sorted (the TTL left depends on the time).
    leases: Vec<(i64, i64, Vec<bytes::Bytes>)>,
}

fn read(engine: &Engine, key: &str, revision: i64) -> Result<Option<KeyValue>, Error> {
    assert!(revision > 0, "revision 0 reads the current revision");
    let response = engine.range(&RangeRequest {
        key: key.as_bytes().to_vec(),
        revision,
        ..RangeRequest::default()
    })?;
    assert!(response.kvs.len() <= 1, "one key read as {:?}", response.kvs);
    Ok(response.kvs.into_iter().next())
}

fn read_all(engine: &Engine, revision: i64) -> Vec<KeyValue> {
    engine
        .range(&RangeRequest::all().at_revision(revision))
        .unwrap_or_else(|e| panic!("full range at {revision}: {e}"))
        .kvs
}

fn snapshot(engine: &Engine) -> Snapshot {
    let current = engine.current_revision();
    let hash = engine
        .maintenance()
        .hash_kv(0)
        .unwrap_or_else(|e| panic!("hash_kv: {e}"));
    assert_eq!(hash.hash_revision, current, "{hash:?}");
    let compacted = hash.compact_revision;
    let history = (compacted.max(1)..=current)
        .map(|rev| (rev, read_all(engine, rev)))
        .collect();
    let mut ids = engine.leases().list();
    ids.sort_unstable();
    let leases = ids
        .into_iter()
        .map(|id| {
            let status = engine.leases().time_to_live(id, true);
            let mut keys = status.keys;
            keys.sort();
            (id, status.granted_ttl, keys)
        })
        .collect();
    Snapshot {
        current,
        compacted,
        hash: Some(hash),
        history,
        leases,
    }
}

/// Opens the engine, takes its snapshot and closes it again.
fn open_snapshot(dir: &Path) -> Snapshot {
    let engine = Engine::open(dir, engine_crash::config()).unwrap_or_else(|e| panic!("open: {e}"));
    let snapshot = snapshot(&engine);
    engine.close().unwrap();
    snapshot
}

/// An engine reopened after a kill, as the checks see it: compacted at `compacted`, with the
/// iteration's `context` for a failure's message.
struct Reopened<'a> {
    engine: &'a Engine,
    compacted: i64,
    context: &'a str,
}

/// Checks one promise (check 1 of the module docs), printed in `iteration`, against the
/// reopened engine.
fn check_line(reopened: &Reopened<'_>, iteration: usize, line: &Line) {
    let Reopened {
        engine,
        compacted,
        context,
    } = *reopened;
    // A read below the compacted revision must fail, and say so.
    let readable = |key: &str, revision: i64| match read(engine, key, revision) {
        Ok(found) => Some(found),
        Err(Error::Compacted { .. }) if revision < compacted => None,
        Err(e) => panic!("`{line}` (iteration {iteration}): reading {key} at {revision}: {e}; {context}"),
    };
    let whence = || format!("(iteration {iteration}); {context}");
    let counter = |kv: &Option<KeyValue>| kv.as_ref().map(|kv| (kv.mod_revision, kv.value.clone()));
    match line {
        Line::Put { revision, key, tag, .. } => {
            if let Some(found) = readable(key, *revision) {
                let found = found.as_ref().map(|kv| (kv.mod_revision, kv.value.clone(), kv.lease));
                let want = (*revision, engine_crash::value(tag), 0);
                assert_eq!(found, Some(want), "acknowledged `{line}` lost or changed {}", whence());
            }
        }
        Line::LeasePut {
            revision,
            lease,
            key,
            tag,
            ..
        } => {
            if let Some(found) = readable(key, *revision) {
                let found = found.as_ref().map(|kv| (kv.mod_revision, kv.value.clone(), kv.lease));
                let want = (*revision, engine_crash::value(tag), *lease);
                assert_eq!(found, Some(want), "acknowledged `{line}` lost or changed {}", whence());
            }
        }
        Line::Delete { revision, key, .. } => {
            // A delete of nothing on a never-written store answers revision 0: nothing to read.
            if *revision > 0 {
                if let Some(found) = readable(key, *revision) {
                    assert_eq!(found, None, "acknowledged `{line}` lost {}", whence());
                }
            }
        }
        Line::CasSucceeded {
            revision,
            prev_mod,
            value,
            ..
        } => {
            if let Some(found) = readable(COUNTER, *revision) {
                let want = (*revision, value.to_string().into());
                assert_eq!(
                    counter(&found),
                    Some(want),
                    "acknowledged `{line}` lost or changed {}",
                    whence()
                );
            }
            // The compare saw the store as of the revision before.
            if *revision > 1 {
                if let Some(found) = readable(COUNTER, revision - 1) {
                    let want = (*prev_mod > 0).then(|| (*prev_mod, (value - 1).to_string().into()));
                    assert_eq!(counter(&found), want, "`{line}`: the counter before it {}", whence());
                }
            }
        }
        Line::CasFailed {
            revision,
            seen_mod,
            seen_value,
            ..
        } => {
            if let Some(found) = readable(COUNTER, *revision) {
                let want = (*seen_mod > 0).then(|| (*seen_mod, seen_value.to_string().into()));
                assert_eq!(counter(&found), want, "`{line}`: the counter it read {}", whence());
            }
        }
        // Checked with their lease, by `check_leases`.
        Line::Ready { .. }
        | Line::Compacting { .. }
        | Line::Compacted { .. }
        | Line::Grant { .. }
        | Line::Revoking { .. }
        | Line::Revoked { .. } => {}
    }
}

/// Checks the leases (check 6 of the module docs) against the reopened engine.
fn check_leases(reopened: &Reopened<'_>, promises: &Promises) {
    let Reopened {
        engine,
        compacted,
        context,
    } = *reopened;
    let live: BTreeSet<i64> = engine.leases().list().into_iter().collect();
    let current = engine.current_revision();
    let key_at = |key: &str, revision: i64| match read(engine, key, revision) {
        Ok(found) => Some(found),
        Err(Error::Compacted { .. }) if revision < compacted => None,
        Err(e) => panic!("reading {key} at {revision}: {e}; {context}"),
    };
    // Every lease there, acknowledged or not, holds only keys under its own prefix.
    for &id in &live {
        let status = engine.leases().time_to_live(id, true);
        assert!(status.ttl > 0, "lease {id} listed with {status:?}; {context}");
        let prefix = engine_crash::lease_prefix(id);
        for key in &status.keys {
            assert!(
                key.starts_with(prefix.as_bytes()),
                "lease {id} holds {key:?}, not under {prefix}: {status:?}; {context}"
            );
        }
    }
    for (&id, lease) in &promises.leases {
        let status = engine.leases().time_to_live(id, true);
        let gone = !live.contains(&id);
        assert_eq!(
            gone,
            status.ttl == -1,
            "lease {id}: {status:?}, listed {}; {context}",
            !gone
        );
        if let Some(revoked) = lease.revoked {
            assert!(
                gone,
                "lease {id} revoked at {revoked} (acknowledged) but still there: {status:?}; {context}"
            );
        } else if !lease.revoking {
            assert!(
                !gone,
                "lease {id} granted (acknowledged) and never revoked, but gone; {context}"
            );
        }
        if gone {
            for key in &lease.keys {
                let found = key_at(key, current).flatten();
                assert_eq!(
                    found, None,
                    "{key} of revoked lease {id} still there at {current}; {context}"
                );
                if let Some(revoked) = lease.revoked {
                    if let Some(found) = key_at(key, revoked) {
                        assert_eq!(
                            found, None,
                            "{key} of lease {id} not deleted by its revoke at {revoked}; {context}"
                        );
                    }
                    if let Some(found) = key_at(key, revoked - 1) {
                        assert_eq!(
                            found.map(|kv| kv.lease),
                            Some(id),
                            "{key} of lease {id} not there just before its revoke at {revoked}; {context}"
                        );
                    }
                }
            }
        } else {
            assert_eq!(status.granted_ttl, LEASE_TTL, "lease {id}: {status:?}; {context}");
            for key in &lease.keys {
                assert!(
                    status.keys.iter().any(|k| k == key.as_bytes()),
                    "{key} acknowledged under lease {id}, which does not hold it: {status:?}; {context}"
                );
                let found = key_at(key, current).flatten().map(|kv| kv.lease);
                assert_eq!(found, Some(id), "{key} of live lease {id} at {current}; {context}");
            }
        }
    }
}

/// Records a child's lines, checking check 5 of the module docs.
fn record(promises: &mut Promises, iteration: usize, run: &ChildRun, context: &str) {
    let mut last_by_thread: BTreeMap<usize, i64> = BTreeMap::new();
    for line in &run.lines {
        match *line {
            Line::Compacting { revision } => {
                promises.compactions_asked.insert(revision);
            }
            Line::Compacted { revision } => {
                assert!(
                    promises.compactions_asked.contains(&revision),
                    "`{line}` never asked for: {context}"
                );
                promises.compacted = promises.compacted.max(revision);
            }
            Line::Grant { lease, .. } => {
                // (IDs come from the clock at open; a revoked one is never granted again here.)
                let fresh = promises.leases.insert(lease, LeasePromise::default()).is_none();
                assert!(fresh, "`{line}`: lease {lease} granted twice: {context}");
            }
            Line::LeasePut { lease, ref key, .. } => {
                let promise = promises.leases.get_mut(&lease);
                let promise = promise.unwrap_or_else(|| panic!("`{line}` before its grant: {context}"));
                assert!(
                    key.starts_with(&engine_crash::lease_prefix(lease)) && promise.keys.insert(key.clone()),
                    "`{line}`: a key not of its lease, or put twice: {context}"
                );
            }
            Line::Revoking { lease, .. } => {
                let promise = promises.leases.get_mut(&lease);
                promise
                    .unwrap_or_else(|| panic!("`{line}` before its grant: {context}"))
                    .revoking = true;
            }
            Line::Revoked {
                lease, revision, keys, ..
            } => {
                let promise = promises.leases.get_mut(&lease);
                let promise = promise.unwrap_or_else(|| panic!("`{line}` before its grant: {context}"));
                assert!(
                    promise.revoking && promise.revoked.is_none(),
                    "`{line}` not asked for, or twice: {context}"
                );
                assert_eq!(
                    promise.keys.len() as u64,
                    keys,
                    "`{line}`: keys acknowledged under it: {context}"
                );
                promise.revoked = Some(revision);
            }
            _ => {}
        }
        if let Some((thread, revision)) = line.write() {
            let changed = line.changed_store();
            assert!(
                revision > run.ready || (revision == run.ready && !changed),
                "`{line}` not after the revision the child opened at, {}: {context}",
                run.ready
            );
            if let Some(&last) = last_by_thread.get(&thread) {
                assert!(
                    revision > last || (revision == last && !changed),
                    "`{line}` after a write at {last} by the same thread: {context}"
                );
            }
            last_by_thread.insert(thread, revision);
            if changed {
                if let Some(other) = promises.changed.insert(revision, line.to_string()) {
                    panic!("`{line}` and `{other}` share a revision: {context}");
                }
            }
            promises.revision = promises.revision.max(revision);
        }
        promises.lines.push((iteration, line.clone()));
    }
}

/// The revision at which two snapshots' histories first differ.
fn first_difference(a: &Snapshot, b: &Snapshot) -> Option<i64> {
    a.history
        .iter()
        .zip(&b.history)
        .find(|((ra, ka), (rb, kb))| ra != rb || ka != kb)
        .map(|((rev, _), _)| *rev)
}

#[test]
fn kill_9_loses_no_acknowledged_write() {
    let started = Instant::now();
    let seed = std::env::var("CAIRN_CRASH_SEED")
        .map(|s| s.parse::<u64>().expect("CAIRN_CRASH_SEED must be a u64"))
        .unwrap_or_else(|_| rand::random());
    let iterations: usize = std::env::var("CAIRN_CRASH_ITERATIONS")
        .map(|s| s.parse().expect("CAIRN_CRASH_ITERATIONS must be a number"))
        .unwrap_or(30);
    let mut rng = StdRng::seed_from_u64(seed);
    let tmp = tempfile::Builder::new()
        .prefix("cairn-engine-crash-")
        .tempdir()
        .unwrap();
    let dir = tmp.path().join("engine");
    let stderr_path = tmp.path().join("child.stderr");
    eprintln!(
        "engine_crash: seed {seed} (CAIRN_CRASH_SEED={seed} repeats it), {iterations} kills, engine in {}",
        dir.display()
    );

    let mut promises = Promises::default();
    let mut last = Snapshot {
        current: 1, // an empty engine is at revision 1, as etcd
        compacted: 0,
        hash: None,
        history: BTreeMap::new(),
        leases: Vec::new(),
    };
    for iteration in 0..iterations {
        let spec = ChildSpec {
            dir: &dir,
            threads: rng.random_range(1..=4),
            compact_every: rng.random_range(20..=120),
            seed: rng.random(),
            prefix: format!("c{iteration}"),
            kill_after: rng.random_range(1..=300),
        };
        let run = run_child(&spec, &stderr_path);
        let context = format!(
            "iteration {iteration} (seed {seed}, {} threads, compact every {} writes, kill after {} writes): \
             child {}; stderr:\n{}",
            spec.threads, spec.compact_every, spec.kill_after, run.status, run.stderr
        );
        assert_eq!(
            run.status.signal(),
            Some(SIGKILL),
            "the child died on its own: {context}"
        );
        assert!(run.writes >= spec.kill_after, "{context}");
        assert_eq!(
            run.ready, last.current,
            "the child's open must find what the last open found: {context}"
        );
        record(&mut promises, iteration, &run, &context);

        // The first open may repair a torn tail; the second must find exactly the same.
        let engine = Engine::open(&dir, engine_crash::config()).unwrap_or_else(|e| panic!("open: {e}; {context}"));
        let now = snapshot(&engine);
        assert!(
            now.current >= promises.revision,
            "revision {} answered, but the engine reopens at {}: {context}",
            promises.revision,
            now.current
        );
        assert!(now.current >= last.current, "{context}");
        assert!(
            now.compacted >= promises.compacted,
            "compaction at {} acknowledged, but the engine reopens compacted at {}: {context}",
            promises.compacted,
            now.compacted
        );
        assert!(
            now.compacted == 0 || promises.compactions_asked.contains(&now.compacted),
            "compacted at {}, which no child asked for: {context}",
            now.compacted
        );
        if promises.compacted >= 2 {
            // (A read at revision 0 would read the current one.)
            let below = read(&engine, "k00", promises.compacted - 1);
            assert!(
                matches!(below, Err(Error::Compacted { .. })),
                "a read below the acknowledged compaction at {}: {below:?}; {context}",
                promises.compacted
            );
        }
        let reopened = Reopened {
            engine: &engine,
            compacted: now.compacted,
            context: &context,
        };
        for (printed_in, line) in &promises.lines {
            check_line(&reopened, *printed_in, line);
        }
        check_leases(&reopened, &promises);
        engine.close().unwrap();

        let again = open_snapshot(&dir);
        assert!(
            again == now,
            "two opens differ: current {} / {}, compacted {} / {}, {:?} / {:?}, history first at {:?}, leases \
             {:?} / {:?}; {context}",
            now.current,
            again.current,
            now.compacted,
            again.compacted,
            now.hash,
            again.hash,
            first_difference(&now, &again),
            now.leases,
            again.leases
        );
        for (rev, kvs) in last.history.range(now.compacted..) {
            assert_eq!(
                now.history.get(rev),
                Some(kvs),
                "revision {rev} read differently by the last open: {context}"
            );
        }
        last = now;
    }

    let count = |f: fn(&Line) -> bool| promises.lines.iter().filter(|(_, l)| f(l)).count();
    // Checkpoints release old segments, so count rotations by the newest sequence number.
    let segments = std::fs::read_dir(dir.join("wal"))
        .unwrap()
        .filter_map(|e| cairn_wal::parse_segment_name(&e.unwrap().file_name().to_string_lossy()))
        .map(|(seq, _)| seq.0 + 1)
        .max()
        .unwrap_or(0);
    let compactions = count(|l| matches!(l, Line::Compacted { .. }));
    eprintln!(
        "engine_crash: {} writes ({} puts, {} deletes of a key, {} cas that wrote, {} that failed), {compactions} \
         compactions acknowledged, {} leases granted ({} keys put under them, {} revoked, {} left), over \
         {iterations} kills in {:.1?}; revision {}, compacted at {}, {segments} WAL segments written",
        count(|l| l.write().is_some()),
        count(|l| matches!(l, Line::Put { .. })),
        count(|l| matches!(l, Line::Delete { deleted: 1.., .. })),
        count(|l| matches!(l, Line::CasSucceeded { .. })),
        count(|l| matches!(l, Line::CasFailed { .. })),
        count(|l| matches!(l, Line::Grant { .. })),
        count(|l| matches!(l, Line::LeasePut { .. })),
        count(|l| matches!(l, Line::Revoked { .. })),
        last.leases.len(),
        started.elapsed(),
        last.current,
        last.compacted,
    );
    if iterations >= 30 {
        // Some 4,500 writes of up to about 550 bytes into 64 KiB segments, compacting every 20 to
        // 120 of them: rotation and compaction are certain.
        assert!(segments > 1, "the test must rotate WAL segments");
        assert!(dir.join("checkpoint").exists(), "the test must checkpoint");
        assert!(compactions > 0, "the test must compact");
        assert!(
            count(|l| matches!(l, Line::LeasePut { .. })) > 0
                && count(|l| matches!(l, Line::Revoked { keys: 1.., .. })) > 0,
            "the test must put keys under leases and revoke leases with keys"
        );
    }
    if std::env::var_os("CAIRN_CRASH_KEEP").is_some() {
        eprintln!("engine_crash: kept {}", tmp.keep().display());
    }
}
