//! etcd's Maintenance work on the engine: compaction, non-blocking defragmentation, snapshots
//! (taken in bounded memory while writes go on, restored into a new directory, inspected),
//! alarms and HashKV.

use parking_lot::RwLock;

use super::checkpointing::write_and_release;
use super::core::Core;
use super::state::State;
use crate::error::{Error, Failure, Result};
use crate::format::snapshot::SnapshotMeta;
use crate::format::snapshot::SnapshotWriter;
use crate::mvcc::store::{HashKv, HashScope};
use crate::request::{Alarm, Request};

/// What a defragmentation did: the data files' size before and after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Defragmented {
    /// Bytes the data files took when defragmentation began ([`EngineStatus::size`](crate::EngineStatus::size)).
    pub before: u64,
    /// Bytes the fresh data files take once switched to.
    pub after: u64,
}

/// Records per snapshot frame.
const SNAPSHOT_CHUNK: usize = 1024;
/// Chunks a snapshot's reader may get ahead of its writer.
const EXPORT_AHEAD: usize = 4;
/// Records a defragmentation copies, or repoints under one lock hold.
const DEFRAG_BATCH: usize = 1024;
/// The share of its time a defragmentation spends copying: after each batch it rests three
/// times as long as the batch took, so it never holds a core or the disk for long at a
/// stretch and requests keep their latency (at the cost of a defragmentation four times as
/// long as it could be; at a half share, one write in thirty still queued behind its syncs).
const DEFRAG_DUTY: f64 = 0.25;

/// Writes a snapshot of `state` to `out` (see [`Maintenance::snapshot`]).
pub(super) fn write_snapshot(state: &RwLock<State>, out: &mut dyn std::io::Write) -> Result<u64> {
    let writer = export_state(
        state,
        |meta| SnapshotWriter::new(out, &meta),
        |w, records| w.records(records),
    )?;
    writer.finish()
}

/// Keeps the compaction sweep from dropping history while a snapshot or a hash reads it a
/// chunk at a time; taken with `store.pinned += 1` under the state's lock, released however
/// the reading ends. A snapshot from the leader installed meanwhile carries the count over.
struct Pin<'a>(&'a RwLock<State>);

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        self.0.write().store.pinned -= 1;
    }
}

/// Records hashed under one hold of the state's read lock.
const HASH_CHUNK: usize = 4096;

