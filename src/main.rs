//! `tuixiu-sandbox`: the command-line entry point.

mod cli;
mod cmd;
mod units;

// The library half of the crate, under the names the command modules use.
use tuixiu_sandbox::{env, inputs, manifest, skills};

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};

/// Exit status for errors of the tool itself (bad arguments, setup failures),
/// as docker and podman use it.
pub const EXIT_TOOL_ERROR: u8 = sandbox::EXIT_SETUP_FAILED;

fn main() -> ExitCode {
    // git runs this binary as its askpass helper during a checkout.
    if std::env::var_os(inputs::ASKPASS_ENV).is_some() {
        return ExitCode::from(inputs::askpass_main());
    }
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(EXIT_TOOL_ERROR),
            };
        }
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(EXIT_TOOL_ERROR);
        }
    };
    init_logging(cli.verbose);

    let code = match cli.command {
        Command::Run(args) => {
            let sub = matches.subcommand_matches("run").expect("clap matched `run`");
            cmd::run::main(*args, sub)
        }
        Command::Check(args) => cmd::check::main(args),
        Command::Exec(args) => cmd::exec::main(args),
        Command::Proxy(args) => tuixiu_sandbox::proxy::main(tuixiu_sandbox::proxy::Options {
            config: args.config,
            state_dir: args.state_dir,
            allow_insecure_ws: args.allow_insecure_ws,
        }),
        Command::Instances(args) => cmd::instances::list(args),
        Command::Inspect(args) => cmd::instances::inspect(args),
        Command::Stop(args) => cmd::instances::stop(args),
        Command::Rm(args) => cmd::instances::remove(args),
        Command::Manifest(command) => cmd::manifest::main(command),
        Command::Extract(args) => cmd::manifest::extract(args),
        Command::Skills(command) => cmd::skills::main(command),
    };
    ExitCode::from(code)
}

/// Diagnostics go to stderr only: stdout belongs to the sandboxed command
/// (an ACP agent speaks NDJSON over it).
fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("TUIXIU_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// Prints one error line on stderr, prefixed with the program name.
pub fn report_error(message: impl std::fmt::Display) {
    eprintln!("tuixiu-sandbox: {message}");
}
