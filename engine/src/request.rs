//! The requests that change state, as they are logged and applied.
//!
//! Every change to the state machine is the deterministic application of one [`Request`] at
//! one log index: two members that apply the same sequence reach the same state. Today the
//! single-node engine logs them in its WAL; with Raft they travel in raft-rs entries.
//!
//! Encoding: one format byte (1), then the request in postcard. A payload that does not decode
//! is corruption of the log, reported, never skipped.

use serde::{Deserialize, Serialize};

use crate::auth::AuthChange;
use crate::kv::txn::{DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, TxnRequest, TxnResponse};

const FORMAT_V1: u8 = 1;

/// A state-changing request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Raises (`activate`) or disarms an alarm.
    Alarm {
        activate: bool,
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
}

/// A member-wide alarm (etcd's `AlarmType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
}

/// Why a logged payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error("empty request payload")]
    Empty,
    #[error("unknown request format {0}")]
    UnknownFormat(u8),
    #[error("undecodable request: {0}")]
    Invalid(String),
}

impl Request {
    /// The entry's bytes: the format byte, then the request. A request that does not
    /// serialize is an error, never an entry that would not decode.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, crate::Error> {
        let mut out = vec![FORMAT_V1];
        let body = postcard::to_allocvec(self)
            .map_err(|e| crate::Error::Internal(format!("a request did not serialize for the log: {e}")))?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
        match bytes.split_first() {
            None => Err(DecodeError::Empty),
            Some((&FORMAT_V1, body)) => postcard::from_bytes(body).map_err(|e| DecodeError::Invalid(e.to_string())),
            Some((other, _)) => Err(DecodeError::UnknownFormat(*other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_roundtrip_and_garbage_is_refused() {
        let requests = [
            Request::Put(PutRequest {
                key: b"k".to_vec(),
                value: "v".into(),
                lease: 7,
                ..PutRequest::default()
            }),
            Request::Compact { revision: 42 },
            Request::Txn(TxnRequest::default()),
        ];
        for r in requests {
            assert_eq!(Request::decode(&r.encode().unwrap()), Ok(r));
        }
        assert_eq!(Request::decode(&[]), Err(DecodeError::Empty));
        assert_eq!(Request::decode(&[9, 1, 2]), Err(DecodeError::UnknownFormat(9)));
        assert!(matches!(
            Request::decode(&[1, 0xff, 0xff, 0xff]),
            Err(DecodeError::Invalid(_))
        ));
    }
}
