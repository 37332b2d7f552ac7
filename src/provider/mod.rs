//! Providers: where a run's processes execute.
//!
//! A provider manages **instances**, one per run, named by the backend
//! (`instance_name`, e.g. `tuixiu-run-<run_id>`). An instance outlives the
//! processes started in it: the agent, init scripts and terminals all run
//! in the same instance, and it stays until it is stopped or removed, so a
//! daemon restart can re-adopt it by name.
//!
//! | provider | an instance is | a process is |
//! |---|---|---|
//! | [`native`] | the run's host directories (workspace, home) and its sandbox template, recorded in the state directory | a fresh sandbox from the template, launched by `tuixiu-sandbox __exec` |
//! | [`docker`] | a long-lived container (`docker run -d`) with the workspace at `/workspace` | `docker exec -i` in that container |
//! | [`host`] | the same directories as native, without any isolation (development only) | a plain host process in the workspace |
//!
//! Callers use the [`Provider`] trait, usually through [`AnyProvider`],
//! which picks one of the three at run time. The operations are `async`
//! (tokio) because the daemon drives many runs at once; the CLI calls them
//! on a current-thread runtime. `tuixiu-sandbox run --provider native`
//! does not come through here at all: it launches in-process.

pub mod docker;
mod error;
pub mod host;
mod local;
pub mod names;
pub mod native;
mod process;
mod records;

use std::future::Future;
use std::path::{Path, PathBuf};

use sandbox::{Access, Network, UserView};
use serde::{Deserialize, Serialize};

pub use error::{ConflictError, InvalidError, MemfdStep, ProviderError};
pub use names::{DEFAULT_INSTANCE_PREFIX, NameError};
pub use process::{ExitStatus, Killer, Process};

/// The three providers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Native,
    Docker,
    Host,
}

impl ProviderKind {
    /// The name the backend knows (`capabilities.sandbox.provider`,
    /// `sandbox_instance_status.provider`). The native provider is the
    /// bubblewrap-equivalent and reports `bwrap`, the value the backend's
    /// policy checks already understand.
    pub fn wire_name(self) -> &'static str {
        match self {
            ProviderKind::Native => "bwrap",
            ProviderKind::Docker => "container_oci",
            ProviderKind::Host => "host_process",
        }
    }

    /// The name used on the command line (`--provider`).
    pub fn cli_name(self) -> &'static str {
        match self {
            ProviderKind::Native => "native",
            ProviderKind::Docker => "docker",
            ProviderKind::Host => "host",
        }
    }
}

/// The life-cycle state of an instance, as reported to the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InstanceStatus {
    Creating,
    Running,
    Stopped,
    Missing,
    Error,
}

impl InstanceStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceStatus::Creating => "creating",
            InstanceStatus::Running => "running",
            InstanceStatus::Stopped => "stopped",
            InstanceStatus::Missing => "missing",
            InstanceStatus::Error => "error",
        }
    }
}

/// What a provider knows about one instance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceInfo {
    pub name: String,
    /// Which provider manages it.
    #[serde(skip)]
    pub kind: ProviderKind,
    /// The provider's wire name (`bwrap`, `container_oci`, `host_process`).
    pub provider: &'static str,
    /// The container CLI for `container_oci` (`docker`, `podman`, `nerdctl`).
    pub runtime: Option<String>,
    pub status: InstanceStatus,
    /// RFC 3339 time of creation, when known.
    pub created_at: Option<String>,
    pub run_id: Option<String>,
    /// The container id (docker).
    pub id: Option<String>,
    pub image: Option<String>,
    /// The host directory behind `/workspace`.
    pub workspace: Option<PathBuf>,
    /// Why the status is `error`, or the last failure seen.
    pub last_error: Option<String>,
    /// The egress proxy's counters of an instance with `--network allow`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Counts>,
}

impl InstanceInfo {
    /// An instance that does not exist.
    pub fn missing(kind: ProviderKind, name: &str) -> InstanceInfo {
        InstanceInfo {
            name: name.to_string(),
            kind,
            provider: kind.wire_name(),
            runtime: None,
            status: InstanceStatus::Missing,
            created_at: None,
            run_id: None,
            id: None,
            image: None,
            workspace: None,
            last_error: None,
            egress: None,
        }
    }
}

