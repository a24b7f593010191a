//! The keys this proxy owns under its leasing session, and what it knows of each: a pure state machine, driven by
//! the session's actor (watch events, session loss) and by the calls that acquire and write keys.
//!
//! An entry goes through three steps: *pending* while the acquiring Txn is on its way (so that an end of ownership
//! the session sees meanwhile is not lost), *owned* once the Txn confirmed the ownership key, and *servable* once the
//! key's own watcher is confirmed by etcd, from which point every write on the key (a plain client's too) reaches
//! the entry. Only servable entries answer reads, and only while the session's lease is known alive.

use std::collections::{BTreeMap, BTreeSet};

use proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use proto::mvccpb::KeyValue;
use proto::mvccpb::event::EventType;
use tokio::time::{Duration, Instant};

/// How long a key whose ownership another client revoked is not acquired again (etcd's `revokeBackoff`): a writer
/// that revoked it gets its write in before this proxy competes for the key again.
pub const REVOKE_BACKOFF: Duration = Duration::from_secs(2);

/// One key this proxy owns (or is acquiring).
#[derive(Debug, Clone)]
pub struct Entry {
    /// The key's value as of `header.revision`; `None` when the key does not exist.
    pub kv: Option<KeyValue>,
    /// The header of the newest answer or event the entry reflects.
    pub header: ResponseHeader,
    /// The create revision of the ownership key (0 while pending).
    pub ownership_revision: i64,
    /// The session generation that acquired it.
    pub generation: u64,
    /// Set while pending: the revision of an end of ownership seen before the acquiring Txn answered.
    pub ended_at: Option<i64>,
    /// The key's watcher is confirmed by etcd (Created): every later write reaches the entry.
    pub watched: bool,
    /// The id of the key's watcher on the session's watch stream.
    pub watch_id: i64,
}

/// Every key of one proxy's leasing state.
#[derive(Debug, Default)]
pub struct Owned {
    entries: BTreeMap<Vec<u8>, Entry>,
    /// Keys revoked by another client, and until when they are not acquired again.
    backoff: BTreeMap<Vec<u8>, Instant>,
    /// Keys (and ranges) a write through this proxy is changing: not acquired until it is done.
    writing: BTreeMap<(Vec<u8>, Vec<u8>), usize>,
    /// Watch ids of the key watchers, to their key.
    watchers: BTreeMap<i64, Vec<u8>>,
    next_watch_id: i64,
}

/// What the session's actor must do after an event on an ownership key.
#[derive(Debug, PartialEq, Eq)]
pub enum Rescind {
    /// Nothing: the event does not concern this proxy.
    Nothing,
    /// Delete the ownership key, guarded by its create revision being older than the revoke's revision.
    Delete { ownership_key: Vec<u8>, before: i64 },
}

/// Whether `key` lies in `[start, end)`, with etcd's range semantics (an empty `end` is the single key `start`;
/// `"\0"` is every key from `start` on).
pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        _ => key >= start && key < end,
    }
}

/// Watch id of the watcher on the leasing prefix; key watchers take the ids after it.
pub const PREFIX_WATCH_ID: i64 = 1;

impl Owned {
    /// The entry of `key` if it can answer a read now.
    pub fn servable(&self, key: &[u8], generation: u64) -> Option<&Entry> {
        self.entries
            .get(key)
            .filter(|e| e.watched && e.ownership_revision > 0 && e.generation == generation)
    }

    /// Whether the proxy may try to acquire `key` now.
    pub fn may_acquire(&self, key: &[u8], now: Instant) -> bool {
        let backing_off = self.backoff.get(key).is_some_and(|until| now < *until);
        let written = self
            .writing
            .keys()
            .any(|(start, end)| in_range(key, start, end));
        !backing_off && !written && !self.entries.contains_key(key)
    }

