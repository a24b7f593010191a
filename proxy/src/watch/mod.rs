//! The Watch service with coalescing: client watchers (c-watchers) on the same key or range share one upstream
//! watcher (s-watcher) whenever that cannot lose or duplicate an event.
//!
//! - [`filter`]: what one c-watcher sees of a shared response (its start, filters, prev_kv, fragmentation).
//! - [`hub`]: the state machine mapping c-watchers onto s-watchers (join, merge, cancel, resume, slow consumers).
//! - [`actor`]: runs a hub against etcd over one upstream Watch stream per caller identity (or one in all, with
//!   the proxy's own identity, `--user`).
//! - [`admission`]: with the proxy's own identity, checks each caller's token for read permission on its range.
//!
//! This module wires client streams to their hub: requests in, responses (bounded by `--watch-buffer-size`) out.

pub mod actor;
pub mod admission;
pub mod filter;
pub mod hub;
#[cfg(test)]
mod hub_fuzz;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{WatchRequest, WatchResponse};
use tokio::sync::{Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};

use crate::error;
use crate::metrics::Metrics;
use crate::namespace::Namespace;
use crate::upstream::identity::Identity;
use crate::upstream::outbound::{OnDrop, Outbound};
use crate::upstream::{BoxStream, Forwarded, Upstream};
use actor::{Actor, Command, Registry, UpstreamAuth};
use hub::{Hub, HubConfig, StreamId, StreamSink};

/// Requests one client stream may have waiting for its hub: a client that sends creates faster than the hub
/// applies them waits (its HTTP/2 flow control pushes back, as on etcd, which handles a stream's requests one at a
/// time) instead of growing the queue without bound or crowding out other streams.
const QUEUED_REQUESTS_PER_STREAM: usize = 64;

/// The proxy's Watch service.
pub struct WatchService {
    upstream: Arc<Upstream>,
    metrics: Metrics,
    config: HubConfig,
    buffer: usize,
    /// The proxy's own identity (`--user`): upstream streams carry its token, and callers are admitted by a check
    /// of theirs.
    identity: Option<Arc<Identity>>,
    /// `--namespace`: creates get its prefix before the hub sees them (hubs work on etcd's keys), events lose it
    /// on their way to each client.
    namespace: Option<Arc<Namespace>>,
    hubs: Registry,
    next_stream: AtomicU64,
}

impl WatchService {
    /// `buffer` is the number of responses each client stream may have unread before it is ended;
    /// `config.own_identity` must say whether `identity` is given.
    pub fn new(
        upstream: Arc<Upstream>,
        metrics: Metrics,
        config: HubConfig,
        buffer: usize,
        identity: Option<Arc<Identity>>,
        namespace: Option<Arc<Namespace>>,
    ) -> Self {
        Self {
            upstream,
            metrics,
            config,
            buffer: buffer.max(1),
            identity,
            namespace,
            hubs: Registry::default(),
            next_stream: AtomicU64::new(1),
        }
    }

    /// Registers a client stream with the hub of its identity (starting that hub if needed).
    fn open(
        &self,
        token: Option<String>,
        stream: StreamId,
        sink: StreamSink,
    ) -> mpsc::UnboundedSender<Command> {
        let mut hubs = self
            .hubs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut sink = Some(sink);
        if let Some(commands) = hubs.get(&token) {
            let open = Command::Open {
                stream,
                sink: sink.take().expect("present"),
            };
            match commands.send(open) {
                Ok(()) => return commands.clone(),
                Err(mpsc::error::SendError(Command::Open { sink: returned, .. })) => {
                    sink = Some(returned)
                }
                Err(_) => unreachable!("the command sent was Open"),
            }
        }
        let (commands, receiver) = mpsc::unbounded_channel();
        let hub = Hub::new(self.config, self.metrics.clone());
        let auth = match &self.identity {
            Some(identity) => UpstreamAuth::Proxy(identity.clone()),
            None => UpstreamAuth::Caller(token.clone()),
        };
        let actor = Actor {
            hub,
            upstream: self.upstream.clone(),
            auth,
            key: token.clone(),
            commands: receiver,
            registry: self.hubs.clone(),
            token: None,
        };
        let _ = commands.send(Command::Open {
            stream,
            sink: sink.take().expect("present"),
        });
        hubs.insert(token, commands.clone());
        tokio::spawn(actor.run());
        commands
    }
}

