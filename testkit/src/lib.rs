//! The one test kit: everything the proxy's integration tests, the conformance suite and the benchmark need to
//! run real processes. Dev-only; never a dependency of the product.
//!
//! - [`etcd`]: the etcd versions (3.4.23, 3.5.1, 3.5.30, 3.6.16, 3.7.3) and where they are installed; clusters of member
//!   processes (kill, SIGSTOP/SIGCONT, restart); containers of a locally imported image; one member of either;
//!   client URLs in the clear or over TLS ([`etcd::EtcdTls`], `--client-cert-auth` included).
//! - [`proxy`]: the proxy's release binary, built on first use, started with flags on a free port (readiness over
//!   TLS when it serves TLS).
//! - [`etcdctl`]: the real `etcdctl`, one-shot with a deadline or in the background; with TLS files or without.
//! - [`normalize`]: the one set of rules that makes etcdctl output comparable between etcds.
//! - [`process`]: a child process with a log file, killed by its own PID and on drop.
//! - [`pki`]: certificates made in this process (a CA issuing server and client certificates, with or without a
//!   Common Name, of chosen validity and key algorithm; CRLs), written and atomically replaced as PEM files.
//! - [`ports`], [`http`]: free loopback ports outside the kernel's ephemeral range, and a tiny HTTP/1.1 GET, in the
//!   clear or over TLS with a client certificate.
//! - [`dirs`], [`wait`]: temporary directories on tmpfs, log tails, and waiting on a condition with a deadline.
//! - [`diff`]: the line diff every failure report shows.
//! - [`dns`]: a DNS server on loopback answering SRV questions from a table (UDP and TCP, truncation, failures).
//! - [`hostile`]: requests a hostile client sends (a Txn nested 100,000 deep), made without recursion.
//! - [`fuzz`]: the seeded property runner (`FUZZ_SEED`, `FUZZ_CASES`) of every arbitrary-input and model property.
//!
//! The workspace's clippy.toml bans std and tokio sockets so that the proxy reaches the network only through its
//! `Net` seam. This crate serves real processes on real ports, never simulated code: the ban is lifted in its
//! socket modules, and only there.

pub mod diff;
pub mod dirs;
pub mod dns;
pub mod etcd;
pub mod etcdctl;
pub mod fuzz;
pub mod hostile;
pub mod http;
pub mod normalize;
pub mod pki;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod proxy_image;
pub mod wait;

pub use etcd::{Backend, Binaries, Etcd, EtcdCluster, EtcdTls, Spec, Version};
pub use etcdctl::{Background, Etcdctl, Output};
pub use normalize::Normalizer;
pub use pki::TlsPaths;
pub use ports::{free_port, try_free_port};
pub use proxy::ProxyProcess;
pub use wait::{try_wait_for, wait_for};

/// Whether this runs under CI (`CI=true`), where a missing backend or version is a failure, not a skip.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}
