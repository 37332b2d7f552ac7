//! From the declared keys to a checked [`Config`]: each value converted
//! and checked where it is read, in the order the file's sections come
//! (so the first error reported is the first one a reader meets).

use std::path::PathBuf;

use serde_json::Value;

use super::keys::*;
use super::reader::Reader;
use super::{
    AgentConfig, Bootstrap, Config, ConfigError, PermissionPolicy, ProviderChoice, SandboxConfig, Secret,
    TlsConfig, Volume, url_parts,
};
use crate::provider::names;
use crate::proxy::pathmap::PathMapping;

/// Every key, read once.
pub(super) fn config(r: &mut Reader<'_>) -> Result<Config, ConfigError> {
    let backend = backend(r)?;
    let heartbeat_seconds = r.int(&HEARTBEAT_SECONDS)?;
    let inventory_interval_seconds = r.int(&INVENTORY_INTERVAL_SECONDS)?;
    let agent_command = r.list(&AGENT_COMMAND)?.unwrap_or_default();
    let agent_env_allowlist = r.list(&AGENT_ENV_ALLOWLIST)?;
    if let Some(list) = &agent_env_allowlist
        && let Some(bad) = list.iter().find(|k| !crate::env::is_name(k))
    {
        return Err(r.err("agent_env_allowlist", format!("{bad:?} is not a variable name")));
    }
    let skills_download_max_bytes = r.int(&SKILLS_DOWNLOAD_MAX_BYTES)?;
    let state_dir = match r.string(&STATE_DIR)? {
        Some(dir) => absolute(r, "state_dir", &dir)?,
        None => crate::provider::default_state_dir(),
    };
    let allow_insecure_ws = r.boolean(&ALLOW_INSECURE_WS)?;
    let control_signing_secret = r.string(&CONTROL_SIGNING_SECRET)?.map(Secret::new);
    let register_hmac_secret = r.string(&REGISTER_HMAC_SECRET)?.map(Secret::new);
    let reconnect_max_seconds = r.int(&RECONNECT_MAX_SECONDS)?;
    let register_ack_timeout_seconds = r.int(&REGISTER_ACK_TIMEOUT_SECONDS)?;
    let outbox_max_messages = r.size(&OUTBOX_MAX_MESSAGES)?;
    let outbox_max_bytes = r.size(&OUTBOX_MAX_BYTES)?;
    let keepalive_min_seconds = r.int(&KEEPALIVE_MIN_SECONDS)?;
    let expire_idle_runs = r.boolean(&EXPIRE_IDLE_RUNS)?;
    let git_push_timeout_max_seconds = r.int(&GIT_PUSH_TIMEOUT_MAX_SECONDS)?;
    let agent = agent(r)?;
    let sandbox = sandbox(r, &agent)?;
    let permission_policy = permission_policy(r, sandbox.provider)?;
    // Struct fields are evaluated in the order written: the reads below
    // keep the file's order.
    Ok(Config {
        orchestrator_url: backend.orchestrator_url,
        auth_token: backend.auth_token,
        register_url: backend.register_url,
        bootstrap_token: backend.bootstrap_token,
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
        permission_timeout_seconds: r.int(&PERMISSION_TIMEOUT_SECONDS)?,
        fs_read_max_bytes: r.int(&FS_READ_MAX_BYTES)?,
        agent_shutdown_grace_seconds: r.int(&AGENT_SHUTDOWN_GRACE_SECONDS)?,
        acp_request_timeout_seconds: r.int(&ACP_REQUEST_TIMEOUT_SECONDS)?,
        shutdown_flush_seconds: r.int(&SHUTDOWN_FLUSH_SECONDS)?,
        run_max_terminals: r.size(&RUN_MAX_TERMINALS)?,
        run_max_processes: r.size(&RUN_MAX_PROCESSES)?,
        run_terminal_memory_bytes: r.size(&RUN_TERMINAL_MEMORY_BYTES)?,
        agent,
        sandbox,
        tls: tls(r)?,
    })
}

/// Where the backend is and how the daemon authenticates to it.
struct Backend {
    orchestrator_url: String,
    register_url: Option<String>,
    auth_token: Option<Secret>,
    bootstrap_token: Option<Secret>,
}

