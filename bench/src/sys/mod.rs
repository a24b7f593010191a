//! The operating system as the benchmark sees it: a tiny HTTP client, `/proc` readings (free ports come from the
//! workspace's `ports` crate).

pub mod http;
pub mod procfs;
