//! The saved key index: opening a store without reading its values.
//!
//! Rebuilding the key index and the revision log from the data files reads every record,
//! values included, so a restart would cost the bytes stored, not the keys. The saved index
//! (its file is `format::index`'s) holds what the scan would build, up to a position in the
//! data files (its *cover*). Opening loads it (keys in order: the tree is built bottom up),
//! scans only the records after the cover, and compacts at the checkpoint's revision: the
//! same state a full scan builds, which the tests below check against it.
//!
//! It is written from the data files, never from the live index, so no lock is held and no
//! write waits for it: [`refresh`] merges the saved index (sorted by key) with the records
//! after its cover (read with `pread`, sorted by key in memory, a bounded batch at a time)
//! into a new file. The checkpointer thread refreshes it after a checkpoint once the records
//! not covered reach a few tens of MiB and an eighth of those covered (each refresh rewrites
//! the whole index), and closing refreshes it once they reach that floor, so a restart after
//! a clean stop scans little.
//!
//! A saved index that is missing, damaged, or does not match the checkpoint's layout (a
//! defragmentation or an installed snapshot since: another layout epoch; files with the same
//! ids but other records) is not used: opening falls back to the full scan.

use std::collections::VecDeque;
use std::path::Path;

use super::index::Index;
use super::key_index::KeyIndex;
use super::revision_log::RevisionLog;
use crate::backend::{self, Backend, FileLen, Loc, DATA_DIR};
use crate::error::{Error, Failure, Result};
use crate::format::index::{Cover, CoveredFile, LastRecord, Reader, Writer};
use crate::revision::Revision;

/// What opening needs from a saved index: where it is, and the checkpoint's layout epoch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SavedAt<'a> {
    /// The engine's directory (the index is beside the checkpoint).
    pub(crate) dir: &'a Path,
    pub(crate) epoch: u64,
}

/// A store's index and revision log as loaded, before the records after the cover.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) index: Index,
    pub(crate) log: RevisionLog,
    /// Keys that exist with a lease attached, in key order.
    pub(crate) leased: Vec<(Box<[u8]>, i64)>,
    /// How far into each file of the layout the index covers.
    pub(crate) covered: Vec<u64>,
    pub(crate) compacted: i64,
}

fn mismatch(why: impl std::fmt::Display) -> Error {
    Error::Backend(Failure::new(format!(
        "the saved index does not match the data files: {why}"
    )))
}

/// Whether `cover` describes a prefix of `layout` at `epoch`, compacted no later than
/// `compacted`: each covered file is the layout's file at its place, whole but the last.
/// Returns the covered length of each.
fn covered_prefix(cover: &Cover, epoch: u64, layout: &[FileLen], compacted: i64) -> Result<Vec<u64>> {
    if cover.epoch != epoch {
        return Err(mismatch(format!(
            "layout epoch {}, the checkpoint's is {epoch}",
            cover.epoch
        )));
    }
    if cover.compacted > compacted {
        return Err(mismatch(format!(
            "compacted at {}, the checkpoint at {compacted}",
            cover.compacted
        )));
    }
    let last = cover.files.len().checked_sub(1);
    let mut covered = Vec::with_capacity(cover.files.len());
    for (i, f) in cover.files.iter().enumerate() {
        let Some(file) = layout.get(i).filter(|l| l.id == f.id) else {
            return Err(mismatch(format!(
                "data file {} is not at place {i} of the layout",
                f.id
            )));
        };
        let fits = if Some(i) == last {
            f.len <= file.len
        } else {
            f.len == file.len
        };
        if !fits || f.last.is_none() != (f.len == 0) {
            return Err(mismatch(format!(
                "data file {} covered to {}, holds {}",
                f.id, f.len, file.len
            )));
        }
        covered.push(f.len);
    }
    Ok(covered)
}

