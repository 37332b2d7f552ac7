//! Command-line definitions (clap). Only argument shapes live here; the
//! `cmd` modules turn them into work.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    /// (PATH, HOME, USER, LOGNAME, SHELL, TERM, then --pass-env and --env):
    /// the caller's environment is never inherited.
    #[command(after_help = "Examples:\n  \
        tuixiu-sandbox run -- sh -c 'id; pwd'\n  \
        tuixiu-sandbox run --workspace ./repo --network off -- cargo test\n  \
        tuixiu-sandbox run --home ~/.agent-home --env OPENAI_API_KEY=... -- codex-acp")]
    Run(Box<RunArgs>),

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

    /// Run the execution-plane daemon: connect to the tuixiu backend and
    /// keep one sandbox instance per run (a drop-in for the Node acp-proxy).
    ///
    /// Runs until SIGTERM or SIGINT (exit 0). Exits 3 when the backend
    /// refuses the proxy id (another proxy uses it) and 125 on a startup
    /// error (bad config, state directory locked by another daemon). Every
    /// config key can be set by an environment variable ACP_PROXY_<KEY>
    /// (tables: ACP_PROXY_<TABLE>_<KEY>); see docs/proxy.md.
    #[command(after_help = "Examples:\n  \
        tuixiu-sandbox proxy --config /etc/tuixiu/proxy.toml\n  \
        ACP_PROXY_AUTH_TOKEN=... tuixiu-sandbox proxy --config proxy.toml -v")]
    Proxy(ProxyArgs),

    /// Internal: run a serialized sandbox spec read from a descriptor (used
    /// by multi-threaded callers such as the daemon).
    #[command(name = "__exec", hide = true)]
    Exec(ExecArgs),
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The TOML config file (the Node acp-proxy's keys are accepted)
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// State directory (identity, lock, run state) [default: state_dir, else $XDG_STATE_HOME/tuixiu-sandbox]
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Allow plain ws:// to a non-loopback backend (tokens travel unencrypted; testing only)
    #[arg(long)]
    pub allow_insecure_ws: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Host directory bound read-write at /workspace [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    /// Host directory bound read-write at the guest home [default: a private tmpfs]
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,

    /// User name inside the sandbox (getpwuid, id -un, $USER)
    #[arg(long, value_name = "NAME", default_value = "agent")]
    pub user: String,

    /// User id inside the sandbox
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub uid: u32,

    /// Group id inside the sandbox [default: the uid]
    #[arg(long, value_name = "N")]
    pub gid: Option<u32>,

    /// Guest path of the home: absolute, no '..', not /workspace or inside it [default: /home/NAME]
    #[arg(long, value_name = "PATH")]
    pub home_path: Option<String>,

    /// Working directory inside; must be under /workspace or the home [default: /workspace]
    #[arg(long, value_name = "PATH")]
    pub chdir: Option<String>,

    /// Bind host SRC read-only at DEST (repeatable; applied in order with --bind and --tmpfs)
    #[arg(long, num_args = 2, value_names = ["SRC", "DEST"], action = clap::ArgAction::Append)]
    pub ro_bind: Vec<String>,

    /// Bind host SRC read-write at DEST (repeatable)
    #[arg(long, num_args = 2, value_names = ["SRC", "DEST"], action = clap::ArgAction::Append)]
    pub bind: Vec<String>,

    /// Mount a private tmpfs at DEST (repeatable)
    #[arg(long, value_name = "DEST", action = clap::ArgAction::Append)]
    pub tmpfs: Vec<String>,

    /// Set an environment variable inside (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE", action = clap::ArgAction::Append)]
    pub env: Vec<String>,

    /// Copy a variable from the caller's environment, if set (repeatable)
    #[arg(long, value_name = "KEY", action = clap::ArgAction::Append)]
    pub pass_env: Vec<String>,

    /// Network: `on` shares the host's; `off` gives a private namespace with only loopback
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NetworkArg::On)]
    pub network: NetworkArg,

    /// Hostname inside the sandbox
    #[arg(long, value_name = "NAME", default_value = "sandbox")]
    pub hostname: String,

    /// Host uid the sandbox user maps onto (root callers only) [default: the caller's]
    #[arg(long, value_name = "N")]
    pub map_uid: Option<u32>,

    /// Host gid the sandbox group maps onto (root callers only) [default: the caller's]
    #[arg(long, value_name = "N")]
    pub map_gid: Option<u32>,

    /// Write {"child-pid": N} when the command starts and {"exit-code": N} when it ends to FD
    #[arg(long, value_name = "FD")]
    pub json_status_fd: Option<i32>,

    /// Keep the caller's session and terminal (for interactive shells); by
    /// default the command runs in a new session, which blocks TIOCSTI injection
    #[arg(long)]
    pub keep_session: bool,

    /// The command to run, and its arguments
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,

    #[command(flatten)]
    pub provider: RunProviderArgs,
}

