//! The arguments of `completions` and `__man` (the commands: `cmd/docs.rs`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// The shells completions are made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: CompletionShell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// An existing directory to write the pages (section 1) into
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}
