//! The history of one key: its generations of revisions.
//!
//! A generation is a key's life from creation to deletion. Each put adds a revision to the
//! current generation; a delete adds a tombstone revision and closes it, opening an empty one.
//! For example, a key put at 1.0, 2.0 and 3.0, deleted at 4.0, put again at 5.0 and 6.0:
//!
//! ```text
//! generations, oldest first:
//!     {1.0, 2.0, 3.0, 4.0(t)}    closed by the tombstone 4.0
//!     {5.0, 6.0}                 current: the key lives (after a delete it is {}, empty)
//! ```
//!
//! Reading at revision 3 finds 3.0 (version 3, created 1.0); at 4 the key does not exist (its
//! tombstone is at or before 4); at 5 it finds 5.0, version 1, created 5.0.
//!
//! Compacting at revision `r` keeps, in the generation that holds `r`, the newest revision at
//! or below `r` and everything after it, and drops older generations. A kept revision that is a
//! tombstone is dropped too, with its generation: nothing can read it any more. Compacting the
//! example at 4 leaves `[{5.0, 6.0}]`; at 2 it leaves `[{2.0, 3.0, 4.0(t)}, {5.0, 6.0}]`.

use std::num::NonZeroU32;

use smallvec::{smallvec, SmallVec};

use crate::revision::Revision;

/// One life of a key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Generation {
    /// Puts in this generation (the key's version is reset by a delete).
    /// Invariant: `ver >= revs.len()` once compaction has dropped early revisions.
    pub(crate) ver: i64,
    /// The revision that created the key in this generation.
    pub(crate) created: Revision,
    /// Ascending; in a closed generation the last one is the tombstone. Inline while there is
    /// one (most keys, once compacted): a key then costs the index no allocation of its own.
    pub(crate) revs: SmallVec<[Revision; 1]>,
}

impl Generation {
    fn is_empty(&self) -> bool {
        self.revs.is_empty()
    }

    /// Index of the newest revision with `main <= at`, if any.
    fn newest_at(&self, at: i64) -> Option<usize> {
        self.revs.iter().rposition(|r| r.main <= at)
    }
}

/// Why a change to a key's history was refused: the store would be inconsistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum KeyIndexError {
    #[error("revision {given} is not after the key's last revision {last}")]
    NotAfterLast { given: Revision, last: Revision },
    #[error("cannot delete a key that does not exist")]
    NotLive,
}

/// The revisions of one key, in either of two forms (see [`Repr`]).
///
/// Memory matters here: the index holds every key, and most keys, once compacted, are alive
/// with one revision. Such a key takes 32 bytes in its leaf and no allocation of its own; any
/// other history is boxed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyIndex(Repr);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    /// A key alive with one revision in its one generation, when the figures fit.
    One(One),
    /// Any other history.
    Many(Box<History>),
}

/// A key alive with one revision: what [`History`] holds as one generation of one revision,
/// packed. Its sub-revisions fit 32 bits (a sub-revision counts the changes within one
/// request) and its version does too, and is not 0 (the niche that tells the forms apart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct One {
    created_main: i64,
    modified_main: i64,
    created_sub: u32,
    modified_sub: u32,
    ver: NonZeroU32,
}

// The form most keys take: checked here, so that a change of layout is seen.
const _: () = assert!(size_of::<KeyIndex>() == 32);

impl One {
    fn of(history: &History) -> Option<One> {
        let [g] = history.generations.as_slice() else {
            return None;
        };
        let [modified] = g.revs.as_slice() else {
            return None;
        };
        Some(One {
            created_main: g.created.main,
            modified_main: modified.main,
            created_sub: u32::try_from(g.created.sub).ok()?,
            modified_sub: u32::try_from(modified.sub).ok()?,
            ver: u32::try_from(g.ver).ok().and_then(NonZeroU32::new)?,
        })
    }

    fn created(self) -> Revision {
        Revision {
            main: self.created_main,
            sub: i64::from(self.created_sub),
        }
    }

    fn modified(self) -> Revision {
        Revision {
            main: self.modified_main,
            sub: i64::from(self.modified_sub),
        }
    }

    fn found(self) -> Found {
        Found {
            modified: self.modified(),
            created: self.created(),
            version: i64::from(self.ver.get()),
        }
    }

    fn history(self) -> History {
        History {
            generations: smallvec![Generation {
                ver: i64::from(self.ver.get()),
                created: self.created(),
                revs: smallvec![self.modified()],
            }],
        }
    }
}

