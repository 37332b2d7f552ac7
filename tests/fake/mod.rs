//! The fakes the daemon's tests and benchmarks share (docs/testing.md,
//! "Fakes"): the tuixiu backend ([`backend`]) and the proxy.toml they
//! write ([`config`]). Included by `#[path]` from tests/proxy_support and
//! examples/daemon_bench, so it is built only with them and never reaches
//! a release binary or the package. The fake agent is tests/fake/agent.rs,
//! built as the example `fake_agent` (not a module of this one).

#![allow(dead_code)] // each user takes its own part

pub mod backend;
pub mod config;
