//! The cache's copies of ranges: for each, every key of the range at a known revision, kept current by applying
//! the events of the range's watcher. Bounded in bytes; the least recently read ranges go first. A read is
//! answered from the copy of its own range or of a range that covers it (one key of a cached prefix, say). A copy
//! that keeps failing to answer is retired ([`super::rest`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use proto::etcdserverpb::ResponseHeader;
use proto::mvccpb::{Event, KeyValue, event::EventType};
use tokio::time::Instant;

use super::query::KeyRange;
use crate::watch::hub::ETCD_RESYNC_PERIOD;

/// What a copy holds beyond its keys' bytes, counted against the bound: a key's place in the map and its fields.
const KEY_OVERHEAD: usize = 96;
/// A range's own cost besides its keys.
const RANGE_OVERHEAD: usize = 256;

/// The most ranges the cache holds at once, whatever their bytes: each has a watcher on etcd, and a cache of many
/// tiny ranges (single keys read once each) would otherwise cost etcd a watcher per key read.
pub const MAX_COPIES: usize = 4096;

/// Reads that a copy may fail to answer in a row (not at the revision they needed in time), over at least
/// [`UNANSWERED_FOR`], before it is retired: dropped with its watcher, so that a copy that cannot answer stops
/// costing (its events applied, its watcher on etcd). Before etcd 3.5.8 a copy moves by its own range's events
/// only, so every write through the proxy elsewhere leaves it behind the revision a serializable read needs; and a
/// range written faster than it is read is behind more often than not. A copy that answers now and then is kept:
/// any answer starts the count again.
pub const MISSES_TO_RETIRE: u32 = 32;

/// How long a copy must have failed to answer before it is retired, whatever the number of reads: longer than a
/// new copy takes to be of use (its watcher confirmed by etcd, and two of etcd's resync periods for a
/// linearizable read's progress answer), so that a hot range read thousands of times a second is not retired
/// while its copy warms up.
pub const UNANSWERED_FOR: Duration = Duration::from_secs(2);

/// How long after a copy's watcher is created etcd may still be syncing it: etcd syncs a watcher created from a
/// revision it has reached (as a copy's is) within its resync period, and the watch actor asks for progress again
/// one period after a request etcd may have dropped meanwhile; two periods cover both.
pub const SYNC_WINDOW: Duration = ETCD_RESYNC_PERIOD.saturating_mul(2);

/// The watch id of a copy's watcher on the cache's stream.
pub type WatchId = i64;

/// One cached range.
pub struct Copy {
    pub range: KeyRange,
    pub kvs: BTreeMap<Bytes, KeyValue>,
    /// The revision the copy is the range's state at.
    pub revision: i64,
    /// The header of the answer that filled it: cluster, member and term for the answers it gives.
    header: ResponseHeader,
    pub watch_id: WatchId,
    /// The progress requests sent on the stream before etcd confirmed the copy's watcher; an answer to a later
    /// one covers it.
    pub covered_from: Option<u64>,
    bytes: usize,
    last_used: u64,
    /// Reads in a row it could not answer ([`MISSES_TO_RETIRE`]), since the first of them.
    misses: u32,
    first_miss: Option<Instant>,
    /// It answered a read since it was filled: a copy of use, should it be retired later.
    answered_once: bool,
}

impl Copy {
    /// The copy's keys within `range` (a range it covers), in key order.
    pub fn kvs_in<'a>(&'a self, range: &'a KeyRange) -> impl Iterator<Item = &'a KeyValue> + 'a {
        range
            .bounds()
            .map(|bounds| self.kvs.range::<[u8], _>(bounds).map(|(_, kv)| kv))
            .into_iter()
            .flatten()
    }

    /// The copy answered a read: it is worth its cost, and the count of reads it missed starts again.
    pub fn answered(&mut self) {
        self.misses = 0;
        self.first_miss = None;
        self.answered_once = true;
    }

    /// A header for an answer from this copy.
    pub fn header(&self) -> ResponseHeader {
        ResponseHeader {
            revision: self.revision,
            ..self.header
        }
    }
}

/// A copy retired for failing to answer ([`Store::missed`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Retired {
    pub watch_id: WatchId,
    pub range: KeyRange,
    /// It had answered some read before it stopped answering.
    pub answered_once: bool,
}

/// What a change to the store did, for the metrics and the watchers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Evicted {
    pub watch_ids: Vec<WatchId>,
}

