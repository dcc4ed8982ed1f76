//! The data files under load and after crashes: a defragmentation running beside writers and a
//! reader loses no acknowledged write, never shows a reader a value that was not written, and
//! leaves a state that survives a reopen; a snapshot streamed while writes go on holds exactly
//! the state at its revision; data files a crash left behind (a defragmentation's copies that
//! were never switched to, or old files a switched one had not deleted yet) are removed on
//! opening without changing the state; and compaction followed by defragmentation returns the
//! freed space to the file system.
//!
//! A compaction drops history in a background sweep; these tests wait for it
//! (`Maintenance::wait_compacted`) before they measure space.

// Test code: a panic is a test failure, with the message to debug it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use bytes::Bytes;
use cairn_engine::offline;
use cairn_engine::{Config, Engine, HashKv, KeyValue, PutRequest, RangeRequest, RangeResponse};

/// Each key's value and mod revision.
type Kvs = BTreeMap<Vec<u8>, (Bytes, i64)>;

/// An acknowledged put: key, value, revision.
type Ack = (String, Bytes, i64);

fn config() -> Config {
    Config {
        // Small files, so a store of a few MiB spans many and defragmentation has some to drop.
        data_file_size: 64 << 10,
        lease_check_interval: None,
        ..Config::default()
    }
}

fn key(i: usize) -> String {
    format!("key/{i:05}")
}

/// A value of `len` bytes naming its key, so a reader can tell it was written for that key.
fn value(key: &str, tag: &str, len: usize) -> Bytes {
    let mut v = format!("{key}={tag};").into_bytes();
    v.resize(len.max(v.len()), b'.');
    Bytes::from(v)
}

fn written_for_its_key(kv: &KeyValue) -> bool {
    let mut prefix = kv.key.to_vec();
    prefix.push(b'=');
    kv.value.starts_with(&prefix)
}

fn put(key: &str, value: Bytes) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value,
        ..PutRequest::default()
    }
}

/// Puts `key` and returns the acknowledgement.
fn put_acked(engine: &Engine, key: &str, tag: &str, len: usize) -> Ack {
    let v = value(key, tag, len);
    let revision = engine.write(put(key, v.clone())).unwrap().revision;
    (key.to_owned(), v, revision)
}

/// Puts keys `0..keys`, `versions` times each, logging many puts before waiting for any so one
/// fsync serves them all; returns each key's last value and revision.
fn load(engine: &Engine, keys: usize, versions: usize, len: usize) -> Kvs {
    let mut latest = Kvs::new();
    for version in 0..versions {
        for first in (0..keys).step_by(500) {
            let pending: Vec<_> = (first..keys.min(first + 500))
                .map(|i| {
                    let k = key(i);
                    let v = value(&k, &format!("load{version}"), len);
                    let p = engine.write_async(put(&k, v.clone())).unwrap();
                    (k, v, p)
                })
                .collect();
            for (k, v, p) in pending {
                latest.insert(k.into_bytes(), (v, p.wait().unwrap().revision));
            }
        }
    }
    latest
}

/// Compacts at the current revision and waits for the sweep that drops the history, then
/// overwrites `barrier_key` (returned) so the newest revision is past the compacted one.
fn compact_and_sweep(engine: &Engine, barrier_key: &str, len: usize) -> (i64, Ack) {
    let compacted = engine.current_revision();
    engine.compact(compacted).unwrap();
    engine.maintenance().wait_compacted().unwrap();
    (compacted, put_acked(engine, barrier_key, "barrier", len))
}

fn range_all(engine: &Engine, revision: i64) -> RangeResponse {
    engine.range(&RangeRequest::all().at_revision(revision)).unwrap()
}

/// Every key at `revision` (0: now), with its value and mod revision.
fn state_at(engine: &Engine, revision: i64) -> Kvs {
    range_all(engine, revision)
        .kvs
        .into_iter()
        .map(|kv| (kv.key.to_vec(), (kv.value, kv.mod_revision)))
        .collect()
}

