//! The apply thread: committed entries applied to the state in log order, their waiters
//! answered, each new revision's events handed to the watch hub, compaction swept in bounded
//! steps between batches, and periodic checkpoints encoded (and written by a checkpointer
//! thread beside it); and a snapshot from the leader installed in place of the state. On a
//! group's sole member, the node thread applies a small batch itself when the apply thread is
//! idle ([`Handoff`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_wal::Wal;
use crossbeam_channel::{bounded, unbounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use raft::eraftpb::EntryType;

use super::checkpointing::{write_and_release, Checkpointing, Encoded};
use super::propose::{Answer, Waiters};
use super::watch::Fed;
use super::State;
use crate::auth::{AuthChange, AuthError};
use crate::consensus::log::RaftLog;
use crate::consensus::node::{ApplyQueue, Input, Status, ToApply};
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
    /// Async readers waiting for an index, with their deadlines: answered (in any order)
    /// once it is applied, or [`Error::Timeout`] once past the deadline
    /// ([`AppliedIndex::expire`]).
    waiting: Vec<(u64, Instant, oneshot::Sender<Result<()>>)>,
}

impl AppliedIndex {
    pub(super) fn set(&self, index: u64) {
        let mut st = self.state.lock();
        st.index = index;
        for (_, _, reader) in st.waiting.extract_if(.., |(at, _, _)| *at <= index) {
            let _ = reader.send(Ok(()));
        }
        drop(st);
        self.changed.notify_all();
    }

    /// The last applied index.
    pub(super) fn get(&self) -> u64 {
        self.state.lock().index
    }

    /// Waits until `index` is applied; false on timeout.
    pub(super) fn wait(&self, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        while st.index < index {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return st.index >= index;
            }
        }
        true
    }

    /// None if `index` is applied already; otherwise a receiver answered once it is, with
    /// [`Error::Timeout`] if that is not before `deadline` (or failing if the engine goes
    /// away first).
    pub(super) fn reached(&self, index: u64, deadline: Instant) -> Option<oneshot::Receiver<Result<()>>> {
        let mut st = self.state.lock();
        if st.index >= index {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        st.waiting.push((index, deadline, tx));
        Some(rx)
    }

    /// Answers [`Error::Timeout`] to the async readers past their deadline.
    fn expire(&self, now: Instant) {
        let mut st = self.state.lock();
        for (_, _, reader) in st.waiting.extract_if(.., |(_, deadline, _)| *deadline <= now) {
            let _ = reader.send(Err(Error::Timeout));
        }
    }
}

/// Applies one request; its errors are the request's answer, not the engine's. Everything that
/// depends on configuration was decided when it was proposed, so replay reaches the same state
/// whatever the configuration is now.
fn apply(state: &mut State, request: &Request, index: u64) -> Answer {
    let State {
        store,
        lessor,
        alarms,
        membership,
        auth,
        tokens,
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
        Request::Auth(change) => {
            auth.apply(change)?;
            match change {
                AuthChange::UserDelete { name } | AuthChange::UserChangePassword { name, .. } => {
                    tokens.get_mut().invalidate_user(name);
                }
                AuthChange::Disable => tokens.get_mut().clear(),
                _ => {}
            }
            Ok((Response::Auth, store.current_revision()))
        }
        Request::Authenticate {
            name,
            prefix,
            checked_revision,
        } => {
            auth.password_hash(name)?;
            if auth.revision() != *checked_revision {
                return Err(AuthError::OldRevision.into());
            }
            let token = format!("{prefix}.{index}");
            tokens.get_mut().register(token.clone(), name.clone());
            Ok((Response::Authenticated { token }, store.current_revision()))
        }
        Request::Guarded { auth_revision, request } => {
            if auth.enabled() && *auth_revision < auth.revision() {
                return Err(AuthError::OldRevision.into());
            }
            apply(state, request, index)
        }
    }
}

/// What applying needs from the engine, besides the queue and the compaction sweep's settings.
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
    pub(super) checkpointing: Arc<Checkpointing>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) applied: Arc<AppliedIndex>,
    /// To tell the node thread what was applied and what a checkpoint covers.
    pub(super) node: Sender<Input>,
    /// Where a leader's restarted lease clocks are recorded, and whether this member is a
    /// learner.
    pub(super) status: Arc<Status>,
    /// This member's ID.
    pub(super) member_id: u64,
    /// Where the applied index is published, for snapshots sent to followers.
    pub(super) log: RaftLog,
    /// Held while a snapshot from the leader is installed (no defragmentation meanwhile).
    pub(super) defragmenting: Arc<Mutex<()>>,
}

