//! Calls to etcd with the retry policy: reads are retried on the next endpoint within a deadline when the endpoint
//! fails; writes only when they provably never left the proxy. Server streams (Snapshot, Observe, RangeStream) are
//! opened like reads; once they run, an upstream failure ends the client's stream with Unavailable. (Watch and
//! LeaseKeepAlive have their own upstream streams: see `watch` and `lease`.)
//!
//! Every call is made with the messages as bytes ([`RawCodec`]): what etcd sends reaches the client as etcd sent
//! it. The proxy's own questions to etcd ([`Upstream::call`]) take the same path, encoded and decoded around it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::uri::PathAndQuery;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

use super::codec::RawCodec;
use super::ordering;
use super::{Active, DEFAULT_RETRY_WINDOW, Forwarded, NO_LEADER, Upstream};
use crate::error::{self, OUTCOME_UNKNOWN};

/// The least a read waits for its endpoint before it is sent to another one as well, however fast reads usually
/// are: below this, ordinary scheduling delays would double the reads etcd serves.
pub const HEDGE_DELAY_MIN: Duration = Duration::from_millis(50);

/// The most a read waits for its endpoint before it is sent to another one as well, however slow reads usually
/// are: a read that etcd takes longer to serve costs a second member that read.
pub const HEDGE_DELAY_MAX: Duration = Duration::from_millis(500);

/// Whether a call may be repeated on another endpoint after an endpoint failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Has no effect on etcd's state: repeat on any endpoint failure.
    ReadOnly,
    /// Changes etcd's state: repeat only when the request provably never reached etcd.
    Write,
}

/// The tracing of one attempt on etcd (nothing with tracing off).
#[derive(Default)]
pub(super) struct AttemptTrace {
    traceparent: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    span: Option<crate::otel::span::OpenSpan>,
}

impl AttemptTrace {
    /// The attempt's request: what the client's carried, its `traceparent` naming the attempt's span.
    pub(super) fn request(&self, forwarded: &Forwarded, message: Bytes) -> Request<Bytes> {
        let mut request = forwarded.request(message);
        if let Some(traceparent) = &self.traceparent {
            request
                .metadata_mut()
                .insert(crate::otel::TRACEPARENT, traceparent.clone());
        }
        request
    }

    /// Ends the attempt's span with the code etcd answered.
    pub(super) fn end(self, code: tonic::Code) {
        if let Some(span) = self.span {
            span.end(code);
        }
    }
}

/// A response stream as the proxy's services return it.
pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

impl Upstream {
    /// A unary call of the method at `path` (e.g. `/etcdserverpb.KV/Range`), its messages relayed as bytes.
    pub async fn unary(
        self: &Arc<Self>,
        retry: Retry,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let forwarded = Forwarded::capture(&request);
        let response = self
            .unary_captured(retry, &path, &forwarded, request.into_inner())
            .await?;
        Ok(Response::new(response))
    }

    /// [`Upstream::unary`] of a client request whose forwarded parts the caller has captured already (the range
    /// cache, which reads them first): each call captures them once, however many attempts it makes.
    pub async fn unary_captured(
        self: &Arc<Self>,
        retry: Retry,
        path: &PathAndQuery,
        forwarded: &Forwarded,
        message: Bytes,
    ) -> Result<Bytes, Status> {
        let at_arrival = self
            .revision_floor
            .as_ref()
            .map_or(0, |floor| floor.highest());
        let response = self
            .unary_unordered(retry, path, forwarded, message.clone())
            .await?;
        if let Some(floor) = &self.revision_floor
            && floor.judge(path.path(), &message, &response, at_arrival) == ordering::Verdict::Reask
        {
            // A lagging member's answer (or one the floor could not judge yet): etcd's linearizable read is at least
            // as new as any it returned, and teaches the floor a committed revision.
            self.metrics.serializable_reads_reasked.inc();
            let linearizable = ordering::linearizable(&message);
            let response = self
                .unary_unordered(retry, path, forwarded, linearizable.clone())
                .await?;
            floor.judge(path.path(), &linearizable, &response, at_arrival);
            return Ok(response);
        }
        Ok(response)
    }

    /// A unary call with no revision ordering: its answer goes to no client as it is.
    async fn unary_unordered(
        self: &Arc<Self>,
        retry: Retry,
        path: &PathAndQuery,
        forwarded: &Forwarded,
        message: Bytes,
    ) -> Result<Bytes, Status> {
        let call = |mut grpc: tonic::client::Grpc<Channel>, request| {
            let path = path.clone();
            async move { grpc.unary(request, path, RawCodec).await }
        };
        let (_, response) = self
            .with_retries(retry, path, forwarded, message, call)
            .await?;
        Ok(response)
    }

