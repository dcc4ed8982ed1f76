//! The Auth service, with etcd's rules: every change goes through the log (passwords hashed
//! first, with bcrypt, off the apply path) and needs an admin (the root role) once auth is on;
//! AuthStatus and Authenticate need no one; a user may read itself, and a role it holds.

use std::sync::Arc;

use cairn_engine::{Access, AuthChange, AuthError, Permission};
use tonic::{Request, Response, Status};

use crate::api::access::{self, Caller};
use crate::api::node::Node;
use crate::errors::{auth_status, IntoStatus};
use crate::pb::authpb;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;

/// The longest user or role name, and password, accepted (etcd has no limit but the request
/// size; these keep a bcrypt call and the auth store bounded).
const MAX_NAME: usize = 4096;
/// bcrypt uses at most 72 bytes of a password; longer ones are refused rather than cut.
const MAX_PASSWORD: usize = 72;

/// The Auth service over a [`Node`].
#[derive(Debug, Clone)]
pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    /// The service for `node`, hashing new passwords at its `--bcrypt-cost`.
    pub fn new(node: Arc<Node>) -> AuthService {
        AuthService { node }
    }

    async fn caller<T>(&self, request: &Request<T>) -> Result<Option<Caller>, Status> {
        self.node.caller(request).await
    }

    /// Proposes `change` as `caller`, who must be an admin; answers with a header.
    async fn change(&self, caller: Option<&Caller>, change: AuthChange) -> Result<pb::ResponseHeader, Status> {
        access::admin(&self.node.engine, caller)?;
        self.node.admit_write()?;
        let pending = self
            .node
            .engine
            .server()
            .auth_change_async(change, access::guard(caller))
            .or_status()?;
        let applied = pending.await.or_status()?;
        Ok(self.node.header(applied.revision))
    }

    /// A bcrypt hash of `password` at `--bcrypt-cost`, computed on a blocking thread.
    async fn hash(&self, password: String) -> Result<String, Status> {
        if password.len() > MAX_PASSWORD {
            return Err(Status::invalid_argument(format!(
                "etcdserver: password longer than {MAX_PASSWORD} bytes"
            )));
        }
        let cost = self.node.access.bcrypt_cost;
        tokio::task::spawn_blocking(move || bcrypt::hash_with_result(password, cost))
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .map(|h| h.format_for_version(bcrypt::Version::TwoA))
            .map_err(|e| Status::internal(format!("etcdserver: bcrypt: {e}")))
    }

    /// The hash a user add or password change stores: of the password, or the one given
    /// (base64 of a bcrypt hash, as etcdctl sends it), or none for a no-password user.
    async fn password_hash(
        &self,
        password: String,
        hashed: String,
        no_password: bool,
    ) -> Result<Option<String>, Status> {
        if no_password {
            return Ok(None);
        }
        if !hashed.is_empty() && password.is_empty() {
            use base64::Engine as _;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(hashed.as_bytes())
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    Status::invalid_argument("etcdserver: hashed password is not base64 of a bcrypt hash")
                })?;
            return Ok(Some(decoded));
        }
        self.hash(password).await.map(Some)
    }
}

fn check_name(name: &str) -> Result<(), Status> {
    if name.len() > MAX_NAME {
        return Err(Status::invalid_argument(format!(
            "etcdserver: name longer than {MAX_NAME} bytes"
        )));
    }
    Ok(())
}

fn access_of(t: i32) -> Result<Access, Status> {
    match authpb::permission::Type::try_from(t) {
        Ok(authpb::permission::Type::Read) => Ok(Access::Read),
        Ok(authpb::permission::Type::Write) => Ok(Access::Write),
        Ok(authpb::permission::Type::Readwrite) => Ok(Access::ReadWrite),
        Err(_) => Err(Status::invalid_argument("etcdserver: invalid permission type")),
    }
}

