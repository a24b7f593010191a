//! Txn as etcd applies it: static checks (operation count, empty keys, Put flags), the duplicate-key check of both
//! branches, then every compare of the whole nested txn evaluated against the state before the txn, then the
//! state checks of the chosen operations, and only then the writes, all at one revision.

use std::time::Duration;

use proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use proto::etcdserverpb::request_op::Request;
use proto::etcdserverpb::response_op::Response;
use proto::etcdserverpb::{
    Compare, RequestOp, ResponseHeader, ResponseOp, TxnRequest, TxnResponse,
};
use proto::mvccpb::KeyValue;

use super::errors::StoreError;
use super::keyspace::KeyRange;
use super::store::Store;

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;

/// The branch taken at every level of a nested txn, decided before anything is written.
struct Path {
    succeeded: bool,
    /// One entry per nested txn in the taken branch, in order.
    nested: Vec<Path>,
}

impl Store {
    pub fn txn(&mut self, request: &TxnRequest, now: Duration) -> Result<TxnResponse, StoreError> {
        check_txn(request, MAX_TXN_OPS)?;
        check_duplicates(&request.success)?;
        check_duplicates(&request.failure)?;
        let before = self.revision();
        let path = self.choose_path(request, before);
        self.check_path_state(request, &path)?;
        let mut response = self.apply_path(request, &path);
        self.commit(now);
        response.header = Some(ResponseHeader {
            revision: self.revision(),
            ..Default::default()
        });
        Ok(response)
    }

