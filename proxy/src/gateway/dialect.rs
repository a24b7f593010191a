//! Where etcd versions' gateways differ: how an error is written, and what a wrong method or an unknown path gets.
//!
//! Seen on real etcd (`testdata/gateway/README.md`): 3.5.1 (and 3.4, grpc-gateway v1.9.5) write an error as
//! `{"error":M,"code":C,"message":M}` and answer a wrong method or an unknown path in plain text; 3.5.30, 3.6 and
//! 3.7 write `{"code":C,"message":M}` and answer both as JSON errors. Every version serves `/v3beta/` as `/v3/`,
//! ignores fields it does not know and anything after the first JSON value.
//!
//! Paths differ too: up to 3.5.9 HashKV shares `/v3/maintenance/hash` with Hash (whose binding, registered first,
//! wins) and `/v3/maintenance/hashkv` does not exist; 3.4 has no AuthStatus or Downgrade (their paths answer as
//! unknown paths: see [`is_unknown_method`]).
//!
//! Which 3.5 release changed the error form is not known here, so the proxy does not guess from a version number: it
//! asks the active member `GET` [`PROBE_PATH`], whose answer tells both apart ([`EtcdGateway::of_probe`]).

use http::StatusCode;
use serde_json::{Value, json};
use tonic::Code;

/// How one etcd release line writes its gateway's errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// etcd 3.4 and early 3.5: `{"error":M,"code":C,"message":M}`.
    Legacy,
    /// etcd 3.5.30, 3.6 and 3.7: `{"code":C,"message":M}`.
    Status,
}

/// What the proxy learns of the gateway of the etcd behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EtcdGateway {
    pub dialect: Dialect,
    /// Whether `/v3/maintenance/hashkv` exists (etcd 3.5.10 on).
    pub hashkv_path: bool,
}

/// The path asked to learn an [`EtcdGateway`].
pub const PROBE_PATH: &str = "/v3/maintenance/hashkv";

impl EtcdGateway {
    /// The gateway of the newest etcd, assumed until one member has answered the probe.
    pub const NEWEST: EtcdGateway = EtcdGateway {
        dialect: Dialect::Status,
        hashkv_path: true,
    };

    /// The gateway whose answer to `GET` [`PROBE_PATH`] this is: a wrong method where the path exists (405 in
    /// text from the older form, 501 in JSON from the newer), an unknown path where it does not (404, in text or
    /// JSON). `None` for anything else: an etcd that does not serve its gateway (`--enable-grpc-gateway=false`
    /// answers with its own "404 page not found"), or an answer from something that is not etcd.
    pub fn of_probe(status: StatusCode, body: &[u8]) -> Option<EtcdGateway> {
        let (dialect, hashkv_path) = match status {
            StatusCode::METHOD_NOT_ALLOWED => (Dialect::Legacy, true),
            StatusCode::NOT_IMPLEMENTED => (Dialect::Status, true),
            StatusCode::NOT_FOUND if body == b"Not Found\n" => (Dialect::Legacy, false),
            StatusCode::NOT_FOUND
                if serde_json::from_slice::<Value>(body)
                    .is_ok_and(|answer| answer.get("code") == Some(&json!(5))) =>
            {
                (Dialect::Status, false)
            }
            _ => return None,
        };
        Some(EtcdGateway {
            dialect,
            hashkv_path,
        })
    }

    /// The gRPC method a path under `/v3/` names on this etcd, or `None` if it has no such path.
    pub fn grpc_path(self, method_path: &str) -> Option<&'static str> {
        if method_path == "maintenance/hashkv" && !self.hashkv_path {
            return None;
        }
        super::routes::grpc_path(method_path)
    }
}

/// Whether a call's refusal says etcd has no such method (grpc-go's "unknown method ..."): etcd's gateway has no
/// path for a method its server lacks (3.4's AuthStatus, Downgrade), so the path is answered as unknown.
pub fn is_unknown_method(code: Code, message: &str) -> bool {
    code == Code::Unimplemented && message.starts_with("unknown method")
}

impl Dialect {
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
    fn the_probe_tells_the_dialect_and_the_paths() {
        let probe = |status: u16, body: &str| {
            EtcdGateway::of_probe(
                StatusCode::from_u16(status).expect("a status"),
                body.as_bytes(),
            )
        };
        let gateway = |dialect, hashkv_path| {
            Some(EtcdGateway {
                dialect,
                hashkv_path,
            })
        };
        // 3.4.23 and 3.5.1; a 3.5 between 3.5.10 and the newer form; 3.5.30 on; a 3.5 before 3.5.10 in the newer form.
        assert_eq!(probe(404, "Not Found\n"), gateway(Dialect::Legacy, false));
        assert_eq!(
            probe(405, "Method Not Allowed\n"),
            gateway(Dialect::Legacy, true)
        );
        assert_eq!(
            probe(501, r#"{"code":12,"message":"Method Not Allowed"}"#),
            gateway(Dialect::Status, true)
        );
        assert_eq!(
            probe(404, r#"{"code":5, "message":"Not Found"}"#),
            gateway(Dialect::Status, false)
        );
        // Without its gateway, etcd answers from its own mux.
        assert_eq!(probe(404, "404 page not found\n"), None);
        assert_eq!(probe(200, "{}"), None);
    }

    #[test]
    fn hashkv_has_a_path_only_where_etcd_gives_it_one() {
        let old = EtcdGateway {
            dialect: Dialect::Legacy,
            hashkv_path: false,
        };
        assert_eq!(old.grpc_path("maintenance/hashkv"), None);
        assert_eq!(
            old.grpc_path("maintenance/hash"),
            Some("/etcdserverpb.Maintenance/Hash")
        );
        assert_eq!(
            EtcdGateway::NEWEST.grpc_path("maintenance/hashkv"),
            Some("/etcdserverpb.Maintenance/HashKV")
        );
        assert!(is_unknown_method(
            Code::Unimplemented,
            "unknown method Downgrade for service etcdserverpb.Maintenance"
        ));
        assert!(!is_unknown_method(
            Code::Unimplemented,
            "RangeStream with a sort order"
        ));
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
