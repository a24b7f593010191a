//! The model store keeps etcd's semantics (each case checked against etcd 3.4.23 with etcdctl where it says so);
//! the last test serves the model to check its watch census.

use std::time::Duration;

use proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::response_op::Response as OpResponse;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCancelRequest, WatchCreateRequest, WatchRequest,
};
use sim::model::errors::StoreError;
use sim::model::{LeaseEnd, Store};
use tonic::Code;

const T0: Duration = Duration::ZERO;

fn put(store: &mut Store, key: &str, value: &str) -> i64 {
    store
        .put(
            &PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            },
            T0,
        )
        .unwrap()
        .header
        .unwrap()
        .revision
}

fn get(key: &str, range_end: &str) -> RangeRequest {
    RangeRequest {
        key: key.into(),
        range_end: range_end.into(),
        ..Default::default()
    }
}

fn keys(store: &Store, request: &RangeRequest) -> Vec<String> {
    store
        .range(request)
        .unwrap()
        .kvs
        .iter()
        .map(|kv| String::from_utf8(kv.key.to_vec()).unwrap())
        .collect()
}

fn put_op(key: &str) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            ..Default::default()
        })),
    }
}

#[test]
fn revisions_start_at_one_and_every_put_makes_one() {
    let mut store = Store::new();
    assert_eq!(store.revision(), 1);
    assert_eq!(put(&mut store, "a", "1"), 2);
    // etcd: a put of an unchanged value still creates a revision (checked: `put a 1` twice → 2, 3).
    assert_eq!(put(&mut store, "a", "1"), 3);
    let kv = &store.range(&get("a", "")).unwrap().kvs[0];
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (2, 3, 2));
}

#[test]
fn deleting_nothing_makes_no_revision() {
    let mut store = Store::new();
    put(&mut store, "a", "1");
    let response = store
        .delete_range(
            &DeleteRangeRequest {
                key: b"zz".to_vec(),
                ..Default::default()
            },
            T0,
        )
        .unwrap();
    assert_eq!(response.deleted, 0);
    assert_eq!(response.header.unwrap().revision, 2);
    assert_eq!(store.revision(), 2);
}

#[test]
fn range_end_zero_byte_means_every_key_from_key() {
    let mut store = Store::new();
    for key in ["a", "b", "c"] {
        put(&mut store, key, "v");
    }
    assert_eq!(keys(&store, &get("b", "\0")), ["b", "c"]);
    assert_eq!(keys(&store, &get("\0", "\0")), ["a", "b", "c"]);
    assert_eq!(keys(&store, &get("a", "c")), ["a", "b"]);
    assert!(keys(&store, &get("c", "a")).is_empty());
}

#[test]
fn count_ignores_limit_and_more_says_the_limit_cut() {
    let mut store = Store::new();
    for key in ["a", "b", "c"] {
        put(&mut store, key, "v");
    }
    let mut request = get("a", "\0");
    request.limit = 2;
    let response = store.range(&request).unwrap();
    assert_eq!(
        (response.kvs.len(), response.count, response.more),
        (2, 3, true)
    );
    request.limit = 3;
    let response = store.range(&request).unwrap();
    assert_eq!(
        (response.kvs.len(), response.count, response.more),
        (3, 3, false)
    );
    request.count_only = true;
    let response = store.range(&request).unwrap();
    assert_eq!((response.kvs.len(), response.count), (0, 3));
    // etcd's MVCC returns no keys for count_only, so a limit below the count cuts nothing: `more` stays false.
    request.limit = 2;
    let response = store.range(&request).unwrap();
    assert_eq!(
        (response.kvs.len(), response.count, response.more),
        (0, 3, false)
    );
}

#[test]
fn sort_by_a_target_without_order_is_ascending_and_descend_reverses() {
    let mut store = Store::new();
    put(&mut store, "b", "1");
    put(&mut store, "a", "2");
    let mut request = get("a", "\0");
    request.sort_target = SortTarget::Mod as i32;
    assert_eq!(keys(&store, &request), ["b", "a"]);
    request.sort_order = SortOrder::Descend as i32;
    assert_eq!(keys(&store, &request), ["a", "b"]);
    request.sort_target = SortTarget::Key as i32;
    assert_eq!(keys(&store, &request), ["b", "a"]);
}

