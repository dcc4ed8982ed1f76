//! The embedded engine: a directory holding a durable, revisioned key-value store with leases,
//! replicated by Raft.
//!
//! A write is validated, encoded as a [`Request`](crate::request::Request), and handed to the
//! Raft node thread under a request ID, which proposes it. Once the entry is committed (in the
//! WALs of a majority; the WAL's group commit makes one fdatasync serve many), the apply thread
//! applies it to the state (store, lessor and alarms) in log order and answers the caller.
//! Reads take the state's read lock and are served concurrently with other reads; a write's
//! answer comes after it is applied, so a read that starts after a write returns sees it.
//!
//! Leases expire on this member's clock: a checker thread (or an explicit
//! [`Engine::expire_leases`]) proposes a revoke for each expired lease, a bounded batch at a
//! time, through the same write path; each revoke deletes its keys in one revision.
//!
//! On disk: `<dir>/wal/`, the log of every request; `<dir>/data/`, the records of every change
//! still in history (see [`crate::backend`]); `<dir>/checkpoint`, the applied index with the
//! data files' layout and the leases. Opening rebuilds the state from the checkpoint and its
//! data files and replays the log after it, so a crash at any point recovers every
//! acknowledged write (and possibly some that were logged but not yet answered).
//!
//! This module holds [`Engine`] and what its threads share (`Core`, `State`), with opening
//! and closing. The rest of the API is split by concern: `kv` (put, delete_range, txn, range),
//! `leases`, `watch`, `membership` (and the inbox peers' messages arrive through),
//! `maintenance` (compaction, defragmentation, snapshots, alarms, HashKV) and `status`; the
//! write path's ends are in `propose`, the apply thread in `apply`, checkpoints in
//! `checkpointing`.

mod apply;
mod auth;
mod builder;
mod checkpointing;
mod kv;
mod leases;
mod maintenance;
mod membership;
mod open;
mod propose;
pub(crate) mod staged;
mod status;
mod versions;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use cairn_wal::Wal;
use crossbeam_channel::bounded;
use parking_lot::{Mutex, RwLock};

use apply::{AppliedIndex, ApplyThread, Applying, Handoff, Publisher, Swept};
use builder::Identity;
use checkpointing::{checkpoint_and_release, Checkpointing};
use leases::checker_loop;
use maintenance::write_snapshot;
use open::Recovered;
use propose::Waiters;
use watch::{watch_loop, WatchThread};

use crate::config::Config;
use crate::consensus::interface::{NoPeers, NodeConfig, Status, Transport};
use crate::consensus::log::RaftLog;
use crate::consensus::node::{NodeHandle, NodeParts};
use crate::consensus::RecentRequests;
use crate::error::{Error, Result};
use crate::lease::lessor::Lessor;
use crate::membership::Membership;
use crate::mvcc::store::Store;
use crate::request::Alarm;
use crate::thread::{self, Stoppable, Worker};
use crate::watch::hub::WatchHub;

pub use builder::{EngineBuilder, Peer};
pub use kv::{Applied, WriteRequest};
pub use leases::LeaseGrant;
pub use maintenance::{Defragmented, SnapshotInfo};
pub use membership::{Inbox, Member, Members};
pub use propose::{Pending, PendingFuture};
pub use status::RaftStatus;
pub use watch::{Watch, WatchGroup};

/// The running Raft node and the log it writes.
struct Replica {
    node: NodeHandle,
    wal: Arc<Wal>,
}

/// What requests change: the store, the lessor and the alarms, always together.
struct State {
    store: Store,
    lessor: Lessor,
    /// The raised alarms, by member (etcd's `AlarmMember`s).
    alarms: std::collections::BTreeSet<(u64, Alarm)>,
    /// Users, roles and permissions.
    auth: crate::auth::AuthStore,
    /// The versions the members agreed (`crate::version`).
    versions: crate::version::ClusterVersions,
    /// Simple tokens, registered as their entries are applied (not persisted).
    tokens: Mutex<crate::auth::tokens::SimpleTokens>,
    /// The last log index applied. Invariant: the state is exactly the log up to here.
    applied_index: u64,
    /// The term of the entry at `applied_index`.
    applied_term: u64,
    /// The group's membership as of `applied_index`.
    membership: Membership,
    /// The request IDs of the last entries applied (each request is applied once).
    recent: RecentRequests,
    /// Defragmentations and installed snapshots so far (see [`crate::checkpoint`]).
    epoch: u64,
    /// Snapshots from the leader installed since open: a snapshot being taken of the old
    /// state cannot go on reading the new one.
    installs: u64,
}

