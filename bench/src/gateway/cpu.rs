//! CPU time of the processes a gateway measurement involves: the proxy, etcd and this benchmark itself (its
//! clients share the machine's cores with both). Read before and after a window; the difference is what each
//! used in it (utime + stime of all threads, from `/proc/<pid>/stat`).

use serde::{Deserialize, Serialize};

use crate::sys::procfs;

/// The processes metered.
#[derive(Clone, Copy, Debug)]
pub struct CpuMeter {
    pub proxy: u32,
    pub etcd: u32,
    pub bench: u32,
}

/// CPU seconds of each process: used so far (a reading) or between two readings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuUsed {
    pub proxy_seconds: f64,
    pub etcd_seconds: f64,
    pub bench_seconds: f64,
}

impl CpuMeter {
    pub fn read(&self) -> Result<CpuUsed, String> {
        let seconds = |name: &str, pid: u32| {
            procfs::cpu_seconds(pid).map_err(|e| format!("CPU of {name} (pid {pid}): {e}"))
        };
        Ok(CpuUsed {
            proxy_seconds: seconds("the proxy", self.proxy)?,
            etcd_seconds: seconds("etcd", self.etcd)?,
            bench_seconds: seconds("the benchmark", self.bench)?,
        })
    }
}

impl CpuUsed {
    /// What was used since `start` (a counter that went backwards counts as 0).
    pub fn since(&self, start: &CpuUsed) -> CpuUsed {
        CpuUsed {
            proxy_seconds: (self.proxy_seconds - start.proxy_seconds).max(0.0),
            etcd_seconds: (self.etcd_seconds - start.etcd_seconds).max(0.0),
            bench_seconds: (self.bench_seconds - start.bench_seconds).max(0.0),
        }
    }

    /// Adds another window's use.
    pub fn add(&mut self, other: &CpuUsed) {
        self.proxy_seconds += other.proxy_seconds;
        self.etcd_seconds += other.etcd_seconds;
        self.bench_seconds += other.bench_seconds;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_between_readings_is_their_difference_and_adds_up() {
        let start = CpuUsed {
            proxy_seconds: 1.0,
            etcd_seconds: 2.0,
            bench_seconds: 3.0,
        };
        let end = CpuUsed {
            proxy_seconds: 1.5,
            etcd_seconds: 1.0,
            bench_seconds: 4.0,
        };
        let mut used = end.since(&start);
        assert_eq!(
            used,
            CpuUsed {
                proxy_seconds: 0.5,
                etcd_seconds: 0.0,
                bench_seconds: 1.0
            }
        );
        used.add(&used.clone());
        assert_eq!(used.bench_seconds, 2.0);
    }

    #[test]
    fn this_process_can_be_metered() {
        let me = std::process::id();
        let meter = CpuMeter {
            proxy: me,
            etcd: me,
            bench: me,
        };
        assert!(meter.read().is_ok());
        assert!(
            CpuMeter {
                etcd: u32::MAX,
                ..meter
            }
            .read()
            .is_err()
        );
    }
}
