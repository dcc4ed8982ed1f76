//! etcd's KV service on the engine: put, delete_range and txn through the log, and range and
//! read-only txns from the local state, linearizable (after a read barrier) unless
//! serializable. Reads and the barrier come blocking or async (no thread waits).

use std::time::Instant;

use super::propose::Pending;
use super::{Core, Engine};
use crate::consensus::interface::Input;
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};
use crate::request::{Request, Response};

/// A response with the store's revision after the request (etcd's `header.revision`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied<T> {
    /// The request's own answer.
    pub response: T,
    /// The store's revision once the request was applied: the new one if it changed
    /// something, else the current one.
    pub revision: i64,
}

/// `request`, guarded by the auth revision it was permitted at, if any.
pub(super) fn guarded(request: Request, guard: Option<u64>) -> Request {
    match guard {
        Some(auth_revision) => Request::Guarded {
            auth_revision,
            request: Box::new(request),
        },
        None => request,
    }
}

/// One of etcd's write requests, for [`Engine::write`]: [`PutRequest`],
/// [`DeleteRangeRequest`] or [`TxnRequest`] (sealed).
pub trait WriteRequest: sealed::Write {}

impl WriteRequest for PutRequest {}
impl WriteRequest for DeleteRangeRequest {}
impl WriteRequest for TxnRequest {}

// The supertrait makes the engine's own types reachable from a public trait, but nothing outside
// the crate can name it, so none can implement or call it.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use super::*;

    /// What [`Engine::write`] does with each kind of request.
    pub trait Write: Sized {
        /// What applying it answers.
        type Response: Unpin;
        /// Checks it before it is logged (etcd's validation, and the quota for what it adds).
        fn admit(&self, core: &Core) -> Result<()>;
        /// The request as logged.
        fn into_request(self) -> Request;
        /// Its answer, or the unexpected one.
        fn answer(response: Response) -> std::result::Result<Self::Response, Response>;
    }

    impl Write for PutRequest {
        type Response = PutResponse;

        fn admit(&self, core: &Core) -> Result<()> {
            self.validate()?;
            core.check_quota(crate::mvcc::store::record_size(self.key.len(), self.value.len()))
        }

        fn into_request(self) -> Request {
            Request::Put(self)
        }

        fn answer(response: Response) -> std::result::Result<PutResponse, Response> {
            match response {
                Response::Put(r) => Ok(r),
                other => Err(other),
            }
        }
    }

    impl Write for DeleteRangeRequest {
        type Response = DeleteRangeResponse;

        fn admit(&self, _: &Core) -> Result<()> {
            if self.key.is_empty() {
                return Err(Error::EmptyKey);
            }
            Ok(())
        }

        fn into_request(self) -> Request {
            Request::DeleteRange(self)
        }

        fn answer(response: Response) -> std::result::Result<DeleteRangeResponse, Response> {
            match response {
                Response::DeleteRange(r) => Ok(r),
                other => Err(other),
            }
        }
    }

    impl Write for TxnRequest {
        type Response = TxnResponse;

        fn admit(&self, core: &Core) -> Result<()> {
            self.validate(core.config.max_txn_ops)?;
            if !self.is_read_only() {
                core.check_quota(self.put_bytes())?;
            }
            Ok(())
        }

        fn into_request(self) -> Request {
            Request::Txn(self)
        }

        fn answer(response: Response) -> std::result::Result<TxnResponse, Response> {
            match response {
                Response::Txn(r) => Ok(r),
                other => Err(other),
            }
        }
    }
}

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
        self.write_async_as(request, None)
    }

    /// [`Engine::write_async`] permitted at auth revision `guard`: refused with
    /// [`crate::AuthError::OldRevision`] if the auth store changed before it is applied.
    pub fn write_async_as<W: WriteRequest>(
        &self,
        request: W,
        guard: Option<u64>,
    ) -> Result<Pending<Applied<W::Response>>> {
        request.admit(&self.core)?;
        let rx = self.core.submit(guarded(request.into_request(), guard))?;
        Ok(Pending::new(rx, |(response, revision)| match W::answer(response) {
            Ok(response) => Ok(Applied { response, revision }),
            Err(other) => Err(Error::internal(format!("a write answered with {other:?}"))),
        }))
    }

    /// Runs a transaction (etcd's `Txn`). A read-only one ([`TxnRequest::is_read_only`]) is
    /// answered from this member's state, as etcd does, after the read barrier unless every
    /// op is a serializable range ([`TxnRequest::is_serializable`]); any other goes through
    /// the log ([`Engine::write`]).
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        if request.is_read_only() {
            request.validate(self.core.config.max_txn_ops)?;
            if !request.is_serializable() {
                self.core.read_barrier()?;
            }
            return self.read_txn_locally(&request);
        }
        self.write(request)
    }

    /// [`Engine::txn`] of a read-only txn, for async code: no thread waits for the read
    /// barrier, which fails after `Config::request_timeout` ([`Engine::read_barrier_async`]).
    /// Fails with [`Error::Misuse`] if the txn writes (use [`Engine::write_async`]).
    pub async fn read_txn_async(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        if !request.is_read_only() {
            return Err(Error::Misuse("read_txn_async of a txn that writes: use write_async"));
        }
        request.validate(self.core.config.max_txn_ops)?;
        if !request.is_serializable() {
            self.read_barrier_async().await?;
        }
        self.read_txn_locally(request)
    }

    fn read_txn_locally(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        let st = self.core.state.read();
        st.check_readable(self.member_id())?;
        let (response, revision) = request.read(&st.store)?;
        Ok(Applied { response, revision })
    }

    /// Reads a key or range (etcd's `Range`), concurrently with other reads. Linearizable
    /// unless `request.serializable`: it first waits for a ReadIndex round (shared with the
    /// other reads in flight) and for this member to apply up to it; a serializable read is
    /// served from the local state at once.
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if !request.serializable {
            self.core.read_barrier()?;
        }
        let st = self.core.state.read();
        st.check_readable(self.member_id())?;
        request.apply(&st.store)
    }

    /// [`Engine::range`] for async code: no thread waits for the read barrier, and a
    /// linearizable read is answered within `Config::request_timeout` like the blocking call.
    pub async fn range_async(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if !request.serializable {
            self.read_barrier_async().await?;
        }
        let st = self.core.state.read();
        st.check_readable(self.member_id())?;
        request.apply(&st.store)
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
        let deadline = Instant::now() + self.core.config.request_timeout;
        let index = match self.core.read_index()? {
            ReadIndex::Known(index) => index,
            ReadIndex::Round(answer) => answer.await.map_err(|_| Error::Closed)??,
        };
        match self.core.applied.reached(index, deadline) {
            None => Ok(()),
            Some(reached) => reached.await.map_err(|_| Error::Closed)?,
        }
    }

    /// How long a blocking call waits before [`Error::Timeout`] (`Config::request_timeout`):
    /// the deadline to give the async calls that have none of their own.
    pub fn request_timeout(&self) -> std::time::Duration {
        self.core.config.request_timeout
    }
}

