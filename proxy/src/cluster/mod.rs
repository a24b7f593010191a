//! How clients find proxies: MemberList answered with etcd's members reached at the proxies
//! (`--advertise-client-url`), and the proxy's registration in etcd (`--resolver-prefix`, `--resolver-ttl`) in the
//! naming format etcd's clients resolve.
//!
//! - [`entry`]: the registration's key and value (etcd's naming format).
//! - [`members`]: MemberList's answer.
//! - [`registration`]: registering, keeping the lease alive, registering again, deregistering.

pub mod entry;
pub mod members;
pub mod registration;
