//! The operating system as the benchmark sees it: loopback ports, a tiny HTTP client, `/proc` readings.

pub mod http;
pub mod ports;
pub mod procfs;
