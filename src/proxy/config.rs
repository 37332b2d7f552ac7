//! The daemon's configuration: a TOML file with the Node acp-proxy's keys
//! (so an existing `config.toml` works), a few of our own, and environment
//! overrides.
//!
//! Every key has one environment variable, `ACP_PROXY_` + the table name
//! (if any) + the key in SCREAMING_SNAKE_CASE: `auth_token` →
//! `ACP_PROXY_AUTH_TOKEN`, `[agent] id` → `ACP_PROXY_AGENT_ID`,
//! `[sandbox] workspaceHostRoot` → `ACP_PROXY_SANDBOX_WORKSPACE_HOST_ROOT`.
//! The variable wins over the file. Lists accept a JSON array or a
//! comma/space separated string; booleans `true/false/1/0/yes/no`.
//!
//! Unknown keys are warned about (a typo must not pass unnoticed, and a
//! newer config must still start an older daemon); a value of the wrong
//! type or out of range is an error naming the key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::provider::names;

/// Where a key lives: the top level or a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Bool,
    /// A list of strings.
    List,
    /// Free-form (a table or an array of tables): no environment override.
    Any,
}

/// Every key the daemon reads, as `(table, key, kind)`; table `""` is the top level.
const SCHEMA: &[(&str, &str, Kind)] = &[
    ("", "orchestrator_url", Kind::Str),
    ("", "auth_token", Kind::Str),
    ("", "register_url", Kind::Str),
    ("", "bootstrap_token", Kind::Str),
    ("", "heartbeat_seconds", Kind::Int),
    ("", "inventory_interval_seconds", Kind::Int),
    ("", "agent_command", Kind::List),
    ("", "agent_env_allowlist", Kind::List),
    ("", "skills_download_max_bytes", Kind::Int),
    ("", "state_dir", Kind::Str),
    ("", "allow_insecure_ws", Kind::Bool),
    ("", "control_signing_secret", Kind::Str),
    ("", "register_hmac_secret", Kind::Str),
    ("", "reconnect_max_seconds", Kind::Int),
    ("", "register_ack_timeout_seconds", Kind::Int),
    ("", "outbox_max_messages", Kind::Int),
    ("", "outbox_max_bytes", Kind::Int),
    ("", "keepalive_min_seconds", Kind::Int),
    ("", "expire_idle_runs", Kind::Bool),
    ("", "git_push_timeout_max_seconds", Kind::Int),
    ("", "permission_policy", Kind::Str),
    ("", "permission_timeout_seconds", Kind::Int),
    ("", "fs_read_max_bytes", Kind::Int),
    ("", "agent_shutdown_grace_seconds", Kind::Int),
    ("", "acp_request_timeout_seconds", Kind::Int),
    ("", "shutdown_flush_seconds", Kind::Int),
    ("", "run_max_terminals", Kind::Int),
    ("", "run_max_processes", Kind::Int),
    ("", "run_terminal_memory_bytes", Kind::Int),
    ("agent", "id", Kind::Str),
    ("agent", "name", Kind::Str),
    ("agent", "max_concurrent", Kind::Int),
    ("agent", "capabilities", Kind::Any),
    ("agent", "statePath", Kind::Str),
    ("sandbox", "provider", Kind::Str),
    ("sandbox", "image", Kind::Str),
    ("sandbox", "runtime", Kind::Str),
    ("sandbox", "workspaceHostRoot", Kind::Str),
    ("sandbox", "workspaceProvider", Kind::Str),
    ("sandbox", "terminalEnabled", Kind::Bool),
    ("sandbox", "gitPush", Kind::Bool),
    ("sandbox", "nested", Kind::Bool),
    ("sandbox", "nestedUserns", Kind::Bool),
    ("sandbox", "env", Kind::Any),
    ("sandbox", "volumes", Kind::Any),
    ("sandbox", "instancePrefix", Kind::Str),
    ("sandbox", "network", Kind::Str),
    ("sandbox", "allowHosts", Kind::List),
    ("sandbox", "allowRanges", Kind::List),
    ("sandbox", "noIsolationAcknowledged", Kind::Bool),
    ("sandbox", "bootstrap", Kind::Any),
    ("sandbox", "secretFiles", Kind::Any),
    ("sandbox", "pathMapping", Kind::Any),
    ("tls", "ca_file", Kind::Str),
    ("tls", "client_cert", Kind::Str),
    ("tls", "client_key", Kind::Str),
];

/// Keys of the Node proxy that this daemon accepts and ignores on purpose
/// (no warning): they configure things that do not exist here.
const IGNORED: &[(&str, &str)] = &[
    ("", "mock_mode"),
    ("", "skills_mounting_enabled"),
    ("sandbox", "agentMode"),
    ("sandbox", "workingDir"),
    ("sandbox", "boxMode"),
    ("sandbox", "boxName"),
    ("sandbox", "boxReuse"),
    ("sandbox", "autoRemove"),
    ("sandbox", "extraRunArgs"),
    ("sandbox", "cpus"),
    ("sandbox", "memoryMib"),
];

