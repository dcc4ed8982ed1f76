//! Opening an engine, in order: the state recovered from the checkpoint, the data files and
//! the log ([`recover`]); a new group's membership written as its first entries
//! ([`bootstrap`]); then, in `Engine::start`, everything the threads share built, the threads
//! started, and what the member knew committed applied before it returns
//! ([`catch_up_target`]).

use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use cairn_wal::Wal;
use crossbeam_channel::bounded;
use parking_lot::{Mutex, RwLock};

use super::apply::{ApplyThread, Applying, Handoff, Publisher};
use super::builder::Identity;
use super::checkpointing::Checkpointing;
use super::core::{Core, Replica};
use super::handle::Engine;
use super::leases::checker_loop;
use super::maintenance::write_snapshot;
use super::progress::AppliedIndex;
use super::state::State;
use crate::backend::DATA_DIR;
use crate::config::Config;
use crate::consensus::interface::{NodeConfig, Status, Transport};
use crate::consensus::log::RaftLog;
use crate::consensus::node::{NodeHandle, NodeParts};
use crate::error::{Error, Failure, Result};
use crate::format::checkpoint;
use crate::mvcc::saved_index::SavedAt;
use crate::mvcc::store::Store;
use crate::thread;
use crate::watch::feed::{watch_loop, WatchThread, FEED_DEPTH};
use crate::watch::hub::WatchHub;

/// What opening recovered: the state as of the checkpoint, and the log after it, in memory
/// and in the WAL (open for writing).
pub(super) struct Recovered {
    pub(super) state: State,
    pub(super) log: RaftLog,
    pub(super) wal: Arc<Wal>,
}

/// Reads the checkpoint, opens the data files it names, and replays the WAL into the Raft
/// log. The WAL locks the directory: nothing here runs in two processes at once.
pub(super) fn recover(dir: &Path, config: &Config) -> Result<Recovered> {
    let wal_dir = config.wal_dir.clone().unwrap_or_else(|| dir.join("wal"));
    let mut replay = Wal::open(wal_dir, config.wal.clone())?;
    let checkpoint = checkpoint::read(dir)?;
    let opened = Store::open(
        &dir.join(DATA_DIR),
        config.data_file_size,
        checkpoint.as_ref().map(|c| &c.store),
        checkpoint.as_ref().map(|c| SavedAt { dir, epoch: c.epoch }),
    )?;
    if opened.from_saved_index {
        tracing::info!(
            keys = opened.store.key_count(),
            "opened the store from its saved key index"
        );
    }
    let mut state = State::new(opened.store, config);
    if let Some(c) = checkpoint {
        let (storage, release) = (c.versions.cluster(), crate::version::Version::release());
        if storage > release {
            return Err(Error::Checkpoint(Failure::new(format!(
                "the data was written by cairn {storage} (its storage version); this is cairn {}, \
                 which cannot read it: downgrade the cluster to {release} first (etcdctl downgrade enable {release})",
                crate::version::RELEASE
            ))));
        }
        state.versions = c.versions;
        state.lessor.load(c.leases);
        state.lessor.apply_changes(&opened.leased);
        state.alarms = c.alarms.into_iter().collect();
        state.auth = c.auth;
        state.auth_status.mirror(&state.auth);
        state.applied_index = c.applied_index;
        state.applied_term = c.applied_term;
        state.membership = c.membership;
        state.recent = c.recent;
        state.epoch = c.epoch;
    }
    // The Raft log after the checkpoint; the entries committed in it are applied by the
    // apply thread once the node hands them over, before `open` returns.
    let log = RaftLog::new(
        state.applied_index,
        state.applied_term,
        state.membership.to_conf_state(),
    );
    for record in replay.by_ref() {
        log.replay(record?)?;
    }
    log.finish_replay(config.snapshot_catch_up_entries);
    state.store.release_pages();
    let wal = Arc::new(replay.finish()?);
    Ok(Recovered { state, log, wal })
}

/// A new group's first entries add its members (this one alone, for a group of one); a
/// member joining a running group, or one with data, writes none.
pub(super) fn bootstrap(state: &State, log: &RaftLog, wal: &Wal, identity: &Identity) -> Result<()> {
    let member_id = identity.member_id;
    if state.applied_index == 0 && log.last_index() == 0 && !identity.join_existing {
        let members = if identity.peers.is_empty() {
            vec![member_id]
        } else {
            identity.peers.clone()
        };
        crate::consensus::log::bootstrap(log, wal, &members, &identity.attributes)?;
    }
    Ok(())
}

/// `EngineBuilder::force_new_cluster`: a member with data made a group of one (see
/// [`crate::consensus::log::force_new_cluster`]); a member without data starts as any new one.
pub(super) fn force_new_cluster(state: &State, log: &RaftLog, wal: &Wal, identity: &Identity) -> Result<()> {
    if !identity.force_new_cluster || (state.applied_index == 0 && log.last_index() == 0) {
        return Ok(());
    }
    let m = &state.membership;
    let known: Vec<u64> = m.voters.iter().chain(&m.learners).copied().collect();
    crate::consensus::log::force_new_cluster(log, wal, identity.member_id, &known)
}

/// The log index opening must apply before it returns.
pub(super) fn catch_up_target(state: &State, log: &RaftLog, identity: &Identity) -> u64 {
    let member_id = identity.member_id;
    let single = if log.last_index() > state.applied_index && state.membership.voters.is_empty() {
        // A new group: its members are in its first entries.
        !identity.join_existing && (identity.peers.is_empty() || identity.peers == [member_id])
    } else {
        state.membership.voters == [member_id] && state.membership.learners.is_empty()
    };
    // A group of one is leader again at once and commits everything in its log with the
    // empty entry of its new term (so leases have restarted their clocks by then too); a
    // member of a bigger group knows only what was committed before it stopped.
    if single {
        log.last_index() + 1
    } else {
        log.hard_state().commit
    }
}

impl Engine {
    /// Opens (or creates) a group of one in `dir`, recovering everything its log holds:
    /// `Engine::builder(dir).config(config).open()`.
    pub fn open(dir: impl AsRef<Path>, config: Config) -> Result<Engine> {
        Engine::builder(dir).config(config).open()
    }

    pub(super) fn start(
        dir: &Path,
        config: Config,
        identity: Identity,
        transport: Arc<dyn Transport>,
    ) -> Result<Engine> {
        let member_id = identity.member_id;
        // Every log event of this member, from its threads too (each enters the span it was
        // started in), names the member.
        let _member = tracing::info_span!("member", id = %format_args!("{member_id:x}")).entered();
        config.validate()?;
        let dir = dir.to_path_buf();
        let Recovered { state, log, wal } = recover(&dir, &config)?;
        bootstrap(&state, &log, &wal, &identity)?;
        force_new_cluster(&state, &log, &wal, &identity)?;
        let catch_up_to = catch_up_target(&state, &log, &identity);
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
        let revision = state.store.current_revision();
        let auth_status = state.auth_status.clone();
        let core = Arc::new(Core {
            checkpointing: Arc::new(Checkpointing {
                newest: Mutex::new((state.applied_index, state.epoch)),
                catch_up: config.snapshot_catch_up_entries,
                latency_us: Mutex::new(cairn_wal::Distribution::default()),
                saved_index_bytes: config.saved_index_bytes,
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
            revision: AtomicI64::new(revision),
            auth_status,
            member_id,
            dir,
            config,
        });
        let (feed, fed) = bounded(FEED_DEPTH);
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
}
