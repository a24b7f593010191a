//! Deterministic chaos simulation of etcd-grpc-proxy: the production proxy runs unchanged over turmoil's
//! simulated network and virtual time, in front of a model etcd, while faults hit members and links.
//!
//! - [`net`]: [`net::TurmoilNet`], the proxy's `Net` seam over turmoil.
//! - [`model`]: the model etcd (shared MVCC store, leases, watch) served as real tonic services on any listener.
pub mod check;
pub mod fault;
pub mod model;
pub mod net;
pub mod scenario;
pub mod seeds;
pub mod topology;
pub mod trace;
pub mod world;
