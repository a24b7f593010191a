//! `--experimental-leasing-prefix=P`: the leasing protocol of etcd's `client/v3/leasing`, interoperable with Go's
//! leasing clients on the same prefix, so that linearizable single-key reads of keys this proxy owns are answered
//! without asking etcd.
//!
//! - A linearizable single-key Range (no revision, no range end) of a key nobody owns acquires it: a Txn puts the
//!   ownership key `P+key` (inside `--namespace`) under the session's lease if it does not exist, answering the read
//!   on the way. From then on the key is read locally, while the session is known alive ([`session`]).
//! - Every Put, DeleteRange and Txn with writes goes to etcd guarded: done only if no ownership key lies on what it
//!   writes. Otherwise it revokes each owner (`REVOKE` written into the ownership key, then waiting for its owner
//!   to delete it) and tries again; keys this proxy owns in what it writes are given up first. So a write through
//!   this proxy never leaves a stale copy in any leasing client of the prefix, and releases this proxy's own
//!   ownership of the keys it writes (the next read acquires them again).
//! - A write made directly on etcd by a client that knows nothing of leasing revokes nothing; each owned key's
//!   own watcher brings it to the entry (within one event delivery), which Go's leasing client never sees.
//! - A Txn is never answered locally: a read-only Txn goes to etcd as it is.
//! - Whenever etcd's auth may be on, a local answer is given only after etcd answered a `count_only` read of the
//!   key with the caller's token (the range cache's [`Permissions`]).
//!
//! - [`owned`]: the owned keys, a pure state machine.
//! - [`session`]: the session's lease and watch stream, and what ends a session.
//! - [`protocol`]: the protocol's Txns and calls.
//! - [`keys`]: where ownership keys lie.

pub mod keys;
pub mod owned;
pub mod protocol;
pub mod session;

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use prost::Message;
use proto::etcdserverpb::{
    DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, ResponseHeader, TxnRequest,
    TxnResponse, WatchCreateRequest, request_op, response_op,
};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::cache::Cache;
use crate::cache::consistent::ask_count;
use crate::cache::permission::Permissions;
use crate::cache::query::KeyRange;
use crate::config::Config;
use crate::lease::LeaseService;
use crate::metrics::Metrics;
use crate::upstream::identity::Identity;
use crate::upstream::{Forwarded, Retry, Upstream};
use crate::watch::WatchService;
use crate::watch::hub::HubConfig;
use keys::OwnershipKeys;
use protocol::Calls;
use session::Shared;

/// The KV calls the protocol serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCall {
    Range,
    Put,
    DeleteRange,
    Txn,
}

impl KvCall {
    pub fn of(path: &str) -> Option<Self> {
        Some(match path {
            "/etcdserverpb.KV/Range" => Self::Range,
            "/etcdserverpb.KV/Put" => Self::Put,
            "/etcdserverpb.KV/DeleteRange" => Self::DeleteRange,
            "/etcdserverpb.KV/Txn" => Self::Txn,
            _ => return None,
        })
    }
}

/// The leasing protocol of one running proxy.
pub struct Leasing {
    shared: Arc<Shared>,
    calls: Arc<Calls>,
    keys: OwnershipKeys,
    metrics: Metrics,
    /// The range cache, for reads the protocol does not answer.
    cache: Option<Arc<Cache>>,
    /// What the proxy knows of etcd's auth, for local answers.
    permissions: Permissions,
}

