//! The keep-alive coalescer: one upstream LeaseKeepAlive stream carries the renewals of every client stream with one
//! token (the caller's, sent upstream with each stream it opens; see [`super`] for why one per token).
//!
//! Rules (each is what a client connected directly to etcd would observe):
//! - A client request is answered with the TTL of a renewal that etcd performed *after* the request arrived: each
//!   request joins the next renewal of its lease that has not been sent yet, never one already in flight.
//! - Requests for one lease that arrive while the coalescer is busy share one renewal: the coalescer drains every
//!   request waiting in its queue before it sends, so sharing costs no added latency.
//! - Nothing is renewed unless a client asked: a lease whose clients stop expires within its TTL, as on etcd.
//! - etcd answers the requests of one stream in order, so the answers for a lease match its renewals first-in,
//!   first-out.
//! - Each client stream reads its answers in the order of its requests, whatever their leases, as from etcd; once
//!   an error ends a client stream, nothing more of it is read or renewed ([`super::replies`]).
//! - When the upstream stream fails, it is re-opened (on the next endpoint, after failover: [`supervisor`]) and every
//!   renewal not yet answered is settled there: answered from etcd's LeaseTimeToLive if etcd performed it, sent
//!   again if not ([`super::confirm`]); clients see only a later answer, never an error, while an endpoint is up. A
//!   request whose client stream has ended meanwhile is dropped, not sent: it would renew a lease nobody keeps.
//! - When etcd refuses a renewal (a lease whose keys the token may not write), only the client streams of the leases
//!   it refuses end with its error ([`super::refusal`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status, Streaming};

use crate::metrics::Metrics;
use crate::otel::span::OpenSpan;
use crate::upstream::supervisor::{
    self, CHECK_EVERY, Ended, LOOKUP_TIMEOUT, RENEWAL_TIMEOUT, Ready, Supervised,
};
use crate::upstream::{Active, Upstream};

use super::renewals::{
    LeaseRenewals, Renew, deliver, fail_all, fail_leader_requirers, forget_departed,
    oldest_in_flight, queue, send_queued, unsettle_unanswered,
};
use super::{confirm, refusal};

/// Requests taken from the queue in one go (bounds the work between two looks at the upstream stream).
const DRAIN_BATCH: usize = 4096;

/// Runs the coalescer of the callers with `token` until every sender of `requests` is gone.
pub async fn run(
    upstream: Arc<Upstream>,
    metrics: Metrics,
    requests: mpsc::Receiver<Renew>,
    token: Option<String>,
) {
    let mut coalescer = Coalescer {
        upstream: upstream.clone(),
        metrics,
        requests,
        token: token.and_then(|token| token.parse::<MetadataValue<Ascii>>().ok()),
        leases: BTreeMap::new(),
    };
    supervisor::supervise(&upstream, &mut coalescer).await;
}

/// One coalescer: its callers' requests, as whom it renews, and what it owes, lease by lease.
struct Coalescer {
    upstream: Arc<Upstream>,
    metrics: Metrics,
    requests: mpsc::Receiver<Renew>,
    token: Option<MetadataValue<Ascii>>,
    leases: BTreeMap<i64, LeaseRenewals>,
}

impl Supervised for Coalescer {
    const KIND: &'static str = "keep-alive";

    async fn ready(&mut self) -> Ready {
        unsettle_unanswered(&mut self.leases);
        forget_departed(&mut self.leases);
        // Open the upstream stream only when there is something to renew.
        if self.leases.is_empty() {
            let Some(first) = self.requests.recv().await else {
                return Ready::Finish;
            };
            queue(&mut self.leases, first);
        }
        Ready::Serve
    }

