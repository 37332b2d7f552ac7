//! `tuixiu-sandbox-proxy`: the execution-plane daemon alone.
//!
//! The launcher runs this binary for `tuixiu-sandbox proxy`. The daemon
//! lives as long as the host serves runs, and its resident set is mostly
//! the pages of code it has run and their neighbours: linked without the
//! other commands (skill jobs' HTTP server and schema validation, the
//! CLI's other parsers), it maps about 2 MiB less than the full tool does
//! (docs/benchmarks.md). Help, and a command line it does not take, go to
//! `tuixiu-sandbox-full`.

use std::ffi::OsString;
use std::process::ExitCode;

use tuixiu_sandbox::launcher;

fn main() -> ExitCode {
    // git runs the current executable as its askpass helper during a
    // checkout of an agentInputs item.
    if std::env::var_os(tuixiu_sandbox::inputs::ASKPASS_ENV).is_some() {
        return ExitCode::from(tuixiu_sandbox::inputs::askpass_main());
    }
    let argv: Vec<OsString> = std::env::args_os().collect();
    let code = tuixiu_sandbox::proxy::cli::run(&argv[1..]).unwrap_or_else(|| launcher::exec_full(&argv));
    ExitCode::from(code)
}
