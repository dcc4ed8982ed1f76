//! The MVCC store: keys with their full history, written at revisions.
//!
//! A write request runs as one [`WriteTxn`]: every change it makes shares the main revision
//! `current + 1`, with sub-revisions 0, 1, 2… in order, and the store's revision moves only if
//! something changed (a delete of nothing, or a read-only request, leaves it). Reads name a
//! revision (0 for the current one) and see the store exactly as it was then, unless
//! compaction has dropped that history.
//!
//! Every change is a record in the backend's data files (a put's value, lease, create revision
//! and version, or a tombstone); the revision log says where each record still in history
//! lives, and the key index which revision each key's value is at.

use std::ops::Bound;
use std::path::Path;

use bytes::Bytes;

use super::index::{Index, KeyRange};
use super::key_index::{Found, KeyIndexError};
use super::revision_log::RevisionLog;
use super::saved_index::{self, SavedAt};
use crate::backend::record::{self, Record};
use crate::backend::{Backend, FileLen, FileMaker, Mark};
use crate::error::{Error, Failure, Result};
use crate::revision::Revision;

/// A key as a read returns it (etcd's `mvccpb.KeyValue`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key; never empty.
    pub key: Bytes,
    /// The revision of the put that created the key (in its current generation).
    pub create_revision: i64,
    /// The revision of the last put.
    pub mod_revision: i64,
    /// Puts since creation: 1 on create.
    pub version: i64,
    /// The value; empty when read with `keys_only`, and in a delete event.
    pub value: Bytes,
    /// The attached lease, 0 for none.
    pub lease: i64,
}

/// What a change of `key` with `value` takes in the backend (padding included).
pub(crate) fn record_size(key: usize, value: usize) -> u64 {
    record::padded(record::HEADER_LEN + key + value) as u64
}

/// What happened to a key at a revision (etcd's `mvccpb.Event`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Whether the key was put or deleted.
    pub kind: EventKind,
    /// The key after the change; for a delete, only `key` and `mod_revision` (the deletion's
    /// revision) are set.
    pub kv: KeyValue,
    /// The key before the change, if it existed.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    /// `kv` put, over `prev_kv`.
    fn put(kv: KeyValue, prev_kv: Option<KeyValue>) -> Event {
        Event {
            kind: EventKind::Put,
            kv,
            prev_kv,
        }
    }

    /// `key` deleted at revision `main`: its key-value is the key and the revision alone.
    fn deleted(key: Bytes, main: i64, prev_kv: Option<KeyValue>) -> Event {
        let kv = KeyValue {
            key,
            create_revision: 0,
            mod_revision: main,
            version: 0,
            value: Bytes::new(),
            lease: 0,
        };
        Event {
            kind: EventKind::Delete,
            kv,
            prev_kv,
        }
    }
}

/// What a change did to a key (etcd's `mvccpb.Event.EventType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was put: created, or overwritten with a new version.
    Put,
    /// The key was deleted, by a DeleteRange or a lease's revocation.
    Delete,
}

/// Which history a hash covers: the changes up to revision `to`, as of compaction at
/// `compacted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HashScope {
    pub(crate) to: i64,
    pub(crate) compacted: i64,
}

/// etcd's `HashKV` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HashKv {
    /// CRC-32 over every change still in history up to `hash_revision`.
    pub hash: u32,
    /// The store's compacted revision, 0 if never compacted (etcd's `compact_revision`).
    pub compact_revision: i64,
    /// The revision hashed up to: the one asked for, or the current one for 0 (etcd's
    /// `hash_revision`).
    pub hash_revision: i64,
}

impl HashKv {
    /// A hash as another member reported it.
    pub fn new(hash: u32, compact_revision: i64, hash_revision: i64) -> HashKv {
        HashKv {
            hash,
            compact_revision,
            hash_revision,
        }
    }
}

/// How to read a range (etcd's `RangeRequest` options, less sorting and filters, which the
/// request layer applies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// The revision to read at; 0 or less for the current one.
    pub revision: i64,
    /// At most this many keys; 0 for no limit.
    pub limit: usize,
    /// Return keys without values.
    pub keys_only: bool,
    /// Return only the count.
    pub count_only: bool,
}

/// The answer to a range read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResult {
    /// The key-values found, in key order, at most `limit`; none for `count_only`.
    pub kvs: Vec<KeyValue>,
    /// Keys in the range at that revision, ignoring the limit.
    pub count: usize,
    /// Whether keys remain beyond the limit.
    pub more: bool,
    /// The revision the read was served at.
    pub revision: i64,
}

/// The store's state.
#[derive(Debug)]
pub struct Store {
    index: Index,
    pub(super) log: RevisionLog,
    pub(super) backend: Backend,
    /// The newest revision. Invariant: `compacted <= current`.
    current: i64,
    /// History below this revision is gone.
    compacted: i64,
    /// Physical compaction still under way: reads already behave as if it were done.
    compacting: Option<Compaction>,
    /// Snapshots being streamed and hashes being taken: the compaction sweep waits for them
    /// (their records must stay).
    pub(crate) pinned: usize,
    /// A defragmentation is copying: the sweep waits for it too. Dropping records between
    /// its batches would leave in the copies a key's earlier record without the later one
    /// (a put without its delete), which a store rebuilt from the files would then resurrect.
    pub(super) defragmenting: bool,
    /// The events of the write requests since [`Store::take_events`], when recording (someone
    /// watches): each change's event, built from what the write had at hand.
    events: Option<Vec<Event>>,
}

/// What a checkpoint records of a store: the rest is rebuilt from the data files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoreMeta {
    pub(crate) current: i64,
    pub(crate) compacted: i64,
    pub(crate) layout: Vec<FileLen>,
}

/// A store opened, with what the lessor needs of it.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) store: Store,
    /// Every key that exists with a lease attached, as changes from none, in key order.
    pub(crate) leased: Vec<LeaseChange>,
    /// Whether a saved index was loaded (and only the records after it scanned).
    pub(crate) from_saved_index: bool,
}

fn disagree(rev: Revision, e: KeyIndexError) -> Error {
    Error::Backend(Failure::caused_by(format!("data files disagree at revision {rev}"), e))
}

