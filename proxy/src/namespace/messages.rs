//! Which fields of etcd's messages hold keys (field numbers from `proto/`), and which messages of which methods
//! are rewritten. Watch is rewritten on its typed messages (see [`super::Namespace::watch_create`]).
//!
//! Not rewritten: revisions, compaction, leases' IDs, members, maintenance, users and roles' names. Snapshot sends
//! the whole database: it is not namespaced (nor is it in etcd's Go proxy).

use super::rewrite::{Empty, Field, Foreign, Schema};

/// etcd's (3.5 on) words for a permission on an empty key (`ErrGRPCInvalidAuthMgmt`). etcd 3.4 grants one,
/// on every key below the range end: the proxy refuses it there too, which keeps it inside the namespace.
const INVALID_AUTH_MGMT: &str = "etcdserver: invalid auth management";

/// A key of KV: left empty for etcd to refuse; must be in the namespace in an answer.
const KV_KEY: Field = Field::Key {
    empty: Empty::Keep,
    foreign: Foreign::Refuse,
};
/// A key or name of the Lock and Election services, which etcd takes empty.
const NAME: Field = Field::Key {
    empty: Empty::Prefix,
    foreign: Foreign::Refuse,
};
const END: Field = Field::RangeEnd {
    foreign: Foreign::Refuse,
};

// etcdserverpb requests.
static RANGE_OR_DELETE_REQUEST: Schema = Schema {
    fields: &[(1, KV_KEY), (2, END)],
};
static PUT_REQUEST: Schema = Schema {
    fields: &[(1, KV_KEY)],
};
static COMPARE: Schema = Schema {
    fields: &[(3, KV_KEY), (64, END)],
};
static REQUEST_OP: Schema = Schema {
    fields: &[
        (1, Field::Message(&RANGE_OR_DELETE_REQUEST)),
        (2, Field::Message(&PUT_REQUEST)),
        (3, Field::Message(&RANGE_OR_DELETE_REQUEST)),
        (4, Field::Message(&TXN_REQUEST)),
    ],
};
static TXN_REQUEST: Schema = Schema {
    fields: &[
        (1, Field::Message(&COMPARE)),
        (2, Field::Message(&REQUEST_OP)),
        (3, Field::Message(&REQUEST_OP)),
    ],
};

// etcdserverpb answers.
static KEY_VALUE: Schema = Schema {
    fields: &[(1, KV_KEY)],
};
static RANGE_RESPONSE: Schema = Schema {
    fields: &[(2, Field::Message(&KEY_VALUE))],
};
static PUT_RESPONSE: Schema = Schema {
    fields: &[(2, Field::Message(&KEY_VALUE))],
};
static DELETE_RANGE_RESPONSE: Schema = Schema {
    fields: &[(3, Field::Message(&KEY_VALUE))],
};
static RESPONSE_OP: Schema = Schema {
    fields: &[
        (1, Field::Message(&RANGE_RESPONSE)),
        (2, Field::Message(&PUT_RESPONSE)),
        (3, Field::Message(&DELETE_RANGE_RESPONSE)),
        (4, Field::Message(&TXN_RESPONSE)),
    ],
};
static TXN_RESPONSE: Schema = Schema {
    fields: &[(3, Field::Message(&RESPONSE_OP))],
};
static RANGE_STREAM_RESPONSE: Schema = Schema {
    fields: &[(1, Field::Message(&RANGE_RESPONSE))],
};
/// A lease's keys: etcd lists every key attached, wherever it is; a client sees those in its namespace.
static LEASE_TIME_TO_LIVE_RESPONSE: Schema = Schema {
    fields: &[(
        5,
        Field::Key {
            empty: Empty::Prefix,
            foreign: Foreign::DropKey,
        },
    )],
};

// Auth: role permissions are on keys, so they are namespaced too (etcd's Go proxy leaves them alone, which makes a
// namespaced client's grants cover keys outside its namespace).
static PERMISSION: Schema = Schema {
    fields: &[
        (
            2,
            Field::Key {
                empty: Empty::Refuse(INVALID_AUTH_MGMT),
                foreign: Foreign::DropMessage,
            },
        ),
        (
            3,
            Field::RangeEnd {
                foreign: Foreign::DropMessage,
            },
        ),
    ],
};
static ROLE_GRANT_PERMISSION_REQUEST: Schema = Schema {
    fields: &[(2, Field::Message(&PERMISSION))],
};
static ROLE_REVOKE_PERMISSION_REQUEST: Schema = Schema {
    fields: &[(2, NAME), (3, END)],
};
static ROLE_GET_RESPONSE: Schema = Schema {
    fields: &[(2, Field::Message(&PERMISSION))],
};

