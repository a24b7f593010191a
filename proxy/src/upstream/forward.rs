//! What of a client's request travels upstream besides the message: the metadata etcd reads and the deadline.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Request;
use tonic::metadata::MetadataMap;

/// Metadata keys etcd reads from requests: the auth token (gRPC and gateway spellings), the leader requirement, the
/// client's API version (a label of etcd's `etcd_server_client_requests_total`; etcd refuses one that is not UTF-8),
/// and the trace context its otelgrpc interceptor reads (W3C `traceparent` and `tracestate`, and `baggage`), so a
/// trace a client starts reaches etcd's spans through the proxy (with `--enable-distributed-tracing`, `traceparent`
/// names the proxy's span instead: see [`crate::otel`]).
const FORWARDED_KEYS: [&str; 7] = [
    "token",
    "authorization",
    "hasleader",
    "client-api-version",
    "traceparent",
    "tracestate",
    "baggage",
];

/// The parts of a client request that each upstream attempt repeats.
#[derive(Clone, Debug, Default)]
pub struct Forwarded {
    metadata: MetadataMap,
    /// When the client stops waiting, from its `grpc-timeout`.
    pub deadline: Option<Instant>,
}

impl Forwarded {
    /// Captures what must be forwarded from a client request.
    pub fn capture<T>(request: &Request<T>) -> Self {
        let incoming = request.metadata();
        let mut metadata = MetadataMap::new();
        for key in FORWARDED_KEYS {
            for value in incoming.get_all(key) {
                metadata.append(key, value.clone());
            }
        }
        let deadline = incoming
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|t| Instant::now() + t);
        Self { metadata, deadline }
    }

    /// Builds the upstream request for one attempt.
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        *request.metadata_mut() = self.metadata.clone();
        if let Some(deadline) = self.deadline {
            request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        request
    }

    /// The caller's auth token: `token`, or else `authorization` (the gRPC gateway's spelling), the order etcd
    /// reads them in.
    pub fn token(&self) -> Option<String> {
        ["token", "authorization"].into_iter().find_map(|key| {
            let value = self.metadata.get(key)?.to_str().ok()?;
            Some(value.to_owned())
        })
    }

    /// The span the caller's `traceparent` names, if it is valid.
    pub fn trace_parent(&self) -> Option<crate::otel::context::SpanContext> {
        let value = self.metadata.get(crate::otel::TRACEPARENT)?.to_str().ok()?;
        crate::otel::context::SpanContext::parse(value)
    }

    /// Whether the caller requires a leader (`hasleader: true`).
    pub fn requires_leader(&self) -> bool {
        self.metadata.get("hasleader").and_then(|v| v.to_str().ok()) == Some("true")
    }
}

/// Parses a gRPC `grpc-timeout` header value: up to 8 digits and a unit (H, M, S, m, u, n).
pub fn parse_grpc_timeout(raw: &str) -> Option<Duration> {
    if raw.len() < 2 || raw.len() > 9 {
        return None;
    }
    let (digits, unit) = raw.split_at(raw.len() - 1);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_read_as_etcd_reads_it() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut request = Request::new(());
            for (k, v) in pairs {
                request.metadata_mut().insert(*k, v.parse().unwrap());
            }
            Forwarded::capture(&request).token()
        };
        assert_eq!(with(&[("token", "a")]).as_deref(), Some("a"));
        assert_eq!(with(&[("authorization", "b")]).as_deref(), Some("b"));
        assert_eq!(
            with(&[("token", "a"), ("authorization", "b")]).as_deref(),
            Some("a")
        );
        assert_eq!(with(&[("x-other", "c")]), None);
    }

    #[test]
    fn grpc_timeouts_parse_per_the_spec() {
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("999999999S"), None, "more than 8 digits");
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
    }

    #[test]
    fn trace_context_and_the_api_version_travel_upstream_as_sent() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut request = Request::new(());
        for (key, value) in [
            ("traceparent", traceparent),
            ("tracestate", "vendor=opaque"),
            ("baggage", "user=alice"),
            ("client-api-version", "3.6"),
        ] {
            request.metadata_mut().insert(key, value.parse().unwrap());
        }
        let forwarded = Forwarded::capture(&request);
        let upstream = forwarded.request(());
        assert_eq!(upstream.metadata().get("traceparent").unwrap(), traceparent);
        assert_eq!(
            upstream.metadata().get("tracestate").unwrap(),
            "vendor=opaque"
        );
        assert_eq!(upstream.metadata().get("baggage").unwrap(), "user=alice");
        assert_eq!(
            upstream.metadata().get("client-api-version").unwrap(),
            "3.6"
        );
        assert_eq!(
            forwarded.trace_parent().map(|p| p.traceparent()).as_deref(),
            Some(traceparent)
        );
    }

    #[test]
    fn token_and_hasleader_are_forwarded_and_nothing_else() {
        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("token", "abc".parse().unwrap());
        request
            .metadata_mut()
            .insert("hasleader", "true".parse().unwrap());
        request
            .metadata_mut()
            .insert("x-other", "1".parse().unwrap());
        let forwarded = Forwarded::capture(&request);
        let upstream = forwarded.request(());
        assert_eq!(upstream.metadata().get("token").unwrap(), "abc");
        assert!(forwarded.requires_leader());
        assert!(upstream.metadata().get("x-other").is_none());
    }
}
