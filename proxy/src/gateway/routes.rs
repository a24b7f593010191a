//! The gateway's paths: which gRPC method each `POST /v3/...` is, as etcd's `.proto` files bind them
//! (`google.api.http`), plus the three lease paths etcd also serves under `/v3/kv/lease/`.

/// Every gateway path under `/v3/` and the gRPC method it names.
pub const ROUTES: &[(&str, &str)] = &[
    ("kv/range", "/etcdserverpb.KV/Range"),
    ("kv/put", "/etcdserverpb.KV/Put"),
    ("kv/deleterange", "/etcdserverpb.KV/DeleteRange"),
    ("kv/txn", "/etcdserverpb.KV/Txn"),
    ("kv/compaction", "/etcdserverpb.KV/Compact"),
    ("watch", "/etcdserverpb.Watch/Watch"),
    ("lease/grant", "/etcdserverpb.Lease/LeaseGrant"),
    ("lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"),
    ("kv/lease/revoke", "/etcdserverpb.Lease/LeaseRevoke"),
    ("lease/keepalive", "/etcdserverpb.Lease/LeaseKeepAlive"),
    ("lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive"),
    ("kv/lease/timetolive", "/etcdserverpb.Lease/LeaseTimeToLive"),
    ("lease/leases", "/etcdserverpb.Lease/LeaseLeases"),
    ("kv/lease/leases", "/etcdserverpb.Lease/LeaseLeases"),
    ("cluster/member/add", "/etcdserverpb.Cluster/MemberAdd"),
    (
        "cluster/member/remove",
        "/etcdserverpb.Cluster/MemberRemove",
    ),
    (
        "cluster/member/update",
        "/etcdserverpb.Cluster/MemberUpdate",
    ),
    ("cluster/member/list", "/etcdserverpb.Cluster/MemberList"),
    (
        "cluster/member/promote",
        "/etcdserverpb.Cluster/MemberPromote",
    ),
    ("maintenance/alarm", "/etcdserverpb.Maintenance/Alarm"),
    ("maintenance/status", "/etcdserverpb.Maintenance/Status"),
    (
        "maintenance/defragment",
        "/etcdserverpb.Maintenance/Defragment",
    ),
    ("maintenance/hash", "/etcdserverpb.Maintenance/Hash"),
    ("maintenance/hashkv", "/etcdserverpb.Maintenance/HashKV"),
    ("maintenance/snapshot", "/etcdserverpb.Maintenance/Snapshot"),
    (
        "maintenance/transfer-leadership",
        "/etcdserverpb.Maintenance/MoveLeader",
    ),
    (
        "maintenance/downgrade",
        "/etcdserverpb.Maintenance/Downgrade",
    ),
    ("auth/enable", "/etcdserverpb.Auth/AuthEnable"),
    ("auth/disable", "/etcdserverpb.Auth/AuthDisable"),
    ("auth/status", "/etcdserverpb.Auth/AuthStatus"),
    ("auth/authenticate", "/etcdserverpb.Auth/Authenticate"),
    ("auth/user/add", "/etcdserverpb.Auth/UserAdd"),
    ("auth/user/get", "/etcdserverpb.Auth/UserGet"),
    ("auth/user/list", "/etcdserverpb.Auth/UserList"),
    ("auth/user/delete", "/etcdserverpb.Auth/UserDelete"),
    (
        "auth/user/changepw",
        "/etcdserverpb.Auth/UserChangePassword",
    ),
    ("auth/user/grant", "/etcdserverpb.Auth/UserGrantRole"),
    ("auth/user/revoke", "/etcdserverpb.Auth/UserRevokeRole"),
    ("auth/role/add", "/etcdserverpb.Auth/RoleAdd"),
    ("auth/role/get", "/etcdserverpb.Auth/RoleGet"),
    ("auth/role/list", "/etcdserverpb.Auth/RoleList"),
    ("auth/role/delete", "/etcdserverpb.Auth/RoleDelete"),
    ("auth/role/grant", "/etcdserverpb.Auth/RoleGrantPermission"),
    (
        "auth/role/revoke",
        "/etcdserverpb.Auth/RoleRevokePermission",
    ),
    ("lock/lock", "/v3lockpb.Lock/Lock"),
    ("lock/unlock", "/v3lockpb.Lock/Unlock"),
    ("election/campaign", "/v3electionpb.Election/Campaign"),
    ("election/proclaim", "/v3electionpb.Election/Proclaim"),
    ("election/leader", "/v3electionpb.Election/Leader"),
    ("election/observe", "/v3electionpb.Election/Observe"),
    ("election/resign", "/v3electionpb.Election/Resign"),
];

/// The gRPC path of a gateway path under `/v3/` (the prefix already taken off), or `None` if etcd has no such path.
pub fn grpc_path(gateway_path: &str) -> Option<&'static str> {
    ROUTES
        .iter()
        .find(|(path, _)| *path == gateway_path)
        .map(|(_, grpc)| *grpc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_names_a_method_the_proxy_serves_and_knows_the_messages_of() {
        for (path, grpc) in ROUTES {
            assert_eq!(grpc_path(path), Some(*grpc));
            assert!(
                crate::rpc::methods::route(grpc).is_some(),
                "{path} -> {grpc} is not routed"
            );
            assert!(
                super::super::json::Method::of(grpc).is_some(),
                "{path} -> {grpc} has no descriptor"
            );
        }
        // etcd 3.7.1's 48 methods with a gateway path (all but RangeStream), and three lease paths also under kv/.
        assert_eq!(ROUTES.len(), 51);
    }

    #[test]
    fn unknown_paths_are_not_methods() {
        assert_eq!(grpc_path("kv/rang"), None);
        assert_eq!(grpc_path("kv/rangestream"), None);
        assert_eq!(grpc_path(""), None);
    }
}