impl Leasing {
    /// The protocol with `--experimental-leasing-prefix`, or `None` without it; starts the session.
    pub fn new(
        upstream: &Arc<Upstream>,
        metrics: &Metrics,
        config: &Config,
        lease: Arc<LeaseService>,
        identity: Option<Arc<Identity>>,
        hub: HubConfig,
        cache: Option<Arc<Cache>>,
    ) -> Option<Arc<Self>> {
        let keys = OwnershipKeys::new(&config.namespace, &config.leasing_prefix)?;
        // Its watchers run on a watch service of their own, with the proxy's identity, on keys as etcd sees them.
        let hub = HubConfig {
            own_identity: identity.is_some(),
            hidden_prefix: 0,
            max_join_lag: 0,
            ..hub
        };
        let watch = Arc::new(WatchService::new(
            upstream.clone(),
            metrics.clone(),
            hub,
            1,
            identity.clone(),
            None,
        ));
        let calls = Arc::new(Calls {
            upstream: upstream.clone(),
            lease,
            identity,
            watch: watch.clone(),
        });
        let shared = Arc::new(Shared::default());
        tokio::spawn(session::run(
            shared.clone(),
            calls.clone(),
            keys.clone(),
            watch,
            metrics.clone(),
            config.leasing_ttl,
        ));
        Some(Arc::new(Self {
            shared,
            calls,
            keys,
            metrics: metrics.clone(),
            cache,
            permissions: Permissions::default(),
        }))
    }

    /// Serves one KV call (keys as etcd sees them, inside the namespace). `as_is`: how the call is retried when it
    /// goes to etcd unchanged (a read, or a write the protocol has nothing to guard in).
    pub async fn serve(
        &self,
        call: KvCall,
        path: PathAndQuery,
        request: Request<Bytes>,
        as_is: Retry,
    ) -> Result<Response<Bytes>, Status> {
        let forwarded = Forwarded::capture(&request);
        let bytes = request.get_ref().clone();
        let written = match call {
            KvCall::Range => return self.range(path, request).await,
            KvCall::Put => PutRequest::decode(bytes).ok().map(|put| {
                let key = put.key.clone();
                (
                    request_op::Request::RequestPut(put),
                    vec![(key, Vec::new())],
                )
            }),
            KvCall::DeleteRange => DeleteRangeRequest::decode(bytes).ok().map(|delete| {
                let range = (delete.key.clone(), delete.range_end.clone());
                (request_op::Request::RequestDeleteRange(delete), vec![range])
            }),
            KvCall::Txn => TxnRequest::decode(bytes).ok().and_then(|txn| {
                let mut written = Vec::new();
                protocol::written_by(&txn, &mut written);
                (!written.is_empty()).then_some((request_op::Request::RequestTxn(txn), written))
            }),
        };
        let written = written.map(|(op, written)| {
            let leased: Vec<_> = written
                .into_iter()
                .filter(|(key, _)| !self.keys.is_ownership_key(key))
                .collect();
            (op, leased)
        });
        match written {
            Some((op, written)) if !written.is_empty() => {
                let answer = self.write(&forwarded, op, written).await?;
                Ok(Response::new(Bytes::from(answer)))
            }
            // Unreadable (etcd judges it), read-only, or only about ownership keys themselves: as it is.
            _ => self.calls.upstream.unary(as_is, path, request).await,
        }
    }