impl WatchService {
    /// A Watch stream for a client inside the proxy (the range cache): it is served like a client's, on this
    /// service's hubs and so on their upstream streams, and ends when dropped.
    pub fn attach(&self, token: Option<String>, buffer: usize) -> LocalStream {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (responses, responses_rx) = mpsc::channel(buffer.max(1));
        let (abort, abort_rx) = mpsc::channel(1);
        // The range cache reads `aborted` alone: a stream the hub finishes ends there at once, as one it aborts.
        let sink = StreamSink {
            responses,
            finish: abort.clone(),
            abort,
            requires_leader: false,
        };
        let commands = self.open(token, id, sink);
        LocalStream {
            handle: StreamHandle { id, commands },
            responses: responses_rx,
            aborted: abort_rx,
        }
    }
}

/// A Watch stream opened inside the proxy (see [`WatchService::attach`]).
pub struct LocalStream {
    /// What sends requests; the stream closes when it is dropped.
    pub handle: StreamHandle,
    /// What the hub answers, in order.
    pub responses: mpsc::Receiver<WatchResponse>,
    /// Why the hub ended the stream, if it did.
    pub aborted: mpsc::Receiver<Status>,
}

/// The requests side of a [`LocalStream`].
pub struct StreamHandle {
    id: StreamId,
    commands: mpsc::UnboundedSender<Command>,
}

impl StreamHandle {
    pub fn create(&self, request: proto::etcdserverpb::WatchCreateRequest) {
        let _ = self.commands.send(Command::Create {
            stream: self.id,
            request,
        });
    }

    pub fn cancel(&self, watch_id: i64) {
        let _ = self.commands.send(Command::Cancel {
            stream: self.id,
            watch_id,
        });
    }

    pub fn request_progress(&self) {
        let _ = self.commands.send(Command::Progress { stream: self.id });
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Close { stream: self.id });
    }
}

impl WatchService {
    /// One client's Watch stream.
    pub async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<BoxStream<WatchResponse>>, Status> {
        let forwarded = Forwarded::capture(&request);
        if forwarded.requires_leader() {
            self.upstream
                .require_leader(forwarded.token().as_deref())
                .await?;
        }
        // Streams are shared only between callers with one token, whichever key carried it.
        let token = match self.identity {
            Some(_) => None,
            None => forwarded.token(),
        };
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (responses, responses_rx) = mpsc::channel(self.buffer);
        let (abort, abort_rx) = mpsc::channel(1);
        let (finish, finish_rx) = mpsc::channel(1);
        let sink = StreamSink {
            responses,
            abort: abort.clone(),
            finish,
            requires_leader: forwarded.requires_leader(),
        };
        let commands = self.open(token, stream, sink);
        let admission = match (&self.identity, forwarded.token()) {
            (Some(_), _) => Some(Admission::EveryCreate),
            (None, Some(_)) => Some(Admission::OpenEndedCreates),
            // No identity and no token: etcd's auth is off, or etcd refuses the create itself.
            (None, None) => None,
        }
        .map(|which| Gate {
            upstream: self.upstream.clone(),
            caller: forwarded,
            which,
        });
        tokio::spawn(read_requests(
            request.into_inner(),
            stream,
            commands.clone(),
            abort,
            admission,
            self.namespace.clone(),
        ));
        let outbound = Outbound {
            items: responses_rx,
            abort: abort_rx,
            finish: Some(finish_rx),
            shutdown: self.upstream.shutdown_signal(),
        };
        // When the client is gone, its watchers go too.
        let close = OnDrop(move || {
            let _ = commands.send(Command::Close { stream });
        });
        let namespace = self.namespace.clone();
        let to_client = move |response| match &namespace {
            Some(namespace) => namespace.watch_response(response),
            None => Ok(response),
        };
        Ok(Response::new(outbound.into_stream(to_client, close)))
    }
}

