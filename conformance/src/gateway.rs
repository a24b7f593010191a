//! The gateway replay harness: cases of HTTP/JSON requests to etcd's gateway (`testdata/gateway/<area>/<name>.gw`)
//! played with the real `curl` against direct etcd and through the proxy binary under the flag profiles, requiring
//! the same answers: HTTP status, content type, and the JSON values (key order and whitespace aside), normalised by
//! the kit's normaliser ([`testkit::Normalizer::gateway_json`]); `tests/gateway.rs` runs it.
//!
//! - [`case`]: the case language (requests, headers, bodies; watch streams opened, read and closed by name).
//! - [`curl`]: one request through `curl`, or a stream kept open, in the clear or with TLS client certificates.
//! - [`play`]: one case on one target, giving its normalised transcript.
//!
//! What `testdata/gateway/README.md` records of real etcd's answers per version is what the cases pin; direct
//! etcd's transcripts are checked against insta snapshots per version (`testdata/gateway/snapshots/etcd-<v>/`).

pub mod case;
pub mod curl;
pub mod play;
