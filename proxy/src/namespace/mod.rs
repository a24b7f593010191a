//! `--namespace`: each client sees a whole keyspace that is really the part of etcd's under one prefix. Every key
//! a client sends gets the prefix, every key it receives loses it; revisions, compaction, leases, members and
//! everything else pass unchanged.
//!
//! - this module: the prefix arithmetic ([`Namespace`]) and the Watch service's typed messages.
//! - [`messages`]: which fields of which etcd messages are keys, by method.
//! - [`rewrite`]: edits those fields of a message as bytes, copying every other field as it came (so fields this
//!   proxy does not know survive).
//!
//! A key in an answer from etcd that is outside the namespace cannot come from a request the proxy rewrote; it is
//! an internal error, logged and answered as such, never passed on. The two exceptions are lists of things etcd
//! keeps cluster-wide: a lease's keys and a role's permissions, of which a client sees the ones in its namespace.

pub mod messages;
pub mod rewrite;

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use proto::etcdserverpb::{WatchCreateRequest, WatchResponse};
use proto::mvccpb::KeyValue;
use tonic::{Request, Response, Status};

use crate::upstream::BoxStream;
use messages::Method;
use rewrite::Direction;

/// One namespace: its prefix and the end of the range its keys span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Namespace {
    prefix: Vec<u8>,
    /// The first key after every key that starts with the prefix: the prefix without its trailing `0xff` bytes,
    /// its last byte then incremented; `"\0"` (the end of the keyspace) for a prefix of `0xff` bytes only.
    end: Vec<u8>,
}

impl Namespace {
    /// The namespace of `--namespace`, or `None` for an empty prefix (no namespace).
    pub fn new(prefix: &[u8]) -> Option<Self> {
        if prefix.is_empty() {
            return None;
        }
        let mut end = prefix.to_vec();
        while end.last() == Some(&0xff) {
            end.pop();
        }
        match end.last_mut() {
            Some(last) => *last += 1,
            None => end.push(0),
        }
        Some(Self {
            prefix: prefix.to_vec(),
            end,
        })
    }

    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// A client's key as etcd stores it.
    pub fn key(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], key].concat()
    }

    /// A client's (non-empty) range end as etcd sees it: `"\0"`, "every key from the start on", ends where the
    /// namespace ends; any other end gets the prefix, which keeps the order of keys, so the range covers exactly
    /// the namespace's keys the client's range covers.
    pub fn range_end(&self, end: &[u8]) -> Vec<u8> {
        if end == [0] {
            self.end.clone()
        } else {
            self.key(end)
        }
    }

    /// An etcd key as the client sees it, or `None` when it is outside the namespace.
    pub fn strip<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        key.strip_prefix(&self.prefix[..])
    }

    /// A range end etcd reports (a permission's) as the client sees it, or `None` when the range cannot be in the
    /// namespace. An end at or past the namespace's end covers every key of the namespace from its start on:
    /// `"\0"` to the client.
    pub fn strip_range_end(&self, end: &[u8]) -> Option<Vec<u8>> {
        if let Some(stripped) = self.strip(end) {
            return Some(stripped.to_vec());
        }
        let past_the_end = end == [0] || (self.end != [0] && end >= &self.end[..]);
        past_the_end.then(|| vec![0])
    }

    /// A client's watch create as etcd must see it. etcd takes an empty key in a create as `"\0"`, the smallest
    /// key, and so does the proxy before adding the prefix.
    pub fn watch_create(&self, create: &mut WatchCreateRequest) {
        let key: &[u8] = if create.key.is_empty() {
            &[0]
        } else {
            &create.key
        };
        create.key = self.key(key);
        if !create.range_end.is_empty() {
            create.range_end = self.range_end(&create.range_end);
        }
    }

    /// A watch response as the client must see it: every event's key and previous key stripped.
    pub fn watch_response(&self, mut response: WatchResponse) -> Result<WatchResponse, Status> {
        for event in &mut response.events {
            for kv in event.kv.iter_mut().chain(event.prev_kv.iter_mut()) {
                self.strip_key_value(kv)?;
            }
        }
        Ok(response)
    }

    fn strip_key_value(&self, kv: &mut KeyValue) -> Result<(), Status> {
        if !kv.key.starts_with(&self.prefix) {
            return Err(foreign_key(&kv.key));
        }
        kv.key = kv.key.slice(self.prefix.len()..);
        Ok(())
    }
}

/// The rewriting of one call's messages: none without a namespace or for a method without keys, in which case
/// every message passes as it is.
#[derive(Clone)]
pub struct CallKeys {
    rewrite: Option<(Arc<Namespace>, Method)>,
}

impl CallKeys {
    /// The rewriting a call of the method at `path` needs.
    pub fn of(namespace: Option<&Arc<Namespace>>, path: &str) -> Self {
        let rewrite =
            namespace.and_then(|namespace| Some((namespace.clone(), messages::of(path)?)));
        Self { rewrite }
    }

    pub fn request(&self, request: Request<Bytes>) -> Result<Request<Bytes>, Status> {
        let Some((
            namespace,
            Method {
                request: Some(schema),
                ..
            },
        )) = &self.rewrite
        else {
            return Ok(request);
        };
        let (metadata, extensions, message) = request.into_parts();
        let message = namespace.rewrite(schema, Direction::Request, &message)?;
        Ok(Request::from_parts(metadata, extensions, message))
    }

