//! Lease keep-alive streams, coalesced: the renewals of every client stream that carries the same token (or none)
//! travel over one upstream stream ([`coalescer`]), and answers are routed back. (The Lease service's unary calls
//! are relayed by [`crate::rpc`].)
//!
//! One upstream stream per token, because etcd checks each renewal's token (from 3.5.30: none is "user name is
//! empty", and a user may renew only a lease whose keys it may write): a renewal sent with another caller's token,
//! or with none, would be answered as that caller, not as this one. Without auth no caller has a token and every
//! renewal shares one stream. etcd ends a stream when it refuses one renewal; [`refusal`] finds whose it was. A
//! renewal whose answer a broken stream lost is not simply sent again: [`confirm`] asks etcd whether it was performed.
//! [`renewals`] holds what each coalescer owes, lease by lease; [`replies`] puts each client stream's answers back in
//! the order of its requests, and ends it at its first error.

pub mod coalescer;
mod confirm;
mod refusal;
pub mod renewals;
pub mod replies;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::{Semaphore, mpsc, watch};

use proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use tonic::{Request, Response, Status, Streaming};

use crate::error;
use crate::metrics::Metrics;
use crate::upstream::outbound::{OnDrop, Outbound};
use crate::upstream::{BoxStream, Forwarded, Upstream};
use renewals::{Renew, Waiter};
use replies::{Answer, Replies};

/// Requests one client stream may have unanswered (or answered but unread); beyond it the proxy stops reading
/// that stream's requests, so a client that never reads cannot grow the proxy's memory.
const MAX_UNANSWERED_PER_STREAM: usize = 1024;
/// Requests queued towards the coalescer from all client streams.
const RENEW_QUEUE: usize = 8192;

/// The proxy's keep-alive coalescing.
pub struct LeaseService {
    upstream: Arc<Upstream>,
    metrics: Metrics,
    /// The coalescer of callers without a token (all callers when etcd's auth is off): it runs as long as the
    /// service, so its upstream stream stays open while clients come and go.
    tokenless: mpsc::Sender<Renew>,
    /// The coalescer of each token, held weakly: it ends with the last client stream that sends to it (a token
    /// belongs to one client, and expires), and the next stream with the token starts another.
    by_token: Mutex<HashMap<String, mpsc::WeakSender<Renew>>>,
}

impl LeaseService {
    /// Creates the service and starts the coalescer of callers without a token.
    pub fn new(upstream: Arc<Upstream>, metrics: Metrics) -> Self {
        let tokenless = start_coalescer(&upstream, &metrics, None);
        Self {
            upstream,
            metrics,
            tokenless,
            by_token: Mutex::new(HashMap::new()),
        }
    }

    /// Where the renewals of a caller with `token` go: its token's coalescer, started if none runs.
    fn renewals(&self, token: Option<String>) -> mpsc::Sender<Renew> {
        let Some(token) = token else {
            return self.tokenless.clone();
        };
        let mut by_token = self
            .by_token
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(renewals) = by_token.get(&token).and_then(mpsc::WeakSender::upgrade) {
            return renewals;
        }
        by_token.retain(|_, renewals| renewals.strong_count() > 0);
        let renewals = start_coalescer(&self.upstream, &self.metrics, Some(token.clone()));
        by_token.insert(token, renewals.downgrade());
        renewals
    }
}

/// Starts a coalescer for the callers with `token`; it runs until every sender it returns is gone.
fn start_coalescer(
    upstream: &Arc<Upstream>,
    metrics: &Metrics,
    token: Option<String>,
) -> mpsc::Sender<Renew> {
    let (renewals, requests) = mpsc::channel(RENEW_QUEUE);
    tokio::spawn(coalescer::run(
        upstream.clone(),
        metrics.clone(),
        requests,
        token,
    ));
    renewals
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
    let replies = Replies::new(answers);
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
            // None once an error ends the stream: etcd reads no more of a stream it has ended.
            let Some(reply) = replies.ticket() else {
                return;
            };
            let waiter = Waiter {
                reply,
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
        // Half-close: `replies` is dropped here, so the stream ends once every pending request is answered.
    });
    metrics.lease_client_streams.inc();
    let outbound = Outbound {
        items: answers_rx,
        abort: abort_rx,
        finish: None,
        shutdown,
    };
    let gauge = OnDrop(move || metrics.lease_client_streams.dec());
    outbound.into_stream(|(answer, _permit): Answer| answer, gauge)
}

impl LeaseService {
    /// Renews `lease_id` once as the caller with `token`, for a lease of the proxy's own (its registration, renewed
    /// with the proxy's token when it has an identity).
    pub async fn renew(
        &self,
        lease_id: i64,
        token: Option<String>,
    ) -> Result<LeaseKeepAliveResponse, Status> {
        let (answers, mut answer) = mpsc::channel::<Answer>(1);
        let permit = Arc::new(Semaphore::new(1))
            .acquire_owned()
            .await
            .expect("a new semaphore is open");
        let reply = Replies::new(answers)
            .ticket()
            .expect("a new stream has not ended");
        let waiter = Waiter {
            reply,
            permit,
            requires_leader: false,
        };
        let shutting_down = || Status::unavailable("etcd-grpc-proxy: shutting down");
        self.renewals(token)
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
            self.renewals(forwarded.token()),
            self.metrics.clone(),
            self.upstream.shutdown_signal(),
        )))
    }
}
