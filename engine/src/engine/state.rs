//! What requests change ([`State`]): the store, the lessor, the alarms, the auth store and the
//! membership, always together, at one applied index.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::consensus::RecentRequests;
use crate::error::{Error, Result};
use crate::lease::lessor::Lessor;
use crate::membership::Membership;
use crate::mvcc::store::Store;
use crate::request::Alarm;

/// What requests change: the store, the lessor and the alarms, always together.
pub(crate) struct State {
    pub(crate) store: Store,
    pub(super) lessor: Lessor,
    /// The raised alarms, by member (etcd's `AlarmMember`s).
    pub(super) alarms: std::collections::BTreeSet<(u64, Alarm)>,
    /// Users, roles and permissions.
    pub(super) auth: crate::auth::AuthStore,
    /// Whether `auth` is enabled, and its revision, stored whenever either changes (under the
    /// state's write lock): every request's permission check reads them without the lock.
    pub(super) auth_status: Arc<AuthStatus>,
    /// The versions the members agreed (`crate::version`).
    pub(super) versions: crate::version::ClusterVersions,
    /// Simple tokens, registered as their entries are applied (not persisted).
    pub(super) tokens: Mutex<crate::auth::tokens::SimpleTokens>,
    /// The last log index applied. Invariant: the state is exactly the log up to here.
    pub(super) applied_index: u64,
    /// The term of the entry at `applied_index`.
    pub(super) applied_term: u64,
    /// The group's membership as of `applied_index`.
    pub(super) membership: Membership,
    /// The request IDs of the last entries applied (each request is applied once).
    pub(super) recent: RecentRequests,
    /// Defragmentations and installed snapshots so far (see `format::checkpoint`).
    pub(super) epoch: u64,
    /// Snapshots from the leader installed since open: a snapshot being taken of the old
    /// state cannot go on reading the new one.
    pub(super) installs: u64,
}

/// An auth store's enabled flag and revision in one word, read without a lock (see
/// [`State::auth_status`]): the top bit says enabled, the rest is the revision, so the two are
/// always read as one store left them.
#[derive(Debug, Default)]
pub(crate) struct AuthStatus(AtomicU64);

const AUTH_ENABLED: u64 = 1 << 63;

impl AuthStatus {
    fn of(auth: &crate::auth::AuthStore) -> AuthStatus {
        let status = AuthStatus::default();
        status.mirror(auth);
        status
    }

    /// Stores `auth`'s status; called under the lock of the state that holds it.
    pub(super) fn mirror(&self, auth: &crate::auth::AuthStore) {
        let enabled = if auth.enabled() { AUTH_ENABLED } else { 0 };
        self.0
            .store(enabled | (auth.revision() & !AUTH_ENABLED), Ordering::Release);
    }

    /// Whether auth is enabled, and the auth store's revision.
    pub(crate) fn get(&self) -> (bool, u64) {
        let word = self.0.load(Ordering::Acquire);
        (word & AUTH_ENABLED != 0, word & !AUTH_ENABLED)
    }
}

impl State {
    /// The state of `store` before anything is applied: membership, leases, alarms and users
    /// come from a checkpoint, or from the log (a new group's first entries add its members).
    pub(super) fn new(store: Store, config: &Config) -> State {
        State {
            store,
            lessor: Lessor::new(config.min_lease_ttl, config.clock.clone()),
            alarms: Default::default(),
            auth: Default::default(),
            auth_status: Arc::new(AuthStatus::of(&crate::auth::AuthStore::default())),
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
    pub(super) fn check_readable(&self, me: u64) -> Result<()> {
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
    pub(super) fn empty(applied: u64) -> State {
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
