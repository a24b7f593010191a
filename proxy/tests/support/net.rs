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
    closed_within(&mut connect(addr).await, limit).await
}

/// A TCP connection to `addr`, for bytes sent by hand.
pub async fn connect(addr: &str) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// Whether the server closes `stream` (end of stream or reset) within `limit`; what it sends meanwhile is read and
/// dropped.
pub async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 256];
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

/// One HTTP/2 frame as it was on the wire.
#[derive(Debug)]
pub struct RawFrame {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// An HTTP/2 client connection driven frame by frame, for what no client library sends on purpose (ping floods).
pub struct RawHttp2 {
    stream: tokio::net::TcpStream,
}

impl RawHttp2 {
    pub const HEADERS: u8 = 0x1;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;

    /// Connects and sends the client preface and an empty SETTINGS frame.
    pub async fn connect(addr: &str) -> Self {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        let mut conn = Self { stream };
        conn.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        conn.send(Self::SETTINGS, 0, 0, &[]).await;
        conn
    }

    async fn write(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(bytes).await.expect("write");
    }

    pub async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        frame.extend_from_slice(&[kind, flags]);
        frame.extend_from_slice(&stream.to_be_bytes());
        frame.extend_from_slice(payload);
        self.write(&frame).await;
    }

    pub async fn ping(&mut self, data: u64) {
        self.send(Self::PING, 0, 0, &data.to_be_bytes()).await;
    }

    /// Opens a gRPC call on `stream` (its request stays open): a HEADERS frame whose fields are HPACK literals.
    pub async fn open_call(&mut self, stream: u32, path: &str) {
        let mut block = Vec::new();
        for (name, value) in [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "proxy"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ] {
            // Literal without indexing, new name; both strings short enough for a one-byte length.
            block.push(0);
            for s in [name, value] {
                assert!(s.len() < 127);
                block.push(s.len() as u8);
                block.extend_from_slice(s.as_bytes());
            }
        }
        const END_HEADERS: u8 = 0x4;
        self.send(Self::HEADERS, END_HEADERS, stream, &block).await;
    }

    /// The next frame, or `None` when the server closed the connection.
    pub async fn next_frame(&mut self) -> Option<RawFrame> {
        use tokio::io::AsyncReadExt;
        let mut header = [0u8; 9];
        match self.stream.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) => panic!("read: {e}"),
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; len];
        self.stream
            .read_exact(&mut payload)
            .await
            .expect("frame payload");
        Some(RawFrame {
            kind: header[3],
            flags: header[4],
            stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
            payload,
        })
    }
}
