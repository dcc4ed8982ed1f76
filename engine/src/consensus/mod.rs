//! Replication with raft-rs: the Raft log over the WAL, and the node thread that owns the
//! `RawNode` (see docs/design.md, "Raft").

pub(crate) mod interface;
pub(crate) mod local;
pub(crate) mod log;
mod logging;
pub(crate) mod node;
pub(crate) mod transfer;

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
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Membership {
    pub(crate) voters: Vec<u64>,
    pub(crate) learners: Vec<u64>,
    /// The outgoing voters of a joint configuration.
    pub(crate) voters_outgoing: Vec<u64>,
    /// Voters that become learners when the joint configuration is left.
    pub(crate) learners_next: Vec<u64>,
    pub(crate) auto_leave: bool,
    /// Every member's attributes, by ID.
    #[serde(with = "crate::format::state::attributes")]
    pub(crate) attributes: BTreeMap<u64, MemberAttributes>,
}

impl Membership {
    /// Records a membership change: the new configuration, and the attributes of the members
    /// it added (kept for a learner promoted) and removed.
    pub(crate) fn apply(&mut self, change: &ConfApplied) {
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
            self.attributes
                .entry(*id)
                .or_insert_with(|| crate::format::state::attributes::decode(&change.context));
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
    /// Forgets `id`, recorded last by [`RecentRequests::first_time`] for an entry that could
    /// not be applied after all (it will be again).
    pub(crate) fn forget_last(&mut self, id: u64) {
        if self.order.back() == Some(&id) {
            self.order.pop_back();
            self.set.remove(&id);
        }
    }

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
