//! Every call to etcd goes through here: the endpoint pool, the active endpoint, failure detection, failover,
//! probing of failed endpoints, and the retry policy of unary and streaming calls.
//!
//! One endpoint is active at a time (chosen at random from the seeded RNG at start). It serves every request until
//! a call on it fails in a way that says the endpoint cannot serve; then the proxy moves to another endpoint that
//! is believed up, and a probe task brings the failed one back when it answers again.

mod call;
pub mod codec;
mod forward;
pub mod identity;
pub mod outbound;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

pub use call::{BoxStream, Retry};
pub use forward::Forwarded;

use crate::config::{Config, Endpoint};
use crate::metrics::Metrics;
use crate::net::{Connector, Net};

/// First and largest pause between probes of a failed endpoint.
const PROBE_BACKOFF_START: Duration = Duration::from_millis(100);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long a read may keep being retried across endpoints when the client set no deadline.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// The HTTP/2 receive window of each upstream stream: what etcd may send on one stream ahead of the proxy's
/// relay, so what an answer stream whose client does not read (Snapshot, Observe) holds in the proxy at most.
/// (hyper's default, written out because the bound depends on it.)
pub const UPSTREAM_STREAM_WINDOW: u32 = 2 * 1024 * 1024;

/// The HTTP/2 receive window of each upstream connection, the largest HTTP/2 allows. All calls to an endpoint
/// share one connection, and h2 gives connection window back only when a stream's data is read: with a smaller
/// window, a few streams whose clients stop reading hold it all (hyper's default 5 MiB: three unread Snapshot
/// streams) and every other call to that endpoint, Watch and lease streams included, stalls. At this size a
/// stream is bounded by its own window alone, as in grpc-go, which returns connection window as data arrives.
const UPSTREAM_CONNECTION_WINDOW: u32 = (1 << 31) - 1;

struct Member {
    endpoint: Endpoint,
    channel: Channel,
    up: AtomicBool,
    probing: AtomicBool,
    /// It answered RangeStream with Unimplemented (etcd before 3.7) since it was last found down.
    lacks_range_stream: AtomicBool,
}

/// The etcd endpoints and which one serves.
pub struct Upstream {
    members: Vec<Member>,
    active: AtomicUsize,
    rng: Mutex<StdRng>,
    metrics: Metrics,
    /// Largest message the proxy sends to etcd.
    pub max_send_bytes: usize,
    /// Largest message the proxy accepts from etcd.
    pub max_recv_bytes: usize,
    dial_timeout: Duration,
    /// Becomes true when the proxy shuts down; running streams end then.
    shutdown: watch::Receiver<bool>,
}