    /// A call with one request and a stream of responses (Snapshot, Observe, RangeStream). Opening it is retried
    /// like a read.
    pub async fn server_stream(
        self: &Arc<Self>,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<BoxStream<Bytes>>, Status> {
        let forwarded = Forwarded::capture(&request);
        let open = |mut grpc: tonic::client::Grpc<Channel>, request| {
            let path = path.clone();
            async move { grpc.server_streaming(request, path, RawCodec).await }
        };
        let (pick, response) = self
            .with_retries(
                Retry::ReadOnly,
                &path,
                &forwarded,
                request.into_inner(),
                open,
            )
            .await?;
        Ok(Response::new(self.relay(pick, response)))
    }

    /// The proxy's own unary call (a permission check, a Status): the same path as a client's, with the messages
    /// encoded and decoded around it, and without the revision ordering of client reads: its answer reaches no
    /// client as it is, so a lagging member's answer to it is not asked again (and not counted as a client read
    /// asked again). It ends after [`super::OWN_CALL_DEADLINE`] if etcd has not answered.
    pub async fn call<Req, Resp>(
        self: &Arc<Self>,
        retry: Retry,
        path: &'static str,
        request: Request<Req>,
    ) -> Result<Response<Resp>, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let forwarded = Forwarded::capture(&request);
        let message = Bytes::from(request.into_inner().encode_to_vec());
        let path_and_query = PathAndQuery::from_static(path);
        let answer = self.unary_unordered(retry, &path_and_query, &forwarded, message);
        let bytes = tokio::time::timeout(super::OWN_CALL_DEADLINE, answer)
            .await
            .map_err(|_| {
                Status::unavailable(format!(
                    "etcd-grpc-proxy: etcd did not answer the proxy's {path} within {:?}",
                    super::OWN_CALL_DEADLINE
                ))
            })??;
        let message = Resp::decode(bytes).map_err(|err| {
            Status::internal(format!(
                "etcd-grpc-proxy: cannot read etcd's answer to {path}: {err}"
            ))
        })?;
        Ok(Response::new(message))
    }

    /// A gRPC client on `channel` with the proxy's receive limit (what it accepts from etcd); the send limit is
    /// checked before any attempt, so that an oversized request is refused with etcd's error.
    pub(super) async fn client(
        &self,
        channel: Channel,
    ) -> Result<tonic::client::Grpc<Channel>, Status> {
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(self.max_recv_bytes)
            .max_encoding_message_size(usize::MAX);
        grpc.ready()
            .await
            .map_err(|err| Status::unknown(format!("Service was not ready: {err}")))?;
        Ok(grpc)
    }

    /// With tracing on, the client span of one attempt of `path` on etcd, a child of the call's server span (whose
    /// context the forwarded `traceparent` carries), and the `traceparent` naming it for the attempt's request.
    pub(super) fn attempt_trace(&self, path: &PathAndQuery, forwarded: &Forwarded) -> AttemptTrace {
        let (Some(tracer), Some(parent)) = (&self.tracer, forwarded.trace_parent()) else {
            return AttemptTrace::default();
        };
        let (traceparent, span) = tracer.client_span(path.path(), parent);
        AttemptTrace {
            traceparent: traceparent.parse().ok(),
            span,
        }
    }

    pub(super) fn check_send(&self, message: &Bytes) -> Result<(), Status> {
        if message.len() > self.max_send_bytes {
            return Err(error::sending_too_large(message.len(), self.max_send_bytes));
        }
        Ok(())
    }

    /// Handles one failed attempt: returns the status for the client if the call must not be repeated.
    async fn after_failure(
        self: &Arc<Self>,
        pick: &Active,
        status: Status,
        retry: Retry,
        deadline: Instant,
        attempt: usize,
    ) -> Result<(), Status> {
        if !error::is_endpoint_failure(&status) {
            return Err(error::to_client(status));
        }
        self.report_failure(pick);
        let repeatable = retry == Retry::ReadOnly || error::never_sent(&status);
        if !repeatable || Instant::now() >= deadline {
            return Err(error::to_client(status));
        }
        // After a full pass over the endpoints, pause before the next pass instead of spinning.
        if attempt.is_multiple_of(self.len()) {
            let pause =
                std::time::Duration::from_millis(50 * (attempt / self.len()).min(10) as u64);
            tokio::time::sleep_until((Instant::now() + pause).min(deadline)).await;
        }
        tracing::debug!(%status, attempt, "retrying on another etcd endpoint");
        Ok(())
    }

