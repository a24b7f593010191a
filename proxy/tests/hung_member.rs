//! A hung etcd member (SIGSTOP: its sockets accept, nothing answers) costs the proxy's clients nothing while
//! another member answers. Against a real 3-member cluster and the proxy binary with its default flags, under
//! read and write load (each call with a 3 s client deadline) and with a Watch and a LeaseKeepAlive stream open:
//!
//! - when the member the proxy is using hangs for 6 s, no read fails, the read p99 over the stall stays within one
//!   hedge delay plus a healthy member's answer, the proxy names another active endpoint within
//!   [`replacement_bound`], writes either succeed or get etcd's "outcome unknown" answer, acknowledged writes are
//!   readable, the watch misses nothing and the lease stays alive;
//! - when a member the proxy is not using (and not the raft leader) hangs for 6 s, the same holds, nothing fails at
//!   all and the active endpoint stays where it was.
//!
//! Every bound comes from the proxy's own constants (`proxy::upstream`), not from wall-clock guesses. The etcd
//! version is `TESTKIT_ETCD_VERSION` (as for every test of this package), so a run per version covers each one
//! the test kit has. The measured figures are printed (`--nocapture`) so they can be quoted.

mod support;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, MoveLeaderRequest,
    PutRequest, RangeRequest, StatusRequest, WatchCreateRequest, WatchRequest,
};
use proxy::upstream::{HANG_BOUND_MAX, HEDGE_DELAY_MAX, replacement_bound};
use support::grpc::{channel, status};
use support::metrics;
use testkit::{EtcdCluster, ProxyProcess, wait_for};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// The deadline every client call carries (grpc-timeout), as in the report.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the victim stays stopped: the fault itself, not a wait for anything.
const STALL: Duration = Duration::from_secs(6);
/// How often /metrics is read while the victim is stopped.
const METRICS_POLL: Duration = Duration::from_millis(10);
/// How often the lease is renewed through the proxy.
const KEEPALIVE_PERIOD: Duration = Duration::from_secs(1);
/// Deadline of every wait for a condition (setup, catching up after the stall); a hang guard, never a bound.
const PATIENCE: Duration = Duration::from_secs(60);
/// Calls of each kind that must succeed before the fault, so that the proxy has learnt its usual answer times.
const WARM_UP_CALLS: usize = 20;

/// The p99 read latency allowed over the stall. A read that waits on the hung member is sent to another member
/// after the hedge delay the proxy learnt (at most `HEDGE_DELAY_MAX`), and that member answers like any healthy
/// member: within `HANG_BOUND_MAX`, the proxy's own ceiling for a live member's answer (slower counts as hung). The
/// ceiling is far above what a loopback etcd takes, which leaves room for a debug build on a loaded 2-core
/// machine. Reads that arrive while the replacement is being chosen wait for the choice (at most
/// `proxy::upstream::CHOOSE_WAIT`, longer than the hedge delay) but they are at most one per loop, well inside
/// the 1% a p99 leaves out.
fn read_p99_bound() -> Duration {
    HEDGE_DELAY_MAX + HANG_BOUND_MAX
}

/// The lease TTL: the longest a renewal can be held up when the proxy keeps its promises, rounded up to whole
/// seconds. The next renewal is sent one period after the last answer; if it waits on the hung member it is
/// re-sent once the endpoint is replaced (within `replacement_bound()`), and a healthy member answers within
/// `HANG_BOUND_MAX`. A keep-alive stream left behind on the hung member lets the lease expire.
fn lease_ttl() -> i64 {
    let held_up = KEEPALIVE_PERIOD + replacement_bound() + HANG_BOUND_MAX;
    held_up.as_secs() as i64 + 1
}

/// Only one scenario runs at a time in this binary: their latencies and timings are the thing measured, and two
/// clusters under load on the same two cores would measure each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_active_member_is_replaced_within_the_bound_and_costs_no_read() {
    hang_scenario(Victim::Active, "hung-active/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_follower_the_proxy_does_not_use_changes_nothing() {
    hang_scenario(Victim::Follower, "hung-follower/").await;
}

