//! The whole cache asleep while it answers next to nothing. A copy that keeps missing is retired on its own
//! ([`super::rest`]), but a read of a resting range still costs the cache's work around it: decoding the request,
//! looking its range up, sharing its call to etcd with identical reads in flight. When the copies answer fewer
//! than one read in [`MISSES_TO_RETIRE`] over at least [`judged_over`] (before etcd 3.5.8, every write
//! through the proxy leaves every quiet copy behind the revision a serializable read needs; a scan reads each range
//! once), the cache sleeps: its copies are dropped with their watchers, and every Range goes to etcd as with the
//! cache off, at the cost of a clock read. A sleep lasts [`super::rest::REST_MIN`], doubling up to [`SLEEP_MAX`]
//! while the cache wakes to answer nothing again ([`next_rest`]). Then it wakes, fills copies from the reads that
//! come, and is judged again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::CATCH_UP_WAIT;
use super::rest::next_rest;
use super::store::{MISSES_TO_RETIRE, SYNC_WINDOW};

/// How long the cache watches its copies answer before it is judged: longer than a copy that can answer takes to
/// start. etcd confirms its watcher within a round trip and syncs it within two of its resync periods
/// ([`SYNC_WINDOW`]), after which the copy's own events reach it; where progress answers move copies (etcd from
/// 3.5.8, or a version not known yet) a serializable read behind may also wait [`CATCH_UP_WAIT`] for one. Shorter
/// than a copy's own [`super::store::UNANSWERED_FOR`]: a cache whose copies all miss is known sooner than any one
/// copy is, and each time it wakes to a load that still leaves them behind it costs this long again.
pub fn judged_over(progress_may_move_copies: bool) -> Duration {
    match progress_may_move_copies {
        true => SYNC_WINDOW + CATCH_UP_WAIT,
        false => SYNC_WINDOW,
    }
}

/// The longest sleep: every range goes to etcd meanwhile, so it is shorter than a range's longest rest
/// ([`super::rest::REST_MAX`]); a cache whose writes stopped answers again within it.
pub const SLEEP_MAX: Duration = Duration::from_secs(8);

/// Until when the cache sleeps: read by every Range call without a lock.
pub struct Sleep {
    origin: Instant,
    /// Nanoseconds after `origin` until which the cache sleeps (0: awake since it started).
    until: AtomicU64,
}

impl Default for Sleep {
    /// Awake, from now.
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            until: AtomicU64::new(0),
        }
    }
}

impl Sleep {
    fn since_origin(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether the cache sleeps at `now`.
    pub fn asleep(&self, now: Instant) -> bool {
        self.since_origin(now) < self.until.load(Ordering::Relaxed)
    }

    /// The cache sleeps from `now` for `length`.
    pub fn start(&self, now: Instant, length: Duration) {
        self.until
            .store(self.since_origin(now + length), Ordering::Relaxed);
    }
}

/// The reads the cache looked up in its current judgement period (from its first miss), and how long its next
/// sleep is.
#[derive(Debug, Default)]
pub struct Window {
    /// The first miss of the period (`None` until one comes).
    started: Option<Instant>,
    answered: u32,
    missed: u32,
    /// The last sleep, if the cache has not answered enough since.
    last_sleep: Option<Duration>,
}

impl Window {
    /// A copy answered a read.
    pub fn answered(&mut self) {
        self.answered = self.answered.saturating_add(1);
    }

