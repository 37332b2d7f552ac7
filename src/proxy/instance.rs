//! A run's instance, as its lane makes sure of it (`ensureRuntime`,
//! docs/protocol.md, "Messages from the backend"): the instance name, TTL and
//! `init` checked, the run's host directories resolved under
//! `workspaceHostRoot`, the sandbox user, the mounts (`sandbox.volumes`,
//! `mounts.rs`, the manifest's binds), the instance ensured and the run state
//! persisted; and removing it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::config::{Config, ProviderChoice, Volume};
use super::landing::Planning;
use super::mounts::{MountError, Mounts, chown_new};
use super::report::Reporter;
use super::shared::{RunSlot, RunState, STATE_VERSION, init_env};
use crate::hostfs::under_root::{UnderRootError, resolve_under_root};
use crate::inputs::{self, InputError};
use crate::manifest::ManifestError;
use crate::provider::names::{self, NameError};
use crate::provider::{
    AnyProvider, InstanceConfig, InstanceInfo, InstanceStatus, Mount, Provider, ProviderError,
};

pub const DEFAULT_TTL: u64 = 1800;
pub const MAX_TTL: u64 = 86_400;

/// Why a run's instance could not be made ready. The texts go to the
/// backend (`acp_opened`, `prompt_result`, `sandbox_control_result`).
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error("instance_name must be a string, got {0}")]
    NameNotString(Value),
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(
        "instance_name {name:?} differs from the run's existing instance {existing:?} (instanceName 与既有运行时不一致)"
    )]
    NameDiffers { name: String, existing: String },
    #[error("init must be an object")]
    InitNotObject,
    #[error("init.script must be a string")]
    InitScript,
    #[error("init.timeout_seconds must be a number")]
    InitTimeout,
    #[error("init.env must be an object")]
    InitEnvNotObject,
    #[error("init.env: {0}")]
    InitEnv(#[source] NameError),
    /// A host directory of the run that is not under `workspaceHostRoot`
    /// (or cannot be made there).
    #[error("{0}")]
    Path(#[source] UnderRootError),
    #[error("USER_HOME/HOME {home:?} {why}")]
    Home { home: String, why: &'static str },
    #[error("USER_HOME/HOME must not be /workspace or inside /workspace")]
    HomeInWorkspace,
    #[error("TUIXIU_BWRAP_UID {0:?} is not a uid")]
    Uid(String),
    #[error("TUIXIU_BWRAP_GID {0:?} is not a gid")]
    Gid(String),
    #[error("sandbox user: {0}")]
    User(#[source] sandbox::error::SpecError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Inputs(#[from] InputError),
    /// `workspaceHostRoot` as the agentInputs' host path allowlist.
    #[error("{0}")]
    InputsConfig(#[source] inputs::AllowlistError),
    #[error(transparent)]
    Mounts(#[from] MountError),
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("sandbox 实例未处于 running 状态：{0}")]
    NotRunning(&'static str),
    #[error("init.network must be an object {{\"allowHosts\": [\"PATTERN[:PORT]\", ...]}}")]
    InitNetwork,
    #[error("init.network.allowHosts: {0}")]
    InitNetworkRule(#[source] crate::egress::PatternError),
    /// The run's list would reach what the daemon's policy does not.
    #[error("init.network.allowHosts: {rule} is not allowed by this proxy's network policy ({policy})")]
    NetworkWidened { rule: String, policy: &'static str },
    #[error("init.network.allowHosts: the {0} provider cannot restrict a run's network to a list")]
    NetworkNarrowing(&'static str),
}

/// `path` resolved inside `root` (made when `create`).
fn under_root(root: &Path, path: &Path, create: bool) -> Result<PathBuf, InstanceError> {
    resolve_under_root(root, path, create).map_err(InstanceError::Path)
}

/// The sandbox user's home inside the sandbox (`USER_HOME`, `HOME`, else
/// `/root`), normalized, never inside the workspace.
fn guest_home(env: &HashMap<String, String>) -> Result<String, InstanceError> {
    let home_guest = ["USER_HOME", "HOME"]
        .iter()
        .find_map(|k| env.get(*k).filter(|v| !v.is_empty()).cloned())
        .unwrap_or_else(|| "/root".into());
    let home_guest = sandbox::guest_path::normalize(&home_guest)
        .map_err(|why| InstanceError::Home { home: home_guest.clone(), why })?;
    if sandbox::guest_path::is_within(&home_guest, sandbox::WORKSPACE) {
        return Err(InstanceError::HomeInWorkspace);
    }
    Ok(home_guest)
}

/// The config an instance is made from, copied once from [`Config`].
pub struct InstanceSettings {
    provider: ProviderChoice,
    /// Docker's image (other providers run the host's filesystem).
    image: Option<String>,
    workspace_host_root: PathBuf,
    instance_prefix: String,
    keepalive_min_seconds: u64,
    /// `sandbox.env`: every instance's environment.
    env: Vec<(String, String)>,
    volumes: Vec<Volume>,
    nested: bool,
    nested_userns: bool,
    network: sandbox::Network,
    egress: crate::egress::Policy,
}

impl InstanceSettings {
    pub fn new(cfg: &Config) -> InstanceSettings {
        let s = &cfg.sandbox;
        InstanceSettings {
            provider: s.provider,
            image: s.image.clone(),
            workspace_host_root: s.workspace_host_root.clone(),
            instance_prefix: s.instance_prefix.clone(),
            keepalive_min_seconds: cfg.keepalive_min_seconds,
            env: s.env.clone(),
            volumes: s.volumes.clone(),
            nested: s.nested,
            nested_userns: s.nested_userns,
            network: s.network,
            egress: s.egress.clone(),
        }
    }
}

/// The instance part of every lane: what making and removing a run's
/// instance needs, and nothing else. Each call is given the run it acts on
/// (its [`RunSlot`]).
pub struct InstancePart {
    provider: Arc<AnyProvider>,
    mounts: Arc<Mounts>,
    report: Arc<Reporter>,
    /// How the run's agentInputs are planned (for their binds).
    planning: Planning,
    settings: InstanceSettings,
}

impl InstancePart {
    pub fn new(
        provider: Arc<AnyProvider>,
        mounts: Arc<Mounts>,
        report: Arc<Reporter>,
        planning: Planning,
        settings: InstanceSettings,
    ) -> InstancePart {
        InstancePart { provider, mounts, report, planning, settings }
    }
    /// The TTL from a message: clamped, default 1 800 (or the run's current one).
    fn ttl(&self, run: &RunSlot, v: &Value) -> u64 {
        let min = self.settings.keepalive_min_seconds;
        match v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())) {
            Some(n) if n.is_finite() => (n.max(0.0) as u64).clamp(min, MAX_TTL),
            _ => run.state().map_or(DEFAULT_TTL.clamp(min, MAX_TTL), |s| s.keepalive_ttl_seconds),
        }
    }

    /// `ensureRuntime`: validates the instance name, TTL and init; makes
    /// sure the run's directories and instance exist and run; persists the
    /// state. Stops the keepalive clock (work is in flight). In
    /// `ensureRuntime`'s order: every check before the first directory is
    /// made, the instance before the state that records it.
    pub async fn prepare(
        &self,
        run: &mut RunSlot,
        instance_name: &Value,
        ttl: &Value,
        init: &Value,
    ) -> Result<(), InstanceError> {
        let name = self.instance_name(run, instance_name)?;
        let ttl = self.ttl(run, ttl);
        let init = match init {
            Value::Null => None,
            v => Some(check_init(v)?),
        };
        if let Some(env) = init.as_ref().and_then(|i| i.get("env")).and_then(Value::as_object) {
            self.report.add_secrets(env.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))));
        }
        let effective_init = init.clone().or_else(|| run.state().and_then(|s| s.init.clone()));
        let env = init_env(effective_init.as_ref());
        let (workspace, home) = self.run_dirs(run, init.is_some(), effective_init.as_ref(), &env)?;
        let home_guest = guest_home(&env)?;
        let user = user_view(&env, &home_guest)?;
        let (uid, gid) = (user.uid, user.gid);
        if self.settings.provider == ProviderChoice::Docker {
            chown_new(&workspace, &user);
            chown_new(&home, &user);
        }
        let dirs = RunDirs { workspace, home, home_guest, uid, gid };
        let config = self.instance_config(run, &name, &dirs, effective_init.as_ref(), user)?;
        let info = match self.provider.ensure(&config).await {
            Ok(info) => info,
            Err(e) => {
                self.report.error_status(run.run_id(), &name, &e.to_string());
                return Err(e.into());
            }
        };
        self.report.status(run.run_id(), &info);
        record(run, name, ttl, init, dirs);
        run.persist();
        if info.status != InstanceStatus::Running {
            return Err(InstanceError::NotRunning(info.status.as_str()));
        }
        Ok(())
    }

    /// What the provider makes the run's instance from: the daemon's
    /// settings, the run's directories, user and network, and the mounts
    /// (`sandbox.volumes`, the run's own, the manifest's binds).
    fn instance_config(
        &self,
        run: &RunSlot,
        name: &str,
        dirs: &RunDirs,
        effective_init: Option<&Value>,
        user: sandbox::UserView,
    ) -> Result<InstanceConfig, InstanceError> {
        // The manifest's binds are the instance's: a read-only WORKSPACE
        // bind shows the workspace read-only, other bindMount items are
        // mounted where they target (binds are fixed when the instance is
        // made; the applier only records them).
        let (workspace_read_only, manifest_binds) = match effective_init {
            Some(init) => manifest_binds(&self.planning, init, &dirs.home_guest)?,
            None => (false, Vec::new()),
        };
        let run_mounts = self.mounts.prepare(run.run_id(), &user, &dirs.home_guest)?;
        let mounts = self.instance_mounts(run_mounts, manifest_binds);
        let (network, egress) = run_network(&self.settings, effective_init)?;
        Ok(InstanceConfig {
            image: match self.settings.provider {
                ProviderChoice::Docker => self.settings.image.clone(),
                _ => None,
            },
            home: Some(dirs.home.clone()),
            workspace_read_only,
            user,
            network,
            egress,
            mounts,
            env: self.settings.env.clone(),
            nested: self.settings.nested,
            nested_userns: self.settings.nested_userns,
            hidden: self.mounts.hidden().to_vec(),
            ..InstanceConfig::new(name.to_string(), run.run_id().to_string(), dirs.workspace.clone())
        })
    }

    /// The run's workspace and home on the host, made (private) under
    /// `workspaceHostRoot`: the workspace the run has unless a new `init`
    /// names one.
    fn run_dirs(
        &self,
        run: &RunSlot,
        fresh_init: bool,
        effective_init: Option<&Value>,
        env: &HashMap<String, String>,
    ) -> Result<(PathBuf, PathBuf), InstanceError> {
        let root = self.settings.workspace_host_root.clone();
        let workspace = match (run.state(), fresh_init) {
            (Some(state), false) => state.workspace.clone(),
            _ => {
                let wanted = workspace_from_init(effective_init, env)
                    .unwrap_or_else(|| root.join(format!("run-{}", run.run_id())));
                under_root(&root, &wanted, true)?
            }
        };
        let home = under_root(&root, &root.join(format!("home-{}", run.run_id())), true)?;
        // The run's own directories, made 0755 by earlier versions.
        for dir in [&home, &workspace].into_iter().filter(|d| d.parent() == Some(root.as_path())) {
            if dir.file_name().is_some_and(|n| {
                *n == *format!("run-{}", run.run_id()) || *n == *format!("home-{}", run.run_id())
            }) {
                make_private(dir);
            }
        }
        Ok((workspace, home))
    }

    /// The instance's mounts: `sandbox.volumes`, the run's own (scratch,
    /// agent state, secrets), the manifest's binds.
    fn instance_mounts(&self, run_mounts: Vec<Mount>, manifest_binds: Vec<Mount>) -> Vec<Mount> {
        let mut mounts: Vec<Mount> = self
            .settings
            .volumes
            .iter()
            .map(|v| Mount::Bind {
                src: v.host_path.clone(),
                dst: v.guest_path.clone(),
                access: if v.read_only { sandbox::Access::Ro } else { sandbox::Access::Rw },
            })
            .collect();
        mounts.extend(run_mounts);
        mounts.extend(manifest_binds);
        mounts
    }

    /// The run's instance name: the message's (validated), else the
    /// existing one, else `<prefix><run_id>`. A different name than the
    /// run's existing instance is an error.
    fn instance_name(&self, run: &RunSlot, v: &Value) -> Result<String, InstanceError> {
        let name = match v {
            Value::Null => None,
            Value::String(s) if s.trim().is_empty() => None,
            Value::String(s) => Some(s.trim().to_string()),
            other => return Err(InstanceError::NameNotString(other.clone())),
        };
        let name = match (name, run.state()) {
            (Some(n), _) => n,
            (None, Some(state)) => state.instance_name.clone(),
            (None, None) => format!("{}{}", self.settings.instance_prefix, run.run_id()),
        };
        names::validate_instance_name(&name, &self.settings.instance_prefix)?;
        if let Some(state) = run.state()
            && state.instance_name != name
        {
            return Err(InstanceError::NameDiffers { name, existing: state.instance_name.clone() });
        }
        Ok(name)
    }

    /// Removes instance `name`; if it is this run's, the run is forgotten
    /// with the files the daemon kept for its instance (scratch, staged
    /// secrets) and for the run (inputs kept aside).
    pub async fn remove(&self, run: &mut RunSlot, name: &str) -> Result<InstanceInfo, ProviderError> {
        match self.provider.remove(name).await {
            Ok(info) => {
                if run.state().is_some_and(|s| s.instance_name == name) {
                    self.mounts.discard(run.run_id());
                    self.mounts.discard_incoming(run.run_id());
                    run.forget();
                }
                if !run.run_id().is_empty() {
                    self.report.status(run.run_id(), &info);
                }
                Ok(info)
            }
            Err(e) => {
                if !run.run_id().is_empty() {
                    self.report.error_status(run.run_id(), name, &e.to_string());
                }
                Err(e)
            }
        }
    }
}

/// The run's directories and user, as an instance was made with them.
struct RunDirs {
    workspace: PathBuf,
    home: PathBuf,
    home_guest: String,
    uid: u32,
    gid: u32,
}

/// Records in the run's state the instance made ready: its name, TTL,
/// directories and user, and the run's `init` when a new one came. The
/// keepalive clock stops (work is in flight).
fn record(run: &mut RunSlot, name: String, ttl: u64, init: Option<Value>, dirs: RunDirs) {
    let now = super::now_iso();
    let run_id = run.run_id().to_string();
    let state = run.state_or_insert_with(|| RunState {
        version: STATE_VERSION,
        run_id,
        instance_name: name,
        keepalive_ttl_seconds: ttl,
        expires_at_ms: None,
        workspace: dirs.workspace.clone(),
        home: dirs.home.clone(),
        home_guest: dirs.home_guest.clone(),
        init: None,
        uid: dirs.uid,
        gid: dirs.gid,
        created_at: now.clone(),
        updated_at: now.clone(),
        instance_removed: false,
        landed: Default::default(),
    });
    state.keepalive_ttl_seconds = ttl;
    state.expires_at_ms = None;
    state.instance_removed = false;
    state.workspace = dirs.workspace;
    state.home = dirs.home;
    state.home_guest = dirs.home_guest;
    state.uid = dirs.uid;
    state.gid = dirs.gid;
    if init.is_some() {
        state.init = init;
    }
    state.updated_at = now;
}

/// Takes group and other access away from a run's own directory.
fn make_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(dir) else { return };
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        match std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o7700)) {
            Ok(()) => tracing::info!("{}: mode {mode:o} narrowed to {:o}", dir.display(), mode & 0o7700),
            Err(e) => tracing::warn!("{}: narrowing mode {mode:o}: {e}", dir.display()),
        }
    }
}

