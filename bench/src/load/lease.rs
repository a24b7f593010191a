//! Lease keep-alive: L leases (granted on etcd directly, not measured) kept alive through the target over S
//! bidirectional LeaseKeepAlive streams, each lease refreshed every TTL/3 as etcd's Go client does. Latency is
//! from a request to its answer; a request not answered by the end of the drain period counts as failed.
//!
//! Requests on a stream are pipelined (several leases may wait at once) and answers are matched by lease ID:
//! a proxy may answer on its own cadence (etcd's Go proxy answers when its shared lessor next renews the lease),
//! and that wait is exactly what this scenario shows.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, stream};
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::recorder::{Recorder, Tally};
use crate::meter::Meter;

/// Grants and revokes in flight during setup and cleanup.
const SETUP_CONCURRENCY: usize = 16;

pub struct LeaseKeepalive {
    pub leases: usize,
    pub streams: usize,
    pub ttl_seconds: i64,
    pub measured: Duration,
}

/// When each lease of one stream is due: lease `g` of `total` refreshes at `g/total` of every interval, so the
/// load is spread evenly over time.
#[derive(Clone, Copy)]
struct Cadence {
    begin: Instant,
    interval: Duration,
    total: usize,
}

impl Cadence {
    fn due(&self, round: u32, global_index: usize) -> Instant {
        self.begin
            + self.interval * round
            + self
                .interval
                .mul_f64(global_index as f64 / self.total.max(1) as f64)
    }
}

impl LeaseKeepalive {
    fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.ttl_seconds.max(1) as f64 / 3.0)
    }

    pub async fn run(&self, channels: &[Channel], direct: Channel, meter: &Meter) -> Tally {
        let ids = match grant(direct.clone(), self.leases, self.ttl_seconds).await {
            Ok(ids) => ids,
            Err(status) => {
                let mut failed = Recorder::new();
                failed.failure(format!(
                    "lease grant: {:?}: {}",
                    status.code(),
                    status.message()
                ));
                return failed.tally(self.measured);
            }
        };
        let interval = self.interval();
        let streams = self.streams.clamp(1, ids.len().max(1));
        let cadence = Cadence {
            begin: Instant::now(),
            interval,
            total: ids.len(),
        };
        // One full interval of warm-up, so every lease has been registered wherever the target registers leases.
        let window_start = cadence.begin + interval;
        let window_end = window_start + self.measured;
        // Answers may trail by up to one renewal period of a proxy's own cadence (TTL/3) plus scheduling.
        let drain_until = window_end + interval + Duration::from_secs(1);
        let tasks: Vec<_> = (0..streams)
            .map(|s| {
                let mine: Vec<(usize, i64)> = ids
                    .iter()
                    .copied()
                    .enumerate()
                    .skip(s)
                    .step_by(streams)
                    .collect();
                let channel = channels[s % channels.len()].clone();
                let window = Window {
                    start: window_start,
                    end: window_end,
                    drain_until,
                };
                tokio::spawn(keep_alive_stream(channel, mine, cadence, window))
            })
            .collect();
        tokio::time::sleep_until(window_start).await;
        meter.start().await;
        tokio::time::sleep_until(window_start + self.measured / 2).await;
        meter.in_place().await;
        tokio::time::sleep_until(window_end).await;
        // The window closes when the last request of the window is sent, so etcd's counters and the proxy's CPU
        // cover the steady state of the measured requests (warm-up answers trail into it as drain answers trail
        // out of it), not the drain period that follows.
        meter.end().await;
        let mut total = Recorder::new();
        for task in tasks {
            match task.await {
                Ok(recorder) => total.merge(&recorder),
                Err(e) => total.failure(format!("keep-alive stream task: {e}")),
            }
        }
        revoke(direct, ids).await;
        total.tally(self.measured)
    }
}