/// The environment variable that overrides `table.key`.
pub fn env_name(table: &str, key: &str) -> String {
    let mut out = String::from("ACP_PROXY_");
    if !table.is_empty() {
        out.push_str(&table.to_ascii_uppercase());
        out.push('_');
    }
    for (i, c) in key.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

pub use crate::env::Secret;

/// Which provider runs the instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderChoice {
    /// The namespace sandbox (`native`, alias `bwrap`); reported as `bwrap`.
    Native,
    /// Containers through a CLI (`container_oci`, alias `docker`).
    Docker,
    /// No isolation (`host_process`, alias `host`): development only.
    Host,
}

/// A configured extra mount (`[[sandbox.volumes]]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub host_path: PathBuf,
    pub guest_path: String,
    pub read_only: bool,
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub id: Option<String>,
    pub name: Option<String>,
    pub max_concurrent: u64,
    /// Merged into `register_agent.agent.capabilities`.
    pub capabilities: Map<String, Value>,
    /// Guest path where `<state_dir>/agents/<agent id>/state` is mounted
    /// (read-write) in every instance: the agent's own session files
    /// outlive the run's sandbox, so `session/load` finds them later.
    pub state_path: Option<String>,
}

/// `permission_policy`: how `session/request_permission` is answered
/// (the ACP host's own type).
pub use crate::acp::port::PermissionPolicy;

/// `[sandbox.bootstrap]`: run in the instance before the agent starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bootstrap {
    /// Exit 0: already bootstrapped, skip the install.
    pub check_command: Option<String>,
    pub install_command: Option<String>,
    pub timeout_seconds: u64,
}

#[derive(Clone, Debug)]
pub struct SandboxConfig {
    pub provider: ProviderChoice,
    pub image: Option<String>,
    /// The container CLI (`docker`, `podman`, `nerdctl`).
    pub runtime: String,
    /// Canonical: every workspace and home lives under it.
    pub workspace_host_root: PathBuf,
    pub terminal_enabled: bool,
    pub git_push: bool,
    /// Native provider: agents may run `bwrap` (nested sandboxes, docs/bwrap.md).
    pub nested: bool,
    /// Native provider: nested commands may make their own user, mount and
    /// pid namespaces (`--nested-userns`, docs/security.md).
    pub nested_userns: bool,
    pub env: Vec<(String, String)>,
    pub volumes: Vec<Volume>,
    pub instance_prefix: String,
    /// `on`, `off`, or `proxied` (`allow`) with [`SandboxConfig::egress`].
    pub network: sandbox::Network,
    /// `allow`'s policy (`allowHosts`, `allowRanges`); with `on`, the
    /// ranges a run that narrows its network to a list (`init.network`)
    /// may reach.
    pub egress: crate::egress::Policy,
    pub no_isolation_acknowledged: bool,
    pub bootstrap: Option<Bootstrap>,
    /// `[sandbox.secretFiles] name = "/host/file"`: mounted read-only at
    /// `/run/secrets/<name>` in every instance.
    pub secret_files: Vec<(String, PathBuf)>,
    /// `pathMapping`: host paths from a backend on Windows (docs/acp.md, "Host
    /// paths from a backend on Windows").
    pub path_mapping: super::pathmap::PathMapping,
}

#[derive(Clone, Debug, Default)]
pub struct TlsConfig {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub orchestrator_url: String,
    pub auth_token: Option<Secret>,
    pub register_url: Option<String>,
    pub bootstrap_token: Option<Secret>,
    pub heartbeat_seconds: u64,
    /// 0 disables the periodic inventories (they are still sent on connect).
    pub inventory_interval_seconds: u64,
    pub agent_command: Vec<String>,
    /// `None`: the default allowlist.
    pub agent_env_allowlist: Option<Vec<String>>,
    pub skills_download_max_bytes: u64,
    pub state_dir: PathBuf,
    pub allow_insecure_ws: bool,
    pub control_signing_secret: Option<Secret>,
    pub register_hmac_secret: Option<Secret>,
    pub reconnect_max_seconds: u64,
    pub register_ack_timeout_seconds: u64,
    pub outbox_max_messages: usize,
    pub outbox_max_bytes: usize,
    pub keepalive_min_seconds: u64,
    pub expire_idle_runs: bool,
    pub git_push_timeout_max_seconds: u64,
    /// How the agent's `session/request_permission` is answered.
    pub permission_policy: PermissionPolicy,
    /// How long `ask` waits for `session_permission` (then: cancelled).
    pub permission_timeout_seconds: u64,
    /// Largest file `fs/read_text_file` returns whole.
    pub fs_read_max_bytes: u64,
    /// Between closing the agent's stdin and SIGTERM, and SIGTERM and SIGKILL.
    pub agent_shutdown_grace_seconds: u64,
    /// Timeout of the daemon's own requests to the agent (not prompts).
    pub acp_request_timeout_seconds: u64,
    /// At SIGTERM, how long the last messages may take to reach the backend.
    pub shutdown_flush_seconds: u64,
    /// Terminals one run's agent may hold at once (created, not released).
    pub run_max_terminals: usize,
    /// Processes in one run's sandbox above which no terminal starts.
    pub run_max_processes: usize,
    /// Memory one run's terminals may keep their output in; the rest goes
    /// to anonymous files in `<state>/terminals` (docs/acp.md).
    pub run_terminal_memory_bytes: usize,
    pub agent: AgentConfig,
    pub sandbox: SandboxConfig,
    pub tls: TlsConfig,
}

