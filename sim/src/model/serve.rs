//! Serving one member: the model's tonic services on a listener from any `Net` (turmoil in the simulation, real
//! TCP for the conformance suite), in plaintext or over TLS, plus the task that expires leases on time.
//!
//! Connections are served here with hyper's HTTP/2 server (as tonic's `Server` does, with its settings) rather than
//! by tonic's `Server`, so that a hung member ([`Cluster::hang`]) can be stopped as a process is: the accept loop
//! goes on (the kernel completes TCP handshakes), while every connection, its TLS handshake included, runs inside
//! [`WhileRunning`] and hyper's keep-alive timers run on the member's [`ProcessTimer`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proto::etcdserverpb::auth_server::AuthServer;
use proto::etcdserverpb::cluster_server::ClusterServer;
use proto::etcdserverpb::kv_server::KvServer;
use proto::etcdserverpb::lease_server::LeaseServer;
use proto::etcdserverpb::maintenance_server::MaintenanceServer;
use proto::etcdserverpb::watch_server::WatchServer;
use proxy::net::{Conn, Listener};
use proxy::tls::ServerTls;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::service::Routes;
use tower::ServiceExt;

use super::auth_service::AuthService;
use super::cluster::{Cluster, ConnectedAt, stopped};
use super::cluster_service::{ClusterService, MaintenanceService};
use super::kv_service::KvService;
use super::lease_service::LeaseService;
use super::process::{ProcessTimer, WhileRunning};
use super::watch_service::WatchService;

/// How often the expiry task looks at the leases when none is due sooner.
const EXPIRY_IDLE_POLL: Duration = Duration::from_millis(500);

