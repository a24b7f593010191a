//! What comes back, and how two answers are compared: unary answers whole, Watch streams per watcher (Created
//! answer, events, cancels), with the few normalisations a comparison needs, each with its reason.

use std::collections::BTreeMap;
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeResponse, LeaseGrantRequest,
    LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseTimeToLiveRequest,
    LeaseTimeToLiveResponse, PutResponse, RangeResponse, TxnResponse, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse, response_op,
};
use proto::mvccpb::{Event, KeyValue};
use sim::topology;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use super::case::{
    Bytes, Op, delete_request, put_request, range_request, txn_request, watch_create,
};

/// One answer, as compared.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Range(RangeResponse),
    Put(PutResponse),
    Delete(DeleteRangeResponse),
    Txn(TxnResponse),
    Compact(CompactionResponse),
    LeaseGrant(LeaseGrantResponse),
    LeaseRevoke(LeaseRevokeResponse),
    TimeToLive(LeaseTimeToLiveResponse),
    /// A watch create's answer (its Created response).
    Watch(WatchResponse),
    Refused {
        code: Code,
        message: String,
    },
    /// Nothing within [`WAIT`], or the watch stream broke: why.
    Missing(String),
}

/// How long an answer may take (virtual time; every answer normally takes milliseconds).
const WAIT: Duration = Duration::from_secs(5);

async fn answer<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    wrap: impl FnOnce(T) -> Answer,
) -> Answer {
    match tokio::time::timeout(WAIT, call).await {
        Ok(Ok(response)) => wrap(response.into_inner()),
        Ok(Err(status)) => Answer::Refused {
            code: status.code(),
            message: status.message().to_string(),
        },
        Err(_) => Answer::Missing(format!("no answer within {WAIT:?}")),
    }
}

/// One Watch stream and everything received on it.
pub struct WatchLine {
    requests: mpsc::Sender<WatchRequest>,
    responses: Streaming<WatchResponse>,
    received: Vec<WatchResponse>,
    creates: usize,
    /// Why the stream is no longer read (it ended or failed, or an awaited answer did not come).
    broken: Option<String>,
}

impl WatchLine {
    async fn open(client: &mut WatchClient<Channel>) -> Result<Self, String> {
        let (requests, rx) = mpsc::channel(16);
        let responses = tokio::time::timeout(WAIT, client.watch(ReceiverStream::new(rx)))
            .await
            .map_err(|_| format!("Watch not answered within {WAIT:?}"))?
            .map_err(|s| format!("Watch refused: {:?} {}", s.code(), s.message()))?
            .into_inner();
        Ok(Self {
            requests,
            responses,
            received: Vec::new(),
            creates: 0,
            broken: None,
        })
    }

    async fn send(&mut self, request: RequestUnion) {
        let request = WatchRequest {
            request_union: Some(request),
        };
        if self.requests.send(request).await.is_err() && self.broken.is_none() {
            self.broken = Some("the Watch stream's request side closed".into());
        }
    }

    /// Reads until `done` holds for what was received; false if the stream ends, fails or [`WAIT`] passes first.
    async fn read_until(&mut self, what: &str, done: impl Fn(&[WatchResponse]) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !done(&self.received) {
            if self.broken.is_some() {
                return false;
            }
            match tokio::time::timeout_at(deadline, self.responses.message()).await {
                Ok(Ok(Some(response))) => self.received.push(response),
                Ok(Ok(None)) => self.broken = Some(format!("stream ended awaiting {what}")),
                Ok(Err(status)) => {
                    self.broken = Some(format!(
                        "stream failed ({:?} {}) awaiting {what}",
                        status.code(),
                        status.message()
                    ))
                }
                Err(_) => self.broken = Some(format!("no {what} within {WAIT:?}")),
            }
        }
        true
    }

    /// Creates a watcher and returns its Created answer (creates are answered in order).
    async fn create(&mut self, create: WatchCreateRequest) -> Answer {
        self.send(RequestUnion::CreateRequest(create)).await;
        self.creates += 1;
        let wanted = self.creates;
        let created = |received: &[WatchResponse]| received.iter().filter(|r| r.created).count();
        if !self
            .read_until("the Created answer", |r| created(r) >= wanted)
            .await
        {
            return Answer::Missing(self.broken.clone().unwrap_or_default());
        }
        let answer = self.received.iter().filter(|r| r.created).nth(wanted - 1);
        Answer::Watch(answer.cloned().unwrap_or_default())
    }

    /// Asks for progress and reads until its answer: every event through the revision it reports has arrived.
    pub async fn fence(&mut self) -> Result<(), String> {
        let progress = |r: &WatchResponse| {
            r.watch_id == -1 && !r.created && !r.canceled && r.events.is_empty()
        };
        let before = self.received.iter().filter(|r| progress(r)).count();
        self.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await;
        if self
            .read_until("the progress answer", |r| {
                r.iter().filter(|r| progress(r)).count() > before
            })
            .await
        {
            Ok(())
        } else {
            Err(self.broken.clone().unwrap_or_default())
        }
    }

