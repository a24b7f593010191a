//! Watchers and watch streams registered in etcd, from its own `/metrics` (`etcd_debugging_mvcc_watcher_total`,
//! `etcd_debugging_mvcc_watch_stream_total`): what a tree of proxies leaves of its clients' 10,000 watchers.
//! Read once before the clients' watchers exist, and sampled through the measured window; the samples are kept
//! as their smallest and largest value, so a watcher that came and went during the window shows.

use serde::{Deserialize, Serialize};
use testkit::http;

use crate::upstream;

/// One reading of both gauges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EtcdGauges {
    pub watchers: f64,
    pub watch_streams: f64,
}

/// Reads both gauges from etcd at `addr` (`127.0.0.1:PORT`, in the clear).
pub async fn read(addr: &str) -> Result<EtcdGauges, String> {
    match http::get(addr, "/metrics").await {
        Ok((200, body)) => {
            let counters = upstream::parse(&body);
            Ok(EtcdGauges {
                watchers: counters.watchers,
                watch_streams: counters.watch_streams,
            })
        }
        Ok((code, _)) => Err(format!("etcd /metrics answered HTTP {code}")),
        Err(e) => Err(format!("etcd /metrics: {e}")),
    }
}

/// The smallest and largest value a gauge showed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Range {
    pub min: f64,
    pub max: f64,
}

impl Range {
    /// Over `values`; None when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        values.into_iter().fold(None, |range, v| {
            Some(match range {
                None => Range { min: v, max: v },
                Some(Range { min, max }) => Range {
                    min: min.min(v),
                    max: max.max(v),
                },
            })
        })
    }

    /// "3" when it never moved, else "2–3".
    pub fn describe(&self) -> String {
        if self.min == self.max {
            format!("{}", self.max)
        } else {
            format!("{}–{}", self.min, self.max)
        }
    }
}

/// Both gauges over the measured window: their ranges, and how many readings they come from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct GaugesDuring {
    pub watchers: Range,
    pub watch_streams: Range,
    pub samples: usize,
}

impl GaugesDuring {
    /// Over `samples`; None when there are none.
    pub fn of(samples: &[EtcdGauges]) -> Option<Self> {
        Some(Self {
            watchers: Range::of(samples.iter().map(|s| s.watchers))?,
            watch_streams: Range::of(samples.iter().map(|s| s.watch_streams))?,
            samples: samples.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holds_the_smallest_and_largest_sample() {
        assert_eq!(Range::of([]), None);
        let range = Range::of([3.0, 1.0, 2.0]).expect("three samples");
        assert_eq!(range, Range { min: 1.0, max: 3.0 });
        assert_eq!(range.describe(), "1–3");
        assert_eq!(
            Range::of([2.0, 2.0]).map(|r| r.describe()).as_deref(),
            Some("2")
        );
    }

    #[test]
    fn both_gauges_are_ranged_over_the_same_samples() {
        let samples = [
            EtcdGauges {
                watchers: 1.0,
                watch_streams: 2.0,
            },
            EtcdGauges {
                watchers: 11.0,
                watch_streams: 2.0,
            },
        ];
        let during = GaugesDuring::of(&samples).expect("two samples");
        assert_eq!(
            during.watchers,
            Range {
                min: 1.0,
                max: 11.0
            }
        );
        assert_eq!(during.watch_streams.describe(), "2");
        assert_eq!(during.samples, 2);
        assert_eq!(GaugesDuring::of(&[]), None);
    }
}
