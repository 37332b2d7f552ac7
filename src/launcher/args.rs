//! Arguments of the commands that launch sandboxes: `run` (with its
//! manifest, environment, provider and limit options) and `__exec`. They
//! live in the library so the small `tuixiu-sandbox` launcher and the full
//! tool parse them identically.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::error::RunError;
use super::units::{UnitError, parse_size, parse_size_or_unlimited};

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

    /// Size of each private tmpfs: /tmp, /dev/shm, a tmpfs home, /scratch and
    /// every --tmpfs (K, M, G suffixes); writing past it fails with ENOSPC
    /// [default: 1G]
    #[arg(long, value_name = "SIZE")]
    pub tmpfs_size: Option<String>,

    /// Set an environment variable inside (repeatable). Typed here, it always
    /// reaches the command; the allowlist (--env-allow) filters --env-file
    /// and manifests
    #[arg(long = "env", value_name = "KEY=VALUE", action = clap::ArgAction::Append)]
    pub env: Vec<String>,

    /// Copy a variable from the caller's environment, if set (repeatable)
    #[arg(long, value_name = "KEY", action = clap::ArgAction::Append)]
    pub pass_env: Vec<String>,

    /// Network: `on` shares the host's; `off` gives a private namespace with
    /// only loopback (local TCP between the command's own processes works);
    /// `none` is `off` without IP at all: AF_INET/AF_INET6 sockets are denied
    /// by seccomp and, with Landlock ABI 4 or newer, TCP bind/connect too;
    /// `allow` is `off` plus an egress proxy (HTTP_PROXY, HTTPS_PROXY,
    /// ALL_PROXY) that reaches only the --allow-host destinations
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NetworkArg::On)]
    pub network: NetworkArg,

    #[command(flatten)]
    pub egress: EgressArgs,

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

    /// /proc: `fresh` mounts the sandbox's own (exit 125 where the kernel
    /// refuses it, as inside most containers); `bind` binds the caller's
    /// /proc read-only (the sandbox then sees the caller's processes; its
    /// pid namespace stays private); `auto` is fresh where possible, else
    /// bind with a warning
    #[arg(long, value_enum, value_name = "MODE", default_value_t = ProcArg::Auto)]
    pub proc: ProcArg,

    /// Host uid the sandbox user maps onto (root callers only) [default: the caller's]
    #[arg(long, value_name = "N")]
    pub map_uid: Option<u32>,

    /// Host gid the sandbox group maps onto (root callers only) [default: the caller's]
    #[arg(long, value_name = "N")]
    pub map_gid: Option<u32>,

    /// Write {"child-pid": N} when the command starts and {"exit-code": N} when it ends to FD
    #[arg(long, value_name = "FD")]
    pub json_status_fd: Option<i32>,

    /// Nested sandboxes: `on` lets the command run `bwrap` (codex-acp and
    /// Claude Code sandbox their tool calls with it), served by this
    /// launcher outside the command's confinement (docs/bwrap.md); `off`
    /// leaves bwrap out (it then fails as it would in any sandbox)
    #[arg(long, value_enum, value_name = "MODE", default_value_t = NestedArg::On)]
    pub nested: NestedArg,

    /// Keep the caller's session and terminal (for interactive shells); by
    /// default the command runs in a new session, which blocks TIOCSTI injection
    #[arg(long)]
    pub keep_session: bool,

    /// agentInputs manifest (JSON, a bare object or {"agentInputs": {...}}):
    /// its items are fetched before the sandbox starts and landed in order
    /// before the command runs; its WORKSPACE "." bindMount replaces
    /// --workspace. See docs/manifest.md
    #[arg(long, value_name = "FILE", help_heading = "Inputs")]
    pub manifest: Option<PathBuf>,

    #[command(flatten)]
    pub plan: PlanArgs,

    #[command(flatten)]
    pub inputs: InputArgs,

    #[command(flatten)]
    pub env_pipeline: EnvArgs,

    /// The command to run, and its arguments
    #[arg(value_name = "COMMAND", required = true, trailing_var_arg = true)]
    pub command: Vec<String>,

    #[command(flatten)]
    pub provider: RunProviderArgs,
}

/// What a `run` command line says beyond the parsed values: the order of
/// the mount options (a later mount may cover an earlier one), and which
/// options were given rather than defaulted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunGiven {
    /// `--ro-bind`, `--bind` and `--tmpfs`, in command-line order.
    pub mount_order: Vec<MountFlag>,
    /// `--user` was given.
    pub user: bool,
    /// `--map-uid` or `--map-gid` was given.
    pub map_ids: bool,
}

/// The mount options of `run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountFlag {
    RoBind,
    Bind,
    Tmpfs,
}

