//! The replicated state as checkpoints and snapshots hold it, as private types of this module:
//! the auth store, member attributes (also a membership change's context), the membership,
//! the recent request IDs, leases, the store's layout, alarms and the agreed versions. Each
//! mirrors the engine's type as it was when the format was fixed; `checkpoint` and `snapshot`
//! put them together into their bodies. The golden test below pins their bytes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::entry::{self, Permission};
use crate::auth::AuthStore;
use crate::backend::FileLen;
use crate::consensus::RecentRequests;
use crate::lease::lessor::LeaseRecord;
use crate::membership::{MemberAttributes, Membership};
use crate::mvcc::store::StoreMeta;
use crate::request::Alarm;
use crate::version::{ClusterVersions, Version};

#[derive(Serialize, Deserialize)]
pub(super) struct Auth {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

#[derive(Serialize, Deserialize)]
struct User {
    name: String,
    password_hash: Option<String>,
    no_password: bool,
    roles: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Role {
    name: String,
    permissions: Vec<Permission>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Attributes {
    name: String,
    peer_urls: Vec<String>,
    client_urls: Vec<String>,
}

impl From<&AuthStore> for Auth {
    fn from(store: &AuthStore) -> Auth {
        let users = store.users.iter().map(|(name, u)| {
            let user = User {
                name: u.name.clone(),
                password_hash: u.password_hash.clone(),
                no_password: u.no_password,
                roles: u.roles.clone(),
            };
            (name.clone(), user)
        });
        let roles = store.roles.iter().map(|(name, r)| {
            let role = Role {
                name: r.name.clone(),
                permissions: r.permissions.iter().cloned().map(Permission::from).collect(),
            };
            (name.clone(), role)
        });
        Auth {
            enabled: store.enabled,
            revision: store.revision,
            users: users.collect(),
            roles: roles.collect(),
        }
    }
}

impl From<Auth> for AuthStore {
    fn from(auth: Auth) -> AuthStore {
        let users = auth.users.into_iter().map(|(name, u)| {
            let user = crate::auth::User {
                name: u.name,
                password_hash: u.password_hash,
                no_password: u.no_password,
                roles: u.roles,
            };
            (name, user)
        });
        let roles = auth.roles.into_iter().map(|(name, r)| {
            let role = crate::auth::Role {
                name: r.name,
                permissions: r.permissions.into_iter().map(Into::into).collect(),
            };
            (name, role)
        });
        AuthStore::load(auth.enabled, auth.revision, users.collect(), roles.collect())
    }
}

impl From<&MemberAttributes> for Attributes {
    fn from(a: &MemberAttributes) -> Attributes {
        Attributes {
            name: a.name.clone(),
            peer_urls: a.peer_urls.clone(),
            client_urls: a.client_urls.clone(),
        }
    }
}

impl From<Attributes> for MemberAttributes {
    fn from(a: Attributes) -> MemberAttributes {
        MemberAttributes {
            name: a.name,
            peer_urls: a.peer_urls,
            client_urls: a.client_urls,
        }
    }
}

/// The membership: raft's configuration and each member's attributes, by ID.
#[derive(Serialize, Deserialize)]
pub(super) struct Members {
    voters: Vec<u64>,
    learners: Vec<u64>,
    voters_outgoing: Vec<u64>,
    learners_next: Vec<u64>,
    auto_leave: bool,
    attributes: BTreeMap<u64, Attributes>,
}

impl From<&Membership> for Members {
    fn from(m: &Membership) -> Members {
        Members {
            voters: m.voters.clone(),
            learners: m.learners.clone(),
            voters_outgoing: m.voters_outgoing.clone(),
            learners_next: m.learners_next.clone(),
            auto_leave: m.auto_leave,
            attributes: m.attributes.iter().map(|(id, a)| (*id, a.into())).collect(),
        }
    }
}

impl From<Members> for Membership {
    fn from(m: Members) -> Membership {
        Membership {
            voters: m.voters,
            learners: m.learners,
            voters_outgoing: m.voters_outgoing,
            learners_next: m.learners_next,
            auto_leave: m.auto_leave,
            attributes: m.attributes.into_iter().map(|(id, a)| (id, a.into())).collect(),
        }
    }
}

/// The last request IDs applied, oldest first.
#[derive(Serialize, Deserialize)]
pub(super) struct Recent(Vec<u64>);

impl From<&RecentRequests> for Recent {
    fn from(r: &RecentRequests) -> Recent {
        Recent(r.ids().collect())
    }
}

impl From<Recent> for RecentRequests {
    fn from(r: Recent) -> RecentRequests {
        RecentRequests::from_ids(r.0)
    }
}

/// A lease as every member agrees on it.
#[derive(Serialize, Deserialize)]
pub(super) struct Lease {
    id: i64,
    ttl: i64,
    remaining_ttl: i64,
}

impl From<&LeaseRecord> for Lease {
    fn from(l: &LeaseRecord) -> Lease {
        Lease {
            id: l.id,
            ttl: l.ttl,
            remaining_ttl: l.remaining_ttl,
        }
    }
}

impl From<Lease> for LeaseRecord {
    fn from(l: Lease) -> LeaseRecord {
        LeaseRecord {
            id: l.id,
            ttl: l.ttl,
            remaining_ttl: l.remaining_ttl,
        }
    }
}

/// One data file of the store's layout, and the bytes of records in it.
#[derive(Serialize, Deserialize)]
pub(super) struct File {
    id: u32,
    len: u64,
}

/// What a checkpoint records of the store: its revisions and the data files' layout.
#[derive(Serialize, Deserialize)]
pub(super) struct Store {
    current: i64,
    compacted: i64,
    layout: Vec<File>,
}

impl From<&StoreMeta> for Store {
    fn from(s: &StoreMeta) -> Store {
        Store {
            current: s.current,
            compacted: s.compacted,
            layout: s.layout.iter().map(|f| File { id: f.id, len: f.len }).collect(),
        }
    }
}

impl From<Store> for StoreMeta {
    fn from(s: Store) -> StoreMeta {
        StoreMeta {
            current: s.current,
            compacted: s.compacted,
            layout: s.layout.into_iter().map(|f| FileLen { id: f.id, len: f.len }).collect(),
        }
    }
}

/// The raised alarms, each with the member it was raised for.
pub(super) fn alarms(alarms: &[(u64, Alarm)]) -> Vec<(u64, entry::Alarm)> {
    alarms
        .iter()
        .map(|(member, a)| (*member, entry::Alarm::from(*a)))
        .collect()
}

/// The raised alarms as they were read.
pub(super) fn alarms_from(alarms: Vec<(u64, entry::Alarm)>) -> Vec<(u64, Alarm)> {
    alarms.into_iter().map(|(m, a)| (m, Alarm::from(a))).collect()
}

/// A release line.
#[derive(Serialize, Deserialize, Clone, Copy)]
struct Release {
    major: u32,
    minor: u32,
}

/// The versions the members agreed.
#[derive(Serialize, Deserialize)]
struct Versions {
    cluster: Option<Release>,
    downgrade: Option<Release>,
}

impl From<&ClusterVersions> for Versions {
    fn from(v: &ClusterVersions) -> Versions {
        let release = |v: Version| Release {
            major: v.major,
            minor: v.minor,
        };
        Versions {
            cluster: v.cluster.map(release),
            downgrade: v.downgrade.map(release),
        }
    }
}

impl From<Versions> for ClusterVersions {
    fn from(v: Versions) -> ClusterVersions {
        let version = |r: Release| Version::new(r.major, r.minor);
        ClusterVersions {
            cluster: v.cluster.map(version),
            downgrade: v.downgrade.map(version),
        }
    }
}

/// An empty auth store's bytes: what an older format without the auth store reads as.
pub(super) fn empty_auth() -> Vec<u8> {
    postcard::to_allocvec(&Auth::from(&AuthStore::default())).unwrap_or_default()
}

/// The agreed versions as the trailer of a checkpoint body or a snapshot meta: after the last
/// field, where a reader from before them (0.1, which decodes with `postcard::from_bytes`)
/// stops. Written only once something is agreed, so until then the bytes are 0.1's.
pub(super) mod versions_trailer {
    use serde::de::DeserializeOwned;

    use super::Versions;
    use crate::version::ClusterVersions;

    /// `body` with `versions` after it.
    pub(in crate::format) fn append(body: Vec<u8>, versions: &ClusterVersions) -> postcard::Result<Vec<u8>> {
        match *versions == ClusterVersions::default() {
            true => Ok(body),
            false => postcard::to_extend(&Versions::from(versions), body),
        }
    }

    /// The body's fields, and the versions after them (the defaults when there are none).
    pub(in crate::format) fn split<T: DeserializeOwned>(bytes: &[u8]) -> postcard::Result<(T, ClusterVersions)> {
        let (fields, trailer) = postcard::take_from_bytes::<T>(bytes)?;
        let versions = match trailer.is_empty() {
            true => ClusterVersions::default(),
            false => postcard::from_bytes::<Versions>(trailer)?.into(),
        };
        Ok((fields, versions))
    }
}

/// Member attributes in a membership change's context.
pub(crate) mod attributes {
    use super::*;

    /// A context's bytes.
    pub(crate) fn encode(attributes: &MemberAttributes) -> crate::Result<Vec<u8>> {
        postcard::to_allocvec(&Attributes::from(attributes))
            .map_err(|e| crate::Error::Encode(crate::Failure::caused_by("member attributes", e)))
    }

    /// Attributes from a context; one that does not decode (or an empty one) gives none.
    pub(crate) fn decode(context: &[u8]) -> MemberAttributes {
        postcard::from_bytes::<Attributes>(context)
            .map(MemberAttributes::from)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Access, AuthChange, AuthInfo, Permission};
    use crate::membership::Membership;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[derive(Serialize, Deserialize)]
    struct Holder {
        auth: Auth,
        alarms: Vec<entry::Alarm>,
    }

    /// The bytes below were written before these types existed, by serializing the engine's
    /// types directly: the mirrors must write and read exactly them.
    #[test]
    fn state_is_byte_for_byte_what_it_was() {
        let mut store = AuthStore::default();
        let changes = [
            AuthChange::UserAdd {
                name: "cert".into(),
                password_hash: None,
                no_password: true,
            },
            AuthChange::UserAdd {
                name: "v".into(),
                password_hash: Some("p".into()),
                no_password: false,
            },
            AuthChange::RoleAdd { name: "q".into() },
            AuthChange::UserGrantRole {
                user: "v".into(),
                role: "q".into(),
            },
            AuthChange::RoleGrantPermission {
                name: "q".into(),
                permission: Permission {
                    access: Access::Write,
                    key: b"k".to_vec(),
                    range_end: vec![],
                },
            },
            AuthChange::UserAdd {
                name: "root".into(),
                password_hash: Some("p".into()),
                no_password: false,
            },
            AuthChange::RoleAdd { name: "root".into() },
            AuthChange::UserGrantRole {
                user: "root".into(),
                role: "root".into(),
            },
            AuthChange::Enable,
        ];
        // The golden store went through 4 more (refused or undone) changes first.
        store.revision += 4;
        for c in &changes {
            store.apply(c).unwrap();
        }
        let alarms = vec![(0, Alarm::NoSpace), (0, Alarm::Corrupt)];
        let holder = Holder {
            auth: Auth::from(&store),
            alarms: super::alarms(&alarms).into_iter().map(|(_, a)| a).collect(),
        };
        let bytes = postcard::to_allocvec(&holder).unwrap();
        assert_eq!(
            hex(&bytes),
            concat!(
                "010d030463657274046365727400010004726f6f7404726f6f74010170000104726f6f7401760176010170",
                "0001017102017101710101016b0004726f6f7404726f6f7400",
                "020001",
            )
        );
        let back: Holder = postcard::from_bytes(&bytes).unwrap();
        let auth = AuthStore::from(back.auth);
        assert_eq!(auth, store);
        assert_eq!(alarms_from(back.alarms.into_iter().map(|a| (0, a)).collect()), alarms);
        let at = auth.revision();
        assert_eq!(
            auth.permitted(
                AuthInfo {
                    user: "v",
                    revision: at
                },
                b"k",
                b"",
                Access::Write
            ),
            Ok(()),
            "the cache is rebuilt"
        );
        assert!(auth
            .permitted(
                AuthInfo {
                    user: "v",
                    revision: at
                },
                b"j",
                b"",
                Access::Write
            )
            .is_err());

        let mut m = Membership {
            voters: vec![1, 2],
            learners: vec![3],
            ..Membership::default()
        };
        let a = MemberAttributes {
            name: "a".into(),
            peer_urls: vec!["http://p".into()],
            client_urls: vec!["http://c".into()],
        };
        m.attributes.insert(1, a.clone());
        assert_eq!(
            hex(&attributes::encode(&a).unwrap()),
            "01610108687474703a2f2f700108687474703a2f2f63"
        );
        assert_eq!(attributes::decode(&attributes::encode(&a).unwrap()), a);
        assert_eq!(attributes::decode(b"\xff"), MemberAttributes::default());
        let bytes = postcard::to_allocvec(&Members::from(&m)).unwrap();
        assert_eq!(
            hex(&bytes),
            "0201020103000000010101610108687474703a2f2f700108687474703a2f2f63"
        );
        assert_eq!(Membership::from(postcard::from_bytes::<Members>(&bytes).unwrap()), m);
    }
}