impl State {
    /// The state of `store` before anything is applied: membership, leases, alarms and users
    /// come from a checkpoint, or from the log (a new group's first entries add its members).
    fn new(store: Store, config: &Config) -> State {
        State {
            store,
            lessor: Lessor::new(config.min_lease_ttl, config.clock.clone()),
            alarms: Default::default(),
            auth: Default::default(),
            versions: Default::default(),
            tokens: Mutex::new(crate::auth::tokens::SimpleTokens::new(
                config.simple_token_ttl,
                config.clock.clone(),
            )),
            applied_index: 0,
            applied_term: 0,
            membership: Membership::default(),
            recent: RecentRequests::default(),
            epoch: 0,
            installs: 0,
        }
    }

    /// Reads served here fail while a CORRUPT alarm names this member (or no member): a hash
    /// check found its data differs from the others'.
    fn check_readable(&self, me: u64) -> Result<()> {
        match self
            .alarms
            .iter()
            .any(|&(m, a)| a == Alarm::Corrupt && (m == me || m == 0))
        {
            true => Err(Error::Corrupt),
            false => Ok(()),
        }
    }

    /// An empty state in memory, applied up to `applied`, for the apply core's tests.
    #[cfg(test)]
    fn empty(applied: u64) -> State {
        let config = Config {
            clock: Arc::new(crate::clock::ManualClock::default()),
            min_lease_ttl: 1,
            ..Config::default()
        };
        let mut state = State::new(Store::new(), &config);
        state.applied_index = applied;
        state
    }
}

/// What the engine's handle shares with its threads.
struct Core {
    config: Config,
    /// The engine's directory.
    dir: PathBuf,
    /// This member's Raft ID.
    member_id: u64,
    /// The node's handle and the log; `None` once closed. The engine's locks are taken in the
    /// one order docs/design.md gives ("Concurrency model"), this one first.
    replica: Mutex<Option<Replica>>,
    waiters: Arc<Waiters>,
    /// The Raft log (shared with the node thread), for reads on a group of one.
    log: RaftLog,
    /// The node's leader and term, as it last published them.
    status: Arc<Status>,
    /// The next request ID: this member's ID in the top 16 bits, a counter below.
    next_request: AtomicU64,
    applied: Arc<AppliedIndex>,
    state: Arc<RwLock<State>>,
    hub: Arc<Mutex<WatchHub>>,
    /// See [`Checkpointing`].
    checkpointing: Arc<Checkpointing>,
    /// See [`Swept`].
    swept: Arc<Swept>,
    /// Held by the one defragmentation that may run at a time, and by a snapshot's install.
    defragmenting: Arc<Mutex<()>>,
    /// The next server-chosen lease ID candidate.
    next_lease_id: AtomicI64,
}

