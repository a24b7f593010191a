//! Lease keep-alive streams, coalesced: every client stream's renewals travel over one upstream stream
//! ([`coalescer`]), and answers are routed back. (The Lease service's unary calls are relayed by [`crate::rpc`].)

pub mod coalescer;

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::{Semaphore, mpsc, watch};

use proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use tonic::{Request, Response, Status, Streaming};

use crate::error;
use crate::metrics::Metrics;
use crate::upstream::outbound::{OnDrop, Outbound};
use crate::upstream::{BoxStream, Forwarded, Upstream};
use coalescer::{Answer, Renew, Waiter};

/// Requests one client stream may have unanswered (or answered but unread); beyond it the proxy stops reading
/// that stream's requests, so a client that never reads cannot grow the proxy's memory.
const MAX_UNANSWERED_PER_STREAM: usize = 1024;
/// Requests queued towards the coalescer from all client streams.
const RENEW_QUEUE: usize = 8192;

/// The proxy's keep-alive coalescing.
pub struct LeaseService {
    upstream: Arc<Upstream>,
    metrics: Metrics,
    renewals: mpsc::Sender<Renew>,
}

impl LeaseService {
    /// Creates the service and starts its keep-alive coalescer.
    pub fn new(upstream: Arc<Upstream>, metrics: Metrics) -> Self {
        let (renewals, requests) = mpsc::channel(RENEW_QUEUE);
        tokio::spawn(coalescer::run(upstream.clone(), metrics.clone(), requests));
        Self {
            upstream,
            metrics,
            renewals,
        }
    }
}

/// One client keep-alive stream: reads its requests into the coalescer and yields the answers.
fn client_stream(
    mut inbound: Streaming<LeaseKeepAliveRequest>,
    requires_leader: bool,
    renewals: mpsc::Sender<Renew>,
    metrics: Metrics,
    shutdown: watch::Receiver<bool>,
) -> BoxStream<LeaseKeepAliveResponse> {
    let (answers, answers_rx) = mpsc::channel::<Answer>(MAX_UNANSWERED_PER_STREAM);
    let (abort, abort_rx) = mpsc::channel::<Status>(1);
    let permits = Arc::new(Semaphore::new(MAX_UNANSWERED_PER_STREAM));
    tokio::spawn(async move {
        while let Some(next) = inbound.next().await {
            let request = match next {
                Ok(request) => request,
                Err(status) => {
                    let _ = abort.send(error::to_client(status)).await;
                    return;
                }
            };
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let waiter = Waiter {
                answers: answers.clone(),
                permit,
                requires_leader,
            };
            if renewals
                .send(Renew {
                    lease_id: request.id,
                    waiter,
                })
                .await
                .is_err()
            {
                return;
            }
        }
        // Half-close: `answers` is dropped here, so the stream ends once every pending request is answered.
    });
    metrics.lease_client_streams.inc();
    let outbound = Outbound {
        items: answers_rx,
        abort: abort_rx,
        shutdown,
    };
    let gauge = OnDrop(move || metrics.lease_client_streams.dec());
    outbound.into_stream(|(answer, _permit): Answer| answer, gauge)
}

impl LeaseService {
    /// Renews `lease_id` once over the shared upstream stream, for a lease of the proxy's own (its registration).
    pub async fn renew(&self, lease_id: i64) -> Result<LeaseKeepAliveResponse, Status> {
        let (answers, mut answer) = mpsc::channel::<Answer>(1);
        let permit = Arc::new(Semaphore::new(1))
            .acquire_owned()
            .await
            .expect("a new semaphore is open");
        let waiter = Waiter {
            answers,
            permit,
            requires_leader: false,
        };
        let shutting_down = || Status::unavailable("etcd-grpc-proxy: shutting down");
        self.renewals
            .send(Renew { lease_id, waiter })
            .await
            .map_err(|_| shutting_down())?;
        answer
            .recv()
            .await
            .map(|(answer, _)| answer)
            .unwrap_or_else(|| Err(shutting_down()))
    }

    /// One client's keep-alive stream.
    pub async fn lease_keep_alive(
        &self,
        request: Request<Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<LeaseKeepAliveResponse>>, Status> {
        let forwarded = Forwarded::capture(&request);
        let requires_leader = forwarded.requires_leader();
        if requires_leader {
            self.upstream
                .require_leader(forwarded.token().as_deref())
                .await?;
        }
        Ok(Response::new(client_stream(
            request.into_inner(),
            requires_leader,
            self.renewals.clone(),
            self.metrics.clone(),
            self.upstream.shutdown_signal(),
        )))
    }
}
