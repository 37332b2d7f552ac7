//! `run` in the full tool: other providers and named instances here, the
//! native sandbox (with or without a manifest) through the shared launcher
//! code.

use clap::ArgMatches;
use tuixiu_sandbox::launcher;

use crate::cli::RunArgs;
use tuixiu_sandbox::launcher::args::RunGiven;

pub fn main(args: RunArgs, matches: &ArgMatches) -> u8 {
    if super::run_provider::handles(&args) {
        return super::run_provider::main(args, matches);
    }
    launcher::run::main(args, &RunGiven::from_matches(matches))
}
