//! The Cluster and Maintenance services of one member: MemberList and Status with the cluster's identities, raft
//! term and leader; Alarm answers "no alarms"; membership changes and the other maintenance calls are
//! Unimplemented.

use proto::etcdserverpb::alarm_request::AlarmAction;
use proto::etcdserverpb::cluster_server::Cluster as ClusterApi;
use proto::etcdserverpb::maintenance_server::Maintenance;
use proto::etcdserverpb::{
    AlarmRequest, AlarmResponse, DefragmentRequest, DefragmentResponse, DowngradeRequest,
    DowngradeResponse, HashKvRequest, HashKvResponse, HashRequest, HashResponse, MemberAddRequest,
    MemberAddResponse, MemberListRequest, MemberListResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse, MoveLeaderRequest, MoveLeaderResponse, SnapshotRequest, SnapshotResponse,
    StatusRequest, StatusResponse,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::cluster::Cluster;
use super::errors::unimplemented;

/// The version the model reports in Status unless told to imitate another ([`Cluster::imitate`]). (Its auth follows etcd 3.5.30's rules, which the conformance suite
/// compares it with: from 3.5.30, once auth is on, Status, Compact and Alarm changes are for the root role, and
/// MemberList and an Alarm listing for any user.)
pub const MODEL_VERSION: &str = "3.4.23";

pub struct ClusterService {
    pub cluster: Cluster,
    pub member: usize,
}

#[tonic::async_trait]
impl ClusterApi for ClusterService {
    async fn member_add(
        &self,
        _: Request<MemberAddRequest>,
    ) -> Result<Response<MemberAddResponse>, Status> {
        Err(unimplemented("MemberAdd"))
    }

    async fn member_remove(
        &self,
        _: Request<MemberRemoveRequest>,
    ) -> Result<Response<MemberRemoveResponse>, Status> {
        Err(unimplemented("MemberRemove"))
    }

    async fn member_update(
        &self,
        _: Request<MemberUpdateRequest>,
    ) -> Result<Response<MemberUpdateResponse>, Status> {
        Err(unimplemented("MemberUpdate"))
    }

    async fn member_list(
        &self,
        request: Request<MemberListRequest>,
    ) -> Result<Response<MemberListResponse>, Status> {
        // etcd 3.5.30 on: with auth on, the member list is for users.
        self.cluster
            .authorize_user(self.member, request.metadata())?;
        // etcd's MemberList header carries no revision.
        Ok(Response::new(MemberListResponse {
            header: Some(self.cluster.header(self.member, 0)),
            members: self.cluster.members(),
        }))
    }

    async fn member_promote(
        &self,
        _: Request<MemberPromoteRequest>,
    ) -> Result<Response<MemberPromoteResponse>, Status> {
        Err(unimplemented("MemberPromote"))
    }
}

pub struct MaintenanceService {
    pub cluster: Cluster,
    pub member: usize,
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        // etcd 3.5.30 on: with auth on, listing the alarms is for users, changing them for the root role.
        if request.get_ref().action == AlarmAction::Get as i32 {
            self.cluster
                .authorize_user(self.member, request.metadata())?;
        } else {
            self.cluster
                .authorize_admin(self.member, request.metadata())?;
        }
        let revision = self.cluster.with_store(|store, _| store.revision());
        Ok(Response::new(AlarmResponse {
            header: Some(self.cluster.header(self.member, revision)),
            alarms: Vec::new(),
        }))
    }

    async fn status(
        &self,
        request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.cluster
            .authorize_admin(self.member, request.metadata())?;
        let revision = self.cluster.with_store(|store, _| store.revision());
        let term = self.cluster.raft_term();
        Ok(Response::new(StatusResponse {
            header: Some(self.cluster.header(self.member, revision)),
            version: self.cluster.version().to_string(),
            db_size: 20480,
            // 0 when this member knows no leader: none has a quorum, or it is cut off from the others.
            leader: if self.cluster.has_leader(self.member) {
                self.cluster.leader_id()
            } else {
                0
            },
            raft_index: revision as u64,
            raft_term: term,
            raft_applied_index: revision as u64,
            errors: Vec::new(),
            db_size_in_use: 16384,
            is_learner: false,
            // The model speaks as an etcd 3.5, which has none of 3.6's Status fields.
            ..Default::default()
        }))
    }

    async fn defragment(
        &self,
        _: Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        Err(unimplemented("Defragment"))
    }

    async fn hash(&self, _: Request<HashRequest>) -> Result<Response<HashResponse>, Status> {
        Err(unimplemented("Hash"))
    }

    async fn hash_kv(&self, _: Request<HashKvRequest>) -> Result<Response<HashKvResponse>, Status> {
        Err(unimplemented("HashKV"))
    }

    type SnapshotStream = ReceiverStream<Result<SnapshotResponse, Status>>;

    async fn snapshot(
        &self,
        _: Request<SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(unimplemented("Snapshot"))
    }

    async fn move_leader(
        &self,
        _: Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        Err(unimplemented("MoveLeader"))
    }

    async fn downgrade(
        &self,
        _: Request<DowngradeRequest>,
    ) -> Result<Response<DowngradeResponse>, Status> {
        Err(unimplemented("Downgrade"))
    }
}