    async fn serve(&mut self, pick: &Active, span: &mut Option<OpenSpan>) -> Ended {
        let (upstream, token) = (&self.upstream, self.token.as_ref());
        let confirming = confirm::confirm_all(&mut self.leases, LOOKUP_TIMEOUT, |id| {
            look_up(upstream, pick, token, id)
        });
        tokio::select! {
            // A move abandons the lookups; what they were for is settled on the next endpoint.
            biased;
            () = upstream.abandoned(pick) => return Ended::Reopen,
            answered = confirming => self.metrics.lease_renewals_confirmed.inc_by(answered as u64),
        }
        let stream = Stream {
            upstream: &self.upstream,
            metrics: &self.metrics,
            pick,
            token: self.token.as_ref(),
        };
        match stream
            .serve(&mut self.leases, &mut self.requests, span)
            .await
        {
            StreamEnd::ClientsGone => Ended::Finished,
            StreamEnd::Moved | StreamEnd::Healthy => Ended::Reopen,
            StreamEnd::Failed(status) => Ended::Failed(status),
        }
    }

    fn leader_lost(&mut self, status: &Status) {
        fail_leader_requirers(&mut self.leases, status);
    }

    async fn refused(&mut self, pick: &Active, status: &Status) {
        if refusal::refuses_one_renewal(status) {
            // Perhaps of one client's renewal only: only the leases etcd refuses fail.
            let (upstream, metrics, token) = (&self.upstream, &self.metrics, self.token.as_ref());
            let renew_alone = |id| {
                metrics.lease_renewals_forwarded.inc();
                renew_alone(upstream, pick, token, id)
            };
            refusal::settle(&mut self.leases, status, renew_alone).await;
        } else {
            // etcd's refusal of the caller ending the stream (an invalid token, say): every unanswered request
            // gets it, as it would on a direct stream.
            fail_all(&mut self.leases, status);
        }
    }

    /// What a lost stream owes is sent again on the next (see `ready`).
    fn lost(&mut self) {}
}

enum StreamEnd {
    /// Every client stream is gone and nothing is pending.
    ClientsGone,
    /// The stream failed with this status.
    Failed(Status),
    /// The stream served answers before it ended cleanly.
    Healthy,
    /// Another endpoint became active (a call elsewhere failed over): move the stream there.
    Moved,
}

/// One upstream stream: where it goes and as whom.
struct Stream<'a> {
    upstream: &'a Arc<Upstream>,
    metrics: &'a Metrics,
    pick: &'a Active,
    token: Option<&'a MetadataValue<Ascii>>,
}

impl Stream<'_> {
    /// Serves one upstream stream until it ends; with tracing on, `own_span` gets the stream's span (the stream is
    /// the proxy's, shared by clients: see [`crate::otel::own_stream`]).
    async fn serve(
        &self,
        leases: &mut BTreeMap<i64, LeaseRenewals>,
        requests: &mut mpsc::Receiver<Renew>,
        own_span: &mut Option<crate::otel::span::OpenSpan>,
    ) -> StreamEnd {
        let Stream {
            upstream,
            metrics,
            pick,
            token,
        } = *self;
        let (tx, rx) = mpsc::unbounded_channel();
        let mut request = keep_alive_request(UnboundedReceiverStream::new(rx), token);
        *own_span = crate::otel::own_stream(
            upstream.tracer(),
            "/etcdserverpb.Lease/LeaseKeepAlive",
            request.metadata_mut(),
        );
        let mut client = LeaseClient::new(pick.channel.clone())
            .max_decoding_message_size(upstream.max_recv_bytes);
        send_queued(leases, &tx, metrics, Instant::now());
        let opening = client.lease_keep_alive(request);
        tokio::pin!(opening);
        let mut answers: Option<Streaming<LeaseKeepAliveResponse>> = None;
        let mut answered_any = false;
        metrics.lease_upstream_streams.inc();
        let _gauge = scopeguard(|| metrics.lease_upstream_streams.dec());
        let mut requests_open = true;
        let mut check = tokio::time::interval(CHECK_EVERY);
        let moved = upstream.abandoned(pick);
        tokio::pin!(moved);
        loop {
            tokio::select! {
                // A fixed order keeps a seeded run reproducible (tokio draws select!'s order from an unseeded RNG).
                // Nothing starves: the check is ready twice a second, a move once, and answers come only for
                // renewals sent.
                biased;
                () = &mut moved => return StreamEnd::Moved,
                _ = check.tick() => {
                    if oldest_in_flight(leases).is_some_and(|sent| sent.elapsed() > RENEWAL_TIMEOUT) {
                        return StreamEnd::Failed(Status::unavailable("etcd did not answer a lease renewal in time"));
                    }
                }
                opened = &mut opening, if answers.is_none() => match opened {
                    Ok(response) => answers = Some(response.into_inner()),
                    Err(status) => return StreamEnd::Failed(status),
                },
                next = async { answers.as_mut().expect("guarded by is_some").next().await }, if answers.is_some() => {
                    match next {
                        Some(Ok(answer)) => {
                            answered_any = true;
                            deliver(leases, answer);
                        }
                        Some(Err(status)) => return StreamEnd::Failed(status),
                        None if answered_any => return StreamEnd::Healthy,
                        None => return StreamEnd::Failed(Status::unavailable("upstream keep-alive stream ended")),
                    }
                }
                renew = requests.recv(), if requests_open => match renew {
                    Some(renew) => {
                        queue(leases, renew);
                        for _ in 1..DRAIN_BATCH {
                            match requests.try_recv() {
                                Ok(renew) => queue(leases, renew),
                                Err(_) => break,
                            }
                        }
                        send_queued(leases, &tx, metrics, Instant::now());
                    }
                    None => requests_open = false,
                },
            }
            if !requests_open && leases.values().all(LeaseRenewals::is_idle) {
                return StreamEnd::ClientsGone;
            }
        }
    }
}

