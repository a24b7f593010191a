//! What a failover run recorded (faults and every call) and the counting done on it afterwards.
//!
//! A call belongs to a fault when it was still running at the fault's injection or started before one client
//! timeout after the member was healthy again: calls caught by the fault, calls made during it, and calls right
//! after it that may still meet its damage (a dead connection, a stale choice of member). Failures outside every fault are counted apart; they
//! should be none. Rates are per minute of fault, the fault lasting from injection until the member was healthy
//! again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::FaultKind;
use super::load::{Call, Op, Via};

/// The whole run, as written to JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailoverReport {
    pub etcd_version: String,
    pub command: String,
    pub machine: String,
    pub rounds: usize,
    pub fault_seconds: f64,
    pub client_timeout_seconds: f64,
    pub pace_ms: u64,
    pub phases: Vec<Phase>,
}

/// One fault kind: fresh proxies, the load running throughout, and its faults.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    pub kind: FaultKind,
    /// What both proxies and etcdctl were given as `--endpoints` (the members, or relays in front of them).
    pub endpoints: Vec<String>,
    pub faults: Vec<Fault>,
    pub calls: Vec<Call>,
    /// Why the phase stopped early, if it did.
    pub failure: Option<String>,
    /// The end of this proxy's log (it runs with `RUST_LOG=warn`: failovers and hung members are logged).
    pub proxy_log: String,
    /// The machine's 1-minute load average when the phase started and ended: on a shared machine, what the
    /// timings competed with.
    pub load_average: (Option<f64>, Option<f64>),
}

/// One fault of one member.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fault {
    pub round: usize,
    /// The member's index in `endpoints`.
    pub member: usize,
    /// Whether it led the cluster when it was faulted (`None`: its `/metrics` did not say).
    pub leader: Option<bool>,
    /// Whether it was this proxy's active endpoint when it was faulted.
    pub this_proxys_active: bool,
    /// Seconds from the phase's start: injected; lifted (SIGCONT, restart begun, partition healed); healthy again.
    pub start_s: f64,
    pub lifted_s: f64,
    pub recovered_s: f64,
    /// Seconds from injection until this proxy's `/metrics` showed another endpoint active (when the member was
    /// its active one); `None` if it never did while the fault and one client timeout after it lasted.
    pub replaced_after_s: Option<f64>,
    /// Times this proxy changed its active endpoint from injection to the end of the fault's window.
    pub failovers: Option<f64>,
    /// Anything odd seen around it (a proxy not healthy before the fault, ...).
    pub notes: Vec<String>,
}

impl Fault {
    /// Seconds the member was unavailable: from injection until it was healthy again.
    pub fn seconds(&self) -> f64 {
        self.recovered_s - self.start_s
    }

    /// Whether `call` belongs to this fault.
    pub fn covers(&self, call: &Call, client_timeout_s: f64) -> bool {
        call.start_s + call.seconds >= self.start_s
            && call.start_s < self.recovered_s + client_timeout_s
    }
}

/// The counts of one route over a set of faults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub faults: usize,
    pub fault_seconds: f64,
    pub reads: usize,
    pub failed_reads: usize,
    pub writes: usize,
    pub failed_writes: usize,
    /// The slowest read that succeeded, in seconds.
    pub slowest_read_s: f64,
    /// Failed reads and writes that belong to no fault of the phase.
    pub failed_outside: (usize, usize),
    /// Error messages of failed calls, with how often each was seen.
    pub errors: BTreeMap<String, usize>,
}

impl Counts {
    /// Failed reads per minute of fault; `None` without any fault time.
    pub fn failed_reads_per_minute(&self) -> Option<f64> {
        (self.fault_seconds > 0.0).then(|| self.failed_reads as f64 * 60.0 / self.fault_seconds)
    }
}

