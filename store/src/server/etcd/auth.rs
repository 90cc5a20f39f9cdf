//! etcd's Auth service. rkube authenticates store clients by mutual TLS client certificates
//! issued by the cluster CA; etcd's user/password auth is refused with a clear status, never
//! silently accepted. AuthStatus answers truthfully that it is disabled.

use tonic::{Request, Response, Status};

use crate::proto::etcdserverpb as pb;
use crate::proto::etcdserverpb::auth_server::Auth;

pub struct AuthService {
    pub node: std::sync::Arc<crate::server::node::Node>,
}

fn refused() -> Status {
    Status::unimplemented(
        "etcdserver: user/password authentication is not supported by rkube; clients authenticate with \
         mutual TLS client certificates signed by the cluster CA (see DIR/pki from `rkube up`)",
    )
}

macro_rules! auth_service {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
        #[tonic::async_trait]
        impl Auth for AuthService {
            async fn auth_status(
                &self,
                _request: Request<pb::AuthStatusRequest>,
            ) -> Result<Response<pb::AuthStatusResponse>, Status> {
                Ok(Response::new(pb::AuthStatusResponse {
                    header: self.node.header(self.node.mvcc.revision()),
                    enabled: false,
                    auth_revision: 0,
                }))
            }
            $(
                async fn $name(&self, _request: Request<$req>) -> Result<Response<$resp>, Status> {
                    Err(refused())
                }
            )*
        }
    };
}

auth_service! {
    auth_enable(pb::AuthEnableRequest) -> pb::AuthEnableResponse;
    auth_disable(pb::AuthDisableRequest) -> pb::AuthDisableResponse;
    authenticate(pb::AuthenticateRequest) -> pb::AuthenticateResponse;
    user_add(pb::AuthUserAddRequest) -> pb::AuthUserAddResponse;
    user_get(pb::AuthUserGetRequest) -> pb::AuthUserGetResponse;
    user_list(pb::AuthUserListRequest) -> pb::AuthUserListResponse;
    user_delete(pb::AuthUserDeleteRequest) -> pb::AuthUserDeleteResponse;
    user_change_password(pb::AuthUserChangePasswordRequest) -> pb::AuthUserChangePasswordResponse;
    user_grant_role(pb::AuthUserGrantRoleRequest) -> pb::AuthUserGrantRoleResponse;
    user_revoke_role(pb::AuthUserRevokeRoleRequest) -> pb::AuthUserRevokeRoleResponse;
    role_add(pb::AuthRoleAddRequest) -> pb::AuthRoleAddResponse;
    role_get(pb::AuthRoleGetRequest) -> pb::AuthRoleGetResponse;
    role_list(pb::AuthRoleListRequest) -> pb::AuthRoleListResponse;
    role_delete(pb::AuthRoleDeleteRequest) -> pb::AuthRoleDeleteResponse;
    role_grant_permission(pb::AuthRoleGrantPermissionRequest) -> pb::AuthRoleGrantPermissionResponse;
    role_revoke_permission(pb::AuthRoleRevokePermissionRequest) -> pb::AuthRoleRevokePermissionResponse;
}
