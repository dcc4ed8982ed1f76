//! Replication with raft-rs: the Raft log over the WAL, and the node thread that owns the
//! `RawNode` (see docs/design.md, "Raft").

pub(crate) mod local;
pub(crate) mod log;
pub(crate) mod node;
pub(crate) mod transfer;

use raft::eraftpb::ConfState;

/// The group's membership, as a checkpoint keeps it (raft's ConfState).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Membership {
    pub(crate) voters: Vec<u64>,
    pub(crate) learners: Vec<u64>,
    /// The outgoing voters of a joint configuration.
    pub(crate) voters_outgoing: Vec<u64>,
    /// Voters that become learners when the joint configuration is left.
    pub(crate) learners_next: Vec<u64>,
    pub(crate) auto_leave: bool,
}

impl Membership {
    pub(crate) fn to_conf_state(&self) -> ConfState {
        ConfState {
            voters: self.voters.clone(),
            learners: self.learners.clone(),
            voters_outgoing: self.voters_outgoing.clone(),
            learners_next: self.learners_next.clone(),
            auto_leave: self.auto_leave,
            ..ConfState::default()
        }
    }
}

impl From<&ConfState> for Membership {
    fn from(cs: &ConfState) -> Membership {
        Membership {
            voters: cs.voters.clone(),
            learners: cs.learners.clone(),
            voters_outgoing: cs.voters_outgoing.clone(),
            learners_next: cs.learners_next.clone(),
            auto_leave: cs.auto_leave,
        }
    }
}

/// The request IDs of the last entries applied, to apply each request once: a proposal a
/// follower forwards can reach the leader twice (a duplicated message), and raft-rs would log
/// it twice. Part of the replicated state (checkpoints and snapshots carry it), so every member
/// skips the same entries.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecentRequests {
    order: std::collections::VecDeque<u64>,
    #[serde(skip)]
    set: std::collections::HashSet<u64>,
}

/// How many request IDs are remembered: a duplicate arriving later than this many entries
/// after its original is applied again (a transport that keeps a message that long is broken).
const REMEMBERED_REQUESTS: usize = 16 << 10;

impl RecentRequests {
    /// Records `id`; false if it was applied already.
    pub(crate) fn first_time(&mut self, id: u64) -> bool {
        if self.set.len() != self.order.len() {
            // Loaded from a checkpoint: the set is rebuilt from the order.
            self.set = self.order.iter().copied().collect();
        }
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
