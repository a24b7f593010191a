//! The Cluster service. MemberList passes through (advertising the proxy itself, `--advertise-client-url`, is a
//! later step); membership changes are forwarded as writes.

use std::sync::Arc;

use proto::etcdserverpb::cluster_client::ClusterClient;
use proto::etcdserverpb::cluster_server::Cluster;
use proto::etcdserverpb::{
    MemberAddRequest, MemberAddResponse, MemberListRequest, MemberListResponse,
    MemberPromoteRequest, MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse,
    MemberUpdateRequest, MemberUpdateResponse,
};
use tonic::{Request, Response, Status};

use crate::upstream::{Retry, Upstream, forward_unary};

/// The proxy's Cluster service.
pub struct ClusterService {
    upstream: Arc<Upstream>,
}

impl ClusterService {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_add(
        &self,
        request: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ClusterClient::member_add
        )
    }

    async fn member_remove(
        &self,
        request: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ClusterClient::member_remove
        )
    }

    async fn member_update(
        &self,
        request: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ClusterClient::member_update
        )
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            ClusterClient::member_list
        )
    }

    async fn member_promote(
        &self,
        request: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            ClusterClient::member_promote
        )
    }
}
