//! `tuixiu-sandbox proxy`: the execution-plane daemon (seed 002), a
//! drop-in replacement for the Node acp-proxy against the tuixiu backend.
//!
//! | module | job |
//! |---|---|
//! | [`cli`] | the `proxy` command line (the full tool and the daemon's own binary) |
//! | [`config`] | the TOML config (Node keys + ours), env overrides, validation |
//! | [`identity`] | the stable proxy id and the state-directory lock |
//! | [`tls`], [`auth`] | rustls client config (system roots + CA file, mTLS); the Bearer token (static or bootstrap-registered, refreshed) |
//! | [`link`] | the WebSocket: connect, register, heartbeats, inventories, reconnect |
//! | [`outbox`] | the bounded FIFO of everything the daemon sends, kept across disconnects |
//! | [`protocol`] | serde types of every message both ways |
//! | [`lane`] | what a run's parts share: its state, its jobs, the lane, the registry of lanes and agents, the replies |
//! | [`instance`] | a run's instance: `ensureRuntime` (name, TTL, `init`, host directories, user, mounts), removal |
//! | [`runs`] | routing to the lanes and each lane's loop: ordered processing, keepalive, re-adoption |
//! | [`mounts`] | what every instance gets besides the workspace and home: `/scratch`, the agent's state directory, `/run/secrets/<name>` |
//! | [`persist`] | run state files written by one blocking worker, latest content first |
//! | [`control`] | every `sandbox_control` action and its protections |
//! | [`gitenv`] | host git processes: credentials through askpass/ssh key files, hardening, deadlines |
//! | [`repo`] | the workspace made a checkout of `TUIXIU_REPO_URL` (clone, or from a per-URL cache) |
//! | [`inventory`] | `sandbox_inventory` and `workspace_inventory` |
//! | [`status`] | `<state_dir>/status.json`, the daemon's liveness for health checks |
//! | [`acp_sink`] | the daemon's side of the ACP host's interface: its settings, its reports as wire messages |
//! | [`landed`] | fingerprints of landed agentInputs targets: landing again never overwrites the agent's work |
//!
//! Threading: one tokio current-thread runtime. Nothing here enters a
//! namespace: sandboxes are launched by `tuixiu-sandbox __exec` through the
//! native provider, containers by the docker CLI.

pub mod acp_sink;
pub mod agent;
pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod gitenv;
pub mod identity;
pub mod instance;
pub mod inventory;
pub mod landed;
pub mod lane;
pub mod link;
pub mod mounts;
pub mod outbox;
pub mod pathmap;
pub mod persist;
pub mod protocol;
pub mod repo;
pub mod runs;
pub mod status;
pub mod tls;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use crate::env::Redactor;
use crate::provider::docker::DockerProvider;
use crate::provider::host::HostProvider;
use crate::provider::native::NativeProvider;
use crate::provider::{AnyProvider, InstanceInfo, Provider, ProviderError};
use config::{Config, ProviderChoice};

/// Exit status when the backend refuses the proxy id.
pub const EXIT_ID_CONFLICT: u8 = 3;

/// What the daemon's tasks share.
pub struct Daemon {
    pub cfg: Config,
    pub proxy_id: String,
    pub provider: AnyProvider,
    pub outbox: outbox::Outbox,
    pub runs: lane::Runs,
    /// Every secret seen (config tokens, secret init.env values), for
    /// scrubbing text that leaves the daemon.
    pub redactor: Mutex<Redactor>,
    /// Registered with the backend right now.
    pub connected: AtomicBool,
    /// `<state>/runs`.
    pub runs_dir: PathBuf,
    /// Writes run states off the daemon's thread.
    pub persister: persist::Persister,
    /// What instances get besides workspace and home (`mounts.rs`).
    pub mounts: mounts::Mounts,
}

impl Daemon {
    pub fn new(cfg: Config, proxy_id: String) -> Result<Daemon, ProviderError> {
        let state = &cfg.state_dir;
        let prefix = cfg.sandbox.instance_prefix.as_str();
        let provider = match cfg.sandbox.provider {
            ProviderChoice::Native => AnyProvider::Native(
                NativeProvider::with_current_exe(state, prefix).and_then(NativeProvider::with_lifeline)?,
            ),
            ProviderChoice::Docker => {
                AnyProvider::Docker(DockerProvider::new(&cfg.sandbox.runtime, state, prefix)?)
            }
            ProviderChoice::Host => {
                AnyProvider::Host(HostProvider::new(state, prefix, cfg.sandbox.no_isolation_acknowledged)?)
            }
        };
        Ok(Self::with_provider(cfg, proxy_id, provider))
    }

