//! The KV service of one member: every call runs on the shared store under its lock, after the key ranges it names
//! are recorded in the history. Writes, compactions and linearizable reads go through raft: they wait for the
//! member to know a leader ([`Cluster::wait_for_leader`]). A serializable read is answered at once, by a member cut
//! off from the others from the revision it had applied then (or from the current store if a compaction has
//! passed that revision since: a simplification, as the model's members share one store).

use std::time::Duration;

use proto::etcdserverpb::kv_server::Kv;
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::{
    CompactionRequest, CompactionResponse, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RangeStreamResponse, TxnRequest, TxnResponse,
};
use tonic::{Request, Response, Status};

use super::auth::Access;
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
        if !request.get_ref().serializable {
            self.cluster
                .wait_for_leader(self.member, request.metadata())
                .await?;
        }
        let wants = [(
            Access::Read,
            &request.get_ref().key[..],
            &request.get_ref().range_end[..],
        )];
        self.cluster
            .authorize(self.member, request.metadata(), &wants)?;
        let request = request.into_inner();
        let mut response = self.cluster.with_store(|store, now| {
            // A member cut off from the others answers a serializable read from what it had applied.
            let applied = self.cluster.applied_revision(self.member, store.revision());
            let behind = applied < store.revision() && applied >= store.compacted();
            let mut read = request.clone();
            if behind {
                if request.revision > applied {
                    return Err(crate::model::errors::future_revision());
                }
                if request.revision <= 0 {
                    read.revision = applied;
                }
            }
            let mut response = store.range(&read)?;
            if behind && let Some(header) = response.header.as_mut() {
                header.revision = applied;
            }
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
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let mut wants = Vec::new();
        put_access(request.get_ref(), &mut wants);
        self.cluster
            .authorize(self.member, request.metadata(), &wants)?;
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
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        let mut wants = Vec::new();
        delete_access(request.get_ref(), &mut wants);
        self.cluster
            .authorize(self.member, request.metadata(), &wants)?;
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
        // etcd serves a Txn of serializable Ranges only locally (from the member's current store here).
        if !is_serializable(request.get_ref()) {
            self.cluster
                .wait_for_leader(self.member, request.metadata())
                .await?;
        }
        let mut wants = Vec::new();
        txn_access(request.get_ref(), &mut wants);
        self.cluster
            .authorize(self.member, request.metadata(), &wants)?;
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
        self.cluster
            .wait_for_leader(self.member, request.metadata())
            .await?;
        // etcd 3.5.30 on: compaction is for the root role.
        self.cluster
            .authorize_admin(self.member, request.metadata())?;
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

/// What a key range access list holds: etcd's auth checks each.
type Wants<'a> = Vec<(Access, &'a [u8], &'a [u8])>;

/// A Put writes its key, and reads it too when it asks for the previous value.
fn put_access<'a>(put: &'a PutRequest, wants: &mut Wants<'a>) {
    wants.push((Access::Write, &put.key, b""));
    if put.prev_kv {
        wants.push((Access::Read, &put.key, b""));
    }
}

/// A DeleteRange writes its range, and reads it too when it asks for the previous values.
fn delete_access<'a>(delete: &'a DeleteRangeRequest, wants: &mut Wants<'a>) {
    wants.push((Access::Write, &delete.key, &delete.range_end));
    if delete.prev_kv {
        wants.push((Access::Read, &delete.key, &delete.range_end));
    }
}

/// A Txn reads what it compares and accesses what every operation of both branches does, nested ones included.
fn txn_access<'a>(txn: &'a TxnRequest, wants: &mut Wants<'a>) {
    for compare in &txn.compare {
        wants.push((Access::Read, &compare.key, &compare.range_end));
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(Op::RequestRange(range)) => {
                wants.push((Access::Read, &range.key, &range.range_end))
            }
            Some(Op::RequestPut(put)) => put_access(put, wants),
            Some(Op::RequestDeleteRange(delete)) => delete_access(delete, wants),
            Some(Op::RequestTxn(inner)) => txn_access(inner, wants),
            None => {}
        }
    }
}

/// Whether etcd serves a Txn locally, without raft: every operation of both branches is a serializable Range.
fn is_serializable(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| matches!(&op.request, Some(Op::RequestRange(range)) if range.serializable))
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
