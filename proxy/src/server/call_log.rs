//! `--experimental-enable-grpc-logging`: one log line per gRPC call, written when the call ends (a stream at its
//! end), with the fields of go-grpc-middleware's zap logging interceptor: `grpc.service`, `grpc.method`,
//! `grpc.code`, `grpc.time_ms`, `peer.address`, `span.kind`, `system`.
//!
//! etcd's Go proxy (3.6+) logs each request and response message whole instead, as JSON: keys, values, lease IDs,
//! and the passwords of `Authenticate`, `UserAdd` and `UserChangePassword`, and the tokens `Authenticate` returns.
//! This proxy relays messages as bytes and does not decode them to log them; no content of a message is logged,
//! so no key, value, password or token reaches the log.

use std::net::SocketAddr;
use std::time::Duration;

/// Where the lines go (`RUST_LOG=grpc=off` silences them without turning the flag off).
pub const TARGET: &str = "grpc";

/// What the line of one call says besides its end: who called what.
pub struct CallLog {
    pub peer: SocketAddr,
    /// `true` for the unary calls (go-grpc-middleware's "unary call"), `false` for streams.
    pub unary: bool,
}

impl CallLog {
    /// Writes the call's line: it ended with `code` after `elapsed`.
    pub fn finished(&self, service: &str, method: &str, code: tonic::Code, elapsed: Duration) {
        let code = crate::metrics::code_label(code);
        let kind = if self.unary { "unary" } else { "streaming" };
        tracing::event!(
            target: TARGET,
            tracing::Level::INFO,
            grpc.service = %service,
            grpc.method = %method,
            grpc.code = %code,
            grpc.time_ms = milliseconds(elapsed),
            peer.address = %self.peer,
            span.kind = %"server",
            system = %"grpc",
            "finished {kind} call with code {code}"
        );
    }
}

/// Milliseconds with microseconds as decimals, a number as the Go interceptor writes `grpc.time_ms`.
fn milliseconds(elapsed: Duration) -> f64 {
    // Exact below 2^53 microseconds (285 years).
    elapsed.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_milliseconds_to_the_microsecond() {
        assert_eq!(milliseconds(Duration::from_micros(1_234_567)), 1234.567);
        assert_eq!(milliseconds(Duration::from_nanos(5_999)), 0.005);
        assert_eq!(milliseconds(Duration::ZERO), 0.0);
    }
}