fn backend(r: &mut Reader<'_>) -> Result<Backend, ConfigError> {
    let orchestrator_url = r.string(&ORCHESTRATOR_URL)?.ok_or_else(|| {
        r.err(
            "orchestrator_url",
            "required (e.g. wss://backend.example/ws/agent); or set ACP_PROXY_ORCHESTRATOR_URL",
        )
    })?;
    let url = url_parts(&orchestrator_url).map_err(|why| r.err("orchestrator_url", why.to_string()))?;
    if !matches!(url.scheme.as_str(), "ws" | "wss") {
        return Err(r.err("orchestrator_url", format!("{orchestrator_url:?}: the scheme must be ws or wss")));
    }
    let register_url = r.string(&REGISTER_URL)?;
    if let Some(u) = &register_url {
        let parts = url_parts(u).map_err(|why| r.err("register_url", why.to_string()))?;
        if !matches!(parts.scheme.as_str(), "http" | "https") {
            return Err(r.err("register_url", format!("{u:?}: the scheme must be http or https")));
        }
    }
    let auth_token = r.string(&AUTH_TOKEN)?.map(Secret::new);
    let bootstrap_token = r.string(&BOOTSTRAP_TOKEN)?.map(Secret::new);
    if register_url.is_some() != bootstrap_token.is_some() && auth_token.is_none() {
        return Err(r.err(
            if register_url.is_some() { "bootstrap_token" } else { "register_url" },
            "register_url and bootstrap_token go together (the token is obtained by POSTing to register_url)",
        ));
    }
    Ok(Backend { orchestrator_url, register_url, auth_token, bootstrap_token })
}