/// `assert_eq!` for big maps: reports how many keys differ and the first few, not both maps.
fn assert_same(got: &Kvs, expected: &Kvs, what: &str) {
    if got == expected {
        return;
    }
    let mut keys: Vec<&Vec<u8>> = got.keys().chain(expected.keys()).collect();
    keys.sort();
    keys.dedup();
    let differing: Vec<String> = keys
        .into_iter()
        .filter(|k| got.get(*k) != expected.get(*k))
        .map(|k| {
            let show = |e: Option<&(Bytes, i64)>| {
                e.map(|(v, rev)| format!("{:?}@{rev}", String::from_utf8_lossy(v.get(..24).unwrap_or(v))))
            };
            format!(
                "{}: got {:?}, expected {:?}",
                String::from_utf8_lossy(k),
                show(got.get(k)),
                show(expected.get(k))
            )
        })
        .collect();
    panic!(
        "{what}: {} keys differ; the first: {:#?}",
        differing.len(),
        &differing[..differing.len().min(5)]
    );
}

/// `assert_eq!` for big range responses: reports the first key-value that differs.
fn assert_same_range(got: &RangeResponse, expected: &RangeResponse, what: &str) {
    if got == expected {
        return;
    }
    let at = got
        .kvs
        .iter()
        .zip(&expected.kvs)
        .position(|(g, e)| g != e)
        .unwrap_or(got.kvs.len().min(expected.kvs.len()));
    panic!(
        "{what}: got {} keys (count {}, at {}), expected {} (count {}, at {}); first difference, \
         entry {at}: got {:?}, expected {:?}",
        got.kvs.len(),
        got.count,
        got.revision,
        expected.kvs.len(),
        expected.count,
        expected.revision,
        got.kvs.get(at),
        expected.kvs.get(at)
    );
}

/// Applies acknowledged puts, in revision order, to `state`; checks no two got one revision.
fn apply_acks(state: &mut Kvs, acks: &[Ack]) {
    let mut acks = acks.to_vec();
    acks.sort_by_key(|(_, _, rev)| *rev);
    for pair in acks.windows(2) {
        assert!(pair[0].2 < pair[1].2, "two puts acknowledged at revision {}", pair[0].2);
    }
    for (k, v, rev) in acks {
        state.insert(k.into_bytes(), (v, rev));
    }
}

/// xorshift64*: reproducible key choices without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Sets its flag when dropped, so threads waiting on it stop even if its owner panics.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The data files in `dir`'s data directory, by name.
fn data_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn file_id(name: &str) -> u32 {
    u32::from_str_radix(name.strip_suffix(".dat").unwrap(), 16).unwrap()
}

