//! One watch fan-out phase: N watchers of one key through the proxy, one watch per stream, the streams spread evenly
//! over C connections: over the gateway (`POST /v3/watch` on HTTP/2) or over gRPC (a tonic Watch stream), the
//! two transports measured the same way. Then a warm-up put every watcher must see, then P puts paced straight to
//! etcd, each value its sequence number; every watcher notes when each put's event reached it. Reported: etcd's
//! watchers added by the phase (its own gauge), the latency from each put's send to its arrival at each watcher
//! (N x P samples), the deliveries missing or repeated, and the CPU the proxy, etcd and this process used while
//! the puts were delivered.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{PutRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

use super::client::{self, JsonLines, b64};
use super::cpu::{CpuMeter, CpuUsed};
use crate::load::dial::Dialer;
use crate::load::recorder::{Latency, Recorder};
use crate::tree::etcd_gauges;

/// How long all watchers may take to be created, and every watcher to see the warm-up put.
const SETUP_DEADLINE: Duration = Duration::from_secs(60);
/// How long deliveries may trail the last put before the missing ones count as missed.
const DRAIN_DEADLINE: Duration = Duration::from_secs(30);
/// How long etcd may take to drop a phase's watchers once its clients are gone.
const RELEASE_DEADLINE: Duration = Duration::from_secs(30);
/// Errors kept per phase; the rest are only counted.
const ERROR_SAMPLES: usize = 5;

/// How the watchers reach the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// `POST /v3/watch` with a `create_request`, one per HTTP/2 stream.
    Gateway,
    /// A gRPC Watch stream (tonic) with one `WatchCreateRequest`.
    Grpc,
}

impl Transport {
    pub fn label(self) -> &'static str {
        match self {
            Transport::Gateway => "gateway (HTTP/2, JSON)",
            Transport::Grpc => "gRPC",
        }
    }
}

/// What one phase is to do.
#[derive(Clone, Debug)]
pub struct FanoutPlan {
    pub transport: Transport,
    pub watchers: usize,
    pub connections: usize,
    pub puts: usize,
    pub put_interval: Duration,
    /// The watched key; each phase has its own.
    pub key: Vec<u8>,
}

/// Where the phase runs.
pub struct Servers<'a> {
    pub proxy_addr: &'a str,
    pub etcd_addr: &'a str,
    /// A connection straight to etcd, for the puts.
    pub etcd: &'a Channel,
    pub cpu: &'a CpuMeter,
}

/// What one phase measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FanoutPhase {
    pub transport: Transport,
    pub watchers: usize,
    pub connections: usize,
    pub puts: usize,
    pub put_interval_ms: f64,
    /// Seconds from the first watch request to the last watcher's `created`.
    pub create_seconds: f64,
    /// etcd's `etcd_debugging_mvcc_watcher_total` before the phase's watchers, and the most added over it while
    /// they were in place (read once all were created and once after the puts).
    pub etcd_watchers_before: f64,
    pub etcd_watchers_added: f64,
    /// Watchers that saw the warm-up put.
    pub warmed: usize,
    /// `watchers x puts`.
    pub expected: u64,
    pub delivered: u64,
    pub missing: u64,
    /// Events a watcher saw again or out of order.
    pub duplicates: u64,
    /// Watch streams that failed (answered an error, ended, or carried something unreadable).
    pub stream_errors: u64,
    pub error_samples: Vec<String>,
    /// From a put's send to its event's arrival at a watcher, over every delivery.
    pub latency: Option<Latency>,
    /// Milliseconds from each put's send to its last delivery (index 0: the first measured put), 0 for a put no
    /// watcher received: whether the delay was there from the first put or built up put after put.
    #[serde(default)]
    pub last_delivery_ms_by_put: Vec<f64>,
    /// From the first measured put to the last delivery (or the drain deadline).
    pub window_seconds: f64,
    pub cpu: CpuUsed,
}

impl FanoutPhase {
    /// Whether every watcher saw every put exactly once, and no stream failed.
    pub fn complete(&self) -> bool {
        self.missing == 0
            && self.duplicates == 0
            && self.stream_errors == 0
            && self.delivered == self.expected
    }
}

