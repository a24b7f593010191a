//! What a client or an operator can hand the proxy, arbitrary: request bytes, gRPC paths, RangeStream requests,
//! endpoints and command lines. Every decoder and parser answers without panicking, and where the proxy decides
//! from a request's bytes, it decides as the decoded message says (a reference model over arbitrary messages).
//!
//! Each property runs `FUZZ_CASES` cases (default 256) from a fixed seed, so a CI failure reproduces; `ci/fuzz.sh
//! SECONDS` runs them again and again with new seeds for as long as it is given, and a failure prints its seed.

use proptest::prelude::*;

use prost::Message;
use proto::etcdserverpb::{
    AlarmRequest, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest, request_op,
};
use proxy::config::Endpoint;
use proxy::rpc::methods::{self, Repeat};
use proxy::rpc::range_stream;
use proxy::upstream::Retry;
use proxy::wire;

/// Arbitrary-input properties run 256 cases by default.
fn check<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    testkit::fuzz::check(256, strategy, test);
}

#[test]
fn the_wire_reader_reads_any_bytes_and_stops_at_the_first_error() {
    check(prop::collection::vec(any::<u8>(), 0..256), |bytes| {
        let read: Vec<_> = wire::fields(&bytes).collect();
        let errors = read.iter().filter(|r| r.is_err()).count();
        prop_assert!(errors <= 1);
        if errors == 1 {
            prop_assert!(read.last().unwrap().is_err(), "nothing after the error");
        }
        for repeat in [Repeat::Read, Repeat::Write, Repeat::Txn, Repeat::Alarm] {
            let _ = repeat.retry(&bytes);
        }
        Ok(())
    });
}

/// The decision the proxy used to make from the decoded Txn: a read when every op of every branch is a Range
/// (nested Txns included; an empty op counts as a read).
fn reference_txn_is_read(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| match &op.request {
            Some(request_op::Request::RequestRange(_)) | None => true,
            Some(request_op::Request::RequestTxn(nested)) => reference_txn_is_read(nested),
            Some(_) => false,
        })
}

fn ops() -> impl Strategy<Value = RequestOp> {
    let leaf = prop_oneof![
        Just(None),
        any::<Vec<u8>>().prop_map(|key| Some(request_op::Request::RequestRange(RangeRequest {
            key,
            ..Default::default()
        }))),
        any::<Vec<u8>>().prop_map(|key| Some(request_op::Request::RequestPut(PutRequest {
            key,
            ..Default::default()
        }))),
        any::<Vec<u8>>().prop_map(|key| Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key,
                ..Default::default()
            }
        ))),
    ]
    .prop_map(|request| RequestOp { request });
    leaf.prop_recursive(3, 24, 4, |inner| {
        (
            prop::collection::vec(inner.clone(), 0..4),
            prop::collection::vec(inner, 0..4),
        )
            .prop_map(|(success, failure)| RequestOp {
                request: Some(request_op::Request::RequestTxn(TxnRequest {
                    success,
                    failure,
                    ..Default::default()
                })),
            })
    })
}

#[test]
fn a_txn_is_repeated_exactly_when_its_decoded_form_only_reads() {
    let txns = (
        prop::collection::vec(ops(), 0..5),
        prop::collection::vec(ops(), 0..5),
    )
        .prop_map(|(success, failure)| TxnRequest {
            success,
            failure,
            ..Default::default()
        });
    check(txns, |txn| {
        let expected = if reference_txn_is_read(&txn) {
            Retry::ReadOnly
        } else {
            Retry::Write
        };
        prop_assert_eq!(Repeat::Txn.retry(&txn.encode_to_vec()).ok(), Some(expected));
        Ok(())
    });
}

#[test]
fn an_alarm_is_repeated_exactly_when_it_only_lists() {
    check(
        (0i32..4, any::<u64>(), 0i32..3),
        |(action, member_id, alarm)| {
            let request = AlarmRequest {
                action,
                member_id,
                alarm,
            };
            let expected = if action == 0 {
                Retry::ReadOnly
            } else {
                Retry::Write
            };
            prop_assert_eq!(
                Repeat::Alarm.retry(&request.encode_to_vec()).ok(),
                Some(expected)
            );
            Ok(())
        },
    );
}

#[test]
fn any_path_gets_a_route_or_grpc_gos_answer() {
    check(any::<String>(), |path| {
        if methods::route(&path).is_none() {
            let status = methods::unknown(&path);
            prop_assert_eq!(status.code(), tonic::Code::Unimplemented);
        }
        Ok(())
    });
}

#[test]
fn range_stream_requests_are_refused_exactly_when_etcd_3_7_would_refuse_them() {
    let requests = (
        prop::collection::vec(any::<u8>(), 0..3),
        -1i32..4,
        -1i32..6,
        prop_oneof![Just(0i64), any::<i64>()],
        prop_oneof![Just(0i64), any::<i64>()],
    )
        .prop_map(
            |(key, sort_order, sort_target, min_mod, max_create)| RangeRequest {
                key,
                sort_order,
                sort_target,
                min_mod_revision: min_mod,
                max_create_revision: max_create,
                ..Default::default()
            },
        );
    check(requests, |request| {
        let valid_sort =
            (0..=2).contains(&request.sort_order) && (0..=4).contains(&request.sort_target);
        let key_order =
            request.sort_order == 0 || (request.sort_target == 0 && request.sort_order == 1);
        let filtered = request.min_mod_revision != 0 || request.max_create_revision != 0;
        let accepted = !request.key.is_empty() && valid_sort && key_order && !filtered;
        prop_assert_eq!(range_stream::check(&request).is_ok(), accepted);
        Ok(())
    });
}

#[test]
fn an_accepted_endpoint_is_one_the_proxy_can_dial() {
    let endpoints = prop_oneof![
        any::<String>(),
        "[a-z0-9%@ :\\[\\]._/-]{0,20}",
        "(http://)?[a-z0-9.%@ \\[\\]-]{1,8}:[1-9][0-9]{0,4}",
    ];
    check(endpoints, |raw| {
        if let Ok(endpoint) = Endpoint::parse(&raw) {
            let uri = format!("http://{}", endpoint.authority());
            prop_assert!(
                uri.parse::<http::Uri>().is_ok(),
                "{:?} was accepted as {:?}, which is no URI",
                raw,
                uri
            );
        }
        Ok(())
    });
}

#[test]
fn any_command_line_parses_or_is_refused_with_a_message() {
    let flag = prop_oneof![
        Just("--endpoints"),
        Just("--listen-addr"),
        Just("--max-send-bytes"),
        Just("--max-recv-bytes"),
        Just("--dial-timeout"),
        Just("--grpc-keepalive-interval"),
        Just("--watch-buffer-size"),
        Just("--worker-threads"),
        Just("--user"),
        Just("--namespace"),
        Just("--unknown-flag"),
    ];
    let args = prop::collection::vec((flag, any::<String>()), 0..4);
    check(args, |args| {
        let mut line = vec!["etcd-grpc-proxy".to_owned(), "start".to_owned()];
        line.extend(args.iter().map(|(flag, value)| format!("{flag}={value}")));
        if let Err(err) = proxy::cli::parse(line.clone(), || 1) {
            prop_assert!(!err.to_string().is_empty(), "{:?}", line);
        }
        Ok(())
    });
}
