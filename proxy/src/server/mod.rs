//! One listener for everything: gRPC (HTTP/2) and the admin routes (HTTP/1.1 and HTTP/2), told apart per request:
//! `/health` (etcd's health through the proxy's upstream path), `/proxy/health` (the proxy checked through its own
//! listener), `/metrics` (etcd's metrics, relayed from the active member), `/proxy/metrics` (the proxy's own), and
//! `/debug/pprof/` with `--enable-pprof` ([`crate::profiling`]). Also the per-RPC metrics, the per-call log lines,
//! and graceful shutdown.
//!
//! - [`call_log`]: `--experimental-enable-grpc-logging`'s line for each call, written where the metrics record it.
//! - [`limits`]: how many client connections and calls are taken at once.
//! - [`setup`]: the deadline by which a new connection must have sent its HTTP/2 preface or HTTP/1.1 request head.
//! - [`ping_guard`]: each client connection's HTTP/2 frames watched for pings that come too often
//!   ([`ping_policy`], grpc-go's rules), [`frames`] finding their headers.

// The frame follower and the ping guard read bytes from clients: the fuzz targets (`fuzzing`) reach them too.
mod call_log;
pub(crate) mod frames;
mod limits;
pub(crate) mod ping_guard;
mod ping_policy;
mod setup;

pub use limits::Limits;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::body::Body;

use crate::config::Config;
use crate::metrics::{self, Metrics};
use crate::net::Listener;
use crate::tls::ServerTls;
use crate::upstream::{Upstream, shutting_down};
use crate::workers::{WorkerExecutor, Workers};

/// What every request handler needs.
pub struct App {
    pub rpc: crate::rpc::Rpc,
    pub upstream: Arc<Upstream>,
    pub metrics: Metrics,
    pub limits: Limits,
    /// `/proxy/health`'s client of the main listener.
    pub own_health: crate::health::OwnHealth,
    /// `--enable-pprof`: `/debug/pprof/` is served on the main port.
    pub pprof: bool,
    /// `--experimental-enable-grpc-logging`: each call is logged when it ends.
    pub grpc_logging: bool,
    /// etcd's JSON gateway on the main port.
    pub gateway: crate::gateway::Gateway,
    /// The workers client connections are handed to (`/debug/pprof/tasks` counts their tasks too).
    pub workers: Workers,
}

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routes {
    /// The main port: gRPC and the admin routes.
    All,
    /// `--metrics-addr`: the admin routes only, as etcd's metrics listener.
    AdminOnly,
}

/// One listener: what it serves, and the TLS its connections go through first (`None`: plaintext).
pub struct Port {
    pub listener: Box<dyn Listener>,
    pub tls: Option<Arc<ServerTls>>,
    pub routes: Routes,
}