/// What a watch stream carried, reduced to what the phase counts.
#[derive(Debug, PartialEq)]
enum Message {
    Created,
    /// The sequence numbers of the puts whose events came.
    Events(Vec<u64>),
}

/// A gateway watch message: `{"result": {...}}` with `created` or `events`, or an error.
fn gateway_message(value: &Value) -> Result<Message, String> {
    let Some(result) = value.get("result") else {
        return Err(format!("not a watch result: {value}"));
    };
    if result["canceled"] == true {
        return Err(format!("watch canceled: {value}"));
    }
    if result["created"] == true {
        return Ok(Message::Created);
    }
    let events = result["events"].as_array().map_or(&[][..], Vec::as_slice);
    events
        .iter()
        .map(|event| {
            let value = event["kv"]["value"]
                .as_str()
                .ok_or_else(|| format!("an event without a value: {event}"))?;
            sequence(&client::unb64(value)?)
        })
        .collect::<Result<_, _>>()
        .map(Message::Events)
}

/// A gRPC watch response, as [`gateway_message`] reads the gateway's.
fn grpc_message(response: &WatchResponse) -> Result<Message, String> {
    if response.canceled {
        return Err(format!("watch canceled: {}", response.cancel_reason));
    }
    if response.created {
        return Ok(Message::Created);
    }
    response
        .events
        .iter()
        .map(|event| {
            sequence(
                &event
                    .kv
                    .as_ref()
                    .map(|kv| kv.value.clone())
                    .unwrap_or_default(),
            )
        })
        .collect::<Result<_, _>>()
        .map(Message::Events)
}

/// A put's sequence number from its value.
fn sequence(value: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            format!(
                "a value that is no put's: {:?}",
                String::from_utf8_lossy(value)
            )
        })
}

/// One watcher's stream.
enum Source {
    Gateway(JsonLines),
    /// The request side is kept open: closing it would end the Watch stream.
    Grpc {
        stream: Streaming<WatchResponse>,
        _requests: mpsc::Sender<WatchRequest>,
    },
}

impl Source {
    async fn next(&mut self) -> Result<Message, String> {
        match self {
            Source::Gateway(lines) => match lines.next().await? {
                Some(value) => gateway_message(&value),
                None => Err("the watch answer ended".into()),
            },
            Source::Grpc { stream, .. } => match stream.message().await {
                Ok(Some(response)) => grpc_message(&response),
                Ok(None) => Err("the Watch stream ended".into()),
                Err(status) => Err(format!("{:?}: {}", status.code(), status.message())),
            },
        }
    }
}

/// When each put reached one watcher (index: sequence number; 0 is the warm-up put).
#[derive(Clone, Debug, PartialEq)]
struct Arrivals {
    at: Vec<Option<Instant>>,
    last_seq: Option<u64>,
    duplicates: u64,
    error: Option<String>,
}

impl Arrivals {
    fn new(puts: usize) -> Self {
        Self {
            at: vec![None; puts + 1],
            last_seq: None,
            duplicates: 0,
            error: None,
        }
    }

    /// Put `seq` arrived at `at`: its first arrival in order is kept; one seen again or after a later put is a
    /// duplicate (etcd delivers one key's events in order, once).
    fn record(&mut self, seq: u64, at: Instant) {
        let in_order = self.last_seq.is_none_or(|last| seq > last);
        match self.at.get_mut(seq as usize) {
            Some(slot @ None) if in_order => *slot = Some(at),
            Some(_) => self.duplicates += 1,
            None => {
                self.error
                    .get_or_insert_with(|| format!("an event of put {seq}, never made"));
            }
        }
        self.last_seq = Some(self.last_seq.map_or(seq, |last| last.max(seq)));
    }

    fn has_all(&self) -> bool {
        self.at.iter().all(Option::is_some)
    }
}

