//! Plain tonic channels to etcd or the proxy, for tests that speak the raw etcd v3 API.

use std::time::Duration;

use proto::etcdserverpb::PutRequest;
use proto::etcdserverpb::kv_client::KvClient;
use tonic::transport::Channel;

/// A connected channel to `127.0.0.1:PORT` (etcd or the proxy).
pub async fn channel(addr: &str) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .expect("valid URI")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

/// `req` with one ASCII metadata entry added (e.g. `token`, `hasleader`).
pub fn with_meta<T>(req: T, key: &'static str, value: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(req);
    req.metadata_mut()
        .insert(key, value.parse().expect("ASCII metadata value"));
    req
}

/// A status as "Code: message", the part of an error that etcd defines.
pub fn status(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// Puts `key` = `value` and returns the revision etcd gave the write.
pub async fn put(channel: &Channel, key: &str, value: &str) -> i64 {
    KvClient::new(channel.clone())
        .put(PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .header
        .unwrap()
        .revision
}

/// A token for user `name` from `addr` (etcd or the proxy), by Authenticate.
pub async fn token(addr: &str, name: &str, password: &str) -> String {
    let request = proto::etcdserverpb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    proto::etcdserverpb::auth_client::AuthClient::new(channel(addr).await)
        .authenticate(request)
        .await
        .unwrap()
        .into_inner()
        .token
}
