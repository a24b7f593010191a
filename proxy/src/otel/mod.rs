//! `--enable-distributed-tracing`: the proxy's own spans, as etcd records its own (OpenTelemetry, exported over
//! OTLP/gRPC), without the OpenTelemetry SDK: ids come from the seeded RNG and time from `tokio::time`, so the proxy
//! stays simulable. Off by default; off, none of this exists and a client's trace context is relayed untouched.
//!
//! Each call a client makes is a SERVER span, a child of the client's `traceparent` if it sent one; each attempt
//! of it on etcd is a CLIENT span, a child of the server span, and the `traceparent` etcd receives names that
//! client span, so etcd's own spans hang under the proxy's. The server span is made where every call passes
//! (`server::grpc`), and written into the call's `traceparent` header, which `upstream::Forwarded` carries to each
//! attempt (`upstream::call`), where the client span is made. The streams the proxy shares between clients
//! (coalesced Watch and LeaseKeepAlive) are its own: each is a CLIENT span rooting a trace of its own.
//!
//! - [`context`]: W3C `traceparent`, read and written.
//! - [`sampler`]: etcd's sampler, ParentBased(TraceIDRatioBased).
//! - [`span`]: an open span, and its OTLP record.
//! - [`export`]: the bounded queue and the task that sends batches to the collector.

pub mod context;
pub mod export;
pub mod sampler;
pub mod span;

use std::sync::{Arc, Mutex};

use http::HeaderValue;
use proto::opentelemetry::proto::common::v1::{AnyValue, KeyValue, any_value};
use proto::opentelemetry::proto::resource::v1::Resource;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::net::Connector;
use context::SpanContext;
use sampler::Sampler;
use span::{Kind, OpenSpan};

/// The metadata keys of W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The tracing flags, as etcd names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--distributed-tracing-address`: the collector's `host:port` (OTLP/gRPC, plaintext as etcd dials it).
    pub address: String,
    /// `--distributed-tracing-service-name`: the resource's `service.name`.
    pub service_name: String,
    /// `--distributed-tracing-instance-id`: the resource's `service.instance.id`, left out when empty (as etcd).
    pub instance_id: String,
    /// `--distributed-tracing-sampling-rate`: root spans recorded per million.
    pub sampling_per_million: u32,
    /// The wall clock when the proxy started, in nanoseconds since the Unix epoch: span times are this plus the
    /// time `tokio::time` says has passed (the flags' reader sets it; a simulation sets its own).
    pub epoch_unix_nanos: u64,
}

/// Defaults of etcd's flags.
pub const DEFAULT_ADDRESS: &str = "localhost:4317";
pub const DEFAULT_SERVICE_NAME: &str = "etcd";

/// Makes the proxy's spans and queues them for export.
pub struct Tracer {
    sampler: Sampler,
    /// Trace and span ids: seeded from the config's seed, apart from the upstream's RNG so that turning tracing on
    /// does not change which endpoints a seed picks.
    ids: Mutex<StdRng>,
    epoch_unix_nanos: u64,
    started: Instant,
    queue: export::Queue,
}

impl Tracer {
    /// Starts the exporting task (dialling the collector through `connector`) and returns the tracer.
    pub fn start(
        settings: &Settings,
        seed: u64,
        connector: Connector,
        metrics: &Metrics,
    ) -> Arc<Self> {
        let mut attributes = vec![text("service.name", &settings.service_name)];
        if !settings.instance_id.is_empty() {
            attributes.push(text("service.instance.id", &settings.instance_id));
        }
        let queue = export::Exporter {
            collector: settings.address.clone(),
            resource: Resource {
                attributes,
                dropped_attributes_count: 0,
            },
            connector,
            dropped: metrics.trace_spans_dropped.clone(),
            exported: metrics.trace_spans_exported.clone(),
        }
        .start();
        Arc::new(Self {
            sampler: Sampler::new(settings.sampling_per_million),
            ids: Mutex::new(StdRng::seed_from_u64(seed ^ 0x7472_6163_6520_6964)),
            epoch_unix_nanos: settings.epoch_unix_nanos,
            started: Instant::now(),
            queue,
        })
    }

