//! The leasing protocol's messages and calls to etcd: acquiring a key (a guarded Txn), the guarded write of a
//! client's Put, DeleteRange or Txn, revoking another client's ownership (`REVOKE` written into its ownership key,
//! then waiting for its deletion), and giving up this proxy's own ownership (a guarded delete).

use std::sync::Arc;
use std::time::Duration;

use proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use proto::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseKeepAliveResponse, PutRequest, RangeRequest, RequestOp,
    TxnRequest, TxnResponse, WatchCreateRequest, request_op,
};
use proto::mvccpb::event::EventType;
use tokio::time::Instant;
use tonic::Status;

use crate::lease::LeaseService;
use crate::upstream::identity::{Identity, own_token, own_write};
use crate::upstream::{Forwarded, Retry, Upstream};
use crate::watch::{LocalStream, WatchService};

/// Txn's path.
pub const TXN: &str = "/etcdserverpb.KV/Txn";
/// What a revoking writer writes into an ownership key (etcd's leasing clients' word).
pub const REVOKE: &[u8] = b"REVOKE";
/// Attempts at giving up an ownership key before the session's lease is left to take it.
const RESCIND_ATTEMPTS: usize = 5;

/// The calls the protocol makes to etcd.
pub struct Calls {
    pub upstream: Arc<Upstream>,
    pub lease: Arc<LeaseService>,
    pub identity: Option<Arc<Identity>>,
    pub watch: Arc<WatchService>,
}

pub fn op(request: request_op::Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

pub fn get(key: &[u8], range_end: &[u8]) -> RequestOp {
    op(request_op::Request::RequestRange(RangeRequest {
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        ..Default::default()
    }))
}

/// `create_revision(key [, range_end]) <result> revision`.
pub fn create_revision(
    key: &[u8],
    range_end: &[u8],
    result: CompareResult,
    revision: i64,
) -> Compare {
    Compare {
        result: result as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: range_end.to_vec(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
    }
}

/// The Txn that acquires `key` for `lease`, answering `read` on the way (etcd's `acquire`): if nobody owns the key
/// and the key has no lease of its own (as etcd's leasing clients require: such a key goes with its lease, outside
/// the protocol), put the ownership key under `lease`. Either way: operation 0 answers `read`, 2 is the whole key;
/// 1 is the put, or on failure the ownership key as it is (the proxy may own it already).
pub fn acquire(key: &[u8], ownership_key: &[u8], lease: i64, read: RangeRequest) -> TxnRequest {
    TxnRequest {
        compare: vec![
            create_revision(ownership_key, b"", CompareResult::Equal, 0),
            Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Lease as i32,
                key: key.to_vec(),
                range_end: Vec::new(),
                target_union: Some(TargetUnion::Lease(0)),
            },
        ],
        success: vec![
            op(request_op::Request::RequestRange(read.clone())),
            op(request_op::Request::RequestPut(PutRequest {
                key: ownership_key.to_vec(),
                lease,
                ..Default::default()
            })),
            get(key, b""),
        ],
        failure: vec![
            op(request_op::Request::RequestRange(read)),
            get(ownership_key, b""),
            get(key, b""),
        ],
    }
}

/// The client's operation `user`, done only if no ownership key lies on what it writes (`ownership_ranges`);
/// otherwise the ownership keys there are read, to be revoked.
pub fn guarded(user: RequestOp, ownership_ranges: &[(Vec<u8>, Vec<u8>)]) -> TxnRequest {
    TxnRequest {
        compare: ownership_ranges
            .iter()
            .map(|(start, end)| create_revision(start, end, CompareResult::Less, 1))
            .collect(),
        success: vec![user],
        failure: ownership_ranges
            .iter()
            .map(|(start, end)| get(start, end))
            .collect(),
    }
}

/// Every key or range a Txn's operations write, in either branch, nested Txns included.
pub fn written_by(txn: &TxnRequest, into: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(request_op::Request::RequestPut(put)) => into.push((put.key.clone(), Vec::new())),
            Some(request_op::Request::RequestDeleteRange(delete)) => {
                into.push((delete.key.clone(), delete.range_end.clone()))
            }
            Some(request_op::Request::RequestTxn(nested)) => written_by(nested, into),
            _ => {}
        }
    }
}

impl Calls {
    /// The proxy's own token, if it has an identity.
    async fn token(&self) -> Result<Option<String>, Status> {
        own_token(self.identity.as_ref(), &self.upstream).await
    }

    /// A call of the proxy's own (the session's lease, giving up an ownership key).
    pub async fn own<Req, Resp>(&self, path: &'static str, message: Req) -> Result<Resp, Status>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        own_write(self.identity.as_ref(), &self.upstream, path, message).await
    }

    /// One renewal of the session's lease.
    pub async fn renew(&self, lease: i64) -> Result<LeaseKeepAliveResponse, Status> {
        let token = self.token().await?;
        self.lease.renew(lease, token).await
    }