/// Leased keys as `leased` (in key order) says, with the later changes of `changed` (each
/// key's lease now, 0 for none or deleted) over them, in key order.
fn merge_leases(leased: Vec<(Box<[u8]>, i64)>, changed: std::collections::BTreeMap<Vec<u8>, i64>) -> Vec<LeaseChange> {
    let kept = leased.into_iter().filter(|(k, _)| !changed.contains_key(&**k));
    let mut all: Vec<(Bytes, i64)> = kept.map(|(k, l)| (Bytes::from(Vec::from(k)), l)).collect();
    all.extend(
        changed
            .into_iter()
            .filter(|(_, l)| *l != 0)
            .map(|(k, l)| (Bytes::from(k), l)),
    );
    all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    all.into_iter()
        .map(|(key, to)| LeaseChange { key, from: 0, to })
        .collect()
}

/// Physical compaction in progress: keys before `next_key` are done.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Compaction {
    at: i64,
    next_key: Vec<u8>,
}

fn internal(e: KeyIndexError) -> Error {
    Error::Internal(Failure::caused_by("the key index", e))
}

impl Compaction {
    fn with_next(self, next_key: Vec<u8>) -> Compaction {
        Compaction { next_key, ..self }
    }
}

impl Default for Store {
    /// An empty store in memory, at revision 1 as etcd's: the first write gets revision 2.
    fn default() -> Self {
        Store::with_backend(Backend::in_memory(IN_MEMORY_FILE_SIZE))
    }
}

/// Data "files" of a store in memory.
const IN_MEMORY_FILE_SIZE: usize = 1 << 20;

/// Changes since a revision that a count at that revision reads back through at most (each
/// one's record, for its key); past that, the range is walked.
const COUNT_BACK: usize = 1 << 16;

impl Store {
    /// An empty store in memory at revision 1, as etcd's: the first write gets revision 2.
    pub fn new() -> Store {
        Store::default()
    }

    fn with_backend(backend: Backend) -> Store {
        Store {
            index: Index::default(),
            log: RevisionLog::default(),
            backend,
            current: 1,
            compacted: 0,
            compacting: None,
            pinned: 0,
            defragmenting: false,
            events: None,
        }
    }