/// Validates `init` as the Node proxy does (docs/protocol.md, "init
/// validation").
fn check_init(v: &Value) -> Result<Value, InstanceError> {
    let Some(obj) = v.as_object() else {
        return Err(InstanceError::InitNotObject);
    };
    if let Some(s) = obj.get("script")
        && !s.is_string()
        && !s.is_null()
    {
        return Err(InstanceError::InitScript);
    }
    if let Some(t) = obj.get("timeout_seconds")
        && !t.is_null()
        && !t.as_f64().is_some_and(f64::is_finite)
    {
        return Err(InstanceError::InitTimeout);
    }
    if let Some(env) = obj.get("env")
        && !env.is_null()
    {
        let Some(env) = env.as_object() else {
            return Err(InstanceError::InitEnvNotObject);
        };
        for (k, v) in env {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            names::validate_env(k, &text).map_err(InstanceError::InitEnv)?;
        }
    }
    if let Some(network) = obj.get("network")
        && !network.is_null()
    {
        init_allow_hosts(network)?;
    }
    Ok(v.clone())
}

/// `init.network.allowHosts`, parsed.
fn init_allow_hosts(network: &Value) -> Result<Vec<crate::egress::Rule>, InstanceError> {
    let hosts = network.get("allowHosts").and_then(Value::as_array).ok_or(InstanceError::InitNetwork)?;
    hosts
        .iter()
        .map(|h| {
            let text = h.as_str().ok_or(InstanceError::InitNetwork)?;
            crate::egress::Rule::parse(text).map_err(InstanceError::InitNetworkRule)
        })
        .collect()
}

