//! GETs on etcd's client port over HTTP, beside gRPC: etcd serves `/metrics` there, which the proxy relays as its
//! own `/metrics` (as etcd's Go proxy does). Over TLS the request goes over HTTP/2 (the proxy offers only `h2` to
//! etcd, whose TLS port serves its HTTP routes over it too); in the clear over HTTP/1.1 (etcd's plaintext port
//! takes HTTP/2 only for gRPC).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioExecutor;
use tower::Service;

use super::Upstream;

/// How long one member may take to answer.
pub const HTTP_GET_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest answer taken (etcd's `/metrics` is a few hundred KiB).
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// What a member answered.
#[derive(Debug)]
pub struct HttpAnswer {
    /// The member that answered (`host:port`).
    pub endpoint: String,
    pub status: StatusCode,
    /// Its `Content-Type` and `Content-Encoding`, what a client needs to read the body.
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Upstream {
    /// GETs `path` from the active member, or when it cannot answer, from the others in turn, with the request
    /// headers `asked` (`Accept`, `Accept-Encoding`). When none answers, says what each one's failure was.
    pub async fn http_get(&self, path: &str, asked: &HeaderMap) -> Result<HttpAnswer, String> {
        let active = self.active().index;
        let mut failures = Vec::new();
        for index in std::iter::once(active).chain(self.others(active)) {
            let endpoint = self.members.get(index).endpoint.authority().to_string();
            match tokio::time::timeout(HTTP_GET_TIMEOUT, self.get_from(&endpoint, path, asked))
                .await
            {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(err)) => failures.push(format!("{endpoint}: {err}")),
                Err(_) => {
                    failures.push(format!("{endpoint}: no answer within {HTTP_GET_TIMEOUT:?}"))
                }
            }
        }
        Err(failures.join("; "))
    }

    async fn get_from(
        &self,
        authority: &str,
        path: &str,
        asked: &HeaderMap,
    ) -> Result<HttpAnswer, String> {
        let scheme = if self.tls_on { "https" } else { "http" };
        let uri: Uri = format!("{scheme}://{authority}{path}")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let io = self
            .connector
            .clone()
            .call(uri.clone())
            .await
            .map_err(|e| e.to_string())?;
        let mut request = Request::get(uri.clone())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        for name in [header::ACCEPT, header::ACCEPT_ENCODING] {
            if let Some(value) = asked.get(&name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        let response = if self.tls_on {
            let (mut sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            sender.send_request(request).await
        } else {
            let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            // HTTP/1.1 names the path in the request line and the host in its own header.
            *request.uri_mut() = Uri::try_from(path).map_err(|e| e.to_string())?;
            let host = HeaderValue::try_from(authority).map_err(|e| e.to_string())?;
            request.headers_mut().insert(header::HOST, host);
            sender.send_request(request).await
        }
        .map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        let mut headers = HeaderMap::new();
        for name in [header::CONTENT_TYPE, header::CONTENT_ENCODING] {
            if let Some(value) = parts.headers.get(&name) {
                headers.insert(name, value.clone());
            }
        }
        Ok(HttpAnswer {
            endpoint: authority.to_string(),
            status: parts.status,
            headers,
            body,
        })
    }
}
