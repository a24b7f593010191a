//! One upstream watcher per distinct range, at rest: once faults are healed, creates and cancels have stopped and
//! everything has caught up, the proxy's watch hub must serve all its client watchers with exactly one upstream
//! watcher per distinct `(key, range_end)` they watch, all on one upstream Watch stream (the simulation has no auth,
//! so every client stream shares one hub). Nothing else may be left on any member: no duplicate for a range, no
//! watcher for a range no client watches any more, no second stream.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::model::{WatchCensus, WatchedRange};

/// What the census client saw at the quiet point.
#[derive(Clone, Debug)]
pub struct CensusLog {
    pub at: Duration,
    /// The members' live watchers at that instant.
    pub census: WatchCensus,
    /// The ranges of the client watchers live at that instant.
    pub client_ranges: BTreeSet<WatchedRange>,
}

fn show(range: &WatchedRange) -> String {
    format!(
        "[{:?}, {:?})",
        String::from_utf8_lossy(&range.0),
        String::from_utf8_lossy(&range.1)
    )
}

/// Checks one census; every way it differs from "one upstream watcher per distinct client range, on one stream".
pub fn check_census(log: &CensusLog) -> Vec<String> {
    let mut violations = Vec::new();
    let at = log.at.as_secs_f64();
    let expected_streams = usize::from(!log.client_ranges.is_empty());
    if log.census.streams.len() != expected_streams {
        let streams: Vec<String> = log
            .census
            .streams
            .iter()
            .map(|s| {
                format!(
                    "member {} stream #{}: {} watcher(s)",
                    s.member,
                    s.stream,
                    s.ranges.values().sum::<usize>()
                )
            })
            .collect();
        violations.push(format!(
            "census at {at:.3}s: {} upstream Watch stream(s) hold watchers, expected {expected_streams}: {streams:?}",
            log.census.streams.len()
        ));
    }
    let upstream = log.census.per_range();
    for range in &log.client_ranges {
        match upstream.get(range).copied().unwrap_or(0) {
            1 => {}
            count => violations.push(format!(
                "census at {at:.3}s: {count} upstream watchers on {} (client watchers watch it; expected 1)",
                show(range)
            )),
        }
    }
    for (range, count) in &upstream {
        if !log.client_ranges.contains(range) {
            violations.push(format!(
                "census at {at:.3}s: {count} upstream watcher(s) left on {}, which no client watcher watches",
                show(range)
            ));
        }
    }
    violations
}
