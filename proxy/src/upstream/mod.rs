//! Every call to etcd goes through here: the endpoint pool, the active endpoint, failure detection, failover,
//! probing of failed endpoints, and the retry policy of unary and streaming calls.
//!
//! One endpoint is active at a time (chosen at random from the seeded RNG at start). It serves every request until
//! it is found unable to serve: a call on it fails in a way that says so, or the heartbeat finds it hung or without
//! a leader. Its replacement is the first voting member to answer Status with a leader; a probe task brings the failed
//! one back when it answers again. Reads that wait longer than usual are sent to a second member as well.
//!
//! - [`call`]: unary and server-stream calls with the retry policy and hedged reads.
//! - [`choose`]: choosing the next active endpoint.
//! - [`leader`]: calls only the leader serves (MoveLeader), sent to its endpoint.
//! - [`heartbeat`]: noticing a hung or leaderless active member.
//! - [`http_get`]: GETs on etcd's client port (its `/metrics`, which the proxy relays).
//! - [`latency`]: the learnt answer times behind the heartbeat's and the hedge's bounds.
//! - [`ordering`]: serializable reads that never go back in revision.
//! - [`pool`], [`sync`]: the endpoints, and `--endpoints-auto-sync-interval`'s refresh of them from MemberList.
//! - [`forward`], [`codec`], [`outbound`], [`identity`]: what a call carries upstream.
//! - [`etcd_version`], [`versions`]: where etcd's versions differ, and the version each member said.

mod call;
mod choose;
pub mod codec;
pub mod etcd_version;
mod forward;
mod heartbeat;
mod http_get;
pub mod identity;
mod latency;
mod leader;
mod ordering;
pub mod outbound;
mod pool;
pub mod supervisor;
mod sync;
pub mod versions;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

pub use crate::error::OUTCOME_UNKNOWN;
pub use call::{BoxStream, HEDGE_DELAY_MAX, Retry};
pub use choose::CHOOSE_WAIT;
use choose::Health;
pub use forward::Forwarded;
pub use heartbeat::{HANG_BOUND_MAX, HEARTBEAT_INTERVAL, replacement_bound};
pub use http_get::HttpAnswer;
use latency::LatencyEstimate;
use ordering::RevisionFloor;
pub use ordering::{header_revision, is_serializable};
use pool::{Member, Pool};

use crate::config::{Config, Endpoint};
use crate::metrics::Metrics;
use crate::net::{Connector, Net};

/// First and largest pause between probes of a failed endpoint.
const PROBE_BACKOFF_START: Duration = Duration::from_millis(100);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long a read may keep being retried across endpoints when the client set no deadline.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(10);

/// How long the proxy waits for etcd's answer to a call of its own (Authenticate, a Status, a permission check, a
/// RangeStream page): a member that accepts and never answers (stopped, partitioned) must not hold up for good
/// what waits on such a call (with one endpoint nothing else abandons it). Past it the call ends `Unavailable`,
/// an endpoint failure, as a broken connection would. Far above any answer a live member gives: a bcrypt
/// comparison under load, a page of `--max-send-bytes`.
pub const OWN_CALL_DEADLINE: Duration = Duration::from_secs(10);

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

/// Which endpoint serves, and since when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ActiveState {
    index: usize,
    /// Counts the changes of the active endpoint: a failure seen by a call that started before the last change
    /// says nothing about the endpoint serving now.
    epoch: u64,
    /// A replacement is being chosen; calls wait for it (at most [`CHOOSE_WAIT`]) rather than go to the endpoint
    /// being left.
    choosing: bool,
}

/// The endpoint a call was made on: compare it with the active one to tell whether the endpoint changed since.
#[derive(Clone, Debug)]
pub struct Active {
    pub index: usize,
    epoch: u64,
    pub channel: Channel,
}

