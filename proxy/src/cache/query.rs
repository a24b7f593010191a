//! Which Range requests the cache can answer, and the answer etcd would give to one from a range's keys.
//!
//! etcd answers a Range by taking every key of `[key, range_end)` at the revision, dropping those outside the
//! revision filters, sorting, and cutting at `limit` (`more` says it cut); `count` is the number of keys in the
//! range before any filter or limit; `keys_only` empties values, `count_only` sends no keys at all. The same steps
//! on the cache's copy of the range give the same answer, with one exception: Go's sort is not stable, so etcd's
//! order of keys that tie on a sort target other than the key cannot be known. Such a read goes to etcd.

use std::cmp::Ordering;
use std::ops::Bound;

use bytes::Bytes;
use prost::Message;
use proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use proto::etcdserverpb::{RangeRequest, RangeResponse, ResponseHeader};
use proto::mvccpb::KeyValue;

/// A range of keys as etcd reads `key` and `range_end`: an empty end is the key alone, `"\0"` every key from
/// `key` on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyRange {
    pub key: Bytes,
    pub end: Bytes,
}

impl KeyRange {
    pub fn contains(&self, key: &[u8]) -> bool {
        if self.end.is_empty() {
            return key == &self.key[..];
        }
        key >= &self.key[..] && (self.end[..] == [0] || key < &self.end[..])
    }

    /// A range of more than one key (`end` set): only such a range can cover another besides itself.
    pub fn is_wide(&self) -> bool {
        !self.end.is_empty()
    }

    /// Whether every key `other` may hold lies in this range, so that this range's keys in `other` are all of
    /// `other`'s keys. A range whose end is at or before its key holds nothing, and is covered only by itself.
    pub fn covers(&self, other: &KeyRange) -> bool {
        if self == other {
            return true;
        }
        if other.end.is_empty() {
            return self.contains(&other.key);
        }
        let to_the_last_key = |r: &KeyRange| r.end[..] == [0];
        if !to_the_last_key(other) && other.end <= other.key {
            return false;
        }
        self.is_wide()
            && self.key <= other.key
            && (to_the_last_key(self) || (!to_the_last_key(other) && other.end <= self.end))
    }

    /// The bounds of this range's keys, for a map ordered by key; `None` when it holds no key.
    pub fn bounds(&self) -> Option<KeyBounds<'_>> {
        let start = Bound::Included(&self.key[..]);
        if self.end.is_empty() {
            return Some((start, Bound::Included(&self.key[..])));
        }
        if self.end[..] == [0] {
            return Some((start, Bound::Unbounded));
        }
        (self.key < self.end).then_some((start, Bound::Excluded(&self.end[..])))
    }
}

/// The first and last key of a range, as `BTreeMap::range` takes them.
pub type KeyBounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// A Range request the cache can answer: a read of the newest revision with options it can apply exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    pub range: KeyRange,
    pub serializable: bool,
    request: RangeRequest,
}

impl Query {
    /// The request as the cache can serve it, or `None` when it must go to etcd: unreadable bytes, fields this
    /// proxy does not know (a newer etcd's options), an empty key (etcd's error), an old revision, a negative
    /// limit or an unknown sort.
    pub fn of(bytes: &[u8]) -> Option<Self> {
        let request = RangeRequest::decode(bytes).ok()?;
        // Re-encoding yields the same length only when every field was known and written once.
        let known = request.encoded_len() == bytes.len();
        let answerable = known
            && !request.key.is_empty()
            && request.revision == 0
            && request.limit >= 0
            && SortOrder::try_from(request.sort_order).is_ok()
            && SortTarget::try_from(request.sort_target).is_ok();
        answerable.then(|| Self {
            range: KeyRange {
                key: Bytes::from(request.key.clone()),
                end: Bytes::from(request.range_end.clone()),
            },
            serializable: request.serializable,
            request,
        })
    }

