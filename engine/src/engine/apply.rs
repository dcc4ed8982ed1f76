//! The apply thread: committed entries applied to the state in log order, their waiters
//! answered, each new revision's events handed to the watch hub, compaction swept in bounded
//! steps between batches, and periodic checkpoints encoded (and written by a checkpointer
//! thread beside it); and a snapshot from the leader installed in place of the state.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use cairn_wal::Wal;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock};
use raft::eraftpb::EntryType;

use super::checkpointing::{write_and_release, Checkpointing, Encoded};
use super::propose::{Answer, Waiters};
use super::watch::Fed;
use super::State;
use crate::consensus::log::RaftLog;
use crate::consensus::node::{Input, Status, ToApply};
use crate::consensus::transfer::Staged;
use crate::error::{Error, Result};
use crate::mvcc::index::KeyRange;
use crate::request::{Alarm, Request, Response};
use crate::watch::hub::WatchHub;

/// The last applied log index, for reads to wait on: blocking ([`AppliedIndex::wait`]) or
/// async ([`AppliedIndex::reached`]).
#[derive(Default)]
pub(super) struct AppliedIndex {
    state: Mutex<Applied>,
    changed: parking_lot::Condvar,
}

#[derive(Default)]
struct Applied {
    index: u64,
    /// Async readers waiting for an index: answered (in any order) once it is applied.
    waiting: Vec<(u64, oneshot::Sender<()>)>,
}

impl AppliedIndex {
    pub(super) fn set(&self, index: u64) {
        let mut st = self.state.lock();
        st.index = index;
        for (_, reader) in st.waiting.extract_if(.., |(at, _)| *at <= index) {
            let _ = reader.send(());
        }
        drop(st);
        self.changed.notify_all();
    }

    /// The last applied index.
    pub(super) fn get(&self) -> u64 {
        self.state.lock().index
    }

    /// Waits until `index` is applied; false on timeout.
    pub(super) fn wait(&self, index: u64, timeout: std::time::Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.state.lock();
        while st.index < index {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return st.index >= index;
            }
        }
        true
    }

    /// None if `index` is applied already; otherwise a receiver answered once it is (or
    /// failing if the engine goes away first).
    pub(super) fn reached(&self, index: u64) -> Option<oneshot::Receiver<()>> {
        let mut st = self.state.lock();
        if st.index >= index {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        st.waiting.push((index, tx));
        Some(rx)
    }
}

