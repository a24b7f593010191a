//! Admission of a client watcher when upstream watch streams carry the proxy's own identity (`--user`): etcd no
//! longer sees the caller's token on the stream, so the proxy asks etcd, with the caller's own token and metadata,
//! whether that caller may read the watcher's range, before the watcher reaches the hub.
//!
//! The question is a serializable Range of exactly the watched range at a revision far in the future. etcd checks
//! a Range's read permission (with the same function its Watch uses) before it looks at the revision, so a caller
//! with permission gets "future revision" and one without gets a refusal, and etcd reads no key either way.

use std::sync::Arc;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{RangeRequest, StatusRequest, WatchCreateRequest};
use tonic::{Code, Request, Status};

use crate::upstream::{Forwarded, Retry, Upstream, forward_unary};

/// etcd's answer to a Range above its current revision: the caller passed the permission check.
const FUTURE_REVISION: &str = "etcdserver: mvcc: required revision is a future revision";

/// What etcd said of a caller's watcher.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// etcd's watch would refuse it: the caller's token may not read the range, is invalid, or is missing, as
    /// etcd's answer to the question says (turn it into etcd's refusal with [`refusal`]).
    Refused {
        code: Code,
        message: String,
    },
}

/// The create answer etcd gives a refused watcher: its watch ID and cancel reason.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub watch_id: i64,
    pub reason: String,
}

/// Asks etcd whether the caller (its token is in `caller`) may watch what `create` asks for. An `Err` is a
/// failure to get an answer (no endpoint could serve): the client's stream should end with it.
pub async fn check(
    upstream: &Arc<Upstream>,
    caller: &Forwarded,
    create: &WatchCreateRequest,
) -> Result<Admission, Status> {
    let question = RangeRequest {
        // etcd's watch treats an empty key as "\0", and a Range without key is an error of its own.
        key: if create.key.is_empty() {
            vec![0]
        } else {
            create.key.clone()
        },
        range_end: create.range_end.clone(),
        revision: i64::MAX,
        serializable: true,
        keys_only: true,
        limit: 1,
        ..Default::default()
    };
    let answer = forward_unary!(
        upstream,
        Retry::ReadOnly,
        caller.request(question),
        KvClient::range
    );
    Ok(match answer {
        Ok(_) => Admission::Admitted,
        Err(status) => verdict(status)?,
    })
}

/// Reads etcd's answer to the permission question.
fn verdict(status: Status) -> Result<Admission, Status> {
    match status.code() {
        Code::OutOfRange if status.message() == FUTURE_REVISION => Ok(Admission::Admitted),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => Err(status),
        // PermissionDenied, an invalid or missing token ("invalid auth token", "user name is empty"): etcd's watch
        // refuses the create for the same reason.
        code => Ok(Admission::Refused {
            code,
            message: status.message().to_owned(),
        }),
    }
}

/// etcd's answer to a create that asked for watch ID `requested` (0: the server's choice) and was refused with
/// `code` and `message`. Before 3.5, etcd answers with watch ID -1 and the text of the error as Go prints it; from
/// 3.5 on, with the requested ID and always "permission denied". The active member's Status says which; a member
/// that does not answer is taken to be 3.5 or later. Asked per refusal: refusals are rare, and the members of one
/// cluster may run different versions during an upgrade.
pub async fn refusal(
    upstream: &Arc<Upstream>,
    code: Code,
    message: &str,
    requested: i64,
) -> Refusal {
    let status = forward_unary!(
        upstream,
        Retry::ReadOnly,
        Request::new(StatusRequest {}),
        MaintenanceClient::status
    );
    let before_3_5 = status.is_ok_and(|s| is_before_3_5(&s.get_ref().version));
    refusal_of(before_3_5, code, message, requested)
}

fn refusal_of(before_3_5: bool, code: Code, message: &str, requested: i64) -> Refusal {
    let (watch_id, code, message) = if before_3_5 {
        (-1, code, message)
    } else {
        (
            requested,
            Code::PermissionDenied,
            "etcdserver: permission denied",
        )
    };
    Refusal {
        watch_id,
        reason: format!(
            "rpc error: code = {} desc = {message}",
            crate::metrics::code_label(code)
        ),
    }
}

/// Whether etcd of this version is older than 3.5.
fn is_before_3_5(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) < (3, 5),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_future_revision_answer_admits_and_unreachable_etcd_is_no_verdict() {
        let refused = |code, message: &str| {
            Ok(Admission::Refused {
                code,
                message: message.into(),
            })
        };
        let cases = [
            (
                Status::out_of_range(FUTURE_REVISION),
                Ok(Admission::Admitted),
            ),
            (
                Status::permission_denied("etcdserver: permission denied"),
                refused(Code::PermissionDenied, "etcdserver: permission denied"),
            ),
            (
                Status::unauthenticated("etcdserver: invalid auth token"),
                refused(Code::Unauthenticated, "etcdserver: invalid auth token"),
            ),
            (
                Status::invalid_argument("etcdserver: user name is empty"),
                refused(Code::InvalidArgument, "etcdserver: user name is empty"),
            ),
            (
                Status::unavailable("etcdserver: no leader"),
                Err(Code::Unavailable),
            ),
        ];
        for (status, want) in cases {
            let shown = status.message().to_owned();
            let got = verdict(status).map_err(|s| s.code());
            assert_eq!(got, want, "{shown}");
        }
    }

    #[test]
    fn versions_before_3_5_are_told_apart() {
        for (version, before) in [
            ("3.4.23", true),
            ("3.3.0", true),
            ("3.5.1", false),
            ("3.6.0", false),
            ("4.0.0", false),
            ("", false),
        ] {
            assert_eq!(is_before_3_5(version), before, "{version}");
        }
    }

    #[test]
    fn refusals_look_like_the_version_of_etcd_that_would_give_them() {
        let (code, message) = (Code::Unauthenticated, "etcdserver: invalid auth token");
        assert_eq!(
            refusal_of(true, code, message, 7),
            Refusal {
                watch_id: -1,
                reason: "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
                    .into()
            }
        );
        assert_eq!(
            refusal_of(false, code, message, 7),
            Refusal {
                watch_id: 7,
                reason: "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
                    .into()
            }
        );
    }
}