    /// Whether etcd's answer to this request holds every key of its range with its value, so that it can fill
    /// the cache's copy of the range.
    pub fn answer_fills(&self, answer: &RangeResponse) -> bool {
        let r = &self.request;
        let unfiltered = r.min_mod_revision == 0
            && r.max_mod_revision == 0
            && r.min_create_revision == 0
            && r.max_create_revision == 0;
        unfiltered
            && !r.keys_only
            && !r.count_only
            && !answer.more
            && i64::try_from(answer.kvs.len()) == Ok(answer.count)
    }

    /// etcd's answer from `kvs`, every key of the range at `header.revision` in key order; `None` when keys tie
    /// on the sort target (see the module's note).
    pub fn answer<'a>(
        &self,
        kvs: impl Iterator<Item = &'a KeyValue>,
        header: ResponseHeader,
    ) -> Option<RangeResponse> {
        let r = &self.request;
        let mut count = 0i64;
        let mut kept: Vec<&KeyValue> = Vec::new();
        for kv in kvs {
            count += 1;
            if self.passes_filters(kv) {
                kept.push(kv);
            }
        }
        let mut answer = RangeResponse {
            header: Some(header),
            count,
            ..Default::default()
        };
        if r.count_only {
            return Some(answer);
        }
        self.sort(&mut kept)?;
        if r.limit > 0 && kept.len() > r.limit as usize {
            kept.truncate(r.limit as usize);
            answer.more = true;
        }
        answer.kvs = kept
            .into_iter()
            .map(|kv| {
                let mut kv = kv.clone();
                if r.keys_only {
                    kv.value = Bytes::new();
                }
                kv
            })
            .collect();
        Some(answer)
    }

    fn passes_filters(&self, kv: &KeyValue) -> bool {
        let r = &self.request;
        let within = |value: i64, min: i64, max: i64| {
            (min == 0 || value >= min) && (max == 0 || value <= max)
        };
        within(kv.mod_revision, r.min_mod_revision, r.max_mod_revision)
            && within(
                kv.create_revision,
                r.min_create_revision,
                r.max_create_revision,
            )
    }

    /// Sorts keys (given in key order) as etcd does; `None` when two tie on a target other than the key.
    fn sort(&self, kvs: &mut [&KeyValue]) -> Option<()> {
        let target = SortTarget::try_from(self.request.sort_target).ok()?;
        let mut order = SortOrder::try_from(self.request.sort_order).ok()?;
        // etcd sorts ascending by a target other than the key when no order is given.
        if order == SortOrder::None && target != SortTarget::Key {
            order = SortOrder::Ascend;
        }
        if target != SortTarget::Key {
            let compare = |a: &&KeyValue, b: &&KeyValue| compare_by(target, a, b);
            kvs.sort_by(compare);
            let ties = kvs
                .windows(2)
                .any(|pair| compare(&pair[0], &pair[1]) == Ordering::Equal);
            if ties {
                return None;
            }
        }
        if order == SortOrder::Descend {
            kvs.reverse();
        }
        Some(())
    }
}

