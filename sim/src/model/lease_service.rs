//! The Lease service of one member. Keep-alive streams are recorded in the history (the lease fan-out checker
//! counts them) and answer each request as soon as the member knows a leader (grants, revocations, renewals and
//! TimeToLive go to etcd's leader); a client half-close ends the stream after the last answer.

use futures::StreamExt;
use proto::etcdserverpb::lease_server::Lease;
use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::cluster::{Cluster, ConnectedAt, stopped};
use super::history::StreamKind;

pub struct LeaseService {
    pub cluster: Cluster,
    pub member: usize,
    pub stop: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let request = request.into_inner();
        let cluster = self.cluster.clone();
        let (id, ttl, revision) = self.cluster.with_store(|store, now| {
            store
                .lease_grant(request.id, request.ttl, now, || cluster.fresh_lease_id())
                .map(|(id, ttl)| (id, ttl, store.revision()))
        })?;
        Ok(Response::new(LeaseGrantResponse {
            header: Some(self.cluster.header(self.member, revision)),
            id,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let id = request.into_inner().id;
        let revision = self
            .cluster
            .with_store(|store, now| store.lease_revoke(id, now).map(|()| store.revision()))?;
        Ok(Response::new(LeaseRevokeResponse {
            header: Some(self.cluster.header(self.member, revision)),
        }))
    }

    type LeaseKeepAliveStream = ReceiverStream<Result<LeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        let metadata = request.metadata().clone();
        let connected_at = request.extensions().get::<ConnectedAt>().map(|c| c.0);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        let cluster = self.cluster.clone();
        let member = self.member;
        let mut stop = self.stop.clone();
        let guard = cluster.open_stream(member, StreamKind::LeaseKeepAlive, connected_at);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    // Fixed order, for reproducible runs (turmoil seeds select!'s RNG only under tokio_unstable).
                    biased;
                    next = inbound.next() => next,
                    () = stopped(&mut stop) => return,
                    _ = tx.closed() => return,
                };
                let request = match next {
                    Some(Ok(request)) => {
                        guard.touch();
                        request
                    }
                    // A half-close ends the stream cleanly once every request has been answered.
                    None => return,
                    Some(Err(_)) => return,
                };
                // A renewal goes to the leader: it waits for one, and a wait in vain ends the stream.
                if let Err(status) = cluster.wait_for_leader(member, &metadata).await {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                let (ttl, revision) = cluster.with_store(|store, now| {
                    (
                        store.lease_keep_alive(request.id, now, member),
                        store.revision(),
                    )
                });
                let response = LeaseKeepAliveResponse {
                    header: Some(cluster.header(member, revision)),
                    id: request.id,
                    ttl,
                };
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let request = request.into_inner();
        let (answer, revision) = self.cluster.with_store(|store, now| {
            (
                store.lease_time_to_live(request.id, request.keys, now),
                store.revision(),
            )
        });
        Ok(Response::new(LeaseTimeToLiveResponse {
            header: Some(self.cluster.header(self.member, revision)),
            id: request.id,
            ttl: answer.ttl,
            granted_ttl: answer.granted_ttl,
            keys: answer.keys,
        }))
    }

    async fn lease_leases(
        &self,
        _request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let (ids, revision) = self
            .cluster
            .with_store(|store, now| (store.lease_ids(now), store.revision()));
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.cluster.header(self.member, revision)),
            leases: ids.into_iter().map(|id| LeaseStatus { id }).collect(),
        }))
    }
}
