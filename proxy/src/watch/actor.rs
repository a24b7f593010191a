//! Runs one [`Hub`] against etcd: owns its upstream Watch stream, feeds it client commands and etcd's responses,
//! and checks that etcd still answers (a progress request after a quiet period) so that a hung member is noticed.
//! The stream is opened, re-opened after it ends, and moved with a failover by [`supervisor`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status, Streaming};

use super::hub::{Hub, StreamId, StreamSink};
use crate::error;
use crate::otel::span::OpenSpan;
use crate::upstream::identity::Identity;
use crate::upstream::supervisor::{
    self, CHECK_EVERY, Ended, Ready, Supervised, WATCH_ANSWER_TIMEOUT, WATCH_PROBE_AFTER_SILENCE,
};
use crate::upstream::{Active, Upstream};

/// What client streams ask of their hub.
pub enum Command {
    Open {
        stream: StreamId,
        sink: StreamSink,
    },
    Create {
        stream: StreamId,
        request: WatchCreateRequest,
    },
    Cancel {
        stream: StreamId,
        watch_id: i64,
    },
    Progress {
        stream: StreamId,
    },
    /// A create refused before it reached the hub (see `admission`), answered in its turn.
    Refuse {
        stream: StreamId,
        reason: String,
        watch_id: i64,
    },
    Close {
        stream: StreamId,
    },
    /// A client's request, holding one of its stream's queue places until the hub has applied it.
    Queued {
        command: Box<Command>,
        place: OwnedSemaphorePermit,
    },
}

/// Hubs by caller identity (the `token` metadata): upstream streams are never shared between callers with
/// different tokens, since etcd checks a watch's permissions with the token of the stream that created it. With
/// the proxy's own identity every caller shares the hub under `None`.
pub type Registry = Arc<Mutex<BTreeMap<Option<String>, mpsc::UnboundedSender<Command>>>>;

/// How many ticks of [`CHECK_EVERY`] must find a progress request for clients unanswered before it is
/// sent again (see [`Hub::resend_progress`]): one, so within half a second. etcd syncs a new watcher within 100 ms,
/// so the second request is answered, well within the wait of a linearizable read from the range cache (1 s); a
/// request answered after all only costs etcd a second answer.
const PROGRESS_RESEND_TICKS: u32 = 1;
/// How long after sending a progress request etcd may have dropped for a watcher not yet synced (see
/// [`Hub::progress_maybe_dropped`]) the actor sends it again: etcd's resync period, and a little for its sync to run.
const RESYNC_RESEND_AFTER: Duration =
    super::hub::ETCD_RESYNC_PERIOD.saturating_add(Duration::from_millis(20));
/// How long the actor waits for a member to say its version before opening a stream without knowing it.
const VERSION_WAIT: Duration = Duration::from_secs(1);
/// Commands applied before the actor looks at etcd's responses again.
const DRAIN_BATCH: usize = 1024;

/// Whose token the hub's upstream stream carries.
pub enum UpstreamAuth {
    /// The token every client stream of the hub carries (or none).
    Caller(Option<String>),
    /// The proxy's own (`--user`); callers were admitted with their own tokens.
    Proxy(Arc<Identity>),
}

/// Everything one hub's actor needs.
pub struct Actor {
    pub hub: Hub,
    pub upstream: Arc<Upstream>,
    pub auth: UpstreamAuth,
    /// The hub's key in the registry.
    pub key: Option<String>,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub registry: Registry,
    /// The token the next upstream stream carries (see [`Actor::stream_token`]).
    pub token: Option<String>,
}

enum StreamEnd {
    /// Nothing left to watch: the stream was closed on purpose.
    Idle,
    /// Another endpoint became active: move there.
    Moved,
    /// The stream failed.
    Failed(Status),
    /// etcd refused a create for the token the stream carries: re-open it with a fresh one.
    TokenRefused,
    /// Every client stream and the registry entry are gone.
    Finished,
}

impl Actor {
    /// Runs until the hub has no client stream left (it then removes itself from the registry).
    pub async fn run(mut self) {
        let upstream = self.upstream.clone();
        supervisor::supervise(&upstream, &mut self).await;
    }