/// An open engine. `Engine` is `Send + Sync`: share it between threads.
pub struct Engine {
    core: Arc<Core>,
    apply_thread: Mutex<Option<Worker<Result<()>>>>,
    /// The lease checker, when leases expire on their own.
    checker: Mutex<Option<Stoppable>>,
    watch_thread: Mutex<Option<Stoppable>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dir", &self.core.dir)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Opens (or creates) a group of one in `dir`, recovering everything its log holds:
    /// `Engine::builder(dir).config(config).open()`.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine> {
        Engine::builder(dir).config(config).open()
    }

    fn start(dir: &Path, config: Config, identity: Identity, transport: Arc<dyn Transport>) -> Result<Engine> {
        let member_id = identity.member_id;
        // Every log event of this member, from its threads too (each enters the span it was
        // started in), names the member.
        let _member = tracing::info_span!("member", id = %format_args!("{member_id:x}")).entered();
        config.validate()?;
        let dir = dir.to_path_buf();
        let Recovered { state, log, wal } = open::recover(&dir, &config)?;
        open::bootstrap(&state, &log, &wal, &identity)?;
        open::force_new_cluster(&state, &log, &wal, &identity)?;
        let catch_up_to = open::catch_up_target(&state, &log, &identity);
        let applied = Arc::new(AppliedIndex::default());
        applied.set(state.applied_index);
        let node_config = NodeConfig {
            id: member_id,
            tick: config.raft_tick,
            election_ticks: config.election_ticks,
            heartbeat_ticks: config.heartbeat_ticks,
            applied: state.applied_index,
            read_timeout: config.request_timeout,
            pre_vote: config.pre_vote,
            advance_election_ticks: config.advance_election_ticks,
        };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| i64::try_from(d.as_millis()).unwrap_or(1));
        let first_request = ((member_id & 0xffff) << 48) | ((seed as u64) << 8 & ((1 << 48) - 1));
        let status = Arc::new(Status::default());
        status.learner.store(
            state.membership.learners.contains(&member_id),
            std::sync::atomic::Ordering::Relaxed,
        );
        // Everything the threads share exists before any of them starts: the core, and the
        // channels between them.
        let core = Arc::new(Core {
            checkpointing: Arc::new(Checkpointing {
                newest: Mutex::new((state.applied_index, state.epoch)),
                catch_up: config.snapshot_catch_up_entries,
                latency_us: Mutex::new(cairn_wal::Distribution::default()),
            }),
            state: Arc::new(RwLock::new(state)),
            hub: Arc::new(Mutex::new(WatchHub::new(config.watch_buffer, config.watch_batch))),
            replica: Mutex::new(None),
            log,
            status,
            waiters: Arc::default(),
            next_request: AtomicU64::new(first_request),
            applied,
            defragmenting: Arc::new(Mutex::new(())),
            swept: Arc::default(),
            next_lease_id: AtomicI64::new((seed << 8) & i64::MAX),
            member_id,
            dir,
            config,
        });
        let (feed, fed) = bounded(watch::FEED_DEPTH);
        let node_inputs = crossbeam_channel::unbounded();
        let publisher = Publisher {
            core: core.clone(),
            feed,
            watchers: core.hub.lock().counter(),
            wal: wal.clone(),
            node: node_inputs.0.clone(),
        };
        let (handoff, apply_rx, apply_shared) = Handoff::new(Applying::new(publisher));
        let snapshots = {
            let state = core.state.clone();
            Arc::new(move |out: &mut dyn std::io::Write| write_snapshot(&state, out))
        };
        let node = NodeHandle::spawn(NodeParts {
            config: node_config,
            inputs: node_inputs,
            log: core.log.clone(),
            wal: wal.clone(),
            transport,
            apply: Box::new(handoff),
            status: core.status.clone(),
            snapshots,
        })?;
        *core.replica.lock() = Some(Replica { node, wal });
        let apply_thread = {
            let thread = ApplyThread {
                rx: apply_rx,
                shared: apply_shared,
            };
            thread::start("cairn-apply", move || thread.run())?
        };
        let watch_thread = {
            let watching = WatchThread {
                state: core.state.clone(),
                hub: core.hub.clone(),
                feed: fed,
                every: core.config.watch_sync_interval,
                progress_every: core.config.watch_progress_interval,
            };
            thread::start_stoppable("cairn-watch", move |stop| watch_loop(watching, stop))?
        };
        let engine = Engine {
            core,
            apply_thread: Mutex::new(Some(apply_thread)),
            checker: Mutex::new(None),
            watch_thread: Mutex::new(Some(watch_thread)),
        };
        let caught_up = engine
            .core
            .applied
            .wait(catch_up_to, engine.core.config.request_timeout);
        if !caught_up {
            return Err(Error::Timeout);
        }
        // Lease clocks restart now: a restart can delay expiry, never hasten it.
        engine.core.state.write().lessor.restart_clocks();
        if let Some(every) = engine.core.config.lease_check_interval {
            let core = engine.core.clone();
            let thread = thread::start_stoppable("cairn-lease-check", move |stop| checker_loop(core, stop, every))?;
            *engine.checker.lock() = Some(thread);
        }
        engine.agree_alone();
        Ok(engine)
    }

    /// The directory the engine lives in.
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Stops accepting writes, lets every queued one finish, and syncs the log.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// Stops the threads, checkpoints and closes the log. A thread that panicked is the error
    /// (after everything else is done), unless closing failed first.
    fn shutdown(&self) -> Result<()> {
        let mut panicked = Ok(());
        for stopper in [&self.checker, &self.watch_thread] {
            if let Some(thread) = stopper.lock().take() {
                panicked = panicked.and(thread.stop());
            }
        }
        let replica = self.core.replica.lock().take();
        let Some(Replica { node, wal }) = replica else {
            return panicked;
        };
        // The node stops first; the apply thread then applies what it was handed and ends.
        panicked = panicked.and(node.stop());
        if let Some(t) = self.apply_thread.lock().take() {
            panicked = panicked.and(t.join().and_then(|checkpointer| checkpointer));
        }
        // Proposals never committed: their callers get `Closed`.
        self.core.waiters.clear();
        // Everything queued is applied: checkpoint it, so the next open replays nothing.
        checkpoint_and_release(
            &self.core.dir,
            &mut self.core.state.write(),
            &wal,
            &self.core.checkpointing,
        )?;
        match Arc::try_unwrap(wal) {
            Ok(wal) => wal.close()?,
            Err(shared) => {
                shared.sync()?.wait()?;
            }
        }
        panicked
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