    /// Records that an acquiring Txn for `key` is about to be sent in session `generation`; returns the id its
    /// watcher will have.
    pub fn begin_acquire(&mut self, key: &[u8], generation: u64) -> i64 {
        self.next_watch_id = self.next_watch_id.max(PREFIX_WATCH_ID) + 1;
        let watch_id = self.next_watch_id;
        self.entries.insert(
            key.to_vec(),
            Entry {
                kv: None,
                header: ResponseHeader::default(),
                ownership_revision: 0,
                generation,
                ended_at: None,
                watched: false,
                watch_id,
            },
        );
        watch_id
    }

    /// The acquiring Txn answered: `owned` says whether the ownership key is this proxy's, created at
    /// `ownership_revision`, with `kv` the key's value at `header`. True if the entry is kept (the caller then
    /// starts its watcher from `header.revision + 1`).
    pub fn finish_acquire(
        &mut self,
        key: &[u8],
        generation: u64,
        owned: Option<i64>,
        kv: Option<KeyValue>,
        header: ResponseHeader,
    ) -> bool {
        let Some(entry) = self.entries.get_mut(key) else {
            return false;
        };
        let ended = entry.ended_at.is_some_and(|at| at > header.revision);
        let keep = entry.ownership_revision == 0 && entry.generation == generation && !ended;
        match (keep, owned) {
            (true, Some(ownership_revision)) => {
                entry.kv = kv;
                entry.header = header;
                entry.ownership_revision = ownership_revision;
                entry.ended_at = None;
                self.watchers.insert(entry.watch_id, key.to_vec());
                true
            }
            _ => {
                if entry.ownership_revision == 0 {
                    self.entries.remove(key);
                }
                false
            }
        }
    }

