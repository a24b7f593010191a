//! etcd's key-range rules in one place: an empty `range_end` means the single key, `"\0"` means every key from
//! `key` on, anything else is the half-open interval `[key, range_end)` (empty if `range_end <= key`). Also the
//! range of every key with a prefix (`etcdctl get --prefix`, a namespace) and whether one range lies in another.

use std::ops::Bound;

/// `BTreeMap::range` bounds over keys.
pub type KeyBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// A key range as etcd interprets `key` and `range_end`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyRange {
    Single(Vec<u8>),
    From(Vec<u8>),
    Span(Vec<u8>, Vec<u8>),
}

impl KeyRange {
    pub fn new(key: &[u8], range_end: &[u8]) -> Self {
        match range_end {
            [] => Self::Single(key.to_vec()),
            [0] => Self::From(key.to_vec()),
            end => Self::Span(key.to_vec(), end.to_vec()),
        }
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        match self {
            Self::Single(k) => k.as_slice() == key,
            Self::From(start) => key >= start.as_slice(),
            Self::Span(start, end) => key >= start.as_slice() && key < end.as_slice(),
        }
    }

    /// Bounds for `BTreeMap::range`; `None` when the range is empty (a `range_end` at or before `key`).
    pub fn bounds(&self) -> Option<KeyBounds> {
        match self {
            Self::Single(k) => Some((Bound::Included(k.clone()), Bound::Included(k.clone()))),
            Self::From(start) => Some((Bound::Included(start.clone()), Bound::Unbounded)),
            Self::Span(start, end) if end > start => {
                Some((Bound::Included(start.clone()), Bound::Excluded(end.clone())))
            }
            Self::Span(..) => None,
        }
    }

    /// Every key that starts with `prefix` (every key at all for an empty prefix).
    pub fn prefix(prefix: &[u8]) -> Self {
        Self::new(prefix, &prefix_end(prefix))
    }

    /// Whether this range lies in `outer`: it starts in `outer` and ends at or before `outer` ends. An empty span
    /// must also start in `outer`, so that a request naming keys elsewhere is caught even when it reads nothing.
    pub fn within(&self, outer: &KeyRange) -> bool {
        let (start, end) = self.interval();
        let (outer_start, outer_end) = outer.interval();
        let starts_inside = start >= outer_start
            && outer_end
                .as_ref()
                .is_none_or(|outer_end| &start < outer_end);
        let ends_inside = match (&end, &outer_end) {
            (_, None) => true,
            (None, Some(_)) => false,
            (Some(end), Some(outer_end)) => end <= outer_end,
        };
        starts_inside && ends_inside
    }

    /// Whether two ranges share a key (for etcd's duplicate-key check in a txn).
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        let (a_start, a_end) = self.interval();
        let (b_start, b_end) = other.interval();
        let a_before_b_end = b_end.is_none_or(|end| a_start < end);
        let b_before_a_end = a_end.is_none_or(|end| b_start < end);
        a_before_b_end && b_before_a_end && !self.is_empty() && !other.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.bounds().is_none()
    }

    /// The range as `[start, end)` with `None` for "no end"; a single key is `[k, k\0)`.
    fn interval(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        match self {
            Self::Single(k) => {
                let mut next = k.clone();
                next.push(0);
                (k.clone(), Some(next))
            }
            Self::From(start) => (start.clone(), None),
            Self::Span(start, end) => (start.clone(), Some(end.clone())),
        }
    }
}

/// The `range_end` of every key starting with `prefix`, as etcd's clients compute it: the prefix without its
/// trailing `0xff` bytes, its last byte incremented; `"\0"` (no end) when nothing is left (an empty prefix, or one
/// of `0xff` bytes only).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while end.last() == Some(&0xff) {
        end.pop();
    }
    match end.last_mut() {
        Some(last) => *last += 1,
        None => end.push(0),
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_end_semantics_follow_etcd() {
        // (key, range_end, probe, contained)
        type Case<'a> = (&'a [u8], &'a [u8], &'a [u8], bool);
        let cases: &[Case] = &[
            (b"a", b"", b"a", true),
            (b"a", b"", b"ab", false),
            (b"a", b"\0", b"zzz", true),
            (b"b", b"\0", b"a", false),
            (b"\0", b"\0", b"a", true),
            (b"a", b"c", b"b", true),
            (b"a", b"c", b"c", false),
            (b"c", b"a", b"b", false),
        ];
        for (key, end, probe, want) in cases {
            assert_eq!(
                KeyRange::new(key, end).contains(probe),
                *want,
                "{key:?} {end:?} {probe:?}"
            );
        }
        assert!(KeyRange::new(b"c", b"a").bounds().is_none());
    }

    #[test]
    fn overlap_detects_shared_keys_only() {
        let single = |k: &[u8]| KeyRange::new(k, b"");
        assert!(single(b"a").overlaps(&single(b"a")));
        assert!(!single(b"a").overlaps(&single(b"b")));
        assert!(KeyRange::new(b"a", b"c").overlaps(&single(b"b")));
        assert!(!KeyRange::new(b"a", b"c").overlaps(&single(b"c")));
        assert!(KeyRange::new(b"a", b"\0").overlaps(&single(b"zz")));
        assert!(!KeyRange::new(b"c", b"a").overlaps(&single(b"b")));
    }

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"a", b"b"),
            (b"a/", b"a0"),
            (b"a\xff", b"b"),
            (b"a\xff\xff", b"b"),
            (b"\x00", b"\x01"),
            (b"\xff", b"\0"),
            (b"\xff\xff", b"\0"),
            (b"", b"\0"),
        ];
        for (prefix, end) in cases {
            assert_eq!(prefix_end(prefix), *end, "{prefix:?}");
        }
    }

    #[test]
    fn within_holds_only_for_ranges_inside_the_outer_one() {
        // (key, range_end, prefix, within)
        type Case<'a> = (&'a [u8], &'a [u8], &'a [u8], bool);
        let cases: &[Case] = &[
            (b"pa", b"", b"p", true),
            (b"p", b"", b"p", true),
            (b"q", b"", b"p", false),
            (b"o", b"", b"p", false),
            (b"pa", b"pz", b"p", true),
            (b"pa", b"q", b"p", true),
            (b"pa", b"q\0", b"p", false),
            (b"o", b"pz", b"p", false),
            // From-key ranges reach the end of the keyspace: inside only a prefix of 0xff bytes (or none).
            (b"pa", b"\0", b"p", false),
            (b"\xff\xffa", b"\0", b"\xff\xff", true),
            (b"\xff", b"\0", b"\xff\xff", false),
            (b"a", b"\0", b"", true),
            // Go's proxy ends "a\xff" at "b\0", which reaches key "b".
            (b"a\xff", b"b", b"a\xff", true),
            (b"a\xff", b"b\0", b"a\xff", false),
            // An empty span reads nothing, but must still be named inside.
            (b"pb", b"pa", b"p", true),
            (b"z", b"a", b"p", false),
        ];
        for (key, end, prefix, want) in cases {
            assert_eq!(
                KeyRange::new(key, end).within(&KeyRange::prefix(prefix)),
                *want,
                "{key:?} {end:?} in {prefix:?}"
            );
        }
    }
}
