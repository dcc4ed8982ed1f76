//! The replicated state as checkpoints (format 6) and snapshots (format 5) hold it, and the
//! member attributes a membership change carries in its context.
//!
//! The checkpoint and snapshot bodies are private structs of `checkpoint.rs` and
//! `snapshot.rs`; the API types inside them ([`AuthStore`], [`Alarm`], [`MemberAttributes`])
//! are written through the adapters here (`#[serde(with = ...)]`), as this module's own
//! types. The private types they also hold (the membership, leases, the store's layout) are
//! written as they are: changing one is changing the format, which the golden test below and
//! the fixtures in `tests/fixtures/format/` catch.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::entry::{self, Permission};
use crate::auth::AuthStore;
use crate::consensus::MemberAttributes;
use crate::request::Alarm;

#[derive(Serialize, Deserialize)]
struct Auth {
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
struct Attributes {
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

/// `#[serde(with)]` for an [`AuthStore`] (its permission cache is rebuilt on load).
pub(crate) mod auth_store {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(store: &AuthStore, s: S) -> Result<S::Ok, S::Error> {
        Auth::from(store).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<AuthStore, D::Error> {
        Auth::deserialize(d).map(AuthStore::from)
    }

    /// An empty store's bytes: what an older format without the auth store reads as.
    pub(crate) fn empty() -> Vec<u8> {
        postcard::to_allocvec(&Auth::from(&AuthStore::default())).unwrap_or_default()
    }
}

/// `#[serde(with)]` for the raised alarms, each with its member (checkpoints from version 7,
/// snapshots from version 6).
pub(crate) mod alarms {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(alarms: &[(u64, Alarm)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(alarms.iter().map(|(member, a)| (*member, entry::Alarm::from(*a))))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, Alarm)>, D::Error> {
        Vec::<(u64, entry::Alarm)>::deserialize(d).map(|v| v.into_iter().map(|(m, a)| (m, Alarm::from(a))).collect())
    }
}

/// `#[serde(with)]` for the raised alarms as older versions wrote them, without a member:
/// read as member 0's.
pub(crate) mod alarms_without_member {
    use super::*;

    #[cfg(test)]
    pub(crate) fn serialize<S: Serializer>(alarms: &[(u64, Alarm)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(alarms.iter().map(|(_, a)| entry::Alarm::from(*a)))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(u64, Alarm)>, D::Error> {
        Vec::<entry::Alarm>::deserialize(d).map(|v| v.into_iter().map(|a| (0, Alarm::from(a))).collect())
    }
}

/// Member attributes: in a membership change's context, and (`#[serde(with)]`, by member ID)
/// in the membership checkpoints and snapshots hold.
/// The agreed versions as the trailer of a checkpoint body or a snapshot meta: after the last
/// field, where a reader from before them (0.1, which decodes with `postcard::from_bytes`)
/// stops. Written only once something is agreed, so until then the bytes are 0.1's.
pub(crate) mod versions_trailer {
    use serde::de::DeserializeOwned;

    use crate::version::ClusterVersions;

    /// `body` with `versions` after it.
    pub(crate) fn append(body: Vec<u8>, versions: &ClusterVersions) -> postcard::Result<Vec<u8>> {
        match *versions == ClusterVersions::default() {
            true => Ok(body),
            false => postcard::to_extend(versions, body),
        }
    }

    /// The body's fields, and the versions after them (the defaults when there are none).
    pub(crate) fn split<T: DeserializeOwned>(bytes: &[u8]) -> postcard::Result<(T, ClusterVersions)> {
        let (fields, trailer) = postcard::take_from_bytes::<T>(bytes)?;
        let versions = match trailer.is_empty() {
            true => ClusterVersions::default(),
            false => postcard::from_bytes(trailer)?,
        };
        Ok((fields, versions))
    }
}

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

    pub(crate) fn serialize<S: Serializer>(map: &BTreeMap<u64, MemberAttributes>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(map.iter().map(|(id, a)| (id, Attributes::from(a))))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u64, MemberAttributes>, D::Error> {
        BTreeMap::<u64, Attributes>::deserialize(d).map(|m| m.into_iter().map(|(id, a)| (id, a.into())).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Access, AuthChange, Permission};
    use crate::consensus::Membership;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Holder {
        #[serde(with = "auth_store")]
        auth: AuthStore,
        #[serde(with = "alarms_without_member")]
        alarms: Vec<(u64, Alarm)>,
    }

    /// The bytes below were written before these types existed, by serializing the API's types
    /// directly: the adapters must write and read exactly them.
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
        let holder = Holder {
            auth: store,
            alarms: vec![(0, Alarm::NoSpace), (0, Alarm::Corrupt)],
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
        assert_eq!(back, holder);
        let at = back.auth.revision();
        assert_eq!(
            back.auth.permitted("v", at, b"k", b"", Access::Write),
            Ok(()),
            "the cache is rebuilt"
        );
        assert!(back.auth.permitted("v", at, b"j", b"", Access::Write).is_err());

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
        let bytes = postcard::to_allocvec(&m).unwrap();
        assert_eq!(
            hex(&bytes),
            "0201020103000000010101610108687474703a2f2f700108687474703a2f2f63"
        );
        assert_eq!(postcard::from_bytes::<Membership>(&bytes).unwrap(), m);
    }
}
