//! The model also serves real gRPC over real loopback TCP (`proxy::net::TokioNet`), as the conformance suite uses
//! it: answers carry the cluster's identities, errors carry etcd's codes and texts, and services the model does not
//! implement answer Unimplemented.

use std::sync::Arc;

use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::cluster_client::ClusterClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{
    AuthStatusRequest, CompactionRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    MemberListRequest, PutRequest, RangeRequest,
};
use proxy::net::{Net, TokioNet};
use sim::model::{self, Cluster};
use tonic::Code;

#[tokio::test]
async fn the_model_speaks_etcds_grpc_over_loopback_tcp() {
    let cluster = Cluster::new(1, 42);
    let listener = TokioNet.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    cluster.set_client_urls(0, vec![format!("http://{addr}")]);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(model::serve(cluster.clone(), 0, listener, async {
        let _ = stop_rx.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(proxy::net::Connector::new(Arc::new(TokioNet)))
        .await
        .unwrap();

    let mut kv = KvClient::new(channel.clone());
    for value in ["1", "2", "3"] {
        kv.put(PutRequest {
            key: b"a".to_vec(),
            value: value.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    kv.compact(CompactionRequest {
        revision: 3,
        physical: false,
    })
    .await
    .unwrap();
    let compacted = kv
        .range(RangeRequest {
            key: b"a".to_vec(),
            revision: 2,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(compacted.code(), Code::OutOfRange);
    assert_eq!(
        compacted.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    let empty = kv.range(RangeRequest::default()).await.unwrap_err();
    assert_eq!(
        (empty.code(), empty.message()),
        (Code::InvalidArgument, "etcdserver: key is not provided")
    );
    let current = kv
        .range(RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let header = current.header.unwrap();
    assert_eq!(
        (header.revision, header.cluster_id, header.member_id),
        (4, cluster.cluster_id(), cluster.member_id(0))
    );

    let mut lease = LeaseClient::new(channel.clone());
    let granted = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(granted.id > 0);
    let exists = lease
        .lease_grant(LeaseGrantRequest {
            ttl: 60,
            id: granted.id,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (exists.code(), exists.message()),
        (Code::FailedPrecondition, "etcdserver: lease already exists")
    );
    // An unknown lease's keep-alive answers TTL 0, not an error.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(LeaseKeepAliveRequest { id: 12345 }).await.unwrap();
    let mut answers = lease
        .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answers.message().await.unwrap().unwrap().ttl, 0);
    drop(tx);

    let members = ClusterClient::new(channel.clone())
        .member_list(MemberListRequest {
            linearizable: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(members.members[0].client_ur_ls, [format!("http://{addr}")]);

    let auth = AuthClient::new(channel)
        .auth_status(AuthStatusRequest {})
        .await
        .unwrap_err();
    assert_eq!(auth.code(), Code::Unimplemented);

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}
