//! The requests that change state, as they are logged and applied.
//!
//! Every change to the state machine is the deterministic application of one [`Request`] at
//! one log index: two members that apply the same sequence reach the same state.
//!
//! These are the engine's own types; the log holds them in its own format
//! ([`crate::format::entry`]), converted at the boundary.

use crate::auth::AuthChange;
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};

/// A state-changing request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    Put(PutRequest),
    DeleteRange(DeleteRangeRequest),
    Txn(TxnRequest),
    Compact {
        revision: i64,
    },
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    /// Remaining TTLs, in seconds, of the listed leases.
    LeaseCheckpoint {
        remaining: Vec<(i64, i64)>,
    },
    /// Replaces member `id`'s peer URLs.
    MemberUpdate {
        id: u64,
        peer_urls: Vec<String>,
    },
    /// Member `id` publishes its name and client URLs.
    MemberPublish {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
    /// Raises (`activate`) or disarms `alarm` of `member` (0 for none in particular, as
    /// etcd stores an alarm activated with member ID 0).
    Alarm {
        activate: bool,
        member: u64,
        alarm: Alarm,
    },
    /// A change to the auth store.
    Auth(AuthChange),
    /// A simple token for `name`: `prefix` and the entry's index, registered on every member
    /// if the auth store is still at `checked_revision` (where the password was checked).
    Authenticate {
        name: String,
        prefix: String,
        checked_revision: u64,
    },
    /// `request`, permitted by the auth store at `auth_revision`: refused if the store has
    /// changed since (etcd's "revision of auth store is old").
    Guarded {
        auth_revision: u64,
        request: Box<Request>,
    },
    /// The members agreed this cluster version (`crate::version`).
    ClusterVersion(crate::version::Version),
    /// A downgrade to `target` is enabled, or (`None`) cancelled or done.
    Downgrade {
        target: Option<crate::version::Version>,
    },
}

impl Request {
    /// The log's edge: a committed entry's request checked as a client's is where it entered
    /// (keys given, flags that exclude each other, no key written twice in a branch), for an
    /// entry whatever proposed it, a peer or an older release. Only what every member judges
    /// alike: not the size limits of one member's configuration, so that every member refuses
    /// the same entries.
    pub(crate) fn check(&self) -> crate::Result<()> {
        match self {
            Request::Put(p) => p.validate(),
            Request::DeleteRange(d) => d.validate(),
            Request::Txn(t) => t.validate(usize::MAX),
            Request::Guarded { request, .. } => request.check(),
            _ => Ok(()),
        }
    }
}

/// An alarm (etcd's `AlarmType`), raised for a member (etcd's `AlarmMember`: the engine keeps
/// `(member ID, Alarm)` pairs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Alarm {
    /// The backend reached its quota: writes that add data fail.
    NoSpace,
    /// A hash check found members disagreeing.
    Corrupt,
}

/// The outcome of applying a [`Request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Response {
    Put(PutResponse),
    DeleteRange(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact,
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke,
    LeaseCheckpoint,
    Alarm,
    /// A membership change was applied.
    ConfChange,
    /// A member's attributes changed.
    Member,
    /// An auth change was applied.
    Auth,
    /// A simple token was registered.
    Authenticated {
        token: String,
    },
    /// The agreed versions changed.
    Versions,
}