/// A configuration problem: which key, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("{origin}: {key}: {reason}")]
    Key { origin: String, key: String, reason: String },
}

/// Reads keys out of the parsed file, remembering which were used.
struct Reader<'a> {
    origin: &'a str,
    table: BTreeMap<(String, String), (Value, bool)>,
}

impl<'a> Reader<'a> {
    fn err(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Key { origin: self.origin.to_string(), key: key.to_string(), reason: reason.into() }
    }

    fn take(&mut self, table: &str, key: &str) -> Option<Value> {
        self.table.get_mut(&(table.to_string(), key.to_string())).map(|(v, used)| {
            *used = true;
            v.clone()
        })
    }

    fn dotted(table: &str, key: &str) -> String {
        if table.is_empty() { key.to_string() } else { format!("{table}.{key}") }
    }

    fn string(&mut self, table: &str, key: &str) -> Result<Option<String>, ConfigError> {
        match self.take(table, key) {
            None => Ok(None),
            Some(Value::String(s)) => {
                let s = s.trim().to_string();
                Ok(if s.is_empty() { None } else { Some(s) })
            }
            Some(other) => {
                Err(self.err(&Self::dotted(table, key), format!("expected a string, got {other}")))
            }
        }
    }

    fn int(&mut self, table: &str, key: &str, default: u64, min: u64, max: u64) -> Result<u64, ConfigError> {
        let v = match self.take(table, key) {
            None => return Ok(default),
            Some(v) => v,
        };
        let n = match &v {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match n {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.err(
                &Self::dotted(table, key),
                format!("expected an integer between {min} and {max}, got {v}"),
            )),
        }
    }

