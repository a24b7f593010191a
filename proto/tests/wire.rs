//! Wire-shape checks of the etcd v3 API definitions against etcd 3.7.1.
//!
//! Three kinds of check:
//! - the descriptor set declares exactly etcd's gRPC methods (full HTTP/2 paths,
//!   request/response message names and streaming kinds), nothing more;
//! - messages encode to (and decode from) the bytes etcd puts on the wire,
//!   hand-computed from field numbers and wire types;
//! - spot checks of field numbers, types, oneofs and enum values in the descriptor.

use std::collections::BTreeSet;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, EnumDescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use proto::{authpb, etcdserverpb as pb, mvccpb, v3electionpb, v3lockpb};

// ---------------------------------------------------------------- helpers

fn fds() -> FileDescriptorSet {
    FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET).expect("descriptor set decodes")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Unary,
    ServerStream,
    ClientStream,
    Bidi,
}
use Kind::{Bidi, ServerStream, Unary};

/// Every method etcd 3.7.1 serves over gRPC: (path, request, response, kind).
/// Request and response messages live in the same package as the service.
#[rustfmt::skip]
const METHODS: &[(&str, &str, &str, Kind)] = &[
    ("/etcdserverpb.KV/Range",                  "RangeRequest",                    "RangeResponse",                    Unary),
    ("/etcdserverpb.KV/Put",                    "PutRequest",                      "PutResponse",                      Unary),
    ("/etcdserverpb.KV/DeleteRange",            "DeleteRangeRequest",              "DeleteRangeResponse",              Unary),
    ("/etcdserverpb.KV/Txn",                    "TxnRequest",                      "TxnResponse",                      Unary),
    ("/etcdserverpb.KV/Compact",                "CompactionRequest",               "CompactionResponse",               Unary),
    ("/etcdserverpb.KV/RangeStream",            "RangeRequest",                    "RangeStreamResponse",              ServerStream),
    ("/etcdserverpb.Watch/Watch",               "WatchRequest",                    "WatchResponse",                    Bidi),
    ("/etcdserverpb.Lease/LeaseGrant",          "LeaseGrantRequest",               "LeaseGrantResponse",               Unary),
    ("/etcdserverpb.Lease/LeaseRevoke",         "LeaseRevokeRequest",              "LeaseRevokeResponse",              Unary),
    ("/etcdserverpb.Lease/LeaseKeepAlive",      "LeaseKeepAliveRequest",           "LeaseKeepAliveResponse",           Bidi),
    ("/etcdserverpb.Lease/LeaseTimeToLive",     "LeaseTimeToLiveRequest",          "LeaseTimeToLiveResponse",          Unary),
    ("/etcdserverpb.Lease/LeaseLeases",         "LeaseLeasesRequest",              "LeaseLeasesResponse",              Unary),
    ("/etcdserverpb.Cluster/MemberAdd",         "MemberAddRequest",                "MemberAddResponse",                Unary),
    ("/etcdserverpb.Cluster/MemberRemove",      "MemberRemoveRequest",             "MemberRemoveResponse",             Unary),
    ("/etcdserverpb.Cluster/MemberUpdate",      "MemberUpdateRequest",             "MemberUpdateResponse",             Unary),
    ("/etcdserverpb.Cluster/MemberList",        "MemberListRequest",               "MemberListResponse",               Unary),
    ("/etcdserverpb.Cluster/MemberPromote",     "MemberPromoteRequest",            "MemberPromoteResponse",            Unary),
    ("/etcdserverpb.Maintenance/Alarm",         "AlarmRequest",                    "AlarmResponse",                    Unary),
    ("/etcdserverpb.Maintenance/Status",        "StatusRequest",                   "StatusResponse",                   Unary),
    ("/etcdserverpb.Maintenance/Defragment",    "DefragmentRequest",               "DefragmentResponse",               Unary),
    ("/etcdserverpb.Maintenance/Hash",          "HashRequest",                     "HashResponse",                     Unary),
    ("/etcdserverpb.Maintenance/HashKV",        "HashKVRequest",                   "HashKVResponse",                   Unary),
    ("/etcdserverpb.Maintenance/Snapshot",      "SnapshotRequest",                 "SnapshotResponse",                 ServerStream),
    ("/etcdserverpb.Maintenance/MoveLeader",    "MoveLeaderRequest",               "MoveLeaderResponse",               Unary),
    ("/etcdserverpb.Maintenance/Downgrade",     "DowngradeRequest",                "DowngradeResponse",                Unary),
    ("/etcdserverpb.Auth/AuthEnable",           "AuthEnableRequest",               "AuthEnableResponse",               Unary),
    ("/etcdserverpb.Auth/AuthDisable",          "AuthDisableRequest",              "AuthDisableResponse",              Unary),
    ("/etcdserverpb.Auth/AuthStatus",           "AuthStatusRequest",               "AuthStatusResponse",               Unary),
    ("/etcdserverpb.Auth/Authenticate",         "AuthenticateRequest",             "AuthenticateResponse",             Unary),
    ("/etcdserverpb.Auth/UserAdd",              "AuthUserAddRequest",              "AuthUserAddResponse",              Unary),
    ("/etcdserverpb.Auth/UserGet",              "AuthUserGetRequest",              "AuthUserGetResponse",              Unary),
    ("/etcdserverpb.Auth/UserList",             "AuthUserListRequest",             "AuthUserListResponse",             Unary),
    ("/etcdserverpb.Auth/UserDelete",           "AuthUserDeleteRequest",           "AuthUserDeleteResponse",           Unary),
    ("/etcdserverpb.Auth/UserChangePassword",   "AuthUserChangePasswordRequest",   "AuthUserChangePasswordResponse",   Unary),
    ("/etcdserverpb.Auth/UserGrantRole",        "AuthUserGrantRoleRequest",        "AuthUserGrantRoleResponse",        Unary),
    ("/etcdserverpb.Auth/UserRevokeRole",       "AuthUserRevokeRoleRequest",       "AuthUserRevokeRoleResponse",       Unary),
    ("/etcdserverpb.Auth/RoleAdd",              "AuthRoleAddRequest",              "AuthRoleAddResponse",              Unary),
    ("/etcdserverpb.Auth/RoleGet",              "AuthRoleGetRequest",              "AuthRoleGetResponse",              Unary),
    ("/etcdserverpb.Auth/RoleList",             "AuthRoleListRequest",             "AuthRoleListResponse",             Unary),
    ("/etcdserverpb.Auth/RoleDelete",           "AuthRoleDeleteRequest",           "AuthRoleDeleteResponse",           Unary),
    ("/etcdserverpb.Auth/RoleGrantPermission",  "AuthRoleGrantPermissionRequest",  "AuthRoleGrantPermissionResponse",  Unary),
    ("/etcdserverpb.Auth/RoleRevokePermission", "AuthRoleRevokePermissionRequest", "AuthRoleRevokePermissionResponse", Unary),
    ("/v3electionpb.Election/Campaign",         "CampaignRequest",                 "CampaignResponse",                 Unary),
    ("/v3electionpb.Election/Proclaim",         "ProclaimRequest",                 "ProclaimResponse",                 Unary),
    ("/v3electionpb.Election/Leader",           "LeaderRequest",                   "LeaderResponse",                   Unary),
    ("/v3electionpb.Election/Observe",          "LeaderRequest",                   "LeaderResponse",                   ServerStream),
    ("/v3electionpb.Election/Resign",           "ResignRequest",                   "ResignResponse",                   Unary),
    ("/v3lockpb.Lock/Lock",                     "LockRequest",                     "LockResponse",                     Unary),
    ("/v3lockpb.Lock/Unlock",                   "UnlockRequest",                   "UnlockResponse",                   Unary),
];

