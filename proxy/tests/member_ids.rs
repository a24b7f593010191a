//! Member IDs through the proxy, against real etcd: MemberList through the proxy (by default it answers it, so that
//! clients syncing their endpoints find proxies) lists etcd's own members, IDs, names, peer URLs and learners as
//! etcd lists them, each reached at the proxy's URL; and every call that takes a member ID (MoveLeader,
//! MemberUpdate, MemberPromote, MemberRemove) works through the proxy with an ID listed through it. MoveLeader,
//! which etcd serves only on the leader, reaches the leader through the proxy whichever member the proxy uses.

mod support;

use std::time::Duration;

use proto::etcdserverpb::cluster_client::ClusterClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{
    Member, MemberListRequest, MemberPromoteRequest, MemberRemoveRequest, MemberUpdateRequest,
    MoveLeaderRequest, StatusRequest,
};
use testkit::wait_for;
use tonic::transport::Channel;

/// How long a member change may take to be seen (an election, a learner catching up) on a loaded CI machine.
const SETTLE: Duration = Duration::from_secs(30);

/// What a member is to etcd, without the client URLs (which the proxy replaces).
fn identities(members: &[Member]) -> Vec<(u64, String, Vec<String>, bool)> {
    let mut seen: Vec<_> = members
        .iter()
        .map(|m| (m.id, m.name.clone(), m.peer_ur_ls.clone(), m.is_learner))
        .collect();
    seen.sort();
    seen
}

async fn list(channel: &Channel) -> Vec<Member> {
    ClusterClient::new(channel.clone())
        .member_list(MemberListRequest { linearizable: true })
        .await
        .expect("member list")
        .into_inner()
        .members
}

/// The leader's ID, as member `channel` reports it (0: none known).
async fn leader_of(channel: &Channel) -> u64 {
    MaintenanceClient::new(channel.clone())
        .status(StatusRequest {})
        .await
        .map(|s| s.into_inner().leader)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_calls_take_the_ids_member_list_shows_through_the_proxy() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut cluster = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let through = support::grpc::channel(&proxy.addr()).await;
    let direct = support::grpc::channel(&cluster.addr(0)).await;

    let listed = list(&through).await;
    assert_eq!(identities(&listed), identities(&list(&direct).await));
    for member in &listed {
        assert_eq!(member.client_ur_ls, [proxy.addr()], "{member:?}");
    }

    // MoveLeader with each listed voter that does not lead, twice round: whichever member the proxy uses, the
    // call reaches the leader, and etcd moves leadership where it was asked.
    for round in 0..2 {
        for transferee in listed.iter().map(|m| m.id) {
            let current = wait_for("a leader", SETTLE, || async {
                match leader_of(&direct).await {
                    0 => Err("no leader yet".to_string()),
                    id => Ok(id),
                }
            })
            .await;
            if current == transferee {
                continue;
            }
            MaintenanceClient::new(through.clone())
                .move_leader(MoveLeaderRequest {
                    target_id: transferee,
                })
                .await
                .unwrap_or_else(|e| {
                    panic!("round {round}: move leadership to {transferee:x}: {e}")
                });
            wait_for("the new leader", SETTLE, || async {
                match leader_of(&direct).await {
                    id if id == transferee => Ok(()),
                    id => Err(format!("leader {id:x}, asked for {transferee:x}")),
                }
            })
            .await;
        }
    }

    // MemberUpdate with a listed ID: etcd takes it (the same peer URLs: nothing changes).
    let first = &listed[0];
    ClusterClient::new(through.clone())
        .member_update(MemberUpdateRequest {
            id: first.id,
            peer_ur_ls: first.peer_ur_ls.clone(),
        })
        .await
        .expect("member update with a listed ID");

    // A learner is listed as one, with its ID, which MemberPromote and then MemberRemove take.
    cluster.add_learner(0).await.expect("add a learner");
    let listed = list(&through).await;
    let added = listed
        .iter()
        .find(|m| m.is_learner)
        .unwrap_or_else(|| panic!("the learner is listed: {listed:?}"))
        .id;
    assert_eq!(identities(&listed), identities(&list(&direct).await));
    // etcd promotes a learner only once it has caught up with the leader.
    wait_for("the learner promoted", SETTLE, || async {
        ClusterClient::new(through.clone())
            .member_promote(MemberPromoteRequest { id: added })
            .await
            .map(|_| ())
            .map_err(|e| support::grpc::status(&e))
    })
    .await;
    assert!(
        list(&direct)
            .await
            .iter()
            .any(|m| m.id == added && !m.is_learner),
        "promoted"
    );
    ClusterClient::new(through.clone())
        .member_remove(MemberRemoveRequest { id: added })
        .await
        .expect("member remove with a listed ID");
    assert!(list(&direct).await.iter().all(|m| m.id != added), "removed");
}

/// The way the `etcd-client` crate's own test of MoveLeader and `etcdctl move-leader` use a single member: the
/// listed ID is the leader's, and moving leadership to it is answered as etcd answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_member_list_and_move_leader_work_through_the_proxy() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let ctl = binaries.etcdctl(&proxy.addr());
    let listed = ctl.ok(&["member", "list"]).await;
    let id = listed
        .split(',')
        .next()
        .expect("one line per member: ID, status, name, ...")
        .trim()
        .to_string();
    let direct = binaries.etcdctl(&cluster.addr(0));
    assert!(
        direct
            .ok(&["member", "list"])
            .await
            .starts_with(&format!("{id},")),
        "the ID is etcd's: {listed}"
    );
    let moved = ctl.ok(&["move-leader", &id]).await;
    assert!(
        moved.contains(&format!("Leadership transferred from {id} to {id}")),
        "{moved}"
    );
}

/// What the `etcd-client` crate's own test of MoveLeader does, through the proxy in front of three members: list
/// the members, ask Status for the leader, and move leadership to the first listed member that does not lead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_client_crates_move_leader_works_through_the_proxy() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let mut client = etcd_client::Client::connect([proxy.addr()], None)
        .await
        .expect("connect");
    let listed = client.member_list().await.expect("member list");
    let leader = client.status().await.expect("status").leader();
    let transferee = listed
        .members()
        .iter()
        .map(|m| m.id())
        .find(|&id| id != leader)
        .expect("a member that does not lead");
    client
        .move_leader(transferee)
        .await
        .unwrap_or_else(|e| panic!("move leadership from {leader:x} to {transferee:x}: {e}"));
    let direct = support::grpc::channel(&cluster.addr(0)).await;
    wait_for("the new leader", SETTLE, || async {
        match leader_of(&direct).await {
            id if id == transferee => Ok(()),
            id => Err(format!("leader {id:x}, asked for {transferee:x}")),
        }
    })
    .await;
}
