//! The key index: every key in order, with its [`KeyIndex`], in memory.
//!
//! It answers which keys of a range existed at a revision, and which revision holds each
//! one's value, without reading any value: `count` and `limit` are decided here. Values live
//! in the backend, found by revision.

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

/// What [`Index::put`] found and made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Put {
    /// The key just before the put, if it existed.
    pub(crate) before: Option<Found>,
    /// The revision that last changed the key before the put (a put or its tombstone), `None`
    /// for a key with no history: what [`Index::undo`] takes to put it back.
    pub(crate) previous: Option<Revision>,
    /// The key after the put: its new revision, creation revision and version.
    pub(crate) now: Found,
}

/// Keys a leaf holds before it splits. Its two arrays then take 36 KiB (16 and 56 bytes a
/// key), and an insert in its middle moves half of that. Unit tests take 8, so that a few
/// keys split and join leaves.
const LEAF: usize = if cfg!(test) { 8 } else { 512 };

/// Bytes of keys a leaf holds at most: what its 4-byte offsets reach. Unit tests take 64, so
/// that long keys split leaves by their bytes too.
const LEAF_BYTES: usize = if cfg!(test) { 64 } else { u32::MAX as usize };

/// The keys of a leaf, back to back in one buffer, each found by where it ends: 4 bytes a
/// key besides its own, where a boxed key took 16 and its allocation's rounding up. A leaf's
/// keys take less than 4 GiB (see [`Index::insert`]).
#[derive(Clone, Debug, Default)]
struct Packed {
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`, ascending.
    ends: Vec<u32>,
}

impl Packed {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn start(&self, i: usize) -> usize {
        match i.checked_sub(1) {
            Some(before) => self.ends.get(before).map_or(self.bytes.len(), |e| *e as usize),
            None => 0,
        }
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let end = *self.ends.get(i)? as usize;
        self.bytes.get(self.start(i)..end)
    }

    fn first(&self) -> Option<&[u8]> {
        self.get(0)
    }

    fn last(&self) -> Option<&[u8]> {
        self.get(self.len().checked_sub(1)?)
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        (0..self.len()).filter_map(|i| self.get(i))
    }

    /// Whether `key` would take the keys past what 4-byte offsets reach.
    fn overflows_with(&self, key: &[u8]) -> bool {
        self.bytes.len() + key.len() > LEAF_BYTES
    }

    fn binary_search(&self, key: &[u8]) -> Result<usize, usize> {
        let (mut low, mut high) = (0, self.len());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.get(mid).map(|k| k.cmp(key)) {
                Some(std::cmp::Ordering::Less) => low = mid + 1,
                Some(std::cmp::Ordering::Greater) => high = mid,
                Some(std::cmp::Ordering::Equal) => return Ok(mid),
                None => break,
            }
        }
        Err(low)
    }

    /// Puts `key` at `at` (the caller checked [`Packed::overflows_with`]). The buffer grows by
    /// an eighth at a time, not doubling, so a leaf wastes little.
    fn insert(&mut self, at: usize, key: &[u8]) {
        let start = self.start(at);
        if self.bytes.capacity() - self.bytes.len() < key.len() {
            self.bytes.reserve_exact(key.len().max(self.bytes.len() / 8));
        }
        self.bytes.splice(start..start, key.iter().copied());
        let added = key.len() as u32;
        self.ends.insert(at, start as u32 + added);
        for end in self.ends.iter_mut().skip(at + 1) {
            *end += added;
        }
    }

    fn remove(&mut self, at: usize) {
        let (start, Some(end)) = (self.start(at), self.ends.get(at).copied()) else {
            return;
        };
        self.bytes.drain(start..end as usize);
        self.ends.remove(at);
        let removed = end - start as u32;
        for end in self.ends.iter_mut().skip(at) {
            *end -= removed;
        }
    }

    fn split_off(&mut self, at: usize) -> Packed {
        let start = self.start(at);
        let bytes = self.bytes.split_off(start);
        let mut ends = self.ends.split_off(at);
        for end in &mut ends {
            *end -= start as u32;
        }
        Packed { bytes, ends }
    }

    /// Takes `next`'s keys, which all come after these (the caller checked that they fit).
    fn append(&mut self, next: Packed) {
        let base = self.bytes.len() as u32;
        self.bytes.reserve_exact(next.bytes.len());
        self.ends.reserve_exact(next.ends.len());
        self.bytes.extend_from_slice(&next.bytes);
        self.ends.extend(next.ends.iter().map(|e| e + base));
    }

    fn shrink_to(&mut self, keys: usize) {
        self.ends.shrink_to(keys);
        self.bytes.shrink_to(self.bytes.len() + self.bytes.len() / 8);
    }
}

/// A run of consecutive keys with their histories. Invariant: `keys` ascend strictly, one
/// history each, none of them empty, and `live` counts the live ones.
#[derive(Clone, Debug, Default)]
struct Leaf {
    keys: Packed,
    histories: Vec<KeyIndex>,
    live: usize,
}

impl Leaf {
    fn with_capacity(n: usize) -> Leaf {
        Leaf {
            keys: Packed {
                bytes: Vec::new(),
                ends: Vec::with_capacity(n),
            },
            histories: Vec::with_capacity(n),
            live: 0,
        }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether `key` must go into a leaf of its own or a split one: this one holds [`LEAF`]
    /// keys, or the key would take its keys past 4 GiB.
    fn is_full_for(&self, key: &[u8]) -> bool {
        self.len() >= LEAF || self.keys.overflows_with(key)
    }

    fn insert(&mut self, at: usize, key: &[u8], history: KeyIndex) {
        self.live += usize::from(history.is_live());
        self.keys.insert(at, key);
        self.histories.insert(at, history);
    }

    fn remove(&mut self, at: usize) {
        if at < self.len() {
            self.keys.remove(at);
            if self.histories.remove(at).is_live() {
                self.live -= 1;
            }
        }
    }

    /// The keys from `at` on, taken into a leaf of their own.
    fn split_off(&mut self, at: usize) -> Leaf {
        let keys = self.keys.split_off(at);
        let histories = self.histories.split_off(at);
        let live = histories.iter().filter(|h| h.is_live()).count();
        self.live -= live;
        Leaf { keys, histories, live }
    }

    /// Takes `next`'s keys, which all come after this leaf's.
    fn append(&mut self, next: Leaf) {
        self.histories.reserve_exact(next.len());
        self.keys.append(next.keys);
        self.histories.extend(next.histories);
        self.live += next.live;
    }

    /// Gives memory back once at most a quarter of it is used (after deletions and
    /// compaction), keeping room to grow by as many keys again.
    fn shrink(&mut self) {
        if self.histories.capacity() > 4 * self.len() {
            self.keys.shrink_to(2 * self.len());
            self.histories.shrink_to(2 * self.len());
        }
    }

    fn entries(&self) -> impl Iterator<Item = (&[u8], &KeyIndex)> {
        self.keys.iter().zip(&self.histories)
    }
}

/// Every key's history, in key order, in leaves of up to [`LEAF`] keys. A key's place is
/// found by a binary search over the leaves' low bounds, then one within its leaf; a range
/// walks leaves in order. Each leaf counts its live keys, so the count of a range now adds
/// the counts of the leaves it covers whole, and walks only its two ends.
///
/// Keys put in ascending order, as a load or a restore puts them, fill leaves whole: a key
/// after the last goes into a fresh leaf, a full leaf splits where the new key goes when it
/// lands in its first or last eighth (keys from many clients arrive almost in order), and in
/// halves elsewhere. (A B-tree splits in the middle whatever the order, and ascending keys
/// left its nodes half empty, twice the memory for the same keys.)
///
/// ```text
/// lows:    []            "d"              "m"
/// leaves:  [a b c]       [d f g k]        [m q z]
///          live 3        live 2 (f gone)  live 3
/// ```
#[derive(Clone, Debug, Default)]
pub(crate) struct Index {
    /// Invariant: no leaf is empty, and every key of a leaf is below every key of the next.
    leaves: Vec<Leaf>,
    /// One per leaf: `lows[i]` is at or below every key of leaf `i` and above every key of
    /// leaf `i - 1`; `lows[0]` is empty (keys never are).
    lows: Vec<Box<[u8]>>,
    /// Keys that exist now. Invariant: the sum of the leaves' `live`.
    live: usize,
}

impl Index {
    /// The index of `keys`, which must ascend strictly (a saved index's), in full leaves.
    /// `None` if they do not ascend.
    pub(crate) fn from_sorted(keys: Vec<(Box<[u8]>, KeyIndex)>) -> Option<Index> {
        if keys.windows(2).any(|w| matches!(w, [a, b] if a.0 >= b.0)) {
            return None;
        }
        let mut index = Index::default();
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            let mut leaf = Leaf::with_capacity(LEAF);
            while let Some((key, history)) = keys.next_if(|(key, _)| !leaf.is_full_for(key)) {
                let at = leaf.len();
                leaf.insert(at, &key, history);
            }
            let low = match index.lows.is_empty() {
                true => Box::default(),
                false => leaf.keys.first().map(Box::from).unwrap_or_default(),
            };
            index.live += leaf.live;
            index.lows.push(low);
            index.leaves.push(leaf);
        }
        Some(index)
    }