    /// A Range: answered from an owned key's entry while the session is known alive, acquiring the key on a
    /// linearizable read; any other read goes on as without leasing.
    async fn range(
        &self,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        let forwarded = Forwarded::capture(&request);
        let leasable = RangeRequest::decode(request.get_ref().clone())
            .ok()
            .filter(|read| {
                read.range_end.is_empty()
                    && read.revision == 0
                    && !self.keys.is_ownership_key(&read.key)
                    // Only etcd can say it has no leader.
                    && !forwarded.requires_leader()
            });
        let Some(read) = leasable else {
            return self.pass_read(path, request).await;
        };
        // A local answer is given only to a caller etcd lets read the key: checked with etcd whenever auth may be
        // on, as the range cache checks its copies' readers.
        let token = forwarded.token();
        if self.permissions.must_check(token.as_deref()) && self.may_answer_locally(&read.key) {
            let range = KeyRange {
                key: read.key.clone().into(),
                end: Bytes::new(),
            };
            let check = ask_count(&self.calls.upstream, token.as_deref(), &range, true).await;
            self.permissions.checked(token.as_deref(), &check);
            match check {
                Ok(_) => {}
                Err(status) if crate::error::is_endpoint_failure(&status) => {
                    return self.pass_read(path, request).await;
                }
                Err(status) => return Err(crate::error::to_client(status)),
            }
        }
        let now = Instant::now();
        let decided = {
            let mut state = self.shared.lock();
            match state.alive(now) {
                None => Err(None),
                Some((lease, generation)) => {
                    if let Some(entry) = state.owned.servable(&read.key, generation) {
                        let mut answer = owned::answer(entry, &read);
                        // No leasing client wrote the key since the entry's revision (it would have revoked this
                        // proxy first): the answer holds at the newest revision the proxy returned, so reads never
                        // go back in revision (`--experimental-serializable-ordering`).
                        let floor = self.calls.upstream.revision_floor();
                        if let Some(header) = &mut answer.header {
                            header.revision = header.revision.max(floor);
                        }
                        Err(Some(answer))
                    } else if read.serializable || !state.owned.may_acquire(&read.key, now) {
                        Err(None)
                    } else {
                        let watch_id = state.owned.begin_acquire(&read.key, generation);
                        Ok((lease, generation, watch_id))
                    }
                }
            }
        };
        let (lease, generation, watch_id) = match decided {
            Ok(acquiring) => acquiring,
            Err(Some(local)) => {
                self.metrics.leasing_local_reads.inc();
                let revision = local.header.map_or(0, |h| h.revision);
                self.calls.upstream.returned_revision(revision);
                return Ok(Response::new(Bytes::from(local.encode_to_vec())));
            }
            Err(None) => return self.pass_read(path, request).await,
        };
        let key = read.key.clone();
        let Some(ownership_key) = self.keys.of(&key) else {
            self.shared.lock().owned.abandon_acquire(&key);
            return self.pass_read(path, request).await;
        };
        let txn = protocol::acquire(&key, &ownership_key, lease, read);
        let answer = match self.calls.txn(&forwarded, txn).await {
            Ok(answer) => answer,
            Err(status) => {
                self.shared.lock().owned.abandon_acquire(&key);
                if session::is_lease_not_found(&status) {
                    self.shared.report_lease_gone(lease);
                    return self.pass_read(path, request).await;
                }
                return Err(status);
            }
        };
        let header = answer.header.unwrap_or_default();
        let ranges: Vec<RangeResponse> = answer
            .responses
            .into_iter()
            .map(|op| match op.response {
                Some(response_op::Response::ResponseRange(range)) => range,
                _ => RangeResponse::default(),
            })
            .collect();
        let ownership = match answer.succeeded {
            true => Some(header.revision),
            false => ranges
                .get(1)
                .and_then(|r| r.kvs.first())
                .filter(|kv| kv.lease == lease && kv.value != protocol::REVOKE)
                .map(|kv| kv.create_revision),
        };
        let kv = ranges.get(2).and_then(|r| r.kvs.first()).cloned();
        {
            let mut state = self.shared.lock();
            if state
                .owned
                .finish_acquire(&key, generation, ownership, kv, header)
                && let Some(live) = &state.live
            {
                live.watch.create(WatchCreateRequest {
                    key: key.clone(),
                    start_revision: header.revision + 1,
                    watch_id,
                    ..Default::default()
                });
            }
            self.metrics
                .leasing_owned_keys
                .set(state.owned.len() as i64);
        }
        let mut user = ranges.into_iter().next().unwrap_or_default();
        user.header = Some(header);
        self.calls.upstream.learnt_revision(header.revision);
        Ok(Response::new(Bytes::from(user.encode_to_vec())))
    }

    /// Whether a read of `key` would be answered locally now.
    fn may_answer_locally(&self, key: &[u8]) -> bool {
        let state = self.shared.lock();
        state
            .alive(Instant::now())
            .is_some_and(|(_, generation)| state.owned.servable(key, generation).is_some())
    }

    async fn pass_read(
        &self,
        path: PathAndQuery,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        match &self.cache {
            Some(cache) => cache.range(path, request).await,
            None => {
                self.calls
                    .upstream
                    .unary(Retry::ReadOnly, path, request)
                    .await
            }
        }
    }

