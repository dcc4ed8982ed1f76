//! Replication with raft-rs: the Raft log over the WAL, and the node thread that owns the
//! `RawNode` (see docs/design.md, "Raft").

pub(crate) mod interface;
pub(crate) mod local;
pub(crate) mod log;
mod logging;
pub(crate) mod node;
pub(crate) mod transfer;

/// The request IDs of the last entries applied, to apply each request once: a proposal a
/// follower forwards can reach the leader twice (a duplicated message), and raft-rs would log
/// it twice. Part of the replicated state (checkpoints and snapshots carry it), so every member
/// skips the same entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RecentRequests {
    order: std::collections::VecDeque<u64>,
    set: foldhash::HashSet<u64>,
}

/// How many request IDs are remembered: a duplicate arriving later than this many entries
/// after its original is applied again (a transport that keeps a message that long is broken).
const REMEMBERED_REQUESTS: usize = 16 << 10;

impl RecentRequests {
    /// Forgets `id`, recorded last by [`RecentRequests::first_time`] for an entry that could
    /// not be applied after all (it will be again).
    pub(crate) fn forget_last(&mut self, id: u64) {
        if self.order.back() == Some(&id) {
            self.order.pop_back();
            self.set.remove(&id);
        }
    }

    /// The IDs remembered, oldest first, as checkpoints and snapshots keep them.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.order.iter().copied()
    }

    /// The IDs a checkpoint or snapshot kept, oldest first.
    pub(crate) fn from_ids(ids: impl IntoIterator<Item = u64>) -> RecentRequests {
        let order: std::collections::VecDeque<u64> = ids.into_iter().collect();
        let set = order.iter().copied().collect();
        RecentRequests { order, set }
    }

    /// Records `id`; false if it was applied already.
    pub(crate) fn first_time(&mut self, id: u64) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > REMEMBERED_REQUESTS {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}