    /// The server span of a call to `path`: a child of the `traceparent` in `headers` if it is valid, else the
    /// root of a new trace. `headers`' `traceparent` is replaced by the span's own, for the attempts on etcd. `None`
    /// when the span is not recorded.
    pub fn server_span(
        self: &Arc<Self>,
        path: &str,
        headers: &mut http::HeaderMap,
    ) -> Option<OpenSpan> {
        let parent = headers
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(SpanContext::parse);
        let (trace_id, span_id) = {
            let mut ids = self.ids.lock().expect("never poisoned");
            let trace_id = match parent {
                Some(parent) => parent.trace_id,
                None => nonzero(&mut ids),
            };
            (trace_id, nonzero(&mut ids))
        };
        let context = SpanContext {
            trace_id,
            span_id,
            sampled: self.sampler.sampled(parent.as_ref(), &trace_id),
        };
        if let Ok(value) = HeaderValue::from_str(&context.traceparent()) {
            headers.insert(TRACEPARENT, value);
        }
        if parent.is_none() {
            // A `tracestate` belongs to the `traceparent` it came with (W3C: ignored without a valid one); a new trace
            // starts without it.
            headers.remove(TRACESTATE);
        }
        context.sampled.then(|| {
            let name = path.trim_start_matches('/').to_owned();
            OpenSpan::new(
                self.clone(),
                context,
                parent.map(|p| p.span_id),
                name,
                Kind::Server,
            )
        })
    }

    /// The client span of one attempt of `path` on etcd, a child of `parent`: the `traceparent` to send with the
    /// attempt, and the span if it is recorded.
    pub fn client_span(
        self: &Arc<Self>,
        path: &str,
        parent: SpanContext,
    ) -> (String, Option<OpenSpan>) {
        let span_id: [u8; 8] = nonzero(&mut self.ids.lock().expect("never poisoned"));
        let context = SpanContext {
            trace_id: parent.trace_id,
            span_id,
            sampled: parent.sampled,
        };
        let span = context.sampled.then(|| {
            let name = path.trim_start_matches('/').to_owned();
            OpenSpan::new(
                self.clone(),
                context,
                Some(parent.span_id),
                name,
                Kind::Client,
            )
        });
        (context.traceparent(), span)
    }

    /// The CLIENT span of a stream the proxy opens for itself and shares between clients (the coalesced Watch and
    /// LeaseKeepAlive streams): no client's trace owns it, so it is the root of a trace of its own, sampled by the
    /// rate. Returns the `traceparent` to open the stream with, and the span if it is recorded.
    pub fn own_stream_span(self: &Arc<Self>, path: &str) -> (String, Option<OpenSpan>) {
        let (trace_id, span_id) = {
            let mut ids = self.ids.lock().expect("never poisoned");
            (nonzero(&mut ids), nonzero(&mut ids))
        };
        let context = SpanContext {
            trace_id,
            span_id,
            sampled: self.sampler.sampled(None, &trace_id),
        };
        let span = context.sampled.then(|| {
            let name = path.trim_start_matches('/').to_owned();
            OpenSpan::new(self.clone(), context, None, name, Kind::Client)
        });
        (context.traceparent(), span)
    }

    /// Sends the spans queued so far (the proxy stops), waiting at most [`export::EXPORT_TIMEOUT`] for the
    /// collector.
    pub async fn flush(&self) {
        let _ = tokio::time::timeout(export::EXPORT_TIMEOUT, self.queue.flush()).await;
    }

    fn now_unix_nanos(&self) -> u64 {
        let since_start = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.epoch_unix_nanos.saturating_add(since_start)
    }

    fn export(&self, record: proto::opentelemetry::proto::trace::v1::Span) {
        self.queue.push(record);
    }
}

