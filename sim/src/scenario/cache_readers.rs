//! The `cache` scenario: the proxy runs with the range cache on (`--range-cache-max-bytes=67108864`, 64 MiB,
//! [`RANGE_CACHE_MAX_BYTES`]; everything else as [`crate::world::proxy_config`] ships it, serializable ordering
//! on), readers repeat Range calls through it while others write on a few keys, members fail, and the history is
//! compacted under the cache's watchers.
//!
//! - [`READERS`] readers, each one client (its own connection) making one call at a time through the proxy:
//!   serializable Range calls of single keys, prefixes, open-ended ranges (`range_end = "\0"`), a span and the
//!   whole keyspace, plain (which fills the cache's copies) or with a limit, `count_only`, `keys_only`, sorts and
//!   revision filters (which the copies answer once filled); and about one in five linearizable (plain or limited,
//!   over three ranges only, so that readers often ask the very same thing at once). After the faults and the
//!   writes end, each reader reads every range linearizably, then twice serializably.
//! - Two writers straight on the members (puts, deletes, two-key txns, prefix deletes) and one through the proxy
//!   (puts, deletes, txns), until [`WRITES_UNTIL`]; every acknowledged write is logged for the linearizable check.
//! - A compactor compacts the model (KV Compact straight on a member) to a revision at most two behind the
//!   newest, every 200–500 ms while the readers run, so that the cache's watchers (resumed after a failover from
//!   their next revision) are overtaken by compactions.
//! - A scraper reads the proxy's own `/metrics` (HTTP/2 GET on the proxy's port, over the same dialer as the
//!   clients) every 250 ms and once after the readers are done, and sums `etcd_grpc_proxy_cache_hits_total` and
//!   `_misses_total` over proxy restarts ([`CacheMetrics::observe`]): a lower bound of the reads the cache answered.
//! - Faults: the shared profile (member crashes and restarts, hangs, partitions both ways and one way, held links,
//!   latency, proxy restarts), all healed at `QUIET_FROM`, plus one episode of slow proxy↔member links
//!   ([`slow_links`]).
//!
//! Checks: [`crate::check::cache`].

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Body as _;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::Channel;
use tower::ServiceExt;

use super::logs::now;
use super::writers::MemberClients;
use crate::check::cache::{AckedWrite, CacheMetrics, Minimums, ReadLog, ReadOutcome, describe};
use crate::fault::{Fault, FaultPlan, Scheduled};
use crate::model::Cluster;
use crate::topology::{Dialer, member_authority, proxy_authority};
use crate::trace::Trace;
use crate::world::{self, Settings, World};

/// `--range-cache-max-bytes`: 64 MiB, far more than the scenario's few keys need (nothing is evicted).
pub const RANGE_CACHE_MAX_BYTES: usize = 64 << 20;
/// Reader clients.
pub const READERS: usize = 3;
/// Writes and compactions end a little after the faults are healed.
pub const WRITES_UNTIL: Duration = Duration::from_millis(3800);
/// The random reads end here; then each reader reads every range once more (see the module's note).
pub const READS_UNTIL: Duration = Duration::from_millis(4400);
/// The deadline each call through the proxy carries, and how long its client waits at most.
const CALL_DEADLINE: Duration = Duration::from_secs(3);
const CALL_BOUND: Duration = Duration::from_secs(4);
/// How often the scraper reads `/metrics`.
const SCRAPE_EVERY: Duration = Duration::from_millis(250);

/// The least a run must have checked. Seeds 0..64 checked 112–203 serializable and 41–75 linearizable answers,
/// the cache answered 56–149 reads, and 7–13 compactions overlapped the reads (proxy at commits 9f99ab0 and
/// 1474de6).
pub const MINIMUMS: Minimums = Minimums {
    serializable: 100,
    linearizable: 20,
    cache_hits: 10,
    compactions: 3,
};

/// What the scenario's clients log for [`crate::check::cache`].
#[derive(Clone, Default)]
pub struct CacheLogs {
    reads: Arc<Mutex<Vec<ReadLog>>>,
    writes: Arc<Mutex<Vec<AckedWrite>>>,
    metrics: Arc<Mutex<Option<CacheMetrics>>>,
}

impl CacheLogs {
    fn push_read(&self, read: ReadLog) {
        self.reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(read);
    }

    fn push_write(&self, write: AckedWrite) {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(write);
    }

