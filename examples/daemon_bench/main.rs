//! The daemon's benchmarks, one driver: each subcommand is the fake
//! backend of one measurement (a WebSocket server on loopback that the
//! real daemon, release build, connects to). The scripts in scripts/ build
//! and run them; docs/benchmarks.md has the results.
//!
//! Usage: daemon_bench SUBCOMMAND ARGS...
//!
//! * `acp`: `acp_open` latency and the update relay (scripts/bench acp);
//! * `proxy`: idle RSS, idle runs, `sandbox_control` bursts and round trips
//!   (scripts/bench proxy);
//! * `curve`: memory, CPU and latency as runs and updates grow
//!   (scripts/bench daemon-curve);
//! * `terminal-rss`: the memory for terminal output
//!   (scripts/bench terminal-rss).
//!
//! The backend's link and the proxy.toml builder are the tests' own fakes
//! (tests/fake, included here); the agent they start is
//! tests/fake/agent.rs.

mod acp;
mod curve;
#[path = "../../tests/fake/mod.rs"]
mod fake;
mod procstat;
mod proxy;
mod terminal_rss;

use fake::backend::link;
use fake::config::ProxyToml;

const USAGE: &str = "usage: daemon_bench acp|proxy|curve|terminal-rss ARGS...";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    if args.len() < 2 {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    // The subcommand's own arguments keep their positions (args[1]...).
    let subcommand = args.remove(1);
    match subcommand.as_str() {
        "acp" => acp::main(args).await,
        "proxy" => proxy::main(args).await,
        "curve" => curve::main(args).await,
        "terminal-rss" => terminal_rss::main(args).await,
        other => {
            eprintln!("daemon_bench: unknown subcommand {other:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}
