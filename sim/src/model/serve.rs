//! Serving one member: the model's tonic services on a listener from any `Net` (turmoil in the simulation, real
//! TCP for the conformance suite), in plaintext or over TLS, plus the task that expires leases on time.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use proto::etcdserverpb::cluster_server::ClusterServer;
use proto::etcdserverpb::kv_server::KvServer;
use proto::etcdserverpb::lease_server::LeaseServer;
use proto::etcdserverpb::maintenance_server::MaintenanceServer;
use proto::etcdserverpb::watch_server::WatchServer;
use proxy::net::{BoxFuture, Conn, Listener};
use proxy::tls::ServerTls;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tonic::transport::server::Connected;

use super::cluster::Cluster;
use super::cluster_service::{ClusterService, MaintenanceService};
use super::kv_service::KvService;
use super::lease_service::LeaseService;
use super::watch_service::WatchService;

/// How often the expiry task looks at the leases when none is due sooner.
const EXPIRY_IDLE_POLL: Duration = Duration::from_millis(500);

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
/// keep-alive stream and stops. Services the model does not implement (Auth, Election, Lock) answer Unimplemented.
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
    listener: Box<dyn Listener>,
    shutdown: impl Future<Output = ()>,
    options: ServeOptions,
) -> Result<(), tonic::transport::Error> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let signal = {
        let mut stop = stop_rx.clone();
        async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        }
    };
    let (keepalive_interval, keepalive_timeout) = options.keepalive.unzip();
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(keepalive_interval)
        .http2_keepalive_timeout(keepalive_timeout)
        .add_service(KvServer::new(KvService {
            cluster: cluster.clone(),
            member,
        }))
        .add_service(WatchServer::new(WatchService {
            cluster: cluster.clone(),
            member,
            stop: stop_rx.clone(),
        }))
        .add_service(LeaseServer::new(LeaseService {
            cluster: cluster.clone(),
            member,
            stop: stop_rx.clone(),
        }))
        .add_service(ClusterServer::new(ClusterService {
            cluster: cluster.clone(),
            member,
        }))
        .add_service(MaintenanceServer::new(MaintenanceService {
            cluster: cluster.clone(),
            member,
        }))
        .serve_with_incoming_shutdown(incoming(listener, options.tls), signal);
    tokio::pin!(server);
    let expiry = expire_leases(cluster);
    tokio::pin!(expiry);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            // Fixed order, for reproducible runs (turmoil seeds select!'s RNG only under tokio_unstable).
            biased;
            result = &mut server => return result,
            () = &mut expiry => {}
            () = &mut shutdown => {
                let _ = stop_tx.send(true);
                return server.await;
            }
        }
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

/// The accepted connections as the stream tonic wants. A failed accept is retried: a simulated network refuses
/// nothing at the listener, and a real one recovers from transient errors (too many open files). With `tls`, a
/// connection is yielded once its handshake completes; handshakes run side by side, so one stalled client (its link
/// cut mid-handshake) delays nobody else, and one that fails or times out is dropped.
fn incoming(
    listener: Box<dyn Listener>,
    tls: Option<Arc<ServerTls>>,
) -> impl futures::Stream<Item = Result<Accepted, io::Error>> {
    let handshakes: FuturesUnordered<BoxFuture<'static, io::Result<Conn>>> =
        FuturesUnordered::new();
    futures::stream::unfold(
        (listener, tls, handshakes),
        |(mut listener, tls, mut handshakes)| async move {
            loop {
                tokio::select! {
                    // Fixed order, for reproducible runs.
                    biased;
                    Some(done) = handshakes.next(), if !handshakes.is_empty() => match done {
                        Ok(conn) => return Some((Ok(Accepted(conn)), (listener, tls, handshakes))),
                        Err(err) => tracing::debug!(%err, "model etcd: TLS handshake failed"),
                    },
                    accepted = listener.accept() => match accepted {
                        Ok((conn, _peer)) => match &tls {
                            None => return Some((Ok(Accepted(conn)), (listener, tls, handshakes))),
                            Some(tls) => {
                                let tls = tls.clone();
                                handshakes.push(Box::pin(async move { tls.accept(conn).await }));
                            }
                        },
                        Err(err) => {
                            tracing::debug!(%err, "model etcd: accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    },
                }
            }
        },
    )
}

/// An accepted connection, with the `Connected` tonic requires.
pub struct Accepted(Conn);

impl Connected for Accepted {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
