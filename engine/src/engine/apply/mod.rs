//! Applying committed entries, in two steps:
//!
//! 1. [`transition`]: under the state's write lock, a batch is applied as a pure transition,
//!    [`State::apply_batch`], which returns an [`Outcome`] (answers, events, a checkpoint,
//!    the applied position) and changes nothing outside the state.
//! 2. [`Publisher::publish`]: without the lock, the outcome is carried out: events to the watch
//!    thread, the applied index to readers, the log and the node thread, answers to waiters,
//!    and the checkpoint to the [`Checkpointer`] thread.
//!
//! The [`ApplyThread`] runs both for what the node thread hands over, sweeps compactions in
//! bounded steps between batches, and installs snapshots from the leader. On a group's sole
//! member, the node thread applies a small batch itself when the apply thread is idle
//! ([`Handoff`]); [`Shared`]'s lock keeps batches, and their publishing, in log order.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_wal::Wal;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

mod handoff;
mod transition;

pub(super) use handoff::{Handoff, Shared};
use transition::{Entries, Outcome, Schedule, Step};

use super::checkpointing::{write_and_release, Checkpointing, Encoded};
use super::watch::Fed;
use super::{Core, State};
use crate::consensus::interface::Staged;
use crate::consensus::interface::{Input, ToApply};
use crate::error::{Error, Result};
use crate::watch::hub::WatchHub;

/// How often the apply thread answers proposals past their deadline ([`Waiters::expire`]).
const WAITER_SWEEP: Duration = Duration::from_millis(100);

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

/// Where a batch's [`Outcome`] is published: the engine's core (readers, waiters, the watch
/// hub, the Raft log), and the channels to the watch thread, the node thread and the WAL.
pub(in crate::engine) struct Publisher {
    pub(in crate::engine) core: Arc<Core>,
    /// Where each new revision's events go, for the watch thread to hand out.
    pub(in crate::engine) feed: Sender<Fed>,
    /// How many watchers there are (no events are built for none).
    pub(in crate::engine) watchers: Arc<AtomicUsize>,
    /// The log checkpoints release.
    pub(in crate::engine) wal: Arc<Wal>,
    /// To tell the node thread what was applied and what a checkpoint covers.
    pub(in crate::engine) node: Sender<Input>,
}

impl Publisher {
    /// Where the state now stands, for everyone who waits on it: the log (for snapshots sent
    /// to followers), readers waiting for an index, and the node thread.
    fn publish_position(&self, index: u64, term: u64, conf_state: raft::eraftpb::ConfState, learner: Option<bool>) {
        let core = &self.core;
        if let Some(learner) = learner {
            core.status.learner.store(learner, Ordering::Relaxed);
        }
        core.log.publish_applied(index, term, conf_state);
        core.applied.set(index);
        let _ = self.node.send(Input::Applied(index));
    }

    /// Carries out what applying a batch did, outside the state lock: the new revisions go
    /// to the watchers (in order: publishing is serialized by [`Shared`]'s lock), the applied
    /// position is published, and the waiters are answered.
    fn publish(&self, outcome: Outcome) {
        for fed in outcome.events {
            // Never waits: a full queue drops the revision, and the watchers due it catch up
            // from history (see `WatchHub::notify`).
            let _ = self.feed.try_send(fed);
        }
        self.publish_position(
            outcome.applied_index,
            outcome.applied_term,
            outcome.conf_state,
            outcome.learner,
        );
        self.core.waiters.answer(outcome.answers);
    }
}

/// Signalled when a compaction's sweep finishes, for [`crate::Engine::wait_compacted`].
#[derive(Default)]
pub(in crate::engine) struct Swept {
    lock: Mutex<()>,
    done: parking_lot::Condvar,
}

impl Swept {
    fn notify(&self) {
        let _signal = self.lock.lock();
        self.done.notify_all();
    }

    /// Waits until `finished` says so, looking again at least every 100 ms.
    pub(in crate::engine) fn wait(&self, mut finished: impl FnMut() -> Result<bool>) -> Result<()> {
        let mut guard = self.lock.lock();
        while !finished()? {
            self.done.wait_for(&mut guard, Duration::from_millis(100));
        }
        Ok(())
    }
}

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
    let Ok(staged) = staged.into_any().downcast::<crate::engine::staged::Staged>() else {
        return Err(Error::internal("a staged state that is not a snapshot's"));
    };
    let Some((mut store, mut lessor, meta)) = staged.take() else {
        return Err(Error::internal("a staged snapshot was installed twice"));
    };
    // Snapshots of the old state still running unpin the new one when they stop.
    store.pinned = st.store.pinned;
    let old = std::mem::replace(&mut st.store, store);
    lessor.restart_clocks();
    st.lessor = lessor;
    st.alarms = meta.alarms.into_iter().collect();
    st.versions = meta.versions;
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

