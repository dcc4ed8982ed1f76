//! The write path's two ends: a request registered as a waiter under a new request ID and
//! handed to the node thread (after etcd's quota check), and its answer coming back once the
//! entry is applied, waited for or awaited as a [`Pending`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_wal::Wal;
use crossbeam_channel::Sender;
use parking_lot::Mutex;

use super::Inner;
use crate::consensus::node::Input;
use crate::error::{Error, Result};
use crate::request::{Alarm, Request, Response};

pub(super) type Answer = Result<(Response, i64)>;

/// Waits for a proposal's answer: [`Error::Timeout`] after `timeout` (the write may still be
/// applied), [`Error::Closed`] if the engine closed first.
pub(super) fn wait_answer(rx: oneshot::Receiver<Answer>, timeout: std::time::Duration) -> Answer {
    match rx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::Closed),
    }
}

/// Proposals waiting for their entry to be applied, by request ID (carried in the entry's
/// context, so an entry proposed through any member finds its waiter on the member that
/// proposed it).
pub(super) type Waiters = Mutex<HashMap<u64, oneshot::Sender<Answer>>>;

/// A write that is logged and will be answered once applied: [`Pending::wait`] for it, or
/// `.await` it.
#[must_use = "a pending write says when it is applied, and how it went"]
pub struct Pending<T> {
    rx: oneshot::Receiver<Answer>,
    /// How long [`Pending::wait`] waits (`Config::request_timeout`).
    timeout: std::time::Duration,
    convert: fn((Response, i64)) -> Result<T>,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl<T> Pending<T> {
    pub(super) fn new(
        (rx, timeout): (oneshot::Receiver<Answer>, std::time::Duration),
        convert: fn((Response, i64)) -> Result<T>,
    ) -> Pending<T> {
        Pending { rx, timeout, convert }
    }

    /// Blocks until the write is applied, or fails with [`Error::Timeout`] after
    /// `Config::request_timeout`: then the write may still be applied later, or may have been
    /// already (as with etcd, a timed-out write's outcome is unknown).
    pub fn wait(self) -> Result<T> {
        (self.convert)(wait_answer(self.rx, self.timeout)?)
    }
}

impl<T: Unpin> std::future::IntoFuture for Pending<T> {
    type Output = Result<T>;
    type IntoFuture = PendingFuture<T>;

    fn into_future(self) -> PendingFuture<T> {
        PendingFuture {
            rx: self.rx.into_future(),
            convert: self.convert,
        }
    }
}

/// The future of a [`Pending`] write.
pub struct PendingFuture<T> {
    rx: oneshot::AsyncReceiver<Answer>,
    convert: fn((Response, i64)) -> Result<T>,
}

impl<T> std::fmt::Debug for PendingFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFuture").finish_non_exhaustive()
    }
}

impl<T: Unpin> std::future::Future for PendingFuture<T> {
    type Output = Result<T>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<T>> {
        let convert = self.convert;
        std::pin::Pin::new(&mut self.rx).poll(cx).map(|r| match r {
            Ok(Ok(answer)) => convert(answer),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Closed),
        })
    }
}

impl Inner {
    /// Where inputs for the node thread go.
    pub(super) fn node_tx(&self) -> Result<Sender<Input>> {
        let replica = self.replica.lock();
        Ok(replica.as_ref().ok_or(Error::Closed)?.node.tx.clone())
    }

    /// The WAL, while the engine is open.
    pub(super) fn wal(&self) -> Result<Arc<Wal>> {
        let replica = self.replica.lock();
        Ok(replica.as_ref().ok_or(Error::Closed)?.wal.clone())
    }

    /// Logs `request` and queues it; the receiver gets its answer once applied.
    pub(super) fn submit(&self, request: Request) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let data = request.encode();
        self.submit_input(|id| Input::Propose { id, data })
    }

    /// Registers a waiter under a new request ID and hands the node the input `make` builds
    /// with that ID.
    pub(super) fn submit_input(
        &self,
        make: impl FnOnce(u64) -> Input,
    ) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let tx = self.node_tx()?;
        self.waiters.lock().insert(id, reply);
        if tx.send(make(id)).is_err() {
            self.waiters.lock().remove(&id);
            return Err(Error::Closed);
        }
        Ok((answer, self.config.request_timeout))
    }

    /// etcd's quota check, before a write that adds `bytes` is logged: past the quota, the
    /// NOSPACE alarm is raised (durably, once) and the write refused.
    pub(super) fn check_quota(&self, bytes: u64) -> Result<()> {
        let quota = self.config.quota_backend_bytes;
        if quota == 0 {
            return Ok(());
        }
        let (used, raised) = {
            let st = self.state.read();
            (st.store.size_in_use(), st.alarms.contains(&Alarm::NoSpace))
        };
        if used.saturating_add(bytes) <= quota {
            return Ok(());
        }
        if !raised {
            tracing::warn!(used, quota, "backend quota exceeded: raising the NOSPACE alarm");
            self.propose(Request::Alarm {
                activate: true,
                alarm: Alarm::NoSpace,
            })?;
        }
        Err(Error::NoSpace)
    }

    pub(super) fn propose(&self, request: Request) -> Answer {
        let (rx, timeout) = self.submit(request)?;
        wait_answer(rx, timeout)
    }
}
