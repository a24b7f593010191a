//! How many client connections and calls the proxy takes at once. Past either bound the newcomer is refused at
//! once (a connection closed as soon as accepted, a call answered `ResourceExhausted`) rather than left to wait
//! or to take memory and file descriptors from the clients already served.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Config;
use crate::metrics::Metrics;

pub struct Limits {
    connections: Arc<Semaphore>,
    calls: Arc<Semaphore>,
    max_calls: usize,
    metrics: Metrics,
}

/// A connection's place; the gauge of open connections counts it until dropped.
pub struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
    metrics: Metrics,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.metrics.client_connections.dec();
    }
}

impl Limits {
    pub fn new(config: &Config, metrics: Metrics) -> Self {
        let bounded = |n: usize| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)));
        Self {
            connections: bounded(config.max_client_connections),
            calls: bounded(config.max_client_calls),
            max_calls: config.max_client_calls,
            metrics,
        }
    }

    /// A place for a new connection, or `None` (counted) when every place is taken.
    pub fn connection(&self) -> Option<ConnectionSlot> {
        match self.connections.clone().try_acquire_owned() {
            Ok(permit) => {
                self.metrics.client_connections.inc();
                Some(ConnectionSlot {
                    _permit: permit,
                    metrics: self.metrics.clone(),
                })
            }
            Err(_) => {
                self.metrics.client_connections_refused.inc();
                None
            }
        }
    }

    /// A place for a new call, held until its response ends; or the status that refuses it.
    pub fn call(&self) -> Result<OwnedSemaphorePermit, tonic::Status> {
        self.calls.clone().try_acquire_owned().map_err(|_| {
            self.metrics.client_calls_refused.inc();
            tonic::Status::resource_exhausted(format!(
                "etcd-grpc-proxy: too many calls in progress (--max-client-calls={})",
                self.max_calls
            ))
        })
    }
}