    /// Learns the etcd version of the member a stream opens on (`pick`), each time one opens, so that the hub
    /// answers as that member does: the members of a cluster run one version except during an upgrade, when a
    /// stream that moves from an upgraded member to one not yet upgraded meets the older rules (a progress answer
    /// before 3.5.8 does not mean that the stream's watchers are synced). A member slow to say keeps what the hub
    /// knew, rather than holding the stream up: it is asked again at the next stream.
    async fn learn_version(&mut self, pick: &Active, token: Option<&str>) {
        match tokio::time::timeout(VERSION_WAIT, self.upstream.version_on(pick, token)).await {
            Ok(Ok(version)) => self.hub.set_etcd_version(Some(&version)),
            Ok(Err(refused)) if error::is_auth_refusal(&refused) => self.hub.set_etcd_version(None),
            Ok(Err(_)) | Err(_) => {}
        }
    }

    /// The token to open the upstream stream with. When etcd refuses the proxy's credentials, every watcher is
    /// ended with etcd's reason (nothing can be watched for them) before the error is returned.
    async fn stream_token(&mut self) -> Result<Option<String>, Status> {
        let identity = match &self.auth {
            UpstreamAuth::Caller(token) => return Ok(token.clone()),
            UpstreamAuth::Proxy(identity) => identity.clone(),
        };
        let token = identity.token(&self.upstream).await;
        if let Err(status) = &token
            && !error::is_endpoint_failure(status)
        {
            self.hub.end_all(&format!(
                "etcd-grpc-proxy: etcd refused the proxy's --user credentials: {}",
                status.message()
            ));
        }
        token
    }

    /// Applies commands until the hub needs an upstream stream. Returns false when the actor should end.
    async fn wait_for_work(&mut self) -> bool {
        while !self.hub.needs_upstream() {
            if self.hub.has_no_streams() && self.retire() {
                return false;
            }
            match self.commands.recv().await {
                Some(command) => self.apply(command),
                None => return false,
            }
        }
        true
    }

