//! What keeps the cached ranges current: one Watch stream of the cache's own, served by a watch service of the
//! cache's own (so by upstream Watch streams no client watcher shares: a client's watcher catching up cannot hold
//! back the progress answers the cache waits for). Each cached range has a watcher from its fill's revision; its
//! events are applied as they come, a cancel (a compaction overtook it, etcd refused it) drops the copy,
//! and the end of the stream drops them all. The hub under it resumes the watchers after a failover from the next
//! revision, so a copy never misses an event.
//!
//! Progress requests move every copy to the revision etcd answers them at when its range had no event, so that a
//! read wanting a newer revision than a copy's last event need not go to etcd. Only from etcd 3.5.8 does a progress
//! answer mean that every watcher of the stream has received everything up to it (`etcd_version`); with an older
//! etcd copies move by their own events only. Each answer is judged by the version of the member that gave it (its
//! header names it; [`crate::upstream::versions`]), not by the version learnt once: during a rolling upgrade the
//! stream can move from an upgraded member to one that is not, whose answer comes while a watcher resumed there
//! is still catching up.

use std::sync::{Arc, Mutex, MutexGuard};

use proto::etcdserverpb::{WatchCreateRequest, WatchResponse};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::rest::Resting;
use super::sleep::Window;
use super::store::{Evicted, Retired, SYNC_WINDOW, Store, WatchId};
use crate::metrics::Metrics;
use crate::upstream::etcd_version;
use crate::upstream::identity::Identity;
use crate::upstream::{Upstream, shutting_down};
use crate::watch::{LocalStream, StreamHandle, WatchService};

/// How often the cache asks the active member's version again (see [`Feed::learn_version`]).
const VERSION_RECHECK: std::time::Duration = std::time::Duration::from_secs(10);

/// Responses the cache's stream may hold unread; the feed applies them as they come, so this is only a burst.
const STREAM_BUFFER: usize = 4096;

/// The cache's state under one lock.
pub struct State {
    pub store: Store,
    /// Ranges whose copy was retired, not filled again for a while.
    pub resting: Resting,
    /// The reads the copies answered and missed lately, which decide whether the whole cache sleeps.
    pub window: Window,
    stream: Option<StreamHandle>,
    /// Progress requests sent on the current stream, and whether the last is unanswered.
    progress_sent: u64,
    progress_in_flight: bool,
    /// Whether progress answers move copies (etcd 3.5.8 on); `None` until a member has said its version. Each
    /// answer is still judged by the version of the member that gave it ([`Feed::apply`]).
    progress_trusted: Option<bool>,
    /// The task that learns the version, and learns it again now and then, runs.
    learning_version: bool,
    /// When the last copy's watcher was created.
    new_watchers: NewWatchers,
}

impl State {
    /// Whether a member said a version whose progress answers cannot move copies (etcd before 3.5.8).
    pub fn progress_known_useless(&self) -> bool {
        self.progress_trusted == Some(false)
    }
}

/// When the cache last created a watcher, and whether etcd may still be syncing it: etcd from 3.5.13 answers no
/// progress request on the stream until it has.
#[derive(Default)]
struct NewWatchers {
    last_create: Option<Instant>,
}

impl NewWatchers {
    fn created(&mut self, at: Instant) {
        self.last_create = Some(at);
    }

    fn may_be_syncing(&self, now: Instant) -> bool {
        self.last_create
            .is_some_and(|at| now.saturating_duration_since(at) < SYNC_WINDOW)
    }
}

/// The copies, their watchers' stream, and a signal for readers waiting for a copy to move.
pub struct Feed {
    state: Mutex<State>,
    changed: Notify,
    watch: WatchService,
    upstream: Arc<Upstream>,
    metrics: Metrics,
    /// The proxy's own identity (`--user`): the cache's watchers and its question for etcd's version carry its token.
    identity: Option<Arc<Identity>>,
}