    fn boolean(&mut self, table: &str, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.take(table, key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" | "" => Ok(false),
                _ => Err(self.err(&Self::dotted(table, key), format!("expected true or false, got {s:?}"))),
            },
            Some(other) => {
                Err(self.err(&Self::dotted(table, key), format!("expected true or false, got {other}")))
            }
        }
    }

    fn list(&mut self, table: &str, key: &str) -> Result<Option<Vec<String>>, ConfigError> {
        match self.take(table, key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s),
                    other => Err(self.err(
                        &Self::dotted(table, key),
                        format!("expected a list of strings, found {other}"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(other) => {
                Err(self.err(&Self::dotted(table, key), format!("expected a list of strings, got {other}")))
            }
        }
    }

    /// Keys present but never read: warned about, not fatal.
    fn unused(&self) -> Vec<String> {
        self.table
            .iter()
            .filter(|(_, (_, used))| !used)
            .filter(|((t, k), _)| !IGNORED.contains(&(t.as_str(), k.as_str())))
            .map(|((t, k), _)| Self::dotted(t, k))
            .collect()
    }
}

/// An environment value converted to the key's type.
fn env_value(kind: Kind, raw: &str) -> Value {
    match kind {
        Kind::Str | Kind::Int | Kind::Bool | Kind::Any => Value::String(raw.to_string()),
        Kind::List => {
            let trimmed = raw.trim();
            if trimmed.starts_with('[')
                && let Ok(Value::Array(items)) = serde_json::from_str::<Value>(trimmed)
            {
                return Value::Array(items);
            }
            Value::Array(
                trimmed
                    .split(|c: char| c == ',' || c.is_whitespace())
                    .filter(|s| !s.is_empty())
                    .map(|s| Value::String(s.to_string()))
                    .collect(),
            )
        }
    }
}

impl Config {
    /// Loads `path` (if given) and applies the environment overrides of
    /// `env` (normally `std::env::vars()`). Returns the config and the
    /// warnings to log (unknown keys).
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let (origin, doc) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: path.display().to_string(),
                    reason: sandbox::error::io_error_text(&e),
                })?;
                let doc: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::File {
                    path: path.display().to_string(),
                    reason: one_line(&e),
                })?;
                (path.display().to_string(), doc)
            }
            None => ("environment".to_string(), toml::Table::new()),
        };
        let env: BTreeMap<String, String> = env.into_iter().collect();
        Self::from_table(&origin, doc, &env)
    }

    /// [`Config::load`] after the file was read and parsed as TOML (the
    /// `proxy_config` fuzz target starts here).
    #[doc(hidden)]
    pub fn from_table(
        origin: &str,
        doc: toml::Table,
        env: &BTreeMap<String, String>,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        // Flatten to (table, key) → JSON value; sub-tables of the known
        // tables stay values (`capabilities`, `env`).
        let mut flat = BTreeMap::new();
        for (key, value) in doc {
            let value = serde_json::to_value(&value).unwrap_or(Value::Null);
            match value {
                Value::Object(map) if ["agent", "sandbox", "tls"].contains(&key.as_str()) => {
                    for (k, v) in map {
                        flat.insert((key.clone(), k), (v, false));
                    }
                }
                other => {
                    flat.insert((String::new(), key), (other, false));
                }
            }
        }
        for (table, key, kind) in SCHEMA {
            if *kind == Kind::Any {
                continue;
            }
            if let Some(raw) = env.get(&env_name(table, key)) {
                flat.insert((table.to_string(), key.to_string()), (env_value(*kind, raw), false));
            }
        }
        let mut r = Reader { origin, table: flat };

        let orchestrator_url = r.string("", "orchestrator_url")?.ok_or_else(|| {
            r.err(
                "orchestrator_url",
                "required (e.g. wss://backend.example/ws/agent); or set ACP_PROXY_ORCHESTRATOR_URL",
            )
        })?;
        let url = url_parts(&orchestrator_url).map_err(|why| r.err("orchestrator_url", why.to_string()))?;
        if !matches!(url.scheme.as_str(), "ws" | "wss") {
            return Err(
                r.err("orchestrator_url", format!("{orchestrator_url:?}: the scheme must be ws or wss"))
            );
        }
        let register_url = r.string("", "register_url")?;
        if let Some(u) = &register_url {
            let parts = url_parts(u).map_err(|why| r.err("register_url", why.to_string()))?;
            if !matches!(parts.scheme.as_str(), "http" | "https") {
                return Err(r.err("register_url", format!("{u:?}: the scheme must be http or https")));
            }
        }
        let auth_token = r.string("", "auth_token")?.map(Secret::new);
        let bootstrap_token = r.string("", "bootstrap_token")?.map(Secret::new);
        if register_url.is_some() != bootstrap_token.is_some() && auth_token.is_none() {
            return Err(r.err(
                if register_url.is_some() { "bootstrap_token" } else { "register_url" },
                "register_url and bootstrap_token go together (the token is obtained by POSTing to register_url)",
            ));
        }
        let heartbeat_seconds = r.int("", "heartbeat_seconds", 30, 1, 3600)?;
        let inventory_interval_seconds = r.int("", "inventory_interval_seconds", 300, 0, 86_400)?;
        let agent_command = r.list("", "agent_command")?.unwrap_or_default();
        let agent_env_allowlist = r.list("", "agent_env_allowlist")?;
        if let Some(list) = &agent_env_allowlist
            && let Some(bad) = list.iter().find(|k| !crate::env::is_name(k))
        {
            return Err(r.err("agent_env_allowlist", format!("{bad:?} is not a variable name")));
        }
        let skills_download_max_bytes =
            r.int("", "skills_download_max_bytes", 200 * 1024 * 1024, 0, u64::MAX)?;
        let state_dir = match r.string("", "state_dir")? {
            Some(dir) => absolute(&r, "state_dir", &dir)?,
            None => crate::provider::default_state_dir(),
        };
        let allow_insecure_ws = r.boolean("", "allow_insecure_ws", false)?;
        let control_signing_secret = r.string("", "control_signing_secret")?.map(Secret::new);
        let register_hmac_secret = r.string("", "register_hmac_secret")?.map(Secret::new);
        let reconnect_max_seconds = r.int("", "reconnect_max_seconds", 30, 1, 3600)?;
        let register_ack_timeout_seconds = r.int("", "register_ack_timeout_seconds", 10, 1, 600)?;
        let outbox_max_messages = r.int("", "outbox_max_messages", 10_000, 1, 10_000_000)? as usize;
        let outbox_max_bytes = r.int("", "outbox_max_bytes", 64 * 1024 * 1024, 1024, 1 << 40)? as usize;
        let keepalive_min_seconds = r.int("", "keepalive_min_seconds", 60, 1, 86_400)?;
        let expire_idle_runs = r.boolean("", "expire_idle_runs", false)?;
        let git_push_timeout_max_seconds = r.int("", "git_push_timeout_max_seconds", 3600, 5, 86_400)?;

        let agent = AgentConfig {
            id: match r.string("agent", "id")? {
                Some(id) => Some(check_proxy_id(&r, &id)?),
                None => None,
            },
            name: r.string("agent", "name")?,
            max_concurrent: r.int("agent", "max_concurrent", 1, 1, 10_000)?,
            capabilities: match r.take("agent", "capabilities") {
                None => Map::new(),
                Some(Value::Object(map)) => map,
                Some(other) => {
                    return Err(r.err("agent.capabilities", format!("expected a table, got {other}")));
                }
            },
            state_path: match r.string("agent", "statePath")? {
                None => None,
                Some(p) => {
                    let norm = sandbox::guest_path::normalize(&p)
                        .map_err(|why| r.err("agent.statePath", format!("{p:?} {why}")))?;
                    if sandbox::guest_path::is_within(&norm, sandbox::WORKSPACE) || norm == "/" {
                        return Err(r.err("agent.statePath", "must not be / or inside /workspace"));
                    }
                    Some(norm)
                }
            },
        };

        let provider = match r.string("sandbox", "provider")?.as_deref() {
            None | Some("native") | Some("bwrap") => ProviderChoice::Native,
            Some("container_oci") | Some("docker") => ProviderChoice::Docker,
            Some("host_process") | Some("host") => ProviderChoice::Host,
            Some(other) => {
                return Err(r.err(
                    "sandbox.provider",
                    format!(
                        "{other:?} is not supported (native or its alias bwrap, container_oci, host_process)"
                    ),
                ));
            }
        };
        let image = r.string("sandbox", "image")?;
        if let Some(image) = &image {
            names::validate_image(image).map_err(|e| r.err("sandbox.image", e.to_string()))?;
        }
        if provider == ProviderChoice::Docker && image.is_none() {
            return Err(r.err("sandbox.image", "required with provider container_oci"));
        }
        let runtime = r.string("sandbox", "runtime")?.unwrap_or_else(|| "docker".into());
        if !crate::provider::docker::SUPPORTED_CLIS.contains(&runtime.as_str()) {
            return Err(r.err("sandbox.runtime", format!("{runtime:?}: use docker, podman or nerdctl")));
        }
        let root = r.string("sandbox", "workspaceHostRoot")?.ok_or_else(|| {
            r.err("sandbox.workspaceHostRoot", "required: the host directory holding run-<id> workspaces")
        })?;
        let root = absolute(&r, "sandbox.workspaceHostRoot", &root)?;
        std::fs::create_dir_all(&root).map_err(|e| {
            r.err(
                "sandbox.workspaceHostRoot",
                format!("create {}: {}", root.display(), sandbox::error::io_error_text(&e)),
            )
        })?;
        let workspace_host_root = std::fs::canonicalize(&root).map_err(|e| {
            r.err(
                "sandbox.workspaceHostRoot",
                format!("{}: {}", root.display(), sandbox::error::io_error_text(&e)),
            )
        })?;
        match r.string("sandbox", "workspaceProvider")?.as_deref() {
            None | Some("host") => {}
            Some(other) => {
                return Err(r.err(
                    "sandbox.workspaceProvider",
                    format!("{other:?} is not supported: only \"host\" (workspaces under workspaceHostRoot)"),
                ));
            }
        }
        let terminal_enabled = r.boolean("sandbox", "terminalEnabled", false)?;
        let git_push = r.boolean("sandbox", "gitPush", true)?;
        let nested = r.boolean("sandbox", "nested", true)?;
        let nested_userns = r.boolean("sandbox", "nestedUserns", true)?;
        let env = match r.take("sandbox", "env") {
            None => Vec::new(),
            Some(Value::Object(map)) => {
                let mut out = Vec::new();
                for (k, v) in map {
                    let v = match v {
                        Value::String(s) => s,
                        Value::Number(n) => n.to_string(),
                        Value::Bool(b) => b.to_string(),
                        other => {
                            return Err(r.err(
                                &format!("sandbox.env.{k}"),
                                format!("expected a string, got {other}"),
                            ));
                        }
                    };
                    names::validate_env(&k, &v).map_err(|e| r.err(&format!("sandbox.env.{k}"), e.reason))?;
                    out.push((k, v));
                }
                out
            }
            Some(other) => return Err(r.err("sandbox.env", format!("expected a table, got {other}"))),
        };
        let volumes = match r.take("sandbox", "volumes") {
            None => Vec::new(),
            Some(Value::Array(items)) => {
                let mut out = Vec::new();
                for (i, item) in items.into_iter().enumerate() {
                    let key = format!("sandbox.volumes[{i}]");
                    let Value::Object(map) = item else {
                        return Err(r.err(&key, "expected a table {hostPath, guestPath, readOnly}"));
                    };
                    let get = |k: &str| map.get(k).and_then(Value::as_str).map(str::to_string);
                    let host = get("hostPath").ok_or_else(|| r.err(&key, "hostPath is required"))?;
                    let guest = get("guestPath").ok_or_else(|| r.err(&key, "guestPath is required"))?;
                    let norm = sandbox::guest_path::normalize(&guest)
                        .map_err(|why| r.err(&key, format!("guestPath {guest:?} {why}")))?;
                    let read_only = map.get("readOnly").and_then(Value::as_bool).unwrap_or(false);
                    out.push(Volume { host_path: absolute(&r, &key, &host)?, guest_path: norm, read_only });
                }
                out
            }
            Some(other) => {
                return Err(r.err("sandbox.volumes", format!("expected an array of tables, got {other}")));
            }
        };
        let instance_prefix =
            r.string("sandbox", "instancePrefix")?.unwrap_or_else(|| names::DEFAULT_INSTANCE_PREFIX.into());
        names::validate_prefix(&instance_prefix)
            .map_err(|e| r.err("sandbox.instancePrefix", e.to_string()))?;
        let (network, egress) = network(&mut r, provider)?;
        let no_isolation_acknowledged = r.boolean("sandbox", "noIsolationAcknowledged", false)?;
        if provider == ProviderChoice::Host && !no_isolation_acknowledged {
            return Err(r.err(
                "sandbox.provider",
                "host_process runs agents without any isolation: set sandbox.noIsolationAcknowledged = true to allow it",
            ));
        }

        let bootstrap = match r.take("sandbox", "bootstrap") {
            None => None,
            Some(Value::Object(map)) => {
                let text = |k: &str| -> Result<Option<String>, ConfigError> {
                    match map.get(k) {
                        None | Some(Value::Null) => Ok(None),
                        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
                        Some(Value::String(s)) => Ok(Some(s.clone())),
                        Some(other) => Err(r.err(
                            &format!("sandbox.bootstrap.{k}"),
                            format!("expected a string, got {other}"),
                        )),
                    }
                };
                let timeout_seconds = match map.get("timeoutSeconds") {
                    None => 600,
                    Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())) {
                        Some(n) if (1..=86_400).contains(&n) => n,
                        _ => {
                            return Err(r.err(
                                "sandbox.bootstrap.timeoutSeconds",
                                format!("expected an integer between 1 and 86400, got {v}"),
                            ));
                        }
                    },
                };
                let b = Bootstrap {
                    check_command: text("checkCommand")?,
                    install_command: text("installCommand")?,
                    timeout_seconds,
                };
                (b.check_command.is_some() || b.install_command.is_some()).then_some(b)
            }
            Some(other) => return Err(r.err("sandbox.bootstrap", format!("expected a table, got {other}"))),
        };
        let path_mapping = match r.take("sandbox", "pathMapping") {
            None => super::pathmap::PathMapping::None,
            Some(value) => {
                let (kind, root) = match &value {
                    Value::String(kind) => (Some(kind.clone()), None),
                    Value::Object(map) => (
                        map.get("type").and_then(Value::as_str).map(str::to_string),
                        map.get("mountRoot").and_then(Value::as_str).map(str::to_string),
                    ),
                    other => (None, Some(other.to_string())),
                };
                match kind.as_deref() {
                    Some("none") => super::pathmap::PathMapping::None,
                    Some("windows_to_wsl") => {
                        let mount_root = root.unwrap_or_else(|| "/mnt".into());
                        if !mount_root.starts_with('/') {
                            return Err(r.err("sandbox.pathMapping.mountRoot", "must be an absolute path"));
                        }
                        super::pathmap::PathMapping::WindowsToWsl { mount_root }
                    }
                    _ => {
                        return Err(r.err(
                            "sandbox.pathMapping",
                            "expected \"windows_to_wsl\", \"none\", or a table {type = \"windows_to_wsl\", mountRoot = \"/mnt\"}",
                        ));
                    }
                }
            }
        };
        let secret_files = match r.take("sandbox", "secretFiles") {
            None => Vec::new(),
            Some(Value::Object(map)) => {
                let mut out = Vec::new();
                for (name, v) in map {
                    let key = format!("sandbox.secretFiles.{name}");
                    let ok_name = !name.is_empty()
                        && name.len() <= 128
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
                        && !name.starts_with('.');
                    if !ok_name {
                        return Err(r.err(
                            &key,
                            "a secret name is letters, digits, '_', '.', '-' (not starting with '.')",
                        ));
                    }
                    let Some(path) = v.as_str() else {
                        return Err(r.err(&key, format!("expected a file path, got {v}")));
                    };
                    let path = absolute(&r, &key, path)?;
                    if !path.is_file() {
                        return Err(r.err(&key, format!("{} is not a readable file", path.display())));
                    }
                    out.push((name, path));
                }
                out
            }
            Some(other) => return Err(r.err("sandbox.secretFiles", format!("expected a table, got {other}"))),
        };
        if provider == ProviderChoice::Host {
            // host_process has no mount namespace: nothing can be shown at
            // a guest path, so these would silently not exist.
            if agent.state_path.is_some() {
                return Err(r.err(
                    "agent.statePath",
                    "needs a provider with mounts (native or container_oci), not host_process",
                ));
            }
            if !secret_files.is_empty() {
                return Err(r.err(
                    "sandbox.secretFiles",
                    "needs a provider with mounts (native or container_oci), not host_process",
                ));
            }
        }
        let permission_policy = match r.string("", "permission_policy")?.as_deref() {
            None => {
                if provider == ProviderChoice::Host {
                    PermissionPolicy::Ask
                } else {
                    PermissionPolicy::AllowOnce
                }
            }
            Some("allow_once" | "allow" | "auto") => PermissionPolicy::AllowOnce,
            Some("ask") => PermissionPolicy::Ask,
            Some("deny") => PermissionPolicy::Deny,
            Some(other) => {
                return Err(r.err("permission_policy", format!("{other:?}: use allow_once, ask or deny")));
            }
        };
        let permission_timeout_seconds = r.int("", "permission_timeout_seconds", 600, 1, 86_400)?;
        let fs_read_max_bytes = r.int("", "fs_read_max_bytes", 16 * 1024 * 1024, 1, 1 << 30)?;
        let agent_shutdown_grace_seconds = r.int("", "agent_shutdown_grace_seconds", 2, 0, 600)?;
        let acp_request_timeout_seconds = r.int("", "acp_request_timeout_seconds", 300, 1, 86_400)?;
        let shutdown_flush_seconds = r.int("", "shutdown_flush_seconds", 5, 0, 600)?;
        let run_max_terminals = r.int("", "run_max_terminals", 32, 1, 100_000)? as usize;
        let run_max_processes = r.int("", "run_max_processes", 512, 1, 1_000_000)? as usize;
        let run_terminal_memory_bytes =
            r.int("", "run_terminal_memory_bytes", 8 * 1024 * 1024, 0, 1 << 40)? as usize;

        let tls = TlsConfig {
            ca_file: r.string("tls", "ca_file")?.map(|p| absolute(&r, "tls.ca_file", &p)).transpose()?,
            client_cert: r
                .string("tls", "client_cert")?
                .map(|p| absolute(&r, "tls.client_cert", &p))
                .transpose()?,
            client_key: r
                .string("tls", "client_key")?
                .map(|p| absolute(&r, "tls.client_key", &p))
                .transpose()?,
        };
        if tls.client_cert.is_some() != tls.client_key.is_some() {
            return Err(r.err("tls.client_cert", "client_cert and client_key go together"));
        }

        let warnings =
            r.unused().into_iter().map(|k| format!("{origin}: unknown key {k:?} ignored")).collect();
        let config = Config {
            orchestrator_url,
            auth_token,
            register_url,
            bootstrap_token,
            heartbeat_seconds,
            inventory_interval_seconds,
            agent_command,
            agent_env_allowlist,
            skills_download_max_bytes,
            state_dir,
            allow_insecure_ws,
            control_signing_secret,
            register_hmac_secret,
            reconnect_max_seconds,
            register_ack_timeout_seconds,
            outbox_max_messages,
            outbox_max_bytes,
            keepalive_min_seconds,
            expire_idle_runs,
            git_push_timeout_max_seconds,
            permission_policy,
            permission_timeout_seconds,
            fs_read_max_bytes,
            agent_shutdown_grace_seconds,
            acp_request_timeout_seconds,
            shutdown_flush_seconds,
            run_max_terminals,
            run_max_processes,
            run_terminal_memory_bytes,
            agent,
            sandbox: SandboxConfig {
                provider,
                image,
                runtime,
                workspace_host_root,
                terminal_enabled,
                git_push,
                nested,
                nested_userns,
                env,
                volumes,
                instance_prefix,
                network,
                egress,
                no_isolation_acknowledged,
                bootstrap,
                secret_files,
                path_mapping,
            },
            tls,
        };
        Ok((config, warnings))
    }

    /// The secrets of the config, for redaction.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        [&self.auth_token, &self.bootstrap_token, &self.control_signing_secret, &self.register_hmac_secret]
            .into_iter()
            .flatten()
            .map(Secret::expose)
    }
}

