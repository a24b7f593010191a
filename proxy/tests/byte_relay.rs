//! Messages travel through the proxy as the bytes they arrived as, in both directions, against a fake upstream
//! that speaks etcd 3.7: fields the proxy's `.proto` files do not know survive, and RangeStream is relayed.
//!
//! The fake answers every call with fixed bytes and records what reached it; the client is a plain gRPC client
//! whose messages are bytes too, so nothing on either side decodes what it did not write.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http::uri::PathAndQuery;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prost::Message;
use proto::etcdserverpb as pb;
use proxy::upstream::codec::RawCodec;
use tonic::Request;

/// An unknown field a newer etcd or client might send: number 99, a varint (key 99 << 3 = 792 → 0x98 0x06).
const UNKNOWN_FIELD: [u8; 3] = [0x98, 0x06, 0x2a];

fn with_unknown_field(message: impl Message) -> Bytes {
    let mut bytes = message.encode_to_vec();
    bytes.extend_from_slice(&UNKNOWN_FIELD);
    Bytes::from(bytes)
}

/// What etcd 3.7 answers Status with: 3.5's fields, 3.6's `storageVersion`, `dbSizeQuota`, `downgradeInfo`, and
/// a field that no release has yet.
fn status_of_3_7() -> Bytes {
    with_unknown_field(pb::StatusResponse {
        header: Some(pb::ResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision: 3,
            raft_term: 4,
        }),
        version: "3.7.1".into(),
        db_size: 20480,
        leader: 2,
        raft_index: 9,
        raft_term: 4,
        raft_applied_index: 9,
        db_size_in_use: 16384,
        storage_version: "3.7.0".into(),
        db_size_quota: 2147483648,
        downgrade_info: Some(pb::DowngradeInfo {
            enabled: false,
            target_version: String::new(),
        }),
        ..Default::default()
    })
}

fn range_answer() -> Bytes {
    with_unknown_field(pb::RangeResponse {
        header: Some(pb::ResponseHeader {
            revision: 7,
            ..Default::default()
        }),
        kvs: vec![proto::mvccpb::KeyValue {
            key: Bytes::from_static(b"k"),
            value: Bytes::from_static(b"v"),
            create_revision: 2,
            mod_revision: 7,
            version: 3,
            lease: 0,
        }],
        count: 1,
        more: false,
    })
}

fn range_stream_chunks() -> Vec<Bytes> {
    (0..3)
        .map(|i| {
            with_unknown_field(pb::RangeStreamResponse {
                range_response: Some(pb::RangeResponse {
                    kvs: vec![proto::mvccpb::KeyValue {
                        key: Bytes::from(format!("k{i}")),
                        ..Default::default()
                    }],
                    count: if i == 2 { 3 } else { 0 },
                    ..Default::default()
                }),
            })
        })
        .collect()
}

/// The fake etcd: answers Range, Status and RangeStream with the bytes above, and records every request.
#[derive(Clone, Default)]
struct Fake {
    received: Arc<Mutex<Vec<(String, Bytes)>>>,
}

impl Fake {
    async fn start(&self) -> String {
        let mut listener = proxy::net::Net::bind(&proxy::net::TokioNet, ([127, 0, 0, 1], 0).into())
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((accepted, _)) = listener.accept().await else {
                    return;
                };
                let Ok(conn) = accepted.open() else {
                    continue;
                };
                let fake = fake.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let fake = fake.clone();
                        async move { Ok::<_, Infallible>(fake.answer(request).await) }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(conn), service)
                        .await;
                });
            }
        });
        addr
    }

    async fn answer(
        &self,
        request: http::Request<hyper::body::Incoming>,
    ) -> http::Response<tonic::body::Body> {
        let path = request.uri().path().to_owned();
        let received = self.received.clone();
        let record = move |message: &Bytes| {
            received
                .lock()
                .unwrap()
                .push((path.clone(), message.clone()))
        };
        let mut grpc = tonic::server::Grpc::new(RawCodec);
        match request.uri().path() {
            "/etcdserverpb.KV/RangeStream" => {
                let service = tower::service_fn(move |request: Request<Bytes>| {
                    record(request.get_ref());
                    let chunks = futures::stream::iter(range_stream_chunks().into_iter().map(Ok));
                    async move { Ok(tonic::Response::new(chunks)) }
                });
                grpc.server_streaming(service, request).await
            }
            path => {
                let answer = match path {
                    "/etcdserverpb.Maintenance/Status" => status_of_3_7(),
                    _ => range_answer(),
                };
                let service = tower::service_fn(move |request: Request<Bytes>| {
                    record(request.get_ref());
                    let answer = answer.clone();
                    async move { Ok(tonic::Response::new(answer)) }
                });
                grpc.unary(service, request).await
            }
        }
    }

    fn received(&self, path: &str) -> Vec<Bytes> {
        let received = self.received.lock().unwrap();
        received
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
            .collect()
    }
}

