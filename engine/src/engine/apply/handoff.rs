//! [`Handoff`]: the node thread's way to the apply thread, which on a group's sole member may
//! apply a small batch itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};
use parking_lot::{Mutex, RwLock};

use super::applying::Applying;
use super::transition::Entries;
use crate::consensus::interface::{ApplyQueue, ToApply};
use crate::engine::state::State;
use crate::error::{Error, Result};

/// The node thread's way to the apply thread ([`ApplyQueue`]). Work is applied in the order it
/// is handed over. On a group's sole member, a small batch of entries that finds the node
/// thread with no other input and the apply thread with nothing queued and nothing in hand is
/// applied on the node thread itself: one thread hand-off fewer per write when writes come one
/// or a few at a time (the serial put's path). Under load, in a group of several (where a node
/// thread held up by an apply would delay heartbeats), for a batch that would encode a
/// checkpoint (which flushes the data files), and for everything else, the apply thread
/// applies and the node thread goes on with the next Ready.
pub(in crate::engine) struct Handoff {
    tx: Sender<ToApply>,
    shared: Arc<Shared>,
}

/// What the apply thread shares with the node thread's [`Handoff`].
pub(in crate::engine) struct Shared {
    /// Handed to the apply thread and not yet applied. Only the node thread adds to it, so
    /// when it reads 0 everything handed over before is applied.
    pub(super) queued: AtomicUsize,
    /// How batches are applied and published. Its lock serializes publishing: whichever
    /// thread applies a batch publishes it before the next batch is applied.
    pub(super) applying: Mutex<Applying>,
    state: Arc<RwLock<State>>,
}

/// Batches of at most this many entries, and this many bytes, may be applied on the node
/// thread.
const HERE_ENTRIES: usize = 8;
const HERE_BYTES: usize = 64 << 10;

impl Handoff {
    /// A handoff to an apply thread not started yet, which takes the receiver and the
    /// shared part ([`super::ApplyThread`]).
    pub(in crate::engine) fn new(applying: Applying) -> (Handoff, Receiver<ToApply>, Arc<Shared>) {
        let (tx, rx) = unbounded();
        let state = applying.publisher.core.state.clone();
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            applying: Mutex::new(applying),
            state,
        });
        let handoff = Handoff {
            tx,
            shared: shared.clone(),
        };
        (handoff, rx, shared)
    }

    fn queue(&self, work: ToApply) -> Result<()> {
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        self.tx.send(work).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            Error::Closed
        })
    }

    /// Applies `batch` here if the apply thread has nothing queued, is not applying, and the
    /// state lock is free at once (a long read holding it must not stall the node thread:
    /// ticks and heartbeats wait on it); gives the batch back otherwise.
    fn apply_here(&self, batch: Entries) -> Option<Entries> {
        let bytes: usize = batch.iter().map(|(e, _)| e.data.len()).sum();
        if batch.len() > HERE_ENTRIES || bytes > HERE_BYTES || self.shared.queued.load(Ordering::Acquire) != 0 {
            return Some(batch);
        }
        let Some(mut applying) = self.shared.applying.try_lock() else {
            return Some(batch);
        };
        if applying.checkpoint_due(batch.len()) {
            // Encoding one flushes the data files: never on the node thread.
            return Some(batch);
        }
        let Some(st) = self.shared.state.try_write() else {
            return Some(batch);
        };
        if applying.entries(st, batch) {
            // The batch began a compaction: the apply thread sweeps it, between batches.
            if self.queue(ToApply::Sweep).is_err() {
                tracing::warn!("no apply thread to sweep a compaction");
            }
        }
        None
    }
}

impl ApplyQueue for Handoff {
    fn send(&self, work: ToApply) -> Result<()> {
        self.queue(work)
    }

    fn send_or_apply(&self, work: ToApply) -> Result<()> {
        match work {
            ToApply::Entries(batch) => match self.apply_here(batch) {
                None => Ok(()),
                Some(batch) => self.queue(ToApply::Entries(batch)),
            },
            work => self.queue(work),
        }
    }
}
