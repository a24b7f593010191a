//! Client watchers through the proxy (tonic's generated Watch client), several multiplexed on one Watch stream the
//! way etcd's own clients do it: creates are pipelined and matched to their Created answers in order (client-chosen
//! watch IDs must come back as chosen), responses are told apart by watch ID, and when the stream fails every
//! watcher is re-created on a new stream from the revision after the last one it received.
//!
//! A watcher may be cancelled by its client at a chosen time and followed by another one (which may reuse its
//! client-chosen ID once the cancel is answered). A watcher is complete once it has seen the run's fence (see
//! [`Fence`]); the stream stays open, with every watcher still live, until the census (if the scenario takes one)
//! is done, so that the proxy is observed at rest with everything it serves.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_create_request::FilterType;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{WatchCancelRequest, WatchCreateRequest, WatchRequest, WatchResponse};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::login::{Login, Session, with_token};
use super::logs::now;
use crate::check::watch::{WatchEnd, WatchStart, WatcherLog};
use crate::model::{Cluster, WatchedRange};
use crate::trace::Trace;

/// Where a watcher asks to start, resolved against the model when it is first created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// No start revision: from the current revision on.
    Now,
    /// This revision.
    Revision(i64),
    /// This many revisions before the current one (at least 1): catch-up from history, maybe compacted.
    Behind(i64),
    /// This many revisions after the current one: a future start revision.
    Ahead(i64),
}

/// What to watch, and when.
#[derive(Clone, Debug)]
pub struct WatcherSpec {
    pub name: String,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub start: Start,
    pub prev_kv: bool,
    pub no_put: bool,
    pub no_delete: bool,
    pub progress_notify: bool,
    /// A client-chosen watch ID (`None`: the server assigns one).
    pub watch_id: Option<i64>,
    /// When the client creates it.
    pub create_at: Duration,
    /// When the client cancels it (`None`: never).
    pub cancel_at: Option<Duration>,
    /// The index (in the stream's plan) of a watcher that must have ended before this one is created.
    pub after: Option<usize>,
}

impl WatcherSpec {
    /// A watcher created at once and never cancelled.
    pub fn simple(name: String, key: &str, range_end: &str, start: Start) -> Self {
        Self {
            name,
            key: key.as_bytes().to_vec(),
            range_end: range_end.as_bytes().to_vec(),
            start,
            prev_kv: false,
            no_put: false,
            no_delete: false,
            progress_notify: false,
            watch_id: None,
            create_at: Duration::ZERO,
            cancel_at: None,
            after: None,
        }
    }
}

/// The end of the run's writes: a txn putting every key at `puts`, then (for watchers that filter puts out) possibly
/// one deleting them all at `last`. Nothing is written after `last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub puts: i64,
    pub last: i64,
}

impl Fence {
    /// The last revision a watcher can see an event at.
    pub fn target(&self, no_delete: bool) -> i64 {
        if no_delete { self.puts } else { self.last }
    }
}

/// The watchers the clients want live right now (created, not cancelled, not ended by the server), by name; the
/// census compares them with the model's upstream watchers.
pub type LiveWatchers = Arc<Mutex<BTreeMap<String, WatchedRange>>>;

/// What every stream of a scenario shares.
#[derive(Clone)]
pub struct StreamEnv {
    pub channel: Channel,
    pub cluster: Cluster,
    pub fence: watch::Receiver<Option<Fence>>,
    /// `true` once the census is taken (or when there is none): then complete watchers may go.
    pub released: watch::Receiver<bool>,
    pub live: LiveWatchers,
    pub give_up_at: Duration,
    pub trace: Trace,
    /// Under auth: the user the streams watch as (each stream carries its token; a token etcd no longer knows is
    /// replaced by a new one, and the watchers it refused are created again on a new stream).
    pub login: Option<Login>,
}

