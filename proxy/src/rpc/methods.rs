//! Every method of etcd 3.7.1's gRPC API, by path, and how the proxy serves it.
//!
//! Most methods are relayed as bytes; what the proxy needs to know about a call (may it be repeated on another
//! endpoint?) is read from the path, and for two methods from one or two fields of the request.

use tonic::Status;

use crate::upstream::Retry;
use crate::wire::{self, Value};

/// How the proxy serves one method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// One request, one response, both relayed as bytes.
    Unary(Repeat),
    /// KV Range: answered from the range cache when it can, else relayed as a read.
    Range,
    /// One request, a stream of responses, relayed as bytes (Snapshot, Observe). Opened like a read.
    ServerStream,
    /// Relayed to an etcd that serves it (3.7 on), served by the proxy from Range where etcd does not.
    RangeStream,
    /// Coalesced onto shared upstream watchers.
    Watch,
    /// Coalesced onto one upstream keep-alive stream.
    LeaseKeepAlive,
    /// Answered by the proxy with `--advertise-client-url` ([`crate::cluster::members`]), else relayed as a read.
    MemberList,
    /// A write only etcd's leader serves (MoveLeader), relayed to the leader's endpoint.
    OnLeader,
}

/// Whether a unary call may be repeated on another endpoint, by method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    Read,
    Write,
    /// A read when every operation of every branch (nested Txns included) is a Range.
    Txn,
    /// A read when its action is GET (0, also when absent).
    Alarm,
}

impl Repeat {
    /// The retry policy of this call, given its request bytes. Bytes the proxy cannot read are treated as a
    /// write (never repeated) and relayed for etcd to judge; a Txn nested deeper than [`wire::MAX_DEPTH`] gets
    /// etcd's own refusal of a Txn nested too deep.
    pub fn retry(self, request: &[u8]) -> Result<Retry, Status> {
        let read = match self {
            Repeat::Read => true,
            Repeat::Write => false,
            Repeat::Txn => txn_is_read_only(request, 0)
                .map_err(|wire::TooDeep| crate::error::txn_too_deep())?,
            Repeat::Alarm => alarm_is_get(request),
        };
        Ok(if read { Retry::ReadOnly } else { Retry::Write })
    }
}

/// The route of a gRPC path, or `None` for a method etcd does not have.
pub fn route(path: &str) -> Option<Route> {
    use Repeat::{Read, Write};
    use Route::{ServerStream, Unary};
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    Some(match (service, method) {
        ("etcdserverpb.KV", "Range") => Route::Range,
        ("etcdserverpb.KV", "Put" | "DeleteRange" | "Compact") => Unary(Write),
        ("etcdserverpb.KV", "Txn") => Unary(Repeat::Txn),
        ("etcdserverpb.KV", "RangeStream") => Route::RangeStream,
        ("etcdserverpb.Watch", "Watch") => Route::Watch,
        ("etcdserverpb.Lease", "LeaseKeepAlive") => Route::LeaseKeepAlive,
        ("etcdserverpb.Lease", "LeaseGrant" | "LeaseRevoke") => Unary(Write),
        ("etcdserverpb.Lease", "LeaseTimeToLive" | "LeaseLeases") => Unary(Read),
        ("etcdserverpb.Cluster", "MemberList") => Route::MemberList,
        (
            "etcdserverpb.Cluster",
            "MemberAdd" | "MemberRemove" | "MemberUpdate" | "MemberPromote",
        ) => Unary(Write),
        ("etcdserverpb.Maintenance", "Alarm") => Unary(Repeat::Alarm),
        ("etcdserverpb.Maintenance", "Status" | "Hash" | "HashKV") => Unary(Read),
        ("etcdserverpb.Maintenance", "Defragment" | "Downgrade") => Unary(Write),
        ("etcdserverpb.Maintenance", "MoveLeader") => Route::OnLeader,
        ("etcdserverpb.Maintenance", "Snapshot") => ServerStream,
        ("etcdserverpb.Auth", "AuthStatus" | "UserGet" | "UserList" | "RoleGet" | "RoleList") => {
            Unary(Read)
        }
        // Never repeated once sent: each attempt costs etcd a bcrypt comparison and may issue a token.
        ("etcdserverpb.Auth", "Authenticate") => Unary(Write),
        (
            "etcdserverpb.Auth",
            "AuthEnable"
            | "AuthDisable"
            | "UserAdd"
            | "UserDelete"
            | "UserChangePassword"
            | "UserGrantRole"
            | "UserRevokeRole"
            | "RoleAdd"
            | "RoleDelete"
            | "RoleGrantPermission"
            | "RoleRevokePermission",
        ) => Unary(Write),
        ("v3electionpb.Election", "Campaign" | "Proclaim" | "Resign") => Unary(Write),
        ("v3electionpb.Election", "Leader") => Unary(Read),
        ("v3electionpb.Election", "Observe") => ServerStream,
        ("v3lockpb.Lock", "Lock" | "Unlock") => Unary(Write),
        _ => return None,
    })
}

