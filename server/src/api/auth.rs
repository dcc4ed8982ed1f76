//! The Auth service. Authentication is not implemented yet (it has its own issue): every call
//! answers `Unimplemented`, which clients treat as "no auth", except AuthStatus, which reports
//! it disabled.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::node::Node;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::auth_server::Auth;

/// The Auth service over a [`Node`].
#[derive(Debug, Clone)]
pub struct AuthService {
    node: Arc<Node>,
}

impl AuthService {
    pub fn new(node: Arc<Node>) -> AuthService {
        AuthService { node }
    }
}

fn unimplemented<T>() -> Result<Response<T>, Status> {
    Err(Status::unimplemented("cairn does not implement authentication yet"))
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_status(
        &self,
        _r: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        Ok(Response::new(pb::AuthStatusResponse {
            header: Some(self.node.current_header()),
            enabled: false,
            auth_revision: 0,
        }))
    }

    async fn auth_enable(
        &self,
        _r: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        unimplemented()
    }

    async fn auth_disable(
        &self,
        _r: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        unimplemented()
    }

    async fn authenticate(
        &self,
        _r: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        unimplemented()
    }

    async fn user_add(&self, _r: Request<pb::AuthUserAddRequest>) -> Result<Response<pb::AuthUserAddResponse>, Status> {
        unimplemented()
    }

    async fn user_get(&self, _r: Request<pb::AuthUserGetRequest>) -> Result<Response<pb::AuthUserGetResponse>, Status> {
        unimplemented()
    }

    async fn user_list(
        &self,
        _r: Request<pb::AuthUserListRequest>,
    ) -> Result<Response<pb::AuthUserListResponse>, Status> {
        unimplemented()
    }

    async fn user_delete(
        &self,
        _r: Request<pb::AuthUserDeleteRequest>,
    ) -> Result<Response<pb::AuthUserDeleteResponse>, Status> {
        unimplemented()
    }

    async fn user_change_password(
        &self,
        _r: Request<pb::AuthUserChangePasswordRequest>,
    ) -> Result<Response<pb::AuthUserChangePasswordResponse>, Status> {
        unimplemented()
    }

    async fn user_grant_role(
        &self,
        _r: Request<pb::AuthUserGrantRoleRequest>,
    ) -> Result<Response<pb::AuthUserGrantRoleResponse>, Status> {
        unimplemented()
    }

    async fn user_revoke_role(
        &self,
        _r: Request<pb::AuthUserRevokeRoleRequest>,
    ) -> Result<Response<pb::AuthUserRevokeRoleResponse>, Status> {
        unimplemented()
    }

    async fn role_add(&self, _r: Request<pb::AuthRoleAddRequest>) -> Result<Response<pb::AuthRoleAddResponse>, Status> {
        unimplemented()
    }

    async fn role_get(&self, _r: Request<pb::AuthRoleGetRequest>) -> Result<Response<pb::AuthRoleGetResponse>, Status> {
        unimplemented()
    }

    async fn role_list(
        &self,
        _r: Request<pb::AuthRoleListRequest>,
    ) -> Result<Response<pb::AuthRoleListResponse>, Status> {
        unimplemented()
    }

    async fn role_delete(
        &self,
        _r: Request<pb::AuthRoleDeleteRequest>,
    ) -> Result<Response<pb::AuthRoleDeleteResponse>, Status> {
        unimplemented()
    }

    async fn role_grant_permission(
        &self,
        _r: Request<pb::AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<pb::AuthRoleGrantPermissionResponse>, Status> {
        unimplemented()
    }

    async fn role_revoke_permission(
        &self,
        _r: Request<pb::AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<pb::AuthRoleRevokePermissionResponse>, Status> {
        unimplemented()
    }
}
