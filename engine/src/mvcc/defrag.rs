//! Defragmentation as one object per phase, whose methods follow its protocol. Writes go on
//! throughout: the caller takes the store's lock only around the short steps that need it.
//!
//! 1. [`Store::begin_defrag`] seals the active data file (new writes go to a new one) and
//!    returns a [`Copying`]: every record at or below the cut, the revision then, is to be
//!    copied into fresh files.
//! 2. [`Copying`], in rounds: [`Copying::fetch`] the next records to copy (read lock),
//!    [`Copying::copy`] them (no lock: the slow part), and when [`Copying::has_news`],
//!    [`Copying::install`] (write lock): copies in sealed files become readable and their
//!    records are pointed at them. [`Copying::finish`] seals the last file.
//! 3. [`Repointing::install`] (write lock, in batches) makes the last file readable and points
//!    the remaining records at their copies, then [`Repointing::switch`] drops the old files from the layout and returns their
//!    paths, to delete once a checkpoint of the new layout is durable.
//!
//! One written meanwhile is above the cut and in a new file already. The compaction sweep waits
//! from the start to the switch (or [`Store::abandon_defrag`]): were it to drop a key's history
//! between two batches, the copies would hold the key's put but not its later delete, and a
//! store rebuilt from them after a restart would have the key back (found by the hash checks
//! of tests/faults). A record compacted away before the copy began is not in the log, so not
//! copied.

use std::collections::VecDeque;
use std::ops::Bound;
use std::path::PathBuf;

use super::store::Store;
use crate::backend::{Active, FileMaker, Loc, Sealed};
use crate::error::{Error, Result};
use crate::revision::Revision;

/// A defragmentation syncs its copies every this many bytes.
const SYNC_BYTES: u64 = 512 << 10;

/// The copying phase (see the module docs).
#[derive(Debug)]
pub(crate) struct Copying {
    /// Records up to this revision are copied; later ones are written to new files anyway.
    cut: Revision,
    /// The files being defragmented.
    old: Vec<(u32, Sealed)>,
    maker: FileMaker,
    /// Records and their new places per lock hold, and per fetch.
    batch: usize,
    /// The file being filled with copies.
    out: Option<Active>,
    /// The last revision fetched.
    after: Option<Revision>,
    /// Fetched, not yet copied.
    chunk: Vec<(Revision, Loc)>,
    /// Copied into the file still being filled: not readable yet.
    pending: Vec<(Revision, Loc)>,
    /// Files filled and sealed, to register.
    filled: Vec<(u32, Sealed)>,
    /// Copied into registered files, to point at.
    ready: VecDeque<(Revision, Loc)>,
    /// Every file of copies, in order.
    fresh: Vec<u32>,
}

/// The repointing phase (see the module docs).
#[derive(Debug)]
pub(crate) struct Repointing {
    old: Vec<u32>,
    /// The last file sealed, to register.
    filled: Vec<(u32, Sealed)>,
    ready: VecDeque<(Revision, Loc)>,
    fresh: Vec<u32>,
    batch: usize,
}

impl Store {
    /// Starts defragmenting, copying and repointing `batch` records at a time (see the
    /// module docs).
    pub(crate) fn begin_defrag(&mut self, batch: usize) -> Result<Copying> {
        let (old, maker) = self.backend.begin_defrag()?;
        self.defragmenting = true;
        Ok(Copying {
            cut: Revision::new(self.current_revision(), i64::MAX),
            old,
            maker,
            batch: batch.max(1),
            out: None,
            after: None,
            chunk: Vec::new(),
            pending: Vec::new(),
            filled: Vec::new(),
            ready: VecDeque::new(),
            fresh: Vec::new(),
        })
    }
}

impl Copying {
    /// Takes the next records to copy from `store`; false once every one is copied.
    pub(crate) fn fetch(&mut self, store: &Store) -> bool {
        let from = self.after.map_or(Bound::Unbounded, Bound::Excluded);
        self.chunk = store
            .log
            .range(from, Bound::Included(self.cut))
            .take(self.batch)
            .collect();
        self.after = self.chunk.last().map(|(rev, _)| *rev).or(self.after);
        !self.chunk.is_empty()
    }