/// Accepts connections until `shutdown` turns true, then lets each connection finish its calls (streams are ended
/// by the upstream relay) for up to `config.shutdown_grace` before closing it.
pub async fn serve(
    port: Port,
    app: Arc<App>,
    config: &Config,
    mut shutdown: watch::Receiver<bool>,
) {
    let Port {
        mut listener,
        tls,
        routes,
    } = port;
    let workers = app.workers.clone();
    // One connection builder per worker: hyper spawns each call's task with the builder's executor.
    let builders: Vec<_> = (0..workers.len())
        .map(|worker| {
            let mut builder = auto::Builder::new(workers.executor(worker));
            builder
                .http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(config.max_concurrent_streams)
                .keep_alive_interval(config.client_keepalive.interval)
                .keep_alive_timeout(config.client_keepalive.timeout);
            builder
        })
        .collect();
    let grace = config.shutdown_grace;
    let setup_timeout = config.client_setup_timeout;
    // etcd's metrics listener is Go's plain HTTP server, which does not police pings.
    let ping_min_time = (routes == Routes::All).then_some(config.client_ping_min_time);
    let mut connections = JoinSet::new();
    let connection_shutdown = shutdown.clone();
    // Logged once each time the limit starts refusing, not per connection.
    let mut refusing = false;
    loop {
        // Every select! in the proxy polls in a fixed order: tokio draws the order from an unseeded RNG, which
        // would make a seeded simulation differ from run to run when two branches are ready at once. Finished
        // connections are reaped before new ones are taken (they are finitely many: nothing starves).
        tokio::select! {
            biased;
            _ = shutting_down(&mut shutdown) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((conn, peer)) => {
                    let Some(slot) = app.limits.connection() else {
                        if !std::mem::replace(&mut refusing, true) {
                            tracing::warn!(%peer, "--max-client-connections are open: closing new connections until one ends");
                        }
                        drop(conn);
                        continue;
                    };
                    refusing = false;
                    let worker = workers.next();
                    tracing::debug!(%peer, worker, "client connected");
                    let serving = Serving {
                        setup_deadline: Instant::now() + setup_timeout,
                        slot,
                        builder: builders[worker].clone(),
                        app: app.clone(),
                        tls: tls.clone(),
                        routes,
                        ping_min_time,
                        shutdown: connection_shutdown.clone(),
                        grace,
                    };
                    workers.spawn_into(&mut connections, worker, serving.connection(conn, peer));
                }
                Err(err) => {
                    // Running out of file descriptors and the like: keep serving the connections we have.
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// What one connection is served with.
struct Serving {
    /// By when the TLS handshake and the HTTP/2 preface or HTTP/1.1 request head must be through.
    setup_deadline: Instant,
    /// Held for as long as the connection lasts.
    slot: limits::ConnectionSlot,
    builder: auto::Builder<WorkerExecutor>,
    app: Arc<App>,
    tls: Option<Arc<ServerTls>>,
    routes: Routes,
    /// `None`: pings are not policed.
    ping_min_time: Option<Duration>,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
}

impl Serving {
    async fn connection(mut self, accepted: crate::net::Accepted, peer: std::net::SocketAddr) {
        // Opened here, on the worker that serves it, so that its reads and writes are polled by that worker.
        let conn = match accepted.open() {
            Ok(conn) => conn,
            Err(err) => {
                tracing::debug!(%peer, %err, "cannot take over an accepted connection");
                return;
            }
        };
        let conn = match &self.tls {
            // A handshake still running at shutdown is dropped: it has no calls to finish.
            Some(tls) => tokio::select! {
                biased;
                accepted = tokio::time::timeout_at(self.setup_deadline, tls.accept(conn)) => match accepted {
                    Ok(Ok(conn)) => conn,
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, %err, "TLS handshake with a client failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake not finished within --client-setup-timeout");
                        return;
                    }
                },
                _ = shutting_down(&mut self.shutdown) => return,
            },
            None => conn,
        };
        let (app, routes) = (self.app, self.routes);
        // Boxed: hyper moves each call's future into a task of its own and the task moves it again, and the whole
        // call (upstream attempt and retries included) is a large future; moving a box is moving a pointer.
        // Profiles showed these copies as the largest single cost in the proxy's own code.
        let service = hyper::service::service_fn(move |request| {
            Box::pin(handle(app.clone(), routes, peer, request))
        });
        let _slot = self.slot;
        let conn = setup::SetupDeadline::new(conn, self.setup_deadline);
        let conn = ping_guard::PingGuard::new(conn, self.ping_min_time);
        let connection = self.builder.serve_connection(TokioIo::new(conn), service);
        tokio::pin!(connection);
        // A connection that has ended at shutdown needs no graceful end (which would send it a GOAWAY).
        tokio::select! {
            biased;
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%err, "client connection ended with an error");
                }
                return;
            }
            _ = shutting_down(&mut self.shutdown) => {}
        }
        connection.as_mut().graceful_shutdown();
        if tokio::time::timeout(self.grace, connection).await.is_err() {
            tracing::warn!(
                "closing a client connection that did not finish within the shutdown grace period"
            );
        }
    }
}

/// The most bytes of a body sent to an admin route that are read before it is answered.
const UNUSED_BODY_BOUND: usize = 64 * 1024;