/// Which creates of a caller the proxy checks with etcd before they reach the hub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission {
    /// Upstream streams carry the proxy's own identity (`--user`): etcd never sees the caller's token.
    EveryCreate,
    /// Upstream streams carry the caller's token, so etcd checks each create itself, except that etcd before
    /// 3.5.33, 3.6.14 and 3.7.1 checks a `range_end` of `"\0"` (every key from `key` on) as if it were the single
    /// key `key` (GHSA-xg4h-6gfc-h4m8): a caller allowed to read one key would receive every later write. Those
    /// creates are checked on the range they really cover.
    OpenEndedCreates,
}

impl Admission {
    fn checks(self, create: &proto::etcdserverpb::WatchCreateRequest) -> bool {
        match self {
            Admission::EveryCreate => true,
            Admission::OpenEndedCreates => create.range_end == [0],
        }
    }
}

/// What checks a caller's creates: see [`Admission`].
struct Gate {
    upstream: Arc<Upstream>,
    caller: Forwarded,
    which: Admission,
}

/// Forwards a client's requests to its hub. A half-close ends only this loop: the watchers keep running, as on
/// etcd, until the client cancels them or goes away. The creates the `admission` gate checks are first asked of
/// etcd with the caller's token; requests stay in order, as etcd handles them.
async fn read_requests(
    mut inbound: Streaming<WatchRequest>,
    stream: StreamId,
    commands: mpsc::UnboundedSender<Command>,
    abort: mpsc::Sender<Status>,
    admission: Option<Gate>,
    namespace: Option<Arc<Namespace>>,
) {
    let places = Arc::new(Semaphore::new(QUEUED_REQUESTS_PER_STREAM));
    while let Some(next) = inbound.next().await {
        let request = match next {
            Ok(request) => request,
            Err(status) => {
                let _ = abort.try_send(error::to_client(status));
                return;
            }
        };
        let command = match request.request_union {
            Some(RequestUnion::CreateRequest(mut request)) => {
                if let Some(namespace) = &namespace {
                    namespace.watch_create(&mut request);
                }
                match &admission {
                    Some(gate) if gate.which.checks(&request) => {
                        match admit(&gate.upstream, &gate.caller, stream, request).await {
                            Ok(command) => command,
                            Err(status) => {
                                let _ = abort.try_send(status);
                                return;
                            }
                        }
                    }
                    _ => Command::Create { stream, request },
                }
            }
            Some(RequestUnion::CancelRequest(cancel)) => Command::Cancel {
                stream,
                watch_id: cancel.watch_id,
            },
            Some(RequestUnion::ProgressRequest(_)) => Command::Progress { stream },
            None => continue,
        };
        let place = places
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let queued = Command::Queued {
            command: Box::new(command),
            place,
        };
        if commands.send(queued).is_err() {
            return;
        }
    }
}

/// The command for a create from a caller who must be admitted first (see [`admission`]): the create itself, or
/// etcd's refusal of it. An `Err` says etcd could not be asked.
async fn admit(
    upstream: &Arc<Upstream>,
    caller: &Forwarded,
    stream: StreamId,
    request: proto::etcdserverpb::WatchCreateRequest,
) -> Result<Command, Status> {
    Ok(match admission::check(upstream, caller, &request).await? {
        admission::Admission::Admitted => Command::Create { stream, request },
        admission::Admission::Refused { code, message } => {
            let refusal = admission::refusal(upstream, code, &message, request.watch_id).await;
            Command::Refuse {
                stream,
                reason: refusal.reason,
                watch_id: refusal.watch_id,
            }
        }
    })
}
