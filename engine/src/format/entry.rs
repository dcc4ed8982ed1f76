//! Log entries, format 1: one format byte (1), then an [`Entry`] in postcard.
//!
//! Every change to the state machine is one entry; two members that apply the same entries
//! reach the same state, so these bytes must mean the same thing to every version that reads
//! them. A payload that does not decode is damage to the log, reported, never skipped.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::request::Request;
use crate::version::{ClusterVersions, Feature, Version};

const FORMAT_V1: u8 = 1;

/// The API's types, which convert to and from the format's.
mod api {
    pub(super) use crate::auth::{Access, AuthChange, Permission};
    pub(super) use crate::kv::range::{RangeRequest, SortOrder, SortTarget};
    pub(super) use crate::kv::txn::{
        Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
    };
    pub(super) use crate::request::Alarm;
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

/// The entry's bytes: the format byte, then the request, in the forms every member of a
/// cluster at `versions` decodes. A request that does not serialize is an error, never an
/// entry that would not decode.
pub(crate) fn encode(request: Request, versions: &ClusterVersions) -> crate::Result<Vec<u8>> {
    postcard::to_extend(&Entry::new(request, versions), vec![FORMAT_V1])
        .map_err(|e| crate::Error::Encode(crate::Failure::caused_by("a log entry", e)))
}

/// The request an entry holds.
pub(crate) fn decode(bytes: &[u8]) -> Result<Request, DecodeError> {
    match bytes.split_first() {
        None => Err(DecodeError::Empty),
        Some((&FORMAT_V1, body)) => postcard::from_bytes::<Entry>(body)
            .map(Request::from)
            .map_err(|e| DecodeError::Invalid(e.to_string())),
        Some((other, _)) => Err(DecodeError::UnknownFormat(*other)),
    }
}

// Format 1. Variants and fields are in their order on disk: reorder nothing, add no field. A new
// request is a variant appended at the end (the variants before it keep their bytes), as
// `MemberAlarm` was; what replaces a variant leaves the old one decoding. A new variant is
// written only once the cluster version allows it (a `Feature`, `Entry::new`): a member on an
// older release would not decode it.

#[derive(Serialize, Deserialize)]
enum Entry {
    Put(Put),
    DeleteRange(DeleteRange),
    Txn(Txn),
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
    LeaseCheckpoint {
        remaining: Vec<(i64, i64)>,
    },
    MemberUpdate {
        id: u64,
        peer_urls: Vec<String>,
    },
    MemberPublish {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
    /// Written before alarms had a member; read as member 0's.
    Alarm {
        activate: bool,
        alarm: Alarm,
    },
    Auth(AuthChange),
    Authenticate {
        name: String,
        prefix: String,
        checked_revision: u64,
    },
    Guarded {
        auth_revision: u64,
        request: Box<Entry>,
    },
    MemberAlarm {
        activate: bool,
        member: u64,
        alarm: Alarm,
    },
    /// From 0.2 (`Feature::Versions`).
    ClusterVersion {
        major: u32,
        minor: u32,
    },
    /// From 0.2 (`Feature::Versions`).
    Downgrade {
        target: Option<(u32, u32)>,
    },
}

#[derive(Serialize, Deserialize)]
struct Put {
    key: Vec<u8>,
    value: Bytes,
    lease: i64,
    prev_kv: bool,
    ignore_value: bool,
    ignore_lease: bool,
}

#[derive(Serialize, Deserialize)]
struct DeleteRange {
    key: Vec<u8>,
    range_end: Vec<u8>,
    prev_kv: bool,
}

#[derive(Serialize, Deserialize)]
struct Txn {
    compare: Vec<Compare>,
    success: Vec<Op>,
    failure: Vec<Op>,
}

#[derive(Serialize, Deserialize)]
struct Compare {
    key: Vec<u8>,
    range_end: Vec<u8>,
    target: Target,
    result: Relation,
}

#[derive(Serialize, Deserialize)]
enum Target {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Bytes),
    Lease(i64),
}

#[derive(Serialize, Deserialize)]
enum Relation {
    Equal,
    Greater,
    Less,
    NotEqual,
}

#[derive(Serialize, Deserialize)]
enum Op {
    Range(Range),
    Put(Put),
    DeleteRange(DeleteRange),
    Txn(Txn),
}

#[derive(Serialize, Deserialize)]
struct Range {
    key: Vec<u8>,
    range_end: Vec<u8>,
    limit: i64,
    revision: i64,
    sort_order: SortOrder,
    sort_target: SortTarget,
    serializable: bool,
    keys_only: bool,
    count_only: bool,
    min_mod_revision: i64,
    max_mod_revision: i64,
    min_create_revision: i64,
    max_create_revision: i64,
}

#[derive(Serialize, Deserialize)]
enum SortOrder {
    None,
    Ascend,
    Descend,
}

#[derive(Serialize, Deserialize)]
enum SortTarget {
    Key,
    Version,
    Create,
    Mod,
    Value,
}

/// Shared with [`super::state`]'s auth store.
#[derive(Clone, Copy, Serialize, Deserialize)]
pub(super) enum Alarm {
    NoSpace,
    Corrupt,
}

#[derive(Serialize, Deserialize)]
enum AuthChange {
    Enable,
    Disable,
    UserAdd {
        name: String,
        password_hash: Option<String>,
        no_password: bool,
    },
    UserDelete {
        name: String,
    },
    UserChangePassword {
        name: String,
        password_hash: Option<String>,
    },
    UserGrantRole {
        user: String,
        role: String,
    },
    UserRevokeRole {
        name: String,
        role: String,
    },
    RoleAdd {
        name: String,
    },
    RoleDelete {
        name: String,
    },
    RoleGrantPermission {
        name: String,
        permission: Permission,
    },
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
}

/// Shared with [`super::state`]'s auth store.
#[derive(Serialize, Deserialize)]
pub(super) struct Permission {
    access: Access,
    key: Vec<u8>,
    range_end: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
enum Access {
    Read,
    Write,
    ReadWrite,
}

// The conversions, both ways, each a move of the same fields.

/// Whether `request` is written differently at different cluster versions: only such a
/// request needs the agreed versions to be encoded (a put does not wait for the state's lock).
pub(crate) fn gated(request: &Request) -> bool {
    match request {
        Request::Alarm { .. } => true,
        Request::Guarded { request, .. } => gated(request),
        _ => false,
    }
}

impl Entry {
    /// `r` in the forms a cluster at `versions` decodes. Keep [`gated`] in step.
    fn new(r: Request, versions: &ClusterVersions) -> Entry {
        match r {
            Request::Put(p) => Entry::Put(p.into()),
            Request::DeleteRange(d) => Entry::DeleteRange(d.into()),
            Request::Txn(t) => Entry::Txn(t.into()),
            Request::Compact { revision } => Entry::Compact { revision },
            Request::LeaseGrant { id, ttl } => Entry::LeaseGrant { id, ttl },
            Request::LeaseRevoke { id } => Entry::LeaseRevoke { id },
            Request::LeaseCheckpoint { remaining } => Entry::LeaseCheckpoint { remaining },
            Request::MemberUpdate { id, peer_urls } => Entry::MemberUpdate { id, peer_urls },
            Request::MemberPublish { id, name, client_urls } => Entry::MemberPublish { id, name, client_urls },
            Request::Alarm {
                activate,
                member,
                alarm,
            } if versions.allows(Feature::MemberAlarm) => Entry::MemberAlarm {
                activate,
                member,
                alarm: alarm.into(),
            },
            // Builds before 0.2 may not know `MemberAlarm`: the alarm goes without its member,
            // and every member holds it as member 0's.
            Request::Alarm { activate, alarm, .. } => Entry::Alarm {
                activate,
                alarm: alarm.into(),
            },
            Request::Auth(change) => Entry::Auth(change.into()),
            Request::Authenticate {
                name,
                prefix,
                checked_revision,
            } => Entry::Authenticate {
                name,
                prefix,
                checked_revision,
            },
            Request::Guarded { auth_revision, request } => Entry::Guarded {
                auth_revision,
                request: Box::new(Entry::new(*request, versions)),
            },
            // Proposed only once every member reports 0.2 or later (the server's version
            // monitor), or at a cluster version that allows them.
            Request::ClusterVersion(v) => Entry::ClusterVersion {
                major: v.major,
                minor: v.minor,
            },
            Request::Downgrade { target } => Entry::Downgrade {
                target: target.map(|v| (v.major, v.minor)),
            },
        }
    }
}

impl From<Entry> for Request {
    fn from(e: Entry) -> Request {
        match e {
            Entry::Put(p) => Request::Put(p.into()),
            Entry::DeleteRange(d) => Request::DeleteRange(d.into()),
            Entry::Txn(t) => Request::Txn(t.into()),
            Entry::Compact { revision } => Request::Compact { revision },
            Entry::LeaseGrant { id, ttl } => Request::LeaseGrant { id, ttl },
            Entry::LeaseRevoke { id } => Request::LeaseRevoke { id },
            Entry::LeaseCheckpoint { remaining } => Request::LeaseCheckpoint { remaining },
            Entry::MemberUpdate { id, peer_urls } => Request::MemberUpdate { id, peer_urls },
            Entry::MemberPublish { id, name, client_urls } => Request::MemberPublish { id, name, client_urls },
            Entry::Alarm { activate, alarm } => Request::Alarm {
                activate,
                member: 0,
                alarm: alarm.into(),
            },
            Entry::MemberAlarm {
                activate,
                member,
                alarm,
            } => Request::Alarm {
                activate,
                member,
                alarm: alarm.into(),
            },
            Entry::Auth(change) => Request::Auth(change.into()),
            Entry::Authenticate {
                name,
                prefix,
                checked_revision,
            } => Request::Authenticate {
                name,
                prefix,
                checked_revision,
            },
            Entry::Guarded { auth_revision, request } => Request::Guarded {
                auth_revision,
                request: Box::new((*request).into()),
            },
            Entry::ClusterVersion { major, minor } => Request::ClusterVersion(Version::new(major, minor)),
            Entry::Downgrade { target } => Request::Downgrade {
                target: target.map(|(major, minor)| Version::new(major, minor)),
            },
        }
    }
}

impl From<api::PutRequest> for Put {
    fn from(p: api::PutRequest) -> Put {
        Put {
            key: p.key,
            value: p.value,
            lease: p.lease,
            prev_kv: p.prev_kv,
            ignore_value: p.ignore_value,
            ignore_lease: p.ignore_lease,
        }
    }
}

impl From<Put> for api::PutRequest {
    fn from(p: Put) -> api::PutRequest {
        api::PutRequest {
            key: p.key,
            value: p.value,
            lease: p.lease,
            prev_kv: p.prev_kv,
            ignore_value: p.ignore_value,
            ignore_lease: p.ignore_lease,
        }
    }
}

impl From<api::DeleteRangeRequest> for DeleteRange {
    fn from(d: api::DeleteRangeRequest) -> DeleteRange {
        DeleteRange {
            key: d.key,
            range_end: d.range_end,
            prev_kv: d.prev_kv,
        }
    }
}

impl From<DeleteRange> for api::DeleteRangeRequest {
    fn from(d: DeleteRange) -> api::DeleteRangeRequest {
        api::DeleteRangeRequest {
            key: d.key,
            range_end: d.range_end,
            prev_kv: d.prev_kv,
        }
    }
}

fn convert<A: Into<B>, B>(items: Vec<A>) -> Vec<B> {
    items.into_iter().map(Into::into).collect()
}

impl From<api::TxnRequest> for Txn {
    fn from(t: api::TxnRequest) -> Txn {
        Txn {
            compare: convert(t.compare),
            success: convert(t.success),
            failure: convert(t.failure),
        }
    }
}

impl From<Txn> for api::TxnRequest {
    fn from(t: Txn) -> api::TxnRequest {
        api::TxnRequest {
            compare: convert(t.compare),
            success: convert(t.success),
            failure: convert(t.failure),
        }
    }
}

impl From<api::Compare> for Compare {
    fn from(c: api::Compare) -> Compare {
        use api::CompareResult as R;
        use api::CompareTarget as T;
        Compare {
            key: c.key,
            range_end: c.range_end,
            target: match c.target {
                T::Version(v) => Target::Version(v),
                T::Create(v) => Target::Create(v),
                T::Mod(v) => Target::Mod(v),
                T::Value(v) => Target::Value(v),
                T::Lease(v) => Target::Lease(v),
            },
            result: match c.result {
                R::Equal => Relation::Equal,
                R::Greater => Relation::Greater,
                R::Less => Relation::Less,
                R::NotEqual => Relation::NotEqual,
            },
        }
    }
}

impl From<Compare> for api::Compare {
    fn from(c: Compare) -> api::Compare {
        use api::CompareResult as R;
        use api::CompareTarget as T;
        api::Compare {
            key: c.key,
            range_end: c.range_end,
            target: match c.target {
                Target::Version(v) => T::Version(v),
                Target::Create(v) => T::Create(v),
                Target::Mod(v) => T::Mod(v),
                Target::Value(v) => T::Value(v),
                Target::Lease(v) => T::Lease(v),
            },
            result: match c.result {
                Relation::Equal => R::Equal,
                Relation::Greater => R::Greater,
                Relation::Less => R::Less,
                Relation::NotEqual => R::NotEqual,
            },
        }
    }
}

impl From<api::RequestOp> for Op {
    fn from(op: api::RequestOp) -> Op {
        match op {
            api::RequestOp::Range(r) => Op::Range(r.into()),
            api::RequestOp::Put(p) => Op::Put(p.into()),
            api::RequestOp::DeleteRange(d) => Op::DeleteRange(d.into()),
            api::RequestOp::Txn(t) => Op::Txn(t.into()),
        }
    }
}

impl From<Op> for api::RequestOp {
    fn from(op: Op) -> api::RequestOp {
        match op {
            Op::Range(r) => api::RequestOp::Range(r.into()),
            Op::Put(p) => api::RequestOp::Put(p.into()),
            Op::DeleteRange(d) => api::RequestOp::DeleteRange(d.into()),
            Op::Txn(t) => api::RequestOp::Txn(t.into()),
        }
    }
}

impl From<api::RangeRequest> for Range {
    fn from(r: api::RangeRequest) -> Range {
        Range {
            key: r.key,
            range_end: r.range_end,
            limit: r.limit,
            revision: r.revision,
            sort_order: match r.sort_order {
                api::SortOrder::None => SortOrder::None,
                api::SortOrder::Ascend => SortOrder::Ascend,
                api::SortOrder::Descend => SortOrder::Descend,
            },
            sort_target: match r.sort_target {
                api::SortTarget::Key => SortTarget::Key,
                api::SortTarget::Version => SortTarget::Version,
                api::SortTarget::Create => SortTarget::Create,
                api::SortTarget::Mod => SortTarget::Mod,
                api::SortTarget::Value => SortTarget::Value,
            },
            serializable: r.serializable,
            keys_only: r.keys_only,
            count_only: r.count_only,
            min_mod_revision: r.min_mod_revision,
            max_mod_revision: r.max_mod_revision,
            min_create_revision: r.min_create_revision,
            max_create_revision: r.max_create_revision,
        }
    }
}

impl From<Range> for api::RangeRequest {
    fn from(r: Range) -> api::RangeRequest {
        api::RangeRequest {
            key: r.key,
            range_end: r.range_end,
            limit: r.limit,
            revision: r.revision,
            sort_order: match r.sort_order {
                SortOrder::None => api::SortOrder::None,
                SortOrder::Ascend => api::SortOrder::Ascend,
                SortOrder::Descend => api::SortOrder::Descend,
            },
            sort_target: match r.sort_target {
                SortTarget::Key => api::SortTarget::Key,
                SortTarget::Version => api::SortTarget::Version,
                SortTarget::Create => api::SortTarget::Create,
                SortTarget::Mod => api::SortTarget::Mod,
                SortTarget::Value => api::SortTarget::Value,
            },
            serializable: r.serializable,
            keys_only: r.keys_only,
            count_only: r.count_only,
            min_mod_revision: r.min_mod_revision,
            max_mod_revision: r.max_mod_revision,
            min_create_revision: r.min_create_revision,
            max_create_revision: r.max_create_revision,
        }
    }
}

impl From<api::Alarm> for Alarm {
    fn from(a: api::Alarm) -> Alarm {
        match a {
            api::Alarm::NoSpace => Alarm::NoSpace,
            api::Alarm::Corrupt => Alarm::Corrupt,
        }
    }
}

impl From<Alarm> for api::Alarm {
    fn from(a: Alarm) -> api::Alarm {
        match a {
            Alarm::NoSpace => api::Alarm::NoSpace,
            Alarm::Corrupt => api::Alarm::Corrupt,
        }
    }
}

impl From<api::AuthChange> for AuthChange {
    fn from(c: api::AuthChange) -> AuthChange {
        use api::AuthChange as A;
        match c {
            A::Enable => AuthChange::Enable,
            A::Disable => AuthChange::Disable,
            A::UserAdd {
                name,
                password_hash,
                no_password,
            } => AuthChange::UserAdd {
                name,
                password_hash,
                no_password,
            },
            A::UserDelete { name } => AuthChange::UserDelete { name },
            A::UserChangePassword { name, password_hash } => AuthChange::UserChangePassword { name, password_hash },
            A::UserGrantRole { user, role } => AuthChange::UserGrantRole { user, role },
            A::UserRevokeRole { name, role } => AuthChange::UserRevokeRole { name, role },
            A::RoleAdd { name } => AuthChange::RoleAdd { name },
            A::RoleDelete { name } => AuthChange::RoleDelete { name },
            A::RoleGrantPermission { name, permission } => AuthChange::RoleGrantPermission {
                name,
                permission: permission.into(),
            },
            A::RoleRevokePermission { role, key, range_end } => {
                AuthChange::RoleRevokePermission { role, key, range_end }
            }
        }
    }
}

impl From<AuthChange> for api::AuthChange {
    fn from(c: AuthChange) -> api::AuthChange {
        use api::AuthChange as A;
        match c {
            AuthChange::Enable => A::Enable,
            AuthChange::Disable => A::Disable,
            AuthChange::UserAdd {
                name,
                password_hash,
                no_password,
            } => A::UserAdd {
                name,
                password_hash,
                no_password,
            },
            AuthChange::UserDelete { name } => A::UserDelete { name },
            AuthChange::UserChangePassword { name, password_hash } => A::UserChangePassword { name, password_hash },
            AuthChange::UserGrantRole { user, role } => A::UserGrantRole { user, role },
            AuthChange::UserRevokeRole { name, role } => A::UserRevokeRole { name, role },
            AuthChange::RoleAdd { name } => A::RoleAdd { name },
            AuthChange::RoleDelete { name } => A::RoleDelete { name },
            AuthChange::RoleGrantPermission { name, permission } => A::RoleGrantPermission {
                name,
                permission: permission.into(),
            },
            AuthChange::RoleRevokePermission { role, key, range_end } => {
                A::RoleRevokePermission { role, key, range_end }
            }
        }
    }
}

impl From<api::Permission> for Permission {
    fn from(p: api::Permission) -> Permission {
        Permission {
            access: match p.access {
                api::Access::Read => Access::Read,
                api::Access::Write => Access::Write,
                api::Access::ReadWrite => Access::ReadWrite,
            },
            key: p.key,
            range_end: p.range_end,
        }
    }
}

impl From<Permission> for api::Permission {
    fn from(p: Permission) -> api::Permission {
        api::Permission {
            access: match p.access {
                Access::Read => api::Access::Read,
                Access::Write => api::Access::Write,
                Access::ReadWrite => api::Access::ReadWrite,
            },
            key: p.key,
            range_end: p.range_end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One request of every kind, every variant of every enum inside them included.
    fn samples() -> Vec<Request> {
        use crate::auth::{Access, AuthChange, Permission};
        use crate::kv::range::{RangeRequest, SortOrder, SortTarget};
        use crate::kv::txn::{
            Compare, CompareResult, CompareTarget, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
        };
        let put = PutRequest {
            key: b"k".to_vec(),
            value: "v".into(),
            lease: 7,
            prev_kv: true,
            ignore_value: false,
            ignore_lease: true,
        };
        let delete = DeleteRangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            prev_kv: true,
        };
        let ranges = [
            (SortOrder::None, SortTarget::Key),
            (SortOrder::Ascend, SortTarget::Version),
            (SortOrder::Descend, SortTarget::Create),
            (SortOrder::None, SortTarget::Mod),
            (SortOrder::Ascend, SortTarget::Value),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, (sort_order, sort_target))| {
            RequestOp::Range(RangeRequest {
                key: vec![b'r', i as u8],
                range_end: vec![0],
                limit: 10 + i as i64,
                revision: 300,
                sort_order,
                sort_target,
                serializable: i % 2 == 0,
                keys_only: i % 3 == 0,
                count_only: i == 4,
                min_mod_revision: 1,
                max_mod_revision: 2,
                min_create_revision: 3,
                max_create_revision: 4,
            })
        });
        let compares = [
            (CompareTarget::Version(1), CompareResult::Equal),
            (CompareTarget::Create(2), CompareResult::Greater),
            (CompareTarget::Mod(3), CompareResult::Less),
            (CompareTarget::Value("x".into()), CompareResult::NotEqual),
            (CompareTarget::Lease(5), CompareResult::Equal),
        ]
        .into_iter()
        .map(|(target, result)| Compare {
            key: b"c".to_vec(),
            range_end: b"d".to_vec(),
            target,
            result,
        })
        .collect();
        let txn = TxnRequest {
            compare: compares,
            success: ranges
                .chain([RequestOp::Put(put.clone()), RequestOp::DeleteRange(delete.clone())])
                .collect(),
            failure: vec![RequestOp::Txn(TxnRequest {
                compare: vec![],
                success: vec![RequestOp::Put(put.clone())],
                failure: vec![],
            })],
        };
        let permission = |access, key: &[u8]| Permission {
            access,
            key: key.to_vec(),
            range_end: b"z".to_vec(),
        };
        let auth = [
            AuthChange::Enable,
            AuthChange::Disable,
            AuthChange::UserAdd {
                name: "u".into(),
                password_hash: Some("$2b$".into()),
                no_password: false,
            },
            AuthChange::UserAdd {
                name: "cert".into(),
                password_hash: None,
                no_password: true,
            },
            AuthChange::UserDelete { name: "u".into() },
            AuthChange::UserChangePassword {
                name: "u".into(),
                password_hash: Some("h".into()),
            },
            AuthChange::UserGrantRole {
                user: "u".into(),
                role: "r".into(),
            },
            AuthChange::UserRevokeRole {
                name: "u".into(),
                role: "r".into(),
            },
            AuthChange::RoleAdd { name: "r".into() },
            AuthChange::RoleDelete { name: "r".into() },
            AuthChange::RoleGrantPermission {
                name: "r".into(),
                permission: permission(Access::Read, b"a"),
            },
            AuthChange::RoleGrantPermission {
                name: "r".into(),
                permission: permission(Access::Write, b"b"),
            },
            AuthChange::RoleGrantPermission {
                name: "r".into(),
                permission: permission(Access::ReadWrite, b"c"),
            },
            AuthChange::RoleRevokePermission {
                role: "r".into(),
                key: b"a".to_vec(),
                range_end: vec![],
            },
        ];
        let mut out = vec![
            Request::Put(put.clone()),
            Request::DeleteRange(delete),
            Request::Txn(txn),
            Request::Compact { revision: 42 },
            Request::LeaseGrant { id: 9, ttl: 60 },
            Request::LeaseRevoke { id: 9 },
            Request::LeaseCheckpoint {
                remaining: vec![(9, 30), (10, 1)],
            },
            Request::MemberUpdate {
                id: 0xdead_beef_0000_0001,
                peer_urls: vec!["http://a:2380".into(), "http://b:2380".into()],
            },
            Request::MemberPublish {
                id: 3,
                name: "m".into(),
                client_urls: vec!["http://a:2379".into()],
            },
            Request::Alarm {
                activate: true,
                member: 0,
                alarm: api::Alarm::NoSpace,
            },
            Request::Alarm {
                activate: false,
                member: 0x8e9e_05c5_2164_694d,
                alarm: api::Alarm::Corrupt,
            },
            Request::Authenticate {
                name: "u".into(),
                prefix: "tok".into(),
                checked_revision: 12,
            },
            Request::Guarded {
                auth_revision: 13,
                request: Box::new(Request::Put(put)),
            },
        ];
        out.extend(auth.into_iter().map(Request::Auth));
        out.extend([
            Request::ClusterVersion(Version::new(0, 2)),
            Request::Downgrade {
                target: Some(Version::new(0, 1)),
            },
            Request::Downgrade { target: None },
        ]);
        out
    }