/// Routes one request: gRPC by content type, admin routes by path.
async fn handle(
    app: Arc<App>,
    routes: Routes,
    peer: std::net::SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let is_grpc = routes == Routes::All
        && request
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| ct.as_bytes().starts_with(b"application/grpc"));
    if is_grpc {
        return Ok(grpc(&app, peer, request).await);
    }
    // etcd serves its gateway on its client port, not on its metrics listener.
    if routes == Routes::All && crate::gateway::Gateway::serves(request.uri().path()) {
        let call = |grpc_request| grpc(&app, peer, grpc_request);
        return Ok(app.gateway.serve(request, call).await);
    }
    let (request, body) = request.into_parts();
    // The admin routes read no body; one sent anyway is read (up to a bound) before the answer.
    crate::gateway::drain_unused(body, UNUSED_BODY_BOUND).await;
    // Only on the main port, as etcd's proxy serves them.
    if routes == Routes::All
        && app.pprof
        && request.uri.path().starts_with(crate::profiling::PREFIX)
    {
        return Ok(
            crate::profiling::serve(request.uri.path(), request.uri.query(), &app.workers).await,
        );
    }
    let get = request.method == http::Method::GET;
    let response = match request.uri.path() {
        "/health" if get => health(crate::health::check(&app.upstream, &app.metrics).await),
        "/proxy/health" if get => health(app.own_health.check(&app.metrics).await),
        "/metrics" if get => from_etcd(&app.upstream, "/metrics", &request.headers).await,
        // etcd's version, as its client port serves it (clients such as etcd3gw read it to choose their API path).
        "/version" if get && routes == Routes::All => {
            from_etcd(&app.upstream, "/version", &request.headers).await
        }
        "/proxy/metrics" if get => plain(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            app.metrics.render(),
        ),
        "/health" | "/proxy/health" | "/metrics" | "/proxy/metrics" => {
            let mut response = plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "Method Not Allowed\n".into(),
            );
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET"));
            response
        }
        // Go's `http.NotFound`, as etcd and its Go proxy answer.
        _ => plain(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n".into(),
        ),
    };
    Ok(response)
}

fn health(health: crate::health::Health) -> Response<Body> {
    plain(
        StatusCode::from_u16(health.http_status()).unwrap_or(StatusCode::OK),
        "application/json",
        health.json(),
    )
}

/// `GET path` relayed from the active member (or, when it cannot answer, from the next one that does): `/metrics`,
/// etcd's own metrics, as etcd's Go proxy relays them (the proxy's are on `/proxy/metrics`), and `/version`.
async fn from_etcd(upstream: &Upstream, path: &str, asked: &http::HeaderMap) -> Response<Body> {
    match upstream.http_get(path, asked).await {
        Ok(answer) => {
            let mut response = Response::new(Body::new(Full::new(answer.body)));
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            response
        }
        Err(failures) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("etcd-grpc-proxy: no etcd member answered GET {path} ({failures})\n"),
        ),
    }
}

