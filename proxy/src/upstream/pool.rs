//! The endpoints the proxy may use, each with its lazily connected channel and what the proxy believes of it.
//!
//! The list changes only with `--endpoints-auto-sync-interval` ([`super::sync`]): an endpoint etcd no longer lists
//! is retired (never chosen again), a new one is appended. An endpoint keeps its index for the proxy's life, so a
//! pick made before a change still names the endpoint it was made on; an endpoint that comes back reuses its old
//! index.
//!
//! A retired endpoint's channel is released once it is no longer active ([`Pool::release_retired`]), and goes
//! when the last call on it ends (each call holds a clone): members replaced one by one over a long life must not
//! each leave a connection and its task behind. It is connected again only if the endpoint comes back. A call that
//! picked a retired endpoint just before its channel went gets one that fails at once, as a connection that
//! cannot be opened, so the call is retried elsewhere and nothing connects to the endpoint again.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use crate::config::Endpoint;
use crate::net::{BoxFuture, Conn, Connector, Listener, Net};

/// One endpoint.
pub struct Member {
    pub endpoint: Endpoint,
    /// The channels new calls use, one per worker ([`crate::workers`]): none once the endpoint is retired and its
    /// channels released.
    channel: Mutex<Option<Vec<Channel>>>,
    /// Believed able to serve (it answered with a leader since it last failed).
    pub up: AtomicBool,
    /// A probe task is asking it until it answers again.
    pub probing: AtomicBool,
    /// It answered RangeStream with Unimplemented (etcd before 3.7) since it was last found down.
    pub lacks_range_stream: AtomicBool,
    /// No longer among the cluster's members: never chosen, never probed. Changed with `channel` locked, so that
    /// a channel is released only while retired and is there again once the endpoint comes back.
    retired: AtomicBool,
}

impl Member {
    /// `channels`: one per worker, at least one.
    pub fn new(endpoint: Endpoint, channels: Vec<Channel>) -> Self {
        debug_assert!(!channels.is_empty());
        Self {
            endpoint,
            channel: Mutex::new(Some(channels)),
            up: AtomicBool::new(true),
            probing: AtomicBool::new(false),
            lacks_range_stream: AtomicBool::new(false),
            retired: AtomicBool::new(false),
        }
    }

    /// The channel new calls of the running worker use (for a retired endpoint whose channels are gone, one that
    /// fails at once).
    pub fn channel(&self) -> Channel {
        match &*self.lock_channel() {
            Some(channels) => channels[crate::workers::current() % channels.len()].clone(),
            None => retired_channel(),
        }
    }

    /// Every worker's channel (for a retired endpoint whose channels are gone, one that fails at once): what the
    /// heartbeat and the probes ask on, since a connection the network broke under one worker hangs that worker's
    /// calls however well the others' answer.
    pub fn channels(&self) -> Vec<Channel> {
        match &*self.lock_channel() {
            Some(channels) => channels.clone(),
            None => vec![retired_channel()],
        }
    }

    /// The endpoint is no longer among the cluster's members; its channel stays until [`Member::release_channel`].
    pub fn retire(&self) {
        let _channel = self.lock_channel();
        self.retired.store(true, Ordering::Release);
    }

    /// The endpoint is a member again: it is connected again (`connect`) if its channel went. False if it was not
    /// retired.
    pub fn restore(&self, connect: impl FnOnce() -> Vec<Channel>) -> bool {
        let mut channel = self.lock_channel();
        if !self.retired() {
            return false;
        }
        self.retired.store(false, Ordering::Release);
        channel.get_or_insert_with(connect);
        true
    }

    /// Drops the channel of a retired endpoint (calls under way keep theirs).
    fn release_channel(&self) {
        let mut channel = self.lock_channel();
        if self.retired() {
            *channel = None;
        }
    }

    fn lock_channel(&self) -> MutexGuard<'_, Option<Vec<Channel>>> {
        self.channel.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Releases the channels of the retired endpoints other than `active` (calls still go to the active one until
    /// its replacement is chosen; a later call releases it).
    pub fn release_retired(&self, active: usize) {
        for (index, member) in self.read().iter().enumerate() {
            if index != active {
                member.release_channel();
            }
        }
    }

    /// How many endpoints hold a channel for new calls.
    #[cfg(test)]
    pub fn channels(&self) -> usize {
        self.read()
            .iter()
            .filter(|member| member.lock_channel().is_some())
            .count()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Member>>> {
        self.members
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A channel for a retired endpoint whose own channel is gone: every call on it fails as a connection that could
/// not be opened (so even a write is retried on another endpoint), without touching the network. Made per call,
/// and gone with it: it only serves a call that picked the endpoint just before its channel was released.
fn retired_channel() -> Channel {
    TonicEndpoint::from_static("http://retired.invalid")
        .connect_with_connector_lazy(Connector::new(Arc::new(Retired)))
}

/// The network of [`retired_channel`]: nothing is reachable.
struct Retired;

impl Net for Retired {
    fn bind(&self, _addr: std::net::SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async { Err(io::ErrorKind::Unsupported.into()) })
    }

    fn connect(&self, _authority: String) -> BoxFuture<'static, io::Result<Conn>> {
        Box::pin(async {
            Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "etcd-grpc-proxy: the endpoint is no longer a member of the cluster",
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::RangeRequest;
    use proto::etcdserverpb::kv_client::KvClient;

    fn member(authority: &str) -> Member {
        let endpoint = Endpoint::parse(authority).unwrap();
        Member::new(endpoint, vec![retired_channel()])
    }

    #[tokio::test]
    async fn a_retired_endpoint_keeps_its_channel_only_while_active() {
        let pool = Pool::new(vec![member("a:1"), member("b:1"), member("c:1")]);
        pool.get(0).retire();
        pool.get(1).retire();
        pool.release_retired(0);
        assert_eq!(pool.channels(), 2, "the active one and the live one");
        assert!(pool.get(0).restore(|| panic!("it still has its channel")));
        assert!(!pool.get(2).restore(|| panic!("it was never retired")));
        let mut connected = false;
        assert!(pool.get(1).restore(|| {
            connected = true;
            vec![retired_channel()]
        }));
        assert!(connected, "a released channel is made again on return");
        assert_eq!(pool.channels(), 3);
    }

    #[tokio::test]
    async fn a_call_on_a_released_endpoint_fails_as_never_sent() {
        let pool = Pool::new(vec![member("a:1"), member("b:1")]);
        pool.get(1).retire();
        pool.release_retired(0);
        let refused = KvClient::new(pool.get(1).channel())
            .range(RangeRequest::default())
            .await
            .unwrap_err();
        assert!(
            crate::error::never_sent(&refused),
            "retried elsewhere, even a write: {refused:?}"
        );
    }
}