fn compare_by(target: SortTarget, a: &KeyValue, b: &KeyValue) -> Ordering {
    match target {
        SortTarget::Key => a.key.cmp(&b.key),
        SortTarget::Version => a.version.cmp(&b.version),
        SortTarget::Create => a.create_revision.cmp(&b.create_revision),
        SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
        SortTarget::Value => a.value.cmp(&b.value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from(key.to_owned()),
            value: Bytes::from(value.to_owned()),
            create_revision: create,
            mod_revision: modified,
            version,
            lease: 0,
        }
    }

    fn store() -> Vec<KeyValue> {
        vec![
            kv("a", "3", 2, 2, 1),
            kv("b", "1", 3, 7, 3),
            kv("c", "2", 4, 5, 2),
        ]
    }

    fn query(request: RangeRequest) -> Query {
        Query::of(&request.encode_to_vec()).expect("answerable")
    }

    fn keys(answer: &RangeResponse) -> Vec<&[u8]> {
        answer.kvs.iter().map(|kv| &kv.key[..]).collect()
    }

    fn answer(request: RangeRequest) -> Option<RangeResponse> {
        let kvs = store();
        query(request).answer(kvs.iter(), ResponseHeader::default())
    }

    fn all() -> RangeRequest {
        RangeRequest {
            key: b"a".to_vec(),
            range_end: vec![0],
            ..Default::default()
        }
    }

    #[test]
    fn ranges_read_as_etcd_reads_them() {
        let single = KeyRange {
            key: Bytes::from_static(b"b"),
            end: Bytes::new(),
        };
        assert!(single.contains(b"b") && !single.contains(b"ba"));
        let from = KeyRange {
            key: Bytes::from_static(b"b"),
            end: Bytes::from_static(b"\0"),
        };
        assert!(from.contains(b"b") && from.contains(b"zzz") && !from.contains(b"a"));
        let span = KeyRange {
            key: Bytes::from_static(b"b"),
            end: Bytes::from_static(b"c"),
        };
        assert!(span.contains(b"bz") && !span.contains(b"c"));
    }

    #[test]
    fn limits_count_the_whole_range_and_say_more() {
        let limited = answer(RangeRequest { limit: 2, ..all() }).unwrap();
        assert_eq!(keys(&limited), [b"a", b"b"]);
        assert!(limited.more);
        assert_eq!(limited.count, 3);
        let exact = answer(RangeRequest { limit: 3, ..all() }).unwrap();
        assert!(!exact.more);
    }

    #[test]
    fn filters_apply_before_the_limit_but_not_to_the_count() {
        let filtered = answer(RangeRequest {
            min_mod_revision: 5,
            limit: 1,
            ..all()
        })
        .unwrap();
        assert_eq!(keys(&filtered), [b"b"]);
        assert!(filtered.more, "two keys passed the filter");
        assert_eq!(filtered.count, 3);
        let created = answer(RangeRequest {
            max_create_revision: 3,
            ..all()
        })
        .unwrap();
        assert_eq!(keys(&created), [b"a", b"b"]);
    }

    #[test]
    fn sorts_follow_etcd_and_ties_go_to_etcd() {
        let by_value = answer(RangeRequest {
            sort_target: SortTarget::Value as i32,
            ..all()
        })
        .unwrap();
        assert_eq!(keys(&by_value), [b"b", b"c", b"a"], "no order: ascending");
        let descending = answer(RangeRequest {
            sort_order: SortOrder::Descend as i32,
            limit: 2,
            ..all()
        })
        .unwrap();
        assert_eq!(keys(&descending), [b"c", b"b"]);
        let mut tied = store();
        tied[1].version = 1;
        let by_version = query(RangeRequest {
            sort_target: SortTarget::Version as i32,
            ..all()
        });
        assert!(
            by_version
                .answer(tied.iter(), ResponseHeader::default())
                .is_none()
        );
    }

    #[test]
    fn keys_only_and_count_only() {
        let keys_only = answer(RangeRequest {
            keys_only: true,
            ..all()
        })
        .unwrap();
        assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
        assert_eq!(keys_only.kvs[0].mod_revision, 2);
        let count_only = answer(RangeRequest {
            count_only: true,
            limit: 1,
            ..all()
        })
        .unwrap();
        assert!(count_only.kvs.is_empty() && !count_only.more);
        assert_eq!(count_only.count, 3);
    }

    #[test]
    fn requests_the_cache_cannot_answer_exactly_go_to_etcd() {
        let refused = |request: RangeRequest| Query::of(&request.encode_to_vec()).is_none();
        assert!(refused(RangeRequest {
            revision: 4,
            ..all()
        }));
        assert!(refused(RangeRequest { limit: -1, ..all() }));
        assert!(
            refused(RangeRequest::default()),
            "an empty key: etcd's error"
        );
        assert!(refused(RangeRequest {
            sort_target: 9,
            ..all()
        }));
        let mut unknown_field = all().encode_to_vec();
        unknown_field.extend_from_slice(&[0xa0, 0x06, 0x01]); // field 100
        assert!(Query::of(&unknown_field).is_none());
        let mut repeated_field = all().encode_to_vec();
        repeated_field.extend_from_slice(&[0x0a, 0x01, b'z']); // key again: the last one counts
        assert!(Query::of(&repeated_field).is_none());
    }

    #[test]
    fn only_whole_answers_fill() {
        let q = query(all());
        let whole = RangeResponse {
            kvs: store(),
            count: 3,
            ..Default::default()
        };
        assert!(q.answer_fills(&whole));
        let cut = RangeResponse {
            more: true,
            ..whole.clone()
        };
        assert!(!q.answer_fills(&cut));
        let short = RangeResponse {
            count: 4,
            ..whole.clone()
        };
        assert!(!q.answer_fills(&short));
        let keys_only = query(RangeRequest {
            keys_only: true,
            ..all()
        });
        assert!(!keys_only.answer_fills(&whole));
        let limited_but_whole = query(RangeRequest { limit: 5, ..all() });
        assert!(limited_but_whole.answer_fills(&whole));
    }

    fn range(key: &str, end: &[u8]) -> KeyRange {
        KeyRange {
            key: Bytes::from(key.to_owned()),
            end: Bytes::copy_from_slice(end),
        }
    }

    #[test]
    fn a_range_covers_the_ranges_whose_keys_all_lie_in_it() {
        let prefix = range("a/", b"a0");
        let from_b = range("b", &[0]);
        assert!(prefix.covers(&range("a/x", b"")), "a key in it");
        assert!(prefix.covers(&range("a/x", b"a/y")), "a range in it");
        assert!(prefix.covers(&range("a/", b"a0")), "itself");
        assert!(prefix.covers(&range("a/x/", b"a/x0")), "a prefix in it");
        assert!(
            !prefix.covers(&range("a/x", b"b")),
            "a range that ends past it"
        );
        assert!(
            !prefix.covers(&range("a", b"a/z")),
            "a range that starts before it"
        );
        assert!(
            !prefix.covers(&range("a/x", &[0])),
            "every key from one in it on"
        );
        assert!(!prefix.covers(&range("b", b"")), "a key outside");
        assert!(
            from_b.covers(&range("c", &[0])),
            "every key from a later one"
        );
        assert!(from_b.covers(&range("c", b"d")));
        assert!(!from_b.covers(&range("a", &[0])));
        let key = range("a/x", b"");
        assert!(key.covers(&key.clone()));
        assert!(
            !key.covers(&range("a/x", b"a/x\0")),
            "a single key covers only itself"
        );
        // A range that ends before it starts holds nothing; only the same request is answered like it.
        let backwards = range("a/y", b"a/x");
        assert!(!prefix.covers(&backwards));
        assert!(backwards.covers(&backwards.clone()));
    }

    #[test]
    fn bounds_select_the_keys_etcd_reads() {
        let keys: std::collections::BTreeMap<Bytes, ()> = ["a", "a/1", "a/2", "b", "c"]
            .into_iter()
            .map(|k| (Bytes::from(k), ()))
            .collect();
        let read = |r: KeyRange| -> Vec<&[u8]> {
            r.bounds()
                .map(|b| keys.range::<[u8], _>(b).map(|(k, _)| &k[..]).collect())
                .unwrap_or_default()
        };
        assert_eq!(read(range("a/", b"a0")), [&b"a/1"[..], b"a/2"]);
        assert_eq!(read(range("a/1", b"")), [&b"a/1"[..]]);
        assert_eq!(read(range("b", &[0])), [&b"b"[..], b"c"]);
        assert!(read(range("c", b"b")).is_empty());
        assert!(read(range("b", b"b")).is_empty());
    }
}