/// Resource limits, applied by the provider that supports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// CPUs, fractional (`--cpus 1.5`).
    pub cpus: Option<f64>,
    /// Memory in bytes.
    pub memory: Option<u64>,
    /// Maximum number of processes (tasks).
    pub pids: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.cpus.is_none() && self.memory.is_none() && self.pids.is_none()
    }
}

/// An extra mount of an instance, besides `/workspace` and the home.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Mount {
    /// A host path at a guest path.
    Bind { src: PathBuf, dst: String, access: Access },
    /// A private tmpfs owned by the instance's user.
    Tmpfs { dst: String },
}

/// How to create an instance. Reusing an instance by name ignores
/// everything but the checks that the existing one matches (run id,
/// workspace, image).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstanceConfig {
    pub name: String,
    pub run_id: String,
    /// The container image (docker only; required there).
    pub image: Option<String>,
    /// Host directory shown at `/workspace`.
    pub workspace: PathBuf,
    /// Show the workspace read-only (a manifest's `ro` WORKSPACE bind).
    #[serde(default)]
    pub workspace_read_only: bool,
    /// Host directory shown at the user's home. `None`: a directory the
    /// provider keeps in its state directory, removed with the instance.
    pub home: Option<PathBuf>,
    pub user: UserView,
    pub network: Network,
    pub hostname: String,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// Variables every process of the instance gets (after the user view,
    /// before the process's own). For docker they are the container's
    /// environment and visible to `docker inspect`: keep secrets in
    /// [`ProcessSpec::env`].
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Native only: host ids the sandbox user maps onto (root callers).
    #[serde(default)]
    pub host_ids: Option<sandbox::HostIds>,
    /// Native only: processes may run `bwrap` (nested sandboxes).
    #[serde(default = "nested_default")]
    pub nested: bool,
    /// Native only: nested commands may make their own user, mount and
    /// pid namespaces (`--nested-userns`).
    #[serde(default = "nested_default")]
    pub nested_userns: bool,
    /// Native only: the egress proxy's policy, with [`Network::Proxied`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::Policy>,
    /// Host paths (canonical) the instance must not see by any path:
    /// covered wherever the system view (native) or a bind would show
    /// them (the daemon's workspace root and state directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<PathBuf>,
}

fn nested_default() -> bool {
    true
}

impl InstanceConfig {
    /// A config with the defaults of `tuixiu-sandbox run`: user `agent`
    /// (1000:1000), the host's network, hostname `sandbox`, no limits.
    pub fn new(name: impl Into<String>, run_id: impl Into<String>, workspace: impl Into<PathBuf>) -> Self {
        InstanceConfig {
            name: name.into(),
            run_id: run_id.into(),
            image: None,
            workspace: workspace.into(),
            workspace_read_only: false,
            home: None,
            user: UserView::new("agent", 1000, 1000),
            network: Network::On,
            hostname: "sandbox".into(),
            limits: Limits::default(),
            mounts: Vec::new(),
            env: Vec::new(),
            host_ids: None,
            nested: true,
            nested_userns: true,
            egress: None,
            hidden: Vec::new(),
        }
    }
}

/// Where a process's stdio goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stdio {
    /// Pipes, available as [`Process::stdin`], `stdout` and `stderr`.
    #[default]
    Piped,
    /// The caller's own descriptors (the CLI's passthrough).
    Inherit,
}

/// One process to start in an instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The command and its arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Variables added after the instance's (later ones win).
    pub env: Vec<(String, String)>,
    /// Working directory as the instance sees it (under `/workspace` or the
    /// home) [default: `/workspace`].
    pub cwd: Option<String>,
    /// The working directory as a descriptor the caller resolved inside
    /// the instance's view (a terminal's `cwd`): where the provider can, the
    /// process starts there by `fchdir` (native: joined; host), and `cwd`
    /// only names it; docker's `exec` takes the path.
    pub cwd_dir: Option<DirFd>,
    pub stdio: Stdio,
}

