//! The KV service of one member: every call runs on the shared store under its lock, after the key ranges it names
//! are recorded in the history.

use std::time::Duration;

use proto::etcdserverpb::kv_server::Kv;
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use super::cluster::Cluster;
use super::history::{AccessKind, History};

pub struct KvService {
    pub cluster: Cluster,
    pub member: usize,
}

#[tonic::async_trait]
impl Kv for KvService {
    type RangeStreamStream = futures::stream::Empty<Result<RangeStreamResponse, Status>>;

    /// The model is an etcd before 3.7, which has no RangeStream: grpc-go's answer to a method it lacks.
    async fn range_stream(
        &self,
        _request: Request<RangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(Status::unimplemented(
            "unknown method RangeStream for service etcdserverpb.KV",
        ))
    }

    async fn range(
        &self,
        request: Request<RangeRequest>,
    ) -> Result<Response<RangeResponse>, Status> {
        let request = request.into_inner();
        let mut response = self.cluster.with_store(|store, now| {
            let response = store.range(&request)?;
            store.history.record_access(
                now,
                self.member,
                AccessKind::Range,
                &request.key,
                &request.range_end,
            );
            Ok::<_, Status>(response)
        })?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let mut response = self.cluster.with_store(|store, now| {
            let response = store.put(&request, now)?;
            store
                .history
                .record_access(now, self.member, AccessKind::Put, &request.key, b"");
            Ok::<_, Status>(response)
        })?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let request = request.into_inner();
        let mut response = self.cluster.with_store(|store, now| {
            let response = store.delete_range(&request, now)?;
            store.history.record_access(
                now,
                self.member,
                AccessKind::DeleteRange,
                &request.key,
                &request.range_end,
            );
            Ok::<_, Status>(response)
        })?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        let mut response = self.cluster.with_store(|store, now| {
            let response = store.txn(&request, now)?;
            record_txn(&mut store.history, now, self.member, &request);
            Ok::<_, Status>(response)
        })?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn compact(
        &self,
        request: Request<CompactionRequest>,
    ) -> Result<Response<CompactionResponse>, Status> {
        let request = request.into_inner();
        let revision = self.cluster.with_store(|store, now| {
            store
                .compact(request.revision, now)
                .map(|()| store.revision())
        })?;
        Ok(Response::new(CompactionResponse {
            header: Some(self.cluster.header(self.member, revision)),
        }))
    }
}

/// Records every key range an accepted Txn names: its compares and the operations of both branches, nested txns included.
fn record_txn(history: &mut History, at: Duration, member: usize, request: &TxnRequest) {
    for compare in &request.compare {
        history.record_access(
            at,
            member,
            AccessKind::Compare,
            &compare.key,
            &compare.range_end,
        );
    }
    for op in request.success.iter().chain(&request.failure) {
        match &op.request {
            Some(Op::RequestRange(range)) => {
                history.record_access(at, member, AccessKind::Range, &range.key, &range.range_end)
            }
            Some(Op::RequestPut(put)) => {
                history.record_access(at, member, AccessKind::Put, &put.key, b"")
            }
            Some(Op::RequestDeleteRange(delete)) => history.record_access(
                at,
                member,
                AccessKind::DeleteRange,
                &delete.key,
                &delete.range_end,
            ),
            Some(Op::RequestTxn(inner)) => record_txn(history, at, member, inner),
            None => {}
        }
    }
}
