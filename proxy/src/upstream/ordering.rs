//! Monotonic serializable reads (`--experimental-serializable-ordering`, on by default): a serializable Range is
//! answered by whichever member serves, from that member's own copy of the data, and a member that lags (it was
//! cut off, it is catching up after a restart, the proxy failed over to it) answers from an older revision than
//! one the proxy already returned. A client that reads through the proxy would see time go backwards.
//!
//! The proxy remembers the highest revision any KV answer carried. A serializable answer older than the highest
//! revision returned before the read arrived is not passed on: the read is asked again as a linearizable one,
//! which etcd answers at a revision at least as new as every revision it ever returned. Only lagging answers cost
//! that second read. An answer older only than revisions returned after the read arrived, to calls that ran
//! beside it, is passed on: no client that asks could have seen those revisions before asking, and etcd itself
//! may order a read before a write it runs beside. With several workers the answers of calls that ran side by
//! side are taken in on different threads, in either order, and judging them by the floor when they came back
//! asked 13-17% of a mixed load's reads again (`bench`, two workers, 320948b).
//!
//! The floor means something only once it holds a revision etcd committed: a linearizable answer, a write's, or
//! the Status of a member with a leader. A proxy that has just started has returned nothing, but its clients may
//! have read through its previous run; if it could learn no committed revision (under auth, etcd 3.5.30 refuses a
//! tokenless Status; or no member had a leader), a serializable answer cannot be told from a lagging member's
//! (an isolated member's, say), so it too is asked again linearizably, until one such revision is learnt.
//!
//! etcd's Go proxy takes the flag but applies it to nothing it forwards (`go-grpc-proxy.md` §11.2).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::{self, Value};

/// `RangeRequest.serializable`.
const RANGE_SERIALIZABLE: u32 = 7;
/// The `header` field of every etcd answer, and `ResponseHeader.revision`.
const RESPONSE_HEADER: u32 = 1;
const HEADER_REVISION: u32 = 3;

/// The KV methods whose answers carry the store's revision.
const KV_METHODS: [&str; 4] = [
    "/etcdserverpb.KV/Range",
    "/etcdserverpb.KV/Put",
    "/etcdserverpb.KV/DeleteRange",
    "/etcdserverpb.KV/Txn",
];

/// The highest store revision a KV answer through this proxy carried.
#[derive(Debug, Default)]
pub struct RevisionFloor {
    highest: AtomicI64,
    /// A revision etcd committed has been learnt: `highest` is at least as new as it.
    committed: AtomicBool,
}

/// What to do with a KV answer.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Pass it on.
    Pass,
    /// A serializable read answered from an older revision than one already returned, or before any committed
    /// revision was learnt: ask again, linearizably.
    Reask,
}

impl RevisionFloor {
    /// The highest revision returned so far.
    pub fn highest(&self) -> i64 {
        self.highest.load(Ordering::Acquire)
    }

    /// Records a revision returned without a call to etcd (an answer from the range cache).
    pub fn raise(&self, revision: i64) {
        self.highest.fetch_max(revision, Ordering::AcqRel);
    }

    /// Records a revision etcd committed (the Status of a member with a leader): from now on the floor judges.
    pub fn learn(&self, revision: i64) {
        self.raise(revision);
        self.committed.store(true, Ordering::Release);
    }

    /// Judges etcd's `answer` to `request` on the method at `path`, and raises the floor to its revision.
    /// `at_arrival` is [`RevisionFloor::highest`] when the request arrived, before it was sent.
    pub fn judge(&self, path: &str, request: &[u8], answer: &[u8], at_arrival: i64) -> Verdict {
        if !KV_METHODS.contains(&path) {
            return Verdict::Pass;
        }
        let Some(revision) = header_revision(answer) else {
            return Verdict::Pass;
        };
        let serializable_read = path == KV_METHODS[0] && is_serializable(request);
        // A linearizable read, a Put and a DeleteRange are answered at a revision etcd committed (a Txn may be a
        // read-only one etcd answers from the member's own copy).
        if !serializable_read && path != KV_METHODS[3] {
            self.learn(revision);
            return Verdict::Pass;
        }
        self.highest.fetch_max(revision, Ordering::AcqRel);
        let judged = self.committed.load(Ordering::Acquire);
        let lagging = revision < at_arrival || !judged;
        if lagging && serializable_read {
            Verdict::Reask
        } else {
            Verdict::Pass
        }
    }
}

/// The same Range request, linearizable: protobuf keeps the last value of a repeated scalar field, so appending
/// `serializable = false` overrides it and leaves every other field (unknown ones included) as the client sent it.
pub fn linearizable(request: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(request.len() + 2);
    out.put_slice(request);
    out.put_u8((RANGE_SERIALIZABLE << 3) as u8);
    out.put_u8(0);
    out.freeze()
}