    /// A cluster whose members all decode every form this build writes.
    const AGREED: ClusterVersions = ClusterVersions {
        cluster: Some(Version::new(0, 2)),
        downgrade: None,
    };

    /// Format 1's bytes for each of [`samples`], as written before the format had its own
    /// types: every later version must write and read exactly these.
    const GOLDEN: &str = include_str!("entry_v1.golden");

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn format_1_is_byte_for_byte_what_it_was() {
        let samples = samples();
        let golden: Vec<&str> = GOLDEN.lines().collect();
        assert_eq!(samples.len(), golden.len());
        for (request, expected) in samples.into_iter().zip(golden) {
            let bytes = encode(request.clone(), &AGREED).unwrap();
            assert_eq!(hex(&bytes), expected, "{request:?}");
            assert_eq!(decode(&bytes), Ok(request));
        }
    }

    /// Alarms as format 1 wrote them before they had a member: read as member 0's.
    #[test]
    fn alarms_without_a_member_are_member_0s() {
        let legacy = [
            ("01090100", true, api::Alarm::NoSpace),
            ("01090001", false, api::Alarm::Corrupt),
        ];
        for (hex, activate, alarm) in legacy {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let request = Request::Alarm {
                activate,
                member: 0,
                alarm,
            };
            assert_eq!(decode(&bytes), Ok(request));
        }
    }