type MethodRow = (String, String, String, Kind);

fn declared_methods(set: &FileDescriptorSet) -> BTreeSet<MethodRow> {
    let mut out = BTreeSet::new();
    for file in &set.file {
        let package = file.package();
        for service in &file.service {
            for method in &service.method {
                let kind = match (method.client_streaming(), method.server_streaming()) {
                    (false, false) => Kind::Unary,
                    (false, true) => Kind::ServerStream,
                    (true, false) => Kind::ClientStream,
                    (true, true) => Kind::Bidi,
                };
                let strip = |t: &str| t.strip_prefix('.').unwrap_or(t).to_owned();
                let row = (
                    format!("/{package}.{}/{}", service.name(), method.name()),
                    strip(method.input_type()),
                    strip(method.output_type()),
                    kind,
                );
                assert!(out.insert(row.clone()), "method declared twice: {row:?}");
            }
        }
    }
    out
}

/// Finds a message by its full name (`pkg.Outer.Inner`, no leading dot).
fn message<'a>(set: &'a FileDescriptorSet, full_name: &str) -> &'a DescriptorProto {
    fn walk<'a>(
        prefix: &str,
        msgs: &'a [DescriptorProto],
        want: &str,
    ) -> Option<&'a DescriptorProto> {
        for m in msgs {
            let name = format!("{prefix}.{}", m.name());
            if name == want {
                return Some(m);
            }
            if let Some(found) = walk(&name, &m.nested_type, want) {
                return Some(found);
            }
        }
        None
    }
    set.file
        .iter()
        .find_map(|f| walk(f.package(), &f.message_type, full_name))
        .unwrap_or_else(|| panic!("message {full_name} not in descriptor set"))
}

fn field<'a>(set: &'a FileDescriptorSet, msg: &str, name: &str) -> &'a FieldDescriptorProto {
    message(set, msg)
        .field
        .iter()
        .find(|f| f.name() == name)
        .unwrap_or_else(|| panic!("{msg}.{name} not declared"))
}