    /// Every key with its history, in key order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &KeyIndex)> {
        self.leaves.iter().flat_map(Leaf::entries)
    }

    /// The leaf `key` belongs in, and where in it: `Ok` where it is, `Err` where it would go.
    fn find(&self, key: &[u8]) -> (usize, Result<usize, usize>) {
        let leaf = self.lows.partition_point(|low| **low <= *key).saturating_sub(1);
        let at = match self.leaves.get(leaf) {
            Some(l) => l.keys.binary_search(key),
            None => Err(0),
        };
        (leaf, at)
    }

    /// Keys of `range` in order, with their histories.
    fn walk<'a>(&'a self, range: &'a KeyRange) -> impl Iterator<Item = (&'a [u8], &'a KeyIndex)> + 'a {
        let (start, end) = range.bounds();
        let (leaf, at) = match start {
            Bound::Included(key) => {
                let (leaf, at) = self.find(key);
                (leaf, at.unwrap_or_else(|at| at))
            }
            _ => (0, 0),
        };
        let before_end = move |key: &[u8]| match end {
            Bound::Included(end) => key <= end,
            Bound::Excluded(end) => key < end,
            Bound::Unbounded => true,
        };
        self.leaves
            .get(leaf..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(move |(i, l)| {
                let skip = if i == 0 { at } else { 0 };
                l.entries().skip(skip)
            })
            .take_while(move |(key, _)| before_end(key))
    }

    /// Applies `change` to the history of `key` (a new, empty one if it has none), keeping
    /// the live counts; a history left empty goes.
    fn change(
        &mut self,
        key: &[u8],
        change: impl FnOnce(&mut KeyIndex) -> Result<(), KeyIndexError>,
    ) -> Result<(), KeyIndexError> {
        let (leaf, at) = self.find(key);
        let at = match at {
            Ok(at) => at,
            Err(at) => {
                let mut history = KeyIndex::default();
                let result = change(&mut history);
                if !history.is_empty() {
                    self.insert(leaf, at, key, history);
                }
                return result;
            }
        };
        let Some(ki) = self.leaves.get_mut(leaf).and_then(|l| l.histories.get_mut(at)) else {
            return Err(KeyIndexError::NotLive);
        };
        let was_live = ki.is_live();
        let result = change(ki);
        let (is_live, emptied) = (ki.is_live(), ki.is_empty());
        if let Some(l) = self.leaves.get_mut(leaf) {
            l.live = (l.live + usize::from(is_live)).saturating_sub(usize::from(was_live));
        }
        self.live = (self.live + usize::from(is_live)).saturating_sub(usize::from(was_live));
        if emptied {
            self.remove(leaf, at);
        }
        result
    }

    /// Puts `key` at `at` of leaf `leaf` (where [`Index::find`] said it goes).
    fn insert(&mut self, leaf: usize, at: usize, key: &[u8], history: KeyIndex) {
        self.live += usize::from(history.is_live());
        let last = self.leaves.len().saturating_sub(1);
        let Some(l) = self.leaves.get_mut(leaf) else {
            // The first key.
            let mut first = Leaf::with_capacity(LEAF);
            first.insert(0, key, history);
            self.leaves.push(first);
            self.lows.push(Box::default());
            return;
        };
        if !l.is_full_for(key) {
            l.insert(at, key, history);
            return;
        }
        if l.keys.overflows_with(key) {
            // Keys of gigabytes: the key takes a leaf of its own, between the two parts of
            // this one, so that no leaf's keys pass 4 GiB (one key is less: a record's length
            // is 4 bytes).
            let right = l.split_off(at);
            let mut own = Leaf::with_capacity(1);
            own.insert(0, key, history);
            let mut next = leaf + 1;
            match l.len() {
                // Its low stays below the key.
                0 => *l = own,
                _ => {
                    self.leaves.insert(next, own);
                    self.lows.insert(next, key.into());
                    next += 1;
                }
            }
            if let Some(low) = right.keys.first().map(Box::from) {
                self.leaves.insert(next, right);
                self.lows.insert(next, low);
            }
            return;
        }
        if leaf == last && at == l.len() {
            // After the last key: a fresh leaf, and the full one stays full.
            let mut next = Leaf::with_capacity(LEAF);
            next.insert(0, key, history);
            self.leaves.push(next);
            self.lows.push(key.into());
            return;
        }
        // Near an end of the leaf, it splits where the key goes, so that keys arriving almost
        // in order (a load by many clients) leave full leaves behind them; elsewhere in halves.
        let split = match at {
            at if at >= LEAF - LEAF / 8 || at <= LEAF / 8 => at.clamp(1, LEAF - 1),
            _ => LEAF / 2,
        };
        let right = l.split_off(split);
        let low = right.keys.first().map(Box::from).unwrap_or_default();
        let (into, at) = match at <= split {
            true => (leaf, at),
            false => (leaf + 1, at - split),
        };
        self.leaves.insert(leaf + 1, right);
        self.lows.insert(leaf + 1, low);
        if let Some(l) = self.leaves.get_mut(into) {
            l.insert(at, key, history);
        }
    }

    /// Removes the key at `at` of leaf `leaf` (its history must not be live, or be counted
    /// out already). A leaf left with an eighth of its keys or fewer joins a neighbour that
    /// has room; an empty one goes.
    fn remove(&mut self, leaf: usize, at: usize) {
        let Some(l) = self.leaves.get_mut(leaf) else {
            return;
        };
        l.remove(at);
        if l.len() > LEAF / 8 {
            l.shrink();
            return;
        }
        let (len, bytes) = (l.len(), l.keys.bytes.len());
        let fits = |i: usize| {
            self.leaves
                .get(i)
                .is_some_and(|n| n.len() + len <= LEAF && n.keys.bytes.len() + bytes <= LEAF_BYTES)
        };
        if len == 0 {
            self.drop_leaf(leaf);
        } else if fits(leaf + 1) {
            self.join(leaf);
        } else if leaf > 0 && fits(leaf - 1) {
            self.join(leaf - 1);
        } else if let Some(l) = self.leaves.get_mut(leaf) {
            l.shrink();
        }
    }

    /// Moves leaf `leaf + 1`'s keys to the end of leaf `leaf`.
    fn join(&mut self, leaf: usize) {
        if leaf + 1 >= self.leaves.len() {
            return;
        }
        let next = self.leaves.remove(leaf + 1);
        self.lows.remove(leaf + 1);
        if let Some(l) = self.leaves.get_mut(leaf) {
            l.append(next);
        }
    }

    fn drop_leaf(&mut self, leaf: usize) {
        if leaf < self.leaves.len() {
            self.leaves.remove(leaf);
            self.lows.remove(leaf);
        }
        // The first leaf's low is below every key.
        if let Some(low) = self.lows.first_mut() {
            *low = Box::default();
        }
    }

    /// Records a put at `rev`, finding the key once: returns the key as it was just before
    /// (so as a read inside the same request sees it) and as it now is. A put refused
    /// changes nothing.
    pub(crate) fn put(&mut self, key: &[u8], rev: Revision) -> Result<Put, KeyIndexError> {
        let mut before = None;
        let mut previous = None;
        let mut now = None;
        self.change(key, |ki| {
            // A key in the index has history (`change` removes emptied ones); a new one has none.
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
        if self.find(key).1.is_err() {
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

    fn history(&self, key: &[u8]) -> Option<&KeyIndex> {
        let (leaf, at) = self.find(key);
        self.leaves.get(leaf)?.histories.get(at.ok()?)
    }

    /// The revision that last changed `key`, if it has any history.
    pub(crate) fn modified(&self, key: &[u8]) -> Option<Revision> {
        self.history(key).map(KeyIndex::modified)
    }

    /// Takes back the last change of `key` (see [`KeyIndex::undo`]); `previous` is what
    /// [`Index::modified`] said before it, `None` for a key that had no history.
    pub(crate) fn undo(&mut self, key: &[u8], rev: Revision, tombstone: bool, previous: Option<Revision>) {
        let (leaf, Ok(at)) = self.find(key) else {
            return;
        };
        match previous {
            Some(previous) => {
                let _ = self.change(key, |ki| {
                    ki.undo(rev, tombstone);
                    debug_assert_eq!(ki.modified(), previous);
                    Ok(())
                });
            }
            None => {
                let Some(l) = self.leaves.get_mut(leaf) else {
                    return;
                };
                if l.histories.get(at).is_some_and(KeyIndex::is_live) {
                    // Counted out here: `remove` takes it from its leaf's count.
                    self.live -= 1;
                }
                self.remove(leaf, at);
            }
        }
    }

    pub(crate) fn get(&self, key: &[u8], at: i64) -> Option<Found> {
        self.history(key)?.get(at)
    }

    /// The keys of `range` that existed at revision `at`; at most `limit` of them (0: no limit)
    /// returned, all of them counted, unless `uncounted`: then the walk stops at the limit
    /// (the caller knows the count).
    pub(crate) fn range(&self, range: &KeyRange, at: i64, limit: usize, uncounted: bool) -> IndexRange {
        let mut out = IndexRange::default();
        for (key, ki) in self.walk(range) {
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

    /// How many keys of `range` exist now: the live counts of the leaves it covers whole,
    /// and a walk of the leaves at its two ends.
    pub(crate) fn count_live(&self, range: &KeyRange) -> usize {
        let (start, _) = range.bounds();
        let (first, at) = match start {
            Bound::Included(key) => {
                let (leaf, at) = self.find(key);
                (leaf, at.unwrap_or_else(|at| at))
            }
            _ => (0, 0),
        };
        let mut count = 0;
        for (i, l) in self.leaves.get(first..).unwrap_or_default().iter().enumerate() {
            let skip = if i == 0 { at } else { 0 };
            let whole = skip == 0
                && l.keys.first().is_some_and(|k| range.contains(k))
                && l.keys.last().is_some_and(|k| range.contains(k));
            if whole {
                count += l.live;
                continue;
            }
            // From the range's start on, a key outside it is past its end.
            for (key, ki) in l.entries().skip(skip) {
                if !range.contains(key) {
                    return count;
                }
                count += usize::from(ki.is_live());
            }
        }
        count
    }

    /// The keys of `range` that exist now, for a delete.
    pub(crate) fn live_keys(&self, range: &KeyRange) -> Vec<Vec<u8>> {
        self.walk(range)
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
        let (mut leaf, start) = self.find(from);
        let mut start = start.unwrap_or_else(|at| at);
        let mut done = 0;
        'leaves: while let Some(l) = self.leaves.get_mut(leaf) {
            for (key, ki) in l.keys.iter().zip(l.histories.iter_mut()).skip(start) {
                if done == limit {
                    next = Some(key.to_vec());
                    break 'leaves;
                }
                // Compaction never changes whether a key lives now.
                ki.compact(at, &mut dropped);
                if ki.is_empty() {
                    emptied.push(key.to_vec());
                }
                done += 1;
            }
            (leaf, start) = (leaf + 1, 0);
        }
        for key in emptied {
            if let (leaf, Ok(at)) = self.find(&key) {
                self.remove(leaf, at);
            }
        }
        (dropped, next)
    }

    /// Keys with any history, live or not.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.leaves.iter().map(Leaf::len).sum()
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
        let mut idx = Index::default();
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
        let mut idx = Index::default();
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
        let mut idx = Index::default();
        idx.put(b"a", rev(1)).unwrap();
        idx.put(b"a", rev(2)).unwrap();
        idx.put(b"b", rev(3)).unwrap();
        idx.tombstone(b"b", rev(4)).unwrap();
        // One key per batch: a, then b.
        let (dropped, next) = idx.compact_batch(4, b"", 1);
        assert_eq!((dropped, next.as_deref()), (vec![rev(1)], Some(&b"b"[..])));
        let (dropped, next) = idx.compact_batch(4, b"b", 1);
        assert_eq!((dropped, next), (vec![rev(3), rev(4)], None));
        assert_eq!(idx.len(), 1);
        assert_eq!(idx.get(b"a", 4).map(|f| f.version), Some(2));
    }

    /// Operations on a handful of keys (so that leaves of 8 split, join and empty).
    #[derive(Clone, Debug)]
    enum Op {
        Put(u8),
        Delete(u8),
        Compact,
        /// Takes back the last put or delete, if any.
        Undo,
        /// Counts the keys now, and reads, in `[a, b)` (`b == 0`: no end; `b == 1`: `a` alone).
        Count(u8, u8),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0..40u8).prop_map(Op::Put),
            3 => (0..40u8).prop_map(Op::Delete),
            1 => Just(Op::Compact),
            1 => Just(Op::Undo),
            2 => (0..42u8, 0..42u8).prop_map(|(a, b)| Op::Count(a, b)),
        ]
    }

    /// Keys of 3 to 33 bytes: a leaf of 8 passes its 64 bytes with a few long ones.
    fn key(k: u8) -> Vec<u8> {
        format!("k{k:02}{}", "x".repeat(usize::from(k % 7) * 5)).into_bytes()
    }

    proptest::proptest! {
        /// The index answers as a `BTreeMap` of the same histories does (the B-tree it once
        /// was), whatever leaves its keys fall in, and its counts of keys now agree with a walk.
        #[test]
        fn leaves_answer_as_a_sorted_map(ops in proptest::collection::vec(op(), 1..300)) {
            let mut idx = Index::default();
            let mut model: std::collections::BTreeMap<Vec<u8>, KeyIndex> = Default::default();
            let mut main = 0;
            // The last change: key, revision, tombstone, previous revision.
            let mut last: Option<(Vec<u8>, Revision, bool, Option<Revision>)> = None;
            for op in ops {
                main += 1;
                let r = rev(main);
                match op {
                    Op::Put(k) => {
                        let key = key(k);
                        let previous = idx.modified(&key);
                        idx.put(&key, r).unwrap();
                        model.entry(key.clone()).or_default().put(r).unwrap();
                        last = Some((key, r, false, previous));
                    }
                    Op::Delete(k) => {
                        let key = key(k);
                        let previous = idx.modified(&key);
                        let live = model.get(&key).is_some_and(KeyIndex::is_live);
                        proptest::prop_assert_eq!(idx.tombstone(&key, r).is_ok(), live);
                        if live {
                            model.get_mut(&key).unwrap().tombstone(r).unwrap();
                            last = Some((key, r, true, previous));
                        }
                    }
                    Op::Compact => {
                        let mut from = Vec::new();
                        loop {
                            let (_, next) = idx.compact_batch(main, &from, 3);
                            match next {
                                Some(next) => from = next,
                                None => break,
                            }
                        }
                        model.retain(|_, ki| {
                            ki.compact(main, &mut Vec::new());
                            !ki.is_empty()
                        });
                        last = None;
                    }
                    Op::Undo => {
                        if let Some((key, r, tombstone, previous)) = last.take() {
                            idx.undo(&key, r, tombstone, previous);
                            match previous {
                                Some(_) => model.get_mut(&key).unwrap().undo(r, tombstone),
                                None => {
                                    model.remove(&key);
                                }
                            }
                        }
                    }
                    Op::Count(a, b) => {
                        let end = match b {
                            0 => vec![0],
                            1 => Vec::new(),
                            b => key(b),
                        };
                        let range = KeyRange::new(&key(a), &end);
                        let walked = model.iter().filter(|(k, ki)| range.contains(k) && ki.is_live()).count();
                        proptest::prop_assert_eq!(idx.count_live(&range), walked);
                        let read = idx.range(&range, main, 0, false);
                        proptest::prop_assert_eq!(read.count, walked);
                        proptest::prop_assert_eq!(read.keys.len(), walked);
                    }
                }
                let listed: Vec<(Vec<u8>, KeyIndex)> = idx.iter().map(|(k, ki)| (k.to_vec(), ki.clone())).collect();
                let expected: Vec<(Vec<u8>, KeyIndex)> = model.iter().map(|(k, ki)| (k.clone(), ki.clone())).collect();
                proptest::prop_assert_eq!(listed, expected);
                proptest::prop_assert_eq!(idx.live(), model.values().filter(|ki| ki.is_live()).count());
                proptest::prop_assert_eq!(idx.leaves.iter().map(|l| l.live).sum::<usize>(), idx.live());
                proptest::prop_assert!(idx.leaves.iter().all(|l| l.len() > 0 && l.len() <= LEAF));
                proptest::prop_assert!(idx.leaves.iter().all(|l| l.keys.bytes.len() <= LEAF_BYTES || l.len() == 1));
                proptest::prop_assert_eq!(idx.lows.len(), idx.leaves.len());
                for (i, (low, l)) in idx.lows.iter().zip(&idx.leaves).enumerate() {
                    proptest::prop_assert!(i > 0 || low.is_empty());
                    proptest::prop_assert!(l.keys.first().is_some_and(|k| **low <= *k));
                    if let Some(prev) = i.checked_sub(1).and_then(|p| idx.leaves.get(p)) {
                        proptest::prop_assert!(prev.keys.last().is_some_and(|k| *k < **low));
                    }
                }
            }
        }
    }
}
