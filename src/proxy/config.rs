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
//!
//! Each key is declared once, in `keys.rs` (location, type, default,
//! bounds, meaning); `reader.rs` reads declared keys out of the file and
//! the environment; `parse.rs` turns them into the checked [`Config`].

mod keys;
mod parse;
mod reader;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use keys::{Key, Kind, SCHEMA, docs_table, env_name, help_text};

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
        let mut r = reader::Reader::new(origin, doc, env);
        let config = parse::config(&mut r)?;
        let warnings =
            r.unused().into_iter().map(|k| format!("{origin}: unknown key {k:?} ignored")).collect();
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

fn one_line(e: &dyn fmt::Display) -> String {
    e.to_string().split_whitespace().collect::<Vec<_>>().join(" ")
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

    /// Whole error lines, as they were before the keys were declared in
    /// one table.
    #[test]
    fn error_texts_are_the_old_ones() {
        // (before the minimal config, after it, environment, the error).
        type Case = (&'static str, &'static str, &'static [(&'static str, &'static str)], &'static str);
        let cases: &[Case] = &[
            (
                "heartbeat_seconds = \"often\"\n",
                "",
                &[],
                "heartbeat_seconds: expected an integer between 1 and 3600, got \"often\"",
            ),
            (
                "allow_insecure_ws = \"maybe\"\n",
                "",
                &[],
                "allow_insecure_ws: expected true or false, got \"maybe\"",
            ),
            ("agent_command = \"x\"\n", "", &[], "agent_command: expected a list of strings, got \"x\""),
            ("agent_command = [1]\n", "", &[], "agent_command: expected a list of strings, found 1"),
            ("", "env = 3\n", &[], "sandbox.env: expected a table, got 3"),
            ("", "network = \"lan\"\n", &[], "sandbox.network: \"lan\": use on, off or allow"),
            ("", "secretFiles = 1\n", &[], "sandbox.secretFiles: expected a table, got 1"),
            ("", "[agent]\ncapabilities = 1\n", &[], "agent.capabilities: expected a table, got 1"),
            (
                "",
                "[tls]\nclient_cert = \"/x\"\n",
                &[],
                "tls.client_cert: client_cert and client_key go together",
            ),
            (
                "",
                "",
                &[("ACP_PROXY_SANDBOX_GIT_PUSH", "perhaps")],
                "sandbox.gitPush: expected true or false, got \"perhaps\"",
            ),
            (
                "",
                "",
                &[("ACP_PROXY_OUTBOX_MAX_BYTES", "10")],
                "outbox_max_bytes: expected an integer between 1024 and 1099511627776, got \"10\"",
            ),
        ];
        for (before, after, env, want) in cases {
            let e = load(&format!("{before}{MIN}{after}"), env).unwrap_err().to_string();
            assert_eq!(e, format!("proxy.toml: {want}"));
        }
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