#[test]
fn defragmenting_while_writing_keeps_every_write() {
    const KEYS: usize = 5_000;
    // Writers pick among these, so some puts overwrite loaded keys and some create keys.
    const KEY_SPACE: usize = KEYS + KEYS / 5;
    const VALUE_LEN: usize = 300;
    // Each writer and the reader go on at least this long, however fast defragmentation is.
    const MIN_OPS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let mut expected = load(&engine, KEYS, 4, VALUE_LEN);
    let loaded_in_use = engine.status().size_in_use;
    let (compacted, barrier) = compact_and_sweep(&engine, &key(0), VALUE_LEN);
    apply_acks(&mut expected, &[barrier]);
    assert!(
        engine.status().size_in_use < loaded_in_use / 3,
        "compaction keeps one of each key's four versions: {} of {loaded_in_use} bytes in use",
        engine.status().size_in_use
    );
    let at_compaction = state_at(&engine, compacted);
    assert_eq!(at_compaction.len(), KEYS);

    let defrag_done = AtomicBool::new(false);
    let writers_done = AtomicBool::new(false);
    let (defragmented, acks, reads) = std::thread::scope(|s| {
        let defrag = s.spawn(|| {
            let _done = SetOnDrop(&defrag_done);
            engine.maintenance().defragment()
        });
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (engine, defrag_done) = (&engine, &defrag_done);
                s.spawn(move || {
                    let mut rng = Rng::new(w + 1);
                    let mut acks: Vec<Ack> = Vec::new();
                    while acks.len() < MIN_OPS || !defrag_done.load(Ordering::SeqCst) {
                        let k = key(rng.below(KEY_SPACE));
                        acks.push(put_acked(engine, &k, &format!("w{w}-{}", acks.len()), VALUE_LEN));
                    }
                    acks
                })
            })
            .collect();
        let reader = s.spawn(|| {
            let mut rng = Rng::new(99);
            // A later read never sees an older put than an earlier one did.
            let mut last_seen: HashMap<Bytes, i64> = HashMap::new();
            let mut reads = 0usize;
            while reads < MIN_OPS || !writers_done.load(Ordering::SeqCst) {
                let k = key(rng.below(KEY_SPACE));
                for kv in engine.range(&RangeRequest::key(k.clone())).unwrap().kvs {
                    assert!(written_for_its_key(&kv), "{k} read as {:?}", kv.value);
                    let last = last_seen.entry(kv.key.clone()).or_insert(0);
                    assert!(kv.mod_revision >= *last, "{k} went back from revision {last} to {kv:?}");
                    *last = kv.mod_revision;
                }
                // History is read through the records being moved, too.
                let then = engine
                    .range(&RangeRequest::key(k.clone()).at_revision(compacted))
                    .unwrap();
                assert_eq!(
                    then.kvs.first().map(|kv| (kv.value.clone(), kv.mod_revision)),
                    at_compaction.get(k.as_bytes()).cloned(),
                    "{k} at the compacted revision {compacted}"
                );
                reads += 1;
            }
            reads
        });
        let stop_reader = SetOnDrop(&writers_done);
        let acks: Vec<Ack> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        drop(stop_reader);
        (defrag.join().unwrap(), acks, reader.join().unwrap())
    });
    let defragmented = defragmented.unwrap();
    assert!(defragmented.after < defragmented.before, "{defragmented:?}");
    assert!(acks.len() >= 2 * MIN_OPS && reads >= MIN_OPS);
    apply_acks(&mut expected, &acks);
    assert_same(&state_at(&engine, 0), &expected, "after defragmenting");
    assert_same(
        &state_at(&engine, compacted),
        &at_compaction,
        "history after defragmenting",
    );
    assert_eq!(engine.status().keys, expected.len());
    let last = acks.iter().map(|(_, _, rev)| *rev).max().unwrap();
    assert_eq!(engine.current_revision(), last);
    let hash = engine.maintenance().hash_kv(0).unwrap();
    engine.close().unwrap();

    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(engine.current_revision(), last);
    assert_same(&state_at(&engine, 0), &expected, "after reopening");
    assert_same(&state_at(&engine, compacted), &at_compaction, "history after reopening");
    assert_eq!(
        engine.maintenance().hash_kv(0).unwrap(),
        hash,
        "HashKV is stable across a restart"
    );
}

/// A snapshot's destination that, at the snapshot's first byte (its revision is fixed by then),
/// holds the snapshot until `more` puts newer than the store's revision at that moment have
/// been acknowledged: the rest of it is certain to be streamed while the store has moved on.
struct HeldSink<'a> {
    bytes: Vec<u8>,
    hold: Option<(&'a Engine, mpsc::Receiver<i64>, usize)>,
}

