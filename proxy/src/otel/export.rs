//! The proxy's spans to the collector: OTLP over gRPC (`TraceService/Export`), in batches, from one background
//! task. The queue in front of it is bounded and never waited on: when it is full (the collector is slow or down)
//! a span is dropped and counted, so tracing never slows a call. The collector is dialled through the proxy's
//! [`Net`](crate::net::Net), as etcd is. When the proxy stops, what is queued is sent at once ([`Queue::flush`]).

use std::time::Duration;

use http::uri::PathAndQuery;
use prometheus::IntCounter;
use proto::opentelemetry::proto::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use proto::opentelemetry::proto::common::v1::InstrumentationScope;
use proto::opentelemetry::proto::resource::v1::Resource;
use proto::opentelemetry::proto::trace::v1::{ResourceSpans, ScopeSpans, Span};
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use crate::net::Connector;

/// Spans waiting for export at most (OpenTelemetry's batch processor's default queue).
pub const QUEUE: usize = 2048;
/// Spans in one export at most (the batch processor's default).
pub const BATCH: usize = 512;
/// How long a span waits for a batch to fill before it is sent anyway (the batch processor's default).
pub const DELAY: Duration = Duration::from_secs(5);
/// How long one export may take (the OTLP exporter's default).
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

const EXPORT_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Where finished spans are queued for export.
pub struct Queue {
    sender: mpsc::Sender<Span>,
    dropped: IntCounter,
    /// Asks the exporting task to send what is queued now, and to say when it has.
    flushes: mpsc::Sender<oneshot::Sender<()>>,
}

impl Queue {
    /// Queues `span`, or drops and counts it when the queue is full.
    pub fn push(&self, span: Span) {
        if self.sender.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    /// Sends every span queued so far without waiting for its batch to fill; returns once the collector answered
    /// (or the export failed).
    pub async fn flush(&self) {
        let (done, exported) = oneshot::channel();
        if self.flushes.send(done).await.is_ok() {
            let _ = exported.await;
        }
    }
}

/// What the exporting task needs.
pub struct Exporter {
    pub collector: String,
    pub resource: Resource,
    pub connector: Connector,
    pub dropped: IntCounter,
    pub exported: IntCounter,
}

impl Exporter {
    /// Starts the exporting task; it ends when the queue's sender is dropped.
    pub fn start(self) -> Queue {
        let (sender, receiver) = mpsc::channel(QUEUE);
        let (flushes, flush_requests) = mpsc::channel(1);
        let queue = Queue {
            sender,
            dropped: self.dropped.clone(),
            flushes,
        };
        tokio::spawn(self.run(receiver, flush_requests));
        queue
    }

    async fn run(
        self,
        mut receiver: mpsc::Receiver<Span>,
        mut flush_requests: mpsc::Receiver<oneshot::Sender<()>>,
    ) {
        let channel = match Endpoint::from_shared(format!("http://{}", self.collector)) {
            Ok(endpoint) => endpoint
                .connect_timeout(EXPORT_TIMEOUT)
                .connect_with_connector_lazy(self.connector.clone()),
            Err(err) => {
                // The address was checked when the flags were read; should it not form a URI, no span can go.
                tracing::warn!(address = %self.collector, %err, "cannot export spans to this address");
                while let Some(_span) = receiver.recv().await {
                    self.dropped.inc();
                }
                return;
            }
        };
        let mut batch = Vec::with_capacity(BATCH);
        loop {
            // Wait for a first span, then for the batch to fill or its delay to pass, unless a flush is asked for.
            let mut flush = None;
            tokio::select! {
                biased;
                asked = flush_requests.recv() => match asked {
                    Some(done) => flush = Some(done),
                    None => return,
                },
                span = receiver.recv() => match span {
                    Some(span) => batch.push(span),
                    None => return,
                },
            }
            let deadline = tokio::time::Instant::now() + DELAY;
            while flush.is_none() && batch.len() < BATCH {
                tokio::select! {
                    biased;
                    asked = flush_requests.recv() => match asked {
                        Some(done) => flush = Some(done),
                        None => return,
                    },
                    span = tokio::time::timeout_at(deadline, receiver.recv()) => match span {
                        Ok(Some(span)) => batch.push(span),
                        Ok(None) | Err(_) => break,
                    },
                }
            }
            if flush.is_some() {
                while let Ok(span) = receiver.try_recv() {
                    batch.push(span);
                }
            }
            while !batch.is_empty() {
                let rest = batch.split_off(batch.len().min(BATCH));
                let spans = std::mem::replace(&mut batch, rest);
                self.send(&channel, spans).await;
            }
            if let Some(done) = flush {
                let _ = done.send(());
            }
        }
    }

    /// Exports `spans`, counting them as exported or dropped.
    async fn send(&self, channel: &Channel, spans: Vec<Span>) {
        let count = spans.len() as u64;
        match self.export(channel.clone(), spans).await {
            Ok(rejected) => {
                self.exported.inc_by(count.saturating_sub(rejected));
                self.dropped.inc_by(rejected.min(count));
            }
            Err(status) => {
                tracing::debug!(%status, spans = count, "span export failed; spans dropped");
                self.dropped.inc_by(count);
            }
        }
    }

    /// One Export call; the number of spans the collector says it rejected.
    async fn export(&self, channel: Channel, spans: Vec<Span>) -> Result<u64, tonic::Status> {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "etcd-grpc-proxy".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    spans,
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        let call = async {
            grpc.ready()
                .await
                .map_err(|err| tonic::Status::unavailable(err.to_string()))?;
            let mut request = tonic::Request::new(request);
            request.set_timeout(EXPORT_TIMEOUT);
            grpc.unary::<_, ExportTraceServiceResponse, _>(
                request,
                PathAndQuery::from_static(EXPORT_PATH),
                ProstCodec::default(),
            )
            .await
        };
        let response = tokio::time::timeout(EXPORT_TIMEOUT, call)
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("the collector did not answer"))??;
        Ok(response
            .into_inner()
            .partial_success
            .map_or(0, |partial| partial.rejected_spans.max(0) as u64))
    }
}