impl Applier {
    /// Publishes whether this member is a learner in the membership `st` holds.
    fn publish_learner(&self, st: &State) {
        let learner = st.membership.learners.contains(&self.member_id);
        self.status.learner.store(learner, Ordering::Relaxed);
    }
}

/// Signalled (under its mutex) when a compaction's sweep finishes.
pub(super) type Swept = (Mutex<()>, parking_lot::Condvar);

/// Swaps a snapshot's staged state in for the live one; returns the checkpoint to write before
/// anything else, and the old data files, to delete after it. Watchers catch up from the new
/// state (or learn that their revisions were compacted). Call with `defragmenting` held.
fn install(state: &RwLock<State>, hub: &Mutex<WatchHub>, staged: Staged) -> Result<(Encoded, Vec<PathBuf>)> {
    let mut st = state.write();
    if staged.index() <= st.applied_index {
        return Err(Error::internal(format!(
            "a snapshot at {} cannot replace the state at {}",
            staged.index(),
            st.applied_index
        )));
    }
    let Some((mut store, mut lessor, meta)) = staged.take() else {
        return Err(Error::internal("a staged snapshot was installed twice"));
    };
    // Snapshots of the old state still running unpin the new one when they stop.
    store.pinned = st.store.pinned;
    let old = std::mem::replace(&mut st.store, store);
    lessor.restart_clocks();
    st.lessor = lessor;
    st.alarms = meta.alarms.into_iter().collect();
    st.auth = meta.auth;
    // Tokens name users of the old auth store; clients authenticate again.
    st.tokens.get_mut().clear();
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

/// The node thread's way to the apply thread ([`ApplyQueue`]). Work is applied in the order it
/// is handed over. On a group's sole member, a small batch of entries that finds the node
/// thread with no other input and the apply thread with nothing queued and nothing in hand is
/// applied on the node thread itself: one thread hand-off fewer per write when writes come one
/// or a few at a time (the serial put's path). Under load, in a group of several (where a node
/// thread held up by an apply would delay heartbeats), for a batch that would encode a
/// checkpoint (which flushes the data files), and for everything else, the apply thread
/// applies and the node thread goes on with the next Ready.
pub(super) struct Handoff {
    tx: Sender<ToApply>,
    shared: Arc<Shared>,
}

/// What the apply thread shares with the node thread's [`Handoff`].
pub(super) struct Shared {
    /// Handed to the apply thread and not yet applied. Only the node thread adds to it, so
    /// when it reads 0 everything handed over before is applied.
    queued: AtomicUsize,
    /// How to apply: the apply thread's, lent to the node thread for a small batch. None
    /// until the apply thread starts, and after it stops.
    applying: Mutex<Option<Applying>>,
    state: Arc<RwLock<State>>,
}

/// Batches of at most this many entries, and this many bytes, may be applied on the node
/// thread.
const HERE_ENTRIES: usize = 8;
const HERE_BYTES: usize = 64 << 10;
/// How often the apply thread answers proposals past their deadline ([`Waiters::expire`]).
const WAITER_SWEEP: Duration = Duration::from_millis(100);

impl Handoff {
    /// A handoff to an apply thread not started yet; `apply_loop` takes the receiver and the
    /// shared part.
    pub(super) fn new(state: Arc<RwLock<State>>) -> (Handoff, Receiver<ToApply>, Arc<Shared>) {
        let (tx, rx) = unbounded();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            applying: Mutex::new(None),
            state,
        });
        let handoff = Handoff {
            tx,
            shared: shared.clone(),
        };
        (handoff, rx, shared)
    }

    fn queue(&self, work: ToApply) -> Result<()> {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(work).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            Error::Closed
        })
    }

    /// Applies `batch` here if the apply thread has nothing queued, is not applying, and the
    /// state lock is free at once (a long read holding it must not stall the node thread:
    /// ticks and heartbeats wait on it); gives the batch back otherwise.
    fn apply_here(&self, batch: Entries) -> Option<Entries> {
        let bytes: usize = batch.iter().map(|(e, _)| e.data.len()).sum();
        if batch.len() > HERE_ENTRIES || bytes > HERE_BYTES || self.shared.queued.load(Ordering::Acquire) != 0 {
            return Some(batch);
        }
        let Some(mut lent) = self.shared.applying.try_lock() else {
            return Some(batch);
        };
        let Some(applying) = lent.as_mut() else {
            return Some(batch);
        };
        if applying.checkpoint_due(batch.len()) {
            // Encoding one flushes the data files: never on the node thread.
            return Some(batch);
        }
        let Some(st) = self.shared.state.try_write() else {
            return Some(batch);
        };
        if applying.entries(st, batch) {
            // The batch began a compaction: the apply thread sweeps it, between batches.
            if self.queue(ToApply::Sweep).is_err() {
                tracing::warn!("no apply thread to sweep a compaction");
            }
        }
        None
    }
}