/// Loads the saved index for the store whose checkpoint names `layout`, compacted at
/// `compacted`: `None` if there is none. An error if it is damaged or does not match (the
/// caller falls back to the scan).
pub(crate) fn load(at: SavedAt<'_>, backend: &Backend, layout: &[FileLen], compacted: i64) -> Result<Option<Loaded>> {
    let Some(mut reader) = Reader::open(at.dir)? else {
        return Ok(None);
    };
    let cover = reader.cover().clone();
    let covered = covered_prefix(&cover, at.epoch, layout, compacted)?;
    for f in &cover.files {
        if let Some(last) = f.last {
            if backend.stored_crc(f.id, last.offset) != Some((last.crc, f.len)) {
                return Err(mismatch(format!("data file {} holds other records", f.id)));
            }
        }
    }
    let capacity = usize::try_from(cover.keys).unwrap_or(0).min(1 << 28);
    let mut keys: Vec<(Box<[u8]>, KeyIndex)> = Vec::with_capacity(capacity);
    let mut locs: Vec<(Revision, Loc)> = Vec::with_capacity(capacity);
    let mut leased = Vec::new();
    while let Some(mut block) = reader.next_block()? {
        while let Some(k) = block.next_key(&mut locs)? {
            if k.lease != 0 && k.index.is_live() {
                leased.push((Box::from(k.key), k.lease));
            }
            keys.push((Box::from(k.key), k.index));
        }
    }
    let index = Index::from_sorted(keys).ok_or_else(|| mismatch("keys out of order"))?;
    locs.sort_unstable_by_key(|(rev, _)| *rev);
    let log = RevisionLog::from_sorted(&locs).ok_or_else(|| mismatch("a revision twice"))?;
    Ok(Some(Loaded {
        index,
        log,
        leased,
        covered,
        compacted: cover.compacted,
    }))
}

/// What a refresh brings the saved index to: a checkpoint's layout, epoch and compaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) epoch: u64,
    pub(crate) compacted: i64,
    pub(crate) layout: Vec<FileLen>,
}

/// When a refresh is worth its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum When {
    /// A running member: once the records not covered reach this many bytes and an eighth of
    /// those covered (every refresh rewrites the whole index).
    Growing(u64),
    /// Closing: once they reach this many bytes (the next open scans the rest).
    Closing(u64),
}

/// Records read per round of a refresh: its memory is bounded by them, not by the store.
#[cfg(not(test))]
const ROUND_RECORDS: usize = 1 << 19;
/// A few, so that the tests' small histories take several rounds.
#[cfg(test)]
const ROUND_RECORDS: usize = 7;

/// One record after the cover, as a refresh sorts it.
#[derive(Debug)]
struct Change {
    key: Box<[u8]>,
    rev: Revision,
    created: Revision,
    version: i64,
    lease: i64,
    loc: Loc,
}

/// A saved key, owned (a refresh holds a block's keys while it merges).
#[derive(Debug)]
struct Saved {
    key: Vec<u8>,
    lease: i64,
    index: KeyIndex,
    locs: Vec<(Revision, Loc)>,
}

/// The keys of a saved index one at a time, in order.
struct Keys {
    reader: Reader,
    queued: VecDeque<Saved>,
}

impl Keys {
    fn next(&mut self) -> Result<Option<Saved>> {
        if self.queued.is_empty() {
            let Some(mut block) = self.reader.next_block()? else {
                return Ok(None);
            };
            let mut locs = Vec::new();
            while let Some(k) = block.next_key(&mut locs)? {
                self.queued.push_back(Saved {
                    key: k.key.to_vec(),
                    lease: k.lease,
                    index: k.index,
                    locs: std::mem::take(&mut locs),
                });
            }
        }
        Ok(self.queued.pop_front())
    }
}

/// The saved index of `dir` if its cover is a prefix of `target`'s layout (by ids and
/// lengths: [`last_records_match`] checks the records); its keys, cover, and covered lengths.
fn base(dir: &Path, target: &Target) -> Option<(Keys, Cover, Vec<u64>)> {
    let reader = Reader::open(dir).ok().flatten()?;
    let cover = reader.cover().clone();
    let covered = covered_prefix(&cover, target.epoch, &target.layout, target.compacted).ok()?;
    let keys = Keys {
        reader,
        queued: VecDeque::new(),
    };
    Some((keys, cover, covered))
}

/// Whether the last record `cover` names in each data file is the one there now (same ids
/// and lengths are not enough: another store's files, or a backup's, may have them).
fn last_records_match(dir: &Path, cover: &Cover) -> bool {
    let data_dir = dir.join(DATA_DIR);
    cover.files.iter().all(|f| {
        let Some(last) = f.last else {
            return true;
        };
        let mut found = None;
        let _ = backend::read_records(&data_dir, f.id, (last.offset, f.len), |_, crc, _| {
            found = Some(crc);
            false
        });
        found == Some(last.crc)
    })
}

