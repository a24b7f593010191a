//! The Watch service of one member. Each stream is a session task holding its watchers; whenever the store changes
//! it sends every watcher the events of the new revisions on its range (one response per revision, as etcd does for
//! synced watchers), read from the recorded history, so a watcher never misses or repeats a revision.
//!
//! Follows etcd's server: Created first (header at the current revision), auto IDs from 0, client-chosen IDs,
//! filters, prev_kv, progress notifications and progress requests (watch_id -1), cancel, and a start revision below
//! the compaction revision answered by a response with `compact_revision` set and `canceled`. A client half-close
//! does not end the stream; the client going away or the member stopping does.
//!
//! Every live watcher is counted in the cluster's [`census`](super::census) under its stream, from just before its
//! Created answer until its cancel or the end of its stream.

use std::collections::BTreeMap;

use futures::StreamExt;
use proto::etcdserverpb::watch_create_request::FilterType;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::watch_server::Watch;
use proto::etcdserverpb::{WatchCreateRequest, WatchRequest, WatchResponse};
use proto::mvccpb::event::EventType;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Response, Status, Streaming};

use super::auth::{Access, watch_checked_range};
use super::census::WatchedRange;
use super::cluster::{Cluster, ConnectedAt, StreamGuard, stopped};
use super::history::{AccessKind, StreamKind};
use super::keyspace::KeyRange;

