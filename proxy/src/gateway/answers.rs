//! The answer of an in-process gRPC call as the gateway's JSON: one object for a unary call; for a stream, one
//! `{"result":...}` line per message and, if the call fails, an `{"error":...}` object last, as etcd's gateway
//! writes them.

use bytes::Bytes;
use futures::Stream;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use prost_reflect::MessageDescriptor;
use tonic::Code;
use tonic::body::Body;

use super::dialect::Dialect;
use super::frames::Deframer;
use super::json;

/// A whole JSON answer with its status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    json_bytes_response(status, Bytes::from(body.to_string()))
}

/// [`json_response`] of JSON already written.
fn json_bytes_response(status: StatusCode, json: Bytes) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(json)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A text answer, as the older gateway writes a wrong method or an unknown path (Go's `http.Error`).
fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from_static(text.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A path under `/v3/` that names no method.
pub fn no_such_path(dialect: Dialect) -> Response<Body> {
    match dialect {
        Dialect::Legacy => plain(StatusCode::NOT_FOUND, "Not Found\n"),
        Dialect::Status => error(dialect, Code::NotFound, "Not Found"),
    }
}

/// A method's path asked with another HTTP method than POST.
pub fn wrong_method(dialect: Dialect) -> Response<Body> {
    match dialect {
        Dialect::Legacy => plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n"),
        Dialect::Status => error(dialect, Code::Unimplemented, "Method Not Allowed"),
    }
}

/// A call's error, in the dialect's form; a method etcd does not have is a path its gateway does not have.
fn call_error(dialect: Dialect, code: Code, message: &str) -> Response<Body> {
    if super::dialect::is_unknown_method(code, message) {
        return no_such_path(dialect);
    }
    error(dialect, code, message)
}

/// A unary call's error, in the dialect's form.
pub fn error(dialect: Dialect, code: Code, message: &str) -> Response<Body> {
    json_response(dialect.http_status(code), &dialect.error(code, message))
}

/// The status a gRPC answer ended with, read from the trailers (or the headers of a trailers-only answer).
fn status_of(headers: &http::HeaderMap) -> Option<tonic::Status> {
    tonic::Status::from_header_map(headers)
}

/// The header etcd's gateway adds to the answer of every call it made: the gRPC answer's content type, as metadata.
fn with_call_metadata(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(
        "grpc-metadata-content-type",
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A unary call's answer: its message as JSON, or its error.
pub async fn unary(
    answer: Response<Body>,
    output: &MessageDescriptor,
    dialect: Dialect,
) -> Response<Body> {
    with_call_metadata(unary_json(answer, output, dialect).await)
}

async fn unary_json(
    answer: Response<Body>,
    output: &MessageDescriptor,
    dialect: Dialect,
) -> Response<Body> {
    if let Some(status) = status_of(answer.headers()) {
        return call_error(dialect, status.code(), status.message());
    }
    let mut body = answer.into_body();
    let mut deframer = Deframer::default();
    let mut status = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => deframer.push(&data),
                Err(frame) => status = frame.trailers_ref().and_then(status_of),
            },
            Err(failed) => return call_error(dialect, failed.code(), failed.message()),
        }
    }
    match status {
        Some(status) if status.code() != Code::Ok => {
            return call_error(dialect, status.code(), status.message());
        }
        _ => {}
    }
    match deframer.next_message() {
        Ok(Some(message)) => match json::response(output, &message) {
            Some(json) => json_bytes_response(StatusCode::OK, json),
            None => error(
                dialect,
                Code::Internal,
                "etcd-grpc-proxy: etcd's answer is not the method's message",
            ),
        },
        Ok(None) | Err(_) => error(
            dialect,
            Code::Internal,
            "etcd-grpc-proxy: no answer from etcd",
        ),
    }
}

/// A streaming call's answers, each written as it arrives.
pub fn stream(
    answer: Response<Body>,
    output: MessageDescriptor,
    dialect: Dialect,
) -> Response<Body> {
    if let Some(status) = status_of(answer.headers()) {
        if super::dialect::is_unknown_method(status.code(), status.message()) {
            return no_such_path(dialect);
        }
        // Failed before its first message: etcd's gateway writes the stream's error with the error's status.
        return with_call_metadata(json_response(
            dialect.http_status(status.code()),
            &dialect.stream_error(status.code(), status.message()),
        ));
    }
    let lines = lines(answer.into_body(), output, dialect);
    let mut response = Response::new(Body::new(StreamBody::new(lines)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    with_call_metadata(response)
}

/// What the answer stream has yet to write.
struct Lines {
    body: Body,
    deframer: Deframer,
    output: MessageDescriptor,
    dialect: Dialect,
    /// Set once the error object (or the end) is written.
    done: bool,
}

fn lines(
    body: Body,
    output: MessageDescriptor,
    dialect: Dialect,
) -> impl Stream<Item = Result<Frame<Bytes>, tonic::Status>> + Send + 'static {
    let state = Lines {
        body,
        deframer: Deframer::default(),
        output,
        dialect,
        done: false,
    };
    futures::stream::unfold(state, |mut state| async move {
        let line = state.next_line().await?;
        Some((Ok(Frame::data(line)), state))
    })
}

impl Lines {
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            match self.deframer.next_message() {
                Ok(Some(message)) => {
                    return Some(match json::result_line(&self.output, &message) {
                        Some(line) => line,
                        None => self.fail(
                            Code::Internal,
                            "etcd-grpc-proxy: etcd's answer is not the method's message",
                        ),
                    });
                }
                Ok(None) => {}
                Err(_) => {
                    return Some(self.fail(Code::Internal, "etcd-grpc-proxy: bad frame from etcd"));
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.deframer.push(&data),
                    Err(frame) => match frame.trailers_ref().and_then(status_of) {
                        Some(status) if status.code() != Code::Ok => {
                            return Some(self.fail(status.code(), status.message()));
                        }
                        _ => {}
                    },
                },
                Some(Err(failed)) => return Some(self.fail(failed.code(), failed.message())),
                None => return None,
            }
        }
    }

    /// The error object that ends the stream.
    fn fail(&mut self, code: Code, message: &str) -> Bytes {
        self.done = true;
        Bytes::from(self.dialect.stream_error(code, message).to_string())
    }
}
