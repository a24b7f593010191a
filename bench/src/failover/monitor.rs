//! Which member this proxy is using, read from its own `/metrics` (`etcd_grpc_proxy_upstream_active{endpoint}`),
//! once before a fault and every [`POLL`] while it lasts: the replacement time is the first poll that shows
//! another member active.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use testkit::http;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

/// How often the proxy's `/metrics` is read during a fault.
pub const POLL: Duration = Duration::from_millis(10);

/// A read of `/metrics` that takes longer than this counts as unread: the proxy is not answering its own HTTP.
const READ_TIMEOUT: Duration = Duration::from_secs(1);

/// What one read of the proxy's `/metrics` said.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds from the phase's start to when the answer arrived.
    pub at_s: f64,
    /// The endpoint (`127.0.0.1:PORT`, as given in `--endpoints`) whose active gauge is 1; `None` if none is, or
    /// `/metrics` did not answer.
    pub active: Option<String>,
    /// `etcd_grpc_proxy_upstream_failovers_total`.
    pub failovers: Option<f64>,
}

/// Reads `/metrics` at `addr` once.
pub async fn read(addr: &str, epoch: Instant) -> Sample {
    let answer = tokio::time::timeout(READ_TIMEOUT, http::get(addr, "/proxy/metrics")).await;
    let mut sample = match answer {
        Ok(Ok((200, body))) => parse(&body),
        _ => Sample::default(),
    };
    sample.at_s = epoch.elapsed().as_secs_f64();
    sample
}

/// The active endpoint and the failover count in a Prometheus text page.
pub fn parse(text: &str) -> Sample {
    let mut sample = Sample::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("etcd_grpc_proxy_upstream_active{") {
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let endpoint = labels
                .split(',')
                .find_map(|pair| pair.trim().strip_prefix("endpoint="))
                .map(|v| v.trim_matches('"'));
            if value.trim() == "1"
                && let Some(endpoint) = endpoint
            {
                sample.active = Some(endpoint.to_string());
            }
        } else if let Some(value) = line.strip_prefix("etcd_grpc_proxy_upstream_failovers_total ") {
            sample.failovers = value.trim().parse().ok();
        }
    }
    sample
}

/// Polls the proxy's `/metrics` every [`POLL`] until stopped. Dropping it stops the polling.
pub struct Monitor {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<Vec<Sample>>>,
}

impl Monitor {
    pub fn start(addr: &str, epoch: Instant) -> Self {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(poll(addr.to_string(), epoch, stopped));
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops polling and returns every sample, oldest first.
    pub async fn stop(mut self) -> Vec<Sample> {
        self.stop.send_replace(true);
        match self.task.take() {
            Some(task) => task.await.unwrap_or_default(),
            None => Vec::new(),
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn poll(addr: String, epoch: Instant, mut stop: watch::Receiver<bool>) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(POLL);
    // A slow read is followed by the next at once, not by a burst.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stop| *stop) => return samples,
            _ = tick.tick() => {}
        }
        samples.push(read(&addr, epoch).await);
    }
}

/// When (seconds from the phase's start) the first sample at or after `from_s` shows an endpoint other than
/// `victim` active: the proxy has replaced it. `None` if no sample does.
pub fn replaced_at(samples: &[Sample], victim: &str, from_s: f64) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.at_s >= from_s)
        .find(|s| s.active.as_deref().is_some_and(|a| a != victim))
        .map(|s| s.at_s)
}

/// How many times the proxy changed its active endpoint between the first and the last sample that read the
/// counter.
pub fn failovers(samples: &[Sample]) -> Option<f64> {
    let mut read = samples.iter().filter_map(|s| s.failovers);
    let first = read.next()?;
    Some(read.next_back().unwrap_or(first) - first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# HELP etcd_grpc_proxy_upstream_active 1 for the endpoint that serves requests now
# TYPE etcd_grpc_proxy_upstream_active gauge
etcd_grpc_proxy_upstream_active{endpoint=\"127.0.0.1:20001\"} 0
etcd_grpc_proxy_upstream_active{endpoint=\"127.0.0.1:20003\"} 1
etcd_grpc_proxy_upstream_active{endpoint=\"127.0.0.1:20005\"} 0
etcd_grpc_proxy_upstream_failovers_total 2
";

    #[test]
    fn the_active_endpoint_and_failover_count_are_read() {
        let sample = parse(PAGE);
        assert_eq!(sample.active.as_deref(), Some("127.0.0.1:20003"));
        assert_eq!(sample.failovers, Some(2.0));
        assert_eq!(
            parse("etcd_grpc_proxy_upstream_active{endpoint=\"x\"} 0\n").active,
            None
        );
    }

    fn at(at_s: f64, active: Option<&str>, failovers: Option<f64>) -> Sample {
        Sample {
            at_s,
            active: active.map(str::to_string),
            failovers,
        }
    }

    #[test]
    fn replacement_is_the_first_sample_after_the_fault_naming_another_endpoint() {
        let samples = [
            at(0.9, Some("b"), Some(1.0)),
            at(1.0, Some("a"), Some(1.0)),
            // Unread and no-endpoint-active samples are not a replacement.
            at(1.5, None, None),
            at(2.0, Some("b"), Some(2.0)),
            at(3.0, Some("c"), Some(3.0)),
        ];
        assert_eq!(replaced_at(&samples, "a", 1.0), Some(2.0));
        assert_eq!(replaced_at(&samples, "b", 2.5), Some(3.0));
        assert_eq!(replaced_at(&samples[..3], "a", 1.0), None);
        assert_eq!(failovers(&samples), Some(2.0));
        assert_eq!(failovers(&samples[2..3]), None);
    }
}
