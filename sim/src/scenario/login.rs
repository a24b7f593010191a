//! A client's etcd login under auth, kept as etcd's clients keep theirs: authenticate once, send the token with
//! every call, and authenticate again when etcd says the token is invalid (a member forgets a token unused for its
//! `--auth-token-ttl`, and every token when it restarts).

use std::time::Duration;

use proto::etcdserverpb::AuthenticateRequest;
use proto::etcdserverpb::auth_client::AuthClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// How long an Authenticate may take before the client tries again later.
const AUTHENTICATE_TIMEOUT: Duration = Duration::from_millis(1500);

/// A user name and password.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Login {
    pub user: String,
    pub password: String,
}

impl Login {
    pub fn new(user: &str, password: &str) -> Self {
        Self {
            user: user.to_string(),
            password: password.to_string(),
        }
    }
}

/// A login and the token it holds now.
pub struct Session {
    login: Login,
    token: Option<String>,
}

impl Session {
    pub fn new(login: Login) -> Self {
        Self { login, token: None }
    }

    pub fn user(&self) -> &str {
        &self.login.user
    }

    /// The token to send, authenticating over `channel` first when none is held; `None` if etcd did not give one.
    pub async fn token(&mut self, channel: &Channel) -> Option<String> {
        if self.token.is_none() {
            let request = AuthenticateRequest {
                name: self.login.user.clone(),
                password: self.login.password.clone(),
            };
            let mut client = AuthClient::new(channel.clone());
            let call = client.authenticate(request);
            if let Ok(Ok(answer)) = tokio::time::timeout(AUTHENTICATE_TIMEOUT, call).await {
                self.token = Some(answer.into_inner().token);
            }
        }
        self.token.clone()
    }

    /// A call failed with `status`: if etcd refused the token, the next call authenticates again.
    pub fn failed(&mut self, status: &Status) {
        if is_invalid_token(status.code(), status.message()) {
            self.token = None;
        }
    }

    /// etcd refused a watcher for the stream's token (its cancel reason): the next stream authenticates again.
    pub fn refused_watcher(&mut self, reason: &str) -> bool {
        let refused = is_invalid_token_reason(reason);
        if refused {
            self.token = None;
        }
        refused
    }
}

/// `message` as a request carrying `token` (none if `None`).
pub fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token.and_then(|t| t.parse().ok()) {
        request.metadata_mut().insert("token", token);
    }
    request
}

fn is_invalid_token(code: Code, message: &str) -> bool {
    code == Code::Unauthenticated && message == "etcdserver: invalid auth token"
}

/// Whether a watch cancel reason (a gRPC status in Go's words) is etcd refusing the stream's token.
pub fn is_invalid_token_reason(reason: &str) -> bool {
    reason == "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
}
