//! What the proxy knows of the gateway of the etcd behind ([`EtcdGateway`]), learned by asking the active member and
//! asked again after [`RELEARN_AFTER`] (a rolling upgrade changes it). Only the first gateway call waits for the
//! answer; later ones use what is known while a task asks again, so an etcd that does not answer (a member down, a
//! partition) never adds its timeouts to a call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use super::dialect::{self, EtcdGateway};
use crate::upstream::Upstream;

/// How long what was learned is trusted before the active member is asked again.
pub const RELEARN_AFTER: Duration = Duration::from_secs(10);

/// What is known, and whether a task is asking again.
#[derive(Clone, Copy)]
struct Known {
    etcd: EtcdGateway,
    at: Instant,
    asking: bool,
}

/// The gateway of the etcd behind, as far as it is known.
pub struct Learned {
    upstream: Arc<Upstream>,
    known: Arc<Mutex<Option<Known>>>,
}

impl Learned {
    pub fn new(upstream: Arc<Upstream>) -> Self {
        Self {
            upstream,
            known: Arc::new(Mutex::new(None)),
        }
    }

    /// The gateway of the etcd behind: the first call asks and waits; a call after [`RELEARN_AFTER`] starts one
    /// task to ask again and is answered with what is known.
    pub async fn etcd_gateway(&self) -> EtcdGateway {
        let known = {
            let mut known = lock(&self.known);
            match known.as_mut() {
                None => None,
                Some(now) if now.asking || now.at.elapsed() < RELEARN_AFTER => return now.etcd,
                Some(stale) => {
                    stale.asking = true;
                    Some(stale.etcd)
                }
            }
        };
        let asking = ask(self.upstream.clone(), self.known.clone());
        match known {
            Some(etcd) => {
                tokio::spawn(asking);
                etcd
            }
            None => asking.await,
        }
    }
}

/// Asks the active member, and records what it says (or, when it cannot say, keeps what was known, or the newest
/// etcd's gateway, until the next time).
async fn ask(upstream: Arc<Upstream>, known: Arc<Mutex<Option<Known>>>) -> EtcdGateway {
    let answer = upstream
        .http_get(dialect::PROBE_PATH, &HeaderMap::new())
        .await;
    let learned = match answer {
        Ok(answer) => EtcdGateway::of_probe(answer.status, &answer.body),
        Err(_) => None,
    };
    let mut known = lock(&known);
    let etcd = learned
        .or(known.map(|known| known.etcd))
        .unwrap_or(EtcdGateway::NEWEST);
    *known = Some(Known {
        etcd,
        at: Instant::now(),
        asking: false,
    });
    etcd
}

fn lock(known: &Mutex<Option<Known>>) -> std::sync::MutexGuard<'_, Option<Known>> {
    known.lock().unwrap_or_else(|e| e.into_inner())
}
