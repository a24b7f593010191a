//! Runs one [`Hub`] against etcd: owns its upstream Watch stream, feeds it client commands and etcd's responses,
//! re-opens the stream on the active endpoint when it fails or the proxy fails over, and checks that etcd still
//! answers (a progress request after a quiet period) so that a hung member is noticed.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status, Streaming};

use super::hub::{Hub, StreamId, StreamSink};
use crate::error;
use crate::upstream::Upstream;

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
    Close {
        stream: StreamId,
    },
}

/// Hubs by caller identity (the `token` metadata): upstream streams are never shared between callers with
/// different tokens, since etcd checks a watch's permissions with the token of the stream that created it.
pub type Registry = Arc<Mutex<BTreeMap<Option<String>, mpsc::UnboundedSender<Command>>>>;

/// How often the actor looks at the upstream stream's health.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// After this long without a message from etcd, ask it for progress...
const PROBE_AFTER_SILENCE: Duration = Duration::from_secs(5);
/// ...and if it does not answer within this, treat the endpoint as failed. The same bound applies to creates: a
/// member that keeps sending events but no longer hears the proxy would otherwise leave new watchers unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const REOPEN_BACKOFF_START: Duration = Duration::from_millis(50);
const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Commands applied before the actor looks at etcd's responses again.
const DRAIN_BATCH: usize = 1024;

/// Everything one hub's actor needs.
pub struct Actor {
    pub hub: Hub,
    pub upstream: Arc<Upstream>,
    pub token: Option<String>,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub registry: Registry,
}

enum StreamEnd {
    /// Nothing left to watch: the stream was closed on purpose.
    Idle,
    /// Another endpoint became active: move there.
    Moved,
    /// The stream failed.
    Failed(Status),
    /// Every client stream and the registry entry are gone.
    Finished,
}

impl Actor {
    /// Runs until the hub has no client stream left (it then removes itself from the registry).
    pub async fn run(mut self) {
        let mut backoff = REOPEN_BACKOFF_START;
        loop {
            if !self.wait_for_work().await {
                return;
            }
            let (index, channel) = self.upstream.active();
            match self.serve_stream(channel, index).await {
                StreamEnd::Finished => return,
                StreamEnd::Idle | StreamEnd::Moved => backoff = REOPEN_BACKOFF_START,
                StreamEnd::Failed(status) => {
                    if error::is_endpoint_failure(&status) {
                        self.upstream.report_failure(index);
                        if status.message() == crate::lease::coalescer::NO_LEADER {
                            self.hub.fail_leader_requirers(&status);
                        }
                    }
                    tracing::debug!(%status, "upstream watch stream ended; re-opening");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(REOPEN_BACKOFF_MAX);
                }
            }
            self.hub.upstream_lost();
        }
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
        registry.remove(&self.token);
        self.commands.close();
        true
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Open { stream, sink } => self.hub.open_stream(stream, sink),
            Command::Create { stream, request } => self.hub.create(stream, request),
            Command::Cancel { stream, watch_id } => self.hub.cancel(stream, watch_id),
            Command::Progress { stream } => self.hub.request_progress(stream),
            Command::Close { stream } => self.hub.close_stream(stream),
        }
    }

    fn flush(&mut self, tx: &mpsc::UnboundedSender<WatchRequest>) {
        self.hub.flush_creates();
        for request in self.hub.outbox.drain(..) {
            // A closed stream loses these; `upstream_lost` re-creates everything from the hub's state.
            let _ = tx.send(request);
        }
    }

    async fn serve_stream(
        &mut self,
        channel: tonic::transport::Channel,
        index: usize,
    ) -> StreamEnd {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut request = Request::new(UnboundedReceiverStream::new(rx));
        // etcd ends a stream that requires a leader when it loses it, so the proxy notices and fails over.
        request
            .metadata_mut()
            .insert("hasleader", MetadataValue::from_static("true"));
        if let Some(token) = self
            .token
            .as_deref()
            .and_then(|t| MetadataValue::try_from(t).ok())
        {
            request.metadata_mut().insert("token", token);
        }
        let mut client =
            WatchClient::new(channel).max_decoding_message_size(self.upstream.max_recv_bytes);
        self.flush(&tx);
        let opening = client.watch(request);
        tokio::pin!(opening);
        let mut responses: Option<Streaming<WatchResponse>> = None;
        let mut check = tokio::time::interval(CHECK_EVERY);
        let mut last_heard = Instant::now();
        let mut probe_sent: Option<Instant> = None;
        let mut creates = AnswerDeadline::default();
        loop {
            tokio::select! {
                opened = &mut opening, if responses.is_none() => match opened {
                    Ok(response) => responses = Some(response.into_inner()),
                    Err(status) => return StreamEnd::Failed(status),
                },
                next = async { responses.as_mut().expect("guarded").next().await }, if responses.is_some() => {
                    match next {
                        Some(Ok(response)) => {
                            last_heard = Instant::now();
                            probe_sent = None;
                            self.hub.upstream_response(response);
                            self.flush(&tx);
                        }
                        Some(Err(status)) => return StreamEnd::Failed(status),
                        None => return StreamEnd::Failed(Status::unavailable("upstream watch stream ended")),
                    }
                }
                command = self.commands.recv() => {
                    let Some(command) = command else { return StreamEnd::Finished };
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
                _ = check.tick() => {
                    if self.upstream.active().0 != index {
                        return StreamEnd::Moved;
                    }
                    if creates.overdue(self.hub.create_progress(), Instant::now(), PROBE_TIMEOUT) {
                        return StreamEnd::Failed(Status::unavailable("etcd did not answer a watch create in time"));
                    }
                    if let Some(sent) = probe_sent {
                        if sent.elapsed() > PROBE_TIMEOUT {
                            return StreamEnd::Failed(Status::unavailable("etcd did not answer a watch progress request in time"));
                        }
                    } else if last_heard.elapsed() > PROBE_AFTER_SILENCE && self.hub.probe() {
                        probe_sent = Some(Instant::now());
                        self.flush(&tx);
                    }
                }
            }
        }
    }
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
