//! Ranges resting after their copy was retired ([`super::store::Store::missed`]): reads of a resting range go to
//! etcd, as with the cache off, and fill no copy until its rest is over. A rest starts at [`REST_MIN`] and doubles,
//! up to [`REST_MAX`], each time the range's next copy is retired again without having answered a read; a copy that
//! answered before it was retired starts the range at [`REST_MIN`] again. So a range whose copies cannot answer
//! (etcd before 3.5.8 and writes through the proxy) costs a copy for a small share of the time, and one whose
//! writes stop is cached again within its current rest.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::query::KeyRange;
use super::store::{MAX_COPIES, Retired};

/// The first rest of a range after its copy was retired.
pub const REST_MIN: Duration = Duration::from_secs(1);

/// The longest rest: the longest a range whose writes have stopped may go to etcd before it is cached again.
pub const REST_MAX: Duration = Duration::from_secs(32);

/// The rest that follows a `last` one that did not help (the copy after it answered nothing either): twice as
/// long, up to `longest`; [`REST_MIN`] after none. The cache's sleep ([`super::sleep`]) grows the same way.
pub fn next_rest(last: Option<Duration>, longest: Duration) -> Duration {
    last.map_or(REST_MIN, |last| (last * 2).min(longest))
}

/// One range's rest: until when, and how long the next one is should the next copy answer nothing either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rest {
    until: Instant,
    length: Duration,
}

/// The ranges resting now, and those that rested before (whose next rest is longer); at most [`MAX_COPIES`].
#[derive(Default)]
pub struct Resting {
    ranges: HashMap<KeyRange, Rest>,
}

impl Resting {
    /// A copy was retired at `now`: its range rests.
    pub fn retired(&mut self, retired: Retired, now: Instant) {
        let last = match retired.answered_once {
            false => self.ranges.get(&retired.range).map(|rest| rest.length),
            true => None,
        };
        let length = next_rest(last, REST_MAX);
        if self.ranges.len() >= MAX_COPIES && !self.ranges.contains_key(&retired.range) {
            // Ranges whose rest has been over a longest rest's time have had their next copy since (or are not
            // read): forgetting them only shortens a rest that may come.
            self.ranges
                .retain(|_, rest| now.saturating_duration_since(rest.until) < REST_MAX);
            if self.ranges.len() >= MAX_COPIES {
                return;
            }
        }
        self.ranges.insert(
            retired.range,
            Rest {
                until: now + length,
                length,
            },
        );
    }

    /// Whether `range` may be filled at `now`: it is not resting.
    pub fn may_fill(&self, range: &KeyRange, now: Instant) -> bool {
        self.ranges.get(range).is_none_or(|rest| rest.until <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn range(key: &str) -> KeyRange {
        KeyRange {
            key: Bytes::from(key.to_owned()),
            end: Bytes::new(),
        }
    }

    fn retired(key: &str, answered_once: bool) -> Retired {
        Retired {
            watch_id: 1,
            range: range(key),
            answered_once,
        }
    }

    #[test]
    fn a_range_whose_copies_never_answer_rests_longer_each_time_up_to_the_longest() {
        let mut resting = Resting::default();
        let t = Instant::now();
        assert!(resting.may_fill(&range("k"), t));
        resting.retired(retired("k", false), t);
        assert!(!resting.may_fill(&range("k"), t + REST_MIN / 2));
        assert!(resting.may_fill(&range("k"), t + REST_MIN));
        assert!(
            resting.may_fill(&range("other"), t),
            "only the retired range rests"
        );
        let mut now = t + REST_MIN;
        let mut expected = REST_MIN;
        for _ in 0..10 {
            resting.retired(retired("k", false), now);
            expected = (expected * 2).min(REST_MAX);
            assert!(!resting.may_fill(&range("k"), now + expected - Duration::from_millis(1)));
            assert!(resting.may_fill(&range("k"), now + expected));
            now += expected;
        }
        assert_eq!(expected, REST_MAX);
        // A copy that answered before it was retired: the shortest rest again.
        resting.retired(retired("k", true), now);
        assert!(resting.may_fill(&range("k"), now + REST_MIN));
    }

    #[test]
    fn at_most_max_copies_ranges_are_remembered_and_long_finished_rests_make_room() {
        let mut resting = Resting::default();
        let t = Instant::now();
        for n in 0..MAX_COPIES {
            resting.retired(retired(&format!("k{n}"), false), t);
        }
        // Full, and every rest still recent: the new range does not rest.
        resting.retired(retired("new", false), t + REST_MIN);
        assert!(resting.may_fill(&range("new"), t + REST_MIN));
        // Once those rests are long over, they make room.
        let later = t + REST_MIN + REST_MAX;
        resting.retired(retired("new", false), later);
        assert!(!resting.may_fill(&range("new"), later));
        assert_eq!(resting.ranges.len(), 1);
    }
}
