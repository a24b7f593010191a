//! The decisions taken from request bytes in `rpc/methods.rs`: whether a Txn only reads and whether an Alarm call
//! only lists (both decide whether a call may be repeated on another endpoint). A read must never be a write:
//! whenever the proxy says "read" and prost can decode the request, the decoded request must read only.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::etcdserverpb::{AlarmRequest, TxnRequest, request_op};
use proxy::fuzzing::{Repeat, alarm_is_get, repeat_is_read, txn_is_read_only};

fuzz_target!(|data: &[u8]| {
    if txn_is_read_only(data)
        && let Ok(txn) = TxnRequest::decode(data)
    {
        assert!(
            reads_only(&txn),
            "a Txn with a write was taken for a read: {txn:?}"
        );
    }
    if alarm_is_get(data)
        && let Ok(alarm) = AlarmRequest::decode(data)
    {
        assert_eq!(
            alarm.action, 0,
            "an Alarm call that is not GET was taken for a read"
        );
    }
    assert!(repeat_is_read(Repeat::Read, data));
    assert!(!repeat_is_read(Repeat::Write, data));
});

fn reads_only(txn: &TxnRequest) -> bool {
    txn.success
        .iter()
        .chain(&txn.failure)
        .all(|op| match &op.request {
            None | Some(request_op::Request::RequestRange(_)) => true,
            Some(request_op::Request::RequestTxn(nested)) => reads_only(nested),
            Some(_) => false,
        })
}
