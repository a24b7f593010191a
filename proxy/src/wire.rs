//! Reads the protobuf wire format just far enough for the proxy's decisions (is this Txn read-only?) and edits
//! (the keys `--namespace` rewrites), without decoding a message into a struct: a message is a sequence of
//! (field number, value) pairs, and a field the proxy does not look at is skipped over, or copied as it came.

/// How many messages deep any reader in the proxy follows messages inside messages. Every function that descends
/// into nested messages counts its depth and stops here, so no bytes, from a client or from etcd, can make the proxy
/// recurse without bound (a 100,000-deep Txn once overflowed its stack). Each level of a Txn is two messages (a
/// TxnRequest and its RequestOp), so a Txn 255 levels deep fits, its innermost Range 510 messages deep: twice what
/// etcd itself accepts at its default `--max-txn-ops` of 128, since etcd takes each level's operations from the
/// count its outer Txn leaves.
pub const MAX_DEPTH: usize = 512;

/// A message nests deeper than [`MAX_DEPTH`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooDeep;

/// One field's value, by wire type. Nested messages, strings and bytes are all `Bytes` (wire type 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// The bytes are not a protobuf message: a truncated field, an overlong varint, a group or an unknown wire type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The fields of one message, in the order they were written.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

/// The fields of one message with the bytes each was written as (tag included), to copy the ones an edit leaves.
pub fn fields_with_bytes(
    message: &[u8],
) -> impl Iterator<Item = Result<(u32, Value<'_>, &[u8]), Malformed>> {
    let mut fields = fields(message);
    std::iter::from_fn(move || {
        let before = fields.rest;
        let field = fields.next()?;
        let written = &before[..before.len() - fields.rest.len()];
        Some(field.map(|(number, value)| (number, value, written)))
    })
}

/// Appends a length-delimited field (bytes, a string or a nested message).
pub fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, u64::from(number) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// See [`fields`]. Yields one `Err` and then stops when the bytes are malformed.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let field = self.read_field();
        if field.is_err() {
            self.rest = &[];
        }
        Some(field)
    }
}

impl<'a> Fields<'a> {
    fn read_field(&mut self) -> Result<(u32, Value<'a>), Malformed> {
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed)?;
        if number == 0 {
            return Err(Malformed);
        }
        let value = match key & 0b111 {
            0 => Value::Varint(self.varint()?),
            1 => Value::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| Malformed)?,
            )),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Malformed)?;
                Value::Bytes(self.take(len)?)
            }
            5 => Value::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().map_err(|_| Malformed)?,
            )),
            // 3 and 4 are proto2 groups, which etcd's proto3 messages never use; 6 and 7 do not exist.
            _ => return Err(Malformed),
        };
        Ok((number, value))
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for (i, &byte) in self.rest.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Ok(value);
            }
        }
        Err(Malformed)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], Malformed> {
        if len > self.rest.len() {
            return Err(Malformed);
        }
        let (taken, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::etcdserverpb::{PutRequest, RangeRequest};

    #[test]
    fn fields_are_read_in_order_with_their_values() {
        let put = PutRequest {
            key: b"k".to_vec(),
            lease: 300,
            prev_kv: true,
            ..Default::default()
        };
        let bytes = put.encode_to_vec();
        let read: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            read,
            vec![
                (1, Value::Bytes(b"k")),
                (3, Value::Varint(300)),
                (4, Value::Varint(1)),
            ]
        );
    }

    #[test]
    fn negative_numbers_and_fixed_widths_are_read() {
        let range = RangeRequest {
            key: b"a".to_vec(),
            revision: -1,
            ..Default::default()
        };
        let bytes = range.encode_to_vec();
        let read: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read[1], (4, Value::Varint(u64::MAX)));
        // 9 (fixed64) and 10 (fixed32) by hand: field 15, wire type 1; field 16, wire type 5.
        let bytes = [0x79, 1, 0, 0, 0, 0, 0, 0, 0, 0x85, 0x01, 2, 0, 0, 0];
        let read: Vec<_> = fields(&bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(read, vec![(15, Value::Fixed64(1)), (16, Value::Fixed32(2))]);
    }

    #[test]
    fn fields_come_with_their_bytes_and_written_fields_read_back() {
        let put = PutRequest {
            key: vec![b'k'; 200],
            lease: 300,
            ..Default::default()
        };
        let bytes = put.encode_to_vec();
        let mut copied = Vec::new();
        for field in fields_with_bytes(&bytes) {
            let (number, value, written) = field.unwrap();
            match (number, value) {
                (1, Value::Bytes(key)) => put_bytes(&mut copied, 1, key),
                _ => copied.extend_from_slice(written),
            }
        }
        assert_eq!(copied, bytes, "a 200-byte key needs a two-byte length");
        let mut empty = Vec::new();
        put_bytes(&mut empty, 16, b"");
        assert_eq!(empty, [0x82, 0x01, 0x00]);
    }

    #[test]
    fn malformed_bytes_are_reported_once_and_never_panic() {
        let cases: &[&[u8]] = &[
            &[0x0a, 0x05, b'a'], // a length beyond the end
            &[0x08],             // a key without its varint
            &[
                0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ], // an 11-byte varint
            &[0x0b],             // a group
            &[0x0e, 0x00],       // wire type 6
            &[0x00, 0x00],       // field number 0
            &[0x09, 0x01, 0x02], // a truncated fixed64
        ];
        for bytes in cases {
            let read: Vec<_> = fields(bytes).collect();
            assert_eq!(read.last(), Some(&Err(Malformed)), "{bytes:?}");
            assert_eq!(read.iter().filter(|r| r.is_err()).count(), 1);
        }
    }
}
