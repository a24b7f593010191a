//! MemberList with `--advertise-client-url`: clients that sync their endpoints from MemberList (clientv3's `Sync`,
//! `--endpoints-auto-sync-interval`) must find proxies there, not etcd's members, or they route around the proxy.
//! So the answer lists the proxies registered under `--resolver-prefix`, or else this proxy alone, as etcd's Go
//! proxy answers; without an advertised URL, MemberList passes through to etcd. A caller etcd refuses its
//! MemberList (under auth, etcd 3.5.30 lists the members only to users: not without a token) is refused the same
//! way.

use std::sync::Arc;

use proto::etcdserverpb::{
    Member, MemberListRequest, MemberListResponse, RangeRequest, RangeResponse,
};
use tonic::{Request, Status};

use super::entry;
use crate::config::Advertise;
use crate::error;
use crate::upstream::identity::Identity;
use crate::upstream::{Retry, Upstream, path};

/// What MemberList answers through this proxy.
pub struct Members {
    upstream: Arc<Upstream>,
    advertise: Advertise,
    /// The prefix registrations live under in etcd (the namespace's included), with `--resolver-prefix`.
    registrations: Option<Vec<u8>>,
    /// The proxy's own identity (`--user`), to read the registrations with under etcd auth.
    identity: Option<Arc<Identity>>,
}

impl Members {
    pub fn new(
        upstream: Arc<Upstream>,
        advertise: Advertise,
        registrations: Option<Vec<u8>>,
        identity: Option<Arc<Identity>>,
    ) -> Self {
        Self {
            upstream,
            advertise,
            registrations,
            identity,
        }
    }

    /// The answer to a MemberList call whose caller sent `token`: the registered proxies, or, when none can be
    /// read (none registered yet, etcd unreachable, no permission), this proxy alone. Like etcd's Go proxy's, the
    /// answer has no header: it does not come from one member. A caller etcd would refuse is refused
    /// ([`Members::check_caller`]).
    pub async fn answer(&self, token: Option<String>) -> Result<MemberListResponse, Status> {
        self.check_caller(token.as_deref()).await?;
        let mut members = match &self.registrations {
            Some(prefix) => self.registered(prefix, token).await,
            None => Vec::new(),
        };
        if members.is_empty() {
            members.push(member(&self.advertise.url, &self.advertise.name));
        }
        Ok(MemberListResponse {
            header: None,
            members,
        })
    }

    /// Refuses the caller with `token` if etcd refuses it its own MemberList: with auth on, etcd 3.5.30 and later
    /// list the members only to a caller with a valid token. The caller's MemberList goes to etcd with its token, and only an
    /// auth refusal is passed on: etcd unreachable does not keep the proxy from listing the fleet.
    async fn check_caller(&self, token: Option<&str>) -> Result<(), Status> {
        let mut request = Request::new(MemberListRequest {
            linearizable: false,
        });
        if let Some(token) = token.and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        let asked = self
            .upstream
            .call::<_, MemberListResponse>(Retry::ReadOnly, path::MEMBER_LIST, request)
            .await;
        match asked {
            Err(refused) if error::is_auth_refusal(&refused) => Err(refused),
            _ => Ok(()),
        }
    }

    /// The proxies registered under `prefix`, in key order; none when they cannot be read.
    async fn registered(&self, prefix: &[u8], caller_token: Option<String>) -> Vec<Member> {
        let token = match &self.identity {
            Some(identity) => match identity.token(&self.upstream).await {
                Ok(token) => token,
                Err(status) => {
                    tracing::warn!(%status, "cannot read the registered proxies: no token");
                    return Vec::new();
                }
            },
            None => caller_token,
        };
        let (key, range_end) = entry::range(prefix);
        let mut request = Request::new(RangeRequest {
            key,
            range_end,
            serializable: true,
            ..Default::default()
        });
        if let Some(token) = token.and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        let read = self
            .upstream
            .call::<_, RangeResponse>(Retry::ReadOnly, path::RANGE, request)
            .await;
        match read {
            Ok(answer) => answer
                .into_inner()
                .kvs
                .iter()
                .filter_map(|kv| entry::parse(&kv.value))
                .map(|registered| member(&registered.url, &registered.name))
                .collect(),
            Err(status) => {
                tracing::warn!(%status, "cannot read the registered proxies; listing this proxy alone");
                Vec::new()
            }
        }
    }
}

/// A member standing for the proxy at `url`. Its ID is a hash of the URL, so that each proxy listed has its own
/// (etcd's Go proxy gives every one 0); no peer URLs, not a learner.
fn member(url: &str, name: &str) -> Member {
    Member {
        id: fnv1a(url.as_bytes()),
        name: name.to_owned(),
        peer_ur_ls: Vec::new(),
        client_ur_ls: vec![url.to_owned()],
        is_learner: false,
    }
}

/// FNV-1a, 64 bits: a stable hash (the same ID for the same URL from every proxy and every run).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_has_a_name_its_url_and_a_stable_id_of_its_own() {
        let a = member("127.0.0.1:23790", "host");
        assert_eq!(a.name, "host");
        assert_eq!(a.client_ur_ls, ["127.0.0.1:23790"]);
        assert_eq!(a.id, member("127.0.0.1:23790", "other").id);
        assert_ne!(a.id, member("127.0.0.1:23791", "host").id);
        assert_ne!(a.id, 0);
    }
}
