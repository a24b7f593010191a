//! Loopback sockets for the harness: free ports, a port held busy, and a tiny HTTP/1.1 GET.
//!
//! The workspace's clippy.toml bans std/tokio sockets outside `proxy/src/net` so that the
//! proxy itself only reaches the network through its simulation seam. These tests are real
//! processes on real sockets, not simulated code, so the ban is lifted here, and only here.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use ports::free_port;

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

/// `GET path` over HTTP/1.1 on a fresh connection; returns the status code and the body
/// (chunked bodies are decoded). Errors are strings, for use as "last seen" in waits.
pub async fn http_get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let fut = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write to {addr}: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read from {addr}: {e}"))?;
        parse_response(&raw)
    };
    match tokio::time::timeout(Duration::from_secs(10), fut).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "GET http://{addr}{path}: no complete response within 10s"
        )),
    }
}

/// Parses a complete HTTP/1.1 response (as read until the server closed).
pub fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("incomplete HTTP response: {text:?}"))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size_line, rest) = body
            .split_once("\r\n")
            .ok_or_else(|| format!("bad chunked body near {body:?}"))?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| format!("bad chunk size {size_line:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = rest
            .get(..size)
            .ok_or_else(|| format!("truncated chunk of {size} bytes"))?;
        out.push_str(chunk);
        body = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
}
