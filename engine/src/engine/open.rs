//! Opening an engine, in order: the state recovered from the checkpoint, the data files and
//! the log ([`recover`]); a new group's membership written as its first entries
//! ([`bootstrap`]); then, in `Engine::start`, everything the threads share built, the threads
//! started, and what the member knew committed applied before it returns
//! ([`catch_up_target`]).

use std::path::Path;
use std::sync::Arc;

use cairn_wal::Wal;

use super::builder::Identity;
use super::State;
use crate::backend::DATA_DIR;
use crate::config::Config;
use crate::consensus::log::RaftLog;
use crate::error::{Error, Failure, Result};
use crate::format::checkpoint;
use crate::mvcc::store::Store;

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
    let store = Store::open(
        &dir.join(DATA_DIR),
        config.data_file_size,
        checkpoint.as_ref().map(|c| &c.store),
    )?;
    let mut state = State::new(store, config);
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
        state.lessor.apply_changes(&state.store.leased_keys()?);
        state.alarms = c.alarms.into_iter().collect();
        state.auth = c.auth;
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
