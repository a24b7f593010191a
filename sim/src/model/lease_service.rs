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
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{Access, Caller};
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
        // Any caller may grant; a token it carries must be valid.
        self.cluster.caller(self.member, request.metadata())?;
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
        let id = request.get_ref().id;
        authorize_lease(
            &self.cluster,
            self.member,
            request.metadata(),
            id,
            LeaseCheck::Revoke,
        )?;
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
                let allowed = match cluster.wait_for_leader(member, &metadata).await {
                    Ok(()) => {
                        authorize_lease(&cluster, member, &metadata, request.id, LeaseCheck::Renew)
                    }
                    Err(status) => Err(status),
                };
                if let Err(status) = allowed {
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
        let id = request.get_ref().id;
        authorize_lease(
            &self.cluster,
            self.member,
            request.metadata(),
            id,
            LeaseCheck::Read,
        )?;
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
        request: Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        let (ids, revision) = self
            .cluster
            .with_store(|store, now| (store.lease_ids(now), store.revision()));
        // Lease 0 is never granted: asking about it checks the caller alone, as etcd does before any lease.
        for id in std::iter::once(0).chain(ids.iter().copied()) {
            let metadata = request.metadata();
            authorize_lease(&self.cluster, self.member, metadata, id, LeaseCheck::Read)?;
        }
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.cluster.header(self.member, revision)),
            leases: ids.into_iter().map(|id| LeaseStatus { id }).collect(),
        }))
    }
}

/// What etcd 3.5.30's auth asks of a lease call's caller (`checkLeaseRenew`, `checkLeaseTimeToLive`,
/// `checkLeasePuts`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LeaseCheck {
    /// A renewal: a user, who may write every key attached to the lease.
    Renew,
    /// TimeToLive, Leases: a user, who may read every key attached.
    Read,
    /// A revocation: whoever may write every key attached (with no key attached, anyone).
    Revoke,
}

/// Refuses a lease call on `lease` reaching member `member` with `metadata` unless its caller passes `check`
/// (the root role passes every check).
fn authorize_lease(
    cluster: &Cluster,
    member: usize,
    metadata: &MetadataMap,
    lease: i64,
    check: LeaseCheck,
) -> Result<(), Status> {
    let caller = cluster.caller(member, metadata)?;
    if caller == Caller::Anyone {
        return Ok(());
    }
    if caller == Caller::Nobody && check != LeaseCheck::Revoke {
        return Err(super::errors::user_empty());
    }
    if cluster
        .with_auth(|auth, _| auth.check_admin(&caller))
        .is_ok()
    {
        return Ok(());
    }
    let keys = cluster.with_store(|store, now| store.lease_time_to_live(lease, true, now).keys);
    let access = match check {
        LeaseCheck::Read => Access::Read,
        LeaseCheck::Renew | LeaseCheck::Revoke => Access::Write,
    };
    let wants: Vec<(Access, &[u8], &[u8])> = keys
        .iter()
        .map(|key| (access, &key[..], &b""[..]))
        .collect();
    cluster.authorize(member, metadata, &wants).map(drop)
}
