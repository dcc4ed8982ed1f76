//! The write path's two ends: a request registered as a waiter under a new request ID and
//! handed to the node thread (after etcd's quota check), and its answer coming back once the
//! entry is applied, waited for or awaited as a [`Pending`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use cairn_wal::Wal;
use crossbeam_channel::Sender;

use super::core::Core;
use super::waiters::{wait_answer, Answer};
use crate::consensus::interface::Input;
use crate::error::{Error, Result};
use crate::request::{Alarm, Request, Response};

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
pub(crate) fn guarded(request: Request, guard: Option<u64>) -> Request {
    match guard {
        Some(auth_revision) => Request::Guarded {
            auth_revision,
            request: Box::new(request),
        },
        None => request,
    }
}

/// A write that is logged and will be answered once applied: [`Pending::wait`] for it, or
/// `.await` it. Either way it is answered within `Config::request_timeout`: applied, failed,
/// or [`Error::Timeout`] (the outcome unknown) if raft lost or delayed it.
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
    pub(crate) fn new(
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

impl Core {
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

    /// Logs `request`, in the forms every member decodes (`crate::version`), and queues it;
    /// the receiver gets its answer once applied.
    pub(crate) fn submit(&self, request: Request) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let data = self.encode(request)?;
        self.submit_input(|id| Input::Propose { id, data })
    }

    /// `request` as a log entry, in the forms every member decodes (`crate::version`).
    fn encode(&self, request: Request) -> Result<Vec<u8>> {
        let versions = match crate::format::entry::gated(&request) {
            true => self.state.read().versions,
            false => Default::default(),
        };
        crate::format::entry::encode(request, &versions)
    }

    /// [`Core::submit`] for what only the leader of `term` decides (see
    /// [`Input::ProposeAsLeader`]): refused with [`Error::NotLeader`] by a member that no
    /// longer leads that term.
    pub(super) fn submit_as_leader(
        &self,
        request: Request,
        term: u64,
    ) -> Result<(oneshot::Receiver<Answer>, std::time::Duration)> {
        let data = self.encode(request)?;
        self.submit_input(|id| Input::ProposeAsLeader { id, data, term })
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
        self.waiters
            .insert(id, reply, Instant::now() + self.config.request_timeout);
        if tx.send(make(id)).is_err() {
            self.waiters.forget(id);
            return Err(Error::Closed);
        }
        Ok((answer, self.config.request_timeout))
    }

    /// etcd's quota check, before a write that adds `bytes` is logged: past the quota, the
    /// NOSPACE alarm is raised (durably, once) and the write refused.
    pub(crate) fn check_quota(&self, bytes: u64) -> Result<()> {
        let quota = self.config.quota_backend_bytes;
        if quota == 0 {
            return Ok(());
        }
        let (used, raised) = {
            let st = self.state.read();
            let raised = st.alarms.iter().any(|(_, a)| *a == Alarm::NoSpace);
            (st.store.size_in_use(), raised)
        };
        if used.saturating_add(bytes) <= quota {
            return Ok(());
        }
        if !raised {
            tracing::warn!(used, quota, "backend quota exceeded: raising the NOSPACE alarm");
            self.propose(Request::Alarm {
                activate: true,
                member: self.member_id,
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
