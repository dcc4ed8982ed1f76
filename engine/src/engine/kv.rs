//! etcd's KV service on the engine: put, delete_range and txn through the log, and range and
//! read-only txns from the local state, linearizable (after a read barrier) unless
//! serializable. Reads and the barrier come blocking or async (no thread waits).

use std::time::Instant;

use super::propose::Pending;
use super::{Engine, Inner};
use crate::consensus::node::Input;
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};
use crate::request::{Request, Response};

/// A response with the store's revision after the request (etcd's `header.revision`).
#[derive(Clone, Debug, PartialEq, Eq)]
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

fn unexpected(what: &str, answer: Response) -> Error {
    Error::internal(format!("{what} answered with {answer:?}"))
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

    /// Puts a key (etcd's `Put`).
    pub fn put(&self, request: PutRequest) -> Result<Applied<PutResponse>> {
        self.put_async(request)?.wait()
    }

    /// [`Engine::put`] for async code: logs the request now, and the returned [`Pending`]
    /// can be awaited (or waited on).
    pub fn put_async(&self, request: PutRequest) -> Result<Pending<Applied<PutResponse>>> {
        self.put_async_as(request, None)
    }

    /// [`Engine::put_async`] permitted at auth revision `guard`: refused with
    /// [`crate::AuthError::OldRevision`] if the auth store changed before it is applied.
    pub fn put_async_as(&self, request: PutRequest, guard: Option<u64>) -> Result<Pending<Applied<PutResponse>>> {
        request.validate()?;
        self.inner
            .check_quota(crate::mvcc::store::record_size(request.key.len(), request.value.len()))?;
        let rx = self.inner.submit(guarded(Request::Put(request), guard))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Put(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("put", other)),
        }))
    }

    /// Deletes a key or range (etcd's `DeleteRange`).
    pub fn delete_range(&self, request: DeleteRangeRequest) -> Result<Applied<DeleteRangeResponse>> {
        self.delete_range_async(request)?.wait()
    }

    /// [`Engine::delete_range`] for async code.
    pub fn delete_range_async(&self, request: DeleteRangeRequest) -> Result<Pending<Applied<DeleteRangeResponse>>> {
        self.delete_range_async_as(request, None)
    }

    /// [`Engine::delete_range_async`] permitted at auth revision `guard`.
    pub fn delete_range_async_as(
        &self,
        request: DeleteRangeRequest,
        guard: Option<u64>,
    ) -> Result<Pending<Applied<DeleteRangeResponse>>> {
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let rx = self.inner.submit(guarded(Request::DeleteRange(request), guard))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::DeleteRange(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("delete", other)),
        }))
    }

    /// Runs a transaction (etcd's `Txn`). A read-only one ([`TxnRequest::is_read_only`]) is
    /// answered from this member's state, as etcd does, after the read barrier unless every
    /// op is a serializable range ([`TxnRequest::is_serializable`]); any other goes through
    /// the log.
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        if request.is_read_only() {
            request.validate(self.inner.config.max_txn_ops)?;
            if !request.is_serializable() {
                self.inner.read_barrier()?;
            }
            return self.read_txn_locally(&request);
        }
        self.txn_async(request)?.wait()
    }

    /// [`Engine::txn`] of a read-only txn, for async code: no thread waits for the read
    /// barrier, which fails after `Config::request_timeout` ([`Engine::read_barrier_async`]).
    /// Fails with [`Error::Misuse`] if the txn writes (use [`Engine::txn_async`]).
    pub async fn read_txn_async(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        if !request.is_read_only() {
            return Err(Error::Misuse("read_txn_async of a txn that writes: use txn_async"));
        }
        request.validate(self.inner.config.max_txn_ops)?;
        if !request.is_serializable() {
            self.read_barrier_async().await?;
        }
        self.read_txn_locally(request)
    }

    fn read_txn_locally(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        let (response, revision) = request.read(&self.inner.state.read().store)?;
        Ok(Applied { response, revision })
    }

    /// [`Engine::txn`] for async code; every txn goes through the log here, a read-only one
    /// too (correct, but [`Engine::read_txn_async`] answers it without the log).
    pub fn txn_async(&self, request: TxnRequest) -> Result<Pending<Applied<TxnResponse>>> {
        self.txn_async_as(request, None)
    }

    /// [`Engine::txn_async`] permitted at auth revision `guard`.
    pub fn txn_async_as(&self, request: TxnRequest, guard: Option<u64>) -> Result<Pending<Applied<TxnResponse>>> {
        request.validate(self.inner.config.max_txn_ops)?;
        if !request.is_read_only() {
            self.inner.check_quota(request.put_bytes())?;
        }
        let rx = self.inner.submit(guarded(Request::Txn(request), guard))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Txn(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("txn", other)),
        }))
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
            self.inner.read_barrier()?;
        }
        request.apply(&self.inner.state.read().store)
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
        request.apply(&self.inner.state.read().store)
    }

    /// Waits until this member has applied everything committed when it was called: what it
    /// reads next is linearizable (a ReadIndex round, shared with concurrent reads).
    pub fn read_barrier(&self) -> Result<()> {
        self.inner.read_barrier()
    }

    /// [`Engine::read_barrier`] for async code, without a thread waiting. It fails with
    /// [`Error::Timeout`] after `Config::request_timeout` (checked every 100 ms), as the
    /// blocking call does, whatever raft drops.
    pub async fn read_barrier_async(&self) -> Result<()> {
        let deadline = Instant::now() + self.inner.config.request_timeout;
        let index = match self.inner.read_index()? {
            ReadIndex::Known(index) => index,
            ReadIndex::Round(answer) => answer.await.map_err(|_| Error::Closed)??,
        };
        match self.inner.applied.reached(index, deadline) {
            None => Ok(()),
            Some(reached) => reached.await.map_err(|_| Error::Closed)?,
        }
    }

    /// How long a blocking call waits before [`Error::Timeout`] (`Config::request_timeout`):
    /// the deadline to give the async calls that have none of their own.
    pub fn request_timeout(&self) -> std::time::Duration {
        self.inner.config.request_timeout
    }
}

/// The log index a read barrier waits for this member to apply.
enum ReadIndex {
    /// Known at once: everything the sole voter has logged.
    Known(u64),
    /// The answer of a ReadIndex round, still out.
    Round(oneshot::Receiver<Result<u64>>),
}

impl Inner {
    /// Where a read barrier stands: the sole voter needs no round (no other member can have
    /// committed anything, so applying everything in its log makes a read linearizable);
    /// any other member joins a ReadIndex round, batched with the other reads.
    fn read_index(&self) -> Result<ReadIndex> {
        if let Some(index) = self.log.sole_voter_last_index(self.config.member_id) {
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