/// Finds an enum by its full name (`pkg.Enum` or `pkg.Message.Enum`).
fn enumeration<'a>(set: &'a FileDescriptorSet, full_name: &str) -> &'a EnumDescriptorProto {
    let (parent, name) = full_name.rsplit_once('.').expect("qualified enum name");
    let top_level = set
        .file
        .iter()
        .filter(|f| f.package() == parent)
        .flat_map(|f| f.enum_type.iter())
        .find(|e| e.name() == name);
    if let Some(e) = top_level {
        return e;
    }
    message(set, parent)
        .enum_type
        .iter()
        .find(|e| e.name() == name)
        .unwrap_or_else(|| panic!("enum {full_name} not in descriptor set"))
}

fn enum_values(set: &FileDescriptorSet, full_name: &str) -> Vec<(String, i32)> {
    enumeration(set, full_name)
        .value
        .iter()
        .map(|v| (v.name().to_owned(), v.number()))
        .collect()
}

/// (number, type, label, oneof name) of a field.
fn shape(set: &FileDescriptorSet, msg: &str, name: &str) -> (i32, Type, Label, Option<String>) {
    let m = message(set, msg);
    let f = field(set, msg, name);
    let oneof = f.oneof_index.map(|i| {
        m.oneof_decl[usize::try_from(i).expect("index")]
            .name()
            .to_owned()
    });
    (f.number(), f.r#type(), f.label(), oneof)
}

// ---------------------------------------------------------------- (a) services and methods

#[test]
fn descriptor_declares_exactly_etcds_methods() {
    let expected: BTreeSet<MethodRow> = METHODS
        .iter()
        .map(|(path, req, resp, kind)| {
            let package = path[1..].split('.').next().expect("package part");
            (
                (*path).to_owned(),
                format!("{package}.{req}"),
                format!("{package}.{resp}"),
                *kind,
            )
        })
        .collect();
    assert_eq!(expected.len(), METHODS.len(), "table has duplicates");
    assert_eq!(METHODS.len(), 49);

    let declared = declared_methods(&fds());
    let missing: Vec<_> = expected.difference(&declared).collect();
    let extra: Vec<_> = declared.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:#?}\nextra {extra:#?}"
    );
}

#[test]
fn no_method_is_client_streaming_only() {
    // etcd has unary, server-streaming and bidi methods, but no client-only streams.
    assert!(METHODS.iter().all(|m| m.3 != Kind::ClientStream));
    assert!(
        declared_methods(&fds())
            .iter()
            .all(|m| m.3 != Kind::ClientStream)
    );
}

#[test]
fn generated_service_names_match_etcd() {
    use pb::{
        auth_server, cluster_server, kv_server, lease_server, maintenance_server, watch_server,
    };
    let names = [
        kv_server::SERVICE_NAME,
        watch_server::SERVICE_NAME,
        lease_server::SERVICE_NAME,
        cluster_server::SERVICE_NAME,
        maintenance_server::SERVICE_NAME,
        auth_server::SERVICE_NAME,
        v3electionpb::election_server::SERVICE_NAME,
        v3lockpb::lock_server::SERVICE_NAME,
    ];
    assert_eq!(
        names,
        [
            "etcdserverpb.KV",
            "etcdserverpb.Watch",
            "etcdserverpb.Lease",
            "etcdserverpb.Cluster",
            "etcdserverpb.Maintenance",
            "etcdserverpb.Auth",
            "v3electionpb.Election",
            "v3lockpb.Lock",
        ]
    );
    // Every method path in the table belongs to one of these services.
    for (path, ..) in METHODS {
        let service = path[1..].split('/').next().expect("service part");
        assert!(names.contains(&service), "{path} has unknown service");
    }
}

#[test]
fn descriptor_holds_only_our_five_files_and_no_foreign_imports() {
    let set = fds();
    let mut files: Vec<(&str, &str)> = set.file.iter().map(|f| (f.name(), f.package())).collect();
    files.sort_unstable();
    assert_eq!(
        files,
        [
            ("authpb/auth.proto", "authpb"),
            ("etcdserverpb/rpc.proto", "etcdserverpb"),
            ("mvccpb/kv.proto", "mvccpb"),
            ("v3electionpb/v3election.proto", "v3electionpb"),
            ("v3lockpb/v3lock.proto", "v3lockpb"),
        ]
    );
    for file in &set.file {
        assert_eq!(file.syntax(), "proto3", "{}", file.name());
        for dep in &file.dependency {
            assert!(
                [
                    "mvccpb/kv.proto",
                    "authpb/auth.proto",
                    "etcdserverpb/rpc.proto"
                ]
                .contains(&dep.as_str()),
                "{} imports {dep}",
                file.name()
            );
        }
        // No gogoproto / google.api options anywhere: methods and fields carry none.
        for service in &file.service {
            for method in &service.method {
                assert!(
                    method.options.is_none(),
                    "{} has method options",
                    method.name()
                );
            }
        }
    }
}

