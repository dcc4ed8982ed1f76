//! Every error a client sees, in one place: engine errors and the server's own checks mapped
//! to etcd's gRPC code and exact message (clients compare the text; docs/compatibility.md and
//! docs/security.md list them).

use cairn_engine::{AuthError, Error};
use tonic::{Code, Status};

/// Errors the server itself raises, before a request reaches the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The encoded request is larger than `--max-request-bytes`.
    #[error("etcdserver: request is too large")]
    RequestTooLarge,
    /// An unknown sort order or target.
    #[error("etcdserver: invalid sort option")]
    InvalidSortOption,
    /// The applied index lags too far behind the committed one.
    #[error("etcdserver: too many requests")]
    TooManyRequests,
    /// `hasleader` was asked for and there is no leader.
    #[error("etcdserver: no leader")]
    NoLeader,
    /// Peer URLs that do not parse.
    #[error("etcdserver: given member URLs are invalid")]
    InvalidMemberUrls,
    /// Peer URLs another member already has.
    #[error("etcdserver: Peer URLs already exists")]
    PeerUrlsExist,
    /// RangeStream with a sort order other than by key, ascending.
    #[error("RangeStream does not support custom sort orders")]
    StreamSort,
    /// RangeStream with revision filters.
    #[error("RangeStream does not support revision filters")]
    StreamFilters,
    /// A call a learner does not serve: anything but Status, Snapshot and a serializable Range.
    #[error("etcdserver: rpc not supported for learner")]
    NotForLearner,
}

impl From<Refusal> for Status {
    fn from(r: Refusal) -> Status {
        let code = match r {
            Refusal::RequestTooLarge | Refusal::InvalidSortOption | Refusal::InvalidMemberUrls => Code::InvalidArgument,
            Refusal::TooManyRequests => Code::ResourceExhausted,
            Refusal::NoLeader => Code::Unavailable,
            Refusal::PeerUrlsExist | Refusal::NotForLearner => Code::FailedPrecondition,
            Refusal::StreamSort | Refusal::StreamFilters => Code::Unimplemented,
        };
        Status::new(code, r.to_string())
    }
}

/// etcd's status for an auth error.
pub fn auth_status(e: AuthError) -> Status {
    let code = match e {
        // Not one of etcd's gRPC errors: it reaches clients as Go's error, code Unknown.
        AuthError::NoPasswordUser => return Status::unknown(format!("auth: {e}")),
        AuthError::PermissionDenied => Code::PermissionDenied,
        AuthError::InvalidToken => Code::Unauthenticated,
        AuthError::Failed
        | AuthError::UserEmpty
        | AuthError::RoleEmpty
        | AuthError::PermissionNotGiven
        | AuthError::InvalidManagement
        | AuthError::OldRevision => Code::InvalidArgument,
        AuthError::NotEnabled
        | AuthError::UserExists
        | AuthError::UserNotFound
        | AuthError::RoleExists
        | AuthError::RoleNotFound
        | AuthError::RootUserMissing
        | AuthError::RootRoleMissing
        | AuthError::PermissionNotGranted
        | AuthError::RoleNotGranted => Code::FailedPrecondition,
    };
    Status::new(code, format!("etcdserver: {e}"))
}

/// etcd's code and message for an engine error. One etcd has no text for (an I/O, WAL or
/// other internal failure) is logged and answered as `Internal`, `etcdserver: ` and the
/// engine's own message.
pub fn status(e: &Error) -> Status {
    let (code, message): (Code, &str) = match e {
        Error::Auth(a) => return auth_status(*a),
        Error::EmptyKey => (Code::InvalidArgument, "etcdserver: key is not provided"),
        Error::KeyNotFound => (Code::InvalidArgument, "etcdserver: key not found"),
        Error::ValueProvided => (Code::InvalidArgument, "etcdserver: value is provided"),
        Error::LeaseProvided => (Code::InvalidArgument, "etcdserver: lease is provided"),
        Error::TooManyOps { .. } => (Code::InvalidArgument, "etcdserver: too many operations in txn request"),
        Error::DuplicateKey => (Code::InvalidArgument, "etcdserver: duplicate key given in txn request"),
        Error::Compacted { .. } => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        ),
        Error::FutureRevision { .. } => (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision is a future revision",
        ),
        Error::NoSpace => (Code::ResourceExhausted, "etcdserver: mvcc: database space exceeded"),
        Error::Corrupt => (Code::DataLoss, "etcdserver: corrupt cluster"),
        Error::LeaseNotFound => (Code::NotFound, "etcdserver: requested lease not found"),
        Error::LeaseExists => (Code::FailedPrecondition, "etcdserver: lease already exists"),
        Error::LeaseTtlTooLarge => (Code::OutOfRange, "etcdserver: too large lease TTL"),
        Error::MemberExists => (Code::FailedPrecondition, "etcdserver: member ID already exist"),
        Error::MemberNotFound => (Code::NotFound, "etcdserver: member not found"),
        Error::MemberNotLearner => (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member",
        ),
        Error::LearnerNotReady => (
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member which is in sync with leader",
        ),
        Error::NoLeader => (Code::Unavailable, "etcdserver: no leader"),
        Error::NotLeader => (Code::FailedPrecondition, "etcdserver: not leader"),
        Error::LeaderChanged => (Code::Unavailable, "etcdserver: leader changed"),
        Error::Timeout => (Code::Unavailable, "etcdserver: request timed out"),
        Error::BadLeaderTransferee => (Code::FailedPrecondition, "etcdserver: bad leader transferee"),
        Error::ConfChangePending => (
            Code::FailedPrecondition,
            "etcdserver: re-configuration failed due to not enough started members",
        ),
        Error::Closed => (Code::Unavailable, "etcdserver: server stopped"),
        Error::CorruptEntry { .. } => (Code::DataLoss, "etcdserver: corrupt cluster"),
        other => {
            tracing::error!(error = %other, "request failed inside the engine");
            return Status::new(Code::Internal, format!("etcdserver: {other}"));
        }
    };
    Status::new(code, message)
}

/// Engine results as tonic results.
pub trait IntoStatus<T> {
    /// The value, or the error as etcd's status.
    fn or_status(self) -> Result<T, Status>;
}

impl<T> IntoStatus<T> for cairn_engine::Result<T> {
    fn or_status(self) -> Result<T, Status> {
        self.map_err(|e| status(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_etcds() {
        let cases = [
            (
                Error::EmptyKey,
                Code::InvalidArgument,
                "etcdserver: key is not provided",
            ),
            (
                Error::Compacted {
                    requested: 1,
                    compacted: 5,
                },
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                Error::LeaseNotFound,
                Code::NotFound,
                "etcdserver: requested lease not found",
            ),
            (Error::Timeout, Code::Unavailable, "etcdserver: request timed out"),
            (Error::NotLeader, Code::FailedPrecondition, "etcdserver: not leader"),
        ];
        for (e, code, message) in cases {
            let s = status(&e);
            assert_eq!((s.code(), s.message()), (code, message), "{e:?}");
        }
        let s = Status::from(Refusal::RequestTooLarge);
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "etcdserver: request is too large")
        );
    }
}
