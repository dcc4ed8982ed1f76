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
    /// The answer whatever `rx` gets, for a write refused before it was logged that waits on
    /// another entry ([`OverQuota`]).
    refusal: Option<Error>,
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
        Pending {
            rx,
            timeout,
            convert,
            refusal: None,
        }
    }

    /// `refusal`, once `rx` (another entry's answer) has come or timed out.
    fn refused((rx, timeout): (oneshot::Receiver<Answer>, std::time::Duration), refusal: Error) -> Pending<T> {
        Pending {
            rx,
            timeout,
            convert: |_| Err(Error::internal("a refusal converted an answer")),
            refusal: Some(refusal),
        }
    }

    /// Blocks until the write is applied, or fails with [`Error::Timeout`] after
    /// `Config::request_timeout`: then the write may still be applied later, or may have been
    /// already (as with etcd, a timed-out write's outcome is unknown).
    pub fn wait(self) -> Result<T> {
        let answer = wait_answer(self.rx, self.timeout);
        match self.refusal {
            Some(refusal) => Err(refusal),
            None => (self.convert)(answer?),
        }
    }
}

impl<T: Unpin> std::future::IntoFuture for Pending<T> {
    type Output = Result<T>;
    type IntoFuture = PendingFuture<T>;

    fn into_future(self) -> PendingFuture<T> {
        PendingFuture {
            rx: self.rx.into_future(),
            convert: self.convert,
            refusal: self.refusal,
        }
    }
}

/// The future of a [`Pending`] write.
pub struct PendingFuture<T> {
    rx: oneshot::AsyncReceiver<Answer>,
    convert: fn((Response, i64)) -> Result<T>,
    refusal: Option<Error>,
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
        let answer = std::task::ready!(std::pin::Pin::new(&mut self.rx).poll(cx));
        std::task::Poll::Ready(match (self.refusal.take(), answer) {
            (Some(refusal), _) => Err(refusal),
            (None, Ok(Ok(answer))) => convert(answer),
            (None, Ok(Err(e))) => Err(e),
            (None, Err(_)) => Err(Error::Closed),
        })
    }
}

/// A write refused by the quota ([`Core::check_quota`]): [`Error::NoSpace`], answered once the
/// NOSPACE alarm this refusal proposed (if it was not raised yet) is applied, so that a client
/// told NOSPACE finds the alarm raised. The alarm is not waited for here: the caller may be an
/// async task's thread, and the members that commit the alarm may need that thread to hear
/// from each other (with no leader the wait lasts the request timeout). As etcd does, NOSPACE
/// is the answer whatever becomes of the alarm's proposal.
pub(crate) struct OverQuota {
    raising: Option<(oneshot::Receiver<Answer>, std::time::Duration)>,
}

impl OverQuota {
    /// NOSPACE as a [`Pending`] write: answered when the alarm is (at once if raised already).
    pub(crate) fn pending<T>(self) -> Result<Pending<T>> {
        match self.raising {
            Some(raising) => Ok(Pending::refused(raising, Error::NoSpace)),
            None => Err(Error::NoSpace),
        }
    }

    /// NOSPACE, once the alarm is applied: blocks, for callers on a thread of their own.
    pub(crate) fn wait(self) -> Error {
        if let Some((rx, timeout)) = self.raising {
            let _ = wait_answer(rx, timeout);
        }
        Error::NoSpace
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
    /// write is refused ([`OverQuota`]) and the NOSPACE alarm raised (durably, once).
    pub(crate) fn check_quota(&self, bytes: u64) -> std::result::Result<(), OverQuota> {
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
        let mut raising = None;
        if !raised {
            tracing::warn!(used, quota, "backend quota exceeded: raising the NOSPACE alarm");
            raising = self
                .submit(Request::Alarm {
                    activate: true,
                    member: self.member_id,
                    alarm: Alarm::NoSpace,
                })
                .ok();
        }
        Err(OverQuota { raising })
    }

    pub(super) fn propose(&self, request: Request) -> Answer {
        let (rx, timeout) = self.submit(request)?;
        wait_answer(rx, timeout)
    }
}
