//! The proxy's own etcd identity (`--user`, `--password`), used for upstream watch streams only.
//!
//! Why: a watch stream carries the token it was opened with, and etcd checks that token again at every create on
//! it. A stream opened with one caller's token would fail the moment that token expires and the proxy has to
//! re-create its watchers (a failover, an etcd restart that forgets every token), so the callers would see their
//! watchers cancelled. With an identity the proxy holds the upstream streams with its own token, obtains a new one
//! whenever etcd refuses the old one, and checks each caller's own token for read permission on the range before
//! admitting its watcher (see `watch::admission`).

use std::fmt;
use std::sync::Arc;

use proto::etcdserverpb::{AuthenticateRequest, AuthenticateResponse};
use tokio::sync::Mutex;
use tonic::{Code, Request, Status};

use super::{Retry, Upstream};
use crate::metrics::Metrics;

/// etcd's answer to Authenticate when auth is disabled: the proxy then watches without a token.
const AUTH_NOT_ENABLED: &str = "etcdserver: authentication is not enabled";

/// A user name and password for etcd.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    // The password stays out of logs and panics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Held {
    /// Nothing obtained yet, or the last token was refused.
    Nothing,
    Token(String),
    /// etcd said auth is disabled: watch without a token (until etcd refuses that).
    AuthDisabled,
}

/// The proxy's identity and the token it holds now.
pub struct Identity {
    credentials: Credentials,
    held: Mutex<Held>,
    metrics: Metrics,
}

impl Identity {
    pub fn new(credentials: Credentials, metrics: Metrics) -> Arc<Self> {
        Arc::new(Self {
            credentials,
            held: Mutex::new(Held::Nothing),
            metrics,
        })
    }

    /// The token to open an upstream watch stream with (`None`: etcd's auth is disabled). Authenticates when no
    /// token is held; concurrent callers wait for one Authenticate.
    pub async fn token(&self, upstream: &Arc<Upstream>) -> Result<Option<String>, Status> {
        let mut held = self.held.lock().await;
        match &*held {
            Held::Token(token) => return Ok(Some(token.clone())),
            Held::AuthDisabled => return Ok(None),
            Held::Nothing => {}
        }
        let request = Request::new(AuthenticateRequest {
            name: self.credentials.user.clone(),
            password: self.credentials.password.clone(),
        });
        // Not repeated once sent: each attempt costs etcd a bcrypt comparison and may issue a token.
        let answer: Result<tonic::Response<AuthenticateResponse>, Status> = upstream
            .call(Retry::Write, super::path::AUTHENTICATE, request)
            .await;
        let result = match &answer {
            Ok(_) => "token",
            Err(status) if is_auth_disabled(status) => "auth_disabled",
            Err(_) => "error",
        };
        self.metrics
            .watch_identity_authentications
            .with_label_values(&[result])
            .inc();
        match answer {
            Ok(response) => {
                let token = response.into_inner().token;
                *held = Held::Token(token.clone());
                Ok(Some(token))
            }
            Err(status) if is_auth_disabled(&status) => {
                *held = Held::AuthDisabled;
                Ok(None)
            }
            Err(status) if crate::error::is_endpoint_failure(&status) => {
                tracing::debug!(%status, "no etcd endpoint answered the proxy's Authenticate");
                Err(status)
            }
            Err(status) => {
                tracing::warn!(user = %self.credentials.user, %status, "etcd refused the proxy's --user credentials");
                Err(status)
            }
        }
    }

    /// etcd refused `stale` (the token a stream was opened with): the next [`token`](Self::token) authenticates
    /// again, unless another stream already replaced it.
    pub async fn forget(&self, stale: Option<&str>) {
        let mut held = self.held.lock().await;
        let current = match &*held {
            Held::Token(token) => Some(token.as_str()),
            Held::AuthDisabled => None,
            Held::Nothing => return,
        };
        if current == stale {
            *held = Held::Nothing;
        }
    }
}

/// The token of the proxy's own calls: its identity's when it has one (`--user`), none otherwise.
pub async fn own_token(
    identity: Option<&Arc<Identity>>,
    upstream: &Arc<Upstream>,
) -> Result<Option<String>, Status> {
    match identity {
        Some(identity) => identity.token(upstream).await,
        None => Ok(None),
    }
}

/// A write of the proxy's own (a registration, a lease, an ownership key), made with [`own_token`].
pub async fn own_write<Req, Resp>(
    identity: Option<&Arc<Identity>>,
    upstream: &Arc<Upstream>,
    path: &'static str,
    message: Req,
) -> Result<Resp, Status>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let mut request = Request::new(message);
    if let Some(token) = own_token(identity, upstream).await?
        && let Ok(token) = token.parse()
    {
        request.metadata_mut().insert("token", token);
    }
    upstream
        .call(Retry::Write, path, request)
        .await
        .map(tonic::Response::into_inner)
}

fn is_auth_disabled(status: &Status) -> bool {
    status.code() == Code::FailedPrecondition && status.message() == AUTH_NOT_ENABLED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_reaches_debug_output() {
        let credentials = Credentials {
            user: "proxy".into(),
            password: "s3cret".into(),
        };
        let shown = format!("{credentials:?}");
        assert!(
            shown.contains("proxy") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn only_etcds_auth_disabled_answer_means_watch_without_token() {
        assert!(is_auth_disabled(&Status::failed_precondition(
            AUTH_NOT_ENABLED
        )));
        assert!(!is_auth_disabled(&Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password"
        )));
        assert!(!is_auth_disabled(&Status::unavailable(AUTH_NOT_ENABLED)));
    }
}
