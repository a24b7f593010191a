//! etcd's HTTP/JSON gateway (`POST /v3/kv/range` and the rest) on the client port: each gateway call becomes the
//! gRPC call it names, served in-process by the one forwarding path (so namespaces, the range cache, auth, limits,
//! metrics, call logs and the watch and keep-alive coalescing apply as to any gRPC call), and its answer becomes
//! JSON again in the form of the etcd version behind.
//!
//! - [`routes`]: gateway path → gRPC method.
//! - [`json`]: messages to and from JSON by their descriptors.
//! - [`dialect`]: what differs between etcd versions' gateways (errors, wrong methods, unknown paths).
//! - [`learn`]: which of them the etcd behind is, learned by asking it.
//! - [`requests`]: a streaming call's body of JSON requests → gRPC frames.
//! - [`answers`]: the gRPC answer → JSON (one object, or one line per message of a stream).
//! - [`frames`]: gRPC's length-prefixed messages.

pub mod answers;
pub mod dialect;
pub mod frames;
pub mod json;
pub mod learn;
pub mod requests;
pub mod routes;

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, Request, Response, header};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use tonic::Code;
use tonic::body::Body;

use crate::upstream::Upstream;
use dialect::Dialect;

/// JSON is larger than the protobuf it encodes (base64 bytes, field names, integers as strings): a request body may
/// take this many times `--max-recv-bytes` before it is refused unread; the encoded request then meets the gRPC
/// limit as any call does.
const JSON_EXPANSION: usize = 4;

/// The gateway of one running proxy.
pub struct Gateway {
    /// The gateway of the etcd behind.
    learned: learn::Learned,
    /// The most bytes a request (or one request of a stream) may take as JSON.
    max_request_bytes: usize,
}

impl Gateway {
    pub fn new(upstream: Arc<Upstream>, max_recv_bytes: usize) -> Self {
        Self {
            learned: learn::Learned::new(upstream),
            max_request_bytes: max_recv_bytes.saturating_mul(JSON_EXPANSION),
        }
    }

    /// Whether a path is the gateway's (under a prefix some etcd version serves it at).
    pub fn serves(path: &str) -> bool {
        path.starts_with("/v3/") || path.starts_with("/v3beta/")
    }

    /// Serves one gateway request; `call` serves the gRPC call it becomes.
    pub async fn serve<B, C, F>(&self, request: Request<B>, call: C) -> Response<Body>
    where
        B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Into<Box<dyn std::error::Error + Send + Sync>>,
        C: FnOnce(Request<Body>) -> F,
        F: Future<Output = Response<Body>>,
    {
        // etcd answers a CORS preflight on any path, before its gateway sees it.
        if request.method() == HttpMethod::OPTIONS {
            self.drain(request.into_body()).await;
            return with_cors(Response::new(Body::empty()));
        }
        let etcd = self.learned.etcd_gateway().await;
        let dialect = etcd.dialect;
        let method = Dialect::method_path(request.uri().path())
            .and_then(|path| etcd.grpc_path(path))
            .and_then(|grpc_path| Some((grpc_path, json::Method::of(grpc_path)?)));
        let Some((grpc_path, method)) = method else {
            self.drain(request.into_body()).await;
            return with_cors(answers::no_such_path(dialect));
        };
        if request.method() != HttpMethod::POST {
            self.drain(request.into_body()).await;
            return with_cors(answers::wrong_method(dialect));
        }
        with_cors(self.call(dialect, grpc_path, method, request, call).await)
    }

    async fn drain<B>(&self, body: B)
    where
        B: HttpBody<Data = Bytes> + Unpin,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        drain_unused(body, self.max_request_bytes).await;
    }

    /// Serves a gateway request for one gRPC method.
    async fn call<B, C, F>(
        &self,
        dialect: Dialect,
        grpc_path: &'static str,
        method: json::Method,
        request: Request<B>,
        call: C,
    ) -> Response<Body>
    where
        B: HttpBody<Data = Bytes> + Send + Unpin + 'static,
        B::Error: std::fmt::Display + Into<Box<dyn std::error::Error + Send + Sync>>,
        C: FnOnce(Request<Body>) -> F,
        F: Future<Output = Response<Body>>,
    {
        let headers = forwarded(request.headers());
        let body = request.into_body();
        let grpc_body = if method.client_streaming {
            Body::new(StreamBody::new(requests::frames(
                body,
                method.input.clone(),
                self.max_request_bytes,
            )))
        } else {
            let json = match Limited::new(body, self.max_request_bytes).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => {
                    let message = format!(
                        "etcd-grpc-proxy: request body not read ({err}; at most {} bytes)",
                        self.max_request_bytes
                    );
                    return answers::error(dialect, Code::InvalidArgument, &message);
                }
            };
            match json::request(&method.input, &json) {
                Ok(encoded) => Body::new(Full::new(frames::frame(&encoded))),
                Err(json::BadJson(message)) => {
                    return answers::error(dialect, Code::InvalidArgument, &message);
                }
            }
        };
        let mut grpc_request = Request::new(grpc_body);
        *grpc_request.method_mut() = HttpMethod::POST;
        *grpc_request.uri_mut() = http::Uri::from_static(grpc_path);
        *grpc_request.headers_mut() = headers;
        let answer = call(grpc_request).await;
        if method.server_streaming {
            answers::stream(answer, method.output, dialect)
        } else {
            answers::unary(answer, &method.output, dialect).await
        }
    }
}

/// Reads and drops a request body that is answered without being used, up to `bound` bytes: an HTTP/2 answer that
/// ends the stream while the client is still sending makes clients (curl) see the stream reset instead of the answer.
pub async fn drain_unused<B>(body: B, bound: usize)
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = Limited::new(body, bound);
    while let Some(Ok(_)) = body.frame().await {}
}

/// The CORS headers etcd puts on every answer of its client port (its default `--cors` allows every origin).
fn with_cors(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("accept, content-type, authorization"),
    );
    response
}

/// The headers of the gRPC call a gateway request becomes: the token in `Authorization` (etcd reads it there),
/// and each `Grpc-Metadata-<name>` as `<name>`, as etcd's gateway forwards them.
fn forwarded(asked: &HeaderMap) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    if let Some(token) = asked.get(header::AUTHORIZATION) {
        headers.insert(header::AUTHORIZATION, token.clone());
    }
    for (name, value) in asked {
        if let Some(key) = name.as_str().strip_prefix("grpc-metadata-")
            && let Ok(key) = HeaderName::from_bytes(key.as_bytes())
        {
            headers.append(key, value.clone());
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_and_grpc_metadata_are_forwarded() {
        let mut asked = HeaderMap::new();
        asked.insert(header::AUTHORIZATION, HeaderValue::from_static("tok"));
        asked.insert("grpc-metadata-hasleader", HeaderValue::from_static("true"));
        asked.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        asked.insert("x-other", HeaderValue::from_static("x"));
        let headers = forwarded(&asked);
        assert_eq!(headers[header::AUTHORIZATION], "tok");
        assert_eq!(headers["hasleader"], "true");
        assert_eq!(headers[header::CONTENT_TYPE], "application/grpc");
        assert!(headers.get(header::CONTENT_LENGTH).is_none());
        assert!(headers.get("x-other").is_none());
    }

    #[test]
    fn gateway_prefixes() {
        assert!(Gateway::serves("/v3/kv/range"));
        assert!(Gateway::serves("/v3beta/kv/range"));
        assert!(!Gateway::serves("/v3alpha/kv/range"));
        assert!(!Gateway::serves("/metrics"));
    }
}