/// Every cached range.
pub struct Store {
    max_bytes: usize,
    bytes: usize,
    /// Ordered, so that the choice among covering copies is the same from run to run.
    copies: BTreeMap<KeyRange, Copy>,
    /// The copies of more than one key: the only ones that can cover another range than their own.
    wide: BTreeSet<KeyRange>,
    by_watch: HashMap<WatchId, KeyRange>,
    /// Ranges by last use, oldest first.
    recency: BTreeMap<u64, KeyRange>,
    clock: u64,
    next_watch: WatchId,
}

impl Store {
    pub fn new(max_bytes: usize) -> Self {
        Self {
            max_bytes,
            bytes: 0,
            copies: BTreeMap::new(),
            wide: BTreeSet::new(),
            by_watch: HashMap::new(),
            recency: BTreeMap::new(),
            clock: 0,
            next_watch: 1,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// The copy that answers reads of `range` ([`Store::get`]), marked as just used.
    pub fn read(&mut self, range: &KeyRange) -> Option<&mut Copy> {
        // A range's own copy is found with one lookup, and nothing is cloned; a covered range looks its covering
        // copy up first.
        let covering;
        let key = if self.copies.contains_key(range) {
            range
        } else {
            covering = self.get(range)?.range.clone();
            &covering
        };
        let copy = self.copies.get_mut(key)?;
        self.clock += 1;
        // The recency entry moves to the new time with the range it already holds.
        if let Some(entry) = self.recency.remove(&copy.last_used) {
            self.recency.insert(self.clock, entry);
        }
        copy.last_used = self.clock;
        Some(copy)
    }

    /// The copy that answers reads of `range`: its own, or else, of the copies covering it, the one furthest
    /// along (a confirmed watcher first, then the newest revision).
    pub fn get(&self, range: &KeyRange) -> Option<&Copy> {
        if let Some(copy) = self.copies.get(range) {
            return Some(copy);
        }
        self.wide
            .iter()
            .filter(|wide| wide.covers(range))
            .filter_map(|wide| self.copies.get(wide))
            .max_by_key(|copy| (copy.covered_from.is_some(), copy.revision))
    }

    /// A read of `range` went to etcd at `now`: the copy that answers such reads, if any, could not answer it. It
    /// is retired after [`MISSES_TO_RETIRE`] in a row over [`UNANSWERED_FOR`] at least (returned, for its watcher
    /// to be cancelled and its range to rest).
    pub fn missed(&mut self, range: &KeyRange, now: Instant) -> Option<Retired> {
        let own = self.get(range)?.range.clone();
        let copy = self.copies.get_mut(&own).expect("just found");
        copy.misses += 1;
        let since = *copy.first_miss.get_or_insert(now);
        if copy.misses < MISSES_TO_RETIRE || now.saturating_duration_since(since) < UNANSWERED_FOR {
            return None;
        }
        let retired = Retired {
            watch_id: copy.watch_id,
            answered_once: copy.answered_once,
            range: own,
        };
        self.drop_watch(retired.watch_id);
        Some(retired)
    }

    /// Adds a copy of `range` filled from an answer at `header.revision`; returns its new watch id (the watcher to
    /// create from the next revision) and the copies evicted to make room. `None` when the range is already
    /// cached (or covered by a cached range) or would take more than an eighth of the bound. (Whether a retired
    /// range has rested enough is the caller's question: [`super::rest::Resting`].)
    pub fn fill(
        &mut self,
        range: KeyRange,
        kvs: Vec<KeyValue>,
        header: ResponseHeader,
    ) -> Option<(WatchId, Evicted)> {
        if self.get(&range).is_some() {
            return None;
        }
        let bytes = RANGE_OVERHEAD + kvs.iter().map(cost).sum::<usize>();
        if bytes > self.max_bytes / 8 {
            return None;
        }
        let watch_id = self.next_watch;
        self.next_watch += 1;
        self.clock += 1;
        let copy = Copy {
            range: range.clone(),
            kvs: kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            revision: header.revision,
            header,
            watch_id,
            covered_from: None,
            bytes,
            last_used: self.clock,
            misses: 0,
            first_miss: None,
            answered_once: false,
        };
        self.bytes += bytes;
        self.by_watch.insert(watch_id, range.clone());
        self.recency.insert(self.clock, range.clone());
        if range.is_wide() {
            self.wide.insert(range.clone());
        }
        self.copies.insert(range, copy);
        Some((watch_id, self.evict_over_bound()))
    }

    /// Applies the events a copy's watcher delivered; returns the copies evicted if it grew past the bound.
    pub fn apply(&mut self, watch_id: WatchId, events: &[Event]) -> Evicted {
        let Some(copy) = self
            .by_watch
            .get(&watch_id)
            .and_then(|range| self.copies.get_mut(range))
        else {
            return Evicted::default();
        };
        for event in events {
            let Some(kv) = &event.kv else { continue };
            // A watcher from the next revision after the fill never repeats an event, but a resumed one could:
            // the copy already reflects everything up to its revision.
            if kv.mod_revision <= copy.revision || !copy.range.contains(&kv.key) {
                continue;
            }
            let removed = if event.r#type == EventType::Delete as i32 {
                copy.kvs.remove(&kv.key)
            } else {
                let added = cost(kv);
                copy.bytes += added;
                self.bytes += added;
                copy.kvs.insert(kv.key.clone(), kv.clone())
            };
            if let Some(old) = removed {
                copy.bytes -= cost(&old);
                self.bytes -= cost(&old);
            }
        }
        if let Some(last) = events.iter().filter_map(|e| e.kv.as_ref()).last() {
            copy.revision = copy.revision.max(last.mod_revision);
        }
        self.evict_over_bound()
    }

    /// etcd confirmed the copy's watcher; `progress_sent` progress requests had gone out on the stream.
    pub fn confirmed(&mut self, watch_id: WatchId, progress_sent: u64) {
        if let Some(copy) = self
            .by_watch
            .get(&watch_id)
            .and_then(|range| self.copies.get_mut(range))
        {
            copy.covered_from.get_or_insert(progress_sent);
        }
    }

    /// Progress request number `request` was answered at `revision`: every copy whose watcher etcd confirmed
    /// before that request went out has received every event up to `revision`.
    pub fn progress(&mut self, request: u64, revision: i64) {
        for copy in self.copies.values_mut() {
            if copy.covered_from.is_some_and(|sent| sent < request) {
                copy.revision = copy.revision.max(revision);
            }
        }
    }

    /// Drops the copy of the watcher `watch_id` (cancelled, compacted, or evicted).
    pub fn drop_watch(&mut self, watch_id: WatchId) -> bool {
        let Some(range) = self.by_watch.remove(&watch_id) else {
            return false;
        };
        self.wide.remove(&range);
        if let Some(copy) = self.copies.remove(&range) {
            self.bytes -= copy.bytes;
            self.recency.remove(&copy.last_used);
        }
        true
    }

    /// Drops every copy (their watchers' stream is gone, or the cache falls asleep); returns their watchers, in
    /// the order of their ranges.
    pub fn clear(&mut self) -> Vec<WatchId> {
        let dropped = self.copies.values().map(|copy| copy.watch_id).collect();
        self.copies.clear();
        self.wide.clear();
        self.by_watch.clear();
        self.recency.clear();
        self.bytes = 0;
        dropped
    }

    fn evict_over_bound(&mut self) -> Evicted {
        let mut evicted = Evicted::default();
        while self.bytes > self.max_bytes || self.copies.len() > MAX_COPIES {
            let Some((_, range)) = self.recency.pop_first() else {
                break;
            };
            let watch_id = self.copies.get(&range).map(|c| c.watch_id);
            if let Some(watch_id) = watch_id {
                self.drop_watch(watch_id);
                evicted.watch_ids.push(watch_id);
            }
        }
        evicted
    }
}

/// What one key costs the bound.
fn cost(kv: &KeyValue) -> usize {
    KEY_OVERHEAD + kv.key.len() + kv.value.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, revision: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from(key.to_owned()),
            value: Bytes::from(value.to_owned()),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: 0,
        }
    }

    fn prefix(p: &str) -> KeyRange {
        let mut end = p.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        KeyRange {
            key: Bytes::from(p.to_owned()),
            end: Bytes::from(end),
        }
    }

    fn at(revision: i64) -> ResponseHeader {
        ResponseHeader {
            revision,
            member_id: 7,
            ..Default::default()
        }
    }

    fn put(key: &str, value: &str, revision: i64) -> Event {
        Event {
            r#type: EventType::Put as i32,
            kv: Some(kv(key, value, revision)),
            prev_kv: None,
        }
    }

    fn delete(key: &str, revision: i64) -> Event {
        Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                mod_revision: revision,
                ..kv(key, "", 0)
            }),
            prev_kv: None,
        }
    }

    fn values(store: &Store, range: &KeyRange) -> Vec<(String, String)> {
        store.copies[range]
            .kvs
            .values()
            .map(|kv| {
                (
                    String::from_utf8(kv.key.to_vec()).unwrap(),
                    String::from_utf8(kv.value.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn events_keep_a_copy_current_and_move_its_revision() {
        let mut store = Store::new(1 << 20);
        let range = prefix("a/");
        let (id, _) = store
            .fill(range.clone(), vec![kv("a/1", "x", 3)], at(5))
            .unwrap();
        store.apply(id, &[put("a/2", "y", 6), put("a/1", "z", 6)]);
        store.apply(id, &[delete("a/2", 7)]);
        assert_eq!(values(&store, &range), [("a/1".into(), "z".into())]);
        assert_eq!(store.get(&range).unwrap().header().revision, 7);
        assert_eq!(store.get(&range).unwrap().header().member_id, 7);
        // An event the copy already reflects changes nothing.
        store.apply(id, &[put("a/1", "old", 6)]);
        assert_eq!(values(&store, &range), [("a/1".into(), "z".into())]);
    }

    #[test]
    fn progress_covers_only_watchers_confirmed_before_the_request() {
        let mut store = Store::new(1 << 20);
        let (early, _) = store.fill(prefix("a/"), vec![], at(5)).unwrap();
        let (late, _) = store.fill(prefix("b/"), vec![], at(5)).unwrap();
        let (unconfirmed, _) = store.fill(prefix("c/"), vec![], at(5)).unwrap();
        store.confirmed(early, 0);
        store.confirmed(late, 1);
        store.progress(1, 9);
        assert_eq!(store.get(&prefix("a/")).unwrap().revision, 9);
        assert_eq!(store.get(&prefix("b/")).unwrap().revision, 5);
        store.progress(2, 10);
        assert_eq!(store.get(&prefix("b/")).unwrap().revision, 10);
        assert_eq!(store.get(&prefix("c/")).unwrap().revision, 5);
        let _ = unconfirmed;
    }

    #[test]
    fn the_least_recently_read_range_is_evicted_first() {
        let big = "v".repeat(1500);
        let mut store = Store::new(16 * 1000);
        let (a, _) = store
            .fill(prefix("a/"), vec![kv("a/1", &big, 2)], at(2))
            .unwrap();
        let (b, _) = store
            .fill(prefix("b/"), vec![kv("b/1", &big, 2)], at(2))
            .unwrap();
        assert!(store.read(&prefix("a/")).is_some());
        let mut evicted = Vec::new();
        for (n, p) in ["c/", "d/", "e/", "f/", "g/", "h/", "i/", "j/", "k/"]
            .into_iter()
            .enumerate()
        {
            let (_, out) = store
                .fill(
                    prefix(p),
                    vec![kv(&format!("{p}1"), &big, 2)],
                    at(2 + n as i64),
                )
                .unwrap();
            evicted.extend(out.watch_ids);
        }
        assert_eq!(evicted.first(), Some(&b), "b was read least recently");
        assert!(store.bytes() <= 16 * 1000);
        assert_eq!(evicted.get(1), Some(&a), "then a");
        assert!(store.get(&prefix("b/")).is_none());
    }

    #[test]
    fn growth_by_events_is_bounded_too_and_large_ranges_are_not_cached() {
        let mut store = Store::new(8 * 1000);
        let (a, _) = store.fill(prefix("a/"), vec![], at(2)).unwrap();
        let (_b, _) = store.fill(prefix("b/"), vec![], at(2)).unwrap();
        let big = "v".repeat(4000);
        let evicted = store.apply(a, &[put("a/1", &big, 3), put("a/2", &big, 3)]);
        assert!(store.bytes() <= 8 * 1000);
        assert!(!evicted.watch_ids.is_empty());
        assert!(
            store
                .fill(prefix("z/"), vec![kv("z/1", &big, 2)], at(2))
                .is_none(),
            "more than an eighth of the bound"
        );
    }

    #[test]
    fn the_number_of_ranges_is_bounded_too() {
        let mut store = Store::new(usize::MAX / 2);
        let mut evicted = Vec::new();
        for n in 0..=MAX_COPIES {
            let (_, out) = store
                .fill(prefix(&format!("r{n}/")), vec![], at(2))
                .unwrap();
            evicted.extend(out.watch_ids);
        }
        assert_eq!(store.len(), MAX_COPIES);
        assert_eq!(evicted, [1], "the first range, read least recently");
    }

    #[test]
    fn dropping_a_watch_frees_its_bytes() {
        let mut store = Store::new(1 << 20);
        let (id, _) = store
            .fill(prefix("a/"), vec![kv("a/1", "x", 2)], at(2))
            .unwrap();
        assert!(store.bytes() > 0);
        assert!(store.drop_watch(id));
        assert_eq!(store.bytes(), 0);
        assert!(store.is_empty());
        assert!(!store.drop_watch(id));
    }

    fn key(k: &str) -> KeyRange {
        KeyRange {
            key: Bytes::from(k.to_owned()),
            end: Bytes::new(),
        }
    }

    #[test]
    fn a_range_inside_a_cached_one_is_read_from_its_copy() {
        let mut store = Store::new(1 << 20);
        let (id, _) = store
            .fill(
                prefix("a/"),
                vec![kv("a/1", "x", 3), kv("a/2", "y", 4)],
                at(5),
            )
            .unwrap();
        store.apply(id, &[put("a/1", "z", 6)]);
        let one = key("a/1");
        let copy = store.read(&one).expect("the prefix's copy");
        assert_eq!(copy.range, prefix("a/"));
        let values: Vec<_> = copy.kvs_in(&one).map(|kv| kv.value.clone()).collect();
        assert_eq!(values, [Bytes::from("z")]);
        assert_eq!(copy.header().revision, 6);
        assert_eq!(
            copy.kvs_in(&key("a/3")).count(),
            0,
            "a key the range does not hold"
        );
        assert!(store.get(&key("b")).is_none(), "a key outside");
        // A covered range gets no copy (and no watcher) of its own.
        assert!(store.fill(one, vec![kv("a/1", "z", 6)], at(6)).is_none());
        assert_eq!(store.len(), 1);
        // Once the covering copy is gone, nothing answers for the key.
        assert!(store.drop_watch(id));
        assert!(store.get(&key("a/1")).is_none());
    }

    #[test]
    fn of_two_covering_copies_the_one_further_along_answers() {
        let mut store = Store::new(1 << 20);
        // The narrower first: a range a cached one covers gets no copy.
        let (narrow, _) = store.fill(prefix("a/"), vec![], at(7)).unwrap();
        let (wide, _) = store.fill(prefix("a"), vec![], at(5)).unwrap();
        let sub = key("a/1");
        assert_eq!(store.get(&sub).unwrap().range, prefix("a/"), "the newer");
        store.confirmed(wide, 0);
        assert_eq!(
            store.get(&sub).unwrap().range,
            prefix("a"),
            "a confirmed watcher first"
        );
        store.confirmed(narrow, 0);
        assert_eq!(store.get(&sub).unwrap().range, prefix("a/"));
    }

    #[test]
    fn a_copy_is_retired_after_missing_reads_in_a_row_over_a_while() {
        let mut store = Store::new(1 << 20);
        let range = prefix("a/");
        let (id, _) = store.fill(range.clone(), vec![], at(2)).unwrap();
        let t = Instant::now();
        // Any number of misses within UNANSWERED_FOR (a copy warming up): kept.
        for _ in 0..10 * MISSES_TO_RETIRE {
            assert_eq!(store.missed(&range, t), None);
        }
        // One answer, and both counts start again.
        store.read(&range).unwrap().answered();
        let later = t + UNANSWERED_FOR * 3;
        for _ in 1..MISSES_TO_RETIRE {
            assert_eq!(store.missed(&range, later), None);
        }
        assert_eq!(
            store.missed(&range, later + UNANSWERED_FOR / 2),
            None,
            "the first was at `later`: 32 misses, but too soon"
        );
        let retired = store
            .missed(&range, later + UNANSWERED_FOR)
            .expect("retired");
        assert_eq!(
            retired,
            Retired {
                watch_id: id,
                range: range.clone(),
                answered_once: true
            }
        );
        assert!(store.is_empty());
        assert_eq!(store.bytes(), 0);
        assert_eq!(store.missed(&range, later), None, "nothing left to miss");
    }

    #[test]
    fn a_read_inside_a_cached_range_counts_against_the_copy_that_covers_it() {
        let mut store = Store::new(1 << 20);
        let (id, _) = store.fill(prefix("a/"), vec![], at(2)).unwrap();
        let t = Instant::now();
        for _ in 1..MISSES_TO_RETIRE {
            assert_eq!(store.missed(&key("a/1"), t), None);
        }
        let retired = store.missed(&key("a/2"), t + UNANSWERED_FOR).unwrap();
        assert_eq!((retired.watch_id, retired.range), (id, prefix("a/")));
        assert!(!retired.answered_once);
    }
}
