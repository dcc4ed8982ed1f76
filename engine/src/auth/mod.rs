//! etcd's authentication store: users, roles and key-range permissions, replicated through the
//! log like any other state, with etcd's rules and its auth revision.
//!
//! - [`AuthStore`]: the state every member holds (in checkpoints and snapshots too), changed
//!   only by applying an [`AuthChange`]; every change bumps the revision.
//! - Permission checks ([`AuthStore::permitted`]) answer from per-user merged key ranges,
//!   rebuilt after each change, as etcd's range permission cache.
//! - [`tokens`]: simple tokens, registered on every member as their `Authenticate` entry is
//!   applied, and forgotten after their TTL.
//!
//! Passwords arrive here already hashed (bcrypt, hashed before proposing, off the apply path,
//! as etcd does); checking one is the caller's job too ([`AuthStore::password_hash`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub mod tokens;

/// The user and role that may do anything, and without which auth cannot be enabled.
pub const ROOT: &str = "root";

/// Why an auth request or check failed (each is one of etcd's errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// etcd: "authentication is not enabled".
    #[error("authentication is not enabled")]
    NotEnabled,
    /// etcd: "authentication failed, invalid user ID or password".
    #[error("authentication failed, invalid user ID or password")]
    Failed,
    /// etcd: "permission denied".
    #[error("permission denied")]
    PermissionDenied,
    /// etcd: "invalid auth token".
    #[error("invalid auth token")]
    InvalidToken,
    /// etcd: "user name is empty".
    #[error("user name is empty")]
    UserEmpty,
    /// etcd: "user name already exists".
    #[error("user name already exists")]
    UserExists,
    /// etcd: "user name not found".
    #[error("user name not found")]
    UserNotFound,
    /// etcd: "role name is empty".
    #[error("role name is empty")]
    RoleEmpty,
    /// etcd: "role name already exists".
    #[error("role name already exists")]
    RoleExists,
    /// etcd: "role name not found".
    #[error("role name not found")]
    RoleNotFound,
    /// etcd: "root user does not exist".
    #[error("root user does not exist")]
    RootUserMissing,
    /// etcd: "root user does not have root role".
    #[error("root user does not have root role")]
    RootRoleMissing,
    /// etcd: "invalid auth management".
    #[error("invalid auth management")]
    InvalidManagement,
    /// etcd: "permission not given".
    #[error("permission not given")]
    PermissionNotGiven,
    /// etcd: "permission is not granted to the role".
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    /// etcd: "role is not granted to the user".
    #[error("role is not granted to the user")]
    RoleNotGranted,
    /// Authenticating a user created without a password (etcd: "auth: authentication
    /// failed, password was given for no password user").
    #[error("authentication failed, password was given for no password user")]
    NoPasswordUser,
    /// etcd: "revision of auth store is old".
    #[error("revision of auth store is old")]
    OldRevision,
}

/// What a permission allows (etcd's `Permission.Type`, same numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Range, watch, and compares in a txn.
    Read,
    /// Put and delete.
    Write,
    /// Both.
    ReadWrite,
}

impl Access {
    fn allows(self, wanted: Access) -> bool {
        self == Access::ReadWrite || self == wanted
    }
}

/// A key or range a role may read or write: one key if `range_end` is empty, `[key,
/// range_end)` otherwise, `[key, ∞)` if `range_end` is `"\0"`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Permission {
    /// What it allows.
    pub access: Access,
    /// The key, or the range's first key.
    pub key: Vec<u8>,
    /// The range's end (see above).
    pub range_end: Vec<u8>,
}

/// A user: its bcrypt hash (none for a certificate-only user), and its roles, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// The user's name.
    pub name: String,
    /// The bcrypt hash of its password.
    pub password_hash: Option<String>,
    /// Created without a password: it authenticates by certificate only.
    pub no_password: bool,
    /// The roles it holds, sorted.
    pub roles: Vec<String>,
}

/// A role and its permissions, sorted by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Role {
    /// The role's name.
    pub name: String,
    /// What it may access, sorted by key.
    pub permissions: Vec<Permission>,
}

