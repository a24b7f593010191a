//! Admission of a client watcher: the proxy asks etcd, with the caller's own token and metadata, whether that
//! caller may read the watcher's range, before the watcher reaches the hub. Every create is asked when upstream
//! watch streams carry the proxy's own identity (`--user`: etcd never sees the caller's token); without it, only
//! creates that etcd itself checks on the wrong range (see `Admission` in the module above).
//!
//! The question is a serializable Range of exactly the watched range at a revision far in the future. etcd checks
//! a Range's read permission (with the same function its Watch uses) before it looks at the revision, so a caller
//! with permission gets "future revision" and one without gets a refusal, and etcd reads no key either way.

use std::sync::Arc;

use proto::etcdserverpb::{
    RangeRequest, RangeResponse, StatusRequest, StatusResponse, WatchCreateRequest,
};
use tonic::{Code, Request, Status};

use crate::upstream::etcd_version;
use crate::upstream::{Forwarded, Retry, Upstream, path};

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
    let answer: Result<tonic::Response<RangeResponse>, Status> = upstream
        .call(Retry::ReadOnly, path::RANGE, caller.request(question))
        .await;
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
/// `code` and `message`, worded as the active member's version of etcd words it (see [`Wording`]); its Status
/// says which version that is. Asked per refusal: refusals are rare, and the members of one cluster may run
/// different versions during an upgrade.
pub async fn refusal(
    upstream: &Arc<Upstream>,
    code: Code,
    message: &str,
    requested: i64,
) -> Refusal {
    let status: Result<tonic::Response<StatusResponse>, Status> = upstream
        .call(
            Retry::ReadOnly,
            path::STATUS,
            Request::new(StatusRequest {}),
        )
        .await;
    // A member that does not say is taken to be of the newest kind, as an unreadable version is (see `wording`).
    let wording = status.map_or(Wording::NamesTheError, |s| wording(&s.get_ref().version));
    refusal_of(wording, code, message, requested)
}

/// How a version of etcd answers a create it refuses (server/etcdserver/api/v3rpc/watch.go, `recvLoop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wording {
    /// 3.2 and 3.3: watch ID -1, always "permission denied". (3.0 and 3.1 do not check a watcher at all.)
    Before3_4,
    /// 3.4.0 to 3.4.21 and 3.5.0 to 3.5.5: the watch ID the client asked for, always "permission denied". A
    /// client that asked for none (0) then reads it as the end of its watcher 0 (etcd issue #14296).
    RequestedId,
    /// 3.4.22 and 3.5.6 on, all of 3.6 and 3.7: watch ID -1 (clientv3's `InvalidWatchID`), and the auth error
    /// by its name when it is one of `NAMED`, "permission denied" otherwise (etcd PRs #14547/#14563, backported
    /// to 3.4 as #14548/#14562).
    NamesTheError,
}

/// The refusals etcd's watch names as themselves since [`Wording::NamesTheError`], as gRPC statuses: exactly
/// those a Range asked with the same token fails with for the same cause.
const NAMED: [(Code, &str); 3] = [
    (Code::Unauthenticated, "etcdserver: invalid auth token"),
    (
        Code::InvalidArgument,
        "etcdserver: revision of auth store is old",
    ),
    (Code::InvalidArgument, "etcdserver: user name is empty"),
];

fn refusal_of(wording: Wording, code: Code, message: &str, requested: i64) -> Refusal {
    let (watch_id, names_the_error) = match wording {
        Wording::Before3_4 => (-1, false),
        Wording::RequestedId => (requested, false),
        Wording::NamesTheError => (-1, true),
    };
    let (code, message) = if names_the_error && NAMED.contains(&(code, message)) {
        (code, message)
    } else {
        (Code::PermissionDenied, "etcdserver: permission denied")
    };
    Refusal {
        watch_id,
        // Go's text of a gRPC status error, which etcd puts in the cancel reason.
        reason: format!(
            "rpc error: code = {} desc = {message}",
            crate::metrics::code_label(code)
        ),
    }
}

/// How etcd of this version (a Status `version`, "3.5.30") words a refusal. A version that does not read as
/// major.minor.patch gets the newest wording: etcd has always reported its version so, so another form would
/// come from an etcd newer than this code, and every etcd since 3.5.6 words it the newest way. (3.6.0-alpha.0,
/// which etcd's main branch reported both before and after the fix, reads as 3.6.0: no reading of it is right for
/// every build.)
fn wording(version: &str) -> Wording {
    match etcd_version::release(version) {
        Some(v) if v < (3, 4, 0) => Wording::Before3_4,
        Some(v) if v < (3, 4, 22) || ((3, 5, 0)..(3, 5, 6)).contains(&v) => Wording::RequestedId,
        _ => Wording::NamesTheError,
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
    fn each_version_gets_the_wording_of_its_etcd() {
        use Wording::*;
        for (version, want) in [
            ("3.3.27", Before3_4),
            ("3.4.0", RequestedId),
            ("3.4.21", RequestedId),
            ("3.4.22", NamesTheError),
            ("3.4.23", NamesTheError),
            ("3.5.0-rc.1", RequestedId),
            ("3.5.0", RequestedId),
            ("3.5.1", RequestedId),
            ("3.5.5", RequestedId),
            ("3.5.6", NamesTheError),
            ("3.5.30", NamesTheError),
            ("3.6.0-rc.0", NamesTheError),
            ("3.6.0", NamesTheError),
            ("3.7.1", NamesTheError),
            ("4.0.0", NamesTheError),
            // Unreadable: the newest.
            ("", NamesTheError),
            ("3.5", NamesTheError),
            ("3.5.x", NamesTheError),
            ("3.5.1.2", NamesTheError),
            ("garbage", NamesTheError),
        ] {
            assert_eq!(wording(version), want, "{version}");
        }
    }

    #[test]
    fn refusals_look_like_the_version_of_etcd_that_would_give_them() {
        let denied = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";
        let invalid = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token";
        let cases = [
            (
                Wording::Before3_4,
                (Code::Unauthenticated, "etcdserver: invalid auth token"),
                (-1, denied),
            ),
            (
                Wording::RequestedId,
                (Code::Unauthenticated, "etcdserver: invalid auth token"),
                (7, denied),
            ),
            (
                Wording::NamesTheError,
                (Code::Unauthenticated, "etcdserver: invalid auth token"),
                (-1, invalid),
            ),
            (
                Wording::NamesTheError,
                (Code::InvalidArgument, "etcdserver: user name is empty"),
                (
                    -1,
                    "rpc error: code = InvalidArgument desc = etcdserver: user name is empty",
                ),
            ),
            (
                Wording::NamesTheError,
                (
                    Code::InvalidArgument,
                    "etcdserver: revision of auth store is old",
                ),
                (
                    -1,
                    "rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old",
                ),
            ),
            (
                Wording::NamesTheError,
                (Code::PermissionDenied, "etcdserver: permission denied"),
                (-1, denied),
            ),
            // Any other error etcd's watch calls "permission denied".
            (
                Wording::NamesTheError,
                (Code::FailedPrecondition, "etcdserver: something else"),
                (-1, denied),
            ),
        ];
        for (wording, (code, message), (watch_id, reason)) in cases {
            assert_eq!(
                refusal_of(wording, code, message, 7),
                Refusal {
                    watch_id,
                    reason: reason.into()
                },
                "{wording:?} {message}"
            );
        }
    }
}