/// `sandbox.network` and the egress policy of `allow` (`allowHosts`,
/// `allowRanges`; the ranges also serve runs that narrow `on` to a list).
fn network(
    r: &mut Reader<'_>,
    provider: ProviderChoice,
) -> Result<(sandbox::Network, crate::egress::Policy), ConfigError> {
    let network = match r.string("sandbox", "network")?.as_deref() {
        None | Some("on") | Some("host") => sandbox::Network::On,
        Some("off") | Some("none") => sandbox::Network::Off,
        Some("allow") => sandbox::Network::Proxied,
        Some(other) => return Err(r.err("sandbox.network", format!("{other:?}: use on, off or allow"))),
    };
    let allow_hosts = r.list("sandbox", "allowHosts")?.unwrap_or_default();
    let allow_ranges = r.list("sandbox", "allowRanges")?.unwrap_or_default();
    if !allow_hosts.is_empty() && network != sandbox::Network::Proxied {
        return Err(r.err("sandbox.allowHosts", "needs sandbox.network = \"allow\""));
    }
    if !allow_ranges.is_empty() && network == sandbox::Network::Off {
        return Err(r.err("sandbox.allowRanges", "means nothing with sandbox.network = \"off\""));
    }
    let egress = crate::egress::Policy {
        hosts: allow_hosts
            .iter()
            .map(|h| crate::egress::Rule::parse(h))
            .collect::<Result<_, _>>()
            .map_err(|e| r.err("sandbox.allowHosts", e.to_string()))?,
        ranges: allow_ranges
            .iter()
            .map(|h| crate::egress::Range::parse(h))
            .collect::<Result<_, _>>()
            .map_err(|e| r.err("sandbox.allowRanges", e.to_string()))?,
    };
    if network == sandbox::Network::Proxied && provider != ProviderChoice::Native {
        return Err(r.err("sandbox.network", "allow (the egress proxy) needs the native provider"));
    }
    Ok((network, egress))
}

