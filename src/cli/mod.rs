//! Command-line definitions (clap). Only argument shapes live here; the
//! `cmd` modules turn them into work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod docs;
pub mod skills;

pub use tuixiu_sandbox::launcher::args::*;
pub use tuixiu_sandbox::proxy::cli::ProxyArgs;

const PROXY_EXAMPLES: &str = "Examples:\n  \
    tuixiu-sandbox proxy --config /etc/tuixiu/proxy.toml\n  \
    ACP_PROXY_AUTH_TOKEN=... tuixiu-sandbox proxy --config proxy.toml -v";

/// Sandbox runtime and execution-plane daemon for ACP coding agents.
///
/// Exit status of `run`: the command's own status, 128+N when it was killed
/// by signal N, 125 when the sandbox could not be set up (or the arguments
/// are wrong), 126 when the command cannot be executed, 127 when it was not
/// found.
#[derive(Debug, Parser)]
#[command(name = "tuixiu-sandbox", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// More diagnostics on stderr (-v info, -vv debug, -vvv trace). The
    /// TUIXIU_LOG environment variable takes a tracing filter instead.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a fresh sandbox (user, mount, pid, ipc and uts namespaces).
    ///
    /// The workspace is bound read-write at /workspace and the command starts
    /// there. stdin, stdout and stderr are passed straight through; nothing
    /// but the command writes to stdout. The environment is built explicitly
    /// (PATH, HOME, USER, LOGNAME, SHELL, TERM, --pass-env, then --env-file
    /// and --env filtered by the allowlist, see --env-allow): the caller's
    /// environment is never inherited.
    ///
    /// With --manifest, the agentInputs items (workspace, skills, files, git
    /// checkouts) are fetched first and landed in order before the command
    /// starts; a failing item stops the run with exit status 125.
    #[command(after_help = "Examples:\n  \
        tuixiu-sandbox run -- sh -c 'id; pwd'\n  \
        tuixiu-sandbox run --workspace ./repo --network off -- cargo test\n  \
        tuixiu-sandbox run --home ~/.agent-home --env-file agent.env --env-allow OPENAI_API_KEY -- codex-acp\n  \
        tuixiu-sandbox run --manifest m.json --allow-host-path /srv/runs \\\n      \
        --inputs-base-url https://backend.example --inputs-token-file token -- codex-acp")]
    Run(Box<RunArgs>),

    /// bubblewrap's command line, for agents that sandbox their own tool
    /// calls: inside a sandbox (where it is also on PATH as `bwrap`), the
    /// nested sandbox is built by this sandbox's launcher, outside the
    /// agent's confinement. `bwrap --help` lists the options;
    /// docs/bwrap.md says which are served.
    #[command(disable_help_flag = true)]
    Bwrap(BwrapArgs),

    /// List the instances the providers keep (per-run sandboxes and containers).
    #[command(after_help = "Examples:\n  \
        tuixiu-sandbox instances\n  \
        tuixiu-sandbox instances --provider docker --json")]
    Instances(InstancesArgs),

    /// Show the state of one instance: creating, running, stopped, missing or error.
    Inspect(InstanceArgs),

    /// Stop an instance: its processes end, its files stay; `run` or the
    /// daemon starts it again.
    Stop(InstanceArgs),

    /// Remove an instance and what the provider keeps for it (never a
    /// workspace or home directory that was given to it).
    Rm(InstanceArgs),

    /// Work with agentInputs manifests (see docs/manifest.md).
    #[command(subcommand)]
    Manifest(ManifestCommand),

    /// Skill jobs: the Skill Runner HTTP API, one-off runs, package checks
    /// (see docs/skills.md).
    #[command(subcommand)]
    Skills(skills::SkillsCommand),

    /// Run the execution-plane daemon: connect to the tuixiu backend and
    /// keep one sandbox instance per run (a drop-in for the Node acp-proxy).
    ///
    /// Runs until SIGTERM or SIGINT (exit 0). Exits 3 when the backend
    /// refuses the proxy id (another proxy uses it) and 125 on a startup
    /// error (bad config, state directory locked by another daemon). Every
    /// config key can be set by an environment variable ACP_PROXY_<KEY>
    /// (tables: ACP_PROXY_<TABLE>_<KEY>); `--help` lists them all, and
    /// docs/proxy.md says what each means.
    #[command(
        after_help = PROXY_EXAMPLES,
        after_long_help = format!("{PROXY_EXAMPLES}\n\n{}", tuixiu_sandbox::proxy::config::help_text())
    )]
    Proxy(ProxyArgs),

    /// Internal: extract a zip with the safe extractor into an empty
    /// directory, as downloadExtract does (used by scripts/bench extract).
    #[command(name = "__extract", hide = true)]
    Extract(ExtractArgs),

    /// Check whether this host can run sandboxes, and what is missing.
    ///
    /// Probes user namespaces (and the sysctls and AppArmor policy that
    /// block them), Landlock, seccomp, cgroup v2 delegation, whether a fresh
    /// /proc can be mounted (in a throwaway sandbox), and the docker CLI
    /// and daemon. Prints a table with a hint for each missing piece. Exit
    /// status 0 when `run` can work here (and, with --daemon, the daemon is
    /// alive), 1 when it cannot.
    Check(CheckArgs),

    /// Internal: run a serialized sandbox spec read from a descriptor (used
    /// by multi-threaded callers such as the daemon).
    #[command(name = "__exec", hide = true)]
    Exec(ExecArgs),

    /// Print a shell completion script (bash, zsh or fish) on stdout.
    ///
    /// The package installs them already; for a manual install, write the
    /// script where the shell looks for completions.
    #[command(after_help = "Examples:\n  \
        tuixiu-sandbox completions bash > /etc/bash_completion.d/tuixiu-sandbox\n  \
        tuixiu-sandbox completions zsh > \"${fpath[1]}/_tuixiu-sandbox\"\n  \
        tuixiu-sandbox completions fish > ~/.config/fish/completions/tuixiu-sandbox.fish")]
    Completions(docs::CompletionsArgs),

    /// Internal: write the man pages into DIR (the package build runs it).
    #[command(name = "__man", hide = true)]
    Man(docs::ManArgs),
}