/// An upstream keep-alive stream of `requests` as the caller with `token`.
fn keep_alive_request<S>(requests: S, token: Option<&MetadataValue<Ascii>>) -> Request<S> {
    let mut request = Request::new(requests);
    // Ask etcd to end the stream when it loses its leader, so that the proxy fails over instead of waiting.
    request
        .metadata_mut()
        .insert("hasleader", MetadataValue::from_static("true"));
    if let Some(token) = token {
        request.metadata_mut().insert("token", token.clone());
    }
    request
}

/// Renews lease `id` once on a stream of its own to the `pick` endpoint, as the caller with `token`.
async fn renew_alone(
    upstream: &Upstream,
    pick: &Active,
    token: Option<&MetadataValue<Ascii>>,
    id: i64,
) -> Result<LeaseKeepAliveResponse, Status> {
    // Kept open until the answer is read: a half-close could end the stream before etcd answers.
    let requests =
        futures::stream::iter([LeaseKeepAliveRequest { id }]).chain(futures::stream::pending());
    let renewal = async {
        LeaseClient::new(pick.channel.clone())
            .max_decoding_message_size(upstream.max_recv_bytes)
            .lease_keep_alive(keep_alive_request(requests, token))
            .await?
            .into_inner()
            .message()
            .await?
            .ok_or_else(|| Status::unavailable("upstream keep-alive stream ended"))
    };
    tokio::time::timeout(RENEWAL_TIMEOUT, renewal)
        .await
        .unwrap_or_else(|_| {
            Err(Status::unavailable(
                "etcd did not answer a lease renewal in time",
            ))
        })
}

/// LeaseTimeToLive of lease `id` at the `pick` endpoint, as the caller with `token`.
async fn look_up(
    upstream: &Upstream,
    pick: &Active,
    token: Option<&MetadataValue<Ascii>>,
    id: i64,
) -> Result<LeaseTimeToLiveResponse, Status> {
    let mut request = Request::new(LeaseTimeToLiveRequest { id, keys: false });
    if let Some(token) = token {
        request.metadata_mut().insert("token", token.clone());
    }
    let mut client =
        LeaseClient::new(pick.channel.clone()).max_decoding_message_size(upstream.max_recv_bytes);
    match tokio::time::timeout(LOOKUP_TIMEOUT, client.lease_time_to_live(request)).await {
        Ok(answer) => answer.map(tonic::Response::into_inner),
        Err(_) => Err(Status::unavailable(
            "etcd did not answer LeaseTimeToLive in time",
        )),
    }
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
#[path = "coalescer_fuzz.rs"]
mod fuzz;
