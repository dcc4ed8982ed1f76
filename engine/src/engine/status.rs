//! What the engine reports about itself ([`EngineStatus`]): Raft's view (leader, term,
//! indexes; etcd's Status), and sizes and counts for metrics.

use std::sync::atomic::Ordering;

use super::core::Core;
use crate::error::Error;

/// What a member knows of itself at one moment ([`Engine::status`](crate::Engine::status)): Raft's view, as etcd's
/// `Status` reports it, and the store's sizes and counts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineStatus {
    /// This member's ID.
    pub member_id: u64,
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
    /// Why this member stopped accepting writes for good, if it has: its WAL failed (a full
    /// disk when a segment was to be made, an fsync error), and the log cannot be trusted to
    /// take more until the engine is opened again. Whoever runs the engine should restart it
    /// (the `cairn` server exits, as etcd does).
    pub failure: Option<Error>,
    /// The store's current revision.
    pub current_revision: i64,
    /// The revision history was compacted at (0 if never).
    pub compacted_revision: i64,
    /// Bytes the data files hold (etcd's `dbSize`): history kept, plus what compaction freed
    /// and a defragmentation would return; space preallocated for later writes is not counted
    /// (kube-apiserver exports this as `apiserver_storage_size_bytes`).
    pub size: u64,
    /// Bytes of history kept (etcd's `dbSizeInUse`; what the quota limits).
    pub size_in_use: u64,
    /// Keys that exist now (etcd's `keys_total`); kept by the index, not counted.
    pub keys: usize,
    /// Leases granted and not yet revoked or expired.
    pub leases: usize,
    /// Watchers open now.
    pub watchers: usize,
    /// How many snapshots from the leader this member has installed since it was opened (a
    /// follower too far behind for the leader's log is sent one).
    pub snapshots_installed: u64,
}

impl Core {
    pub(super) fn leader(&self) -> Option<u64> {
        match self.status.leader.load(Ordering::Relaxed) {
            0 => None,
            id => Some(id),
        }
    }
}

impl EngineStatus {
    /// What `core`'s member knows of itself now.
    pub(super) fn read(core: &Core) -> EngineStatus {
        let status = &core.status;
        let watchers = core.hub.lock().len();
        let st = core.state.read();
        EngineStatus {
            member_id: core.member_id,
            leader: core.leader(),
            term: status.term.load(Ordering::Relaxed),
            commit_index: core.log.hard_state().commit,
            applied_index: st.applied_index,
            is_learner: status.learner.load(Ordering::Relaxed),
            leader_changes: status.leader_changes.load(Ordering::Relaxed),
            proposals_pending: core.waiters.len() as u64,
            proposals_failed: status.proposals_failed.load(Ordering::Relaxed),
            failure: status.failed.lock().clone(),
            current_revision: st.store.current_revision(),
            compacted_revision: st.store.compacted_revision(),
            size: st.store.size(),
            size_in_use: st.store.size_in_use(),
            keys: st.store.key_count(),
            leases: st.lessor.len(),
            watchers,
            snapshots_installed: st.installs,
        }
    }
}
