//! Conformance suite: etcdctl scenarios (`testdata/conformance/<area>/<name>.scn`) replayed against real etcd
//! and against the proxy binary under every flag profile, requiring the same normalised answers;
//! `cargo test -p conformance` runs it.
//!
//! Data flows: [`scenario`] parses a `.scn` file → [`runner`] plays it on one target through the real `etcdctl`,
//! normalising every output with the kit's normaliser, then reads what etcd itself holds under the run's keys →
//! the suite (`tests/conformance.rs`) compares the targets' transcripts and etcd's keys, checks `direct` against
//! its insta snapshot, and prints the [`report`].
//!
//! - etcd comes from the workspace's `testkit`: 3.4.23, 3.5.1, 3.5.30, 3.6.16 and 3.7.3 as processes, 3.5.1,
//!   3.5.30 and 3.7.3 in containers (`TESTKIT_ETCD_VERSIONS` picks some); so do etcdctl, the normaliser, the proxy's release binary and free ports.
//! - [`profile`]: the flag profiles the proxy runs under (`default`, `namespace`, `tls`, `chain`, `cache`, and
//!   `container` and `container-tls`: the proxy from its container image, in front of etcd in a container), and
//!   [`profile::Setup`], which starts etcd and the proxy for a profile (TLS on both sides for `tls`, with the run's
//!   certificates from [`tls`]; for `chain` a proxy in front of a proxy, as [`profile::Proxies`]);
//!   [`profile::Endpoint`] tells etcdctl and the Rust clients how to reach a target.
//! - [`target`]: `direct`, `proxy` (the binary, once per profile), `container` (the image), `model` (the sim's
//!   etcd, in this process).
//! - [`suite`]: one etcd per backend, version and transport shared by scenarios under their own key prefixes, a
//!   fresh etcd for scenarios that change cluster-wide state; results per target, profile, backend and version
//!   (direct etcd over TLS is the row `direct | tls`, compared with direct etcd in the clear).
//! - [`differences`]: the scenarios where the proxy answers differently from etcd by design, with reasons.
//!
//! [`gateway`] replays HTTP/JSON cases (`testdata/gateway/<area>/<name>.gw`) on etcd's gateway with `curl`, directly
//! and through the proxy under the profiles (`tests/gateway.rs`), comparing HTTP statuses and JSON values.
//!
//! [`go_clients`] runs Go's own etcd clients (the Go module `goclients/`: clientv3, Kubernetes' storage layer)
//! against etcd directly and through the proxy under the profiles (`tests/go_clients.rs`), each run on a fresh
//! three-member cluster it owns and acts on for the Go tests.
//!
//! Two more test binaries use the same kit, profiles and targets: `tests/etcd_client.rs` (the core scenarios and the
//! keep-alive API through the `etcd-client` crate) and `tests/raw_grpc.rs` (raw gRPC where etcdctl cannot reach:
//! client-chosen watch IDs, progress requests, fragments, half-closed streams, compaction), each comparing direct
//! etcd, the proxy (under every profile) and the model transcript by transcript, on every etcd version as a process.

pub mod differences;
pub mod gateway;
pub mod go_clients;
pub mod profile;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod suite;
pub mod target;
pub mod tls;