    /// A Txn made for a client, with its token.
    pub async fn txn(&self, forwarded: &Forwarded, txn: TxnRequest) -> Result<TxnResponse, Status> {
        self.upstream
            .call(Retry::Write, TXN, forwarded.request(txn))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Gives up this proxy's ownership key, if its create revision is still before `before` (it is not a newer
    /// acquisition's).
    pub async fn rescind(&self, ownership_key: Vec<u8>, before: i64) {
        let txn = TxnRequest {
            compare: vec![create_revision(
                &ownership_key,
                b"",
                CompareResult::Less,
                before,
            )],
            success: vec![op(request_op::Request::RequestDeleteRange(
                DeleteRangeRequest {
                    key: ownership_key.clone(),
                    ..Default::default()
                },
            ))],
            failure: Vec::new(),
        };
        for _ in 0..RESCIND_ATTEMPTS {
            match self.own::<_, TxnResponse>(TXN, txn.clone()).await {
                Ok(_) => return,
                Err(status) => {
                    tracing::debug!(%status, key = %String::from_utf8_lossy(&ownership_key), "cannot give up an ownership key")
                }
            }
        }
    }

    /// Revokes another client's ownership key (`REVOKE` written into it, its lease kept) and waits for its owner to
    /// delete it, or for its lease to end it. `created` is its create revision as read: a newer one is not revoked
    /// (the caller reads again).
    pub async fn revoke(
        &self,
        forwarded: &Forwarded,
        ownership_key: &[u8],
        created: i64,
    ) -> Result<(), Status> {
        let txn = TxnRequest {
            compare: vec![create_revision(
                ownership_key,
                b"",
                CompareResult::Equal,
                created,
            )],
            success: vec![op(request_op::Request::RequestPut(PutRequest {
                key: ownership_key.to_vec(),
                value: REVOKE.to_vec(),
                ignore_lease: true,
                ..Default::default()
            }))],
            failure: Vec::new(),
        };
        let answer = self.txn(forwarded, txn).await?;
        if !answer.succeeded {
            return Ok(());
        }
        let revision = answer.header.map_or(0, |h| h.revision);
        self.wait_deleted(ownership_key, revision, forwarded.deadline)
            .await
    }

    /// Waits until `key` is deleted after `revision`.
    async fn wait_deleted(
        &self,
        key: &[u8],
        revision: i64,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        let LocalStream {
            handle,
            mut responses,
            mut aborted,
        } = self.watch.attach(None, 16);
        handle.create(WatchCreateRequest {
            key: key.to_vec(),
            start_revision: revision + 1,
            ..Default::default()
        });
        let deleted = async {
            loop {
                tokio::select! {
                    biased;
                    Some(status) = aborted.recv() => return Err(status),
                    response = responses.recv() => {
                        let Some(response) = response else {
                            return Err(Status::unavailable("etcd-grpc-proxy: leasing watch ended"));
                        };
                        if response.canceled {
                            return Err(Status::unavailable(format!(
                                "etcd-grpc-proxy: cannot watch a revoked ownership key: {}",
                                response.cancel_reason
                            )));
                        }
                        if response.events.iter().any(|e| e.r#type == EventType::Delete as i32) {
                            return Ok(());
                        }
                    }
                }
            }
        };
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::time::timeout_at(deadline.unwrap_or(far), deleted)
            .await
            .map_err(|_| Status::deadline_exceeded("context deadline exceeded"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_txns_writes_are_gathered_from_both_branches_and_nested_txns() {
        let put = |k: &str| {
            op(request_op::Request::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            }))
        };
        let txn = TxnRequest {
            success: vec![put("a"), get(b"r", b"")],
            failure: vec![op(request_op::Request::RequestTxn(TxnRequest {
                failure: vec![op(request_op::Request::RequestDeleteRange(
                    DeleteRangeRequest {
                        key: b"d".to_vec(),
                        range_end: b"e".to_vec(),
                        ..Default::default()
                    },
                ))],
                ..Default::default()
            }))],
            ..Default::default()
        };
        let mut written = Vec::new();
        written_by(&txn, &mut written);
        assert_eq!(
            written,
            vec![(b"a".to_vec(), Vec::new()), (b"d".to_vec(), b"e".to_vec())]
        );
    }

    #[test]
    fn a_guarded_write_requires_no_ownership_key_on_what_it_writes() {
        let txn = guarded(get(b"x", b""), &[(b"L/a".to_vec(), Vec::new())]);
        assert_eq!(txn.compare[0].target, CompareTarget::Create as i32);
        assert_eq!(txn.compare[0].result, CompareResult::Less as i32);
        assert_eq!(
            txn.compare[0].target_union,
            Some(TargetUnion::CreateRevision(1))
        );
        assert_eq!(txn.failure.len(), 1, "reads the ownership keys to revoke");
    }
}