impl ApplyQueue for Handoff {
    fn send(&self, work: ToApply) -> Result<()> {
        self.queue(work)
    }

    fn send_or_apply(&self, work: ToApply) -> Result<()> {
        match work {
            ToApply::Entries(batch) => match self.apply_here(batch) {
                None => Ok(()),
                Some(batch) => self.queue(ToApply::Entries(batch)),
            },
            work => self.queue(work),
        }
    }
}

type Entries = Vec<(raft::eraftpb::Entry, Option<crate::consensus::ConfApplied>)>;

/// How work is applied, on the apply thread or lent to the node thread: the state it applies
/// to and everything it answers and feeds.
pub(super) struct Applying {
    with: Applier,
    everything: KeyRange,
    /// Entries applied since the last checkpoint was encoded.
    since_checkpoint: u64,
    /// Set while the checkpointer thread writes one: the next waits for more entries.
    writing: Arc<AtomicBool>,
    /// To the checkpointer thread; None if it could not start.
    to_write: Option<Sender<Encoded>>,
}

impl Applying {
    /// Whether applying `entries` more would encode a checkpoint.
    fn checkpoint_due(&self, entries: usize) -> bool {
        self.with.checkpoint_entries > 0 && self.since_checkpoint + entries as u64 >= self.with.checkpoint_entries
    }

    /// Applies anything but entries.
    fn other(&mut self, work: ToApply) {
        match work {
            ToApply::Entries(batch) => {
                let state = self.with.state.clone();
                // A compaction it begins is swept by the apply loop, which is the caller.
                self.entries(state.write(), batch);
            }
            ToApply::Sweep => {}
            ToApply::Dropped { id, error } => {
                self.with.status.proposals_failed.fetch_add(1, Ordering::Relaxed);
                self.with.waiters.answer([(id, Err(error))]);
            }
            ToApply::BecameLeader { term } => {
                // A new leader extends what the old one granted; it never expires early.
                self.with.state.write().lessor.restart_clocks();
                self.with.status.leases_term.store(term, Ordering::Release);
            }
            ToApply::Install { staged, reply } => {
                let installed = {
                    let _one = self.with.defragmenting.lock();
                    install(&self.with.state, &self.with.hub, staged)
                };
                let outcome = installed.and_then(|(encoded, old_files)| {
                    let index = encoded.applied;
                    write_and_release(&self.with.dir, &encoded, &self.with.wal, &self.with.checkpointing)?;
                    for path in old_files {
                        if let Err(e) = crate::backend::delete_gradually(&path, false) {
                            tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
                        }
                    }
                    Ok(index)
                });
                if let Ok(index) = outcome {
                    let st = self.with.state.read();
                    self.with.publish_learner(&st);
                    self.with
                        .log
                        .publish_applied(index, st.applied_term, st.membership.to_conf_state());
                    drop(st);
                    self.with.applied.set(index);
                    let _ = self.with.node.send(Input::Applied(index));
                    self.since_checkpoint = 0;
                }
                let _ = reply.send(outcome.map(|_| ()));
            }
        }
    }