    /// Opens the store kept in `data_dir`: the state `meta` describes (none: a new store),
    /// from the saved index at `saved` and the records after it, or, without one that
    /// matches, by scanning every record of its data files.
    pub(crate) fn open(
        data_dir: &Path,
        file_size: u64,
        meta: Option<&StoreMeta>,
        saved: Option<SavedAt<'_>>,
    ) -> Result<Opened> {
        let layout = meta.map(|m| m.layout.as_slice()).unwrap_or_default();
        let mut store = Store::with_backend(Backend::open(data_dir, file_size, layout)?);
        let Some(meta) = meta else {
            return Ok(Opened {
                store,
                leased: Vec::new(),
                from_saved_index: false,
            });
        };
        if let Some(at) = saved {
            match store.load_saved(at, meta) {
                Ok(Some(leased)) => {
                    return Ok(Opened {
                        store,
                        leased,
                        from_saved_index: true,
                    })
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "not using the saved key index: scanning every record");
                    store = Store::with_backend(store.backend);
                }
            }
        }
        store.scan_all(meta.current, meta.compacted)?;
        let leased = store.leased_keys()?;
        Ok(Opened {
            store,
            leased,
            from_saved_index: false,
        })
    }

    /// Loads the saved index at `at` and scans the records after it: the leased keys, or
    /// `None` if there is no saved index. An error leaves the store to be rebuilt.
    fn load_saved(&mut self, at: SavedAt<'_>, meta: &StoreMeta) -> Result<Option<Vec<LeaseChange>>> {
        let Some(loaded) = saved_index::load(at, &self.backend, &meta.layout, meta.compacted)? else {
            return Ok(None);
        };
        (self.index, self.log) = (loaded.index, loaded.log);
        let mut changed = std::collections::BTreeMap::new();
        let Store {
            index, log, backend, ..
        } = self;
        backend.scan_after(&loaded.covered, |loc, record| {
            index
                .restore(record.key, record.rev, record.created, record.version)
                .map_err(|e| disagree(record.rev, e))?;
            log.insert(record.rev, loc);
            let lease = if record.is_tombstone() { 0 } else { record.lease };
            changed.insert(record.key.to_vec(), lease);
            Ok(())
        })?;
        self.current = meta.current;
        if meta.compacted > loaded.compacted {
            // Compacted since the index was saved: every key may have history to drop.
            self.begin_compaction(meta.compacted)?;
            while self.compaction_step(usize::MAX) {}
        } else {
            // The saved keys are compacted at this revision already, and the records after
            // the index all come after it (the index covered every record of a checkpoint
            // at or after the compaction): nothing is left to drop. Only the keys those
            // records changed are looked at, to be sure; no full sweep.
            self.compacted = meta.compacted;
            if meta.compacted > 0 {
                for key in changed.keys() {
                    let (dropped, _) = self.index.compact_batch(meta.compacted, key, 1);
                    debug_assert!(dropped.is_empty(), "a record after the saved index was compacted");
                    for rev in &dropped {
                        self.log.remove(rev);
                    }
                }
            }
        }
        Ok(Some(merge_leases(loaded.leased, changed)))
    }

    /// The store whose records `backend` holds, at revision `current`, compacted at
    /// `compacted`: the index and revision log are rebuilt by scanning the records.
    pub(crate) fn rebuild(backend: Backend, current: i64, compacted: i64) -> Result<Store> {
        let mut store = Store::with_backend(backend);
        store.scan_all(current, compacted)?;
        Ok(store)
    }

    /// Builds the index and revision log by scanning every record, then compacts.
    fn scan_all(&mut self, current: i64, compacted: i64) -> Result<()> {
        let Store {
            index, log, backend, ..
        } = self;
        backend.scan(|loc, record| {
            index
                .restore(record.key, record.rev, record.created, record.version)
                .map_err(|e| disagree(record.rev, e))?;
            log.insert(record.rev, loc);
            Ok(())
        })?;
        self.current = current;
        if compacted > 0 {
            self.begin_compaction(compacted)?;
            while self.compaction_step(usize::MAX) {}
        }
        Ok(())
    }

    /// The key index and the revision log (to compare stores built two ways).
    #[cfg(test)]
    pub(crate) fn parts(&self) -> (&Index, &RevisionLog) {
        (&self.index, &self.log)
    }

    /// What creates this store's data files (for a state built beside it).
    pub(crate) fn file_maker(&self) -> FileMaker {
        self.backend.maker()
    }

    /// The paths of every data file of this store (to delete once it is replaced).
    pub(crate) fn file_paths(&self) -> Vec<std::path::PathBuf> {
        self.backend.file_paths()
    }

    /// Writes buffered records to the data files, so that [`Store::meta`] names them.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.backend.flush()
    }

    /// Drops the data files' pages from the process's resident set: after opening, which
    /// read them all, they are the page cache's, not this process's working set.
    pub(crate) fn release_pages(&self) {
        self.backend.release_pages();
    }

    /// What a checkpoint records of the store. Call [`Store::flush`] first.
    pub(crate) fn meta(&self) -> StoreMeta {
        StoreMeta {
            current: self.current,
            compacted: self.compacted,
            layout: self.backend.layout(),
        }
    }

    /// The newest revision (1 for an empty, never written store, as in etcd).
    pub fn current_revision(&self) -> i64 {
        self.current
    }

    /// The revision history was compacted at (0 if never).
    pub fn compacted_revision(&self) -> i64 {
        self.compacted
    }

    /// Bytes of history kept, in the backend's record format (what the quota limits).
    pub fn size_in_use(&self) -> u64 {
        self.log.bytes()
    }

    /// Bytes of records the data files hold, history no longer kept included (what
    /// defragmentation returns to the file system), preallocated space not counted.
    pub fn size(&self) -> u64 {
        self.backend.held_bytes()
    }

    /// Keys that exist now.
    pub fn key_count(&self) -> usize {
        self.index.live()
    }

    fn read_revision(&self, requested: i64) -> Result<i64> {
        if requested <= 0 {
            return Ok(self.current);
        }
        if requested > self.current {
            return Err(Error::FutureRevision {
                requested,
                current: self.current,
            });
        }
        if requested < self.compacted {
            return Err(Error::Compacted {
                requested,
                compacted: self.compacted,
            });
        }
        Ok(requested)
    }

    /// How many keys of `range` existed at revision `at`, without walking the range, when
    /// the index holds nothing after the current revision: now, the index's live counts; at an
    /// earlier revision (a paged list's later pages), the count now corrected by the keys
    /// changed since, which the revision log names. `None` when more than [`COUNT_BACK`]
    /// changes came since: the caller walks the range instead.
    fn count_at(&self, range: &KeyRange, at: i64) -> Result<Option<usize>> {
        let now = match range.is_everything() {
            true => self.index.live(),
            false => self.index.count_live(range),
        };
        if at == self.current {
            return Ok(Some(now));
        }
        let mut changed = Vec::new();
        let since = self
            .log
            .range(Bound::Included(Revision::new(at + 1, 0)), Bound::Unbounded);
        for (n, (_, loc)) in since.enumerate() {
            if n == COUNT_BACK {
                return Ok(None);
            }
            let key = self.backend.read(loc)?.key;
            if range.contains(key) {
                changed.push(key);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        let (mut gone, mut new) = (0, 0);
        for key in changed {
            match (
                self.index.get(key, at).is_some(),
                self.index.get(key, self.current).is_some(),
            ) {
                (true, false) => gone += 1,
                (false, true) => new += 1,
                _ => {}
            }
        }
        let count = (now + gone).saturating_sub(new);
        debug_assert_eq!(count, self.index.range(range, at, 0, false).count, "the count at {at}");
        Ok(Some(count))
    }

    fn record(&self, rev: Revision) -> Result<Record<'_>> {
        let loc = self
            .log
            .get(&rev)
            .ok_or_else(|| Error::internal(format!("no record stored for revision {rev}")))?;
        self.backend.read(loc)
    }

    /// The key's value as found in the index. Keys only are answered from the index alone,
    /// without reading the record, so without the lease, as etcd 3.7 answers them (its
    /// `FastKeysOnly`): kube-apiserver 1.34+ reads every resource's whole prefix keys-only
    /// each minute, and none of it needs the values' pages.
    fn key_value(&self, key: &[u8], found: Found, keys_only: bool) -> Result<KeyValue> {
        if keys_only {
            return Ok(KeyValue {
                key: Bytes::copy_from_slice(key),
                create_revision: found.created.main,
                mod_revision: found.modified.main,
                version: found.version,
                value: Bytes::new(),
                lease: 0,
            });
        }
        let record = self.record(found.modified)?;
        if record.is_tombstone() {
            return Err(Error::internal(format!("revision {} is a tombstone", found.modified)));
        }
        Ok(KeyValue {
            key: Bytes::copy_from_slice(key),
            create_revision: found.created.main,
            mod_revision: found.modified.main,
            version: found.version,
            value: Bytes::copy_from_slice(record.value),
            lease: record.lease,
        })
    }

    /// Reads the keys of `range` as of `opts.revision`.
    pub fn range(&self, key: &[u8], range_end: &[u8], opts: ReadOptions) -> Result<RangeResult> {
        let at = self.read_revision(opts.revision)?;
        self.range_at(&KeyRange::new(key, range_end), at, opts, true)
    }

    /// A range at revision `at`. `settled`: the index holds nothing after the current
    /// revision (no write request is under way), so its live-key counts are the counts now.
    fn range_at(&self, range: &KeyRange, at: i64, opts: ReadOptions, settled: bool) -> Result<RangeResult> {
        let limit = if opts.count_only { 1 } else { opts.limit };
        // Keys now: the index keeps counts (of every key, and of each leaf's), so only
        // `limit` keys are walked, and the two ends of the range counted.
        let counted = match settled {
            true => self.count_at(range, at)?,
            false => None,
        };
        let found = if let Some(count) = counted {
            let mut found = self.index.range(range, at, limit, true);
            found.count = count;
            found
        } else {
            self.index.range(range, at, limit, false)
        };
        let mut kvs = Vec::new();
        if !opts.count_only {
            kvs.reserve(found.keys.len());
            for (key, f) in &found.keys {
                kvs.push(self.key_value(key, *f, opts.keys_only)?);
            }
        }
        Ok(RangeResult {
            more: opts.limit != 0 && found.count > opts.limit,
            count: found.count,
            kvs,
            revision: at,
        })
    }

    /// Starts a write request. Its changes share one revision; drop it or call
    /// [`WriteTxn::end`] to finish.
    pub fn write(&mut self) -> WriteTxn<'_> {
        let main = self.current + 1;
        let mark = self.backend.mark();
        let events_before = self.events.as_ref().map_or(0, Vec::len);
        WriteTxn {
            store: self,
            main,
            sub: 0,
            lease_changes: Vec::new(),
            undo: Vec::new(),
            mark,
            events_before,
            finished: false,
        }
    }

    /// Whether write requests record their events from now on (for watchers), to be taken
    /// with [`Store::take_events`]. Off, nothing is recorded and what was is dropped.
    pub(crate) fn record_events(&mut self, on: bool) {
        match (on, &self.events) {
            (true, None) => self.events = Some(Vec::new()),
            (false, Some(_)) => self.events = None,
            _ => {}
        }
    }

    /// The events recorded since the last call, in revision order: each put with the key's
    /// new version and its previous value, each delete with the value it deleted.
    pub(crate) fn take_events(&mut self) -> Vec<Event> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Drops the history below `revision`: reads below it fail with [`Error::Compacted`], and
    /// each key keeps its newest version at or below it. All at once; the engine compacts at
    /// once logically but drops the history in bounded steps between requests.
    pub fn compact(&mut self, revision: i64) -> Result<()> {
        self.begin_compaction(revision)?;
        while self.compaction_step(usize::MAX) {}
        Ok(())
    }

    /// Compacts at `revision` logically, at once: reads below it fail, and everything a read,
    /// a watch or HashKV can observe is as after compaction. The history is dropped later, a
    /// batch of keys per [`Store::compaction_step`]; a newer compaction restarts the sweep.
    pub(crate) fn begin_compaction(&mut self, revision: i64) -> Result<()> {
        if revision <= self.compacted {
            return Err(Error::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        if revision > self.current {
            return Err(Error::FutureRevision {
                requested: revision,
                current: self.current,
            });
        }
        self.compacted = revision;
        self.compacting = Some(Compaction {
            at: revision,
            next_key: Vec::new(),
        });
        Ok(())
    }

    /// Drops the compacted history of up to `keys` keys; returns whether any is left. Waits
    /// (does nothing) while a snapshot is being streamed or the files defragmented.
    pub(crate) fn compaction_step(&mut self, keys: usize) -> bool {
        if self.sweep_paused() {
            return false;
        }
        let Some(c) = self.compacting.take() else {
            return false;
        };
        let (dropped, next) = self.index.compact_batch(c.at, &c.next_key, keys);
        for rev in &dropped {
            self.log.remove(rev);
        }
        self.compacting = next.map(|next_key| c.with_next(next_key));
        self.compacting.is_some()
    }

    /// Whether a compaction's sweep has history left to drop (paused by a snapshot or not).
    pub(crate) fn compaction_unfinished(&self) -> bool {
        self.compacting.is_some()
    }

    /// Whether the sweep has work to do now: unfinished and not paused.
    pub(crate) fn compaction_pending(&self) -> bool {
        self.compacting.is_some() && !self.sweep_paused()
    }

    fn sweep_paused(&self) -> bool {
        self.pinned > 0 || self.defragmenting
    }

    /// Ends a defragmentation that failed before its switch: the sweep resumes.
    pub(crate) fn abandon_defrag(&mut self) {
        self.defragmenting = false;
    }

    /// Whether the change at `rev` of `key` is still history as of compaction at `compacted`:
    /// after it, or the value each key keeps at it. Changes the sweep has not dropped yet are
    /// not.
    fn visible(&self, rev: &Revision, key: &[u8], compacted: i64) -> bool {
        rev.main > compacted || self.index.get(key, compacted).is_some_and(|f| f.modified == *rev)
    }

    /// The events of `revisions` on keys of `range`, in revision order, whole revisions only,
    /// stopping after the revision that reaches `limit` events (0: no limit), with each
    /// change's previous value if `with_prev`. The first revision must not be below the
    /// compacted revision (the caller checks).
    pub(crate) fn events(
        &self,
        revisions: std::ops::RangeInclusive<i64>,
        range: &KeyRange,
        limit: usize,
        with_prev: bool,
    ) -> Result<Vec<Event>> {
        let (from, to) = revisions.into_inner();
        let mut out: Vec<Event> = Vec::new();
        let span = (
            Bound::Included(Revision::new(from, 0)),
            Bound::Included(Revision::new(to, i64::MAX)),
        );
        for (rev, loc) in self.log.range(span.0, span.1) {
            if limit != 0 && out.len() >= limit && out.last().is_some_and(|e| e.kv.mod_revision != rev.main) {
                break;
            }
            let record = self.backend.read(loc)?;
            if !range.contains(record.key) || !self.visible(&rev, record.key, self.compacted) {
                continue;
            }
            // Below the compacted revision the previous value is gone (or going).
            let prev_kv = match self.index.get(record.key, rev.main - 1) {
                Some(found) if with_prev && rev.main > self.compacted => {
                    Some(self.key_value(record.key, found, false)?)
                }
                _ => None,
            };
            let key = Bytes::copy_from_slice(record.key);
            let event = if record.is_tombstone() {
                Event::deleted(key, rev.main, prev_kv)
            } else {
                let kv = KeyValue {
                    key,
                    create_revision: record.created.main,
                    mod_revision: rev.main,
                    version: record.version,
                    value: Bytes::copy_from_slice(record.value),
                    lease: record.lease,
                };
                Event::put(kv, prev_kv)
            };
            out.push(event);
        }
        Ok(out)
    }

    /// A hash of the history still kept, up to `revision` (0 for the current one): members that
    /// applied the same log, and compacted at the same revision, agree on it, across restarts.
    /// All under one borrow; the engine hashes a chunk at a time ([`Store::hash_chunk`]).
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        let at = self.hash_revision(revision)?;
        let mut hasher = crc32fast::Hasher::new();
        let mut after = None;
        let scope = HashScope {
            to: at,
            compacted: self.compacted,
        };
        while let Some(last) = self.hash_chunk(&mut hasher, after, scope, usize::MAX)? {
            after = Some(last);
        }
        Ok(HashKv {
            hash: hasher.finalize(),
            compact_revision: self.compacted,
            hash_revision: at,
        })
    }

    /// The revision HashKV of `revision` hashes up to (0: the current one).
    pub(crate) fn hash_revision(&self, revision: i64) -> Result<i64> {
        // etcd refuses the compacted revision itself too (reads accept it).
        if revision > 0 && self.compacted > 0 && revision <= self.compacted {
            return Err(Error::Compacted {
                requested: revision,
                compacted: self.compacted,
            });
        }
        self.read_revision(revision)
    }

    /// Adds to `hasher` the changes in history `scope` covers after revision `after` (none:
    /// from the start), at most `limit` looked at. Returns the last revision looked at
    /// (`None`: nothing was left). The caller keeps the history from being swept between
    /// chunks (the store's pin).
    pub(crate) fn hash_chunk(
        &self,
        hasher: &mut crc32fast::Hasher,
        after: Option<Revision>,
        scope: HashScope,
        limit: usize,
    ) -> Result<Option<Revision>> {
        let HashScope { to, compacted } = scope;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = None;
        for (rev, loc) in self
            .log
            .range(from, Bound::Included(Revision::new(to, i64::MAX)))
            .take(limit)
        {
            last = Some(rev);
            let record = self.backend.read(loc)?;
            if !self.visible(&rev, record.key, compacted) {
                continue;
            }
            hasher.update(&rev.encode());
            hasher.update(&(record.key.len() as u64).to_be_bytes());
            hasher.update(record.key);
            if record.is_tombstone() {
                hasher.update(&[0]);
            } else {
                hasher.update(&[1]);
                hasher.update(&(record.value.len() as u64).to_be_bytes());
                hasher.update(record.value);
                hasher.update(&record.lease.to_be_bytes());
            }
        }
        Ok(last)
    }

    /// Every key that exists now with a lease attached, as lease changes from none (for the
    /// lessor to rebuild its key sets from).
    pub(crate) fn leased_keys(&self) -> Result<Vec<LeaseChange>> {
        let mut out = Vec::new();
        for (key, found) in self
            .index
            .range(&KeyRange::new(&[0], &[0]), self.current, 0, false)
            .keys
        {
            let lease = self.record(found.modified)?.lease;
            if lease != 0 {
                out.push(LeaseChange {
                    key: Bytes::from(key),
                    from: 0,
                    to: lease,
                });
            }
        }
        Ok(out)
    }

    /// The records in history as of compaction at `compacted`, after revision `after` (none:
    /// from the start) up to revision `to`, encoded; at most `limit` looked at. Returns them
    /// and the last revision looked at (`None`: nothing left).
    pub(crate) fn export_chunk(
        &self,
        after: Option<Revision>,
        to: i64,
        compacted: i64,
        limit: usize,
    ) -> Result<(Chunk, Option<Revision>)> {
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Chunk::default();
        let mut last = None;
        for (rev, loc) in self
            .log
            .range(from, Bound::Included(Revision::new(to, i64::MAX)))
            .take(limit)
        {
            let record = self.backend.read(loc)?;
            if self.visible(&rev, record.key, compacted) {
                out.push(&record)?;
            }
            last = Some(rev);
        }
        Ok((out, last))
    }
}