/// Which member is stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Victim {
    /// The member the proxy is using, made a raft follower first: a hung leader stalls every member's
    /// linearizable reads and writes until etcd elects another (its `--election-timeout`), which no proxy can
    /// hide; here only the proxy's part is measured.
    Active,
    /// A member that is neither the proxy's nor the raft leader.
    Follower,
}

async fn hang_scenario(victim: Victim, prefix: &'static str) {
    let _one_at_a_time = SERIAL.lock().await;
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 3, &[]).await;
    // Default flags: only the endpoints (and the listen address, which the kit adds).
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let through_proxy = channel(&proxy.addr()).await;
    let label = format!("etcd {} {victim:?}", binaries.version);

    // Leadership moves (if it must) before the load starts: during a transfer etcd drops proposals ("raft
    // proposal dropped"), which is etcd's answer to the move, not to the fault.
    settled(&proxy, &cluster, victim == Victim::Active).await;
    // The streams open before the load, so that every put is an event the watch must deliver.
    let watch = Watcher::open(through_proxy.clone(), prefix).await;
    let keeper = Keeper::start(through_proxy.clone()).await;
    let mut load = Load::start(&proxy.addr(), prefix).await;
    load.warm_up().await;
    // Still so under load (were the proxy to have moved onto the leader meanwhile, leadership moves again and
    // the puts it costs are reported as failures).
    let (active, leader) = settled(&proxy, &cluster, victim == Victim::Active).await;
    let stopped_index = match victim {
        Victim::Active => active,
        Victim::Follower => (0..cluster.len())
            .find(|&i| i != active && i != leader)
            .expect("3 members: one is neither active nor leader"),
    };
    let active_endpoint = cluster.endpoint(active);
    let hung_endpoint = cluster.endpoint(stopped_index);

    let stopped = Instant::now();
    cluster.pause(stopped_index);
    // A renewal in flight on the stopped member from the first moment: the keep-alive stream must leave it.
    // (The write loop does the same for the watch: every put is an event it must deliver.)
    keeper.renew_now();
    let seen = watch_active(&proxy, &active_endpoint, stopped, STALL).await;
    tokio::time::sleep_until(stopped + STALL).await;
    cluster.resume(stopped_index);
    let resumed = Instant::now();

    // After the stall: a write made now reaches the watcher, and the lease is still there.
    let marker = put_marker(&through_proxy, prefix).await;
    watch.wait_for_revision(marker).await;
    let ttl_left = keeper.ttl_left(&through_proxy).await;
    load.stop().await;
    let kept = keeper.stop().await;
    let calls = std::mem::take(&mut *load.calls.lock().unwrap());

    let stall = Stall { stopped, resumed };
    let slowest_event = watch.slowest_delivery(&calls);
    report(
        &label,
        &stall,
        &seen,
        &calls,
        &kept,
        ttl_left,
        slowest_event,
    );

    assert_no_read_failed(&calls);
    assert_read_p99_within_bound(&stall, &calls);
    match victim {
        Victim::Active => {
            assert_replaced_in_time(&seen, &hung_endpoint);
            assert_puts_failed_only_as_outcome_unknown(&stall, &seen, &calls);
        }
        Victim::Follower => {
            assert_active_unchanged(&seen, &active_endpoint);
            let failed: Vec<&Call> = calls.iter().filter(|c| c.result.is_err()).collect();
            assert!(
                failed.is_empty(),
                "calls failed although the proxy's member and the leader never hung: {failed:#?}"
            );
        }
    }
    let stored = stored_under(&through_proxy, prefix).await;
    assert_acknowledged_puts_readable(&calls, &stored);
    watch.assert_saw_exactly(&stored, marker);
    kept.assert_alive(ttl_left);
}

// --- The load: one linearizable read loop, one serializable read loop, one put loop ----------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Linearizable,
    Serializable,
    Put,
}

impl Op {
    fn is_read(self) -> bool {
        self != Op::Put
    }
}

#[derive(Debug)]
struct Call {
    op: Op,
    /// The key a put wrote (each put writes a fresh key); empty for reads.
    key: String,
    started: Instant,
    ended: Instant,
    result: Result<(), String>,
}

impl Call {
    fn latency(&self) -> Duration {
        self.ended - self.started
    }