fn one_line(e: &dyn fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
}

fn absolute(r: &Reader<'_>, key: &str, path: &str) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        Ok(p)
    } else {
        std::env::current_dir()
            .map(|cwd| cwd.join(p))
            .map_err(|e| r.err(key, format!("relative path {path:?}: {e}")))
    }
}

/// A proxy id: what the backend keys agents by. Same characters as an
/// instance name, so it is safe in file names and logs.
fn check_proxy_id(r: &Reader<'_>, id: &str) -> Result<String, ConfigError> {
    names::validate_instance_name(id, "").map_err(|e| r.err("agent.id", e.reason))?;
    Ok(id.to_string())
}

/// The parts of a URL the daemon needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlParts {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

/// A URL [`url_parts`] cannot split.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("{0:?} is not a URL (expected scheme://host/...)")]
    NotUrl(String),
    #[error("{0:?}: unclosed '[' in the host")]
    Unclosed(String),
    #[error("{0:?}: no host")]
    NoHost(String),
    #[error("{url:?}: bad port {port:?}")]
    BadPort { url: String, port: String },
}

/// Splits `scheme://[user@]host[:port]/...` (IPv6 hosts in brackets).
pub fn url_parts(url: &str) -> Result<UrlParts, UrlError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| UrlError::NotUrl(url.to_string()))?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let (host, after) = inner.split_once(']').ok_or_else(|| UrlError::Unclosed(url.to_string()))?;
        (host.to_string(), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (authority.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::NoHost(url.to_string()));
    }
    let default_port = match scheme.as_str() {
        "ws" | "http" => 80,
        "wss" | "https" => 443,
        _ => 0,
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => {
            p.parse::<u16>().map_err(|_| UrlError::BadPort { url: url.to_string(), port: p.to_string() })?
        }
    };
    Ok(UrlParts { scheme, host: host.to_ascii_lowercase(), port })
}

