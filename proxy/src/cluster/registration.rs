//! `--resolver-prefix`: the proxy registers itself in etcd under a lease it keeps alive, so that clients resolving
//! `etcd:///<prefix>` (and MemberList through any proxy of the fleet) find it. The lease is renewed through the
//! keep-alive coalescer, like a client's. When etcd says the lease is gone (it expired during a partition, or
//! across a failover) the proxy registers again; when the proxy stops gracefully it revokes the lease, so its key
//! goes at once; a killed proxy's key goes when its TTL runs out.

use std::sync::Arc;
use std::time::Duration;

use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, PutRequest,
    PutResponse,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Status;

use crate::lease::LeaseService;
use crate::upstream::identity::{Identity, own_token, own_write};
use crate::upstream::{Upstream, path};

/// The pause before trying again after a step failed (as etcd's Go proxy, at most one attempt a second).
const RETRY_PAUSE: Duration = Duration::from_secs(1);
/// How long a graceful stop waits for etcd to revoke the lease.
const REVOKE_WAIT: Duration = Duration::from_secs(2);

/// What to register, and with what.
pub struct Registrar {
    pub upstream: Arc<Upstream>,
    pub lease: Arc<LeaseService>,
    /// The proxy's own identity (`--user`), for writing under etcd auth.
    pub identity: Option<Arc<Identity>>,
    pub key: Vec<u8>,
    pub value: String,
    /// Seconds.
    pub ttl: i64,
}

/// A running registration.
pub struct Registration {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Registration {
    /// Registers now, and again whenever the registration is lost, until [`Registration::stop`].
    pub fn start(registrar: Registrar) -> Self {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(registrar.run(stopped));
        Self { stop, task }
    }

    /// Revokes the registration's lease (its key goes with it) and ends; waits at most [`REVOKE_WAIT`] for etcd.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

impl Registrar {
    async fn run(self, mut stopped: oneshot::Receiver<()>) {
        loop {
            let registered = tokio::select! {
                biased;
                _ = &mut stopped => return,
                registered = self.register() => registered,
            };
            let lease = match registered {
                Ok(lease) => lease,
                Err(status) => {
                    tracing::warn!(%status, key = %String::from_utf8_lossy(&self.key), "cannot register in etcd; trying again");
                    tokio::select! {
                        biased;
                        _ = &mut stopped => return,
                        _ = tokio::time::sleep(RETRY_PAUSE) => continue,
                    }
                }
            };
            tracing::info!(key = %String::from_utf8_lossy(&self.key), lease, "registered in etcd");
            if self.keep_alive(lease, &mut stopped).await == Ended::Stopped {
                match self.revoke(lease).await {
                    Ok(()) => tracing::info!(lease, "deregistered from etcd"),
                    Err(why) => tracing::warn!(
                        lease,
                        why,
                        "cannot deregister; the key goes when its lease expires"
                    ),
                }
                return;
            }
            tracing::warn!(lease, "the registration's lease is gone; registering again");
        }
    }

    /// Grants a lease and writes the key under it; returns the lease.
    async fn register(&self) -> Result<i64, Status> {
        let grant = LeaseGrantRequest {
            ttl: self.ttl,
            id: 0,
        };
        let granted: LeaseGrantResponse = self.call(path::LEASE_GRANT, grant).await?;
        if !granted.error.is_empty() {
            return Err(Status::unavailable(granted.error));
        }
        let put = PutRequest {
            key: self.key.clone(),
            value: self.value.clone().into_bytes(),
            lease: granted.id,
            ..Default::default()
        };
        match self.call::<_, PutResponse>(path::PUT, put).await {
            Ok(_) => Ok(granted.id),
            Err(refused) => {
                // The lease would otherwise live out its TTL, one more for every attempt (under auth, a user that
                // may not write the prefix is refused each time).
                if let Err(why) = self.revoke(granted.id).await {
                    tracing::debug!(
                        lease = granted.id,
                        why,
                        "cannot revoke a refused registration's lease"
                    );
                }
                Err(refused)
            }
        }
    }

    /// Renews `lease` every third of its TTL until it is gone or the proxy stops.
    async fn keep_alive(&self, lease: i64, stopped: &mut oneshot::Receiver<()>) -> Ended {
        let every = Duration::from_secs(self.ttl as u64) / 3;
        loop {
            tokio::select! {
                biased;
                _ = &mut *stopped => return Ended::Stopped,
                _ = tokio::time::sleep(every) => {}
            }
            // etcd checks the token of each renewal (3.5.30 on): the proxy renews as its user.
            let renewal = async {
                let token = self.token().await?;
                let renewed = self.lease.renew(lease, token.clone()).await;
                if let (Err(status), Some(identity)) = (&renewed, &self.identity)
                    && crate::error::is_auth_refusal(status)
                    && status.code() != tonic::Code::PermissionDenied
                {
                    // The token is gone (an etcd restart forgets every token) or auth was turned on since: the
                    // next renewal authenticates again.
                    identity.forget(token.as_deref()).await;
                }
                renewed
            };
            match tokio::time::timeout(every, renewal).await {
                Ok(Ok(renewed)) if renewed.ttl > 0 => {}
                Ok(Ok(_)) => return Ended::Lost,
                // The upstream is failing over or unreachable: the next renewal tells whether the lease outlived it.
                Ok(Err(status)) => tracing::debug!(%status, lease, "registration renewal failed"),
                Err(_) => tracing::debug!(lease, "registration renewal not answered in time"),
            }
        }
    }

    /// Revokes `lease`, waiting at most [`REVOKE_WAIT`] for etcd; `Err` says why it may not be gone.
    async fn revoke(&self, lease: i64) -> Result<(), String> {
        let revoke = LeaseRevokeRequest { id: lease };
        let revoked: Result<Result<LeaseRevokeResponse, Status>, _> =
            tokio::time::timeout(REVOKE_WAIT, self.call(path::LEASE_REVOKE, revoke)).await;
        match revoked {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(status.to_string()),
            Err(_) => Err(format!("not answered within {REVOKE_WAIT:?}")),
        }
    }

    /// The proxy's token, if it has an identity (and etcd's auth is on).
    async fn token(&self) -> Result<Option<String>, Status> {
        own_token(self.identity.as_ref(), &self.upstream).await
    }

    /// A write with the proxy's token, if it has an identity.
    async fn call<Req, Resp>(&self, path: &'static str, message: Req) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        own_write(self.identity.as_ref(), &self.upstream, path, message).await
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Ended {
    Stopped,
    Lost,
}
