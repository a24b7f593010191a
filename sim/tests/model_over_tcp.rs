//! The model also serves real gRPC over real loopback TCP (`proxy::net::TokioNet`), as the conformance suite uses
//! it: answers carry the cluster's identities, errors carry etcd's codes and texts, services the model does not
//! implement answer Unimplemented, and every key range a request names is recorded in the history.

use std::sync::Arc;

use proto::authpb::Permission;
use proto::authpb::permission::Type as PermissionType;
use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::cluster_client::ClusterClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    AuthEnableRequest, AuthRoleAddRequest, AuthRoleGrantPermissionRequest, AuthStatusRequest,
    AuthUserAddRequest, AuthUserGrantRoleRequest, AuthenticateRequest, CompactionRequest, Compare,
    DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, MemberListRequest, PutRequest,
    RangeRequest, RequestOp, StatusRequest, TxnRequest, WatchCreateRequest, WatchRequest,
    request_op,
};
use proto::v3lockpb::LockRequest;
use proto::v3lockpb::lock_client::LockClient;
use proxy::net::{Net, TokioNet};
use sim::model::{self, AccessKind, Cluster};
use tonic::Code;

/// One member of a model cluster served on a free loopback port, and a channel to it.
struct Served {
    addr: std::net::SocketAddr,
    channel: tonic::transport::Channel,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Served {
    /// Serves `member` of `cluster`; with `advertise`, MemberList lists the member at its real address.
    async fn start(cluster: &Cluster, member: usize, advertise: bool) -> Self {
        let listener = TokioNet.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        if advertise {
            cluster.set_client_urls(member, vec![format!("http://{addr}")]);
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(model::serve(cluster.clone(), member, listener, async {
            let _ = stopped.await;
        }));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(proxy::net::Connector::new(Arc::new(TokioNet)))
            .await
            .unwrap();
        Self {
            addr,
            channel,
            stop,
            server,
        }
    }

    /// Stops the member and waits for its server to end.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.server.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn the_model_speaks_etcds_grpc_over_loopback_tcp() {
    let cluster = Cluster::new(1, 42);
    let served = Served::start(&cluster, 0, true).await;
    let channel = served.channel.clone();

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
    assert_eq!(
        members.members[0].client_ur_ls,
        [format!("http://{}", served.addr)]
    );

    let auth = AuthClient::new(channel.clone())
        .auth_status(AuthStatusRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(!auth.enabled && auth.auth_revision == 1, "{auth:?}");

    let lock = LockClient::new(channel)
        .lock(LockRequest {
            name: b"l".to_vec(),
            lease: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(lock.code(), Code::Unimplemented);

    served.stop().await;
}

#[tokio::test]
async fn the_model_records_every_key_range_an_accepted_request_names() {
    let cluster = Cluster::new(1, 7);
    let served = Served::start(&cluster, 0, false).await;
    let channel = served.channel.clone();
    let mut kv = KvClient::new(channel.clone());
    let op = |request| RequestOp {
        request: Some(request),
    };
    kv.put(PutRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    // A refused request touched nothing (etcd checks a whole request first) and is not recorded.
    let refused = kv.range(RangeRequest::default()).await;
    assert!(refused.is_err());
    kv.delete_range(DeleteRangeRequest {
        key: b"a".to_vec(),
        range_end: b"\0".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    // Both branches of a txn, nested ones included, whichever runs.
    kv.txn(TxnRequest {
        compare: vec![Compare {
            key: b"c".to_vec(),
            range_end: b"d".to_vec(),
            ..Default::default()
        }],
        success: vec![op(request_op::Request::RequestRange(RangeRequest {
            key: b"s".to_vec(),
            ..Default::default()
        }))],
        failure: vec![op(request_op::Request::RequestTxn(TxnRequest {
            failure: vec![op(request_op::Request::RequestPut(PutRequest {
                key: b"f".to_vec(),
                ..Default::default()
            }))],
            ..Default::default()
        }))],
    })
    .await
    .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"w".to_vec(),
            range_end: b"x".to_vec(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut watch = WatchClient::new(channel)
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    assert!(watch.message().await.unwrap().unwrap().created);

    let history = cluster.history();
    let named: Vec<(usize, AccessKind, &[u8], &[u8])> = history
        .accesses
        .iter()
        .map(|a| (a.member, a.kind, &a.key[..], &a.range_end[..]))
        .collect();
    let want: Vec<(usize, AccessKind, &[u8], &[u8])> = vec![
        (0, AccessKind::Put, b"k", b""),
        (0, AccessKind::DeleteRange, b"a", b"\0"),
        (0, AccessKind::Compare, b"c", b"d"),
        (0, AccessKind::Range, b"s", b""),
        (0, AccessKind::Put, b"f", b""),
        (0, AccessKind::Watch, b"w", b"x"),
    ];
    assert_eq!(named, want);

    drop(tx);
    served.stop().await;
}

/// A member cut off from the other members (`Cluster::isolate`) behaves as etcd's would: Status names no leader,
/// a caller that requires one is refused at once, a write waits for one (past the caller's deadline here), and
/// serializable reads and new watchers see the revision it had applied when cut off; once it rejoins, the write
/// goes through and the watcher gets what it missed.
#[tokio::test]
async fn a_member_cut_off_from_the_others_knows_no_leader_and_serves_what_it_had_applied() {
    use proto::etcdserverpb::StatusRequest;
    use proto::etcdserverpb::maintenance_client::MaintenanceClient;

    let cluster = Cluster::new(3, 7);
    let served = Served::start(&cluster, 2, false).await;
    let channel = served.channel.clone();
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let put = |value: &str| PutRequest {
        key: b"a".to_vec(),
        value: value.into(),
        ..Default::default()
    };
    kv.put(put("1")).await.unwrap();
    assert_ne!(
        maintenance
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .leader,
        0
    );

    cluster.isolate(2);
    // Another member, which still has a leader, writes revision 3.
    cluster.with_store(|store, now| store.put(&put("2"), now).unwrap());
    assert_eq!(
        maintenance
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .leader,
        0
    );

    let mut requires_leader = tonic::Request::new(put("3"));
    requires_leader
        .metadata_mut()
        .insert("hasleader", "true".parse().unwrap());
    let refused = kv.put(requires_leader).await.unwrap_err();
    assert_eq!(
        (refused.code(), refused.message()),
        (Code::Unavailable, "etcdserver: no leader")
    );
    // Without `hasleader` the write waits for a leader (etcd's request timeout is 7 s): no answer in 300 ms.
    let waited =
        tokio::time::timeout(std::time::Duration::from_millis(300), kv.put(put("3"))).await;
    assert!(waited.is_err(), "answered without a leader: {waited:?}");

    let stale = kv
        .range(RangeRequest {
            key: b"a".to_vec(),
            serializable: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stale.header.unwrap().revision, 2);
    assert_eq!(stale.kvs[0].value, &b"1"[..]);

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let mut watch = WatchClient::new(channel.clone())
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let created = watch.message().await.unwrap().unwrap();
    assert!(created.created);
    assert_eq!(
        created.header.unwrap().revision,
        2,
        "created at what it had applied"
    );

    cluster.rejoin(2);
    let missed = watch.message().await.unwrap().unwrap();
    assert_eq!(missed.events[0].kv.as_ref().unwrap().mod_revision, 3);
    assert_ne!(
        maintenance
            .status(StatusRequest {})
            .await
            .unwrap()
            .into_inner()
            .leader,
        0
    );
    let written = kv.put(put("4")).await.unwrap().into_inner();
    assert!(written.header.unwrap().revision >= 4);
    drop(tx);
    served.stop().await;
}

/// Creates a watcher of `key`..`range_end` on a stream: its ID, whether it was cancelled, and why.
async fn create(
    requests: &tokio::sync::mpsc::Sender<WatchRequest>,
    responses: &mut tonic::Streaming<proto::etcdserverpb::WatchResponse>,
    key: &[u8],
    range_end: &[u8],
) -> (i64, bool, String) {
    let create = WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            ..Default::default()
        })),
    };
    requests.send(create).await.unwrap();
    let created = responses.message().await.unwrap().unwrap();
    (created.watch_id, created.canceled, created.cancel_reason)
}

/// `message` with metadata `token` = `token`.
fn as_user<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}

/// The model's auth over real gRPC, beyond what the conformance suite compares with etcd through etcdctl: tokens
/// live in each member's memory (a crash forgets them), a watcher is checked with its stream's token (a watch from
/// a key on is checked as that key alone, as etcd 3.5 checks it), and renewals need a user (etcd 3.5.30).
#[tokio::test]
async fn auth_checks_every_call_and_a_crashed_member_forgets_its_tokens() {
    let cluster = Cluster::new(2, 5);
    let m0 = Served::start(&cluster, 0, false).await;
    let m1 = Served::start(&cluster, 1, false).await;
    let mut admin = AuthClient::new(m0.channel.clone());
    admin
        .user_add(AuthUserAddRequest {
            name: "root".into(),
            password: "rootpw".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    admin
        .user_grant_role(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        })
        .await
        .unwrap();
    admin
        .user_add(AuthUserAddRequest {
            name: "alice".into(),
            password: "alicepw".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    admin
        .role_add(AuthRoleAddRequest { name: "a".into() })
        .await
        .unwrap();
    admin
        .role_grant_permission(AuthRoleGrantPermissionRequest {
            name: "a".into(),
            perm: Some(Permission {
                perm_type: PermissionType::Readwrite as i32,
                key: b"a/".to_vec(),
                range_end: b"a0".to_vec(),
            }),
        })
        .await
        .unwrap();
    admin
        .user_grant_role(AuthUserGrantRoleRequest {
            user: "alice".into(),
            role: "a".into(),
        })
        .await
        .unwrap();
    admin.auth_enable(AuthEnableRequest {}).await.unwrap();
    let alice = admin
        .authenticate(AuthenticateRequest {
            name: "alice".into(),
            password: "alicepw".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .token;

    let read = |channel: tonic::transport::Channel, key: &'static str, token: String| async move {
        KvClient::new(channel)
            .range(as_user(
                RangeRequest {
                    key: key.into(),
                    ..Default::default()
                },
                &token,
            ))
            .await
            .map(drop)
            .map_err(|s| (s.code(), s.message().to_string()))
    };
    assert_eq!(read(m0.channel.clone(), "a/1", alice.clone()).await, Ok(()));
    assert_eq!(
        read(m0.channel.clone(), "b", alice.clone()).await,
        Err((
            Code::PermissionDenied,
            "etcdserver: permission denied".into()
        ))
    );
    let anonymous = KvClient::new(m0.channel.clone())
        .range(RangeRequest {
            key: b"a/1".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(anonymous.message(), "etcdserver: user name is empty");

    // Watchers, checked with the stream's token at each create.
    let (requests, inbound) = tokio::sync::mpsc::channel(4);
    let mut responses = WatchClient::new(m0.channel.clone())
        .watch(as_user(
            tokio_stream::wrappers::ReceiverStream::new(inbound),
            &alice,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        create(&requests, &mut responses, b"a/1", b"").await,
        (0, false, String::new())
    );
    assert_eq!(
        create(&requests, &mut responses, b"b", b"").await,
        (
            -1,
            true,
            "rpc error: code = PermissionDenied desc = etcdserver: permission denied".into()
        )
    );
    assert_eq!(
        create(&requests, &mut responses, b"a/", b"\0").await,
        (1, false, String::new()),
        "etcd checks a watch from a key on as the key alone"
    );

    // A renewal needs a user.
    let lease = LeaseClient::new(m0.channel.clone())
        .lease_grant(as_user(LeaseGrantRequest { ttl: 60, id: 0 }, &alice))
        .await
        .unwrap()
        .into_inner()
        .id;
    let renewal = tokio_stream::iter([LeaseKeepAliveRequest { id: lease }]);
    let mut renewals = LeaseClient::new(m0.channel.clone())
        .lease_keep_alive(renewal)
        .await
        .unwrap()
        .into_inner();
    let refused = renewals.message().await.unwrap_err();
    assert_eq!(refused.message(), "etcdserver: user name is empty");

    // etcd 3.5.30: the member list is for users, Status for the root role.
    let listed = ClusterClient::new(m0.channel.clone())
        .member_list(as_user(
            MemberListRequest {
                linearizable: false,
            },
            &alice,
        ))
        .await;
    assert!(listed.is_ok(), "{listed:?}");
    let anonymous = ClusterClient::new(m0.channel.clone())
        .member_list(MemberListRequest {
            linearizable: false,
        })
        .await
        .unwrap_err();
    assert_eq!(anonymous.message(), "etcdserver: user name is empty");
    let status = MaintenanceClient::new(m0.channel.clone())
        .status(as_user(StatusRequest {}, &alice))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);

    // Member 1 crashes and restarts: it has forgotten alice's token; member 0 has not.
    cluster.crashed(1);
    cluster.restarted(1);
    assert_eq!(
        read(m1.channel.clone(), "a/1", alice.clone()).await,
        Err((
            Code::Unauthenticated,
            "etcdserver: invalid auth token".into()
        ))
    );
    assert_eq!(read(m0.channel.clone(), "a/1", alice).await, Ok(()));

    m0.stop().await;
    m1.stop().await;
}