    /// Whether the call was in flight at any moment of `[from, to]`.
    fn overlaps(&self, from: Instant, to: Instant) -> bool {
        self.started <= to && self.ended >= from
    }
}

struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// One loop per kind of call, each on a connection of its own, one call at a time.
    async fn start(proxy: &str, prefix: &'static str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for op in [Op::Linearizable, Op::Serializable, Op::Put] {
            let kv = KvClient::new(channel(proxy).await);
            tasks.push(tokio::spawn(call_loop(
                kv,
                op,
                prefix,
                stop.clone(),
                calls.clone(),
            )));
        }
        Self { stop, calls, tasks }
    }

    /// Waits until each loop has had calls answered: the proxy has then learnt how long reads and Status take.
    async fn warm_up(&self) {
        wait_for("the load to warm up", PATIENCE, || async {
            let calls = self.calls.lock().unwrap();
            let ok = |op| {
                calls
                    .iter()
                    .filter(|c| c.op == op && c.result.is_ok())
                    .count()
            };
            let counts = [Op::Linearizable, Op::Serializable, Op::Put].map(ok);
            if counts.iter().all(|&n| n >= WARM_UP_CALLS) {
                Ok(())
            } else {
                Err(format!(
                    "linearizable, serializable, put answered: {counts:?}"
                ))
            }
        })
        .await;
    }

    async fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks.drain(..) {
            tokio::time::timeout(PATIENCE, task)
                .await
                .expect("each loop's last call ends within its deadline")
                .expect("a load loop panicked");
        }
    }
}

async fn call_loop(
    mut kv: KvClient<Channel>,
    op: Op,
    prefix: &'static str,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
) {
    for i in 0u64.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let key = match op {
            Op::Put => format!("{prefix}{i:07}"),
            Op::Linearizable | Op::Serializable => String::new(),
        };
        let started = Instant::now();
        let result = match op {
            Op::Put => {
                let put = PutRequest {
                    key: key.clone().into_bytes(),
                    value: key.clone().into_bytes(),
                    ..Default::default()
                };
                outcome(kv.put(with_deadline(put))).await
            }
            Op::Linearizable | Op::Serializable => {
                let range = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix),
                    count_only: true,
                    serializable: op == Op::Serializable,
                    ..Default::default()
                };
                outcome(kv.range(with_deadline(range))).await
            }
        };
        let ended = Instant::now();
        calls.lock().unwrap().push(Call {
            op,
            key,
            started,
            ended,
            result,
        });
    }
}

/// `message` with the client deadline, sent as grpc-timeout: the proxy sees it and may use it, as etcd would.
fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CLIENT_TIMEOUT);
    request
}

/// A call's result as "Code: message"; no answer within the client deadline is a failure too (the client gave up).
async fn outcome<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<(), String> {
    match tokio::time::timeout(CLIENT_TIMEOUT, call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(refused)) => Err(status(&refused)),
        Err(_) => Err(format!("no answer within {CLIENT_TIMEOUT:?}")),
    }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

// --- The streams -------------------------------------------------------------------------------------------------

#[derive(Default)]
struct WatchSeen {
    /// (key, mod_revision, when it arrived) of every event, in the order delivered.
    events: Vec<(Vec<u8>, i64, Instant)>,
    /// How the stream failed, if it did (an error, a cancel, an end).
    failure: Option<String>,
}

/// A watcher on the load's prefix through the proxy, its events collected by a task.
struct Watcher {
    /// Held so that the client never half-closes the stream.
    _requests: mpsc::Sender<WatchRequest>,
    seen: Arc<Mutex<WatchSeen>>,
    _task: JoinHandle<()>,
}

