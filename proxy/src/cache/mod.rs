//! The range cache (`--range-cache-max-bytes`): Range calls answered from copies of ranges that a watch keeps
//! current, so that a write made anywhere (directly on etcd, through another proxy) reaches the copy within one
//! event delivery, unlike etcd's Go proxy, whose cache only writes through itself invalidate.
//!
//! A copy holds every key of one range (`key`, `range_end`) at a revision: it is filled by an answer from etcd
//! that held the whole range (any read, linearizable ones too), and from then on follows the range's watcher. Any
//! Range over exactly that range is answered from it as etcd would answer (limits, sorts, filters, `keys_only`,
//! `count_only`: [`query`]), with the copy's revision in its header:
//! - a serializable read once the copy is at the newest revision the proxy already returned (so that reads never
//!   go back, `--experimental-serializable-ordering`), waiting briefly for the copy's events or a progress answer
//!   to move it ([`feed`]);
//! - a linearizable read once the copy is at etcd's revision learnt after the read arrived ([`consistent`]), so
//!   that it reflects every write acknowledged before it (from etcd 3.5.8, whose progress answers can move a copy;
//!   before, once a member said its version, a linearizable read goes to etcd as with the cache off, at no cost
//!   of the cache's).
//!
//! A read the cache cannot answer in time goes to etcd, as without a cache. A copy that cannot answer 32 reads in a
//! row over 2 s (before etcd 3.5.8 every write through the proxy elsewhere leaves it behind; a range written faster
//! than it is read) is retired, so that it stops costing, and its range rests before it is filled again
//! ([`store::MISSES_TO_RETIRE`], [`rest`]). A cache whose copies answer fewer than one read in 32 over the time a
//! copy takes to start answering sleeps: its copies are dropped and every read goes to etcd for a while, at no
//! cost of the cache's but a clock read ([`sleep`]).
//!
//! - [`consistent`]: the revision a linearizable read from the cache must reach.
//! - [`permission`]: when a read must be checked with etcd before a copy answers it.
//! - [`query`]: which requests the cache can answer, and the answer from a range's keys.
//! - [`store`]: the copies, bounded in bytes, least recently read evicted first, retired when they keep missing.
//! - [`rest`]: the ranges whose copy was retired, resting before they are filled again.
//! - [`sleep`]: the whole cache asleep while its copies answer next to nothing.
//! - [`feed`]: the cache's own watch stream that keeps the copies current.
//!
//! With auth on, copies are watched with the proxy's own identity (`--user`), and a caller gets a copy's answer
//! only after etcd answered a `count_only`, `limit 1` read of that range with the caller's token (for a
//! linearizable read, the request that learns the revision; for a serializable one, a serializable one): etcd's
//! own permission check, made for every read once auth may be on ([`permission`]), so a revoked permission or an
//! expired token takes effect at once. Without `--user`, calls with a token go to etcd.

pub mod consistent;
pub mod feed;
pub mod permission;
pub mod query;
pub mod rest;
pub mod sleep;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use http::uri::PathAndQuery;
use prost::Message;
use proto::etcdserverpb::RangeResponse;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::metrics::Metrics;
use crate::upstream::identity::Identity;
use crate::upstream::{Forwarded, Retry, Upstream, header_revision, is_serializable};
use crate::watch::WatchService;
use crate::watch::hub::HubConfig;
use consistent::Revisions;
use feed::Feed;
use permission::Permissions;
use query::Query;
use sleep::Sleep;
use store::Store;

/// How long a serializable read waits for its copy to reach the newest revision the proxy returned before it goes
/// to etcd instead: a few progress answers' time (from etcd 3.5.8; before, it does not wait).
pub const CATCH_UP_WAIT: Duration = Duration::from_millis(250);

/// How long a linearizable read waits for its copy to reach etcd's revision before it goes to etcd instead. A copy
/// whose watcher runs gets there within a progress answer's round trip; this bound is for one whose watcher is
/// being resumed after a failover.
pub const CONSISTENT_WAIT: Duration = Duration::from_secs(1);

