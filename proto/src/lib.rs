//! The etcd v3 gRPC API (wire shape of etcd 3.7.1) as Rust types, clients and servers.
//!
//! The `.proto` sources live in `proto/proto/` (include root) and are compiled at build
//! time by `protox` (no system `protoc`), then turned into code by `tonic-prost-build`.
//!
//! | module            | proto package  | source file                          | services                                         |
//! |-------------------|----------------|--------------------------------------|--------------------------------------------------|
//! | [`mvccpb`]        | `mvccpb`       | `mvccpb/kv.proto`                    | none (`KeyValue`, `Event`)                       |
//! | [`authpb`]        | `authpb`       | `authpb/auth.proto`                  | none (`User`, `Role`, `Permission`)              |
//! | [`etcdserverpb`]  | `etcdserverpb` | `etcdserverpb/rpc.proto`             | `KV`, `Watch`, `Lease`, `Cluster`, `Maintenance`, `Auth` |
//! | [`v3electionpb`]  | `v3electionpb` | `v3electionpb/v3election.proto`      | `Election`                                       |
//! | [`v3lockpb`]      | `v3lockpb`     | `v3lockpb/v3lock.proto`              | `Lock`                                           |
//!
//! Each service `Foo` gets a client in `<module>::foo_client::FooClient` and a server in
//! `<module>::foo_server::{Foo, FooServer}`; the gRPC paths are etcd's own, e.g.
//! `/etcdserverpb.KV/Range` or `/v3lockpb.Lock/Lock`.
//!
//! [`opentelemetry`] holds the parts of OTLP (opentelemetry-proto v1: `common`, `resource`, `trace` and the
//! collector's `TraceService`) that the proxy exports its spans with, in modules nested as the packages are.
//!
//! [`FILE_DESCRIPTOR_SET`] is the encoded `google.protobuf.FileDescriptorSet` of etcd's
//! five files (not OTLP's), for tests and for gRPC reflection.
//!
//! The modules are siblings at the crate root because prost refers to other packages
//! by relative paths such as `super::mvccpb::KeyValue`.

/// Storage types: `KeyValue` and watch `Event`.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// Auth types: users, roles, permissions.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// The main API: KV, Watch, Lease, Cluster, Maintenance and Auth services.
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The Election service (concurrency API).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// The Lock service (concurrency API).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// OTLP's span export (`opentelemetry.proto.*.v1`): nested as the packages are, since prost refers from one package
/// to another by relative paths (`super::super::...`).
#[allow(clippy::all, clippy::pedantic, clippy::nursery, missing_docs)]
pub mod opentelemetry {
    pub mod proto {
        pub mod common {
            pub mod v1 {
                tonic::include_proto!("opentelemetry.proto.common.v1");
            }
        }
        pub mod resource {
            pub mod v1 {
                tonic::include_proto!("opentelemetry.proto.resource.v1");
            }
        }
        pub mod trace {
            pub mod v1 {
                tonic::include_proto!("opentelemetry.proto.trace.v1");
            }
        }
        pub mod collector {
            pub mod trace {
                pub mod v1 {
                    tonic::include_proto!("opentelemetry.proto.collector.trace.v1");
                }
            }
        }
    }
}

/// Encoded `FileDescriptorSet` of every `.proto` file of this crate (with source info).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/etcd_descriptor_set.bin"));
