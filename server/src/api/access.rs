//! Who is asking, and whether they may: a caller named by its token (gRPC metadata `token`, or
//! `authorization`) or, with `--client-cert-auth` and no token, by its client certificate's
//! common name; and etcd's permission checks, made where etcd makes them, before a request is
//! served or proposed. A write carries the auth revision it was permitted at, and is refused
//! at apply if the auth store changed in between (`cairn_engine::Engine::put_async_as`).
//!
//! When auth is disabled, nothing is checked and every caller may do everything.

use cairn_engine::{Access, AuthError, AuthInfo, AuthStore, Engine};
use tonic::Status;

use crate::errors::auth_status;
use crate::transport::listen::ClientCert;

/// How callers prove who they are, from the flags.
#[derive(Debug, Clone)]
pub struct Settings {
    /// bcrypt's cost for new passwords (`--bcrypt-cost`).
    pub bcrypt_cost: u32,
    /// Whether a client certificate's common name names the caller (`--client-cert-auth`).
    pub client_cert_auth: bool,
    /// JWT tokens (`--auth-token jwt,...`); simple tokens when `None`.
    pub jwt: Option<crate::api::jwt::Jwt>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            bcrypt_cost: 10,
            client_cert_auth: false,
            jwt: None,
        }
    }
}

/// A caller known to the auth store at a revision (etcd's `AuthInfo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The user's name (a certificate's common name is taken as one).
    pub user: String,
    /// The auth store's revision the caller was identified at (a JWT's own, else the store's
    /// current one): a check against a store that has changed since is refused as out of date.
    pub revision: u64,
}

/// The caller of a request, when auth is enabled: `Ok(None)` for one that gave no token and
/// no certificate; an invalid or expired token is etcd's "invalid auth token". With auth
/// disabled, always `Ok(None)`, at the cost of one read of the auth flag.
pub async fn caller<T>(
    engine: &Engine,
    settings: &Settings,
    request: &tonic::Request<T>,
) -> Result<Option<Caller>, Status> {
    caller_of(engine, settings, request.metadata(), request.extensions()).await
}

/// [`caller`] from a request's parts (a stream keeps them to check each watch it creates).
pub async fn caller_of(
    engine: &Engine,
    settings: &Settings,
    metadata: &tonic::metadata::MetadataMap,
    extensions: &tonic::Extensions,
) -> Result<Option<Caller>, Status> {
    let (enabled, revision) = engine.server().auth_status();
    if !enabled {
        return Ok(None);
    }
    let token = metadata
        .get("token")
        .or_else(|| metadata.get("authorization"))
        .and_then(|v| v.to_str().ok())
        .map(|t| t.strip_prefix("Bearer ").unwrap_or(t));
    if let Some(token) = token {
        let found = match &settings.jwt {
            Some(jwt) => jwt.verify(token).map(|(user, rev)| Caller { user, revision: rev }),
            None => simple_token(engine, token).await.map(|user| Caller { user, revision }),
        };
        return match found {
            Some(caller) => Ok(Some(caller)),
            None => {
                tracing::warn!("invalid auth token");
                Err(auth_status(AuthError::InvalidToken))
            }
        };
    }
    if settings.client_cert_auth {
        let cert = extensions
            .get::<axum::extract::ConnectInfo<ClientCert>>()
            .and_then(|c| c.0 .0.clone());
        if let Some(cn) = cert {
            return Ok(Some(Caller {
                user: cn.to_string(),
                revision,
            }));
        }
    }
    Ok(None)
}

/// The user a simple token names. A token names the index of the entry that registered it:
/// if this member knows no such token, it waits until it has applied that index (bounded by
/// the request timeout), then looks again, as etcd's members wait.
async fn simple_token(engine: &Engine, token: &str) -> Option<String> {
    if let Some(user) = engine.server().resolve_token(token) {
        return Some(user);
    }
    let index: u64 = token.rsplit_once('.')?.1.parse().ok()?;
    engine.server().applied_async(index).await.ok()?;
    engine.server().resolve_token(token)
}

fn user_of(caller: Option<&Caller>) -> (&str, u64) {
    caller.map_or(("", 0), |c| (c.user.as_str(), c.revision))
}

/// What one request needs, in etcd's terms.
#[derive(Debug)]
pub enum Need<'a> {
    /// Read on a key and range end as a request gives them: the key alone if the end is
    /// empty, `[key, end)` otherwise, every key from `key` on if the end is `"\0"`.
    Read(&'a [u8], &'a [u8]),
    /// Write on a key and range end, read as for [`Need::Read`].
    Write(&'a [u8], &'a [u8]),
    /// Write on every key attached to the lease, unless the caller is an admin.
    LeaseWrite(i64),
    /// Read on every key attached to the lease, unless the caller is an admin.
    LeaseRead(i64),
}

