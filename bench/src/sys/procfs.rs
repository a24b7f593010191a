//! CPU time and resident memory of a process, from `/proc/<pid>/stat` and `/proc/<pid>/status`.

use std::sync::OnceLock;

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU fields (`getconf CLK_TCK`; 100 on every Linux we run).
pub fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// User plus system CPU seconds the process has used so far (all its threads).
pub fn cpu_seconds(pid: u32) -> std::io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_cpu_ticks(&stat)
        .map(|ticks| ticks as f64 / ticks_per_second())
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/{pid}/stat: {stat:?}")))
}

/// utime + stime (fields 14 and 15). The command name (field 2) may hold spaces, so fields are counted after
/// its closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state), so field N is at index N - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// Resident set size now and the process's peak so far, in KiB (`VmRSS`, `VmHWM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    pub rss_kib: u64,
    pub peak_kib: u64,
}

pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_memory(&status)
        .ok_or_else(|| std::io::Error::other(format!("no VmRSS/VmHWM in /proc/{pid}/status")))
}

fn parse_memory(status: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    Some(Memory {
        rss_kib: field("VmRSS:")?,
        peak_kib: field("VmHWM:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_utime_plus_stime_even_with_spaces_in_the_name() {
        let stat =
            "4242 (etcd grpc (x)) S 1 2 3 0 -1 4194560 100 0 0 0 250 70 0 0 20 0 12 0 999 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(320));
    }

    #[test]
    fn memory_reads_rss_and_high_water_mark() {
        let status = "Name:\tetcd\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t9\n";
        assert_eq!(
            parse_memory(status),
            Some(Memory {
                rss_kib: 10240,
                peak_kib: 20480
            })
        );
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        assert!(memory(pid).expect("own /proc status").rss_kib > 0);
        let cpu = cpu_seconds(pid).expect("own /proc stat");
        assert!(cpu.is_finite() && cpu >= 0.0, "{cpu}");
    }
}
