//! Idle memory of a proxy: its resident set once it has settled, and what each idle client watcher adds.
//!
//! Memory right after a burst of work still moves (allocator caches, a Go collector running), so a reading counts
//! only once two samples [`SAMPLE_EVERY`] apart agree within [`TOLERANCE_KIB`]; if they never do before
//! [`SETTLE_TIMEOUT`], the last sample is kept and marked unsettled so a report can say so.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sys::procfs;

/// Time between two samples compared for settling.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How far two samples may differ and still count as settled: four 4 KiB pages.
pub const TOLERANCE_KIB: u64 = 16;
/// How long to wait for the resident set to settle.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(6);

/// Consecutive RSS samples, settled once two in a row agree within a tolerance.
#[derive(Clone, Debug)]
pub struct Settling {
    tolerance_kib: u64,
    previous: Option<u64>,
}

impl Settling {
    pub fn new(tolerance_kib: u64) -> Self {
        Self {
            tolerance_kib,
            previous: None,
        }
    }

    /// Feeds the next sample; true when it agrees with the one before.
    pub fn observe(&mut self, kib: u64) -> bool {
        let settled = self
            .previous
            .is_some_and(|p| p.abs_diff(kib) <= self.tolerance_kib);
        self.previous = Some(kib);
        settled
    }
}

/// One settled (or timed-out) reading of a resident set.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RssReading {
    pub kib: u64,
    /// False if the samples still moved when the wait ended.
    pub settled: bool,
}

/// The resident set of `pid` once settled (bounded by [`SETTLE_TIMEOUT`]); None if `/proc` cannot be read.
pub async fn settled_rss(pid: u32) -> Option<RssReading> {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    let mut settling = Settling::new(TOLERANCE_KIB);
    loop {
        let kib = procfs::memory(pid).ok()?.rss_kib;
        if settling.observe(kib) {
            return Some(RssReading { kib, settled: true });
        }
        if tokio::time::Instant::now() >= deadline {
            return Some(RssReading {
                kib,
                settled: false,
            });
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// What a proxy's resident set grew by while `watchers` idle client watchers were created.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdleWatcherMemory {
    pub before: RssReading,
    pub after: RssReading,
    pub watchers: u64,
}

impl IdleWatcherMemory {
    /// KiB per watcher (negative if the resident set shrank); None without watchers.
    pub fn kib_per_watcher(&self) -> Option<f64> {
        (self.watchers > 0)
            .then(|| (self.after.kib as f64 - self.before.kib as f64) / self.watchers as f64)
    }

    /// Both readings settled.
    pub fn settled(&self) -> bool {
        self.before.settled && self.after.settled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settles_only_when_two_consecutive_samples_agree_within_the_tolerance() {
        let mut s = Settling::new(16);
        assert!(!s.observe(1000), "a first sample has nothing to agree with");
        assert!(!s.observe(1100));
        assert!(!s.observe(1017), "17 KiB apart is beyond 16");
        assert!(s.observe(1001));
        assert!(s.observe(1017), "16 KiB apart is within");
    }

    #[test]
    fn kib_per_watcher_is_the_growth_spread_over_the_watchers() {
        let reading = |kib| RssReading { kib, settled: true };
        let memory = IdleWatcherMemory {
            before: reading(10_000),
            after: reading(30_480),
            watchers: 10_000,
        };
        assert_eq!(memory.kib_per_watcher(), Some(2.048));
        assert!(memory.settled());
        let shrank = IdleWatcherMemory {
            after: RssReading {
                kib: 9_000,
                settled: false,
            },
            ..memory
        };
        assert_eq!(shrank.kib_per_watcher(), Some(-0.1));
        assert!(!shrank.settled());
        let none = IdleWatcherMemory {
            watchers: 0,
            ..memory
        };
        assert_eq!(none.kib_per_watcher(), None);
    }

    #[tokio::test]
    async fn this_process_has_a_settled_or_timed_out_reading() {
        let reading = settled_rss(std::process::id())
            .await
            .expect("own /proc status");
        assert!(reading.kib > 0, "{reading:?}");
    }
}