/// A directory descriptor shared by the specs that name it (two are equal
/// when they are the same descriptor).
#[derive(Clone, Debug)]
pub struct DirFd(pub std::sync::Arc<std::os::fd::OwnedFd>);

impl PartialEq for DirFd {
    fn eq(&self, other: &DirFd) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for DirFd {}

impl ProcessSpec {
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ProcessSpec { argv: argv.into_iter().map(Into::into).collect(), ..Default::default() }
    }
}

/// The operations every provider offers. Implementations must be usable
/// from many tasks at once (`&self`, `Send` futures).
///
/// Instance names are validated (characters, length, configured prefix)
/// before anything else happens; a provider never touches an instance it
/// did not create (docker: the `acp-proxy.managed=1` label).
pub trait Provider: Send + Sync {
    /// Which provider this is.
    fn kind(&self) -> ProviderKind;

    /// The container CLI in use (`docker`, `podman`, `nerdctl`), if any.
    fn runtime(&self) -> Option<&str> {
        None
    }

    /// Creates the instance, or reuses the one with this name: a stopped
    /// instance is started again, a running one is returned as it is.
    /// Refuses an existing instance of another run, workspace or image.
    fn ensure(
        &self,
        config: &InstanceConfig,
    ) -> impl Future<Output = Result<InstanceInfo, ProviderError>> + Send;

    /// The instance's state; a name that does not exist is `missing`, not an error.
    fn inspect(&self, name: &str) -> impl Future<Output = Result<InstanceInfo, ProviderError>> + Send;

    /// Starts the run's long-lived process (the ACP agent) with streaming
    /// stdio. At most one agent lives per instance.
    fn spawn_agent(
        &self,
        name: &str,
        spec: &ProcessSpec,
    ) -> impl Future<Output = Result<Process, ProviderError>> + Send;

    /// Starts a short process (init script, terminal, git) in the instance.
    fn exec(
        &self,
        name: &str,
        spec: &ProcessSpec,
    ) -> impl Future<Output = Result<Process, ProviderError>> + Send;

    /// Stops the instance: its processes end, its files stay. Stopping a
    /// stopped or missing instance succeeds.
    fn stop(&self, name: &str) -> impl Future<Output = Result<InstanceInfo, ProviderError>> + Send;

    /// Removes the instance and what the provider keeps for it (never a
    /// directory the caller gave). Removing a missing instance succeeds.
    fn remove(&self, name: &str) -> impl Future<Output = Result<InstanceInfo, ProviderError>> + Send;

    /// Every instance this provider manages (with the configured prefix).
    fn list(&self) -> impl Future<Output = Result<Vec<InstanceInfo>, ProviderError>> + Send;
}

/// One of the three providers, chosen at run time (from the command line or
/// the daemon's config). An enum rather than `dyn Provider`: the set is
/// closed, dispatch stays static, and the trait keeps plain `async` methods.
pub enum AnyProvider {
    Native(native::NativeProvider),
    Docker(docker::DockerProvider),
    Host(host::HostProvider),
}

macro_rules! dispatch {
    ($self:ident, $p:ident => $e:expr) => {
        match $self {
            AnyProvider::Native($p) => $e,
            AnyProvider::Docker($p) => $e,
            AnyProvider::Host($p) => $e,
        }
    };
}

impl AnyProvider {
    /// `inspect` answered on the caller's thread when it costs only a
    /// record read and a `statx` (native, host); `None` when it needs a
    /// process (docker's CLI), so it stays asynchronous.
    pub fn inspect_now(&self, name: &str) -> Option<Result<InstanceInfo, ProviderError>> {
        match self {
            AnyProvider::Native(p) => Some(p.inspect_now(name)),
            AnyProvider::Host(p) => Some(p.inspect_now(name)),
            AnyProvider::Docker(_) => None,
        }
    }
}

impl Provider for AnyProvider {
    fn kind(&self) -> ProviderKind {
        dispatch!(self, p => p.kind())
    }

    fn runtime(&self) -> Option<&str> {
        dispatch!(self, p => p.runtime())
    }