fn agent(r: &mut Reader<'_>) -> Result<AgentConfig, ConfigError> {
    Ok(AgentConfig {
        id: match r.string(&AGENT_ID)? {
            Some(id) => Some(check_proxy_id(r, &id)?),
            None => None,
        },
        name: r.string(&AGENT_NAME)?,
        max_concurrent: r.int(&AGENT_MAX_CONCURRENT)?,
        capabilities: r.table(&AGENT_CAPABILITIES)?.unwrap_or_default(),
        state_path: match r.string(&AGENT_STATE_PATH)? {
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
    })
}

fn sandbox(r: &mut Reader<'_>, agent: &AgentConfig) -> Result<SandboxConfig, ConfigError> {
    let provider = provider(r)?;
    let image = r.string(&SANDBOX_IMAGE)?;
    if let Some(image) = &image {
        names::validate_image(image).map_err(|e| r.err("sandbox.image", e.to_string()))?;
    }
    if provider == ProviderChoice::Docker && image.is_none() {
        return Err(r.err("sandbox.image", "required with provider container_oci"));
    }
    let runtime = r.string(&SANDBOX_RUNTIME)?.unwrap_or_else(|| "docker".into());
    if !crate::provider::docker::SUPPORTED_CLIS.contains(&runtime.as_str()) {
        return Err(r.err("sandbox.runtime", format!("{runtime:?}: use docker, podman or nerdctl")));
    }
    let workspace_host_root = workspace_root(r)?;
    let terminal_enabled = r.boolean(&SANDBOX_TERMINAL_ENABLED)?;
    let git_push = r.boolean(&SANDBOX_GIT_PUSH)?;
    let nested = r.boolean(&SANDBOX_NESTED)?;
    let nested_userns = r.boolean(&SANDBOX_NESTED_USERNS)?;
    let env = env(r)?;
    let volumes = volumes(r)?;
    let instance_prefix =
        r.string(&SANDBOX_INSTANCE_PREFIX)?.unwrap_or_else(|| names::DEFAULT_INSTANCE_PREFIX.into());
    names::validate_prefix(&instance_prefix).map_err(|e| r.err("sandbox.instancePrefix", e.to_string()))?;
    let (network, egress) = network(r, provider)?;
    let no_isolation_acknowledged = r.boolean(&SANDBOX_NO_ISOLATION_ACKNOWLEDGED)?;
    if provider == ProviderChoice::Host && !no_isolation_acknowledged {
        return Err(r.err(
            "sandbox.provider",
            "host_process runs agents without any isolation: set sandbox.noIsolationAcknowledged = true to allow it",
        ));
    }
    let bootstrap = bootstrap(r)?;
    let path_mapping = path_mapping(r)?;
    let secret_files = secret_files(r)?;
    if provider == ProviderChoice::Host {
        // host_process has no mount namespace: nothing can be shown at
        // a guest path, so these would silently not exist.
        let why = "needs a provider with mounts (native or container_oci), not host_process";
        if agent.state_path.is_some() {
            return Err(r.err("agent.statePath", why));
        }
        if !secret_files.is_empty() {
            return Err(r.err("sandbox.secretFiles", why));
        }
    }
    Ok(SandboxConfig {
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
    })
}

fn provider(r: &mut Reader<'_>) -> Result<ProviderChoice, ConfigError> {
    match r.string(&SANDBOX_PROVIDER)?.as_deref() {
        None | Some("native") | Some("bwrap") => Ok(ProviderChoice::Native),
        Some("container_oci") | Some("docker") => Ok(ProviderChoice::Docker),
        Some("host_process") | Some("host") => Ok(ProviderChoice::Host),
        Some(other) => Err(r.err(
            "sandbox.provider",
            format!("{other:?} is not supported (native or its alias bwrap, container_oci, host_process)"),
        )),
    }
}

/// `workspaceHostRoot`, created and made canonical, and the only
/// `workspaceProvider` there is.
fn workspace_root(r: &mut Reader<'_>) -> Result<PathBuf, ConfigError> {
    let key = "sandbox.workspaceHostRoot";
    let root = r
        .string(&SANDBOX_WORKSPACE_HOST_ROOT)?
        .ok_or_else(|| r.err(key, "required: the host directory holding run-<id> workspaces"))?;
    let root = absolute(r, key, &root)?;
    std::fs::create_dir_all(&root).map_err(|e| {
        r.err(key, format!("create {}: {}", root.display(), sandbox::error::io_error_text(&e)))
    })?;
    let canonical = std::fs::canonicalize(&root)
        .map_err(|e| r.err(key, format!("{}: {}", root.display(), sandbox::error::io_error_text(&e))))?;
    match r.string(&SANDBOX_WORKSPACE_PROVIDER)?.as_deref() {
        None | Some("host") => Ok(canonical),
        Some(other) => Err(r.err(
            "sandbox.workspaceProvider",
            format!("{other:?} is not supported: only \"host\" (workspaces under workspaceHostRoot)"),
        )),
    }
}

/// `[sandbox.env]`: strings (numbers and booleans as written).
fn env(r: &mut Reader<'_>) -> Result<Vec<(String, String)>, ConfigError> {
    let Some(map) = r.table(&SANDBOX_ENV)? else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (k, v) in map {
        let v = match v {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(r.err(&format!("sandbox.env.{k}"), format!("expected a string, got {other}")));
            }
        };
        names::validate_env(&k, &v).map_err(|e| r.err(&format!("sandbox.env.{k}"), e.reason))?;
        out.push((k, v));
    }
    Ok(out)
}

/// `[[sandbox.volumes]]`.
fn volumes(r: &mut Reader<'_>) -> Result<Vec<Volume>, ConfigError> {
    let items = match r.take(&SANDBOX_VOLUMES) {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(r.err("sandbox.volumes", format!("expected an array of tables, got {other}")));
        }
    };
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
        out.push(Volume { host_path: absolute(r, &key, &host)?, guest_path: norm, read_only });
    }
    Ok(out)
}

