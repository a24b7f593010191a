//! Where etcd versions' gateways differ: how an error is written, and what a wrong method or an unknown path gets.
//!
//! Seen on real etcd (`testdata/gateway/README.md`): 3.5.1 (and 3.4, grpc-gateway v1.9.5) write an error as
//! `{"error":M,"code":C,"message":M}` and answer a wrong method or an unknown path in plain text; 3.5.30, 3.6 and
//! 3.7 write `{"code":C,"message":M}` and answer both as JSON errors. Every version serves `/v3beta/` as `/v3/`,
//! ignores fields it does not know and anything after the first JSON value.
//!
//! Which 3.5 release changed the form is not known here, so the proxy does not guess from a version number: it asks
//! the active member `GET /v3/kv/range`, which the older form answers 405 in plain text and the newer 501 in JSON.

use http::StatusCode;
use serde_json::{Value, json};
use tonic::Code;

/// The gateway of one etcd release line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// etcd 3.4 and early 3.5: `{"error":M,"code":C,"message":M}`.
    Legacy,
    /// etcd 3.5.30, 3.6 and 3.7: `{"code":C,"message":M}`.
    Status,
}

/// The path asked to tell the dialects apart, and what each answers it with.
pub const PROBE_PATH: &str = "/v3/kv/range";

impl Dialect {
    /// The dialect whose answer to `GET` [`PROBE_PATH`] has this status, or `None` for an etcd that does not
    /// serve its gateway (`--enable-grpc-gateway=false`) or did not answer.
    pub fn of_probe(status: StatusCode) -> Option<Dialect> {
        match status {
            StatusCode::METHOD_NOT_ALLOWED => Some(Dialect::Legacy),
            StatusCode::NOT_IMPLEMENTED => Some(Dialect::Status),
            _ => None,
        }
    }

    /// The path under `/v3/` (or `/v3beta/`, which etcd serves as `/v3/`) that a request path names.
    pub fn method_path(path: &str) -> Option<&str> {
        path.strip_prefix("/v3/")
            .or_else(|| path.strip_prefix("/v3beta/"))
    }

    /// The HTTP status a gRPC code is answered with.
    pub fn http_status(self, code: Code) -> StatusCode {
        match code {
            Code::Ok => StatusCode::OK,
            // the newer gateway answers a cancelled call with nginx's "client closed request".
            Code::Cancelled => match self {
                Dialect::Legacy => StatusCode::REQUEST_TIMEOUT,
                Dialect::Status => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            },
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body of a unary call's error.
    pub fn error(self, code: Code, message: &str) -> Value {
        match self {
            Dialect::Legacy => json!({"error": message, "code": code as i32, "message": message}),
            Dialect::Status => json!({"code": code as i32, "message": message}),
        }
    }

    /// The object a stream ends with when its call fails after it started.
    pub fn stream_error(self, code: Code, message: &str) -> Value {
        let error = match self {
            Dialect::Legacy => {
                let status = self.http_status(code);
                json!({
                    "grpc_code": code as i32,
                    "http_code": status.as_u16(),
                    "message": message,
                    "http_status": status.canonical_reason().unwrap_or(""),
                })
            }
            Dialect::Status => json!({"code": code as i32, "message": message}),
        };
        json!({ "error": error })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_tells_the_dialects_apart() {
        assert_eq!(
            Dialect::of_probe(StatusCode::METHOD_NOT_ALLOWED),
            Some(Dialect::Legacy)
        );
        assert_eq!(
            Dialect::of_probe(StatusCode::NOT_IMPLEMENTED),
            Some(Dialect::Status)
        );
        // An etcd without its gateway answers with its own 404.
        assert_eq!(Dialect::of_probe(StatusCode::NOT_FOUND), None);
    }

    #[test]
    fn v3beta_is_v3_and_v3alpha_is_gone() {
        assert_eq!(Dialect::method_path("/v3beta/kv/range"), Some("kv/range"));
        assert_eq!(Dialect::method_path("/v3/kv/range"), Some("kv/range"));
        assert_eq!(Dialect::method_path("/v3alpha/kv/range"), None);
    }

    #[test]
    fn errors_take_each_dialects_form() {
        assert_eq!(
            Dialect::Legacy.error(Code::OutOfRange, "m"),
            json!({"error": "m", "code": 11, "message": "m"})
        );
        assert_eq!(
            Dialect::Status.error(Code::NotFound, "m"),
            json!({"code": 5, "message": "m"})
        );
        assert_eq!(
            Dialect::Legacy.http_status(Code::OutOfRange),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            Dialect::Status.http_status(Code::Unimplemented),
            StatusCode::NOT_IMPLEMENTED
        );
        assert_eq!(Dialect::Status.http_status(Code::Cancelled).as_u16(), 499);
        assert_eq!(
            Dialect::Legacy.stream_error(Code::NotFound, "m"),
            json!({"error": {"grpc_code": 5, "http_code": 404, "message": "m", "http_status": "Not Found"}})
        );
    }
}
