//! What each tier of a tree cost: one figure per process ([`PerProcess`]: etcd, the mid proxy, each leaf, the
//! bench client itself), reduced to one figure per tier ([`ByTier`]: the leaves as their sum and their largest).
//! CPU is the growth of utime + stime between two readings over the wall time between them; memory is the
//! process's peak resident set (`VmHWM`).

use serde::{Deserialize, Serialize};

use crate::sys::procfs;

/// One value per metered process.
#[derive(Clone, Debug, PartialEq)]
pub struct PerProcess<T> {
    pub etcd: T,
    pub mid: T,
    pub leaves: Vec<T>,
    /// This benchmark's own process (the watch clients and the writer).
    pub bench: T,
}

impl<T> PerProcess<T> {
    /// `f` of every value, or the first error.
    pub fn try_map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<PerProcess<U>, E> {
        Ok(PerProcess {
            etcd: f(&self.etcd)?,
            mid: f(&self.mid)?,
            leaves: self.leaves.iter().map(&mut f).collect::<Result<_, _>>()?,
            bench: f(&self.bench)?,
        })
    }
}

/// The PIDs of a tree's processes.
pub type Pids = PerProcess<u32>;

/// A figure per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ByTier {
    pub etcd: f64,
    pub mid: f64,
    /// All leaves together.
    pub leaves_sum: f64,
    /// The leaf with the largest figure.
    pub leaf_max: f64,
    pub bench: f64,
}

impl ByTier {
    pub fn of(values: &PerProcess<f64>) -> Self {
        Self {
            etcd: values.etcd,
            mid: values.mid,
            leaves_sum: values.leaves.iter().sum(),
            leaf_max: values.leaves.iter().copied().fold(0.0, f64::max),
            bench: values.bench,
        }
    }
}

/// CPU seconds (user + system, all threads) each process has used so far.
pub fn cpu_seconds(pids: &Pids) -> Result<PerProcess<f64>, String> {
    pids.try_map(|&pid| procfs::cpu_seconds(pid).map_err(|e| format!("CPU of pid {pid}: {e}")))
}

/// Each process's peak resident set so far, MiB.
pub fn peak_rss_mib(pids: &Pids) -> Result<PerProcess<f64>, String> {
    pids.try_map(|&pid| {
        procfs::memory(pid)
            .map(|m| m.peak_kib as f64 / 1024.0)
            .map_err(|e| format!("memory of pid {pid}: {e}"))
    })
}

/// CPU seconds per second of wall time in each tier between two readings `wall_seconds` apart (None when no time
/// passed or the readings do not describe the same processes). A counter that went backwards counts as 0.
pub fn cpu_rate(
    start: &PerProcess<f64>,
    end: &PerProcess<f64>,
    wall_seconds: f64,
) -> Option<ByTier> {
    if wall_seconds <= 0.0 || start.leaves.len() != end.leaves.len() {
        return None;
    }
    let rate = |a: f64, b: f64| (b - a).max(0.0) / wall_seconds;
    let per_process = PerProcess {
        etcd: rate(start.etcd, end.etcd),
        mid: rate(start.mid, end.mid),
        leaves: start
            .leaves
            .iter()
            .zip(&end.leaves)
            .map(|(&a, &b)| rate(a, b))
            .collect(),
        bench: rate(start.bench, end.bench),
    };
    Some(ByTier::of(&per_process))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings(etcd: f64, mid: f64, leaves: &[f64], bench: f64) -> PerProcess<f64> {
        PerProcess {
            etcd,
            mid,
            leaves: leaves.to_vec(),
            bench,
        }
    }

    #[test]
    fn cpu_rate_is_seconds_used_per_wall_second_with_leaves_summed_and_maxed() {
        let start = readings(10.0, 5.0, &[1.0, 2.0, 3.0], 7.0);
        let end = readings(12.0, 9.0, &[2.0, 2.5, 6.0], 17.0);
        let rate = cpu_rate(&start, &end, 2.0).expect("two seconds passed");
        assert_eq!(
            rate,
            ByTier {
                etcd: 1.0,
                mid: 2.0,
                leaves_sum: 2.25,
                leaf_max: 1.5,
                bench: 5.0,
            }
        );
    }

    #[test]
    fn cpu_rate_needs_elapsed_time_and_the_same_processes() {
        let a = readings(1.0, 1.0, &[1.0], 1.0);
        assert_eq!(cpu_rate(&a, &a, 0.0), None);
        let b = readings(1.0, 1.0, &[1.0, 1.0], 1.0);
        assert_eq!(cpu_rate(&a, &b, 1.0), None);
        let backwards = readings(0.5, 1.0, &[1.0], 1.0);
        assert_eq!(cpu_rate(&a, &backwards, 1.0).map(|r| r.etcd), Some(0.0));
    }

    #[test]
    fn a_tier_without_leaves_has_zero_leaf_figures() {
        let tiers = ByTier::of(&readings(1.0, 2.0, &[], 3.0));
        assert_eq!((tiers.leaves_sum, tiers.leaf_max), (0.0, 0.0));
    }

    #[test]
    fn this_process_can_be_metered_in_every_tier() {
        let me = std::process::id();
        let pids = PerProcess {
            etcd: me,
            mid: me,
            leaves: vec![me, me],
            bench: me,
        };
        let cpu = cpu_seconds(&pids).expect("own /proc stat");
        assert_eq!(cpu.leaves.len(), 2);
        let rss = peak_rss_mib(&pids).expect("own /proc status");
        assert!(rss.bench > 0.0, "{rss:?}");
        let missing = PerProcess {
            etcd: u32::MAX,
            ..pids
        };
        assert!(cpu_seconds(&missing).is_err());
    }
}
