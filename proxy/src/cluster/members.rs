//! MemberList with `--advertise-client-url`: clients that sync their endpoints from MemberList (clientv3's `Sync`,
//! `--endpoints-auto-sync-interval`) must find proxies there, not etcd's members, or they route around the proxy.
//! And clients that act on a member they listed (MoveLeader, MemberUpdate, MemberRemove, MemberPromote, `etcdctl
//! move-leader`) must get IDs etcd knows. So the answer is etcd's own member list, IDs, names, peer URLs and
//! learners as etcd lists them, with each started member's client URLs replaced by the proxies': the proxies
//! registered under `--resolver-prefix`, or else this proxy alone. Without an advertised URL, MemberList passes
//! through to etcd untouched.
//!
//! etcd's list is asked with the caller's request and token, so a caller etcd refuses (under auth, etcd 3.5.30
//! lists the members only to callers with a token) is refused the same way. When etcd cannot answer, the last list
//! it gave is used (its IDs are still etcd's); before any, the caller gets etcd's failure.

use std::sync::{Arc, Mutex};

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
    /// etcd's last answer, for when it cannot answer.
    last_listed: Mutex<Option<MemberListResponse>>,
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
            last_listed: Mutex::new(None),
        }
    }

    /// The answer to a client's MemberList `request`, sent with `token`: etcd's members, reached through the
    /// proxies (see the module's comment).
    pub async fn answer(
        &self,
        request: MemberListRequest,
        token: Option<String>,
    ) -> Result<MemberListResponse, Status> {
        let listed = self.etcd_members(request, token.as_deref()).await?;
        let mut urls = match &self.registrations {
            Some(prefix) => self.registered(prefix, token).await,
            None => Vec::new(),
        };
        if urls.is_empty() {
            urls.push(self.advertise.url.clone());
        }
        Ok(through_proxies(listed, &urls))
    }

    /// etcd's answer to `request` with `token`; its last one when it cannot answer now. An auth refusal is passed
    /// on: it is about the caller, not about etcd.
    async fn etcd_members(
        &self,
        request: MemberListRequest,
        token: Option<&str>,
    ) -> Result<MemberListResponse, Status> {
        let mut request = Request::new(request);
        if let Some(token) = token.and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        let asked = self
            .upstream
            .call::<_, MemberListResponse>(Retry::ReadOnly, path::MEMBER_LIST, request)
            .await;
        let mut last = self.last_listed.lock().unwrap_or_else(|p| p.into_inner());
        match asked {
            Ok(listed) => {
                let listed = listed.into_inner();
                *last = Some(listed.clone());
                Ok(listed)
            }
            Err(refused) if error::is_auth_refusal(&refused) => Err(refused),
            Err(failed) => last.clone().ok_or(failed),
        }
    }

    /// The client URLs of the proxies registered under `prefix`, in key order; none when they cannot be read.
    async fn registered(&self, prefix: &[u8], caller_token: Option<String>) -> Vec<String> {
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
                .map(|registered| registered.url)
                .collect(),
            Err(status) => {
                tracing::warn!(%status, "cannot read the registered proxies; listing this proxy alone");
                Vec::new()
            }
        }
    }
}

/// etcd's `listed` members as clients reach them through the proxies at `urls`: every started member (one with a
/// name: etcd lists a member that has not started yet without name or client URLs, and clients skip it) gets all
/// the proxies' URLs, so that whichever members a client takes its endpoints from (clientv3's `Sync` skips
/// learners), it finds every proxy and no etcd member. The header is etcd's.
fn through_proxies(listed: MemberListResponse, urls: &[String]) -> MemberListResponse {
    let members = listed
        .members
        .into_iter()
        .map(|member| Member {
            client_ur_ls: if member.name.is_empty() {
                member.client_ur_ls
            } else {
                urls.to_vec()
            },
            ..member
        })
        .collect();
    MemberListResponse { members, ..listed }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd_member(id: u64, name: &str, learner: bool) -> Member {
        Member {
            id,
            name: name.into(),
            peer_ur_ls: vec![format!("http://10.0.0.{id}:2380")],
            client_ur_ls: if name.is_empty() {
                Vec::new()
            } else {
                vec![format!("http://10.0.0.{id}:2379")]
            },
            is_learner: learner,
        }
    }

    #[test]
    fn members_keep_etcds_ids_and_are_reached_through_every_proxy() {
        let listed = MemberListResponse {
            header: Some(proto::etcdserverpb::ResponseHeader {
                member_id: 1,
                ..Default::default()
            }),
            members: vec![
                etcd_member(1, "m1", false),
                etcd_member(2, "m2", true),
                etcd_member(3, "", false),
            ],
        };
        let proxies = ["http://p1:23790".to_string(), "http://p2:23790".to_string()];
        let answer = through_proxies(listed.clone(), &proxies);
        assert_eq!(answer.header, listed.header, "etcd's header");
        for (seen, etcd) in answer.members.iter().zip(&listed.members) {
            assert_eq!(
                (seen.id, &seen.name, &seen.peer_ur_ls, seen.is_learner),
                (etcd.id, &etcd.name, &etcd.peer_ur_ls, etcd.is_learner),
                "all but the client URLs as etcd lists them"
            );
        }
        assert_eq!(answer.members[0].client_ur_ls, proxies);
        assert_eq!(answer.members[1].client_ur_ls, proxies, "a learner too");
        assert!(
            answer.members[2].client_ur_ls.is_empty(),
            "a member not started yet stays so"
        );
    }
}
