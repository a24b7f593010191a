//! Watch fan-out: W watchers (one Watch stream each) on one key over C connections to the target, while a writer
//! puts that key at a steady rate straight to etcd. Measures completeness (events delivered / W x puts) and the
//! latency from a put's issue to each watcher's delivery.
//!
//! The writer goes to etcd directly so that every target is compared on the watch path alone; each put's value
//! carries its sequence number, which maps a delivered event back to the instant its put was issued.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, kv_client::KvClient};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::recorder::{Recorder, Tally};
use crate::meter::Meter;

/// How long all watchers may take to be created.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long deliveries may trail the last put before the missing ones count as lost.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

pub struct WatchFanout {
    pub watchers: usize,
    pub put_rate: f64,
    pub measured: Duration,
    pub value_size: usize,
}

/// Deliveries against expectations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchStats {
    pub watchers: u64,
    pub watchers_created: u64,
    /// Puts etcd acknowledged.
    pub puts: u64,
    /// `watchers x puts`.
    pub expected: u64,
    pub delivered: u64,
    /// `delivered / expected` (1.0 is complete; above 1.0 would mean duplicates).
    pub completeness: f64,
}

struct Shared {
    /// When put `seq` was issued; set by the writer before it sends the put.
    issued: Vec<OnceLock<Instant>>,
    created: AtomicUsize,
    delivered: AtomicU64,
}

impl WatchFanout {
    /// Runs one fan-out through `channels` (to the target), with puts through `direct` (to etcd).
    pub async fn run(
        &self,
        channels: &[Channel],
        direct: Channel,
        meter: &Meter,
    ) -> (Tally, WatchStats) {
        let key = format!("bench/watch/{}", RUN_SEQ.fetch_add(1, Ordering::Relaxed)).into_bytes();
        let puts_planned = (self.put_rate * self.measured.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        let shared = Arc::new(Shared {
            issued: (0..puts_planned).map(|_| OnceLock::new()).collect(),
            created: AtomicUsize::new(0),
            delivered: AtomicU64::new(0),
        });
        let recorders: Vec<Arc<Mutex<Recorder>>> = (0..self.watchers)
            .map(|_| Arc::new(Mutex::new(Recorder::new())))
            .collect();
        let tasks: Vec<_> = recorders
            .iter()
            .enumerate()
            .map(|(i, recorder)| {
                let channel = channels[i % channels.len()].clone();
                tokio::spawn(watcher(
                    channel,
                    key.clone(),
                    Arc::clone(&shared),
                    Arc::clone(recorder),
                ))
            })
            .collect();
        let created_by = Instant::now() + CREATE_TIMEOUT;
        while shared.created.load(Ordering::Relaxed) < self.watchers && Instant::now() < created_by
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let watchers_created = shared.created.load(Ordering::Relaxed);

        meter.start().await;
        let writer_start = Instant::now();
        let mut writer_errors = Recorder::new();
        let writer = async {
            let mut kv = KvClient::new(direct);
            let mut acknowledged = 0u64;
            for seq in 0..puts_planned {
                tokio::time::sleep_until(
                    writer_start + Duration::from_secs_f64(seq as f64 / self.put_rate),
                )
                .await;
                let mut value = (seq as u64).to_le_bytes().to_vec();
                value.resize(self.value_size.max(8), b'w');
                let _ = shared.issued[seq].set(Instant::now());
                let put = kv.put(PutRequest {
                    key: key.clone(),
                    value,
                    ..Default::default()
                });
                match tokio::time::timeout(super::REQUEST_TIMEOUT, put).await {
                    Ok(Ok(_)) => acknowledged += 1,
                    Ok(Err(status)) => writer_errors.failure(format!(
                        "put: {:?}: {}",
                        status.code(),
                        status.message()
                    )),
                    Err(_) => writer_errors.failure("put: no answer"),
                }
            }
            acknowledged
        };
        let midpoint = async {
            tokio::time::sleep_until(writer_start + self.measured / 2).await;
            meter.in_place().await;
        };
        let (puts, ()) = tokio::join!(writer, midpoint);
        // Throughput is over the put phase: waiting for missing events must not dilute the rate of the delivered.
        let window = writer_start.elapsed();

        let expected = puts * watchers_created as u64;
        let drained_by = Instant::now() + DRAIN_TIMEOUT;
        while shared.delivered.load(Ordering::Relaxed) < expected && Instant::now() < drained_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        meter.end().await;
        for task in &tasks {
            task.abort();
        }
        let mut total = writer_errors;
        for recorder in &recorders {
            total.merge(&recorder.lock().unwrap_or_else(|e| e.into_inner()));
        }
        for _ in watchers_created..self.watchers {
            total.failure("watcher not created in time");
        }
        let delivered = shared.delivered.load(Ordering::Relaxed);
        let stats = WatchStats {
            watchers: self.watchers as u64,
            watchers_created: watchers_created as u64,
            puts,
            expected,
            delivered,
            completeness: if expected == 0 {
                0.0
            } else {
                delivered as f64 / expected as f64
            },
        };
        (total.tally(window), stats)
    }
}

/// One client watcher: creates a watch on `key`, then records every event's delivery latency.
async fn watcher(
    channel: Channel,
    key: Vec<u8>,
    shared: Arc<Shared>,
    recorder: Arc<Mutex<Recorder>>,
) {
    let fail = |what: String| {
        recorder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .failure(what)
    };
    let (requests, outgoing) = mpsc::channel(1);
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key,
            ..Default::default()
        })),
    };
    // Queued before the call: a server may hold its response headers until the first message arrives.
    if requests.send(create).await.is_err() {
        return fail("watch request stream closed".into());
    }
    let mut stream = match WatchClient::new(channel)
        .watch(ReceiverStream::new(outgoing))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return fail(format!("watch: {:?}: {}", status.code(), status.message())),
    };
    loop {
        match stream.message().await {
            Ok(Some(response)) => {
                if response.created {
                    shared.created.fetch_add(1, Ordering::Relaxed);
                }
                if response.canceled {
                    return fail(format!("watch canceled: {}", response.cancel_reason));
                }
                for event in response.events {
                    let Some(seq) = event
                        .kv
                        .as_ref()
                        .and_then(|kv| kv.value.get(..8))
                        .and_then(|b| <[u8; 8]>::try_from(b).ok())
                        .map(|b| u64::from_le_bytes(b) as usize)
                    else {
                        fail("event without a sequence number".into());
                        continue;
                    };
                    match shared.issued.get(seq).and_then(OnceLock::get) {
                        Some(issued) => {
                            recorder
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .success(issued.elapsed());
                            shared.delivered.fetch_add(1, Ordering::Relaxed);
                        }
                        None => fail(format!("event for put {seq}, which was never issued")),
                    }
                }
            }
            Ok(None) => return fail("watch stream ended".into()),
            Err(status) => {
                return fail(format!("watch: {:?}: {}", status.code(), status.message()));
            }
        }
    }
    // `requests` lives until the task ends or is aborted, so the client never half-closes on its own.
}
