//! The operating system as the benchmark sees it: `/proc` readings. Free ports and HTTP GETs come from the
//! workspace's `loopback` crate.

pub mod procfs;