/// etcd's (grpc-go's) answer to a path it does not serve.
pub fn unknown(path: &str) -> Status {
    const SERVICES: [&str; 8] = [
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
        "etcdserverpb.Cluster",
        "etcdserverpb.Maintenance",
        "etcdserverpb.Auth",
        "v3electionpb.Election",
        "v3lockpb.Lock",
    ];
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    match trimmed.split_once('/') {
        Some((service, method)) if SERVICES.contains(&service) => {
            Status::unimplemented(format!("unknown method {method} for service {service}"))
        }
        Some((service, _)) => Status::unimplemented(format!("unknown service {service}")),
        None => Status::unimplemented(format!("malformed method name: {path:?}")),
    }
}

/// TxnRequest: `success` = 2 and `failure` = 3, each a RequestOp whose oneof is `request_range` = 1,
/// `request_put` = 2, `request_delete_range` = 3 or `request_txn` = 4.
/// `depth` is how many messages deep `txn` lies in the request.
fn txn_is_read_only(txn: &[u8], depth: usize) -> Result<bool, wire::TooDeep> {
    if depth >= wire::MAX_DEPTH {
        return Err(wire::TooDeep);
    }
    for field in wire::fields(txn) {
        let read = match field {
            Ok((2 | 3, Value::Bytes(op))) => op_is_read(op, depth + 1)?,
            Ok((2 | 3, _)) | Err(_) => false,
            Ok(_) => true,
        };
        if !read {
            return Ok(false);
        }
    }
    Ok(true)
}

fn op_is_read(op: &[u8], depth: usize) -> Result<bool, wire::TooDeep> {
    for field in wire::fields(op) {
        let read = match field {
            // The operation's own message is one level deeper, and must be within the bound too.
            Ok((1 | 4, _)) if depth + 1 >= wire::MAX_DEPTH => return Err(wire::TooDeep),
            Ok((1, _)) => true,
            Ok((4, Value::Bytes(nested))) => txn_is_read_only(nested, depth + 1)?,
            // A put, a delete, or an operation this proxy does not know: not repeated.
            _ => false,
        };
        if !read {
            return Ok(false);
        }
    }
    Ok(true)
}

