//! The server-side view of one run: etcd's counters at the start and end of the measured window and its gauges
//! while the load is in place, the CPU seconds and memory of etcd and of the proxy in front of it, and the proxy's
//! range cache hits and misses (its own metrics, read at the start and end of the window).
//!
//! The runner calls [`Meter::baseline`] before a scenario's setup. A scenario calls [`Meter::start`] when measuring begins (after its setup and warm-up), [`Meter::in_place`]
//! once its load is fully established (watchers created, streams open), and [`Meter::end`] when measuring stops.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use crate::memory::{self, RssReading};
use crate::services::Service;
use crate::sys::procfs;
use crate::upstream::{self, EtcdCounters, UpstreamLoad};
use testkit::http;

/// How often the proxy's resident memory is sampled during a run.
const RSS_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// What the servers spent on one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerCost {
    /// CPU seconds etcd used in the measured window.
    pub etcd_cpu_seconds: f64,
    /// CPU seconds the proxy used in the measured window (None for direct).
    pub proxy_cpu_seconds: Option<f64>,
    /// The proxy's largest resident set seen during the window, KiB (sampled every 100 ms).
    pub proxy_peak_rss_kib: Option<u64>,
    /// Length of the window from [`Meter::start`] to [`Meter::end`], seconds (for rates of etcd's counters).
    #[serde(default)]
    pub window_seconds: f64,
    /// The load that reached etcd in the window.
    pub upstream: UpstreamLoad,
    /// The proxy's range cache answers in the window (None for direct, or when its metrics could not be read).
    #[serde(default)]
    pub proxy_cache: Option<CacheCounts>,
    /// Readings that failed (a report shows them instead of silently zero numbers).
    pub problems: Vec<String>,
}

/// Range calls a proxy answered from its cache and those it sent on, from its own metrics
/// (`etcd_grpc_proxy_cache_hits_total`, `etcd_grpc_proxy_cache_misses_total`: the same names in etcd's Go proxy,
/// which counts only serializable reads, and in this proxy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheCounts {
    pub hits: f64,
    pub misses: f64,
}

impl CacheCounts {
    /// Reads both counters from a Prometheus text; None when neither is there.
    pub fn parse(text: &str) -> Option<Self> {
        let mut hits = None;
        let mut misses = None;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let value = value.trim().parse::<f64>().ok();
            match name.split('{').next().unwrap_or_default() {
                "etcd_grpc_proxy_cache_hits_total" => hits = value,
                "etcd_grpc_proxy_cache_misses_total" => misses = value,
                _ => {}
            }
        }
        (hits.is_some() || misses.is_some()).then(|| Self {
            hits: hits.unwrap_or(0.0),
            misses: misses.unwrap_or(0.0),
        })
    }

    /// What happened from `self` to `later`.
    fn until(self, later: Self) -> Self {
        Self {
            hits: (later.hits - self.hits).max(0.0),
            misses: (later.misses - self.misses).max(0.0),
        }
    }
}

#[derive(Default)]
struct Readings {
    baseline: Option<EtcdCounters>,
    before: Option<EtcdCounters>,
    during: Option<EtcdCounters>,
    cpu_start: Option<(f64, Option<f64>)>,
    cache_start: Option<CacheCounts>,
    started_at: Option<tokio::time::Instant>,
    cost: ServerCost,
    sampler: Option<JoinHandle<()>>,
}

/// Reads the servers of one target during one run.
pub struct Meter {
    etcd: Service,
    proxy: Option<Service>,
    proxy_pid: Option<u32>,
    readings: Mutex<Readings>,
    peak_rss: Arc<Mutex<Option<u64>>>,
}

impl Meter {
    /// Meters `etcd` (its `/metrics` read over TLS when it serves TLS) and the `proxy` in front of it, if any (its
    /// process, and its own metrics for the cache counters).
    pub fn new(etcd: &Service, proxy: Option<Service>) -> Self {
        Self {
            etcd: etcd.clone(),
            proxy_pid: proxy.as_ref().map(Service::pid),
            proxy,
            readings: Mutex::new(Readings::default()),
            peak_rss: Arc::new(Mutex::new(None)),
        }
    }

    fn readings(&self) -> std::sync::MutexGuard<'_, Readings> {
        self.readings.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn counters(&self) -> Result<EtcdCounters, String> {
        match http::get_with(self.etcd.addr(), "/metrics", self.etcd.http_tls()).await {
            Ok((200, body)) => Ok(upstream::parse(&body)),
            Ok((code, _)) => Err(format!("etcd /metrics answered HTTP {code}")),
            Err(e) => Err(format!("etcd /metrics: {e}")),
        }
    }

    /// The proxy's cache counters now; None for direct, or when they cannot be read (not a problem of the run:
    /// etcd's load is what the run reports).
    async fn cache_counts(&self) -> Option<CacheCounts> {
        let proxy = self.proxy.as_ref()?;
        match http::get_with(proxy.addr(), proxy.metrics_path(), proxy.http_tls()).await {
            Ok((200, body)) => CacheCounts::parse(&body),
            _ => None,
        }
    }

    fn cpu(&self) -> Result<(f64, Option<f64>), String> {
        let etcd = procfs::cpu_seconds(self.etcd.pid()).map_err(|e| format!("etcd CPU: {e}"))?;
        let proxy = match self.proxy_pid {
            Some(pid) => Some(procfs::cpu_seconds(pid).map_err(|e| format!("proxy CPU: {e}"))?),
            None => None,
        };
        Ok((etcd, proxy))
    }