/// Records exported together, encoded back to back in one buffer (one allocation a chunk, not
/// one a record).
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    /// The records, each in the record format and padded.
    pub(crate) bytes: Vec<u8>,
    pub(crate) count: u64,
}

impl Chunk {
    fn push(&mut self, record: &Record<'_>) -> Result<()> {
        let at = self.bytes.len();
        self.bytes.resize(at + record.padded_len(), 0);
        record
            .encode_into(self.bytes.get_mut(at..).unwrap_or_default())
            .ok_or_else(|| Error::internal("a record to export does not encode"))?;
        self.count += 1;
        Ok(())
    }

    /// The records, in order.
    pub(crate) fn records(&self) -> impl Iterator<Item = Result<Record<'_>>> {
        let mut rest = self.bytes.as_slice();
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            Some(match record::decode(rest) {
                Ok((record, len)) => {
                    rest = rest.get(len..).unwrap_or_default();
                    Ok(record)
                }
                Err(e) => {
                    rest = &[];
                    Err(Error::Snapshot(Failure::caused_by(
                        "an exported record does not decode",
                        e,
                    )))
                }
            })
        })
    }
}

/// A key whose attached lease a write changed (0: no lease), for the lessor to follow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseChange {
    pub(crate) key: Bytes,
    pub(crate) from: i64,
    pub(crate) to: i64,
}

