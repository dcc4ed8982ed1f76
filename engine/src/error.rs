//! The one error type of the `engine` crate.
//!
//! Variants are what a caller branches on; the server maps each to etcd's gRPC code and exact
//! message in one place (docs/compatibility.md).

/// Errors returned by the engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An auth request or permission check failed (each of etcd's auth errors).
    #[error("{0}")]
    Auth(#[from] crate::auth::AuthError),
    /// The key is empty (etcd: "key is not provided").
    #[error("key is not provided")]
    EmptyKey,
    /// The requested revision is below the compacted one, or for a compaction at or below it
    /// (etcd: ErrCompacted).
    #[error("mvcc: required revision has been compacted")]
    Compacted {
        /// The revision asked for, by a read, a HashKV or a compaction.
        requested: i64,
        /// The store's compacted revision: reads at or above it succeed, and a compaction must
        /// be above it.
        compacted: i64,
    },
    /// The requested revision is after the current one (etcd: ErrFutureRev).
    #[error("mvcc: required revision is a future revision")]
    FutureRevision {
        /// The revision asked for, by a read, a HashKV or a compaction.
        requested: i64,
        /// The store's current revision at the time.
        current: i64,
    },
    /// `ignore_value`/`ignore_lease` on a key that does not exist (etcd: "key not found").
    #[error("key not found")]
    KeyNotFound,
    /// `ignore_value` together with a value (etcd: "value is provided").
    #[error("value is provided")]
    ValueProvided,
    /// `ignore_lease` together with a lease (etcd: "lease is provided").
    #[error("lease is provided")]
    LeaseProvided,
    /// A txn with more operations than allowed (etcd: "too many operations in txn request").
    #[error("too many operations in txn request")]
    TooManyOps {
        /// The longest of the compare, success and failure lists of the offending txn (or
        /// nested txn).
        ops: usize,
        /// What that list may hold: [`crate::Config::max_txn_ops`], less the longest list of
        /// each enclosing txn (as etcd counts).
        limit: usize,
    },
    /// A txn that writes a key twice in one branch (etcd: "duplicate key given in txn request").
    #[error("duplicate key given in txn request")]
    DuplicateKey,
    /// The lease does not exist (etcd: "requested lease not found").
    #[error("requested lease not found")]
    LeaseNotFound,
    /// A grant with the ID of an existing lease (etcd: "lease already exists").
    #[error("lease already exists")]
    LeaseExists,
    /// A grant above the largest TTL (etcd: "too large lease TTL").
    #[error("too large lease TTL")]
    LeaseTtlTooLarge,
    /// The NOSPACE alarm is raised: writes that add data fail until it is disarmed (etcd:
    /// "mvcc: database space exceeded").
    #[error("mvcc: database space exceeded")]
    NoSpace,
    /// The configuration failed validation.
    #[error("invalid engine config: {0}")]
    InvalidConfig(String),
    /// The write-ahead log failed. When `poisoned`, no write can succeed until the engine is
    /// reopened.
    #[error("wal: {message}")]
    Wal {
        /// Whether a failed write or fsync poisoned the log (the WAL's `Poisoned` error).
        poisoned: bool,
        /// The text of the WAL's error.
        message: String,
    },
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
    Checkpoint(String),
    /// Reading or writing the data files failed, or they are damaged.
    #[error("backend: {0}")]
    Backend(String),
    /// A snapshot could not be written or read, or it is damaged.
    #[error("snapshot: {0}")]
    Snapshot(String),
    /// The Raft leader changed while the request was in flight; it may or may not have been
    /// applied (etcd: "etcdserver: leader changed").
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    /// No Raft leader is known, so the request cannot be proposed (etcd: "etcdserver: no
    /// leader").
    #[error("etcdserver: no leader")]
    NoLeader,
    /// The request was not answered in time; a write may still have been applied (etcd:
    /// "etcdserver: request timed out").
    #[error("etcdserver: request timed out")]
    Timeout,
    /// The request needs the leader and this member is not it (etcd: "etcdserver: not
    /// leader").
    #[error("etcdserver: not leader")]
    NotLeader,
    /// A leadership transfer to a member that is not a voter (etcd: "etcdserver: bad leader
    /// transferee").
    #[error("etcdserver: bad leader transferee")]
    BadLeaderTransferee,
    /// A membership change while another is still in progress.
    #[error("etcdserver: a membership change is already in progress")]
    ConfChangePending,
    /// Adding a member ID that is already a member (etcd: "etcdserver: ID exists").
    #[error("etcdserver: ID exists")]
    MemberExists,
    /// Removing or promoting an ID that is not a member (etcd: "etcdserver: member not
    /// found").
    #[error("etcdserver: member not found")]
    MemberNotFound,
    /// Promoting a member that is not a learner (etcd: "etcdserver: can only promote a
    /// learner member").
    #[error("etcdserver: can only promote a learner member")]
    MemberNotLearner,
    /// Promoting a learner that has not caught up with the leader (etcd: "etcdserver: can
    /// only promote a learner member which is in sync with leader").
    #[error("etcdserver: can only promote a learner member which is in sync with leader")]
    LearnerNotReady,
    /// The engine has been closed.
    #[error("engine is closed")]
    Closed,
    /// A call the API does not allow as made (a writing txn to `read_txn_async`, say): a bug in
    /// the caller, with what to do instead.
    #[error("API misuse: {0}")]
    Misuse(&'static str),
    /// Something to be written (a log entry, a membership change's context) did not encode.
    #[error("encoding {what}: {reason}")]
    Encode {
        /// What was being encoded.
        what: &'static str,
        /// The encoder's error.
        reason: String,
    },
    /// The store's own invariants would break: a bug or a damaged state, never a bad request.
    #[error("internal consistency error: {0}")]
    Internal(String),
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

impl From<cairn_wal::Error> for Error {
    fn from(e: cairn_wal::Error) -> Error {
        Error::Wal {
            poisoned: matches!(e, cairn_wal::Error::Poisoned { .. }),
            message: e.to_string(),
        }
    }
}

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
}