/// A change to the auth store, as logged.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // each variant is the etcd RPC of its name, fields as there
pub enum AuthChange {
    /// AuthEnable: needs the root user with the root role.
    Enable,
    /// AuthDisable.
    Disable,
    /// UserAdd, the password already hashed.
    UserAdd {
        name: String,
        password_hash: Option<String>,
        no_password: bool,
    },
    /// UserDelete (not root while auth is on).
    UserDelete { name: String },
    /// UserChangePassword, the password already hashed.
    UserChangePassword {
        name: String,
        password_hash: Option<String>,
    },
    /// UserGrantRole.
    UserGrantRole { user: String, role: String },
    /// UserRevokeRole (not root's root role while auth is on).
    UserRevokeRole { name: String, role: String },
    /// RoleAdd.
    RoleAdd { name: String },
    /// RoleDelete (not root while auth is on); it is revoked from every user.
    RoleDelete { name: String },
    /// RoleGrantPermission: replaces the access of a permission on the same range.
    RoleGrantPermission { name: String, permission: Permission },
    /// RoleRevokePermission.
    RoleRevokePermission {
        role: String,
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
}

/// Who makes a request, for permission checks: the user, and the auth revision their
/// permission was read at (etcd's `AuthInfo`; revision 0 for no user).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthInfo<'a> {
    /// The user's name; empty for none.
    pub user: &'a str,
    /// The auth store's revision when the request was admitted.
    pub revision: u64,
}

/// The auth store's state. A new one is at revision 1, as etcd's is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthStore {
    pub(crate) enabled: bool,
    pub(crate) revision: u64,
    pub(crate) users: BTreeMap<String, User>,
    pub(crate) roles: BTreeMap<String, Role>,
    /// Each user's permissions merged across its roles; rebuilt after every change.
    merged: HashMap<String, Arc<Merged>>,
}

impl Default for AuthStore {
    fn default() -> AuthStore {
        AuthStore {
            enabled: false,
            revision: 1,
            users: BTreeMap::new(),
            roles: BTreeMap::new(),
            merged: HashMap::new(),
        }
    }
}

/// One user's permitted key ranges, merged: sorted, disjoint `[start, end)` intervals (`end`
/// `None` for unbounded), one list per access.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Merged {
    read: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    write: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// `key`'s successor among byte strings: the end of the interval holding just `key`.
fn successor(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// A permission or request range as an interval `[start, end)`.
fn interval(key: &[u8], range_end: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
    match range_end {
        [] => (key.to_vec(), Some(successor(key))),
        [0] => (key.to_vec(), None),
        end => (key.to_vec(), Some(end.to_vec())),
    }
}

fn merge(mut intervals: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    intervals.retain(|(start, end)| end.as_ref().is_none_or(|e| e > start));
    intervals.sort();
    let mut merged: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::with_capacity(intervals.len());
    for (start, end) in intervals {
        if let Some((_, last_end)) = merged.last_mut() {
            let touches = last_end.as_ref().is_none_or(|e| *e >= start);
            if touches {
                let longer = match (&*last_end, &end) {
                    (None, _) | (_, None) => None,
                    (Some(a), Some(b)) => Some(a.max(b).clone()),
                };
                *last_end = longer;
                continue;
            }
        }
        merged.push((start, end));
    }
    merged
}

/// Whether the sorted, disjoint `intervals` cover `[start, end)` (`end` `None`: unbounded),
/// decided as etcd's interval tree decides it (`Contains`): the intervals that intersect the
/// request must be contiguous, begin at or before its start and end at or after its end. A
/// reversed request (`end` before `start`) is decided by the same rule, as in etcd.
fn covers(intervals: &[(Vec<u8>, Option<Vec<u8>>)], start: &[u8], end: Option<&[u8]>) -> bool {
    if end.is_some_and(|e| e <= start) {
        // An empty range is decided as the key at its start. etcd's answer for a reversed
        // range depends on its tree's shape; when the tree is searched whole, it is the same.
        let point = successor(start);
        return covers(intervals, start, Some(&point));
    }
    let before = |a: &[u8], b: Option<&[u8]>| b.is_none_or(|b| a < b);
    let mut visited = intervals
        .iter()
        .filter(|(s, e)| before(start, e.as_deref()) && before(s, end));
    let Some((min_begin, first_end)) = visited.next() else {
        return false;
    };
    let mut max_end = first_end.as_deref();
    for (s, e) in visited {
        if max_end.is_some_and(|m| m < s.as_slice()) {
            return false;
        }
        max_end = match (max_end, e.as_deref()) {
            (None, _) | (_, None) => None,
            (Some(a), Some(b)) => Some(a.max(b)),
        };
    }
    let reaches_end = match (max_end, end) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(m), Some(e)) => m >= e,
    };
    reaches_end && min_begin.as_slice() <= start
}

