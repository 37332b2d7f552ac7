//! `tuixiu-sandbox proxy`: the execution-plane daemon (docs/proxy.md), a
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
//! | [`shared`] | what a run's parts share: its state and where it is written, its agent slot, the jobs, the registry of lanes and agents, the replies |
//! | [`lane`] | one run's lane: its run and agent slots, and the instance and agent parts that act on them |
//! | [`landing`] | a run's agentInputs landed (planned, fetched with the download token, never over the agent's work) |
//! | [`instance`] | a run's instance: `ensureRuntime` (name, TTL, `init`, host directories, user, mounts), removal |
//! | [`run_state`] | what is persisted of a run (`RunState`) |
//! | [`runs`] | the [`runs::RunContext`] the daemon gives its runs (each part made once), routing to the lanes and each lane's loop: ordered processing, keepalive, re-adoption |
//! | [`mounts`] | what every instance gets besides the workspace and home: `/scratch`, the agent's state directory, `/run/secrets/<name>` |
//! | [`report`] | what goes to the backend: the outbox, secrets scrubbed out, instance status reports |
//! | [`persist`] | run state files written by one blocking worker, latest content first |
//! | [`control`] | every `sandbox_control` action and its protections |
//! | [`exposed`] | warnings when the workspace root or the state directory lies where sandboxes see |
//! | [`gitenv`] | host git processes: credentials through askpass/ssh key files, hardening, deadlines |
//! | [`repo`] | the workspace made a checkout of `TUIXIU_REPO_URL` (clone, or from a per-URL cache) |
//! | [`inventory`] | `sandbox_inventory` and `workspace_inventory` |
//! | [`status`] | `<state_dir>/status.json`, the daemon's liveness for health checks |
//! | [`acp_sink`] | the daemon's side of the ACP host's interface: its settings, its reports as wire messages |
//! | [`metrics`] | the Prometheus metrics (`--metrics-listen`): families fed from the message streams |
//!
//! Threading: a tokio current-thread runtime for the runs, one for the
//! link (its own thread, `link::run_apart`), and the blocking pool
//! (`crate::blocking`) for anything that may block (docs/architecture.md,
//! "Threading"). Nothing here enters a namespace: sandboxes are launched by
//! `tuixiu-sandbox __exec` through the native provider, containers by the
//! docker CLI.

pub mod acp_sink;
pub mod agent;
pub mod auth;
pub mod cli;
pub mod config;
pub mod control;
pub mod exposed;
pub mod gitenv;
pub mod identity;
pub mod instance;
pub mod inventory;
pub mod landing;
pub mod lane;
pub mod link;
pub mod metrics;
pub mod mounts;
pub mod outbox;
pub mod pathmap;
pub mod persist;
pub mod protocol;
pub mod repo;
pub mod report;
pub mod run_state;
pub mod runs;
pub mod shared;
pub mod signing;
pub mod status;
pub mod tls;
pub mod unread;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value, json};

use crate::env::Redactor;
use crate::provider::docker::DockerProvider;
use crate::provider::host::HostProvider;
use crate::provider::native::NativeProvider;
use crate::provider::{AnyProvider, Provider, ProviderError};
use auth::LinkSecrets;
use config::{Config, ProviderChoice};

/// Exit status when the backend refuses the proxy id.
pub const EXIT_ID_CONFLICT: u8 = 3;

/// The daemon as its top sees it (`main`, the link, the status file): the
/// link's own state next to the run side.
///
/// Each part gets what it uses and no more (docs/architecture.md, "Layers"):
/// the run side is the [`runs::RunContext`], which makes the instance, agent
/// and control parts once, each with its own services and the config values
/// it reads; the config itself stays here, for the link and the status
/// file, which alone see the registration state and the proxy id.
pub struct Daemon {
    proxy_id: String,
    /// What the link authenticates with; taken out of the config.
    link_secrets: LinkSecrets,
    /// Registered with the backend right now.
    connected: AtomicBool,
    /// The config, without its secrets: the link's (reconnects, timeouts,
    /// TLS, registration) and the status file's. The runs do not get it.
    cfg: Config,
    run: Arc<runs::RunContext>,
    /// Private directories that lie where sandboxes see ([`exposed`]).
    path_warnings: Vec<String>,
}

