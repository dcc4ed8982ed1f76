//! The MVCC store: keys with their full history, written at revisions.
//!
//! A write request runs as one [`WriteTxn`]: every change it makes shares the main revision
//! `current + 1`, with sub-revisions 0, 1, 2… in order, and the store's revision moves only if
//! something changed (a delete of nothing, or a read-only request, leaves it). Reads name a
//! revision (0 for the current one) and see the store exactly as it was then, unless
//! compaction has dropped that history.
//!
//! Values are kept per revision in a [`ValueStore`]; today that is an in-memory map, and the
//! memory-mapped backend replaces it behind the same calls.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::index::{KeyRange, TreeIndex};
use super::key_index::{Found, KeyIndexError};
use super::revision::Revision;
use crate::error::{Error, Result};

/// A key as a read returns it (etcd's `mvccpb.KeyValue`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyValue {
    pub key: Bytes,
    /// The revision of the put that created the key (in its current generation).
    pub create_revision: i64,
    /// The revision of the last put.
    pub mod_revision: i64,
    /// Puts since creation: 1 on create.
    pub version: i64,
    pub value: Bytes,
    /// The attached lease, 0 for none.
    pub lease: i64,
}

/// One change as the revision log keeps it: a put's value and lease, or a tombstone.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Change {
    key: Bytes,
    /// `None` for a delete.
    put: Option<(Bytes, i64)>,
}

/// Every change still in history, by revision (what etcd keeps in its key bucket, and what
/// the memory-mapped backend will keep in its data files). Invariant: holds the change of every
/// revision the index can still return.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
struct RevisionLog {
    #[serde(with = "super::sorted_map")]
    changes: BTreeMap<Revision, Change>,
    /// Bytes the changes take in the backend's record format. Invariant: the sum of
    /// [`record_size`] over `changes`.
    bytes: u64,
}

/// Per-record overhead in the backend's format: revision, lengths, lease, checksum.
pub(crate) const RECORD_OVERHEAD: u64 = 48;

/// What a change of `key` with `value` takes in the backend.
pub(crate) fn record_size(key: usize, value: usize) -> u64 {
    RECORD_OVERHEAD + key as u64 + value as u64
}

impl RevisionLog {
    fn insert(&mut self, rev: Revision, change: Change) {
        let size = record_size(change.key.len(), change.put.as_ref().map_or(0, |(v, _)| v.len()));
        self.bytes += size;
        if let Some(old) = self.changes.insert(rev, change) {
            self.bytes -= record_size(old.key.len(), old.put.as_ref().map_or(0, |(v, _)| v.len()));
        }
    }

    fn remove(&mut self, rev: &Revision) {
        if let Some(old) = self.changes.remove(rev) {
            self.bytes -= record_size(old.key.len(), old.put.as_ref().map_or(0, |(v, _)| v.len()));
        }
    }
}

/// What happened to a key at a revision (etcd's `mvccpb.Event`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Event {
    pub kind: EventKind,
    /// The key after the change; for a delete, only `key` and `mod_revision` (the deletion's
    /// revision) are set.
    pub kv: KeyValue,
    /// The key before the change, if it existed.
    pub prev_kv: Option<KeyValue>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EventKind {
    Put,
    Delete,
}

/// etcd's `HashKV` answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashKv {
    /// CRC-32 over every change still in history up to `hash_revision`.
    pub hash: u32,
    pub compact_revision: i64,
    pub hash_revision: i64,
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
    pub kvs: Vec<KeyValue>,
    /// Keys in the range at that revision, ignoring the limit.
    pub count: usize,
    /// Whether keys remain beyond the limit.
    pub more: bool,
    /// The revision the read was served at.
    pub revision: i64,
}

/// The store's state.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Store {
    index: TreeIndex,
    log: RevisionLog,
    /// The newest revision. Invariant: `compacted <= current`.
    current: i64,
    /// History below this revision is gone.
    compacted: i64,
    /// Physical compaction still under way: reads already behave as if it were done.
    compacting: Option<Compaction>,
}

/// Physical compaction in progress: keys before `next_key` are done.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Compaction {
    at: i64,
    next_key: Vec<u8>,
}

fn internal(e: KeyIndexError) -> Error {
    Error::Internal(e.to_string())
}