#[test]
fn historical_reads_future_and_compacted_revisions_follow_etcd() {
    let mut store = Store::new();
    put(&mut store, "a", "1"); // 2
    put(&mut store, "a", "2"); // 3
    put(&mut store, "b", "3"); // 4
    let mut at = get("a", "");
    at.revision = 2;
    assert_eq!(store.range(&at).unwrap().kvs[0].value, &b"1"[..]);
    // The header of a historical read carries the current revision.
    assert_eq!(store.range(&at).unwrap().header.unwrap().revision, 4);
    at.revision = 5;
    assert_eq!(store.range(&at).unwrap_err(), StoreError::FutureRevision);
    store.compact(3, T0).unwrap();
    // Checked on etcd 3.4.23: after `compaction 3`, `get --rev=3` works and `get --rev=2` is compacted.
    at.revision = 3;
    assert_eq!(store.range(&at).unwrap().kvs[0].value, &b"2"[..]);
    at.revision = 2;
    assert_eq!(store.range(&at).unwrap_err(), StoreError::Compacted);
    assert_eq!(store.compact(3, T0).unwrap_err(), StoreError::Compacted);
    assert_eq!(store.compact(2, T0).unwrap_err(), StoreError::Compacted);
    assert_eq!(
        store.compact(99, T0).unwrap_err(),
        StoreError::FutureRevision
    );
    let status: tonic::Status = StoreError::Compacted.into();
    assert_eq!(status.code(), Code::OutOfRange);
    assert_eq!(
        status.message(),
        "etcdserver: mvcc: required revision has been compacted"
    );
}

#[test]
fn min_and_max_revision_filters_apply_before_the_limit() {
    let mut store = Store::new();
    for key in ["a", "b", "c", "d"] {
        put(&mut store, key, "v"); // a=2 b=3 c=4 d=5
    }
    let mut request = get("a", "\0");
    request.min_mod_revision = 3;
    request.max_mod_revision = 4;
    assert_eq!(keys(&store, &request), ["b", "c"]);
    // count is taken before the revision filters, as etcd does.
    assert_eq!(store.range(&request).unwrap().count, 4);
    request.min_mod_revision = 0;
    request.max_mod_revision = 0;
    request.min_create_revision = 4;
    assert_eq!(keys(&store, &request), ["c", "d"]);
}

#[test]
fn put_flags_and_their_errors() {
    let mut store = Store::new();
    let base = PutRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let cases = [
        (
            PutRequest {
                key: Vec::new(),
                ..base.clone()
            },
            StoreError::EmptyKey,
        ),
        (
            PutRequest {
                ignore_value: true,
                ..base.clone()
            },
            StoreError::KeyNotFound,
        ),
        (
            PutRequest {
                ignore_value: true,
                value: b"x".to_vec(),
                ..base.clone()
            },
            StoreError::ValueProvided,
        ),
        (
            PutRequest {
                ignore_lease: true,
                lease: 5,
                ..base.clone()
            },
            StoreError::LeaseProvided,
        ),
        (
            PutRequest {
                lease: 5,
                ..base.clone()
            },
            StoreError::LeaseNotFound,
        ),
    ];
    for (request, want) in cases {
        assert_eq!(store.put(&request, T0).unwrap_err(), want, "{request:?}");
    }
    assert_eq!(store.revision(), 1, "failed puts make no revision");
    put(&mut store, "k", "v");
    let kept = store
        .put(
            &PutRequest {
                ignore_value: true,
                prev_kv: true,
                ..base
            },
            T0,
        )
        .unwrap();
    assert_eq!(kept.prev_kv.unwrap().value, &b"v"[..]);
    assert_eq!(store.range(&get("k", "")).unwrap().kvs[0].value, &b"v"[..]);
}

#[test]
fn a_txn_is_one_revision_and_reads_its_own_writes() {
    let mut store = Store::new();
    put(&mut store, "a", "1");
    let response = store
        .txn(
            &TxnRequest {
                compare: vec![Compare {
                    key: b"a".to_vec(),
                    target: CompareTarget::Value as i32,
                    result: CompareResult::Equal as i32,
                    target_union: Some(TargetUnion::Value(b"1".to_vec())),
                    ..Default::default()
                }],
                success: vec![
                    put_op("b"),
                    put_op("c"),
                    RequestOp {
                        request: Some(Op::RequestRange(get("b", "\0"))),
                    },
                ],
                failure: vec![],
            },
            T0,
        )
        .unwrap();
    assert!(response.succeeded);
    assert_eq!(response.header.unwrap().revision, 3);
    assert_eq!(store.revision(), 3);
    let Some(OpResponse::ResponseRange(range)) = &response.responses[2].response else {
        panic!("third response is a range");
    };
    assert_eq!(range.kvs.len(), 2);
    assert!(range.kvs.iter().all(|kv| kv.mod_revision == 3));
    // A read-only txn makes no revision.
    let read_only = store
        .txn(
            &TxnRequest {
                success: vec![RequestOp {
                    request: Some(Op::RequestRange(get("a", ""))),
                }],
                ..Default::default()
            },
            T0,
        )
        .unwrap();
    assert_eq!(read_only.header.unwrap().revision, 3);
}

