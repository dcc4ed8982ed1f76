//! A group's membership: who its members are (raft's configuration) and what each is called
//! and reached at, as the replicated state records it.

use std::collections::BTreeMap;

use raft::eraftpb::ConfState;

/// What a group records about a member besides its ID (etcd's member attributes), replicated
/// like the rest of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemberAttributes {
    /// The member's human-readable name (etcd's `--name`); empty until the member publishes
    /// it, unless the group was bootstrapped with it.
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where clients reach it; empty until it publishes them.
    pub client_urls: Vec<String>,
}

impl MemberAttributes {
    /// The attributes of a member added with `peer_urls` (its name and client URLs come when
    /// it publishes them).
    pub fn with_peer_urls(peer_urls: Vec<String>) -> MemberAttributes {
        MemberAttributes {
            peer_urls,
            ..MemberAttributes::default()
        }
    }
}

/// A membership change applied to raft, for the apply thread to record.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ConfApplied {
    /// The membership after it.
    pub(crate) state: ConfState,
    /// Members it added (as voters or learners; a promotion adds a voter that was a learner).
    pub(crate) added: Vec<u64>,
    pub(crate) removed: Vec<u64>,
    /// The change's context: the attributes of the member it adds.
    pub(crate) context: bytes::Bytes,
}

/// The group's membership, as a checkpoint keeps it (raft's ConfState), with each member's
/// attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Membership {
    pub(crate) voters: Vec<u64>,
    pub(crate) learners: Vec<u64>,
    /// The outgoing voters of a joint configuration.
    pub(crate) voters_outgoing: Vec<u64>,
    /// Voters that become learners when the joint configuration is left.
    pub(crate) learners_next: Vec<u64>,
    pub(crate) auto_leave: bool,
    /// Every member's attributes, by ID.
    pub(crate) attributes: BTreeMap<u64, MemberAttributes>,
}

impl Membership {
    /// Records a membership change: the new configuration, and the attributes of the members
    /// it added (`added`, decoded from the change's context; kept for a learner promoted) and
    /// removed.
    pub(crate) fn apply(&mut self, change: &ConfApplied, added: &MemberAttributes) {
        let cs = &change.state;
        self.voters = cs.voters.clone();
        self.learners = cs.learners.clone();
        self.voters_outgoing = cs.voters_outgoing.clone();
        self.learners_next = cs.learners_next.clone();
        self.auto_leave = cs.auto_leave;
        for id in &change.removed {
            self.attributes.remove(id);
        }
        for id in &change.added {
            self.attributes.entry(*id).or_insert_with(|| added.clone());
        }
    }

    /// Whether `id` is a member (a voter or a learner, in either half of a joint
    /// configuration).
    pub(crate) fn contains(&self, id: u64) -> bool {
        [&self.voters, &self.learners, &self.voters_outgoing, &self.learners_next]
            .iter()
            .any(|ids| ids.contains(&id))
    }

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