impl Daemon {
    /// The daemon of `cfg`, with its configured provider. Called inside a
    /// Tokio runtime: the task that starts the runs' lanes runs there.
    pub fn new(cfg: Config, proxy_id: String) -> Result<Daemon, ProviderError> {
        let state = &cfg.state_dir;
        let prefix = cfg.sandbox.instance_prefix.as_str();
        let network_events = Arc::new(report::NetworkEvents::default());
        let provider = match cfg.sandbox.provider {
            ProviderChoice::Native => AnyProvider::Native(
                NativeProvider::with_current_exe(state, prefix)
                    .and_then(NativeProvider::with_lifeline)
                    .and_then(NativeProvider::with_nested_counts)?
                    .with_egress_reports(network_events.clone()),
            ),
            ProviderChoice::Docker => {
                AnyProvider::Docker(DockerProvider::new(&cfg.sandbox.runtime, state, prefix)?)
            }
            ProviderChoice::Host => {
                AnyProvider::Host(HostProvider::new(state, prefix, cfg.sandbox.no_isolation_acknowledged)?)
            }
        };
        let daemon = Self::with_provider(cfg, proxy_id, provider);
        network_events.attach(daemon.run.report().clone());
        Ok(daemon)
    }

    /// As [`Daemon::new`], with `provider` instead of the configured one
    /// (the `proxy_messages` and `acp_transport` fuzz targets pass a native
    /// provider whose launcher does not exist: instances, but no process).
    /// Like [`Daemon::new`], inside a Tokio runtime.
    #[doc(hidden)]
    pub fn with_provider(mut cfg: Config, proxy_id: String, provider: AnyProvider) -> Daemon {
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
        let report = Arc::new(report::Reporter::new(
            outbox::Outbox::new(cfg.outbox_max_messages, cfg.outbox_max_bytes),
            redactor,
            provider.kind(),
            provider.runtime().map(str::to_string),
        ));
        let mounts = mounts::Mounts::new(&cfg, &proxy_id);
        let path_warnings = exposed::warnings(&cfg);
        // Each secret goes to the one part that signs or authenticates
        // with it; the runs get the config without them.
        let link_secrets = LinkSecrets {
            auth_token: cfg.auth_token.take(),
            bootstrap_token: cfg.bootstrap_token.take(),
            register_hmac_secret: cfg.register_hmac_secret.take(),
        };
        let signer = signing::Signer::new(cfg.control_signing_secret.take());
        let landing = landing::Landing::new(&cfg, link_secrets.auth_token.clone());
        let (run, new_lanes) = runs::RunContext::new(&cfg, provider, report, mounts, signer, landing);
        let run = Arc::new(run);
        run.spawn(runs::serve_lanes(Arc::downgrade(&run), new_lanes));
        Daemon { proxy_id, link_secrets, connected: AtomicBool::new(false), cfg, run, path_warnings }
    }

    /// The private directories that lie where sandboxes see, as warnings.
    pub fn path_warnings(&self) -> &[String] {
        &self.path_warnings
    }

    pub fn cfg(&self) -> &Config {
        &self.cfg
    }

    /// The link's tokens and registration secret.
    fn link_secrets(&self) -> &LinkSecrets {
        &self.link_secrets
    }

    pub fn proxy_id(&self) -> &str {
        &self.proxy_id
    }

    /// What the daemon gives its runs.
    pub fn run_context(&self) -> &Arc<runs::RunContext> {
        &self.run
    }

    pub fn outbox(&self) -> &outbox::Outbox {
        self.run.report().outbox()
    }

