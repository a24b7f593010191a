//! What the simulated clients write down for the checkers, shared between client hosts and the driver.

use std::sync::{Arc, Mutex};

use crate::check::calls::CallLog;
use crate::check::lease::LeaseClientLog;
use crate::check::watch::WatcherLog;

#[derive(Clone, Default)]
pub struct Logs {
    pub watchers: Arc<Mutex<Vec<WatcherLog>>>,
    pub calls: Arc<Mutex<Vec<CallLog>>>,
    pub leases: Arc<Mutex<Vec<LeaseClientLog>>>,
}

impl Logs {
    pub fn push_watcher(&self, log: WatcherLog) {
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log);
    }

    pub fn push_call(&self, log: CallLog) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log);
    }

    pub fn push_lease(&self, log: LeaseClientLog) {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log);
    }

    pub fn watchers(&self) -> Vec<WatcherLog> {
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn calls(&self) -> Vec<CallLog> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn leases(&self) -> Vec<LeaseClientLog> {
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Virtual time inside the simulation.
pub fn now() -> std::time::Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}
