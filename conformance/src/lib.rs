//! Conformance suite: etcdctl scenarios replayed on real etcd and through the proxy. Skeleton until its issue lands.
