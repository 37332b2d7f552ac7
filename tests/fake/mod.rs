//! The fakes the daemon's tests and benchmarks share (docs/testing.md,
//! "Fakes"): the tuixiu backend ([`backend`]) and the proxy.toml they
//! write ([`config`]). Included by `#[path]` from tests/proxy_support and
//! examples/daemon_bench, so it is built only with them and never reaches
//! a release binary or the package. The fake agent is
//! tests/fixtures/scripted_agent.py, and examples/acp_bench_agent.rs its
//! compiled subset for the benchmarks.

#![allow(dead_code)] // each user takes its own part

pub mod backend;
pub mod config;