// ---------------------------------------------------------------- (b) exact bytes

#[test]
fn range_request_bytes() {
    let req = pb::RangeRequest {
        key: b"foo".to_vec(),
        range_end: b"fop".to_vec(),
        limit: 10,
        revision: 5,
        sort_order: pb::range_request::SortOrder::Descend as i32,
        sort_target: pb::range_request::SortTarget::Mod as i32,
        serializable: true,
        keys_only: false,
        count_only: true,
        min_mod_revision: 300,
        max_mod_revision: 0,
        min_create_revision: 0,
        max_create_revision: 1,
    };
    let expected: &[u8] = &[
        0x0a, 0x03, b'f', b'o', b'o', // 1 key (LEN)
        0x12, 0x03, b'f', b'o', b'p', // 2 range_end (LEN)
        0x18, 0x0a, // 3 limit = 10
        0x20, 0x05, // 4 revision = 5
        0x28, 0x02, // 5 sort_order = DESCEND
        0x30, 0x03, // 6 sort_target = MOD
        0x38, 0x01, // 7 serializable
        0x48, 0x01, // 9 count_only (8 keys_only is default, omitted)
        0x50, 0xac, 0x02, // 10 min_mod_revision = 300
        0x68, 0x01, // 13 max_create_revision = 1
    ];
    assert_eq!(req.encode_to_vec(), expected);
    assert_eq!(pb::RangeRequest::decode(expected).expect("decodes"), req);
}

#[test]
fn put_request_bytes() {
    let req = pb::PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 0x1234,
        prev_kv: true,
        ignore_value: false,
        ignore_lease: true,
    };
    let expected: &[u8] = &[
        0x0a, 0x01, b'k', // 1 key
        0x12, 0x01, b'v', // 2 value
        0x18, 0xb4, 0x24, // 3 lease = 4660
        0x20, 0x01, // 4 prev_kv
        0x30, 0x01, // 6 ignore_lease
    ];
    assert_eq!(req.encode_to_vec(), expected);
}

#[test]
fn negative_int64_uses_ten_byte_varint() {
    // int64 (not sint64): -1 is sign-extended to 64 bits, as Go's encoder does.
    let req = pb::RangeRequest {
        revision: -1,
        ..Default::default()
    };
    let mut expected = vec![0x20];
    expected.extend_from_slice(&[0xff; 9]);
    expected.push(0x01);
    assert_eq!(req.encode_to_vec(), expected);
}

#[test]
fn watch_create_request_bytes() {
    let req = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: b"a".to_vec(),
                range_end: b"b".to_vec(),
                start_revision: 7,
                progress_notify: true,
                filters: vec![pb::watch_create_request::FilterType::Nodelete as i32],
                prev_kv: true,
                watch_id: 3,
                fragment: true,
            },
        )),
    };
    let expected: &[u8] = &[
        0x0a, 0x13, // 1 create_request, 19 bytes
        0x0a, 0x01, b'a', // 1 key
        0x12, 0x01, b'b', // 2 range_end
        0x18, 0x07, // 3 start_revision
        0x20, 0x01, // 4 progress_notify
        0x2a, 0x01, 0x01, // 5 filters, packed: [NODELETE]
        0x30, 0x01, // 6 prev_kv
        0x38, 0x03, // 7 watch_id
        0x40, 0x01, // 8 fragment
    ];
    assert_eq!(req.encode_to_vec(), expected);
    assert_eq!(pb::WatchRequest::decode(expected).expect("decodes"), req);
}

#[test]
fn watch_cancel_and_progress_requests_bytes() {
    let cancel = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CancelRequest(
            pb::WatchCancelRequest { watch_id: 5 },
        )),
    };
    assert_eq!(cancel.encode_to_vec(), [0x12, 0x02, 0x08, 0x05]);
    // An empty oneof member is still present on the wire: tag + zero length.
    let progress = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::ProgressRequest(
            pb::WatchProgressRequest {},
        )),
    };
    assert_eq!(progress.encode_to_vec(), [0x1a, 0x00]);
}

