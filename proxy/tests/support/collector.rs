//! A loopback OTLP/gRPC collector: serves `TraceService/Export` and keeps every span it receives with the
//! resource it came under, for tests of the proxy's (and etcd's) distributed tracing.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use proto::opentelemetry::proto::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use proto::opentelemetry::proto::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use proto::opentelemetry::proto::common::v1::{KeyValue, any_value};
use proto::opentelemetry::proto::trace::v1::Span;
use tokio::task::{JoinHandle, JoinSet};
use tonic::{Request, Response, Status};

/// One received span and the attributes of the resource it was exported under.
#[derive(Clone, Debug)]
pub struct Received {
    pub resource: HashMap<String, String>,
    pub span: Span,
}

impl Received {
    /// The span's attribute `key` as text (ints as their digits).
    pub fn attribute(&self, key: &str) -> Option<String> {
        attributes(&self.span.attributes).remove(key)
    }
}

/// A running collector.
pub struct Collector {
    pub addr: String,
    spans: Arc<Mutex<Vec<Received>>>,
    serving: JoinHandle<()>,
}

#[derive(Clone)]
struct Keep(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Keep {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut kept = self.0.lock().expect("not poisoned");
        for resource_spans in request.into_inner().resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| attributes(&r.attributes))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    kept.push(Received {
                        resource: resource.clone(),
                        span,
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Listens on a free loopback port.
    pub async fn start() -> Self {
        let mut listener = proxy::net::Net::bind(&proxy::net::TokioNet, ([127, 0, 0, 1], 0).into())
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("a bound address").to_string();
        let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
        let server = TraceServiceServer::new(Keep(spans.clone()));
        let serving = tokio::spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((accepted, _)) = listener.accept().await {
                let Ok(conn) = accepted.open() else {
                    continue;
                };
                let server = server.clone();
                let service = hyper::service::service_fn(move |request: http::Request<_>| {
                    let mut server = server.clone();
                    async move {
                        let response = tower::Service::call(&mut server, request).await;
                        Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
                    }
                });
                connections.spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(conn), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            spans,
            serving,
        }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("not poisoned").clone()
    }

    /// The spans of the trace `trace_id` received so far.
    pub fn trace(&self, trace_id: &[u8]) -> Vec<Received> {
        self.spans()
            .into_iter()
            .filter(|r| r.span.trace_id == trace_id)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

fn attributes(list: &[KeyValue]) -> HashMap<String, String> {
    list.iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => s.clone(),
                any_value::Value::IntValue(i) => i.to_string(),
                any_value::Value::BoolValue(b) => b.to_string(),
                any_value::Value::DoubleValue(d) => d.to_string(),
                any_value::Value::BytesValue(b) => format!("{b:?}"),
            };
            Some((kv.key.clone(), value))
        })
        .collect()
}