    /// A client's write, guarded against every ownership key on what it writes (revoking their owners, giving up
    /// this proxy's own); the answer is the client's own operation's.
    async fn write(
        &self,
        forwarded: &Forwarded,
        user: request_op::Request,
        written: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> Result<Vec<u8>, Status> {
        let ownership_ranges: Vec<(Vec<u8>, Vec<u8>)> = written
            .iter()
            .filter_map(|(key, end)| match end.is_empty() {
                true => self.keys.of(key).map(|owner| (owner, Vec::new())),
                false => self.keys.of_range(key, end),
            })
            .collect();
        let mut released = Vec::new();
        {
            let mut state = self.shared.lock();
            for (key, end) in &written {
                for (owned, ownership_revision, watch_id) in state.owned.begin_write(key, end) {
                    if let Some(live) = &state.live {
                        live.watch.cancel(watch_id);
                    }
                    released.push((owned, ownership_revision));
                }
            }
            self.metrics
                .leasing_owned_keys
                .set(state.owned.len() as i64);
        }
        let _writing = Writing {
            shared: &self.shared,
            written: &written,
        };
        for (key, ownership_revision) in released {
            if let Some(ownership_key) = self.keys.of(&key) {
                self.calls
                    .rescind(ownership_key, ownership_revision + 1)
                    .await;
            }
        }
        let guarded = protocol::guarded(protocol::op(user), &ownership_ranges);
        loop {
            let answer = self.calls.txn(forwarded, guarded.clone()).await?;
            if answer.succeeded {
                return Ok(unwrap_answer(answer));
            }
            let lease = self.shared.lock().live.as_ref().map(|live| live.lease);
            for response in answer.responses {
                let Some(response_op::Response::ResponseRange(owners)) = response.response else {
                    continue;
                };
                for owner in owners.kvs {
                    if lease.is_some_and(|lease| lease == owner.lease) {
                        self.calls
                            .rescind(owner.key.to_vec(), owner.create_revision + 1)
                            .await;
                    } else {
                        self.calls
                            .revoke(forwarded, &owner.key, owner.create_revision)
                            .await?;
                    }
                }
            }
        }
    }
}

/// Ends a write's mark on its ranges however the write ends.
struct Writing<'a> {
    shared: &'a Shared,
    written: &'a [(Vec<u8>, Vec<u8>)],
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        for (key, end) in self.written {
            state.owned.end_write(key, end);
        }
    }
}

/// The client's operation's answer out of the guarded Txn's, with the Txn's header.
fn unwrap_answer(answer: TxnResponse) -> Vec<u8> {
    let header: Option<ResponseHeader> = answer.header;
    match answer.responses.into_iter().next().and_then(|r| r.response) {
        Some(response_op::Response::ResponsePut(mut put)) => {
            put.header = header;
            put.encode_to_vec()
        }
        Some(response_op::Response::ResponseDeleteRange(mut delete)) => {
            delete.header = header;
            delete.encode_to_vec()
        }
        Some(response_op::Response::ResponseTxn(mut txn)) => {
            txn.header = header;
            txn.encode_to_vec()
        }
        Some(response_op::Response::ResponseRange(mut range)) => {
            range.header = header;
            range.encode_to_vec()
        }
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::{PutResponse, ResponseOp};

    #[test]
    fn a_guarded_writes_answer_is_the_clients_own_with_the_txns_header() {
        let header = ResponseHeader {
            revision: 42,
            ..Default::default()
        };
        let answer = TxnResponse {
            header: Some(header),
            succeeded: true,
            responses: vec![ResponseOp {
                response: Some(response_op::Response::ResponsePut(PutResponse::default())),
            }],
        };
        let put = PutResponse::decode(Bytes::from(unwrap_answer(answer))).unwrap();
        assert_eq!(put.header.unwrap().revision, 42);
    }

    #[test]
    fn only_kv_reads_and_writes_take_the_protocol() {
        assert_eq!(KvCall::of("/etcdserverpb.KV/Range"), Some(KvCall::Range));
        assert_eq!(KvCall::of("/etcdserverpb.KV/Txn"), Some(KvCall::Txn));
        assert_eq!(KvCall::of("/etcdserverpb.KV/Compact"), None);
        assert_eq!(KvCall::of("/etcdserverpb.KV/RangeStream"), None);
    }
}
