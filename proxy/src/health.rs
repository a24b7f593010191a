//! `/health`: whether the proxy can serve a linearizable read right now.
//!
//! A Range of key `a` goes through the same upstream path (and failover) as client reads. Answers that prove etcd
//! reached quorum but refused the proxy's anonymous read (permission denied, or no user under auth) count as
//! healthy, as on etcd's proxy.

use std::sync::Arc;
use std::time::Duration;

use proto::etcdserverpb::{RangeRequest, RangeResponse};
use tonic::{Code, Request};

use crate::metrics::Metrics;
use crate::upstream::{Retry, Upstream};

/// How long a health check may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// The outcome of one health check: the HTTP status and the JSON body etcd uses.
#[derive(Debug, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    pub reason: String,
}

impl Health {
    pub fn http_status(&self) -> u16 {
        if self.healthy { 200 } else { 503 }
    }

    pub fn json(&self) -> String {
        format!(
            r#"{{"health":"{}","reason":{}}}"#,
            self.healthy,
            json_string(&self.reason)
        )
    }
}

/// Runs one check and counts it.
pub async fn check(upstream: &Arc<Upstream>, metrics: &Metrics) -> Health {
    let mut request = Request::new(RangeRequest {
        key: b"a".to_vec(),
        ..Default::default()
    });
    request.set_timeout(HEALTH_TIMEOUT);
    let read = tokio::time::timeout(HEALTH_TIMEOUT, async {
        upstream
            .call::<_, RangeResponse>(Retry::ReadOnly, crate::upstream::path::RANGE, request)
            .await
    });
    let health = match read.await {
        Ok(Ok(_)) => Health {
            healthy: true,
            reason: String::new(),
        },
        Ok(Err(status)) if refused_but_answered(status.code(), status.message()) => Health {
            healthy: true,
            reason: String::new(),
        },
        Ok(Err(status)) => Health {
            healthy: false,
            reason: format!("GET ERROR:{}", status.message()),
        },
        Err(_elapsed) => Health {
            healthy: false,
            reason: "GET ERROR:context deadline exceeded".into(),
        },
    };
    if health.healthy {
        metrics.health_success.inc()
    } else {
        metrics.health_failures.inc()
    }
    health
}

fn refused_but_answered(code: Code, message: &str) -> bool {
    code == Code::PermissionDenied || message == "etcdserver: user name is empty"
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_match_etcds_format() {
        let ok = Health {
            healthy: true,
            reason: String::new(),
        };
        assert_eq!(
            (ok.http_status(), ok.json()),
            (200, r#"{"health":"true","reason":""}"#.to_string())
        );
        let bad = Health {
            healthy: false,
            reason: "GET ERROR:say \"no\"\n".into(),
        };
        assert_eq!(bad.http_status(), 503);
        assert_eq!(
            bad.json(),
            r#"{"health":"false","reason":"GET ERROR:say \"no\"\u000a"}"#
        );
    }

    #[test]
    fn auth_refusals_prove_a_working_cluster() {
        assert!(refused_but_answered(
            Code::PermissionDenied,
            "etcdserver: permission denied"
        ));
        assert!(refused_but_answered(
            Code::InvalidArgument,
            "etcdserver: user name is empty"
        ));
        assert!(!refused_but_answered(
            Code::Unavailable,
            "etcdserver: no leader"
        ));
    }
}
