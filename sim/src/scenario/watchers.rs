//! A client watcher through the proxy (tonic's generated Watch client), written the way etcd's own clients
//! behave: when the stream fails it re-creates the watcher from the revision after the last one it received.
//! It stops once it has seen the run's fence revision (then it knows it is complete) or the server cancels it.

use std::time::Duration;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_create_request::FilterType;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{WatchCreateRequest, WatchRequest};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::logs::now;
use crate::check::watch::{WatchEnd, WatchStart, WatcherLog};
use crate::model::Cluster;
use crate::trace::Trace;

/// What to watch.
#[derive(Clone, Debug)]
pub struct WatcherSpec {
    pub name: String,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    /// `None`: from now on.
    pub start_revision: Option<i64>,
    pub prev_kv: bool,
    pub no_delete: bool,
}

/// Runs one watcher until it is complete through the fence, cancelled, or `give_up_at` passes.
pub async fn run_watcher(
    spec: WatcherSpec,
    channel: Channel,
    cluster: Cluster,
    mut fence: watch::Receiver<Option<i64>>,
    give_up_at: Duration,
    trace: Trace,
) -> WatcherLog {
    let mut log = WatcherLog {
        name: spec.name.clone(),
        key: spec.key.clone(),
        range_end: spec.range_end.clone(),
        prev_kv: spec.prev_kv,
        no_delete: spec.no_delete,
        start: None,
        received: Vec::new(),
        end: WatchEnd::Unconfirmed,
    };
    // The revision the watcher needs next; known once a Created response told where it starts.
    let mut next: Option<i64> = None;
    let mut client = WatchClient::new(channel);
    let mut attempt = 0u32;
    while now() < give_up_at {
        attempt += 1;
        let start_revision = next.or(spec.start_revision).unwrap_or(0);
        let model_revision = cluster.with_store(|store, _| store.revision());
        let (tx, rx) = mpsc::channel(4);
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: spec.key.clone(),
                range_end: spec.range_end.clone(),
                start_revision,
                prev_kv: spec.prev_kv,
                filters: if spec.no_delete {
                    vec![FilterType::Nodelete as i32]
                } else {
                    Vec::new()
                },
                ..Default::default()
            })),
        };
        let _ = tx.send(create).await;
        let opened = tokio::time::timeout(
            Duration::from_secs(3),
            client.watch(ReceiverStream::new(rx)),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                trace.record(format!("{}: open failed: {:?}", spec.name, status.code()));
                tokio::time::sleep(backoff(attempt)).await;
                continue;
            }
            Err(_) => {
                trace.record(format!("{}: open timed out", spec.name));
                continue;
            }
        };
        loop {
            let deadline = tokio::time::sleep_until(
                tokio::time::Instant::now() + (give_up_at.saturating_sub(now())),
            );
            let message = tokio::select! {
                message = stream.message() => message,
                changed = fence.changed(), if fence.borrow().is_none() => {
                    let _ = changed;
                    // The fence is known now; it may already be behind us.
                    if let (Some(f), Some(n)) = (*fence.borrow(), next)
                        && n > f
                    {
                        log.end = WatchEnd::CompleteThrough(f);
                        return log;
                    }
                    continue;
                }
                () = deadline => return log,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) | Err(_) => {
                    trace.record(format!(
                        "{}: stream ended, re-creating from {next:?}",
                        spec.name
                    ));
                    break;
                }
            };
            if response.created {
                if response.canceled {
                    log.end = WatchEnd::Cancelled {
                        reason: response.cancel_reason,
                        compact_revision: response.compact_revision,
                    };
                    return log;
                }
                if log.start.is_none() {
                    let reported = response.header.as_ref().map_or(0, |h| h.revision);
                    let start = match spec.start_revision {
                        Some(revision) => WatchStart::Revision(revision),
                        None => WatchStart::Current {
                            model_revision,
                            reported,
                        },
                    };
                    trace.record(format!(
                        "{}: created, starts at {}",
                        spec.name,
                        start.first_revision()
                    ));
                    next = Some(start.first_revision());
                    log.start = Some(start);
                }
                continue;
            }
            if response.canceled {
                trace.record(format!(
                    "{}: cancelled: {:?} compact {}",
                    spec.name, response.cancel_reason, response.compact_revision
                ));
                log.end = WatchEnd::Cancelled {
                    reason: response.cancel_reason,
                    compact_revision: response.compact_revision,
                };
                return log;
            }
            for event in response.events {
                let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                next = Some(revision + 1);
                log.received.push(event);
            }
            if let (Some(f), Some(n)) = (*fence.borrow(), next)
                && n > f
            {
                log.end = WatchEnd::CompleteThrough(f);
                return log;
            }
        }
        tokio::time::sleep(backoff(attempt)).await;
    }
    log
}

/// A short pause before re-opening, growing with the attempts (virtual time, so it costs nothing real).
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis(20 * u64::from(attempt.min(10)))
}
