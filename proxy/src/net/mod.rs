//! The `Net` seam: the only way the proxy touches sockets.
//!
//! Production uses [`TokioNet`]; the simulation supplies a turmoil-backed implementation. Everything above this
//! module sees connections as boxed byte streams, so the same server and upstream code runs in both worlds.

mod tokio_net;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

pub use tokio_net::TokioNet;

/// A boxed future, as returned by the object-safe `Net` methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A bidirectional byte stream: a TCP connection in production, a simulated one in tests.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// A connection as the rest of the proxy sees it.
pub type Conn = Box<dyn Io>;

/// A bound listening socket: a stream of accepted connections.
pub trait Listener: Send + 'static {
    /// The address actually bound (useful when the port was 0).
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// Waits for the next connection and returns it with the peer's address.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Accepted, SocketAddr)>>;
}

/// An accepted connection, not yet tied to a runtime: [`Accepted::open`] ties it to the runtime it is called on.
/// The proxy accepts on one runtime and serves each connection on a worker's ([`crate::workers`]); a socket
/// registered where it was accepted would have its readiness polled there, waking the worker from another thread
/// on every read and write, and waiting while that runtime is busy.
pub struct Accepted(Box<dyn FnOnce() -> io::Result<Conn> + Send>);

impl Accepted {
    /// A connection tied to no runtime's reactor (a simulated one): opening it gives it as it is.
    pub fn ready(conn: Conn) -> Self {
        Self(Box::new(move || Ok(conn)))
    }

    /// A connection opened by `open` on the runtime that serves it.
    pub fn deferred(open: impl FnOnce() -> io::Result<Conn> + Send + 'static) -> Self {
        Self(Box::new(open))
    }

    /// The connection, tied to the runtime this is called on (call it from the task that serves it).
    pub fn open(self) -> io::Result<Conn> {
        (self.0)()
    }
}

/// The network the proxy runs on.
pub trait Net: Send + Sync + 'static {
    /// Binds a listener on `addr`.
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>>;
    /// Opens a connection to `authority` (`host:port`), resolving the host itself.
    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>>;
}

/// Why a connection attempt failed. Kept as a distinct type so that the upstream can tell, from a failed call's
/// error chain, that the request provably never left the proxy (and may therefore be retried even if it is a write).
#[derive(Debug, thiserror::Error)]
#[error("connect to {authority}: {source}")]
pub struct ConnectFailed {
    pub authority: String,
    #[source]
    pub source: io::Error,
}

/// A handshake run on every new outbound connection before it is used: TLS towards etcd (`crate::tls::ClientTls`).
/// Defined here, below TLS, so that the seam does not depend on what runs above it.
pub trait Handshake: Send + Sync + 'static {
    /// Runs the handshake on `conn`, a fresh connection to `authority` (`host:port`).
    fn handshake<'a>(&'a self, conn: Conn, authority: &'a str) -> BoxFuture<'a, io::Result<Conn>>;
}

/// A tower `Service<Uri>` that dials through a [`Net`] (and runs a [`Handshake`] on what it gives, when TLS
/// towards etcd is on), for tonic's `connect_with_connector_lazy`.
#[derive(Clone)]
pub struct Connector {
    net: Arc<dyn Net>,
    tls: Option<Arc<dyn Handshake>>,
}

impl Connector {
    /// Plaintext connections.
    pub fn new(net: Arc<dyn Net>) -> Self {
        Self { net, tls: None }
    }

    /// Connections with the handshake `tls` runs, or plaintext for `None`.
    pub fn with_tls<H: Handshake>(net: Arc<dyn Net>, tls: Option<Arc<H>>) -> Self {
        Self {
            net,
            tls: tls.map(|h| h as Arc<dyn Handshake>),
        }
    }
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<Conn>;
    type Error = ConnectFailed;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let net = self.net.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
            // Nothing of a call is sent before the handshake ends: a failed handshake is a failed connect.
            let connected = async {
                let conn = net.connect(authority.clone()).await?;
                match &tls {
                    Some(tls) => tls.handshake(conn, &authority).await,
                    None => Ok(conn),
                }
            };
            match connected.await {
                Ok(conn) => Ok(TokioIo::new(conn)),
                Err(source) => Err(ConnectFailed { authority, source }),
            }
        })
    }
}
