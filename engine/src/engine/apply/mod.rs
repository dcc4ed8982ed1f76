//! Applying committed entries, in two steps:
//!
//! 1. [`transition`]: under the state's write lock, a batch is applied as a pure transition,
//!    `State::apply_batch`, which returns an [`transition::Outcome`] (answers, events, a checkpoint,
//!    the applied position) and changes nothing outside the state.
//! 2. [`applying::Publisher::publish`]: without the lock, the outcome is carried out: events to the watch
//!    thread, the applied index to readers, the log and the node thread, answers to waiters,
//!    and the checkpoint to the `Checkpointer` thread.
//!
//! The [`thread::ApplyThread`] runs both for what the node thread hands over, sweeps compactions in
//! bounded steps between batches, and installs snapshots from the leader. On a group's sole
//! member, the node thread applies a small batch itself when the apply thread is idle
//! ([`handoff::Handoff`]); [`handoff::Shared`]'s lock keeps batches, and their publishing, in log order.

mod applying;
mod handoff;
mod thread;
mod transition;

pub(super) use applying::{Applying, Publisher};
pub(super) use handoff::Handoff;
pub(super) use thread::ApplyThread;