#[derive(Debug, Args)]
pub struct InstancesArgs {
    /// Only this provider's instances [default: all]
    #[arg(long, value_enum, value_name = "PROVIDER")]
    pub provider: Option<ProviderArg>,

    /// Print a JSON array instead of a table
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub options: ProviderOptions,
}

#[derive(Debug, Args)]
pub struct InstanceArgs {
    /// The instance's provider [default: the one that has NAME: native,
    /// then host, then docker]
    #[arg(long, value_enum, value_name = "PROVIDER")]
    pub provider: Option<ProviderArg>,

    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub options: ProviderOptions,

    /// The instance name
    #[arg(value_name = "NAME")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,

    /// Also check the daemon whose state directory is DIR: alive (its pid
    /// exists) and its status file fresh (a health check for containers and
    /// services; docs/deploy.md)
    #[arg(long, value_name = "DIR")]
    pub daemon: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExtractArgs {
    /// The zip archive
    #[arg(value_name = "ZIP")]
    pub archive: PathBuf,

    /// An existing, empty directory to extract into
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Worker threads (default: as downloadExtract, one below 1 MiB of
    /// content, else the CPUs available up to 4)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: Option<u16>,

    /// Most entries the zip may have
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub zip_max_entries: u64,

    /// Largest file the zip may extract (K, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "20M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub zip_max_file_bytes: u64,

    /// Most bytes the zip may extract in total (K, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = tuixiu_sandbox::launcher::units::parse_size)]
    pub zip_max_total_bytes: u64,
}

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Validate a manifest without running anything; print the plan (item,
    /// action, resolved target) or the first error. Exit 0 when valid, 1 when not.
    Check(ManifestCheckArgs),
}

#[derive(Debug, Args)]
pub struct ManifestCheckArgs {
    /// The manifest (JSON)
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// As for `run`: also allowed as a hostPath root
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// As for `run`: the user whose home USER_HOME is [default: agent]
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,

    /// As for `run`: guest path of the home [default: /home/NAME]
    #[arg(long, value_name = "PATH")]
    pub home_path: Option<String>,

    /// Print one JSON object (the plan, or the error with its code) instead
    /// of lines; the schema is in docs/json.md
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub plan: PlanArgs,
}

/// `bwrap`'s arguments, parsed by its own parser (`tuixiu_sandbox::bwrap`).
#[derive(Debug, clap::Args)]
pub struct BwrapArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "BWRAP ARGS")]
    pub args: Vec<std::ffi::OsString>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
