//! The revision log: where every change still in history lives, by revision (what etcd keeps
//! in its key bucket). In memory only: it is rebuilt by scanning the data files on open.
//!
//! Revisions arrive almost always in ascending order (each write appends the next ones), and
//! compaction removes them scattered across the whole history. So the log is a list of sorted
//! chunks of at most [`CHUNK`] entries, not a B-tree: an append goes at the end of the last
//! chunk, a removal only marks its entry dead, and a chunk is squeezed once half of it is
//! dead. An entry costs 28 bytes (a B-tree filled in ascending order, its nodes half full,
//! cost about twice that), and lookups are two binary searches.
//!
//! ```text
//! chunks:  [2.0 3.0 3.1 x 5.0]  [6.0 x x 9.0]  [10.0 11.0]     x: a dead entry
//!          firsts 2.0, 6.0, 10.0; every revision of a chunk is below the next chunk's first
//! ```

use std::ops::Bound;

use crate::backend::Loc;
use crate::revision::Revision;

/// Entries a chunk holds before a new one is started.
const CHUNK: usize = 1024;

/// Marks a dead entry: no record has length 0.
const DEAD: Loc = Loc {
    file: 0,
    offset: 0,
    len: 0,
};

/// Ascending revisions and their records' places. Invariant: `revs` and `locs` have the same
/// length, `revs` is strictly ascending, `dead` counts the entries whose loc is [`DEAD`], and
/// `dead < revs.len()` (an all-dead chunk is dropped).
#[derive(Debug, Default)]
struct Chunk {
    revs: Vec<Revision>,
    locs: Vec<Loc>,
    dead: usize,
}

impl Chunk {
    fn with_capacity(n: usize) -> Chunk {
        Chunk {
            revs: Vec::with_capacity(n),
            locs: Vec::with_capacity(n),
            dead: 0,
        }
    }

    /// Drops the dead entries.
    fn squeeze(&mut self) {
        let (mut revs, mut locs): (Vec<Revision>, Vec<Loc>) = self
            .revs
            .iter()
            .zip(&self.locs)
            .filter(|(_, l)| **l != DEAD)
            .map(|(r, l)| (*r, *l))
            .unzip();
        revs.shrink_to_fit();
        locs.shrink_to_fit();
        (self.revs, self.locs, self.dead) = (revs, locs, 0);
    }
}

/// See the module docs. Invariant: no chunk is empty, and chunks ascend: every revision of a
/// chunk is below the first of the next.
#[derive(Debug, Default)]
pub(crate) struct RevisionLog {
    chunks: Vec<Chunk>,
    /// A lower bound of each chunk, searched instead of the chunks themselves (one contiguous
    /// array, no pointer to follow per step). Invariant: one per chunk; `lows[i]` is at or
    /// below every revision of chunk `i` and above every revision of chunk `i - 1`.
    lows: Vec<Revision>,
    /// Live entries.
    len: usize,
    /// Bytes the records take in the data files. Invariant: the sum of `len` over the live
    /// entries.
    bytes: u64,
}

impl RevisionLog {
    /// Bytes the records still in history take in the data files.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries still in history.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The log of `entries`, which must ascend strictly by revision (a saved index's, sorted):
    /// full chunks, built without searching. `None` if they do not ascend.
    pub(crate) fn from_sorted(entries: &[(Revision, Loc)]) -> Option<RevisionLog> {
        let mut log = RevisionLog::default();
        for part in entries.chunks(CHUNK) {
            let mut chunk = Chunk::with_capacity(part.len());
            for (rev, loc) in part {
                let after = chunk.revs.last().or(log.chunks.last().and_then(|c| c.revs.last()));
                if after.is_some_and(|last| last >= rev) || *loc == DEAD {
                    return None;
                }
                chunk.revs.push(*rev);
                chunk.locs.push(*loc);
                log.bytes += u64::from(loc.len);
            }
            log.len += part.len();
            log.lows.push(chunk.revs.first().copied().unwrap_or_default());
            log.chunks.push(chunk);
        }
        Some(log)
    }