/// Whether a Range request asks for a serializable read, read from the wire without decoding the rest (an
/// unreadable request is not).
pub fn is_serializable(range: &[u8]) -> bool {
    let mut serializable = false;
    for field in wire::fields(range) {
        match field {
            Ok((RANGE_SERIALIZABLE, Value::Varint(value))) => serializable = value != 0,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    serializable
}

/// The revision in an answer's header, read from the wire without decoding the rest of the answer.
pub fn header_revision(answer: &[u8]) -> Option<i64> {
    let header = wire::fields(answer).find_map(|field| match field {
        Ok((RESPONSE_HEADER, Value::Bytes(header))) => Some(header),
        _ => None,
    })?;
    wire::fields(header).find_map(|field| match field {
        Ok((HEADER_REVISION, Value::Varint(revision))) => Some(revision as i64),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use proto::etcdserverpb::{PutResponse, RangeRequest, RangeResponse, ResponseHeader};

    const RANGE: &str = "/etcdserverpb.KV/Range";
    const PUT: &str = "/etcdserverpb.KV/Put";

    fn range(serializable: bool) -> Vec<u8> {
        RangeRequest {
            key: b"k".to_vec(),
            serializable,
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn header(revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    fn range_answer(revision: i64) -> Vec<u8> {
        RangeResponse {
            header: header(revision),
            ..Default::default()
        }
        .encode_to_vec()
    }

    /// A call that arrived after every answer judged before it: `judge` with the floor as it is now.
    fn judged(floor: &RevisionFloor, path: &str, request: &[u8], answer: &[u8]) -> Verdict {
        floor.judge(path, request, answer, floor.highest())
    }

    #[test]
    fn an_answer_older_only_than_revisions_returned_since_the_read_arrived_passes() {
        let floor = RevisionFloor::default();
        floor.learn(10);
        // A serializable read arrives with the floor at 10; a put beside it is answered at 11 first.
        let at_arrival = floor.highest();
        assert_eq!(judged(&floor, PUT, b"", &range_answer(11)), Verdict::Pass);
        assert_eq!(
            floor.judge(RANGE, &range(true), &range_answer(10), at_arrival),
            Verdict::Pass,
            "a read that ran beside the put may be ordered before it, as etcd may order it"
        );
        assert_eq!(
            floor.judge(RANGE, &range(true), &range_answer(9), at_arrival),
            Verdict::Reask,
            "older than a revision returned before it arrived: a lagging member's"
        );
        assert_eq!(
            floor.highest(),
            11,
            "the floor still rises with every answer"
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(10)),
            Verdict::Reask,
            "a read that arrives after the put was answered must see it"
        );
    }

    #[test]
    fn an_older_serializable_answer_is_asked_again() {
        let floor = RevisionFloor::default();
        floor.learn(1);
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(10)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(9)),
            Verdict::Reask
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(10)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(11)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(10)),
            Verdict::Reask
        );
    }

    #[test]
    fn writes_raise_the_floor_and_linearizable_answers_pass() {
        let floor = RevisionFloor::default();
        let put = PutResponse {
            header: header(20),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(judged(&floor, PUT, b"", &put), Verdict::Pass);
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(19)),
            Verdict::Reask
        );
        // A linearizable read is never older than what etcd returned before: nothing to ask again.
        assert_eq!(
            judged(&floor, RANGE, &range(false), &range_answer(19)),
            Verdict::Pass
        );
    }

    #[test]
    fn other_methods_and_unreadable_answers_change_nothing() {
        let floor = RevisionFloor::default();
        floor.learn(1);
        judged(&floor, RANGE, &range(true), &range_answer(50));
        let status = range_answer(1);
        assert_eq!(
            judged(&floor, "/etcdserverpb.Maintenance/Status", b"", &status),
            Verdict::Pass
        );
        assert_eq!(judged(&floor, RANGE, &range(true), &[0xff]), Verdict::Pass);
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(49)),
            Verdict::Reask
        );
    }

    /// Issue 38 (sim `auth` seed 8343): the proxy restarted while no member had a leader (one crashed, one cut
    /// off), and under auth every member refused its tokenless Status, so the new run learnt no revision; the cut-off
    /// member's serializable answer at revision 21 passed a floor of nothing, after the reader had read 26.
    #[test]
    fn a_fresh_floor_asks_serializable_answers_again_until_it_learns_a_committed_revision() {
        let floor = RevisionFloor::default();
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(21)),
            Verdict::Reask,
            "nothing committed is known: a member cut off from the majority may have answered"
        );
        // A serializable answer teaches nothing committed, however new it looks.
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(30)),
            Verdict::Reask
        );
        // Neither does a Txn (a read-only one is answered from the member's own copy) ...
        let txn = range_answer(31);
        assert_eq!(
            judged(&floor, "/etcdserverpb.KV/Txn", b"", &txn),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(31)),
            Verdict::Reask
        );
        // ... nor the Status of a member without a leader (`raise`).
        floor.raise(32);
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(32)),
            Verdict::Reask
        );
        // The linearizable read asked again is answered at a committed revision: from now on the floor judges.
        assert_eq!(
            judged(&floor, RANGE, &range(false), &range_answer(33)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(33)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&floor, RANGE, &range(true), &range_answer(32)),
            Verdict::Reask
        );
    }

    #[test]
    fn a_status_with_a_leader_or_a_write_teaches_the_floor_a_committed_revision() {
        let learnt = RevisionFloor::default();
        learnt.learn(26);
        assert_eq!(
            judged(&learnt, RANGE, &range(true), &range_answer(26)),
            Verdict::Pass
        );
        assert_eq!(
            judged(&learnt, RANGE, &range(true), &range_answer(21)),
            Verdict::Reask
        );
        let written = RevisionFloor::default();
        let put = PutResponse {
            header: header(26),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(judged(&written, PUT, b"", &put), Verdict::Pass);
        assert_eq!(
            judged(&written, RANGE, &range(true), &range_answer(27)),
            Verdict::Pass
        );
    }

    #[test]
    fn the_linearizable_request_keeps_every_other_field() {
        let mut request = range(true);
        request.extend_from_slice(&[0x98, 0x06, 0x2a]); // an unknown field 99
        let linearizable = linearizable(&Bytes::from(request.clone()));
        assert!(linearizable.starts_with(&request));
        let decoded = RangeRequest::decode(linearizable.clone()).unwrap();
        assert!(!decoded.serializable);
        assert_eq!(decoded.key, b"k");
        assert!(!is_serializable(&linearizable));
    }
}
