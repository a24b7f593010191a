//! The watch census: how many watchers are live on each member's Watch streams right now, per watched range.
//!
//! A watcher is live from the moment the member created it (a create the member refused, or one answered with a
//! compaction cancel, never is) until it is cancelled or its stream ends (the client went away, the member
//! stopped or crashed). Ranges are counted as the client spelled them (`key`, `range_end` of the create request),
//! since that is what a proxy shares its upstream watchers by. etcd exposes the total as the
//! `etcd_debugging_mvcc_watcher_total` gauge; the census breaks it down by member, stream and range.

use std::collections::BTreeMap;

/// A watched range as the create request spelled it: `(key, range_end)`.
pub type WatchedRange = (Vec<u8>, Vec<u8>);

/// The live watchers of one Watch stream on one member.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamWatchers {
    pub member: usize,
    /// The stream's index in [`History::streams`](super::History::streams).
    pub stream: usize,
    /// Live watchers per range (only ranges with at least one).
    pub ranges: BTreeMap<WatchedRange, usize>,
}

/// A snapshot of every member's live watchers (streams without a live watcher are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchCensus {
    pub streams: Vec<StreamWatchers>,
}

impl WatchCensus {
    /// Every live watcher, on all members and streams.
    pub fn total(&self) -> usize {
        self.streams.iter().flat_map(|s| s.ranges.values()).sum()
    }

    /// Live watchers per range, summed over members and streams.
    pub fn per_range(&self) -> BTreeMap<WatchedRange, usize> {
        let mut ranges = BTreeMap::new();
        for stream in &self.streams {
            for (range, count) in &stream.ranges {
                *ranges.entry(range.clone()).or_insert(0) += count;
            }
        }
        ranges
    }
}

/// The census as the cluster keeps it: live watchers per stream index.
#[derive(Debug, Default)]
pub(super) struct Registry {
    streams: BTreeMap<usize, StreamWatchers>,
}

impl Registry {
    pub(super) fn added(&mut self, member: usize, stream: usize, range: WatchedRange) {
        let entry = self
            .streams
            .entry(stream)
            .or_insert_with(|| StreamWatchers {
                member,
                stream,
                ranges: BTreeMap::new(),
            });
        *entry.ranges.entry(range).or_insert(0) += 1;
    }

    pub(super) fn removed(&mut self, stream: usize, range: &WatchedRange) {
        let Some(entry) = self.streams.get_mut(&stream) else {
            return;
        };
        if let Some(count) = entry.ranges.get_mut(range) {
            *count -= 1;
            if *count == 0 {
                entry.ranges.remove(range);
            }
        }
        if entry.ranges.is_empty() {
            self.streams.remove(&stream);
        }
    }

    /// The stream ended: its watchers are gone.
    pub(super) fn stream_ended(&mut self, stream: usize) {
        self.streams.remove(&stream);
    }

    pub(super) fn snapshot(&self) -> WatchCensus {
        WatchCensus {
            streams: self.streams.values().cloned().collect(),
        }
    }
}