/// How batches are applied and published, on the apply thread or lent to the node thread
/// ([`Handoff`]): built before either starts.
pub(in crate::engine) struct Applying {
    publisher: Publisher,
    schedule: Schedule,
    /// Set while the checkpointer thread writes one: the next waits for more entries.
    writing: Arc<AtomicBool>,
    /// To the checkpointer thread, while the apply thread runs it.
    to_write: Option<Sender<Encoded>>,
    /// Entries this member could not apply yet (see `Stalled`), with every batch committed
    /// since, in order, when applying stopped, and when it was last tried: tried again every
    /// [`STALL_RETRY`].
    stalled: Option<(Entries, Instant, Instant)>,
}

/// How often applying stalled entries is tried again.
const STALL_RETRY: Duration = Duration::from_secs(1);

impl Applying {
    pub(in crate::engine) fn new(publisher: Publisher) -> Applying {
        Applying {
            schedule: Schedule {
                every: publisher.core.config.checkpoint_entries,
                since: 0,
                may_encode: false,
            },
            publisher,
            writing: Arc::new(AtomicBool::new(false)),
            to_write: None,
            stalled: None,
        }
    }

    /// Whether entries wait to be applied again.
    fn is_stalled(&self) -> bool {
        self.stalled.is_some()
    }

    /// Whether stalled entries are due to be tried again.
    fn retry_due(&self) -> bool {
        self.stalled
            .as_ref()
            .is_some_and(|(_, _, tried)| tried.elapsed() >= STALL_RETRY)
    }

    /// Tries the stalled entries again.
    fn retry_stalled(&mut self, st: RwLockWriteGuard<'_, State>) -> bool {
        match self.stalled.take() {
            Some((entries, since, _)) => {
                let compacting = self.apply_in_order(st, entries, Some(since));
                if self.stalled.is_none() {
                    tracing::info!(
                        stalled_for = ?since.elapsed(),
                        "applying committed entries again: the entry that failed is applied"
                    );
                }
                compacting
            }
            None => false,
        }
    }

    /// Whether applying `entries` more would encode a checkpoint.
    fn checkpoint_due(&self, entries: usize) -> bool {
        self.schedule.due_within(entries)
    }

    /// Applies committed entries under the state lock `st`, then publishes what they did
    /// without it; returns whether a compaction is left to sweep.
    fn entries(&mut self, st: RwLockWriteGuard<'_, State>, batch: Entries) -> bool {
        if let Some((stalled, _, _)) = self.stalled.as_mut() {
            // Behind the entry that failed: applied after it, in order.
            stalled.extend(batch);
            return false;
        }
        self.apply_in_order(st, batch, None)
    }

    /// Applies `batch`; if an entry fails because of this member (see `Stalled`), keeps it
    /// and the rest for [`Applying::retry_stalled`]. `since`: when applying first stalled.
    fn apply_in_order(&mut self, mut st: RwLockWriteGuard<'_, State>, batch: Entries, since: Option<Instant>) -> bool {
        self.schedule.may_encode = self.to_write.is_some() && !self.writing.load(Ordering::Acquire);
        let mut outcome = st.apply_batch(
            batch,
            Step {
                member_id: self.publisher.core.member_id,
                watchers: &self.publisher.watchers,
                schedule: &mut self.schedule,
            },
        );
        drop(st);
        if let Some(stalled) = outcome.stalled.take() {
            if since.is_none() {
                tracing::error!(
                    index = stalled.entries.first().map_or(0, |(e, _)| e.index),
                    error = %stalled.error,
                    "cannot apply a committed entry (a full disk?): applying stops there and is tried again every second; this member answers no write meanwhile"
                );
            }
            self.stalled = Some((stalled.entries, since.unwrap_or_else(Instant::now), Instant::now()));
        }
        let compacting = outcome.compacting;
        let checkpoint = self.publish(outcome);
        if let (Some(encoded), Some(tx)) = (checkpoint, self.to_write.as_ref()) {
            let index = encoded.applied;
            self.writing.store(true, Ordering::Release);
            if tx.send(encoded).is_err() {
                self.writing.store(false, Ordering::Release);
            }
            let _ = self.publisher.node.send(Input::Compact {
                index: index.saturating_sub(self.publisher.core.checkpointing.catch_up),
            });
        }
        compacting
    }

    /// Publishes an outcome; gives back the checkpoint it holds, to hand to the checkpointer.
    fn publish(&self, mut outcome: Outcome) -> Option<Encoded> {
        let checkpoint = outcome.checkpoint.take();
        self.publisher.publish(outcome);
        checkpoint
    }

