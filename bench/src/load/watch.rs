//! Watch fan-out: W watchers on one key, multiplexed P to a Watch stream (as etcd's clients multiplex the watchers
//! of one context), the streams spread over C connections to the target, while a writer puts that key at a steady
//! rate straight to etcd. Measures completeness (events delivered / W x puts), the latency from a put's issue to
//! each delivery, the latency from a put's issue to its *last* delivery (the fan-out latency, per put), and the
//! proxy memory each idle watcher costs (resident set before and after the watchers are created, before any put).
//!
//! The writer goes to etcd directly so that every target is compared on the watch path alone; each put's value
//! carries its sequence number, which maps a delivered event back to the instant its put was issued. Each watcher
//! must see the puts in order, once each: a put it sees again (or after a later one) counts as a duplicate, and
//! the watchers a put never reached count as missing deliveries.
//!
//! The run tells a [`FanoutMeter`] when measuring starts and ends: [`Meter`] for the side-by-side benchmark, or
//! one that meters a whole tree of proxies (`bench tree`).

use std::collections::{HashMap, HashSet};
use std::future::Future;
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

use super::fanout::PutDeliveries;
use super::recorder::{Latency, Recorder, Tally};
use crate::memory::{IdleWatcherMemory, RssReading};
use crate::meter::Meter;

/// How long all watchers may take to be created.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long deliveries may trail the last put before the missing ones count as lost.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long every watcher may take to receive the warm-up event.
const WARMUP_TIMEOUT: Duration = Duration::from_secs(60);
/// The sequence number the warm-up put carries: never one of the measured puts'.
const WARMUP_SEQ: u64 = u64::MAX;

/// Whoever meters the servers during a fan-out, told when each step of the run happens.
pub trait FanoutMeter: Sync {
    /// The proxy's resident set once settled, read before and after the watchers are created (None: not metered).
    fn settled_proxy_rss(&self) -> impl Future<Output = Option<RssReading>> + Send;
    /// Measuring begins: watchers created (and warmed up, if asked), the first put is next.
    fn start(&self) -> impl Future<Output = ()> + Send;
    /// Halfway through the puts: the load is in place.
    fn in_place(&self) -> impl Future<Output = ()> + Send;
    /// Measuring ends: every delivery arrived, or the drain timed out.
    fn end(&self) -> impl Future<Output = ()> + Send;
}

impl FanoutMeter for Meter {
    fn settled_proxy_rss(&self) -> impl Future<Output = Option<RssReading>> + Send {
        Meter::settled_proxy_rss(self)
    }

    fn start(&self) -> impl Future<Output = ()> + Send {
        Meter::start(self)
    }

    fn in_place(&self) -> impl Future<Output = ()> + Send {
        Meter::in_place(self)
    }

    async fn end(&self) {
        Meter::end(self).await;
    }
}

static RUN_SEQ: AtomicU64 = AtomicU64::new(0);

pub struct WatchFanout {
    pub watchers: usize,
    /// Watchers created on each Watch stream (the last stream may hold fewer).
    pub watchers_per_stream: usize,
    pub put_rate: f64,
    pub measured: Duration,
    pub value_size: usize,
    /// Where the target keeps keys in etcd: the proxies' `--namespace` (empty for direct etcd and without one);
    /// the writer, which goes to etcd itself, puts the watched key under it.
    pub etcd_prefix: Vec<u8>,
    /// Before measuring, one put every watcher must receive (bounded by a deadline), so the measured puts find every
    /// path through the target already carrying events.
    pub warmup_event: bool,
}

/// Deliveries against expectations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WatchStats {
    pub watchers: u64,
    pub watchers_created: u64,
    /// Client Watch streams the watchers were multiplexed on.
    #[serde(default)]
    pub streams: u64,
    /// Puts etcd acknowledged.
    pub puts: u64,
    /// `watchers x puts`.
    pub expected: u64,
    pub delivered: u64,
    /// `delivered / expected` (1.0 is complete; above 1.0 would mean duplicates).
    pub completeness: f64,
    /// Puts every created watcher received.
    #[serde(default)]
    pub puts_complete: u64,
    /// From a put's issue to its last delivery, over the complete puts.
    #[serde(default)]
    pub fanout: Option<Latency>,
    /// Watchers that received the warm-up event (None: the run had none).
    #[serde(default)]
    pub warmed: Option<u64>,
    /// Deliveries that never came: for each put issued, the created watchers it did not reach.
    #[serde(default)]
    pub missing: u64,
    /// Events a watcher received again, or after a later put's (etcd delivers one key's events in order, once).
    #[serde(default)]
    pub duplicates: u64,
    /// The proxy's resident set before and after the watchers were created (None for direct etcd).
    #[serde(default)]
    pub idle_memory: Option<IdleWatcherMemory>,
}

struct Shared {
    /// When put `seq` was issued; set by the writer before it sends the put.
    issued: Vec<OnceLock<Instant>>,
    created: AtomicUsize,
    /// Watchers that received the warm-up event.
    warmed: AtomicUsize,
    delivered: AtomicU64,
}

