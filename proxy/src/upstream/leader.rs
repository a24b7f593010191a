//! Calls only etcd's leader serves. MoveLeader is refused by every other member ("etcdserver: not leader"), and a
//! client of the proxy cannot choose its member: so such a call goes to the endpoint whose member leads, found by
//! asking the endpoints' Status (with the caller's token: under auth Status, like MoveLeader, is for the root role
//! on the versions that restrict it). When no endpoint is found to lead, the call goes the usual way and etcd
//! answers it as it would.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use proto::etcdserverpb::{StatusRequest, StatusResponse};
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use super::codec::RawCodec;
use super::{Forwarded, Retry, Upstream};
use crate::error;

/// How long each endpoint's Status may take while the leader's endpoint is looked for.
const STATUS_WAIT: Duration = Duration::from_secs(2);

impl Upstream {
    /// A unary write only the leader serves: sent to the leader's endpoint when the active one does not lead.
    pub async fn unary_on_leader(
        self: &Arc<Self>,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let forwarded = Forwarded::capture(&request);
        let active = self.active().index;
        match self.leader_endpoint(active, forwarded.token()).await {
            Some(leader) if leader != active => {
                let message = request.into_inner();
                self.check_send(&message)?;
                let mut grpc = self.client(self.members.get(leader).channel()).await?;
                let trace = self.attempt_trace(&path, &forwarded);
                let request = trace.request(&forwarded, message);
                let answer = grpc.unary(request, path, RawCodec).await;
                trace.end(
                    answer
                        .as_ref()
                        .map_or_else(Status::code, |_| tonic::Code::Ok),
                );
                answer.map_err(error::to_client)
            }
            _ => self.unary(Retry::Write, path, request).await,
        }
    }

    /// The endpoint whose member leads, asking the `active` one first: it names the leader, and is it unless
    /// leadership moved. `None` when no endpoint says it leads (an election, or the caller may not ask Status).
    async fn leader_endpoint(&self, active: usize, token: Option<String>) -> Option<usize> {
        let leads = |status: &StatusResponse| {
            status.leader != 0 && status.header.as_ref().map(|h| h.member_id) == Some(status.leader)
        };
        let first = self.status_of(active, token.as_deref()).await?;
        if leads(&first) {
            return Some(active);
        }
        for index in self.others(active) {
            if let Some(status) = self.status_of(index, token.as_deref()).await
                && leads(&status)
            {
                return Some(index);
            }
        }
        None
    }

    /// Endpoint `index`'s Status asked with `token`, if it answers within [`STATUS_WAIT`].
    async fn status_of(&self, index: usize, token: Option<&str>) -> Option<StatusResponse> {
        let mut request = Request::new(StatusRequest {});
        if let Some(token) = token.and_then(|t| MetadataValue::try_from(t).ok()) {
            request.metadata_mut().insert("token", token);
        }
        let mut client = proto::etcdserverpb::maintenance_client::MaintenanceClient::new(
            self.members.get(index).channel(),
        );
        match tokio::time::timeout(STATUS_WAIT, client.status(request)).await {
            Ok(Ok(status)) => Some(status.into_inner()),
            _ => None,
        }
    }
}