    /// Applies anything but entries.
    fn other(&mut self, work: ToApply) {
        let core = self.publisher.core.clone();
        match work {
            ToApply::Entries(batch) => {
                let state = core.state.clone();
                // A compaction it begins is swept by the apply loop, which is the caller.
                self.entries(state.write(), batch);
            }
            ToApply::Sweep => {}
            ToApply::Dropped { id, error } => {
                core.status.proposals_failed.fetch_add(1, Ordering::Relaxed);
                core.waiters.answer([(id, Err(error))]);
            }
            ToApply::BecameLeader { term } => {
                // A new leader extends what the old one granted; it never expires early.
                core.state.write().lessor.restart_clocks();
                core.status.leases_term.store(term, Ordering::Release);
            }
            ToApply::Install { staged, reply } => {
                let installed = {
                    let _one = core.defragmenting.lock();
                    install(&core.state, &core.hub, staged)
                };
                let outcome = installed.and_then(|(encoded, old_files)| {
                    write_and_release(&core.dir, &encoded, &self.publisher.wal, &core.checkpointing)?;
                    for path in old_files {
                        if let Err(e) = crate::backend::delete_gradually(&path, false) {
                            tracing::warn!(file = %path.display(), error = %e, "cannot delete an old data file");
                        }
                    }
                    Ok(encoded.applied)
                });
                if let Ok(index) = outcome {
                    let (term, conf_state, learner) = {
                        let st = core.state.read();
                        let learner = st.membership.learners.contains(&core.member_id);
                        (st.applied_term, st.membership.to_conf_state(), learner)
                    };
                    self.publisher.publish_position(index, term, conf_state, Some(learner));
                    self.schedule.since = 0;
                }
                let _ = reply.send(outcome.map(|_| ()));
            }
        }
    }
}

/// The checkpointer thread: writes the checkpoints the apply path encodes, one at a time, while
/// requests go on being applied.
struct Checkpointer {
    dir: PathBuf,
    wal: Arc<Wal>,
    checkpointing: Arc<Checkpointing>,
    writing: Arc<AtomicBool>,
    written: Receiver<Encoded>,
}

impl Checkpointer {
    fn run(self) {
        for encoded in self.written {
            if let Err(e) = write_and_release(&self.dir, &encoded, &self.wal, &self.checkpointing) {
                tracing::error!(error = %e, "checkpoint failed; the log keeps growing");
            }
            self.writing.store(false, Ordering::Release);
        }
    }
}

/// The apply thread: applies what the node thread hands over, in order, and sweeps
/// compactions between batches.
pub(in crate::engine) struct ApplyThread {
    pub(in crate::engine) rx: Receiver<ToApply>,
    pub(in crate::engine) shared: Arc<Shared>,
}

impl ApplyThread {
    /// Runs until the node thread's end of the queue is gone; an error if the checkpointer
    /// thread panicked.
    pub(in crate::engine) fn run(self) -> Result<()> {
        let ApplyThread { rx, shared } = self;
        let checkpointer = start_checkpointer(&shared);
        let core = shared.applying.lock().publisher.core.clone();
        let (state, waiters, applied, swept) = (&core.state, &core.waiters, &core.applied, &core.swept);
        let compaction_batch = core.config.compaction_batch;
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
            // A compaction sweeps a bounded batch of keys between requests, and while idle, so
            // no write waits behind it for long.
            let (compacting, unfinished) = {
                let st = state.read();
                (st.store.compaction_pending(), st.store.compaction_unfinished())
            };
            let work = if compacting {
                if !state.write().store.compaction_step(compaction_batch) {
                    swept.notify();
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
            } else if shared.applying.lock().is_stalled() {
                // Stalled entries are tried again on time, whether more come or not.
                {
                    let mut applying = shared.applying.lock();
                    if applying.retry_due() {
                        applying.retry_stalled(state.write());
                    }
                }
                match rx.recv_timeout(STALL_RETRY / 4) {
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
            shared.applying.lock().other(work);
            // Only now: the node thread applies a batch itself only once nothing handed over
            // before is left.
            shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        // Let a checkpoint being written finish before the final one is taken.
        shared.applying.lock().to_write = None;
        checkpointer.map_or(Ok(()), crate::thread::Worker::join)
    }
}

/// Starts the checkpointer thread and gives the apply path its queue; without one (it could
/// not start), checkpoints are only written on close.
fn start_checkpointer(shared: &Shared) -> Option<crate::thread::Worker> {
    let mut applying = shared.applying.lock();
    let (to_write, written) = bounded::<Encoded>(1);
    let p = &applying.publisher;
    let checkpointer = Checkpointer {
        dir: p.core.dir.clone(),
        wal: p.wal.clone(),
        checkpointing: p.core.checkpointing.clone(),
        writing: applying.writing.clone(),
        written,
    };
    let spawned = crate::thread::start("cairn-checkpoint", move || checkpointer.run());
    match spawned {
        Ok(thread) => {
            applying.to_write = Some(to_write);
            Some(thread)
        }
        Err(e) => {
            tracing::error!(error = %e, "no checkpoint thread; checkpoints only on close");
            None
        }
    }
}
