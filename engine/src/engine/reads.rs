//! Reads from this member's state: a range, or a read-only txn, linearizable (after the read
//! barrier) unless serializable. The barrier: a read that starts after it sees everything
//! committed when it was called. The sole voter needs no round; any other member joins a
//! ReadIndex round, batched with the other reads, then waits until it has applied up to the
//! index.
//!
//! These take requests already checked where they entered (the embedded API, `Engine::range`
//! and `Engine::txn`, or the server's edge).

use std::time::Instant;

use super::core::Core;
use super::propose::Applied;
use crate::consensus::interface::Input;
use crate::error::{Error, Result};
use crate::kv::range::{RangeRequest, RangeResponse};
use crate::kv::txn::{TxnRequest, TxnResponse};

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

    /// [`Core::read_barrier`] without a thread waiting.
    pub(super) async fn read_barrier_async(&self) -> Result<()> {
        let deadline = Instant::now() + self.config.request_timeout;
        let index = match self.read_index()? {
            ReadIndex::Known(index) => index,
            ReadIndex::Round(answer) => answer.await.map_err(|_| Error::Closed)??,
        };
        match self.applied.reached(index, deadline) {
            None => Ok(()),
            Some(reached) => reached.await.map_err(|_| Error::Closed)?,
        }
    }

    /// A range, checked already, from this member's state: after the barrier unless
    /// serializable.
    pub(super) fn range(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if !request.serializable {
            self.read_barrier()?;
        }
        self.range_here(request)
    }

    /// [`Core::range`] without a thread waiting.
    pub(super) async fn range_async(&self, request: &RangeRequest) -> Result<RangeResponse> {
        if !request.serializable {
            self.read_barrier_async().await?;
        }
        self.range_here(request)
    }

    fn range_here(&self, request: &RangeRequest) -> Result<RangeResponse> {
        let st = self.state.read();
        st.check_readable(self.member_id)?;
        request.apply(&st.store)
    }

    /// A read-only txn, checked already ([`Error::Misuse`] if it writes), from this member's
    /// state: after the barrier unless every op is a serializable range.
    pub(super) async fn read_txn_async(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        if !request.is_read_only() {
            return Err(Error::Misuse("read_txn_async of a txn that writes: use write_async"));
        }
        if !request.is_serializable() {
            self.read_barrier_async().await?;
        }
        self.read_txn_here(request)
    }

    /// The blocking [`Core::read_txn_async`].
    pub(super) fn read_txn(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        if !request.is_serializable() {
            self.read_barrier()?;
        }
        self.read_txn_here(request)
    }

    fn read_txn_here(&self, request: &TxnRequest) -> Result<Applied<TxnResponse>> {
        let st = self.state.read();
        st.check_readable(self.member_id)?;
        let (response, revision) = request.read(&st.store)?;
        Ok(Applied { response, revision })
    }
}
