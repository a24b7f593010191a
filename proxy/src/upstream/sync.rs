//! `--endpoints-auto-sync-interval`: the endpoint list follows the cluster's membership, as clientv3's auto-sync
//! does, so the proxy keeps serving while members are replaced one by one, the ones it started with included.
//! Every interval the active member's MemberList is read; the client URLs of its members (learners excluded: they
//! serve no client requests; members without a name excluded: they have not started) become the endpoints. New
//! ones are added, ones no longer listed are retired (their channels released: see [`super::pool`]), and an active
//! endpoint that is retired is replaced (its channel goes at the next sync after that). A
//! MemberList that fails, or that lists nothing usable, changes nothing (logged, as clientv3 logs it). With
//! `--user`, the MemberList carries the proxy's token.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use proto::etcdserverpb::{MemberListRequest, MemberListResponse};
use tonic::Request;

use super::identity::Identity;
use super::pool::Member;
use super::{Replace, Retry, Upstream, path, sleep_unless_shutdown};
use crate::config::{Endpoint, Scheme};

/// How long one sync may take (clientv3's auto-sync gives its `Sync` 5 s).
const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

impl Upstream {
    /// Refreshes the endpoints every `every` until the proxy shuts down, asking as the proxy's `identity` if it
    /// has one (under auth etcd 3.5.30 lists its members only to a caller with a valid token).
    pub async fn auto_sync(self: Arc<Self>, every: Duration, identity: Option<Arc<Identity>>) {
        let mut shutdown = self.shutdown.clone();
        while sleep_unless_shutdown(&mut shutdown, every).await {
            let listed = self.member_list(identity.as_deref());
            match tokio::time::timeout(SYNC_TIMEOUT, listed).await {
                Ok(Ok(list)) => self.follow(&list),
                Ok(Err(status)) => tracing::warn!(%status, "endpoint sync: MemberList failed"),
                Err(_) => tracing::warn!("endpoint sync: MemberList not answered in time"),
            }
        }
    }

