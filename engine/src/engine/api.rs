//! What an [`Engine`] does: etcd's KV requests (reads and writes), watches, compaction and the
//! engine's status, and the handles to the rest (`leases()`, `members()`, `maintenance()`,
//! `server()`). Each method's work is in the file named for its concern; this file is the
//! face, in one place.

use super::handle::Engine;
use super::leases::Leases;
use super::maintenance::Maintenance;
use super::members::{Inbox, Members};
use super::propose::{Applied, Pending};
use super::server::ServerHooks;
use super::status::EngineStatus;
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{DeleteRangeRequest, PutRequest, TxnRequest, TxnResponse};
use crate::kv::write::{write, WriteRequest};
use crate::request::{Request, Response};
use crate::watch::hub::{Wake, WatchRequest};
use crate::watch::stream::{Watch, WatchGroup};

impl Engine {
    /// The current key-value at `key`, if there is one (a linearizable read).
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<crate::KeyValue>> {
        let found = self.range(&RangeRequest::key(key.as_ref()))?;
        Ok(found.kvs.into_iter().next())
    }

    /// Every current key-value whose key starts with `prefix`, in key order (a linearizable
    /// read).
    pub fn get_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<crate::KeyValue>> {
        Ok(self.range(&RangeRequest::prefix(prefix.as_ref()))?.kvs)
    }

    /// Puts `value` at `key`, and returns the store's revision after it (a convenience over
    /// [`Engine::write`] of a [`PutRequest`]).
    pub fn put(&self, key: impl AsRef<[u8]>, value: impl Into<bytes::Bytes>) -> Result<i64> {
        Ok(self.write(PutRequest::new(key.as_ref(), value))?.revision)
    }

    /// Deletes `key`; whether it existed (a convenience over [`Engine::write`] of a
    /// [`DeleteRangeRequest`]).
    pub fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        Ok(self.write(DeleteRangeRequest::key(key.as_ref()))?.response.deleted > 0)
    }

    /// Applies one of etcd's write requests through the log: a [`PutRequest`], a
    /// [`DeleteRangeRequest`] or a [`TxnRequest`] (every txn, a read-only one too; [`Engine::txn`]
    /// answers those without the log). Blocks until it is applied, or fails with
    /// [`Error::Timeout`] after `Config::request_timeout`.
    ///
    /// A write takes its request by value (it moves into the log); a read borrows it.
    pub fn write<W: WriteRequest>(&self, request: W) -> Result<Applied<W::Response>> {
        self.write_async(request)?.wait()
    }

    /// [`Engine::write`] for async code: logs the request now, and the returned [`Pending`]
    /// can be awaited (or waited on).
    pub fn write_async<W: WriteRequest>(&self, request: W) -> Result<Pending<Applied<W::Response>>> {
        request.check(self.core.config.max_txn_ops)?;
        write(&self.core, request, None)
    }

    /// Runs a transaction (etcd's `Txn`). A read-only one ([`TxnRequest::is_read_only`]) is
    /// answered from this member's state, as etcd does, after the read barrier unless every
    /// op is a serializable range ([`TxnRequest::is_serializable`]); any other goes through
    /// the log ([`Engine::write`]).
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        request.check(self.core.config.max_txn_ops)?;
        if request.is_read_only() {
            return self.core.read_txn(&request);
        }
        write(&self.core, request, None)?.wait()
    }

    /// [`Engine::txn`] of a read-only txn, for async code: no thread waits for the read
    /// barrier, which fails after `Config::request_timeout` ([`Engine::read_barrier_async`]).
    /// Fails with [`Error::Misuse`] if the txn writes (use [`Engine::write_async`]).
    pub async fn read_txn_async(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        request.check(self.core.config.max_txn_ops)?;
        self.core.read_txn_async(request).await
    }

    /// Reads a key or range (etcd's `Range`), concurrently with other reads. Linearizable
    /// unless `request.serializable`: it first waits for a ReadIndex round (shared with the
    /// other reads in flight) and for this member to apply up to it; a serializable read is
    /// served from the local state at once.
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        request.validate()?;
        self.core.range(request)
    }

    /// [`Engine::range`] for async code: no thread waits for the read barrier, and a
    /// linearizable read is answered within `Config::request_timeout` like the blocking call.
    pub async fn range_async(&self, request: &RangeRequest) -> Result<RangeResponse> {
        request.validate()?;
        self.core.range_async(request).await
    }

    /// Waits until this member has applied everything committed when it was called: what it
    /// reads next is linearizable (a ReadIndex round, shared with concurrent reads).
    pub fn read_barrier(&self) -> Result<()> {
        self.core.read_barrier()
    }

    /// [`Engine::read_barrier`] for async code, without a thread waiting. It fails with
    /// [`Error::Timeout`] after `Config::request_timeout` (checked every 100 ms), as the
    /// blocking call does, whatever raft drops.
    pub async fn read_barrier_async(&self) -> Result<()> {
        self.core.read_barrier_async().await
    }

    /// Drops history below `revision` (etcd's `Compact`).
    pub fn compact(&self, revision: i64) -> Result<Applied<()>> {
        match self.core.propose(Request::Compact { revision })? {
            (Response::Compact, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::internal(format!("compact answered with {other:?}"))),
        }
    }

    /// etcd's Maintenance service: defragmentation, snapshots, alarms, HashKV, and the
    /// periodic chores (checkpoints, watch progress) run on demand.
    pub fn maintenance(&self) -> Maintenance<'_> {
        Maintenance::new(&self.core)
    }

    /// etcd's Lease service: grant, revoke, keep-alive, time-to-live, and expiry on demand.
    pub fn leases(&self) -> Leases<'_> {
        Leases::new(&self.core)
    }

    /// A handle that delivers messages to this member without holding the engine (for a
    /// transport's receiving side).
    pub fn inbox(&self) -> Result<Inbox> {
        Inbox::new(&self.core)
    }

    /// etcd's Cluster service: the group's members, and changes to them.
    pub fn members(&self) -> Members<'_> {
        Members::new(&self.core)
    }

    /// What a process serving this member needs beyond the embedded API (see
    /// [`ServerHooks`]).
    pub fn server(&self) -> ServerHooks<'_> {
        ServerHooks::new(&self.core)
    }

    /// What this member knows of itself now. One read of the state and one of the watchers:
    /// cheap, but not free; [`Engine::leader`], [`Engine::member_id`] and
    /// [`Engine::current_revision`] are the ones to call on every request.
    pub fn status(&self) -> EngineStatus {
        EngineStatus::read(&self.core)
    }

    /// The leader this member knows of, if any (one atomic read).
    pub fn leader(&self) -> Option<u64> {
        self.core.leader()
    }

    /// This member's ID.
    pub fn member_id(&self) -> u64 {
        self.core.member_id
    }

    /// The store's current revision: the last applied batch's (no lock).
    pub fn current_revision(&self) -> i64 {
        self.core.revision.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Watches a key or range from `start_revision` (etcd's `Watch`). Past revisions are
    /// replayed from history, then changes follow as they are applied.
    /// An empty key means `"\0"`, as in etcd (with `range_end` `"\0"`: every key).
    pub fn watch(&self, request: &WatchRequest) -> Result<Watch> {
        Watch::new(&self.core.hub, &self.core.state, request)
    }

    /// A new, empty [`WatchGroup`]; `wake` is called after each delivery is queued for it.
    /// `wake` runs on the engine's threads, under its locks: it must only signal, never block.
    pub fn watch_group(&self, wake: Option<Wake>) -> WatchGroup {
        WatchGroup::new(&self.core.hub, &self.core.state, wake)
    }
}
