//! TLS on both sides of the proxy, above the [`crate::net::Net`] seam: a connection the `Net` gives is wrapped
//! here, so the simulation runs the same TLS code over its simulated network.
//!
//! - [`server`]: towards clients (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-crl-file`,
//!   `--auto-tls`, cipher suites and versions): the handshake deadline and the answer to plaintext clients.
//! - [`client`]: towards etcd (`--cacert`, `--cert`, `--key`, `--insecure-skip-tls-verify`).
//! - [`own`]: towards the proxy's own listener, for `/proxy/health`'s check of the proxy as clients reach it.
//! - [`reload`]: one mechanism for rotation: a configuration built from files is rebuilt for the next connection
//!   when any of its files changes on disk; a change that does not load keeps the last good configuration.
//! - [`pem`]: reading certificates, keys and CRLs, with errors that name the file and the reason.
//! - [`suites`]: Go's names of cipher suites and TLS versions, as etcd's flags take them.
//! - [`auto`]: `--auto-tls`'s self-signed certificate under `<data-dir>/fixtures/proxy`.
//!
//! The crypto provider is aws-lc-rs, not ring: etcd's own `--auto-tls` (members and Go proxies alike) makes ECDSA
//! P-521 certificates, and ring can neither verify P-521 signatures nor sign with a P-521 key. It costs a C build
//! (aws-lc-sys, about a minute on a clean build here) and no runtime dependency.

pub mod auto;
pub mod client;
pub mod own;
pub mod pem;
pub mod reload;
pub mod server;
pub mod suites;

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

pub use client::{ClientSettings, ClientTls};
pub use server::{ServerSettings, ServerTls};

/// Why a TLS configuration could not be built: the message names the file (or flag) and the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

impl TlsError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// The one crypto provider both sides use (see the module comment for why aws-lc-rs).
pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}

/// ALPN protocols the proxy offers and asks for: gRPC needs `h2`; `/health` and `/metrics` also serve HTTP/1.1.
pub const ALPN_SERVER: &[&[u8]] = &[b"h2", b"http/1.1"];