impl Write for HeldSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some((engine, acked, more)) = self.hold.take() {
            let now = engine.current_revision();
            let mut newer = 0;
            while newer < more {
                // An error: every writer stopped early; the snapshot fails and so does the test.
                if acked.recv().map_err(std::io::Error::other)? > now {
                    newer += 1;
                }
            }
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_snapshot_taken_during_writes_is_the_state_at_its_revision() {
    const KEYS: usize = 2_000;
    const KEY_SPACE: usize = KEYS + KEYS / 5;
    const VALUE_LEN: usize = 200;
    const MIN_PUTS: usize = 50;
    // Puts acknowledged before the snapshot starts, and after its revision is fixed.
    const BEFORE: usize = 20;
    const DURING: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    load(&engine, KEYS, 2, VALUE_LEN);
    let loaded = engine.current_revision();

    let snapshot_done = AtomicBool::new(false);
    let (acked_tx, acked_rx) = mpsc::channel();
    let (snapshot, acks) = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (engine, snapshot_done, acked_tx) = (&engine, &snapshot_done, acked_tx.clone());
                s.spawn(move || {
                    let mut rng = Rng::new(w + 7);
                    let mut acks: Vec<Ack> = Vec::new();
                    while acks.len() < MIN_PUTS || !snapshot_done.load(Ordering::SeqCst) {
                        let k = key(rng.below(KEY_SPACE));
                        let ack = put_acked(engine, &k, &format!("w{w}-{}", acks.len()), VALUE_LEN);
                        // The snapshot may have stopped listening.
                        let _ = acked_tx.send(ack.2);
                        acks.push(ack);
                    }
                    acks
                })
            })
            .collect();
        drop(acked_tx);
        let snapshot = s.spawn(|| {
            let _done = SetOnDrop(&snapshot_done);
            for _ in 0..BEFORE {
                acked_rx.recv().unwrap();
            }
            let mut sink = HeldSink {
                bytes: Vec::new(),
                hold: Some((&engine, acked_rx, DURING)),
            };
            let size = engine.maintenance().snapshot(&mut sink).unwrap();
            assert_eq!(size, sink.bytes.len() as u64);
            sink.bytes
        });
        let snapshot = snapshot.join().unwrap();
        let acks: Vec<Ack> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        (snapshot, acks)
    });

    let restored_dir = tempfile::tempdir().unwrap();
    offline::restore(&mut snapshot.as_slice(), restored_dir.path()).unwrap();
    let restored = Engine::open(restored_dir.path(), config()).unwrap();
    let at = restored.current_revision();
    let revisions: Vec<i64> = acks.iter().map(|(_, _, rev)| *rev).collect();
    assert!(
        at >= loaded + BEFORE as i64 && revisions.contains(&at),
        "the snapshot's revision {at} is one of the writers' (loaded up to {loaded})"
    );
    let newer = revisions.iter().filter(|rev| **rev > at).count();
    assert!(newer >= DURING, "{newer} puts after the snapshot's revision {at}");
    assert_eq!(engine.current_revision(), *revisions.iter().max().unwrap());

    let source_at = range_all(&engine, at);
    assert_same_range(
        &range_all(&restored, 0),
        &source_at,
        &format!("the restored state against the source's at {at}"),
    );
    assert_ne!(
        range_all(&engine, 0),
        source_at,
        "writes after the snapshot's revision are not in it"
    );
    // History before it came along too: the load, and the writers' first puts.
    for rev in [2, loaded / 2, loaded, loaded + 1, at - 1] {
        assert_same_range(
            &range_all(&restored, rev),
            &range_all(&engine, rev),
            &format!("revision {rev}"),
        );
    }
    assert_eq!(
        restored.maintenance().hash_kv(at).unwrap(),
        engine.maintenance().hash_kv(at).unwrap()
    );
    assert_eq!(
        restored.maintenance().hash_kv(0).unwrap(),
        engine.maintenance().hash_kv(at).unwrap()
    );
}

/// A store with compacted history, defragmented once, and some writes since; returns the
/// revisions at which to compare its reads.
fn build_defragmented(engine: &Engine) -> Vec<i64> {
    load(engine, 400, 3, 300);
    let (compacted, _) = compact_and_sweep(engine, &key(0), 300);
    engine.maintenance().defragment().unwrap();
    for i in 0..50 {
        put_acked(engine, &key(i * 7), "after", 300);
    }
    let current = engine.current_revision();
    vec![
        compacted,
        compacted + 1,
        (compacted + current) / 2,
        current - 1,
        current,
    ]
}

/// Everything observable at some revisions: their full ranges, and HashKV.
#[derive(Debug)]
struct Observed {
    ranges: Vec<RangeResponse>,
    hash: HashKv,
}

fn observe(engine: &Engine, revisions: &[i64]) -> Observed {
    Observed {
        ranges: revisions.iter().map(|rev| range_all(engine, *rev)).collect(),
        hash: engine.maintenance().hash_kv(0).unwrap(),
    }
}

fn assert_observed(got: &Observed, expected: &Observed, what: &str) {
    for (i, (g, e)) in got.ranges.iter().zip(&expected.ranges).enumerate() {
        assert_same_range(g, e, &format!("{what}, revision {}", e.revision));
        assert_eq!(g.revision, e.revision, "{what}, read {i}");
    }
    assert_eq!(got.ranges.len(), expected.ranges.len());
    assert_eq!(got.hash, expected.hash, "{what}: HashKV");
}