#[test]
fn watch_response_decodes_etcd_bytes() {
    let bytes: &[u8] = &[
        0x0a, 0x02, 0x18, 0x09, // 1 header { 3 revision = 9 }
        0x10, 0x02, // 2 watch_id = 2
        0x32, 0x00, // 6 cancel_reason = "" (explicit empty string is accepted)
        0x5a, 0x09, // 11 events, 9 bytes
        0x08, 0x01, // Event.type = DELETE
        0x12, 0x05, // Event.kv, 5 bytes
        0x0a, 0x01, b'a', // KeyValue.key
        0x18, 0x09, // KeyValue.mod_revision = 9
    ];
    let resp = pb::WatchResponse::decode(bytes).expect("decodes");
    assert_eq!(resp.header.as_ref().map(|h| h.revision), Some(9));
    assert_eq!(resp.watch_id, 2);
    assert!(!resp.created && !resp.canceled && !resp.fragment);
    assert_eq!(resp.events.len(), 1);
    let ev = &resp.events[0];
    assert_eq!(ev.r#type(), mvccpb::event::EventType::Delete);
    let kv = ev.kv.as_ref().expect("kv");
    assert_eq!((kv.key.as_ref(), kv.mod_revision), (&b"a"[..], 9));
    assert!(ev.prev_kv.is_none());
}

#[test]
fn compare_lease_and_range_end_bytes() {
    let cmp = pb::Compare {
        result: pb::compare::CompareResult::NotEqual as i32,
        target: pb::compare::CompareTarget::Lease as i32,
        key: b"k".to_vec(),
        target_union: Some(pb::compare::TargetUnion::Lease(9)),
        range_end: b"z".to_vec(),
    };
    let expected: &[u8] = &[
        0x08, 0x03, // 1 result = NOT_EQUAL
        0x10, 0x04, // 2 target = LEASE
        0x1a, 0x01, b'k', // 3 key
        0x40, 0x09, // 8 lease (target_union)
        0x82, 0x04, 0x01, b'z', // 64 range_end: tag (64 << 3 | 2) = 514 = 0x82 0x04
    ];
    assert_eq!(cmp.encode_to_vec(), expected);
    // A oneof member set to its default value is still written.
    let zero = pb::Compare {
        target_union: Some(pb::compare::TargetUnion::Version(0)),
        ..Default::default()
    };
    assert_eq!(zero.encode_to_vec(), [0x20, 0x00]);
}

#[test]
fn txn_request_bytes() {
    let txn = pb::TxnRequest {
        compare: vec![pb::Compare {
            key: b"k".to_vec(),
            target_union: Some(pb::compare::TargetUnion::Value(b"v".to_vec())),
            target: pb::compare::CompareTarget::Value as i32,
            ..Default::default()
        }],
        success: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                key: b"k".to_vec(),
                value: b"w".to_vec(),
                ..Default::default()
            })),
        }],
        failure: vec![pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(pb::RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })),
        }],
    };
    let expected: &[u8] = &[
        0x0a, 0x08, // 1 compare, 8 bytes
        0x10, 0x03, // target = VALUE
        0x1a, 0x01, b'k', // key
        0x3a, 0x01, b'v', // 7 value
        0x12, 0x08, // 2 success, 8 bytes
        0x12, 0x06, // RequestOp 2 request_put, 6 bytes
        0x0a, 0x01, b'k', 0x12, 0x01, b'w', //
        0x1a, 0x05, // 3 failure, 5 bytes
        0x0a, 0x03, // RequestOp 1 request_range, 3 bytes
        0x0a, 0x01, b'k',
    ];
    assert_eq!(txn.encode_to_vec(), expected);
}

#[test]
fn lease_and_status_camel_case_fields_bytes() {
    let ka = pb::LeaseKeepAliveResponse {
        header: None,
        id: 7,
        ttl: 60,
    };
    assert_eq!(ka.encode_to_vec(), [0x10, 0x07, 0x18, 0x3c]);

    let ttl = pb::LeaseTimeToLiveResponse {
        header: None,
        id: 1,
        ttl: 2,
        granted_ttl: 3,
        keys: vec![b"x".to_vec()],
    };
    assert_eq!(
        ttl.encode_to_vec(),
        [0x10, 0x01, 0x18, 0x02, 0x20, 0x03, 0x2a, 0x01, b'x']
    );

    let status = pb::StatusResponse {
        version: "3.5.0".to_owned(),
        db_size: 1,
        raft_applied_index: 2,
        errors: vec!["e".to_owned()],
        db_size_in_use: 3,
        is_learner: true,
        ..Default::default()
    };
    let expected: &[u8] = &[
        0x12, 0x05, b'3', b'.', b'5', b'.', b'0', // 2 version
        0x18, 0x01, // 3 dbSize
        0x38, 0x02, // 7 raftAppliedIndex
        0x42, 0x01, b'e', // 8 errors
        0x48, 0x03, // 9 dbSizeInUse
        0x50, 0x01, // 10 isLearner
    ];
    assert_eq!(status.encode_to_vec(), expected);

    // etcd 3.6's fields: 11 storageVersion, 12 dbSizeQuota, 13 downgradeInfo.
    let status = pb::StatusResponse {
        storage_version: "3.6.0".to_owned(),
        db_size_quota: 2,
        downgrade_info: Some(pb::DowngradeInfo {
            enabled: true,
            target_version: "3.5".to_owned(),
        }),
        ..Default::default()
    };
    let expected: &[u8] = &[
        0x5a, 0x05, b'3', b'.', b'6', b'.', b'0', // 11 storageVersion
        0x60, 0x02, // 12 dbSizeQuota
        0x6a, 0x07, 0x08, 0x01, 0x12, 0x03, b'3', b'.',
        b'5', // 13 downgradeInfo {1 enabled, 2 targetVersion}
    ];
    assert_eq!(status.encode_to_vec(), expected);
}

