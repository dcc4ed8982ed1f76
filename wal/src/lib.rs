//! cairn's write-ahead log: segmented files of CRC-chained records, written by one
//! group-commit thread and recovered with torn-tail repair.
//!
//! The log is a sequence of [`Record`]s: entries with contiguous indexes, opaque state, and
//! truncation markers. [`Wal::open`] returns a [`Replay`] that yields every record in order;
//! [`Replay::finish`] then gives the [`Wal`] to append to. Appends from many threads are
//! queued to one writer that writes each group with one call and one fdatasync; a caller
//! with nothing better to do while the disk syncs can write on its own thread when the writer
//! is idle ([`Wal::append_here`]), in the same order.
//!
//! On disk: files `{seq:016x}-{first_index:016x}.wal`, each a 40-byte header followed by
//! 8-aligned frames (docs/wal-format.md has every byte). A crash at any point leaves a log that
//! recovers to a prefix of what was appended that includes everything acknowledged as durable.
//!
//! This crate knows bytes, indexes and segments; it knows nothing of Raft or MVCC.

#![warn(missing_docs)]

mod config;
mod error;
mod frame;
mod fs;
mod notifier;
mod pipeline;
mod recovery;
mod segment;
#[cfg(any(test, feature = "testing"))]
mod sim;
mod stats;
mod types;
mod wal;
mod writer;

pub use config::{Config, RecoveryMode};
pub use error::{CorruptionReason, Error, FrameError, Result};
pub use frame::{decode_frame, framed_len, Frame, FrameKind, FRAME_ALIGN, FRAME_HEADER_LEN};
pub use fs::{DirLock, FileSystem, StdFs, WalFile};
pub use recovery::{repair, repair_with, RepairReport, Replay};
pub use segment::{parse_segment_name, segment_name, SegmentHeader, HEADER_LEN as SEGMENT_HEADER_LEN};
/// Crash and fault simulation, for tests (the `testing` feature).
#[cfg(any(test, feature = "testing"))]
pub use sim::{SimFs, SyncGate, SECTOR};
pub use stats::{Distribution, StatsSnapshot};
pub use types::{Appended, Durability, LogIndex, Record, SegmentSeq};
pub use wal::{Ticket, TicketFuture, Wal};
