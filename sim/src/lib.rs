//! Deterministic chaos simulation of etcd-grpc-proxy: the production proxy (`proxy::run`, unchanged) runs over
//! turmoil's simulated network and virtual time, in front of a model etcd, while members crash, links partition and
//! messages are delayed or held; invariant checkers then judge the run against the model's history.
//!
//! Data flows: [`scenario`] builds a [`world::World`] (model members + proxy + clients + [`fault`] plan) from a
//! seed → the world runs → [`check`] compares the clients' logs with [`model::History`] → a
//! [`scenario::Report`] (seed, [`trace`] digest, violations, worst revision lag).
//!
//! - [`net`]: [`net::TurmoilNet`], the proxy's `Net` seam over turmoil; [`net::HostSockets`], a host's connections,
//!   closed in one order before the world crashes it.
//! - [`model`]: the model etcd (one MVCC store shared by several members, leases on virtual time, watch, a leader
//!   elected by a quorum, members that crash, hang or are cut off from the others) served as etcd's real tonic services on any listener ([`model::serve`]); also used
//!   over real TCP by the conformance suite.
//! - [`topology`]: host names and ports; tonic channels and `etcd-client` clients over the simulated network,
//!   plaintext or TLS ([`topology::Dialer`]).
//! - [`tls`]: TLS in a world, on every connection: `Settings { tls: Some(TlsFiles { .. }), .. }` makes the members
//!   serve TLS (client certificates required), the proxy serve and dial TLS (`server_tls`, `upstream_tls`), and
//!   [`world::World::dialer`] dial TLS; the handshakes run above the `Net` seam, over turmoil. The PEM files come
//!   from the test (`tests/tls.rs` makes them with `testkit::pki`).
//! - [`fault`]: seeded fault plans (crash/restart, hang/resume, isolation from the other members, proxy↔member
//!   partitions both ways and one way, held links, latency and jitter, proxy restarts, one-way cuts of a client's
//!   link) and their application.
//! - [`world`]: one simulated world (one proxy, or several with their own configurations) and its run loop; stops
//!   the proxies at the end and counts their leftover tasks. While it runs, std's clock on its thread reads
//!   simulated time (the `sim_clock` crate), so dependencies that read it (h2) do not depend on the machine's load.
//! - [`scenario`]: the scenarios and their clients (watchers, callers, lease keepers, direct writers), the fleet of
//!   proxies in a tree.
//! - [`check`]: the invariant checkers, pure functions over histories.
//! - [`trace`], [`seeds`]: the event trace and its digest; `SIM_SEED` / `SIM_SEEDS` and regression seeds.
//!
//! How to run, reproduce a seed and add a scenario: `sim/README.md`.

pub mod check;
pub mod fault;
pub mod model;
pub mod net;
pub mod scenario;
pub mod seeds;
pub mod tls;
pub mod topology;
pub mod trace;
pub mod world;
