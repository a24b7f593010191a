//! The one place that decides what status a client sees, and what an upstream failure means for failover.
//!
//! Upstream statuses reach clients unchanged. The exceptions are the proxy's own message-size limits, which are
//! reported the way etcd (grpc-go) reports them, so that clients matching on etcd's errors keep working.

use std::error::Error as _;

use tonic::{Code, Status};

use crate::net::ConnectFailed;

/// etcd's answer when a request may or may not have been applied (`ErrTimeoutDueToConnectionLost`): a call whose
/// connection to etcd broke after it was sent, or that was waiting on an endpoint the proxy has left, gets it.
/// clientv3 recognises etcd's errors by their exact words.
pub const OUTCOME_UNKNOWN: &str = "etcdserver: request timed out, possibly due to connection lost";

const TONIC_DECODE_TOO_LARGE: &str = "Error, decoded message length too large: found ";

/// etcd's answer to a Txn nested deeper than it takes (InvalidArgument, `ErrGRPCTooManyOps`): the proxy's answer
/// to one nested deeper than [`crate::wire::MAX_DEPTH`].
pub fn txn_too_deep() -> Status {
    Status::invalid_argument("etcdserver: too many operations in txn request")
}

/// etcd's error for a message larger than the receiver accepts.
pub fn received_too_large(found: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: received message larger than max ({found} vs. {limit})"
    ))
}

/// etcd's error for a message larger than the sender may send.
pub fn sending_too_large(found: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "grpc: trying to send message larger than max ({found} vs. {limit})"
    ))
}

/// tonic's words for a gRPC frame that ends before the length it announced.
const TONIC_TRUNCATED_FRAME: &str = "Unexpected EOF decoding stream.";

/// Rewrites what tonic says of a bad frame from a client into what etcd (grpc-go) says of the same bytes:
/// "decoded message length too large" (OutOfRange) becomes ResourceExhausted, a frame cut short (Internal) becomes
/// Unknown "unexpected EOF". Returns `None` for any other status.
pub fn etcd_frame_error(code: Code, message: &str) -> Option<Status> {
    if code == Code::Internal && message == TONIC_TRUNCATED_FRAME {
        return Some(Status::unknown("unexpected EOF"));
    }
    if code != Code::OutOfRange {
        return None;
    }
    let rest = message.strip_prefix(TONIC_DECODE_TOO_LARGE)?;
    let (found, rest) = rest.split_once(" bytes, the limit is: ")?;
    let limit = rest.strip_suffix(" bytes")?;
    Some(received_too_large(found.parse().ok()?, limit.parse().ok()?))
}

/// What a client sees for a failed upstream call.
pub fn to_client(status: Status) -> Status {
    if let Some(rewritten) = etcd_frame_error(status.code(), status.message()) {
        return rewritten;
    }
    if status.source().is_some() {
        // A failure of the proxy's own connection to etcd, not an answer from etcd. The outcome of the call is
        // unknown, which etcd's clients read from Unavailable (tonic reports a broken connection as Unknown or
        // Internal); the transport internals stay out of the client's view but in the message for diagnosis.
        let code = match status.code() {
            Code::Unknown | Code::Internal => Code::Unavailable,
            code => code,
        };
        if code == Code::Unavailable && !never_sent(&status) {
            tracing::debug!(%status, "an upstream call broke after it was sent");
            return Status::unavailable(OUTCOME_UNKNOWN);
        }
        return Status::new(code, status.message().to_string());
    }
    status
}

/// etcd's refusal, by a learner, of every call but Status and serializable Range (`ErrGRPCNotSupportedForLearner`):
/// Unavailable up to etcd 3.5, FailedPrecondition from 3.6.
pub const NOT_FOR_LEARNER: &str = "etcdserver: rpc not supported for learner";

/// Whether etcd refused the call because the member is a learner (in the words of any etcd version).
pub fn is_learner_refusal(status: &Status) -> bool {
    matches!(status.code(), Code::FailedPrecondition | Code::Unavailable)
        && status.message() == NOT_FOR_LEARNER
}

/// Whether this failure says the endpoint cannot serve (so the proxy should move to another one).
pub fn is_endpoint_failure(status: &Status) -> bool {
    match status.code() {
        Code::Unavailable => true,
        // A learner serves no write and no linearizable read, whoever asks: another member will. etcd 3.5 said so
        // with Unavailable; from 3.6 the code alone no longer tells.
        Code::FailedPrecondition => is_learner_refusal(status),
        // Statuses built by tonic from a broken connection carry their cause; statuses sent by etcd do not.
        Code::Unknown | Code::Internal | Code::Cancelled => {
            status.source().is_some_and(|s| !is_deadline(s))
        }
        _ => false,
    }
}

/// Whether etcd refused a call for want of rights: no token ("user name is empty"), a stale or invalid one, or a
/// user without the permission. etcd words each of these itself; the two InvalidArgument ones are told apart from
/// other bad arguments by their messages, which etcd has kept since 3.2.
pub fn is_auth_refusal(status: &Status) -> bool {
    match status.code() {
        Code::PermissionDenied | Code::Unauthenticated => true,
        Code::InvalidArgument => matches!(
            status.message(),
            "etcdserver: user name is empty" | "etcdserver: revision of auth store is old"
        ),
        _ => false,
    }
}

