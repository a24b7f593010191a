//! Side-by-side benchmark of direct etcd, etcd's Go grpc-proxy and this proxy (with its range cache, and for the
//! read scenarios and write-to-visible without it too, and there with `--baseline-bin` another build of it), in one
//! run.
//!
//! Data flows: [`plan`] (what to run) → [`runner`] (per etcd version a fresh [`services::Stack`]; per scenario
//! rounds over its targets, [`plan::Scenario::targets`]) → [`load`] (tonic clients drive the scenario) and [`meter`] (etcd's /metrics
//! via [`upstream`], CPU and memory via [`sys::procfs`]) → [`results`] (runs, medians, ratios) → [`report`]
//! (JSON, markdown, SVG charts).
//!
//! - [`plan`]: targets, scenarios, sizes (each a flag), timing.
//! - [`services`]: etcd, `etcd grpc-proxy start` and `etcd-grpc-proxy start` as child processes on free loopback
//!   ports, killed when dropped (the `testkit` crate's processes); with `--tls`, every link mutual TLS with the
//!   certificates of [`tls`].
//! - [`load`]: the load generator (closed loop or fixed rate, in the clear or over TLS) and the scenarios.
//! - [`meter`], [`upstream`]: what a run cost etcd and the proxy; [`memory`]: a proxy's settled idle memory.
//! - [`sys`]: `/proc` readings; processes, free ports and HTTP GETs come from the `testkit` crate.
//! - [`results`], [`report`]: the data model and its outputs.
//!
//! `bench failover` ([`failover`]) is a run of its own: a 3-member cluster, each member crashed, hung and
//! partitioned in turn under load through this proxy, the Go proxy and etcdctl at once.
//! `bench tree` ([`tree`]) is another: a mid proxy and leaf proxies in front of one etcd, 10,000 watchers on one
//! key through the leaves, this proxy's tree and the Go proxy's in turn (issue 18).
//! `bench list` ([`list`]) is a third: 100,000 keys listed with RangeStream from etcd 3.7 directly and through this
//! proxy (issue 32).
//! `bench gateway` ([`gateway`]) is a fourth: etcd's JSON gateway through this proxy (issue 34): a watch fan-out
//! over the gateway against the same over gRPC, and unary calls against etcd's own gateway.
//!
//! The benchmark asserts nothing about speed; it measures. Its quick mode is exercised by `tests/quick.rs`.

pub mod failover;
pub mod gateway;
pub mod list;
pub mod load;
pub mod memory;
pub mod meter;
pub mod plan;
pub mod report;
pub mod results;
pub mod runner;
pub mod services;
pub mod sys;
pub mod tls;
pub mod tree;
pub mod upstream;
