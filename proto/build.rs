//! Compiles the etcd v3 `.proto` files under `proto/` with protox (pure Rust, no
//! system `protoc`) and generates prost messages plus tonic clients and servers.
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={INCLUDE}");
    for file in FILES {
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
    Ok(())
}
