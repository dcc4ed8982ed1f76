//! The apply thread ([`ApplyThread`]) and the checkpointer thread it starts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_wal::Wal;
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, TryRecvError};

use super::applying::STALL_RETRY;
use super::handoff::Shared;
use crate::consensus::interface::ToApply;
use crate::engine::checkpointing::{refresh_saved_index, write_and_release, Checkpointing, Encoded};
use crate::error::Result;
use crate::mvcc::saved_index::When;

/// How often the apply thread answers proposals past their deadline ([`Waiters::expire`]).
const WAITER_SWEEP: Duration = Duration::from_millis(100);

/// The checkpointer thread: writes the checkpoints the apply path encodes, one at a time, while
/// requests go on being applied.
struct Checkpointer {
    dir: PathBuf,
    wal: Arc<Wal>,
    checkpointing: Arc<Checkpointing>,
    writing: Arc<AtomicBool>,
    written: Receiver<Encoded>,
}

impl Checkpointer {
    fn run(self) {
        for encoded in self.written {
            let written = write_and_release(&self.dir, &encoded, &self.wal, &self.checkpointing);
            self.writing.store(false, Ordering::Release);
            match written {
                Ok(()) => refresh_saved_index(&self.dir, &encoded, When::Growing(self.checkpointing.saved_index_bytes)),
                Err(e) => tracing::error!(error = %e, "checkpoint failed; the log keeps growing"),
            }
        }
    }
}

/// The apply thread: applies what the node thread hands over, in order, and sweeps
/// compactions between batches.
pub(in crate::engine) struct ApplyThread {
    pub(in crate::engine) rx: Receiver<ToApply>,
    pub(in crate::engine) shared: Arc<Shared>,
}

impl ApplyThread {
    /// Runs until the node thread's end of the queue is gone; an error if the checkpointer
    /// thread panicked.
    pub(in crate::engine) fn run(self) -> Result<()> {
        let ApplyThread { rx, shared } = self;
        let checkpointer = start_checkpointer(&shared);
        let core = shared.applying.lock().publisher.core.clone();
        let (state, waiters, applied, swept) = (&core.state, &core.waiters, &core.applied, &core.swept);
        let compaction_batch = core.config.compaction_batch;
        let mut swept_waiters = Instant::now();
        loop {
            // Proposals raft lost, and async reads waiting for an index this member does not
            // reach, are answered once past their deadline, whatever else goes on.
            if swept_waiters.elapsed() >= WAITER_SWEEP {
                applied.expire(Instant::now());
                let expired = waiters.expire(Instant::now());
                if expired > 0 {
                    tracing::debug!(expired, "proposals unanswered past the request timeout: timed out");
                }
                swept_waiters = Instant::now();
            }
            // A compaction sweeps a bounded batch of keys between requests, and while idle, so
            // no write waits behind it for long.
            let (compacting, unfinished) = {
                let st = state.read();
                (st.store.compaction_pending(), st.store.compaction_unfinished())
            };
            let work = if compacting {
                if !state.write().store.compaction_step(compaction_batch) {
                    swept.notify();
                }
                match rx.try_recv() {
                    Ok(work) => work,
                    Err(TryRecvError::Empty) => continue,
                    Err(TryRecvError::Disconnected) => break,
                }
            } else if unfinished {
                // Paused by a snapshot: look again now and then, requests or not.
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(work) => work,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else if shared.applying.lock().is_stalled() {
                // Stalled entries are tried again on time, whether more come or not.
                {
                    let mut applying = shared.applying.lock();
                    if applying.retry_due() {
                        applying.retry_stalled(state.write());
                    }
                }
                match rx.recv_timeout(STALL_RETRY / 4) {
                    Ok(work) => work,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv_timeout(WAITER_SWEEP) {
                    Ok(work) => work,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            shared.applying.lock().other(work);
            // Only now: the node thread applies a batch itself only once nothing handed over
            // before is left.
            shared.queued.fetch_sub(1, Ordering::AcqRel);
        }
        // Let a checkpoint being written finish before the final one is taken.
        shared.applying.lock().to_write = None;
        checkpointer.map_or(Ok(()), crate::thread::Worker::join)
    }
}

/// Starts the checkpointer thread and gives the apply path its queue; without one (it could
/// not start), checkpoints are only written on close.
fn start_checkpointer(shared: &Shared) -> Option<crate::thread::Worker> {
    let mut applying = shared.applying.lock();
    let (to_write, written) = bounded::<Encoded>(1);
    let p = &applying.publisher;
    let checkpointer = Checkpointer {
        dir: p.core.dir.clone(),
        wal: p.wal.clone(),
        checkpointing: p.core.checkpointing.clone(),
        writing: applying.writing.clone(),
        written,
    };
    let spawned = crate::thread::start("cairn-checkpoint", move || checkpointer.run());
    match spawned {
        Ok(thread) => {
            applying.to_write = Some(to_write);
            Some(thread)
        }
        Err(e) => {
            tracing::error!(error = %e, "no checkpoint thread; checkpoints only on close");
            None
        }
    }
}
