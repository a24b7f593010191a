//! Rewrites the keys of one message as bytes, by a [`Schema`] of the message: key fields get the prefix (in a
//! request) or lose it (in an answer), nested messages are rewritten the same way, and every other field is copied
//! byte for byte, unknown ones included.

use bytes::Bytes;
use tonic::Status;

use super::{Namespace, foreign_key};
use crate::wire::{self, Value};

/// The fields of one message that hold keys or messages with keys; fields not listed are copied.
pub struct Schema {
    pub fields: &'static [(u32, Field)],
}

/// What one field is to the namespace.
pub enum Field {
    /// A key (or, repeated, a list of keys).
    Key { empty: Empty, foreign: Foreign },
    /// The end of the range that starts at the message's key. Empty means "the key alone" and stays empty.
    RangeEnd { foreign: Foreign },
    /// A nested message, or each element of a repeated one.
    Message(&'static Schema),
}

/// In a request, what an empty (or absent) key becomes.
pub enum Empty {
    /// Left empty: etcd refuses the whole request, in its own order of checks and with its own words (every etcd
    /// refuses an empty key in these fields before it reads or writes anything).
    Keep,
    /// Refused by the proxy (InvalidArgument, etcd's words), where an etcd would take an empty key that the
    /// prefix must not reach.
    Refuse(&'static str),
    /// The prefix itself: etcd accepts an empty key here.
    Prefix,
}

/// In an answer, what a key outside the namespace means.
pub enum Foreign {
    /// The proxy's arithmetic failed: an internal error, never passed on.
    Refuse,
    /// A list etcd keeps cluster-wide (a lease's keys): that key is left out.
    DropKey,
    /// The whole message is left out (a role's permission outside the namespace).
    DropMessage,
}

/// Which way a message travels.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Direction {
    Request,
    Answer,
}

/// Why a message could not be rewritten.
#[derive(Debug, PartialEq, Eq)]
pub enum Unrewritable {
    /// Not a protobuf message, or a key field of another wire type than bytes.
    Malformed,
    /// An empty key where etcd refuses one, with etcd's words.
    EmptyKey(&'static str),
    /// A key outside the namespace in an answer.
    Foreign(Vec<u8>),
    /// Messages nested deeper than [`wire::MAX_DEPTH`].
    TooDeep,
}

impl Unrewritable {
    pub fn into_status(self, direction: Direction) -> Status {
        match (self, direction) {
            (Unrewritable::Malformed, Direction::Request) => Status::internal(
                "grpc: error unmarshalling request: proto: cannot parse invalid wire-format data",
            ),
            (Unrewritable::Malformed, Direction::Answer) => {
                Status::internal("etcd-grpc-proxy: etcd's answer is not a valid protobuf message")
            }
            (Unrewritable::EmptyKey(words), _) => Status::invalid_argument(words),
            // Only a Txn nests without end: a client gets etcd's refusal of one nested too deep.
            (Unrewritable::TooDeep, Direction::Request) => crate::error::txn_too_deep(),
            (Unrewritable::TooDeep, Direction::Answer) => Status::internal(format!(
                "etcd-grpc-proxy: etcd's answer nests messages deeper than {}",
                wire::MAX_DEPTH
            )),
            (Unrewritable::Foreign(key), _) => foreign_key(&key),
        }
    }
}

impl Namespace {
    /// `message` rewritten by `schema` in `direction`.
    pub fn rewrite(
        &self,
        schema: &Schema,
        direction: Direction,
        message: &[u8],
    ) -> Result<Bytes, Status> {
        let mut out = Vec::with_capacity(message.len() + self.prefix.len() * 2);
        match self.edit(schema, direction, message, 0, &mut out) {
            Ok(_) => Ok(out.into()),
            Err(why) => Err(why.into_status(direction)),
        }
    }

    /// Appends the rewritten `message`, `depth` messages deep in the one being rewritten, to `out`; `Ok(false)`
    /// when the message is to be left out (nothing appended).
    fn edit(
        &self,
        schema: &Schema,
        direction: Direction,
        message: &[u8],
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, Unrewritable> {
        if depth >= wire::MAX_DEPTH {
            return Err(Unrewritable::TooDeep);
        }
        let start = out.len();
        let mut keys_seen = 0u32;
        for field in wire::fields_with_bytes(message) {
            let (number, value, written) = field.map_err(|_| Unrewritable::Malformed)?;
            let Some((index, (_, kind))) = schema
                .fields
                .iter()
                .enumerate()
                .find(|(_, (n, _))| *n == number)
            else {
                out.extend_from_slice(written);
                continue;
            };
            let Value::Bytes(bytes) = value else {
                return Err(Unrewritable::Malformed);
            };
            if matches!(kind, Field::Key { .. }) {
                keys_seen |= 1 << index;
            }
            if !self.edit_field(kind, direction, number, bytes, depth, out)? {
                out.truncate(start);
                return Ok(false);
            }
        }
        // An absent key is an empty one (proto3 does not write empty bytes); one kept empty stays absent.
        for (index, (number, kind)) in schema.fields.iter().enumerate() {
            let kept_empty = matches!(
                kind,
                Field::Key {
                    empty: Empty::Keep,
                    ..
                }
            );
            if matches!(kind, Field::Key { .. })
                && !(kept_empty && direction == Direction::Request)
                && keys_seen & (1 << index) == 0
                && !self.edit_field(kind, direction, *number, b"", depth, out)?
            {
                out.truncate(start);
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Appends one rewritten field of a message `depth` deep; `Ok(false)` when that message is to be left out.
    fn edit_field(
        &self,
        kind: &Field,
        direction: Direction,
        number: u32,
        bytes: &[u8],
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, Unrewritable> {
        match (kind, direction) {
            (Field::Key { empty, .. }, Direction::Request) => match (bytes.is_empty(), empty) {
                (true, Empty::Refuse(words)) => return Err(Unrewritable::EmptyKey(words)),
                (true, Empty::Keep) => wire::put_bytes(out, number, bytes),
                _ => wire::put_bytes(out, number, &self.key(bytes)),
            },
            (Field::Key { foreign, .. }, Direction::Answer) => match self.strip(bytes) {
                Some(stripped) => wire::put_bytes(out, number, stripped),
                None => return self.foreign(foreign, bytes),
            },
            (Field::RangeEnd { .. }, Direction::Request) if bytes.is_empty() => {
                wire::put_bytes(out, number, bytes)
            }
            (Field::RangeEnd { .. }, Direction::Request) => {
                wire::put_bytes(out, number, &self.range_end(bytes))
            }
            (Field::RangeEnd { foreign }, Direction::Answer) if !bytes.is_empty() => {
                match self.strip_range_end(bytes) {
                    Some(end) => wire::put_bytes(out, number, &end),
                    None => return self.foreign(foreign, bytes),
                }
            }
            (Field::RangeEnd { .. }, Direction::Answer) => wire::put_bytes(out, number, bytes),
            (Field::Message(nested), _) => {
                let mut rewritten = Vec::with_capacity(bytes.len() + self.prefix.len());
                if self.edit(nested, direction, bytes, depth + 1, &mut rewritten)? {
                    wire::put_bytes(out, number, &rewritten);
                }
            }
        }
        Ok(true)
    }

    fn foreign(&self, foreign: &Foreign, key: &[u8]) -> Result<bool, Unrewritable> {
        match foreign {
            Foreign::Refuse => Err(Unrewritable::Foreign(key.to_vec())),
            Foreign::DropKey => Ok(true),
            Foreign::DropMessage => Ok(false),
        }
    }
}