/// AlarmRequest: `action` = 1, GET = 0.
fn alarm_is_get(request: &[u8]) -> bool {
    wire::fields(request).all(|field| match field {
        Ok((1, Value::Varint(action))) => action == 0,
        Ok((1, _)) | Err(_) => false,
        Ok(_) => true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::etcdserverpb::{
        AlarmRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, alarm_request, request_op,
    };

    fn op(request: request_op::Request) -> RequestOp {
        RequestOp {
            request: Some(request),
        }
    }

    fn retry_of(txn: &TxnRequest) -> Retry {
        Repeat::Txn.retry(&txn.encode_to_vec()).unwrap()
    }

    #[test]
    fn txns_with_a_write_anywhere_are_writes() {
        let read = op(request_op::Request::RequestRange(RangeRequest::default()));
        let write = op(request_op::Request::RequestPut(PutRequest::default()));
        let reads_only = TxnRequest {
            success: vec![read.clone()],
            failure: vec![read.clone(), RequestOp::default()],
            ..Default::default()
        };
        assert_eq!(retry_of(&reads_only), Retry::ReadOnly);
        let write_in_failure = TxnRequest {
            success: vec![read.clone()],
            failure: vec![write.clone()],
            ..Default::default()
        };
        assert_eq!(retry_of(&write_in_failure), Retry::Write);
        let nested_write = TxnRequest {
            success: vec![op(request_op::Request::RequestTxn(TxnRequest {
                success: vec![read, write],
                ..Default::default()
            }))],
            ..Default::default()
        };
        assert_eq!(retry_of(&nested_write), Retry::Write);
    }

    #[test]
    fn unreadable_or_unknown_operations_are_never_repeated() {
        // A RequestOp with field 5, which etcd 3.7 does not have.
        let unknown_op = [0x12, 0x02, 0x2a, 0x00];
        assert_eq!(Repeat::Txn.retry(&unknown_op).unwrap(), Retry::Write);
        assert_eq!(
            Repeat::Txn.retry(&[0x12, 0x09]).unwrap(),
            Retry::Write,
            "truncated"
        );
        assert_eq!(
            Repeat::Txn.retry(&[]).unwrap(),
            Retry::ReadOnly,
            "an empty Txn"
        );
    }

    #[test]
    fn a_txn_nested_deeper_than_the_bound_gets_etcds_refusal_and_no_overflow() {
        let range = RangeRequest::default().encode_to_vec();
        // A Txn 255 levels deep (its innermost Range 510 messages deep) is read; one level more is refused.
        let deepest_read = testkit::hostile::nested_txn(255, &range);
        // On a small stack: the bound must hold well inside what a runtime thread has (2 MiB), in a debug build.
        let decided = std::thread::Builder::new()
            .stack_size(1024 * 1024)
            .spawn(move || Repeat::Txn.retry(&deepest_read).unwrap())
            .unwrap()
            .join()
            .expect("no stack overflow at the bound");
        assert_eq!(decided, Retry::ReadOnly);
        for levels in [256, 100_000] {
            let refused = Repeat::Txn
                .retry(&testkit::hostile::nested_txn(levels, &range))
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{levels}");
            assert_eq!(
                refused.message(),
                "etcdserver: too many operations in txn request"
            );
        }
    }

    #[test]
    fn only_alarm_gets_are_reads() {
        let get = AlarmRequest::default().encode_to_vec();
        assert_eq!(Repeat::Alarm.retry(&get).unwrap(), Retry::ReadOnly);
        let activate = AlarmRequest {
            action: alarm_request::AlarmAction::Activate as i32,
            member_id: 1,
            alarm: 1,
        };
        assert_eq!(
            Repeat::Alarm.retry(&activate.encode_to_vec()).unwrap(),
            Retry::Write
        );
    }

    #[test]
    fn every_method_of_etcd_has_a_route_and_others_get_grpc_gos_answer() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut count = 0;
        for file in &set.file {
            for service in &file.service {
                for method in &service.method {
                    let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                    assert!(route(&path).is_some(), "{path} has no route");
                    count += 1;
                }
            }
        }
        assert_eq!(count, 49, "etcd 3.7.1 has 49 gRPC methods");
        assert_eq!(
            unknown("/etcdserverpb.KV/Scan").message(),
            "unknown method Scan for service etcdserverpb.KV"
        );
        assert_eq!(unknown("/foo.Bar/Baz").message(), "unknown service foo.Bar");
        assert!(route("/etcdserverpb.KV/Scan").is_none());
        assert_eq!(
            route("/etcdserverpb.Auth/Authenticate"),
            Some(Route::Unary(Repeat::Write)),
            "each Authenticate costs etcd a bcrypt: never repeated once sent"
        );
    }
}