// v3lockpb and v3electionpb.
/// LockRequest's name, UnlockRequest's key, CampaignRequest's and LeaderRequest's name.
static NAME_FIRST: Schema = Schema {
    fields: &[(1, NAME)],
};
/// LockResponse's key.
static LOCK_RESPONSE: Schema = Schema {
    fields: &[(2, NAME)],
};
static LEADER_KEY: Schema = Schema {
    fields: &[(1, NAME), (2, NAME)],
};
static WITH_LEADER_KEY_FIRST: Schema = Schema {
    fields: &[(1, Field::Message(&LEADER_KEY))],
};
static WITH_LEADER_KEY_SECOND: Schema = Schema {
    fields: &[(2, Field::Message(&LEADER_KEY))],
};
/// LeaderResponse: the leader's key-value.
static LEADER_RESPONSE: Schema = Schema {
    fields: &[(2, Field::Message(&KEY_VALUE))],
};

/// The schemas of one method's request and answer; `None` where the message has no key.
#[derive(Clone, Copy)]
pub struct Method {
    pub request: Option<&'static Schema>,
    pub answer: Option<&'static Schema>,
}

/// The keys of the method at `path`, or `None` when neither its request nor its answer holds one.
pub fn of(path: &str) -> Option<Method> {
    let both = |request, answer| Some((Some(request), Some(answer)));
    let (request, answer) = match path {
        "/etcdserverpb.KV/Range" | "/etcdserverpb.KV/RangeStream" => {
            let answer = if path.ends_with("Stream") {
                &RANGE_STREAM_RESPONSE
            } else {
                &RANGE_RESPONSE
            };
            both(&RANGE_OR_DELETE_REQUEST, answer)?
        }
        "/etcdserverpb.KV/Put" => both(&PUT_REQUEST, &PUT_RESPONSE)?,
        "/etcdserverpb.KV/DeleteRange" => both(&RANGE_OR_DELETE_REQUEST, &DELETE_RANGE_RESPONSE)?,
        "/etcdserverpb.KV/Txn" => both(&TXN_REQUEST, &TXN_RESPONSE)?,
        "/etcdserverpb.Lease/LeaseTimeToLive" => (None, Some(&LEASE_TIME_TO_LIVE_RESPONSE)),
        "/etcdserverpb.Auth/RoleGrantPermission" => (Some(&ROLE_GRANT_PERMISSION_REQUEST), None),
        "/etcdserverpb.Auth/RoleRevokePermission" => (Some(&ROLE_REVOKE_PERMISSION_REQUEST), None),
        "/etcdserverpb.Auth/RoleGet" => (None, Some(&ROLE_GET_RESPONSE)),
        "/v3lockpb.Lock/Lock" => both(&NAME_FIRST, &LOCK_RESPONSE)?,
        "/v3lockpb.Lock/Unlock" => (Some(&NAME_FIRST), None),
        "/v3electionpb.Election/Campaign" => both(&NAME_FIRST, &WITH_LEADER_KEY_SECOND)?,
        "/v3electionpb.Election/Proclaim" | "/v3electionpb.Election/Resign" => {
            (Some(&WITH_LEADER_KEY_FIRST), None)
        }
        "/v3electionpb.Election/Leader" | "/v3electionpb.Election/Observe" => {
            both(&NAME_FIRST, &LEADER_RESPONSE)?
        }
        _ => return None,
    };
    Some(Method { request, answer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::namespace::Namespace;
    use crate::namespace::rewrite::Direction::{self, Answer, Request};
    use bytes::Bytes;
    use prost::Message;
    use proto::authpb::Permission;
    use proto::etcdserverpb::{
        AuthRoleGetResponse, AuthRoleGrantPermissionRequest, Compare, LeaseTimeToLiveResponse,
        PutRequest, RangeRequest, RangeResponse, RequestOp, ResponseOp, TxnRequest, TxnResponse,
        compare, request_op, response_op,
    };
    use proto::mvccpb::KeyValue;
    use proto::v3electionpb::{CampaignResponse, LeaderKey, ProclaimRequest};
    use proto::v3lockpb::LockRequest;
    use tonic::Code;

    fn ns() -> Namespace {
        Namespace::new(b"/app/").unwrap()
    }

    fn rewrite<M: Message + Default>(
        path: &str,
        direction: Direction,
        message: &M,
    ) -> Result<M, tonic::Status> {
        let method = of(path).expect("a method with keys");
        let schema = match direction {
            Request => method.request,
            Answer => method.answer,
        }
        .expect("a schema for this direction");
        let bytes = ns().rewrite(schema, direction, &message.encode_to_vec())?;
        Ok(M::decode(bytes).expect("the rewritten message decodes"))
    }

    fn kv(key: &[u8]) -> KeyValue {
        KeyValue {
            key: Bytes::copy_from_slice(key),
            value: Bytes::from_static(b"v"),
            ..Default::default()
        }
    }

    #[test]
    fn range_keys_and_ends_get_the_prefix_and_other_fields_stay_as_they_came() {
        let range = RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            limit: 5,
            ..Default::default()
        };
        let rewritten = rewrite("/etcdserverpb.KV/Range", Request, &range).unwrap();
        assert_eq!(rewritten.key, b"/app/a");
        assert_eq!(rewritten.range_end, b"/app0");
        assert_eq!(rewritten.limit, 5);
        let single = RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        };
        assert_eq!(
            rewrite("/etcdserverpb.KV/Range", Request, &single)
                .unwrap()
                .range_end,
            b""
        );

        // Field 99 (a varint), unknown to etcd 3.7, is copied byte for byte after the rewritten key.
        let mut bytes = single.encode_to_vec();
        bytes.extend_from_slice(&[0x98, 0x06, 0x2a]);
        let schema = of("/etcdserverpb.KV/Range").unwrap().request.unwrap();
        let rewritten = ns().rewrite(schema, Request, &bytes).unwrap();
        assert_eq!(&rewritten[..], b"\x0a\x06/app/a\x98\x06\x2a");
    }

    #[test]
    fn an_empty_kv_key_stays_empty_for_etcd_to_refuse_in_its_own_order() {
        // etcd checks a Txn's operations in order: here it answers "value is provided" for the first, which a
        // refusal of the second's empty key by the proxy would hide.
        let txn = TxnRequest {
            success: vec![
                RequestOp {
                    request: Some(request_op::Request::RequestPut(PutRequest {
                        key: b"a".to_vec(),
                        value: b"v".to_vec(),
                        ignore_value: true,
                        ..Default::default()
                    })),
                },
                RequestOp {
                    request: Some(request_op::Request::RequestRange(RangeRequest {
                        range_end: vec![0],
                        ..Default::default()
                    })),
                },
            ],
            compare: vec![Compare::default()],
            ..Default::default()
        };
        let sent = rewrite("/etcdserverpb.KV/Txn", Request, &txn).unwrap();
        assert_eq!(sent.compare[0].key, b"");
        let Some(request_op::Request::RequestPut(put)) = &sent.success[0].request else {
            panic!()
        };
        assert_eq!(put.key, b"/app/a");
        let Some(request_op::Request::RequestRange(range)) = &sent.success[1].request else {
            panic!()
        };
        assert_eq!(
            (&range.key[..], &range.range_end[..]),
            (&b""[..], &b"/app0"[..])
        );
        let schema = of("/etcdserverpb.KV/Put").unwrap().request.unwrap();
        let empty = ns()
            .rewrite(schema, Request, &PutRequest::default().encode_to_vec())
            .unwrap();
        assert!(empty.is_empty(), "an absent key stays absent");
    }

    #[test]
    fn a_txn_or_answer_nested_deeper_than_the_bound_is_refused_without_overflow() {
        let range = RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        }
        .encode_to_vec();
        let answer = RangeResponse {
            kvs: vec![kv(b"/app/k")],
            ..Default::default()
        }
        .encode_to_vec();
        let txn = of("/etcdserverpb.KV/Txn").unwrap();
        let (request_schema, answer_schema) = (txn.request.unwrap(), txn.answer.unwrap());
        // A Txn 255 levels deep, the deepest read, on a stack smaller than a runtime thread's (2 MiB), in debug.
        let (deepest_request, deepest_answer) = (
            testkit::hostile::nested_txn(255, &range),
            testkit::hostile::nested_txn_response(255, &answer),
        );
        let (sent, answered) = std::thread::Builder::new()
            .stack_size(1024 * 1024)
            .spawn(move || {
                (
                    ns().rewrite(request_schema, Request, &deepest_request),
                    ns().rewrite(answer_schema, Answer, &deepest_answer),
                )
            })
            .unwrap()
            .join()
            .expect("no stack overflow at the bound");
        let sent = sent.unwrap();
        assert!(
            sent.windows(6).any(|w| w == b"/app/k"),
            "the innermost key got the prefix"
        );
        assert!(
            !answered.unwrap().windows(5).any(|w| w == b"/app/"),
            "and lost it"
        );
        for levels in [256, 100_000] {
            let refused = ns()
                .rewrite(
                    request_schema,
                    Request,
                    &testkit::hostile::nested_txn(levels, &range),
                )
                .unwrap_err();
            assert_eq!(
                (refused.code(), refused.message()),
                (
                    tonic::Code::InvalidArgument,
                    "etcdserver: too many operations in txn request"
                ),
                "{levels}"
            );
            let refused = ns()
                .rewrite(
                    answer_schema,
                    Answer,
                    &testkit::hostile::nested_txn_response(levels, &answer),
                )
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Internal, "{levels}");
        }
    }

    #[test]
    fn every_key_of_a_txn_and_its_answer_is_rewritten_at_every_depth() {
        let op = |request| RequestOp {
            request: Some(request),
        };
        let txn = TxnRequest {
            compare: vec![Compare {
                key: b"c".to_vec(),
                range_end: vec![0],
                target: compare::CompareTarget::Value as i32,
                ..Default::default()
            }],
            success: vec![op(request_op::Request::RequestTxn(TxnRequest {
                success: vec![
                    op(request_op::Request::RequestPut(PutRequest {
                        key: b"p".to_vec(),
                        ..Default::default()
                    })),
                    op(request_op::Request::RequestDeleteRange(
                        proto::etcdserverpb::DeleteRangeRequest {
                            key: b"d".to_vec(),
                            range_end: b"e".to_vec(),
                            ..Default::default()
                        },
                    )),
                ],
                ..Default::default()
            }))],
            failure: vec![op(request_op::Request::RequestRange(RangeRequest {
                key: b"r".to_vec(),
                ..Default::default()
            }))],
        };
        let rewritten = rewrite("/etcdserverpb.KV/Txn", Request, &txn).unwrap();
        assert_eq!(rewritten.compare[0].key, b"/app/c");
        assert_eq!(rewritten.compare[0].range_end, b"/app0");
        let Some(request_op::Request::RequestTxn(nested)) = &rewritten.success[0].request else {
            panic!("the nested txn stays a txn");
        };
        let Some(request_op::Request::RequestPut(put)) = &nested.success[0].request else {
            panic!()
        };
        assert_eq!(put.key, b"/app/p");
        let Some(request_op::Request::RequestDeleteRange(delete)) = &nested.success[1].request
        else {
            panic!()
        };
        assert_eq!(
            (&delete.key[..], &delete.range_end[..]),
            (&b"/app/d"[..], &b"/app/e"[..])
        );
        let Some(request_op::Request::RequestRange(range)) = &rewritten.failure[0].request else {
            panic!()
        };
        assert_eq!(range.key, b"/app/r");

        let answer = TxnResponse {
            succeeded: true,
            responses: vec![ResponseOp {
                response: Some(response_op::Response::ResponseTxn(TxnResponse {
                    responses: vec![ResponseOp {
                        response: Some(response_op::Response::ResponseRange(RangeResponse {
                            kvs: vec![kv(b"/app/x"), kv(b"/app/")],
                            count: 2,
                            ..Default::default()
                        })),
                    }],
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let rewritten = rewrite("/etcdserverpb.KV/Txn", Answer, &answer).unwrap();
        let Some(response_op::Response::ResponseTxn(nested)) = &rewritten.responses[0].response
        else {
            panic!()
        };
        let Some(response_op::Response::ResponseRange(range)) = &nested.responses[0].response
        else {
            panic!()
        };
        let keys: Vec<_> = range.kvs.iter().map(|kv| kv.key.clone()).collect();
        assert_eq!(keys, [&b"x"[..], &b""[..]]);
        assert_eq!((range.count, rewritten.succeeded), (2, true));
    }

    #[test]
    fn a_foreign_key_in_an_answer_is_an_internal_error_not_an_answer() {
        let answer = RangeResponse {
            kvs: vec![kv(b"/app/a"), kv(b"/other/b")],
            ..Default::default()
        };
        let status = rewrite("/etcdserverpb.KV/Range", Answer, &answer).unwrap_err();
        assert_eq!(status.code(), Code::Internal);
        assert!(
            !status.message().contains("other"),
            "the foreign key is logged, not sent"
        );
    }

    #[test]
    fn lists_etcd_keeps_cluster_wide_show_only_the_namespace_part() {
        let lease = LeaseTimeToLiveResponse {
            id: 7,
            keys: vec![b"/app/a".to_vec(), b"/other/b".to_vec(), b"/app/c".to_vec()],
            ..Default::default()
        };
        let rewritten = rewrite("/etcdserverpb.Lease/LeaseTimeToLive", Answer, &lease).unwrap();
        assert_eq!(rewritten.keys, [b"a".to_vec(), b"c".to_vec()]);
        assert_eq!(rewritten.id, 7);

        let perm = |key: &[u8], range_end: &[u8]| Permission {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            perm_type: 1,
        };
        let role = AuthRoleGetResponse {
            perm: vec![
                perm(b"/app/a", b""),
                perm(b"/other", b""),
                perm(b"/app/p", b"/app0"),
                perm(b"/app/q", b"/app/r"),
            ],
            ..Default::default()
        };
        let rewritten = rewrite("/etcdserverpb.Auth/RoleGet", Answer, &role).unwrap();
        assert_eq!(
            rewritten.perm,
            [perm(b"a", b""), perm(b"p", &[0]), perm(b"q", b"r")]
        );

        let grant = AuthRoleGrantPermissionRequest {
            name: "r".into(),
            perm: Some(perm(b"k", &[0])),
        };
        let rewritten = rewrite("/etcdserverpb.Auth/RoleGrantPermission", Request, &grant).unwrap();
        assert_eq!(rewritten.perm, Some(perm(b"/app/k", b"/app0")));
        let empty = AuthRoleGrantPermissionRequest {
            name: "r".into(),
            perm: Some(perm(b"", &[0])),
        };
        let status =
            rewrite("/etcdserverpb.Auth/RoleGrantPermission", Request, &empty).unwrap_err();
        assert_eq!(status.message(), "etcdserver: invalid auth management");
    }

    #[test]
    fn lock_and_election_names_and_keys_live_under_the_prefix() {
        let lock = rewrite(
            "/v3lockpb.Lock/Lock",
            Request,
            &LockRequest {
                name: vec![],
                lease: 9,
            },
        )
        .unwrap();
        assert_eq!(
            (lock.name, lock.lease),
            (b"/app/".to_vec(), 9),
            "an empty name is etcd's to take"
        );
        let leader = LeaderKey {
            name: b"/app/e".to_vec(),
            key: b"/app/e/694d".to_vec(),
            rev: 3,
            lease: 4,
        };
        let campaign = CampaignResponse {
            header: None,
            leader: Some(leader.clone()),
        };
        let answered = rewrite("/v3electionpb.Election/Campaign", Answer, &campaign).unwrap();
        let client_leader = answered.leader.unwrap();
        assert_eq!(
            (&client_leader.name[..], &client_leader.key[..]),
            (&b"e"[..], &b"e/694d"[..])
        );
        let proclaim = ProclaimRequest {
            leader: Some(client_leader),
            value: b"v".to_vec(),
        };
        let sent = rewrite("/v3electionpb.Election/Proclaim", Request, &proclaim).unwrap();
        assert_eq!(sent.leader, Some(leader));
    }

    #[test]
    fn bytes_that_are_not_a_message_are_refused_not_forwarded() {
        let schema = of("/etcdserverpb.KV/Put").unwrap().request.unwrap();
        for bytes in [&[0x0a, 0x05, b'a'][..], &[0x08, 0x01], &[0x0b]] {
            let status = ns().rewrite(schema, Request, bytes).unwrap_err();
            assert_eq!(status.code(), Code::Internal, "{bytes:?}");
        }
        assert!(of("/etcdserverpb.KV/Compact").is_none());
        assert!(of("/etcdserverpb.Maintenance/Snapshot").is_none());
    }
}