/// Applies one request; its errors are the request's answer, not the engine's. Everything that
/// depends on configuration was decided when it was proposed, so replay reaches the same state
/// whatever the configuration is now.
fn apply(state: &mut State, request: &Request) -> Answer {
    let State {
        store,
        lessor,
        alarms,
        membership,
        ..
    } = state;
    if alarms.contains(&Alarm::NoSpace) {
        // etcd's capped applier: what adds data fails; reads, deletes, compaction and leases'
        // revokes go on, so space can be reclaimed.
        let adds = match request {
            Request::Put(_) | Request::LeaseGrant { .. } => true,
            Request::Txn(t) => !t.is_read_only(),
            _ => false,
        };
        if adds {
            return Err(Error::NoSpace);
        }
    }
    match request {
        Request::Put(p) => {
            let (r, rev, changes) = p.apply_checked(store, &|id| lessor.exists(id))?;
            lessor.apply_changes(&changes);
            Ok((Response::Put(r), rev))
        }
        Request::DeleteRange(d) => {
            let (r, rev, changes) = d.apply_checked(store)?;
            lessor.apply_changes(&changes);
            Ok((Response::DeleteRange(r), rev))
        }
        Request::Txn(t) => {
            let (r, rev, changes) = t.apply_checked(store, &|id| lessor.exists(id))?;
            lessor.apply_changes(&changes);
            Ok((Response::Txn(r), rev))
        }
        Request::Compact { revision } => {
            // Logical now; the apply thread drops the history in bounded batches.
            store.begin_compaction(*revision)?;
            Ok((Response::Compact, store.current_revision()))
        }
        Request::LeaseGrant { id, ttl } => {
            let ttl = lessor.grant(*id, *ttl)?;
            Ok((Response::LeaseGrant { id: *id, ttl }, store.current_revision()))
        }
        Request::LeaseRevoke { id } => {
            // Every attached key goes in one revision.
            let keys = lessor.keys(*id)?;
            let mut w = store.write();
            for key in &keys {
                w.delete_range(key, &[])?;
            }
            let (rev, _) = w.finish();
            lessor.revoke(*id)?;
            Ok((Response::LeaseRevoke, rev))
        }
        Request::LeaseCheckpoint { remaining } => {
            for (id, ttl) in remaining {
                lessor.checkpoint(*id, *ttl);
            }
            Ok((Response::LeaseCheckpoint, store.current_revision()))
        }
        Request::MemberUpdate { id, peer_urls } => {
            if !membership.contains(*id) {
                return Err(Error::MemberNotFound);
            }
            membership.attributes.entry(*id).or_default().peer_urls = peer_urls.clone();
            Ok((Response::Member, store.current_revision()))
        }
        Request::MemberPublish { id, name, client_urls } => {
            if !membership.contains(*id) {
                return Err(Error::MemberNotFound);
            }
            let attributes = membership.attributes.entry(*id).or_default();
            attributes.name = name.clone();
            attributes.client_urls = client_urls.clone();
            Ok((Response::Member, store.current_revision()))
        }
        Request::Alarm { activate, alarm } => {
            if *activate {
                alarms.insert(*alarm);
            } else {
                alarms.remove(alarm);
            }
            Ok((Response::Alarm, store.current_revision()))
        }
    }
}

/// What the apply thread needs besides its queue.
pub(super) struct Applier {
    pub(super) state: Arc<RwLock<State>>,
    pub(super) hub: Arc<Mutex<WatchHub>>,
    /// Where each new revision's events go, for the watch thread to hand out.
    pub(super) feed: Sender<Fed>,
    /// How many watchers there are (no events are built for none).
    pub(super) watchers: Arc<AtomicUsize>,
    pub(super) wal: Arc<Wal>,
    pub(super) dir: PathBuf,
    pub(super) checkpoint_entries: u64,
    pub(super) compaction_batch: usize,
    pub(super) checkpointing: Arc<Checkpointing>,
    pub(super) swept: Arc<Swept>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) applied: Arc<AppliedIndex>,
    /// To tell the node thread what was applied and what a checkpoint covers.
    pub(super) node: Sender<Input>,
    /// Where a leader's restarted lease clocks are recorded.
    pub(super) status: Arc<Status>,
    /// Where the applied index is published, for snapshots sent to followers.
    pub(super) log: RaftLog,
    /// Held while a snapshot from the leader is installed (no defragmentation meanwhile).
    pub(super) defragmenting: Arc<Mutex<()>>,
}

/// Signalled (under its mutex) when a compaction's sweep finishes.
pub(super) type Swept = (Mutex<()>, parking_lot::Condvar);

/// Swaps a snapshot's staged state in for the live one; returns the checkpoint to write before
/// anything else, and the old data files, to delete after it. Watchers catch up from the new
/// state (or learn that their revisions were compacted). Call with `defragmenting` held.
fn install(state: &RwLock<State>, hub: &Mutex<WatchHub>, staged: Staged) -> Result<(Encoded, Vec<PathBuf>)> {
    let mut st = state.write();
    if staged.index() <= st.applied_index {
        return Err(Error::Internal(format!(
            "a snapshot at {} cannot replace the state at {}",
            staged.index(),
            st.applied_index
        )));
    }
    let Some((mut store, mut lessor, meta)) = staged.take() else {
        return Err(Error::Internal("a staged snapshot was installed twice".into()));
    };
    // Snapshots of the old state still running unpin the new one when they stop.
    store.pinned = st.store.pinned;
    let old = std::mem::replace(&mut st.store, store);
    lessor.restart_clocks();
    st.lessor = lessor;
    st.alarms = meta.alarms.into_iter().collect();
    st.applied_index = meta.applied_index;
    st.applied_term = meta.applied_term;
    st.membership = meta.membership;
    st.recent = meta.recent;
    st.epoch += 1;
    st.installs += 1;
    hub.lock().unsync_all();
    let encoded = st.checkpoint()?;
    Ok((encoded, old.file_paths()))
}