/// What one stream's watchers observed, and anything the stream itself saw wrong.
#[derive(Clone, Debug, Default)]
pub struct StreamLog {
    pub watchers: Vec<WatcherLog>,
    pub problems: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Not created yet.
    Waiting,
    /// Create sent on the current stream, not answered yet.
    Pending,
    Live(i64),
    /// Cancel sent, not answered yet.
    Cancelling(i64),
    Ended,
}

struct Slot {
    spec: WatcherSpec,
    log: WatcherLog,
    phase: Phase,
    /// The revision the watcher needs next; known once a Created response told where it starts.
    next: Option<i64>,
    /// The resolved start revision of its first create (`None` for [`Start::Now`]).
    first_start: Option<i64>,
    cancel_sent: bool,
}

impl Slot {
    /// Nothing more to wait for: complete through the fence, or ended.
    fn done(&self) -> bool {
        matches!(self.log.end, WatchEnd::CompleteThrough(_)) || self.phase == Phase::Ended
    }

    fn range(&self) -> WatchedRange {
        (self.spec.key.clone(), self.spec.range_end.clone())
    }
}

/// A create sent and not answered yet.
struct PendingCreate {
    slot: usize,
    requested_id: Option<i64>,
    /// The lowest revision a member had applied when the create was sent (for the lag of a watcher without start
    /// revision).
    applied: i64,
}

/// The stream's state between two upstream events.
struct Driver {
    name: String,
    slots: Vec<Slot>,
    env: StreamEnv,
    problems: Vec<String>,
    session: Option<Session>,
    /// etcd refused the stream's token: the stream is re-opened with a new one.
    token_refused: bool,
}

/// Runs one watcher alone on its own stream (created at once, never cancelled).
pub async fn run_watcher(spec: WatcherSpec, env: StreamEnv) -> WatcherLog {
    let name = spec.name.clone();
    let mut log = run_watch_stream(name, vec![spec], env).await;
    let mut watcher = log.watchers.remove(0);
    watcher.problems.extend(log.problems);
    watcher
}

/// Runs the watchers of `plan` multiplexed on one Watch stream (re-opened when it fails) until every one is
/// complete or ended and the census is done, or `give_up_at` passes.
pub async fn run_watch_stream(name: String, plan: Vec<WatcherSpec>, env: StreamEnv) -> StreamLog {
    let slots = plan
        .into_iter()
        .map(|spec| Slot {
            log: WatcherLog {
                name: spec.name.clone(),
                key: spec.key.clone(),
                range_end: spec.range_end.clone(),
                prev_kv: spec.prev_kv,
                no_put: spec.no_put,
                no_delete: spec.no_delete,
                caller: env.login.as_ref().map(|login| login.user.clone()),
                start: None,
                received: Vec::new(),
                received_at: Vec::new(),
                progress: Vec::new(),
                problems: Vec::new(),
                end: WatchEnd::Unconfirmed,
            },
            spec,
            phase: Phase::Waiting,
            next: None,
            first_start: None,
            cancel_sent: false,
        })
        .collect();
    let session = env.login.clone().map(Session::new);
    let mut driver = Driver {
        name,
        slots,
        env,
        problems: Vec::new(),
        session,
        token_refused: false,
    };
    driver.run().await;
    StreamLog {
        watchers: driver.slots.into_iter().map(|s| s.log).collect(),
        problems: driver.problems,
    }
}

