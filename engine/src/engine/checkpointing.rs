//! Checkpoints: the state encoded under its lock (a small record: the applied index, the data
//! files' layout, the leases), then written without it, data files synced first. One is
//! written at a time and an older one never replaces a newer one; the log before it is
//! released once it is durable. A crash while one is written leaves the previous one.
//!
//! Opening loads the checkpoint, then replays only the log entries after its applied index;
//! segments of the log wholly below it are released. The applied index and the state are
//! written together, never separately, so a crash can never pair a state with the wrong
//! position in the log (the mistake behind etcd 3.5's data-inconsistency bug). What a
//! checkpoint holds, its file's layout, its versions and its atomic write are
//! `crate::format::checkpoint`'s.

use std::path::Path;

use cairn_wal::{LogIndex, Wal};
use parking_lot::Mutex;

use super::state::State;
use crate::backend::{FileMaker, DATA_DIR};
use crate::error::Result;
use crate::format::checkpoint;
use crate::format::checkpoint::Checkpoint;
use crate::mvcc::saved_index::{self, Target, When};

/// A checkpoint encoded under the state lock, to write without it.
#[derive(Debug)]
pub(super) struct Encoded {
    bytes: Vec<u8>,
    order: (u64, u64),
    pub(super) applied: u64,
    /// The data files to sync first, and what the saved index may cover once it is written.
    target: Target,
}

impl State {
    pub(super) fn checkpoint(&mut self) -> Result<Encoded> {
        self.store.flush()?;
        let c = Checkpoint {
            applied_index: self.applied_index,
            applied_term: self.applied_term,
            membership: self.membership.clone(),
            recent: self.recent.clone(),
            epoch: self.epoch,
            store: self.store.meta(),
            leases: self.lessor.records(),
            alarms: self.alarms.iter().copied().collect(),
            auth: self.auth.clone(),
            versions: self.versions,
        };
        Ok(Encoded {
            bytes: checkpoint::encode(&c)?,
            order: c.order(),
            applied: c.applied_index,
            target: Target {
                epoch: c.epoch,
                compacted: c.store.compacted,
                layout: c.store.layout,
            },
        })
    }
}

/// How checkpoints are written.
pub(super) struct Checkpointing {
    /// The order ([`Checkpoint::order`]) of the newest checkpoint written. Held while one is
    /// written, so two never write the same temporary file at once, and an older one never
    /// replaces a newer one (the log it needs may be released already, its data files
    /// deleted).
    pub(super) newest: Mutex<(u64, u64)>,
    /// Log entries kept before a checkpoint (`Config::snapshot_catch_up_entries`).
    pub(super) catch_up: u64,
    /// How long writing each checkpoint took, in microseconds.
    pub(super) latency_us: Mutex<cairn_wal::Distribution>,
    /// `Config::saved_index_bytes`.
    pub(super) saved_index_bytes: u64,
}

/// Syncs the data files a checkpoint names, writes it, and releases the log it covers.
pub(super) fn write_and_release(dir: &Path, c: &Encoded, wal: &Wal, checkpointing: &Checkpointing) -> Result<()> {
    let mut newest = checkpointing.newest.lock();
    if c.order < *newest {
        return Ok(());
    }
    let started = std::time::Instant::now();
    FileMaker::sync_files(&dir.join(DATA_DIR), &c.target.layout)?;
    checkpoint::write_bytes(dir, &c.bytes)?;
    *newest = c.order;
    checkpointing.latency_us.lock().record_duration(started.elapsed());
    // The last entries before the checkpoint stay, for followers that are behind.
    wal.release_before(LogIndex(
        c.applied.saturating_add(1).saturating_sub(checkpointing.catch_up),
    ))?;
    Ok(())
}

/// Brings the saved key index up to a checkpoint just written, when `when` says it is due
/// (see `mvcc::saved_index`; `u64::MAX` bytes never is). A failure is logged, not returned:
/// the index is a cache, and opening scans what it does not cover.
pub(super) fn refresh_saved_index(dir: &Path, c: &Encoded, when: When) {
    let started = std::time::Instant::now();
    match saved_index::refresh(dir, &c.target, when) {
        Ok(true) => tracing::debug!(elapsed = ?started.elapsed(), "saved the key index"),
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "cannot save the key index; opening will scan more records"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(applied: u64) -> Encoded {
        let mut c = State::empty(applied).checkpoint().unwrap();
        c.target.layout.clear();
        c
    }

    #[test]
    fn an_older_checkpoint_never_replaces_a_newer_one() {
        // The log before the newer one may be released already: going back would lose it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(DATA_DIR)).unwrap();
        let wal = Wal::open(dir.path().join("wal"), cairn_wal::Config::default())
            .unwrap()
            .finish()
            .unwrap();
        let checkpointing = Checkpointing {
            newest: Mutex::new((0, 0)),
            catch_up: 5000,
            latency_us: Mutex::new(cairn_wal::Distribution::default()),
            saved_index_bytes: u64::MAX,
        };
        write_and_release(dir.path(), &at(10), &wal, &checkpointing).unwrap();
        write_and_release(dir.path(), &at(5), &wal, &checkpointing).unwrap();
        assert_eq!(checkpoint::read(dir.path()).unwrap().unwrap().applied_index, 10);
        write_and_release(dir.path(), &at(12), &wal, &checkpointing).unwrap();
        assert_eq!(checkpoint::read(dir.path()).unwrap().unwrap().applied_index, 12);
    }
}
