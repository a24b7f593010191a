//! The Lease service. Unary calls are forwarded with their real status codes; each keep-alive stream is forwarded
//! 1:1 for now (coalescing keep-alives onto one upstream stream is a later step).

use std::sync::Arc;

use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::lease_server::Lease;
use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use tonic::{Request, Response, Status, Streaming};

use crate::upstream::{BoxStream, Retry, Upstream, forward_bidi, forward_unary};

/// The proxy's Lease service.
pub struct LeaseService {
    upstream: Arc<Upstream>,
}

impl LeaseService {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

#[tonic::async_trait]
impl Lease for LeaseService {
    type LeaseKeepAliveStream = BoxStream<LeaseKeepAliveResponse>;

    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            LeaseClient::lease_grant
        )
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::Write,
            request,
            LeaseClient::lease_revoke
        )
    }

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        forward_bidi!(self.upstream, request, LeaseClient::lease_keep_alive)
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            LeaseClient::lease_time_to_live
        )
    }

    async fn lease_leases(
        &self,
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        forward_unary!(
            self.upstream,
            Retry::ReadOnly,
            request,
            LeaseClient::lease_leases
        )
    }
}