    /// Makes a call on the active endpoint, repeating it on the next one after an endpoint failure when `retry`
    /// allows, until the client's deadline (or [`DEFAULT_RETRY_WINDOW`]). Returns the endpoint that answered.
    async fn with_retries<Resp, F, Fut>(
        self: &Arc<Self>,
        retry: Retry,
        path: &PathAndQuery,
        forwarded: &Forwarded,
        message: Bytes,
        call: F,
    ) -> Result<(Active, Resp), Status>
    where
        F: Fn(tonic::client::Grpc<Channel>, Request<Bytes>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        self.check_send(&message)?;
        let deadline = forwarded
            .deadline
            .unwrap_or_else(|| Instant::now() + DEFAULT_RETRY_WINDOW);
        let attempt_on = |pick: Active| self.attempt(pick, path, forwarded, &message, &call);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pick = self.serving().await;
            let (pick, answer) = match retry {
                Retry::ReadOnly => self.hedged(pick, attempt_on).await,
                Retry::Write => self.unless_abandoned(pick, attempt_on).await,
            };
            match answer {
                Ok(response) => return Ok((pick, response.into_inner())),
                Err(status) if forwarded.requires_leader() && status.message() == NO_LEADER => {
                    return self
                        .ask_others_for_leader(&pick, retry, &attempt_on, status)
                        .await;
                }
                Err(status) => {
                    self.after_failure(&pick, status, retry, deadline, attempt)
                        .await?
                }
            }
        }
    }

    /// One attempt of a call on `pick`'s endpoint.
    async fn attempt<Resp, F, Fut>(
        &self,
        pick: Active,
        path: &PathAndQuery,
        forwarded: &Forwarded,
        message: &Bytes,
        call: &F,
    ) -> (Active, Result<Response<Resp>, Status>)
    where
        F: Fn(tonic::client::Grpc<Channel>, Request<Bytes>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let trace = self.attempt_trace(path, forwarded);
        let answer = match self.client(pick.channel.clone()).await {
            // Built once the channel is ready, so that the deadline sent is what is left of the client's.
            Ok(grpc) => call(grpc, trace.request(forwarded, message.clone())).await,
            Err(status) => Err(status),
        };
        // A stream's attempt ends when etcd answers its opening (the relay of its messages is the server span's).
        trace.end(
            answer
                .as_ref()
                .map_or_else(Status::code, |_| tonic::Code::Ok),
        );
        (pick, answer)
    }

    /// An attempt on the active endpoint `pick` that ends, if the proxy leaves that endpoint while it waits (the
    /// endpoint failed or hung), with etcd's "outcome unknown" answer: the request may have reached etcd, so it is
    /// not repeated, and waiting on until the client's deadline would tell the client nothing more.
    async fn unless_abandoned<Resp, A, Fut>(
        &self,
        pick: Active,
        attempt_on: A,
    ) -> (Active, Result<Response<Resp>, Status>)
    where
        A: Fn(Active) -> Fut,
        Fut: Future<Output = (Active, Result<Response<Resp>, Status>)>,
    {
        tokio::select! {
            biased;
            answered = attempt_on(pick.clone()) => answered,
            () = self.abandoned(&pick) => (pick, Err(Status::unavailable(OUTCOME_UNKNOWN))),
        }
    }

    /// A read on the active endpoint `pick`, sent to another endpoint as well if it is not answered within the
    /// usual answer time (learnt from earlier reads): a hung member costs a read that delay, not the client's
    /// deadline. The first answer wins; the other attempt is dropped, which cancels it (see [`first_answer`] for
    /// a failure).
    async fn hedged<Resp, A, Fut>(
        &self,
        pick: Active,
        attempt_on: A,
    ) -> (Active, Result<Response<Resp>, Status>)
    where
        A: Fn(Active) -> Fut,
        Fut: Future<Output = (Active, Result<Response<Resp>, Status>)>,
    {
        let started = Instant::now();
        let delay = self.read_latency.bound(HEDGE_DELAY_MIN, HEDGE_DELAY_MAX);
        let first = self.unless_abandoned(pick.clone(), &attempt_on);
        tokio::pin!(first);
        let waited = tokio::select! {
            biased;
            answered = &mut first => Some(answered),
            () = tokio::time::sleep(delay) => None,
        };
        let answered = match waited {
            Some(answered) => answered,
            None => match self.random_up_other(pick.index) {
                None => first.await,
                Some(other) => {
                    tracing::debug!(
                        ?delay,
                        "read not answered in its usual time; asking another endpoint too"
                    );
                    let second = attempt_on(self.member(other));
                    tokio::pin!(second);
                    first_answer(first, second).await
                }
            },
        };
        if answered.1.is_ok() {
            self.read_latency.observe(started.elapsed());
        }
        answered
    }

    /// A call that requires a leader was refused by `refused`'s member because it has none. etcd refused it before
    /// doing anything, so it may go to another member even if it writes. Each other endpoint is asked once, since
    /// another member may have a leader (the refusing one may be cut off from the majority); one that serves it
    /// becomes the active endpoint. When none can serve, the client gets etcd's "no leader" answer, as it would
    /// from its member directly, and at once rather than after the whole retry window. A "no leader" answer marks
    /// no endpoint down: during an election every member gives it.
    async fn ask_others_for_leader<Resp, A, Fut>(
        self: &Arc<Self>,
        refused: &Active,
        retry: Retry,
        attempt_on: A,
        no_leader: Status,
    ) -> Result<(Active, Resp), Status>
    where
        A: Fn(Active) -> Fut,
        Fut: Future<Output = (Active, Result<Response<Resp>, Status>)>,
    {
        for index in self.others(refused.index) {
            let (pick, answer) = attempt_on(self.member(index)).await;
            match answer {
                Ok(response) => {
                    self.seek_leader(refused);
                    return Ok((pick, response.into_inner()));
                }
                Err(status) if status.message() == NO_LEADER => {}
                Err(status) if error::is_endpoint_failure(&status) => {
                    self.report_failure(&pick);
                    if retry == Retry::Write && !error::never_sent(&status) {
                        // The write may have been applied: its outcome is unknown, as etcd's client reports it.
                        return Err(error::to_client(status));
                    }
                }
                Err(status) => return Err(error::to_client(status)),
            }
        }
        Err(error::to_client(no_leader))
    }

    /// Relays an upstream response stream to the client. An endpoint failure ends it with Unavailable (so the
    /// client re-establishes the stream, now on another endpoint) and triggers failover. The stream also ends,
    /// with Unavailable, when the proxy shuts down.
    fn relay<Resp: Send + 'static>(
        self: &Arc<Self>,
        pick: Active,
        upstream: Streaming<Resp>,
    ) -> BoxStream<Resp> {
        let state = Relay {
            upstream: self.clone(),
            pick,
            stream: upstream,
            shutdown: self.shutdown.clone(),
            done: false,
        };
        Box::pin(futures::stream::unfold(state, |mut relay| async move {
            let item = relay.next().await?;
            Some((item, relay))
        }))
    }
}

