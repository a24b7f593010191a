//! The Auth service of one member, on the cluster's [`Auth`]: every call goes through raft as etcd's do (it waits
//! for the member to know a leader), its token is checked first, and all but Authenticate, UserGet and RoleGet
//! need the root role once auth is on (UserGet of oneself and RoleGet of one's own role do not).

use std::time::Duration;

use proto::etcdserverpb::auth_server::Auth as AuthApi;
use proto::etcdserverpb::*;
use tonic::{Request, Response, Status};

use super::auth::{Auth, Caller};
use super::cluster::Cluster;

pub struct AuthService {
    pub cluster: Cluster,
    pub member: usize,
}

/// Whether a call needs the root role when auth is on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    Admin,
    /// The call decides for itself (UserGet, RoleGet).
    Caller,
}

impl AuthService {
    /// Runs `op` as etcd applies an auth call from the request's caller; returns its result and the header.
    async fn apply<M, R>(
        &self,
        request: Request<M>,
        needs: Needs,
        op: impl FnOnce(&mut Auth, &Caller, M, Duration) -> Result<R, Status>,
    ) -> Result<(R, Option<ResponseHeader>), Status> {
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let caller = self.cluster.caller(self.member, request.metadata())?;
        let message = request.into_inner();
        let result = self.cluster.with_auth(|auth, now| {
            if needs == Needs::Admin {
                auth.check_admin(&caller)?;
            }
            op(auth, &caller, message, now)
        })?;
        Ok((result, self.header()))
    }

    fn header(&self) -> Option<ResponseHeader> {
        let revision = self
            .cluster
            .with_store(|store, _| self.cluster.applied_revision(self.member, store.revision()));
        Some(self.cluster.header(self.member, revision))
    }
}

#[tonic::async_trait]
impl AuthApi for AuthService {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, _, _| auth.enable())
            .await?;
        Ok(Response::new(AuthEnableResponse { header }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, _, _| {
                auth.disable();
                Ok(())
            })
            .await?;
        Ok(Response::new(AuthDisableResponse { header }))
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let ((enabled, auth_revision), header) = self
            .apply(request, Needs::Admin, |auth, _, _, _| {
                Ok((auth.is_enabled(), auth.revision()))
            })
            .await?;
        Ok(Response::new(AuthStatusResponse {
            header,
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        // Authenticate carries no token to check: it is how a caller gets one.
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let request = request.into_inner();
        let token = self
            .cluster
            .with_auth(|auth, now| auth.authenticate(&request.name, &request.password, now))?;
        Ok(Response::new(AuthenticateResponse {
            header: self.header(),
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                let no_password = r.options.is_some_and(|o| o.no_password);
                auth.user_add(&r.name, &r.password, no_password)
            })
            .await?;
        Ok(Response::new(AuthUserAddResponse { header }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let (roles, header) = self
            .apply(request, Needs::Caller, |auth, caller, r, _| {
                auth.user_get(caller, &r.name)
            })
            .await?;
        Ok(Response::new(AuthUserGetResponse { header, roles }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let (users, header) = self
            .apply(request, Needs::Admin, |auth, _, _, _| Ok(auth.user_list()))
            .await?;
        Ok(Response::new(AuthUserListResponse { header, users }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.user_delete(&r.name)
            })
            .await?;
        Ok(Response::new(AuthUserDeleteResponse { header }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.user_change_password(&r.name, &r.password)
            })
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse { header }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.user_grant_role(&r.user, &r.role)
            })
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse { header }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.user_revoke_role(&r.name, &r.role)
            })
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse { header }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.role_add(&r.name)
            })
            .await?;
        Ok(Response::new(AuthRoleAddResponse { header }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let (perm, header) = self
            .apply(request, Needs::Caller, |auth, caller, r, _| {
                auth.role_get(caller, &r.role)
            })
            .await?;
        Ok(Response::new(AuthRoleGetResponse { header, perm }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let (roles, header) = self
            .apply(request, Needs::Admin, |auth, _, _, _| Ok(auth.role_list()))
            .await?;
        Ok(Response::new(AuthRoleListResponse { header, roles }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.role_delete(&r.role)
            })
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse { header }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.role_grant_permission(&r.name, r.perm)
            })
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse { header }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let ((), header) = self
            .apply(request, Needs::Admin, |auth, _, r, _| {
                auth.role_revoke_permission(&r.role, &r.key, &r.range_end)
            })
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse { header }))
    }
}
