//! The key index: an in-memory B-tree from each key to its [`KeyIndex`].
//!
//! It answers which keys of a range existed at a revision, and which revision holds each
//! one's value, without reading any value: `count` and `limit` are decided here. Values live
//! in the backend, found by revision.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::key_index::{Found, KeyIndex, KeyIndexError};
use crate::revision::Revision;

/// The keys a request names, in etcd's encoding of `(key, range_end)`:
/// an empty `range_end` is the single key, `range_end == [0]` is every key `>= key`, anything
/// else the half-open range `[key, range_end)`; `key == [0]` with `range_end == [0]` is every key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyRange {
    pub(crate) start: Vec<u8>,
    /// Exclusive end; `None` for "no end".
    pub(crate) end: Option<Vec<u8>>,
    /// A single key rather than a range.
    pub(crate) single: bool,
}

impl KeyRange {
    pub(crate) fn new(key: &[u8], range_end: &[u8]) -> KeyRange {
        match range_end {
            [] => KeyRange {
                start: key.to_vec(),
                end: None,
                single: true,
            },
            [0] => KeyRange {
                start: key.to_vec(),
                end: None,
                single: false,
            },
            end => KeyRange {
                start: key.to_vec(),
                end: Some(end.to_vec()),
                single: false,
            },
        }
    }

    /// Whether the range holds every key (keys are never empty, so any start up to `[0]`
    /// with no end).
    pub(crate) fn is_everything(&self) -> bool {
        !self.single && self.end.is_none() && self.start.as_slice() <= [0].as_slice()
    }

    /// Whether `key` falls in the range.
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        <(Bound<&[u8]>, Bound<&[u8]>) as std::ops::RangeBounds<[u8]>>::contains(&self.bounds(), key)
    }

    fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let start = Bound::Included(self.start.as_slice());
        if self.single {
            return (start, Bound::Included(self.start.as_slice()));
        }
        match &self.end {
            // An end at or before the start is an empty range.
            Some(end) if end.as_slice() <= self.start.as_slice() => (start, Bound::Excluded(self.start.as_slice())),
            Some(end) => (start, Bound::Excluded(end.as_slice())),
            None => (start, Bound::Unbounded),
        }
    }
}

/// The end of the range of every key starting with `prefix` (its last byte incremented, trailing
/// 0xff bytes dropped; `[0]`, "no end", when the prefix is all 0xff or empty).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// What a range read finds in the index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexRange {
    /// Up to `limit` keys that existed at the revision, in key order, with where to find them.
    pub(crate) keys: Vec<(Vec<u8>, Found)>,
    /// Every key of the range that existed at the revision, whatever the limit.
    pub(crate) count: usize,
}

/// What [`TreeIndex::put`] found and made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Put {
    /// The key just before the put, if it existed.
    pub(crate) before: Option<Found>,
    /// The revision that last changed the key before the put (a put or its tombstone), `None`
    /// for a key with no history: what [`TreeIndex::undo`] takes to put it back.
    pub(crate) previous: Option<Revision>,
    /// The key after the put: its new revision, creation revision and version.
    pub(crate) now: Found,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct TreeIndex {
    /// Keys as boxed slices, not `Vec`s: 8 bytes less in every entry of every node.
    tree: BTreeMap<Box<[u8]>, KeyIndex>,
    /// Keys that exist now. Invariant: the number of live entries of `tree`.
    live: usize,
}

impl TreeIndex {
    /// The index of `keys`, which must ascend strictly (a saved index's): the tree is built
    /// bottom up, its nodes full, without a search per key. `None` if they do not ascend.
    pub(crate) fn from_sorted(keys: Vec<(Box<[u8]>, KeyIndex)>) -> Option<TreeIndex> {
        if keys.windows(2).any(|w| matches!(w, [a, b] if a.0 >= b.0)) {
            return None;
        }
        let live = keys.iter().filter(|(_, ki)| ki.is_live()).count();
        // Sorted input: collecting sorts again (one pass finds it sorted), then builds the
        // tree from the sorted run.
        let tree: BTreeMap<Box<[u8]>, KeyIndex> = keys.into_iter().collect();
        Some(TreeIndex { tree, live })
    }

