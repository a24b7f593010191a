//! RangeStream through the proxy on etcd 3.4.23, 3.5.1 and 3.5.30, none of which serves it: the proxy builds the
//! stream from Range calls. Whatever the keyspace, the client's limit and the writes made meanwhile, the chunks
//! put together are one Range at the pinned revision, and `header`, `more` and `count` come on the last chunk only.

mod support;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{DeleteRangeRequest, PutRequest, RangeRequest, range_request};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::{Code, Request};

/// The proxy's `--max-send-bytes`, which the emulation (like etcd 3.7 its `--max-request-bytes`) aims its chunk
/// sizes at: small, so that values of a few KiB make the chunk limit halve as well as double.
const MAX_SEND_BYTES: &str = "8192";

/// One generated case: keys (by suffix) with value sizes, the client's limit (0: none), keys only or not.
#[derive(Debug, Clone)]
struct Case {
    keys: Vec<(u8, usize)>,
    limit: i64,
    keys_only: bool,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0u8..120, 0usize..3000), 0..80),
        prop_oneof![Just(0i64), 1i64..90],
        any::<bool>(),
    )
        .prop_map(|(keys, limit, keys_only)| Case {
            keys,
            limit,
            keys_only,
        })
}

fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    *end.last_mut().unwrap() += 1;
    end
}

async fn run_case(
    number: usize,
    case: &Case,
    etcd: &mut KvClient<Channel>,
    proxy: &mut KvClient<Channel>,
) -> Result<usize, String> {
    let prefix = format!("rs/{number:04}/").into_bytes();
    for (suffix, len) in &case.keys {
        let mut key = prefix.clone();
        key.extend(format!("{suffix:03}").bytes());
        let put = PutRequest {
            key,
            value: vec![b'x'; *len],
            ..Default::default()
        };
        etcd.put(put).await.map_err(|s| format!("put: {s:?}"))?;
    }
    let request = RangeRequest {
        key: prefix.clone(),
        range_end: prefix_end(&prefix),
        limit: case.limit,
        keys_only: case.keys_only,
        ..Default::default()
    };
    let mut stream = proxy
        .range_stream(request.clone())
        .await
        .map_err(|s| format!("open: {s:?}"))?
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|s| format!("chunk: {s:?}"))?;
        chunks.push(
            chunk
                .range_response
                .ok_or("a chunk without range_response")?,
        );
        if chunks.len() == 1 {
            // The range changes under the stream: every key deleted, one new key in the middle. The client's
            // small flow-control window keeps the proxy at most a chunk ahead of what the client has read, so
            // from the third chunk on, pages are read after these writes.
            etcd.delete_range(DeleteRangeRequest {
                key: prefix.clone(),
                range_end: prefix_end(&prefix),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("delete: {s:?}"))?;
            let mut key = prefix.clone();
            key.extend(b"050+");
            etcd.put(PutRequest {
                key,
                value: b"later".to_vec(),
                ..Default::default()
            })
            .await
            .map_err(|s| format!("put: {s:?}"))?;
        }
    }

    let (last, rest) = chunks.split_last().ok_or("no chunk at all")?;
    for chunk in rest {
        if chunk.header.is_some() || chunk.more || chunk.count != 0 {
            return Err(format!(
                "header, more or count before the last chunk: {chunk:?}"
            ));
        }
    }
    if chunks[0].kvs.len() > 10 {
        return Err(format!("a first chunk of {} keys", chunks[0].kvs.len()));
    }
    let pinned = last
        .header
        .as_ref()
        .ok_or("no header on the last chunk")?
        .revision;
    let streamed_kvs: Vec<_> = chunks.iter().flat_map(|c| c.kvs.clone()).collect();
    let expected = etcd
        .range(RangeRequest {
            revision: pinned,
            ..request
        })
        .await
        .map_err(|s| format!("range at {pinned}: {s:?}"))?
        .into_inner();
    if streamed_kvs != expected.kvs {
        return Err(format!(
            "at revision {pinned} the chunks hold {} keys, one Range {}",
            streamed_kvs.len(),
            expected.kvs.len()
        ));
    }
    if (last.more, last.count) != (expected.more, expected.count) {
        return Err(format!(
            "more/count {:?}, one Range {:?}",
            (last.more, last.count),
            (expected.more, expected.count)
        ));
    }
    Ok(chunks.len())
}

/// A channel whose streams accept 1 KiB at a time: the server can send the next chunk only once the client has
/// read the last one.
async fn small_window_channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