    pub fn reads(&self) -> Vec<ReadLog> {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn writes(&self) -> Vec<AckedWrite> {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The scraper's sums, once it is done (`None` if it never finished).
    pub fn metrics(&self) -> Option<CacheMetrics> {
        self.metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The world of this scenario: one proxy on [`crate::topology::PROXY_HOST`], [`world::proxy_config`] plus
/// `--range-cache-max-bytes` (and TLS when the settings carry it, as [`World::new`] does). Unless the settings
/// bring a plan of their own, the seed's plan gets one [`slow_links`] episode besides.
pub fn world<'a>(mut settings: Settings) -> World<'a> {
    if settings.plan.is_none() {
        let mut plan = FaultPlan::generate(settings.seed, &settings.faults);
        plan.faults
            .extend(slow_links(settings.seed, settings.members));
        // Stable: an episode's start stays before its end.
        plan.faults.sort_by_key(|scheduled| scheduled.at);
        settings.plan = Some(plan);
    }
    let mut config = world::proxy_config(settings.seed, settings.members);
    config.range_cache_max_bytes = RANGE_CACHE_MAX_BYTES;
    World::with_proxy(settings, config)
}

/// One episode in which every proxy↔member link is slow (100–200 ms each way, for 300–800 ms, starting between
/// 0.8 and 2.5 s): etcd's answers then reach the proxy long after etcd made them, so a read that arrives meanwhile
/// and is handed an answer made before it (an identical read already in flight) can miss a write acknowledged
/// before it started. The shared profile's latency (at most 50 ms on one link) seldom leaves room for that, and a
/// hedge to another member answers first. The clients' own links stay fast.
pub fn slow_links(seed: u64, members: usize) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x736c_6f77);
    let from = Duration::from_millis(rng.random_range(800..2500));
    let until = from + Duration::from_millis(rng.random_range(300..800));
    let latency = Duration::from_millis(rng.random_range(100..=200));
    let mut faults = Vec::new();
    for member in 0..members {
        faults.push(Scheduled {
            at: from,
            fault: Fault::Latency { member, latency },
        });
        faults.push(Scheduled {
            at: until,
            fault: Fault::Latency {
                member,
                latency: Duration::ZERO,
            },
        });
    }
    faults
}

/// The keys the writers write.
pub fn keys() -> Vec<Vec<u8>> {
    ["c/x/0", "c/x/1", "c/x/2", "c/y/0", "c/y/1", "c/z"]
        .into_iter()
        .map(|k| k.as_bytes().to_vec())
        .collect()
}

/// The ranges the readers read, `(key, range_end)`. The first three are the ones read linearizably too.
pub fn ranges() -> Vec<(&'static [u8], &'static [u8])> {
    vec![
        (b"c/x/", b"c/x0"),
        (b"c/y/", b"\0"),
        (b"c/x/1", b""),
        (b"c/y/", b"c/y0"),
        (b"c/", b"c0"),
        (b"\0", b"\0"),
        (b"c/x/1", b"c/y/1"),
        (b"c/z", b""),
        // A key no one writes: an empty range.
        (b"c/q", b""),
    ]
}

/// The prefixes the writers delete whole now and then.
const DELETED_PREFIXES: [(&[u8], &[u8]); 2] = [(b"c/x/", b"c/x0"), (b"c/y/", b"c/y0")];

/// Adds the readers, writers, compactor and scraper; returns where they log.
pub fn build_cache(world: &mut World<'_>, rng: &mut StdRng, members: usize) -> CacheLogs {
    let logs = CacheLogs::default();
    let done = Arc::new(watch::Sender::new(0usize));
    for reader in 0..READERS {
        let (seed, logs, trace, dialer) = (
            rng.random(),
            logs.clone(),
            world.trace.clone(),
            world.dialer(),
        );
        let done = done.clone();
        world.client(&format!("reader{reader}"), async move {
            read_until_done(format!("reader{reader}"), seed, dialer, &logs, &trace).await;
            done.send_modify(|finished| *finished += 1);
            Ok(())
        });
    }
    for writer in 0..2 {
        let (seed, logs, trace, dialer) = (
            rng.random(),
            logs.clone(),
            world.trace.clone(),
            world.dialer(),
        );
        world.client(&format!("writer{writer}"), async move {
            let members = MemberClients::new(members, &dialer);
            direct_writer(format!("writer{writer}"), seed, members, &logs, &trace).await;
            Ok(())
        });
    }
    let (seed, logs_, trace, dialer) = (
        rng.random(),
        logs.clone(),
        world.trace.clone(),
        world.dialer(),
    );
    world.client("proxy-writer", async move {
        proxy_writer("proxy-writer".into(), seed, dialer, &logs_, &trace).await;
        Ok(())
    });
    let (seed, cluster, trace, dialer) = (
        rng.random(),
        world.cluster.clone(),
        world.trace.clone(),
        world.dialer(),
    );
    world.client("compactor", async move {
        compactor(seed, members, cluster, dialer, &trace).await;
        Ok(())
    });
    let (logs_, trace, dialer) = (logs.clone(), world.trace.clone(), world.dialer());
    let finished = done.subscribe();
    world.client("scraper", async move {
        scraper(dialer, &logs_, &trace, finished).await;
        Ok(())
    });
    logs
}

fn range_request(key: &[u8], range_end: &[u8], serializable: bool) -> RangeRequest {
    RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        serializable,
        ..Default::default()
    }
}

/// A linearizable read (one in five) or a serializable one with options.
fn random_request(rng: &mut StdRng) -> RangeRequest {
    let ranges = ranges();
    if rng.random_bool(0.2) {
        let (key, end) = ranges[rng.random_range(0..3)];
        let mut request = range_request(key, end, false);
        if rng.random_bool(0.3) {
            request.limit = 1;
        }
        return request;
    }
    let (key, end) = ranges[rng.random_range(0..ranges.len())];
    with_options(range_request(key, end, true), rng)
}

/// Plain four times in ten (those fill copies), otherwise with options the copies answer.
fn with_options(mut request: RangeRequest, rng: &mut StdRng) -> RangeRequest {
    let limit = |rng: &mut StdRng| match rng.random_bool(0.5) {
        true => rng.random_range(1..3),
        false => 0,
    };
    match rng.random_range(0..10) {
        0..=3 => {}
        4 => request.limit = rng.random_range(1..3),
        5 => {
            request.count_only = true;
            request.limit = limit(rng);
        }
        6 => {
            request.keys_only = true;
            request.limit = limit(rng);
        }
        7 => {
            request.sort_order = SortOrder::Descend as i32;
            request.limit = limit(rng);
        }
        8 => {
            let targets = [SortTarget::Mod, SortTarget::Create, SortTarget::Version];
            let orders = [SortOrder::None, SortOrder::Ascend, SortOrder::Descend];
            request.sort_target = targets[rng.random_range(0..targets.len())] as i32;
            request.sort_order = orders[rng.random_range(0..orders.len())] as i32;
            request.limit = limit(rng);
        }
        _ => match rng.random_bool(0.5) {
            true => request.min_mod_revision = rng.random_range(2..40),
            false => request.max_create_revision = rng.random_range(2..40),
        },
    }
    request
}

async fn read_until_done(name: String, seed: u64, dialer: Dialer, logs: &CacheLogs, trace: &Trace) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kv = KvClient::new(dialer.channel(&proxy_authority()));
    tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
    while now() < READS_UNTIL {
        tokio::time::sleep(Duration::from_millis(rng.random_range(5..60))).await;
        let request = random_request(&mut rng);
        read(&mut kv, &name, request, logs, trace).await;
    }
    // Quiet: no fault, no write. A linearizable read raises the proxy's floor to the newest revision; the copies
    // must catch up with it (or the reads go to etcd) and still answer as etcd would.
    for (key, end) in ranges() {
        read(&mut kv, &name, range_request(key, end, false), logs, trace).await;
        for _ in 0..2 {
            let request = with_options(range_request(key, end, true), &mut rng);
            read(&mut kv, &name, request, logs, trace).await;
        }
    }
}