pub(super) fn apply_loop(rx: Receiver<ToApply>, a: Applier) {
    let Applier {
        state,
        hub,
        feed,
        watchers,
        wal,
        dir,
        checkpoint_entries,
        compaction_batch,
        checkpointing,
        swept,
        waiters,
        applied,
        node,
        status,
        log,
        defragmenting,
    } = a;
    let everything = KeyRange::new(&[0], &[0]);
    let mut since_checkpoint = 0u64;
    // The state is encoded here, under the lock; writing and fsyncing the file happen on the
    // checkpointer thread while requests go on being applied. One at a time: while one is
    // being written, the next waits for more entries.
    let writing = Arc::new(AtomicBool::new(false));
    let (to_write, written) = bounded::<Encoded>(1);
    let checkpointer = {
        let (dir, wal, checkpointing, writing) = (dir.clone(), wal.clone(), checkpointing.clone(), writing.clone());
        std::thread::Builder::new()
            .name("cairn-checkpoint".into())
            .spawn(move || {
                for encoded in written {
                    if let Err(e) = write_and_release(&dir, &encoded, &wal, &checkpointing) {
                        tracing::error!(error = %e, "checkpoint failed; the log keeps growing");
                    }
                    writing.store(false, Ordering::Release);
                }
            })
    };
    let (to_write, checkpointer) = match checkpointer {
        Ok(thread) => (Some(to_write), Some(thread)),
        Err(e) => {
            tracing::error!(error = %e, "no checkpoint thread; checkpoints only on close");
            (None, None)
        }
    };
    loop {
        // A compaction sweeps a bounded batch of keys between requests, and while idle, so no
        // write waits behind it for long.
        let (compacting, unfinished) = {
            let st = state.read();
            (st.store.compaction_pending(), st.store.compaction_unfinished())
        };
        let p = if compacting {
            if !state.write().store.compaction_step(compaction_batch) {
                let _signal = swept.0.lock();
                swept.1.notify_all();
            }
            match rx.try_recv() {
                Ok(p) => p,
                Err(TryRecvError::Empty) => continue,
                Err(TryRecvError::Disconnected) => break,
            }
        } else if unfinished {
            // Paused by a snapshot: look again now and then, requests or not.
            match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                Ok(p) => p,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(p) => p,
                Err(_) => break,
            }
        };
        let batch = match p {
            ToApply::Entries(batch) => batch,
            ToApply::Dropped { id, error } => {
                status.proposals_failed.fetch_add(1, Ordering::Relaxed);
                if let Some(w) = waiters.lock().remove(&id) {
                    let _ = w.send(Err(error));
                }
                continue;
            }
            ToApply::BecameLeader { term } => {
                // A new leader extends what the old one granted; it never expires early.
                state.write().lessor.restart_clocks();
                status.leases_term.store(term, Ordering::Release);
                continue;
            }
            ToApply::Install { staged, reply } => {
                let installed = {
                    let _one = defragmenting.lock();
                    install(&state, &hub, staged)
                };
                let outcome = installed.and_then(|(encoded, old_files)| {
                    let index = encoded.applied;
                    write_and_release(&dir, &encoded, &wal, &checkpointing)?;
                    for path in old_files {
                        if let Err(e) = crate::backend::delete_gradually(&path, false) {
                            tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
                        }
                    }
                    Ok(index)
                });
                if let Ok(index) = outcome {
                    let st = state.read();
                    log.publish_applied(index, st.applied_term, st.membership.to_conf_state());
                    drop(st);
                    applied.set(index);
                    let _ = node.send(Input::Applied(index));
                    since_checkpoint = 0;
                }
                let _ = reply.send(outcome.map(|_| ()));
                continue;
            }
        };
        let mut answers = Vec::new();
        let mut encoded = None;
        let mut st = state.write();
        for (entry, conf) in batch {
            if entry.index <= st.applied_index {
                // In the state already: a snapshot from the leader was newer than its
                // metadata said. A waiter for it times out, as for any outcome not known.
                continue;
            }
            if let Some(change) = conf {
                st.membership.apply(&change);
                if let Some(id) = entry.context.as_ref().try_into().ok().map(u64::from_le_bytes) {
                    answers.push((id, Ok((Response::ConfChange, st.store.current_revision()))));
                }
            }
            let before = st.store.current_revision();
            let id = entry.context.as_ref().try_into().ok().map(u64::from_le_bytes);
            let duplicate = id.is_some_and(|id| !st.recent.first_time(id));
            if duplicate {
                tracing::debug!(index = entry.index, "skipping a request applied already");
            }
            if entry.get_entry_type() == EntryType::EntryNormal && !entry.data.is_empty() && !duplicate {
                let outcome = match Request::decode(&entry.data) {
                    Ok(request) => apply(&mut st, &request),
                    Err(e) => {
                        tracing::error!(index = entry.index, error = %e, "a committed entry does not decode");
                        Err(Error::CorruptEntry {
                            index: entry.index,
                            reason: e.to_string(),
                        })
                    }
                };
                if let Some(id) = id {
                    answers.push((id, outcome));
                }
            }
            st.applied_index = entry.index;
            st.applied_term = entry.term;
            let after = st.store.current_revision();
            if after > before && watchers.load(Ordering::Relaxed) > 0 {
                // Queued under the state lock, so in revision order, and a watcher created
                // after this revision skips it. Never waits: a full queue drops the revision,
                // and the watchers due it catch up from history (see `WatchHub::notify`).
                match st.store.events(after, after, &everything, 0, true) {
                    Ok(events) => {
                        let _ = feed.try_send((after, events));
                    }
                    Err(e) => tracing::error!(error = %e, revision = after, "cannot build watch events"),
                }
            }
            since_checkpoint += 1;
            let due = checkpoint_entries > 0 && since_checkpoint >= checkpoint_entries;
            if due && encoded.is_none() && to_write.is_some() && !writing.load(Ordering::Acquire) {
                since_checkpoint = 0;
                // A small record: the layout and the leases.
                match st.checkpoint() {
                    Ok(e) => encoded = Some(e),
                    Err(e) => tracing::error!(error = %e, "cannot encode a checkpoint"),
                }
            }
        }
        let index = st.applied_index;
        log.publish_applied(index, st.applied_term, st.membership.to_conf_state());
        drop(st);
        applied.set(index);
        let _ = node.send(Input::Applied(index));
        {
            let mut waiting = waiters.lock();
            for (id, outcome) in answers {
                if let Some(w) = waiting.remove(&id) {
                    let _ = w.send(outcome);
                }
            }
        }
        if let (Some(e), Some(tx)) = (encoded, to_write.as_ref()) {
            let index = e.applied;
            writing.store(true, Ordering::Release);
            if tx.send(e).is_err() {
                writing.store(false, Ordering::Release);
            }
            let _ = node.send(Input::Compact {
                index: index.saturating_sub(checkpointing.catch_up),
            });
        }
    }
    // Let a checkpoint being written finish before the final one is taken.
    drop(to_write);
    if let Some(thread) = checkpointer {
        let _ = thread.join();
    }
}
