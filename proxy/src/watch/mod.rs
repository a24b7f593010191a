//! The Watch service with coalescing: client watchers (c-watchers) on the same key or range share one upstream
//! watcher (s-watcher) whenever that cannot lose or duplicate an event.
//!
//! - [`filter`]: what one c-watcher sees of a shared response (its start, filters, prev_kv, fragmentation).
//! - [`hub`]: the state machine mapping c-watchers onto s-watchers (join, merge, cancel, resume, slow consumers).
//! - [`actor`]: runs a hub against etcd over one upstream Watch stream per caller identity.
//!
//! This module wires client streams to their hub: requests in, responses (bounded by `--watch-buffer-size`) out.

pub mod actor;
pub mod filter;
pub mod hub;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::watch_server::Watch;
use proto::etcdserverpb::{WatchRequest, WatchResponse};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::error;
use crate::metrics::Metrics;
use crate::upstream::outbound::{OnDrop, Outbound};
use crate::upstream::{BoxStream, Upstream};
use actor::{Actor, Command, Registry};
use hub::{Hub, HubConfig, StreamId, StreamSink};

/// The proxy's Watch service.
pub struct WatchService {
    upstream: Arc<Upstream>,
    metrics: Metrics,
    config: HubConfig,
    buffer: usize,
    hubs: Registry,
    next_stream: AtomicU64,
}

impl WatchService {
    /// `buffer` is the number of responses each client stream may have unread before it is ended.
    pub fn new(
        upstream: Arc<Upstream>,
        metrics: Metrics,
        config: HubConfig,
        buffer: usize,
    ) -> Self {
        Self {
            upstream,
            metrics,
            config,
            buffer: buffer.max(1),
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
        let actor = Actor {
            hub,
            upstream: self.upstream.clone(),
            token: token.clone(),
            commands: receiver,
            registry: self.hubs.clone(),
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

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = BoxStream<WatchResponse>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let forwarded = crate::upstream::Forwarded::capture(&request);
        let token = request
            .metadata()
            .get("token")
            .and_then(|t| t.to_str().ok())
            .map(str::to_owned);
        let stream = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (responses, responses_rx) = mpsc::channel(self.buffer);
        let (abort, abort_rx) = mpsc::channel(1);
        let sink = StreamSink {
            responses,
            abort: abort.clone(),
            requires_leader: forwarded.requires_leader(),
        };
        let commands = self.open(token, stream, sink);
        tokio::spawn(read_requests(
            request.into_inner(),
            stream,
            commands.clone(),
            abort,
        ));
        let outbound = Outbound {
            items: responses_rx,
            abort: abort_rx,
            shutdown: self.upstream.shutdown_signal(),
        };
        // When the client is gone, its watchers go too.
        let close = OnDrop(move || {
            let _ = commands.send(Command::Close { stream });
        });
        Ok(Response::new(outbound.into_stream(Ok, close)))
    }
}

/// Forwards a client's requests to its hub. A half-close ends only this loop: the watchers keep running, as on
/// etcd, until the client cancels them or goes away.
async fn read_requests(
    mut inbound: Streaming<WatchRequest>,
    stream: StreamId,
    commands: mpsc::UnboundedSender<Command>,
    abort: mpsc::Sender<Status>,
) {
    while let Some(next) = inbound.next().await {
        let request = match next {
            Ok(request) => request,
            Err(status) => {
                let _ = abort.try_send(error::to_client(status));
                return;
            }
        };
        let command = match request.request_union {
            Some(RequestUnion::CreateRequest(request)) => Command::Create { stream, request },
            Some(RequestUnion::CancelRequest(cancel)) => Command::Cancel {
                stream,
                watch_id: cancel.watch_id,
            },
            Some(RequestUnion::ProgressRequest(_)) => Command::Progress { stream },
            None => continue,
        };
        if commands.send(command).is_err() {
            return;
        }
    }
}