/// The run's network: the daemon's (`sandbox.network`), or narrowed to the
/// run's own list (`init.network.allowHosts`), which may take away but never
/// add: under `allow` every rule must be covered by one of the daemon's;
/// under `on` (everything) the list becomes the run's allowlist, with the
/// daemon's `allowRanges`; under `off` only an empty list is no wider.
fn run_network(
    cfg: &InstanceSettings,
    init: Option<&Value>,
) -> Result<(sandbox::Network, Option<crate::egress::Policy>), InstanceError> {
    use sandbox::Network;
    let wanted = match init.and_then(|i| i.get("network")) {
        None | Some(Value::Null) => None,
        Some(network) => Some(init_allow_hosts(network)?),
    };
    match (cfg.network, wanted) {
        (Network::Proxied, None) => Ok((Network::Proxied, Some(cfg.egress.clone()))),
        (Network::Proxied, Some(rules)) => match cfg.egress.narrowed(&rules) {
            Ok(policy) => Ok((Network::Proxied, Some(policy))),
            Err(rule) => Err(InstanceError::NetworkWidened { rule: rule.to_string(), policy: "allow" }),
        },
        (Network::On, Some(rules)) => match cfg.provider {
            ProviderChoice::Native => Ok((
                Network::Proxied,
                Some(crate::egress::Policy { hosts: rules, ranges: cfg.egress.ranges.clone() }),
            )),
            ProviderChoice::Docker => Err(InstanceError::NetworkNarrowing("container_oci")),
            ProviderChoice::Host => Err(InstanceError::NetworkNarrowing("host_process")),
        },
        (Network::Off, Some(rules)) => match rules.first() {
            None => Ok((Network::Off, None)),
            Some(rule) => Err(InstanceError::NetworkWidened { rule: rule.to_string(), policy: "off" }),
        },
        (network, None) => Ok((network, None)),
    }
}