    async fn ensure(&self, config: &InstanceConfig) -> Result<InstanceInfo, ProviderError> {
        dispatch!(self, p => p.ensure(config).await)
    }

    async fn inspect(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        dispatch!(self, p => p.inspect(name).await)
    }

    async fn spawn_agent(&self, name: &str, spec: &ProcessSpec) -> Result<Process, ProviderError> {
        dispatch!(self, p => p.spawn_agent(name, spec).await)
    }

    async fn exec(&self, name: &str, spec: &ProcessSpec) -> Result<Process, ProviderError> {
        dispatch!(self, p => p.exec(name, spec).await)
    }

    async fn stop(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        dispatch!(self, p => p.stop(name).await)
    }

    async fn remove(&self, name: &str) -> Result<InstanceInfo, ProviderError> {
        dispatch!(self, p => p.remove(name).await)
    }

    async fn list(&self) -> Result<Vec<InstanceInfo>, ProviderError> {
        dispatch!(self, p => p.list().await)
    }
}

/// The default state directory: `$XDG_STATE_HOME/tuixiu-sandbox`, else
/// `$HOME/.local/state/tuixiu-sandbox`, else `/var/lib/tuixiu-sandbox`.
pub fn default_state_dir() -> PathBuf {
    let from_env = |key: &str| std::env::var_os(key).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = from_env("XDG_STATE_HOME").filter(|d| d.is_absolute()) {
        return dir.join("tuixiu-sandbox");
    }
    if let Some(home) = from_env("HOME").filter(|d| d.is_absolute()) {
        return home.join(".local/state/tuixiu-sandbox");
    }
    PathBuf::from("/var/lib/tuixiu-sandbox")
}

/// Checks a guest working directory: under `/workspace` or the home.
pub fn check_guest_cwd_pub(cwd: &str, home: &str) -> Result<String, ProviderError> {
    check_guest_cwd(cwd, home)
}

pub(crate) fn check_guest_cwd(cwd: &str, home: &str) -> Result<String, ProviderError> {
    crate::hostfs::bounds::check(cwd.as_bytes()).map_err(InvalidError::CwdBound)?;
    let norm = sandbox::guest_path::normalize(cwd).map_err(|why| InvalidError::NotClean {
        what: "working directory",
        path: cwd.to_string(),
        why,
    })?;
    if sandbox::guest_path::is_within(&norm, sandbox::WORKSPACE)
        || sandbox::guest_path::is_within(&norm, home)
    {
        Ok(norm)
    } else {
        Err(InvalidError::CwdOutside { cwd: cwd.to_string(), home: home.to_string() }.into())
    }
}

/// Checks that a host directory exists and returns its canonical path.
pub(crate) fn canonical_dir(what: &'static str, dir: &Path) -> Result<PathBuf, ProviderError> {
    let canon = std::fs::canonicalize(dir).map_err(|e| ProviderError::File {
        op: what,
        path: dir.to_path_buf(),
        source: e,
    })?;
    if !canon.is_dir() {
        return Err(InvalidError::NotADirectory { what, dir: dir.to_path_buf() }.into());
    }
    Ok(canon)
}

/// Checks extra mounts: bind sources exist, destinations are clean
/// absolute guest paths.
pub(crate) fn check_mounts(mounts: &[Mount]) -> Result<(), ProviderError> {
    for mount in mounts {
        let dst = match mount {
            Mount::Bind { src, dst, .. } => {
                std::fs::metadata(src).map_err(|e| ProviderError::File {
                    op: "bind source",
                    path: src.to_path_buf(),
                    source: e,
                })?;
                dst
            }
            Mount::Tmpfs { dst } => dst,
        };
        sandbox::guest_path::normalize(dst).map_err(|why| InvalidError::NotClean {
            what: "mount destination",
            path: dst.to_string(),
            why,
        })?;
    }
    Ok(())
}

/// Checks the environment of an instance or a process.
pub(crate) fn check_env(env: &[(String, String)]) -> Result<(), ProviderError> {
    for (k, v) in env {
        names::validate_env(k, v)?;
    }
    Ok(())
}

/// Now, as RFC 3339 with milliseconds (UTC).
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
