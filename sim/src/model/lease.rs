//! Leases on virtual time: grant (given or generated ID), revoke and expiry (both delete the attached keys in one
//! revision), keep-alive (an unknown lease answers TTL 0), TimeToLive (-1 for an unknown lease) and Leases.

use std::collections::BTreeSet;
use std::time::Duration;

use super::errors::StoreError;
use super::history::{LeaseEnd, LeaseRecord};
use super::store::{Lease, Store};

/// etcd's smallest TTL with default election settings: shorter requests are granted this TTL.
pub const MIN_LEASE_TTL: i64 = 2;
/// etcd's `MaxLeaseTTL`.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// What TimeToLive reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeToLive {
    /// Seconds left (rounded down), or -1 if the lease does not exist.
    pub ttl: i64,
    pub granted_ttl: i64,
    pub keys: Vec<Vec<u8>>,
}

impl Store {
    /// Grants a lease. `id` 0 means "choose one": `fresh_id` is asked until it gives an unused positive ID.
    pub fn lease_grant(
        &mut self,
        id: i64,
        ttl: i64,
        now: Duration,
        mut fresh_id: impl FnMut() -> i64,
    ) -> Result<(i64, i64), StoreError> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::LeaseTtlTooLarge);
        }
        let id = if id == 0 {
            loop {
                let candidate = fresh_id();
                if candidate > 0 && !self.leases.contains_key(&candidate) {
                    break candidate;
                }
            }
        } else if self.leases.contains_key(&id) {
            return Err(StoreError::LeaseExists);
        } else {
            id
        };
        let ttl = ttl.max(MIN_LEASE_TTL);
        let expires_at = now + Duration::from_secs(ttl as u64);
        self.expiries.insert((expires_at, id));
        self.leases.insert(
            id,
            Lease {
                granted_ttl: ttl,
                expires_at,
                keys: BTreeSet::new(),
            },
        );
        self.history.leases.insert(
            id,
            LeaseRecord {
                id,
                granted_ttl: ttl,
                granted_at: now,
                keep_alives: Vec::new(),
                ended: None,
            },
        );
        Ok((id, ttl))
    }

    /// Revokes a lease and deletes its keys in one revision.
    pub fn lease_revoke(&mut self, id: i64, now: Duration) -> Result<(), StoreError> {
        if !self.leases.contains_key(&id) {
            return Err(StoreError::LeaseNotFound);
        }
        self.end_lease(id, now, LeaseEnd::Revoked);
        Ok(())
    }

    fn end_lease(&mut self, id: i64, now: Duration, how: LeaseEnd) {
        let Some(lease) = self.leases.remove(&id) else {
            return;
        };
        self.expiries.remove(&(lease.expires_at, id));
        let latest = self.latest();
        for key in &lease.keys {
            if let Some(kv) = self
                .live_in(&super::keyspace::KeyRange::new(key, b""), latest)
                .pop()
            {
                self.stage_tombstone(kv);
            }
        }
        self.commit(now);
        if let Some(record) = self.history.leases.get_mut(&id) {
            record.ended = Some((now, how));
        }
    }

    /// Renews a lease for its granted TTL; an unknown (or expired) lease answers TTL 0, as etcd does.
    pub fn lease_keep_alive(&mut self, id: i64, now: Duration, member: usize) -> i64 {
        self.expire_leases(now);
        let Some(lease) = self.leases.get_mut(&id) else {
            return 0;
        };
        self.expiries.remove(&(lease.expires_at, id));
        lease.expires_at = now + Duration::from_secs(lease.granted_ttl as u64);
        self.expiries.insert((lease.expires_at, id));
        if let Some(record) = self.history.leases.get_mut(&id) {
            record.keep_alives.push((now, member));
        }
        lease.granted_ttl
    }

    pub fn lease_time_to_live(&mut self, id: i64, with_keys: bool, now: Duration) -> TimeToLive {
        self.expire_leases(now);
        match self.leases.get(&id) {
            None => TimeToLive {
                ttl: -1,
                granted_ttl: 0,
                keys: Vec::new(),
            },
            Some(lease) => TimeToLive {
                ttl: lease.expires_at.saturating_sub(now).as_secs() as i64,
                granted_ttl: lease.granted_ttl,
                keys: if with_keys {
                    lease.keys.iter().cloned().collect()
                } else {
                    Vec::new()
                },
            },
        }
    }

    pub fn lease_ids(&mut self, now: Duration) -> Vec<i64> {
        self.expire_leases(now);
        self.leases.keys().copied().collect()
    }

    /// Ends every lease whose time is up (each deleting its keys in its own revision), unless there is no leader.
    /// Returns whether any ended.
    pub fn expire_leases(&mut self, now: Duration) -> bool {
        if self.expiry_paused {
            return false;
        }
        let mut due: Vec<i64> = self
            .expiries
            .iter()
            .take_while(|(expires_at, _)| *expires_at <= now)
            .map(|(_, id)| *id)
            .collect();
        // Leases due together end in ID order (each in its own revision).
        due.sort_unstable();
        for id in &due {
            self.end_lease(*id, now, LeaseEnd::Expired);
        }
        !due.is_empty()
    }

    /// The cluster lost its leader: no lease expires until one is elected ([`Store::promote_leases`]).
    pub fn pause_lease_expiry(&mut self) {
        self.expiry_paused = true;
    }

    /// A new leader was elected at `now`: as etcd's lessor does on promotion, every lease is renewed for its TTL
    /// plus `extend` (an election timeout), since the new leader cannot tell when each was last renewed; leases
    /// expire again from then on.
    pub fn promote_leases(&mut self, now: Duration, extend: Duration) {
        self.expiry_paused = false;
        self.expiries.clear();
        for (id, lease) in &mut self.leases {
            lease.expires_at = now + extend + Duration::from_secs(lease.granted_ttl as u64);
            self.expiries.insert((lease.expires_at, *id));
        }
        self.history.elections.push(now);
    }

    /// When the next lease expires, if any lease exists and leases expire at all (not while there is no leader).
    pub fn next_expiry(&self) -> Option<Duration> {
        if self.expiry_paused {
            return None;
        }
        self.expiries.first().map(|(expires_at, _)| *expires_at)
    }
}