/// Answers of reads in flight to etcd, by request: an identical read that arrives meanwhile waits for the same
/// answer instead of asking again.
type InFlight =
    Mutex<HashMap<(Option<String>, Bytes), Shared<BoxFuture<'static, Result<Bytes, Status>>>>>;

/// One read waiting for a shared answer from etcd. However the wait ends (the answer came, or the caller went:
/// cancel, deadline, connection drop), the last reader to leave takes the entry out of the map, which drops the
/// call to etcd if it is still on its way: nothing a cancelled read started outlives its readers.
struct Waiting<'a> {
    in_flight: &'a InFlight,
    key: (Option<String>, Bytes),
    answer: Shared<BoxFuture<'static, Result<Bytes, Status>>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        // `strong_count` counts the map's clone and this one; `None` once the answer is in, which a later read must
        // not be given (it could be older than what the proxy has returned since).
        let last_or_answered = self.answer.strong_count().is_none_or(|count| count <= 2);
        if last_or_answered
            && in_flight
                .get(&self.key)
                .is_some_and(|f| f.ptr_eq(&self.answer))
        {
            in_flight.remove(&self.key);
        }
    }
}

/// The range cache of one running proxy.
pub struct Cache {
    feed: Arc<Feed>,
    upstream: Arc<Upstream>,
    metrics: Metrics,
    in_flight: InFlight,
    revisions: Arc<Revisions>,
    /// The proxy has its own identity (`--user`): callers with a token are served from copies too.
    own_identity: bool,
    permissions: Permissions,
    sleep: Sleep,
}

/// What a check with etcd says about answering from a copy: `Err` is etcd's refusal of the caller, the answer to
/// give; `Ok(Some(None))` means etcd could not be asked (the read goes to etcd, where it is retried); `Ok(None)`
/// means go on.
fn refusal_or_retry(check: Result<i64, Status>) -> Result<Option<Option<Bytes>>, Status> {
    match check {
        Ok(_) => Ok(None),
        Err(status) if crate::error::is_endpoint_failure(&status) => Ok(Some(None)),
        Err(status) => Err(crate::error::to_client(status)),
    }
}

impl Cache {
    /// A cache bounded to `max_bytes`, or `None` when that is 0 (the cache is off).
    pub fn new(
        upstream: &Arc<Upstream>,
        metrics: &Metrics,
        max_bytes: usize,
        hub: HubConfig,
        identity: Option<Arc<Identity>>,
    ) -> Option<Arc<Self>> {
        if max_bytes == 0 {
            return None;
        }
        // The cache's watchers run on a watch service of their own, so on upstream streams of their own.
        let own_identity = identity.is_some();
        let hub = HubConfig {
            own_identity,
            hidden_prefix: 0,
            max_join_lag: 0,
            ..hub
        };
        let watch = WatchService::new(
            upstream.clone(),
            metrics.clone(),
            hub,
            1,
            identity.clone(),
            None,
        );
        let feed = Feed::new(
            Store::new(max_bytes),
            watch,
            upstream.clone(),
            metrics.clone(),
            identity,
        );
        Some(Arc::new(Self {
            feed: Arc::new(feed),
            upstream: upstream.clone(),
            metrics: metrics.clone(),
            in_flight: Mutex::default(),
            revisions: Revisions::new(upstream.clone()),
            own_identity,
            permissions: Permissions::default(),
            sleep: Sleep::default(),
        }))
    }