fn permission_of(p: &Permission) -> authpb::Permission {
    let t = match p.access {
        Access::Read => authpb::permission::Type::Read,
        Access::Write => authpb::permission::Type::Write,
        Access::ReadWrite => authpb::permission::Type::Readwrite,
    };
    authpb::Permission {
        perm_type: t as i32,
        key: p.key.clone().into(),
        range_end: p.range_end.clone().into(),
    }
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        _r: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let (enabled, auth_revision) = self.node.engine.server().auth_status();
        Ok(Response::new(pb::AuthStatusResponse {
            header: Some(self.node.current_header()),
            enabled,
            auth_revision,
        }))
    }

    async fn auth_enable(&self, r: Request<pb::AuthEnableRequest>) -> Result<Response<pb::AuthEnableResponse>, Status> {
        let caller = self.caller(&r).await?;
        let header = self.change(caller.as_ref(), AuthChange::Enable).await?;
        Ok(Response::new(pb::AuthEnableResponse { header: Some(header) }))
    }

    async fn auth_disable(
        &self,
        r: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        let caller = self.caller(&r).await?;
        let header = self.change(caller.as_ref(), AuthChange::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse { header: Some(header) }))
    }

    async fn authenticate(
        &self,
        r: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let r = r.into_inner();
        check_name(&r.name)?;
        if r.password.len() > MAX_PASSWORD {
            return Err(auth_status(AuthError::Failed));
        }
        let engine = &self.node.engine;
        // Checked against the latest auth store, as etcd does.
        self.node.bounded(engine.read_barrier_async()).await?;
        loop {
            let (hash, checked) = engine
                .server()
                .auth_read(|a| a.password_hash(&r.name))
                .map_err(auth_status)?;
            let password = r.password.clone();
            let matches = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash).unwrap_or(false))
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
            if !matches {
                tracing::warn!(user = %r.name, "invalid authentication was requested");
                return Err(auth_status(AuthError::Failed));
            }
            let token = match &self.node.access.jwt {
                Some(jwt) => jwt.sign(&r.name, checked).map_err(Status::failed_precondition)?,
                None => {
                    let prefix = simple_token_prefix();
                    let pending = engine
                        .server()
                        .authenticate_async(r.name.clone(), prefix, checked)
                        .or_status()?;
                    match pending.await {
                        Ok(token) => token,
                        // The auth store changed while the password was checked: again.
                        Err(cairn_engine::Error::Auth(AuthError::OldRevision)) => continue,
                        Err(e) => return Err(crate::errors::status(&e)),
                    }
                }
            };
            return Ok(Response::new(pb::AuthenticateResponse {
                header: Some(self.node.current_header()),
                token,
            }));
        }
    }

    async fn user_add(&self, r: Request<pb::AuthUserAddRequest>) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        let caller = self.caller(&r).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let r = r.into_inner();
        check_name(&r.name)?;
        if r.name.is_empty() {
            return Err(auth_status(AuthError::UserEmpty));
        }
        let no_password = r.options.is_some_and(|o| o.no_password);
        let password_hash = self.password_hash(r.password, r.hashed_password, no_password).await?;
        let change = AuthChange::UserAdd {
            name: r.name,
            password_hash,
            no_password,
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthUserAddResponse { header: Some(header) }))
    }

    async fn user_get(&self, r: Request<pb::AuthUserGetRequest>) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        let caller = self.caller(&r).await?;
        let name = r.into_inner().name;
        let is_self = caller.as_ref().is_some_and(|c| c.user == name);
        if !is_self {
            access::admin(&self.node.engine, caller.as_ref())?;
        }
        let roles = self
            .node
            .engine
            .server()
            .auth_read(|a| a.user(&name).map(|u| u.roles.clone()))
            .ok_or_else(|| auth_status(AuthError::UserNotFound))?;
        Ok(Response::new(pb::AuthUserGetResponse {
            header: Some(self.node.current_header()),
            roles,
        }))
    }

    async fn user_list(
        &self,
        r: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        let caller = self.caller(&r).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        Ok(Response::new(pb::AuthUserListResponse {
            header: Some(self.node.current_header()),
            users: self.node.engine.server().auth_read(|a| a.user_names()),
        }))
    }

    async fn user_delete(
        &self,
        r: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        let caller = self.caller(&r).await?;
        let name = r.into_inner().name;
        let header = self.change(caller.as_ref(), AuthChange::UserDelete { name }).await?;
        Ok(Response::new(pb::AuthUserDeleteResponse { header: Some(header) }))
    }

    async fn user_change_password(
        &self,
        r: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        let caller = self.caller(&r).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        let r = r.into_inner();
        let no_password = self
            .node
            .engine
            .server()
            .auth_read(|a| a.user(&r.name).map(|u| u.no_password))
            .ok_or_else(|| auth_status(AuthError::UserNotFound))?;
        let password_hash = self.password_hash(r.password, r.hashed_password, no_password).await?;
        let change = AuthChange::UserChangePassword {
            name: r.name,
            password_hash,
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthUserChangePasswordResponse {
            header: Some(header),
        }))
    }

    async fn user_grant_role(
        &self,
        r: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        let caller = self.caller(&r).await?;
        let r = r.into_inner();
        let change = AuthChange::UserGrantRole {
            user: r.user,
            role: r.role,
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthUserGrantRoleResponse { header: Some(header) }))
    }

    async fn user_revoke_role(
        &self,
        r: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        let caller = self.caller(&r).await?;
        let r = r.into_inner();
        let change = AuthChange::UserRevokeRole {
            name: r.name,
            role: r.role,
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthUserRevokeRoleResponse { header: Some(header) }))
    }

    async fn role_add(&self, r: Request<pb::AuthRoleAddRequest>) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        let caller = self.caller(&r).await?;
        let name = r.into_inner().name;
        check_name(&name)?;
        let header = self.change(caller.as_ref(), AuthChange::RoleAdd { name }).await?;
        Ok(Response::new(pb::AuthRoleAddResponse { header: Some(header) }))
    }

    async fn role_get(&self, r: Request<pb::AuthRoleGetRequest>) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        let caller = self.caller(&r).await?;
        let role = r.into_inner().role;
        let holds = caller
            .as_ref()
            .is_some_and(|c| self.node.engine.server().auth_read(|a| a.has_role(&c.user, &role)));
        if !holds {
            access::admin(&self.node.engine, caller.as_ref())?;
        }
        let perm = self
            .node
            .engine
            .server()
            .auth_read(|a| {
                a.role(&role)
                    .map(|r| r.permissions.iter().map(permission_of).collect::<Vec<_>>())
            })
            .ok_or_else(|| auth_status(AuthError::RoleNotFound))?;
        // The root role may do anything: etcd shows it as read-write on every key.
        let perm = if role == cairn_engine::auth::ROOT {
            vec![authpb::Permission {
                perm_type: authpb::permission::Type::Readwrite as i32,
                key: Default::default(),
                range_end: vec![0].into(),
            }]
        } else {
            perm
        };
        Ok(Response::new(pb::AuthRoleGetResponse {
            header: Some(self.node.current_header()),
            perm,
        }))
    }

    async fn role_list(
        &self,
        r: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        let caller = self.caller(&r).await?;
        access::admin(&self.node.engine, caller.as_ref())?;
        Ok(Response::new(pb::AuthRoleListResponse {
            header: Some(self.node.current_header()),
            roles: self.node.engine.server().auth_read(|a| a.role_names()),
        }))
    }

    async fn role_delete(
        &self,
        r: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        let caller = self.caller(&r).await?;
        let name = r.into_inner().role;
        let header = self.change(caller.as_ref(), AuthChange::RoleDelete { name }).await?;
        Ok(Response::new(pb::AuthRoleDeleteResponse { header: Some(header) }))
    }

    async fn role_grant_permission(
        &self,
        r: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        let caller = self.caller(&r).await?;
        let r = r.into_inner();
        let Some(perm) = r.perm else {
            access::admin(&self.node.engine, caller.as_ref())?;
            return Err(auth_status(AuthError::PermissionNotGiven));
        };
        let permission = Permission {
            access: access_of(perm.perm_type)?,
            key: perm.key.to_vec(),
            range_end: perm.range_end.to_vec(),
        };
        let change = AuthChange::RoleGrantPermission {
            name: r.name,
            permission,
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthRoleGrantPermissionResponse {
            header: Some(header),
        }))
    }

    async fn role_revoke_permission(
        &self,
        r: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        let caller = self.caller(&r).await?;
        let r = r.into_inner();
        let change = AuthChange::RoleRevokePermission {
            role: r.role,
            key: r.key.to_vec(),
            range_end: r.range_end.to_vec(),
        };
        let header = self.change(caller.as_ref(), change).await?;
        Ok(Response::new(pb::AuthRoleRevokePermissionResponse {
            header: Some(header),
        }))
    }
}

/// 16 random letters: a simple token's prefix (the entry's index follows it).
fn simple_token_prefix() -> String {
    use rand::seq::IndexedRandom;
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut rng = rand::rng();
    (0..16)
        .map(|_| char::from(*LETTERS.choose(&mut rng).unwrap_or(&b'a')))
        .collect()
}