/// `sandbox.network` and the egress policy of `allow` (`allowHosts`,
/// `allowRanges`; the ranges also serve runs that narrow `on` to a list).
fn network(
    r: &mut Reader<'_>,
    provider: ProviderChoice,
) -> Result<(sandbox::Network, crate::egress::Policy), ConfigError> {
    let network = match r.string(&SANDBOX_NETWORK)?.as_deref() {
        None | Some("on") | Some("host") => sandbox::Network::On,
        Some("off") | Some("none") => sandbox::Network::Off,
        Some("allow") => sandbox::Network::Proxied,
        Some(other) => return Err(r.err("sandbox.network", format!("{other:?}: use on, off or allow"))),
    };
    let allow_hosts = r.list(&SANDBOX_ALLOW_HOSTS)?.unwrap_or_default();
    let allow_ranges = r.list(&SANDBOX_ALLOW_RANGES)?.unwrap_or_default();
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

/// `[sandbox.bootstrap]`; `None` when it has no command.
fn bootstrap(r: &mut Reader<'_>) -> Result<Option<Bootstrap>, ConfigError> {
    let Some(map) = r.table(&SANDBOX_BOOTSTRAP)? else { return Ok(None) };
    let text = |k: &str| -> Result<Option<String>, ConfigError> {
        match map.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => {
                Err(r.err(&format!("sandbox.bootstrap.{k}"), format!("expected a string, got {other}")))
            }
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
    Ok((b.check_command.is_some() || b.install_command.is_some()).then_some(b))
}

/// `sandbox.pathMapping`: a kind, or a table with `type` and `mountRoot`.
fn path_mapping(r: &mut Reader<'_>) -> Result<PathMapping, ConfigError> {
    let Some(value) = r.take(&SANDBOX_PATH_MAPPING) else {
        return Ok(PathMapping::None);
    };
    let (kind, root) = match &value {
        Value::String(kind) => (Some(kind.clone()), None),
        Value::Object(map) => (
            map.get("type").and_then(Value::as_str).map(str::to_string),
            map.get("mountRoot").and_then(Value::as_str).map(str::to_string),
        ),
        other => (None, Some(other.to_string())),
    };
    match kind.as_deref() {
        Some("none") => Ok(PathMapping::None),
        Some("windows_to_wsl") => {
            let mount_root = root.unwrap_or_else(|| "/mnt".into());
            if !mount_root.starts_with('/') {
                return Err(r.err("sandbox.pathMapping.mountRoot", "must be an absolute path"));
            }
            Ok(PathMapping::WindowsToWsl { mount_root })
        }
        _ => Err(r.err(
            "sandbox.pathMapping",
            "expected \"windows_to_wsl\", \"none\", or a table {type = \"windows_to_wsl\", mountRoot = \"/mnt\"}",
        )),
    }
}

/// `[sandbox.secretFiles] name = "/host/file"`.
fn secret_files(r: &mut Reader<'_>) -> Result<Vec<(String, PathBuf)>, ConfigError> {
    let Some(map) = r.table(&SANDBOX_SECRET_FILES)? else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (name, v) in map {
        let key = format!("sandbox.secretFiles.{name}");
        let ok_name = !name.is_empty()
            && name.len() <= 128
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
            && !name.starts_with('.');
        if !ok_name {
            return Err(
                r.err(&key, "a secret name is letters, digits, '_', '.', '-' (not starting with '.')")
            );
        }
        let Some(path) = v.as_str() else {
            return Err(r.err(&key, format!("expected a file path, got {v}")));
        };
        let path = absolute(r, &key, path)?;
        if !path.is_file() {
            return Err(r.err(&key, format!("{} is not a readable file", path.display())));
        }
        out.push((name, path));
    }
    Ok(out)
}

fn permission_policy(r: &mut Reader<'_>, provider: ProviderChoice) -> Result<PermissionPolicy, ConfigError> {
    match r.string(&PERMISSION_POLICY)?.as_deref() {
        None if provider == ProviderChoice::Host => Ok(PermissionPolicy::Ask),
        None => Ok(PermissionPolicy::AllowOnce),
        Some("allow_once" | "allow" | "auto") => Ok(PermissionPolicy::AllowOnce),
        Some("ask") => Ok(PermissionPolicy::Ask),
        Some("deny") => Ok(PermissionPolicy::Deny),
        Some(other) => Err(r.err("permission_policy", format!("{other:?}: use allow_once, ask or deny"))),
    }
}

fn tls(r: &mut Reader<'_>) -> Result<TlsConfig, ConfigError> {
    let mut path = |k: &'static Key| -> Result<Option<PathBuf>, ConfigError> {
        r.string(k)?.map(|p| absolute(r, &k.dotted(), &p)).transpose()
    };
    let tls = TlsConfig {
        ca_file: path(&TLS_CA_FILE)?,
        client_cert: path(&TLS_CLIENT_CERT)?,
        client_key: path(&TLS_CLIENT_KEY)?,
    };
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        return Err(r.err("tls.client_cert", "client_cert and client_key go together"));
    }
    Ok(tls)
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
