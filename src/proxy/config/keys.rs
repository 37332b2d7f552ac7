//! Every config key, declared once: where it lives in the TOML file, its
//! type with its default and bounds, and what it means. The parser reads
//! keys only through these declarations ([`super::reader::Reader`] takes a
//! [`Key`]); the environment overrides, `proxy --help`'s key list and the
//! key table of docs/proxy.md are derived from [`SCHEMA`], and the tests
//! below fail when docs/proxy.md or docs/proxy.toml.example disagree with
//! it. Adding a key: one row here, its field in `Config`, one read in
//! `parse.rs`, then `UPDATE_DOCS=1 cargo test --lib proxy::config` rewrites
//! the docs table (docs/architecture.md, "Where to change what").

/// What a key's value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    /// An unsigned integer in `min..=max`, `default` when absent.
    Int {
        default: u64,
        min: u64,
        max: u64,
    },
    /// `default` when absent.
    Bool {
        default: bool,
    },
    /// A list of strings.
    List,
    /// Free-form (a table or an array of tables): no environment override.
    Any,
}

const STR: Kind = Kind::Str;
const LIST: Kind = Kind::List;
const ANY: Kind = Kind::Any;

const fn int(default: u64, min: u64, max: u64) -> Kind {
    Kind::Int { default, min, max }
}

const fn boolean(default: bool) -> Kind {
    Kind::Bool { default }
}

/// One config key.
#[derive(Debug, PartialEq, Eq)]
pub struct Key {
    /// `""` for the top level, else `agent`, `sandbox` or `tls`.
    pub table: &'static str,
    pub name: &'static str,
    pub kind: Kind,
    /// The default as docs show it; empty for `Int` and `Bool` (derived
    /// from the kind).
    default: &'static str,
    /// One line for docs/proxy.md's table (Markdown).
    pub meaning: &'static str,
}

impl Key {
    /// `table.key`, or `key` at the top level: how errors name it.
    pub fn dotted(&self) -> String {
        if self.table.is_empty() { self.name.to_string() } else { format!("{}.{}", self.table, self.name) }
    }

    /// The environment variable that overrides it (none for tables).
    pub fn env(&self) -> Option<String> {
        (self.kind != Kind::Any).then(|| env_name(self.table, self.name))
    }

    /// The default as docs show it (Markdown).
    pub fn default_text(&self) -> String {
        match self.kind {
            Kind::Int { default, min, max: u64::MAX } => format!("{default} (≥ {min})"),
            Kind::Int { default, min, max } => format!("{default} ({min}–{max})"),
            Kind::Bool { default } => default.to_string(),
            _ => self.default.to_string(),
        }
    }
}

/// Declares each key as a `pub const` [`Key`] and lists them all in
/// [`SCHEMA`], in the order docs show them.
macro_rules! keys {
    ($($id:ident: $table:literal . $name:literal = $kind:expr, $default:literal, $meaning:literal;)*) => {
        $(pub const $id: Key = Key {
            table: $table,
            name: $name,
            kind: $kind,
            default: $default,
            meaning: $meaning,
        };)*
        /// Every key the daemon reads.
        pub const SCHEMA: &[&Key] = &[$(&$id),*];
    };
}