/// Brings the saved index of `dir` (the engine's directory) up to `target` when `when` says
/// it is due; returns whether it wrote one. An error leaves the previous file in place.
pub(crate) fn refresh(dir: &Path, target: &Target, when: When) -> Result<bool> {
    let total: u64 = target.layout.iter().map(|f| f.len).sum();
    let due = |done: u64| {
        let least = match when {
            When::Growing(min) => min.max(done / 8),
            When::Closing(min) => min,
        };
        total > done && total - done >= least
    };
    // After every checkpoint: the cover alone says whether a refresh is due; the data files
    // are read only when it is.
    let mut found = base(dir, target);
    if !due(found.as_ref().map_or(0, |b| b.2.iter().sum())) {
        return Ok(false);
    }
    if found.as_ref().is_some_and(|b| !last_records_match(dir, &b.1)) {
        found = None;
        if !due(0) {
            return Ok(false);
        }
    }
    let (mut keys, mut cover) = match found {
        Some(b) => (Some(b.0), b.1),
        None => {
            let empty = Cover {
                epoch: target.epoch,
                compacted: target.compacted,
                keys: 0,
                files: Vec::new(),
            };
            (None, empty)
        }
    };
    let data_dir = dir.join(DATA_DIR);
    loop {
        // A round: the next records after the cover, sorted by key (stable: a key's changes
        // stay in revision order).
        let mut changes = Vec::new();
        let mut files = cover.files.clone();
        for (i, f) in target.layout.iter().enumerate() {
            if changes.len() >= ROUND_RECORDS {
                break;
            }
            if files.len() == i {
                files.push(CoveredFile {
                    id: f.id,
                    len: 0,
                    last: None,
                });
            }
            let Some(file) = files.get_mut(i) else {
                return Err(Error::internal("the saved index's cover skips a file"));
            };
            if file.len == f.len {
                continue;
            }
            backend::read_records(&data_dir, f.id, (file.len, f.len), |loc, crc, r| {
                if changes.len() >= ROUND_RECORDS {
                    return false;
                }
                changes.push(Change {
                    key: r.key.into(),
                    rev: r.rev,
                    created: r.created,
                    version: r.version,
                    lease: r.lease,
                    loc,
                });
                file.last = Some(LastRecord {
                    offset: u64::from(loc.offset),
                    crc,
                });
                file.len = u64::from(loc.offset) + u64::from(loc.len);
                true
            })?;
            if file.len < f.len {
                // The round is full inside this file: the cover ends here.
                break;
            }
        }
        changes.sort_by(|a, b| a.key.cmp(&b.key));
        let next = Cover {
            epoch: target.epoch,
            compacted: target.compacted,
            keys: 0,
            files,
        };
        merge(dir, keys.as_mut(), &changes, next.clone())?;
        let covered: u64 = next.files.iter().map(|f| f.len).sum();
        cover = next;
        if covered == total {
            return Ok(true);
        }
        // The file just written: its cover is this round's, its records were just read.
        keys = base(dir, target).map(|b| b.0);
        if keys.is_none() {
            return Err(Error::internal("the saved index just written does not match"));
        }
    }
}

