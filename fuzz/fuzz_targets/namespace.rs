//! `--namespace` rewriting (`proxy/src/namespace/`): every message schema of every method with keys, each as a
//! Request (keys get the prefix) and as an Answer (keys lose it), with a fuzzed prefix; and the typed Watch
//! rewriting. Input: one byte choosing the schema, one byte the prefix length, the prefix, the message.
//!
//! Checked: a rewritten request holds only keys inside the namespace; a request rewritten and then read back as an
//! answer gives the client's keys and range ends again, and rewriting that again gives the same bytes; the
//! prefix arithmetic round-trips.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use proto::etcdserverpb::{WatchCreateRequest, WatchResponse};
use proxy::fuzzing::{Direction, Field, Namespace, Schema, Value, fields, keyed_method};

/// Every method whose request or answer holds keys (`namespace/messages.rs`).
const PATHS: &[&str] = &[
    "/etcdserverpb.KV/Range",
    "/etcdserverpb.KV/RangeStream",
    "/etcdserverpb.KV/Put",
    "/etcdserverpb.KV/DeleteRange",
    "/etcdserverpb.KV/Txn",
    "/etcdserverpb.Lease/LeaseTimeToLive",
    "/etcdserverpb.Auth/RoleGrantPermission",
    "/etcdserverpb.Auth/RoleRevokePermission",
    "/etcdserverpb.Auth/RoleGet",
    "/v3lockpb.Lock/Lock",
    "/v3lockpb.Lock/Unlock",
    "/v3electionpb.Election/Campaign",
    "/v3electionpb.Election/Proclaim",
    "/v3electionpb.Election/Resign",
    "/v3electionpb.Election/Leader",
    "/v3electionpb.Election/Observe",
];

/// Every distinct schema of those methods, requests' and answers'.
fn schemas() -> &'static [&'static Schema] {
    static SCHEMAS: OnceLock<Vec<&'static Schema>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut all: Vec<&'static Schema> = Vec::new();
        for path in PATHS {
            let method = keyed_method(path).expect("a method with keys");
            for schema in [method.request, method.answer].into_iter().flatten() {
                if !all.iter().any(|known| std::ptr::eq(*known, schema)) {
                    all.push(schema);
                }
            }
        }
        all
    })
}

/// The keys and range ends of a message, at every depth, in order; `Err` when it is not well-formed where the
/// schema looks.
#[derive(Debug, Default, PartialEq, Eq)]
struct Keys {
    keys: Vec<Vec<u8>>,
    ends: Vec<Vec<u8>>,
}

fn keys_of(schema: &Schema, message: &[u8], into: &mut Keys) -> Result<(), ()> {
    for field in fields(message) {
        let (number, value) = field.map_err(drop)?;
        let Some((_, kind)) = schema.fields.iter().find(|(n, _)| *n == number) else {
            continue;
        };
        let Value::Bytes(bytes) = value else {
            return Err(());
        };
        match kind {
            Field::Key { .. } => into.keys.push(bytes.to_vec()),
            Field::RangeEnd { .. } => into.ends.push(bytes.to_vec()),
            Field::Message(nested) => keys_of(nested, bytes, into)?,
        }
    }
    Ok(())
}

fn keys(schema: &Schema, message: &[u8]) -> Keys {
    let mut keys = Keys::default();
    keys_of(schema, message, &mut keys).expect("a rewritten message is well-formed");
    keys
}

fuzz_target!(|data: &[u8]| {
    let [choice, prefix_len, rest @ ..] = data else {
        return;
    };
    let prefix_len = usize::from(*prefix_len % 16).min(rest.len());
    let (prefix, message) = rest.split_at(prefix_len);
    let Some(ns) = Namespace::new(prefix) else {
        assert!(prefix.is_empty());
        return;
    };
    let end = ns.range_end(&[0]);
    prefix_arithmetic(&ns, &end, message);
    let schemas = schemas();
    let schema = schemas[usize::from(*choice) % schemas.len()];

    // As a request: every key lands in the namespace; back as an answer, the client's keys come back.
    if let Ok(request) = ns.rewrite(schema, Direction::Request, message) {
        let sent = keys(schema, &request);
        for key in &sent.keys {
            assert!(
                key.is_empty() || key.starts_with(prefix),
                "key {key:?} outside {prefix:?}"
            );
        }
        for range_end in &sent.ends {
            assert!(
                range_end.is_empty() || range_end.starts_with(prefix) || *range_end == end,
                "range end {range_end:?} outside {prefix:?}"
            );
        }
        if let Ok(answer) = ns.rewrite(schema, Direction::Answer, &request) {
            let given = keys(schema, message);
            let back = keys(schema, &answer);
            let non_empty = |keys: &[Vec<u8>]| -> Vec<Vec<u8>> {
                keys.iter().filter(|k| !k.is_empty()).cloned().collect()
            };
            assert_eq!(
                non_empty(&back.keys),
                non_empty(&given.keys),
                "keys round-trip"
            );
            assert_eq!(back.ends, given.ends, "range ends round-trip");
            let again = ns
                .rewrite(schema, Direction::Request, &answer)
                .expect("what a request became, read back, is a request again");
            assert_eq!(again, request, "rewriting is a fixpoint");
        }
    }

    // As an answer from etcd: whatever it is, a well-formed result or an error.
    if let Ok(answer) = ns.rewrite(schema, Direction::Answer, message) {
        let mut read = Keys::default();
        keys_of(schema, &answer, &mut read).expect("a rewritten answer is well-formed");
        assert!(answer.len() <= message.len(), "answers only lose bytes");
    }

    // The Watch service's typed rewriting.
    if let Ok(mut create) = WatchCreateRequest::decode(message) {
        let client_end = create.range_end.clone();
        ns.watch_create(&mut create);
        assert!(create.key.starts_with(prefix) && create.key.len() > prefix.len());
        assert!(client_end.is_empty() == create.range_end.is_empty());
        assert!(
            create.range_end.is_empty()
                || create.range_end.starts_with(prefix)
                || create.range_end == end
        );
    }
    if let Ok(response) = WatchResponse::decode(message)
        && let Ok(stripped) = ns.watch_response(response.clone())
    {
        for (before, after) in response.events.iter().zip(&stripped.events) {
            for (kv, stripped_kv) in before.kv.iter().zip(&after.kv) {
                assert_eq!(&kv.key[prefix.len()..], &stripped_kv.key[..]);
            }
        }
    }
});

/// `Namespace::new`'s end and the mapping of keys and range ends.
fn prefix_arithmetic(ns: &Namespace, end: &[u8], tail: &[u8]) {
    let prefix = ns.prefix();
    let client_key = &tail[..tail.len().min(8)];
    let key = ns.key(client_key);
    assert_eq!(ns.strip(&key), Some(client_key));
    if end != [0] {
        assert!(
            prefix < end && key.as_slice() < end,
            "{key:?} past the end {end:?}"
        );
        assert!(ns.strip(end).is_none());
    }
    if !client_key.is_empty() {
        assert_eq!(
            ns.strip_range_end(&ns.range_end(client_key)),
            Some(client_key.to_vec())
        );
    }
    assert_eq!(ns.strip_range_end(end), Some(vec![0]));
}