impl Feed {
    pub fn new(
        store: Store,
        watch: WatchService,
        upstream: Arc<Upstream>,
        metrics: Metrics,
        identity: Option<Arc<Identity>>,
    ) -> Self {
        Self {
            state: Mutex::new(State {
                store,
                resting: Resting::default(),
                window: Window::default(),
                stream: None,
                progress_sent: 0,
                progress_in_flight: false,
                progress_trusted: None,
                learning_version: false,
                new_watchers: NewWatchers::default(),
            }),
            changed: Notify::new(),
            watch,
            upstream,
            metrics,
            identity,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Completes after the next change to the copies (register before looking, see [`Notify::notified`]).
    pub fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }

    /// Starts the watcher of a copy just filled at `revision`, opening the stream if needed. It starts at that
    /// revision, not the next: etcd answers no progress request on a stream with a watcher whose start revision is
    /// still ahead of the store (as the next one is until something is written), and the copy already reflects the
    /// events of `revision`, which it skips.
    pub fn watch_from(
        self: &Arc<Self>,
        state: &mut State,
        watch_id: WatchId,
        key: &[u8],
        end: &[u8],
        revision: i64,
    ) {
        if *self.upstream.shutdown_signal().borrow() {
            // A read finishing during shutdown: no new stream to outlive the proxy.
            return;
        }
        if state.stream.is_none() {
            let LocalStream {
                handle,
                responses,
                aborted,
            } = self.watch.attach(None, STREAM_BUFFER);
            state.stream = Some(handle);
            state.progress_sent = 0;
            state.progress_in_flight = false;
            tokio::spawn(self.clone().apply_responses(responses, aborted));
            if !state.learning_version {
                state.learning_version = true;
                tokio::spawn(self.clone().learn_version());
            }
        }
        let stream = state.stream.as_ref().expect("just opened");
        state.new_watchers.created(Instant::now());
        stream.create(WatchCreateRequest {
            key: key.to_vec(),
            range_end: end.to_vec(),
            start_revision: revision,
            watch_id,
            ..Default::default()
        });
    }

    /// Cancels the watchers of copies evicted to stay within the bounds.
    pub fn cancel(&self, state: &State, evicted: Evicted) {
        self.metrics
            .cache_evictions
            .inc_by(evicted.watch_ids.len() as u64);
        Self::cancel_watchers(state, evicted.watch_ids);
    }

    /// Cancels the watcher of a copy retired at `now` for failing to answer ([`Store::missed`]); its range rests.
    pub fn retire(&self, state: &mut State, retired: Retired, now: Instant) {
        self.metrics.cache_retirements.inc();
        Self::cancel_watchers(state, vec![retired.watch_id]);
        state.resting.retired(retired, now);
        self.update_gauges(state);
    }

    /// The cache falls asleep ([`super::sleep`]): every copy is dropped and its watcher cancelled, and the readers
    /// waiting for a copy to move go to etcd at once.
    pub fn fall_asleep(&self, mut state: MutexGuard<'_, State>) {
        self.metrics.cache_sleeps.inc();
        let watch_ids = state.store.clear();
        Self::cancel_watchers(&state, watch_ids);
        self.update_gauges(&state);
        drop(state);
        self.changed.notify_waiters();
    }

    fn cancel_watchers(state: &State, watch_ids: Vec<WatchId>) {
        if let Some(stream) = &state.stream {
            for id in watch_ids {
                stream.cancel(id);
            }
        }
    }

    /// Asks etcd for progress unless a request is in flight (its answer wakes the waiting readers, who ask again
    /// if it did not move their copy far enough). Does nothing before etcd 3.5.8, whose answers move no copy.
    pub fn want_progress(&self, state: &mut State) {
        if state.progress_trusted != Some(true) || state.progress_in_flight {
            return;
        }
        let Some(stream) = &state.stream else { return };
        state.progress_sent += 1;
        state.progress_in_flight = true;
        stream.request_progress();
    }

    /// Whether there is a copy of `range` that progress answers can bring up to a revision (from etcd 3.5.8).
    pub fn has_copy_to_catch_up(&self, range: &super::query::KeyRange) -> bool {
        let state = self.lock();
        state.progress_trusted == Some(true) && state.store.get(range).is_some()
    }

    /// Whether a copy's watcher was created so recently that etcd may not have synced it yet, so that no progress
    /// answer is to be had for a while ([`SYNC_WINDOW`]).
    pub fn syncing_new_watcher(&self) -> bool {
        self.lock().new_watchers.may_be_syncing(Instant::now())
    }

    /// Whether progress answers move copies (etcd from 3.5.8, once a member said its version).
    pub fn progress_moves_copies(&self) -> bool {
        self.lock().progress_trusted == Some(true)
    }

    /// Whether a member said a version whose progress answers cannot move copies (etcd before 3.5.8). Not yet
    /// known before the first copy's stream asked.
    pub fn progress_known_useless(&self) -> bool {
        self.lock().progress_known_useless()
    }

    /// Learns the active member's version, and again every [`VERSION_RECHECK`] until the proxy shuts down: an
    /// upgrade changes it one member at a time.
    async fn learn_version(self: Arc<Self>) {
        let mut shutdown = self.upstream.shutdown_signal();
        loop {
            let token = match &self.identity {
                Some(identity) => identity.token(&self.upstream).await.ok().flatten(),
                None => None,
            };
            if let Ok(version) = self.upstream.version(token.as_deref()).await {
                let trusted = !etcd_version::answers_progress_without_watchers(Some(&version));
                self.lock().progress_trusted = Some(trusted);
                self.changed.notify_waiters();
            }
            tokio::select! {
                biased;
                _ = shutting_down(&mut shutdown) => return,
                () = tokio::time::sleep(VERSION_RECHECK) => {}
            }
        }
    }

    async fn apply_responses(
        self: Arc<Self>,
        mut responses: tokio::sync::mpsc::Receiver<WatchResponse>,
        mut aborted: tokio::sync::mpsc::Receiver<tonic::Status>,
    ) {
        // The stream, its hub and their upstream stream end with the proxy.
        let mut shutdown = self.upstream.shutdown_signal();
        loop {
            let response = tokio::select! {
                biased;
                _ = shutting_down(&mut shutdown) => None,
                response = responses.recv() => response,
                status = aborted.recv() => {
                    if let Some(status) = status {
                        tracing::warn!(%status, "the range cache's watch stream ended; its copies are dropped");
                    }
                    None
                }
            };
            let Some(response) = response else { break };
            let mut state = self.lock();
            self.apply(&mut state, response);
            drop(state);
            self.changed.notify_waiters();
        }
        let mut state = self.lock();
        state.stream = None;
        state.store.clear();
        self.update_gauges(&state);
        drop(state);
        self.changed.notify_waiters();
    }

    fn apply(&self, state: &mut State, response: WatchResponse) {
        let revision = response.header.map_or(0, |h| h.revision);
        if response.watch_id == -1 && response.events.is_empty() {
            if state.progress_in_flight {
                state.progress_in_flight = false;
                let request = state.progress_sent;
                let member = response.header.map_or(0, |h| h.member_id);
                if self
                    .upstream
                    .member_versions()
                    .answers_progress_when_synced(member)
                {
                    state.store.progress(request, revision);
                } else {
                    // A member before 3.5.8 (during an upgrade, the stream moved to one not upgraded yet) answers
                    // at once, while a watcher resumed there from an older revision may still be catching up:
                    // its answer moves no copy, and reads stop waiting for progress until the version is
                    // learnt again.
                    state.progress_trusted = Some(false);
                }
            }
            return;
        }
        if response.created {
            let sent = state.progress_sent;
            state.store.confirmed(response.watch_id, sent);
        }
        if response.canceled {
            if state.store.drop_watch(response.watch_id) {
                tracing::debug!(
                    watch_id = response.watch_id,
                    compact_revision = response.compact_revision,
                    reason = response.cancel_reason,
                    "a cached range's watcher was cancelled; the copy is dropped"
                );
            }
            self.update_gauges(state);
            return;
        }
        if !response.events.is_empty() {
            let evicted = state.store.apply(response.watch_id, &response.events);
            self.cancel(state, evicted);
            self.update_gauges(state);
        }
    }

    pub fn update_gauges(&self, state: &State) {
        self.metrics.cache_keys.set(state.store.len() as i64);
        self.metrics.cache_bytes.set(state.store.bytes() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::hub::ETCD_RESYNC_PERIOD;

    #[test]
    fn a_watcher_may_be_syncing_for_two_of_etcds_resync_periods_after_it_was_created() {
        let mut watchers = NewWatchers::default();
        let t = Instant::now();
        assert!(!watchers.may_be_syncing(t), "none created");
        watchers.created(t);
        assert!(watchers.may_be_syncing(t));
        assert!(watchers.may_be_syncing(t + ETCD_RESYNC_PERIOD));
        assert!(!watchers.may_be_syncing(t + 2 * ETCD_RESYNC_PERIOD));
        watchers.created(t + 5 * ETCD_RESYNC_PERIOD);
        assert!(
            watchers.may_be_syncing(t + 6 * ETCD_RESYNC_PERIOD),
            "the latest counts"
        );
    }
}