    /// Copies the fetched records, starting new files as they fill.
    pub(crate) fn copy(&mut self) -> Result<()> {
        for (rev, loc) in std::mem::take(&mut self.chunk) {
            let file = self
                .old
                .iter()
                .find(|(id, _)| *id == loc.file)
                .map(|(_, f)| f)
                .ok_or_else(|| Error::internal(format!("record {loc:?} is in no file being defragmented")))?;
            let record = file.read(loc)?;
            let active = match &mut self.out {
                Some(a) => a,
                None => self.out.insert(self.maker.create(record.padded_len())?),
            };
            let before = active.len();
            let (new_loc, full) = self.maker.append(active, &record)?;
            // Sync as it goes, a few MiB at a time, so the disk is never busy for long with
            // the copies (the WAL's fsyncs queue behind them) and the final checkpoint has
            // little left to sync.
            if active.len() / SYNC_BYTES != before / SYNC_BYTES {
                active.sync()?;
            }
            self.pending.push((rev, new_loc));
            if let Some(file) = full {
                self.sealed(file);
            }
        }
        Ok(())
    }

    /// A file filled: its copies become ready once it is registered.
    fn sealed(&mut self, (id, file): (u32, Sealed)) {
        let (done, still): (Vec<_>, Vec<_>) = self.pending.drain(..).partition(|(_, l)| l.file == id);
        self.pending = still;
        self.ready.extend(done);
        self.fresh.push(id);
        self.filled.push((id, file));
    }

    /// Whether [`Copying::install`] has anything to do.
    pub(crate) fn has_news(&self) -> bool {
        !self.filled.is_empty() || !self.ready.is_empty()
    }

    /// Makes the sealed copies readable and points up to a batch of records at them.
    pub(crate) fn install(&mut self, store: &mut Store) {
        for (id, file) in self.filled.drain(..) {
            store.backend.register(id, file);
        }
        repoint(store, &mut self.ready, self.batch);
    }

    /// Seals the last file; every record is copied, and what is left is repointing.
    pub(crate) fn finish(mut self) -> Result<Repointing> {
        if let Some(last) = self.out.take() {
            let (id, sealed) = self.maker.finish(last)?;
            self.filled.push((id, sealed));
            self.fresh.push(id);
            self.ready.extend(self.pending.drain(..));
        }
        Ok(Repointing {
            old: self.old.iter().map(|(id, _)| *id).collect(),
            filled: self.filled,
            ready: self.ready,
            fresh: self.fresh,
            batch: self.batch,
        })
    }
}

impl Repointing {
    /// Makes the last copies readable and points up to a batch of records at their copies;
    /// false once none is left.
    pub(crate) fn install(&mut self, store: &mut Store) -> bool {
        for (id, file) in self.filled.drain(..) {
            store.backend.register(id, file);
        }
        repoint(store, &mut self.ready, self.batch);
        !self.ready.is_empty()
    }

    /// Switches the layout to the copies: returns the old files' paths, to delete once a
    /// checkpoint of the new layout is durable.
    pub(crate) fn switch(self, store: &mut Store) -> Result<Vec<PathBuf>> {
        if !self.ready.is_empty() {
            return Err(Error::internal(
                "a defragmentation switched before every record was repointed",
            ));
        }
        // Every record up to the cut was repointed: the revision log gains no revision at or
        // below it. Checked in debug builds only: it walks the whole log under the lock.
        #[cfg(debug_assertions)]
        if let Some((rev, loc)) = store.log.iter().find(|(_, l)| self.old.contains(&l.file)) {
            return Err(Error::internal(format!(
                "revision {rev} still in an old data file at {loc:?}"
            )));
        }
        store.defragmenting = false;
        Ok(store.backend.switch(&self.old, &self.fresh))
    }
}

