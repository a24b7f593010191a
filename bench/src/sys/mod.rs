//! The operating system as the benchmark sees it: `/proc` readings. Processes, free ports and HTTP GETs come
//! from the workspace's `testkit` crate.

pub mod procfs;