/// The revisions of one key as generations. Invariant: `generations` is non-empty, only the
/// last generation may be empty, and all revisions ascend across generations.
#[derive(Clone, Debug, PartialEq, Eq)]
struct History {
    generations: SmallVec<[Generation; 1]>,
}

/// What a read of a key at a revision finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    /// The revision holding the value that was current then.
    pub(crate) modified: Revision,
    pub(crate) created: Revision,
    pub(crate) version: i64,
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex::from(History::default())
    }
}

impl Default for History {
    fn default() -> Self {
        History {
            generations: smallvec![Generation::default()],
        }
    }
}

impl From<History> for KeyIndex {
    fn from(history: History) -> KeyIndex {
        KeyIndex(match One::of(&history) {
            Some(one) => Repr::One(one),
            None => Repr::Many(Box::new(history)),
        })
    }
}

impl KeyIndex {
    /// The last revision that changed the key (a put or its tombstone); the default revision
    /// for a key with no history. Compaction never drops it while the key has any history.
    pub(crate) fn modified(&self) -> Revision {
        match &self.0 {
            Repr::One(one) => one.modified(),
            Repr::Many(history) => history.modified(),
        }
    }

    /// The history made of `generations` (a saved index's), if it keeps the invariant: at
    /// least one generation, only the last one empty, revisions ascending across all.
    pub(crate) fn from_generations(generations: SmallVec<[Generation; 1]>) -> Option<KeyIndex> {
        History::from_generations(generations).map(KeyIndex::from)
    }

    /// The key's generations, oldest first (a copy, for tests).
    #[cfg(test)]
    pub(crate) fn generations(&self) -> SmallVec<[Generation; 1]> {
        self.with_generations(|g| g.iter().cloned().collect())
    }

    /// Runs `f` on the key's generations, oldest first, unpacked on the stack if packed (for
    /// saving them, key after key, without a copy of every boxed history).
    pub(crate) fn with_generations<R>(&self, f: impl FnOnce(&[Generation]) -> R) -> R {
        match &self.0 {
            Repr::One(one) => f(&one.history().generations),
            Repr::Many(history) => f(&history.generations),
        }
    }

    /// Changes the history with `change`, in generations, then packs it again.
    fn change<R>(&mut self, change: impl FnOnce(&mut History) -> R) -> R {
        match &mut self.0 {
            Repr::Many(history) => {
                let r = change(history);
                if let Some(one) = One::of(history) {
                    self.0 = Repr::One(one);
                }
                r
            }
            Repr::One(one) => {
                let mut history = one.history();
                let r = change(&mut history);
                *self = KeyIndex::from(history);
                r
            }
        }
    }

    /// Records a put at `rev`.
    pub(crate) fn put(&mut self, rev: Revision) -> Result<(), KeyIndexError> {
        self.change(|h| h.put(rev))
    }

    /// Records a delete at `rev`, closing the current generation.
    pub(crate) fn tombstone(&mut self, rev: Revision) -> Result<(), KeyIndexError> {
        self.change(|h| h.tombstone(rev))
    }

    /// Takes back the last change, made at `rev` (a put, or a delete when `tombstone`). For
    /// abandoning a write request.
    pub(crate) fn undo(&mut self, rev: Revision, tombstone: bool) {
        self.change(|h| h.undo(rev, tombstone));
    }

    /// The key as it is now, at its newest revision, if it exists: what [`KeyIndex::get`]
    /// finds at any revision from its last change on, without searching for it.
    pub(crate) fn current(&self) -> Option<Found> {
        match &self.0 {
            Repr::One(one) => Some(one.found()),
            Repr::Many(history) => history.current(),
        }
    }

    /// Whether the key exists at the newest revision.
    pub(crate) fn is_live(&self) -> bool {
        match &self.0 {
            Repr::One(_) => true,
            Repr::Many(history) => history.is_live(),
        }
    }

    /// Whether nothing is left of the key (after compaction).
    pub(crate) fn is_empty(&self) -> bool {
        match &self.0 {
            Repr::One(_) => false,
            Repr::Many(history) => history.is_empty(),
        }
    }

    /// The key as it was at revision `at`, if it existed then.
    pub(crate) fn get(&self, at: i64) -> Option<Found> {
        match &self.0 {
            Repr::One(one) => (one.modified_main <= at).then(|| one.found()),
            Repr::Many(history) => history.get(at),
        }
    }