/// The host workspace the run asks for: the agentInputs `WORKSPACE`
/// bindMount (target `""`/`"."`), else an absolute `TUIXIU_WORKSPACE`.
fn workspace_from_init(init: Option<&Value>, env: &HashMap<String, String>) -> Option<PathBuf> {
    let items = init?.pointer("/agentInputs/items").and_then(Value::as_array);
    for item in items.into_iter().flatten() {
        let is_ws = item.get("apply").and_then(Value::as_str) == Some("bindMount")
            && item.pointer("/target/root").and_then(Value::as_str) == Some("WORKSPACE")
            && matches!(
                item.pointer("/target/path").and_then(Value::as_str).map(str::trim),
                None | Some("" | ".")
            );
        if is_ws && let Some(p) = item.pointer("/source/path").and_then(Value::as_str).map(str::trim) {
            return Some(PathBuf::from(p));
        }
    }
    env.get("TUIXIU_WORKSPACE").map(PathBuf::from).filter(|p| p.is_absolute())
}

/// From a run's `init.agentInputs`: whether the WORKSPACE `"."` bind is
/// read-only, and the other bindMount items as instance mounts.
fn manifest_binds(
    planning: &Planning,
    init: &Value,
    home_guest: &str,
) -> Result<(bool, Vec<Mount>), InstanceError> {
    let Some(value) = init.get("agentInputs").filter(|v| !v.is_null()) else {
        return Ok((false, Vec::new()));
    };
    let manifest = crate::manifest::parse_value(value)?;
    let plan = inputs::Plan::new(manifest, &planning.config().map_err(InstanceError::InputsConfig)?)?;
    let layout = inputs::Layout::new(home_guest.to_string());
    let read_only = plan.workspace().is_some_and(|(_, a)| a == crate::manifest::Access::Ro);
    let binds = plan
        .binds()
        .map(|(_, planned, host, access)| Mount::Bind {
            src: host.canonical.clone(),
            dst: layout.guest(planned.item.target.root, &planned.item.target.path),
            access: match access {
                crate::manifest::Access::Ro => sandbox::Access::Ro,
                crate::manifest::Access::Rw => sandbox::Access::Rw,
            },
        })
        .collect();
    Ok((read_only, binds))
}