#[test]
fn etcd_3_6_maintenance_and_3_7_range_stream_bytes() {
    let hash = pb::HashKvResponse {
        hash_revision: 5,
        ..Default::default()
    };
    assert_eq!(hash.encode_to_vec(), [0x20, 0x05]);
    let snapshot = pb::SnapshotResponse {
        version: "3.6.0".to_owned(),
        ..Default::default()
    };
    assert_eq!(
        snapshot.encode_to_vec(),
        [0x22, 0x05, b'3', b'.', b'6', b'.', b'0']
    );
    let chunk = pb::RangeStreamResponse {
        range_response: Some(pb::RangeResponse {
            more: true,
            count: 3,
            ..Default::default()
        }),
    };
    // 1 range_response { 3 more, 4 count }
    assert_eq!(chunk.encode_to_vec(), [0x0a, 0x04, 0x18, 0x01, 0x20, 0x03]);
}

#[test]
fn concurrency_api_bytes() {
    let lock = v3lockpb::LockRequest {
        name: b"n".to_vec(),
        lease: 5,
    };
    assert_eq!(lock.encode_to_vec(), [0x0a, 0x01, b'n', 0x10, 0x05]);

    let proclaim = v3electionpb::ProclaimRequest {
        leader: Some(v3electionpb::LeaderKey {
            name: b"e".to_vec(),
            key: b"e/1".to_vec(),
            rev: 4,
            lease: 5,
        }),
        value: b"v".to_vec(),
    };
    let expected: &[u8] = &[
        0x0a, 0x0c, // 1 leader, 12 bytes
        0x0a, 0x01, b'e', // name
        0x12, 0x03, b'e', b'/', b'1', // key
        0x18, 0x04, // rev
        0x20, 0x05, // lease
        0x12, 0x01, b'v', // 2 value
    ];
    assert_eq!(proclaim.encode_to_vec(), expected);
}

#[test]
fn auth_messages_bytes() {
    let grant = pb::AuthRoleGrantPermissionRequest {
        name: "r".to_owned(),
        perm: Some(authpb::Permission {
            perm_type: authpb::permission::Type::Readwrite as i32,
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
        }),
    };
    let expected: &[u8] = &[
        0x0a, 0x01, b'r', // 1 name
        0x12, 0x08, // 2 perm, 8 bytes
        0x08, 0x02, // permType = READWRITE
        0x12, 0x01, b'a', 0x1a, 0x01, b'b',
    ];
    assert_eq!(grant.encode_to_vec(), expected);

    let status = pb::AuthStatusResponse {
        header: None,
        enabled: true,
        auth_revision: 300,
    };
    assert_eq!(status.encode_to_vec(), [0x10, 0x01, 0x18, 0xac, 0x02]);
}

// ---------------------------------------------------------------- (c) descriptor spot checks

/// (message, field, number, type, label, oneof).
type FieldCase<'a> = (&'a str, &'a str, i32, Type, Label, Option<&'a str>);