impl Driver {
    async fn run(&mut self) {
        let mut client = WatchClient::new(self.env.channel.clone());
        let mut attempt = 0u32;
        while now() < self.env.give_up_at && !self.finished() {
            attempt += 1;
            let token = match &mut self.session {
                Some(session) => match session.token(&self.env.channel).await {
                    Some(token) => Some(token),
                    None => {
                        self.env
                            .trace
                            .record(format!("{}: authenticate failed", self.name));
                        tokio::time::sleep(backoff(attempt)).await;
                        continue;
                    }
                },
                None => None,
            };
            let (tx, rx) = mpsc::channel(1024);
            // Creates go out before the call is opened: the first request rides with the stream's opening.
            let mut pending = VecDeque::new();
            let mut by_id = BTreeMap::new();
            if !self.create_due(&tx, &mut pending).await {
                continue;
            }
            let opened = tokio::time::timeout(
                Duration::from_secs(3),
                client.watch(with_token(ReceiverStream::new(rx), token.as_deref())),
            )
            .await;
            let mut stream = match opened {
                Ok(Ok(response)) => response.into_inner(),
                Ok(Err(status)) => {
                    self.env.trace.record(format!(
                        "{}: open failed: {:?}",
                        self.name,
                        status.code()
                    ));
                    self.stream_lost();
                    tokio::time::sleep(backoff(attempt)).await;
                    continue;
                }
                Err(_) => {
                    self.env
                        .trace
                        .record(format!("{}: open timed out", self.name));
                    self.stream_lost();
                    continue;
                }
            };
            loop {
                if self.finished() {
                    return;
                }
                let wake = self.next_due();
                let deadline = self.env.give_up_at.saturating_sub(now());
                let fence_known = self.env.fence.borrow().is_some();
                let released = *self.env.released.borrow();
                let message = tokio::select! {
                    // Fixed order, for reproducible runs (turmoil seeds select!'s RNG only under tokio_unstable).
                    biased;
                    message = stream.message() => message,
                    () = sleep_until_due(wake) => {
                        if !self.create_due(&tx, &mut pending).await || !self.cancel_due(&tx).await {
                            break;
                        }
                        continue;
                    }
                    changed = self.env.fence.changed(), if !fence_known => {
                        let _ = changed;
                        // The fence is known now; some watchers may already be past it.
                        for index in 0..self.slots.len() {
                            self.check_complete(index);
                        }
                        continue;
                    }
                    changed = self.env.released.changed(), if !released => {
                        let _ = changed;
                        continue;
                    }
                    () = tokio::time::sleep(deadline) => return,
                };
                match message {
                    Ok(Some(response)) => {
                        self.handle(response, &mut pending, &mut by_id);
                        if std::mem::take(&mut self.token_refused) {
                            self.env.trace.record(format!(
                                "{}: token refused, re-opening with a new one",
                                self.name
                            ));
                            break;
                        }
                    }
                    Ok(None) | Err(_) => {
                        self.env.trace.record(format!(
                            "{}: stream ended, re-creating its watchers",
                            self.name
                        ));
                        break;
                    }
                }
            }
            self.stream_lost();
            tokio::time::sleep(backoff(attempt)).await;
        }
    }

    /// Every watcher ended or complete, and the census (if any) done.
    fn finished(&self) -> bool {
        *self.env.released.borrow() && self.slots.iter().all(Slot::done)
    }

    /// The next time a create or a cancel is due (`None`: nothing scheduled).
    fn next_due(&self) -> Option<Duration> {
        self.slots
            .iter()
            .filter_map(|slot| match slot.phase {
                Phase::Waiting if self.may_start(slot) => Some(slot.spec.create_at),
                Phase::Live(_) if !slot.cancel_sent => slot.spec.cancel_at,
                _ => None,
            })
            .min()
    }

    fn may_start(&self, slot: &Slot) -> bool {
        slot.spec
            .after
            .is_none_or(|before| self.slots[before].phase == Phase::Ended)
    }