/// One change a [`WriteTxn`] made to the key index, to take back if the request fails.
#[derive(Debug)]
struct Undo {
    key: Vec<u8>,
    rev: Revision,
    /// Whether the change was a delete.
    tombstone: bool,
    /// The key's `modified` before it (`None`: no history before).
    previous: Option<Revision>,
}

/// One write request in progress (see the module docs). Dropped without
/// [`WriteTxn::end`], it undoes every change it made: a write request is applied whole or
/// not at all.
#[derive(Debug)]
pub struct WriteTxn<'a> {
    store: &'a mut Store,
    main: i64,
    /// Changes made so far; the next one's sub-revision.
    sub: i64,
    lease_changes: Vec<LeaseChange>,
    /// Every change made, in order, to take back.
    undo: Vec<Undo>,
    /// Where the data files ended before the request, to cut its records off again.
    mark: Mark,
    /// How many events were recorded before the request, to drop its own again.
    events_before: usize,
    finished: bool,
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if self.finished || self.sub == 0 {
            return;
        }
        for Undo {
            key,
            rev,
            tombstone,
            previous,
        } in std::mem::take(&mut self.undo).into_iter().rev()
        {
            self.store.index.undo(&key, rev, tombstone, previous);
        }
        // Newest first: each is then the log's last entry, taken off its end.
        for sub in (0..self.sub).rev() {
            self.store.log.remove(&Revision::new(self.main, sub));
        }
        self.store.backend.rollback(self.mark);
        if let Some(events) = &mut self.store.events {
            events.truncate(self.events_before);
        }
    }
}

