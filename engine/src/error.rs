//! The one error type of the `engine` crate.
//!
//! Variants are what a caller branches on; what went wrong underneath (an I/O error, the
//! WAL's, raft-rs's) stays reachable through `source()` ([`Failure`], [`Error::io_error`]).

use std::sync::Arc;

/// Errors returned by the engine.
///
/// The text is the engine's own; `cairn-server` maps each variant to etcd's gRPC code and
/// message in one place. Errors are cloned to every waiter of a failed batch, so a cause is
/// kept in a shared [`Failure`]; two errors compare equal when they are the same variant with
/// equal fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An auth request or permission check failed (each of etcd's auth errors).
    #[error("{0}")]
    Auth(#[from] crate::auth::AuthError),
    /// The key is empty (etcd: "key is not provided").
    #[error("the key is empty")]
    EmptyKey,
    /// The requested revision is below the compacted one, or for a compaction at or below it
    /// (etcd: ErrCompacted).
    #[error("revision {requested} has been compacted (the oldest kept is {compacted})")]
    Compacted {
        /// The revision asked for, by a read, a HashKV or a compaction.
        requested: i64,
        /// The store's compacted revision: reads at or above it succeed, and a compaction must
        /// be above it.
        compacted: i64,
    },
    /// The requested revision is after the current one (etcd: ErrFutureRev).
    #[error("revision {requested} is in the future (the current one is {current})")]
    FutureRevision {
        /// The revision asked for, by a read, a HashKV or a compaction.
        requested: i64,
        /// The store's current revision at the time.
        current: i64,
    },
    /// `ignore_value`/`ignore_lease` on a key that does not exist (etcd: "key not found").
    #[error("the key does not exist (ignore_value or ignore_lease needs it)")]
    KeyNotFound,
    /// `ignore_value` together with a value (etcd: "value is provided").
    #[error("a value was given with ignore_value")]
    ValueProvided,
    /// `ignore_lease` together with a lease (etcd: "lease is provided").
    #[error("a lease was given with ignore_lease")]
    LeaseProvided,
    /// A txn with more operations than allowed (etcd: "too many operations in txn request").
    #[error("a txn list holds {ops} operations, more than the {limit} allowed")]
    TooManyOps {
        /// The longest of the compare, success and failure lists of the offending txn (or
        /// nested txn).
        ops: usize,
        /// What that list may hold: [`crate::Config::max_txn_ops`], less the longest list of
        /// each enclosing txn (as etcd counts).
        limit: usize,
    },
    /// A txn that writes a key twice in one branch (etcd: "duplicate key given in txn request").
    #[error("a txn branch writes the same key twice")]
    DuplicateKey,
    /// The lease does not exist (etcd: "requested lease not found").
    #[error("the lease does not exist")]
    LeaseNotFound,
    /// A grant with the ID of an existing lease (etcd: "lease already exists").
    #[error("a lease with that ID already exists")]
    LeaseExists,
    /// A grant above the largest TTL (etcd: "too large lease TTL").
    #[error("the lease TTL is above the largest allowed")]
    LeaseTtlTooLarge,
    /// The NOSPACE alarm is raised: writes that add data fail until it is disarmed (etcd:
    /// "mvcc: database space exceeded").
    #[error("the backend quota is exhausted (the NOSPACE alarm is raised)")]
    NoSpace,
    /// The CORRUPT alarm is raised: a hash check found a member whose data differs from the
    /// others'. Writes fail everywhere, and reads on the member named, until it is disarmed
    /// (etcd: "etcdserver: corrupt cluster").
    #[error("the CORRUPT alarm is raised: a member's data differs from the others'")]
    Corrupt,
    /// The configuration failed validation.
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    /// The write-ahead log failed; its error is the source. A failed write or fsync poisons the
    /// log ([`Error::wal_poisoned`]): no write succeeds until the engine is reopened.
    #[error("wal: {0}")]
    Wal(#[source] Failure),
    /// A logged request could not be decoded: the log is damaged.
    #[error("corrupt log entry {index}: {reason}")]
    CorruptEntry {
        /// The log index of the entry.
        index: u64,
        /// Why its payload did not decode.
        reason: String,
    },
    /// Writing or reading the checkpoint failed, or it is damaged.
    #[error("checkpoint: {0}")]
    Checkpoint(#[source] Failure),
    /// Reading or writing the data files failed, or they are damaged.
    #[error("backend: {0}")]
    Backend(#[source] Failure),
    /// A snapshot could not be written or read, or it is damaged.
    #[error("snapshot: {0}")]
    Snapshot(#[source] Failure),
    /// The Raft leader changed while the request was in flight; it may or may not have been
    /// applied (etcd: "etcdserver: leader changed").
    #[error("the Raft leader changed while the request was in flight")]
    LeaderChanged,
    /// No Raft leader is known, so the request cannot be proposed (etcd: "etcdserver: no
    /// leader").
    #[error("no Raft leader is known")]
    NoLeader,
    /// The request was not answered in time; a write may still have been applied (etcd:
    /// "etcdserver: request timed out").
    #[error("the request was not answered in time")]
    Timeout,
    /// The request needs the leader and this member is not it (etcd: "etcdserver: not
    /// leader").
    #[error("this member is not the leader")]
    NotLeader,
    /// A leadership transfer to a member that is not a voter (etcd: "etcdserver: bad leader
    /// transferee").
    #[error("leadership can only move to a voting member")]
    BadLeaderTransferee,
    /// A membership change while another is still in progress.
    #[error("a membership change is already in progress")]
    ConfChangePending,
    /// Adding a member ID that is already a member (etcd: "etcdserver: ID exists").
    #[error("the member ID is already a member")]
    MemberExists,
    /// Removing or promoting an ID that is not a member (etcd: "etcdserver: member not
    /// found").
    #[error("no member has that ID")]
    MemberNotFound,
    /// Promoting a member that is not a learner (etcd: "etcdserver: can only promote a
    /// learner member").
    #[error("only a learner can be promoted")]
    MemberNotLearner,
    /// Promoting a learner that has not caught up with the leader (etcd: "etcdserver: can
    /// only promote a learner member which is in sync with leader").
    #[error("the learner has not caught up with the leader yet")]
    LearnerNotReady,
    /// The engine has been closed.
    #[error("engine is closed")]
    Closed,
    /// A call the API does not allow as made (a writing txn to `read_txn_async`, say): a bug in
    /// the caller, with what to do instead.
    #[error("API misuse: {0}")]
    Misuse(&'static str),
    /// Something to be written (a log entry, a membership change's context) did not encode.
    #[error("encode: {0}")]
    Encode(#[source] Failure),
    /// The engine cannot go on with the request: its own invariants would break (a bug or a
    /// damaged state), or raft-rs or the operating system failed it (the source says which).
    /// Never a bad request: those have variants of their own, and misuse is [`Error::Misuse`].
    #[error("internal error: {0}")]
    Internal(#[source] Failure),
}

impl Error {
    /// Whether trying again later may succeed: the group has no leader for now, is changing
    /// leaders, or did not answer in time. Other errors repeat until something changes (the
    /// request, the configuration, the data).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::NoLeader | Error::LeaderChanged | Error::Timeout | Error::NotLeader | Error::ConfChangePending
        )
    }

    /// Whether a write that failed so may have been applied all the same: it was proposed,
    /// and then the answer was lost (a leader change, a timeout). Retrying such a write must
    /// be safe to repeat, or check first what happened (a txn comparing a revision, say).
    pub fn outcome_unknown(&self) -> bool {
        matches!(self, Error::LeaderChanged | Error::Timeout)
    }
}

/// `std::result::Result` with the engine's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The I/O error at the bottom of this one, if the file system caused it (to tell a full
    /// disk, say, from a damaged file).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        let mut next = std::error::Error::source(self);
        while let Some(e) = next {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                return Some(io);
            }
            next = e.source();
        }
        None
    }

    /// Whether the write-ahead log is poisoned by a failed write or fsync: the engine must be
    /// closed and reopened, which recovers what is on disk.
    pub fn wal_poisoned(&self) -> bool {
        matches!(self, Error::Wal(f) if f.cause_as::<cairn_wal::Error>().is_some_and(|w| matches!(w, cairn_wal::Error::Poisoned { .. })))
    }

    pub(crate) fn internal(context: impl Into<String>) -> Error {
        Error::Internal(Failure::new(context))
    }
}

impl From<cairn_wal::Error> for Error {
    fn from(e: cairn_wal::Error) -> Error {
        Error::Wal(Failure::caused_by("the write-ahead log", e))
    }
}

/// What failed underneath an engine error: what the engine was doing or found, and the error
/// that caused it (an [`std::io::Error`], a [`cairn_wal::Error`], a `raft::Error`), kept whole
/// as the `source()` and shared by the clones an error is sent to every waiter as.
///
/// Two failures are equal when their text is (an I/O error's text names its kind and OS code).
#[derive(Debug, Clone)]
pub struct Failure {
    context: String,
    cause: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Failure {
    /// A failure the engine found itself (a damaged file, a broken invariant): no cause.
    pub fn new(context: impl Into<String>) -> Failure {
        Failure {
            context: context.into(),
            cause: None,
        }
    }

    /// A failure `cause` made while the engine did `context`.
    pub fn caused_by(context: impl Into<String>, cause: impl std::error::Error + Send + Sync + 'static) -> Failure {
        Failure {
            context: context.into(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// What the engine was doing, or what it found.
    pub fn context(&self) -> &str {
        &self.context
    }

    /// The cause, if it is an `E`.
    pub fn cause_as<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.cause.as_deref()?.downcast_ref::<E>()
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.cause {
            Some(cause) => write!(f, "{}: {cause}", self.context),
            None => f.write_str(&self.context),
        }
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_deref().map(|c| c as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for Failure {
    fn eq(&self, other: &Failure) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_those_a_retry_can_get_past() {
        for e in [Error::NoLeader, Error::LeaderChanged, Error::Timeout, Error::NotLeader] {
            assert!(e.is_transient(), "{e:?}");
        }
        for e in [Error::EmptyKey, Error::LeaseNotFound, Error::Closed, Error::NoSpace] {
            assert!(!e.is_transient(), "{e:?}");
        }
        assert!(Error::Timeout.outcome_unknown() && Error::LeaderChanged.outcome_unknown());
        assert!(!Error::NoLeader.outcome_unknown(), "never proposed");
    }

    #[test]
    fn causes_are_kept_and_shared() {
        let full = std::io::Error::from_raw_os_error(28); // ENOSPC
        let e = Error::Checkpoint(Failure::caused_by("write checkpoint.tmp", full));
        assert_eq!(e.io_error().map(|io| io.kind()), Some(std::io::ErrorKind::StorageFull));
        let copy = e.clone();
        assert_eq!(copy, e);
        let source = std::error::Error::source(&copy).unwrap();
        assert_eq!(
            source.to_string(),
            format!("write checkpoint.tmp: {}", std::io::Error::from_raw_os_error(28))
        );
        assert!(e.to_string().starts_with("checkpoint: write checkpoint.tmp: "), "{e}");
        assert!(Error::Checkpoint(Failure::new("damaged")).io_error().is_none());

        let poisoned: Error = cairn_wal::Error::Poisoned {
            op: "fdatasync",
            cause: "EIO".into(),
        }
        .into();
        assert!(poisoned.wal_poisoned());
        let wal_io: Error = cairn_wal::Error::Io {
            op: "open segment",
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        }
        .into();
        assert!(!wal_io.wal_poisoned());
        assert_eq!(
            wal_io.io_error().map(|io| io.kind()),
            Some(std::io::ErrorKind::PermissionDenied)
        );
    }
}