impl Watcher {
    async fn open(through_proxy: Channel, prefix: &str) -> Self {
        let (requests, rx) = mpsc::channel(1);
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        };
        requests
            .send(WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(create)),
            })
            .await
            .expect("the watch request stream is open");
        let mut stream = WatchClient::new(through_proxy)
            .watch(ReceiverStream::new(rx))
            .await
            .unwrap_or_else(|e| panic!("open a watch through the proxy: {}", status(&e)))
            .into_inner();
        let created = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("the watch is created within the deadline")
            .expect("the watch stream is open")
            .unwrap_or_else(|e| panic!("create a watch through the proxy: {}", status(&e)));
        assert!(created.created, "first watch response: {created:?}");
        let seen = Arc::new(Mutex::new(WatchSeen::default()));
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let failure = loop {
                match stream.next().await {
                    Some(Ok(response)) if response.canceled => {
                        break format!("canceled: {response:?}");
                    }
                    Some(Ok(response)) => {
                        let arrived = Instant::now();
                        log.lock().unwrap().events.extend(
                            response
                                .events
                                .iter()
                                .filter_map(|e| e.kv.as_ref())
                                .map(|kv| (kv.key.to_vec(), kv.mod_revision, arrived)),
                        );
                    }
                    Some(Err(e)) => break format!("failed: {}", status(&e)),
                    None => break "ended".to_string(),
                }
            };
            log.lock().unwrap().failure = Some(failure);
        });
        Self {
            _requests: requests,
            seen,
            _task: task,
        }
    }

    /// Waits until the watch delivered an event at `revision` (or failed: the final check says how).
    async fn wait_for_revision(&self, revision: i64) {
        wait_for("the watch to deliver the marker", PATIENCE, || async {
            let seen = self.seen.lock().unwrap();
            let delivered = seen.events.iter().any(|(_, r, _)| *r == revision);
            if delivered || seen.failure.is_some() {
                Ok(())
            } else {
                Err(format!(
                    "{} events, the last at {:?}",
                    seen.events.len(),
                    seen.events.last().map(|(_, r, _)| r)
                ))
            }
        })
        .await;
    }

    /// The longest a put acknowledged through the proxy waited, after its acknowledgement, for its event.
    fn slowest_delivery(&self, calls: &[Call]) -> Duration {
        let seen = self.seen.lock().unwrap();
        let arrived: HashMap<&[u8], Instant> = seen
            .events
            .iter()
            .map(|(key, _, at)| (key.as_slice(), *at))
            .collect();
        calls
            .iter()
            .filter(|c| c.op == Op::Put && c.result.is_ok())
            .filter_map(|c| {
                Some(
                    arrived
                        .get(c.key.as_bytes())?
                        .saturating_duration_since(c.ended),
                )
            })
            .max()
            .unwrap_or_default()
    }

    /// The watch delivered exactly the writes etcd holds under the prefix, in revision order, once each, up to
    /// the marker: no gap across the stall and no duplicate.
    fn assert_saw_exactly(&self, stored: &[(Vec<u8>, i64)], marker: i64) {
        let seen = self.seen.lock().unwrap();
        assert!(
            seen.failure.is_none(),
            "the watch stream through the proxy {} after {} events",
            seen.failure.as_deref().unwrap_or_default(),
            seen.events.len()
        );
        let delivered: Vec<(&[u8], i64)> = seen
            .events
            .iter()
            .filter(|(_, r, _)| *r <= marker)
            .map(|(k, r, _)| (k.as_slice(), *r))
            .collect();
        let expected: Vec<(&[u8], i64)> = stored
            .iter()
            .filter(|(_, r)| *r <= marker)
            .map(|(k, r)| (k.as_slice(), *r))
            .collect();
        if delivered != expected {
            let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
            for (_, revision) in &delivered {
                *counts.entry(*revision).or_default() += 1;
            }
            let want: BTreeSet<i64> = expected.iter().map(|(_, r)| *r).collect();
            let missing: Vec<&i64> = want.iter().filter(|r| !counts.contains_key(r)).collect();
            let extra: Vec<(&i64, &usize)> = counts
                .iter()
                .filter(|(r, n)| !want.contains(r) || **n > 1)
                .collect();
            panic!(
                "the watch did not deliver exactly what etcd holds, in order ({} delivered, {} stored): missing \
                 revisions {missing:?}, unexpected or repeated (revision, times) {extra:?}",
                delivered.len(),
                expected.len(),
            );
        }
    }
}

#[derive(Debug, Default)]
struct KeptAlive {
    answers: usize,
    /// The longest a renewal waited for its answer.
    slowest: Duration,
    failure: Option<String>,
}

