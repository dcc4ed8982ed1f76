//! The notifier: answers large groups of finished requests off the writer thread.
//!
//! Answering a request wakes the thread waiting for it, a system call each. With dozens of
//! appenders, waking them one by one would keep the writer from its next write and fdatasync
//! for hundreds of microseconds. So the writer answers small groups itself (no extra thread
//! hop for a lone appender) and hands large ones to this thread, which wakes their waiters
//! while the writer is already writing and syncing the next group. Once a group is with the
//! notifier, later groups go through it too, so requests are answered in the order they were
//! queued.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Sender};

use crate::error::Result;
use crate::types::Appended;
use crate::writer::Reply;

/// Groups of at most this many requests are answered by the writer itself.
const INLINE_REPLIES: usize = 4;

/// Finished requests and their shared outcome.
pub(crate) struct Completed {
    pub(crate) replies: Vec<(Reply, Appended)>,
    pub(crate) result: Result<()>,
}

impl Completed {
    fn deliver(self) {
        for (reply, appended) in self.replies {
            let outcome = match &self.result {
                Ok(()) => Ok(appended),
                Err(e) => Err(e.duplicate()),
            };
            let _ = reply.send(outcome);
        }
    }
}

#[derive(Debug)]
pub(crate) struct Notifier {
    tx: Option<Sender<Completed>>,
    /// Groups handed to the thread and not yet answered.
    pending: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Notifier {
    pub(crate) fn start() -> std::io::Result<Notifier> {
        let (tx, rx) = unbounded::<Completed>();
        let pending = Arc::new(AtomicUsize::new(0));
        let counter = pending.clone();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("cairn-wal-notify".into())
            .spawn(move || {
                let _span = span.enter();
                for group in rx {
                    group.deliver();
                    counter.fetch_sub(1, Ordering::Release);
                }
            })?;
        Ok(Notifier {
            tx: Some(tx),
            pending,
            thread: Some(thread),
        })
    }

    /// Answers `group`, here or on the notifier thread (see the module docs).
    pub(crate) fn answer(&self, group: Completed) {
        if group.replies.is_empty() {
            return;
        }
        let Some(tx) = &self.tx else {
            group.deliver();
            return;
        };
        if group.replies.len() <= INLINE_REPLIES && self.pending.load(Ordering::Acquire) == 0 {
            group.deliver();
            return;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(unsent) = tx.send(group) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            unsent.into_inner().deliver();
        }
    }
}

impl Drop for Notifier {
    /// Answers everything handed over before returning.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
