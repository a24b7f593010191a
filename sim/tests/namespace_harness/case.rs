//! What a case is: the namespaces of its proxies and its requests, in a form that prints readably when proptest
//! reports a failure (keys as byte string literals, or as made from a namespace); and the etcd requests built from
//! it once the namespaces are known.

use std::fmt;

use proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    WatchCreateRequest, request_op,
};
use sim::check::namespace::show;
use sim::model::keyspace::prefix_end;

/// Bytes shown as a byte string literal, so that a failing case prints readably.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&show(&self.0))
    }
}

/// A key of a case: bytes, or one made from the case's `n`-th namespace (so that it looks like a prefix). Keys are
/// resolved when a request is built, so the generator needs no namespace and proptest shrinks a case step by step.
#[derive(Clone, PartialEq, Eq)]
pub enum Key {
    Bytes(Vec<u8>),
    /// The prefix itself.
    Prefix(usize),
    /// The prefix followed by `a`.
    UnderPrefix(usize),
    /// The prefix's end (`"\0"` for a prefix of 0xff bytes only).
    PrefixEnd(usize),
}

impl Key {
    fn bytes(&self, namespaces: &[Bytes]) -> Vec<u8> {
        match self {
            Key::Bytes(bytes) => bytes.clone(),
            Key::Prefix(n) => namespaces[*n].0.clone(),
            Key::UnderPrefix(n) => [&namespaces[*n].0[..], b"a"].concat(),
            Key::PrefixEnd(n) => prefix_end(&namespaces[*n].0),
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::Bytes(bytes) => f.write_str(&show(bytes)),
            Key::Prefix(n) => write!(f, "namespaces[{n}]"),
            Key::UnderPrefix(n) => write!(f, "namespaces[{n}]+b\"a\""),
            Key::PrefixEnd(n) => write!(f, "end(namespaces[{n}])"),
        }
    }
}

/// The shape of a `range_end`, relative to the key.
#[derive(Clone, Debug)]
pub enum End {
    /// Empty: the key alone.
    Single,
    /// `"\0"`: every key from the key on.
    FromKey,
    /// Every key with the key as prefix (`etcdctl get --prefix`).
    Prefix,
    /// Any end, possibly at or before the key (an empty range).
    To(Key),
}