/// How long HTTP/2 waits for a keep-alive ping's acknowledgement when [`ServeOptions::keepalive`] does not say
/// (hyper's and etcd's default).
const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How a member serves, beyond etcd's defaults.
#[derive(Clone, Default)]
pub struct ServeOptions {
    /// HTTP/2 keep-alive pings to clients: `(interval, timeout)`, etcd's `--grpc-keepalive-interval` and
    /// `--grpc-keepalive-timeout` (etcd pings after two idle hours; `None` here sends no pings). A connection whose
    /// client stops answering is closed, ending its streams and their watchers.
    pub keepalive: Option<(Duration, Duration)>,
    /// Serve TLS: every accepted connection goes through this handshake first (etcd's `--cert-file`,
    /// `--key-file`, and with a trusted CA `--client-cert-auth`); one that fails it is closed. `None`: plaintext.
    pub tls: Option<Arc<ServerTls>>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("keepalive", &self.keepalive)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Serves member `member` of `cluster` on `listener` until `shutdown` completes; then ends every Watch and
/// keep-alive stream, closes every connection gracefully (a hung member does so once resumed, as a stopped process
/// handles its SIGTERM after SIGCONT) and stops. Services the model does not implement (Election, Lock)
/// answer Unimplemented. Never fails; the error type is what tonic's `Server` returned, which callers expect.
pub async fn serve(
    cluster: Cluster,
    member: usize,
    listener: Box<dyn Listener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    serve_with(cluster, member, listener, shutdown, ServeOptions::default()).await
}

/// [`serve`] with options.
pub async fn serve_with(
    cluster: Cluster,
    member: usize,
    mut listener: Box<dyn Listener>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let serving = Serving {
        routes: routes(&cluster, member, &stop_rx),
        http2: http2_builder(&cluster, member, options.keepalive),
        tls: options.tls,
        stop: stop_rx,
    };
    let mut connections = JoinSet::new();
    let expiry = expire_leases(cluster.clone());
    tokio::pin!(expiry);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            // Fixed order, for reproducible runs (turmoil seeds select!'s RNG only under tokio_unstable). Ended
            // connections are reaped before new ones are taken.
            biased;
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut expiry => {}
            // The kernel's part: a hung member still accepts.
            accepted = listener.accept() => match accepted {
                Ok((accepted, _peer)) => match accepted.open() {
                    Ok(conn) => {
                        // Accepted now, by the kernel, even if the process reads the connection only on resume.
                        let connected_at = ConnectedAt(cluster.now());
                        let connection = serving.clone().connection(conn, connected_at);
                        connections.spawn(WhileRunning::new(&cluster, member, connection));
                    }
                    Err(err) => tracing::debug!(%err, "model etcd: cannot take over a connection"),
                },
                Err(err) => {
                    // A simulated network refuses nothing at the listener; a real one recovers from transient
                    // errors (too many open files).
                    tracing::debug!(%err, "model etcd: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// The member's gRPC services; an unknown method answers Unimplemented.
fn routes(cluster: &Cluster, member: usize, stop: &watch::Receiver<bool>) -> Routes {
    Routes::new(KvServer::new(KvService {
        cluster: cluster.clone(),
        member,
    }))
    .add_service(WatchServer::new(WatchService {
        cluster: cluster.clone(),
        member,
        stop: stop.clone(),
    }))
    .add_service(LeaseServer::new(LeaseService {
        cluster: cluster.clone(),
        member,
        stop: stop.clone(),
    }))
    .add_service(ClusterServer::new(ClusterService {
        cluster: cluster.clone(),
        member,
    }))
    .add_service(MaintenanceServer::new(MaintenanceService {
        cluster: cluster.clone(),
        member,
    }))
    .add_service(AuthServer::new(AuthService {
        cluster: cluster.clone(),
        member,
    }))
    .prepare()
}

/// HTTP/2 as tonic's `Server` configures it by default (no stream limit, as etcd's `math.MaxUint32`), with the
/// member's keep-alive on the member's own clock.
fn http2_builder(
    cluster: &Cluster,
    member: usize,
    keepalive: Option<(Duration, Duration)>,
) -> http2::Builder<TokioExecutor> {
    let (interval, timeout) = keepalive.unzip();
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(ProcessTimer::new(cluster.clone(), member))
        .max_concurrent_streams(None)
        .max_local_error_reset_streams(None)
        .keep_alive_interval(interval)
        .keep_alive_timeout(timeout.unwrap_or(DEFAULT_KEEPALIVE_TIMEOUT));
    builder
}

/// What every connection of a member is served with.
#[derive(Clone)]
struct Serving {
    routes: Routes,
    http2: http2::Builder<TokioExecutor>,
    tls: Option<Arc<ServerTls>>,
    /// Turns true when the member shuts down.
    stop: watch::Receiver<bool>,
}

impl Serving {
    /// Serves one connection, accepted at `connected_at`, until it ends, or ends it gracefully when the member
    /// shuts down.
    async fn connection(mut self, conn: Conn, connected_at: ConnectedAt) {
        let conn = match &self.tls {
            // A handshake still running at shutdown has no calls to finish.
            Some(tls) => tokio::select! {
                biased;
                handshake = tls.accept(conn) => match handshake {
                    Ok(conn) => conn,
                    Err(err) => {
                        tracing::debug!(%err, "model etcd: TLS handshake failed");
                        return;
                    }
                },
                () = stopped(&mut self.stop) => return,
            },
            None => conn,
        };
        let routes = self.routes;
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(connected_at);
            routes.clone().oneshot(request)
        });
        let connection = self.http2.serve_connection(TokioIo::new(conn), service);
        tokio::pin!(connection);
        tokio::select! {
            biased;
            result = connection.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%err, "model etcd: connection ended with an error");
                }
                return;
            }
            () = stopped(&mut self.stop) => {}
        }
        connection.as_mut().graceful_shutdown();
        let _ = connection.await;
    }
}

/// Ends due leases at their deadline (each member runs one; the store makes it idempotent).
async fn expire_leases(cluster: Cluster) {
    loop {
        let now = cluster.now();
        let next = cluster.with_store(|store, _| store.next_expiry());
        let pause = match next {
            Some(deadline) if deadline > now => (deadline - now).min(EXPIRY_IDLE_POLL),
            Some(_) => Duration::ZERO,
            None => EXPIRY_IDLE_POLL,
        };
        tokio::time::sleep(pause).await;
        cluster.with_store(|_, _| ());
    }
}