    /// The acquiring Txn failed: forget the pending entry.
    pub fn abandon_acquire(&mut self, key: &[u8]) {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.ownership_revision == 0)
        {
            self.entries.remove(key);
        }
    }

    /// etcd confirmed the watcher `watch_id`.
    pub fn watcher_created(&mut self, watch_id: i64) {
        if let Some(key) = self.watchers.get(&watch_id)
            && let Some(entry) = self.entries.get_mut(key)
        {
            entry.watched = true;
        }
    }

    /// An event on an owned key, from its watcher: the entry follows it.
    pub fn key_event(
        &mut self,
        watch_id: i64,
        kind: EventType,
        kv: KeyValue,
        header: &ResponseHeader,
    ) {
        let Some(entry) = self
            .watchers
            .get(&watch_id)
            .and_then(|key| self.entries.get_mut(key))
        else {
            return;
        };
        let revision = kv.mod_revision;
        entry.kv = match kind {
            EventType::Put => Some(kv),
            EventType::Delete => None,
        };
        entry.header = ResponseHeader {
            revision: revision.max(entry.header.revision),
            ..*header
        };
    }

    /// The key watcher `watch_id` ended (etcd cancelled it): its key is dropped, since writes may no longer reach
    /// it. Returns the key and its ownership revision, for the caller to give the ownership up.
    pub fn watcher_ended(&mut self, watch_id: i64) -> Option<(Vec<u8>, i64)> {
        let key = self.watchers.remove(&watch_id)?;
        let entry = self.entries.remove(&key)?;
        Some((key, entry.ownership_revision))
    }

    /// An event on the ownership key of `key` (from the watcher on the leasing prefix). `REVOKE` written into an
    /// ownership key under `lease` (this proxy's) ends ownership: the entry goes, the key backs off, and the actor
    /// deletes the ownership key. A deletion of the ownership key (its lease expired or was revoked) ends it as
    /// well. Returns the watch id of the dropped entry's watcher (to cancel) and what to rescind.
    pub fn ownership_event(
        &mut self,
        key: &[u8],
        kind: EventType,
        ownership: &KeyValue,
        lease: i64,
        now: Instant,
    ) -> (Option<i64>, Rescind) {
        let revoked = kind == EventType::Put && ownership.value.as_ref() == b"REVOKE";
        let ours = ownership.lease == lease;
        let ends = kind == EventType::Delete || (revoked && ours);
        if !ends {
            return (None, Rescind::Nothing);
        }
        let mut cancelled = None;
        match self.entries.get_mut(key) {
            Some(entry) if entry.ownership_revision == 0 => {
                entry.ended_at = Some(entry.ended_at.unwrap_or(0).max(ownership.mod_revision))
            }
            Some(_) => {
                let entry = self.entries.remove(key).expect("present");
                self.watchers.remove(&entry.watch_id);
                cancelled = Some(entry.watch_id);
            }
            None => {}
        }
        if !revoked || !ours {
            return (cancelled, Rescind::Nothing);
        }
        self.backoff.insert(key.to_vec(), now + REVOKE_BACKOFF);
        (
            cancelled,
            Rescind::Delete {
                ownership_key: ownership.key.to_vec(),
                before: ownership.mod_revision,
            },
        )
    }

    /// Drops the entries in `[start, end)` before a write through this proxy changes them, and marks the range as
    /// being written until [`Owned::end_write`]. Returns the dropped keys with their ownership revisions and
    /// watcher ids, for the caller to give ownership up.
    pub fn begin_write(&mut self, start: &[u8], end: &[u8]) -> Vec<(Vec<u8>, i64, i64)> {
        *self
            .writing
            .entry((start.to_vec(), end.to_vec()))
            .or_default() += 1;
        let keys: Vec<Vec<u8>> = self
            .entries
            .keys()
            .filter(|k| in_range(k, start, end))
            .cloned()
            .collect();
        let mut released = Vec::new();
        for key in keys {
            let entry = self.entries.remove(&key).expect("listed");
            self.watchers.remove(&entry.watch_id);
            if entry.ownership_revision > 0 {
                released.push((key, entry.ownership_revision, entry.watch_id));
            }
        }
        released
    }

    /// The write of `[start, end)` is done.
    pub fn end_write(&mut self, start: &[u8], end: &[u8]) {
        let range = (start.to_vec(), end.to_vec());
        if let Some(count) = self.writing.get_mut(&range) {
            *count -= 1;
            if *count == 0 {
                self.writing.remove(&range);
            }
        }
    }

    /// The session was lost: nothing is owned any more. Returns the watcher ids to cancel.
    pub fn clear(&mut self) -> BTreeSet<i64> {
        self.entries.clear();
        std::mem::take(&mut self.watchers).into_keys().collect()
    }

    /// Forgets back-offs that are over.
    pub fn forget_old_backoffs(&mut self, now: Instant) {
        self.backoff.retain(|_, until| now < *until);
    }

    /// Keys owned (and confirmed) now.
    pub fn len(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.ownership_revision > 0)
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The answer to a single-key Range (no revision, no range end) from an entry, as etcd would give it: the
/// modification and creation bounds filter the key out, `count_only` and `keys_only` trim it.
pub fn answer(entry: &Entry, request: &RangeRequest) -> RangeResponse {
    let kept = entry.kv.as_ref().filter(|kv| {
        kv.mod_revision >= request.min_mod_revision
            && (request.max_mod_revision == 0 || kv.mod_revision <= request.max_mod_revision)
            && kv.create_revision >= request.min_create_revision
            && (request.max_create_revision == 0
                || kv.create_revision <= request.max_create_revision)
    });
    let count = i64::from(kept.is_some());
    let kvs = match (kept, request.count_only) {
        (Some(kv), false) => {
            let mut kv = kv.clone();
            if request.keys_only {
                kv.value.clear();
            }
            vec![kv]
        }
        _ => Vec::new(),
    };
    RangeResponse {
        header: Some(entry.header),
        kvs,
        more: false,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(revision: i64) -> ResponseHeader {
        ResponseHeader {
            revision,
            ..Default::default()
        }
    }

    fn kv(key: &str, value: &str, revision: i64, lease: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease,
        }
    }

    /// An entry for `key` owned since revision 10 in generation 1, its watcher confirmed.
    fn owned(key: &str) -> (Owned, i64) {
        let mut owned = Owned::default();
        let id = owned.begin_acquire(key.as_bytes(), 1);
        assert!(owned.finish_acquire(
            key.as_bytes(),
            1,
            Some(10),
            Some(kv(key, "v1", 5, 0)),
            header(10)
        ));
        owned.watcher_created(id);
        (owned, id)
    }

    #[test]
    fn an_entry_answers_only_once_owned_and_watched_in_its_own_session() {
        let mut owned = Owned::default();
        let id = owned.begin_acquire(b"k", 1);
        assert!(owned.servable(b"k", 1).is_none(), "pending");
        owned.finish_acquire(b"k", 1, Some(10), Some(kv("k", "v", 5, 0)), header(10));
        assert!(owned.servable(b"k", 1).is_none(), "watcher not confirmed");
        owned.watcher_created(id);
        assert!(owned.servable(b"k", 1).is_some());
        assert!(owned.servable(b"k", 2).is_none(), "another session's entry");
    }

    #[test]
    fn a_failed_acquisition_keeps_nothing() {
        let mut owned = Owned::default();
        owned.begin_acquire(b"k", 1);
        assert!(!owned.finish_acquire(b"k", 1, None, None, header(10)));
        assert!(owned.may_acquire(b"k", Instant::now()));
        owned.begin_acquire(b"k", 1);
        owned.abandon_acquire(b"k");
        assert!(owned.is_empty());
    }

    #[test]
    fn a_revoke_seen_while_acquiring_is_not_lost() {
        let mut owned = Owned::default();
        owned.begin_acquire(b"k", 1);
        // The acquiring Txn committed at 10; the revoke at 11 arrives on the prefix watcher before its answer.
        let (_, rescind) = owned.ownership_event(
            b"k",
            EventType::Put,
            &KeyValue {
                mod_revision: 11,
                ..kv("P/k", "REVOKE", 10, 7)
            },
            7,
            Instant::now(),
        );
        assert!(matches!(rescind, Rescind::Delete { before: 11, .. }));
        assert!(!owned.finish_acquire(b"k", 1, Some(10), None, header(10)));
        assert!(owned.servable(b"k", 1).is_none());
    }

    #[test]
    fn a_revoke_of_our_key_drops_it_backs_off_and_asks_to_delete_the_ownership_key() {
        let (mut owned, id) = owned("k");
        let now = Instant::now();
        let revoke = KeyValue {
            mod_revision: 12,
            ..kv("P/k", "REVOKE", 10, 7)
        };
        let (cancelled, rescind) = owned.ownership_event(b"k", EventType::Put, &revoke, 7, now);
        assert_eq!(cancelled, Some(id));
        assert_eq!(
            rescind,
            Rescind::Delete {
                ownership_key: b"P/k".to_vec(),
                before: 12
            }
        );
        assert!(owned.servable(b"k", 1).is_none());
        assert!(!owned.may_acquire(b"k", now), "backs off");
        assert!(owned.may_acquire(b"k", now + REVOKE_BACKOFF));
    }

    #[test]
    fn a_revoke_of_another_clients_key_or_an_ordinary_put_is_ignored() {
        let (mut owned, _) = owned("k");
        let now = Instant::now();
        let theirs = kv("P/k", "REVOKE", 10, 8);
        assert_eq!(
            owned.ownership_event(b"k", EventType::Put, &theirs, 7, now),
            (None, Rescind::Nothing)
        );
        let acquired = kv("P/k", "", 10, 7);
        assert_eq!(
            owned.ownership_event(b"k", EventType::Put, &acquired, 7, now),
            (None, Rescind::Nothing)
        );
        assert!(owned.servable(b"k", 1).is_some());
    }

    #[test]
    fn a_deleted_ownership_key_ends_ownership_without_a_rescind() {
        let (mut owned, id) = owned("k");
        let gone = KeyValue {
            mod_revision: 13,
            ..Default::default()
        };
        let (cancelled, rescind) =
            owned.ownership_event(b"k", EventType::Delete, &gone, 7, Instant::now());
        assert_eq!((cancelled, rescind), (Some(id), Rescind::Nothing));
        assert!(owned.is_empty());
    }

    #[test]
    fn the_entry_follows_its_keys_events_from_any_writer() {
        let (mut owned, id) = owned("k");
        owned.key_event(id, EventType::Put, kv("k", "v2", 11, 0), &header(11));
        let entry = owned.servable(b"k", 1).unwrap();
        assert_eq!(entry.kv.as_ref().unwrap().value.as_ref(), b"v2");
        assert_eq!(entry.header.revision, 11);
        owned.key_event(id, EventType::Delete, kv("k", "", 12, 0), &header(12));
        let answer = answer(owned.servable(b"k", 1).unwrap(), &RangeRequest::default());
        assert_eq!((answer.count, answer.kvs.len()), (0, 0));
        assert_eq!(answer.header.unwrap().revision, 12);
    }

    #[test]
    fn a_write_through_the_proxy_releases_owned_keys_in_its_range_only() {
        let (mut owned, _) = owned("a");
        for key in ["b", "c"] {
            let id = owned.begin_acquire(key.as_bytes(), 1);
            owned.finish_acquire(key.as_bytes(), 1, Some(20), None, header(20));
            owned.watcher_created(id);
        }
        let released = owned.begin_write(b"b", b"c");
        assert_eq!(released.len(), 1);
        assert_eq!(released[0].0, b"b");
        assert!(owned.servable(b"a", 1).is_some() && owned.servable(b"c", 1).is_some());
        assert!(!owned.may_acquire(b"b", Instant::now()), "being written");
        owned.end_write(b"b", b"c");
        assert!(owned.may_acquire(b"b", Instant::now()));
        let everything = owned.begin_write(b"", &[0]);
        assert_eq!(everything.len(), 2, "\\0 is every key on");
    }

    #[test]
    fn a_lost_session_clears_every_entry() {
        let (mut owned, id) = owned("k");
        assert_eq!(owned.clear().into_iter().collect::<Vec<_>>(), vec![id]);
        assert!(owned.servable(b"k", 1).is_none());
    }

    #[test]
    fn local_answers_apply_etcds_filters() {
        let (owned, _) = owned("k");
        let entry = owned.servable(b"k", 1).unwrap();
        let plain = answer(entry, &RangeRequest::default());
        assert_eq!((plain.count, plain.kvs[0].value.as_ref()), (1, &b"v1"[..]));
        let keys_only = answer(
            entry,
            &RangeRequest {
                keys_only: true,
                ..Default::default()
            },
        );
        assert!(keys_only.kvs[0].value.is_empty());
        let count_only = answer(
            entry,
            &RangeRequest {
                count_only: true,
                ..Default::default()
            },
        );
        assert_eq!((count_only.count, count_only.kvs.len()), (1, 0));
        let too_new = answer(
            entry,
            &RangeRequest {
                min_mod_revision: 6,
                ..Default::default()
            },
        );
        assert_eq!((too_new.count, too_new.kvs.len()), (0, 0));
        let old_enough = answer(
            entry,
            &RangeRequest {
                max_create_revision: 5,
                ..Default::default()
            },
        );
        assert_eq!(old_enough.count, 1);
    }

    #[test]
    fn ranges_follow_etcds_semantics() {
        assert!(in_range(b"a", b"a", b""));
        assert!(!in_range(b"ab", b"a", b""));
        assert!(in_range(b"zz", b"a", &[0]));
        assert!(in_range(b"a", b"a", b"b") && !in_range(b"b", b"a", b"b"));
    }
}