impl Upstream {
    /// Builds one lazily connected channel per endpoint and picks the first active endpoint at random.
    pub fn new(
        config: &Config,
        net: Arc<dyn Net>,
        tls: Option<Arc<crate::tls::ClientTls>>,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let connector = Connector::with_tls(net, tls);
        let members: Vec<Member> = config
            .endpoints
            .iter()
            .map(|endpoint| {
                let channel =
                    tonic_endpoint(endpoint, config).connect_with_connector_lazy(connector.clone());
                Member {
                    endpoint: endpoint.clone(),
                    channel,
                    up: AtomicBool::new(true),
                    probing: AtomicBool::new(false),
                    lacks_range_stream: AtomicBool::new(false),
                }
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(config.seed);
        let active = rng.random_range(0..members.len());
        for (index, member) in members.iter().enumerate() {
            metrics
                .upstream_up
                .with_label_values(&[member.endpoint.authority()])
                .set(1);
            metrics
                .upstream_active
                .with_label_values(&[member.endpoint.authority()])
                .set(i64::from(index == active));
        }
        tracing::info!(endpoint = %members[active].endpoint, "active etcd endpoint chosen");
        Arc::new(Self {
            members,
            active: AtomicUsize::new(active),
            rng: Mutex::new(rng),
            metrics,
            max_send_bytes: config.max_send_bytes,
            max_recv_bytes: config.max_recv_bytes,
            dial_timeout: config.dial_timeout,
            shutdown,
        })
    }

    /// The active endpoint's index and channel.
    pub fn active(&self) -> (usize, Channel) {
        let index = self.active.load(Ordering::Acquire);
        (index, self.members[index].channel.clone())
    }

    /// Whether endpoint `index` is known not to serve RangeStream (see [`Upstream::note_lacks_range_stream`]).
    pub fn lacks_range_stream(&self, index: usize) -> bool {
        self.members[index]
            .lacks_range_stream
            .load(Ordering::Acquire)
    }

    /// Remembers that endpoint `index` answered RangeStream with Unimplemented. Forgotten when the endpoint is
    /// next found down and back: it may come back upgraded.
    pub fn note_lacks_range_stream(&self, index: usize) {
        self.members[index]
            .lacks_range_stream
            .store(true, Ordering::Release);
    }

    /// Becomes true when the proxy shuts down; streams end then (wait on it with [`shutting_down`]).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Number of configured endpoints.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: `Config` requires at least one endpoint.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// For a stream that requires a leader, at its start: etcd refuses such a stream at once, with
    /// Unavailable "no leader", when the member has no leader. The proxy asks the active member's Status (which
    /// answers without a leader) rather than sending `hasleader` itself, since a "no leader" answer to a call
    /// would count as an endpoint failure and be retried elsewhere.
    ///
    /// Status goes with the caller's `token`: with auth on, etcd 3.5.30 answers Status only to an admin (earlier
    /// versions to anyone). When etcd refuses to say for want of rights, the stream opens: the upstream stream
    /// requires a leader itself, so etcd still ends it, and the proxy its clients, when there is none.
    pub async fn require_leader(
        self: &Arc<Self>,
        token: Option<&str>,
    ) -> Result<(), tonic::Status> {
        let status = match self.status(token).await {
            Ok(status) => status,
            Err(refused) if crate::error::is_auth_refusal(&refused) => return Ok(()),
            Err(other) => return Err(other),
        };
        if status.leader == 0 {
            return Err(tonic::Status::unavailable(NO_LEADER));
        }
        Ok(())
    }

    /// The etcd version the active member reports, asked with `token`. With auth on, etcd 3.5.30 answers Status
    /// only to an admin: [`crate::error::is_auth_refusal`] tells that apart from a member that cannot answer.
    pub async fn version(self: &Arc<Self>, token: Option<&str>) -> Result<String, tonic::Status> {
        self.status(token).await.map(|s| s.version)
    }

    /// The active member's Status, asked with `token` (see [`Upstream::require_leader`] for why no `hasleader`).
    async fn status(
        self: &Arc<Self>,
        token: Option<&str>,
    ) -> Result<proto::etcdserverpb::StatusResponse, tonic::Status> {
        let mut request = tonic::Request::new(proto::etcdserverpb::StatusRequest {});
        if let Some(token) = token.and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        self.call(Retry::ReadOnly, path::STATUS, request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Records that a call on endpoint `index` failed because the endpoint cannot serve: marks it down, starts
    /// probing it, and if it was active, moves to another endpoint.
    pub fn report_failure(self: &Arc<Self>, index: usize) {
        let member = &self.members[index];
        if member.up.swap(false, Ordering::AcqRel) {
            tracing::warn!(endpoint = %member.endpoint, "etcd endpoint failed");
            self.metrics
                .upstream_up
                .with_label_values(&[member.endpoint.authority()])
                .set(0);
        }
        if !member.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(self.clone().probe(index));
        }
        if self.members.len() > 1 {
            let next = self.pick_replacement(index);
            if self
                .active
                .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.metrics.upstream_failovers.inc();
                self.metrics
                    .upstream_active
                    .with_label_values(&[member.endpoint.authority()])
                    .set(0);
                let replacement = &self.members[next].endpoint;
                self.metrics
                    .upstream_active
                    .with_label_values(&[replacement.authority()])
                    .set(1);
                tracing::warn!(from = %member.endpoint, to = %replacement, "failing over to another etcd endpoint");
            }
        }
    }

    /// A random endpoint believed up other than `failed`; if none is up, the next one in order.
    fn pick_replacement(&self, failed: usize) -> usize {
        let candidates: Vec<usize> = (0..self.members.len())
            .filter(|&i| i != failed && self.members[i].up.load(Ordering::Acquire))
            .collect();
        if candidates.is_empty() {
            return (failed + 1) % self.members.len();
        }
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        candidates[rng.random_range(0..candidates.len())]
    }

    /// Asks a failed endpoint for its status with growing pauses until it answers, then marks it up again.
    async fn probe(self: Arc<Self>, index: usize) {
        let member = &self.members[index];
        let mut backoff = PROBE_BACKOFF_START;
        let mut shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                // A probe must not outlive the proxy (and a fixed order keeps seeded runs reproducible).
                biased;
                _ = shutting_down(&mut shutdown) => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            let mut client = proto::etcdserverpb::maintenance_client::MaintenanceClient::new(
                member.channel.clone(),
            );
            let answered = match tokio::time::timeout(
                self.dial_timeout,
                client.status(proto::etcdserverpb::StatusRequest {}),
            )
            .await
            {
                Ok(Ok(_)) => true,
                Ok(Err(status)) => !crate::error::is_endpoint_failure(&status),
                Err(_elapsed) => false,
            };
            if answered {
                member.lacks_range_stream.store(false, Ordering::Release);
                member.up.store(true, Ordering::Release);
                member.probing.store(false, Ordering::Release);
                self.metrics
                    .upstream_up
                    .with_label_values(&[member.endpoint.authority()])
                    .set(1);
                tracing::info!(endpoint = %member.endpoint, "etcd endpoint is back");
                return;
            }
            backoff = (backoff * 2).min(PROBE_BACKOFF_MAX);
        }
    }
}

/// Paths of the calls the proxy makes itself.
pub mod path {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const RANGE_STREAM: &str = "/etcdserverpb.KV/RangeStream";
    pub const STATUS: &str = "/etcdserverpb.Maintenance/Status";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

/// etcd's answer to a call that requires a leader (`hasleader: true`) while the cluster has none.
pub const NO_LEADER: &str = "etcdserver: no leader";

/// Completes when `signal` turns true (the proxy shuts down); never if its sender is gone without that.
///
/// Unlike `wait_for` used directly in a `select!`, it holds no borrow of the channel's value when it completes, so
/// the futures that wait on it stay `Send`.
pub async fn shutting_down(signal: &mut watch::Receiver<bool>) {
    let sender_gone = signal.wait_for(|down| *down).await.is_err();
    if sender_gone {
        std::future::pending::<()>().await;
    }
}

fn tonic_endpoint(endpoint: &Endpoint, config: &Config) -> TonicEndpoint {
    // The authority was validated by `Endpoint::parse`, so it always forms a valid URI.
    let mut tonic = TonicEndpoint::from_shared(format!("http://{}", endpoint.authority()))
        .expect("validated endpoint forms a URI")
        .connect_timeout(config.dial_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
        .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW);
    if let Some(interval) = config.upstream_keepalive.interval {
        tonic = tonic
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(config.upstream_keepalive.timeout)
            .keep_alive_while_idle(config.upstream_keepalive.while_idle);
    }
    tonic
}
