//! `GET` over HTTP/1.1 on a fresh loopback connection, in the clear or over TLS with a client certificate: enough
//! for `/health` and Prometheus `/metrics`.
//!
//! etcd and both proxies answer HTTP/1.1 on their client ports. A raw socket is simpler than an HTTP client crate.
//! Over TLS no ALPN protocol is offered: Go servers (etcd) that list only `h2` refuse a client offering just
//! `http/1.1`, and without ALPN every server here speaks HTTP/1.1.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pki::TlsPaths;

/// How long one GET may take before it counts as failed.
const GET_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` at `addr` (`127.0.0.1:PORT`); the status code and the body. Errors are strings, shown as
/// "last seen" when a wait times out.
pub async fn get(addr: &str, path: &str) -> Result<(u16, String), String> {
    get_with(addr, path, None).await
}

/// `GET path` at `addr` over TLS, trusting `tls.ca` and presenting `tls.cert` (the files are read for each call,
/// so a replaced certificate is used at once). The server must be valid for the host of `addr`.
pub async fn get_tls(addr: &str, path: &str, tls: &TlsPaths) -> Result<(u16, String), String> {
    get_with(addr, path, Some(tls)).await
}

/// [`get`] in the clear (`tls` is `None`) or [`get_tls`].
pub async fn get_with(
    addr: &str,
    path: &str,
    tls: Option<&TlsPaths>,
) -> Result<(u16, String), String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        match tls {
            None => request(stream, addr, path).await,
            Some(tls) => {
                let config = crate::pki::client_config(tls)?;
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| format!("server name {host:?}: {e}"))?;
                let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                    .connect(name, stream)
                    .await
                    .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
                request(stream, addr, path).await
            }
        }
    };
    tokio::time::timeout(GET_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "GET {scheme}://{addr}{path}: no answer within {GET_TIMEOUT:?}"
            ))
        })
}

async fn request(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    addr: &str,
    path: &str,
) -> Result<(u16, String), String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut raw = Vec::new();
    // A TLS peer that closes without close_notify still sent a whole response: keep what arrived.
    if let Err(e) = stream.read_to_end(&mut raw).await
        && (raw.is_empty() || e.kind() != std::io::ErrorKind::UnexpectedEof)
    {
        return Err(format!("read from {addr}: {e}"));
    }
    parse_response(&raw)
}

/// Splits a complete response (read until the server closed) into status and body, decoding a chunked body.
pub fn parse_response(raw: &[u8]) -> Result<(u16, String), String> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("incomplete HTTP response ({} bytes)", raw.len()))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let chunked = lines.any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut rest: &str) -> Result<String, String> {
    let mut out = String::new();
    loop {
        let (size_line, after) = rest
            .split_once("\r\n")
            .ok_or_else(|| "truncated chunked body".to_string())?;
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|e| format!("bad chunk size {size_line:?}: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        let chunk = after
            .get(..size)
            .ok_or_else(|| format!("chunk of {size} bytes is truncated"))?;
        out.push_str(chunk);
        rest = after[size..].strip_prefix("\r\n").unwrap_or(&after[size..]);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    #[test]
    fn plain_body_is_returned_with_its_status() {
        let raw = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno";
        assert_eq!(parse_response(raw), Ok((503, "no".to_string())));
    }

    #[test]
    fn chunked_body_is_reassembled() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(raw), Ok((200, "abcde".to_string())));
    }

    #[test]
    fn a_response_without_a_blank_line_is_incomplete() {
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3").is_err());
    }
}