#[test]
fn streamed_chunks_are_one_range_at_the_pinned_revision_on_every_version() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut versions = 0;
    for version in testkit::Version::ALL {
        let Some(binaries) = version.require() else {
            continue;
        };
        versions += 1;
        let (cluster, proxy, etcd, through) = runtime.block_on(async {
            let cluster = support::cluster(&binaries, 1, &[]).await;
            let proxy = support::proxy::start(
                &cluster.endpoints(),
                &[&format!("--max-send-bytes={MAX_SEND_BYTES}")],
            )
            .await;
            let etcd = KvClient::new(support::grpc::channel(&cluster.endpoint(0)).await);
            let through = KvClient::new(small_window_channel(&proxy.addr()).await);
            (cluster, proxy, etcd, through)
        });
        let config = Config {
            cases: 12,
            failure_persistence: None,
            ..Config::default()
        };
        // A fixed seed: the same cases on every run and machine; a failure names its case.
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
        let seen = std::cell::RefCell::new(Vec::new());
        let number = std::cell::Cell::new(0);
        let outcome = runner.run(&cases(), |case| {
            number.set(number.get() + 1);
            let (mut etcd, mut through) = (etcd.clone(), through.clone());
            match runtime.block_on(run_case(number.get(), &case, &mut etcd, &mut through)) {
                Ok(s) => {
                    seen.borrow_mut().push(s);
                    Ok(())
                }
                Err(why) => Err(TestCaseError::fail(format!("etcd {version:?}: {why}"))),
            }
        });
        if let Err(failure) = outcome {
            panic!("{failure}\nproxy log:\n{}", proxy.log_tail(40));
        }
        // The checks above mean something only if some streams had pages read after the writes.
        let chunks = seen.into_inner();
        assert!(
            chunks.iter().filter(|&&n| n >= 3).count() >= 3,
            "etcd {version:?}: fewer than 3 cases streamed 3 chunks or more: {chunks:?}"
        );
        drop((proxy, cluster));
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        assert_eq!(versions, 3, "CI has all three etcd versions");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn count_only_and_refused_requests_are_answered_as_etcd_3_7_does() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let mut etcd = KvClient::new(support::grpc::channel(&cluster.endpoint(0)).await);
    let mut through = KvClient::new(support::grpc::channel(&proxy.addr()).await);
    for i in 0..25 {
        etcd.put(PutRequest {
            key: format!("c/{i:02}").into_bytes(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let range = RangeRequest {
        key: b"c/".to_vec(),
        range_end: b"c0".to_vec(),
        ..Default::default()
    };

    let counted: Vec<_> = through
        .range_stream(RangeRequest {
            count_only: true,
            ..range.clone()
        })
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<Vec<_>, _>>()
        .await
        .unwrap();
    assert_eq!(counted.len(), 1, "count_only: one chunk");
    let only = counted[0].range_response.clone().unwrap();
    assert_eq!((only.count, only.kvs.len(), only.more), (25, 0, false));
    assert!(only.header.unwrap().revision > 0);

    let refusals = [
        (
            RangeRequest {
                sort_order: range_request::SortOrder::Descend as i32,
                ..range.clone()
            },
            Code::Unimplemented,
            "RangeStream does not support custom sort orders",
        ),
        (
            RangeRequest {
                min_mod_revision: 2,
                ..range.clone()
            },
            Code::Unimplemented,
            "RangeStream does not support revision filters",
        ),
        (
            RangeRequest::default(),
            Code::InvalidArgument,
            "etcdserver: key is not provided",
        ),
    ];
    for (request, code, message) in refusals {
        let refused = through
            .range_stream(Request::new(request))
            .await
            .expect_err(message);
        assert_eq!((refused.code(), refused.message()), (code, message));
    }

    // A compacted revision is etcd's own error, as from Range.
    etcd.compact(proto::etcdserverpb::CompactionRequest {
        revision: 10,
        physical: true,
    })
    .await
    .unwrap();
    let after = through
        .range_stream(RangeRequest {
            revision: 2,
            ..range
        })
        .await
        .unwrap()
        .into_inner()
        .next()
        .await
        .unwrap()
        .expect_err("revision 2 is compacted");
    assert_eq!(
        (after.code(), after.message()),
        (
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted"
        )
    );
}

/// A stream the proxy builds from Range pages ends, between two pages, with Unavailable when the proxy shuts down
/// (the client then lists again elsewhere), as relayed streams do, instead of running on through the shutdown.
#[tokio::test(flavor = "multi_thread")]
async fn an_emulated_stream_ends_with_unavailable_when_the_proxy_shuts_down() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &["--max-send-bytes=2048"]).await;
    let mut etcd = KvClient::new(support::grpc::channel(&cluster.endpoint(0)).await);
    for i in 0..200 {
        etcd.put(PutRequest {
            key: format!("s/{i:03}").into_bytes(),
            value: vec![b'v'; 500],
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let mut through = KvClient::new(small_window_channel(&proxy.addr()).await);
    let mut stream = through
        .range_stream(RangeRequest {
            key: b"s/".to_vec(),
            range_end: b"s0".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.next().await.unwrap().unwrap();
    let first_keys = first.range_response.unwrap().kvs.len();
    assert!(first_keys < 200, "one chunk cannot hold the range");
    proxy.terminate();
    let mut keys = first_keys;
    let end = loop {
        match tokio::time::timeout(std::time::Duration::from_secs(30), stream.next()).await {
            Ok(Some(Ok(chunk))) => keys += chunk.range_response.unwrap().kvs.len(),
            Ok(Some(Err(status))) => break status,
            Ok(None) => {
                panic!("the stream ended cleanly with {keys} of 200 keys after the shutdown began")
            }
            Err(_) => panic!("the stream neither ended nor went on within 30 s of the shutdown"),
        }
    };
    assert_eq!(
        (end.code(), end.message()),
        (Code::Unavailable, "etcd-grpc-proxy: shutting down")
    );
    assert!(keys < 200, "{keys}");
}