/// Reads one watcher's stream until it has every put, fails, or `stop` is raised.
async fn follow(
    mut source: Source,
    puts: usize,
    created: Arc<AtomicUsize>,
    warmed: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
) -> Arrivals {
    let mut arrivals = Arrivals::new(puts);
    let mut is_created = false;
    while !arrivals.has_all() {
        let message = tokio::select! {
            biased;
            _ = stop.changed() => break,
            message = source.next() => message,
        };
        let now = Instant::now();
        match message {
            Ok(Message::Created) if !is_created => {
                is_created = true;
                created.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Message::Created) => {
                arrivals.error = Some("created twice".into());
                break;
            }
            Ok(Message::Events(seqs)) => {
                for seq in seqs {
                    if seq == 0 && arrivals.at[0].is_none() {
                        warmed.fetch_add(1, Ordering::Relaxed);
                    }
                    arrivals.record(seq, now);
                }
            }
            Err(e) => {
                arrivals.error = Some(e);
                break;
            }
        }
    }
    arrivals
}

/// Opens every watcher of the plan and starts following it.
async fn open(
    plan: &FanoutPlan,
    proxy_addr: &str,
    created: &Arc<AtomicUsize>,
    warmed: &Arc<AtomicUsize>,
    stop: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<Arrivals>>, String> {
    let mut followers = Vec::with_capacity(plan.watchers);
    let per_connection = plan.watchers.div_ceil(plan.connections);
    let gateway_create = json!({"create_request": {"key": b64(&plan.key)}});
    for connection in 0..plan.connections {
        let streams = per_connection.min(plan.watchers - followers.len());
        let mut sources = Vec::with_capacity(streams);
        match plan.transport {
            Transport::Gateway => {
                let mut sender = client::http2(proxy_addr).await?;
                for _ in 0..streams {
                    let lines = JsonLines::open(&mut sender, "/v3/watch", &gateway_create)
                        .await
                        .map_err(|e| format!("connection {connection}: {e}"))?;
                    sources.push(Source::Gateway(lines));
                }
            }
            Transport::Grpc => {
                let channel = Dialer::new(proxy_addr, None).dial().await?;
                for _ in 0..streams {
                    let (requests, rx) = mpsc::channel(1);
                    let create = WatchRequest {
                        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                            key: plan.key.clone(),
                            ..Default::default()
                        })),
                    };
                    requests
                        .send(create)
                        .await
                        .map_err(|_| "the Watch request stream closed".to_string())?;
                    let stream = WatchClient::new(channel.clone())
                        .watch(ReceiverStream::new(rx))
                        .await
                        .map_err(|s| {
                            format!(
                                "connection {connection}: Watch: {:?}: {}",
                                s.code(),
                                s.message()
                            )
                        })?
                        .into_inner();
                    sources.push(Source::Grpc {
                        stream,
                        _requests: requests,
                    });
                }
            }
        }
        for source in sources {
            followers.push(tokio::spawn(follow(
                source,
                plan.puts,
                Arc::clone(created),
                Arc::clone(warmed),
                stop.clone(),
            )));
        }
    }
    Ok(followers)
}

async fn etcd_watchers(etcd_addr: &str) -> Result<f64, String> {
    etcd_gauges::read(etcd_addr).await.map(|g| g.watchers)
}

async fn put(kv: &mut KvClient<Channel>, key: &[u8], seq: u64) -> Result<(), String> {
    kv.put(PutRequest {
        key: key.to_vec(),
        value: seq.to_string().into_bytes(),
        ..Default::default()
    })
    .await
    .map(drop)
    .map_err(|s| format!("put {seq}: {:?}: {}", s.code(), s.message()))
}

