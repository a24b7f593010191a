//! etcd's key-range rules in one place: an empty `range_end` means the single key, `"\0"` means every key from
//! `key` on, anything else is the half-open interval `[key, range_end)` (empty if `range_end <= key`).

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
}