fn plain(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from(body))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Serves one gRPC call (a client's, or one the gateway makes), counting it and translating tonic's size errors
/// into etcd's.
async fn grpc<B>(app: &App, peer: std::net::SocketAddr, mut request: Request<B>) -> Response<Body>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
{
    let path = request.uri().path().to_string();
    // With tracing on, the call's server span; its context replaces the client's `traceparent` for the upstream.
    let span = app
        .upstream
        .tracer()
        .and_then(|tracer| tracer.server_span(&path, request.headers_mut()));
    let labels = RpcLabels::from_path(&path);
    app.metrics
        .grpc_started
        .with_label_values(&labels.as_array())
        .inc();
    let started = Instant::now();
    let (mut response, call) = match app.limits.call() {
        Ok(call) => (app.rpc.serve(request).await, Some(call)),
        Err(refused) => (refused.into_http(), None),
    };
    rewrite_frame_error(response.headers_mut());
    let early_code = status_code(response.headers());
    let (parts, body) = response.into_parts();
    let mut metered = MeteredBody {
        inner: body,
        _call: call,
        record: Some(Record {
            log: app.grpc_logging.then(|| call_log::CallLog {
                peer,
                unary: labels.grpc_type == "unary",
            }),
            metrics: app.metrics.clone(),
            labels,
            started,
            span,
        }),
    };
    if let Some(code) = early_code {
        // Trailers-only response: the status is already known.
        metered.finish(code);
    }
    Response::from_parts(parts, Body::new(metered))
}

/// tonic reports an oversized or truncated request frame in its own words; etcd's are in [`crate::error::etcd_frame_error`].
fn rewrite_frame_error(headers: &mut http::HeaderMap) {
    let Some(code) = status_code(headers) else {
        return;
    };
    let Some(message) = headers.get("grpc-message").and_then(|m| m.to_str().ok()) else {
        return;
    };
    let message = percent_decode(message);
    if let Some(status) = crate::error::etcd_frame_error(code, &message) {
        headers.insert("grpc-status", HeaderValue::from(status.code() as i32));
        if let Ok(value) = HeaderValue::from_str(status.message()) {
            headers.insert("grpc-message", value);
        }
    }
}

fn status_code(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let raw = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(tonic::Code::from_i32(raw))
}

fn percent_decode(s: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(hi), Some(lo)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push(hi << 4 | lo);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

struct RpcLabels {
    grpc_type: &'static str,
    service: String,
    method: String,
}

impl RpcLabels {
    /// Only etcd's own methods get labels of their own: every other path shares `unknown`, so that a client
    /// calling made-up paths cannot grow `/metrics` (and the proxy's memory) without bound.
    fn from_path(path: &str) -> Self {
        let (service, method) = match path.trim_start_matches('/').split_once('/') {
            Some(pair) if crate::rpc::methods::route(path).is_some() => pair,
            _ => ("unknown", "unknown"),
        };
        Self {
            grpc_type: metrics::grpc_type(path),
            service: service.to_string(),
            method: method.to_string(),
        }
    }

    fn as_array(&self) -> [&str; 3] {
        [self.grpc_type, &self.service, &self.method]
    }
}

struct Record {
    /// `None` without `--experimental-enable-grpc-logging`.
    log: Option<call_log::CallLog>,
    metrics: Metrics,
    labels: RpcLabels,
    started: Instant,
    /// The call's server span, when tracing is on and it is recorded.
    span: Option<crate::otel::span::OpenSpan>,
}

/// A response body that records the call's status when it is known (trailers, or the end of a trailers-only
/// response), or `Canceled` if the client went away first.
struct MeteredBody {
    inner: Body,
    /// The call's place under `--max-client-calls`, released with the body.
    _call: Option<tokio::sync::OwnedSemaphorePermit>,
    record: Option<Record>,
}

impl MeteredBody {
    fn finish(&mut self, code: tonic::Code) {
        if let Some(record) = self.record.take() {
            let [grpc_type, service, method] = record.labels.as_array();
            record
                .metrics
                .grpc_handled
                .with_label_values(&[grpc_type, service, method, metrics::code_label(code)])
                .inc();
            let elapsed = record.started.elapsed();
            record
                .metrics
                .grpc_handling_seconds
                .with_label_values(&[grpc_type, service, method])
                .observe(elapsed.as_secs_f64());
            if let Some(log) = &record.log {
                log.finished(service, method, code, elapsed);
            }
            if let Some(span) = record.span {
                span.end(code);
            }
        }
    }
}

impl HttpBody for MeteredBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_code) {
                    self.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.finish(tonic::Code::Internal),
            Poll::Ready(None) => self.finish(tonic::Code::Ok),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encoded_messages_are_decoded() {
        assert_eq!(percent_decode("a%20b%3A"), "a b:");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn oversized_request_errors_are_reported_as_etcd_does() {
        let mut headers = http::HeaderMap::new();
        headers.insert("grpc-status", HeaderValue::from(11));
        headers.insert(
            "grpc-message",
            HeaderValue::from_static(
                "Error,%20decoded%20message%20length%20too%20large:%20found%202048%20bytes,%20the%20limit%20is:%201024%20bytes",
            ),
        );
        rewrite_frame_error(&mut headers);
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(
            headers["grpc-message"],
            "grpc: received message larger than max (2048 vs. 1024)"
        );
    }
}