    /// Applies committed entries under the state lock `st`, then answers their waiters and
    /// tells the node thread; returns whether a compaction is left to sweep.
    fn entries(&mut self, mut st: RwLockWriteGuard<'_, State>, batch: Entries) -> bool {
        let mut answers = Vec::new();
        let mut encoded = None;
        for (entry, conf) in batch {
            if entry.index <= st.applied_index {
                // In the state already: a snapshot from the leader was newer than its
                // metadata said. A waiter for it times out, as for any outcome not known.
                continue;
            }
            if let Some(change) = conf {
                st.membership.apply(&change);
                self.with.publish_learner(&st);
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
                let outcome = match crate::format::entry::decode(&entry.data) {
                    Ok(request) => apply(&mut st, &request, entry.index),
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
            if after > before && self.with.watchers.load(Ordering::Relaxed) > 0 {
                // Queued under the state lock, so in revision order, and a watcher created
                // after this revision skips it. Never waits: a full queue drops the revision,
                // and the watchers due it catch up from history (see `WatchHub::notify`).
                match st.store.events(after, after, &self.everything, 0, true) {
                    Ok(events) => {
                        let _ = self.with.feed.try_send((after, events));
                    }
                    Err(e) => tracing::error!(error = %e, revision = after, "cannot build watch events"),
                }
            }
            self.since_checkpoint += 1;
            let due = self.with.checkpoint_entries > 0 && self.since_checkpoint >= self.with.checkpoint_entries;
            if due && encoded.is_none() && self.to_write.is_some() && !self.writing.load(Ordering::Acquire) {
                self.since_checkpoint = 0;
                // A small record: the layout and the leases.
                match st.checkpoint() {
                    Ok(e) => encoded = Some(e),
                    Err(e) => tracing::error!(error = %e, "cannot encode a checkpoint"),
                }
            }
        }
        let index = st.applied_index;
        // Unfinished, not only pending: a compaction paused by a snapshot still needs the apply
        // loop, which looks again now and then.
        let compacting = st.store.compaction_unfinished();
        self.with
            .log
            .publish_applied(index, st.applied_term, st.membership.to_conf_state());
        drop(st);
        self.with.applied.set(index);
        let _ = self.with.node.send(Input::Applied(index));
        self.with.waiters.answer(answers);
        if let (Some(e), Some(tx)) = (encoded, self.to_write.as_ref()) {
            let index = e.applied;
            self.writing.store(true, Ordering::Release);
            if tx.send(e).is_err() {
                self.writing.store(false, Ordering::Release);
            }
            let _ = self.with.node.send(Input::Compact {
                index: index.saturating_sub(self.with.checkpointing.catch_up),
            });
        }
        compacting
    }
}

/// The apply thread: applies what the node thread hands over, in order, and sweeps
/// compactions between batches.
pub(super) fn apply_loop(
    rx: Receiver<ToApply>,
    shared: Arc<Shared>,
    with: Applier,
    compaction_batch: usize,
    swept: Arc<Swept>,
) {
    let state = with.state.clone();
    let (waiters, applied) = (with.waiters.clone(), with.applied.clone());
    // The state is encoded under the lock; writing and fsyncing the file happen on the
    // checkpointer thread while requests go on being applied. One at a time: while one is
    // being written, the next waits for more entries.
    let writing = Arc::new(AtomicBool::new(false));
    let (to_write, written) = bounded::<Encoded>(1);
    let checkpointer = {
        let (dir, wal, checkpointing, writing) = (
            with.dir.clone(),
            with.wal.clone(),
            with.checkpointing.clone(),
            writing.clone(),
        );
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name("cairn-checkpoint".into())
            .spawn(move || {
                let _span = span.enter();
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
    *shared.applying.lock() = Some(Applying {
        with,
        everything: KeyRange::new(&[0], &[0]),
        since_checkpoint: 0,
        writing,
        to_write,
    });
    let mut swept_waiters = Instant::now();
    loop {
        // Proposals raft lost, and async reads waiting for an index this member does not
        // reach, are answered once past their deadline, whatever else goes on.
        if swept_waiters.elapsed() >= WAITER_SWEEP {
            applied.expire(Instant::now());
            let expired = waiters.expire(Instant::now());
            if expired > 0 {
                tracing::debug!(expired, "proposals unanswered past the request timeout: timed out");
            }
            swept_waiters = Instant::now();
        }
        // A compaction sweeps a bounded batch of keys between requests, and while idle, so no
        // write waits behind it for long.
        let (compacting, unfinished) = {
            let st = state.read();
            (st.store.compaction_pending(), st.store.compaction_unfinished())
        };
        let work = if compacting {
            if !state.write().store.compaction_step(compaction_batch) {
                let _signal = swept.0.lock();
                swept.1.notify_all();
            }
            match rx.try_recv() {
                Ok(work) => work,
                Err(TryRecvError::Empty) => continue,
                Err(TryRecvError::Disconnected) => break,
            }
        } else if unfinished {
            // Paused by a snapshot: look again now and then, requests or not.
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(work) => work,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv_timeout(WAITER_SWEEP) {
                Ok(work) => work,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
            }
        };
        if let Some(applying) = shared.applying.lock().as_mut() {
            applying.other(work);
        }
        // Only now: the node thread applies a batch itself only once nothing handed over
        // before is left.
        shared.queued.fetch_sub(1, Ordering::AcqRel);
    }
    // Let a checkpoint being written finish before the final one is taken.
    drop(shared.applying.lock().take());
    if let Some(thread) = checkpointer {
        let _ = thread.join();
    }
}