/// The sandbox user from `init.env` (the bwrap provider's rules).
fn user_view(env: &HashMap<String, String>, home: &str) -> Result<sandbox::UserView, InstanceError> {
    let get = |k: &str| env.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
    let name =
        get("TUIXIU_BWRAP_USERNAME").or_else(|| get("USER")).or_else(|| get("LOGNAME")).unwrap_or("agent");
    let uid = match get("TUIXIU_BWRAP_UID") {
        Some(s) => s.parse::<u32>().map_err(|_| InstanceError::Uid(s.to_string()))?,
        None => 1000,
    };
    let gid = match get("TUIXIU_BWRAP_GID") {
        Some(s) => s.parse::<u32>().map_err(|_| InstanceError::Gid(s.to_string()))?,
        None => uid,
    };
    let mut user = sandbox::UserView::new(name, uid, gid);
    user.home = home.to_string();
    user.validate().map_err(InstanceError::User)?;
    Ok(user)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn init_checks() {
        assert!(check_init(&json!({"script":"x","timeout_seconds":3,"env":{"A":"b"}})).is_ok());
        assert!(check_init(&json!("x")).is_err());
        assert!(check_init(&json!({"script":3})).is_err());
        assert!(check_init(&json!({"env":[]})).is_err());
        assert!(check_init(&json!({"env":{"A":"x\ny"}})).is_err());
    }

    #[test]
    fn messages_are_the_backends() {
        let e = check_init(&json!({"env":{"A":"x\ny"}})).unwrap_err().to_string();
        assert!(e.starts_with("init.env: environment variable"), "{e}");
        let e = InstanceError::Home { home: "x".into(), why: "is not absolute" };
        assert_eq!(e.to_string(), "USER_HOME/HOME \"x\" is not absolute");
        assert_eq!(
            InstanceError::NotRunning("stopped").to_string(),
            "sandbox 实例未处于 running 状态：stopped"
        );
    }
}
