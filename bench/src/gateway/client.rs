//! etcd's JSON gateway as its clients speak it: unary `POST /v3/...` calls on one HTTP/1.1 keep-alive connection
//! ([`Http1`]), and streamed answers (`/v3/watch`) on HTTP/2 connections with prior knowledge, read one JSON
//! object per line ([`JsonLines`]). Bytes travel as base64 ([`b64`]).
// The benchmark is a client of real sockets; the proxy's `Net` seam is the proxy's, not its load generator's.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpStream;

/// How long a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Base64 of bytes, as the gateway's JSON carries keys and values.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bytes of a base64 string of the gateway's JSON.
pub fn unb64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("not base64 ({e}): {text:?}"))
}

async fn connect(addr: &str) -> Result<TokioIo<TcpStream>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connect to {addr}: no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    // Small requests and answers, one at a time: without this each waits out Nagle's delay.
    stream
        .set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY on {addr}: {e}"))?;
    Ok(TokioIo::new(stream))
}

/// One HTTP/1.1 keep-alive connection making unary gateway calls one after another.
pub struct Http1 {
    addr: String,
    sender: http1::SendRequest<Full<Bytes>>,
}

impl Http1 {
    pub async fn connect(addr: &str) -> Result<Self, String> {
        let (sender, connection) = http1::handshake(connect(addr).await?)
            .await
            .map_err(|e| format!("HTTP/1.1 handshake with {addr}: {e}"))?;
        tokio::spawn(connection);
        Ok(Self {
            addr: addr.to_string(),
            sender,
        })
    }

    /// `POST path` with `body`: the answer's status and body. An error when the connection failed.
    pub async fn post(&mut self, path: &str, body: Bytes) -> Result<(u16, Bytes), String> {
        let request = http::Request::post(path)
            .header(http::header::HOST, &self.addr)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| format!("a request for {path}: {e}"))?;
        self.sender
            .ready()
            .await
            .map_err(|e| format!("connection to {}: {e}", self.addr))?;
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("POST {path}: the body: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
}

/// An HTTP/2 connection with prior knowledge (no upgrade), its connection driven by a task of its own.
pub async fn http2(addr: &str) -> Result<http2::SendRequest<Full<Bytes>>, String> {
    let (sender, connection) = http2::handshake(TokioExecutor::new(), connect(addr).await?)
        .await
        .map_err(|e| format!("HTTP/2 handshake with {addr}: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

/// The JSON objects of one streamed answer, one per line.
pub struct JsonLines {
    body: Incoming,
    buffer: Vec<u8>,
}

impl JsonLines {
    /// Opens `path` with `body` as the whole request body; an error unless it answers 200.
    pub async fn open(
        sender: &mut http2::SendRequest<Full<Bytes>>,
        path: &str,
        body: &Value,
    ) -> Result<Self, String> {
        let request = http::Request::post(format!("http://gateway{path}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("a request for {path}: {e}"))?;
        sender
            .ready()
            .await
            .map_err(|e| format!("HTTP/2 connection: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        if response.status() != 200 {
            return Err(format!("POST {path}: HTTP {}", response.status()));
        }
        Ok(JsonLines {
            body: response.into_body(),
            buffer: Vec::new(),
        })
    }

    /// The next object of the answer; `None` when the answer ended cleanly.
    pub async fn next(&mut self) -> Result<Option<Value>, String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map(Some).map_err(|e| {
                    format!(
                        "not a JSON line ({e}): {:?}",
                        String::from_utf8_lossy(&line)
                    )
                });
            }
            match self.body.frame().await {
                None if self.buffer.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                None => {
                    return Err(format!(
                        "the answer ended inside a line: {:?}",
                        String::from_utf8_lossy(&self.buffer)
                    ));
                }
                Some(Err(e)) => return Err(format!("the answer broke: {e}")),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_refuses_what_is_not_base64() {
        assert_eq!(b64(b"hot"), "aG90");
        assert_eq!(unb64("aG90").as_deref(), Ok(&b"hot"[..]));
        assert!(unb64("not base64!").is_err());
    }
}