/// With tracing on, puts the `traceparent` of a shared stream of the proxy's own (see [`Tracer::own_stream_span`])
/// in `metadata`, and returns the stream's span, for the caller to end with the stream's status.
pub fn own_stream(
    tracer: Option<&Arc<Tracer>>,
    path: &str,
    metadata: &mut tonic::metadata::MetadataMap,
) -> Option<OpenSpan> {
    let (traceparent, span) = tracer?.own_stream_span(path);
    if let Ok(value) = traceparent.parse() {
        metadata.insert(TRACEPARENT, value);
    }
    span
}

/// Random bytes that are not all zero (an all-zero id is invalid).
fn nonzero<const N: usize>(rng: &mut StdRng) -> [u8; N] {
    loop {
        let mut id = [0u8; N];
        rng.fill(&mut id[..]);
        if id != [0; N] {
            return id;
        }
    }
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn tracer(per_million: u32) -> Arc<Tracer> {
        let settings = Settings {
            // Nothing is exported within a test: the first batch waits for export::DELAY.
            address: "127.0.0.1:9".into(),
            service_name: DEFAULT_SERVICE_NAME.into(),
            instance_id: String::new(),
            sampling_per_million: per_million,
            epoch_unix_nanos: 1,
        };
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let net: Arc<dyn crate::net::Net> = Arc::new(crate::net::TokioNet);
        Tracer::start(&settings, 7, Connector::new(net), &metrics)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        for (key, value) in pairs {
            headers.insert(*key, value.parse().unwrap());
        }
        headers
    }

    fn sent(headers: &http::HeaderMap) -> SpanContext {
        SpanContext::parse(headers[TRACEPARENT].to_str().unwrap()).expect("a valid traceparent")
    }

    #[tokio::test]
    async fn the_server_span_joins_the_callers_trace_and_is_what_etcd_is_told() {
        let tracer = tracer(0);
        let parent = SpanContext::parse(PARENT).unwrap();
        let mut call = headers(&[(TRACEPARENT, PARENT), (TRACESTATE, "vendor=x")]);
        let span = tracer.server_span("/etcdserverpb.KV/Range", &mut call);
        assert!(
            span.is_some(),
            "a sampled parent is followed whatever the rate"
        );
        let upstream = sent(&call);
        assert_eq!(upstream.trace_id, parent.trace_id);
        assert_ne!(upstream.span_id, parent.span_id);
        assert!(upstream.sampled);
        assert_eq!(
            call[TRACESTATE], "vendor=x",
            "the caller's tracestate goes on with its trace"
        );

        let (traceparent, client) = tracer.client_span("/etcdserverpb.KV/Range", upstream);
        let attempt = SpanContext::parse(&traceparent).unwrap();
        assert!(client.is_some());
        assert_eq!(attempt.trace_id, parent.trace_id);
        assert_ne!(attempt.span_id, upstream.span_id);
    }

    #[tokio::test]
    async fn without_a_valid_parent_a_new_trace_is_sampled_by_the_rate() {
        for bad in [
            None,
            Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        ] {
            let mut call = match bad {
                Some(bad) => headers(&[(TRACEPARENT, bad), (TRACESTATE, "vendor=x")]),
                None => headers(&[(TRACESTATE, "vendor=x")]),
            };
            assert!(
                tracer(0)
                    .server_span("/etcdserverpb.KV/Put", &mut call)
                    .is_none()
            );
            let upstream = sent(&call);
            assert!(!upstream.sampled, "etcd is told not to record it either");
            assert!(
                call.get(TRACESTATE).is_none(),
                "a tracestate without its traceparent is dropped"
            );
            let mut call = headers(&[]);
            assert!(
                tracer(1_000_000)
                    .server_span("/etcdserverpb.KV/Put", &mut call)
                    .is_some()
            );
            assert!(sent(&call).sampled);
        }
        let unsampled = PARENT.replace("-01", "-00");
        let mut call = headers(&[(TRACEPARENT, unsampled.as_str())]);
        assert!(
            tracer(1_000_000)
                .server_span("/etcdserverpb.KV/Put", &mut call)
                .is_none()
        );
    }
}
