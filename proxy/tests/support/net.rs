//! Loopback sockets only these tests need: a port held busy, and whether a port accepts connections. (Free ports
//! and HTTP GET come from `testkit`.)
//!
//! The workspace's clippy.toml bans std/tokio sockets outside `proxy/src/net` so that the proxy itself only
//! reaches the network through its simulation seam. These tests are real processes on real sockets, not
//! simulated code, so the ban is lifted here, and only here.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

/// A port that stays bound (and so busy) for as long as this value lives.
pub struct BusyPort {
    listener: std::net::TcpListener,
}

impl BusyPort {
    pub fn bind() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        Self { listener }
    }

    pub fn addr(&self) -> String {
        self.listener.local_addr().expect("local_addr").to_string()
    }
}

/// Whether something accepts TCP connections at `addr` right now.
pub async fn is_listening(addr: &str) -> bool {
    tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// A plain HTTP/2 connection to `addr` (handshake done, driven by a task of its own), for requests made by hand.
pub async fn http2<B>(addr: &str) -> hyper::client::conn::http2::SendRequest<B>
where
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    sender
}

/// A `/proc/PID/status` figure in KiB (`VmRSS`, `VmHWM`, ...).
pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace()
        .nth(1)
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {line:?}"))
}

/// Opens a TCP connection to `addr`, sends nothing, and waits up to `limit` for the server to close it. Whether it
/// did.
pub async fn silent_connection_closed_within(addr: &str, limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    let mut buf = [0u8; 64];
    let closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, closed).await.is_ok()
}
