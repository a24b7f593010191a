//! Maintenance, Auth, Election and Lock: forwarded unchanged to the active endpoint (streams included), with the
//! caller's token. Reads are retried on another endpoint when one fails; writes only when provably unsent.

use std::sync::Arc;

use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::auth_server::Auth;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::maintenance_server::Maintenance;
use proto::etcdserverpb::*;
use proto::v3electionpb::election_client::ElectionClient;
use proto::v3electionpb::election_server::Election;
use proto::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use proto::v3lockpb::lock_client::LockClient;
use proto::v3lockpb::lock_server::Lock;
use proto::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use crate::upstream::{BoxStream, Retry, Upstream, forward_server_stream, forward_unary};

/// Maintenance, Auth, Election and Lock, all forwarded as they are.
#[derive(Clone)]
pub struct Passthrough {
    upstream: Arc<Upstream>,
}

impl Passthrough {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

#[tonic::async_trait]
impl Maintenance for Passthrough {
    type SnapshotStream = BoxStream<SnapshotResponse>;

    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        let listing = request.get_ref().action() == alarm_request::AlarmAction::Get;
        let retry = if listing {
            Retry::ReadOnly
        } else {
            Retry::Write
        };
        forward_unary!(self.upstream, retry, request, MaintenanceClient::alarm)
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            MaintenanceClient::status
        )
    }

    async fn defragment(
        &self,
        request: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            MaintenanceClient::defragment
        )
    }

    async fn hash(&self, request: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            MaintenanceClient::hash
        )
    }

    async fn hash_kv(
        &self,
        request: Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            MaintenanceClient::hash_kv
        )
    }

    async fn snapshot(
        &self,
        request: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        forward_server_stream!(self.upstream, request, MaintenanceClient::snapshot)
    }

    async fn move_leader(
        &self,
        request: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            MaintenanceClient::move_leader
        )
    }

    async fn downgrade(
        &self,
        request: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            MaintenanceClient::downgrade
        )
    }
}

#[tonic::async_trait]
impl Auth for Passthrough {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::auth_enable
        )
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::auth_disable
        )
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::auth_status
        )
    }

    /// Authenticate issues a new token each time; repeating it on another endpoint is harmless.
    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::authenticate
        )
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, AuthClient::user_add)
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::user_get
        )
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::user_list
        )
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::user_delete
        )
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::user_change_password
        )
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::user_grant_role
        )
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::user_revoke_role
        )
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, AuthClient::role_add)
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::role_get
        )
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            AuthClient::role_list
        )
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::role_delete
        )
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::role_grant_permission
        )
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            AuthClient::role_revoke_permission
        )
    }
}

#[tonic::async_trait]
impl Election for Passthrough {
    type ObserveStream = BoxStream<LeaderResponse>;

    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ElectionClient::campaign
        )
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ElectionClient::proclaim
        )
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            ElectionClient::leader
        )
    }

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        forward_server_stream!(self.upstream, request, ElectionClient::observe)
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, ElectionClient::resign)
    }
}

#[tonic::async_trait]
impl Lock for Passthrough {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, LockClient::lock)
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, LockClient::unlock)
    }
}
