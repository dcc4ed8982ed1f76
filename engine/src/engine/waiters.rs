//! Proposals waiting for their answers ([`Waiters`]), by request ID, and what they are
//! answered ([`Answer`]).

use std::time::Instant;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::request::Response;

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
/// proposed it), each with the time by which it is answered whatever happens.
///
/// Raft can lose a proposal without a word: one forwarded to a leader that dies, or dropped
/// by a leader deposed before it committed it. Nothing would ever answer its waiter, so the
/// apply thread answers every waiter past its deadline with [`Error::Timeout`]
/// ([`Waiters::expire`]) and forgets it: every write is answered within
/// `Config::request_timeout` (plus the sweep's interval), awaited or waited for, as etcd
/// answers "request timed out".
#[derive(Default)]
pub(super) struct Waiters {
    by_id: Mutex<foldhash::HashMap<u64, Waiter>>,
}

struct Waiter {
    reply: oneshot::Sender<Answer>,
    /// When it is answered [`Error::Timeout`] if nothing answered it before.
    deadline: Instant,
}

impl Waiters {
    pub(super) fn insert(&self, id: u64, reply: oneshot::Sender<Answer>, deadline: Instant) {
        self.by_id.lock().insert(id, Waiter { reply, deadline });
    }

    pub(super) fn forget(&self, id: u64) {
        self.by_id.lock().remove(&id);
    }

    /// Answers the waiters among `answers` still waiting (a request proposed through another
    /// member has none here); one lock for all of them, answered once it is released (an
    /// answer wakes a task that may run at once on another thread).
    pub(super) fn answer(&self, answers: impl IntoIterator<Item = (u64, Answer)>) {
        let mut due = Vec::new();
        let mut waiting = self.by_id.lock();
        for (id, outcome) in answers {
            if let Some(w) = waiting.remove(&id) {
                due.push((w.reply, outcome));
            }
        }
        drop(waiting);
        for (reply, outcome) in due {
            let _ = reply.send(outcome);
        }
    }

    /// Answers [`Error::Timeout`] to every waiter whose deadline is past `now`: its entry may
    /// still be applied later, or may never be (its outcome is unknown, as with etcd).
    /// Returns how many.
    pub(super) fn expire(&self, now: Instant) -> usize {
        let expired: Vec<Waiter> = self
            .by_id
            .lock()
            .extract_if(|_, w| w.deadline <= now)
            .map(|(_, w)| w)
            .collect();
        let count = expired.len();
        for w in expired {
            let _ = w.reply.send(Err(Error::Timeout));
        }
        count
    }

    /// Proposals still waiting.
    pub(super) fn len(&self) -> usize {
        self.by_id.lock().len()
    }

    /// Drops every waiter (the engine closed): each gets [`Error::Closed`].
    pub(super) fn clear(&self) {
        self.by_id.lock().clear();
    }
}