#[test]
fn field_number_spot_checks() {
    let set = fds();
    #[rustfmt::skip]
    let cases: &[FieldCase<'_>] = &[
        ("etcdserverpb.ResponseHeader",                "raft_term",           4,    Type::Uint64,    Label::Optional,   None),
        ("etcdserverpb.ResponseHeader",                "revision",            3,    Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.RangeRequest",                  "serializable",        7,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.RangeRequest",                  "sort_target",         6,    Type::Enum,      Label::Optional,   None),
        ("etcdserverpb.RangeRequest",                  "max_create_revision", 13,   Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.RangeResponse",                 "kvs",                 2,    Type::Message,   Label::Repeated,   None),
        ("etcdserverpb.PutRequest",                    "ignore_lease",        6,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.DeleteRangeResponse",           "prev_kvs",            3,    Type::Message,   Label::Repeated,   None),
        ("etcdserverpb.RequestOp",                     "request_txn",         4,    Type::Message,   Label::Optional,   Some("request")),
        ("etcdserverpb.ResponseOp",                    "response_range",      1,    Type::Message,   Label::Optional,   Some("response")),
        ("etcdserverpb.Compare",                       "lease",               8,    Type::Int64,     Label::Optional,   Some("target_union")),
        ("etcdserverpb.Compare",                       "value",               7,    Type::Bytes,     Label::Optional,   Some("target_union")),
        ("etcdserverpb.Compare",                       "range_end",           64,   Type::Bytes,     Label::Optional,   None),
        ("etcdserverpb.CompactionRequest",             "physical",            2,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.WatchRequest",                  "progress_request",    3,    Type::Message,   Label::Optional,   Some("request_union")),
        ("etcdserverpb.WatchCreateRequest",            "fragment",            8,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.WatchCreateRequest",            "filters",             5,    Type::Enum,      Label::Repeated,   None),
        ("etcdserverpb.WatchResponse",                 "events",              11,   Type::Message,   Label::Repeated,   None),
        ("etcdserverpb.WatchResponse",                 "cancel_reason",       6,    Type::String,    Label::Optional,   None),
        ("etcdserverpb.WatchResponse",                 "fragment",            7,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.LeaseGrantResponse",            "error",               4,    Type::String,    Label::Optional,   None),
        ("etcdserverpb.LeaseCheckpoint",               "remaining_TTL",       2,    Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.LeaseTimeToLiveResponse",       "grantedTTL",          4,    Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.Member",                        "isLearner",           5,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.Member",                        "clientURLs",          4,    Type::String,    Label::Repeated,   None),
        ("etcdserverpb.MemberListRequest",             "linearizable",        1,    Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.StatusResponse",                "isLearner",           10,   Type::Bool,      Label::Optional,   None),
        ("etcdserverpb.StatusResponse",                "dbSizeInUse",         9,    Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.StatusResponse",                "raftAppliedIndex",    7,    Type::Uint64,    Label::Optional,   None),
        ("etcdserverpb.HashKVResponse",                "compact_revision",    3,    Type::Int64,     Label::Optional,   None),
        ("etcdserverpb.AlarmRequest",                  "memberID",            2,    Type::Uint64,    Label::Optional,   None),
        ("etcdserverpb.MoveLeaderRequest",             "targetID",            1,    Type::Uint64,    Label::Optional,   None),
        ("etcdserverpb.AuthStatusResponse",            "authRevision",        3,    Type::Uint64,    Label::Optional,   None),
        ("etcdserverpb.AuthUserAddRequest",            "hashedPassword",      4,    Type::String,    Label::Optional,   None),
        ("etcdserverpb.AuthUserChangePasswordRequest", "hashedPassword",      3,    Type::String,    Label::Optional,   None),
        ("etcdserverpb.AuthUserGrantRoleRequest",      "user",                1,    Type::String,    Label::Optional,   None),
        ("mvccpb.KeyValue",                            "lease",               6,    Type::Int64,     Label::Optional,   None),
        ("mvccpb.Event",                               "prev_kv",             3,    Type::Message,   Label::Optional,   None),
        ("authpb.Permission",                          "permType",            1,    Type::Enum,      Label::Optional,   None),
        ("authpb.Role",                                "keyPermission",       2,    Type::Message,   Label::Repeated,   None),
        ("authpb.User",                                "options",             4,    Type::Message,   Label::Optional,   None),
        ("v3electionpb.LeaderKey",                     "rev",                 3,    Type::Int64,     Label::Optional,   None),
        ("v3lockpb.LockResponse",                      "key",                 2,    Type::Bytes,     Label::Optional,   None),
    ];
    for &(msg, name, number, ty, label, oneof) in cases {
        let got = shape(&set, msg, name);
        let want = (number, ty, label, oneof.map(str::to_owned));
        assert_eq!(got, want, "{msg}.{name}");
    }
}

#[test]
fn cross_package_field_types() {
    let set = fds();
    #[rustfmt::skip]
    let cases = [
        ("etcdserverpb.RangeResponse",       "kvs",     ".mvccpb.KeyValue"),
        ("etcdserverpb.WatchResponse",       "events",  ".mvccpb.Event"),
        ("etcdserverpb.AuthUserAddRequest",  "options", ".authpb.UserAddOptions"),
        ("etcdserverpb.AuthRoleGetResponse", "perm",    ".authpb.Permission"),
        ("etcdserverpb.AlarmMember",         "alarm",   ".etcdserverpb.AlarmType"),
        ("v3electionpb.LeaderResponse",      "kv",      ".mvccpb.KeyValue"),
        ("v3electionpb.CampaignResponse",    "header",  ".etcdserverpb.ResponseHeader"),
        ("v3lockpb.UnlockResponse",          "header",  ".etcdserverpb.ResponseHeader"),
        ("etcdserverpb.WatchCreateRequest",  "filters", ".etcdserverpb.WatchCreateRequest.FilterType"),
    ];
    for (msg, name, ty) in cases {
        assert_eq!(field(&set, msg, name).type_name(), ty, "{msg}.{name}");
    }
}

#[test]
fn enum_values_match_etcd() {
    let set = fds();
    let owned = |v: &[(&str, i32)]| -> Vec<(String, i32)> {
        v.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect()
    };
    let cases: &[(&str, &[(&str, i32)])] = &[
        ("mvccpb.Event.EventType", &[("PUT", 0), ("DELETE", 1)]),
        (
            "authpb.Permission.Type",
            &[("READ", 0), ("WRITE", 1), ("READWRITE", 2)],
        ),
        (
            "etcdserverpb.RangeRequest.SortOrder",
            &[("NONE", 0), ("ASCEND", 1), ("DESCEND", 2)],
        ),
        (
            "etcdserverpb.RangeRequest.SortTarget",
            &[
                ("KEY", 0),
                ("VERSION", 1),
                ("CREATE", 2),
                ("MOD", 3),
                ("VALUE", 4),
            ],
        ),
        (
            "etcdserverpb.Compare.CompareResult",
            &[("EQUAL", 0), ("GREATER", 1), ("LESS", 2), ("NOT_EQUAL", 3)],
        ),
        (
            "etcdserverpb.Compare.CompareTarget",
            &[
                ("VERSION", 0),
                ("CREATE", 1),
                ("MOD", 2),
                ("VALUE", 3),
                ("LEASE", 4),
            ],
        ),
        (
            "etcdserverpb.WatchCreateRequest.FilterType",
            &[("NOPUT", 0), ("NODELETE", 1)],
        ),
        (
            "etcdserverpb.AlarmType",
            &[("NONE", 0), ("NOSPACE", 1), ("CORRUPT", 2)],
        ),
        (
            "etcdserverpb.AlarmRequest.AlarmAction",
            &[("GET", 0), ("ACTIVATE", 1), ("DEACTIVATE", 2)],
        ),
        (
            "etcdserverpb.DowngradeRequest.DowngradeAction",
            &[("VALIDATE", 0), ("ENABLE", 1), ("CANCEL", 2)],
        ),
    ];
    for (name, values) in cases {
        assert_eq!(enum_values(&set, name), owned(values), "{name}");
    }
}

#[test]
fn messages_have_exactly_the_3_7_field_sets() {
    // Whole field lists for messages whose shape changed across etcd versions:
    // 3.6 added SnapshotResponse.version, HashKVResponse.hash_revision, three
    // StatusResponse fields and DowngradeInfo; 3.7 added RangeStreamResponse.
    let set = fds();
    let numbers = |msg: &str| -> Vec<(String, i32)> {
        message(&set, msg)
            .field
            .iter()
            .map(|f| (f.name().to_owned(), f.number()))
            .collect()
    };
    let owned = |v: &[(&str, i32)]| -> Vec<(String, i32)> {
        v.iter().map(|(n, i)| ((*n).to_owned(), *i)).collect()
    };
    let cases: &[(&str, &[(&str, i32)])] = &[
        (
            "etcdserverpb.SnapshotResponse",
            &[
                ("header", 1),
                ("remaining_bytes", 2),
                ("blob", 3),
                ("version", 4),
            ],
        ),
        (
            "etcdserverpb.HashKVResponse",
            &[
                ("header", 1),
                ("hash", 2),
                ("compact_revision", 3),
                ("hash_revision", 4),
            ],
        ),
        (
            "etcdserverpb.StatusResponse",
            &[
                ("header", 1),
                ("version", 2),
                ("dbSize", 3),
                ("leader", 4),
                ("raftIndex", 5),
                ("raftTerm", 6),
                ("raftAppliedIndex", 7),
                ("errors", 8),
                ("dbSizeInUse", 9),
                ("isLearner", 10),
                ("storageVersion", 11),
                ("dbSizeQuota", 12),
                ("downgradeInfo", 13),
            ],
        ),
        (
            "etcdserverpb.DowngradeInfo",
            &[("enabled", 1), ("targetVersion", 2)],
        ),
        ("etcdserverpb.RangeStreamResponse", &[("range_response", 1)]),
        ("etcdserverpb.DowngradeVersionTestRequest", &[("ver", 1)]),
        (
            "etcdserverpb.WatchCreateRequest",
            &[
                ("key", 1),
                ("range_end", 2),
                ("start_revision", 3),
                ("progress_notify", 4),
                ("filters", 5),
                ("prev_kv", 6),
                ("watch_id", 7),
                ("fragment", 8),
            ],
        ),
        (
            "etcdserverpb.WatchResponse",
            &[
                ("header", 1),
                ("watch_id", 2),
                ("created", 3),
                ("canceled", 4),
                ("compact_revision", 5),
                ("cancel_reason", 6),
                ("fragment", 7),
                ("events", 11),
            ],
        ),
        (
            "etcdserverpb.LeaseGrantResponse",
            &[("header", 1), ("ID", 2), ("TTL", 3), ("error", 4)],
        ),
        (
            "mvccpb.KeyValue",
            &[
                ("key", 1),
                ("create_revision", 2),
                ("mod_revision", 3),
                ("version", 4),
                ("value", 5),
                ("lease", 6),
            ],
        ),
    ];
    for (msg, fields) in cases {
        assert_eq!(numbers(msg), owned(fields), "{msg}");
    }
}

#[test]
fn lease_checkpoint_messages_exist() {
    let set = fds();
    assert_eq!(
        shape(&set, "etcdserverpb.LeaseCheckpointRequest", "checkpoints").0,
        1
    );
    assert_eq!(
        shape(&set, "etcdserverpb.LeaseCheckpointResponse", "header").0,
        1
    );
}