/// Points up to `batch` of `ready` at their copies.
fn repoint(store: &mut Store, ready: &mut VecDeque<(Revision, Loc)>, batch: usize) {
    let n = ready.len().min(batch);
    for (rev, loc) in ready.drain(..n) {
        if let Some(at) = store.log.get_mut(&rev) {
            *at = loc;
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::mvcc::store::ReadOptions;

    fn put(store: &mut Store, key: &[u8], value: Bytes) {
        let mut w = store.write();
        w.put(key, value, 0).unwrap();
        w.finish();
    }

    fn everything(store: &Store, revision: i64) -> Vec<(Vec<u8>, Bytes, i64)> {
        let opts = ReadOptions {
            revision,
            ..ReadOptions::default()
        };
        let found = store.range(&[0], &[0], opts).unwrap();
        found
            .kvs
            .into_iter()
            .map(|kv| (kv.key.to_vec(), kv.value, kv.mod_revision))
            .collect()
    }

    #[test]
    fn writes_go_on_and_every_revision_reads_the_same_after_the_switch() {
        let dir = tempfile::tempdir().unwrap();
        // Small files, so the copies fill and seal several along the way.
        let mut store = Store::open(dir.path(), 4096, None, None).unwrap().store;
        for i in 0..300 {
            put(
                &mut store,
                format!("k{:03}", i % 40).as_bytes(),
                Bytes::from(vec![b'v'; 50]),
            );
        }
        let before: Vec<_> = (250..=301).map(|rev| everything(&store, rev)).collect();
        let old_files = store.file_paths();

        let mut copying = store.begin_defrag(16).unwrap();
        let mut rounds = 0;
        while copying.fetch(&store) {
            copying.copy().unwrap();
            // A write between rounds lands above the cut, in a new file: not copied.
            put(&mut store, b"during", Bytes::from(format!("{rounds}")));
            if copying.has_news() {
                copying.install(&mut store);
            }
            rounds += 1;
        }
        assert!(rounds > 300 / 16, "copied in batches: {rounds} rounds");
        let mut repointing = copying.finish().unwrap();
        while repointing.install(&mut store) {}
        let deleted = repointing.switch(&mut store).unwrap();
        assert_eq!(deleted.len(), old_files.len(), "every old file goes");
        for path in &deleted {
            std::fs::remove_file(path).unwrap();
        }
        // History reads the same, from the copies alone.
        let after: Vec<_> = (250..=301).map(|rev| everything(&store, rev)).collect();
        assert_eq!(after, before);
        let current = everything(&store, 0);
        assert!(current
            .iter()
            .any(|(k, v, _)| k == b"during" && *v == format!("{}", rounds - 1)));
    }

    #[test]
    fn a_key_compacted_away_while_copying_stays_gone_in_a_store_rebuilt_from_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 4096, None, None).unwrap().store;
        put(&mut store, b"doomed", Bytes::from_static(b"v"));
        for i in 0..100 {
            put(&mut store, format!("k{i}").as_bytes(), Bytes::from_static(b"v"));
        }
        {
            let mut w = store.write();
            w.delete_range(b"doomed", &[]).unwrap();
            w.finish();
        }
        let mut copying = store.begin_defrag(10).unwrap();
        // The first batch holds the put of "doomed"; its delete comes in a later one.
        assert!(copying.fetch(&store));
        copying.copy().unwrap();
        // Compacted past the delete meanwhile: the sweep must not drop its history yet.
        store.begin_compaction(store.current_revision()).unwrap();
        assert!(!store.compaction_step(usize::MAX) && store.compaction_unfinished());
        while copying.fetch(&store) {
            copying.copy().unwrap();
            if copying.has_news() {
                copying.install(&mut store);
            }
        }
        let mut repointing = copying.finish().unwrap();
        while repointing.install(&mut store) {}
        for path in repointing.switch(&mut store).unwrap() {
            std::fs::remove_file(path).unwrap();
        }
        while store.compaction_step(usize::MAX) {}
        store.flush().unwrap();
        let (meta, hash) = (store.meta(), store.hash_kv(0).unwrap());
        drop(store);

        // What a restart does: the store rebuilt from the files the checkpoint lists.
        let rebuilt = Store::open(dir.path(), 4096, Some(&meta), None).unwrap().store;
        assert!(
            everything(&rebuilt, 0).iter().all(|(k, _, _)| k != b"doomed"),
            "a deleted key came back"
        );
        assert_eq!(rebuilt.hash_kv(0).unwrap(), hash);
    }

    #[test]
    fn the_switch_is_refused_until_every_record_points_at_its_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(dir.path(), 4096, None, None).unwrap().store;
        for i in 0..100 {
            put(&mut store, format!("k{i}").as_bytes(), Bytes::from_static(b"v"));
        }
        let mut copying = store.begin_defrag(10).unwrap();
        while copying.fetch(&store) {
            copying.copy().unwrap();
        }
        let mut repointing = copying.finish().unwrap();
        assert!(repointing.install(&mut store), "one batch of many");
        assert!(matches!(repointing.switch(&mut store), Err(Error::Internal(_))));
    }
}