/// Counts `via`'s calls of `phase` over the faults `chosen` picks; failures outside faults are counted over all
/// of the phase's faults.
pub fn count(
    phase: &Phase,
    via: Via,
    client_timeout_s: f64,
    chosen: impl Fn(&Fault) -> bool,
) -> Counts {
    let faults: Vec<&Fault> = phase.faults.iter().filter(|f| chosen(f)).collect();
    let mut counts = Counts {
        faults: faults.len(),
        fault_seconds: faults.iter().map(|f| f.seconds()).sum(),
        ..Counts::default()
    };
    for call in phase.calls.iter().filter(|c| c.via == via) {
        let failed = call.error.is_some();
        if !phase
            .faults
            .iter()
            .any(|f| f.covers(call, client_timeout_s))
        {
            match (failed, call.op) {
                (true, Op::Read) => counts.failed_outside.0 += 1,
                (true, Op::Write) => counts.failed_outside.1 += 1,
                (false, _) => {}
            }
            continue;
        }
        if !faults.iter().any(|f| f.covers(call, client_timeout_s)) {
            continue;
        }
        match call.op {
            Op::Read => {
                counts.reads += 1;
                counts.failed_reads += usize::from(failed);
                if !failed {
                    counts.slowest_read_s = counts.slowest_read_s.max(call.seconds);
                }
            }
            Op::Write => {
                counts.writes += 1;
                counts.failed_writes += usize::from(failed);
            }
        }
        if let Some(error) = &call.error {
            *counts.errors.entry(error.clone()).or_default() += 1;
        }
    }
    counts
}

/// The `p`th percentile of `values` by nearest rank (with fewer than 100 values, p99 is the largest).
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(start_s: f64, recovered_s: f64, active: bool) -> Fault {
        Fault {
            round: 0,
            member: 0,
            leader: Some(false),
            this_proxys_active: active,
            start_s,
            lifted_s: start_s + 6.0,
            recovered_s,
            replaced_after_s: None,
            failovers: None,
            notes: Vec::new(),
        }
    }

    fn call(via: Via, op: Op, start_s: f64, error: Option<&str>) -> Call {
        Call {
            via,
            op,
            start_s,
            seconds: 0.5,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn calls_are_counted_by_the_fault_they_started_in_and_failures_elsewhere_apart() {
        let phase = Phase {
            kind: FaultKind::Hang,
            endpoints: Vec::new(),
            faults: vec![fault(10.0, 16.0, true), fault(30.0, 36.0, false)],
            calls: vec![
                call(Via::ThisProxy, Op::Read, 5.0, Some("before any fault")),
                // Made 0.2 s before the fault and still waiting when it came: the fault's.
                call(Via::ThisProxy, Op::Write, 9.8, Some("caught")),
                call(Via::ThisProxy, Op::Read, 11.0, None),
                call(Via::ThisProxy, Op::Read, 12.0, Some("DeadlineExceeded")),
                // Within one client timeout (3 s) of recovery: still the fault's.
                call(Via::ThisProxy, Op::Write, 18.5, Some("Unavailable")),
                call(Via::ThisProxy, Op::Read, 20.0, Some("after the window")),
                call(Via::ThisProxy, Op::Read, 31.0, Some("DeadlineExceeded")),
                call(Via::GoProxy, Op::Read, 12.0, Some("not this route")),
            ],
            failure: None,
            proxy_log: String::new(),
            load_average: (None, None),
        };
        let all = count(&phase, Via::ThisProxy, 3.0, |_| true);
        assert_eq!((all.faults, all.fault_seconds), (2, 12.0));
        assert_eq!((all.reads, all.failed_reads), (3, 2));
        assert_eq!((all.writes, all.failed_writes), (2, 2));
        assert_eq!(all.failed_outside, (2, 0));
        assert_eq!(all.failed_reads_per_minute(), Some(10.0));
        assert_eq!(all.errors.get("DeadlineExceeded"), Some(&2));

        let active = count(&phase, Via::ThisProxy, 3.0, |f| f.this_proxys_active);
        assert_eq!(
            (active.faults, active.reads, active.failed_reads),
            (1, 2, 1)
        );
        assert_eq!(
            active.failed_outside,
            (2, 0),
            "outside means outside every fault"
        );
    }

    #[test]
    fn percentiles_are_by_nearest_rank() {
        let values = [0.3, 0.1, 0.2, 0.4];
        assert_eq!(percentile(&values, 50.0), Some(0.2));
        assert_eq!(percentile(&values, 99.0), Some(0.4));
        assert_eq!(percentile(&[0.7], 50.0), Some(0.7));
        assert_eq!(percentile(&[], 50.0), None);
    }
}
