//! etcd's JSON gateway by hand: a unary `POST /v3/...` over HTTP/1.1, and streams (`/v3/watch`) over HTTP/2,
//! many on one connection, read line by line.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;

/// How long one answer (or one line of a stream) may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// `POST path` with a JSON body (and the token in `Authorization`, if any) over a new HTTP/1.1 connection: the
/// answer's status and JSON (a body that is not JSON as a JSON string).
pub async fn post(addr: &str, path: &str, body: &Value, token: Option<&str>) -> (u16, Value) {
    post_raw(addr, path, body.to_string(), token).await
}

/// [`post`] with a body of any bytes.
pub async fn post_raw(
    addr: &str,
    path: &str,
    body: impl Into<Bytes>,
    token: Option<&str>,
) -> (u16, Value) {
    let stream = super::net::connect(addr).await;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
    tokio::spawn(connection);
    let mut request = http::Request::post(path)
        .header(http::header::HOST, addr)
        .body(Full::new(body.into()))
        .expect("a request");
    if let Some(token) = token {
        request.headers_mut().insert(
            http::header::AUTHORIZATION,
            token.parse().expect("a header value"),
        );
    }
    let answer = tokio::time::timeout(DEADLINE, async {
        let response = sender.send_request(request).await.expect("an answer");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.expect("a body");
        (status, body.to_bytes())
    })
    .await
    .unwrap_or_else(|_| panic!("no answer to POST {path} within {DEADLINE:?}"));
    // etcd 3.4 and 3.5.1 answer a wrong method or an unknown path in plain text.
    let json = serde_json::from_slice(&answer.1)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&answer.1).into_owned()));
    (answer.0, json)
}

/// One streaming gateway call: the JSON objects of its answer, one per line.
pub struct JsonLines {
    body: Incoming,
    buffer: Vec<u8>,
}

impl JsonLines {
    /// Opens `path` on an HTTP/2 connection with `body` as the whole request body; panics unless it answers 200.
    pub async fn open(
        sender: &mut hyper::client::conn::http2::SendRequest<Full<Bytes>>,
        path: &str,
        body: &Value,
    ) -> Self {
        let request = http::Request::post(format!("http://gateway{path}"))
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("a request");
        let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
            .await
            .unwrap_or_else(|_| panic!("no answer to POST {path} within {DEADLINE:?}"))
            .expect("an answer");
        assert_eq!(response.status(), 200, "POST {path}");
        JsonLines {
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    /// The next object of the answer; panics if none comes within [`DEADLINE`].
    pub async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap_or_else(|e| {
                    panic!(
                        "not a JSON line ({e}): {:?}",
                        String::from_utf8_lossy(&line)
                    )
                });
            }
            let frame = tokio::time::timeout(DEADLINE, self.body.frame())
                .await
                .unwrap_or_else(|_| panic!("no line within {DEADLINE:?}"))
                .unwrap_or_else(|| {
                    panic!(
                        "the stream ended; left: {:?}",
                        String::from_utf8_lossy(&self.buffer)
                    )
                })
                .expect("a frame");
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }
}

impl JsonLines {
    /// What the answer holds after its last line, read until it ends (etcd's gateway ends a failed stream with an
    /// error object and no newline), as JSON; panics if it does not end within [`DEADLINE`].
    pub async fn last(mut self) -> Value {
        while let Some(frame) = tokio::time::timeout(DEADLINE, self.body.frame())
            .await
            .unwrap_or_else(|_| panic!("the stream did not end within {DEADLINE:?}"))
        {
            if let Ok(data) = frame.expect("a frame").into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
        serde_json::from_slice(&self.buffer).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.buffer)
            )
        })
    }
}

/// Base64 of a key or value, as the gateway's JSON carries bytes.
pub fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
