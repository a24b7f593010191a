//! The KV service of one member: every call runs on the shared store under its lock.

use proto::etcdserverpb::kv_server::Kv;
use proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use super::cluster::Cluster;

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
        let mut response = self.cluster.with_store(|store, _| store.range(&request))?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        let request = request.into_inner();
        let mut response = self
            .cluster
            .with_store(|store, now| store.put(&request, now))?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn delete_range(
        &self,
        request: Request<DeleteRangeRequest>,
    ) -> Result<Response<DeleteRangeResponse>, Status> {
        let request = request.into_inner();
        let mut response = self
            .cluster
            .with_store(|store, now| store.delete_range(&request, now))?;
        self.cluster
            .complete_header(self.member, &mut response.header);
        Ok(Response::new(response))
    }

    async fn txn(&self, request: Request<TxnRequest>) -> Result<Response<TxnResponse>, Status> {
        let request = request.into_inner();
        let mut response = self
            .cluster
            .with_store(|store, now| store.txn(&request, now))?;
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
