//! The protobuf wire reader (`proxy::wire`): `fields`, `fields_with_bytes` and `put_bytes` on arbitrary bytes, and
//! on the length-delimited values inside them, as the proxy reads nested messages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxy::fuzzing::{Value, fields, fields_with_bytes, put_bytes};

fuzz_target!(|data: &[u8]| check(data, 0));

/// Checks one message, and every length-delimited value in it as a message of its own, a few levels deep.
fn check(message: &[u8], depth: usize) {
    let plain: Vec<_> = fields(message).collect();
    let with_bytes: Vec<_> = fields_with_bytes(message).collect();
    assert_eq!(
        plain.len(),
        with_bytes.len(),
        "both readers see as many fields"
    );
    if let Some(at) = plain.iter().position(Result::is_err) {
        assert_eq!(at, plain.len() - 1, "an error is the last item");
    }
    let mut iter = fields(message);
    while let Some(field) = iter.next() {
        if field.is_err() {
            assert!(iter.next().is_none(), "the reader stops after an error");
        }
    }
    let mut read = Vec::new();
    for (field, written) in plain.iter().zip(&with_bytes) {
        match (field, written) {
            (Ok((number, value)), Ok((number_too, value_too, bytes))) => {
                assert_eq!((number, value), (number_too, value_too));
                assert_ne!(*number, 0, "field 0 does not exist");
                read.extend_from_slice(bytes);
                let alone: Vec<_> = fields(bytes).collect();
                assert_eq!(
                    alone,
                    [Ok((*number, *value))],
                    "a field's bytes read back as it"
                );
                if let Value::Bytes(payload) = value {
                    assert!(bytes.ends_with(payload));
                    let mut out = Vec::new();
                    put_bytes(&mut out, *number, payload);
                    assert!(
                        out.len() <= bytes.len(),
                        "put_bytes writes the shortest form"
                    );
                    let again: Vec<_> = fields(&out).collect();
                    assert_eq!(again, [Ok((*number, Value::Bytes(payload)))]);
                    if depth < 4 {
                        check(payload, depth + 1);
                    }
                }
            }
            (Err(_), Err(_)) => {}
            _ => panic!("fields and fields_with_bytes disagree: {field:?} / {written:?}"),
        }
    }
    assert!(
        message.starts_with(&read),
        "the fields' bytes are the message's, in order"
    );
    if plain.last().is_none_or(Result::is_ok) {
        assert_eq!(
            read.len(),
            message.len(),
            "a well-formed message is read to its end"
        );
    }
}