    /// Before the scenario sets anything up: the reference for streams opened and for gauges.
    pub async fn baseline(&self) {
        let counters = self.counters().await;
        let mut r = self.readings();
        match counters {
            Ok(c) => r.baseline = Some(c),
            Err(e) => r.cost.problems.push(format!("before setup: {e}")),
        }
    }

    /// etcd's watchers before the run (after [`Meter::baseline`]).
    pub fn baseline_watchers(&self) -> Option<f64> {
        self.readings().baseline.as_ref().map(|c| c.watchers)
    }

    /// The proxy's resident set once it has settled (see [`memory::settled_rss`]); None for direct etcd.
    pub async fn settled_proxy_rss(&self) -> Option<RssReading> {
        memory::settled_rss(self.proxy_pid?).await
    }

    /// Measuring begins: etcd's counters and both processes' CPU are read now.
    pub async fn start(&self) {
        let cache = self.cache_counts().await;
        let counters = self.counters().await;
        let cpu = self.cpu();
        let sampler = self.proxy_pid.map(|pid| {
            let peak = Arc::clone(&self.peak_rss);
            tokio::spawn(async move {
                loop {
                    if let Ok(memory) = procfs::memory(pid) {
                        let mut peak = peak.lock().unwrap_or_else(|e| e.into_inner());
                        *peak = Some(peak.unwrap_or(0).max(memory.rss_kib));
                    }
                    tokio::time::sleep(RSS_SAMPLE_EVERY).await;
                }
            })
        });
        let mut r = self.readings();
        match counters {
            Ok(c) => r.before = Some(c),
            Err(e) => r.cost.problems.push(format!("at start: {e}")),
        }
        match cpu {
            Ok(c) => r.cpu_start = Some(c),
            Err(e) => r.cost.problems.push(format!("at start: {e}")),
        }
        r.sampler = sampler;
        r.cache_start = cache;
        r.started_at = Some(tokio::time::Instant::now());
    }

    /// The load is fully in place: etcd's gauges (watchers, watch streams) are read now.
    pub async fn in_place(&self) {
        let counters = self.counters().await;
        let mut r = self.readings();
        match counters {
            Ok(c) => r.during = Some(c),
            Err(e) => r.cost.problems.push(format!("during: {e}")),
        }
    }

    /// Measuring stops: counters and CPU are read again; returns what the window cost.
    pub async fn end(&self) -> ServerCost {
        let counters = self.counters().await;
        let cpu = self.cpu();
        let cache = self.cache_counts().await;
        let mut r = self.readings();
        r.cost.proxy_cache = r.cache_start.zip(cache).map(|(a, b)| a.until(b));
        if let Some(sampler) = r.sampler.take() {
            sampler.abort();
        }
        r.cost.proxy_peak_rss_kib = *self.peak_rss.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(started_at) = r.started_at {
            r.cost.window_seconds = started_at.elapsed().as_secs_f64();
        }
        match (&r.cpu_start, cpu) {
            (Some((etcd0, proxy0)), Ok((etcd1, proxy1))) => {
                let (etcd0, proxy0) = (*etcd0, *proxy0);
                r.cost.etcd_cpu_seconds = etcd1 - etcd0;
                r.cost.proxy_cpu_seconds = proxy0.zip(proxy1).map(|(a, b)| b - a);
            }
            (_, Err(e)) => r.cost.problems.push(format!("at end: {e}")),
            (None, Ok(_)) => {}
        }
        match (&r.baseline, &r.before, counters) {
            (Some(baseline), Some(before), Ok(after)) => {
                let during = r.during.as_ref().unwrap_or(&after);
                r.cost.upstream = UpstreamLoad::between(baseline, before, during, &after);
            }
            (_, _, Err(e)) => r.cost.problems.push(format!("at end: {e}")),
            _ => {}
        }
        r.cost.clone()
    }

    /// What the window cost (as returned by [`Meter::end`]; default values if it never ended).
    pub fn cost(&self) -> ServerCost {
        self.readings().cost.clone()
    }

    /// Whether start, in-place and end readings of etcd's metrics all succeeded.
    pub fn read_etcd_metrics(&self) -> bool {
        let r = self.readings();
        r.baseline.is_some()
            && r.before.is_some()
            && r.during.is_some()
            && r.cost.problems.is_empty()
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(sampler) = self.readings().sampler.take() {
            sampler.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_counts_are_read_from_either_proxys_metrics() {
        let go = "# HELP etcd_grpc_proxy_cache_hits_total Total number of cache hits\n\
                  # TYPE etcd_grpc_proxy_cache_hits_total gauge\n\
                  etcd_grpc_proxy_cache_hits_total 12\n\
                  etcd_grpc_proxy_cache_misses_total 3\n";
        let counts = CacheCounts::parse(go).expect("both counters");
        assert_eq!((counts.hits, counts.misses), (12.0, 3.0));
        let later = CacheCounts {
            hits: 112.0,
            misses: 4.0,
        };
        assert_eq!(
            counts.until(later),
            CacheCounts {
                hits: 100.0,
                misses: 1.0
            }
        );
        assert_eq!(CacheCounts::parse("process_cpu_seconds_total 1\n"), None);
    }
}