    /// Registered with the backend right now.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// The link registered (`true`) or went down: the outbox drains only
    /// while registered.
    pub fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::SeqCst);
        self.outbox().set_connected(on);
        if let Some(m) = self.run.report().metrics() {
            m.link(on);
        }
    }

    /// Routes a decoded message to its lane (never blocks).
    pub fn dispatch(&self, msg: protocol::Incoming) {
        if let Some(m) = self.run.report().metrics() {
            m.received(&msg);
        }
        runs::dispatch(&self.run, msg);
    }

    /// Starts feeding metrics; returns what renders them.
    pub fn enable_metrics(&self) -> crate::metrics::Render {
        let m = Arc::new(metrics::Metrics::new());
        self.run.report().set_metrics(m.clone());
        let run = self.run.clone();
        Arc::new(move || {
            let runs = run.runs();
            m.render(metrics::Now {
                lanes: runs.len(),
                agents: runs.all_agents().iter().filter(|a| !a.has_exited()).count(),
                prompts_in_flight: runs.turns_in_flight(),
                outbox: run.report().outbox().stats(),
                nested: match run.provider() {
                    AnyProvider::Native(native) => native.nested_counts(),
                    _ => None,
                },
            })
        })
    }

    /// The two inventories the backend gets after registering and every
    /// `inventory_interval_seconds`: sandboxes, then workspaces.
    pub async fn inventories(&self) -> [Option<String>; 2] {
        [
            inventory::sandbox_inventory_text(self.run.provider()).await,
            inventory::workspace_inventory_text(&self.cfg().sandbox.workspace_host_root),
        ]
    }

    /// What an agent started outside a lane gets (the `acp_transport` fuzz
    /// target's client).
    #[doc(hidden)]
    pub fn acp_context(&self) -> crate::acp::port::Context {
        self.run.acp_context()
    }

    /// `register_agent.agent.capabilities` (docs/protocol.md,
    /// "register_agent").
    pub fn capabilities(&self) -> Map<String, Value> {
        let cfg = self.cfg();
        let mut caps = cfg.agent.capabilities.clone();
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => other,
        };
        caps.insert(
            "runtime".into(),
            json!({"platform": "linux", "arch": arch, "isWsl": false, "wslDistro": null}),
        );
        let docker = cfg.sandbox.provider == ProviderChoice::Docker;
        let provider = self.run.provider();
        let mut sandbox = json!({
            "provider": provider.kind().wire_name(),
            "terminalEnabled": cfg.sandbox.terminal_enabled,
            "agentMode": "exec",
            "image": if docker { json!(cfg.sandbox.image) } else { Value::Null },
            "workingDir": sandbox::WORKSPACE,
            "workspaceProvider": "host",
            "gitPush": cfg.sandbox.git_push,
        });
        if let Some(rt) = provider.runtime() {
            sandbox["runtime"] = json!(rt);
        }
        caps.insert("sandbox".into(), sandbox);
        caps.insert("acpTunnel".into(), json!(true));
        caps
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
    /// `--metrics-listen`: where to serve Prometheus metrics.
    pub metrics_listen: Option<crate::metrics::Listen>,
}