pub struct WatchService {
    pub cluster: Cluster,
    pub member: usize,
    pub stop: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl Watch for WatchService {
    type WatchStream = ReceiverStream<Result<WatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let connected_at = request.extensions().get::<ConnectedAt>().map(|c| c.0);
        let (tx, rx) = mpsc::channel(256);
        let session = Session {
            cluster: self.cluster.clone(),
            member: self.member,
            metadata: request.metadata().clone(),
            watchers: BTreeMap::new(),
            next_id: 0,
            tx,
            guard: self
                .cluster
                .open_stream(self.member, StreamKind::Watch, connected_at),
        };
        let stop = self.stop.clone();
        let inbound = request.into_inner();
        tokio::spawn(session.run(inbound, stop));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The first etcd version that answers no progress request on a stream without watchers.
const PROGRESS_NEEDS_WATCHERS: (u32, u32, u32) = (3, 5, 8);

struct Watcher {
    /// The range as the create request spelled it (the census counts by it).
    requested: WatchedRange,
    range: KeyRange,
    next_revision: i64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
}

struct Session {
    cluster: Cluster,
    member: usize,
    /// The stream's metadata: its token is checked at every create, as etcd does.
    metadata: MetadataMap,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    tx: mpsc::Sender<Result<WatchResponse, Status>>,
    /// Records the stream in the history and its live watchers in the census; dropping it ends both.
    guard: StreamGuard,
}

/// The client went away: the session ends.
struct Gone;

impl Session {
    async fn run(mut self, mut inbound: Streaming<WatchRequest>, mut stop: watch::Receiver<bool>) {
        let mut changed = self.cluster.subscribe();
        let mut progress = tokio::time::interval(self.cluster.progress_interval());
        progress.tick().await;
        let mut reading = true;
        loop {
            if self.deliver().await.is_err() {
                return;
            }
            let tx = self.tx.clone();
            tokio::select! {
                // Fixed order, for reproducible runs (turmoil seeds select!'s RNG only under tokio_unstable).
                biased;
                next = inbound.next(), if reading => match next {
                    Some(Ok(request)) => {
                        self.guard.touch();
                        if self.handle(request).await.is_err() {
                            return;
                        }
                    }
                    None => reading = false,
                    Some(Err(_)) => return,
                },
                result = changed.changed() => {
                    if result.is_err() {
                        return;
                    }
                }
                _ = progress.tick() => {
                    if self.notify_progress().await.is_err() {
                        return;
                    }
                }
                () = stopped(&mut stop) => return,
                _ = tx.closed() => return,
            }
        }
    }

    async fn send(&self, response: WatchResponse) -> Result<(), Gone> {
        self.tx.send(Ok(response)).await.map_err(|_| Gone)
    }

    fn header(&self) -> Option<proto::etcdserverpb::ResponseHeader> {
        let revision = self
            .cluster
            .with_store(|store, _| self.cluster.applied_revision(self.member, store.revision()));
        Some(self.cluster.header(self.member, revision))
    }

    async fn handle(&mut self, request: WatchRequest) -> Result<(), Gone> {
        match request.request_union {
            Some(RequestUnion::CreateRequest(create)) => self.create(create).await,
            Some(RequestUnion::CancelRequest(cancel)) => {
                if let Some(watcher) = self.watchers.remove(&cancel.watch_id) {
                    self.guard.watcher_removed(&watcher.requested);
                    self.send(WatchResponse {
                        header: self.header(),
                        watch_id: cancel.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // From 3.5.8 etcd answers a progress request only when every watcher of the stream is synced, and
                // a stream without watchers not at all.
                if self.watchers.is_empty()
                    && self.cluster.imitates_at_least(PROGRESS_NEEDS_WATCHERS)
                {
                    return Ok(());
                }
                // Bring every watcher up to date first, so the progress revision promises nothing is pending.
                self.deliver().await?;
                self.send(WatchResponse {
                    header: self.header(),
                    watch_id: -1,
                    ..Default::default()
                })
                .await
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, create: WatchCreateRequest) -> Result<(), Gone> {
        // etcd watches "\0", the smallest key, for an empty key.
        let key = if create.key.is_empty() {
            vec![0]
        } else {
            create.key.clone()
        };
        self.cluster.with_store(|store, now| {
            store.history.record_access(
                now,
                self.member,
                AccessKind::Watch,
                &key,
                &create.range_end,
            )
        });
        let range = KeyRange::new(&key, &create.range_end);
        let (current, compacted) = self.cluster.with_store(|store, _| {
            (
                self.cluster.applied_revision(self.member, store.revision()),
                store.compacted(),
            )
        });
        let refused = if let Some(reason) = self.refusal(&key, &create.range_end) {
            Some(reason)
        } else if matches!(range, KeyRange::Span(..)) && range.bounds().is_none() {
            Some("mvcc: watcher range is empty".to_string())
        } else if create.watch_id != 0 && self.watchers.contains_key(&create.watch_id) {
            Some("mvcc: duplicate watch ID provided on the WatchStream".to_string())
        } else {
            None
        };
        if let Some(reason) = refused {
            return self
                .send(WatchResponse {
                    header: Some(self.cluster.header(self.member, current)),
                    watch_id: -1,
                    created: true,
                    canceled: true,
                    cancel_reason: reason,
                    ..Default::default()
                })
                .await;
        }
        let id = if create.watch_id != 0 {
            create.watch_id
        } else {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id += 1;
            self.next_id - 1
        };
        let compacted_start = create.start_revision > 0 && create.start_revision < compacted;
        if !compacted_start {
            // Live (and counted in the census) before its Created answer leaves, so a client that got the answer
            // finds it counted.
            let next_revision = if create.start_revision > 0 {
                create.start_revision
            } else {
                current + 1
            };
            let requested = (create.key.clone(), create.range_end.clone());
            self.guard.watcher_added(requested.clone());
            self.watchers.insert(
                id,
                Watcher {
                    requested,
                    range,
                    next_revision,
                    no_put: create.filters.contains(&(FilterType::Noput as i32)),
                    no_delete: create.filters.contains(&(FilterType::Nodelete as i32)),
                    prev_kv: create.prev_kv,
                    progress_notify: create.progress_notify,
                },
            );
        }
        self.send(WatchResponse {
            header: Some(self.cluster.header(self.member, current)),
            watch_id: id,
            created: true,
            ..Default::default()
        })
        .await?;
        if compacted_start {
            // Answered by a compaction cancel and never live (etcd's watcher gauge does not count it either).
            // etcd's compaction cancel carries header revision 0.
            return self
                .send(WatchResponse {
                    header: Some(self.cluster.header(self.member, 0)),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compacted,
                    ..Default::default()
                })
                .await;
        }
        Ok(())
    }

    /// Why etcd's auth refuses a watcher of `key`..`range_end` on this stream, if it does: the cancel reason etcd
    /// 3.5.30 gives, the refusal's gRPC status in Go's words (checked on [`watch_checked_range`]).
    fn refusal(&self, key: &[u8], range_end: &[u8]) -> Option<String> {
        let (key, range_end) = watch_checked_range(key, range_end);
        let refused = self
            .cluster
            .authorize(
                self.member,
                &self.metadata,
                &[(Access::Read, &key, &range_end)],
            )
            .err()?;
        let (code, message) = match refused.code() {
            Code::Unauthenticated => ("Unauthenticated", refused.message()),
            Code::InvalidArgument => ("InvalidArgument", refused.message()),
            _ => ("PermissionDenied", "etcdserver: permission denied"),
        };
        Some(format!("rpc error: code = {code} desc = {message}"))
    }

    /// Sends every watcher the events it has not seen yet, one response per revision.
    async fn deliver(&mut self) -> Result<(), Gone> {
        let mut outgoing = Vec::new();
        self.cluster.with_store(|store, _| {
            // A member cut off from the others has applied nothing since: its watchers wait until it joins again.
            let current = self.cluster.applied_revision(self.member, store.revision());
            for (id, watcher) in &mut self.watchers {
                if watcher.next_revision > current {
                    continue;
                }
                let start = store
                    .history
                    .revisions
                    .partition_point(|r| r.revision < watcher.next_revision);
                for record in &store.history.revisions[start..] {
                    let events: Vec<_> = record
                        .events
                        .iter()
                        .filter(|event| {
                            let key = event.kv.as_ref().map_or(&[][..], |kv| &kv.key);
                            let is_put = event.r#type == EventType::Put as i32;
                            watcher.range.contains(key)
                                && !(is_put && watcher.no_put)
                                && (is_put || !watcher.no_delete)
                        })
                        .map(|event| {
                            let mut event = event.clone();
                            if !watcher.prev_kv {
                                event.prev_kv = None;
                            }
                            event
                        })
                        .collect();
                    if !events.is_empty() {
                        outgoing.push(WatchResponse {
                            header: Some(self.cluster.header(self.member, current)),
                            watch_id: *id,
                            events,
                            ..Default::default()
                        });
                    }
                }
                watcher.next_revision = current + 1;
            }
        });
        for response in outgoing {
            self.send(response).await?;
        }
        Ok(())
    }

    async fn notify_progress(&mut self) -> Result<(), Gone> {
        self.deliver().await?;
        let header = self.header();
        let ids: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify)
            .map(|(id, _)| *id)
            .collect();
        for watch_id in ids {
            self.send(WatchResponse {
                header,
                watch_id,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }
}