/// Whether the request provably never reached etcd: the connection it was to use could not be opened.
pub fn never_sent(status: &Status) -> bool {
    let mut source = status.source();
    while let Some(err) = source {
        if err.is::<ConnectFailed>() {
            return true;
        }
        source = err.source();
    }
    false
}

fn is_deadline(err: &(dyn std::error::Error + 'static)) -> bool {
    err.to_string().contains("Timeout expired")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_refusals_are_told_from_other_errors() {
        assert!(is_auth_refusal(&Status::permission_denied(
            "etcdserver: permission denied"
        )));
        assert!(is_auth_refusal(&Status::unauthenticated(
            "etcdserver: invalid auth token"
        )));
        assert!(is_auth_refusal(&Status::invalid_argument(
            "etcdserver: user name is empty"
        )));
        assert!(is_auth_refusal(&Status::invalid_argument(
            "etcdserver: revision of auth store is old"
        )));
        assert!(!is_auth_refusal(&Status::invalid_argument(
            "etcdserver: key is not provided"
        )));
        assert!(!is_auth_refusal(&Status::unavailable(
            "etcdserver: no leader"
        )));
    }

    #[test]
    fn tonic_size_errors_become_etcds_resource_exhausted() {
        let status = etcd_frame_error(
            Code::OutOfRange,
            "Error, decoded message length too large: found 2048 bytes, the limit is: 1024 bytes",
        )
        .unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(
            status.message(),
            "grpc: received message larger than max (2048 vs. 1024)"
        );
    }

    #[test]
    fn a_frame_cut_short_is_worded_as_etcd_words_it() {
        let status = etcd_frame_error(Code::Internal, "Unexpected EOF decoding stream.").unwrap();
        assert_eq!(
            (status.code(), status.message()),
            (Code::Unknown, "unexpected EOF")
        );
        assert!(etcd_frame_error(Code::Internal, "etcdserver: corrupt cluster").is_none());
    }

    #[test]
    fn etcds_own_out_of_range_passes_unchanged() {
        assert!(
            etcd_frame_error(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted"
            )
            .is_none()
        );
        let status = to_client(Status::out_of_range(
            "etcdserver: mvcc: required revision has been compacted",
        ));
        assert_eq!(status.code(), Code::OutOfRange);
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }

    #[test]
    fn answers_from_etcd_are_not_endpoint_failures_except_unavailable() {
        assert!(!is_endpoint_failure(&Status::invalid_argument(
            "etcdserver: key is not provided"
        )));
        assert!(!is_endpoint_failure(&Status::unknown(
            "something etcd said"
        )));
        assert!(is_endpoint_failure(&Status::unavailable(
            "etcdserver: no leader"
        )));
    }

    #[test]
    fn a_learners_refusal_is_an_endpoint_failure_in_every_versions_words() {
        let from_3_6 = Status::failed_precondition(NOT_FOR_LEARNER);
        let up_to_3_5 = Status::unavailable(NOT_FOR_LEARNER);
        for refusal in [&from_3_6, &up_to_3_5] {
            assert!(is_learner_refusal(refusal), "{refusal:?}");
            assert!(is_endpoint_failure(refusal), "{refusal:?}");
        }
        // etcd's other FailedPrecondition answers (to MemberPromote, to a feature the cluster lacks) are its answer
        // to the call, whichever member is asked.
        for other in [
            "etcdserver: can only promote a learner member",
            "etcdserver: can only promote a learner member which is in sync with leader",
            "etcdserver: not capable",
        ] {
            let status = Status::failed_precondition(other);
            assert!(!is_learner_refusal(&status), "{other}");
            assert!(!is_endpoint_failure(&status), "{other}");
        }
        assert!(!is_learner_refusal(&Status::invalid_argument(
            NOT_FOR_LEARNER
        )));
        // The client of a call not repeated (a write) gets etcd's answer unchanged.
        let seen = to_client(from_3_6);
        assert_eq!(
            (seen.code(), seen.message()),
            (Code::FailedPrecondition, NOT_FOR_LEARNER)
        );
    }

    #[test]
    fn a_broken_connection_reaches_the_client_as_unavailable() {
        let broken = Status::from_error(Box::new(std::io::Error::from(
            std::io::ErrorKind::BrokenPipe,
        )));
        assert_eq!(broken.code(), Code::Unknown, "tonic's view");
        let seen = to_client(broken);
        assert_eq!(
            (seen.code(), seen.message()),
            (Code::Unavailable, OUTCOME_UNKNOWN),
            "etcd's words for an outcome the proxy cannot know, which clientv3 matches"
        );
        assert_eq!(
            to_client(Status::unknown("an answer from etcd")).code(),
            Code::Unknown
        );
    }

    #[test]
    fn connect_failures_are_recognised_as_never_sent() {
        let connect = ConnectFailed {
            authority: "127.0.0.1:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        let status = Status::from_error(Box::new(connect));
        assert!(never_sent(&status));
        assert!(!never_sent(&Status::unavailable("etcdserver: no leader")));
    }
}
