//! Free loopback ports for the processes a harness starts.
//!
//! A port is probed free and then handed to a process that binds it later. Asking the kernel for `127.0.0.1:0`
//! is not safe for that: such a port lies in the kernel's ephemeral range, and between the probe and the bind any
//! outgoing connection on the machine (a client dialling etcd, etcd dialling a peer) may be given it as its local
//! port, so the process then fails with "address already in use". This crate hands out ports *outside* the
//! ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`), which the kernel never assigns on its own, probes
//! each by binding it, and walks the range in order, so one process hands a port out again only after going round
//! the whole range. Different processes start at different places in the range (by PID), so concurrent test
//! binaries do not walk the same sequence.
#![allow(clippy::disallowed_types)]

use std::ops::Range;
use std::sync::Mutex;

/// Where the next probe starts; `None` before the first call.
static NEXT: Mutex<Option<u16>> = Mutex::new(None);

/// The kernel's ephemeral range when it cannot be read (Linux's default).
const DEFAULT_EPHEMERAL: (u16, u16) = (32768, 60999);
/// Ports below this are left alone: privileged, or well known to other services.
const LOWEST: u16 = 10000;

/// A loopback port that nothing listens on now and that the kernel will not hand to an outgoing connection.
///
/// Panics if every port outside the ephemeral range is taken, which on a test machine means something is
/// badly wrong.
pub fn free_port() -> u16 {
    try_free_port().expect("no free loopback port outside the kernel's ephemeral range")
}

/// Like [`free_port`], for callers that report errors rather than panic.
pub fn try_free_port() -> std::io::Result<u16> {
    let pool = pool(ephemeral_range());
    let span = pool.end - pool.start;
    if span == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            "the kernel's ephemeral port range leaves no loopback port outside it",
        ));
    }
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut candidate =
        next.unwrap_or_else(|| pool.start + (std::process::id() % u32::from(span)) as u16);
    for _ in 0..span {
        if !pool.contains(&candidate) {
            candidate = pool.start;
        }
        let port = candidate;
        candidate = candidate.wrapping_add(1);
        if bindable(port) {
            *next = Some(candidate);
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!(
            "every loopback port in {}..{} is in use",
            pool.start, pool.end
        ),
    ))
}

/// The ports to hand out: below the ephemeral range when there is room there, else above it.
fn pool((low, high): (u16, u16)) -> Range<u16> {
    if low > LOWEST + 1000 {
        LOWEST..low
    } else {
        high.saturating_add(1).max(LOWEST)..u16::MAX
    }
}

/// The kernel's ephemeral port range, inclusive.
fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_range(&text))
        .unwrap_or(DEFAULT_EPHEMERAL)
}

fn parse_range(text: &str) -> Option<(u16, u16)> {
    let mut fields = text.split_whitespace().map(str::parse::<u16>);
    match (fields.next(), fields.next()) {
        (Some(Ok(low)), Some(Ok(high))) if low <= high => Some((low, high)),
        _ => None,
    }
}

/// Whether `127.0.0.1:port` can be bound now (the probe socket is closed again at once).
fn bindable(port: u16) -> bool {
    std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_range_is_parsed_and_bad_text_is_refused() {
        assert_eq!(parse_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_range("60999 32768"), None);
        assert_eq!(parse_range("garbage"), None);
        assert_eq!(parse_range("1024"), None);
    }

    #[test]
    fn the_pool_lies_outside_the_ephemeral_range() {
        assert_eq!(pool((32768, 60999)), 10000..32768);
        // An ephemeral range that starts low leaves room only above it.
        assert_eq!(pool((1024, 40000)), 40001..u16::MAX);
        assert_eq!(pool((1024, 65535)).len(), 0);
    }

    #[test]
    fn ports_handed_out_are_distinct_outside_the_ephemeral_range_and_bindable() {
        let (low, high) = ephemeral_range();
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            ports.len(),
            "a port was handed out twice: {ports:?}"
        );
        for port in ports {
            assert!(
                !(low..=high).contains(&port),
                "{port} is in the ephemeral range {low}..={high}"
            );
            assert!(bindable(port), "{port} was handed out but cannot be bound");
        }
    }
}