keys! {
    ORCHESTRATOR_URL: "" . "orchestrator_url" = STR, "required",
        "`wss://host/ws/agent`; `ws://` only to loopback";
    AUTH_TOKEN: "" . "auth_token" = STR, "—",
        "the proxy JWT (`Authorization: Bearer`)";
    REGISTER_URL: "" . "register_url" = STR, "—",
        "bootstrap registration endpoint (`POST …/api/admin/acp-proxy/register`)";
    BOOTSTRAP_TOKEN: "" . "bootstrap_token" = STR, "—",
        "its secret (`x-acp-proxy-bootstrap`)";
    HEARTBEAT_SECONDS: "" . "heartbeat_seconds" = int(30, 1, 3600), "",
        "heartbeat (and WebSocket ping) interval";
    INVENTORY_INTERVAL_SECONDS: "" . "inventory_interval_seconds" = int(300, 0, 86_400), "",
        "periodic inventories; 0 = only on connect/request";
    AGENT_COMMAND: "" . "agent_command" = LIST, "`[]`",
        "the ACP agent (acp.md)";
    AGENT_ENV_ALLOWLIST: "" . "agent_env_allowlist" = LIST, "the Node list (29 keys)",
        "init.env keys the agent gets";
    PERMISSION_POLICY: "" . "permission_policy" = STR, "`allow_once` (`ask` for host)",
        "`allow_once`, `ask`, `deny` (acp.md)";
    PERMISSION_TIMEOUT_SECONDS: "" . "permission_timeout_seconds" = int(600, 1, 86_400), "",
        "how long `ask` waits";
    FS_READ_MAX_BYTES: "" . "fs_read_max_bytes" = int(16 * 1024 * 1024, 1, 1 << 30), "",
        "largest whole-file `fs/read_text_file`, and the most a read by lines reads of the file (acp.md)";
    RUN_MAX_TERMINALS: "" . "run_max_terminals" = int(32, 1, 100_000), "",
        "terminals one run's agent holds at once (acp.md)";
    RUN_MAX_PROCESSES: "" . "run_max_processes" = int(512, 1, 1_000_000), "",
        "processes in a run's sandbox above which `terminal/create` is refused (acp.md)";
    RUN_TERMINAL_MEMORY_BYTES: "" . "run_terminal_memory_bytes" = int(8 * 1024 * 1024, 0, 1 << 40), "",
        "memory one run's terminals keep their output in; beyond it, anonymous files in `<state>/terminals` (acp.md)";
    AGENT_SHUTDOWN_GRACE_SECONDS: "" . "agent_shutdown_grace_seconds" = int(2, 0, 600), "",
        "stdin close → SIGTERM → SIGKILL";
    ACP_REQUEST_TIMEOUT_SECONDS: "" . "acp_request_timeout_seconds" = int(300, 1, 86_400), "",
        "the daemon's own ACP requests";
    SHUTDOWN_FLUSH_SECONDS: "" . "shutdown_flush_seconds" = int(5, 0, 600), "",
        "at SIGTERM, how long the last messages may take to reach the backend (see \"Shutdown\")";
    SKILLS_DOWNLOAD_MAX_BYTES: "" . "skills_download_max_bytes" = int(200 * 1024 * 1024, 0, u64::MAX), "",
        "agentInputs download limit; 0 = none";
    STATE_DIR: "" . "state_dir" = STR,
        "`$XDG_STATE_HOME/tuixiu-sandbox`, else `~/.local/state/tuixiu-sandbox`",
        "identity, lock, run state, instance records, scratch directories, the agent's state directory, the git cache (also `--state-dir`)";
    ALLOW_INSECURE_WS: "" . "allow_insecure_ws" = boolean(false), "",
        "allow `ws://`/`http://` to non-loopback hosts (warns; also `--allow-insecure-ws`)";
    CONTROL_SIGNING_SECRET: "" . "control_signing_secret" = STR, "—",
        "require signed destructive controls";
    REGISTER_HMAC_SECRET: "" . "register_hmac_secret" = STR, "—",
        "add `auth` to `register_agent`";
    RECONNECT_MAX_SECONDS: "" . "reconnect_max_seconds" = int(30, 1, 3600), "",
        "backoff cap";
    REGISTER_ACK_TIMEOUT_SECONDS: "" . "register_ack_timeout_seconds" = int(10, 1, 600), "",
        "wait for `register_ack` before going on";
    OUTBOX_MAX_MESSAGES: "" . "outbox_max_messages" = int(10_000, 1, 10_000_000), "",
        "outbox bound (messages)";
    OUTBOX_MAX_BYTES: "" . "outbox_max_bytes" = int(64 * 1024 * 1024, 1024, 1 << 40), "",
        "outbox bound (bytes)";
    KEEPALIVE_MIN_SECONDS: "" . "keepalive_min_seconds" = int(60, 1, 86_400), "",
        "lower clamp of `keepalive_ttl_seconds` (lower it only for tests)";
    EXPIRE_IDLE_RUNS: "" . "expire_idle_runs" = boolean(false), "",
        "start the keepalive clock when a run goes idle, not only at `acp_close` (the Node proxy never expires runs)";
    GIT_PUSH_TIMEOUT_MAX_SECONDS: "" . "git_push_timeout_max_seconds" = int(3600, 5, 86_400), "",
        "upper clamp of `git_push.timeout_seconds`";
    AGENT_ID: "agent" . "id" = STR, "generated once",
        "the proxy id (letters, digits, `_.-`)";
    AGENT_NAME: "agent" . "name" = STR, "the id",
        "display name";
    AGENT_MAX_CONCURRENT: "agent" . "max_concurrent" = int(1, 1, 10_000), "",
        "sent in `register_agent`";
    AGENT_CAPABILITIES: "agent" . "capabilities" = ANY, "`{}`",
        "merged into `register_agent.agent.capabilities`";
    AGENT_STATE_PATH: "agent" . "statePath" = STR, "—",
        "guest path of the agent's own state directory, kept across runs (acp.md)";
    SANDBOX_PROVIDER: "sandbox" . "provider" = STR, "`native`",
        "`native` (alias `bwrap`, reported as `bwrap`), `container_oci` (alias `docker`), `host_process` (alias `host`)";
    SANDBOX_IMAGE: "sandbox" . "image" = STR, "—",
        "container image (required for `container_oci`)";
    SANDBOX_RUNTIME: "sandbox" . "runtime" = STR, "`docker`",
        "`docker`, `podman` or `nerdctl`";
    SANDBOX_WORKSPACE_HOST_ROOT: "sandbox" . "workspaceHostRoot" = STR, "required",
        "every `run-<id>`/`home-<id>` lives here (= the backend's `WORKSPACES_ROOT`)";
    SANDBOX_WORKSPACE_PROVIDER: "sandbox" . "workspaceProvider" = STR, "`host`",
        "only `host`";
    SANDBOX_TERMINAL_ENABLED: "sandbox" . "terminalEnabled" = boolean(false), "",
        "serve `terminal/*` (acp.md)";
    SANDBOX_GIT_PUSH: "sandbox" . "gitPush" = boolean(true), "",
        "allow `git_push`";
    SANDBOX_NESTED: "sandbox" . "nested" = boolean(true), "",
        "native provider: agents may run `bwrap` (nested sandboxes, bwrap.md)";
    SANDBOX_NESTED_USERNS: "sandbox" . "nestedUserns" = boolean(true), "",
        "native provider: nested commands may make their own user, mount and pid namespaces, as under bubblewrap (`run --nested-userns`, security.md)";
    SANDBOX_ENV: "sandbox" . "env" = ANY, "`{}`",
        "variables of every instance process";
    SANDBOX_VOLUMES: "sandbox" . "volumes" = ANY, "`[]`",
        "`[[sandbox.volumes]] hostPath, guestPath, readOnly` extra binds";
    SANDBOX_INSTANCE_PREFIX: "sandbox" . "instancePrefix" = STR, "`tuixiu-run-`",
        "only instances with this prefix are managed";
    SANDBOX_NETWORK: "sandbox" . "network" = STR, "`on`",
        "`off`: loopback only (native); `allow`: only `allowHosts`, through the egress proxy (native; \"Network by allowlist\" below)";
    SANDBOX_ALLOW_HOSTS: "sandbox" . "allowHosts" = LIST, "`[]`",
        "with `network = \"allow\"`: `NAME`, `*.DOMAIN` or an IP literal, with `:PORT` or `:*` (default 443)";
    SANDBOX_ALLOW_RANGES: "sandbox" . "allowRanges" = LIST, "`[]`",
        "address ranges (CIDR) the egress proxy may connect to although they are private, loopback, link-local or otherwise special (security.md)";
    SANDBOX_NO_ISOLATION_ACKNOWLEDGED: "sandbox" . "noIsolationAcknowledged" = boolean(false), "",
        "required for `host_process`";
    SANDBOX_BOOTSTRAP: "sandbox" . "bootstrap" = ANY, "—",
        "`checkCommand`, `installCommand`, `timeoutSeconds` run before the agent";
    SANDBOX_SECRET_FILES: "sandbox" . "secretFiles" = ANY, "—",
        "`name = \"/host/file\"`: mounted read-only at `/run/secrets/<name>` (acp.md)";
    SANDBOX_PATH_MAPPING: "sandbox" . "pathMapping" = ANY, "none",
        "`\"windows_to_wsl\"` or `{ type = \"windows_to_wsl\", mountRoot = \"/mnt\" }`: map `D:\\x` host paths from a backend on Windows to `/mnt/d/x` before any check (acp.md)";
    TLS_CA_FILE: "tls" . "ca_file" = STR, "—",
        "PEM CA(s) trusted besides the system roots";
    TLS_CLIENT_CERT: "tls" . "client_cert" = STR, "—",
        "PEM client certificate chain (mTLS; with `tls.client_key`)";
    TLS_CLIENT_KEY: "tls" . "client_key" = STR, "—",
        "its PEM private key";
}