impl KeptAlive {
    fn assert_alive(&self, ttl_left: i64) {
        assert!(
            self.failure.is_none(),
            "the keep-alive stream through the proxy failed after {} answers: {}",
            self.answers,
            self.failure.as_deref().unwrap_or_default()
        );
        assert!(
            ttl_left > 0,
            "the lease (TTL {} s) expired: its renewals were held up longer than the proxy's bounds allow \
             (slowest answer {:?})",
            lease_ttl(),
            self.slowest
        );
    }
}

/// A lease granted through the proxy and renewed through it, on one keep-alive stream, every
/// [`KEEPALIVE_PERIOD`].
struct Keeper {
    lease: i64,
    stop: Arc<AtomicBool>,
    renew_now: Arc<Notify>,
    task: JoinHandle<KeptAlive>,
}

impl Keeper {
    async fn start(through_proxy: Channel) -> Self {
        let lease = LeaseClient::new(through_proxy.clone())
            .lease_grant(LeaseGrantRequest {
                ttl: lease_ttl(),
                id: 0,
            })
            .await
            .unwrap_or_else(|e| panic!("grant a lease through the proxy: {}", status(&e)))
            .into_inner()
            .id;
        let (requests, rx) = mpsc::channel(1);
        let mut answers = LeaseClient::new(through_proxy)
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
            .unwrap_or_else(|e| panic!("open a keep-alive stream: {}", status(&e)))
            .into_inner();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let renew_now = Arc::new(Notify::new());
        let asked = renew_now.clone();
        let task = tokio::spawn(async move {
            let mut kept = KeptAlive::default();
            while !stopping.load(Ordering::SeqCst) {
                if requests
                    .send(LeaseKeepAliveRequest { id: lease })
                    .await
                    .is_err()
                {
                    kept.failure = Some("the request stream closed".into());
                    break;
                }
                let sent = Instant::now();
                let answer = tokio::time::timeout(PATIENCE, answers.next()).await;
                kept.slowest = kept.slowest.max(sent.elapsed());
                kept.failure = match answer {
                    Ok(Some(Ok(a))) if a.ttl > 0 => None,
                    Ok(Some(Ok(a))) => Some(format!("answered TTL {}: the lease is gone", a.ttl)),
                    Ok(Some(Err(e))) => Some(format!("failed: {}", status(&e))),
                    Ok(None) => Some("ended".into()),
                    Err(_) => Some(format!("no answer within {PATIENCE:?}")),
                };
                if kept.failure.is_some() {
                    break;
                }
                kept.answers += 1;
                tokio::select! {
                    () = tokio::time::sleep(KEEPALIVE_PERIOD) => {}
                    () = asked.notified() => {}
                }
            }
            kept
        });
        Self {
            lease,
            stop,
            renew_now,
            task,
        }
    }

    /// Sends the next renewal now (or as soon as the one in flight is answered), instead of at its period.
    fn renew_now(&self) {
        self.renew_now.notify_one();
    }

    /// The lease's remaining TTL as etcd reports it through the proxy (0 or less: gone).
    async fn ttl_left(&self, through_proxy: &Channel) -> i64 {
        let request = LeaseTimeToLiveRequest {
            id: self.lease,
            keys: false,
        };
        LeaseClient::new(through_proxy.clone())
            .lease_time_to_live(with_deadline(request))
            .await
            .unwrap_or_else(|e| panic!("LeaseTimeToLive through the proxy: {}", status(&e)))
            .into_inner()
            .ttl
    }

    async fn stop(self) -> KeptAlive {
        self.stop.store(true, Ordering::SeqCst);
        tokio::time::timeout(PATIENCE, self.task)
            .await
            .expect("the keeper stops within the deadline")
            .expect("the keeper panicked")
    }
}

// --- The active endpoint and the leader -------------------------------------------------------------------------

/// What /metrics said about the active endpoint while the victim was stopped.
#[derive(Debug, Default)]
struct ActiveSeen {
    /// When another endpoint than the one active at the SIGSTOP was first named, as a window after the SIGSTOP:
    /// from the last poll sent that still named the old one (the change came later) to the first answer naming
    /// the new one (the change came earlier).
    replaced: Option<(Duration, Duration, String)>,
    /// Every distinct answer, in order ("none" when no single endpoint was active).
    states: Vec<String>,
    polls: usize,
    slowest_poll: Duration,
}