impl RunGiven {
    /// From clap's matches of [`RunArgs`].
    pub fn from_matches(matches: &clap::ArgMatches) -> RunGiven {
        let mut mounts: Vec<(usize, MountFlag)> = Vec::new();
        for (id, flag, per) in
            [("ro_bind", MountFlag::RoBind, 2), ("bind", MountFlag::Bind, 2), ("tmpfs", MountFlag::Tmpfs, 1)]
        {
            if let Some(indices) = matches.indices_of(id) {
                mounts.extend(indices.step_by(per).map(|at| (at, flag)));
            }
        }
        mounts.sort_by_key(|(at, _)| *at);
        let given = |id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        RunGiven {
            mount_order: mounts.into_iter().map(|(_, flag)| flag).collect(),
            user: given("user"),
            map_ids: given("map_uid") || given("map_gid"),
        }
    }
}

impl RunArgs {
    /// The host ids `--map-uid`/`--map-gid` ask the sandbox user to map
    /// onto (each defaulting to the caller's), or `None` without them.
    /// Only a root caller may choose.
    pub fn host_ids(&self) -> Result<Option<sandbox::HostIds>, RunError> {
        if self.map_uid.is_none() && self.map_gid.is_none() {
            return Ok(None);
        }
        let (euid, egid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        if euid != 0 {
            return Err(RunError::MapIdsNotRoot);
        }
        Ok(Some(sandbox::HostIds { uid: self.map_uid.unwrap_or(euid), gid: self.map_gid.unwrap_or(egid) }))
    }
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

/// Resource limits: the container's with --provider docker; for the native
/// sandbox a delegated cgroup v2 when one is writable, else rlimits, and a
/// warning for what cannot be applied (docs/security.md).
#[derive(Debug, Args)]
pub struct LimitArgs {
    /// CPUs the command may use, fractional (e.g. 1.5); native: cgroup v2 cpu.max only
    #[arg(long, value_name = "N")]
    pub cpus: Option<f64>,

    /// Memory limit: bytes, or with a k, m or g suffix (e.g. 512m); native:
    /// cgroup v2 memory.max, else RLIMIT_AS per process
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Maximum number of processes; native: cgroup v2 pids.max, else RLIMIT_NPROC
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
    #[arg(long, value_name = "PREFIX", default_value = crate::provider::DEFAULT_INSTANCE_PREFIX,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NetworkArg {
    On,
    Off,
    None,
    Allow,
}

/// `--network allow`'s policy (docs/security.md, "Network by allowlist").
#[derive(Debug, Default, Args)]
#[command(next_help_heading = "Network allowlist (--network allow)")]
pub struct EgressArgs {
    /// A destination the command may reach through the egress proxy: a
    /// host NAME, *.DOMAIN (its subdomains) or an IP address, with :PORT or
    /// :* (any port) [default port: 443] (repeatable)
    #[arg(long, value_name = "PATTERN[:PORT]", action = clap::ArgAction::Append)]
    pub allow_host: Vec<String>,

    /// Read more --allow-host patterns from FILE, one per line (# comments)
    #[arg(long, value_name = "FILE", action = clap::ArgAction::Append)]
    pub allow_hosts_file: Vec<PathBuf>,

    /// Let the proxy connect to addresses in this range (CIDR, e.g.
    /// 10.1.0.0/16) although they are private, loopback, link-local or
    /// otherwise special, which it refuses by default (repeatable)
    #[arg(long, value_name = "CIDR", action = clap::ArgAction::Append)]
    pub allow_range: Vec<String>,
}

impl EgressArgs {
    pub fn is_empty(&self) -> bool {
        self.allow_host.is_empty() && self.allow_hosts_file.is_empty() && self.allow_range.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProcArg {
    Fresh,
    Bind,
    Auto,
}

impl From<ProcArg> for sandbox::ProcMode {
    fn from(arg: ProcArg) -> Self {
        match arg {
            ProcArg::Fresh => sandbox::ProcMode::Fresh,
            ProcArg::Bind => sandbox::ProcMode::Bind,
            ProcArg::Auto => sandbox::ProcMode::Auto,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NestedArg {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LandlockArg {
    Off,
    BestEffort,
    Require,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Descriptor to read the JSON SandboxSpec from (read to end-of-file)
    #[arg(long, value_name = "FD")]
    pub spec_fd: i32,

    /// As for `run`
    #[arg(long, value_name = "FD")]
    pub json_status_fd: Option<i32>,

    /// Run the spec's command inside the running sandbox whose PID 1 is
    /// this host pid (its namespaces, mount tree and user view; the spec's
    /// mounts are ignored)
    #[arg(long, value_name = "PID")]
    pub join_pid: Option<i32>,

    /// With --join-pid: a directory descriptor (resolved by the caller
    /// inside the sandbox's tree) the command starts in, by `fchdir`; the
    /// spec's working directory then only names it
    #[arg(long, value_name = "FD", requires = "join_pid")]
    pub cwd_fd: Option<i32>,

    /// As for `run`; replaces the spec's choice
    #[arg(long, value_enum, value_name = "MODE")]
    pub proc: Option<ProcArg>,

    /// The read end of a pipe whose write end only the caller holds: when
    /// the caller is gone (the pipe hangs up), the sandbox is killed
    #[arg(long, value_name = "FD")]
    pub lifeline_fd: Option<i32>,

    /// As for `run`; overrides the spec's own setting
    #[arg(long, value_enum, value_name = "MODE")]
    pub nested: Option<NestedArg>,

    /// A unix stream socket on which the sandbox of a `proxied` network
    /// sends its egress listener, for the caller to serve the proxy
    #[arg(long, value_name = "FD")]
    pub egress_fd: Option<i32>,

    /// The caller's counters of nested requests (a sealed in-memory file),
    /// to which the sandbox's portal adds how each request ended
    #[arg(long, value_name = "FD")]
    pub nested_counts_fd: Option<i32>,
}

/// What planning a manifest needs (shared by `run` and `manifest check`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Inputs")]
pub struct PlanArgs {
    /// Host directory that hostPath sources (copy, bindMount, local git
    /// repositories) may lie under (repeatable). None by default, except
    /// the --workspace given on the command line
    #[arg(long, value_name = "DIR", action = clap::ArgAction::Append)]
    pub allow_host_path: Vec<PathBuf>,

    /// Base URL that relative httpZip URIs resolve against; the inputs token
    /// is only ever sent to this URL's origin
    #[arg(long, value_name = "URL")]
    pub inputs_base_url: Option<String>,
}

/// How `run` fetches and lands manifest items.
#[derive(Debug, Args)]
#[command(next_help_heading = "Inputs")]
pub struct InputArgs {
    /// File holding the bearer token for the inputs endpoint (also read from
    /// the TUIXIU_INPUTS_TOKEN environment variable; never given on the
    /// command line, where `ps` would show it)
    #[arg(long, value_name = "FILE")]
    pub inputs_token_file: Option<PathBuf>,

    /// Cache of downloaded archives, by verified sha256 [default: the first
    /// usable of $XDG_CACHE_HOME/tuixiu-sandbox/inputs, ~/.cache/tuixiu-sandbox/inputs,
    /// $TMPDIR/tuixiu-sandbox-UID/inputs; else no cache, with a warning]
    #[arg(long, value_name = "DIR")]
    pub inputs_cache: Option<PathBuf>,

    /// Deadline of each download, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 60.0, value_parser = parse_seconds)]
    pub download_timeout: f64,

    /// Size cap of each download (bytes; K, M, G suffixes; 0 = no cap)
    #[arg(long, value_name = "SIZE", default_value = "200M", value_parser = parse_size_or_unlimited)]
    pub download_max_bytes: u64,

    /// Most entries one zip may have
    #[arg(long, value_name = "N", default_value_t = 5000)]
    pub zip_max_entries: u64,

    /// Largest file one zip may extract (bytes actually written; K, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "20M", value_parser = parse_size)]
    pub zip_max_file_bytes: u64,

    /// Most bytes one zip may extract in total (K, M, G suffixes)
    #[arg(long, value_name = "SIZE", default_value = "100M", value_parser = parse_size)]
    pub zip_max_total_bytes: u64,

    /// Deadline of each git checkout, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 300.0, value_parser = parse_seconds)]
    pub checkout_timeout: f64,

    /// Append one JSON line per applied item (id, apply, source, target,
    /// bytes, sha256, duration) to FILE
    #[arg(long, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
}

/// The environment pipeline: init.env, user view, envPatch, allowlist.
#[derive(Debug, Args)]
#[command(next_help_heading = "Environment")]
pub struct EnvArgs {
    /// Read KEY=VALUE lines (init.env) from FILE; --env flags are applied after it
    #[arg(long, value_name = "FILE", action = clap::ArgAction::Append)]
    pub env_file: Vec<PathBuf>,

    /// Let KEY from --env-file through the allowlist (repeatable; adds
    /// to the default list of the acp-proxy: HOME, USER, LOGNAME, USER_HOME,
    /// TUIXIU_*, GH_TOKEN...; see docs/manifest.md)
    #[arg(long, value_name = "KEY", action = clap::ArgAction::Append)]
    pub env_allow: Vec<String>,

    /// Start the allowlist empty instead of from the default list
    #[arg(long)]
    pub no_default_env_allow: bool,
}

/// `60`, `1.5`, `30s`.
fn parse_seconds(s: &str) -> Result<f64, UnitError> {
    let n: f64 = s.trim_end_matches('s').parse().map_err(|_| UnitError::NotSeconds(s.into()))?;
    if n.is_finite() && n > 0.0 { Ok(n) } else { Err(UnitError::SecondsNotPositive(s.into())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("1.5"), Ok(1.5));
        assert_eq!(parse_seconds("30s"), Ok(30.0));
        assert!(parse_seconds("0").is_err());
    }
}