#[test]
fn a_crash_after_defragment_copies_but_before_the_switch_recovers() {
    // A defragmentation writes its copies into new files with fresh ids; until a checkpoint
    // names them, they are not part of the state. Leave some behind as a crash would.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    let revisions = build_defragmented(&engine);
    let seen = observe(&engine, &revisions);
    engine.close().unwrap();
    let files = data_files(dir.path());
    let next_id = files.iter().map(|f| file_id(f)).max().unwrap() + 1;
    let data = dir.path().join("data");
    // A copy that was being filled: a real file's records, under the next id.
    let copy = data.join(format!("{next_id:08x}.dat"));
    std::fs::copy(data.join(&files[0]), &copy).unwrap();
    // And garbage under a far id.
    let mut rng = Rng::new(3);
    let garbage: Vec<u8> = (0..(64 << 10) / 8).flat_map(|_| rng.next().to_le_bytes()).collect();
    let far = data.join("ffffff00.dat");
    std::fs::write(&far, garbage).unwrap();

    let engine = Engine::open(dir.path(), config()).unwrap();
    assert!(!copy.exists() && !far.exists(), "{:?}", data_files(dir.path()));
    assert_eq!(data_files(dir.path()), files);
    assert_observed(
        &observe(&engine, &revisions),
        &seen,
        "after reopening over the leftovers",
    );

    // It carries on: new files get ids past the leftovers', and survive another round.
    for i in 0..300 {
        put_acked(&engine, &key(i), "later", 300);
    }
    engine.maintenance().defragment().unwrap();
    let revisions = [engine.status().compacted_revision, engine.current_revision()];
    let seen = observe(&engine, &revisions);
    engine.close().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_observed(
        &observe(&engine, &revisions),
        &seen,
        "after another defragmentation and reopening",
    );
}

#[test]
fn a_crash_after_the_switch_but_before_the_old_files_are_deleted_recovers() {
    // A defragmentation deletes the old files once a checkpoint naming the new ones is
    // durable: a crash between the two leaves them behind, no longer part of the state.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    load(&engine, 400, 3, 300);
    let old: Vec<(PathBuf, Vec<u8>)> = data_files(dir.path())
        .into_iter()
        .map(|name| {
            let path = dir.path().join("data").join(name);
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    compact_and_sweep(&engine, &key(0), 300);
    engine.maintenance().defragment().unwrap();
    let revisions = [engine.status().compacted_revision, engine.current_revision()];
    let seen = observe(&engine, &revisions);
    engine.close().unwrap();
    let files = data_files(dir.path());
    let mut put_back = Vec::new();
    for (path, bytes) in old {
        if !path.exists() {
            std::fs::write(&path, bytes).unwrap();
            put_back.push(path);
        }
    }
    assert!(!put_back.is_empty(), "defragmenting replaced some files");

    let engine = Engine::open(dir.path(), config()).unwrap();
    assert_eq!(data_files(dir.path()), files);
    assert_observed(
        &observe(&engine, &revisions),
        &seen,
        "after reopening over the old files",
    );
}

#[test]
fn compaction_then_defragment_returns_space() {
    const KEYS: usize = 20;
    const VALUE_LEN: usize = 1024;
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path(), config()).unwrap();
    for i in 0..2_000 {
        put_acked(&engine, &key(i % KEYS), &format!("v{i}"), VALUE_LEN);
    }
    let (compacted, _) = compact_and_sweep(&engine, &key(0), VALUE_LEN);
    let revisions = [compacted, engine.current_revision()];
    let seen = observe(&engine, &revisions);
    let in_use = engine.status().size_in_use;

    let done = engine.maintenance().defragment().unwrap();
    assert!(done.after < done.before / 4, "{done:?}");
    assert_eq!(engine.status().size, done.after);
    assert_eq!(engine.status().size_in_use, in_use);
    assert_observed(&observe(&engine, &revisions), &seen, "after defragmenting");
    assert_eq!(range_all(&engine, 0).count, KEYS as i64);
}