    /// Serves one Range call (`path` is Range's): from a copy when it can, else from etcd, filling a copy when
    /// etcd's answer holds a whole range.
    pub async fn range(
        &self,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let forwarded = Forwarded::capture(&request);
        let token = forwarded.token();
        // With auth on, copies are watched with the proxy's own identity (`--user`); without it they cannot be. A
        // caller that requires a leader (`hasleader`) must get etcd's "no leader" when there is none, which only
        // etcd can say.
        let cacheable = (token.is_none() || self.own_identity) && !forwarded.requires_leader();
        let message = request.into_inner();
        // Asleep, the cache lets every read go to etcd as if it were off. Before etcd 3.5.8 no copy can answer a
        // linearizable read (nothing proves a quiet copy current): once a member said such a version, that read
        // goes to etcd likewise, neither decoded nor looked up nor counted, and fills nothing (the serializable
        // reads of its range fill their own copy). Until the version is known it goes through the cache, whose
        // first copy asks.
        let answerable = cacheable
            && !self.sleep.asleep(Instant::now())
            && (is_serializable(&message) || !self.feed.progress_known_useless());
        let Some(query) = answerable.then(|| Query::of(&message)).flatten() else {
            let answer = self
                .upstream
                .unary_captured(Retry::ReadOnly, &path, &forwarded, message)
                .await?;
            return Ok(Response::new(answer));
        };
        if let Some(answer) = self.answer_from_copy(&query, token.as_deref()).await? {
            self.metrics.cache_hits.inc();
            return Ok(Response::new(answer));
        }
        self.metrics.cache_misses.inc();
        let answer = if query.serializable {
            self.shared_answer_from_etcd(token, path, forwarded, message)
                .await?
        } else {
            // A linearizable read must reflect every write acknowledged before it arrived: it shares no call
            // that was sent before.
            self.upstream
                .unary_captured(Retry::ReadOnly, &path, &forwarded, message)
                .await?
        };
        self.missed(&query, &answer);
        Ok(Response::new(answer))
    }

    /// The answer from the copy of the query's range, if there is one that can answer exactly in time: for a
    /// serializable read, once the copy is at the newest revision the proxy returned; for a linearizable one,
    /// once it is at etcd's revision learnt after the read arrived ([`consistent`]). A caller with a token gets a
    /// copy's answer only after etcd answered a read of that range with that token; etcd's refusal is the answer.
    async fn answer_from_copy(
        &self,
        query: &Query,
        token: Option<&str>,
    ) -> Result<Option<Bytes>, Status> {
        let range = &query.range;
        let must_check = self.permissions.must_check(token);
        let (target, wait) = if query.serializable {
            // Without a check to make first, the copy is looked up once, below.
            if must_check {
                if self.feed.lock().store.get(range).is_none() {
                    return Ok(None);
                }
                let check = consistent::ask_count(&self.upstream, token, range, true).await;
                self.permissions.checked(token, &check);
                if let Some(answer) = refusal_or_retry(check)? {
                    return Ok(answer);
                }
            }
            // Before etcd 3.5.8 only the copy's own events move it: a copy behind the floor (a write elsewhere
            // went through the proxy) may stay there, and waiting for it would only delay the read.
            let wait = match self.feed.progress_moves_copies() {
                true => CATCH_UP_WAIT,
                false => Duration::ZERO,
            };
            (self.upstream.revision_floor(), wait)
        } else {
            // Without progress answers (etcd before 3.5.8) a quiet range's copy would never reach the revision.
            if !self.feed.has_copy_to_catch_up(range) {
                return Ok(None);
            }
            // The request that learns the revision is made with the caller's token over its range: a check too.
            let learnt = self.revisions.current(token, range).await;
            self.permissions.checked(token, &learnt);
            // A copy behind it waits for a progress answer, which etcd gives only once every watcher of the
            // cache's stream is synced: not while one created a moment ago may not be. Then the read goes to etcd
            // at once (the copy answers if it is there already), rather than waiting a resync period or two.
            let wait = match self.feed.syncing_new_watcher() {
                true => Duration::ZERO,
                false => CONSISTENT_WAIT,
            };
            match learnt {
                Ok(revision) => (revision, wait),
                failed => return refusal_or_retry(failed).map(Option::flatten),
            }
        };
        Ok(self.wait_for_copy(query, target, wait).await)
    }