/// Reads /metrics every [`METRICS_POLL`] for `stall` after `stopped`, noting every endpoint named active and when
/// the one active before the stop (`before`) stopped being named.
async fn watch_active(
    proxy: &ProxyProcess,
    before: &str,
    stopped: Instant,
    stall: Duration,
) -> ActiveSeen {
    let mut seen = ActiveSeen::default();
    let mut still_old_sent = stopped;
    while stopped.elapsed() < stall {
        let sent = Instant::now();
        let text = proxy.metrics().await;
        let answered = Instant::now();
        seen.polls += 1;
        seen.slowest_poll = seen.slowest_poll.max(answered - sent);
        let active = metrics::active_endpoint(&text);
        let state = active.clone().unwrap_or_else(|| "none".into());
        if seen.states.last() != Some(&state) {
            seen.states.push(state);
        }
        match active {
            Some(now) if now != before && seen.replaced.is_none() => {
                seen.replaced = Some((still_old_sent - stopped, answered - stopped, now));
            }
            _ if seen.replaced.is_none() => still_old_sent = sent,
            _ => {}
        }
        tokio::time::sleep(METRICS_POLL).await;
    }
    seen
}

/// Index of the member whose endpoint /metrics names active.
async fn active_index(proxy: &ProxyProcess, cluster: &EtcdCluster) -> Result<usize, String> {
    let text = proxy.metrics().await;
    let active = metrics::active_endpoint(&text).ok_or("no single active endpoint in /metrics")?;
    (0..cluster.len())
        .find(|&i| cluster.endpoint(i) == active)
        .ok_or(format!("active endpoint {active} is not a member"))
}

/// Member ID of each member, and the leader's ID, which all must agree on.
async fn member_ids_and_leader(cluster: &EtcdCluster) -> Result<(Vec<u64>, u64), String> {
    let mut ids = Vec::new();
    let mut leaders = Vec::new();
    for endpoint in cluster.endpoints() {
        let answer = MaintenanceClient::new(channel(&endpoint).await)
            .status(with_deadline(StatusRequest {}))
            .await
            .map_err(|e| format!("status of {endpoint}: {}", status(&e)))?
            .into_inner();
        ids.push(answer.header.map_or(0, |h| h.member_id));
        leaders.push(answer.leader);
    }
    match leaders.as_slice() {
        [first, rest @ ..] if *first != 0 && rest.iter().all(|l| l == first) => Ok((ids, *first)),
        _ => Err(format!("members disagree on the leader: {leaders:?}")),
    }
}

/// The member the proxy uses and the raft leader, once neither has changed for [`replacement_bound`]: a change
/// the proxy had begun (say, on a Status answer without a leader while leadership moved) shows in /metrics within
/// that time. With `follower_active`, leadership is first moved away from the proxy's member if it had it (etcd's
/// MoveLeader, asked of the leader).
async fn settled(
    proxy: &ProxyProcess,
    cluster: &EtcdCluster,
    follower_active: bool,
) -> (usize, usize) {
    let since: Cell<Option<((usize, usize), Instant)>> = Cell::new(None);
    wait_for(
        "the proxy's member and the leader to settle",
        PATIENCE,
        || async {
            let active = active_index(proxy, cluster).await?;
            let (ids, leader_id) = member_ids_and_leader(cluster).await?;
            let leader = ids
                .iter()
                .position(|&id| id == leader_id)
                .ok_or("the leader is not a member")?;
            if follower_active && active == leader {
                since.set(None);
                let target = ids[(active + 1) % ids.len()];
                MaintenanceClient::new(channel(&cluster.endpoint(active)).await)
                    .move_leader(with_deadline(MoveLeaderRequest { target_id: target }))
                    .await
                    .map_err(|e| {
                        format!("move leadership away from member {active}: {}", status(&e))
                    })?;
                return Err(format!(
                    "member {active} was the leader; leadership moved to {target:x}"
                ));
            }
            match since.get() {
                Some((pair, at)) if pair == (active, leader) => {
                    if at.elapsed() >= replacement_bound() {
                        Ok(pair)
                    } else {
                        Err(format!(
                            "active {active}, leader {leader} since {:?}",
                            at.elapsed()
                        ))
                    }
                }
                _ => {
                    since.set(Some(((active, leader), Instant::now())));
                    Err(format!("active {active}, leader {leader}: new"))
                }
            }
        },
    )
    .await
}