async fn grant(direct: Channel, n: usize, ttl: i64) -> Result<Vec<i64>, tonic::Status> {
    let grants = stream::iter(0..n).map(|_| {
        let mut lease = LeaseClient::new(direct.clone());
        async move {
            let response = lease.lease_grant(LeaseGrantRequest { ttl, id: 0 }).await?;
            Ok::<i64, tonic::Status>(response.into_inner().id)
        }
    });
    grants
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Revokes what the run granted so that leases do not pile up in etcd across runs (a failure only leaves a lease
/// to expire by itself).
async fn revoke(direct: Channel, ids: Vec<i64>) {
    stream::iter(ids)
        .map(|id| {
            let mut lease = LeaseClient::new(direct.clone());
            async move {
                let _ = lease.lease_revoke(LeaseRevokeRequest { id }).await;
            }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

#[derive(Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
    drain_until: Instant,
}

/// Requests sent and not yet answered, oldest first, by lease ID.
type Pending = Arc<Mutex<HashMap<i64, VecDeque<Instant>>>>;

/// One LeaseKeepAlive stream refreshing `leases` (global index, ID) on `cadence` until the window ends, then
/// waiting for outstanding answers until the drain deadline.
async fn keep_alive_stream(
    channel: Channel,
    leases: Vec<(usize, i64)>,
    cadence: Cadence,
    window: Window,
) -> Recorder {
    let recorder = Arc::new(Mutex::new(Recorder::new()));
    let record =
        |f: &dyn Fn(&mut Recorder)| f(&mut recorder.lock().unwrap_or_else(|e| e.into_inner()));
    let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
    let (requests, outgoing) = mpsc::channel(leases.len() + 1);
    let send_done = AtomicBool::new(false);

    let send = |id: i64| {
        let pending = Arc::clone(&pending);
        let requests = requests.clone();
        async move {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(id)
                .or_default()
                .push_back(Instant::now());
            requests.send(LeaseKeepAliveRequest { id }).await.is_ok()
        }
    };
    let Some(&(first_index, first_id)) = leases.first() else {
        return Recorder::new();
    };
    tokio::time::sleep_until(cadence.due(0, first_index)).await;
    // Queued before the call: a server may hold its response headers until the first message arrives.
    if !send(first_id).await {
        record(&|r| r.failure("keep-alive request stream closed"));
    }
    let mut responses = match LeaseClient::new(channel)
        .lease_keep_alive(ReceiverStream::new(outgoing))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => {
            record(&|r| {
                r.failure(format!(
                    "keep-alive: {:?}: {}",
                    status.code(),
                    status.message()
                ))
            });
            return take(recorder);
        }
    };

    let sender = async {
        'rounds: for round in 0u32.. {
            for (position, &(index, id)) in leases.iter().enumerate() {
                if round == 0 && position == 0 {
                    continue; // sent above
                }
                let due = cadence.due(round, index);
                if due >= window.end {
                    break 'rounds;
                }
                tokio::time::sleep_until(due).await;
                if !send(id).await {
                    record(&|r| r.failure("keep-alive request stream closed"));
                    break 'rounds;
                }
            }
        }
        send_done.store(true, Ordering::Release);
    };
    let receiver = async {
        loop {
            let idle = send_done.load(Ordering::Acquire)
                && pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .all(VecDeque::is_empty);
            if idle {
                return;
            }
            // Short waits, so the loop notices when the sender has finished and nothing is outstanding.
            let next = tokio::time::timeout(Duration::from_millis(50), responses.message()).await;
            match next {
                Err(_) if Instant::now() >= window.drain_until => return,
                Err(_) => continue,
                Ok(Ok(Some(response))) => {
                    let sent = pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(&response.id)
                        .and_then(VecDeque::pop_front);
                    match sent {
                        Some(_) if response.ttl <= 0 => record(&|r| {
                            r.failure(format!(
                                "keep-alive of {} answered TTL {}",
                                response.id, response.ttl
                            ))
                        }),
                        Some(sent) if sent >= window.start && sent < window.end => {
                            let latency = sent.elapsed();
                            record(&|r| r.success(latency));
                        }
                        Some(_) => {} // warm-up request
                        None => record(&|r| {
                            r.failure(format!("unrequested keep-alive answer for {}", response.id))
                        }),
                    }
                }
                Ok(Ok(None)) => {
                    record(&|r| r.failure("keep-alive stream ended"));
                    return;
                }
                Ok(Err(status)) => {
                    record(&|r| {
                        r.failure(format!(
                            "keep-alive: {:?}: {}",
                            status.code(),
                            status.message()
                        ))
                    });
                    return;
                }
            }
        }
    };
    tokio::join!(sender, receiver);
    let unanswered: usize = pending
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .flatten()
        .filter(|sent| **sent >= window.start && **sent < window.end)
        .count();
    for _ in 0..unanswered {
        record(&|r| r.failure("keep-alive not answered by the end of the drain period"));
    }
    drop(requests);
    take(recorder)
}

fn take(recorder: Arc<Mutex<Recorder>>) -> Recorder {
    std::mem::take(&mut *recorder.lock().unwrap_or_else(|e| e.into_inner()))
}
