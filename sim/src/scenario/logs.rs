//! What the simulated clients write down for the checkers, shared between client hosts and the driver.

use std::sync::{Arc, Mutex};

use crate::check::auth::UserRead;
use crate::check::calls::CallLog;
use crate::check::census::CensusLog;
use crate::check::lease::LeaseClientLog;
use crate::check::watch::WatcherLog;

#[derive(Clone, Default)]
pub struct Logs {
    pub watchers: Arc<Mutex<Vec<WatcherLog>>>,
    pub calls: Arc<Mutex<Vec<CallLog>>>,
    pub leases: Arc<Mutex<Vec<LeaseClientLog>>>,
    pub censuses: Arc<Mutex<Vec<CensusLog>>>,
    /// Reads by users under auth.
    pub user_reads: Arc<Mutex<Vec<UserRead>>>,
    /// What Watch streams saw wrong that belongs to no one watcher.
    pub stream_problems: Arc<Mutex<Vec<String>>>,
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

    pub fn push_user_read(&self, read: UserRead) {
        self.user_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(read);
    }

    pub fn user_reads(&self) -> Vec<UserRead> {
        self.user_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn push_census(&self, log: CensusLog) {
        self.censuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(log);
    }

    pub fn push_stream_problems(&self, problems: Vec<String>) {
        self.stream_problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(problems);
    }

    pub fn censuses(&self) -> Vec<CensusLog> {
        self.censuses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn stream_problems(&self) -> Vec<String> {
        self.stream_problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