#[test]
fn missing_keys_compare_as_zero_but_never_equal_a_value() {
    let mut store = Store::new();
    let compare = |target: CompareTarget, operand: TargetUnion| TxnRequest {
        compare: vec![Compare {
            key: b"missing".to_vec(),
            target: target as i32,
            result: CompareResult::Equal as i32,
            target_union: Some(operand),
            ..Default::default()
        }],
        ..Default::default()
    };
    let version = store
        .txn(
            &compare(CompareTarget::Version, TargetUnion::Version(0)),
            T0,
        )
        .unwrap();
    assert!(version.succeeded);
    let value = store
        .txn(
            &compare(CompareTarget::Value, TargetUnion::Value(Vec::new())),
            T0,
        )
        .unwrap();
    assert!(!value.succeeded);
}

#[test]
fn txn_checks_duplicates_and_operation_count() {
    let mut store = Store::new();
    let duplicate = TxnRequest {
        success: vec![put_op("a"), put_op("a")],
        ..Default::default()
    };
    assert_eq!(
        store.txn(&duplicate, T0).unwrap_err(),
        StoreError::DuplicateKey
    );
    let put_in_deleted_range = TxnRequest {
        success: vec![
            put_op("b"),
            RequestOp {
                request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
                    key: b"a".to_vec(),
                    range_end: b"c".to_vec(),
                    ..Default::default()
                })),
            },
        ],
        ..Default::default()
    };
    assert_eq!(
        store.txn(&put_in_deleted_range, T0).unwrap_err(),
        StoreError::DuplicateKey
    );
    // The two branches of a nested txn may put the same key: only one runs.
    let nested = TxnRequest {
        success: vec![RequestOp {
            request: Some(Op::RequestTxn(TxnRequest {
                success: vec![put_op("x")],
                failure: vec![put_op("x")],
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    assert!(store.txn(&nested, T0).is_ok());
    let too_many = TxnRequest {
        success: (0..129).map(|i| put_op(&format!("k{i}"))).collect(),
        ..Default::default()
    };
    assert_eq!(
        store.txn(&too_many, T0).unwrap_err(),
        StoreError::TooManyOps
    );
    let at_limit = TxnRequest {
        success: (0..128).map(|i| put_op(&format!("k{i}"))).collect(),
        ..Default::default()
    };
    assert!(store.txn(&at_limit, T0).is_ok());
}

#[test]
fn leases_expire_on_time_and_take_their_keys_in_one_revision() {
    let mut store = Store::new();
    let (id, ttl) = store.lease_grant(0, 1, T0, || 7).unwrap();
    assert_eq!(
        (id, ttl),
        (7, 2),
        "TTLs below etcd's minimum are raised to 2 s"
    );
    assert_eq!(
        store.lease_grant(7, 5, T0, || 8).unwrap_err(),
        StoreError::LeaseExists
    );
    for key in ["a", "b"] {
        store
            .put(
                &PutRequest {
                    key: key.into(),
                    lease: id,
                    ..Default::default()
                },
                T0,
            )
            .unwrap();
    }
    assert_eq!(store.lease_keep_alive(id, Duration::from_secs(1), 0), 2);
    assert_eq!(
        store
            .lease_time_to_live(id, true, Duration::from_secs(2))
            .keys
            .len(),
        2
    );
    assert!(!store.expire_leases(Duration::from_millis(2999)));
    assert!(store.expire_leases(Duration::from_secs(3)));
    assert_eq!(store.revision(), 4, "both keys deleted in one revision");
    assert_eq!(store.history.revisions.last().unwrap().events.len(), 2);
    assert_eq!(
        store.history.leases[&id].ended,
        Some((Duration::from_secs(3), LeaseEnd::Expired))
    );
    assert_eq!(store.lease_keep_alive(id, Duration::from_secs(4), 0), 0);
    assert_eq!(
        store
            .lease_time_to_live(id, false, Duration::from_secs(4))
            .ttl,
        -1
    );
    assert_eq!(
        store.lease_revoke(id, Duration::from_secs(4)).unwrap_err(),
        StoreError::LeaseNotFound
    );
}

/// Serves one model member on a real loopback port; returns the cluster, a channel to it and the stop signal.
async fn serve_one_member() -> (
    sim::model::Cluster,
    tonic::transport::Channel,
    tokio::sync::oneshot::Sender<()>,
) {
    use proxy::net::Net;
    let cluster = sim::model::Cluster::new(1, 7);
    let listener = proxy::net::TokioNet
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sim::model::serve(cluster.clone(), 0, listener, async {
        let _ = stop_rx.await;
    }));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(proxy::net::Connector::new(std::sync::Arc::new(
            proxy::net::TokioNet,
        )))
        .await
        .unwrap();
    (cluster, channel, stop_tx)
}

fn create(key: &str, range_end: &str, watch_id: i64, start_revision: i64) -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: key.into(),
            range_end: range_end.into(),
            watch_id,
            start_revision,
            ..Default::default()
        })),
    }
}

