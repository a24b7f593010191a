//! The MVCC store the members share: keys with their versions, the global revision, compaction, and the history
//! the checkers read. Pure and synchronous; the services lock it for the length of one request.
//!
//! A write request (Put, DeleteRange, a writing Txn, a lease revoke or expiry) stages its changes at revision
//! `current + 1` and commits them as one revision; a request that changes nothing commits nothing (as in etcd).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, PutRequest, PutResponse, RangeRequest, RangeResponse,
    ResponseHeader,
};
use proto::mvccpb::event::EventType;
use proto::mvccpb::{Event, KeyValue};

use super::errors::StoreError;
use super::history::{History, RevisionRecord};
use super::keyspace::KeyRange;

/// One version of a key: its value at `mod_revision`, or a tombstone (`None`) if it was deleted there.
#[derive(Clone, Debug)]
struct Version {
    mod_revision: i64,
    kv: Option<KeyValue>,
}

/// A lease as the store keeps it.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    pub granted_ttl: i64,
    pub expires_at: Duration,
    pub keys: BTreeSet<Vec<u8>>,
}

/// The shared state of the model cluster.
#[derive(Debug)]
pub struct Store {
    revision: i64,
    compacted: i64,
    keys: BTreeMap<Vec<u8>, Vec<Version>>,
    pub(super) leases: BTreeMap<i64, Lease>,
    /// Every lease's `(expires_at, id)`, so that expiry finds the due leases without scanning them all (the
    /// store is consulted on every request, and a scenario keeps thousands of leases).
    pub(super) expiries: BTreeSet<(Duration, i64)>,
    /// No leader: no lease expires (only a leader revokes expired leases) until one is elected.
    pub(super) expiry_paused: bool,
    /// Events of the write in progress, committed as one revision by [`Store::commit`].
    staged: Vec<Event>,
    pub history: History,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    /// An empty store at revision 1, as a new etcd cluster.
    pub fn new() -> Self {
        Self {
            revision: 1,
            compacted: 0,
            keys: BTreeMap::new(),
            leases: BTreeMap::new(),
            expiries: BTreeSet::new(),
            expiry_paused: false,
            staged: Vec::new(),
            history: History::default(),
        }
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn compacted(&self) -> i64 {
        self.compacted
    }

    /// A header with the store's revision; the service adds cluster, member and term.
    fn header(&self) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision: self.revision,
            ..Default::default()
        })
    }

    /// The revision the write in progress will get.
    fn write_revision(&self) -> i64 {
        self.revision + 1
    }

    /// Commits the staged events as one revision, if there are any. Returns whether a revision was made.
    pub(super) fn commit(&mut self, now: Duration) -> bool {
        if self.staged.is_empty() {
            return false;
        }
        self.revision += 1;
        let events = std::mem::take(&mut self.staged);
        self.history.revisions.push(RevisionRecord {
            revision: self.revision,
            at: now,
            events,
        });
        true
    }

    /// The live value of `key` as of `revision` (including staged writes when `revision` is the write revision).
    fn get_at(&self, key: &[u8], revision: i64) -> Option<&KeyValue> {
        let versions = self.keys.get(key)?;
        let index = versions.partition_point(|v| v.mod_revision <= revision);
        versions[..index].last()?.kv.as_ref()
    }

    /// The live key-values in `range` as of `revision`, in key order.
    pub(super) fn live_in(&self, range: &KeyRange, revision: i64) -> Vec<KeyValue> {
        let Some(bounds) = range.bounds() else {
            return Vec::new();
        };
        self.keys
            .range::<Vec<u8>, _>(bounds)
            .filter_map(|(key, _)| self.get_at(key, revision).cloned())
            .collect()
    }

    /// The latest view: committed revisions plus the write in progress.
    pub(super) fn latest(&self) -> i64 {
        if self.staged.is_empty() {
            self.revision
        } else {
            self.write_revision()
        }
    }

    /// Checks a read revision the way etcd's MVCC does: 0 means current; above current is a future revision;
    /// below the compaction revision is compacted (reading exactly at it still works).
    pub(super) fn check_read_revision(&self, revision: i64) -> Result<i64, StoreError> {
        if revision > self.revision {
            return Err(StoreError::FutureRevision);
        }
        if revision <= 0 {
            return Ok(self.latest());
        }
        if revision < self.compacted {
            return Err(StoreError::Compacted);
        }
        Ok(revision)
    }

    /// Range with every option, as etcd's apply layer does it.
    pub fn range(&self, request: &RangeRequest) -> Result<RangeResponse, StoreError> {
        if request.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        let revision = self.check_read_revision(request.revision)?;
        let mut kvs = self.live_in(&KeyRange::new(&request.key, &request.range_end), revision);
        // `count` is the number of keys in the range before the revision filters and the limit.
        let count = kvs.len() as i64;
        kvs.retain(|kv| {
            (request.max_mod_revision == 0 || kv.mod_revision <= request.max_mod_revision)
                && (request.min_mod_revision == 0 || kv.mod_revision >= request.min_mod_revision)
                && (request.max_create_revision == 0
                    || kv.create_revision <= request.max_create_revision)
                && (request.min_create_revision == 0
                    || kv.create_revision >= request.min_create_revision)
        });
        // For count_only etcd's MVCC returns no keys at all (`rangeKeys` in `mvcc/kvstore_txn.go`), so the limit
        // cuts nothing and `more` stays false, whatever the limit.
        if request.count_only {
            kvs.clear();
        }
        sort_kvs(&mut kvs, request.sort_order, request.sort_target);
        let mut more = false;
        if request.limit > 0 && kvs.len() as i64 > request.limit {
            kvs.truncate(request.limit as usize);
            more = true;
        }
        if request.keys_only {
            for kv in &mut kvs {
                kv.value.clear();
            }
        }
        Ok(RangeResponse {
            header: Some(ResponseHeader {
                revision: self.latest(),
                ..Default::default()
            }),
            kvs,
            more,
            count,
        })
    }

    /// Checks a Put against the request alone (etcd's `checkPutRequest`).
    pub(super) fn check_put_request(request: &PutRequest) -> Result<(), StoreError> {
        if request.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        if request.ignore_value && !request.value.is_empty() {
            return Err(StoreError::ValueProvided);
        }
        if request.ignore_lease && request.lease != 0 {
            return Err(StoreError::LeaseProvided);
        }
        Ok(())
    }

    /// Checks a Put against the current state: its lease exists, and the key exists if a field is kept from it.
    pub(super) fn check_put_state(&self, request: &PutRequest) -> Result<(), StoreError> {
        if request.lease != 0 && !self.leases.contains_key(&request.lease) {
            return Err(StoreError::LeaseNotFound);
        }
        if (request.ignore_value || request.ignore_lease)
            && self.get_at(&request.key, self.latest()).is_none()
        {
            return Err(StoreError::KeyNotFound);
        }
        Ok(())
    }

    /// Stages a checked Put.
    pub(super) fn stage_put(&mut self, request: &PutRequest) -> PutResponse {
        let revision = self.write_revision();
        let prev = self.get_at(&request.key, self.latest()).cloned();
        let value = match (&prev, request.ignore_value) {
            (Some(prev), true) => prev.value.clone(),
            _ => request.value.clone().into(),
        };
        let lease = match (&prev, request.ignore_lease) {
            (Some(prev), true) => prev.lease,
            _ => request.lease,
        };
        let kv = KeyValue {
            key: request.key.clone().into(),
            create_revision: prev.as_ref().map_or(revision, |p| p.create_revision),
            mod_revision: revision,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value,
            lease,
        };
        if let Some(prev) = &prev
            && prev.lease != 0
            && prev.lease != lease
            && let Some(old) = self.leases.get_mut(&prev.lease)
        {
            old.keys.remove(&request.key);
        }
        if lease != 0
            && let Some(attached) = self.leases.get_mut(&lease)
        {
            attached.keys.insert(request.key.clone());
        }
        self.push_version(kv.clone(), prev.clone(), EventType::Put);
        PutResponse {
            header: self.header_at(revision),
            prev_kv: if request.prev_kv { prev } else { None },
        }
    }

    /// Stages the deletion of every live key in the range.
    pub(super) fn stage_delete(&mut self, request: &DeleteRangeRequest) -> DeleteRangeResponse {
        let range = KeyRange::new(&request.key, &request.range_end);
        let doomed = self.live_in(&range, self.latest());
        for prev in &doomed {
            self.stage_tombstone(prev.clone());
        }
        let revision = if doomed.is_empty() {
            self.latest()
        } else {
            self.write_revision()
        };
        DeleteRangeResponse {
            header: self.header_at(revision),
            deleted: doomed.len() as i64,
            prev_kvs: if request.prev_kv { doomed } else { Vec::new() },
        }
    }

    /// Stages the deletion of one live key (by DeleteRange, lease revoke or expiry).
    pub(super) fn stage_tombstone(&mut self, prev: KeyValue) {
        if prev.lease != 0
            && let Some(lease) = self.leases.get_mut(&prev.lease)
        {
            lease.keys.remove(prev.key.as_ref());
        }
        let tombstone = KeyValue {
            key: prev.key.clone(),
            mod_revision: self.write_revision(),
            ..Default::default()
        };
        self.push_version(tombstone, Some(prev), EventType::Delete);
    }

    fn push_version(&mut self, kv: KeyValue, prev: Option<KeyValue>, kind: EventType) {
        let revision = self.write_revision();
        let live = (kind == EventType::Put).then(|| kv.clone());
        self.keys.entry(kv.key.to_vec()).or_default().push(Version {
            mod_revision: revision,
            kv: live,
        });
        self.staged.push(Event {
            r#type: kind as i32,
            kv: Some(kv),
            prev_kv: prev,
        });
    }

    fn header_at(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            revision,
            ..Default::default()
        })
    }

    /// Put as a request of its own: checked, staged and committed.
    pub fn put(&mut self, request: &PutRequest, now: Duration) -> Result<PutResponse, StoreError> {
        Self::check_put_request(request)?;
        self.check_put_state(request)?;
        let response = self.stage_put(request);
        self.commit(now);
        Ok(response)
    }

    /// DeleteRange as a request of its own. Deleting nothing makes no revision.
    pub fn delete_range(
        &mut self,
        request: &DeleteRangeRequest,
        now: Duration,
    ) -> Result<DeleteRangeResponse, StoreError> {
        if request.key.is_empty() {
            return Err(StoreError::EmptyKey);
        }
        let response = self.stage_delete(request);
        self.commit(now);
        Ok(response)
    }

    /// Compacts the history before `revision`: older versions can no longer be read or watched.
    pub fn compact(&mut self, revision: i64, now: Duration) -> Result<(), StoreError> {
        if revision <= self.compacted {
            return Err(StoreError::Compacted);
        }
        if revision > self.revision {
            return Err(StoreError::FutureRevision);
        }
        self.compacted = revision;
        for versions in self.keys.values_mut() {
            // Keep the newest version at or before the compaction revision (if live) and everything after it.
            let keep_from = versions
                .partition_point(|v| v.mod_revision <= revision)
                .saturating_sub(1);
            versions.drain(..keep_from);
            if versions
                .first()
                .is_some_and(|v| v.mod_revision <= revision && v.kv.is_none())
            {
                versions.remove(0);
            }
        }
        self.keys.retain(|_, versions| !versions.is_empty());
        self.history.compactions.push((now, revision));
        Ok(())
    }

    /// A header for a response that reads nothing.
    pub fn current_header(&self) -> Option<ResponseHeader> {
        self.header()
    }
}

/// Sorts as etcd does: no order means key order (already given); a non-key target without an order means ascending.
fn sort_kvs(kvs: &mut [KeyValue], order: i32, target: i32) {
    let target = SortTarget::try_from(target).unwrap_or(SortTarget::Key);
    let order = match SortOrder::try_from(order).unwrap_or(SortOrder::None) {
        SortOrder::None if target != SortTarget::Key => SortOrder::Ascend,
        other => other,
    };
    if order == SortOrder::None {
        return;
    }
    // A stable sort keeps key order among equal values, like Go's sort over key-ordered input in practice.
    kvs.sort_by(|a, b| {
        let ordering = match target {
            SortTarget::Key => a.key.cmp(&b.key),
            SortTarget::Version => a.version.cmp(&b.version),
            SortTarget::Create => a.create_revision.cmp(&b.create_revision),
            SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            SortTarget::Value => a.value.cmp(&b.value),
        };
        if order == SortOrder::Descend {
            ordering.reverse()
        } else {
            ordering
        }
    });
}
