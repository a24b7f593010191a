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
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Conn, SocketAddr)>>;
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

/// A tower `Service<Uri>` that dials through a [`Net`], for tonic's `connect_with_connector_lazy`.
#[derive(Clone)]
pub struct Connector {
    net: Arc<dyn Net>,
}

impl Connector {
    pub fn new(net: Arc<dyn Net>) -> Self {
        Self { net }
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
        Box::pin(async move {
            let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
            match net.connect(authority.clone()).await {
                Ok(conn) => Ok(TokioIo::new(conn)),
                Err(source) => Err(ConnectFailed { authority, source }),
            }
        })
    }
}