/// etcd's rule for a permission's range: a key, and an end that is empty, `"\0"` or after it.
fn valid_range(key: &[u8], range_end: &[u8]) -> bool {
    !key.is_empty() && (range_end.is_empty() || range_end == [0] || key < range_end)
}

impl AuthStore {
    /// A store as loaded from a checkpoint or snapshot, its permission cache built.
    pub(crate) fn load(
        enabled: bool,
        revision: u64,
        users: BTreeMap<String, User>,
        roles: BTreeMap<String, Role>,
    ) -> AuthStore {
        let mut store = AuthStore {
            enabled,
            revision,
            users,
            roles,
            merged: HashMap::new(),
        };
        store.rebuild();
        store
    }

    /// Whether auth is enabled: requests then need a user with the permission.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Bumped by every change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// A user, by name.
    pub fn user(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// A role, by name.
    pub fn role(&self, name: &str) -> Option<&Role> {
        self.roles.get(name)
    }

    /// Every user's name, sorted.
    pub fn user_names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    /// Every role's name, sorted.
    pub fn role_names(&self) -> Vec<String> {
        self.roles.keys().cloned().collect()
    }

    /// Whether `user` exists and holds the root role.
    pub fn is_root(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.iter().any(|r| r == ROOT))
    }

    /// Whether `user` holds `role`.
    pub fn has_role(&self, user: &str, role: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.iter().any(|r| r == role))
    }

    /// The bcrypt hash to check `user`'s password against, and the revision checked at:
    /// [`AuthError::Failed`] for an unknown user, [`AuthError::NoPasswordUser`] for one
    /// without a password.
    pub fn password_hash(&self, user: &str) -> Result<(String, u64), AuthError> {
        if !self.enabled {
            return Err(AuthError::NotEnabled);
        }
        let u = self.users.get(user).ok_or(AuthError::Failed)?;
        if u.no_password {
            return Err(AuthError::NoPasswordUser);
        }
        let hash = u.password_hash.clone().ok_or(AuthError::Failed)?;
        Ok((hash, self.revision))
    }

    /// Whether `who` may access `[key, range_end)` (etcd's range semantics) as `access`
    /// (etcd's `isOpPermitted`).
    pub fn permitted(&self, who: AuthInfo<'_>, key: &[u8], range_end: &[u8], access: Access) -> Result<(), AuthError> {
        let AuthInfo { user, revision } = who;
        if !self.enabled {
            return Ok(());
        }
        if revision == 0 {
            return Err(AuthError::UserEmpty);
        }
        if revision < self.revision {
            return Err(AuthError::OldRevision);
        }
        if self.is_root(user) {
            return Ok(());
        }
        let Some(merged) = self.merged.get(user) else {
            return Err(AuthError::PermissionDenied);
        };
        let intervals = if access == Access::Read {
            &merged.read
        } else {
            &merged.write
        };
        let (start, end) = interval(key, range_end);
        if covers(intervals, &start, end.as_deref()) {
            Ok(())
        } else {
            Err(AuthError::PermissionDenied)
        }
    }

    /// Whether `user` may administer (etcd's `IsAdminPermitted`).
    pub fn admin(&self, user: &str) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        if user.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if !self.users.contains_key(user) {
            return Err(AuthError::UserNotFound);
        }
        if !self.is_root(user) {
            return Err(AuthError::PermissionDenied);
        }
        Ok(())
    }

    /// Applies one change with etcd's rules. A change that does nothing (enabling twice,
    /// granting a role held) succeeds without bumping the revision, as in etcd.
    pub fn apply(&mut self, change: &AuthChange) -> Result<(), AuthError> {
        match change {
            AuthChange::Enable => {
                if self.enabled {
                    return Ok(());
                }
                let root = self.users.get(ROOT).ok_or(AuthError::RootUserMissing)?;
                if !root.roles.iter().any(|r| r == ROOT) {
                    return Err(AuthError::RootRoleMissing);
                }
                self.enabled = true;
                // etcd does not bump the revision here.
                return Ok(());
            }
            AuthChange::Disable => {
                if !self.enabled {
                    return Ok(());
                }
                self.enabled = false;
            }
            AuthChange::UserAdd {
                name,
                password_hash,
                no_password,
            } => {
                if name.is_empty() {
                    return Err(AuthError::UserEmpty);
                }
                if self.users.contains_key(name) {
                    return Err(AuthError::UserExists);
                }
                let user = User {
                    name: name.clone(),
                    password_hash: if *no_password { None } else { password_hash.clone() },
                    no_password: *no_password,
                    roles: Vec::new(),
                };
                self.users.insert(name.clone(), user);
            }
            AuthChange::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                self.users.remove(name).ok_or(AuthError::UserNotFound)?;
            }
            AuthChange::UserChangePassword { name, password_hash } => {
                let user = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                if !user.no_password {
                    user.password_hash.clone_from(password_hash);
                }
            }
            AuthChange::UserGrantRole { user, role } => {
                if role != ROOT && !self.roles.contains_key(role) {
                    if !self.users.contains_key(user) {
                        return Err(AuthError::UserNotFound);
                    }
                    return Err(AuthError::RoleNotFound);
                }
                let u = self.users.get_mut(user).ok_or(AuthError::UserNotFound)?;
                match u.roles.binary_search(role) {
                    Ok(_) => return Ok(()),
                    Err(at) => u.roles.insert(at, role.clone()),
                }
            }
            AuthChange::UserRevokeRole { name, role } => {
                if self.enabled && name == ROOT && role == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                let u = self.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
                let before = u.roles.len();
                u.roles.retain(|r| r != role);
                if u.roles.len() == before {
                    return Err(AuthError::RoleNotGranted);
                }
            }
            AuthChange::RoleAdd { name } => {
                if name.is_empty() {
                    return Err(AuthError::RoleEmpty);
                }
                if self.roles.contains_key(name) {
                    return Err(AuthError::RoleExists);
                }
                self.roles.insert(
                    name.clone(),
                    Role {
                        name: name.clone(),
                        permissions: Vec::new(),
                    },
                );
            }
            AuthChange::RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return Err(AuthError::InvalidManagement);
                }
                self.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
                for user in self.users.values_mut() {
                    user.roles.retain(|r| r != name);
                }
            }
            AuthChange::RoleGrantPermission { name, permission } => {
                if !valid_range(&permission.key, &permission.range_end) {
                    return Err(AuthError::InvalidManagement);
                }
                let role = self.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
                // etcd's rule, exactly: only the first permission on the same key is looked at;
                // if its range differs, the new one is added beside it (stably sorted by key).
                let first = role.permissions.partition_point(|p| p.key < permission.key);
                match role.permissions.get_mut(first) {
                    Some(p) if p.key == permission.key && p.range_end == permission.range_end => {
                        p.access = permission.access;
                    }
                    _ => {
                        role.permissions.push(permission.clone());
                        role.permissions.sort_by(|a, b| a.key.cmp(&b.key));
                    }
                }
            }
            AuthChange::RoleRevokePermission { role, key, range_end } => {
                let r = self.roles.get_mut(role).ok_or(AuthError::RoleNotFound)?;
                let before = r.permissions.len();
                r.permissions.retain(|p| !(p.key == *key && p.range_end == *range_end));
                if r.permissions.len() == before {
                    return Err(AuthError::PermissionNotGranted);
                }
            }
        }
        self.revision += 1;
        self.rebuild();
        Ok(())
    }

    /// Rebuilds every user's merged permissions (after a change, or after loading).
    pub(crate) fn rebuild(&mut self) {
        let mut merged = HashMap::with_capacity(self.users.len());
        for user in self.users.values() {
            let mut read = Vec::new();
            let mut write = Vec::new();
            let permissions = user
                .roles
                .iter()
                .filter_map(|r| self.roles.get(r))
                .flat_map(|r| &r.permissions);
            for p in permissions {
                let ivl = interval(&p.key, &p.range_end);
                if p.access.allows(Access::Read) {
                    read.push(ivl.clone());
                }
                if p.access.allows(Access::Write) {
                    write.push(ivl);
                }
            }
            let m = Merged {
                read: merge(read),
                write: merge(write),
            };
            merged.insert(user.name.clone(), Arc::new(m));
        }
        self.merged = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> AuthStore {
        let mut s = AuthStore::default();
        let changes = [
            AuthChange::UserAdd {
                name: "root".into(),
                password_hash: Some("h".into()),
                no_password: false,
            },
            AuthChange::UserGrantRole {
                user: "root".into(),
                role: "root".into(),
            },
            AuthChange::UserAdd {
                name: "u".into(),
                password_hash: Some("h".into()),
                no_password: false,
            },
            AuthChange::RoleAdd { name: "r".into() },
            AuthChange::UserGrantRole {
                user: "u".into(),
                role: "r".into(),
            },
        ];
        for c in &changes {
            s.apply(c).unwrap();
        }
        s
    }

    fn grant(s: &mut AuthStore, access: Access, key: &str, end: &str) {
        let permission = Permission {
            access,
            key: key.into(),
            range_end: end.into(),
        };
        s.apply(&AuthChange::RoleGrantPermission {
            name: "r".into(),
            permission,
        })
        .unwrap();
    }

    #[test]
    fn enabling_needs_root_with_the_root_role_and_root_cannot_be_removed_then() {
        let mut s = AuthStore::default();
        assert_eq!(s.apply(&AuthChange::Enable), Err(AuthError::RootUserMissing));
        s.apply(&AuthChange::UserAdd {
            name: "root".into(),
            password_hash: None,
            no_password: false,
        })
        .unwrap();
        assert_eq!(s.apply(&AuthChange::Enable), Err(AuthError::RootRoleMissing));
        let mut s = store();
        s.apply(&AuthChange::Enable).unwrap();
        let delete = AuthChange::UserDelete { name: "root".into() };
        assert_eq!(s.apply(&delete), Err(AuthError::InvalidManagement));
        let revoke = AuthChange::UserRevokeRole {
            name: "root".into(),
            role: "root".into(),
        };
        assert_eq!(s.apply(&revoke), Err(AuthError::InvalidManagement));
        s.apply(&AuthChange::Disable).unwrap();
        s.apply(&delete).unwrap();
    }

    #[test]
    fn ranges_are_checked_against_merged_permissions() {
        let mut s = store();
        s.apply(&AuthChange::Enable).unwrap();
        grant(&mut s, Access::Read, "a", "c");
        grant(&mut s, Access::ReadWrite, "c", "e");
        grant(&mut s, Access::Write, "key", "");
        grant(&mut s, Access::Read, "z", "\0");
        let rev = s.revision();
        let ok = |k: &str, e: &str, a| {
            s.permitted(
                AuthInfo {
                    user: "u",
                    revision: rev,
                },
                k.as_bytes(),
                e.as_bytes(),
                a,
            )
            .is_ok()
        };
        assert!(ok("a", "", Access::Read));
        assert!(ok("a", "e", Access::Read), "two touching ranges cover one");
        assert!(!ok("a", "f", Access::Read));
        assert!(!ok("a", "", Access::Write));
        assert!(ok("d", "", Access::Write));
        assert!(ok("key", "", Access::Write));
        assert!(!ok("key", "kez", Access::Write), "a key does not cover a range from it");
        assert!(!ok("key0", "", Access::Write));
        assert!(ok("zz", "\0", Access::Read), "from-key within a from-key permission");
        assert!(!ok("a", "\0", Access::Read), "from-key beyond what is granted");
        assert_eq!(
            s.permitted(
                AuthInfo {
                    user: "u",
                    revision: rev - 1
                },
                b"a",
                b"",
                Access::Read
            ),
            Err(AuthError::OldRevision)
        );
        assert_eq!(
            s.permitted(AuthInfo { user: "u", revision: 0 }, b"a", b"", Access::Read),
            Err(AuthError::UserEmpty)
        );
        assert!(s
            .permitted(
                AuthInfo {
                    user: "root",
                    revision: rev
                },
                b"anything",
                b"\0",
                Access::Write
            )
            .is_ok());
        assert_eq!(
            s.permitted(
                AuthInfo {
                    user: "nobody",
                    revision: rev
                },
                b"a",
                b"",
                Access::Read
            ),
            Err(AuthError::PermissionDenied)
        );
    }

    #[test]
    fn revoking_what_is_not_granted_is_refused() {
        let mut s = store();
        let revoke = AuthChange::RoleRevokePermission {
            role: "r".into(),
            key: b"a".to_vec(),
            range_end: vec![],
        };
        assert_eq!(s.apply(&revoke), Err(AuthError::PermissionNotGranted));
        let role = AuthChange::UserRevokeRole {
            name: "u".into(),
            role: "other".into(),
        };
        assert_eq!(s.apply(&role), Err(AuthError::RoleNotGranted));
        let bad = AuthChange::RoleGrantPermission {
            name: "r".into(),
            permission: Permission {
                access: Access::Read,
                key: b"b".to_vec(),
                range_end: b"a".to_vec(),
            },
        };
        assert_eq!(s.apply(&bad), Err(AuthError::InvalidManagement));
    }
}
