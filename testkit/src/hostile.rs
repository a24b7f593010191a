//! Requests a hostile client sends, made without recursion (the encoder of a generated message recurses, so a
//! message deep enough to test the proxy's bounds would overflow the test's own stack).

/// A TxnRequest of `levels` Txns, each the `success` branch's only operation (`request_txn`) of the one around it;
/// the innermost Txn's only operation is `request_range` with `innermost` as its RangeRequest bytes.
/// `levels` = 1 is a Txn holding the Range alone.
pub fn nested_txn(levels: usize, innermost: &[u8]) -> Vec<u8> {
    // RequestOp.request_range = 1 and TxnRequest.success = 2, then RequestOp.request_txn = 4 for each outer level.
    nested(innermost, txn_levels(levels, 1, 2, 4))
}

/// The TxnResponse that answers [`nested_txn`]: `innermost` is the innermost RangeResponse's bytes.
pub fn nested_txn_response(levels: usize, innermost: &[u8]) -> Vec<u8> {
    // ResponseOp.response_range = 1 and TxnResponse.responses = 3, then ResponseOp.response_txn = 4.
    nested(innermost, txn_levels(levels, 1, 3, 4))
}

fn txn_levels(levels: usize, range: u32, ops: u32, txn: u32) -> impl Iterator<Item = u32> {
    [range, ops]
        .into_iter()
        .chain((1..levels).flat_map(move |_| [txn, ops]))
}

/// `innermost` wrapped in one length-delimited field per item of `fields`, from the inside out.
pub fn nested(innermost: &[u8], fields: impl IntoIterator<Item = u32>) -> Vec<u8> {
    // Built backwards: each level is a tag and a length in front of what it holds, so writing every level
    // reversed and turning the whole around once at the end costs one pass.
    let mut reversed: Vec<u8> = innermost.iter().rev().copied().collect();
    for field in fields {
        let mut head = Vec::with_capacity(11);
        put_varint(&mut head, u64::from(field) << 3 | 2);
        put_varint(&mut head, reversed.len() as u64);
        reversed.extend(head.iter().rev());
    }
    reversed.reverse();
    reversed
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nested_txn_reads_back_as_the_same_nesting() {
        use prost::Message;
        use proto::etcdserverpb::{RangeRequest, TxnRequest, request_op::Request};
        let range = RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        let mut txn = TxnRequest::decode(&nested_txn(3, &range.encode_to_vec())[..]).unwrap();
        for _ in 0..2 {
            let Some(Request::RequestTxn(inner)) = txn.success.remove(0).request else {
                panic!("a nested Txn expected");
            };
            txn = inner;
        }
        let Some(Request::RequestRange(innermost)) = txn.success.remove(0).request else {
            panic!("the Range expected innermost");
        };
        assert_eq!(innermost, range);
    }
}
