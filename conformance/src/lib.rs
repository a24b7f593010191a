//! Conformance suite: etcdctl scenarios (`testdata/conformance/<area>/<name>.scn`) replayed against real etcd
//! and against the proxy, requiring the same normalised answers; `cargo test -p conformance` runs it.
//!
//! Data flows: [`scenario`] parses a `.scn` file → [`runner`] plays it on one target through [`etcdctl`],
//! normalising every output with [`normalize`] → the suite (`tests/conformance.rs`) compares the targets'
//! transcripts, checks `direct` against its insta snapshot, and prints the [`report`].
//!
//! - [`backend`]: where etcd comes from: a process (3.4.23 and 3.5.1) or a testcontainers container (3.5.1).
//! - [`target`]: `direct`, `proxy` (the proxy in this process, through `TokioNet`), `model` (the sim's etcd).
//! - [`suite`]: one etcd per backend and version shared by scenarios under their own key prefixes, a fresh
//!   etcd for scenarios that change cluster-wide state; results per target, backend and version.
//! - [`differences`]: the scenarios where the proxy answers differently from etcd by design, with reasons.
//! - free loopback ports come from the workspace's `loopback` crate (outside the kernel's ephemeral range).
//!
//! Two more test binaries use the same backends and targets: `tests/etcd_client.rs` (the core scenarios and the
//! keep-alive API through the `etcd-client` crate) and `tests/raw_grpc.rs` (raw gRPC where etcdctl cannot reach:
//! client-chosen watch IDs, progress requests, fragments, half-closed streams, compaction), each comparing direct
//! etcd, the proxy and the model transcript by transcript, on every etcd version installed as a process.

pub mod backend;
pub mod differences;
pub mod etcdctl;
pub mod normalize;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod suite;
pub mod target;
