//! Compiles the etcd v3 `.proto` files under `proto/` (and the few OTLP messages the proxy exports its spans with)
//! with protox (pure Rust, no system `protoc`) and generates prost messages plus tonic clients and servers.
//! The encoded `FileDescriptorSet` is also written to `OUT_DIR` so the crate can
//! export it.

use std::path::PathBuf;

use prost::Message as _;

const INCLUDE: &str = "proto";

const FILES: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3electionpb/v3election.proto",
    "proto/v3lockpb/v3lock.proto",
];

/// OTLP's span export (the proxy's own spans), only the messages it sends: compiled apart from etcd's, so that
/// the descriptor set stays etcd's API alone.
const OTLP_FILES: &[&str] = &[
    "proto/opentelemetry/proto/common/v1/common.proto",
    "proto/opentelemetry/proto/resource/v1/resource.proto",
    "proto/opentelemetry/proto/trace/v1/trace.proto",
    "proto/opentelemetry/proto/collector/trace/v1/trace_service.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={INCLUDE}");
    for file in FILES.iter().chain(OTLP_FILES) {
        println!("cargo:rerun-if-changed={file}");
    }

    let fds = protox::compile(FILES, [INCLUDE])?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("etcd_descriptor_set.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        // Keys and values as `Bytes`: the proxy hands one watch event to thousands of watchers, and cloning a
        // `Bytes` shares the buffer where cloning a `Vec` copies it.
        .bytes(".mvccpb.KeyValue")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(protox::compile(OTLP_FILES, [INCLUDE])?)?;
    Ok(())
}