/// The hash of the changes in history `scope` covers, read a chunk at a time so writes go on
/// meanwhile; the caller has pinned the store (`_pin`) in the lock hold that chose `scope`
/// and read `installs`.
fn hash_pinned(state: &RwLock<State>, _pin: Pin<'_>, installs: u64, scope: HashScope) -> Result<HashKv> {
    let mut hasher = crc32fast::Hasher::new();
    let mut after = None;
    loop {
        let st = state.read();
        if st.installs != installs {
            // Another state now: what was hashed so far says nothing about it.
            return Err(Error::Snapshot(Failure::new(
                "a snapshot from the leader replaced the state while it was hashed",
            )));
        }
        match st.store.hash_chunk(&mut hasher, after, scope, HASH_CHUNK)? {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    Ok(HashKv {
        hash: hasher.finalize(),
        compact_revision: scope.compacted,
        hash_revision: scope.to,
    })
}

/// Exports the state as of now: `begin` gets its meta (leases, auth, membership, revisions),
/// then `each` every record in history, in revision order, a chunk at a time read under the
/// read lock (writes go on; the compaction sweep waits until it is done). The chunks are read
/// on a thread of their own while `each` takes the ones before, so reading the store and
/// writing the snapshot use a core each.
fn export_state<W>(
    state: &RwLock<State>,
    begin: impl FnOnce(SnapshotMeta) -> Result<W>,
    mut each: impl FnMut(&mut W, &crate::mvcc::store::Chunk) -> Result<()>,
) -> Result<W> {
    let (meta, installs) = {
        let mut st = state.write();
        st.store.pinned += 1;
        let meta = SnapshotMeta {
            applied_index: st.applied_index,
            applied_term: st.applied_term,
            membership: st.membership.clone(),
            recent: st.recent.clone(),
            current: st.store.current_revision(),
            compacted: st.store.compacted_revision(),
            leases: st.lessor.records(),
            alarms: st.alarms.iter().copied().collect(),
            auth: st.auth.clone(),
            versions: st.versions,
        };
        (meta, st.installs)
    };
    let _pin = Pin(state);
    let (current, compacted) = (meta.current, meta.compacted);
    let mut writer = begin(meta)?;
    std::thread::scope(|scope| {
        let (tx, rx) = crossbeam_channel::bounded(EXPORT_AHEAD);
        let reader = crate::thread::start_scoped(scope, "cairn-snapshot-read", move || -> Result<()> {
            let mut after = None;
            loop {
                let (records, last) = {
                    let st = state.read();
                    if st.installs != installs {
                        return Err(Error::Snapshot(Failure::new(
                            "a snapshot from the leader replaced the state while this one was taken",
                        )));
                    }
                    st.store.export_chunk(after, current, compacted, SNAPSHOT_CHUNK)?
                };
                // The end, or the writer gave up (it tells why).
                if last.is_none() || tx.send(records).is_err() {
                    return Ok(());
                }
                after = last;
            }
        })?;
        // The receiver goes with this closure: a reader still sending then stops.
        let written = (move || {
            for records in rx {
                each(&mut writer, &records)?;
            }
            Ok(writer)
        })();
        let read = reader.join()?;
        // A failed read ends the chunks early: its error tells why, not the writer's.
        read.and(written)
    })
}

/// etcd's Maintenance service, without compaction ([`Engine::maintenance`](crate::Engine::maintenance)).
#[derive(Clone, Copy, Debug)]
pub struct Maintenance<'a> {
    core: &'a Core,
}

impl<'a> Maintenance<'a> {
    pub(super) fn new(core: &'a Core) -> Maintenance<'a> {
        Maintenance { core }
    }

    /// Waits until the history dropped by compactions so far is gone from the index and the
    /// revision log, not only hidden (etcd's `Compact` with `physical`); [`Maintenance::defragment`]
    /// then returns its space.
    pub fn wait_compacted(&self) -> Result<()> {
        self.core.swept.wait(|| {
            if !self.core.state.read().store.compaction_unfinished() {
                return Ok(true);
            }
            if self.core.replica.lock().is_none() {
                return Err(Error::Closed);
            }
            Ok(false)
        })
    }

    /// Writes a snapshot of the complete state (history, leases, alarms, applied index) to
    /// `out`, as of now; returns its size. Records are copied out a chunk at a time, so memory
    /// stays bounded and writes go on meanwhile (the compaction sweep waits until it is done).
    /// [`crate::offline::restore`] turns a snapshot into a data directory.
    pub fn snapshot(&self, out: &mut dyn std::io::Write) -> Result<u64> {
        write_snapshot(&self.core.state, out)
    }

    /// Writes a snapshot in etcd's own format (a bbolt database, what `etcdctl snapshot save`
    /// gets from etcd, without the SHA-256 etcd's stream appends) into `file`, which must be
    /// empty; returns it and the database's length. `etcdutl snapshot status` checks it and
    /// `etcdutl snapshot restore` makes an etcd member of it with every revision in history,
    /// the leases, users and roles. Memory stays bounded: records are written a page at a time.
    /// The file is not synced (the server streams it and drops it): sync it to keep it.
    pub fn snapshot_etcd(&self, file: std::fs::File) -> Result<(std::fs::File, u64)> {
        let export = export_state(
            &self.core.state,
            |meta| crate::etcd::export::EtcdExport::begin(file, meta),
            |e, records| e.records(records),
        )?;
        export.finish()
    }

    /// Rewrites the records still in history into fresh data files and deletes the old ones,
    /// returning the space compaction freed to the file system (etcd's `Defragment`). Reads
    /// and writes go on throughout: records are copied without the state lock, and the lock is
    /// taken only briefly, to point a batch of records at their copies and, at the end, to
    /// switch files; the copying is paced (it rests three quarters of the time) so that it
    /// never holds a core or the disk for long. Crash-safe at every step: the old files are
    /// deleted only once a checkpoint naming the new ones is durable; until then the old
    /// checkpoint still holds.
    pub fn defragment(&self) -> Result<Defragmented> {
        let _one = self.core.defragmenting.lock();
        let wal = self.core.wal()?;
        let state = &self.core.state;
        let (mut copying, before) = {
            let mut st = state.write();
            (st.store.begin_defrag(DEFRAG_BATCH)?, st.store.size())
        };
        // Each lock hold is short and handed fairly to any waiting writer: a file seals with a
        // quarter of a million records at once, and repointed back to back they held the lock
        // for tens of milliseconds.
        let rest = |started: std::time::Instant| {
            std::thread::sleep(started.elapsed().mul_f64((1.0 - DEFRAG_DUTY) / DEFRAG_DUTY));
        };
        let switched = (|| {
            loop {
                let started = std::time::Instant::now();
                if !copying.fetch(&state.read().store) {
                    break;
                }
                copying.copy()?;
                if copying.has_news() {
                    let mut st = state.write();
                    copying.install(&mut st.store);
                    parking_lot::RwLockWriteGuard::unlock_fair(st);
                }
                rest(started);
            }
            let mut repointing = copying.finish()?;
            loop {
                let started = std::time::Instant::now();
                let mut st = state.write();
                let more = repointing.install(&mut st.store);
                parking_lot::RwLockWriteGuard::unlock_fair(st);
                if !more {
                    break;
                }
                rest(started);
            }
            let mut st = state.write();
            let old = repointing.switch(&mut st.store)?;
            st.epoch += 1;
            Ok((st.checkpoint()?, old, st.store.size()))
        })();
        let (encoded, old_paths, after_size) = match switched {
            Ok(switched) => switched,
            Err(e) => {
                state.write().store.abandon_defrag();
                return Err(e);
            }
        };
        write_and_release(&self.core.dir, &encoded, &wal, &self.core.checkpointing)?;
        for path in old_paths {
            if let Err(e) = crate::backend::delete_gradually(&path, true) {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
            }
        }
        Ok(Defragmented {
            before,
            after: after_size,
        })
    }

    /// The alarms raised, each with the member it was raised for (etcd's `Alarm` list),
    /// in member order.
    pub fn alarms(&self) -> Vec<(u64, Alarm)> {
        self.core.state.read().alarms.iter().copied().collect()
    }

    /// Raises `alarm` for `member` (etcd's `Alarm` ACTIVATE; 0 is stored as 0, as etcd
    /// stores it); returns once applied here.
    pub fn alarm_activate(&self, member: u64, alarm: Alarm) -> Result<()> {
        let request = Request::Alarm {
            activate: true,
            member,
            alarm,
        };
        self.core.propose(request).map(|_| ())
    }

    /// Disarms `member`'s `alarm` (etcd's `Alarm` DEACTIVATE), durably.
    pub fn alarm_disarm(&self, member: u64, alarm: Alarm) -> Result<()> {
        let request = Request::Alarm {
            activate: false,
            member,
            alarm,
        };
        self.core.propose(request).map(|_| ())
    }

    /// etcd's `HashKV`: a hash of the history kept up to `revision` (0 for the current one),
    /// equal on members that applied the same log, and across restarts. Read a chunk at a time
    /// while writes go on (the compaction sweep waits until it is done).
    pub fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        let state = &self.core.state;
        let (to, compacted, installs) = {
            let mut st = state.write();
            let to = st.store.hash_revision(revision)?;
            st.store.pinned += 1;
            (to, st.store.compacted_revision(), st.installs)
        };
        hash_pinned(state, Pin(state), installs, HashScope { to, compacted })
    }

    /// The hash of the keys and values as of the latest compaction (`hash_revision` and
    /// `compact_revision` are its revision): what a member keeps of each compaction for the
    /// compaction hash check, which compares it with the other members' at the same revision.
    /// It can be taken any time until the next compaction, whose history it does not cover.
    /// `None` if history was never compacted.
    pub fn compaction_hash(&self) -> Result<Option<HashKv>> {
        let state = &self.core.state;
        let (compacted, installs) = {
            let mut st = state.write();
            let compacted = st.store.compacted_revision();
            if compacted == 0 {
                return Ok(None);
            }
            st.store.pinned += 1;
            (compacted, st.installs)
        };
        let scope = HashScope {
            to: compacted,
            compacted,
        };
        hash_pinned(state, Pin(state), installs, scope).map(Some)
    }

    /// Writes a checkpoint now and releases the log before it (also done every
    /// `Config::checkpoint_entries` entries and on close).
    pub fn checkpoint(&self) -> Result<()> {
        let wal = self.core.wal()?;
        let encoded = self.core.state.write().checkpoint()?;
        write_and_release(&self.core.dir, &encoded, &wal, &self.core.checkpointing)
    }

    /// Sends progress notifications now, as the periodic tick
    /// (`Config::watch_progress_interval`) does: every synced watcher that asked for them and
    /// was sent nothing since the last tick gets [`crate::WatchResponse::Progress`].
    pub fn notify_progress(&self) {
        let st = self.core.state.read();
        self.core.hub.lock().progress(st.store.current_revision());
    }
}
