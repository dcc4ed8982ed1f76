//! Snapshots: the complete state as a stream, written and read in bounded memory. The
//! stream's layout and versions are `crate::format::snapshot`'s.

use crate::consensus::RecentRequests;
use crate::lease::lessor::LeaseRecord;
use crate::membership::Membership;
use crate::request::Alarm;
use crate::version::ClusterVersions;

/// Everything in a snapshot besides the records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SnapshotMeta {
    pub(crate) applied_index: u64,
    /// The term of the entry at `applied_index`.
    pub(crate) applied_term: u64,
    /// The group's membership then.
    pub(crate) membership: Membership,
    /// The last request IDs applied.
    pub(crate) recent: RecentRequests,
    pub(crate) current: i64,
    pub(crate) compacted: i64,
    pub(crate) leases: Vec<LeaseRecord>,
    /// The raised alarms, with the member each was raised for.
    pub(crate) alarms: Vec<(u64, Alarm)>,
    /// Users, roles and permissions.
    pub(crate) auth: crate::auth::AuthStore,
    /// The agreed versions (a trailer of the meta: see `format::snapshot`).
    pub(crate) versions: ClusterVersions,
}