    pub fn answer(&self, answer: Response<Bytes>) -> Result<Response<Bytes>, Status> {
        let Some((
            namespace,
            Method {
                answer: Some(schema),
                ..
            },
        )) = &self.rewrite
        else {
            return Ok(answer);
        };
        let (metadata, message, extensions) = answer.into_parts();
        let message = namespace.rewrite(schema, Direction::Answer, &message)?;
        Ok(Response::from_parts(metadata, message, extensions))
    }

    /// Every answer of a stream rewritten; the stream ends at the first that cannot be.
    pub fn answers(self, answers: Response<BoxStream<Bytes>>) -> Response<BoxStream<Bytes>> {
        let Some((
            namespace,
            Method {
                answer: Some(schema),
                ..
            },
        )) = self.rewrite
        else {
            return answers;
        };
        answers.map(|stream| -> BoxStream<Bytes> {
            let rewritten = stream.map(move |item| {
                item.and_then(|message| namespace.rewrite(schema, Direction::Answer, &message))
            });
            let mut failed = false;
            Box::pin(rewritten.take_while(move |item| {
                let go_on = !failed;
                failed |= item.is_err();
                futures::future::ready(go_on)
            }))
        })
    }
}

/// What a client is answered when etcd answers with a key outside the namespace, which correct prefix arithmetic
/// never asks for: logged, and never passed on.
pub fn foreign_key(key: &[u8]) -> Status {
    tracing::error!(
        key = %String::from_utf8_lossy(key),
        "etcd answered with a key outside --namespace; the answer is withheld"
    );
    Status::internal("etcd-grpc-proxy: etcd answered with a key outside the namespace")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::mvccpb::Event;

    fn ns(prefix: &[u8]) -> Namespace {
        Namespace::new(prefix).unwrap()
    }

    #[test]
    fn the_end_of_a_namespace_is_the_first_key_after_all_of_its_keys() {
        assert_eq!(Namespace::new(b""), None);
        assert_eq!(ns(b"/app/").end, b"/app0");
        // Go's proxy increments with wrap-around: "a\xff" would end at "b\0", past the foreign key "b".
        assert_eq!(ns(b"a\xff").end, b"b");
        assert_eq!(ns(b"a\xff\xff").end, b"b");
        assert_eq!(ns(b"a\xfe\xff").end, b"a\xff");
        assert_eq!(ns(b"\xff").end, [0]);
        assert_eq!(ns(b"\xff\xff").end, [0]);
    }

    #[test]
    fn ranges_map_to_exactly_the_namespace_part_of_the_keyspace() {
        let n = ns(b"a\xff");
        assert_eq!(n.key(b""), b"a\xff");
        assert_eq!(n.key(b"k"), b"a\xffk");
        assert_eq!(n.range_end(&[0]), b"b");
        assert_eq!(n.range_end(b"z"), b"a\xffz");
        // Every key between the mapped bounds of a from-key range is in the namespace, and "b" is not reached.
        let (start, end) = (n.key(b"\0"), n.range_end(&[0]));
        for key in [&b"a\xff\0"[..], b"a\xff\xff\xff", b"a\xffzz"] {
            assert!(start.as_slice() <= key && key < end.as_slice());
            assert!(n.strip(key).is_some());
        }
        assert!(b"b".as_slice() >= end.as_slice());
    }

    #[test]
    fn keys_outside_are_not_stripped_and_permission_ends_map_back() {
        let n = ns(b"/app/");
        assert_eq!(n.strip(b"/app/k"), Some(&b"k"[..]));
        assert_eq!(n.strip(b"/app/"), Some(&b""[..]));
        assert_eq!(n.strip(b"/ap"), None);
        assert_eq!(n.strip(b"/other/k"), None);
        assert_eq!(n.strip_range_end(b"/app/z"), Some(b"z".to_vec()));
        assert_eq!(n.strip_range_end(b"/app0"), Some(vec![0]));
        assert_eq!(n.strip_range_end(b"/b"), Some(vec![0]));
        assert_eq!(n.strip_range_end(&[0]), Some(vec![0]));
        assert_eq!(n.strip_range_end(b"/a"), None);
        let top = ns(b"\xff");
        assert_eq!(top.strip_range_end(&[0]), Some(vec![0]));
        assert_eq!(top.strip_range_end(b"\xfe"), None);
    }

    #[test]
    fn watches_are_prefixed_and_their_events_stripped_or_refused() {
        let n = ns(b"/app/");
        let mut create = WatchCreateRequest {
            key: b"k".to_vec(),
            range_end: vec![0],
            ..Default::default()
        };
        n.watch_create(&mut create);
        assert_eq!(
            (create.key, create.range_end),
            (b"/app/k".to_vec(), b"/app0".to_vec())
        );
        let mut single = WatchCreateRequest::default();
        n.watch_create(&mut single);
        assert_eq!(
            (single.key, single.range_end),
            (b"/app/\0".to_vec(), vec![])
        );

        let kv = |key: &[u8]| KeyValue {
            key: Bytes::copy_from_slice(key),
            ..Default::default()
        };
        let response = WatchResponse {
            events: vec![Event {
                kv: Some(kv(b"/app/k")),
                prev_kv: Some(kv(b"/app/k")),
                ..Default::default()
            }],
            ..Default::default()
        };
        let stripped = n.watch_response(response.clone()).unwrap();
        assert_eq!(stripped.events[0].kv.as_ref().unwrap().key, &b"k"[..]);
        assert_eq!(stripped.events[0].prev_kv.as_ref().unwrap().key, &b"k"[..]);
        let mut foreign = response;
        foreign.events[0].prev_kv = Some(kv(b"/other/k"));
        let refused = n.watch_response(foreign).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Internal);
    }
}
