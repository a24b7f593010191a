//! Side-by-side benchmark of direct etcd, etcd's Go proxy and this proxy. Skeleton until its issue lands.
