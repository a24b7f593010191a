//! Loopback sockets for the harnesses that start real processes: the proxy's integration tests, the conformance
//! suite and the benchmark.
//!
//! - [`ports`]: free loopback ports, outside the kernel's ephemeral range so that no outgoing connection takes one
//!   between the probe and the process's own bind.
//! - [`http`]: `GET` over HTTP/1.1 on a fresh connection, for `/health` and Prometheus `/metrics`.
//!
//! The workspace's clippy.toml bans std and tokio sockets so that the proxy reaches the network only through its
//! `Net` seam. This crate serves real processes on real ports, never simulated code: the ban is lifted in its
//! modules, and only there.

pub mod http;
pub mod ports;

pub use ports::{free_port, try_free_port};
