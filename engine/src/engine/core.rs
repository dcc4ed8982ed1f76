//! What the engine's handle shares with its threads ([`Core`]), and the running Raft node
//! ([`Replica`]). The engine's locks are taken in the one order docs/design.md gives
//! ("Concurrency model").

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use cairn_wal::Wal;
use parking_lot::{Mutex, RwLock};

use super::checkpointing::Checkpointing;
use super::progress::{AppliedIndex, Swept};
use super::state::State;
use super::waiters::Waiters;
use crate::config::Config;
use crate::consensus::interface::Status;
use crate::consensus::log::RaftLog;
use crate::consensus::node::NodeHandle;
use crate::watch::hub::WatchHub;

/// The running Raft node and the log it writes.
pub(super) struct Replica {
    pub(super) node: NodeHandle,
    pub(super) wal: Arc<Wal>,
}

/// What the engine's handle shares with its threads.
pub(crate) struct Core {
    pub(crate) config: Config,
    /// The engine's directory.
    pub(super) dir: PathBuf,
    /// This member's Raft ID.
    pub(super) member_id: u64,
    /// The node's handle and the log; `None` once closed. The engine's locks are taken in the
    /// one order docs/design.md gives ("Concurrency model"), this one first.
    pub(super) replica: Mutex<Option<Replica>>,
    pub(super) waiters: Arc<Waiters>,
    /// The Raft log (shared with the node thread), for reads on a group of one.
    pub(super) log: RaftLog,
    /// The node's leader and term, as it last published them.
    pub(super) status: Arc<Status>,
    /// The next request ID: this member's ID in the top 16 bits, a counter below.
    pub(super) next_request: AtomicU64,
    pub(super) applied: Arc<AppliedIndex>,
    pub(super) state: Arc<RwLock<State>>,
    pub(super) hub: Arc<Mutex<WatchHub>>,
    /// See [`Checkpointing`].
    pub(super) checkpointing: Arc<Checkpointing>,
    /// See [`Swept`].
    pub(super) swept: Arc<Swept>,
    /// Held by the one defragmentation that may run at a time, and by a snapshot's install.
    pub(super) defragmenting: Arc<Mutex<()>>,
    /// The next server-chosen lease ID candidate.
    pub(super) next_lease_id: AtomicI64,
    /// The store's current revision, stored after each applied batch (before its events go
    /// to the watchers) and each installed snapshot: what response headers carry, read
    /// without the state's lock.
    pub(super) revision: AtomicI64,
    /// The state's [`AuthStatus`] (the same one: it is never replaced).
    pub(super) auth_status: Arc<super::state::AuthStatus>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("dir", &self.dir)
            .field("member_id", &self.member_id)
            .finish_non_exhaustive()
    }
}