// --- Writes after the stall, and what etcd holds -------------------------------------------------------------------

/// Puts a marker key under the prefix through the proxy (again after a failure: right after the resume the
/// cluster may still be settling) and returns its revision.
async fn put_marker(through_proxy: &Channel, prefix: &str) -> i64 {
    let key = format!("{prefix}~marker");
    wait_for(
        "a put through the proxy after the stall",
        PATIENCE,
        || async {
            let put = PutRequest {
                key: key.clone().into_bytes(),
                value: b"after the stall".to_vec(),
                ..Default::default()
            };
            KvClient::new(through_proxy.clone())
                .put(with_deadline(put))
                .await
                .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                .map_err(|e| status(&e))
        },
    )
    .await
}

/// Every (key, mod_revision) under the prefix, in revision order, read through the proxy.
async fn stored_under(through_proxy: &Channel, prefix: &str) -> Vec<(Vec<u8>, i64)> {
    let range = RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix),
        ..Default::default()
    };
    let mut stored: Vec<(Vec<u8>, i64)> = KvClient::new(through_proxy.clone())
        .range(with_deadline(range))
        .await
        .unwrap_or_else(|e| panic!("final range through the proxy: {}", status(&e)))
        .into_inner()
        .kvs
        .into_iter()
        .map(|kv| (kv.key.to_vec(), kv.mod_revision))
        .collect();
    stored.sort_by_key(|(_, revision)| *revision);
    stored
}

// --- Figures and assertions ----------------------------------------------------------------------------------------

struct Stall {
    stopped: Instant,
    resumed: Instant,
}