/// The log index a read barrier waits for this member to apply.
enum ReadIndex {
    /// Known at once: everything the sole voter has logged.
    Known(u64),
    /// The answer of a ReadIndex round, still out.
    Round(oneshot::Receiver<Result<u64>>),
}

impl Core {
    /// Where a read barrier stands: the sole voter needs no round (no other member can have
    /// committed anything, so applying everything in its log makes a read linearizable);
    /// any other member joins a ReadIndex round, batched with the other reads.
    fn read_index(&self) -> Result<ReadIndex> {
        if let Some(index) = self.log.sole_voter_last_index(self.member_id) {
            return Ok(ReadIndex::Known(index));
        }
        let (reply, answer) = oneshot::channel();
        self.node_tx()?
            .send(Input::ReadIndex { reply })
            .map_err(|_| Error::Closed)?;
        Ok(ReadIndex::Round(answer))
    }

    /// Waits until this member has applied everything committed when the read started, so
    /// that a read after it is linearizable.
    pub(super) fn read_barrier(&self) -> Result<()> {
        let timeout = self.config.request_timeout;
        let index = match self.read_index()? {
            ReadIndex::Known(index) => index,
            ReadIndex::Round(answer) => match answer.recv_timeout(timeout) {
                Ok(index) => index?,
                Err(oneshot::RecvTimeoutError::Timeout) => return Err(Error::Timeout),
                Err(oneshot::RecvTimeoutError::Disconnected) => return Err(Error::Closed),
            },
        };
        if self.applied.wait(index, timeout) {
            Ok(())
        } else {
            Err(Error::Timeout)
        }
    }
}
