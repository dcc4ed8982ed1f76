//! The auth store on the engine: changes and authentications through the log, reads and
//! permission checks from this member's copy, and its simple tokens.

use super::kv::Applied;
use super::propose::Pending;
use super::Engine;
use crate::auth::{AuthChange, AuthStore};
use crate::error::{Error, Result};
use crate::request::{Request, Response};

impl Engine {
    /// Reads this member's auth store (for permission checks and the read-only auth RPCs):
    /// `read` runs under the state's read lock, so keep it short.
    pub fn auth_read<R>(&self, read: impl FnOnce(&AuthStore) -> R) -> R {
        read(&self.core.state.read().auth)
    }

    /// Whether auth is enabled, and the auth store's revision.
    pub fn auth_status(&self) -> (bool, u64) {
        self.auth_read(|a| (a.enabled(), a.revision()))
    }

    /// Changes the auth store through the log; `guard` as for [`Engine::write_async_as`]
    /// (the caller checked the admin permission at that revision).
    pub fn auth_change_async(&self, change: AuthChange, guard: Option<u64>) -> Result<Pending<Applied<()>>> {
        let rx = self.core.submit(super::kv::guarded(Request::Auth(change), guard))?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Auth, revision) => Ok(Applied { response: (), revision }),
            (other, _) => Err(Error::internal(format!("auth change answered with {other:?}"))),
        }))
    }

    /// Registers a simple token for `name` on every member, through the log: its password was
    /// checked at auth revision `checked_revision`, and the token is `prefix`, a dot, and its
    /// entry's index.
    pub fn authenticate_async(&self, name: String, prefix: String, checked_revision: u64) -> Result<Pending<String>> {
        let request = Request::Authenticate {
            name,
            prefix,
            checked_revision,
        };
        let rx = self.core.submit(request)?;
        Ok(Pending::new(rx, |answer| match answer {
            (Response::Authenticated { token }, _) => Ok(token),
            (other, _) => Err(Error::internal(format!("authenticate answered with {other:?}"))),
        }))
    }

    /// The user a simple token names, if this member knows it and it is live (its TTL
    /// slides).
    pub fn resolve_token(&self, token: &str) -> Option<String> {
        self.core.state.read().tokens.lock().resolve(token)
    }

    /// Waits, up to the request timeout, until this member has applied log index `index` (a
    /// simple token names the index of its entry: a member that has not applied it yet waits
    /// for it, as etcd's members do, instead of refusing the token).
    pub async fn applied_async(&self, index: u64) -> Result<()> {
        let deadline = std::time::Instant::now() + self.core.config.request_timeout;
        match self.core.applied.reached(index, deadline) {
            None => Ok(()),
            Some(reached) => reached.await.map_err(|_| Error::Closed)?,
        }
    }

    /// The keys attached to lease `id` (none if it does not exist), for permission checks.
    pub fn lease_keys(&self, id: i64) -> Vec<bytes::Bytes> {
        self.core.state.read().lessor.keys(id).unwrap_or_default()
    }
}
