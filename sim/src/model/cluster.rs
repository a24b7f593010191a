//! [`Cluster`]: the handle every member and the checkers share. It owns the store and the auth state behind locks, the identities
//! (cluster ID, member IDs, raft term), the seeded source of lease IDs, the virtual clock, a signal that wakes
//! watch streams whenever the store changes, the census of live watchers ([`WatchCensus`]), and the members'
//! processes as the faults leave them (crashed, hung, cut off from the others) with the leader a quorum of them
//! elects ([`super::process`], [`super::pause`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use proto::etcdserverpb::{Member, ResponseHeader};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use super::auth::{Access, Auth, Caller};
use super::census::{Registry, WatchCensus, WatchedRange};
use super::history::{Hang, History, Hold, StreamKind, StreamRecord};
use super::pause::{self, Leadership, Pause};
use super::store::Store;

/// etcd's default interval of progress notifications for watchers that asked for them.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10 * 60);

/// etcd's default election timeout: what a new leader adds to every lease's TTL ([`Store::promote_leases`]).
pub const ELECTION_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a raft request waits for a leader before etcd gives up: its default request timeout (5 s plus two
/// election timeouts of 1 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(7);

/// The model etcd cluster: one store served by several members. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

struct Shared {
    store: Mutex<Store>,
    /// Users, roles, whether auth is on, and each member's tokens.
    auth: Mutex<Auth>,
    lease_ids: Mutex<StdRng>,
    cluster_id: u64,
    members: Mutex<Vec<Member>>,
    raft_term: AtomicU64,
    /// Bumped after every change of the store (a revision, a compaction) or of who leads; watch streams and raft
    /// requests waiting for a leader wait on it.
    changed: watch::Sender<u64>,
    /// Origin of virtual time outside a turmoil simulation (tokio's clock, paused or not).
    epoch: tokio::time::Instant,
    /// The latest simulated time seen, in nanoseconds (0 until the cluster runs inside a simulation).
    last_sim_nanos: AtomicU64,
    progress_interval: Mutex<Duration>,
    /// The etcd version whose rules the model follows where versions differ, and which its Status reports.
    version: Mutex<&'static str>,
    /// Live watchers per Watch stream (see [`WatchCensus`]).
    census: Mutex<Registry>,
    /// Which members crashed, hang or are cut off from the others, and who leads.
    leadership: Mutex<Leadership>,
    /// Per member cut off from the others: the revision it had applied then (it applies nothing more until it
    /// joins them again).
    frozen: Mutex<Vec<Option<i64>>>,
    /// Per member: when it was stopped (hung); its connections and timers wait on it.
    pauses: Vec<watch::Sender<Pause>>,
    /// Per member: since when the proxy's link with it holds messages.
    held_since: Mutex<Vec<Option<Duration>>>,
}

impl Cluster {
    /// A cluster of `members` members (named `m0`, `m1`, ...) with identities and lease IDs drawn from `seed`.
    pub fn new(members: usize, seed: u64) -> Self {
        assert!(members > 0, "a cluster has at least one member");
        let mut rng = StdRng::seed_from_u64(seed);
        let cluster_id = rng.random::<u64>() | 1;
        let members: Vec<Member> = (0..members)
            .map(|i| Member {
                id: rng.random::<u64>() | 1,
                name: format!("m{i}"),
                peer_ur_ls: vec![format!("http://m{i}:2380")],
                client_ur_ls: vec![format!("http://m{i}:2379")],
                is_learner: false,
            })
            .collect();
        let lease_seed = rng.random::<u64>();
        let token_seed = rng.random::<u64>();
        let count = members.len();
        Self {
            shared: Arc::new(Shared {
                store: Mutex::new(Store::new()),
                auth: Mutex::new(Auth::new(count, token_seed)),
                lease_ids: Mutex::new(StdRng::seed_from_u64(lease_seed)),
                cluster_id,
                members: Mutex::new(members),
                raft_term: AtomicU64::new(2),
                changed: watch::Sender::new(0),
                epoch: tokio::time::Instant::now(),
                last_sim_nanos: AtomicU64::new(0),
                progress_interval: Mutex::new(DEFAULT_PROGRESS_INTERVAL),
                version: Mutex::new(super::MODEL_VERSION),
                census: Mutex::new(Registry::default()),
                leadership: Mutex::new(Leadership::new(count)),
                frozen: Mutex::new(vec![None; count]),
                pauses: pause::pause_signals(count),
                held_since: Mutex::new(vec![None; count]),
            }),
        }
    }

    /// Sets the client URLs a member advertises in MemberList (for a model served on real ports).
    pub fn set_client_urls(&self, member: usize, urls: Vec<String>) {
        lock(&self.shared.members)[member].client_ur_ls = urls;
    }

    /// Sets how often watchers with `progress_notify` get a progress notification.
    pub fn set_progress_interval(&self, interval: Duration) {
        *lock(&self.shared.progress_interval) = interval;
    }

    pub fn progress_interval(&self) -> Duration {
        *lock(&self.shared.progress_interval)
    }

    /// Makes the model follow etcd `version`'s rules where versions differ (and report it in Status), as the
    /// conformance suite does beside each etcd it compares the model with. Unset, it is [`super::MODEL_VERSION`].
    pub fn imitate(&self, version: &'static str) {
        *lock(&self.shared.version) = version;
    }

    /// The etcd version the model imitates.
    pub fn version(&self) -> &'static str {
        *lock(&self.shared.version)
    }

    /// Whether the imitated version is `at_least` or newer.
    pub fn imitates_at_least(&self, at_least: (u32, u32, u32)) -> bool {
        version_triple(self.version()) >= at_least
    }

    pub fn member_count(&self) -> usize {
        lock(&self.shared.members).len()
    }

    pub fn members(&self) -> Vec<Member> {
        lock(&self.shared.members).clone()
    }

    pub fn cluster_id(&self) -> u64 {
        self.shared.cluster_id
    }

    pub fn member_id(&self, member: usize) -> u64 {
        lock(&self.shared.members)[member].id
    }

    pub fn raft_term(&self) -> u64 {
        self.shared.raft_term.load(Ordering::Acquire)
    }

    /// A new term, as after a leader election.
    pub fn bump_term(&self) {
        self.shared.raft_term.fetch_add(1, Ordering::AcqRel);
    }

    /// The member that leads, if a quorum can elect one (see [`Leadership`]).
    pub fn leader(&self) -> Option<usize> {
        lock(&self.shared.leadership).leader()
    }

    /// The leader's member ID as Status reports it: 0 when there is none.
    pub fn leader_id(&self) -> u64 {
        self.leader().map_or(0, |leader| self.member_id(leader))
    }

    /// Member `member`'s process was killed (its host crashed): it cannot lead; it is no longer hung; it forgets
    /// every token.
    pub fn crashed(&self, member: usize) {
        lock(&self.shared.auth).forget_tokens(member);
        self.set_process(member, true, false);
    }

    /// Member `member`'s process started again.
    pub fn restarted(&self, member: usize) {
        self.set_process(member, false, false);
    }

    /// Member `member`'s process is stopped as by SIGSTOP: its connections stay open, it answers nothing and
    /// cannot lead.
    pub fn hang(&self, member: usize) {
        self.set_process(member, false, true);
    }

    /// The proxy's link with member `member` holds its messages from now on (the network does: the model is told
    /// so that the checkers know when what the member reads at the release was sent).
    pub fn link_held(&self, member: usize) {
        let now = self.now();
        lock(&self.shared.held_since)[member].get_or_insert(now);
    }

    /// The proxy's link with member `member` delivers what it held.
    pub fn link_released(&self, member: usize) {
        let now = self.now();
        if let Some(since) = lock(&self.shared.held_since)[member].take() {
            lock(&self.shared.store).history.holds.push(Hold {
                member,
                since,
                released: now,
            });
        }
    }

    /// Member `member`'s stopped process carries on (SIGCONT).
    pub fn resume(&self, member: usize) {
        self.set_process(member, false, false);
    }

    /// Whether member `member` is hung right now.
    pub fn is_hung(&self, member: usize) -> bool {
        self.shared.pauses[member].borrow().is_hung()
    }

    /// Member `member`'s pause signal: what [`super::process::WhileRunning`] and [`super::process::ProcessTimer`] wait on.
    pub fn pauses(&self, member: usize) -> watch::Receiver<Pause> {
        self.shared.pauses[member].subscribe()
    }

    /// Member `member` is cut off from the other members (the proxy and clients still reach it): it knows no
    /// leader, applies nothing new, and its raft requests wait for a leader; if it led, the others elect another.
    pub fn isolate(&self, member: usize) {
        let revision = lock(&self.shared.store).revision();
        lock(&self.shared.frozen)[member].get_or_insert(revision);
        self.change_leadership(|leadership| leadership.set_isolated(member, true));
    }

    /// Member `member` hears the others again: it catches up and knows the leader, if there is one.
    pub fn rejoin(&self, member: usize) {
        lock(&self.shared.frozen)[member] = None;
        self.change_leadership(|leadership| leadership.set_isolated(member, false));
    }

    /// Whether member `member` knows a leader.
    pub fn has_leader(&self, member: usize) -> bool {
        lock(&self.shared.leadership).has_leader(member)
    }

    /// The revision member `member` has applied when the store is at `store_revision`: the store's, unless the
    /// member is cut off from the others.
    pub fn applied_revision(&self, member: usize, store_revision: i64) -> i64 {
        lock(&self.shared.frozen)[member]
            .map_or(store_revision, |frozen| frozen.min(store_revision))
    }

    /// The lowest revision any member has applied when the store is at `store_revision`.
    pub fn stalest_applied_revision(&self, store_revision: i64) -> i64 {
        lock(&self.shared.frozen)
            .iter()
            .flatten()
            .fold(store_revision, |stalest, &frozen| stalest.min(frozen))
    }

    /// What a raft request (a write, a linearizable read, a lease call) does first: waits until member `member`
    /// knows a leader, for at most [`REQUEST_TIMEOUT`]. A caller that requires a leader (`hasleader: true`) is
    /// refused at once instead, as etcd's interceptor does.
    pub async fn wait_for_leader(
        &self,
        member: usize,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<(), tonic::Status> {
        let mut changed = self.subscribe();
        if self.has_leader(member) {
            return Ok(());
        }
        if metadata.get("hasleader").and_then(|v| v.to_str().ok()) == Some("true") {
            return Err(super::errors::no_leader());
        }
        let known = async {
            while changed.changed().await.is_ok() {
                if self.has_leader(member) {
                    return;
                }
            }
            std::future::pending::<()>().await;
        };
        tokio::time::timeout(REQUEST_TIMEOUT, known)
            .await
            .map_err(|_| super::errors::request_timed_out())
    }

    /// Applies a change of who can lead; wakes every waiter (raft requests, and watch streams: a member that
    /// joined again delivers what it missed).
    fn change_leadership(&self, change: impl FnOnce(&mut Leadership) -> bool) {
        let (elected, led) = {
            let mut leadership = lock(&self.shared.leadership);
            let elected = change(&mut leadership);
            (elected, leadership.leader().is_some())
        };
        if elected {
            self.bump_term();
            let now = self.now();
            lock(&self.shared.store).promote_leases(now, ELECTION_TIMEOUT);
        } else if !led {
            lock(&self.shared.store).pause_lease_expiry();
        }
        self.shared
            .changed
            .send_modify(|generation| *generation += 1);
    }

    fn set_process(&self, member: usize, crashed: bool, hung: bool) {
        let now = self.now();
        let mut ended = None;
        self.shared.pauses[member].send_if_modified(|pause| {
            let before = *pause;
            match hung {
                true => pause.hang(now),
                false => {
                    pause.resume(now);
                    ended = before.since;
                }
            }
            *pause != before
        });
        if let Some(since) = ended {
            lock(&self.shared.store).history.hangs.push(Hang {
                member,
                since,
                resumed: now,
            });
        }
        self.change_leadership(|leadership| leadership.set(member, crashed, hung));
    }

    /// The simulation's clock stands at `now`: for calls made between its steps (faults the world applies), which
    /// would otherwise see only the last simulated time some earlier call recorded, or before any, real time.
    pub fn sim_time_is(&self, now: Duration) {
        self.shared
            .last_sim_nanos
            .fetch_max(now.as_nanos() as u64, Ordering::AcqRel);
    }

    /// Virtual time: the simulation's clock inside turmoil, tokio's clock since creation elsewhere. Between the
    /// steps of a simulation (when the world tears hosts down, for example) the last simulated time is used, so
    /// that no real time ever leaks into a simulated history.
    pub fn now(&self) -> Duration {
        if let Some(now) = turmoil::sim_elapsed() {
            self.shared
                .last_sim_nanos
                .fetch_max(now.as_nanos() as u64, Ordering::AcqRel);
            return now;
        }
        match self.shared.last_sim_nanos.load(Ordering::Acquire) {
            0 => self.shared.epoch.elapsed(),
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Runs `f` on the store (after expiring due leases) and wakes the watch streams if it changed anything.
    pub fn with_store<R>(&self, f: impl FnOnce(&mut Store, Duration) -> R) -> R {
        let now = self.now();
        let mut store = lock(&self.shared.store);
        let before = (store.revision(), store.compacted());
        store.expire_leases(now);
        let result = f(&mut store, now);
        let after = (store.revision(), store.compacted());
        drop(store);
        if before != after {
            self.shared
                .changed
                .send_modify(|generation| *generation += 1);
        }
        result
    }

    /// Runs `f` on the auth state at the current time.
    pub fn with_auth<R>(&self, f: impl FnOnce(&mut Auth, Duration) -> R) -> R {
        let now = self.now();
        f(&mut lock(&self.shared.auth), now)
    }

    /// etcd's `--auth-token-ttl`: how long a member keeps a token nobody uses there.
    pub fn set_auth_token_ttl(&self, ttl: Duration) {
        lock(&self.shared.auth).set_token_ttl(ttl);
    }

    /// Who a request reaching member `member` with `metadata` comes from: the user of its token (`token`, or
    /// `authorization` as etcd's gateway sends it), refused if the member does not know the token.
    pub fn caller(
        &self,
        member: usize,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, tonic::Status> {
        let token = ["token", "authorization"]
            .into_iter()
            .find_map(|key| metadata.get(key).and_then(|v| v.to_str().ok()));
        self.with_auth(|auth, now| auth.caller(member, token, now))
    }

    /// Refuses a request reaching member `member` with `metadata` unless its caller may make every access of
    /// `wants` (each an access to `key`..`range_end`), as etcd's auth would.
    pub fn authorize(
        &self,
        member: usize,
        metadata: &tonic::metadata::MetadataMap,
        wants: &[(Access, &[u8], &[u8])],
    ) -> Result<Caller, tonic::Status> {
        let caller = self.caller(member, metadata)?;
        let auth = lock(&self.shared.auth);
        for (access, key, range_end) in wants {
            auth.check(&caller, *access, key, range_end)?;
        }
        Ok(caller)
    }

    /// Refuses a request reaching member `member` with `metadata` unless it comes from a user (when auth is on): no
    /// token is "user name is empty", as etcd 3.5.30's `requireAuthInfo` says.
    pub fn authorize_user(
        &self,
        member: usize,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, tonic::Status> {
        match self.caller(member, metadata)? {
            Caller::Nobody => Err(super::errors::user_empty()),
            caller => Ok(caller),
        }
    }

    /// Refuses a request reaching member `member` with `metadata` unless its caller has the root role (when auth is
    /// on), as etcd refuses its admin calls.
    pub fn authorize_admin(
        &self,
        member: usize,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Caller, tonic::Status> {
        let caller = self.caller(member, metadata)?;
        lock(&self.shared.auth).check_admin(&caller)?;
        Ok(caller)
    }

    /// A fresh lease ID from the seeded generator: positive and non-zero.
    pub fn fresh_lease_id(&self) -> i64 {
        let mut rng = lock(&self.shared.lease_ids);
        loop {
            let id = rng.random::<i64>() & i64::MAX;
            if id != 0 {
                return id;
            }
        }
    }

    /// A receiver that sees every change of the store.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    /// The response header a member sends at `revision`.
    pub fn header(&self, member: usize, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id(),
            member_id: self.member_id(member),
            revision,
            raft_term: self.raft_term(),
        }
    }

    /// Fills in a header that the store started (it knows only the revision).
    pub fn complete_header(&self, member: usize, header: &mut Option<ResponseHeader>) {
        let revision = header.as_ref().map_or(0, |h| h.revision);
        *header = Some(self.header(member, revision));
    }

    /// A snapshot of everything recorded so far.
    pub fn history(&self) -> History {
        lock(&self.shared.store).history.clone()
    }

    /// The live watchers of every member right now.
    pub fn watch_census(&self) -> WatchCensus {
        lock(&self.shared.census).snapshot()
    }

    /// Records that the proxy (the members' client) was restarted at `at`.
    pub fn proxy_restarted(&self, at: Duration) {
        lock(&self.shared.store).history.proxy_restarts.push(at);
    }

    /// Records that a client opened a stream; the returned guard records its end when dropped.
    pub fn open_stream(
        &self,
        member: usize,
        kind: StreamKind,
        connected_at: Option<Duration>,
    ) -> StreamGuard {
        let now = self.now();
        let index = {
            let mut store = lock(&self.shared.store);
            store.history.streams.push(StreamRecord {
                member,
                kind,
                opened_at: now,
                closed_at: None,
                connected_at,
                first_request_at: None,
                last_request_at: None,
            });
            store.history.streams.len() - 1
        };
        StreamGuard {
            cluster: self.clone(),
            member,
            index,
        }
    }
}

/// When the member accepted the connection a request came on (virtual time): an extension of every request, so
/// that the streams recorded in the history say which connection they came on ([`StreamRecord`]).
#[derive(Clone, Copy, Debug)]
pub struct ConnectedAt(pub Duration);

/// Marks a recorded stream closed when the member's stream task ends (normally, by error, or by a crash).
pub struct StreamGuard {
    cluster: Cluster,
    member: usize,
    index: usize,
}

impl StreamGuard {
    /// Records that a request arrived on the stream. One the member reads as it resumes from a hang was sent
    /// before, while it was stopped: it is dated at the hang's start (or the stream's opening, if later), so that a
    /// stream the proxy left during the hang does not look in use at the resume, beside the one it moved to.
    pub fn touch(&self) {
        let now = self.cluster.now();
        let mut store = lock(&self.cluster.shared.store);
        let at = store.history.arrived_by(self.member, now);
        let record = &mut store.history.streams[self.index];
        let at = at.max(record.opened_at);
        record.first_request_at.get_or_insert(at);
        record.last_request_at = Some(record.last_request_at.map_or(at, |last| last.max(at)));
    }

    /// Counts a watcher the member created on this stream in the census.
    pub fn watcher_added(&self, range: WatchedRange) {
        lock(&self.cluster.shared.census).added(self.member, self.index, range);
    }

    /// Removes a cancelled watcher of this stream from the census.
    pub fn watcher_removed(&self, range: &WatchedRange) {
        lock(&self.cluster.shared.census).removed(self.index, range);
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let now = self.cluster.now();
        if let Ok(mut store) = self.cluster.shared.store.lock() {
            store.history.streams[self.index].closed_at = Some(now);
        }
        // Whatever ends the stream (the client going away, a crash dropping the member's tasks) ends its watchers.
        lock(&self.cluster.shared.census).stream_ended(self.index);
    }
}

/// Completes once the member is told to stop (or its stop signal is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Locks, ignoring poisoning: a panic elsewhere already fails the run, and the checkers still want the history.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// "3.5.30" as (3, 5, 30); a part that is not a number counts as 0.
fn version_triple(version: &str) -> (u32, u32, u32) {
    let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next())
}