/// Where `run` runs the command (docs/providers.md).
#[derive(Debug, Args)]
#[command(next_help_heading = "Providers")]
pub struct RunProviderArgs {
    /// native: namespaces on this host; docker: a container through the
    /// docker CLI; host: no isolation at all (development only, needs
    /// --i-know-there-is-no-isolation)
    #[arg(long, value_enum, value_name = "PROVIDER", default_value_t = ProviderArg::Native)]
    pub provider: ProviderArg,

    /// Container image (docker)
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,

    /// Run in this named instance, created on first use and kept (with its
    /// home) until `tuixiu-sandbox rm`; without it, nothing is kept
    #[arg(long, value_name = "NAME")]
    pub instance_name: Option<String>,

    /// Run id recorded on a new instance [default: the name without the
    /// prefix, or random]
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,

    /// Allow --provider host, which runs the command on this machine
    /// WITHOUT ANY ISOLATION (development only)
    #[arg(long)]
    pub i_know_there_is_no_isolation: bool,

    #[command(flatten)]
    pub limits: LimitArgs,

    #[command(flatten)]
    pub options: ProviderOptions,
}

/// Resource limits (enforced by the docker provider).
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// CPUs the command may use, fractional (e.g. 1.5)
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,

    /// Memory limit: bytes, or with a k, m or g suffix (e.g. 512m)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Maximum number of processes
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
}

/// Options every command that touches instances shares.
#[derive(Debug, Args)]
pub struct ProviderOptions {
    /// Container CLI of the docker provider
    #[arg(long, value_name = "CLI", default_value = "docker", env = "TUIXIU_CONTAINER_CLI",
          value_parser = ["docker", "podman", "nerdctl"])]
    pub container_cli: String,

    /// Where instances are recorded [default: $XDG_STATE_HOME/tuixiu-sandbox,
    /// else ~/.local/state/tuixiu-sandbox]
    #[arg(long, value_name = "DIR", env = "TUIXIU_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Prefix every instance name must carry ("" for none); other names are refused
    #[arg(long, value_name = "PREFIX", default_value = tuixiu_sandbox::provider::DEFAULT_INSTANCE_PREFIX,
          env = "TUIXIU_INSTANCE_PREFIX")]
    pub instance_prefix: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProviderArg {
    /// Linux namespaces on this host (the backend calls it bwrap)
    #[value(alias = "bwrap")]
    Native,
    /// A container through the docker (podman, nerdctl) CLI
    #[value(alias = "container_oci")]
    Docker,
    /// Directly on this host, without isolation
    #[value(alias = "host_process")]
    Host,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    On,
    Off,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Descriptor to read the JSON SandboxSpec from (read to end-of-file)
    #[arg(long, value_name = "FD")]
    pub spec_fd: i32,

    /// As for `run`
    #[arg(long, value_name = "FD")]
    pub json_status_fd: Option<i32>,
}
