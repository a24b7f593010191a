//! One span of the proxy's own while it is open, and the OTLP record it becomes when it ends: named and described
//! as otelgrpc describes a gRPC call (`etcdserverpb.KV/Range`; `rpc.system`, `rpc.service`, `rpc.method`,
//! `rpc.grpc.status_code`), so the proxy's spans read like etcd's own.

use std::sync::Arc;

use proto::opentelemetry::proto::common::v1::{AnyValue, KeyValue, any_value};
use proto::opentelemetry::proto::trace::v1::{Span as SpanRecord, Status, span, status};

use super::Tracer;
use super::context::SpanContext;

/// Which side of a call a span is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call a client made to the proxy.
    Server,
    /// The proxy's attempt of that call on etcd.
    Client,
}

/// A recorded span not ended yet. Ending it (or dropping it: the call was cancelled) queues its record for export.
pub struct OpenSpan {
    tracer: Arc<Tracer>,
    context: SpanContext,
    parent: Option<[u8; 8]>,
    /// The method's full name, `etcdserverpb.KV/Range`.
    name: String,
    kind: Kind,
    start_unix_nanos: u64,
    ended: bool,
}

impl OpenSpan {
    pub(super) fn new(
        tracer: Arc<Tracer>,
        context: SpanContext,
        parent: Option<[u8; 8]>,
        name: String,
        kind: Kind,
    ) -> Self {
        let start_unix_nanos = tracer.now_unix_nanos();
        Self {
            tracer,
            context,
            parent,
            name,
            kind,
            start_unix_nanos,
            ended: false,
        }
    }

    /// Ends the span with the call's gRPC status code.
    pub fn end(mut self, code: tonic::Code) {
        self.finish(code);
    }

    fn finish(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let record = record(
            &self.context,
            self.parent,
            &self.name,
            self.kind,
            self.start_unix_nanos,
            self.tracer.now_unix_nanos(),
            code,
        );
        self.tracer.export(record);
    }
}

impl Drop for OpenSpan {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

/// The OTLP record of a finished span.
pub fn record(
    context: &SpanContext,
    parent: Option<[u8; 8]>,
    name: &str,
    kind: Kind,
    start_unix_nanos: u64,
    end_unix_nanos: u64,
    code: tonic::Code,
) -> SpanRecord {
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    let attributes = vec![
        text("rpc.system", "grpc"),
        text("rpc.service", service),
        text("rpc.method", method),
        KeyValue {
            key: "rpc.grpc.status_code".into(),
            value: Some(AnyValue {
                value: Some(any_value::Value::IntValue(code as i64)),
            }),
        },
    ];
    SpanRecord {
        trace_id: context.trace_id.to_vec(),
        span_id: context.span_id.to_vec(),
        parent_span_id: parent.map(|id| id.to_vec()).unwrap_or_default(),
        // Bit 0: sampled (every exported span is); bits 8 and 9: whether the parent is known to be remote.
        flags: 0x01
            | 0x100
            | if parent.is_some() && kind == Kind::Server {
                0x200
            } else {
                0
            },
        name: name.to_owned(),
        kind: match kind {
            Kind::Server => span::SpanKind::Server,
            Kind::Client => span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: start_unix_nanos,
        end_time_unix_nano: end_unix_nanos.max(start_unix_nanos),
        attributes,
        status: is_error(kind, code).then(|| Status {
            message: String::new(),
            code: status::StatusCode::Error as i32,
        }),
        ..Default::default()
    }
}

/// otelgrpc's rule: a client span is an error for any code but OK; a server span only for the codes that say
/// the server failed (not those that say the request was wrong).
fn is_error(kind: Kind, code: tonic::Code) -> bool {
    use tonic::Code::*;
    match kind {
        Kind::Client => code != Ok,
        Kind::Server => matches!(
            code,
            Unknown | DeadlineExceeded | Unimplemented | Internal | Unavailable | DataLoss
        ),
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

    fn context() -> SpanContext {
        SpanContext {
            trace_id: [7; 16],
            span_id: [8; 8],
            sampled: true,
        }
    }

    fn attribute<'a>(record: &'a SpanRecord, key: &str) -> &'a any_value::Value {
        record
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .unwrap_or_else(|| panic!("{key} missing: {record:?}"))
    }

    #[test]
    fn a_record_names_the_method_as_otelgrpc_does() {
        let record = record(
            &context(),
            Some([9; 8]),
            "etcdserverpb.KV/Range",
            Kind::Server,
            10,
            20,
            tonic::Code::NotFound,
        );
        assert_eq!(record.name, "etcdserverpb.KV/Range");
        assert_eq!(record.kind, span::SpanKind::Server as i32);
        assert_eq!(record.parent_span_id, vec![9; 8]);
        assert_eq!(
            attribute(&record, "rpc.service"),
            &any_value::Value::StringValue("etcdserverpb.KV".into())
        );
        assert_eq!(
            attribute(&record, "rpc.method"),
            &any_value::Value::StringValue("Range".into())
        );
        assert_eq!(
            attribute(&record, "rpc.grpc.status_code"),
            &any_value::Value::IntValue(5)
        );
        assert_eq!(record.status, None, "NotFound is the caller's error");
    }

    #[test]
    fn client_spans_are_errors_for_every_code_but_ok() {
        assert!(is_error(Kind::Client, tonic::Code::NotFound));
        assert!(!is_error(Kind::Client, tonic::Code::Ok));
        assert!(is_error(Kind::Server, tonic::Code::Unavailable));
        assert!(!is_error(Kind::Server, tonic::Code::InvalidArgument));
    }
}
