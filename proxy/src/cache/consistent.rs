//! The revision a linearizable read from the cache must reach: etcd's revision at some moment after the read
//! arrived, learnt by a linearizable Range that costs etcd almost nothing (`count_only`, `limit 1`) and began after
//! the read arrived. Such a Range is answered only once etcd has applied every write acknowledged before it began,
//! so a copy at or past its revision reflects all of them (as etcd's own cache library and Kubernetes' consistent
//! reads from cache do).
//!
//! Reads share these requests: one is in flight at a time, and it answers every read that arrived before it was
//! sent; reads arriving meanwhile wait for the next one, which is sent as soon as the first is answered. The cache
//! answers only calls without a token (auth is off or not asked for), so one request serves every range.

use std::sync::{Arc, Mutex};

use proto::etcdserverpb::{RangeRequest, RangeResponse};
use tokio::sync::oneshot;
use tonic::{Request, Status};

use crate::upstream::{Retry, Upstream, path};

/// What a waiting read receives: the revision, or why etcd could not say.
type Reply = Result<i64, Status>;

/// The shared revision requests.
pub struct Revisions {
    upstream: Arc<Upstream>,
    state: Mutex<Batch>,
}

#[derive(Default)]
struct Batch {
    asking: bool,
    /// Reads that arrived since the request in flight was sent.
    waiting: Vec<(Vec<u8>, oneshot::Sender<Reply>)>,
}

impl Revisions {
    pub fn new(upstream: Arc<Upstream>) -> Arc<Self> {
        Arc::new(Self {
            upstream,
            state: Mutex::default(),
        })
    }

    /// etcd's revision, learnt by a request sent after this call began. `key` is the caller's (a key it reads).
    pub async fn current(self: &Arc<Self>, key: &[u8]) -> Reply {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut batch = self.state.lock().unwrap_or_else(|p| p.into_inner());
            batch.waiting.push((key.to_vec(), reply));
            !std::mem::replace(&mut batch.asking, true)
        };
        if start {
            tokio::spawn(self.clone().ask());
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Status::internal("etcd-grpc-proxy: revision request lost")))
    }

    /// Sends one request for every read waiting, then again while reads keep arriving.
    async fn ask(self: Arc<Self>) {
        loop {
            let waiting = {
                let mut batch = self.state.lock().unwrap_or_else(|p| p.into_inner());
                if batch.waiting.is_empty() {
                    batch.asking = false;
                    return;
                }
                std::mem::take(&mut batch.waiting)
            };
            let key = waiting[0].0.clone();
            let reply = self.ask_etcd(key).await;
            for (_, read) in waiting {
                let _ = read.send(reply.clone());
            }
        }
    }

    async fn ask_etcd(&self, key: Vec<u8>) -> Reply {
        let request = RangeRequest {
            key,
            count_only: true,
            limit: 1,
            ..Default::default()
        };
        let answer: RangeResponse = self
            .upstream
            .call(Retry::ReadOnly, path::RANGE, Request::new(request))
            .await?
            .into_inner();
        Ok(answer.header.map_or(0, |h| h.revision))
    }
}