async fn client(proxy: &testkit::ProxyProcess) -> tonic::client::Grpc<tonic::transport::Channel> {
    let mut grpc = tonic::client::Grpc::new(support::grpc::channel(&proxy.addr()).await);
    grpc.ready().await.unwrap();
    grpc
}

#[tokio::test]
async fn requests_reach_etcd_byte_for_byte_unknown_fields_included() {
    let fake = Fake::default();
    let upstream = fake.start().await;
    let proxy = support::proxy::start(&[upstream], &[]).await;
    let mut grpc = client(&proxy).await;

    let requests = [
        (
            "/etcdserverpb.KV/Range",
            with_unknown_field(pb::RangeRequest {
                key: b"wanted".to_vec(),
                ..Default::default()
            }),
        ),
        (
            "/etcdserverpb.KV/Put",
            with_unknown_field(pb::PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            }),
        ),
        (
            "/etcdserverpb.KV/Txn",
            with_unknown_field(pb::TxnRequest::default()),
        ),
        // Bytes that are no protobuf message at all (a length past the end) go to etcd to judge.
        ("/etcdserverpb.KV/Txn", Bytes::from_static(&[0x12, 0x09])),
    ];
    for (path, bytes) in requests {
        grpc.ready().await.unwrap();
        grpc.unary(
            Request::new(bytes.clone()),
            PathAndQuery::from_static(path),
            RawCodec,
        )
        .await
        .unwrap_or_else(|s| panic!("{path}: {s:?}"));
        assert!(
            fake.received(path).contains(&bytes),
            "{path}: etcd received {:?}, not the client's {bytes:?}",
            fake.received(path)
        );
    }
}

#[tokio::test]
async fn answers_reach_the_client_byte_for_byte_unknown_fields_included() {
    let fake = Fake::default();
    let upstream = fake.start().await;
    let proxy = support::proxy::start(&[upstream], &[]).await;
    let mut grpc = client(&proxy).await;

    let status = grpc
        .unary(
            Request::new(Bytes::from(pb::StatusRequest {}.encode_to_vec())),
            PathAndQuery::from_static("/etcdserverpb.Maintenance/Status"),
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status, status_of_3_7(), "Status through the proxy");
    let decoded = pb::StatusResponse::decode(status).unwrap();
    assert_eq!(decoded.storage_version, "3.7.0");
    assert_eq!(decoded.db_size_quota, 2147483648);

    grpc.ready().await.unwrap();
    let range = grpc
        .unary(
            Request::new(Bytes::from(
                pb::RangeRequest {
                    key: b"k".to_vec(),
                    ..Default::default()
                }
                .encode_to_vec(),
            )),
            PathAndQuery::from_static("/etcdserverpb.KV/Range"),
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    assert_eq!(range, range_answer(), "Range through the proxy");

    grpc.ready().await.unwrap();
    let request = with_unknown_field(pb::RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        ..Default::default()
    });
    let chunks: Vec<Bytes> = grpc
        .server_streaming(
            Request::new(request.clone()),
            PathAndQuery::from_static("/etcdserverpb.KV/RangeStream"),
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner()
        .map(|chunk| chunk.unwrap())
        .collect()
        .await;
    assert_eq!(
        chunks,
        range_stream_chunks(),
        "RangeStream through the proxy"
    );
    assert_eq!(
        fake.received("/etcdserverpb.KV/RangeStream"),
        vec![request],
        "relayed to etcd 3.7 once, as the client sent it"
    );
}
