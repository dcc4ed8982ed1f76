//! The one error type of the `wal` crate.
//!
//! Variants are structured so a caller can branch on them: corruption names the segment and
//! offset, a torn tail is distinct from corruption, and a poisoned log says the handle must be
//! reopened. Nothing here is a bare string for a case a caller must tell apart.

use std::io;
use std::path::PathBuf;

use crate::types::LogIndex;

/// Why a frame could not be decoded. Used both by recovery (to classify damage) and by tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The buffer ends before the frame does: the frame needs `needed` bytes, `available` remain.
    #[error("frame truncated: needs {needed} bytes, {available} available")]
    Truncated {
        /// Bytes the whole frame occupies, padding included; the header length when not even
        /// the length field could be read.
        needed: u64,
        /// Bytes from the start of the frame to the end of the buffer.
        available: u64,
    },
    /// The stored checksum does not match the bytes.
    #[error("crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Crc {
        /// The checksum written in the frame header.
        stored: u32,
        /// The checksum of the bytes as read, seeded with the previous record's crc; a wrong
        /// seed (a record out of place) mismatches just like damaged bytes.
        computed: u32,
    },
    /// The type byte is not a known record type.
    #[error("unknown record type {0}")]
    UnknownType(u8),
    /// Reserved header bytes or alignment padding are not zero.
    #[error("non-zero reserved or padding bytes")]
    NonZeroPadding,
}

/// Errors returned by the write-ahead log.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed. When this comes from a write or an fsync the log is now poisoned.
    #[error("wal i/o error during {op}: {source}")]
    Io {
        /// What the log was doing, such as `"fdatasync"` or `"open segment"`.
        op: &'static str,
        /// The error the file system returned.
        #[source]
        source: io::Error,
    },
    /// An earlier write or fsync failed. The kernel may have dropped dirty pages, so nothing
    /// written since the last successful fsync can be trusted: drop this handle and reopen,
    /// which recovers what is actually on disk.
    #[error("wal is poisoned by an earlier failed {op} ({cause}); reopen it to recover")]
    Poisoned {
        /// The operation whose failure poisoned the log; the first failure wins.
        op: &'static str,
        /// The text of that failure's I/O error (the `io::Error` itself is not kept).
        cause: String,
    },
    /// A damaged record before the tail of the log. Recovery refuses to skip it.
    #[error("wal corrupted in segment {segment} at offset {offset}: {reason}")]
    Corruption {
        /// Path of the damaged segment file.
        segment: PathBuf,
        /// Byte offset of the damage from the start of the file; 0 for a bad header, a broken
        /// chain or a sequence gap.
        offset: u64,
        /// What is wrong there.
        reason: CorruptionReason,
    },
    /// The last written region is torn (a crash during a write), and the recovery mode is
    /// [`crate::RecoveryMode::Strict`].
    #[error("wal has a torn tail in segment {segment} at offset {offset}: {reason}")]
    TornTail {
        /// Path of the last segment file.
        segment: PathBuf,
        /// Byte offset from the start of the file where the torn region begins; a repair cuts
        /// the segment here.
        offset: u64,
        /// Why the frame at `offset` did not decode.
        reason: FrameError,
    },
    /// Appended entries must follow the last entry without a gap.
    #[error("entry index {got} does not follow the last index {last}; expected {}", last.next())]
    NonContiguous {
        /// The last entry before the rejected one, counting earlier records of the same request.
        last: LogIndex,
        /// The index the rejected entry carries.
        got: LogIndex,
    },
    /// A record payload larger than the configured maximum.
    #[error("record of {size} bytes exceeds the limit of {limit} bytes")]
    RecordTooLarge {
        /// The payload's length in bytes.
        size: u64,
        /// The limit in bytes, [`crate::Config::max_record_bytes`].
        limit: u64,
    },
    /// Another process (or handle) holds the log directory.
    #[error("wal directory {dir} is locked by another process: {source}")]
    Locked {
        /// The log directory.
        dir: PathBuf,
        /// The error from taking the lock (`WouldBlock` when another holder has it).
        #[source]
        source: io::Error,
    },
    /// The configuration failed validation.
    #[error("invalid wal config: {0}")]
    InvalidConfig(&'static str),
    /// The log was closed (its writer thread is gone) before the request completed.
    #[error("wal is closed")]
    Closed,
}

/// What exactly is wrong at a corruption point.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptionReason {
    /// A record failed to decode and the damage is not confined to the tail.
    #[error("damaged record ({0})")]
    Frame(FrameError),
    /// The segment header is missing or invalid.
    #[error("bad segment header ({0})")]
    Header(&'static str),
    /// The segment's CRC seed does not continue the previous segment's chain: a stale,
    /// reordered or foreign segment.
    #[error("crc chain broken: segment seed {seed:#010x}, previous segment ends at {expected:#010x}")]
    ChainBroken {
        /// The seed stored in this segment's header.
        seed: u32,
        /// The stored crc of the previous segment's last record (its own seed if it has none).
        expected: u32,
    },
    /// Segment sequence numbers are not consecutive.
    #[error("segment sequence gap: expected {expected}, found {found}")]
    SequenceGap {
        /// The previous segment's sequence number plus one.
        expected: u64,
        /// The sequence number of the segment that follows it on disk.
        found: u64,
    },
    /// Bytes follow the clean end of a segment that is not the last one.
    #[error("data after the end of a sealed segment")]
    DataAfterEnd,
}

/// The crate's result type; the error defaults to [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A copy of this error (`io::Error` is not `Clone`; its kind and text are kept).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Io { op, source } => Error::Io {
                op,
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::Poisoned { op, cause } => Error::Poisoned {
                op,
                cause: cause.clone(),
            },
            Error::Corruption {
                segment,
                offset,
                reason,
            } => Error::Corruption {
                segment: segment.clone(),
                offset: *offset,
                reason: reason.clone(),
            },
            Error::TornTail {
                segment,
                offset,
                reason,
            } => Error::TornTail {
                segment: segment.clone(),
                offset: *offset,
                reason: *reason,
            },
            Error::NonContiguous { last, got } => Error::NonContiguous { last: *last, got: *got },
            Error::RecordTooLarge { size, limit } => Error::RecordTooLarge {
                size: *size,
                limit: *limit,
            },
            Error::Locked { dir, source } => Error::Locked {
                dir: dir.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::InvalidConfig(why) => Error::InvalidConfig(why),
            Error::Closed => Error::Closed,
        }
    }

    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { op, source }
    }
}