    /// Drops history that no read at or after revision `at` can see (see the module docs),
    /// adding the revisions dropped to `dropped`: their records can go.
    pub(crate) fn compact(&mut self, at: i64, dropped: &mut Vec<Revision>) {
        if let Repr::One(_) = self.0 {
            return; // one revision of a live key: every later read sees it
        }
        self.change(|h| h.compact(at, dropped));
    }

    /// Records a change read back from a data file: a put at `rev` with the create revision
    /// and version the record carries (earlier puts of the generation may be compacted away,
    /// so they cannot be counted), or a tombstone when `version` is 0.
    pub(crate) fn restore(&mut self, rev: Revision, created: Revision, version: i64) -> Result<(), KeyIndexError> {
        self.change(|h| h.restore(rev, created, version))
    }
}

impl History {
    /// The last revision that changed the key (a put or its tombstone); the default revision
    /// for a key with no history. Compaction never drops it while the key has any history.
    fn modified(&self) -> Revision {
        self.generations
            .iter()
            .rev()
            .find_map(|g| g.revs.last().copied())
            .unwrap_or_default()
    }

    /// The history made of `generations` (a saved index's), if it keeps the invariant: at
    /// least one generation, only the last one empty, revisions ascending across all.
    fn from_generations(generations: SmallVec<[Generation; 1]>) -> Option<History> {
        let last = generations.len().checked_sub(1)?;
        let mut before: Option<Revision> = None;
        for (i, g) in generations.iter().enumerate() {
            if g.revs.is_empty() && i != last {
                return None;
            }
            for rev in &g.revs {
                if before.is_some_and(|b| b >= *rev) {
                    return None;
                }
                before = Some(*rev);
            }
        }
        Some(History { generations })
    }

    /// Records a put at `rev`.
    fn put(&mut self, rev: Revision) -> Result<(), KeyIndexError> {
        let last = self.modified();
        if rev <= last {
            return Err(KeyIndexError::NotAfterLast { given: rev, last });
        }
        if self.generations.is_empty() {
            self.generations.push(Generation::default());
        }
        if let Some(g) = self.generations.last_mut() {
            if g.revs.is_empty() {
                g.created = rev;
            }
            g.revs.push(rev);
            g.ver += 1;
        }
        Ok(())
    }

    /// Records a delete at `rev`, closing the current generation.
    fn tombstone(&mut self, rev: Revision) -> Result<(), KeyIndexError> {
        if !self.is_live() {
            return Err(KeyIndexError::NotLive);
        }
        self.put(rev)?;
        self.generations.push(Generation::default());
        Ok(())
    }

    /// Takes back the last change, made at `rev` (a put, or a delete when `tombstone`). For
    /// abandoning a write request.
    fn undo(&mut self, rev: Revision, tombstone: bool) {
        if tombstone && self.generations.last().is_some_and(Generation::is_empty) {
            self.generations.pop();
        }
        if let Some(g) = self.generations.last_mut() {
            if g.revs.last() == Some(&rev) {
                g.revs.pop();
                g.ver -= 1;
            }
        }
        if self.generations.is_empty() {
            self.generations.push(Generation::default());
        }
    }

    /// The key as it is now, at its newest revision, if it exists: what [`History::get`]
    /// finds at any revision from its last change on, without searching for it.
    fn current(&self) -> Option<Found> {
        let g = self.generations.last()?;
        Some(Found {
            modified: *g.revs.last()?,
            created: g.created,
            version: g.ver,
        })
    }

    /// Whether the key exists at the newest revision.
    fn is_live(&self) -> bool {
        self.generations.last().is_some_and(|g| !g.is_empty())
    }

    /// Whether nothing is left of the key (after compaction).
    fn is_empty(&self) -> bool {
        self.generations.iter().all(Generation::is_empty)
    }

    /// The generation in which the key existed at revision `at`, if it did.
    fn generation_at(&self, at: i64) -> Option<&Generation> {
        let last = self.generations.len().checked_sub(1)?;
        for (i, g) in self.generations.iter().enumerate().rev() {
            let (Some(first), Some(tomb)) = (g.revs.first(), g.revs.last()) else {
                continue;
            };
            if i != last && tomb.main <= at {
                return None; // deleted at or before `at`
            }
            if first.main <= at {
                return Some(g);
            }
        }
        None
    }