    /// The chunk that holds `rev` if any chunk does: the last one whose first revision is at
    /// or below it.
    fn chunk_of(&self, rev: &Revision) -> Option<usize> {
        self.lows.partition_point(|low| low <= rev).checked_sub(1)
    }

    /// Records that the change at `rev` is at `loc` (replacing what was recorded for it).
    pub(crate) fn insert(&mut self, rev: Revision, loc: Loc) {
        let Some(ci) = self.chunk_of(&rev) else {
            // Before every chunk (or none yet): a new first chunk, or the front of the first.
            match self.chunks.first_mut() {
                Some(first) if first.revs.len() < CHUNK => {
                    first.revs.insert(0, rev);
                    first.locs.insert(0, loc);
                    if let Some(low) = self.lows.first_mut() {
                        *low = rev;
                    }
                }
                _ => {
                    let mut chunk = Chunk::with_capacity(1);
                    chunk.revs.push(rev);
                    chunk.locs.push(loc);
                    self.chunks.insert(0, chunk);
                    self.lows.insert(0, rev);
                }
            }
            self.len += 1;
            self.bytes += u64::from(loc.len);
            return;
        };
        let last = ci + 1 == self.chunks.len();
        let Some(chunk) = self.chunks.get_mut(ci) else {
            return;
        };
        match chunk.revs.binary_search(&rev) {
            Ok(i) => {
                if let Some(at) = chunk.locs.get_mut(i) {
                    if *at == DEAD {
                        chunk.dead -= 1;
                        self.len += 1;
                    } else {
                        self.bytes -= u64::from(at.len);
                    }
                    *at = loc;
                    self.bytes += u64::from(loc.len);
                }
                return;
            }
            Err(i) if i == chunk.revs.len() && last && chunk.revs.len() >= CHUNK => {
                // The usual case once a chunk is full: a new last chunk.
                let mut chunk = Chunk::with_capacity(CHUNK);
                chunk.revs.push(rev);
                chunk.locs.push(loc);
                self.chunks.push(chunk);
                self.lows.push(rev);
            }
            Err(i) => {
                chunk.revs.insert(i, rev);
                chunk.locs.insert(i, loc);
                if chunk.revs.len() >= 2 * CHUNK {
                    // Only out-of-order inserts grow a chunk this far: split it.
                    let mut tail = Chunk {
                        revs: chunk.revs.split_off(CHUNK),
                        locs: chunk.locs.split_off(CHUNK),
                        dead: 0,
                    };
                    chunk.dead = chunk.locs.iter().filter(|l| **l == DEAD).count();
                    tail.dead = tail.locs.iter().filter(|l| **l == DEAD).count();
                    let low = tail.revs.first().copied().unwrap_or_default();
                    self.chunks.insert(ci + 1, tail);
                    self.lows.insert(ci + 1, low);
                }
            }
        }
        self.len += 1;
        self.bytes += u64::from(loc.len);
    }

    /// Forgets the change at `rev`, if it is recorded.
    pub(crate) fn remove(&mut self, rev: &Revision) {
        let Some(ci) = self.chunk_of(rev) else {
            return;
        };
        let Some(chunk) = self.chunks.get_mut(ci) else {
            return;
        };
        let Ok(i) = chunk.revs.binary_search(rev) else {
            return;
        };
        let Some(at) = chunk.locs.get_mut(i) else {
            return;
        };
        if *at == DEAD {
            return;
        }
        self.bytes -= u64::from(at.len);
        self.len -= 1;
        *at = DEAD;
        chunk.dead += 1;
        if chunk.dead == chunk.revs.len() {
            self.chunks.remove(ci);
            self.lows.remove(ci);
        } else if i + 1 == chunk.revs.len() {
            // Undoing the newest change (an abandoned request): take it off the end.
            chunk.revs.pop();
            chunk.locs.pop();
            chunk.dead -= 1;
        } else if chunk.dead * 2 > chunk.revs.len() {
            chunk.squeeze();
        }
    }

