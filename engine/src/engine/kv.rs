//! etcd's KV service on the engine: put, delete_range and txn through the log, and range,
//! linearizable (after a ReadIndex round) unless serializable.

use crossbeam_channel::{bounded, RecvTimeoutError};

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

fn unexpected(what: &str, answer: Response) -> Error {
    Error::Internal(format!("{what} answered with {answer:?}"))
}

impl Engine {
    /// Puts a key (etcd's `Put`).
    pub fn put(&self, request: PutRequest) -> Result<Applied<PutResponse>> {
        self.put_async(request)?.wait()
    }

    /// [`Engine::put`] for async code: logs the request now, and the returned [`Pending`]
    /// can be awaited (or waited on).
    pub fn put_async(&self, request: PutRequest) -> Result<Pending<Applied<PutResponse>>> {
        request.validate()?;
        self.inner
            .check_quota(crate::mvcc::store::record_size(request.key.len(), request.value.len()))?;
        let rx = self.inner.submit(Request::Put(request))?;
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
        if request.key.is_empty() {
            return Err(Error::EmptyKey);
        }
        let rx = self.inner.submit(Request::DeleteRange(request))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::DeleteRange(response), revision) => Ok(Applied { response, revision }),
            (other, _) => Err(unexpected("delete", other)),
        }))
    }

    /// Runs a transaction (etcd's `Txn`).
    pub fn txn(&self, request: TxnRequest) -> Result<Applied<TxnResponse>> {
        self.txn_async(request)?.wait()
    }

    /// [`Engine::txn`] for async code.
    pub fn txn_async(&self, request: TxnRequest) -> Result<Pending<Applied<TxnResponse>>> {
        request.validate(self.inner.config.max_txn_ops)?;
        if !request.is_read_only() {
            self.inner.check_quota(request.put_bytes())?;
        }
        let rx = self.inner.submit(Request::Txn(request))?;
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

    /// Waits until this member has applied everything committed when it was called: what it
    /// reads next is linearizable (a ReadIndex round, shared with concurrent reads).
    pub fn read_barrier(&self) -> Result<()> {
        self.inner.read_barrier()
    }
}

impl Inner {
    /// Waits until this member has applied everything committed when the read started
    /// (ReadIndex, batched with other reads), so that a read after it is linearizable.
    pub(super) fn read_barrier(&self) -> Result<()> {
        let timeout = self.config.request_timeout;
        // The sole voter needs no round: no other member can have committed anything, so
        // waiting until everything in its log is applied makes the read linearizable.
        if let Some(index) = self.log.sole_voter_last_index(self.config.member_id) {
            return if self.applied.wait(index, timeout) {
                Ok(())
            } else {
                Err(Error::Timeout)
            };
        }
        let tx = self.node_tx()?;
        let (reply, answer) = bounded(1);
        tx.send(Input::ReadIndex { reply }).map_err(|_| Error::Closed)?;
        let index = match answer.recv_timeout(timeout) {
            Ok(index) => index?,
            Err(RecvTimeoutError::Timeout) => return Err(Error::Timeout),
            Err(RecvTimeoutError::Disconnected) => return Err(Error::Closed),
        };
        if self.applied.wait(index, timeout) {
            Ok(())
        } else {
            Err(Error::Timeout)
        }
    }
}