/// Runs one phase; an error when it could not be set up or its puts failed. Every watcher is closed when it ends,
/// and it waits (bounded) for etcd to drop the phase's watchers, so the next phase starts from the same count.
pub async fn run(plan: &FanoutPlan, servers: &Servers<'_>) -> Result<FanoutPhase, String> {
    if plan.watchers == 0 || plan.connections == 0 || plan.puts == 0 {
        return Err("watchers, connections and puts must be at least 1".into());
    }
    let before = etcd_watchers(servers.etcd_addr).await?;
    let (created, warmed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (stop_tx, stop) = watch::channel(false);
    let opening = Instant::now();
    let followers = open(plan, servers.proxy_addr, &created, &warmed, &stop).await?;
    let n = plan.watchers;
    testkit::try_wait_for(SETUP_DEADLINE, || async {
        match created.load(Ordering::Relaxed) {
            c if c >= n => Ok(()),
            c => Err(format!(
                "{c} of {n} watchers created within {SETUP_DEADLINE:?}"
            )),
        }
    })
    .await?;
    let create_seconds = opening.elapsed().as_secs_f64();
    let mut added = etcd_watchers(servers.etcd_addr).await? - before;

    let mut kv = KvClient::new(servers.etcd.clone());
    put(&mut kv, &plan.key, 0).await?;
    // A watcher that never sees the warm-up put will miss the measured ones too; the tally says so.
    let _ = testkit::try_wait_for(SETUP_DEADLINE, || async {
        match warmed.load(Ordering::Relaxed) {
            w if w >= n => Ok(()),
            w => Err(format!("{w} of {n} warmed")),
        }
    })
    .await;
    let warmed_count = warmed.load(Ordering::Relaxed);

    let cpu_start = servers.cpu.read()?;
    let window_start = Instant::now();
    let mut sent = vec![window_start; plan.puts + 1];
    let mut pace = tokio::time::interval(plan.put_interval);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for (seq, sent_at) in sent.iter_mut().enumerate().skip(1) {
        pace.tick().await;
        *sent_at = Instant::now();
        put(&mut kv, &plan.key, seq as u64).await?;
    }
    let finished = || async {
        match followers.iter().filter(|f| !f.is_finished()).count() {
            0 => Ok(()),
            left => Err(left),
        }
    };
    let _ = testkit::try_wait_for(DRAIN_DEADLINE, || async {
        finished()
            .await
            .map_err(|left| format!("{left} watchers still waiting"))
    })
    .await;
    let window_seconds = window_start.elapsed().as_secs_f64();
    let cpu = servers.cpu.read()?.since(&cpu_start);
    added = added.max(etcd_watchers(servers.etcd_addr).await? - before);
    let _ = stop_tx.send(true);

    let mut phase = FanoutPhase {
        transport: plan.transport,
        watchers: n,
        connections: plan.connections,
        puts: plan.puts,
        put_interval_ms: plan.put_interval.as_secs_f64() * 1000.0,
        create_seconds,
        etcd_watchers_before: before,
        etcd_watchers_added: added,
        warmed: warmed_count,
        expected: (n * plan.puts) as u64,
        delivered: 0,
        missing: 0,
        duplicates: 0,
        stream_errors: 0,
        error_samples: Vec::new(),
        latency: None,
        last_delivery_ms_by_put: vec![0.0; plan.puts],
        window_seconds,
        cpu,
    };
    let mut latencies = Recorder::new();
    for follower in followers {
        let arrivals = follower
            .await
            .map_err(|e| format!("a watcher's task failed: {e}"))?;
        tally(&mut phase, &mut latencies, &arrivals, &sent);
    }
    phase.latency = latencies.tally(Duration::from_secs(1)).latency;

    // The watchers are gone (their tasks ended and dropped their streams and connections).
    let released = testkit::try_wait_for(RELEASE_DEADLINE, || async {
        match etcd_watchers(servers.etcd_addr).await? - before {
            left if left <= 0.0 => Ok(()),
            left => Err(format!("{left} of the phase's watchers still on etcd")),
        }
    })
    .await;
    if let Err(e) = released {
        eprintln!("gateway: after the {} phase: {e}", plan.transport.label());
    }
    Ok(phase)
}

/// Adds one watcher's arrivals of the measured puts (1..) to the phase.
fn tally(phase: &mut FanoutPhase, latencies: &mut Recorder, arrivals: &Arrivals, sent: &[Instant]) {
    for (seq, at) in arrivals.at.iter().enumerate().skip(1) {
        match at {
            Some(at) => {
                phase.delivered += 1;
                let latency = at.saturating_duration_since(sent[seq]);
                latencies.success(latency);
                if let Some(last) = phase.last_delivery_ms_by_put.get_mut(seq - 1) {
                    *last = last.max(latency.as_secs_f64() * 1000.0);
                }
            }
            None => phase.missing += 1,
        }
    }
    phase.duplicates += arrivals.duplicates;
    if let Some(error) = &arrivals.error {
        phase.stream_errors += 1;
        if phase.error_samples.len() < ERROR_SAMPLES {
            phase.error_samples.push(error.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::mvccpb::{Event, KeyValue};

    #[test]
    fn gateway_messages_read_created_events_and_errors() {
        let created = json!({"result": {"header": {"revision": "2"}, "created": true}});
        assert_eq!(gateway_message(&created), Ok(Message::Created));
        let events = json!({"result": {"events": [
            {"kv": {"key": b64(b"k"), "value": b64(b"7"), "mod_revision": "9"}},
            {"kv": {"key": b64(b"k"), "value": b64(b"8")}},
        ]}});
        assert_eq!(gateway_message(&events), Ok(Message::Events(vec![7, 8])));
        assert_eq!(
            gateway_message(&json!({"result": {"header": {}}})),
            Ok(Message::Events(vec![]))
        );
        assert!(gateway_message(&json!({"error": {"code": 5}})).is_err());
        assert!(gateway_message(&json!({"result": {"canceled": true}})).is_err());
        let foreign = json!({"result": {"events": [{"kv": {"value": b64(b"x")}}]}});
        assert!(gateway_message(&foreign).is_err());
    }

    #[test]
    fn grpc_messages_read_as_gateway_ones() {
        let created = WatchResponse {
            created: true,
            ..Default::default()
        };
        assert_eq!(grpc_message(&created), Ok(Message::Created));
        let event = |value: &str| Event {
            kv: Some(KeyValue {
                value: bytes::Bytes::copy_from_slice(value.as_bytes()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let events = WatchResponse {
            events: vec![event("3"), event("4")],
            ..Default::default()
        };
        assert_eq!(grpc_message(&events), Ok(Message::Events(vec![3, 4])));
        let canceled = WatchResponse {
            canceled: true,
            ..Default::default()
        };
        assert!(grpc_message(&canceled).is_err());
    }

    #[test]
    fn arrivals_keep_first_in_order_deliveries_and_count_the_rest_as_duplicates() {
        let t0 = Instant::now();
        let mut arrivals = Arrivals::new(3);
        for seq in [0, 1, 3, 2, 3] {
            arrivals.record(seq, t0);
        }
        assert_eq!(arrivals.duplicates, 2, "2 after 3, and 3 again");
        assert!(!arrivals.has_all(), "put 2 came out of order");
        arrivals.record(9, t0);
        assert!(arrivals.error.is_some(), "a put never made");
    }

    #[test]
    fn a_phase_tallies_every_watcher_and_put_and_is_complete_only_without_gaps() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let sent = [t0, t0, t0 + ms(10)];
        let mut phase = FanoutPhase {
            transport: Transport::Gateway,
            watchers: 2,
            connections: 1,
            puts: 2,
            put_interval_ms: 10.0,
            create_seconds: 0.0,
            etcd_watchers_before: 0.0,
            etcd_watchers_added: 1.0,
            warmed: 2,
            expected: 4,
            delivered: 0,
            missing: 0,
            duplicates: 0,
            stream_errors: 0,
            error_samples: Vec::new(),
            latency: None,
            last_delivery_ms_by_put: vec![0.0; 2],
            window_seconds: 1.0,
            cpu: CpuUsed::default(),
        };
        let mut latencies = Recorder::new();
        let mut full = Arrivals::new(2);
        for (seq, at) in [(0, t0), (1, t0 + ms(2)), (2, t0 + ms(14))] {
            full.record(seq, at);
        }
        tally(&mut phase, &mut latencies, &full, &sent);
        assert_eq!((phase.delivered, phase.missing), (2, 0));
        let mut short = Arrivals::new(2);
        short.record(1, t0 + ms(3));
        short.error = Some("the watch answer ended".into());
        tally(&mut phase, &mut latencies, &short, &sent);
        assert_eq!(
            (phase.delivered, phase.missing, phase.stream_errors),
            (3, 1, 1)
        );
        assert!(!phase.complete());
        let latency = latencies
            .tally(Duration::from_secs(1))
            .latency
            .expect("three");
        assert!((latency.max_ms - 4.0).abs() < 0.1, "{latency:?}");
        let last = &phase.last_delivery_ms_by_put;
        assert!(
            (last[0] - 3.0).abs() < 0.1 && (last[1] - 4.0).abs() < 0.1,
            "{last:?}"
        );
    }
}