/// One stream's live watchers as `(key, range_end, count)`, readable in assertions.
type StreamCensus = (usize, Vec<(String, String, usize)>);

fn census_of(cluster: &sim::model::Cluster) -> Vec<StreamCensus> {
    cluster
        .watch_census()
        .streams
        .iter()
        .map(|s| {
            let ranges = s
                .ranges
                .iter()
                .map(|((k, e), n)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(e).into_owned(),
                        *n,
                    )
                })
                .collect();
            (s.stream, ranges)
        })
        .collect()
}

/// The census counts what etcd's `etcd_debugging_mvcc_watcher_total` gauge counts (checked on etcd 3.4.23 with
/// `etcdctl watch -i`: three watchers on one stream count 3, a watcher whose start revision is compacted adds
/// nothing, a client going away takes its watchers), broken down by stream and range as the request spelled it.
#[tokio::test]
async fn the_watch_census_counts_live_watchers_per_stream_and_range() {
    let (cluster, channel, _stop) = serve_one_member().await;
    let mut kv = proto::etcdserverpb::kv_client::KvClient::new(channel.clone());
    for value in ["1", "2", "3"] {
        kv.put(PutRequest {
            key: b"a".to_vec(),
            value: value.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    kv.compact(proto::etcdserverpb::CompactionRequest {
        revision: 3,
        physical: false,
    })
    .await
    .unwrap();
    assert!(cluster.watch_census().streams.is_empty());

    let mut watch = WatchClient::new(channel.clone());
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut first = watch
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for request in [
        create("a", "", 0, 0),
        create("a", "", 7, 0),
        create("b", "c", 0, 0),
        // Refused (duplicate ID) and compacted creates are answered but never live.
        create("b", "c", 7, 0),
        create("a", "", 0, 2),
    ] {
        tx.send(request).await.unwrap();
    }
    let mut answers = Vec::new();
    while answers.len() < 6 {
        let response = first.message().await.unwrap().unwrap();
        answers.push((response.watch_id, response.created, response.canceled));
    }
    assert_eq!(
        answers,
        [
            (0, true, false),
            (7, true, false),
            (1, true, false),
            (-1, true, true),
            (2, true, false),
            (2, false, true)
        ]
    );
    let first_stream = cluster.watch_census().streams[0].stream;
    assert_eq!(
        census_of(&cluster),
        [(
            first_stream,
            vec![("a".into(), "".into(), 2), ("b".into(), "c".into(), 1)]
        )]
    );
    assert_eq!(cluster.watch_census().total(), 3);

    // A second stream is counted apart; per_range sums over streams.
    let (tx2, rx2) = tokio::sync::mpsc::channel(4);
    let mut second = watch
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx2))
        .await
        .unwrap()
        .into_inner();
    tx2.send(create("a", "", 0, 0)).await.unwrap();
    assert!(second.message().await.unwrap().unwrap().created);
    assert_eq!(cluster.watch_census().streams.len(), 2);
    assert_eq!(
        cluster.watch_census().per_range()[&(b"a".to_vec(), Vec::new())],
        3
    );

    // A cancel takes one watcher away once it is answered.
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CancelRequest(WatchCancelRequest {
            watch_id: 7,
        })),
    })
    .await
    .unwrap();
    let cancelled = first.message().await.unwrap().unwrap();
    assert_eq!((cancelled.watch_id, cancelled.canceled), (7, true));
    assert_eq!(cluster.watch_census().total(), 3);

    // The client going away takes the stream's watchers; the member notices asynchronously.
    drop((tx, first));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.watch_census().streams.len() != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ended stream's watchers were never removed: {:?}",
            census_of(&cluster)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cluster.watch_census().total(), 1);
    drop((tx2, second));
}

/// Without a leader no lease expires; a new leader renews every lease for its TTL plus an election timeout, as
/// etcd's lessor does on promotion.
#[test]
fn leases_wait_for_a_leader_and_a_new_one_renews_them_all() {
    let secs = Duration::from_secs;
    let mut store = Store::new();
    let (id, ttl) = store.lease_grant(0, 2, T0, || 7).unwrap();
    assert_eq!(ttl, 2);
    store.pause_lease_expiry();
    assert!(
        !store.expire_leases(secs(5)),
        "nothing expires without a leader"
    );
    store.promote_leases(secs(5), secs(1));
    assert_eq!(store.history.elections, [secs(5)]);
    assert_eq!(store.next_expiry(), Some(secs(8)));
    assert!(!store.expire_leases(Duration::from_millis(7999)));
    assert!(
        store.expire_leases(secs(8)),
        "TTL plus the election timeout after the election"
    );
    assert_eq!(
        store.history.leases[&id].ended,
        Some((secs(8), LeaseEnd::Expired))
    );
}
