//! [`ServerHooks`]: what a process serving a member needs beyond the embedded API (the `cairn`
//! server, or an application that runs a group through a [`crate::Transport`] of its own):
//! writes guarded by an auth revision, the auth store and its simple tokens, the versions the
//! members agree, per-request gauges read without a lock, and the WAL's metrics.

use std::sync::atomic::Ordering;

use super::core::Core;
use super::propose::{guarded, Applied, Pending};
use crate::auth::{AuthChange, AuthStore};
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{TxnRequest, TxnResponse};
use crate::kv::write::{write, WriteRequest};
use crate::request::{Request, Response};
use crate::version::{ClusterVersions, Version};

/// What a server of the member needs ([`Engine::server`](crate::Engine::server)); an embedder never does.
#[derive(Clone, Copy, Debug)]
pub struct ServerHooks<'a> {
    core: &'a Core,
}

impl<'a> ServerHooks<'a> {
    pub(super) fn new(core: &'a Core) -> ServerHooks<'a> {
        ServerHooks { core }
    }

    /// [`Engine::write_async`](crate::Engine::write_async) of a request the server checked
    /// at its edge ([`WriteRequest::check`]), permitted at auth revision `guard`: refused with
    /// [`crate::AuthError::OldRevision`] if the auth store changed before it is applied.
    pub fn write_async_as<W: WriteRequest>(
        &self,
        request: W,
        guard: Option<u64>,
    ) -> Result<Pending<Applied<W::Response>>> {
        write(self.core, request, guard)
    }

    /// [`Engine::range_async`](crate::Engine::range_async) of a request the server checked at
    /// its edge ([`RangeRequest::validate`]).
    pub async fn range_async(&self, request: &RangeRequest) -> Result<RangeResponse> {
        self.core.range_async(request).await
    }

    /// [`Engine::read_txn_async`](crate::Engine::read_txn_async) of a request the server
    /// checked at its edge ([`WriteRequest::check`]).
    pub async fn read_txn_async(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        self.core.read_txn_async(request).await
    }

    /// Revokes lease `id`, permitted at auth revision `guard` (see
    /// [`crate::Leases::revoke`]).
    pub fn lease_revoke_as(&self, id: i64, guard: Option<u64>) -> Result<Applied<()>> {
        super::leases::revoke(self.core, id, guard)
    }

    /// Reads this member's auth store (for permission checks and the read-only auth RPCs):
    /// `read` runs under the state's read lock, so keep it short.
    pub fn auth_read<R>(&self, read: impl FnOnce(&AuthStore) -> R) -> R {
        read(&self.core.state.read().auth)
    }

    /// Whether auth is enabled, and the auth store's revision.
    pub fn auth_status(&self) -> (bool, u64) {
        self.core.auth_status.get()
    }

    /// Changes the auth store through the log; `guard` as for
    /// [`ServerHooks::write_async_as`] (the caller checked the admin permission at that
    /// revision).
    pub fn auth_change_async(&self, change: AuthChange, guard: Option<u64>) -> Result<Pending<Applied<()>>> {
        let rx = self.core.submit(guarded(Request::Auth(change), guard))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Auth, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::internal(format!("auth change answered with {other:?}"))),
        }))
    }

    /// Registers a simple token for `name` on every member, through the log: its password was
    /// checked at auth revision `checked_revision`, and the token is `prefix`, a dot, and its
    /// entry's index.
    pub fn authenticate_async(&self, name: String, prefix: String, checked_revision: u64) -> Result<Pending<String>> {
        let request = Request::Authenticate {
            name,
            prefix,
            checked_revision,
        };
        let rx = self.core.submit(request)?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Authenticated { token }, _) => Ok(token),
            (other, _) => Err(Error::internal(format!("authenticate answered with {other:?}"))),
        }))
    }

    /// The user a simple token names, if this member knows it and it is live (its TTL
    /// slides).
    pub fn resolve_token(&self, token: &str) -> Option<String> {
        self.core.state.read().tokens.lock().resolve(token)
    }

    /// Waits, up to the request timeout, until this member has applied log index `index` (a
    /// simple token names the index of its entry: a member that has not applied it yet waits
    /// for it, as etcd's members do, instead of refusing the token).
    pub async fn applied_async(&self, index: u64) -> Result<()> {
        let deadline = std::time::Instant::now() + self.core.config.request_timeout;
        match self.core.applied.reached(index, deadline) {
            None => Ok(()),
            Some(reached) => reached.await.map_err(|_| Error::Closed)?,
        }
    }

    /// The keys attached to lease `id` (none if it does not exist), for permission checks.
    pub fn lease_keys(&self, id: i64) -> Vec<bytes::Bytes> {
        self.core.state.read().lessor.keys(id).unwrap_or_default()
    }

    /// Records this member's name and client URLs in the group (what an etcd member publishes
    /// when it starts); returns once applied here.
    pub fn member_publish(&self, name: String, client_urls: Vec<String>) -> Result<()> {
        let id = self.core.member_id;
        self.core
            .propose(Request::MemberPublish { id, name, client_urls })
            .map(|_| ())
    }

    /// The versions agreed, as applied here. Their cluster version is also the storage
    /// version: the forms this member's state, and its next checkpoint, are written in.
    pub fn versions(&self) -> ClusterVersions {
        self.core.state.read().versions
    }

    /// Proposes `version` as the cluster version; returns once applied here. Propose only a
    /// version every member runs at least (the leader's version monitor decides it), or the
    /// target of an enabled downgrade.
    pub fn set_cluster_version(&self, version: Version) -> Result<()> {
        self.core.propose(Request::ClusterVersion(version)).map(|_| ())
    }

    /// Enables a downgrade to `target` (etcd's `downgrade enable`), or ends one (`None`:
    /// cancelled, or every member runs the target); returns once applied here.
    pub fn set_downgrade(&self, target: Option<Version>) -> Result<()> {
        self.core.propose(Request::Downgrade { target }).map(|_| ())
    }

    /// How long a blocking call waits before [`Error::Timeout`] (`Config::request_timeout`):
    /// the deadline to give the async calls that have none of their own.
    pub fn request_timeout(&self) -> std::time::Duration {
        self.core.config.request_timeout
    }

    /// The current Raft term, as this member knows it (one atomic read).
    pub fn term(&self) -> u64 {
        self.core.status.term.load(Ordering::Relaxed)
    }

    /// How many committed log entries this member has not applied yet (etcd refuses writes
    /// while this is large). Cheap enough for every request: no state lock.
    pub fn apply_lag(&self) -> u64 {
        let committed = self.core.log.committed();
        committed.saturating_sub(self.core.applied.get())
    }

    /// Whether this member is a learner (it receives the log without voting), as far as the
    /// membership it has applied says; without taking any lock.
    pub fn is_learner(&self) -> bool {
        self.core.status.learner.load(Ordering::Relaxed)
    }

    /// The WAL's counters and latency histograms (fsyncs, group-commit batches), for metrics.
    pub fn wal_stats(&self) -> Result<cairn_wal::StatsSnapshot> {
        Ok(self.core.wal()?.stats())
    }

    /// How long checkpoints took to write (data files synced, checkpoint file written and
    /// synced), in microseconds: etcd's backend commit, for metrics.
    pub fn checkpoint_latency_us(&self) -> cairn_wal::Distribution {
        self.core.checkpointing.latency_us.lock().clone()
    }
}