    /// Until the cluster version allows `MemberAlarm`, alarms are written as the builds before
    /// 0.2 wrote them (member 0's); everything else is written as it always was.
    #[test]
    fn below_0_2_alarms_are_written_without_their_member() {
        let unversioned = ClusterVersions::default();
        let raise = Request::Alarm {
            activate: true,
            member: 0x8e9e_05c5_2164_694d,
            alarm: api::Alarm::NoSpace,
        };
        let bytes = encode(raise, &unversioned).unwrap();
        assert_eq!(hex(&bytes), "01090100");
        let as_read = Request::Alarm {
            activate: true,
            member: 0,
            alarm: api::Alarm::NoSpace,
        };
        assert_eq!(decode(&bytes), Ok(as_read));
        let guarded = Request::Guarded {
            auth_revision: 1,
            request: Box::new(Request::Alarm {
                activate: false,
                member: 7,
                alarm: api::Alarm::Corrupt,
            }),
        };
        let bytes = encode(guarded, &unversioned).unwrap();
        assert!(hex(&bytes).ends_with("090001"), "{}", hex(&bytes));
        // Everything else is written as it always was; `gated` names exactly the requests
        // whose bytes depend on the versions.
        let mut samples = samples();
        samples.push(Request::Guarded {
            auth_revision: 1,
            request: Box::new(Request::Alarm {
                activate: true,
                member: 7,
                alarm: api::Alarm::NoSpace,
            }),
        });
        for request in samples {
            let differs = encode(request.clone(), &unversioned) != encode(request.clone(), &AGREED);
            assert_eq!(gated(&request), differs, "{request:?}");
            if !matches!(request, Request::Alarm { .. } | Request::Guarded { .. }) {
                assert!(!differs, "{request:?}");
            }
        }
    }

    #[test]
    fn garbage_is_refused() {
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        assert_eq!(decode(&[9, 1, 2]), Err(DecodeError::UnknownFormat(9)));
        assert!(matches!(decode(&[1, 0xff, 0xff, 0xff]), Err(DecodeError::Invalid(_))));
        // Every truncation of a real entry is refused or decodes to something (never panics).
        for request in samples() {
            let bytes = encode(request, &AGREED).unwrap();
            for end in 0..bytes.len() {
                let _ = decode(&bytes[..end]);
            }
        }
    }
}