    /// The key as it was at revision `at`, if it existed then.
    fn get(&self, at: i64) -> Option<Found> {
        let g = self.generation_at(at)?;
        let n = g.newest_at(at)?;
        let newer = (g.revs.len() - n - 1) as i64;
        Some(Found {
            modified: *g.revs.get(n)?,
            created: g.created,
            version: g.ver - newer,
        })
    }

    /// Drops history that no read at or after revision `at` can see (see the module docs),
    /// adding the revisions dropped to `dropped`: their records can go.
    fn compact(&mut self, at: i64, dropped: &mut Vec<Revision>) {
        let last = self.generations.len().saturating_sub(1);
        // The first generation still alive at `at`: its tombstone is after `at`, or it is the
        // current one.
        let mut gi = 0;
        while gi < last {
            match self.generations.get(gi).and_then(|g| g.revs.last()) {
                Some(tomb) if tomb.main > at => break,
                _ => gi += 1,
            }
        }
        if let Some(g) = self.generations.get_mut(gi) {
            if let Some(n) = g.newest_at(at) {
                dropped.extend(g.revs.drain(..n));
                if g.revs.len() == 1 && gi != last {
                    // Only the tombstone is left: the key did not exist at `at`.
                    gi += 1;
                }
            }
        }
        for g in self.generations.drain(..gi) {
            dropped.extend(g.revs);
        }
        if self.generations.is_empty() {
            self.generations.push(Generation::default());
        }
    }

