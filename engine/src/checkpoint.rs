//! Checkpoints: the applied log index and the state it describes, in one small file.
//!
//! Opening loads the checkpoint, then replays only the log entries after its applied index;
//! segments of the log wholly below it are released. The applied index and the state are
//! written together, never separately, so a crash can never pair a state with the wrong
//! position in the log (the mistake behind etcd 3.5's data-inconsistency bug). The file's
//! layout, its versions and its atomic write are `crate::format::checkpoint`'s.

use crate::consensus::RecentRequests;
use crate::lease::lessor::LeaseRecord;
use crate::membership::Membership;
use crate::mvcc::store::StoreMeta;
use crate::request::Alarm;
use crate::version::ClusterVersions;

/// What a checkpoint holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub(crate) applied_index: u64,
    /// The term of the entry at `applied_index` (the Raft log's "snapshot" term).
    pub(crate) applied_term: u64,
    /// The group's membership at `applied_index`.
    pub(crate) membership: Membership,
    /// The last request IDs applied.
    pub(crate) recent: RecentRequests,
    /// Defragmentations so far (see the module docs).
    pub(crate) epoch: u64,
    pub(crate) store: StoreMeta,
    pub(crate) leases: Vec<LeaseRecord>,
    /// The raised alarms, with the member each was raised for.
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions (its permission cache is rebuilt on load).
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions (a trailer of the body: see `format::checkpoint`).
    pub(crate) versions: ClusterVersions,
}

impl Checkpoint {
    /// Which of two checkpoints is newer.
    pub(crate) fn order(&self) -> (u64, u64) {
        (self.applied_index, self.epoch)
    }
}