/// Whether `host` names this machine's loopback (`localhost`, 127.0.0.0/8, ::1).
pub fn is_loopback_host(host: &str) -> bool {
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>().map(|ip| ip.is_loopback()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str, env: &[(&str, &str)]) -> Result<(Config, Vec<String>), ConfigError> {
        let dir = std::env::temp_dir().join(format!("tuixiu-proxy-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let text = text.replace("ROOT", &dir.join("ws").display().to_string());
        let doc: toml::Table = toml::from_str(&text).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_table("proxy.toml", doc, &env)
    }

    const MIN: &str =
        "orchestrator_url = \"ws://127.0.0.1:1/ws/agent\"\n[sandbox]\nworkspaceHostRoot = \"ROOT\"\n";

    #[test]
    fn defaults() {
        let (c, warnings) = load(MIN, &[]).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.heartbeat_seconds, 30);
        assert_eq!(c.inventory_interval_seconds, 300);
        assert_eq!(c.sandbox.provider, ProviderChoice::Native);
        assert_eq!(c.sandbox.instance_prefix, "tuixiu-run-");
        assert_eq!(c.keepalive_min_seconds, 60);
        assert!(c.sandbox.git_push);
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name("", "auth_token"), "ACP_PROXY_AUTH_TOKEN");
        assert_eq!(env_name("agent", "id"), "ACP_PROXY_AGENT_ID");
        assert_eq!(env_name("sandbox", "workspaceHostRoot"), "ACP_PROXY_SANDBOX_WORKSPACE_HOST_ROOT");
        assert_eq!(env_name("tls", "ca_file"), "ACP_PROXY_TLS_CA_FILE");
    }

    #[test]
    fn env_overrides_file() {
        let text = format!("{MIN}heartbeat_seconds_typo = 3\n");
        let (c, warnings) = load(
            &text,
            &[
                ("ACP_PROXY_HEARTBEAT_SECONDS", "7"),
                ("ACP_PROXY_AGENT_ENV_ALLOWLIST", "A, B C"),
                ("ACP_PROXY_AUTH_TOKEN", "tok-123456"),
            ],
        )
        .unwrap();
        assert_eq!(c.heartbeat_seconds, 7);
        assert_eq!(c.agent_env_allowlist.clone().unwrap(), vec!["A", "B", "C"]);
        assert_eq!(c.auth_token.as_ref().unwrap().expose(), "tok-123456");
        assert!(!format!("{c:?}").contains("tok-123456"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("heartbeat_seconds_typo"), "{warnings:?}");
    }

    #[test]
    fn errors_name_the_key() {
        let e = load(&format!("heartbeat_seconds = \"x\"\n{MIN}"), &[]).unwrap_err().to_string();
        assert!(e.contains("heartbeat_seconds") && e.contains("between 1 and 3600"), "{e}");
        let e = load(&MIN.replace("ws://", "http://"), &[]).unwrap_err().to_string();
        assert!(e.contains("orchestrator_url") && e.contains("ws or wss"), "{e}");
        let e = load(&format!("{MIN}provider = \"boxlite_oci\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("sandbox.provider"), "{e}");
        let e = load(&format!("{MIN}provider = \"container_oci\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("sandbox.image"), "{e}");
        let e = load(&format!("{MIN}provider = \"host_process\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("noIsolationAcknowledged"), "{e}");
        let e = load("[sandbox]\nworkspaceHostRoot = \"ROOT\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("orchestrator_url") && e.contains("required"), "{e}");
    }

    #[test]
    fn documented_example_loads_cleanly() {
        let root = std::env::temp_dir().join(format!("tuixiu-proxy-example-{}", std::process::id()));
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/proxy.toml.example");
        let env = [
            ("ACP_PROXY_SANDBOX_WORKSPACE_HOST_ROOT".to_string(), root.display().to_string()),
            ("ACP_PROXY_BOOTSTRAP_TOKEN".to_string(), "boot-123456".to_string()),
        ];
        let (c, warnings) = Config::load(Some(&example), env).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(c.agent.id.as_deref(), Some("proxy-prod-01"));
        assert_eq!(c.agent.capabilities["languages"][0], "rust");
        assert_eq!(c.agent_command, vec!["codex-acp"]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn urls() {
        let p = url_parts("wss://User@Backend.example:8443/ws/agent?x=1").unwrap();
        assert_eq!(p, UrlParts { scheme: "wss".into(), host: "backend.example".into(), port: 8443 });
        assert_eq!(url_parts("ws://[::1]/ws").unwrap().host, "::1");
        assert_eq!(url_parts("ws://[::1]/ws").unwrap().port, 80);
        assert!(is_loopback_host("127.0.0.2"));
        assert!(is_loopback_host("::1"));
        assert!(is_loopback_host("localhost"));
        assert!(!is_loopback_host("10.0.0.1"));
        assert!(!is_loopback_host("localhost.evil.com"));
    }
}