    /// As [`Daemon::new`], with `provider` instead of the configured one
    /// (the `proxy_messages` and `acp_transport` fuzz targets pass a native
    /// provider whose launcher does not exist: instances, but no process).
    #[doc(hidden)]
    pub fn with_provider(cfg: Config, proxy_id: String, provider: AnyProvider) -> Daemon {
        let mut redactor = Redactor::default();
        for s in cfg.secrets() {
            redactor.add(s);
        }
        for (k, v) in &cfg.sandbox.env {
            if crate::env::SECRET_KEYS.contains(&k.as_str()) {
                redactor.add(v);
            }
        }
        for secret in mounts::secret_values(&cfg.sandbox.secret_files) {
            redactor.add(&secret);
        }
        let runs_dir = cfg.state_dir.join("runs");
        Daemon {
            mounts: mounts::Mounts::new(&cfg, &proxy_id),
            outbox: outbox::Outbox::new(cfg.outbox_max_messages, cfg.outbox_max_bytes),
            cfg,
            proxy_id,
            provider,
            runs: lane::Runs::new(runs::lane_loop),
            redactor: Mutex::new(redactor),
            connected: AtomicBool::new(false),
            runs_dir,
            persister: persist::Persister::default(),
        }
    }

    /// Routes a decoded message to its lane (never blocks).
    pub fn dispatch(self: &Arc<Self>, msg: protocol::Incoming) {
        runs::dispatch(self, msg);
    }

    /// `text` with every known secret replaced by `[REDACTED]`.
    pub fn redact(&self, text: &str) -> String {
        self.redactor.lock().unwrap_or_else(|p| p.into_inner()).redact(text).into_owned()
    }

    pub fn add_secrets<'a>(&self, env: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut r = self.redactor.lock().unwrap_or_else(|p| p.into_inner());
        for (k, v) in env {
            if crate::env::SECRET_KEYS.contains(&k) {
                r.add(v);
            }
        }
    }

    pub fn wire_provider(&self) -> &'static str {
        self.provider.kind().wire_name()
    }

    pub fn runtime(&self) -> Option<String> {
        self.provider.runtime().map(str::to_string)
    }

    /// `register_agent.agent.capabilities` (reference §1.4.1).
    pub fn capabilities(&self) -> Map<String, Value> {
        let mut caps = self.cfg.agent.capabilities.clone();
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => other,
        };
        caps.insert(
            "runtime".into(),
            json!({"platform": "linux", "arch": arch, "isWsl": false, "wslDistro": null}),
        );
        let docker = self.cfg.sandbox.provider == ProviderChoice::Docker;
        let mut sandbox = json!({
            "provider": self.wire_provider(),
            "terminalEnabled": self.cfg.sandbox.terminal_enabled,
            "agentMode": "exec",
            "image": if docker { json!(self.cfg.sandbox.image) } else { Value::Null },
            "workingDir": sandbox::WORKSPACE,
            "workspaceProvider": "host",
            "gitPush": self.cfg.sandbox.git_push,
        });
        if let Some(rt) = self.runtime() {
            sandbox["runtime"] = json!(rt);
        }
        caps.insert("sandbox".into(), sandbox);
        caps.insert("acpTunnel".into(), json!(true));
        caps
    }

    /// Queues `proxy_update sandbox_instance_status` for `run_id`.
    pub fn report_status(&self, run_id: &str, info: &InstanceInfo) {
        let content = protocol::InstanceStatusContent {
            kind: "sandbox_instance_status",
            instance_name: info.name.clone(),
            provider: self.wire_provider(),
            runtime: self.runtime(),
            status: info.status.as_str(),
            last_seen_at: now_iso(),
            last_error: info.last_error.as_deref().map(|e| self.redact(e)),
        };
        self.outbox.push(&protocol::proxy_update(run_id, serde_json::to_value(content).expect("plain data")));
    }

    /// Queues `sandbox_instance_status {status:"error", last_error}`.
    pub fn report_error_status(&self, run_id: &str, instance_name: &str, error: &str) {
        let mut info = InstanceInfo::missing(self.provider.kind(), instance_name);
        info.status = crate::provider::InstanceStatus::Error;
        info.last_error = Some(error.to_string());
        self.report_status(run_id, &info);
    }
}

/// Now as ISO-8601 UTC with milliseconds (`2026-01-28T12:00:00.000Z`).
pub fn now_iso() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

pub fn iso_from_secs(secs: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs)).to_string()
}

pub fn iso_from_system(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Options of `tuixiu-sandbox proxy` beyond the config file.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub config: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub allow_insecure_ws: bool,
    /// Variables that win over the environment: the tokens read from
    /// `--auth-token-file`/`--bootstrap-token-file` (cli.rs).
    pub overrides: Vec<(String, String)>,
}