    /// Where the record of `rev` lives.
    pub(crate) fn get(&self, rev: &Revision) -> Option<Loc> {
        let chunk = self.chunks.get(self.chunk_of(rev)?)?;
        let i = chunk.revs.binary_search(rev).ok()?;
        chunk.locs.get(i).copied().filter(|l| *l != DEAD)
    }

    /// Where the record of `rev` lives, to repoint it (to a copy: the length must stay).
    pub(crate) fn get_mut(&mut self, rev: &Revision) -> Option<&mut Loc> {
        let ci = self.chunk_of(rev)?;
        let chunk = self.chunks.get_mut(ci)?;
        let i = chunk.revs.binary_search(rev).ok()?;
        chunk.locs.get_mut(i).filter(|l| **l != DEAD)
    }

    /// The live entries from `from` to `to`, in revision order.
    pub(crate) fn range(
        &self,
        from: Bound<Revision>,
        to: Bound<Revision>,
    ) -> impl Iterator<Item = (Revision, Loc)> + '_ {
        let (ci, i) = match from {
            Bound::Unbounded => (0, 0),
            Bound::Included(r) | Bound::Excluded(r) => match self.chunk_of(&r) {
                None => (0, 0),
                Some(ci) => {
                    let revs = self.chunks.get(ci).map_or(&[][..], |c| c.revs.as_slice());
                    let i = match from {
                        Bound::Excluded(_) => revs.partition_point(|x| *x <= r),
                        _ => revs.partition_point(|x| *x < r),
                    };
                    (ci, i)
                }
            },
        };
        self.chunks
            .get(ci..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(move |(n, c)| {
                let skip = if n == 0 { i } else { 0 };
                c.revs.iter().zip(c.locs.iter()).skip(skip)
            })
            .filter(|(_, l)| **l != DEAD)
            .map(|(r, l)| (*r, *l))
            .take_while(move |(r, _)| match to {
                Bound::Unbounded => true,
                Bound::Included(end) => *r <= end,
                Bound::Excluded(end) => *r < end,
            })
    }