    fn choose_path(&self, request: &TxnRequest, revision: i64) -> Path {
        let succeeded = request
            .compare
            .iter()
            .all(|compare| self.compare_holds(compare, revision));
        let branch = if succeeded {
            &request.success
        } else {
            &request.failure
        };
        let nested = branch
            .iter()
            .filter_map(|op| match &op.request {
                Some(Request::RequestTxn(inner)) => Some(self.choose_path(inner, revision)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }

    /// A compare holds if it holds for every key in its range; a missing key compares as zero values, except
    /// that a value compare against a missing key is false.
    fn compare_holds(&self, compare: &Compare, revision: i64) -> bool {
        let kvs = self.live_in(&KeyRange::new(&compare.key, &compare.range_end), revision);
        let target = CompareTarget::try_from(compare.target).unwrap_or(CompareTarget::Version);
        if kvs.is_empty() {
            if target == CompareTarget::Value {
                return false;
            }
            return compare_kv(compare, target, &KeyValue::default());
        }
        kvs.iter().all(|kv| compare_kv(compare, target, kv))
    }

    fn check_path_state(&self, request: &TxnRequest, path: &Path) -> Result<(), StoreError> {
        let branch = if path.succeeded {
            &request.success
        } else {
            &request.failure
        };
        let mut nested = path.nested.iter();
        for op in branch {
            match &op.request {
                Some(Request::RequestPut(put)) => self.check_put_state(put)?,
                Some(Request::RequestRange(range)) => {
                    self.check_read_revision(range.revision)?;
                }
                Some(Request::RequestTxn(inner)) => {
                    let inner_path = nested.next().expect("one path per nested txn");
                    self.check_path_state(inner, inner_path)?;
                }
                Some(Request::RequestDeleteRange(_)) | None => {}
            }
        }
        Ok(())
    }

    fn apply_path(&mut self, request: &TxnRequest, path: &Path) -> TxnResponse {
        let branch = if path.succeeded {
            &request.success
        } else {
            &request.failure
        };
        let mut nested = path.nested.iter();
        let mut responses = Vec::with_capacity(branch.len());
        for op in branch {
            let response = match &op.request {
                Some(Request::RequestRange(range)) => {
                    // Checked above, so the read cannot fail; reads see this txn's earlier writes.
                    self.range(range).ok().map(Response::ResponseRange)
                }
                Some(Request::RequestPut(put)) => Some(Response::ResponsePut(self.stage_put(put))),
                Some(Request::RequestDeleteRange(delete)) => {
                    Some(Response::ResponseDeleteRange(self.stage_delete(delete)))
                }
                Some(Request::RequestTxn(inner)) => {
                    let inner_path = nested.next().expect("one path per nested txn");
                    let mut inner_response = self.apply_path(inner, inner_path);
                    inner_response.header = Some(ResponseHeader {
                        revision: self.latest(),
                        ..Default::default()
                    });
                    Some(Response::ResponseTxn(inner_response))
                }
                None => None,
            };
            responses.push(ResponseOp { response });
        }
        TxnResponse {
            header: None,
            succeeded: path.succeeded,
            responses,
        }
    }
}

fn compare_kv(compare: &Compare, target: CompareTarget, kv: &KeyValue) -> bool {
    use std::cmp::Ordering;
    let int_operand = |wanted: Option<i64>| wanted.unwrap_or(0);
    let ordering: Ordering = match target {
        CompareTarget::Version => kv.version.cmp(&int_operand(match compare.target_union {
            Some(TargetUnion::Version(v)) => Some(v),
            _ => None,
        })),
        CompareTarget::Create => kv
            .create_revision
            .cmp(&int_operand(match compare.target_union {
                Some(TargetUnion::CreateRevision(v)) => Some(v),
                _ => None,
            })),
        CompareTarget::Mod => kv
            .mod_revision
            .cmp(&int_operand(match compare.target_union {
                Some(TargetUnion::ModRevision(v)) => Some(v),
                _ => None,
            })),
        CompareTarget::Lease => kv.lease.cmp(&int_operand(match compare.target_union {
            Some(TargetUnion::Lease(v)) => Some(v),
            _ => None,
        })),
        CompareTarget::Value => {
            let wanted: &[u8] = match &compare.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value.as_ref().cmp(wanted)
        }
    };
    match CompareResult::try_from(compare.result).unwrap_or(CompareResult::Equal) {
        CompareResult::Equal => ordering == Ordering::Equal,
        CompareResult::NotEqual => ordering != Ordering::Equal,
        CompareResult::Greater => ordering == Ordering::Greater,
        CompareResult::Less => ordering == Ordering::Less,
    }
}

/// etcd's `checkTxnRequest`: operation count (nested txns share the budget), empty keys, Put flags.
fn check_txn(request: &TxnRequest, max_ops: usize) -> Result<(), StoreError> {
    let ops = request
        .compare
        .len()
        .max(request.success.len())
        .max(request.failure.len());
    if ops > max_ops {
        return Err(StoreError::TooManyOps);
    }
    if request.compare.iter().any(|c| c.key.is_empty()) {
        return Err(StoreError::EmptyKey);
    }
    for op in request.success.iter().chain(&request.failure) {
        match &op.request {
            Some(Request::RequestRange(range)) if range.key.is_empty() => {
                return Err(StoreError::EmptyKey);
            }
            Some(Request::RequestDeleteRange(delete)) if delete.key.is_empty() => {
                return Err(StoreError::EmptyKey);
            }
            Some(Request::RequestPut(put)) => Store::check_put_request(put)?,
            Some(Request::RequestTxn(inner)) => check_txn(inner, max_ops - ops)?,
            _ => {}
        }
    }
    Ok(())
}

/// etcd's `checkIntervals`: within one branch (nested txns included), no key is put twice and no put touches a
/// deleted range. The two branches of one nested txn may put the same key, since only one of them runs.
fn check_duplicates(ops: &[RequestOp]) -> Result<(), StoreError> {
    intervals(ops).map(|_| ())
}

/// The keys put and ranges deleted by a branch, or the duplicate-key error.
fn intervals(ops: &[RequestOp]) -> Result<(Vec<Vec<u8>>, Vec<KeyRange>), StoreError> {
    let mut deletes: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(Request::RequestDeleteRange(d)) => Some(KeyRange::new(&d.key, &d.range_end)),
            _ => None,
        })
        .collect();
    let deleted = |deletes: &[KeyRange], key: &[u8]| {
        let point = KeyRange::new(key, b"");
        deletes.iter().any(|d| d.overlaps(&point))
    };
    let mut puts: Vec<Vec<u8>> = Vec::new();
    for op in ops {
        let Some(Request::RequestTxn(inner)) = &op.request else {
            continue;
        };
        let (puts_then, deletes_then) = intervals(&inner.success)?;
        let (puts_else, deletes_else) = intervals(&inner.failure)?;
        for key in &puts_then {
            if puts.contains(key) || deleted(&deletes, key) {
                return Err(StoreError::DuplicateKey);
            }
            puts.push(key.clone());
        }
        for key in &puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || deleted(&deletes, key) {
                return Err(StoreError::DuplicateKey);
            }
            puts.push(key.clone());
        }
        deletes.extend(deletes_then);
        deletes.extend(deletes_else);
    }
    for op in ops {
        let Some(Request::RequestPut(put)) = &op.request else {
            continue;
        };
        if puts.contains(&put.key) || deleted(&deletes, &put.key) {
            return Err(StoreError::DuplicateKey);
        }
        puts.push(put.key.clone());
    }
    Ok((puts, deletes))
}
