//! `tuixiu-sandbox-full`: every command. The small `tuixiu-sandbox`
//! launcher runs plain native sandboxes itself and `exec`s this binary for
//! everything else (see `tuixiu_sandbox::launcher`).

mod cli;
mod cmd;

// The library half of the crate, under the names the command modules use.
use tuixiu_sandbox::{inputs, manifest, skills};

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command};

use tuixiu_sandbox::launcher::{self, init_logging_with_directives as init_logging};
pub use tuixiu_sandbox::launcher::{EXIT_TOOL_ERROR, report_error};

fn main() -> ExitCode {
    // git runs this binary as its askpass helper during a checkout.
    if std::env::var_os(inputs::ASKPASS_ENV).is_some() {
        return ExitCode::from(inputs::askpass_main());
    }
    // Called as `bwrap`, or `bwrap ...`: bubblewrap's own parser.
    let all: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if tuixiu_sandbox::bwrap::called_as_bwrap(all.first()) {
        return ExitCode::from(tuixiu_sandbox::bwrap::main(&all));
    }
    if all.get(1).is_some_and(|a| a == "bwrap") {
        return ExitCode::from(tuixiu_sandbox::bwrap::main(&all[1..]));
    }
    // `proxy` is parsed alone (see proxy::cli), as the daemon's own binary does.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = tuixiu_sandbox::proxy::cli::run(&argv) {
        return ExitCode::from(code);
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
    // The daemon sets up its own logging (--log-format).
    if !matches!(cli.command, Command::Proxy(_)) {
        init_logging(cli.verbose);
    }

    let code = match cli.command {
        Command::Run(args) => {
            let sub = matches.subcommand_matches("run").expect("clap matched `run`");
            cmd::run::main(*args, sub)
        }
        Command::Check(args) => cmd::check::main(args),
        Command::Exec(args) => launcher::exec::main(args),
        Command::Proxy(args) => tuixiu_sandbox::proxy::cli::start(args, cli.verbose),
        Command::Instances(args) => cmd::instances::list(args),
        Command::Inspect(args) => cmd::instances::inspect(args),
        Command::Stop(args) => cmd::instances::stop(args),
        Command::Rm(args) => cmd::instances::remove(args),
        Command::Manifest(command) => cmd::manifest::main(command),
        Command::Extract(args) => cmd::manifest::extract(args),
        Command::Skills(command) => cmd::skills::main(command),
        Command::Completions(args) => cmd::docs::completions(&args),
        Command::Man(args) => cmd::docs::man(&args),
        Command::Bwrap(args) => {
            let argv: Vec<std::ffi::OsString> = std::iter::once("bwrap".into()).chain(args.args).collect();
            tuixiu_sandbox::bwrap::main(&argv)
        }
    };
    ExitCode::from(code)
}
