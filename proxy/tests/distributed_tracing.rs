//! Traces that cross the proxy. A client's W3C trace context travels to etcd; with `--enable-distributed-tracing`
//! the proxy records each call as a SERVER span (a child of the client's `traceparent`) and each attempt on etcd as
//! a CLIENT span (its child), exports them over OTLP/gRPC, and the `traceparent` etcd receives names the client
//! span, so etcd's own spans (etcd started with its tracing flags) hang under the proxy's in the same trace. A
//! collector that is down costs calls nothing: the spans are dropped and counted.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use proto::opentelemetry::proto::trace::v1::span::SpanKind;
use support::collector::{Collector, Received};
use support::grpc::{channel, with_meta};
use testkit::{Version, wait_for};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A client's trace: its id, the client's own span, and the `traceparent` (sampled) naming that span.
struct ClientTrace {
    trace_id: [u8; 16],
    span_id: [u8; 8],
}

impl ClientTrace {
    fn new(seed: u8) -> Self {
        Self {
            trace_id: [seed; 16],
            span_id: [seed.wrapping_add(1); 8],
        }
    }

    fn traceparent(&self, sampled: bool) -> String {
        format!(
            "00-{}-{}-{}",
            hex(&self.trace_id),
            hex(&self.span_id),
            if sampled { "01" } else { "00" }
        )
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn put(addr: &str, key: &str, traceparent: Option<&str>) {
    let message = PutRequest {
        key: key.into(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    let request = match traceparent {
        Some(traceparent) => with_meta(message, "traceparent", traceparent),
        None => tonic::Request::new(message),
    };
    KvClient::new(channel(addr).await)
        .put(request)
        .await
        .expect("Put succeeds");
}

/// The one span named `name` of `kind` among `spans` from the resource `service`.
fn one<'a>(
    spans: &'a [Received],
    service: &str,
    kind: SpanKind,
    name: &str,
) -> Result<&'a Received, String> {
    let found: Vec<_> = spans
        .iter()
        .filter(|r| {
            r.resource.get("service.name").map(String::as_str) == Some(service)
                && r.span.kind == kind as i32
                && r.span.name == name
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one),
        _ => Err(format!(
            "{} {kind:?} spans {name} from {service} (want 1) among {spans:#?}",
            found.len()
        )),
    }
}

/// etcd's tracing flags in the spelling of `version` (3.5 has only the experimental ones, 3.7 only the others);
/// `None` for etcd 3.4, which has no distributed tracing.
fn etcd_tracing_flags(version: Version, collector: &str) -> Option<Vec<String>> {
    let prefix = match version {
        Version::V3_4_23 => return None,
        Version::V3_5_1 | Version::V3_5_30 => "--experimental-",
        _ => "--",
    };
    Some(vec![
        format!("{prefix}enable-distributed-tracing=true"),
        format!("{prefix}distributed-tracing-address={collector}"),
        format!("{prefix}distributed-tracing-service-name=etcd"),
        format!("{prefix}distributed-tracing-sampling-rate=0"),
    ])
}

fn proxy_tracing_flags(collector: &str, rate: u32) -> Vec<String> {
    vec![
        "--enable-distributed-tracing".into(),
        format!("--distributed-tracing-address={collector}"),
        "--distributed-tracing-service-name=etcd-grpc-proxy".into(),
        "--distributed-tracing-instance-id=proxy-1".into(),
        format!("--distributed-tracing-sampling-rate={rate}"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_spans_hang_under_the_clients_trace_and_unsampled_calls_make_none() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let collector = Collector::start().await;
    let flags = proxy_tracing_flags(&collector.addr, 0);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = support::proxy::start(&etcd.endpoints(), &flags).await;

    // Rate 0: a call without a parent, and one whose parent is not sampled, make no span.
    put(&proxy.addr(), "untraced", None).await;
    let unsampled = ClientTrace::new(0x21);
    put(
        &proxy.addr(),
        "unsampled",
        Some(&unsampled.traceparent(false)),
    )
    .await;
    // A sampled parent always makes them.
    let client = ClientTrace::new(0x42);
    put(&proxy.addr(), "traced", Some(&client.traceparent(true))).await;

    let spans = wait_for(
        "the proxy's server and client span of the Put",
        TIMEOUT,
        || async {
            let spans = collector.trace(&client.trace_id);
            (spans.len() >= 2)
                .then_some(spans)
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;
    let server = one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Server,
        "etcdserverpb.KV/Put",
    )
    .unwrap();
    let upstream = one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Client,
        "etcdserverpb.KV/Put",
    )
    .unwrap();
    assert_eq!(
        server.span.parent_span_id, client.span_id,
        "the server span is the client's child"
    );
    assert_eq!(
        upstream.span.parent_span_id, server.span.span_id,
        "the attempt is the server span's child"
    );
    assert_ne!(upstream.span.span_id, server.span.span_id);
    for span in [server, upstream] {
        assert_eq!(
            span.resource.get("service.instance.id").map(String::as_str),
            Some("proxy-1")
        );
        assert_eq!(
            span.attribute("rpc.system").as_deref(),
            Some("grpc"),
            "{span:?}"
        );
        assert_eq!(
            span.attribute("rpc.service").as_deref(),
            Some("etcdserverpb.KV")
        );
        assert_eq!(span.attribute("rpc.method").as_deref(), Some("Put"));
        assert_eq!(span.attribute("rpc.grpc.status_code").as_deref(), Some("0"));
        assert!(span.span.end_time_unix_nano >= span.span.start_time_unix_nano);
        assert!(span.span.start_time_unix_nano > 0);
    }
    // Spans leave in the order they end: the earlier calls' would have come first.
    let all = collector.spans();
    assert!(
        all.iter().all(|r| r.span.trace_id == client.trace_id),
        "only the sampled call was recorded: {all:#?}"
    );
}

/// A loopback collector, and a one-member etcd of the test's version exporting its spans to it; `None` (the test
/// skips) when etcd is missing or has no distributed tracing (3.4).
async fn traced_etcd() -> Option<(testkit::Binaries, Collector, testkit::EtcdCluster)> {
    let binaries = support::etcd()?;
    let collector = Collector::start().await;
    let Some(etcd_flags) = etcd_tracing_flags(binaries.version, &collector.addr) else {
        eprintln!(
            "etcd {} has no distributed tracing: skipped",
            binaries.version.name()
        );
        return None;
    };
    let etcd_flags: Vec<&str> = etcd_flags.iter().map(String::as_str).collect();
    let etcd = support::cluster(&binaries, 1, &etcd_flags).await;
    Some((binaries, collector, etcd))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcds_spans_hang_under_the_proxys_client_span() {
    let Some((binaries, collector, etcd)) = traced_etcd().await else {
        return;
    };

    // Directly: etcd's server span is a child of the caller's span, in the caller's trace.
    let direct = ClientTrace::new(0x10);
    put(&etcd.addr(0), "direct", Some(&direct.traceparent(true))).await;
    let spans = wait_for("etcd's span of the direct Put", TIMEOUT, || async {
        let spans = collector.trace(&direct.trace_id);
        one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put")?;
        Ok::<_, String>(spans)
    })
    .await;
    let etcds = one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put").unwrap();
    assert_eq!(etcds.span.parent_span_id, direct.span_id);

    // Through the proxy: etcd's server span is a child of the proxy's client span, in the client's trace.
    let flags = proxy_tracing_flags(&collector.addr, 0);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = support::proxy::start(&etcd.endpoints(), &flags).await;
    let through = ClientTrace::new(0x30);
    put(&proxy.addr(), "through", Some(&through.traceparent(true))).await;
    let spans = wait_for(
        "etcd's and the proxy's spans of the Put",
        TIMEOUT,
        || async {
            let spans = collector.trace(&through.trace_id);
            one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put")?;
            one(
                &spans,
                "etcd-grpc-proxy",
                SpanKind::Client,
                "etcdserverpb.KV/Put",
            )?;
            one(
                &spans,
                "etcd-grpc-proxy",
                SpanKind::Server,
                "etcdserverpb.KV/Put",
            )?;
            Ok::<_, String>(spans)
        },
    )
    .await;
    let etcds = one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put").unwrap();
    let proxys = one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Client,
        "etcdserverpb.KV/Put",
    )
    .unwrap();
    assert_eq!(
        etcds.span.parent_span_id, proxys.span.span_id,
        "etcd's span hangs under the proxy's attempt"
    );

    // A server stream the proxy opens for one client carries its trace too: RangeStream is relayed to etcd 3.7, and
    // served from Range calls for an etcd before it.
    let streamed = ClientTrace::new(0x40);
    let mut answers = KvClient::new(channel(&proxy.addr()).await)
        .range_stream(with_meta(
            RangeRequest {
                key: b"through".to_vec(),
                ..Default::default()
            },
            "traceparent",
            &streamed.traceparent(true),
        ))
        .await
        .expect("RangeStream")
        .into_inner();
    while answers
        .message()
        .await
        .expect("RangeStream answers")
        .is_some()
    {}
    let etcd_method = match binaries.version {
        Version::V3_7_3 => "etcdserverpb.KV/RangeStream",
        _ => "etcdserverpb.KV/Range",
    };
    let spans = wait_for(
        "etcd's and the proxy's spans of the RangeStream",
        TIMEOUT,
        || async {
            let spans = collector.trace(&streamed.trace_id);
            one(&spans, "etcd", SpanKind::Server, etcd_method)?;
            one(&spans, "etcd-grpc-proxy", SpanKind::Client, etcd_method)?;
            one(
                &spans,
                "etcd-grpc-proxy",
                SpanKind::Server,
                "etcdserverpb.KV/RangeStream",
            )?;
            Ok::<_, String>(spans)
        },
    )
    .await;
    let etcds = one(&spans, "etcd", SpanKind::Server, etcd_method).unwrap();
    let proxys = one(&spans, "etcd-grpc-proxy", SpanKind::Client, etcd_method).unwrap();
    let served = one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Server,
        "etcdserverpb.KV/RangeStream",
    )
    .unwrap();
    assert_eq!(etcds.span.parent_span_id, proxys.span.span_id);
    assert_eq!(proxys.span.parent_span_id, served.span.span_id);
    assert_eq!(served.span.parent_span_id, streamed.span_id);

    // Without tracing on the proxy the client's context is relayed untouched: etcd's span is the client's child.
    let plain = support::proxy::start(&etcd.endpoints(), &[]).await;
    let relayed = ClientTrace::new(0x50);
    put(&plain.addr(), "relayed", Some(&relayed.traceparent(true))).await;
    let spans = wait_for("etcd's span of the relayed Put", TIMEOUT, || async {
        let spans = collector.trace(&relayed.trace_id);
        one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put")?;
        Ok::<_, String>(spans)
    })
    .await;
    let etcds = one(&spans, "etcd", SpanKind::Server, "etcdserverpb.KV/Put").unwrap();
    assert_eq!(etcds.span.parent_span_id, relayed.span_id);
    assert!(
        spans
            .iter()
            .all(|r| r.resource.get("service.name").map(String::as_str) == Some("etcd")),
        "only etcd's spans (its server span and its own inner ones): {spans:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_calls_nothing_and_its_spans_are_counted_as_dropped() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    // A port nothing listens on.
    let nowhere = format!("127.0.0.1:{}", testkit::free_port());
    let flags = proxy_tracing_flags(&nowhere, 1_000_000);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = support::proxy::start(&etcd.endpoints(), &flags).await;
    let mut kv = KvClient::new(channel(&proxy.addr()).await);
    for i in 0..20 {
        kv.put(PutRequest {
            key: format!("k{i}").into_bytes(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .expect("Put succeeds with the collector down");
        kv.range(RangeRequest {
            key: format!("k{i}").into_bytes(),
            ..Default::default()
        })
        .await
        .expect("Range succeeds with the collector down");
    }
    let dropped = wait_for("the spans counted as dropped", TIMEOUT, || async {
        let metrics = proxy.metrics().await;
        let dropped =
            support::metrics::value(&metrics, "etcd_grpc_proxy_trace_spans_dropped_total", &[])
                .unwrap_or(0.0);
        (dropped >= 80.0)
            .then_some(dropped)
            .ok_or(format!("{dropped} so far"))
    })
    .await;
    // Each of the 40 calls is a server span and a client span; none was exported.
    assert_eq!(dropped, 80.0);
    let metrics = proxy.metrics().await;
    assert_eq!(
        support::metrics::value(&metrics, "etcd_grpc_proxy_trace_spans_exported_total", &[]),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_watch_stream_is_the_proxys_own_trace_not_a_clients() {
    let Some((_, collector, etcd)) = traced_etcd().await else {
        return;
    };
    let flags = proxy_tracing_flags(&collector.addr, 1_000_000);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let proxy = support::proxy::start(&etcd.endpoints(), &flags).await;

    let client = ClientTrace::new(0x60);
    let (requests, rx) = tokio::sync::mpsc::channel(1);
    requests
        .send(support::watch::create("watched", 0))
        .await
        .expect("queue the create request");
    let mut watch =
        proto::etcdserverpb::watch_client::WatchClient::new(channel(&proxy.addr()).await)
            .watch(with_meta(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                "traceparent",
                &client.traceparent(true),
            ))
            .await
            .expect("Watch")
            .into_inner();
    let created = tokio::time::timeout(TIMEOUT, watch.message())
        .await
        .expect("the watcher is created in time")
        .expect("an answer")
        .expect("created");
    assert!(created.created, "{created:?}");
    drop(requests);
    drop(watch);

    const WATCH: &str = "etcdserverpb.Watch/Watch";
    let (own, etcds) = wait_for(
        "the client's Watch span, the shared stream's and etcd's",
        TIMEOUT,
        || async {
            let spans = collector.spans();
            let clients = collector.trace(&client.trace_id);
            one(&clients, "etcd-grpc-proxy", SpanKind::Server, WATCH)?;
            let own = one(&spans, "etcd-grpc-proxy", SpanKind::Client, WATCH)?.clone();
            let etcds = one(&spans, "etcd", SpanKind::Server, WATCH)?.clone();
            Ok::<_, String>((own, etcds))
        },
    )
    .await;
    assert_ne!(
        own.span.trace_id, client.trace_id,
        "the shared stream is in a trace of its own"
    );
    assert!(own.span.parent_span_id.is_empty(), "a root: {own:?}");
    assert_eq!(etcds.span.trace_id, own.span.trace_id);
    assert_eq!(
        etcds.span.parent_span_id, own.span.span_id,
        "etcd's stream span hangs under the proxy's stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_spans_are_sent_when_the_proxy_stops() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let collector = Collector::start().await;
    let flags = proxy_tracing_flags(&collector.addr, 0);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut proxy = support::proxy::start(&etcd.endpoints(), &flags).await;
    let client = ClientTrace::new(0x70);
    put(&proxy.addr(), "last", Some(&client.traceparent(true))).await;
    // At once: the spans' batch would wait 5 s to fill, and the proxy exits well before.
    proxy.terminate();
    support::proxy::wait_exited(&mut proxy, TIMEOUT).await;
    let spans = collector.trace(&client.trace_id);
    one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Server,
        "etcdserverpb.KV/Put",
    )
    .unwrap();
    one(
        &spans,
        "etcd-grpc-proxy",
        SpanKind::Client,
        "etcdserverpb.KV/Put",
    )
    .unwrap();
}