/// Keys of the Node proxy that this daemon accepts and ignores on purpose
/// (no warning): they configure things that do not exist here.
pub const IGNORED: &[(&str, &str)] = &[
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

/// The tables whose keys are declared one by one (their sub-tables, such
/// as `agent.capabilities`, are values).
pub const TABLES: &[&str] = &["agent", "sandbox", "tls"];

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

/// docs/proxy.md's key table.
pub fn docs_table() -> String {
    let mut out = String::from("| key | default | env | meaning |\n|---|---|---|---|\n");
    for k in SCHEMA {
        let env = k.env().map_or_else(|| "—".to_string(), |e| format!("`{e}`"));
        out.push_str(&format!("| `{}` | {} | {env} | {} |\n", k.dotted(), k.default_text(), k.meaning));
    }
    out
}

/// The key list of `proxy --help`: key, environment variable, default.
pub fn help_text() -> String {
    let key_width = SCHEMA.iter().map(|k| k.dotted().len()).max().unwrap_or(0);
    let env_width = SCHEMA.iter().filter_map(|k| k.env()).map(|e| e.len()).max().unwrap_or(0);
    let mut out = String::from("Config keys (file key, environment variable, default; see docs/proxy.md):\n");
    for k in SCHEMA {
        let env = k.env().unwrap_or_else(|| "(a table: file only)".to_string());
        // Short defaults only (the bounds and the long ones: docs/proxy.md).
        let default = match k.kind {
            Kind::Int { default, .. } => default.to_string(),
            Kind::Bool { default } => default.to_string(),
            _ => k.default.replace('`', ""),
        };
        let default =
            if default == "—" || default.len() > 20 { String::new() } else { format!("({default})") };
        let line = format!("  {:key_width$}  {env:env_width$}  {default}", k.dotted());
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
