//! How far applying has got, for those who wait on it: the applied index ([`AppliedIndex`])
//! and the compaction sweep ([`Swept`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::{Error, Result};

/// The last applied log index, for reads to wait on: blocking ([`AppliedIndex::wait`]) or
/// async ([`AppliedIndex::reached`]).
#[derive(Default)]
pub(super) struct AppliedIndex {
    state: Mutex<Applied>,
    changed: parking_lot::Condvar,
    /// `state.index`, stored under its lock: a read whose index is applied already, and every
    /// request's apply-lag check, read it without taking the lock.
    index: AtomicU64,
}

#[derive(Default)]
struct Applied {
    index: u64,
    /// Async readers waiting for an index, with their deadlines: answered (in any order)
    /// once it is applied, or [`Error::Timeout`] once past the deadline
    /// ([`AppliedIndex::expire`]).
    waiting: Vec<(u64, Instant, oneshot::Sender<Result<()>>)>,
}

impl AppliedIndex {
    pub(super) fn set(&self, index: u64) {
        let mut st = self.state.lock();
        st.index = index;
        self.index.store(index, Ordering::Release);
        let due: Vec<_> = st.waiting.extract_if(.., |(at, _, _)| *at <= index).collect();
        drop(st);
        // Answered once the lock is free: a woken reader's task may run on another thread
        // at once, and must not find the lock still held.
        for (_, _, reader) in due {
            let _ = reader.send(Ok(()));
        }
        self.changed.notify_all();
    }

    /// The last applied index (no lock).
    pub(super) fn get(&self) -> u64 {
        self.index.load(Ordering::Acquire)
    }

    /// Waits until `index` is applied; false on timeout.
    pub(super) fn wait(&self, index: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.state.lock();
        while st.index < index {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return st.index >= index;
            }
        }
        true
    }

    /// None if `index` is applied already; otherwise a receiver answered once it is, with
    /// [`Error::Timeout`] if that is not before `deadline` (or failing if the engine goes
    /// away first).
    pub(super) fn reached(&self, index: u64, deadline: Instant) -> Option<oneshot::Receiver<Result<()>>> {
        if self.get() >= index {
            return None;
        }
        let mut st = self.state.lock();
        if st.index >= index {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        st.waiting.push((index, deadline, tx));
        Some(rx)
    }

    /// Answers [`Error::Timeout`] to the async readers past their deadline.
    pub(super) fn expire(&self, now: Instant) {
        let mut st = self.state.lock();
        let late: Vec<_> = st.waiting.extract_if(.., |(_, deadline, _)| *deadline <= now).collect();
        drop(st);
        for (_, _, reader) in late {
            let _ = reader.send(Err(Error::Timeout));
        }
    }
}

/// Signalled when a compaction's sweep finishes, for [`crate::Maintenance::wait_compacted`].
#[derive(Default)]
pub(super) struct Swept {
    lock: Mutex<()>,
    done: parking_lot::Condvar,
}

impl Swept {
    pub(super) fn notify(&self) {
        let _signal = self.lock.lock();
        self.done.notify_all();
    }

    /// Waits until `finished` says so, looking again at least every 100 ms.
    pub(super) fn wait(&self, mut finished: impl FnMut() -> Result<bool>) -> Result<()> {
        let mut guard = self.lock.lock();
        while !finished()? {
            self.done.wait_for(&mut guard, Duration::from_millis(100));
        }
        Ok(())
    }
}