/// What one Watch stream's task records; read after the task is aborted.
struct StreamTally {
    /// Each watcher's first delivery of each put.
    latencies: Recorder,
    deliveries: PutDeliveries,
    duplicates: u64,
}

impl WatchFanout {
    /// Runs one fan-out through `channels` (to the target; Watch streams go to them in turn), with puts through
    /// `direct` (to etcd).
    pub async fn run(
        &self,
        channels: &[Channel],
        direct: Channel,
        meter: &impl FanoutMeter,
    ) -> (Tally, WatchStats) {
        let key = format!("bench/watch/{}", RUN_SEQ.fetch_add(1, Ordering::Relaxed)).into_bytes();
        let puts_planned = (self.put_rate * self.measured.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        let shared = Arc::new(Shared {
            issued: (0..puts_planned).map(|_| OnceLock::new()).collect(),
            created: AtomicUsize::new(0),
            warmed: AtomicUsize::new(0),
            delivered: AtomicU64::new(0),
        });
        let per_stream = self.watchers_per_stream.max(1);
        let stream_sizes: Vec<usize> = (0..self.watchers.div_ceil(per_stream))
            .map(|s| per_stream.min(self.watchers - s * per_stream))
            .collect();
        let tallies: Vec<Arc<Mutex<StreamTally>>> = stream_sizes
            .iter()
            .map(|_| {
                Arc::new(Mutex::new(StreamTally {
                    latencies: Recorder::new(),
                    deliveries: PutDeliveries::new(puts_planned),
                    duplicates: 0,
                }))
            })
            .collect();

        let memory_before = meter.settled_proxy_rss().await;
        let tasks: Vec<_> = stream_sizes
            .iter()
            .zip(&tallies)
            .enumerate()
            .map(|(s, (&watchers, tally))| {
                tokio::spawn(watch_stream(
                    channels[s % channels.len()].clone(),
                    key.clone(),
                    watchers,
                    Arc::clone(&shared),
                    Arc::clone(tally),
                ))
            })
            .collect();
        let created_by = Instant::now() + CREATE_TIMEOUT;
        while shared.created.load(Ordering::Relaxed) < self.watchers && Instant::now() < created_by
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let watchers_created = shared.created.load(Ordering::Relaxed);
        let memory_after = meter.settled_proxy_rss().await;
        let mut writer_errors = Recorder::new();
        let warmed = if self.warmup_event {
            Some(
                self.warm_up(&direct, &key, &shared, watchers_created, &mut writer_errors)
                    .await,
            )
        } else {
            None
        };

        meter.start().await;
        let writer_start = Instant::now();
        let writer = async {
            let mut kv = KvClient::new(direct);
            let mut acknowledged = 0u64;
            for seq in 0..puts_planned {
                tokio::time::sleep_until(
                    writer_start + Duration::from_secs_f64(seq as f64 / self.put_rate),
                )
                .await;
                let _ = shared.issued[seq].set(Instant::now());
                let put = kv.put(self.put(&key, seq as u64));
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
        let mut deliveries = PutDeliveries::new(puts_planned);
        let mut duplicates = 0;
        for tally in &tallies {
            let tally = tally.lock().unwrap_or_else(|e| e.into_inner());
            total.merge(&tally.latencies);
            deliveries.merge(&tally.deliveries);
            duplicates += tally.duplicates;
        }
        for _ in watchers_created..self.watchers {
            total.failure("watcher not created in time");
        }
        let issued: Vec<Option<Instant>> = shared.issued.iter().map(|i| i.get().copied()).collect();
        let fanout = deliveries.summarize(&issued, watchers_created as u64);
        let delivered = shared.delivered.load(Ordering::Relaxed);
        let stats = WatchStats {
            watchers: self.watchers as u64,
            watchers_created: watchers_created as u64,
            streams: stream_sizes.len() as u64,
            puts,
            expected,
            delivered,
            completeness: if expected == 0 {
                0.0
            } else {
                delivered as f64 / expected as f64
            },
            puts_complete: fanout.complete,
            fanout: fanout.latency,
            warmed,
            missing: fanout.missing,
            duplicates,
            idle_memory: memory_before
                .zip(memory_after)
                .map(|(before, after)| IdleWatcherMemory {
                    before,
                    after,
                    watchers: watchers_created as u64,
                }),
        };
        (total.tally(window), stats)
    }

    /// The put of sequence number `seq` on `key`: its value starts with `seq`, padded to the value size.
    fn put(&self, key: &[u8], seq: u64) -> PutRequest {
        let mut value = seq.to_le_bytes().to_vec();
        value.resize(self.value_size.max(8), b'w');
        PutRequest {
            key: [&self.etcd_prefix[..], key].concat(),
            value,
            ..Default::default()
        }
    }

    /// Puts the warm-up event and waits (bounded by [`WARMUP_TIMEOUT`]) until each of the `created` watchers has
    /// it; returns how many have. A shortfall is recorded as a failure in `errors`.
    async fn warm_up(
        &self,
        direct: &Channel,
        key: &[u8],
        shared: &Shared,
        created: usize,
        errors: &mut Recorder,
    ) -> u64 {
        let mut kv = KvClient::new(direct.clone());
        let put = kv.put(self.put(key, WARMUP_SEQ));
        match tokio::time::timeout(super::REQUEST_TIMEOUT, put).await {
            Ok(Ok(_)) => {}
            Ok(Err(status)) => {
                errors.failure(format!(
                    "warm-up put: {:?}: {}",
                    status.code(),
                    status.message()
                ));
                return 0;
            }
            Err(_) => {
                errors.failure("warm-up put: no answer");
                return 0;
            }
        }
        let warmed_by = Instant::now() + WARMUP_TIMEOUT;
        while shared.warmed.load(Ordering::Relaxed) < created && Instant::now() < warmed_by {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let warmed = shared.warmed.load(Ordering::Relaxed);
        if warmed < created {
            errors.failure(format!(
                "{} of {created} watchers had not received the warm-up event after {WARMUP_TIMEOUT:?}",
                created - warmed
            ));
        }
        warmed as u64
    }
}

/// Each watcher's progress through the puts: the sequence number of the next put it has not seen.
#[derive(Debug, Default)]
struct Progress {
    next: HashMap<i64, u64>,
}

impl Progress {
    /// Whether this is watcher `watch_id`'s first sight of put `seq`: false when it saw that put, or a later one,
    /// before (etcd sends one key's events in order, once each).
    fn first_sight(&mut self, watch_id: i64, seq: u64) -> bool {
        let next = self.next.entry(watch_id).or_insert(0);
        if seq < *next {
            return false;
        }
        *next = seq + 1;
        true
    }
}

/// One client Watch stream: creates `watchers` watches on `key` (etcd answers the creates of a stream in order),
/// then records every event's delivery.
async fn watch_stream(
    channel: Channel,
    key: Vec<u8>,
    watchers: usize,
    shared: Arc<Shared>,
    tally: Arc<Mutex<StreamTally>>,
) {
    let lock = || tally.lock().unwrap_or_else(|e| e.into_inner());
    let fail = |what: String| lock().latencies.failure(what);
    // Room for every create, so queueing them never waits for the server.
    let (requests, outgoing) = mpsc::channel(watchers.max(1));
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key,
            ..Default::default()
        })),
    };
    // Queued before the call: a server may hold its response headers until the first message arrives.
    for _ in 0..watchers {
        if requests.send(create.clone()).await.is_err() {
            return fail("watch request stream closed".into());
        }
    }
    let mut stream = match WatchClient::new(channel)
        .watch(ReceiverStream::new(outgoing))
        .await
    {
        Ok(response) => response.into_inner(),
        Err(status) => return fail(format!("watch: {:?}: {}", status.code(), status.message())),
    };
    let mut ours = HashSet::with_capacity(watchers);
    let mut progress = Progress::default();
    let mut warmed = HashSet::with_capacity(watchers);
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return fail("watch stream ended".into()),
            Err(status) => {
                return fail(format!("watch: {:?}: {}", status.code(), status.message()));
            }
        };
        let received = Instant::now();
        if response.canceled {
            fail(format!(
                "watch {} canceled: {}",
                response.watch_id, response.cancel_reason
            ));
            ours.remove(&response.watch_id);
            continue;
        }
        if response.created {
            ours.insert(response.watch_id);
            shared.created.fetch_add(1, Ordering::Relaxed);
        }
        if response.events.is_empty() {
            continue;
        }
        if !ours.contains(&response.watch_id) {
            fail(format!(
                "events for watch {}, which this stream did not create",
                response.watch_id
            ));
            continue;
        }
        let mut tally = lock();
        for event in response.events {
            let Some(seq) = event
                .kv
                .as_ref()
                .and_then(|kv| kv.value.get(..8))
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
            else {
                tally.latencies.failure("event without a sequence number");
                continue;
            };
            if seq == WARMUP_SEQ {
                if warmed.insert(response.watch_id) {
                    shared.warmed.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.duplicates += 1;
                }
                continue;
            }
            if !progress.first_sight(response.watch_id, seq) {
                tally.duplicates += 1;
                shared.delivered.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let seq = usize::try_from(seq).unwrap_or(usize::MAX);
            match shared.issued.get(seq).and_then(OnceLock::get) {
                Some(issued) => {
                    tally
                        .latencies
                        .success(received.saturating_duration_since(*issued));
                    tally.deliveries.record(seq, received);
                    shared.delivered.fetch_add(1, Ordering::Relaxed);
                }
                None => tally
                    .latencies
                    .failure(format!("event for put {seq}, which was never issued")),
            }
        }
    }
    // `requests` lives until the task ends or is aborted, so the client never half-closes on its own.
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_seen_again_or_after_a_later_one_is_not_a_first_sight() {
        let mut progress = Progress::default();
        assert!(progress.first_sight(1, 0));
        assert!(
            progress.first_sight(1, 2),
            "a gap is missing deliveries, not a duplicate"
        );
        assert!(!progress.first_sight(1, 2), "seen again");
        assert!(!progress.first_sight(1, 1), "older than one already seen");
        assert!(progress.first_sight(2, 1), "watchers progress apart");
        assert!(progress.first_sight(1, 3));
    }
}