async fn read(
    kv: &mut KvClient<Channel>,
    client: &str,
    request: RangeRequest,
    logs: &CacheLogs,
    trace: &Trace,
) {
    let started = now();
    let mut call = tonic::Request::new(request.clone());
    call.set_timeout(CALL_DEADLINE);
    let outcome = match tokio::time::timeout(CALL_BOUND, kv.range(call)).await {
        Ok(Ok(answer)) => ReadOutcome::Answer(answer.into_inner()),
        Ok(Err(status)) => ReadOutcome::Failed {
            code: status.code(),
            message: status.message().to_string(),
        },
        Err(_) => ReadOutcome::TimedOut,
    };
    let result = match &outcome {
        ReadOutcome::Answer(answer) => format!(
            "rev {} kvs {} count {}{}",
            answer.header.map_or(0, |h| h.revision),
            answer.kvs.len(),
            answer.count,
            if answer.more { " more" } else { "" }
        ),
        other => format!("{other:?}"),
    };
    trace.record(format!("{client}: {} -> {result}", describe(&request)));
    logs.push_read(ReadLog {
        client: client.to_string(),
        started,
        finished: now(),
        request,
        outcome,
    });
}

fn op(request: Op) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

fn put(key: &[u8], value: String) -> RequestOp {
    op(Op::RequestPut(PutRequest {
        key: key.to_vec(),
        value: value.into_bytes(),
        ..Default::default()
    }))
}

