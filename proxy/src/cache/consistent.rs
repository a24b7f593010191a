//! The revision a linearizable read from the cache must reach: etcd's revision at some moment after the read
//! arrived, learnt by a linearizable Range that costs etcd almost nothing (`count_only`, `limit 1`) and began after
//! the read arrived. Such a Range is answered only once etcd has applied every write acknowledged before it began,
//! so a copy at or past its revision reflects all of them (as etcd's own cache library and Kubernetes' consistent
//! reads from cache do).
//!
//! Reads share these requests: one is in flight at a time, and it answers every read that arrived before it was
//! sent; reads arriving meanwhile wait for the next one, which is sent as soon as the first is answered. A read
//! with a token shares only with reads of the same token and range: its request goes with that token over that
//! range, so that etcd's answer is also its permission check. Reads without one share a request whatever they read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proto::etcdserverpb::{RangeRequest, RangeResponse};
use tokio::sync::oneshot;
use tonic::{Request, Status};

use super::query::KeyRange;
use crate::upstream::{Retry, Upstream, path};

/// What a waiting read receives: the revision, or why etcd could not say.
type Reply = Result<i64, Status>;

/// Who may share a request: every read without a token, or the reads of one token over one range.
type Sharing = Option<(String, KeyRange)>;

/// The shared revision requests.
pub struct Revisions {
    upstream: Arc<Upstream>,
    batches: Mutex<HashMap<Sharing, Batch>>,
}

/// The reads that arrived since the request in flight for them (if any) was sent.
#[derive(Default)]
struct Batch {
    waiting: Vec<(KeyRange, oneshot::Sender<Reply>)>,
}

impl Revisions {
    pub fn new(upstream: Arc<Upstream>) -> Arc<Self> {
        Arc::new(Self {
            upstream,
            batches: Mutex::default(),
        })
    }

    /// etcd's revision, learnt by a request sent after this call began, over the caller's `range` with its `token`
    /// (so an `Err` may be etcd's refusal of the caller).
    pub async fn current(self: &Arc<Self>, token: Option<&str>, range: &KeyRange) -> Reply {
        let (reply, answer) = oneshot::channel();
        let sharing = token.map(|token| (token.to_owned(), range.clone()));
        let start = {
            let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
            let start = !batches.contains_key(&sharing);
            let batch = batches.entry(sharing.clone()).or_default();
            batch.waiting.push((range.clone(), reply));
            start
        };
        if start {
            tokio::spawn(self.clone().ask(sharing));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Status::internal("etcd-grpc-proxy: revision request lost")))
    }

    /// Sends one request for every read of `sharing` waiting, then again while such reads keep arriving; the batch
    /// is gone when none is left.
    async fn ask(self: Arc<Self>, sharing: Sharing) {
        loop {
            let waiting = {
                let mut batches = self.batches.lock().unwrap_or_else(|p| p.into_inner());
                let batch = batches.entry(sharing.clone()).or_default();
                if batch.waiting.is_empty() {
                    batches.remove(&sharing);
                    return;
                }
                std::mem::take(&mut batch.waiting)
            };
            let token = sharing.as_ref().map(|(token, _)| token.as_str());
            let reply = self.ask_etcd(token, &waiting[0].0).await;
            for (_, read) in waiting {
                let _ = read.send(reply.clone());
            }
        }
    }

    async fn ask_etcd(&self, token: Option<&str>, range: &KeyRange) -> Reply {
        ask_count(&self.upstream, token, range, false).await
    }
}

/// A `count_only`, `limit 1` Range over `range` with `token`, linearizable or not; the revision it was answered at.
/// Costs etcd no value read, and with a token it is etcd's check that the caller may read the range.
pub async fn ask_count(
    upstream: &Arc<Upstream>,
    token: Option<&str>,
    range: &KeyRange,
    serializable: bool,
) -> Reply {
    let mut request = Request::new(RangeRequest {
        key: range.key.to_vec(),
        range_end: range.end.to_vec(),
        count_only: true,
        limit: 1,
        serializable,
        ..Default::default()
    });
    if let Some(token) = token {
        let value = token
            .parse()
            .map_err(|_| Status::invalid_argument("etcd-grpc-proxy: unusable token metadata"))?;
        request.metadata_mut().insert("token", value);
    }
    let answer: RangeResponse = upstream
        .call(Retry::ReadOnly, path::RANGE, request)
        .await?
        .into_inner();
    Ok(answer.header.map_or(0, |h| h.revision))
}