struct Relay<Resp> {
    upstream: Arc<Upstream>,
    pick: Active,
    stream: Streaming<Resp>,
    shutdown: watch::Receiver<bool>,
    done: bool,
}

impl<Resp> Relay<Resp> {
    async fn next(&mut self) -> Option<Result<Resp, Status>> {
        if self.done {
            return None;
        }
        let item = tokio::select! {
            biased;
            _ = super::shutting_down(&mut self.shutdown) => Some(Err(Status::unavailable("etcd-grpc-proxy: shutting down"))),
            item = self.stream.next() => match item {
                Some(Err(status)) if error::is_endpoint_failure(&status) => {
                    self.upstream.report_failure(&self.pick);
                    Some(Err(Status::unavailable(format!(
                        "etcd-grpc-proxy: upstream stream failed: {}",
                        status.message()
                    ))))
                }
                Some(Err(status)) => Some(Err(error::to_client(status))),
                other => other,
            },
        };
        self.done = !matches!(item, Some(Ok(_)));
        item
    }
}

/// The first answer of two attempts, even when it is its endpoint's failure (or the proxy left that endpoint): the
/// retry loop then sends the read again, to the endpoint active now. Waiting on for the other attempt instead could
/// wait on a member gone silent behind a dead connection, until the client's deadline.
async fn first_answer<Resp, A, B>(
    first: Pin<&mut A>,
    second: Pin<&mut B>,
) -> (Active, Result<Response<Resp>, Status>)
where
    A: Future<Output = (Active, Result<Response<Resp>, Status>)>,
    B: Future<Output = (Active, Result<Response<Resp>, Status>)>,
{
    let (mut first, mut second) = (first, second);
    tokio::select! {
        biased;
        answer = &mut first => answer,
        answer = &mut second => answer,
    }
}
