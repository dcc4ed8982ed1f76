//! Newtypes and the record model shared by every part of the log.

use std::fmt;

use bytes::Bytes;

/// The index of a log entry (a Raft log index, when the log carries Raft).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogIndex(pub u64);

impl LogIndex {
    /// The index after this one (saturating: `u64::MAX` has no successor).
    pub fn next(self) -> LogIndex {
        LogIndex(self.0.saturating_add(1))
    }

    /// The index as a plain number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The sequence number of a segment file; consecutive segments have consecutive numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SegmentSeq(pub u64);

impl fmt::Display for SegmentSeq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// One logical record of the log, as appended and as replayed.
///
/// Replaying a log yields its records in the order they were appended. Folding them gives the
/// log's content: entries form a contiguous run of indexes, a [`Record::Truncate`] drops every
/// entry at or after its index (Raft overwriting a conflicting suffix), and the last
/// [`Record::State`] wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// An entry at `index`. Invariant: `index` is the previous entry's index + 1, or any index
    /// when the log holds no entry yet or right after a truncation to `index`.
    Entry {
        /// The entry's position in the log.
        index: LogIndex,
        /// Opaque bytes, at most [`crate::Config::max_record_bytes`] long.
        payload: Bytes,
    },
    /// Opaque metadata (Raft's HardState and ConfState, for instance); the latest one wins.
    /// The log carries the latest state into every new segment, so releasing old segments never
    /// loses it.
    State(Bytes),
    /// Drops every entry with an index `>= from`; the next entry must have index `from`. A
    /// point past the end restarts the log there: Raft installing a snapshot that covers
    /// every entry before `from`, which the log never held.
    Truncate {
        /// The first index dropped.
        from: LogIndex,
    },
}

/// How durable an append must be before its [`crate::Ticket`] completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Completes once the records, and everything before them, are fdatasynced.
    Durable,
    /// Completes once the records are written to the file (in the page cache). A later durable
    /// append or [`crate::Wal::sync`] makes them durable.
    Buffered,
}

/// What a completed append reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// Index of the first entry this request appended, if it appended entries.
    pub first_index: Option<LogIndex>,
    /// Index of the last entry in the log after this request.
    pub last_index: Option<LogIndex>,
}