    /// Leaves the registry if no command is waiting; clients send `Open` under the registry's lock, so none is lost.
    fn retire(&mut self) -> bool {
        let mut registry = self
            .registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !self.commands.is_empty() {
            return false;
        }
        registry.remove(&self.key);
        self.commands.close();
        true
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Open { stream, sink } => self.hub.open_stream(stream, sink),
            Command::Create { stream, request } => self.hub.create(stream, request),
            Command::Cancel { stream, watch_id } => self.hub.cancel(stream, watch_id),
            Command::Progress { stream } => {
                tracing::trace!(key = ?self.key, ?stream, "client progress request");
                self.hub.request_progress(stream)
            }
            Command::Refuse {
                stream,
                reason,
                watch_id,
            } => self.hub.refuse(stream, &reason, watch_id),
            Command::Close { stream } => self.hub.close_stream(stream),
            Command::Queued { command, place } => {
                self.apply(*command);
                drop(place);
            }
        }
    }

    fn flush(&mut self, tx: &mpsc::UnboundedSender<WatchRequest>) {
        self.hub.flush_creates();
        for request in self.hub.outbox.drain(..) {
            tracing::trace!(key = ?self.key, ?request, "watch request upstream");
            // A closed stream loses these; `upstream_lost` re-creates everything from the hub's state.
            let _ = tx.send(request);
        }
    }

    /// Serves one upstream stream; with tracing on, `own_span` gets the stream's span (the stream is the proxy's,
    /// shared by clients: see [`crate::otel::own_stream`]).
    async fn serve_stream(
        &mut self,
        pick: &Active,
        token: Option<&str>,
        own_span: &mut Option<crate::otel::span::OpenSpan>,
    ) -> StreamEnd {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut request = Request::new(UnboundedReceiverStream::new(rx));
        *own_span = crate::otel::own_stream(
            self.upstream.tracer(),
            "/etcdserverpb.Watch/Watch",
            request.metadata_mut(),
        );
        // etcd ends a stream that requires a leader when it loses it, so the proxy notices and fails over.
        request
            .metadata_mut()
            .insert("hasleader", MetadataValue::from_static("true"));
        if let Some(token) = token.and_then(|t| MetadataValue::try_from(t).ok()) {
            request.metadata_mut().insert("token", token);
        }
        let mut client = WatchClient::new(pick.channel.clone())
            .max_decoding_message_size(self.upstream.max_recv_bytes);
        self.flush(&tx);
        let opening = client.watch(request);
        tokio::pin!(opening);
        let mut responses: Option<Streaming<WatchResponse>> = None;
        let mut check = tokio::time::interval(CHECK_EVERY);
        let mut last_heard = Instant::now();
        let mut probe_sent: Option<Instant> = None;
        // Ticks that found a progress request unanswered, in a row.
        let mut progress_unanswered: u32 = 0;
        // When to send again a progress request etcd may have dropped for a watcher not synced yet.
        let mut resync_resend: Option<Instant> = None;
        let mut creates = AnswerDeadline::default();
        // Client commands and upstream responses take turns when both are ready (see `next_woke`).
        let mut commands_first = true;
        let upstream = self.upstream.clone();
        let moved = upstream.abandoned(pick);
        tokio::pin!(moved);
        loop {
            if resync_resend.is_none() && self.hub.progress_maybe_dropped() {
                resync_resend = Some(Instant::now() + RESYNC_RESEND_AFTER);
            }
            tokio::select! {
                // A fixed order: tokio draws select!'s order from an unseeded RNG, which would make a seeded
                // simulation differ from run to run. The check is ready twice a second; it starves nothing.
                biased;
                _ = sleep_until_some(resync_resend), if resync_resend.is_some() => {
                    resync_resend = None;
                    if self.hub.progress_maybe_dropped() && self.hub.resend_progress(probe_sent.is_some()) {
                        self.flush(&tx);
                    }
                }
                () = &mut moved => return StreamEnd::Moved,
                _ = check.tick() => {
                    if creates.overdue(self.hub.create_progress(), Instant::now(), WATCH_ANSWER_TIMEOUT) {
                        return StreamEnd::Failed(Status::unavailable("etcd did not answer a watch create in time"));
                    }
                    progress_unanswered = if self.hub.progress_in_flight() { progress_unanswered + 1 } else { 0 };
                    if progress_unanswered >= PROGRESS_RESEND_TICKS {
                        progress_unanswered = 0;
                        if self.hub.resend_progress(probe_sent.is_some()) {
                            self.flush(&tx);
                        }
                    }
                    if let Some(sent) = probe_sent {
                        if sent.elapsed() > WATCH_ANSWER_TIMEOUT {
                            return StreamEnd::Failed(Status::unavailable("etcd did not answer a watch progress request in time"));
                        }
                    } else if last_heard.elapsed() > WATCH_PROBE_AFTER_SILENCE && self.hub.liveness_probe() {
                        probe_sent = Some(Instant::now());
                        self.flush(&tx);
                    }
                }
                opened = &mut opening, if responses.is_none() => match opened {
                    Ok(response) => responses = Some(response.into_inner()),
                    Err(status) => return StreamEnd::Failed(status),
                },
                woke = next_woke(&mut self.commands, responses.as_mut(), &mut commands_first) => match woke {
                    Woke::Response(Some(Ok(response))) => {
                        last_heard = Instant::now();
                        probe_sent = None;
                        tracing::trace!(key = ?self.key, ?response, "watch response from upstream");
                        self.hub.upstream_response(response);
                        if self.hub.take_token_refused() {
                            return StreamEnd::TokenRefused;
                        }
                        self.flush(&tx);
                        // etcd ended the last watcher (compaction): a stream without watchers is closed, as when
                        // clients cancel them, rather than kept open for probes etcd from 3.5.8 never answers.
                        if !self.hub.needs_upstream() {
                            return StreamEnd::Idle;
                        }
                    }
                    Woke::Response(Some(Err(status))) => return StreamEnd::Failed(status),
                    Woke::Response(None) => return StreamEnd::Failed(Status::unavailable("upstream watch stream ended")),
                    Woke::Command(None) => return StreamEnd::Finished,
                    Woke::Command(Some(command)) => {
                        self.apply(command);
                        for _ in 1..DRAIN_BATCH {
                            match self.commands.try_recv() {
                                Ok(command) => self.apply(command),
                                Err(_) => break,
                            }
                        }
                        self.flush(&tx);
                        if !self.hub.needs_upstream() {
                            return StreamEnd::Idle;
                        }
                    }
                },
            }
        }
    }
}

impl Supervised for Actor {
    const KIND: &'static str = "watch";