fn delete(key: &[u8], range_end: &[u8]) -> RequestOp {
    op(Op::RequestDeleteRange(DeleteRangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        ..Default::default()
    }))
}

/// Key ranges as `(key, range_end)`, a single key with an empty end.
type KeyRanges = Vec<(Vec<u8>, Vec<u8>)>;

/// A random write: its operations, the key ranges they write, and a name for the trace.
fn random_write(name: &str, counter: u64, rng: &mut StdRng) -> (Vec<RequestOp>, KeyRanges, String) {
    let keys = keys();
    let key = keys[rng.random_range(0..keys.len())].clone();
    let shown = String::from_utf8_lossy(&key).into_owned();
    match rng.random_range(0..100) {
        0..55 => (
            vec![put(&key, format!("{name}-{counter}"))],
            vec![(key, Vec::new())],
            format!("put {shown}"),
        ),
        55..75 => (
            vec![delete(&key, b"")],
            vec![(key, Vec::new())],
            format!("delete {shown}"),
        ),
        75..90 => {
            let other = keys[rng.random_range(0..keys.len())].clone();
            let mut ops = vec![put(&key, format!("{name}-{counter}a"))];
            let mut ranges = vec![(key, Vec::new())];
            if other != ranges[0].0 {
                ops.push(put(&other, format!("{name}-{counter}b")));
                ranges.push((other.clone(), Vec::new()));
            }
            (
                ops,
                ranges,
                format!("txn put {shown} and {}", String::from_utf8_lossy(&other)),
            )
        }
        _ => {
            let (prefix, end) = DELETED_PREFIXES[rng.random_range(0..DELETED_PREFIXES.len())];
            (
                vec![delete(prefix, end)],
                vec![(prefix.to_vec(), end.to_vec())],
                format!("delete prefix {}", String::from_utf8_lossy(prefix)),
            )
        }
    }
}

/// Writes straight to the members (as other etcd clients do) until [`WRITES_UNTIL`].
async fn direct_writer(
    name: String,
    seed: u64,
    mut members: MemberClients,
    logs: &CacheLogs,
    trace: &Trace,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut counter = 0u64;
    while now() < WRITES_UNTIL {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..120))).await;
        counter += 1;
        let (ops, ranges, what) = random_write(&name, counter, &mut rng);
        let started = now();
        let revision = members
            .txn(TxnRequest {
                success: ops,
                ..Default::default()
            })
            .await;
        trace.record(format!("{name}: {what} -> {revision:?}"));
        if let Some(revision) = revision {
            logs.push_write(AckedWrite {
                writer: name.clone(),
                what,
                ranges,
                revision,
                started,
                acked: now(),
            });
        }
    }
}

/// Writes through the proxy until [`WRITES_UNTIL`]: puts, deletes and txns, each with a deadline.
async fn proxy_writer(name: String, seed: u64, dialer: Dialer, logs: &CacheLogs, trace: &Trace) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut kv = KvClient::new(dialer.channel(&proxy_authority()));
    let mut counter = 0u64;
    while now() < WRITES_UNTIL {
        tokio::time::sleep(Duration::from_millis(rng.random_range(40..200))).await;
        counter += 1;
        let (mut ops, ranges, what) = random_write(&name, counter, &mut rng);
        let started = now();
        // A single operation goes as the call of its own kind, the others as a txn.
        let call = async {
            let header = match (ops.len(), ops[0].request.take()) {
                (1, Some(Op::RequestPut(put))) => {
                    kv.put(with_deadline(put)).await?.into_inner().header
                }
                (1, Some(Op::RequestDeleteRange(delete))) => {
                    kv.delete_range(with_deadline(delete))
                        .await?
                        .into_inner()
                        .header
                }
                (_, first) => {
                    ops[0].request = first;
                    let txn = TxnRequest {
                        success: ops,
                        ..Default::default()
                    };
                    kv.txn(with_deadline(txn)).await?.into_inner().header
                }
            };
            Ok::<_, tonic::Status>(header.map_or(0, |h| h.revision))
        };
        let outcome = tokio::time::timeout(CALL_BOUND, call).await;
        let shown = match &outcome {
            Ok(Ok(revision)) => format!("rev {revision}"),
            Ok(Err(status)) => format!("{:?} {}", status.code(), status.message()),
            Err(_) => "timed out".into(),
        };
        trace.record(format!("{name}: {what} through the proxy -> {shown}"));
        if let Ok(Ok(revision)) = outcome {
            logs.push_write(AckedWrite {
                writer: name.clone(),
                what,
                ranges,
                revision,
                started,
                acked: now(),
            });
        }
    }
}

fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

/// Compacts straight on a random member (the next ones if it fails), to at most two revisions behind the newest,
/// until [`WRITES_UNTIL`].
async fn compactor(seed: u64, members: usize, cluster: Cluster, dialer: Dialer, trace: &Trace) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clients: Vec<KvClient<Channel>> = (0..members)
        .map(|m| KvClient::new(dialer.channel(&member_authority(m))))
        .collect();
    while now() < WRITES_UNTIL {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..500))).await;
        let (newest, compacted) =
            cluster.with_store(|store, _| (store.revision(), store.compacted()));
        let revision = newest - rng.random_range(0..3);
        if revision <= compacted {
            continue;
        }
        // A member that fails (crashed, cut off, without a leader) makes the compactor try the next one, as a client
        // with every endpoint would: giving up at the first failure once let a faulty seed (12813) compact too
        // rarely for the run to check anything about compaction.
        let first = rng.random_range(0..members);
        for member in (0..members).map(|n| (first + n) % members) {
            let call = clients[member].compact(CompactionRequest {
                revision,
                physical: false,
            });
            let outcome = match tokio::time::timeout(Duration::from_millis(500), call).await {
                Ok(Ok(_)) => None,
                Ok(Err(status)) => Some(format!("{:?} {}", status.code(), status.message())),
                Err(_) => Some("timed out".into()),
            };
            trace.record(format!(
                "compactor: compact {revision} on m{member} -> {}",
                outcome.as_deref().unwrap_or("done")
            ));
            if outcome.is_none() {
                break;
            }
        }
    }
}

/// Reads the proxy's `/metrics` every [`SCRAPE_EVERY`] until every reader is done, then once more.
async fn scraper(
    dialer: Dialer,
    logs: &CacheLogs,
    trace: &Trace,
    mut readers_done: watch::Receiver<usize>,
) {
    let channel = dialer.channel(&proxy_authority());
    let mut metrics = CacheMetrics::default();
    let mut previous = None;
    loop {
        let last = *readers_done.borrow_and_update() >= READERS;
        if let Some(counts) = scrape(&channel).await {
            metrics.observe(previous, counts);
            previous = Some(counts);
        }
        if last {
            break;
        }
        tokio::time::sleep(SCRAPE_EVERY).await;
    }
    trace.record(format!(
        "scraper: {} reads of /proxy/metrics: cache hits {}, misses {}",
        metrics.scrapes, metrics.hits, metrics.misses
    ));
    *logs.metrics.lock().unwrap_or_else(|p| p.into_inner()) = Some(metrics);
}

/// One `GET /proxy/metrics` on the proxy's port (HTTP/2, as the proxy serves its admin routes next to gRPC): the
/// cache's hit and miss counters, or `None` if the proxy did not answer (it may be restarting).
async fn scrape(channel: &Channel) -> Option<(u64, u64)> {
    let exchange = async {
        let request = http::Request::get("/proxy/metrics")
            .body(tonic::body::Body::default())
            .ok()?;
        let response = channel.clone().oneshot(request).await.ok()?;
        if response.status() != http::StatusCode::OK {
            return None;
        }
        let mut body = response.into_body();
        let mut text = Vec::new();
        while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
            if let Ok(data) = frame.ok()?.into_data() {
                text.extend_from_slice(&data);
            }
        }
        let text = String::from_utf8(text).ok()?;
        Some((
            counter(&text, "etcd_grpc_proxy_cache_hits_total")?,
            counter(&text, "etcd_grpc_proxy_cache_misses_total")?,
        ))
    };
    tokio::time::timeout(Duration::from_millis(500), exchange)
        .await
        .ok()
        .flatten()
}

/// The value of an unlabelled counter in Prometheus' text format.
fn counter(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(name)?.strip_prefix(' ')?;
        value.trim().parse::<f64>().ok().map(|v| v as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_read_from_prometheus_text() {
        let text = "# HELP etcd_grpc_proxy_cache_hits_total x\n# TYPE etcd_grpc_proxy_cache_hits_total counter\n\
                    etcd_grpc_proxy_cache_hits_total 12\netcd_grpc_proxy_cache_hits_total_other 3\n";
        assert_eq!(counter(text, "etcd_grpc_proxy_cache_hits_total"), Some(12));
        assert_eq!(counter(text, "etcd_grpc_proxy_cache_misses_total"), None);
    }
}