impl Stall {
    /// Reads of `op` in flight at any moment of the stall, with their latencies, sorted.
    fn read_latencies(&self, calls: &[Call], op: Op) -> Vec<Duration> {
        let mut latencies: Vec<Duration> = calls
            .iter()
            .filter(|c| c.op == op && c.overlaps(self.stopped, self.resumed))
            .map(Call::latency)
            .collect();
        latencies.sort();
        latencies
    }
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(
    label: &str,
    stall: &Stall,
    seen: &ActiveSeen,
    calls: &[Call],
    kept: &KeptAlive,
    ttl_left: i64,
    slowest_event: Duration,
) {
    eprintln!("hung_member [{label}]");
    match &seen.replaced {
        Some((after_at_least, after_at_most, to)) => eprintln!(
            "  active endpoint replaced by {to} between {after_at_least:?} and {after_at_most:?} after SIGSTOP \
             (bound: replacement_bound() = {:?})",
            replacement_bound()
        ),
        None => eprintln!("  active endpoint not replaced during the {STALL:?} stall"),
    }
    eprintln!(
        "  active endpoints named during the stall: {:?} ({} polls, slowest {:?})",
        seen.states, seen.polls, seen.slowest_poll
    );
    for op in [Op::Linearizable, Op::Serializable] {
        let during = stall.read_latencies(calls, op);
        let total = calls.iter().filter(|c| c.op == op).count();
        eprintln!(
            "  {op:?} reads: {total} in all, {} during the stall: p50 {:?}, p99 {:?}, max {:?} (p99 bound {:?})",
            during.len(),
            quantile(&during, 0.50),
            quantile(&during, 0.99),
            during.last().copied().unwrap_or_default(),
            read_p99_bound()
        );
    }
    let puts: Vec<&Call> = calls.iter().filter(|c| c.op == Op::Put).collect();
    let failed: Vec<String> = puts
        .iter()
        .filter_map(|c| {
            let why = c.result.as_ref().err()?;
            Some(format!(
                "{} ({:?} after SIGSTOP, took {:?}): {why}",
                c.key,
                c.started.saturating_duration_since(stall.stopped),
                c.latency()
            ))
        })
        .collect();
    eprintln!(
        "  puts: {} in all, {} failed {failed:#?}",
        puts.len(),
        failed.len()
    );
    eprintln!(
        "  keep-alive: {} answers, slowest {:?}, lease TTL {} s, {} s left after the stall; failure: {:?}",
        kept.answers,
        kept.slowest,
        lease_ttl(),
        ttl_left,
        kept.failure
    );
    eprintln!("  watch: slowest event after its put's acknowledgement {slowest_event:?}");
}

fn assert_no_read_failed(calls: &[Call]) {
    let failed: Vec<&Call> = calls
        .iter()
        .filter(|c| c.op.is_read() && c.result.is_err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} reads through the proxy failed: {failed:#?}",
        failed.len()
    );
}

fn assert_read_p99_within_bound(stall: &Stall, calls: &[Call]) {
    for op in [Op::Linearizable, Op::Serializable] {
        let during = stall.read_latencies(calls, op);
        assert!(!during.is_empty(), "no {op:?} read ran during the stall");
        let p99 = quantile(&during, 0.99);
        assert!(
            p99 <= read_p99_bound(),
            "{op:?} reads during the stall: p99 {p99:?} over HEDGE_DELAY_MAX + HANG_BOUND_MAX = {:?} ({} reads, \
             slowest {:?})",
            read_p99_bound(),
            during.len(),
            during.last()
        );
    }
}

/// The proxy named another endpoint within [`replacement_bound`] of the SIGSTOP, and never the hung one again
/// while it was stopped. The change is dated by the window [`ActiveSeen::replaced`] gives; the test fails only
/// when even the window's start is past the bound (the window is one poll wide, about 10 ms).
fn assert_replaced_in_time(seen: &ActiveSeen, hung: &str) {
    let Some((at_least, at_most, to)) = &seen.replaced else {
        panic!(
            "the proxy still named the hung endpoint {hung} active at the end of the {STALL:?} stall \
             (bound: {:?}); seen: {:?}",
            replacement_bound(),
            seen.states
        );
    };
    assert!(
        *at_least <= replacement_bound(),
        "the hung endpoint was replaced (by {to}) between {at_least:?} and {at_most:?} after SIGSTOP; \
         replacement_bound() is {:?}",
        replacement_bound()
    );
    let back = seen
        .states
        .iter()
        .skip_while(|s| s.as_str() != to.as_str())
        .any(|s| s.as_str() == hung);
    assert!(
        !back,
        "the proxy went back to the hung endpoint {hung} while it was stopped: {:?}",
        seen.states
    );
}

fn assert_active_unchanged(seen: &ActiveSeen, active: &str) {
    assert_eq!(
        seen.states,
        vec![active.to_string()],
        "a member the proxy does not use hung, and its active endpoint changed"
    );
}

/// Writes keep their rule: a put fails only with etcd's "outcome unknown" answer (Unavailable, "request timed
/// out"), never a client deadline, and only if it was in flight between the SIGSTOP and the replacement (a put
/// sent after the replacement goes to a healthy member).
fn assert_puts_failed_only_as_outcome_unknown(stall: &Stall, seen: &ActiveSeen, calls: &[Call]) {
    let replaced_by = seen
        .replaced
        .as_ref()
        .map_or(stall.resumed, |(_, at_most, _)| stall.stopped + *at_most);
    let wrong: Vec<&Call> = calls
        .iter()
        .filter(|c| c.op == Op::Put)
        .filter(|c| match &c.result {
            Ok(()) => false,
            Err(why) => {
                let outcome_unknown =
                    why.starts_with("Unavailable: ") && why.contains("request timed out");
                !outcome_unknown || !c.overlaps(stall.stopped, replaced_by)
            }
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "puts failed otherwise than with etcd's outcome-unknown answer while the hung member was active: \
         {wrong:#?}"
    );
}

/// Every put the proxy acknowledged is in etcd.
fn assert_acknowledged_puts_readable(calls: &[Call], stored: &[(Vec<u8>, i64)]) {
    let stored: HashMap<&[u8], i64> = stored.iter().map(|(k, r)| (k.as_slice(), *r)).collect();
    let missing: Vec<&str> = calls
        .iter()
        .filter(|c| c.op == Op::Put && c.result.is_ok())
        .filter(|c| !stored.contains_key(c.key.as_bytes()))
        .map(|c| c.key.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged puts not readable afterwards: {missing:?}"
    );
}
