//! The event trace of one run: faults, client operations and the model's history, each line stamped with virtual
//! time. Its digest identifies a run: the same seed must give the same digest.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::History;

/// Lines shared by the driver and every simulated client.
#[derive(Clone, Default)]
pub struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Trace {
    /// Adds a line stamped with the current virtual time.
    pub fn record(&self, line: impl Into<String>) {
        let now = turmoil::sim_elapsed().unwrap_or_default();
        self.record_at(now, line);
    }

    pub fn record_at(&self, at: Duration, line: impl Into<String>) {
        let line = format!("{:>9.3}s {}", at.as_secs_f64(), line.into());
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The last `n` lines, for a failure report.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let lines = self.lines();
        lines[lines.len().saturating_sub(n)..].to_vec()
    }
}

/// A 64-bit FNV-1a digest of the trace and of the model's history: stable across runs, platforms and Rust versions.
pub fn digest(lines: &[String], history: &History) -> u64 {
    let mut hash = Fnv::default();
    for line in lines {
        hash.write(line.as_bytes());
        hash.write(b"\n");
    }
    for record in &history.revisions {
        hash.write(format!("{} {:?} {:?}\n", record.revision, record.at, record.events).as_bytes());
    }
    for (id, lease) in &history.leases {
        hash.write(format!("{id} {lease:?}\n").as_bytes());
    }
    for stream in &history.streams {
        hash.write(format!("{stream:?}\n").as_bytes());
    }
    hash.0
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
