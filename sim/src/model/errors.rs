//! etcd's error statuses, with the exact codes and texts etcd 3.4/3.5 send (checked against etcd 3.4.23 with
//! etcdctl; the auth ones are etcd's `rpctypes`, compared with etcd 3.5.30 by the conformance suite's auth
//! scenarios), so that the proxy's error pass-through can be checked end to end.

use tonic::Status;

pub fn empty_key() -> Status {
    Status::invalid_argument("etcdserver: key is not provided")
}

pub fn key_not_found() -> Status {
    Status::invalid_argument("etcdserver: key not found")
}

pub fn value_provided() -> Status {
    Status::invalid_argument("etcdserver: value is provided")
}

pub fn lease_provided() -> Status {
    Status::invalid_argument("etcdserver: lease is provided")
}

pub fn too_many_ops() -> Status {
    Status::invalid_argument("etcdserver: too many operations in txn request")
}

pub fn duplicate_key() -> Status {
    Status::invalid_argument("etcdserver: duplicate key given in txn request")
}

pub fn compacted() -> Status {
    Status::out_of_range("etcdserver: mvcc: required revision has been compacted")
}

pub fn future_revision() -> Status {
    Status::out_of_range("etcdserver: mvcc: required revision is a future revision")
}

pub fn lease_not_found() -> Status {
    Status::not_found("etcdserver: requested lease not found")
}

pub fn lease_exists() -> Status {
    Status::failed_precondition("etcdserver: lease already exists")
}

pub fn lease_ttl_too_large() -> Status {
    Status::out_of_range("etcdserver: too large lease TTL")
}

/// A request that requires a leader (`hasleader: true`) on a member that knows none.
pub fn no_leader() -> Status {
    Status::unavailable("etcdserver: no leader")
}

/// A raft request that found no leader within etcd's request timeout.
pub fn request_timed_out() -> Status {
    Status::unavailable("etcdserver: request timed out")
}

pub fn root_user_not_exist() -> Status {
    Status::failed_precondition("etcdserver: root user does not exist")
}

pub fn root_role_not_exist() -> Status {
    Status::failed_precondition("etcdserver: root user does not have root role")
}

pub fn user_already_exist() -> Status {
    Status::failed_precondition("etcdserver: user name already exists")
}

pub fn user_empty() -> Status {
    Status::invalid_argument("etcdserver: user name is empty")
}

pub fn user_not_found() -> Status {
    Status::failed_precondition("etcdserver: user name not found")
}

pub fn role_already_exist() -> Status {
    Status::failed_precondition("etcdserver: role name already exists")
}

pub fn role_not_found() -> Status {
    Status::failed_precondition("etcdserver: role name not found")
}

pub fn role_empty() -> Status {
    Status::invalid_argument("etcdserver: role name is empty")
}

pub fn auth_failed() -> Status {
    Status::invalid_argument("etcdserver: authentication failed, invalid user ID or password")
}

pub fn permission_not_given() -> Status {
    Status::invalid_argument("etcdserver: permission not given")
}

pub fn permission_denied() -> Status {
    Status::permission_denied("etcdserver: permission denied")
}

pub fn role_not_granted() -> Status {
    Status::failed_precondition("etcdserver: role is not granted to the user")
}

pub fn permission_not_granted() -> Status {
    Status::failed_precondition("etcdserver: permission is not granted to the role")
}

pub fn auth_not_enabled() -> Status {
    Status::failed_precondition("etcdserver: authentication is not enabled")
}

pub fn invalid_auth_token() -> Status {
    Status::unauthenticated("etcdserver: invalid auth token")
}

pub fn invalid_auth_mgmt() -> Status {
    Status::invalid_argument("etcdserver: invalid auth management")
}

/// What a method the model does not implement answers (the same code tonic gives an unknown service).
pub fn unimplemented(method: &str) -> Status {
    Status::unimplemented(format!("model etcd does not implement {method}"))
}

/// Internal store errors, turned into statuses at the service edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    EmptyKey,
    KeyNotFound,
    ValueProvided,
    LeaseProvided,
    TooManyOps,
    DuplicateKey,
    Compacted,
    FutureRevision,
    LeaseNotFound,
    LeaseExists,
    LeaseTtlTooLarge,
}

impl From<StoreError> for Status {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::EmptyKey => empty_key(),
            StoreError::KeyNotFound => key_not_found(),
            StoreError::ValueProvided => value_provided(),
            StoreError::LeaseProvided => lease_provided(),
            StoreError::TooManyOps => too_many_ops(),
            StoreError::DuplicateKey => duplicate_key(),
            StoreError::Compacted => compacted(),
            StoreError::FutureRevision => future_revision(),
            StoreError::LeaseNotFound => lease_not_found(),
            StoreError::LeaseExists => lease_exists(),
            StoreError::LeaseTtlTooLarge => lease_ttl_too_large(),
        }
    }
}