/// Loads the config, takes the identity lock and runs the daemon until
/// SIGTERM/SIGINT (0), an id conflict ([`EXIT_ID_CONFLICT`]) or a startup
/// error (125). The steps in the order they happen: config, lock, metrics
/// endpoint, runtime, then [`serve`].
pub fn main(mut opts: Options) -> u8 {
    let metrics_listen = opts.metrics_listen.take();
    let Some(cfg) = load_config(opts) else {
        return sandbox::EXIT_SETUP_FAILED;
    };
    let identity = match identity::acquire(&cfg.state_dir, cfg.agent.id.as_deref()) {
        Ok(i) => i,
        Err(e) => {
            report(&format!("proxy: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    // Bound now: an address in use or a bad path is a startup error.
    let metrics = metrics_listen.as_ref().map(crate::metrics::Endpoint::bind).transpose();
    let Ok(metrics) = metrics.map_err(|e| report(&format!("proxy: {e}"))) else {
        return sandbox::EXIT_SETUP_FAILED;
    };
    // One thread for the runs: the daemon's work is I/O (the socket, CLI
    // children, small files) and a single thread keeps the idle footprint
    // small (see docs/benchmarks.md); the link has one of its own, and
    // blocking work the pool's. Sandboxes are launched by `__exec`, never
    // here.
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            report(&format!("proxy: start the async runtime: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    let code = rt.block_on(serve(cfg, identity.proxy_id.clone(), metrics));
    drop(identity);
    code
}

/// The config of `opts` (file, environment, overrides, command-line
/// options), checked; `None` once the reason is on stderr.
fn load_config(opts: Options) -> Option<Config> {
    // Later entries win: the overrides over the environment.
    let vars = std::env::vars().chain(opts.overrides);
    let (mut cfg, warnings) = match Config::load(opts.config.as_deref(), vars) {
        Ok(c) => c,
        Err(e) => {
            report(&format!("proxy: {e}"));
            return None;
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
                return None;
            }
        }
        _ => {}
    }
    Some(cfg)
}

/// The daemon on the runs' runtime: made, its state directory checked, the
/// runs of a previous daemon adopted, the link run until a signal or an id
/// conflict, then the agents closed and the run state flushed. Returns the
/// exit status.
async fn serve(cfg: Config, proxy_id: String, metrics: Option<crate::metrics::Endpoint>) -> u8 {
    let daemon = match Daemon::new(cfg, proxy_id) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            report(&format!("proxy: {e}"));
            return sandbox::EXIT_SETUP_FAILED;
        }
    };
    let run = daemon.run_context().clone();
    if let Err(e) = identity::private_dir(run.records().dir()) {
        report(&format!("proxy: {e}"));
        return sandbox::EXIT_SETUP_FAILED;
    }
    run.mounts().sweep_leftovers();
    if let Some(endpoint) = metrics {
        serve_metrics(&daemon, endpoint);
    }
    tracing::info!(
        "proxy {} starting: provider {}, state {}, workspaces {}",
        daemon.proxy_id(),
        run.report().wire_provider(),
        daemon.cfg().state_dir.display(),
        daemon.cfg().sandbox.workspace_host_root.display()
    );
    for w in daemon.path_warnings() {
        tracing::warn!("{w}");
    }
    tokio::spawn(status::keep_writing(daemon.clone()));
    runs::adopt_persisted(&run).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let signalled = Arc::new(std::sync::OnceLock::new());
    tokio::spawn(drain_on_signal(daemon.clone(), stop_tx, signalled.clone()));
    let exit = link::run_apart(daemon.clone(), stop_rx).await;
    // Agents do not outlive the daemon that holds their stdio (an id
    // conflict ends the link without the signal).
    run.runs().stop_starting();
    close_agents(run.runs(), daemon.cfg().agent_shutdown_grace_seconds).await;
    run.records().flush();
    if let Some(at) = signalled.get() {
        tracing::info!("shut down in {} ms", at.elapsed().as_millis());
    }
    exit_status(&daemon, exit)
}

/// On SIGTERM/SIGINT, while the link is still up: the agents first (their
/// exits and the results of interrupted prompts are the last messages),
/// then the outbox, within `shutdown_flush_seconds`; only then is the link
/// told to close (`stop`). Each step is logged with what it waits for, and
/// ends as soon as nothing is pending.
async fn drain_on_signal(
    daemon: Arc<Daemon>,
    stop: tokio::sync::watch::Sender<bool>,
    signalled: Arc<std::sync::OnceLock<tokio::time::Instant>>,
) {
    wait_for_signal().await;
    let _ = signalled.set(tokio::time::Instant::now());
    let runs = daemon.run_context().runs();
    runs.stop_starting();
    close_agents(runs, daemon.cfg().agent_shutdown_grace_seconds).await;
    let bound = std::time::Duration::from_secs(daemon.cfg().shutdown_flush_seconds);
    let deadline = tokio::time::Instant::now() + bound;
    let turns = runs.turns_in_flight();
    if turns > 0 {
        tracing::info!(
            "shutting down: waiting for {turns} prompt turn(s) to queue their results (at most {} s: \
             shutdown_flush_seconds)",
            bound.as_secs()
        );
    }
    while runs.turns_in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let queued = daemon.outbox().len();
    if queued > 0 {
        tracing::info!(
            "shutting down: waiting for the backend to take {queued} message(s){} (at most {} ms)",
            if daemon.connected() { "" } else { " (the link is down: until it is back)" },
            left.as_millis()
        );
    }
    if !daemon.outbox().drained(left).await {
        tracing::warn!(
            "shutting down: the backend did not take the last {} message(s) within {} s \
             (shutdown_flush_seconds)",
            daemon.outbox().len(),
            bound.as_secs()
        );
    }
    let _ = stop.send(true);
}

/// The exit status for how the link ended, with what is lost or wrong said.
fn exit_status(daemon: &Daemon, exit: link::Exit) -> u8 {
    match exit {
        link::Exit::Shutdown => {
            if !daemon.outbox().is_empty() {
                tracing::warn!(
                    "{} message(s) not yet delivered to the backend are lost with this shutdown",
                    daemon.outbox().len()
                );
            }
            0
        }
        link::Exit::Conflict(reason) => {
            report(&format!(
                "proxy: the backend refused proxy id {:?} ({reason}): another proxy is connected with \
                 the same id; give each proxy its own [agent] id",
                daemon.proxy_id()
            ));
            EXIT_ID_CONFLICT
        }
    }
}

/// Feeds the metrics from now on and serves them at `endpoint`.
fn serve_metrics(daemon: &Daemon, endpoint: crate::metrics::Endpoint) {
    tracing::info!("metrics on {}/metrics", endpoint.local());
    tokio::spawn(crate::metrics::serve(endpoint, daemon.enable_metrics()));
}

/// Closes every live agent (stdin, SIGTERM after `grace` seconds, SIGKILL
/// after as many more), concurrently; instances and runs stay.
async fn close_agents(runs: &shared::Runs, grace: u64) {
    let live: Vec<_> = runs.all_agents().into_iter().filter(|a| !a.has_exited()).collect();
    if live.is_empty() {
        return;
    }
    tracing::info!(
        "shutting down: closing {} agent(s) (stdin closed; SIGTERM after {grace} s, SIGKILL after {grace} s more)",
        live.len()
    );
    let closing: Vec<_> = live
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