    async fn member_list(
        self: &Arc<Self>,
        identity: Option<&Identity>,
    ) -> Result<MemberListResponse, tonic::Status> {
        let mut request = Request::new(MemberListRequest { linearizable: true });
        let token = match identity {
            Some(identity) => identity.token(self).await?,
            None => None,
        };
        if let Some(token) = token.as_deref().and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("token", token);
        }
        let listed = self.call(Retry::ReadOnly, path::MEMBER_LIST, request).await;
        if let (Err(refused), Some(identity)) = (&listed, identity)
            && refused.code() == tonic::Code::Unauthenticated
        {
            // The token is gone (an etcd restart forgets every token): the next sync authenticates again.
            identity.forget(token.as_deref()).await;
        }
        listed.map(tonic::Response::into_inner)
    }

    /// Makes the endpoints those `list` names.
    fn follow(self: &Arc<Self>, list: &MemberListResponse) {
        let listed = self.usable_urls(list);
        if listed.is_empty() {
            tracing::warn!(
                "endpoint sync: MemberList names no usable client URL; endpoints unchanged"
            );
            return;
        }
        let authorities: BTreeSet<&str> = listed.iter().map(Endpoint::authority).collect();
        for endpoint in &listed {
            self.add_endpoint(endpoint);
        }
        for index in self.members.live() {
            let member = self.members.get(index);
            if !authorities.contains(member.endpoint.authority()) {
                self.retire(index);
            }
        }
        // The active endpoint keeps its channel while calls still go there (a retired one is being replaced).
        self.members.release_retired(self.active.borrow().index);
    }

    /// The client URLs of `list`'s started voting members that this proxy can dial (the scheme its TLS settings
    /// speak: etcd lists `https://` URLs when its clients use TLS).
    fn usable_urls(&self, list: &MemberListResponse) -> Vec<Endpoint> {
        let mut urls = Vec::new();
        for member in list
            .members
            .iter()
            .filter(|m| !m.is_learner && !m.name.is_empty())
        {
            for url in &member.client_ur_ls {
                match Endpoint::parse(url) {
                    Ok(endpoint) if self.speaks(&endpoint) => urls.push(endpoint),
                    Ok(_) => {
                        tracing::warn!(%url, tls = self.tls_on, "endpoint sync: a client URL of the other scheme is skipped")
                    }
                    Err(error) => {
                        tracing::warn!(%error, "endpoint sync: a client URL that does not parse is skipped")
                    }
                }
            }
        }
        urls
    }

    fn speaks(&self, endpoint: &Endpoint) -> bool {
        match endpoint.scheme() {
            Scheme::Bare => true,
            Scheme::Http => !self.tls_on,
            Scheme::Https => self.tls_on,
        }
    }

    /// Adds `endpoint`, or brings it back if it was retired.
    fn add_endpoint(&self, endpoint: &Endpoint) {
        let index = match self.members.find(endpoint.authority()) {
            Some(index) => {
                let connect = || {
                    self.channel_settings
                        .connect(endpoint, &self.connector, &self.workers)
                };
                if !self.members.get(index).restore(connect) {
                    return;
                }
                index
            }
            None => {
                let channels =
                    self.channel_settings
                        .connect(endpoint, &self.connector, &self.workers);
                self.members.push(Member::new(endpoint.clone(), channels))
            }
        };
        let authority = self.members.get(index).endpoint.authority().to_owned();
        self.metrics
            .upstream_up
            .with_label_values(&[&authority])
            .set(1);
        self.metrics
            .upstream_active
            .with_label_values(&[&authority])
            .set(0);
        tracing::info!(endpoint = %endpoint, "endpoint sync: endpoint added");
    }

    /// Stops using endpoint `index`; moves off it if it is active. The last endpoint is never retired.
    fn retire(self: &Arc<Self>, index: usize) {
        if self.len() < 2 {
            return;
        }
        let member = self.members.get(index);
        member.retire();
        let authority = member.endpoint.authority();
        let _ = self.metrics.upstream_up.remove_label_values(&[authority]);
        let _ = self
            .metrics
            .upstream_active
            .remove_label_values(&[authority]);
        tracing::info!(endpoint = %member.endpoint, "endpoint sync: endpoint removed");
        let active = self.active();
        if active.index == index {
            self.replace(&active, Replace::Failed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::metrics::Metrics;
    use proto::etcdserverpb::Member as Listed;

    fn upstream(endpoints: &[&str]) -> Arc<Upstream> {
        let endpoints = endpoints
            .iter()
            .map(|e| Endpoint::parse(e).unwrap())
            .collect();
        let config = Config::new(endpoints, "127.0.0.1:0".parse().unwrap(), 1);
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let (_, shutdown) = tokio::sync::watch::channel(false);
        let tls: Option<Arc<crate::tls::ClientTls>> = None;
        Upstream::new(
            &config,
            Arc::new(crate::upstream::tests::Recording::default()),
            tls,
            metrics,
            shutdown,
            &crate::workers::Workers::on_current(1),
        )
    }

    fn listing(endpoints: &[&str]) -> MemberListResponse {
        let members = endpoints
            .iter()
            .map(|url| Listed {
                name: format!("member {url}"),
                client_ur_ls: vec![(*url).to_owned()],
                ..Default::default()
            })
            .collect();
        MemberListResponse {
            members,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn an_endpoint_no_longer_listed_keeps_no_channel_until_it_comes_back() {
        let all = ["http://a:2379", "http://b:2379", "http://c:2379"];
        let upstream = upstream(&all);
        let active = upstream.active.borrow().index;
        let dropped = (active + 1) % all.len();
        let others: Vec<&str> = (0..all.len())
            .filter(|&i| i != dropped)
            .map(|i| all[i])
            .collect();
        upstream.follow(&listing(&others));
        assert_eq!(upstream.len(), 2);
        assert_eq!(
            upstream.members.channels(),
            2,
            "the dropped endpoint's channel goes with it"
        );
        upstream.follow(&listing(&others));
        assert_eq!(
            upstream.members.channels(),
            2,
            "nor is it made again while the endpoint stays out"
        );
        upstream.follow(&listing(&all));
        assert_eq!(upstream.len(), 3);
        assert_eq!(
            upstream.members.channels(),
            3,
            "an endpoint that comes back is connected again"
        );
    }

    #[tokio::test]
    async fn the_active_endpoint_dropped_keeps_its_channel_until_another_serves() {
        let all = ["http://a:2379", "http://b:2379", "http://c:2379"];
        let upstream = upstream(&all);
        let mut active = upstream.active.subscribe();
        let chosen = active.wait_for(|s| !s.choosing).await.unwrap().index;
        let others: Vec<&str> = (0..all.len())
            .filter(|&i| i != chosen)
            .map(|i| all[i])
            .collect();
        upstream.follow(&listing(&others));
        assert_eq!(
            upstream.members.channels(),
            3,
            "calls still go to it while its replacement is chosen"
        );
        active
            .wait_for(|s| s.index != chosen && !s.choosing)
            .await
            .unwrap();
        upstream.follow(&listing(&others));
        assert_eq!(upstream.members.channels(), 2, "the next sync releases it");
    }
}
