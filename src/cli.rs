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

    /// Check whether this host can run sandboxes, and what is missing.
    ///
    /// Probes user namespaces (and the sysctls and AppArmor policy that
    /// block them), Landlock, seccomp, cgroup v2 delegation, whether a fresh
    /// /proc can be mounted (in a throwaway sandbox), and the docker CLI
    /// and daemon. Prints a table with a hint for each missing piece. Exit
    /// status 0 when `run` can work here, 1 when it cannot.
    Check(CheckArgs),

    /// Internal: run a serialized sandbox spec read from a descriptor (used
    /// by multi-threaded callers such as the daemon).
    #[command(name = "__exec", hide = true)]
    Exec(ExecArgs),
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

    /// Network: `on` shares the host's; `off` gives a private namespace with
    /// only loopback (local TCP between the command's own processes works);
    /// `none` is `off` without IP at all: AF_INET/AF_INET6 sockets are denied
    /// by seccomp and, with Landlock ABI 4 or newer, TCP bind/connect too
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NetworkArg::On)]
    pub network: NetworkArg,

    /// Seccomp profile: a built-in name (`default`, `strict`), a path to an
    /// OCI/Docker-style JSON profile, or `unconfined`
    #[arg(long, value_name = "NAME|FILE", default_value = "default")]
    pub seccomp: String,

    /// Let ptrace and process_vm_readv/writev through the seccomp profile
    /// (debuggers, strace, sanitizers); they only reach the sandbox's own processes
    #[arg(long)]
    pub allow_ptrace: bool,

    /// Landlock: `best-effort` uses what the kernel supports and says when
    /// that is not everything; `require` fails (exit 125) unless it is fully
    /// enforced; `off` does not use it
    #[arg(long, value_enum, value_name = "MODE", default_value_t = LandlockArg::BestEffort)]
    pub landlock: LandlockArg,

    /// Memory limit of the whole sandbox, e.g. 512M, 2G (cgroup v2 memory.max;
    /// without a writable cgroup, RLIMIT_AS per process, with a warning)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// CPU limit in CPUs, e.g. 1.5 (cgroup v2 cpu.max; not applied without one, with a warning)
    #[arg(long, value_name = "N")]
    pub cpus: Option<String>,

    /// Most processes and threads (cgroup v2 pids.max; else RLIMIT_NPROC, with a warning)
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,

    /// Most open files per process (RLIMIT_NOFILE)
    #[arg(long, value_name = "N")]
    pub nofile: Option<u64>,

    /// Wall-clock limit, e.g. 30s, 10m, 1h: then SIGTERM, and SIGKILL after
    /// --kill-after; the exit status is then 124
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,

    /// Grace period between the timeout's SIGTERM and SIGKILL
    #[arg(long, value_name = "DURATION", default_value = "5s", requires = "timeout")]
    pub kill_after: String,

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    On,
    Off,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LandlockArg {
    Off,
    BestEffort,
    Require,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print one JSON object instead of the table
    #[arg(long)]
    pub json: bool,
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
