//! Replication with raft-rs: the Raft log over the WAL, and the node thread that owns the
//! `RawNode` (see docs/design.md, "Raft").

pub(crate) mod local;
pub(crate) mod log;
pub(crate) mod node;

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