/// The etcd endpoints and which one serves.
pub struct Upstream {
    members: Pool,
    /// What new endpoints' channels connect with (`--endpoints-auto-sync-interval` adds endpoints).
    connector: Connector,
    channel_settings: ChannelSettings,
    /// Each endpoint gets a channel per worker.
    workers: crate::workers::Workers,
    /// TLS towards etcd is on: endpoints learnt from MemberList must be `https://` (or bare).
    tls_on: bool,
    active: watch::Sender<ActiveState>,
    rng: Mutex<StdRng>,
    metrics: Metrics,
    /// Largest message the proxy sends to etcd.
    pub max_send_bytes: usize,
    /// Largest message the proxy accepts from etcd.
    pub max_recv_bytes: usize,
    dial_timeout: Duration,
    /// How long the members take to answer Status: the heartbeat's measure of a hung member.
    status_latency: LatencyEstimate,
    /// How long reads take to be answered: the measure for hedging them.
    read_latency: LatencyEstimate,
    /// The highest revision returned, when serializable reads must not go back from it.
    revision_floor: Option<RevisionFloor>,
    /// Becomes true when the proxy shuts down; running streams end then.
    shutdown: watch::Receiver<bool>,
    /// `--enable-distributed-tracing`: makes the client span of each attempt (and the server span of each call).
    tracer: Option<Arc<crate::otel::Tracer>>,
    /// The version each member said in its Status answers.
    versions: versions::MemberVersions,
}