/// Loads the config, takes the identity lock and runs the daemon until
/// SIGTERM/SIGINT (0), an id conflict ([`EXIT_ID_CONFLICT`]) or a startup
/// error (125).
pub fn main(opts: Options) -> u8 {
    // Later entries win: the overrides over the environment.
    let vars = std::env::vars().chain(opts.overrides);
    let (mut cfg, warnings) = match Config::load(opts.config.as_deref(), vars) {
        Ok(c) => c,
        Err(e) => {
            report(&format!("proxy: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    for w in warnings {
        tracing::warn!("{w}");
    }
    if let Some(dir) = opts.state_dir {
        cfg.state_dir = dir;
    }
    if opts.allow_insecure_ws {
        cfg.allow_insecure_ws = true;
    }
    match config::url_parts(&cfg.orchestrator_url) {
        Ok(p) if p.scheme == "ws" && !config::is_loopback_host(&p.host) => {
            if cfg.allow_insecure_ws {
                tracing::warn!(
                    "orchestrator_url ws://{}:{} is plain ws:// to a non-loopback host: tokens and control \
                     messages travel unencrypted (allowed by allow_insecure_ws; use wss:// in production)",
                    p.host,
                    p.port
                );
            } else {
                report(&format!(
                    "proxy: orchestrator_url ws://{}:{}: plain ws:// is only allowed to loopback addresses; \
                     use wss:// (or --allow-insecure-ws, for testing only)",
                    p.host, p.port
                ));
                return sandbox::EXIT_SETUP_FAILED;
            }
        }
        _ => {}
    }
    let identity = match identity::acquire(&cfg.state_dir, cfg.agent.id.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            report(&format!("proxy: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    // One thread: the daemon's work is I/O (the socket, CLI children, small
    // files) and a single thread keeps the idle footprint small (see
    // docs/benchmarks.md). Sandboxes are launched by `__exec`, never here.
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            report(&format!("proxy: start the async runtime: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    let proxy_id = identity.proxy_id.clone();
    let code = rt.block_on(async move {
        let daemon = match Daemon::new(cfg, proxy_id) {
            Ok(d) => Arc::new(d),
            Err(e) => {
                report(&format!("proxy: {e}"));
                return sandbox::EXIT_SETUP_FAILED;
            }
        };
        if let Err(e) = identity::private_dir(&daemon.runs_dir) {
            report(&format!("proxy: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
        daemon.mounts.sweep_leftovers();
        tracing::info!(
            "proxy {} starting: provider {}, state {}, workspaces {}",
            daemon.proxy_id,
            daemon.wire_provider(),
            daemon.cfg.state_dir.display(),
            daemon.cfg.sandbox.workspace_host_root.display()
        );
        tokio::spawn(status::keep_writing(daemon.clone()));
        runs::adopt_persisted(&daemon).await;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopping = daemon.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            // While the link is still up: the agents first (their exits and
            // the results of interrupted prompts are the last messages),
            // then the outbox, within a bound; only then the link closes.
            tracing::info!("shutting down: closing the agents");
            stopping.runs.stop_starting();
            close_agents(&stopping).await;
            let bound = std::time::Duration::from_secs(stopping.cfg.shutdown_flush_seconds);
            let deadline = tokio::time::Instant::now() + bound;
            while stopping.runs.turns_in_flight() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !stopping.outbox.drained(left).await {
                tracing::warn!(
                    "shutting down: the backend did not take the last {} message(s) within {} s \
                     (shutdown_flush_seconds)",
                    stopping.outbox.len(),
                    bound.as_secs()
                );
            }
            let _ = stop_tx.send(true);
        });
        let exit = link::run(daemon.clone(), stop_rx).await;
        // Agents do not outlive the daemon that holds their stdio (an id
        // conflict ends the link without the signal above).
        daemon.runs.stop_starting();
        close_agents(&daemon).await;
        persist::Persister::flush(&daemon);
        match exit {
            link::Exit::Shutdown => {
                if !daemon.outbox.is_empty() {
                    tracing::warn!(
                        "{} message(s) not yet delivered to the backend are lost with this shutdown",
                        daemon.outbox.len()
                    );
                }
                0
            }
            link::Exit::Conflict(reason) => {
                report(&format!(
                    "proxy: the backend refused proxy id {:?} ({reason}): another proxy is connected with \
                     the same id; give each proxy its own [agent] id",
                    daemon.proxy_id
                ));
                EXIT_ID_CONFLICT
            }
        }
    });
    drop(identity);
    code
}

/// Closes every agent (stdin, SIGTERM, SIGKILL), concurrently; instances
/// and runs stay.
async fn close_agents(d: &Arc<Daemon>) {
    let closing: Vec<_> = d
        .runs
        .all_agents()
        .into_iter()
        .map(|a| tokio::spawn(async move { a.shutdown("daemon shutting down").await }))
        .collect();
    for c in closing {
        let _ = c.await;
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; stop the daemon with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// One error line on stderr, as the CLI prints them.
fn report(message: &str) {
    eprintln!("tuixiu-sandbox: {message}");
}