/// Writes the saved index of `base`'s keys with `changes` (sorted by key) applied, compacted
/// and covering what `cover` says.
fn merge(dir: &Path, mut base: Option<&mut Keys>, changes: &[Change], cover: Cover) -> Result<()> {
    let compacted = cover.compacted;
    let mut out = Writer::create(dir)?;
    let mut next_saved = match base.as_deref_mut() {
        Some(keys) => keys.next()?,
        None => None,
    };
    let mut changes = changes.iter().peekable();
    let mut dropped = Vec::new();
    loop {
        let from_base = match (&next_saved, changes.peek()) {
            (None, None) => break,
            (Some(s), Some(c)) => s.key.as_slice() <= &*c.key,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        let mut key = match (from_base, next_saved.take()) {
            (true, Some(saved)) => {
                next_saved = match base.as_deref_mut() {
                    Some(keys) => keys.next()?,
                    None => None,
                };
                if next_saved.as_ref().is_some_and(|n| n.key <= saved.key) {
                    return Err(Error::internal("the saved index's keys are out of order"));
                }
                saved
            }
            (false, held) => {
                next_saved = held;
                let first = changes.peek().map(|c| c.key.to_vec()).unwrap_or_default();
                Saved {
                    key: first,
                    lease: 0,
                    index: KeyIndex::default(),
                    locs: Vec::new(),
                }
            }
            (true, None) => break,
        };
        while let Some(c) = changes.next_if(|c| *c.key == *key.key) {
            key.index.restore(c.rev, c.created, c.version).map_err(|e| {
                Error::Backend(Failure::caused_by(
                    format!("data files disagree at revision {}", c.rev),
                    e,
                ))
            })?;
            key.locs.push((c.rev, c.loc));
            key.lease = c.lease;
        }
        dropped.clear();
        key.index.compact(compacted, &mut dropped);
        if key.index.is_empty() {
            continue;
        }
        let lease = if key.index.is_live() { key.lease } else { 0 };
        let locs = &key.locs;
        out.push(&key.key, lease, &key.index, |rev| {
            locs.iter().find(|(r, _)| r == rev).map(|(_, l)| *l)
        })?;
    }
    out.finish(cover)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::mvcc::store::Store;

    /// A store's state, as a full scan and a saved index must both build it.
    /// Every key's history, every record's place, the revision and the compacted revision.
    type State = (Vec<(Vec<u8>, KeyIndex)>, Vec<(Revision, Loc)>, i64, i64);

    fn state_of(store: &Store) -> State {
        let (index, log) = store.parts();
        (
            index.iter().map(|(k, ki)| (k.to_vec(), ki.clone())).collect(),
            log.iter().collect(),
            store.current_revision(),
            store.compacted_revision(),
        )
    }

    /// Operations on a store: puts (with a lease when `lease`), deletes, compactions, and
    /// saved-index refreshes, on a handful of keys.
    #[derive(Clone, Debug)]
    enum Op {
        Put { key: u8, lease: bool },
        Delete { key: u8 },
        Compact { back: u8 },
        Refresh,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0u8..12, any::<bool>()).prop_map(|(key, lease)| Op::Put { key, lease }),
            2 => (0u8..12).prop_map(|key| Op::Delete { key }),
            1 => (0u8..6).prop_map(|back| Op::Compact { back }),
            1 => Just(Op::Refresh),
        ]
    }

    fn target(store: &mut Store, epoch: u64) -> Target {
        store.flush().unwrap();
        let meta = store.meta();
        Target {
            epoch,
            compacted: meta.compacted,
            layout: meta.layout,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Whatever the history and wherever the saved index stops, opening with it builds
        /// the state a full scan builds, with the same leased keys.
        #[test]
        fn opening_with_the_saved_index_builds_what_the_scan_builds(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path().join(DATA_DIR);
            // Small files, so that histories span several.
            let mut store = Store::open(&data, 4096, None, None).unwrap().store;
            for op in ops {
                match op {
                    Op::Put { key, lease } => {
                        let mut w = store.write();
                        w.put(&[b'k', key], Bytes::from(vec![key; 40]), if lease { 7 } else { 0 }).unwrap();
                        w.end();
                    }
                    Op::Delete { key } => {
                        let mut w = store.write();
                        w.delete_range(&[b'k', key], &[]).unwrap();
                        w.end();
                    }
                    Op::Compact { back } => {
                        let at = store.current_revision() - i64::from(back);
                        if at > store.compacted_revision() {
                            store.compact(at).unwrap();
                        }
                    }
                    Op::Refresh => {
                        let t = target(&mut store, 1);
                        refresh(dir.path(), &t, When::Growing(0)).unwrap();
                    }
                }
            }
            let t = target(&mut store, 1);
            let meta = store.meta();
            let at = SavedAt { dir: dir.path(), epoch: 1 };
            let expected = state_of(&store);
            let leased_now = store.leased_keys().unwrap();
            drop(store);
            let scanned = Store::open(&data, 4096, Some(&meta), None).unwrap();
            proptest::prop_assert_eq!(&state_of(&scanned.store), &expected);
            proptest::prop_assert_eq!(&scanned.leased, &leased_now);
            drop(scanned);
            let opened = Store::open(&data, 4096, Some(&meta), Some(at)).unwrap();
            let saved = dir.path().join(crate::format::index::NAME).exists();
            proptest::prop_assert_eq!(opened.from_saved_index, saved, "a saved index that matches is used");
            proptest::prop_assert_eq!(&state_of(&opened.store), &expected);
            proptest::prop_assert_eq!(&opened.leased, &leased_now);
            drop(opened);
            // And once more with everything covered.
            refresh(dir.path(), &t, When::Closing(0)).unwrap();
            let opened = Store::open(&data, 4096, Some(&meta), Some(at)).unwrap();
            let saved = dir.path().join(crate::format::index::NAME).exists();
            proptest::prop_assert_eq!(opened.from_saved_index, saved);
            proptest::prop_assert!(saved || meta.layout.iter().all(|f| f.len == 0));
            proptest::prop_assert_eq!(&state_of(&opened.store), &expected);
            proptest::prop_assert_eq!(&opened.leased, &leased_now);
        }
    }
}
