//! The KV scenarios: put, linearizable range, serializable range over a hot set, and a mixed workload.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use tonic::transport::Channel;

use super::Operation;

/// Key `i` of the hot set every range scenario reads.
pub fn hot_key(i: usize) -> Vec<u8> {
    format!("bench/hot/{i:05}").into_bytes()
}

fn put_key(i: usize) -> Vec<u8> {
    format!("bench/put/{i:06}").into_bytes()
}

/// Writes the hot set (`keys` keys, `value_size` bytes each) under `prefix` so that ranges find data.
pub async fn populate_hot_set(
    channel: Channel,
    prefix: &str,
    keys: usize,
    value_size: usize,
) -> Result<(), tonic::Status> {
    let mut kv = KvClient::new(channel);
    for i in 0..keys {
        kv.put(PutRequest {
            key: [prefix.as_bytes(), &hot_key(i)].concat(),
            value: vec![b'h'; value_size],
            ..Default::default()
        })
        .await?;
    }
    Ok(())
}

/// Puts of `value_size`-byte values over `keys` keys.
pub struct Put {
    pub keys: usize,
    pub value: Arc<Vec<u8>>,
}

impl Operation for Put {
    fn call(&self, channel: Channel, draw: u64) -> BoxFuture<'static, Result<(), tonic::Status>> {
        let request = PutRequest {
            key: put_key(draw as usize % self.keys.max(1)),
            value: self.value.as_ref().clone(),
            ..Default::default()
        };
        async move { KvClient::new(channel).put(request).await.map(drop) }.boxed()
    }
}

/// Single-key ranges over the hot set.
#[derive(Clone)]
pub struct Range {
    pub hot_keys: usize,
    pub serializable: bool,
}

impl Operation for Range {
    fn call(&self, channel: Channel, draw: u64) -> BoxFuture<'static, Result<(), tonic::Status>> {
        let request = RangeRequest {
            key: hot_key(draw as usize % self.hot_keys.max(1)),
            serializable: self.serializable,
            ..Default::default()
        };
        async move {
            let response = KvClient::new(channel).range(request).await?.into_inner();
            // A range that finds nothing would measure a cheaper request than the scenario claims.
            if response.kvs.is_empty() {
                return Err(tonic::Status::not_found("hot key missing"));
            }
            Ok(())
        }
        .boxed()
    }
}

/// Serializable ranges, linearizable ranges and puts, chosen per request from the worker's seeded RNG.
pub struct Mixed {
    pub serializable_pct: u32,
    pub linearizable_pct: u32,
    pub serializable: Range,
    pub linearizable: Range,
    pub put: Put,
}

impl Operation for Mixed {
    fn call(&self, channel: Channel, draw: u64) -> BoxFuture<'static, Result<(), tonic::Status>> {
        // The low bits choose the kind, the rest the key, so the two choices are independent.
        let kind = (draw % 100) as u32;
        let draw = draw / 100;
        if kind < self.serializable_pct {
            self.serializable.call(channel, draw)
        } else if kind < self.serializable_pct + self.linearizable_pct {
            self.linearizable.call(channel, draw)
        } else {
            self.put.call(channel, draw)
        }
    }
}