    /// A read the cache looked up went to etcd at `now` (not counted while the cache sleeps: a read already on its
    /// way when it fell asleep). Once the period holds [`MISSES_TO_RETIRE`] misses over `judged_over` at least
    /// ([`judged_over`]), it is judged and a new one begins: returns the length of the sleep to start if the copies
    /// answered fewer than one read in [`MISSES_TO_RETIRE`]. A period that reaches twice `judged_over` unjudged
    /// (reads too few, or paused: a load that comes in bursts) begins again at this miss, so that a burst is judged
    /// by its own reads, not by the last one's with its first few.
    pub fn missed(&mut self, now: Instant, judged_over: Duration) -> Option<Duration> {
        let started = *self.started.get_or_insert(now);
        if now.saturating_duration_since(started) > judged_over * 2 {
            *self = Self {
                started: Some(now),
                last_sleep: self.last_sleep,
                ..Self::default()
            };
        }
        let over = now.saturating_duration_since(self.started.unwrap_or(now));
        self.missed = self.missed.saturating_add(1);
        if self.missed < MISSES_TO_RETIRE || over < judged_over {
            return None;
        }
        let answered_enough = self.answered.saturating_mul(MISSES_TO_RETIRE) >= self.missed;
        let length = (!answered_enough).then(|| next_rest(self.last_sleep, SLEEP_MAX));
        *self = Self {
            last_sleep: length,
            ..Self::default()
        };
        length
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::rest::REST_MIN;

    /// The period where progress answers move copies.
    const JUDGED_OVER: Duration = SYNC_WINDOW.saturating_add(CATCH_UP_WAIT);

    /// `misses` misses spread evenly over `over`, from `from`, with `answers` answers among them; the sleep the
    /// last miss started, if any.
    fn period(
        window: &mut Window,
        from: Instant,
        over: Duration,
        misses: u32,
        answers: u32,
    ) -> Option<Duration> {
        for _ in 0..answers {
            window.answered();
        }
        let mut slept = None;
        for n in 0..misses {
            let at = from + over * n / (misses - 1).max(1);
            if let Some(length) = window.missed(at, JUDGED_OVER) {
                assert!(slept.is_none(), "one judgement per period");
                slept = Some(length);
            }
        }
        slept
    }

    #[test]
    fn a_cache_that_answers_nothing_over_the_period_sleeps_and_longer_each_time_up_to_the_longest()
    {
        let mut window = Window::default();
        let t = Instant::now();
        assert_eq!(
            period(&mut window, t, JUDGED_OVER, MISSES_TO_RETIRE, 0),
            Some(REST_MIN)
        );
        let mut expected = REST_MIN;
        for n in 1..10 {
            expected = (expected * 2).min(SLEEP_MAX);
            let from = t + JUDGED_OVER * 2 * n;
            assert_eq!(
                period(&mut window, from, JUDGED_OVER, MISSES_TO_RETIRE, 0),
                Some(expected)
            );
        }
        assert_eq!(expected, SLEEP_MAX);
        // A period that answers enough: no sleep, and the next one that does not is the shortest again.
        let from = t + JUDGED_OVER * 40;
        assert_eq!(
            period(&mut window, from, JUDGED_OVER, MISSES_TO_RETIRE, 1),
            None
        );
        assert_eq!(
            period(
                &mut window,
                from + JUDGED_OVER * 2,
                JUDGED_OVER,
                MISSES_TO_RETIRE,
                0
            ),
            Some(REST_MIN)
        );
    }

    #[test]
    fn a_cache_is_judged_only_over_enough_misses_and_enough_time() {
        let t = Instant::now();
        // Many misses in less than the period (copies warming up): not judged yet.
        let mut window = Window::default();
        let short = JUDGED_OVER - Duration::from_millis(1);
        assert_eq!(
            period(&mut window, t, short, 10 * MISSES_TO_RETIRE, 0),
            None
        );
        // The next miss completes the period.
        assert_eq!(window.missed(t + JUDGED_OVER, JUDGED_OVER), Some(REST_MIN));
        // Too few misses over the period: not judged.
        let mut window = Window::default();
        let (few, from) = (MISSES_TO_RETIRE - 1, t + JUDGED_OVER * 10);
        assert_eq!(period(&mut window, from, JUDGED_OVER, few, 0), None);
        // ... until enough come within twice the period,
        assert_eq!(
            window.missed(from + JUDGED_OVER * 2, JUDGED_OVER),
            Some(REST_MIN)
        );
        // ... and never if they are spread wider: the period begins again.
        let from = from + JUDGED_OVER * 10;
        assert_eq!(period(&mut window, from, JUDGED_OVER, few, 0), None);
        let late = from + JUDGED_OVER * 2 + Duration::from_millis(1);
        assert_eq!(window.missed(late, JUDGED_OVER), None);
    }

    #[test]
    fn a_burst_after_a_pause_is_judged_by_its_own_reads() {
        let t = Instant::now();
        let mut window = Window::default();
        // A burst whose reads all missed, stopped short of a judgement.
        assert_eq!(period(&mut window, t, JUDGED_OVER / 2, 20, 0), None);
        // After a pause, a new burst's first reads miss as they fill its copies: not judged with the last
        // burst's misses.
        let later = t + JUDGED_OVER * 20;
        assert_eq!(
            period(&mut window, later, Duration::from_millis(10), 50, 0),
            None
        );
        // Its copies answer from then on: awake.
        let rest = later + JUDGED_OVER;
        assert_eq!(
            period(&mut window, rest, JUDGED_OVER, MISSES_TO_RETIRE, 500),
            None
        );
    }

    #[test]
    fn the_period_is_shorter_where_no_reader_waits_for_a_progress_answer() {
        assert_eq!(judged_over(true), JUDGED_OVER);
        assert!(judged_over(false) < judged_over(true));
        let t = Instant::now();
        let mut window = Window::default();
        let short = judged_over(false);
        for n in 0..MISSES_TO_RETIRE - 1 {
            assert_eq!(window.missed(t + short * n / MISSES_TO_RETIRE, short), None);
        }
        assert_eq!(window.missed(t + short, short), Some(REST_MIN));
    }

    #[test]
    fn one_answer_in_misses_to_retire_keeps_the_cache_awake_and_fewer_do_not() {
        let t = Instant::now();
        let misses = 10 * MISSES_TO_RETIRE;
        let mut window = Window::default();
        assert_eq!(period(&mut window, t, JUDGED_OVER, misses, 10), None);
        let mut window = Window::default();
        assert_eq!(
            period(&mut window, t, JUDGED_OVER, misses, 9),
            Some(REST_MIN)
        );
    }

    #[test]
    fn the_cache_sleeps_from_the_start_for_the_length_and_is_awake_after() {
        let sleep = Sleep::default();
        let t = Instant::now();
        assert!(!sleep.asleep(t), "awake from the start");
        sleep.start(t, REST_MIN);
        assert!(sleep.asleep(t));
        assert!(sleep.asleep(t + REST_MIN - Duration::from_millis(1)));
        assert!(!sleep.asleep(t + REST_MIN));
    }
}