    /// The copy's answer once it is at `target`, waiting `wait` at most (with no wait, the copy is looked at once
    /// and no waiter or timer is set up: the common case before etcd 3.5.8, where it costs every miss).
    async fn wait_for_copy(&self, query: &Query, target: i64, wait: Duration) -> Option<Bytes> {
        let give_up = Instant::now() + wait;
        loop {
            let changed = self.feed.changed();
            tokio::pin!(changed);
            if !wait.is_zero() {
                changed.as_mut().enable();
            }
            {
                let mut state = self.feed.lock();
                let copy = state.store.read(&query.range)?;
                // Only once etcd has confirmed the copy's watcher: until then nothing says a write after the fill
                // would reach it (a member that cannot watch, say).
                if copy.covered_from.is_some() && copy.revision >= target {
                    let answer = query.answer(copy.kvs_in(&query.range), copy.header())?;
                    copy.answered();
                    let revision = copy.revision;
                    state.window.answered();
                    self.upstream.returned_revision(revision);
                    return Some(Bytes::from(answer.encode_to_vec()));
                }
                self.feed.want_progress(&mut state);
            }
            if wait.is_zero() || tokio::time::timeout_at(give_up, changed).await.is_err() {
                return None;
            }
        }
    }

    /// etcd's answer to a serializable read, shared with identical reads of the same token already waiting for
    /// one. An answer older than the newest revision the proxy had returned when this read arrived (the call was
    /// sent before, and another answer since went further) is not taken: the read is made again.
    async fn shared_answer_from_etcd(
        &self,
        token: Option<String>,
        path: PathAndQuery,
        forwarded: Forwarded,
        message: Bytes,
    ) -> Result<Bytes, Status> {
        let floor = self.upstream.revision_floor();
        let key = (token, message.clone());
        let answer = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight
                .entry(key.clone())
                .or_insert_with(|| {
                    let (upstream, path) = (self.upstream.clone(), path.clone());
                    let (forwarded, message) = (forwarded.clone(), message.clone());
                    async move {
                        upstream
                            .unary_captured(Retry::ReadOnly, &path, &forwarded, message)
                            .await
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let waiting = Waiting {
            in_flight: &self.in_flight,
            key,
            answer,
        };
        let result = waiting.answer.clone().await;
        drop(waiting);
        match result {
            Ok(bytes) if header_revision(&bytes).unwrap_or(0) < floor => {
                self.upstream
                    .unary_captured(Retry::ReadOnly, &path, &forwarded, message)
                    .await
            }
            other => other,
        }
    }

    /// Counts the miss against the copy that could not answer it (retiring one that keeps missing) and against the
    /// cache (which falls asleep if its copies answer next to nothing), and fills a copy of the query's range from
    /// etcd's answer, if that answer holds the whole range and the range may be filled.
    fn missed(&self, query: &Query, answer: &Bytes) {
        {
            let now = Instant::now();
            let mut state = self.feed.lock();
            // A read that was on its way when the cache fell asleep counts for nothing and fills nothing.
            if self.sleep.asleep(now) {
                return;
            }
            if let Some(retired) = state.store.missed(&query.range, now) {
                self.feed.retire(&mut state, retired, now);
            }
            let judged_over = sleep::judged_over(!state.progress_known_useless());
            if let Some(length) = state.window.missed(now, judged_over) {
                self.sleep.start(now, length);
                self.feed.fall_asleep(state);
                return;
            }
            // A range with a copy already (or resting) is not filled: not decoding the answer then keeps a miss as
            // cheap as a read with the cache off, plus the copy lookups.
            if state.store.get(&query.range).is_some() || !state.resting.may_fill(&query.range, now)
            {
                return;
            }
        }
        let Ok(decoded) = RangeResponse::decode(answer.clone()) else {
            return;
        };
        if !query.answer_fills(&decoded) {
            return;
        }
        let header = decoded.header.unwrap_or_default();
        let mut state = self.feed.lock();
        let Some((watch_id, evicted)) = state.store.fill(query.range.clone(), decoded.kvs, header)
        else {
            return;
        };
        let range = &query.range;
        self.feed.watch_from(
            &mut state,
            watch_id,
            &range.key,
            &range.end,
            header.revision,
        );
        self.feed.cancel(&state, evicted);
        self.feed.update_gauges(&state);
    }
}
