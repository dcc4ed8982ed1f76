//! Applying a batch ([`Applying`]) as a pure transition under the state lock, and publishing
//! its outcome without it ([`Publisher`]); installing a snapshot from the leader.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_wal::Wal;
use crossbeam_channel::Sender;
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use super::transition::{Entries, Outcome, Schedule, Step};
use crate::consensus::interface::Staged;
use crate::consensus::interface::{Input, ToApply};
use crate::engine::checkpointing::{write_and_release, Encoded};
use crate::engine::core::Core;
use crate::engine::state::State;
use crate::error::{Error, Result};
use crate::watch::feed::Fed;
use crate::watch::hub::WatchHub;

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
        // Before the events: no watcher is sent a revision newer than the headers say.
        self.core.revision.store(outcome.revision, Ordering::Release);
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
    st.auth_status.mirror(&st.auth);
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
    pub(super) publisher: Publisher,
    schedule: Schedule,
    /// Set while the checkpointer thread writes one: the next waits for more entries.
    pub(super) writing: Arc<AtomicBool>,
    /// To the checkpointer thread, while the apply thread runs it.
    pub(super) to_write: Option<Sender<Encoded>>,
    /// Entries this member could not apply yet (see `Stalled`), with every batch committed
    /// since, in order, when applying stopped, and when it was last tried: tried again every
    /// [`STALL_RETRY`].
    stalled: Option<(Entries, Instant, Instant)>,
}

/// How often applying stalled entries is tried again.
pub(super) const STALL_RETRY: Duration = Duration::from_secs(1);

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
    pub(super) fn is_stalled(&self) -> bool {
        self.stalled.is_some()
    }

    /// Whether stalled entries are due to be tried again.
    pub(super) fn retry_due(&self) -> bool {
        self.stalled
            .as_ref()
            .is_some_and(|(_, _, tried)| tried.elapsed() >= STALL_RETRY)
    }

    /// Tries the stalled entries again.
    pub(super) fn retry_stalled(&mut self, st: RwLockWriteGuard<'_, State>) -> bool {
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
    pub(super) fn checkpoint_due(&self, entries: usize) -> bool {
        self.schedule.due_within(entries)
    }

    /// Applies committed entries under the state lock `st`, then publishes what they did
    /// without it; returns whether a compaction is left to sweep.
    pub(super) fn entries(&mut self, st: RwLockWriteGuard<'_, State>, batch: Entries) -> bool {
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
    pub(super) fn other(&mut self, work: ToApply) {
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
                        core.revision.store(st.store.current_revision(), Ordering::Release);
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
