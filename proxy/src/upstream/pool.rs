//! The endpoints the proxy may use, each with its lazily connected channel and what the proxy believes of it.
//!
//! The list changes only with `--endpoints-auto-sync-interval` ([`super::sync`]): an endpoint etcd no longer lists
//! is retired (never chosen again, its channel dropped when the last call on it ends), a new one is appended. An
//! endpoint keeps its index for the proxy's life, so a pick made before a change still names the endpoint it was
//! made on; an endpoint that comes back reuses its old index.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use tonic::transport::Channel;

use crate::config::Endpoint;

/// One endpoint.
pub struct Member {
    pub endpoint: Endpoint,
    channel: Channel,
    /// Believed able to serve (it answered with a leader since it last failed).
    pub up: AtomicBool,
    /// A probe task is asking it until it answers again.
    pub probing: AtomicBool,
    /// It answered RangeStream with Unimplemented (etcd before 3.7) since it was last found down.
    pub lacks_range_stream: AtomicBool,
    /// No longer among the cluster's members: never chosen, never probed.
    pub retired: AtomicBool,
}

impl Member {
    pub fn new(endpoint: Endpoint, channel: Channel) -> Self {
        Self {
            endpoint,
            channel,
            up: AtomicBool::new(true),
            probing: AtomicBool::new(false),
            lacks_range_stream: AtomicBool::new(false),
            retired: AtomicBool::new(false),
        }
    }

    /// The channel new calls use.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Believed up and not retired.
    pub fn usable(&self) -> bool {
        self.up.load(Ordering::Acquire) && !self.retired()
    }

    pub fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }
}

/// Every endpoint the proxy has used, by index.
#[derive(Default)]
pub struct Pool {
    members: RwLock<Vec<Arc<Member>>>,
}

impl Pool {
    pub fn new(members: Vec<Member>) -> Self {
        Self {
            members: RwLock::new(members.into_iter().map(Arc::new).collect()),
        }
    }

    /// Endpoint `index` (retired ones included: a call made before may still report on it).
    pub fn get(&self, index: usize) -> Arc<Member> {
        self.read()[index].clone()
    }

    /// The indices of the endpoints not retired, in order.
    pub fn live(&self) -> Vec<usize> {
        self.read()
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.retired())
            .map(|(i, _)| i)
            .collect()
    }

    /// The index of the endpoint with `authority`, retired or not.
    pub fn find(&self, authority: &str) -> Option<usize> {
        self.read()
            .iter()
            .position(|m| m.endpoint.authority() == authority)
    }

    /// Appends a new endpoint; returns its index.
    pub fn push(&self, member: Member) -> usize {
        let mut members = self
            .members
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        members.push(Arc::new(member));
        members.len() - 1
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Member>>> {
        self.members
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
