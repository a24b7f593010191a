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
//!   that it reflects every write acknowledged before it (from etcd 3.5.8, whose progress answers can move a copy).
//!
//! A read the cache cannot answer in time goes to etcd, as without a cache.
//!
//! - [`consistent`]: the revision a linearizable read from the cache must reach.
//! - [`query`]: which requests the cache can answer, and the answer from a range's keys.
//! - [`store`]: the copies, bounded in bytes, least recently read evicted first.
//! - [`feed`]: the cache's own watch stream that keeps the copies current.
//!
//! Calls that carry a token are not answered from the cache (with auth on, a copy filled for one user would have to
//! be checked against each other user's permissions); they go to etcd as before.

pub mod consistent;
pub mod feed;
pub mod query;
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
use crate::upstream::{Forwarded, Retry, Upstream};
use crate::watch::WatchService;
use crate::watch::hub::HubConfig;
use consistent::Revisions;
use feed::Feed;
use query::Query;
use store::Store;

/// How long a serializable read waits for its copy to reach the newest revision the proxy returned before it goes
/// to etcd instead: a few progress answers' time.
pub const CATCH_UP_WAIT: Duration = Duration::from_millis(250);

/// How long a linearizable read waits for its copy to reach etcd's revision before it goes to etcd instead. A copy
/// whose watcher runs gets there within a progress answer's round trip; this bound is for one whose watcher is
/// being resumed after a failover.
pub const CONSISTENT_WAIT: Duration = Duration::from_secs(1);

/// Answers of reads in flight to etcd, by request: an identical read that arrives meanwhile waits for the same
/// answer instead of asking again.
type InFlight = Mutex<HashMap<Bytes, Shared<BoxFuture<'static, Result<Bytes, Status>>>>>;

/// The range cache of one running proxy.
pub struct Cache {
    feed: Arc<Feed>,
    upstream: Arc<Upstream>,
    metrics: Metrics,
    in_flight: InFlight,
    revisions: Arc<Revisions>,
}

impl Cache {
    /// A cache bounded to `max_bytes`, or `None` when that is 0 (the cache is off).
    pub fn new(
        upstream: &Arc<Upstream>,
        metrics: &Metrics,
        max_bytes: usize,
        hub: HubConfig,
    ) -> Option<Arc<Self>> {
        if max_bytes == 0 {
            return None;
        }
        // The cache's watchers run on a watch service of their own, so on upstream streams of their own.
        let hub = HubConfig {
            own_identity: false,
            hidden_prefix: 0,
            max_join_lag: 0,
            ..hub
        };
        let watch = WatchService::new(upstream.clone(), metrics.clone(), hub, 1, None, None);
        let feed = Feed::new(
            Store::new(max_bytes),
            watch,
            upstream.clone(),
            metrics.clone(),
        );
        Some(Arc::new(Self {
            feed: Arc::new(feed),
            upstream: upstream.clone(),
            metrics: metrics.clone(),
            in_flight: Mutex::default(),
            revisions: Revisions::new(upstream.clone()),
        }))
    }

    /// Serves one Range call (`path` is Range's): from a copy when it can, else from etcd, filling a copy when
    /// etcd's answer holds a whole range.
    pub async fn range(
        &self,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let query = Query::of(request.get_ref());
        let with_token = Forwarded::capture(&request).token().is_some();
        let Some(query) = query.filter(|_| !with_token) else {
            return self.upstream.unary(Retry::ReadOnly, path, request).await;
        };
        if let Some(answer) = self.answer_from_copy(&query).await {
            self.metrics.cache_hits.inc();
            return Ok(Response::new(answer));
        }
        self.metrics.cache_misses.inc();
        let answer = self.answer_from_etcd(path, request).await?;
        self.fill(&query, &answer);
        Ok(Response::new(answer))
    }

    /// The answer from the copy of the query's range, if there is one that can answer exactly in time: for a
    /// serializable read, once the copy is at the newest revision the proxy returned; for a linearizable one,
    /// once it is at etcd's revision learnt after the read arrived ([`consistent`]).
    async fn answer_from_copy(&self, query: &Query) -> Option<Bytes> {
        let (target, wait) = if query.serializable {
            (self.upstream.revision_floor(), CATCH_UP_WAIT)
        } else {
            // Without progress answers (etcd before 3.5.8) a quiet range's copy would never reach the revision.
            if !self.feed.has_copy_to_catch_up(&query.range) {
                return None;
            }
            let revision = self.revisions.current(&query.range.key).await.ok()?;
            (revision, CONSISTENT_WAIT)
        };
        let give_up = Instant::now() + wait;
        loop {
            let changed = self.feed.changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.feed.lock();
                let copy = state.store.read(&query.range)?;
                // Only once etcd has confirmed the copy's watcher: until then nothing says a write after the fill
                // would reach it (a member that cannot watch, say).
                if copy.covered_from.is_some() && copy.revision >= target {
                    let answer = query.answer(copy.kvs.values(), copy.header())?;
                    return Some(Bytes::from(answer.encode_to_vec()));
                }
                self.feed.want_progress(&mut state);
            }
            if tokio::time::timeout_at(give_up, changed).await.is_err() {
                return None;
            }
        }
    }

    /// etcd's answer, shared with identical reads already waiting for one.
    async fn answer_from_etcd(
        &self,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Bytes, Status> {
        let key = request.get_ref().clone();
        let answer = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight
                .entry(key.clone())
                .or_insert_with(|| {
                    let upstream = self.upstream.clone();
                    async move {
                        let response = upstream.unary(Retry::ReadOnly, path, request).await?;
                        Ok(response.into_inner())
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let result = answer.clone().await;
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if in_flight.get(&key).is_some_and(|f| f.ptr_eq(&answer)) {
            in_flight.remove(&key);
        }
        result
    }

    /// Fills a copy of the query's range from etcd's answer, if that answer holds the whole range.
    fn fill(&self, query: &Query, answer: &Bytes) {
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
