//! [`EngineBuilder`]: the one way to open a member of a group, from a group of one to a member
//! joining a running cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::handle::Engine;
use crate::config::Config;
use crate::consensus::interface::NoPeers;
use crate::consensus::interface::Transport;
use crate::error::{Error, Result};
use crate::membership::MemberAttributes;

/// Opens an [`Engine`]: `Engine::builder(dir).member(id).peers(..).transport(t).open()`.
///
/// Without `member`, `peers` or `transport` it is a group of one, member 1, which is what
/// [`Engine::open`] opens. A member that was part of a group resumes from its own data, and
/// `peers` and `join_existing` only matter the first time a directory is opened.
#[must_use = "nothing is opened until `open`"]
pub struct EngineBuilder {
    dir: PathBuf,
    config: Config,
    identity: Identity,
    transport: Arc<dyn Transport>,
}

/// Who a member is and how its group starts.
#[derive(Clone, Debug)]
pub(super) struct Identity {
    /// This member's Raft ID.
    pub(super) member_id: u64,
    /// A new group's members, this one included; empty for a group of one.
    pub(super) peers: Vec<u64>,
    /// The names and URLs of `peers` that have them, recorded in the group's first entries.
    pub(super) attributes: BTreeMap<u64, MemberAttributes>,
    /// Joins a group that exists already: no membership of its own, learned from the leader.
    pub(super) join_existing: bool,
    /// Makes this member, with its data, a group of one (etcd's `--force-new-cluster`).
    pub(super) force_new_cluster: bool,
}

/// A member of a new group, for [`EngineBuilder::peers`]: an ID alone, or with the name and
/// URLs the group records for it (etcd's `--initial-cluster`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The member's Raft ID; never 0.
    pub id: u64,
    /// Its name and URLs; members without them get them when they publish.
    pub attributes: Option<MemberAttributes>,
}

impl From<u64> for Peer {
    fn from(id: u64) -> Peer {
        Peer { id, attributes: None }
    }
}

impl From<(u64, MemberAttributes)> for Peer {
    fn from((id, attributes): (u64, MemberAttributes)) -> Peer {
        Peer {
            id,
            attributes: Some(attributes),
        }
    }
}

impl std::fmt::Debug for EngineBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("dir", &self.dir)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    pub(super) fn new(dir: &Path) -> EngineBuilder {
        EngineBuilder {
            dir: dir.to_path_buf(),
            config: Config::default(),
            identity: Identity {
                member_id: 1,
                peers: Vec::new(),
                attributes: BTreeMap::new(),
                join_existing: false,
                force_new_cluster: false,
            },
            transport: Arc::new(NoPeers),
        }
    }

    /// The tunables (default: [`Config::default`]).
    pub fn config(mut self, config: Config) -> EngineBuilder {
        self.config = config;
        self
    }

    /// This member's Raft ID (default 1); never 0.
    pub fn member(mut self, id: u64) -> EngineBuilder {
        self.identity.member_id = id;
        self
    }

    /// The members of a new group, this one included (etcd's `--initial-cluster`): IDs, or
    /// `(id, MemberAttributes)` pairs to record their names and URLs in the group's first
    /// entries. Ignored once the member has data.
    pub fn peers<P: Into<Peer>>(mut self, peers: impl IntoIterator<Item = P>) -> EngineBuilder {
        for peer in peers {
            let Peer { id, attributes } = peer.into();
            self.identity.peers.push(id);
            if let Some(a) = attributes {
                self.identity.attributes.insert(id, a);
            }
        }
        self
    }

    /// Joins a group that runs already (etcd's `--initial-cluster-state existing`): the
    /// member starts with no membership and learns it, and the log, from the leader once the
    /// group has added it ([`crate::Members::add`]).
    pub fn join_existing(mut self) -> EngineBuilder {
        self.identity.join_existing = true;
        self
    }

    /// Recovers from the loss of a quorum, as etcd's `--force-new-cluster`: the member keeps
    /// its data and becomes a group of one (every other member removed through its log, what
    /// was not committed dropped), which new members may then join. Open it this way once:
    /// a member opened so again removes every member added since.
    pub fn force_new_cluster(mut self) -> EngineBuilder {
        self.identity.force_new_cluster = true;
        self
    }

    /// Where messages to the other members go (theirs arrive through the member's
    /// [`crate::Inbox`], [`Engine::inbox`]); [`crate::LocalNetwork`] connects members in one
    /// process.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> EngineBuilder {
        self.transport = transport;
        self
    }

    /// Opens (or creates) the member in the directory, recovering everything its log holds,
    /// and returns once it has applied what it had committed.
    pub fn open(self) -> Result<Engine> {
        let id = &self.identity;
        if id.member_id == 0 {
            return Err(Error::InvalidConfig("the member ID must not be 0".into()));
        }
        if !id.peers.is_empty() && !id.peers.contains(&id.member_id) {
            return Err(Error::InvalidConfig("the peers must include this member".into()));
        }
        if id.peers.contains(&0) {
            return Err(Error::InvalidConfig("a peer ID must not be 0".into()));
        }
        Engine::start(&self.dir, self.config, self.identity, self.transport)
    }
}

impl Engine {
    /// A builder to open the engine in `dir`: a group of one unless told otherwise.
    pub fn builder(dir: impl AsRef<Path>) -> EngineBuilder {
        EngineBuilder::new(dir.as_ref())
    }
}