    async fn ready(&mut self) -> Ready {
        if !self.wait_for_work().await {
            return Ready::Finish;
        }
        match self.stream_token().await {
            Ok(token) => self.token = token,
            Err(status) => {
                tracing::debug!(%status, "no token for the upstream watch stream yet");
                return Ready::Retry;
            }
        }
        Ready::Serve
    }

    async fn serve(&mut self, pick: &Active, span: &mut Option<OpenSpan>) -> Ended {
        let token = self.token.clone();
        self.learn_version(pick, token.as_deref()).await;
        match self.serve_stream(pick, token.as_deref(), span).await {
            StreamEnd::Finished => Ended::Finished,
            StreamEnd::Idle | StreamEnd::Moved => Ended::Reopen,
            StreamEnd::TokenRefused => {
                tracing::info!(
                    "etcd refused the upstream watch stream's token; re-opening it with a new one"
                );
                if let UpstreamAuth::Proxy(identity) = &self.auth {
                    identity.forget(token.as_deref()).await;
                }
                Ended::Reopen
            }
            StreamEnd::Failed(status) => Ended::Failed(status),
        }
    }

    fn leader_lost(&mut self, status: &Status) {
        self.hub.fail_leader_requirers(status);
    }

    /// A watch stream's refusals reach its clients through the hub (a refused create, say) before it ends.
    async fn refused(&mut self, _pick: &Active, _status: &Status) {}

    fn lost(&mut self) {
        self.hub.upstream_lost();
    }
}

/// What woke the actor.
enum Woke {
    Command(Option<Command>),
    Response(Option<Result<WatchResponse, Status>>),
}

/// The next client command or upstream response, whichever is ready; when both are, they take turns, so that
/// neither a flood of client commands nor a steady stream of events starves the other, in the same order every run.
fn next_woke<'a>(
    commands: &'a mut mpsc::UnboundedReceiver<Command>,
    mut responses: Option<&'a mut Streaming<WatchResponse>>,
    commands_first: &'a mut bool,
) -> impl Future<Output = Woke> + 'a {
    std::future::poll_fn(move |cx| {
        let first = *commands_first;
        for commands_turn in [first, !first] {
            if commands_turn {
                if let Poll::Ready(command) = commands.poll_recv(cx) {
                    *commands_first = false;
                    return Poll::Ready(Woke::Command(command));
                }
            } else if let Some(responses) = responses.as_mut()
                && let Poll::Ready(next) = responses.poll_next_unpin(cx)
            {
                *commands_first = true;
                return Poll::Ready(Woke::Response(next));
            }
        }
        Poll::Pending
    })
}

/// Notices creates etcd leaves unanswered: fed, on every check, the count of creates answered so far (`None` when
/// none waits), it reports when that count has not moved for longer than the limit while creates wait.
#[derive(Default)]
struct AnswerDeadline {
    waiting: Option<(u64, Instant)>,
}

impl AnswerDeadline {
    fn overdue(&mut self, progress: Option<u64>, now: Instant, limit: Duration) -> bool {
        match (progress, self.waiting) {
            (None, _) => {
                self.waiting = None;
                false
            }
            (Some(answered), Some((seen, since))) if answered == seen => now - since > limit,
            (Some(answered), _) => {
                self.waiting = Some((answered, now));
                false
            }
        }
    }
}

/// Sleeps until `deadline` (used only with a deadline set).
async fn sleep_until_some(deadline: Option<Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_are_overdue_only_when_no_answer_came_for_longer_than_the_limit() {
        let limit = Duration::from_secs(5);
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut deadline = AnswerDeadline::default();
        assert!(!deadline.overdue(None, at(0), limit), "nothing waits");
        assert!(
            !deadline.overdue(Some(3), at(1), limit),
            "first sight starts the clock"
        );
        assert!(
            !deadline.overdue(Some(3), at(6), limit),
            "exactly the limit is not over it"
        );
        assert!(deadline.overdue(Some(3), at(7), limit), "no answer for 6 s");
        assert!(
            !deadline.overdue(Some(4), at(8), limit),
            "an answer restarts the clock"
        );
        assert!(!deadline.overdue(Some(4), at(12), limit));
        assert!(!deadline.overdue(None, at(20), limit), "all answered");
        assert!(
            !deadline.overdue(Some(4), at(21), limit),
            "a new wait starts a new clock"
        );
        assert!(deadline.overdue(Some(4), at(27), limit));
    }
}
