//! Load generation: tonic clients of the `proto` crate over N connections, driven closed-loop (M requests in flight
//! per connection) or open-loop at a fixed rate, with latency recorded per request.
//!
//! - [`dial`]: connections to a target, in the clear or over mutual TLS (tokio-rustls under tonic).
//! - [`recorder`]: latency histograms and error counts, merged into a [`recorder::Tally`].
//! - [`kv`]: put, linearizable range, serializable range over a hot set, and the mixed workload.
//! - [`handshake`]: a new connection (and TLS handshake) per request, one range on it, closed.
//! - [`watch`]: W watchers on one key (P per Watch stream), puts at a steady rate, completeness, put-to-delivery
//!   and put-to-last-delivery latency ([`fanout`]), idle memory per watcher.
//! - [`lease`]: L leases kept alive over S streams.
//! - [`visible`]: how long a write made directly on etcd takes to show in serializable reads through a target.

pub mod dial;
pub mod fanout;
pub mod handshake;
pub mod kv;
pub mod lease;
pub mod recorder;
pub mod visible;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::{RngCore, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::meter::Meter;
use recorder::{Recorder, Tally};

/// A request that has not answered by then counts as failed, so a stuck target cannot hang the benchmark.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One kind of unary request, made on a lane: a connection (a [`Channel`]), or what opens one (a
/// [`dial::Dialer`]). `draw` is a fresh number from the worker's seeded RNG, for choosing keys and kinds.
pub trait Operation<L = Channel>: Send + Sync + 'static {
    fn call(&self, lane: L, draw: u64) -> BoxFuture<'static, Result<(), tonic::Status>>;
}

/// How a unary scenario is driven.
#[derive(Clone, Debug)]
pub struct Shape {
    pub inflight_per_connection: usize,
    /// Total requests per second (open loop); None for closed loop.
    pub rate: Option<f64>,
    pub warmup: Duration,
    pub measured: Duration,
    pub seed: u64,
}

/// Drives `op` over `lanes` (`shape.inflight_per_connection` workers on each) as `shape` says. Requests that start
/// inside the measured window are recorded; `meter` is started when the window opens, read in the middle, and
/// ended when it closes.
pub async fn drive<L: Clone + Send + 'static>(
    lanes: &[L],
    shape: &Shape,
    op: Arc<dyn Operation<L>>,
    meter: &Meter,
) -> Tally {
    let begin = Instant::now();
    let window_start = begin + shape.warmup;
    let window_end = window_start + shape.measured;
    let slots = Arc::new(AtomicU64::new(0));
    let workers = lanes.len() * shape.inflight_per_connection.max(1);
    let mut tasks = Vec::with_capacity(workers);
    for index in 0..workers {
        let lane = lanes[index % lanes.len()].clone();
        let op = Arc::clone(&op);
        let slots = Arc::clone(&slots);
        let rate = shape.rate;
        let seed = shape.seed.wrapping_add(index as u64);
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut recorder = Recorder::new();
            loop {
                // Closed loop: the next request starts when the previous answered. Open loop: it starts at its
                // slot in a global schedule, and latency counts from the slot, so a slow target is not excused
                // for the requests it delayed (no coordinated omission).
                let scheduled = match rate {
                    None => Instant::now(),
                    Some(rate) => {
                        let slot = slots.fetch_add(1, Ordering::Relaxed);
                        let at = begin + Duration::from_secs_f64(slot as f64 / rate);
                        tokio::time::sleep_until(at).await;
                        at
                    }
                };
                if scheduled >= window_end {
                    break;
                }
                let result =
                    tokio::time::timeout(REQUEST_TIMEOUT, op.call(lane.clone(), rng.next_u64()))
                        .await;
                if scheduled < window_start {
                    continue;
                }
                match result {
                    Ok(Ok(())) => recorder.success(scheduled.elapsed()),
                    Ok(Err(status)) => {
                        recorder.failure(format!("{:?}: {}", status.code(), status.message()))
                    }
                    Err(_) => recorder.failure(format!("no answer within {REQUEST_TIMEOUT:?}")),
                }
            }
            recorder
        }));
    }
    tokio::time::sleep_until(window_start).await;
    meter.start().await;
    tokio::time::sleep_until(window_start + shape.measured / 2).await;
    meter.in_place().await;
    tokio::time::sleep_until(window_end).await;
    meter.end().await;
    let mut total = Recorder::new();
    for task in tasks {
        match task.await {
            Ok(recorder) => total.merge(&recorder),
            Err(e) => total.failure(format!("load worker failed: {e}")),
        }
    }
    total.tally(shape.measured)
}