impl WriteTxn<'_> {
    fn next_revision(&mut self) -> Revision {
        let rev = Revision::new(self.main, self.sub);
        self.sub += 1;
        rev
    }

    /// The revision reads inside this request see: its own writes included.
    fn read_at(&self) -> i64 {
        if self.sub > 0 {
            self.main
        } else {
            self.store.current
        }
    }

    /// Appends the record of `change` to `key` at `rev` and logs where it is.
    fn append(&mut self, key: &[u8], rev: Revision, change: Change<'_>) -> Result<()> {
        let (value, lease, created, version) = match change {
            Change::Put { value, lease, found } => (value, lease, found.created, found.version),
            Change::Tombstone => (&[][..], 0, Revision::default(), 0),
        };
        let record = Record {
            rev,
            created,
            version,
            lease,
            key,
            value,
        };
        let loc = self.store.backend.append(&record)?;
        self.store.log.insert(rev, loc);
        Ok(())
    }

    /// `key` as it was before this request, which an event's previous value is (as in etcd),
    /// given what it is now within the request (`at_found`, read as `at_kv`): the same unless
    /// the request changed the key already. `first_change`: nothing in the request changed
    /// anything before, so the key is as it was before the request.
    fn before_request(
        &self,
        key: &[u8],
        first_change: bool,
        at_found: Option<Found>,
        at_kv: &Option<KeyValue>,
    ) -> Result<Option<KeyValue>> {
        if first_change {
            return Ok(at_kv.clone());
        }
        match self.store.index.get(key, self.main - 1) {
            before if before == at_found => Ok(at_kv.clone()),
            Some(found) => self.store.key_value(key, found, false).map(Some),
            None => Ok(None),
        }
    }

    /// Puts `value` at `key`; returns the previous key-value, if the key existed.
    pub fn put(&mut self, key: &[u8], value: Bytes, lease: i64) -> Result<Option<KeyValue>> {
        self.put_reading(key, value, lease, true)
    }

    /// Puts `value` at `key`, for a caller that does not want the previous key-value: its
    /// value is read only if a watcher wants it for its event, its lease always (the lessor
    /// follows which keys each lease holds).
    pub(crate) fn put_only(&mut self, key: &[u8], value: Bytes, lease: i64) -> Result<()> {
        self.put_reading(key, value, lease, false).map(drop)
    }

    /// [`WriteTxn::put`], returning the previous key-value only if `want_previous`. The index
    /// is changed first, in one lookup that also finds the key as it was, and its undo is
    /// recorded before anything that can fail.
    fn put_reading(&mut self, key: &[u8], value: Bytes, lease: i64, want_previous: bool) -> Result<Option<KeyValue>> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let first_change = self.sub == 0;
        let rev = self.next_revision();
        let put = self.store.index.put(key, rev).map_err(internal)?;
        self.undo.push(Undo {
            key: key.to_vec(),
            rev,
            tombstone: false,
            previous: put.previous,
        });
        let watched = self.store.events.is_some();
        let prev = match put.before {
            Some(found) if want_previous || watched => Some(self.store.key_value(key, found, false)?),
            _ => None,
        };
        let from = match (&prev, put.before) {
            (Some(kv), _) => kv.lease,
            (None, Some(found)) => self.store.record(found.modified)?.lease,
            (None, None) => 0,
        };
        if from != lease {
            let key = Bytes::copy_from_slice(key);
            self.lease_changes.push(LeaseChange { key, from, to: lease });
        }
        let event_prev = match watched {
            true => self.before_request(key, first_change, put.before, &prev)?,
            false => None,
        };
        self.append(
            key,
            rev,
            Change::Put {
                value: &value,
                lease,
                found: put.now,
            },
        )?;
        if let Some(events) = &mut self.store.events {
            let kv = KeyValue {
                key: Bytes::copy_from_slice(key),
                create_revision: put.now.created.main,
                mod_revision: rev.main,
                version: put.now.version,
                value,
                lease,
            };
            events.push(Event::put(kv, event_prev));
        }
        Ok(prev)
    }

    /// Deletes the keys of the range; returns the deleted key-values.
    pub fn delete_range(&mut self, key: &[u8], range_end: &[u8]) -> Result<Vec<KeyValue>> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let at = self.read_at();
        let keys = self.store.index.live_keys(&KeyRange::new(key, range_end));
        let mut deleted = Vec::with_capacity(keys.len());
        for k in keys {
            let mut prev_kv = None;
            let at_found = self.store.index.get(&k, at);
            if let Some(found) = at_found {
                let kv = self.store.key_value(&k, found, false)?;
                if kv.lease != 0 {
                    self.lease_changes.push(LeaseChange {
                        key: kv.key.clone(),
                        from: kv.lease,
                        to: 0,
                    });
                }
                if self.store.events.is_some() {
                    prev_kv = self.before_request(&k, self.sub == 0, at_found, &Some(kv.clone()))?;
                }
                deleted.push(kv);
            }
            let previous = self.store.index.modified(&k);
            let rev = self.next_revision();
            self.store.index.tombstone(&k, rev).map_err(internal)?;
            self.undo.push(Undo {
                key: k.clone(),
                rev,
                tombstone: true,
                previous,
            });
            self.append(&k, rev, Change::Tombstone)?;
            if let Some(events) = &mut self.store.events {
                events.push(Event::deleted(Bytes::from(k), rev.main, prev_kv));
            }
        }
        Ok(deleted)
    }

    /// Reads inside the request, seeing its earlier writes.
    pub fn range(&self, key: &[u8], range_end: &[u8], opts: ReadOptions) -> Result<RangeResult> {
        let at = if opts.revision <= 0 {
            self.read_at()
        } else {
            self.store.read_revision(opts.revision)?
        };
        // Once this request has written, the index's live count includes its writes.
        self.store
            .range_at(&KeyRange::new(key, range_end), at, opts, self.sub == 0)
    }

    /// Finishes the request; returns the store's revision after it.
    pub fn end(self) -> i64 {
        self.finish().0
    }

    /// Finishes the request; returns the store's revision after it and the keys whose lease
    /// changed.
    pub(crate) fn finish(mut self) -> (i64, Vec<LeaseChange>) {
        self.finished = true;
        if self.sub > 0 {
            self.store.current = self.main;
        }
        (self.store.current, std::mem::take(&mut self.lease_changes))
    }
}