/// Checks every need in `needs` for `caller` against one view of the auth store.
pub fn check(engine: &Engine, caller: Option<&Caller>, needs: &[Need<'_>]) -> Result<(), Status> {
    let (user, revision) = user_of(caller);
    let who = AuthInfo { user, revision };
    let leases: Vec<i64> = needs
        .iter()
        .filter_map(|n| match n {
            Need::LeaseWrite(id) | Need::LeaseRead(id) if *id != 0 => Some(*id),
            _ => None,
        })
        .collect();
    // A lease's keys matter only with auth on: without, the lessor is not asked (a keep-alive
    // checks its lease on every renewal). Requests without a lease skip the question.
    let keys_needed = !leases.is_empty() && engine.server().auth_status().0;
    let leased: Vec<(i64, Vec<bytes::Bytes>)> = match keys_needed {
        true => leases.iter().map(|&id| (id, engine.server().lease_keys(id))).collect(),
        false => Vec::new(),
    };
    engine
        .server()
        .auth_read(|store| {
            if store.enabled() && !leases.is_empty() && !keys_needed {
                // Enabled since the keys were skipped: the caller retries, as after any
                // change of the auth store under a request.
                return Err(AuthError::OldRevision);
            }
            for need in needs {
                match need {
                    Need::Read(key, end) => store.permitted(who, key, end, Access::Read)?,
                    Need::Write(key, end) => store.permitted(who, key, end, Access::Write)?,
                    Need::LeaseWrite(id) | Need::LeaseRead(id) => {
                        let access = if matches!(need, Need::LeaseWrite(_)) {
                            Access::Write
                        } else {
                            Access::Read
                        };
                        if let Some((_, keys)) = leased.iter().find(|(l, _)| l == id) {
                            lease_keys_permitted(store, who, keys, access)?;
                        }
                    }
                }
            }
            Ok(())
        })
        .map_err(auth_status)
}

/// Whether `who` may access each of a lease's `keys` (an admin, or a lease with none, may).
fn lease_keys_permitted(
    store: &AuthStore,
    who: AuthInfo<'_>,
    keys: &[bytes::Bytes],
    access: Access,
) -> Result<(), AuthError> {
    if keys.is_empty() || store.admin(who.user).is_ok() {
        return Ok(());
    }
    keys.iter().try_for_each(|k| store.permitted(who, k, &[], access))
}

/// etcd's admin check: the caller must hold the root role (when auth is enabled).
pub fn admin(engine: &Engine, caller: Option<&Caller>) -> Result<(), Status> {
    let (user, _) = user_of(caller);
    engine
        .server()
        .auth_read(|store| store.admin(user))
        .map_err(auth_status)
}

/// etcd's `requireAuthInfo`: any authenticated caller (when auth is enabled).
pub fn authenticated(engine: &Engine, caller: Option<&Caller>) -> Result<(), Status> {
    if caller.is_none() && engine.server().auth_status().0 {
        return Err(auth_status(AuthError::UserEmpty));
    }
    Ok(())
}

/// `message` as a request to the leader, carrying the caller's token (simple tokens are
/// registered on every member, JWTs verify anywhere), so the leader checks the same caller.
pub fn onward<T>(metadata: &tonic::metadata::MetadataMap, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    for name in ["token", "authorization"] {
        if let Some(value) = metadata.get(name) {
            request.metadata_mut().insert(name, value.clone());
        }
    }
    request
}

/// The auth revision a write permitted for `caller` is guarded by.
pub fn guard(caller: Option<&Caller>) -> Option<u64> {
    caller.map(|c| c.revision)
}

/// What one request needs, gathered before one check (a few, without allocating).
pub type Needs<'a> = smallvec::SmallVec<[Need<'a>; 4]>;

/// What a range needs: read on the range.
pub fn range_needs<'a>(r: &'a cairn_engine::RangeRequest, out: &mut Needs<'a>) {
    out.push(Need::Read(&r.key, &r.range_end));
}

/// What a put needs: write on the key; read too with `prev_kv`; write on every key already
/// attached to the lease it names.
pub fn put_needs<'a>(p: &'a cairn_engine::PutRequest, out: &mut Needs<'a>) {
    out.push(Need::Write(&p.key, &[]));
    if p.lease != 0 {
        out.push(Need::LeaseWrite(p.lease));
    }
    if p.prev_kv {
        out.push(Need::Read(&p.key, &[]));
    }
}

/// What a delete needs: write on the range; read too with `prev_kv`.
pub fn delete_needs<'a>(d: &'a cairn_engine::DeleteRangeRequest, out: &mut Needs<'a>) {
    out.push(Need::Write(&d.key, &d.range_end));
    if d.prev_kv {
        out.push(Need::Read(&d.key, &d.range_end));
    }
}

/// What a txn needs: read on every compare, then what the ops of both branches need, nested
/// txns included (etcd checks both branches, whichever runs).
pub fn txn_needs<'a>(t: &'a cairn_engine::TxnRequest, out: &mut Needs<'a>) {
    use cairn_engine::RequestOp;
    for c in &t.compare {
        out.push(Need::Read(&c.key, &c.range_end));
    }
    for op in t.success.iter().chain(&t.failure) {
        match op {
            RequestOp::Range(r) => out.push(Need::Read(&r.key, &r.range_end)),
            RequestOp::Put(p) => put_needs(p, out),
            RequestOp::DeleteRange(d) => delete_needs(d, out),
            RequestOp::Txn(nested) => txn_needs(nested, out),
        }
    }
}
