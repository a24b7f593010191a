//! Write-to-visible: how long a write made directly on etcd takes to show in serializable reads through a target
//! while a client keeps reading the key there. A proxy that answers serializable reads from a copy kept current by
//! a watch (this proxy's range cache) shows it within an event's delivery; etcd's Go proxy, whose cache only writes
//! made through itself invalidate, serves the value it cached forever; direct etcd and a proxy without a cache show
//! it in the next read (the floor: one read's round trip).
//!
//! One client, one connection to the target, one to etcd:
//! 1. warm-up: serializable reads of the key through the target, back to back (a cache fills its copy);
//! 2. per write: a put of a fresh value directly on etcd; from its acknowledgement, serializable reads of the key
//!    through the target, back to back, until one returns the new value (its answer's arrival is the latency) or
//!    the wait runs out (the write counts as never seen);
//! 3. a run stops early after `give_up_after` writes in a row were never seen, the rest counted as not attempted,
//!    so that a target that never shows a write costs `give_up_after` waits, not one per write.
//!
//! Latencies go into the run's [`Tally`] (completed = writes seen), the counts into [`VisibilityStats`].

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use tonic::transport::Channel;

use super::REQUEST_TIMEOUT;
use super::recorder::{Recorder, Tally};
use crate::meter::Meter;

/// After a failed read, the next one waits this long (a failing target is not polled in a hot loop).
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(5);

/// The key each target's run writes and reads, as that target's clients name it.
pub fn key(target_label: &str) -> Vec<u8> {
    format!("bench/visible/{target_label}").into_bytes()
}

/// One write-to-visible run at one target.
#[derive(Clone, Debug)]
pub struct WriteToVisible {
    /// The key as the target's clients name it.
    pub key: Vec<u8>,
    /// The same key as written directly on etcd (with the proxies' namespace in front, if any).
    pub etcd_key: Vec<u8>,
    pub writes: usize,
    /// How long each write is awaited in reads through the target.
    pub wait: Duration,
    pub give_up_after: usize,
    /// Reads through the target before the first write.
    pub warmup: Duration,
    pub value_size: usize,
    /// Makes the values of this run differ from every other run's (target, round).
    pub tag: String,
}

/// What a run's writes came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VisibilityStats {
    /// Writes made (acknowledged by etcd).
    pub writes: u64,
    /// Writes a read through the target returned within the wait.
    pub seen: u64,
    /// Writes no read through the target returned within the wait.
    pub never: u64,
    /// Writes not made because the run gave up after `give_up_after` writes in a row never seen.
    pub not_attempted: u64,
    /// The wait per write, seconds.
    pub wait_seconds: f64,
    /// Reads through the target from the first write's acknowledgement to the end, and those that returned an
    /// older value.
    pub reads: u64,
    pub stale_reads: u64,
}

impl WriteToVisible {
    /// The value of write `i` (`i` 0 is the one before the warm-up): the tag and the index, padded to the value size.
    fn value(&self, i: usize) -> Vec<u8> {
        let mut value = format!("{} #{i} ", self.tag).into_bytes();
        if value.len() < self.value_size {
            value.resize(self.value_size, b'v');
        }
        value
    }

    /// Runs it: reads through `target`, writes on `direct`; `meter` is started after the warm-up and ended after the
    /// last write.
    pub async fn run(
        &self,
        target: Channel,
        direct: Channel,
        meter: &Meter,
    ) -> (Tally, VisibilityStats) {
        let mut reader = KvClient::new(target);
        let mut writer = KvClient::new(direct);
        let mut recorder = Recorder::new();
        let mut stats = VisibilityStats {
            wait_seconds: self.wait.as_secs_f64(),
            ..Default::default()
        };
        // The key holds a value of this run before the warm-up, so that its reads find one.
        if let Err(e) = self.put(&mut writer, 0).await {
            recorder.failure(format!("first put on etcd: {e}"));
        }
        let warm_until = Instant::now() + self.warmup;
        while Instant::now() < warm_until {
            if self.read(&mut reader).await.is_err() {
                tokio::time::sleep(RETRY_AFTER_ERROR).await;
            }
        }
        meter.start().await;
        meter.in_place().await;
        let began = Instant::now();
        let mut unseen_in_a_row = 0;
        for i in 1..=self.writes {
            if let Err(e) = self.put(&mut writer, i).await {
                recorder.failure(format!("put on etcd: {e}"));
                continue;
            }
            let acknowledged = Instant::now();
            stats.writes += 1;
            let expected = self.value(i);
            let mut seen = false;
            while acknowledged.elapsed() < self.wait {
                stats.reads += 1;
                match self.read(&mut reader).await {
                    Ok(value) if value.as_deref() == Some(expected.as_slice()) => {
                        recorder.success(acknowledged.elapsed());
                        seen = true;
                        break;
                    }
                    Ok(_) => stats.stale_reads += 1,
                    Err(e) => {
                        recorder.failure(format!("read through the target: {e}"));
                        tokio::time::sleep(RETRY_AFTER_ERROR).await;
                    }
                }
            }
            if seen {
                stats.seen += 1;
                unseen_in_a_row = 0;
            } else {
                stats.never += 1;
                unseen_in_a_row += 1;
                if unseen_in_a_row >= self.give_up_after.max(1) {
                    stats.not_attempted = (self.writes - i) as u64;
                    break;
                }
            }
        }
        let window = began.elapsed();
        meter.end().await;
        (recorder.tally(window), stats)
    }

    async fn put(&self, writer: &mut KvClient<Channel>, i: usize) -> Result<(), String> {
        let request = PutRequest {
            key: self.etcd_key.clone(),
            value: self.value(i),
            ..Default::default()
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, writer.put(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    }

    /// One serializable read of the key through the target: the value it returned (None: no such key).
    async fn read(&self, reader: &mut KvClient<Channel>) -> Result<Option<Vec<u8>>, String> {
        let request = RangeRequest {
            key: self.key.clone(),
            serializable: true,
            ..Default::default()
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, reader.range(request)).await {
            Ok(Ok(response)) => Ok(response
                .into_inner()
                .kvs
                .into_iter()
                .next()
                .map(|kv| kv.value.to_vec())),
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_write_has_a_value_of_its_own_padded_to_the_size() {
        let run = WriteToVisible {
            key: key("go-proxy"),
            etcd_key: [b"ns/".as_slice(), &key("go-proxy")].concat(),
            writes: 3,
            wait: Duration::from_secs(1),
            give_up_after: 2,
            warmup: Duration::ZERO,
            value_size: 32,
            tag: "go-proxy round 2".into(),
        };
        assert_eq!(run.value(1).len(), 32);
        assert!(run.value(1).starts_with(b"go-proxy round 2 #1 v"));
        assert_ne!(run.value(1), run.value(11));
        assert_eq!(run.key, b"bench/visible/go-proxy");
    }
}