    /// What each watcher, in the order of the creates, received: its Created answer, its events, its cancels.
    pub fn watchers(&self) -> Vec<WatcherSeen> {
        let mut seen: Vec<WatcherSeen> = Vec::new();
        let mut by_id: BTreeMap<i64, usize> = BTreeMap::new();
        for response in &self.received {
            if response.created {
                if response.watch_id != -1 {
                    by_id.insert(response.watch_id, seen.len());
                }
                seen.push(WatcherSeen {
                    created: response.clone(),
                    events: Vec::new(),
                    cancels: Vec::new(),
                });
                continue;
            }
            let Some(&index) = by_id.get(&response.watch_id) else {
                continue;
            };
            seen[index].events.extend(response.events.iter().cloned());
            if response.canceled {
                // The header of a cancel is not compared: etcd sends 0 for a compaction, a proxy its own.
                seen[index].cancels.push(WatchResponse {
                    header: None,
                    ..response.clone()
                });
            }
        }
        seen
    }
}

/// What one watcher received, as compared: event responses are flattened (their headers tell only when each was
/// sent, which differs between paths).
#[derive(Clone, Debug, PartialEq)]
pub struct WatcherSeen {
    pub created: WatchResponse,
    pub events: Vec<Event>,
    pub cancels: Vec<WatchResponse>,
}

/// Somewhere requests go: a proxy, or a model served directly.
pub struct Target {
    pub name: String,
    pub kv: KvClient<Channel>,
    pub lease: LeaseClient<Channel>,
    pub watch: WatchClient<Channel>,
    pub line: Option<WatchLine>,
}

impl Target {
    pub fn new(name: String, authority: &str) -> Self {
        let channel = topology::channel(authority);
        Self {
            name,
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel),
            line: None,
        }
    }

    pub async fn call(&mut self, op: &Op, ns: &[Bytes]) -> Answer {
        match op {
            Op::Range(op) => answer(self.kv.range(range_request(op, ns)), Answer::Range).await,
            Op::Put(op) => answer(self.kv.put(put_request(op, ns)), Answer::Put).await,
            Op::Delete(op) => {
                answer(self.kv.delete_range(delete_request(op, ns)), Answer::Delete).await
            }
            Op::Txn(op) => answer(self.kv.txn(txn_request(op, ns)), Answer::Txn).await,
            Op::Compact(revision) => {
                let request = CompactionRequest {
                    revision: *revision,
                    physical: false,
                };
                answer(self.kv.compact(request), Answer::Compact).await
            }
            Op::LeaseGrant(id) => {
                let request = LeaseGrantRequest { ttl: 3600, id: *id };
                answer(self.lease.lease_grant(request), Answer::LeaseGrant).await
            }
            Op::LeaseRevoke(id) => {
                let request = LeaseRevokeRequest { id: *id };
                answer(self.lease.lease_revoke(request), Answer::LeaseRevoke).await
            }
            Op::TimeToLive { lease, keys } => {
                let request = LeaseTimeToLiveRequest {
                    id: *lease,
                    keys: *keys,
                };
                answer(self.lease.lease_time_to_live(request), Answer::TimeToLive).await
            }
            Op::Watch(op) => {
                if self.line.is_none() {
                    match WatchLine::open(&mut self.watch).await {
                        Ok(line) => self.line = Some(line),
                        Err(why) => return Answer::Missing(why),
                    }
                }
                let line = self.line.as_mut().expect("opened above");
                line.create(watch_create(op, ns)).await
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Normalising.

/// Zeroes what two namespaces sharing one model cannot agree on with a model of their own: revisions (headers, a
/// key's create and mod revision).
pub fn strip_revisions(answer: &mut Answer) {
    fn kv(kv: &mut KeyValue) {
        kv.create_revision = 0;
        kv.mod_revision = 0;
    }
    fn txn(response: &mut TxnResponse) {
        response.header = None;
        for op in &mut response.responses {
            match &mut op.response {
                Some(response_op::Response::ResponseRange(r)) => {
                    r.header = None;
                    r.kvs.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponsePut(r)) => {
                    r.header = None;
                    r.prev_kv.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponseDeleteRange(r)) => {
                    r.header = None;
                    r.prev_kvs.iter_mut().for_each(kv);
                }
                Some(response_op::Response::ResponseTxn(r)) => txn(r),
                None => {}
            }
        }
    }
    match answer {
        Answer::Range(r) => {
            r.header = None;
            r.kvs.iter_mut().for_each(kv);
        }
        Answer::Put(r) => {
            r.header = None;
            r.prev_kv.iter_mut().for_each(kv);
        }
        Answer::Delete(r) => {
            r.header = None;
            r.prev_kvs.iter_mut().for_each(kv);
        }
        Answer::Txn(r) => txn(r),
        Answer::Watch(r) => r.header = None,
        Answer::Compact(r) => r.header = None,
        Answer::LeaseGrant(r) => r.header = None,
        Answer::LeaseRevoke(r) => r.header = None,
        Answer::TimeToLive(r) => r.header = None,
        Answer::Refused { .. } | Answer::Missing(_) => {}
    }
}

pub fn strip_event_revisions(watcher: &mut WatcherSeen) {
    watcher.created.header = None;
    for event in &mut watcher.events {
        for kv in event.kv.iter_mut().chain(event.prev_kv.iter_mut()) {
            kv.create_revision = 0;
            kv.mod_revision = 0;
        }
    }
}

/// A lease's remaining TTL is read at a slightly different instant on each path: a second boundary may fall
/// between them.
pub fn align_ttl(subject: &mut Answer, reference: &Answer) {
    if let (Answer::TimeToLive(s), Answer::TimeToLive(r)) = (subject, reference)
        && (s.ttl - r.ttl).abs() <= 1
    {
        s.ttl = r.ttl;
    }
}
