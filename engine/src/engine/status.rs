//! What the engine reports about itself: Raft's view (leader, term, indexes; etcd's Status),
//! and sizes, counts and latencies for metrics.

use std::sync::atomic::Ordering;

use super::Engine;
use crate::error::Result;

/// What a member knows of Raft at one moment ([`Engine::raft_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RaftStatus {
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// The current term.
    pub term: u64,
    /// The last log index it knows committed.
    pub commit_index: u64,
    /// The last log index it applied.
    pub applied_index: u64,
    /// Whether it is a learner.
    pub is_learner: bool,
    /// How many times it has seen a new leader since it was opened.
    pub leader_changes: u64,
    /// Proposals made through it and not answered yet.
    pub proposals_pending: u64,
    /// Proposals made through it that were dropped before being committed, since it was
    /// opened.
    pub proposals_failed: u64,
}

impl Engine {
    /// The leader this member knows of, if any.
    pub fn leader(&self) -> Option<u64> {
        match self.core.status.leader.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }

    /// How many committed log entries this member has not applied yet (etcd refuses writes
    /// while this is large). Cheap enough for every request: no state lock.
    pub fn apply_lag(&self) -> u64 {
        let committed = self.core.log.hard_state().commit;
        committed.saturating_sub(self.core.applied.get())
    }

    /// The current Raft term, as this member knows it (cheap: one atomic read).
    pub fn term(&self) -> u64 {
        self.core.status.term.load(Ordering::Relaxed)
    }

    /// Why this member stopped accepting writes for good, if it has: its WAL failed (a full
    /// disk when a segment was to be made, an fsync error), and the log cannot be trusted to
    /// take more until the engine is opened again. Whoever runs the engine should restart it
    /// (the `cairn` server exits, as etcd does).
    pub fn failure(&self) -> Option<crate::Error> {
        self.core.status.failed.lock().clone()
    }

    /// What this member knows of Raft now (etcd's `Status` fields).
    pub fn raft_status(&self) -> RaftStatus {
        let applied_index = self.core.state.read().applied_index;
        let is_learner = self.is_learner();
        let status = &self.core.status;
        RaftStatus {
            leader: self.leader(),
            term: status.term.load(Ordering::Relaxed),
            commit_index: self.core.log.hard_state().commit,
            applied_index,
            is_learner,
            leader_changes: status.leader_changes.load(Ordering::Relaxed),
            proposals_pending: self.core.waiters.len() as u64,
            proposals_failed: status.proposals_failed.load(Ordering::Relaxed),
        }
    }

    /// Whether this member is a learner (it receives the log without voting), as far as the
    /// membership it has applied says; without taking any lock.
    pub fn is_learner(&self) -> bool {
        self.core.status.learner.load(Ordering::Relaxed)
    }

    /// This member's ID.
    pub fn member_id(&self) -> u64 {
        self.core.member_id
    }

    /// How many snapshots from the leader this member has installed since it was opened (a
    /// follower too far behind for the leader's log is sent one).
    pub fn snapshots_installed(&self) -> u64 {
        self.core.state.read().installs
    }

    /// Bytes the data files hold (etcd's `dbSize`): history kept, plus what compaction freed
    /// and [`Engine::defragment`] would return; space preallocated for later writes is not
    /// counted (kube-apiserver exports this as `apiserver_storage_size_bytes`).
    pub fn size(&self) -> u64 {
        self.core.state.read().store.size()
    }

    /// The WAL's counters and latency histograms (fsyncs, group-commit batches), for metrics.
    pub fn wal_stats(&self) -> Result<cairn_wal::StatsSnapshot> {
        Ok(self.core.wal()?.stats())
    }

    /// How long checkpoints took to write (data files synced, checkpoint file written and
    /// synced), in microseconds: etcd's backend commit, for metrics.
    pub fn checkpoint_latency_us(&self) -> cairn_wal::Distribution {
        self.core.checkpointing.latency_us.lock().clone()
    }

    /// Watchers open now.
    pub fn watcher_count(&self) -> usize {
        self.core.hub.lock().len()
    }

    /// Keys that exist now (etcd's `keys_total`); kept by the index, not counted.
    pub fn key_count(&self) -> usize {
        self.core.state.read().store.key_count()
    }

    /// Bytes of history kept (etcd's `dbSizeInUse`; what the quota limits).
    pub fn size_in_use(&self) -> u64 {
        self.core.state.read().store.size_in_use()
    }

    /// The revision history was compacted at (0 if never).
    pub fn compacted_revision(&self) -> i64 {
        self.core.state.read().store.compacted_revision()
    }

    /// The store's current revision.
    pub fn current_revision(&self) -> i64 {
        self.core.state.read().store.current_revision()
    }
}