impl Compaction {
    fn with_next(self, next_key: Vec<u8>) -> Compaction {
        Compaction { next_key, ..self }
    }
}

impl Default for Store {
    /// An empty store at revision 1, as etcd's: the first write gets revision 2.
    fn default() -> Self {
        Store {
            index: TreeIndex::default(),
            log: RevisionLog::default(),
            current: 1,
            compacted: 0,
            compacting: None,
        }
    }
}

impl Store {
    /// An empty store at revision 1, as etcd's: the first write gets revision 2.
    pub fn new() -> Store {
        Store::default()
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
        self.log.bytes
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

    fn key_value(&self, key: &[u8], found: Found, keys_only: bool) -> Result<KeyValue> {
        let (value, lease) = self
            .log
            .changes
            .get(&found.modified)
            .and_then(|c| c.put.as_ref())
            .ok_or_else(|| Error::Internal(format!("no value stored for revision {}", found.modified)))?;
        Ok(KeyValue {
            key: Bytes::copy_from_slice(key),
            create_revision: found.created.main,
            mod_revision: found.modified.main,
            version: found.version,
            value: if keys_only { Bytes::new() } else { value.clone() },
            lease: *lease,
        })
    }

    /// Reads the keys of `range` as of `opts.revision`.
    pub fn range(&self, key: &[u8], range_end: &[u8], opts: ReadOptions) -> Result<RangeResult> {
        let at = self.read_revision(opts.revision)?;
        self.range_at(&KeyRange::new(key, range_end), at, opts)
    }

    fn range_at(&self, range: &KeyRange, at: i64, opts: ReadOptions) -> Result<RangeResult> {
        let limit = if opts.count_only { 1 } else { opts.limit };
        let found = self.index.range(range, at, limit);
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
        WriteTxn {
            store: self,
            main,
            sub: 0,
            lease_changes: Vec::new(),
            undo: Vec::new(),
            finished: false,
        }
    }

    /// Drops the history below `revision`: reads below it fail with [`Error::Compacted`], and
    /// each key keeps its newest version at or below it. All at once; the engine uses
    /// [`Store::begin_compaction`] and bounded [`Store::compaction_step`]s instead.
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

    /// Drops the compacted history of up to `keys` keys; returns whether any is left.
    pub(crate) fn compaction_step(&mut self, keys: usize) -> bool {
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

    pub(crate) fn compaction_pending(&self) -> bool {
        self.compacting.is_some()
    }

    /// Whether the change at `rev` of `key` is still history: after the compacted revision,
    /// or the value each key keeps at it. Changes the sweep has not dropped yet are not.
    fn visible(&self, rev: &Revision, key: &[u8]) -> bool {
        rev.main > self.compacted || self.index.get(key, self.compacted).is_some_and(|f| f.modified == *rev)
    }

    /// The events of revisions `from..=to` on keys of `range`, in revision order, whole
    /// revisions only, stopping after the revision that reaches `limit` events (0: no limit).
    /// `from` must not be below the compacted revision (the caller checks).
    pub(crate) fn events(&self, from: i64, to: i64, range: &KeyRange, limit: usize) -> Result<Vec<Event>> {
        let mut out: Vec<Event> = Vec::new();
        let span = Revision::new(from, 0)..=Revision::new(to, i64::MAX);
        for (rev, change) in self.log.changes.range(span) {
            if limit != 0 && out.len() >= limit && out.last().is_some_and(|e| e.kv.mod_revision != rev.main) {
                break;
            }
            if !range.contains(&change.key) || !self.visible(rev, &change.key) {
                continue;
            }
            // Below the compacted revision the previous value is gone (or going).
            let prev_kv = match self.index.get(&change.key, rev.main - 1) {
                Some(found) if rev.main > self.compacted => Some(self.key_value(&change.key, found, false)?),
                _ => None,
            };
            let event = match &change.put {
                Some(_) => {
                    let found = self
                        .index
                        .at_exactly(&change.key, *rev)
                        .ok_or_else(|| Error::Internal(format!("revision {rev} missing from the index")))?;
                    Event {
                        kind: EventKind::Put,
                        kv: self.key_value(&change.key, found, false)?,
                        prev_kv,
                    }
                }
                None => Event {
                    kind: EventKind::Delete,
                    kv: KeyValue {
                        key: change.key.clone(),
                        create_revision: 0,
                        mod_revision: rev.main,
                        version: 0,
                        value: Bytes::new(),
                        lease: 0,
                    },
                    prev_kv,
                },
            };
            out.push(event);
        }
        Ok(out)
    }

    /// A hash of the history still kept, up to `revision` (0 for the current one): members that
    /// applied the same log, and compacted at the same revision, agree on it, across restarts.
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        let at = self.read_revision(revision)?;
        let mut h = crc32fast::Hasher::new();
        for (rev, change) in self.log.changes.range(..=Revision::new(at, i64::MAX)) {
            if !self.visible(rev, &change.key) {
                continue;
            }
            h.update(&rev.encode());
            h.update(&(change.key.len() as u64).to_be_bytes());
            h.update(&change.key);
            match &change.put {
                Some((value, lease)) => {
                    h.update(&[1]);
                    h.update(&(value.len() as u64).to_be_bytes());
                    h.update(value);
                    h.update(&lease.to_be_bytes());
                }
                None => h.update(&[0]),
            }
        }
        Ok(HashKv {
            hash: h.finalize(),
            compact_revision: self.compacted,
            hash_revision: at,
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
    /// Every change made, in order, to take back: key, revision, whether a delete, and the
    /// key's previous `modified` (`None`: no history before).
    undo: Vec<(Vec<u8>, Revision, bool, Option<Revision>)>,
    finished: bool,
}

impl Drop for WriteTxn<'_> {
    fn drop(&mut self) {
        if self.finished || self.sub == 0 {
            return;
        }
        for (key, rev, tombstone, previous) in std::mem::take(&mut self.undo).into_iter().rev() {
            self.store.index.undo(&key, rev, tombstone, previous);
        }
        for sub in 0..self.sub {
            self.store.log.remove(&Revision::new(self.main, sub));
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

    /// Puts `value` at `key`; returns the previous key-value, if the key existed.
    pub fn put(&mut self, key: &[u8], value: Bytes, lease: i64) -> Result<Option<KeyValue>> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let at = self.read_at();
        let prev = match self.store.index.get(key, at) {
            Some(found) => Some(self.store.key_value(key, found, false)?),
            None => None,
        };
        let from = prev.as_ref().map_or(0, |kv| kv.lease);
        if from != lease {
            let key = Bytes::copy_from_slice(key);
            self.lease_changes.push(LeaseChange { key, from, to: lease });
        }
        let previous = self.store.index.modified(key);
        let rev = self.next_revision();
        self.store.index.put(key, rev).map_err(internal)?;
        self.undo.push((key.to_vec(), rev, false, previous));
        let key = Bytes::copy_from_slice(key);
        self.store.log.insert(
            rev,
            Change {
                key,
                put: Some((value, lease)),
            },
        );
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
            if let Some(found) = self.store.index.get(&k, at) {
                let kv = self.store.key_value(&k, found, false)?;
                if kv.lease != 0 {
                    self.lease_changes.push(LeaseChange {
                        key: kv.key.clone(),
                        from: kv.lease,
                        to: 0,
                    });
                }
                deleted.push(kv);
            }
            let previous = self.store.index.modified(&k);
            let rev = self.next_revision();
            self.store.index.tombstone(&k, rev).map_err(internal)?;
            self.undo.push((k.clone(), rev, true, previous));
            self.store.log.insert(
                rev,
                Change {
                    key: Bytes::from(k),
                    put: None,
                },
            );
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
        self.store.range_at(&KeyRange::new(key, range_end), at, opts)
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
    fn a_compaction_sweep_is_invisible_at_every_step() {
        let mut swept = Store::new();
        for i in 0..30 {
            let key = format!("k{}", i % 6);
            write(&mut swept, &key, if i % 7 == 3 { None } else { Some("v") });
        }
        let mut at_once = swept.clone();
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
                a.events(20, 31, &everything, 0).unwrap(),
                b.events(20, 31, &everything, 0).unwrap()
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
        let (mut cx, mut cz) = (x.clone(), z.clone());
        cx.compact(4).unwrap();
        cz.compact(4).unwrap();
        assert_eq!(cx.hash_kv(4).unwrap(), cz.hash_kv(4).unwrap());
        assert_eq!(cx.hash_kv(4).unwrap().compact_revision, 4);
        assert!(matches!(cx.hash_kv(3), Err(Error::Compacted { .. })));
    }
}