    /// Every key with its history, in key order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &KeyIndex)> {
        self.tree.iter().map(|(k, ki)| (&**k, ki))
    }

    /// Applies `change` to the history of `key` (created if it has none), keeping `live`.
    fn change(
        &mut self,
        key: &[u8],
        change: impl FnOnce(&mut KeyIndex) -> Result<(), KeyIndexError>,
    ) -> Result<(), KeyIndexError> {
        let ki = match self.tree.get_mut(key) {
            Some(ki) => ki,
            None => self.tree.entry(key.into()).or_default(),
        };
        let was_live = ki.is_live();
        let result = change(ki);
        let is_live = ki.is_live();
        if ki.is_empty() {
            self.tree.remove(key);
        }
        self.live = (self.live + usize::from(is_live)).saturating_sub(usize::from(was_live));
        result
    }

    /// Records a put at `rev`, finding the key once: returns the key as it was just before
    /// (so as a read inside the same request sees it) and as it now is. A put refused
    /// changes nothing.
    pub(crate) fn put(&mut self, key: &[u8], rev: Revision) -> Result<Put, KeyIndexError> {
        let mut before = None;
        let mut previous = None;
        let mut now = None;
        self.change(key, |ki| {
            // A key in the tree has history (`change` removes emptied ones); a new one has none.
            if !ki.is_empty() {
                previous = Some(ki.modified());
                before = ki.current();
            }
            ki.put(rev)?;
            now = ki.current();
            Ok(())
        })?;
        let now = now.ok_or(KeyIndexError::NotLive)?;
        Ok(Put { before, previous, now })
    }

    pub(crate) fn tombstone(&mut self, key: &[u8], rev: Revision) -> Result<(), KeyIndexError> {
        if !self.tree.contains_key(key) {
            return Err(KeyIndexError::NotLive);
        }
        self.change(key, |ki| ki.tombstone(rev))
    }

    /// See [`KeyIndex::restore`].
    pub(crate) fn restore(
        &mut self,
        key: &[u8],
        rev: Revision,
        created: Revision,
        version: i64,
    ) -> Result<(), KeyIndexError> {
        self.change(key, |ki| ki.restore(rev, created, version))
    }

    /// Keys that exist now.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The revision that last changed `key`, if it has any history.
    pub(crate) fn modified(&self, key: &[u8]) -> Option<Revision> {
        self.tree.get(key).map(KeyIndex::modified)
    }

    /// Takes back the last change of `key` (see [`KeyIndex::undo`]); `previous` is what
    /// [`TreeIndex::modified`] said before it, `None` for a key that had no history.
    pub(crate) fn undo(&mut self, key: &[u8], rev: Revision, tombstone: bool, previous: Option<Revision>) {
        match previous {
            Some(previous) => {
                if self.tree.contains_key(key) {
                    let _ = self.change(key, |ki| {
                        ki.undo(rev, tombstone);
                        debug_assert_eq!(ki.modified(), previous);
                        Ok(())
                    });
                }
            }
            None => {
                if self.tree.remove(key).is_some_and(|ki| ki.is_live()) {
                    self.live -= 1;
                }
            }
        }
    }

    pub(crate) fn get(&self, key: &[u8], at: i64) -> Option<Found> {
        self.tree.get(key)?.get(at)
    }

    /// The keys of `range` that existed at revision `at`; at most `limit` of them (0: no limit)
    /// returned, all of them counted, unless `uncounted`: then the walk stops at the limit
    /// (the caller knows the count).
    pub(crate) fn range(&self, range: &KeyRange, at: i64, limit: usize, uncounted: bool) -> IndexRange {
        let mut out = IndexRange::default();
        for (key, ki) in self.tree.range::<[u8], _>(range.bounds()) {
            if let Some(found) = ki.get(at) {
                if limit != 0 && out.keys.len() >= limit {
                    if uncounted {
                        break;
                    }
                } else {
                    out.keys.push((key.to_vec(), found));
                }
                out.count += 1;
            }
        }
        out
    }

    /// The keys of `range` that exist now, for a delete.
    pub(crate) fn live_keys(&self, range: &KeyRange) -> Vec<Vec<u8>> {
        self.tree
            .range::<[u8], _>(range.bounds())
            .filter(|(_, ki)| ki.is_live())
            .map(|(k, _)| k.to_vec())
            .collect()
    }

    /// Compacts up to `limit` keys at revision `at` (see [`KeyIndex::compact`]), starting with
    /// the first key `>= from`, and drops keys with nothing left. Returns the revisions dropped
    /// from their histories (to drop from the revision log too) and the key to continue from,
    /// or `None` when no key is left.
    pub(crate) fn compact_batch(&mut self, at: i64, from: &[u8], limit: usize) -> (Vec<Revision>, Option<Vec<u8>>) {
        let mut dropped = Vec::new();
        let mut emptied = Vec::new();
        let mut next = None;
        let from = (Bound::Included(from), Bound::Unbounded);
        for (done, (key, ki)) in self.tree.range_mut::<[u8], _>(from).enumerate() {
            if done == limit {
                next = Some(key.to_vec());
                break;
            }
            ki.compact(at, &mut dropped);
            if ki.is_empty() {
                emptied.push(key.clone());
            }
        }
        for key in emptied {
            self.tree.remove(&key);
        }
        (dropped, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    #[test]
    fn key_ranges_follow_etcd() {
        // (key, range_end, keys inside, keys outside)
        type Case<'a> = (&'a [u8], &'a [u8], &'a [&'a [u8]], &'a [&'a [u8]]);
        let cases: [Case<'_>; 5] = [
            (b"a", b"", &[b"a"], &[b"", b"a\0", b"b"]),
            (b"a", b"\0", &[b"a", b"b", b"\xff\xff"], &[b"", b"\0"]),
            (b"\0", b"\0", &[b"\0", b"a", b"zzz"], &[b""]),
            (b"a", b"c", &[b"a", b"b", b"bzz"], &[b"c", b"c\0", b"\0"]),
            (b"c", b"a", &[], &[b"a", b"b", b"c"]),
        ];
        for (key, end, inside, outside) in cases {
            let r = KeyRange::new(key, end);
            for k in inside {
                assert!(r.contains(k), "{key:?}..{end:?} contains {k:?}");
            }
            for k in outside {
                assert!(!r.contains(k), "{key:?}..{end:?} excludes {k:?}");
            }
        }
    }

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"ab\xff"), b"ac");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn range_counts_past_the_limit_and_reads_history() {
        let mut idx = TreeIndex::default();
        for (i, key) in [b"a", b"b", b"c", b"d"].iter().enumerate() {
            idx.put(*key, rev(i as i64 + 1)).unwrap();
        }
        idx.tombstone(b"b", rev(5)).unwrap();
        let all = KeyRange::new(b"a", b"\0");
        let now = idx.range(&all, 5, 2, false);
        assert_eq!(now.count, 3);
        assert_eq!(
            now.keys.iter().map(|(k, _)| k.as_slice()).collect::<Vec<_>>(),
            [b"a", b"c"]
        );
        let then = idx.range(&all, 2, 0, false);
        assert_eq!(idx.live(), 3);
        assert_eq!(
            idx.range(&all, 5, 2, true).count,
            2,
            "uncounted: the walk stops at the limit"
        );
        assert_eq!(then.count, 2, "at revision 2 only a and b existed");
        assert_eq!(idx.live_keys(&KeyRange::new(b"a", b"c")), vec![b"a".to_vec()]);
    }

    #[test]
    fn a_put_reports_the_key_before_and_after_it() {
        let mut idx = TreeIndex::default();
        let first = idx.put(b"k", rev(2)).unwrap();
        let created = Found {
            modified: rev(2),
            created: rev(2),
            version: 1,
        };
        assert_eq!(
            first,
            Put {
                before: None,
                previous: None,
                now: created
            }
        );
        let second = idx.put(b"k", Revision::new(3, 1)).unwrap();
        assert_eq!(second.before, Some(created));
        assert_eq!(second.previous, Some(rev(2)));
        assert_eq!(second.now.version, 2);
        assert_eq!(second.now.created, rev(2));
        assert_eq!(Some(second.now), idx.get(b"k", 3));
        // Deleted, then put again: nothing lives before, but the tombstone is its history.
        idx.tombstone(b"k", rev(4)).unwrap();
        let again = idx.put(b"k", rev(5)).unwrap();
        assert_eq!((again.before, again.previous), (None, Some(rev(4))));
        assert_eq!((again.now.version, again.now.created), (1, rev(5)));
        // A refused put (not after the key's last revision) changes nothing.
        let live = idx.live();
        assert!(idx.put(b"k", rev(5)).is_err());
        assert_eq!(idx.get(b"k", 9), Some(again.now));
        assert_eq!(idx.live(), live);
    }

    #[test]
    fn compaction_drops_deleted_keys_and_keeps_current_values() {
        let mut idx = TreeIndex::default();
        idx.put(b"a", rev(1)).unwrap();
        idx.put(b"a", rev(2)).unwrap();
        idx.put(b"b", rev(3)).unwrap();
        idx.tombstone(b"b", rev(4)).unwrap();
        // One key per batch: a, then b.
        let (dropped, next) = idx.compact_batch(4, b"", 1);
        assert_eq!((dropped, next.as_deref()), (vec![rev(1)], Some(&b"b"[..])));
        let (dropped, next) = idx.compact_batch(4, b"b", 1);
        assert_eq!((dropped, next), (vec![rev(3), rev(4)], None));
        assert_eq!(idx.tree.len(), 1);
        assert_eq!(idx.get(b"a", 4).map(|f| f.version), Some(2));
    }
}
