//! The proxy's Prometheus metrics, registered in a registry owned by the running proxy (never a global one), so
//! that several proxies in one process (tests, the simulation) keep separate counts.

use std::sync::Arc;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Every metric the proxy exports, shared: a clone is one reference count, not one per metric (each call's record
/// holds one until its response ends).
#[derive(Clone)]
pub struct Metrics(Arc<MetricSet>);

impl std::ops::Deref for Metrics {
    type Target = MetricSet;

    fn deref(&self) -> &MetricSet {
        &self.0
    }
}

/// The metrics themselves.
pub struct MetricSet {
    registry: Registry,
    /// RPCs started, by type, service and method (go-grpc-prometheus names).
    pub grpc_started: IntCounterVec,
    /// RPCs completed, by type, service, method and gRPC code.
    pub grpc_handled: IntCounterVec,
    /// Seconds from the start of an RPC to its status.
    pub grpc_handling_seconds: HistogramVec,
    /// 1 while the endpoint is believed reachable.
    pub upstream_up: IntGaugeVec,
    /// 1 for the endpoint currently serving.
    pub upstream_active: IntGaugeVec,
    /// Times the active endpoint was replaced after a failure.
    pub upstream_failovers: IntCounter,
    /// Serializable reads asked again linearizably because their member lagged.
    pub serializable_reads_reasked: IntCounter,
    /// Spans of the proxy's own (`--enable-distributed-tracing`) dropped: the export queue was full (the collector
    /// slow or down) or an export failed.
    pub trace_spans_dropped: IntCounter,
    /// Spans of the proxy's own that the collector accepted.
    pub trace_spans_exported: IntCounter,
    /// Range calls answered from the range cache (etcd's Go proxy's name; a counter here, a gauge there).
    pub cache_hits: IntCounter,
    /// Serializable Range calls the range cache could not answer.
    pub cache_misses: IntCounter,
    /// Ranges the cache holds now.
    pub cache_keys: IntGauge,
    /// Bytes the cache's copies count against `--range-cache-max-bytes`.
    pub cache_bytes: IntGauge,
    /// Cached ranges evicted to stay within `--range-cache-max-bytes`.
    pub cache_evictions: IntCounter,
    /// Cached ranges dropped after failing to answer reads in a row.
    pub cache_retirements: IntCounter,
    /// Times the whole range cache fell asleep for answering next to nothing.
    pub cache_sleeps: IntCounter,
    /// Range calls answered locally from keys the leasing protocol owns (`--experimental-leasing-prefix`).
    pub leasing_local_reads: IntCounter,
    /// Keys the leasing protocol owns now.
    pub leasing_owned_keys: IntGauge,
    /// Client LeaseKeepAlive streams open now.
    pub lease_client_streams: IntGauge,
    /// Upstream LeaseKeepAlive streams open now (one while any lease is being kept alive).
    pub lease_upstream_streams: IntGauge,
    /// Renewals sent to etcd.
    pub lease_renewals_forwarded: IntCounter,
    /// Client keep-alive requests answered by a renewal another request triggered.
    pub lease_renewals_shared: IntCounter,
    /// Client keep-alive requests whose renewal's answer a broken upstream stream lost, answered from etcd's
    /// LeaseTimeToLive instead of renewing again (`lease::confirm`).
    pub lease_renewals_confirmed: IntCounter,
    /// Client watchers that share an upstream watcher with another (client watchers minus upstream watchers).
    pub watchers_coalescing: IntGauge,
    /// Events delivered to more than one client watcher from one upstream event (receivers − 1 per response).
    pub watch_events_coalescing: IntCounter,
    /// Client watchers open now.
    pub watch_client_watchers: IntGauge,
    /// Upstream watchers open now.
    pub watch_upstream_watchers: IntGauge,
    /// Tokens the proxy obtained for its own identity (`--user`), by outcome.
    pub watch_identity_authentications: IntCounterVec,
    /// `/health` checks that passed and failed (etcd's names).
    pub client_connections: IntGauge,
    pub client_connections_refused: IntCounter,
    pub client_calls_refused: IntCounter,
    pub health_success: IntCounter,
    pub health_failures: IntCounter,
}

const RPC_LABELS: [&str; 3] = ["grpc_type", "grpc_service", "grpc_method"];

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: Registry) -> prometheus::Result<Self> {
        let grpc_started = IntCounterVec::new(
            Opts::new(
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
            ),
            &RPC_LABELS,
        )?;
        let grpc_handled = IntCounterVec::new(
            Opts::new(
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
            ),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )?;
        let grpc_handling_seconds = HistogramVec::new(
            HistogramOpts::new(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            )
            .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &RPC_LABELS,
        )?;
        let upstream_up = IntGaugeVec::new(
            Opts::new(
                "etcd_grpc_proxy_upstream_up",
                "1 while the etcd endpoint is believed reachable, else 0.",
            ),
            &["endpoint"],
        )?;
        let upstream_active = IntGaugeVec::new(
            Opts::new(
                "etcd_grpc_proxy_upstream_active",
                "1 for the etcd endpoint that currently serves requests.",
            ),
            &["endpoint"],
        )?;
        let upstream_failovers = IntCounter::new(
            "etcd_grpc_proxy_upstream_failovers_total",
            "Times the active etcd endpoint was replaced after a failure.",
        )?;
        let trace_spans_dropped = IntCounter::new(
            "etcd_grpc_proxy_trace_spans_dropped_total",
            "Spans of the proxy's own dropped because the OTLP collector was slow, down or refused them.",
        )?;
        let trace_spans_exported = IntCounter::new(
            "etcd_grpc_proxy_trace_spans_exported_total",
            "Spans of the proxy's own that the OTLP collector accepted.",
        )?;
        let cache_hits = IntCounter::new(
            "etcd_grpc_proxy_cache_hits_total",
            "Total number of cache hits",
        )?;
        let cache_misses = IntCounter::new(
            "etcd_grpc_proxy_cache_misses_total",
            "Total number of cache misses",
        )?;
        let cache_keys = IntGauge::new(
            "etcd_grpc_proxy_cache_keys_total",
            "Total number of keys/ranges cached",
        )?;
        let cache_bytes = IntGauge::new(
            "etcd_grpc_proxy_cache_bytes",
            "Bytes the range cache holds, as counted against --range-cache-max-bytes",
        )?;
        let cache_evictions = IntCounter::new(
            "etcd_grpc_proxy_cache_evictions_total",
            "Cached ranges evicted to stay within --range-cache-max-bytes",
        )?;
        let cache_retirements = IntCounter::new(
            "etcd_grpc_proxy_cache_retired_total",
            "Cached ranges dropped after 32 reads in a row, over at least 2 s, they could not answer (each then rests 1 s to 32 s before it is cached again)",
        )?;
        let cache_sleeps = IntCounter::new(
            "etcd_grpc_proxy_cache_sleeps_total",
            "Times the range cache dropped every copy and let every read go to etcd for a while (1 s to 8 s), its copies having answered fewer than 1 read in 32 over at least 200 ms (450 ms from etcd 3.5.8)",
        )?;
        let leasing_local_reads = IntCounter::new(
            "etcd_grpc_proxy_leasing_local_reads_total",
            "Range calls answered locally from keys the leasing protocol owns (--experimental-leasing-prefix).",
        )?;
        let leasing_owned_keys = IntGauge::new(
            "etcd_grpc_proxy_leasing_owned_keys",
            "Keys the leasing protocol owns now.",
        )?;
        let serializable_reads_reasked = IntCounter::new(
            "etcd_grpc_proxy_serializable_reads_reasked_total",
            "Serializable reads asked again linearizably because their member's answer was older than a revision \
             the proxy had already returned, or came before the proxy had learnt any revision etcd committed.",
        )?;
        let lease_client_streams = IntGauge::new(
            "etcd_grpc_proxy_lease_keepalive_client_streams",
            "Client LeaseKeepAlive streams open now.",
        )?;
        let lease_upstream_streams = IntGauge::new(
            "etcd_grpc_proxy_lease_keepalive_upstream_streams",
            "Upstream LeaseKeepAlive streams open now.",
        )?;
        let lease_renewals_forwarded = IntCounter::new(
            "etcd_grpc_proxy_lease_renewals_forwarded_total",
            "Lease renewals sent to etcd.",
        )?;
        let lease_renewals_shared = IntCounter::new(
            "etcd_grpc_proxy_lease_renewals_shared_total",
            "Client keep-alive requests answered by a renewal that another request triggered.",
        )?;
        let lease_renewals_confirmed = IntCounter::new(
            "etcd_grpc_proxy_lease_renewals_confirmed_total",
            "Client keep-alive requests whose renewal's answer was lost, answered from LeaseTimeToLive instead of \
             renewing again.",
        )?;
        let watchers_coalescing = IntGauge::new(
            "etcd_grpc_proxy_watchers_coalescing_total",
            "Client watchers that share an upstream watcher with another client watcher.",
        )?;
        let watch_events_coalescing = IntCounter::new(
            "etcd_grpc_proxy_events_coalescing_total",
            "Upstream watch responses delivered to more than one client watcher, counted per extra receiver.",
        )?;
        let watch_client_watchers = IntGauge::new(
            "etcd_grpc_proxy_watch_client_watchers",
            "Client watchers open now.",
        )?;
        let watch_upstream_watchers = IntGauge::new(
            "etcd_grpc_proxy_watch_upstream_watchers",
            "Upstream watchers open on etcd now.",
        )?;
        let watch_identity_authentications = IntCounterVec::new(
            Opts::new(
                "etcd_grpc_proxy_watch_identity_authentications_total",
                "Authenticate calls the proxy made for its --user (the token of its upstream watch streams), by result.",
            ),
            &["result"],
        )?;
        let client_connections = IntGauge::new(
            "etcd_grpc_proxy_client_connections",
            "Client connections open now (both listeners).",
        )?;
        let client_connections_refused = IntCounter::new(
            "etcd_grpc_proxy_client_connections_refused_total",
            "Client connections closed as soon as accepted because --max-client-connections were open.",
        )?;
        let client_calls_refused = IntCounter::new(
            "etcd_grpc_proxy_client_calls_refused_total",
            "gRPC calls refused with ResourceExhausted because --max-client-calls were in progress.",
        )?;
        let health_success = IntCounter::new(
            "etcd_server_health_success",
            "The total number of successful health checks",
        )?;
        let health_failures = IntCounter::new(
            "etcd_server_health_failures",
            "The total number of failed health checks",
        )?;
        registry.register(Box::new(grpc_started.clone()))?;
        registry.register(Box::new(grpc_handled.clone()))?;
        registry.register(Box::new(grpc_handling_seconds.clone()))?;
        registry.register(Box::new(upstream_up.clone()))?;
        registry.register(Box::new(upstream_active.clone()))?;
        registry.register(Box::new(upstream_failovers.clone()))?;
        registry.register(Box::new(serializable_reads_reasked.clone()))?;
        registry.register(Box::new(trace_spans_dropped.clone()))?;
        registry.register(Box::new(trace_spans_exported.clone()))?;
        registry.register(Box::new(cache_hits.clone()))?;
        registry.register(Box::new(cache_misses.clone()))?;
        registry.register(Box::new(cache_keys.clone()))?;
        registry.register(Box::new(cache_bytes.clone()))?;
        registry.register(Box::new(cache_evictions.clone()))?;
        registry.register(Box::new(cache_retirements.clone()))?;
        registry.register(Box::new(cache_sleeps.clone()))?;
        registry.register(Box::new(leasing_local_reads.clone()))?;
        registry.register(Box::new(leasing_owned_keys.clone()))?;
        registry.register(Box::new(lease_client_streams.clone()))?;
        registry.register(Box::new(lease_upstream_streams.clone()))?;
        registry.register(Box::new(lease_renewals_forwarded.clone()))?;
        registry.register(Box::new(lease_renewals_shared.clone()))?;
        registry.register(Box::new(lease_renewals_confirmed.clone()))?;
        registry.register(Box::new(watchers_coalescing.clone()))?;
        registry.register(Box::new(watch_events_coalescing.clone()))?;
        registry.register(Box::new(watch_client_watchers.clone()))?;
        registry.register(Box::new(watch_upstream_watchers.clone()))?;
        registry.register(Box::new(watch_identity_authentications.clone()))?;
        registry.register(Box::new(client_connections.clone()))?;
        registry.register(Box::new(client_connections_refused.clone()))?;
        registry.register(Box::new(client_calls_refused.clone()))?;
        registry.register(Box::new(health_success.clone()))?;
        registry.register(Box::new(health_failures.clone()))?;
        Ok(Self(Arc::new(MetricSet {
            registry,
            grpc_started,
            grpc_handled,
            grpc_handling_seconds,
            upstream_up,
            upstream_active,
            upstream_failovers,
            serializable_reads_reasked,
            trace_spans_dropped,
            trace_spans_exported,
            cache_hits,
            cache_misses,
            cache_keys,
            cache_bytes,
            cache_evictions,
            cache_retirements,
            cache_sleeps,
            leasing_local_reads,
            leasing_owned_keys,
            lease_client_streams,
            lease_upstream_streams,
            lease_renewals_forwarded,
            lease_renewals_shared,
            lease_renewals_confirmed,
            watchers_coalescing,
            watch_events_coalescing,
            watch_client_watchers,
            watch_upstream_watchers,
            watch_identity_authentications,
            client_connections,
            client_connections_refused,
            client_calls_refused,
            health_success,
            health_failures,
        })))
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics; an error would mean a bug in registration.
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(%err, "encoding metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The go-grpc-prometheus `grpc_type` of an etcd method, from its full path.
pub fn grpc_type(path: &str) -> &'static str {
    match path {
        "/etcdserverpb.Watch/Watch" | "/etcdserverpb.Lease/LeaseKeepAlive" => "bidi_stream",
        "/etcdserverpb.Maintenance/Snapshot" | "/v3electionpb.Election/Observe" => "server_stream",
        _ => "unary",
    }
}

/// The go-grpc-prometheus `grpc_code` label for a numeric gRPC status code.
pub fn code_label(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_proxies_keep_separate_counts() {
        let a = Metrics::new(Registry::new()).unwrap();
        let b = Metrics::new(Registry::new()).unwrap();
        a.upstream_failovers.inc();
        assert!(
            a.render()
                .contains("etcd_grpc_proxy_upstream_failovers_total 1")
        );
        assert!(
            b.render()
                .contains("etcd_grpc_proxy_upstream_failovers_total 0")
        );
    }

    #[test]
    fn streaming_methods_have_their_grpc_type() {
        assert_eq!(grpc_type("/etcdserverpb.Watch/Watch"), "bidi_stream");
        assert_eq!(
            grpc_type("/etcdserverpb.Maintenance/Snapshot"),
            "server_stream"
        );
        assert_eq!(grpc_type("/etcdserverpb.KV/Range"), "unary");
    }
}
