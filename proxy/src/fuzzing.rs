//! Entry points for coverage-guided fuzzing (`fuzz/`, `cargo fuzz`), compiled only with the `fuzzing` feature:
//! thin wrappers over the functions that read bytes the proxy does not control (clients' requests, etcd's answers,
//! HTTP/2 frames, the command line), so that the fuzz targets call the real code, not a copy.
//!
//! Functions that are public already are re-exported here under one roof; the HTTP/2 frame follower and the ping
//! guard are the crate's own (`server::frames`, `server::ping_guard`). Nothing here changes how the proxy behaves.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

pub use crate::namespace::Namespace;
pub use crate::namespace::messages::{Method as KeyedMethod, of as keyed_method};
pub use crate::namespace::rewrite::{Direction, Empty, Field, Foreign, Schema};
pub use crate::rpc::methods::{Repeat, Route, route, unknown};
pub use crate::rpc::range_stream::{check as range_stream_check, next_chunk_limit};
pub use crate::server::frames::{
    ACK, CLIENT_PREFACE, DATA, END_STREAM, ENHANCE_YOUR_CALM, FrameCursor, FrameHeader, GOAWAY,
    HEADERS, PING, RST_STREAM, goaway,
};
pub use crate::upstream::Retry;
pub use crate::wire::{Fields, Malformed, Value, fields, fields_with_bytes, put_bytes};

/// Whether a call of `repeat`'s kind with these request bytes may be repeated on another endpoint (it only reads;
/// a request the proxy refuses is not a read).
pub fn repeat_is_read(repeat: Repeat, request: &[u8]) -> bool {
    matches!(repeat.retry(request), Ok(Retry::ReadOnly))
}

/// Whether the proxy may repeat a Txn with these request bytes on another endpoint (it only reads).
pub fn txn_is_read_only(request: &[u8]) -> bool {
    repeat_is_read(Repeat::Txn, request)
}

/// Whether an Alarm call with these request bytes only lists alarms (a read).
pub fn alarm_is_get(request: &[u8]) -> bool {
    repeat_is_read(Repeat::Alarm, request)
}

/// The path a call is routed by, taken from a request target's bytes as `Rpc::serve` takes it from the URI
/// (`None`: not a valid request target, which hyper refuses before the proxy sees it).
pub fn request_path(target: &[u8]) -> Option<String> {
    let path = http::uri::PathAndQuery::try_from(target).ok()?;
    Some(path.path().to_owned())
}

/// Parses a command line as the binary does (the seed, when `--seed` is absent, is 0).
pub fn parse_cli(args: Vec<OsString>) -> Result<crate::cli::Cli, clap::Error> {
    crate::cli::parse(args, || 0)
}

/// A single-threaded runtime with a paused clock: timers fire as soon as nothing else can run, so a fuzz input
/// never waits for real time.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// One step of a connection followed by [`ping_guard`].
#[derive(Clone, Debug)]
pub enum GuardStep {
    /// The client sends these bytes; the server above reads them through the guard, `read_size` at most per read.
    Client { bytes: Vec<u8>, read_size: usize },
    /// The server above writes these bytes to the client through the guard.
    Server(Vec<u8>),
    /// Time passes.
    Wait(Duration),
}

/// What a connection followed by [`ping_guard`] did.
#[derive(Clone, Debug, Default)]
pub struct GuardRun {
    /// Everything the server above read through the guard, in order.
    pub read_by_server: Vec<u8>,
    /// Everything that reached the client's side of the connection, in order.
    pub sent_to_client: Vec<u8>,
    /// What the server above wrote, of which the guard reported every byte as written.
    pub written_by_server: Vec<u8>,
    /// Whether the guard ended the connection (a read returned end of stream with client bytes still unread).
    pub ended: bool,
    /// How many bytes of `written_by_server` had been written when the guard ended the connection.
    pub written_before_end: usize,
}

/// Runs the steps through the connection wrapper that enforces `--grpc-keepalive-min-time`
/// (`server::ping_guard::PingGuard`, which follows the frames with [`FrameCursor`]) over an in-memory connection.
pub fn ping_guard(min_time: Option<Duration>, steps: &[GuardStep]) -> GuardRun {
    runtime().block_on(async {
        let wire = Rc::new(RefCell::new(MemoryConn::default()));
        let mut guard = crate::server::ping_guard::PingGuard::new(Shared(wire.clone()), min_time);
        let mut run = GuardRun::default();
        for step in steps {
            match step {
                GuardStep::Client { bytes, read_size } => {
                    wire.borrow_mut().incoming.extend(bytes.iter().copied());
                    let mut buf = vec![0; (*read_size).max(1)];
                    while !run.ended && !wire.borrow().incoming.is_empty() {
                        let n = guard
                            .read(&mut buf)
                            .await
                            .expect("memory reads do not fail");
                        if n == 0 {
                            run.ended = true;
                            run.written_before_end = run.written_by_server.len();
                        }
                        run.read_by_server.extend_from_slice(&buf[..n]);
                    }
                }
                GuardStep::Server(bytes) => {
                    let n = guard.write(bytes).await.expect("memory writes do not fail");
                    run.written_by_server.extend_from_slice(&bytes[..n]);
                }
                GuardStep::Wait(duration) => tokio::time::advance(*duration).await,
            }
        }
        run.sent_to_client = std::mem::take(&mut wire.borrow_mut().outgoing);
        run
    })
}

/// Both ends of an in-memory connection: what the client sent and the server has not read yet, and what reached
/// the client. A read with nothing left to read is the end of the stream.
#[derive(Default)]
struct MemoryConn {
    incoming: VecDeque<u8>,
    outgoing: Vec<u8>,
}

struct Shared(Rc<RefCell<MemoryConn>>);

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut conn = self.0.borrow_mut();
        let n = buf.remaining().min(conn.incoming.len());
        let bytes: Vec<u8> = conn.incoming.drain(..n).collect();
        buf.put_slice(&bytes);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Shared {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.0.borrow_mut().outgoing.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Every gateway path under `/v3/` and the gRPC method it names.
pub use crate::gateway::routes::ROUTES as GATEWAY_ROUTES;

/// A gateway request body read as `grpc_path`'s request, as the gateway reads it: `None` when it is refused, else
/// whether the bytes the gateway would send on decode as that request (they must).
pub fn gateway_request_decodes(grpc_path: &str, json: &[u8]) -> Option<bool> {
    let method = crate::gateway::json::Method::of(grpc_path)?;
    let encoded = crate::gateway::json::request(&method.input, json).ok()?;
    Some(prost_reflect::DynamicMessage::decode(method.input, encoded).is_ok())
}

/// Answer bytes from etcd written as the gateway's JSON for `grpc_path`'s response: `None` when they are not that
/// message, else whether what is written is a JSON object (it must be).
pub fn gateway_response_is_object(grpc_path: &str, answer: &[u8]) -> Option<bool> {
    let method = crate::gateway::json::Method::of(grpc_path)?;
    crate::gateway::json::response(&method.output, answer).map(|json| {
        serde_json::from_slice::<serde_json::Value>(&json).is_ok_and(|json| json.is_object())
    })
}
