//! RangeStream's checks (`rpc/range_stream.rs`): the request, decoded as the proxy decodes it, through `check`
//! (what etcd 3.7 refuses before reading), and the chunk limit arithmetic on arbitrary numbers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::etcdserverpb::{RangeRequest, range_request};
use proxy::fuzzing::{next_chunk_limit, range_stream_check};
use tonic::Code;

fuzz_target!(|data: &[u8]| {
    if let Ok(range) = RangeRequest::decode(data) {
        match range_stream_check(&range) {
            Ok(()) => {
                assert!(!range.key.is_empty());
                let order = range_request::SortOrder::try_from(range.sort_order).unwrap();
                let target = range_request::SortTarget::try_from(range.sort_target).unwrap();
                assert!(
                    order == range_request::SortOrder::None
                        || (order == range_request::SortOrder::Ascend
                            && target == range_request::SortTarget::Key)
                );
                assert_eq!(
                    (
                        range.min_mod_revision,
                        range.max_mod_revision,
                        range.min_create_revision,
                        range.max_create_revision
                    ),
                    (0, 0, 0, 0)
                );
            }
            Err(status) => {
                assert!(matches!(
                    status.code(),
                    Code::InvalidArgument | Code::Unimplemented
                ));
                assert!(!status.message().is_empty());
            }
        }
        // The proxy relays the bytes it got; a re-encoded request is judged alike.
        let again = RangeRequest::decode(range.encode_to_vec().as_slice()).unwrap();
        assert_eq!(
            range_stream_check(&again).map_err(|s| (s.code(), s.message().to_owned())),
            range_stream_check(&range).map_err(|s| (s.code(), s.message().to_owned()))
        );
    }
    if let Some(numbers) = data.get(..24) {
        let word = |i: usize| u64::from_le_bytes(numbers[i * 8..i * 8 + 8].try_into().unwrap());
        let last_limit = word(0) as i64;
        let (last_size, target) = (word(1) as usize, word(2) as usize);
        let limit = next_chunk_limit(last_limit, last_size, target);
        assert!(limit >= 1, "a limit of 0 would mean no limit");
        let kept = [last_limit.saturating_mul(2), last_limit, last_limit / 2];
        assert!(
            kept.iter().any(|&k| k.max(1) == limit),
            "{limit} from {last_limit}"
        );
    }
});
