//! The KV service: Range, Put, DeleteRange, Txn and Compact, forwarded to the active etcd endpoint.
//!
//! Reads (Range, and Txns made only of reads) are retried on another endpoint when one fails; writes only when
//! they provably never reached etcd.

use std::sync::Arc;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::kv_server::Kv;
use proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse, request_op,
};
use tonic::{Request, Response, Status};

use crate::upstream::{Retry, Upstream, forward_unary};

/// The proxy's KV service.
pub struct KvService {
    upstream: Arc<Upstream>,
}

impl KvService {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self { upstream }
    }
}

/// A Txn is a read when every operation of every branch, nested Txns included, is a Range.
pub fn txn_is_read_only(txn: &TxnRequest) -> bool {
    fn op_is_read(op: &RequestOp) -> bool {
        match &op.request {
            Some(request_op::Request::RequestRange(_)) => true,
            Some(request_op::Request::RequestTxn(nested)) => txn_is_read_only(nested),
            Some(
                request_op::Request::RequestPut(_) | request_op::Request::RequestDeleteRange(_),
            ) => false,
            None => true,
        }
    }
    txn.success.iter().chain(&txn.failure).all(op_is_read)
}

#[tonic::async_trait]
impl Kv for KvService {
    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        forward_unary!(self.upstream, Retry::ReadOnly, request, KvClient::range)
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, KvClient::put)
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, KvClient::delete_range)
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let retry = if txn_is_read_only(request.get_ref()) {
            Retry::ReadOnly
        } else {
            Retry::Write
        };
        forward_unary!(self.upstream, retry, request, KvClient::txn)
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        forward_unary!(self.upstream, Retry::Write, request, KvClient::compact)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::PutRequest;

    fn op(request: request_op::Request) -> RequestOp {
        RequestOp {
            request: Some(request),
        }
    }

    #[test]
    fn txns_with_a_write_anywhere_are_writes() {
        let read = op(request_op::Request::RequestRange(RangeRequest::default()));
        let write = op(request_op::Request::RequestPut(PutRequest::default()));
        let reads_only = TxnRequest {
            success: vec![read.clone()],
            failure: vec![read.clone()],
            ..Default::default()
        };
        assert!(txn_is_read_only(&reads_only));
        let write_in_failure = TxnRequest {
            success: vec![read.clone()],
            failure: vec![write.clone()],
            ..Default::default()
        };
        assert!(!txn_is_read_only(&write_in_failure));
        let nested_write = TxnRequest {
            success: vec![op(request_op::Request::RequestTxn(TxnRequest {
                success: vec![write],
                ..Default::default()
            }))],
            ..Default::default()
        };
        assert!(!txn_is_read_only(&nested_write));
    }
}
