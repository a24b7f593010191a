//! [`TurmoilNet`]: the proxy's `Net` seam over turmoil's simulated TCP, so the production proxy, the model members
//! and the clients all talk through one simulated network that faults can cut, delay and hold.
//!
//! A host that can crash (a member, the proxy) tracks its connections in [`HostSockets`], so that a crash closes
//! them in one order every run. Why: turmoil crashes a host by dropping its runtime, and tokio drops the tasks of a
//! runtime shard by shard, a task's shard being its ID modulo the shard count. Task IDs come from one counter for
//! the whole process, so the order in which a crash dropped the host's sockets, and so the order of their FIN and
//! RST segments (each drawing its latency from turmoil's random generator), depended on how many tasks the process
//! had spawned before, in earlier runs and in other test threads: one seed gave two runs (the `cache` scenario's
//! seed 0 differed between the first and the second run in one process). The world asks the host to close its
//! connections first ([`HostSockets::close_all`], oldest first, from inside the host), and crashes it a step later.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use proxy::net::{Accepted, BoxFuture, Conn, Listener, Net};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Simulated TCP. Must be used from inside a turmoil host or client; host names resolve through turmoil's DNS.
/// With [`HostSockets`] ([`TurmoilNet::tracking`]), the connections it makes and accepts are tracked there.
#[derive(Clone, Debug, Default)]
pub struct TurmoilNet {
    sockets: Option<HostSockets>,
}

impl TurmoilNet {
    /// A `Net` whose connections `sockets` tracks (for a host the world may crash).
    pub fn tracking(sockets: HostSockets) -> Self {
        Self {
            sockets: Some(sockets),
        }
    }

    fn conn(&self, stream: turmoil::net::TcpStream) -> io::Result<Conn> {
        match &self.sockets {
            Some(sockets) => sockets.track(stream),
            None => Ok(Box::new(stream)),
        }
    }
}

struct TurmoilListener {
    listener: turmoil::net::TcpListener,
    net: TurmoilNet,
}

impl Listener for TurmoilListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Accepted, SocketAddr)>> {
        Box::pin(async move {
            let (stream, peer) = self.listener.accept().await?;
            Ok((Accepted::ready(self.net.conn(stream)?), peer))
        })
    }
}

impl Net for TurmoilNet {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = turmoil::net::TcpListener::bind(addr).await?;
            Ok(Box::new(TurmoilListener {
                listener,
                net: self.clone(),
            }) as Box<dyn Listener>)
        })
    }

    fn connect(&self, authority: String) -> BoxFuture<'static, io::Result<Conn>> {
        let net = self.clone();
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority.as_str()).await?;
            net.conn(stream)
        })
    }
}

/// A tracked connection's stream: `None` once [`HostSockets::close_all`] closed it.
type Shared = Arc<Mutex<Option<turmoil::net::TcpStream>>>;

/// The connections one host has open, oldest first, and its request to close them.
#[derive(Clone, Debug, Default)]
pub struct HostSockets {
    state: Arc<Mutex<SocketsState>>,
    close_requested: Arc<Notify>,
}

#[derive(Debug, Default)]
struct SocketsState {
    next: u64,
    open: BTreeMap<u64, Weak<Mutex<Option<turmoil::net::TcpStream>>>>,
    /// Closing for a crash: no connection is opened or accepted until the host starts again.
    closing: bool,
}

impl HostSockets {
    fn state(&self) -> std::sync::MutexGuard<'_, SocketsState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn track(&self, stream: turmoil::net::TcpStream) -> io::Result<Conn> {
        let mut state = self.state();
        if state.closing {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the host is crashing",
            ));
        }
        let shared: Shared = Arc::new(Mutex::new(Some(stream)));
        let id = state.next;
        state.next += 1;
        state.open.retain(|_, conn| conn.strong_count() > 0);
        state.open.insert(id, Arc::downgrade(&shared));
        Ok(Box::new(TrackedConn(shared)))
    }

    /// Asks the host to close its connections (the world crashes it a step later).
    pub fn request_close(&self) {
        self.state().closing = true;
        self.close_requested.notify_waiters();
    }

    /// Runs inside the host for as long as its software runs: when a close is requested, closes every connection,
    /// oldest first. Call at the start of each incarnation (it also lets connections be made again).
    pub async fn close_when_asked(self) {
        self.state().closing = false;
        loop {
            let requested = self.close_requested.notified();
            tokio::pin!(requested);
            requested.as_mut().enable();
            if self.state().closing {
                self.close_all();
            }
            requested.await;
        }
    }

    /// Closes every open connection, oldest first (their FIN or RST goes out in that order).
    fn close_all(&self) {
        let open = std::mem::take(&mut self.state().open);
        for conn in open.into_values().filter_map(|conn| conn.upgrade()) {
            let stream = conn.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(stream);
        }
    }
}

/// A connection of a tracked host; reads and writes fail once the host closed it for a crash.
struct TrackedConn(Shared);

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "closed for a crash")
}

impl TrackedConn {
    fn with<T>(
        &self,
        f: impl FnOnce(Pin<&mut turmoil::net::TcpStream>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let mut stream = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match stream.as_mut() {
            Some(stream) => f(Pin::new(stream)),
            None => Poll::Ready(Err(closed())),
        }
    }
}

impl AsyncRead for TrackedConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.with(|stream| stream.poll_read(cx, buf))
    }
}

impl AsyncWrite for TrackedConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.with(|stream| stream.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|stream| stream.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|stream| stream.poll_shutdown(cx))
    }
}