impl End {
    fn wire(&self, key: &Key, namespaces: &[Bytes]) -> Vec<u8> {
        match self {
            End::Single => Vec::new(),
            End::FromKey => vec![0],
            End::Prefix => prefix_end(&key.bytes(namespaces)),
            End::To(end) => end.bytes(namespaces),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RangeOp {
    pub key: Key,
    pub end: End,
    /// 0: current.
    pub revision: i64,
    pub limit: i64,
    /// `(sort_order, sort_target)`.
    pub sort: (i32, i32),
    pub keys_only: bool,
    pub count_only: bool,
    pub serializable: bool,
    /// `(min_mod, max_mod, min_create, max_create)` revisions, 0 for none.
    pub filters: (i64, i64, i64, i64),
}

#[derive(Clone, Debug)]
pub struct PutOp {
    pub key: Key,
    pub value: Bytes,
    pub lease: i64,
    pub prev_kv: bool,
    pub ignore_value: bool,
    pub ignore_lease: bool,
}

#[derive(Clone, Debug)]
pub struct DeleteOp {
    pub key: Key,
    pub end: End,
    pub prev_kv: bool,
}

#[derive(Clone, Debug)]
pub struct CompareOp {
    pub key: Key,
    pub end: End,
    pub target: CompareTarget,
    pub result: CompareResult,
    /// The operand of a numeric target (version, revisions, lease).
    pub number: i64,
    /// The operand of a value compare.
    pub value: Bytes,
}

#[derive(Clone, Debug)]
pub enum TxnStep {
    Range(RangeOp),
    Put(PutOp),
    Delete(DeleteOp),
    Txn(TxnOp),
}

#[derive(Clone, Debug)]
pub struct TxnOp {
    pub compare: Vec<CompareOp>,
    pub success: Vec<TxnStep>,
    pub failure: Vec<TxnStep>,
}

#[derive(Clone, Debug)]
pub struct WatchOp {
    pub key: Key,
    pub end: End,
    pub start_revision: i64,
    pub prev_kv: bool,
    /// A `FilterType`, if any.
    pub filter: Option<i32>,
}

#[derive(Clone, Debug)]
pub enum Op {
    Range(RangeOp),
    Put(PutOp),
    Delete(DeleteOp),
    Txn(TxnOp),
    Compact(i64),
    LeaseGrant(i64),
    LeaseRevoke(i64),
    TimeToLive { lease: i64, keys: bool },
    Watch(WatchOp),
}

/// One case: the namespace of each proxy (one proxy for equivalence, two for isolation), and the requests, each
/// with the index of the proxy it goes through.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub namespaces: Vec<Bytes>,
    pub steps: Vec<(usize, Op)>,
}

// Shorthands for hand-written cases: plain requests (prev_kv on), whose fields a case overrides as it needs.

pub fn b(bytes: &[u8]) -> Bytes {
    Bytes(bytes.to_vec())
}

impl<const N: usize> From<&[u8; N]> for Key {
    fn from(bytes: &[u8; N]) -> Self {
        Key::Bytes(bytes.to_vec())
    }
}

pub fn plain_range(key: impl Into<Key>, end: End) -> RangeOp {
    RangeOp {
        key: key.into(),
        end,
        revision: 0,
        limit: 0,
        sort: (0, 0),
        keys_only: false,
        count_only: false,
        serializable: false,
        filters: (0, 0, 0, 0),
    }
}

pub fn range(key: impl Into<Key>, end: End) -> Op {
    Op::Range(plain_range(key, end))
}

pub fn plain_put(key: impl Into<Key>) -> PutOp {
    PutOp {
        key: key.into(),
        value: b(b"v"),
        lease: 0,
        prev_kv: true,
        ignore_value: false,
        ignore_lease: false,
    }
}

pub fn put(key: impl Into<Key>) -> Op {
    Op::Put(plain_put(key))
}

pub fn leased_put(key: impl Into<Key>, lease: i64) -> Op {
    Op::Put(PutOp {
        lease,
        ..plain_put(key)
    })
}

pub fn plain_delete(key: impl Into<Key>, end: End) -> DeleteOp {
    DeleteOp {
        key: key.into(),
        end,
        prev_kv: true,
    }
}

pub fn delete(key: impl Into<Key>, end: End) -> Op {
    Op::Delete(plain_delete(key, end))
}

pub fn watch(key: impl Into<Key>, end: End, start_revision: i64) -> Op {
    Op::Watch(WatchOp {
        key: key.into(),
        end,
        start_revision,
        prev_kv: true,
        filter: None,
    })
}

pub fn compare(
    key: impl Into<Key>,
    end: End,
    target: CompareTarget,
    result: CompareResult,
) -> CompareOp {
    CompareOp {
        key: key.into(),
        end,
        target,
        result,
        number: 1,
        value: b(b"v"),
    }
}

// The etcd requests a case makes, once its namespaces are known.

pub fn range_request(op: &RangeOp, ns: &[Bytes]) -> RangeRequest {
    let (min_mod_revision, max_mod_revision, min_create_revision, max_create_revision) = op.filters;
    RangeRequest {
        key: op.key.bytes(ns),
        range_end: op.end.wire(&op.key, ns),
        limit: op.limit,
        revision: op.revision,
        sort_order: op.sort.0,
        sort_target: op.sort.1,
        serializable: op.serializable,
        keys_only: op.keys_only,
        count_only: op.count_only,
        min_mod_revision,
        max_mod_revision,
        min_create_revision,
        max_create_revision,
    }
}

pub fn put_request(op: &PutOp, ns: &[Bytes]) -> PutRequest {
    PutRequest {
        key: op.key.bytes(ns),
        value: op.value.0.clone(),
        lease: op.lease,
        prev_kv: op.prev_kv,
        ignore_value: op.ignore_value,
        ignore_lease: op.ignore_lease,
    }
}

pub fn delete_request(op: &DeleteOp, ns: &[Bytes]) -> DeleteRangeRequest {
    DeleteRangeRequest {
        key: op.key.bytes(ns),
        range_end: op.end.wire(&op.key, ns),
        prev_kv: op.prev_kv,
    }
}

pub fn txn_request(op: &TxnOp, ns: &[Bytes]) -> TxnRequest {
    let steps = |steps: &[TxnStep]| -> Vec<RequestOp> {
        steps
            .iter()
            .map(|step| RequestOp {
                request: Some(match step {
                    TxnStep::Range(op) => request_op::Request::RequestRange(range_request(op, ns)),
                    TxnStep::Put(op) => request_op::Request::RequestPut(put_request(op, ns)),
                    TxnStep::Delete(op) => {
                        request_op::Request::RequestDeleteRange(delete_request(op, ns))
                    }
                    TxnStep::Txn(op) => request_op::Request::RequestTxn(txn_request(op, ns)),
                }),
            })
            .collect()
    };
    TxnRequest {
        compare: op
            .compare
            .iter()
            .map(|c| Compare {
                result: c.result as i32,
                target: c.target as i32,
                key: c.key.bytes(ns),
                range_end: c.end.wire(&c.key, ns),
                target_union: Some(match c.target {
                    CompareTarget::Version => TargetUnion::Version(c.number),
                    CompareTarget::Create => TargetUnion::CreateRevision(c.number),
                    CompareTarget::Mod => TargetUnion::ModRevision(c.number),
                    CompareTarget::Lease => TargetUnion::Lease(c.number),
                    CompareTarget::Value => TargetUnion::Value(c.value.0.clone()),
                }),
            })
            .collect(),
        success: steps(&op.success),
        failure: steps(&op.failure),
    }
}

pub fn watch_create(op: &WatchOp, ns: &[Bytes]) -> WatchCreateRequest {
    WatchCreateRequest {
        key: op.key.bytes(ns),
        range_end: op.end.wire(&op.key, ns),
        start_revision: op.start_revision,
        prev_kv: op.prev_kv,
        filters: op.filter.into_iter().collect(),
        ..Default::default()
    }
}
