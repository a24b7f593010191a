//! The model etcd: one MVCC store ([`store`], [`txn`], [`lease`]) shared by several members through a
//! [`Cluster`] handle, served as etcd's real tonic services by [`serve`] on any listener.
//!
//! - [`keyspace`]: etcd's `key`/`range_end` rules.
//! - [`store`], [`txn`], [`lease`]: the state and its operations, synchronous and deterministic.
//! - [`history`]: what the checkers read (revisions, compactions, leases, upstream streams, key ranges named).
//! - [`census`]: the live watchers per member, stream and range, at any instant.
//! - [`process`]: a member crashed or hung (stopped as by SIGSTOP), and the leader the others elect.
//! - [`auth`]: users, roles, permissions and tokens, and who may do what.
//! - [`errors`]: etcd's exact error statuses.
//! - `*_service`: one file per etcd service; [`serve`] puts them on a listener.

pub mod auth;
mod auth_service;
pub mod census;
pub mod cluster;
mod cluster_service;
pub mod errors;
pub mod history;
pub mod keyspace;
mod kv_service;
pub mod lease;
mod lease_service;
pub mod pause;
pub mod process;
mod serve;
pub mod store;
pub mod txn;
mod watch_service;

pub use census::{StreamWatchers, WatchCensus, WatchedRange};
pub use cluster::{Cluster, ELECTION_TIMEOUT};
pub use cluster_service::MODEL_VERSION;
pub use history::{
    AccessKind, Hang, History, Hold, KeyAccess, LeaseEnd, LeaseRecord, RevisionRecord, StreamKind,
    StreamRecord, max_overlap,
};
pub use serve::{ServeOptions, serve, serve_with};
pub use store::Store;