impl Upstream {
    /// Builds one lazily connected channel per endpoint, picks the first active endpoint at random, and starts the
    /// heartbeat that watches it.
    pub fn new(
        config: &Config,
        net: Arc<dyn Net>,
        tls: Option<Arc<crate::tls::ClientTls>>,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
        workers: &crate::workers::Workers,
    ) -> Arc<Self> {
        let tls_on = tls.is_some();
        // The collector is dialled through the same seam as etcd, in plaintext as etcd dials it.
        let tracer = config.distributed_tracing.as_ref().map(|settings| {
            crate::otel::Tracer::start(settings, config.seed, Connector::new(net.clone()), &metrics)
        });
        let connector = Connector::with_tls(net, tls);
        let channel_settings = ChannelSettings::of(config);
        let members: Vec<Member> = config
            .endpoints
            .iter()
            .map(|endpoint| {
                Member::new(
                    endpoint.clone(),
                    channel_settings.connect(endpoint, &connector, workers),
                )
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
        // With several endpoints the random pick is provisional until one answers with a leader (`choose_first`).
        let choosing = members.len() > 1;
        let upstream = Arc::new(Self {
            members: Pool::new(members),
            connector,
            channel_settings,
            workers: workers.clone(),
            tls_on,
            active: watch::Sender::new(ActiveState {
                index: active,
                epoch: 0,
                choosing,
            }),
            rng: Mutex::new(rng),
            metrics,
            max_send_bytes: config.max_send_bytes,
            max_recv_bytes: config.max_recv_bytes,
            dial_timeout: config.dial_timeout,
            status_latency: LatencyEstimate::default(),
            read_latency: LatencyEstimate::default(),
            revision_floor: config.serializable_ordering.then(RevisionFloor::default),
            shutdown,
            tracer,
            versions: versions::MemberVersions::default(),
        });
        if choosing {
            tokio::spawn(upstream.clone().choose_first(active));
        } else {
            tracing::info!(endpoint = %upstream.members.get(active).endpoint, "active etcd endpoint chosen");
        }
        tokio::spawn(upstream.clone().heartbeat());
        upstream
    }

    /// The tracer of `--enable-distributed-tracing`, if it is on.
    pub fn tracer(&self) -> Option<&Arc<crate::otel::Tracer>> {
        self.tracer.as_ref()
    }

    /// The active endpoint now, even while its replacement is being chosen.
    pub fn active(&self) -> Active {
        let state = *self.active.borrow();
        self.pick(state)
    }

    /// The endpoint to use for a new call: the active one once no replacement is being chosen (waiting at most
    /// [`CHOOSE_WAIT`] for the choice, so a call never goes to the endpoint just found failed when a better one is
    /// moments away).
    pub async fn serving(&self) -> Active {
        let state = *self.active.borrow();
        if !state.choosing {
            return self.pick(state);
        }
        let mut changes = self.active.subscribe();
        let settled = tokio::time::timeout(CHOOSE_WAIT, changes.wait_for(|s| !s.choosing)).await;
        drop(settled);
        self.active()
    }

    /// The highest revision a KV answer through the proxy carried, when serializable reads must not go back from
    /// it (`--experimental-serializable-ordering`); 0 otherwise.
    pub fn revision_floor(&self) -> i64 {
        self.revision_floor
            .as_ref()
            .map_or(0, RevisionFloor::highest)
    }

    /// Records a revision the proxy returned without asking etcd (an answer from the range cache), so that later
    /// serializable reads do not go back from it.
    pub fn returned_revision(&self, revision: i64) {
        if let Some(floor) = &self.revision_floor {
            floor.raise(revision);
        }
    }

    /// Records a revision etcd committed, learnt without a client's call (a Status with a leader): serializable
    /// reads do not go back from it, and from now on the floor can judge them (`ordering`).
    pub fn learnt_revision(&self, revision: i64) {
        if let Some(floor) = &self.revision_floor {
            floor.learn(revision);
        }
    }

    /// Completes when the active endpoint is no longer `pick`'s: a long-lived stream on `pick` moves at once, not
    /// at its next look, since a lease whose renewal waits on a member the proxy has left may expire meanwhile.
    pub async fn abandoned(&self, pick: &Active) {
        let mut changes = self.active.subscribe();
        if changes.wait_for(|s| s.index != pick.index).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn pick(&self, state: ActiveState) -> Active {
        Active {
            index: state.index,
            epoch: state.epoch,
            channel: self.members.get(state.index).channel(),
        }
    }

    /// Endpoint `index` as a pick of its own (a hedge, or a member asked besides the active one): a failure on
    /// it never replaces the active endpoint.
    fn member(&self, index: usize) -> Active {
        Active {
            index,
            epoch: u64::MAX,
            channel: self.members.get(index).channel(),
        }
    }

    /// Whether endpoint `index` is known not to serve RangeStream (see [`Upstream::note_lacks_range_stream`]).
    pub fn lacks_range_stream(&self, index: usize) -> bool {
        self.members
            .get(index)
            .lacks_range_stream
            .load(Ordering::Acquire)
    }

    /// Remembers that endpoint `index` answered RangeStream with Unimplemented. Forgotten when the endpoint is
    /// next found down and back: it may come back upgraded.
    pub fn note_lacks_range_stream(&self, index: usize) {
        self.members
            .get(index)
            .lacks_range_stream
            .store(true, Ordering::Release);
    }

    /// Becomes true when the proxy shuts down; streams end then (wait on it with [`shutting_down`]).
    pub fn shutdown_signal(&self) -> watch::Receiver<bool> {
        self.shutdown.clone()
    }

    /// Number of endpoints in use (configured, or learnt by `--endpoints-auto-sync-interval`).
    pub fn len(&self) -> usize {
        self.members.live().len()
    }

    /// Always false: `Config` requires at least one endpoint, and the last one is never retired.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The endpoints in use other than `index`.
    fn others(&self, index: usize) -> impl Iterator<Item = usize> {
        self.members.live().into_iter().filter(move |&i| i != index)
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

    /// The etcd version the member of `pick` reports, asked with `token` on that member's connection: what a
    /// stream opened there will meet (see [`versions`]).
    pub async fn version_on(
        &self,
        pick: &Active,
        token: Option<&str>,
    ) -> Result<String, tonic::Status> {
        let status = MaintenanceClient::new(pick.channel.clone())
            .max_decoding_message_size(self.max_recv_bytes)
            .status(status_request(token))
            .await?
            .into_inner();
        self.versions.record(&status);
        Ok(status.version)
    }

    /// The active member's Status, asked with `token` (see [`Upstream::require_leader`] for why no `hasleader`).
    async fn status(
        self: &Arc<Self>,
        token: Option<&str>,
    ) -> Result<proto::etcdserverpb::StatusResponse, tonic::Status> {
        let status = self
            .call(Retry::ReadOnly, path::STATUS, status_request(token))
            .await
            .map(tonic::Response::into_inner)?;
        self.versions.record(&status);
        Ok(status)
    }

    /// The version each member said in its Status answers (the heartbeat's, the probes', a stream's).
    pub fn member_versions(&self) -> &versions::MemberVersions {
        &self.versions
    }

    /// Records that a call on `pick` failed because its endpoint cannot serve: marks the endpoint down, starts
    /// probing it, and if it is still the active one, chooses another. A failure seen by a call that started
    /// before the active endpoint last changed does not move it again.
    pub fn report_failure(self: &Arc<Self>, pick: &Active) {
        self.mark_down(pick.index);
        self.replace(pick, Replace::Failed);
    }

    /// The member behind `pick` answers but has no leader: if another member has one, it becomes active. During
    /// an election no member has one, and nothing changes (no endpoint is marked down, no stream moves).
    pub fn seek_leader(self: &Arc<Self>, pick: &Active) {
        self.replace(pick, Replace::Leaderless);
    }

    /// Starts choosing a replacement for `pick`, unless it is no longer active or a choice is under way.
    fn replace(self: &Arc<Self>, pick: &Active, why: Replace) {
        if self.len() < 2 && !self.members.get(pick.index).retired() {
            return;
        }
        let claimed = self.active.send_if_modified(|state| {
            let current = state.index == pick.index && state.epoch == pick.epoch;
            if current && !state.choosing {
                state.choosing = true;
                true
            } else {
                false
            }
        });
        if claimed {
            tokio::spawn(self.clone().choose_replacement(pick.index, why));
        }
    }

    /// Marks endpoint `index` down and starts probing it.
    fn mark_down(self: &Arc<Self>, index: usize) {
        let member = self.members.get(index);
        if member.retired() {
            return;
        }
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
    }

    /// Makes endpoint `next` active in place of `from`, ending the choice.
    fn move_to(&self, from: usize, next: Option<usize>) {
        self.active.send_modify(|state| {
            state.choosing = false;
            if let Some(next) = next.filter(|&next| next != state.index) {
                state.index = next;
                state.epoch += 1;
            }
        });
        let Some(next) = next.filter(|&next| next != from) else {
            return;
        };
        let (old, new) = (self.members.get(from), self.members.get(next));
        self.metrics.upstream_failovers.inc();
        // A retired endpoint's labels are gone from /metrics (see `sync`), and stay gone.
        if !old.retired() {
            self.metrics
                .upstream_active
                .with_label_values(&[old.endpoint.authority()])
                .set(0);
        }
        let (old, new) = (&old.endpoint, &new.endpoint);
        self.metrics
            .upstream_active
            .with_label_values(&[new.authority()])
            .set(1);
        tracing::warn!(from = %old, to = %new, "failing over to another etcd endpoint");
    }

    /// A random endpoint believed up other than `failed`; if none is up, the next one in use after it.
    fn random_other(&self, failed: usize) -> usize {
        self.random_up_other(failed).unwrap_or_else(|| {
            let live = self.members.live();
            live.iter()
                .copied()
                .find(|&i| i > failed)
                .or(live.first().copied())
                .unwrap_or(failed)
        })
    }

    /// A random endpoint believed up other than `excluded`.
    fn random_up_other(&self, excluded: usize) -> Option<usize> {
        let candidates: Vec<usize> = self
            .others(excluded)
            .filter(|&i| self.members.get(i).usable())
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let mut rng = self
            .rng
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Some(candidates[rng.random_range(0..candidates.len())])
    }

    /// Asks a failed endpoint for its status with growing pauses until it answers with a leader as a voting member,
    /// then marks it up again. A learner (found out by its refusals) stays down until it is promoted: marked up, it
    /// would be hedged reads' second member, and refuse the linearizable ones.
    async fn probe(self: Arc<Self>, index: usize) {
        let member = self.members.get(index);
        let mut backoff = PROBE_BACKOFF_START;
        let mut shutdown = self.shutdown.clone();
        // A probe must not outlive the proxy.
        while sleep_unless_shutdown(&mut shutdown, backoff).await {
            if member.retired() {
                member.probing.store(false, Ordering::Release);
                return;
            }
            if self.member_status(index, self.dial_timeout).await == Health::Leader {
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

/// Why the active endpoint is being replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replace {
    /// It failed (a broken connection, no answer in time): any member that answers is better.
    Failed,
    /// It answers without a leader: only a member with a leader is better.
    Leaderless,
}

/// Paths of the calls the proxy makes itself.
pub mod path {
    pub const RANGE: &str = "/etcdserverpb.KV/Range";
    pub const PUT: &str = "/etcdserverpb.KV/Put";
    pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
    pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
    pub const RANGE_STREAM: &str = "/etcdserverpb.KV/RangeStream";
    pub const STATUS: &str = "/etcdserverpb.Maintenance/Status";
    pub const MEMBER_LIST: &str = "/etcdserverpb.Cluster/MemberList";
    pub const AUTHENTICATE: &str = "/etcdserverpb.Auth/Authenticate";
}

/// etcd's answer to a call that requires a leader (`hasleader: true`) while the cluster has none.
pub const NO_LEADER: &str = "etcdserver: no leader";

/// A Status request carrying `token`, if any.
fn status_request(token: Option<&str>) -> tonic::Request<proto::etcdserverpb::StatusRequest> {
    let mut request = tonic::Request::new(proto::etcdserverpb::StatusRequest {});
    if let Some(token) = token.and_then(|t| t.parse().ok()) {
        request.metadata_mut().insert("token", token);
    }
    request
}

/// Sleeps for `period`; false if the proxy began shutting down meanwhile (the periodic tasks then end).
async fn sleep_unless_shutdown(signal: &mut watch::Receiver<bool>, period: Duration) -> bool {
    tokio::select! {
        // A fixed order keeps seeded runs reproducible.
        biased;
        _ = shutting_down(signal) => false,
        _ = tokio::time::sleep(period) => true,
    }
}

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

/// How every channel to an endpoint is set up (`--dial-timeout`, `--dial-keepalive-*`, the windows).
#[derive(Clone, Copy)]
struct ChannelSettings {
    dial_timeout: Duration,
    keepalive: crate::config::KeepAlive,
}

impl ChannelSettings {
    fn of(config: &Config) -> Self {
        Self {
            dial_timeout: config.dial_timeout,
            keepalive: config.upstream_keepalive,
        }
    }

    /// Lazily connected channels to `endpoint`, one per worker, each with its tasks on its worker.
    fn connect(
        &self,
        endpoint: &Endpoint,
        connector: &Connector,
        workers: &crate::workers::Workers,
    ) -> Vec<Channel> {
        (0..workers.len())
            .map(|worker| self.connect_one(endpoint, connector, workers.executor(worker)))
            .collect()
    }

    fn connect_one(
        &self,
        endpoint: &Endpoint,
        connector: &Connector,
        executor: crate::workers::WorkerExecutor,
    ) -> Channel {
        // The authority was validated by `Endpoint::parse`, so it always forms a valid URI.
        let mut tonic = TonicEndpoint::from_shared(format!("http://{}", endpoint.authority()))
            .expect("validated endpoint forms a URI")
            .connect_timeout(self.dial_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
            .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
            // A call the proxy gives up (its client went) is reset towards etcd, and etcd's answer may already be
            // on its way. The HTTP/2 library remembers only its last few reset streams; a frame for an older one
            // counts against a limit (1024 by default) that is never reset over the connection's life, and past
            // it the library closes the connection itself (GOAWAY ENHANCE_YOUR_CALM), failing every call on it
            // with ResourceExhausted. Seen after clients cancelled a few thousand calls while a member hung. The
            // limit guards against a hostile peer; etcd is not one.
            .http2_max_local_error_reset_streams(None)
            .executor(executor);
        if let Some(interval) = self.keepalive.interval {
            tonic = tonic
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(self.keepalive.timeout)
                .keep_alive_while_idle(self.keepalive.while_idle);
        }
        tonic.connect_with_connector_lazy(connector.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{BoxFuture, Conn, Listener};
    use crate::workers::Workers;
    use proto::etcdserverpb::RangeRequest;
    use proto::etcdserverpb::kv_client::KvClient;

    /// A network where every dial is refused, recording which worker dialled (the `upstream` tests' network).
    #[derive(Default)]
    pub(super) struct Recording {
        pub(super) dialled_by: Arc<Mutex<Vec<usize>>>,
    }

    impl Net for Recording {
        fn bind(
            &self,
            _addr: std::net::SocketAddr,
        ) -> BoxFuture<'_, std::io::Result<Box<dyn Listener>>> {
            Box::pin(async { Err(std::io::ErrorKind::Unsupported.into()) })
        }

        fn connect(&self, _authority: String) -> BoxFuture<'static, std::io::Result<Conn>> {
            self.dialled_by
                .lock()
                .unwrap()
                .push(crate::workers::current());
            Box::pin(async { Err(std::io::ErrorKind::ConnectionRefused.into()) })
        }
    }

    /// An upstream of `workers` workers to one endpoint on a [`Recording`] network, and what it records.
    fn recorded(workers: &Workers) -> (Arc<Upstream>, Arc<Mutex<Vec<usize>>>, watch::Sender<bool>) {
        let dialled_by = Arc::new(Mutex::new(Vec::new()));
        let config = Config::new(
            vec![Endpoint::parse("etcd:2379").unwrap()],
            "127.0.0.1:0".parse().unwrap(),
            1,
        );
        let (stop, shutdown) = watch::channel(false);
        let upstream = Upstream::new(
            &config,
            Arc::new(Recording {
                dialled_by: dialled_by.clone(),
            }),
            None,
            Metrics::new(prometheus::Registry::new()).unwrap(),
            shutdown,
            workers,
        );
        (upstream, dialled_by, stop)
    }

    #[tokio::test]
    async fn each_worker_calls_etcd_on_a_connection_of_its_own() {
        let workers = Workers::on_current(2);
        let (upstream, dialled_by, _stop) = recorded(&workers);
        for worker in [1, 1] {
            let upstream = upstream.clone();
            let mut call = tokio::task::JoinSet::new();
            workers.spawn_into(&mut call, worker, async move {
                let channel = upstream.active().channel;
                KvClient::new(channel).range(RangeRequest::default()).await
            });
            let refused = call.join_next().await.unwrap().unwrap();
            assert!(refused.is_err(), "nothing answers here");
        }
        let by_worker_1 = dialled_by.lock().unwrap().clone();
        assert!(
            !by_worker_1.is_empty() && by_worker_1.iter().all(|&w| w == 1),
            "worker 1's calls are dialled by worker 1's connection: {by_worker_1:?}"
        );
        let mut call = tokio::task::JoinSet::new();
        let on_0 = upstream.clone();
        workers.spawn_into(&mut call, 0, async move {
            KvClient::new(on_0.active().channel)
                .range(RangeRequest::default())
                .await
        });
        assert!(call.join_next().await.unwrap().unwrap().is_err());
        let dialled = dialled_by.lock().unwrap().clone();
        assert_eq!(
            dialled[by_worker_1.len()..].first(),
            Some(&0),
            "worker 0 dials a connection of its own: {dialled:?}"
        );
    }

    #[tokio::test]
    async fn a_member_is_asked_for_its_status_on_every_workers_connection() {
        let workers = Workers::on_current(3);
        let (upstream, dialled_by, _stop) = recorded(&workers);
        let health = upstream.member_status(0, Duration::from_millis(500)).await;
        assert_eq!(health, choose::Health::Silent, "nothing answers here");
        let mut dialled = dialled_by.lock().unwrap().clone();
        dialled.sort_unstable();
        dialled.dedup();
        assert_eq!(
            dialled,
            [0, 1, 2],
            "the heartbeat's and the probes' question goes over each worker's connection"
        );
    }

    #[test]
    fn a_member_is_as_healthy_as_its_worst_connection() {
        use choose::Health::*;
        let worst = |answers: &[choose::Health]| answers.iter().copied().max();
        assert_eq!(worst(&[Leader, Leader]), Some(Leader));
        assert_eq!(worst(&[Leader, Silent]), Some(Silent));
        assert_eq!(worst(&[NoLeader, Leader]), Some(NoLeader));
        assert_eq!(worst(&[Learner, NoLeader]), Some(Learner));
        assert_eq!(worst(&[Silent, Learner]), Some(Silent));
    }
}