/// A change a write makes to one key, as its record holds it.
enum Change<'a> {
    /// The key now holds `value` with `lease`; `found` is its generation (creation revision
    /// and version) as the index has it after the put.
    Put { value: &'a [u8], lease: i64, found: Found },
    /// The key is deleted.
    Tombstone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(store: &mut Store, key: &str, value: Option<&str>) {
        let mut w = store.write();
        match value {
            Some(v) => {
                w.put(key.as_bytes(), Bytes::copy_from_slice(v.as_bytes()), 0).unwrap();
            }
            None => {
                w.delete_range(key.as_bytes(), &[]).unwrap();
            }
        }
        w.end();
    }

    /// A count at an earlier revision (a paged list's later pages) is the count now corrected
    /// by the keys changed since, and agrees with a walk of the range at that revision for
    /// every revision and range; within a request that has written, the range is walked.
    #[test]
    fn counts_at_earlier_revisions_agree_with_a_walk() {
        let mut store = Store::new();
        let mut revisions = Vec::new();
        for round in 0..4 {
            for k in 0..24 {
                let key = format!("k{k:02}");
                match (k + round) % 5 {
                    0 => write(&mut store, &key, None),
                    1 if round % 2 == 1 => {}
                    _ => write(&mut store, &key, Some("v")),
                }
            }
            revisions.push(store.current_revision());
        }
        let counted = |store: &Store, start: &str, end: &str, at: i64| {
            let opts = ReadOptions {
                revision: at,
                limit: 2,
                ..ReadOptions::default()
            };
            store.range(start.as_bytes(), end.as_bytes(), opts).unwrap().count
        };
        for at in revisions {
            for (start, end) in [("k00", "k24"), ("k05", "k13"), ("k07", ""), ("\0", "\0"), ("k20", "\0")] {
                let walked = store
                    .index
                    .range(&KeyRange::new(start.as_bytes(), end.as_bytes()), at, 0, false)
                    .count;
                assert_eq!(counted(&store, start, end, at), walked, "[{start}, {end}) at {at}");
            }
        }
        // Inside a request that has written, the index is ahead of the current revision.
        let before = store.range(b"k00", b"k99", ReadOptions::default()).unwrap().count;
        let mut w = store.write();
        w.put(b"k30", Bytes::from_static(b"v"), 0).unwrap();
        let inside = w.range(b"k00", b"k99", ReadOptions::default()).unwrap();
        assert_eq!(inside.count, before + 1);
        w.end();
    }

    /// A put that does not return the previous key-value still tells the lessor which lease
    /// the key left, as a put that does: across requests, and within one request whose
    /// earlier put gave the key its lease.
    #[test]
    fn a_put_without_its_previous_value_still_moves_keys_between_leases() {
        let v = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        let change = |key: &str, from, to| LeaseChange { key: v(key), from, to };
        for returning in [true, false] {
            let mut store = Store::new();
            let put = |w: &mut WriteTxn<'_>, key: &str, value: &str, lease| match returning {
                true => w
                    .put(key.as_bytes(), v(value), lease)
                    .map(|prev| prev.map(|kv| kv.value)),
                false => w.put_only(key.as_bytes(), v(value), lease).map(|()| None),
            };
            let mut w = store.write();
            assert_eq!(put(&mut w, "a", "1", 7).unwrap(), None);
            assert_eq!(put(&mut w, "a", "2", 8).unwrap(), returning.then(|| v("1")));
            let (_, changes) = w.finish();
            assert_eq!(
                changes,
                [change("a", 0, 7), change("a", 7, 8)],
                "returning: {returning}"
            );
            let mut w = store.write();
            put(&mut w, "a", "3", 0).unwrap();
            put(&mut w, "b", "4", 0).unwrap();
            let (_, changes) = w.finish();
            assert_eq!(changes, [change("a", 8, 0)], "returning: {returning}");
            let got = store.range(b"a", &[], ReadOptions::default()).unwrap();
            assert_eq!((got.kvs[0].value.clone(), got.kvs[0].version), (v("3"), 3));
        }
    }

    /// The events a write records as it goes are the ones its history holds, read back from
    /// the data files as watchers catching up read them: every kind of change, one revision
    /// at a time.
    #[test]
    fn recorded_events_are_the_ones_the_history_holds() {
        let mut store = Store::new();
        store.record_events(true);
        let everything = KeyRange::new(&[0], &[0]);
        let check = |store: &mut Store, write: &dyn Fn(&mut WriteTxn<'_>)| {
            let mut w = store.write();
            write(&mut w);
            let rev = w.end();
            let recorded = store.take_events();
            let read = store.events(rev..=rev, &everything, 0, true).unwrap();
            assert!(!recorded.is_empty());
            assert_eq!(recorded, read, "at revision {rev}");
        };
        let v = |s: &str| Bytes::copy_from_slice(s.as_bytes());
        check(&mut store, &|w| {
            w.put(b"a", v("1"), 0).unwrap();
        });
        check(&mut store, &|w| {
            w.put(b"b", v("2"), 7).unwrap();
            w.put(b"c", v("3"), 0).unwrap();
        });
        check(&mut store, &|w| {
            w.put(b"a", v("overwritten"), 0).unwrap();
        });
        check(&mut store, &|w| {
            w.delete_range(b"b", b"d").unwrap();
            w.put(b"a", v("again"), 7).unwrap();
        });
        check(&mut store, &|w| {
            w.delete_range(b"a", &[]).unwrap();
        });
        check(&mut store, &|w| {
            w.put(b"a", v("new generation"), 0).unwrap();
        });
        // Keys the request puts, then deletes: each event's previous value is the key before
        // the request, as etcd's watchers see it.
        check(&mut store, &|w| {
            w.put(b"a", v("4"), 0).unwrap();
            w.put(b"c", v("5"), 0).unwrap();
            w.delete_range(b"a", b"d").unwrap();
        });
        // An abandoned write records nothing; one that changes nothing has nothing to record.
        {
            let mut w = store.write();
            w.put(b"z", v("never"), 0).unwrap();
        }
        let mut w = store.write();
        w.delete_range(b"x", &[]).unwrap();
        w.end();
        assert!(store.take_events().is_empty());
        // Not recording: nothing kept.
        store.record_events(false);
        let mut w = store.write();
        w.put(b"q", v("unwatched"), 0).unwrap();
        w.end();
        store.record_events(true);
        assert!(store.take_events().is_empty());
    }

    #[test]
    fn an_abandoned_write_request_leaves_no_trace() {
        let mut store = Store::new();
        write(&mut store, "a", Some("1"));
        write(&mut store, "b", Some("2"));
        let before = (store.hash_kv(0).unwrap(), store.size_in_use(), store.current_revision());
        {
            let mut w = store.write();
            w.put(b"a", Bytes::from_static(b"changed"), 0).unwrap();
            w.put(b"new", Bytes::from_static(b"key"), 0).unwrap();
            w.delete_range(b"b", &[]).unwrap();
            // Dropped without end(): an error stopped the request.
        }
        assert_eq!(
            (store.hash_kv(0).unwrap(), store.size_in_use(), store.current_revision()),
            before
        );
        let all = store.range(&[0], &[0], ReadOptions::default()).unwrap();
        let keys: Vec<&[u8]> = all.kvs.iter().map(|kv| kv.key.as_ref()).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b"]);
        assert_eq!(all.kvs[0].value, "1");
        // The next request takes the abandoned revision as if nothing happened.
        write(&mut store, "a", Some("2"));
        let a = store.range(b"a", &[], ReadOptions::default()).unwrap();
        assert_eq!((a.kvs[0].mod_revision, a.kvs[0].version), (4, 2));
    }

    #[test]
    fn an_abandoned_write_leaves_nothing_in_the_data_files_even_across_a_rotation() {
        // 4 KiB files hold a few records of 1 KiB: the abandoned request starts in one file
        // and ends in the next. Reopening scans the files: its records must not come back.
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 4096, None, None).unwrap().store;
        let big = |c: u8| Bytes::from(vec![c; 1000]);
        for k in ["a", "b"] {
            let mut w = store.write();
            w.put(k.as_bytes(), big(b'1'), 0).unwrap();
            w.end();
        }
        {
            let mut w = store.write();
            for k in ["c", "d", "e", "f", "g"] {
                w.put(k.as_bytes(), big(b'x'), 0).unwrap();
            }
            // Dropped without end(): abandoned.
        }
        let mut w = store.write();
        w.put(b"h", big(b'2'), 0).unwrap();
        w.end();
        store.flush().unwrap();
        let meta = store.meta();
        let expected = (
            store.range(&[0], &[0], ReadOptions::default()).unwrap(),
            store.hash_kv(0).unwrap(),
        );
        drop(store);
        let reopened = Store::open(dir.path(), 4096, Some(&meta), None).unwrap().store;
        let got = (
            reopened.range(&[0], &[0], ReadOptions::default()).unwrap(),
            reopened.hash_kv(0).unwrap(),
        );
        assert_eq!(got, expected);
        let keys: Vec<&[u8]> = got.0.kvs.iter().map(|kv| kv.key.as_ref()).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b", b"h"]);
        assert_eq!(got.0.kvs[2].mod_revision, 4, "h took the abandoned request's revision");
    }

    #[test]
    fn a_compaction_sweep_is_invisible_at_every_step() {
        let build = || {
            let mut s = Store::new();
            for i in 0..30 {
                let key = format!("k{}", i % 6);
                write(&mut s, &key, if i % 7 == 3 { None } else { Some("v") });
            }
            s
        };
        let (mut swept, mut at_once) = (build(), build());
        at_once.compact(20).unwrap();
        swept.begin_compaction(20).unwrap();
        let everything = KeyRange::new(&[0], &[0]);
        let same = |a: &Store, b: &Store| {
            assert_eq!(a.hash_kv(0).unwrap(), b.hash_kv(0).unwrap());
            for rev in 20..=a.current_revision() {
                let opts = ReadOptions {
                    revision: rev,
                    ..ReadOptions::default()
                };
                assert_eq!(a.range(&[0], &[0], opts).unwrap(), b.range(&[0], &[0], opts).unwrap());
            }
            assert_eq!(
                a.events(20..=31, &everything, 0, true).unwrap(),
                b.events(20..=31, &everything, 0, true).unwrap()
            );
        };
        let mut steps = 0;
        loop {
            same(&swept, &at_once);
            if !swept.compaction_step(1) {
                break;
            }
            steps += 1;
        }
        same(&swept, &at_once);
        assert!(steps >= 5, "one key per step");
        assert_eq!(swept.size_in_use(), at_once.size_in_use(), "the same history is left");
    }

    #[test]
    fn hash_kv_is_a_function_of_the_history() {
        let build = |last: &str| {
            let mut s = Store::new();
            write(&mut s, "a", Some("1"));
            write(&mut s, "b", Some("2"));
            write(&mut s, "a", None);
            write(&mut s, "c", Some(last));
            s
        };
        let (x, y, z) = (build("3"), build("3"), build("4"));
        let (mut cx, mut cz) = (build("3"), build("4"));
        assert_eq!(x.hash_kv(0).unwrap(), y.hash_kv(0).unwrap(), "same history, same hash");
        assert_ne!(x.hash_kv(0).unwrap().hash, z.hash_kv(0).unwrap().hash);
        // Revisions: a=2, b=3, delete a=4, c=5.
        assert_eq!(
            x.hash_kv(4).unwrap(),
            z.hash_kv(4).unwrap(),
            "they agree up to revision 4"
        );
        assert_ne!(
            x.hash_kv(3).unwrap().hash,
            x.hash_kv(4).unwrap().hash,
            "the tombstone counts"
        );
        assert!(matches!(x.hash_kv(6), Err(Error::FutureRevision { .. })));
        cx.compact(4).unwrap();
        cz.compact(4).unwrap();
        assert_eq!(cx.hash_kv(0).unwrap().compact_revision, 4);
        // Like etcd, HashKV refuses the compacted revision itself (a read accepts it).
        assert!(matches!(cx.hash_kv(4), Err(Error::Compacted { .. })));
        assert!(matches!(cx.hash_kv(3), Err(Error::Compacted { .. })));
    }
}