    /// Every live entry, in revision order (for consistency checks).
    #[cfg(any(debug_assertions, test))]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Revision, Loc)> + '_ {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn loc(n: u32) -> Loc {
        Loc {
            file: 1,
            offset: n * 64,
            len: 64 + n % 3,
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Append(u8),
        Insert(i64, i64),
        Remove(i64, i64),
        Repoint(i64, i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u8..4).prop_map(Op::Append),
            1 => (0i64..3000, 0i64..3).prop_map(|(m, s)| Op::Insert(m, s)),
            4 => (0i64..3000, 0i64..3).prop_map(|(m, s)| Op::Remove(m, s)),
            1 => (0i64..3000, 0i64..3).prop_map(|(m, s)| Op::Repoint(m, s)),
        ]
    }

    /// The invariants written on [`RevisionLog`] and [`Chunk`].
    fn check(log: &RevisionLog) -> Result<(), String> {
        if log.lows.len() != log.chunks.len() {
            return Err("one low per chunk".into());
        }
        let mut previous_last = None;
        for (c, low) in log.chunks.iter().zip(&log.lows) {
            let dead = c.locs.iter().filter(|l| **l == DEAD).count();
            if c.revs.len() != c.locs.len() || dead != c.dead || dead >= c.revs.len() {
                return Err(format!(
                    "chunk at {low}: {} revs, {} locs, {dead} dead ({})",
                    c.revs.len(),
                    c.locs.len(),
                    c.dead
                ));
            }
            if !c.revs.windows(2).all(|w| w[0] < w[1]) || c.revs.first().is_some_and(|f| f < low) {
                return Err(format!("chunk at {low} out of order"));
            }
            if previous_last.is_some_and(|last| last >= *low) {
                return Err(format!("chunk at {low} overlaps the one before"));
            }
            previous_last = c.revs.last().copied();
        }
        Ok(())
    }

    fn bound(kind: u8, r: Revision) -> Bound<Revision> {
        match kind % 3 {
            0 => Bound::Unbounded,
            1 => Bound::Included(r),
            _ => Bound::Excluded(r),
        }
    }

    proptest! {
        /// The log answers as a `BTreeMap<Revision, Loc>` would (its former form), through
        /// appends, out-of-order inserts, scattered removals and repointing.
        #[test]
        fn behaves_like_a_sorted_map(ops in proptest::collection::vec(op(), 1..3000),
                                     queries in proptest::collection::vec((0u8..3, 0i64..3000, 0u8..3, 0i64..3000), 8)) {
            let mut log = RevisionLog::default();
            let mut model = BTreeMap::new();
            let mut main = 0i64;
            let mut n = 0u32;
            for op in ops {
                n += 1;
                match op {
                    Op::Append(subs) => {
                        main += 1;
                        for sub in 0..i64::from(subs) {
                            log.insert(Revision::new(main, sub), loc(n));
                            model.insert(Revision::new(main, sub), loc(n));
                        }
                    }
                    Op::Insert(m, s) => {
                        log.insert(Revision::new(m, s), loc(n));
                        model.insert(Revision::new(m, s), loc(n));
                    }
                    Op::Remove(m, s) => {
                        log.remove(&Revision::new(m, s));
                        model.remove(&Revision::new(m, s));
                    }
                    Op::Repoint(m, s) => {
                        let r = Revision::new(m, s);
                        prop_assert_eq!(log.get_mut(&r).copied(), model.get(&r).copied());
                        // Defragmentation moves a record: same length, another place.
                        if let (Some(a), Some(b)) = (log.get_mut(&r), model.get_mut(&r)) {
                            let moved = Loc { file: 2, offset: n, len: a.len };
                            *a = moved;
                            *b = moved;
                        }
                    }
                }
            }
            prop_assert_eq!(check(&log), Ok(()));
            prop_assert_eq!(log.len(), model.len());
            prop_assert_eq!(log.bytes(), model.values().map(|l| u64::from(l.len)).sum::<u64>());
            prop_assert!(log.iter().eq(model.iter().map(|(r, l)| (*r, *l))));
            for (fk, fm, tk, tm) in queries {
                let (from, to) = (bound(fk, Revision::new(fm, 1)), bound(tk, Revision::new(tm, 1)));
                if let (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) = (from, to) {
                    if a > b || (a == b && !(matches!(from, Bound::Included(_)) && matches!(to, Bound::Included(_)))) {
                        continue; // BTreeMap::range panics on these
                    }
                }
                let got: Vec<_> = log.range(from, to).collect();
                let want: Vec<_> = model.range((from, to)).map(|(r, l)| (*r, *l)).collect();
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn an_ascending_load_fills_whole_chunks() {
        let mut log = RevisionLog::default();
        for m in 0..(3 * CHUNK as i64 + 1) {
            log.insert(Revision::new(m, 0), loc(1));
        }
        assert_eq!(log.chunks.len(), 4);
        assert!(log.chunks.iter().take(3).all(|c| c.revs.len() == CHUNK));
        // Removing most of a chunk squeezes it; removing all of it drops it.
        for m in 0..(CHUNK as i64 * 3 / 4) {
            log.remove(&Revision::new(m, 0));
        }
        let first = log
            .chunks
            .first()
            .map(|c| (c.revs.len() - c.dead, c.dead * 2 <= c.revs.len()));
        assert_eq!(first, Some((CHUNK / 4, true)), "squeezed once half of it was dead");
        for m in (CHUNK as i64 * 3 / 4)..(CHUNK as i64) {
            log.remove(&Revision::new(m, 0));
        }
        assert_eq!(log.chunks.len(), 3);
        assert_eq!(log.len(), 2 * CHUNK + 1);
    }
}