    /// Records a change read back from a data file: a put at `rev` with the create revision
    /// and version the record carries (earlier puts of the generation may be compacted away,
    /// so they cannot be counted), or a tombstone when `version` is 0.
    fn restore(&mut self, rev: Revision, created: Revision, version: i64) -> Result<(), KeyIndexError> {
        if version == 0 {
            return self.tombstone(rev);
        }
        self.put(rev)?;
        if let Some(g) = self.generations.last_mut() {
            if g.revs.len() == 1 {
                g.created = created;
            }
            g.ver = version;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64) -> Revision {
        Revision::new(main, 0)
    }

    /// The module docs' example: put 1, 2, 3; delete 4; put 5, 6.
    fn example() -> KeyIndex {
        let mut ki = KeyIndex::default();
        for m in [1, 2, 3] {
            ki.put(rev(m)).unwrap();
        }
        ki.tombstone(rev(4)).unwrap();
        for m in [5, 6] {
            ki.put(rev(m)).unwrap();
        }
        ki
    }

    #[test]
    fn get_sees_the_key_as_it_was() {
        // etcd's data model: version counts puts since creation; a delete resets it.
        let ki = example();
        let cases = [
            (0, None),
            (1, Some((1, 1, 1))),
            (3, Some((3, 1, 3))),
            (4, None),
            (5, Some((5, 5, 1))),
            (6, Some((6, 5, 2))),
            (100, Some((6, 5, 2))),
        ];
        for (at, expected) in cases {
            let got = ki.get(at).map(|f| (f.modified.main, f.created.main, f.version));
            assert_eq!(got, expected, "get at {at}");
        }
    }

    #[test]
    fn revisions_must_ascend_and_only_live_keys_can_be_deleted() {
        let mut ki = example();
        assert!(matches!(ki.put(rev(6)), Err(KeyIndexError::NotAfterLast { .. })));
        ki.tombstone(rev(7)).unwrap();
        assert_eq!(ki.tombstone(rev(8)), Err(KeyIndexError::NotLive));
        assert!(!ki.is_live());
        assert_eq!(ki.get(7), None);
    }

    #[test]
    fn compaction_keeps_what_later_reads_see() {
        // Table: compact the example at `at`; the generations left, the revisions dropped, and
        // reads at or after `at` are unchanged.
        let cases: [(i64, Vec<Vec<i64>>, Vec<i64>); 7] = [
            (0, vec![vec![1, 2, 3, 4], vec![5, 6]], vec![]),
            (1, vec![vec![1, 2, 3, 4], vec![5, 6]], vec![]),
            (2, vec![vec![2, 3, 4], vec![5, 6]], vec![1]),
            (3, vec![vec![3, 4], vec![5, 6]], vec![1, 2]),
            (4, vec![vec![5, 6]], vec![1, 2, 3, 4]),
            (5, vec![vec![5, 6]], vec![1, 2, 3, 4]),
            (7, vec![vec![6]], vec![1, 2, 3, 4, 5]),
        ];
        for (at, generations, expect_dropped) in cases {
            let before = example();
            let mut ki = before.clone();
            let mut dropped = Vec::new();
            ki.compact(at, &mut dropped);
            dropped.sort();
            let left: Vec<Vec<i64>> = ki
                .generations()
                .iter()
                .filter(|g| !g.is_empty())
                .map(|g| g.revs.iter().map(|r| r.main).collect())
                .collect();
            assert_eq!(left, generations, "compact at {at}");
            assert_eq!(
                dropped.iter().map(|r| r.main).collect::<Vec<_>>(),
                expect_dropped,
                "dropped at {at}"
            );
            for read in at..=8 {
                assert_eq!(
                    ki.get(read),
                    before.get(read),
                    "read at {read} after compacting at {at}"
                );
            }
        }
    }

    #[test]
    fn restoring_surviving_records_rebuilds_the_compacted_history() {
        let mut compacted = example();
        compacted.compact(5, &mut Vec::new());
        // What the data files still hold after compaction at 5: 5.0 (created 5, version 1)
        // and 6.0 (version 2).
        let mut restored = KeyIndex::default();
        restored.restore(rev(5), rev(5), 1).unwrap();
        restored.restore(rev(6), rev(5), 2).unwrap();
        assert_eq!(restored, compacted);
        // At 3 the first generation survives from 3.0 (version 3), with its tombstone.
        let mut compacted = example();
        compacted.compact(3, &mut Vec::new());
        let mut restored = KeyIndex::default();
        restored.restore(rev(3), rev(1), 3).unwrap();
        restored.restore(rev(4), Revision::default(), 0).unwrap();
        restored.restore(rev(5), rev(5), 1).unwrap();
        restored.restore(rev(6), rev(5), 2).unwrap();
        assert_eq!(restored, compacted);
        assert_eq!(restored.get(3).map(|f| (f.created.main, f.version)), Some((1, 3)));
    }

    #[test]
    fn one_revision_of_a_live_key_is_packed_and_reads_as_its_history() {
        let mut ki = KeyIndex::default();
        ki.put(rev(3)).unwrap();
        assert!(matches!(ki.0, Repr::One(_)), "{ki:?}");
        ki.put(rev(5)).unwrap();
        assert!(matches!(ki.0, Repr::Many(_)), "two revisions: {ki:?}");
        ki.compact(5, &mut Vec::new());
        assert!(matches!(ki.0, Repr::One(_)), "compacted to one: {ki:?}");
        let unpacked = History::from_generations(ki.generations()).unwrap();
        for at in 0..8 {
            assert_eq!(ki.get(at), unpacked.get(at), "at {at}");
        }
        assert_eq!(ki.current(), unpacked.current());
        assert_eq!(ki.current().map(|f| (f.created, f.version)), Some((rev(3), 2)));
        // A delete unpacks it; taking the delete back packs it again.
        ki.tombstone(rev(7)).unwrap();
        assert!(!ki.is_live() && matches!(ki.0, Repr::Many(_)));
        ki.undo(rev(7), true);
        assert!(matches!(ki.0, Repr::One(_)), "{ki:?}");
        // Figures past 32 bits stay unpacked, and read back whole.
        let far = Revision { main: 9, sub: 1 << 40 };
        let mut big_sub = KeyIndex::default();
        big_sub.put(far).unwrap();
        assert!(matches!(big_sub.0, Repr::Many(_)));
        assert_eq!(big_sub.current().map(|f| f.modified), Some(far));
        let mut old = KeyIndex::default();
        old.restore(rev(9), rev(1), 1 << 33).unwrap();
        assert!(matches!(old.0, Repr::Many(_)));
        assert_eq!(old.current().map(|f| f.version), Some(1 << 33));
    }

    #[test]
    fn a_deleted_key_compacts_away_entirely() {
        let mut ki = KeyIndex::default();
        ki.put(rev(1)).unwrap();
        ki.tombstone(rev(2)).unwrap();
        let mut dropped = Vec::new();
        ki.compact(2, &mut dropped);
        assert!(ki.is_empty());
        assert_eq!(dropped, vec![rev(1), rev(2)]);
        // It can be created again afterwards.
        ki.put(rev(3)).unwrap();
        assert_eq!(ki.get(3).map(|f| f.version), Some(1));
    }
}