    /// Sends the creates that are due (and, after a lost stream, re-creates). Returns false if the stream is gone.
    async fn create_due(
        &mut self,
        tx: &mpsc::Sender<WatchRequest>,
        pending: &mut VecDeque<PendingCreate>,
    ) -> bool {
        let at = now();
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            // A complete watcher lost with its stream is re-created too: it stays live until the census is done.
            let due =
                slot.phase == Phase::Waiting && slot.spec.create_at <= at && self.may_start(slot);
            if !due {
                continue;
            }
            let (model_revision, applied) = self.env.cluster.with_store(|store, _| {
                (
                    store.revision(),
                    self.env.cluster.stalest_applied_revision(store.revision()),
                )
            });
            let slot = &mut self.slots[index];
            if slot.log.start.is_none() && slot.first_start.is_none() {
                slot.first_start = match slot.spec.start {
                    Start::Now => None,
                    Start::Revision(revision) => Some(revision),
                    Start::Behind(back) => Some((model_revision - back).max(1)),
                    Start::Ahead(ahead) => Some(model_revision + ahead),
                };
            }
            let start_revision = slot.next.or(slot.first_start).unwrap_or(0);
            let mut filters = Vec::new();
            if slot.spec.no_put {
                filters.push(FilterType::Noput as i32);
            }
            if slot.spec.no_delete {
                filters.push(FilterType::Nodelete as i32);
            }
            let create = WatchRequest {
                request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                    key: slot.spec.key.clone(),
                    range_end: slot.spec.range_end.clone(),
                    start_revision,
                    prev_kv: slot.spec.prev_kv,
                    filters,
                    progress_notify: slot.spec.progress_notify,
                    watch_id: slot.spec.watch_id.unwrap_or(0),
                    ..Default::default()
                })),
            };
            slot.phase = Phase::Pending;
            self.env
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(slot.spec.name.clone(), slot.range());
            pending.push_back(PendingCreate {
                slot: index,
                requested_id: slot.spec.watch_id,
                applied,
            });
            if tx.send(create).await.is_err() {
                return false;
            }
        }
        true
    }

    /// Sends the cancels that are due. Returns false if the stream is gone.
    async fn cancel_due(&mut self, tx: &mpsc::Sender<WatchRequest>) -> bool {
        let at = now();
        for slot in &mut self.slots {
            let Phase::Live(watch_id) = slot.phase else {
                continue;
            };
            if slot.cancel_sent || slot.spec.cancel_at.is_none_or(|t| t > at) {
                continue;
            }
            slot.cancel_sent = true;
            slot.phase = Phase::Cancelling(watch_id);
            self.env
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&slot.spec.name);
            self.env
                .trace
                .record(format!("{}: cancelling watch {watch_id}", slot.spec.name));
            let cancel = WatchRequest {
                request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest { watch_id })),
            };
            if tx.send(cancel).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The stream is gone: live and pending watchers will be re-created; a cancel in flight is as good as done.
    fn stream_lost(&mut self) {
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            match slot.phase {
                Phase::Live(_) | Phase::Pending => slot.phase = Phase::Waiting,
                Phase::Cancelling(_) => self.end(index, WatchEnd::CancelledByClient),
                Phase::Waiting | Phase::Ended => {}
            }
        }
    }

    fn end(&mut self, index: usize, end: WatchEnd) {
        let slot = &mut self.slots[index];
        slot.phase = Phase::Ended;
        self.env
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot.spec.name);
        if !matches!(slot.log.end, WatchEnd::CompleteThrough(_)) {
            self.env
                .trace
                .record(format!("{}: ended: {end:?}", slot.spec.name));
            slot.log.end = end;
        }
    }

    fn handle(
        &mut self,
        response: WatchResponse,
        pending: &mut VecDeque<PendingCreate>,
        by_id: &mut BTreeMap<i64, usize>,
    ) {
        if response.created {
            let Some(create) = pending.pop_front() else {
                self.problems.push(format!(
                    "{}: a Created answer (watch {}) with no create pending",
                    self.name, response.watch_id
                ));
                return;
            };
            self.created(create, response, by_id);
            return;
        }
        let Some(&index) = by_id.get(&response.watch_id) else {
            if response.watch_id != -1 {
                self.problems.push(format!(
                    "{}: a response for watch {} which is not live on the stream",
                    self.name, response.watch_id
                ));
            }
            return;
        };
        let slot = &mut self.slots[index];
        if response.canceled {
            by_id.remove(&response.watch_id);
            if self.token_was_refused(&response.cancel_reason) {
                self.slots[index].phase = Phase::Waiting;
                return;
            }
            let slot = &mut self.slots[index];
            let end = if matches!(slot.phase, Phase::Cancelling(_)) {
                WatchEnd::CancelledByClient
            } else {
                WatchEnd::Cancelled {
                    reason: response.cancel_reason,
                    compact_revision: response.compact_revision,
                }
            };
            self.end(index, end);
            return;
        }
        if response.events.is_empty() {
            let revision = response.header.map_or(0, |h| h.revision);
            slot.log.progress.push((slot.log.received.len(), revision));
            return;
        }
        for event in response.events {
            let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            slot.next = Some(revision + 1);
            slot.log.received.push(event);
            slot.log.received_at.push(now());
        }
        self.check_complete(index);
    }

    fn created(
        &mut self,
        create: PendingCreate,
        response: WatchResponse,
        by_id: &mut BTreeMap<i64, usize>,
    ) {
        let index = create.slot;
        if response.canceled && self.token_was_refused(&response.cancel_reason) {
            // Created again, with a new token, on the next stream.
            self.slots[index].phase = Phase::Waiting;
            return;
        }
        if response.canceled {
            // Refused (watch ID -1) or cancelled at once (a compacted start revision).
            let end = if response.watch_id == -1 {
                WatchEnd::Refused {
                    reason: response.cancel_reason,
                }
            } else {
                WatchEnd::Cancelled {
                    reason: response.cancel_reason,
                    compact_revision: response.compact_revision,
                }
            };
            self.end(index, end);
            return;
        }
        let slot = &mut self.slots[index];
        if let Some(requested) = create.requested_id
            && requested != response.watch_id
        {
            slot.log.problems.push(format!(
                "asked for watch ID {requested}, was created as {}",
                response.watch_id
            ));
        }
        if let Some(other) = by_id.insert(response.watch_id, index) {
            let other_name = self.slots[other].spec.name.clone();
            self.slots[index].log.problems.push(format!(
                "created as watch {}, which {other_name} still holds on the stream",
                response.watch_id
            ));
        }
        let slot = &mut self.slots[index];
        slot.phase = Phase::Live(response.watch_id);
        if slot.log.start.is_none() {
            let reported = response.header.as_ref().map_or(0, |h| h.revision);
            let start = match slot.first_start {
                Some(revision) => WatchStart::Revision(revision),
                None => WatchStart::Current {
                    applied: create.applied,
                    reported,
                },
            };
            self.env.trace.record(format!(
                "{}: created as watch {}, starts at {}",
                slot.spec.name,
                response.watch_id,
                start.first_revision()
            ));
            slot.next = Some(start.first_revision());
            slot.log.start = Some(start);
        }
        self.check_complete(index);
    }

    /// Whether a cancel `reason` is etcd refusing the stream's token (then the stream is re-opened with a new one).
    fn token_was_refused(&mut self, reason: &str) -> bool {
        let refused = self
            .session
            .as_mut()
            .is_some_and(|session| session.refused_watcher(reason));
        self.token_refused |= refused;
        refused
    }

    /// Marks a watcher complete once it has everything through its fence target.
    fn check_complete(&mut self, index: usize) {
        let Some(fence) = *self.env.fence.borrow() else {
            return;
        };
        let slot = &mut self.slots[index];
        if slot.phase == Phase::Ended || matches!(slot.log.end, WatchEnd::CompleteThrough(_)) {
            return;
        }
        let target = fence.target(slot.spec.no_delete);
        if slot.next.is_some_and(|next| next > target) {
            slot.log.end = WatchEnd::CompleteThrough(target);
        }
    }
}

/// Sleeps until the virtual time `at` (forever if `None`).
async fn sleep_until_due(at: Option<Duration>) {
    match at {
        Some(at) => tokio::time::sleep_until(Instant::now() + at.saturating_sub(now())).await,
        None => std::future::pending().await,
    }
}

/// The longest pause before re-opening a stream.
pub const BACKOFF_MAX: Duration = Duration::from_millis(200);

/// A short pause before re-opening, growing with the attempts (virtual time, so it costs nothing real).
fn backoff(attempt: u32) -> Duration {
    (BACKOFF_MAX / 10) * attempt.min(10)
}
